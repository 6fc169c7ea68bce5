"""Instruction emitter of one layer's stream: micro-op kernels (content-addressed in the UOP
buffer), the dependency tokens between the load, compute and store modules, and FINISH.

The token protocol (RAW and WAR links per buffer half) is described in ``docs/vta.md``,
Virtual threads.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tvm_accel.errors import MappingError
from tvm_vta_cp.codegen import (
    ISA,
    LOOP_ITER_BITS,
    MEM_UOP,
    OP_LOAD,
    AluInsn,
    FinishInsn,
    GemmInsn,
    MemInsn,
    queue_of,
)
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.strategy.alu_tail import AluOp
from tvm_vta_cp.strategy.placement import Dram

MAX_ITER = (1 << LOOP_ITER_BITS) - 1


class _UopOverflow(Exception):
    """The layer's micro-op kernels do not all fit the UOP buffer at once."""


def emit_layer(cfg: VTAConfig, isa: ISA, dram: Dram, name: str,
               body: Callable[[Emitter], None]) -> bytes:
    """Run ``body(emitter)``; with one bulk UOP load if every kernel fits, else on demand."""
    try:
        em = Emitter(cfg, isa, dram, name, bulk_uops=True)
        body(em)
    except _UopOverflow:
        em = Emitter(cfg, isa, dram, name, bulk_uops=False)
        body(em)
    return em.finish()


class Emitter:
    """Builds one layer's instruction stream: uop kernels, token links, FINISH."""

    def __init__(self, cfg: VTAConfig, isa: ISA, dram: Dram, name: str, bulk_uops: bool = True):
        self.cfg, self.isa, self.dram, self.name = cfg, isa, dram, name
        # bulk: every kernel gets its own UOP range and one LOAD UOP at the start of the stream
        # brings them all in; otherwise kernels are loaded on first use (evicting all when full)
        self.bulk_uops = bulk_uops
        self._uop_image: list[bytes] = []
        self.insns: list = []
        self._count = [0, 0, 0]
        self._seq: dict[int, int] = {}
        self._links: dict[str, list[tuple[int, int]]] = {"L2G": [], "G2L": [], "G2S": [],
                                                         "S2G": []}
        self.last_reader: dict[int, object] = {}  # INP/WGT half -> last GEMM reading it
        self.last_store: dict[int, object] = {}   # ACC half -> last STORE of its latest tile
        self.pending_load: dict[int, object] = {}  # half -> load group awaiting its GEMM
        self.pending_g2s = None
        self.final_store = None
        self._g2l_done = -1  # queue position of the newest GEMM / STORE a token was popped for
        self._s2g_done = -1
        self._uop_res: dict[bytes, int] = {}
        self._uop_top = 0
        self._kernel_memo: dict[tuple, tuple] = {}
        A, Ib = isa.A, isa.I
        self._uop_shift = (A, A + Ib)

    # -- basics
    def emit(self, insn):
        q = queue_of(insn)
        self._seq[id(insn)] = self._count[q]
        self._count[q] += 1
        self.insns.append(insn)
        return insn

    def _link(self, queue: str, push_insn, pop_insn):
        self._links[queue].append((self._seq[id(push_insn)], self._seq[id(pop_insn)]))

    # -- token protocol
    def load_group(self, half: int, insns: list) -> bool:
        """Emit INP/WGT loads into a half; returns False if there is nothing to load."""
        if not insns:
            return False
        for i in insns:
            self.emit(i)
        reader = self.last_reader.pop(half, None)
        if reader is not None and self._seq[id(reader)] > self._g2l_done:
            # WAR: wait until the last GEMM reading this half is done (an older one is done
            # already when an earlier load waited for a later GEMM: both queues run in order)
            self._g2l_done = self._seq[id(reader)]
            reader.deps.push_prev = True
            insns[0].deps.pop_next = True
            self._link("G2L", reader, insns[0])
        insns[-1].deps.push_next = True
        self.pending_load[half] = insns[-1]
        return True

    def gemm_reads(self, half: int, gemm, popped: bool):
        """Register ``gemm`` as the consumer of the half's pending load (RAW) and its reader."""
        if popped:
            ld = self.pending_load.pop(half)
            gemm.deps.pop_prev = True
            self._link("L2G", ld, gemm)
        self.last_reader[half] = gemm

    def acc_acquire(self, half: int, first_write):
        st = self.last_store.pop(half, None)
        if st is not None and self._seq[id(st)] > self._s2g_done:
            # WAR on ACC: wait for the previous tile's STORE of this half (unless a later STORE
            # was waited for already)
            self._s2g_done = self._seq[id(st)]
            st.deps.push_prev = True
            first_write.deps.pop_next = True
            self._link("S2G", st, first_write)

    def compute_done(self, last_compute):
        last_compute.deps.push_next = True
        self.pending_g2s = last_compute

    def store_group(self, half: int, insns: list):
        for i in insns:
            self.emit(i)
        insns[0].deps.pop_prev = True
        self._link("G2S", self.pending_g2s, insns[0])
        self.pending_g2s = None
        self.last_store[half] = insns[-1]
        self.final_store = insns[-1]

    def new_phase(self):
        """Start a sub-program that lays out INP/WGT/ACC differently (the phases of a
        transpose conv): its first load into either half waits for the newest GEMM of the
        previous one (the queues run in order, so that covers all older GEMMs), and a compute
        no-op waits for its last STORE before any ACC write (requantize vectors included)."""
        if self.last_reader:
            newest = max(self.last_reader.values(), key=lambda i: self._seq[id(i)])
            self.last_reader.update({0: newest, 1: newest})
        st = self.final_store
        if st is not None and self._seq[id(st)] > self._s2g_done:
            nop = self.emit(MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0))
            self._s2g_done = self._seq[id(st)]
            st.deps.push_prev = True
            nop.deps.pop_next = True
            self._link("S2G", st, nop)
        self.last_store.clear()
        self.final_store = None

    def finish(self) -> bytes:
        if self.final_store is not None:
            nop = MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0)
            self.emit(nop)
            self.final_store.deps.push_prev = True
            nop.deps.pop_next = True
            self._link("S2G", self.final_store, nop)
        self.emit(FinishInsn())
        if self.bulk_uops and self._uop_image:
            words = b"".join(self._uop_image)
            n = len(words) // 4
            ld = MemInsn(OP_LOAD, MEM_UOP, 0, self.dram.const(words) // 4, 1, n, n)
            self.insns.insert(0, ld)  # compute-queue order of everything else is unchanged
        for q, pairs in self._links.items():
            for (a0, b0), (a1, b1) in zip(pairs, pairs[1:], strict=False):
                if not (a1 > a0 and b1 > b0):
                    raise AssertionError(f"{self.name}: {q} token links are not FIFO-ordered")
        return self.isa.encode_stream(self.insns)

    # -- micro-op kernels
    def _kernel(self, dims: tuple, bases: tuple, table: tuple = ()) -> tuple:
        """(uop words, iter_out, iter_in, factors) for loop dims ``(extent, dst, src, wgt)``;
        ``table`` lists explicit ``(dst, src, wgt)`` offsets enumerated as one more (outermost,
        non-linear) micro-op dimension, e.g. the non-zero weight blocks of a grouped conv."""
        key = (dims, bases, table)
        hit = self._kernel_memo.get(key)
        if hit is not None:
            return hit
        ds = sorted((d for d in dims if d[0] > 1), key=lambda d: -d[0])
        loops = ds[:2]
        rest = sorted(ds[2:], key=lambda d: -d[1])
        t = np.asarray(table or ((0, 0, 0),), dtype=np.int64).reshape(-1, 3)
        dst, src, wgt = (bases[i] + t[:, i] for i in range(3))
        for e, a, b, c in rest:
            ar = np.arange(e, dtype=np.int64)
            dst = (dst[:, None] + ar[None, :] * a).ravel()
            src = (src[:, None] + ar[None, :] * b).ravel()
            wgt = (wgt[:, None] + ar[None, :] * c).ravel()
        sa, sb = self._uop_shift
        words = (dst | (src << sa) | (wgt << sb)).astype("<u4").tobytes()
        while len(loops) < 2:
            loops.append((1, 0, 0, 0))
        outer, inner = loops[1], loops[0]  # the largest extent innermost
        if outer[0] > MAX_ITER or inner[0] > MAX_ITER:
            raise MappingError(f"layer {self.name}: a loop of {max(outer[0], inner[0])} "
                               "iterations exceeds the 14-bit iteration field")
        res = (words, outer, inner)
        self._kernel_memo[key] = res
        return res

    def _uops(self, words: bytes) -> tuple[int, int]:
        n = len(words) // 4
        base = self._uop_res.get(words)
        if base is None:
            if n > self.cfg.uop_depth:
                raise MappingError(f"layer {self.name}: a micro-op kernel of {n} uops exceeds the "
                                   f"UOP buffer ({self.cfg.uop_depth})")
            if self._uop_top + n > self.cfg.uop_depth:
                if self.bulk_uops:
                    raise _UopOverflow
                self._uop_res.clear()  # evict everything (compute runs in order)
                self._uop_top = 0
            base = self._uop_top
            self._uop_top += n
            self._uop_res[words] = base
            if self.bulk_uops:
                self._uop_image.append(words)
            else:
                self.emit(MemInsn(OP_LOAD, MEM_UOP, base, self.dram.const(words) // 4, 1, n, n))
        return base, base + n

    def gemm(self, dims: tuple, bases: tuple, reset: bool = False,
             table: tuple = ()) -> GemmInsn:
        words, outer, inner = self._kernel(dims, bases, table)
        bgn, end = self._uops(words)
        insn = GemmInsn(reset, bgn, end, outer[0], inner[0], outer[1], inner[1], outer[2],
                        inner[2], outer[3], inner[3])
        return self.emit(insn)

    def alu(self, opcode: int, dims: tuple, bases: tuple, imm: int | None) -> AluInsn:
        words, outer, inner = self._kernel(dims, (bases[0], bases[1], 0))
        bgn, end = self._uops(words)
        insn = AluInsn(opcode, bgn, end, outer[0], inner[0], outer[1], inner[1], outer[2],
                       inner[2], use_imm=imm is not None, imm=0 if imm is None else int(imm))
        return self.emit(insn)


def emit_tail(em: Emitter, ops: list[AluOp], vidx: list[int | None], n: int, tb: int, tco: int,
              S: int, abase: int, vbase: int) -> AluInsn | None:
    """Whole-tile ALU instructions of the requantize tail (ops on the GEMM's bias lanes
    excepted); returns the last one (or None)."""
    last = None
    for op, vi in zip(ops, vidx, strict=True):
        if op.on_gemm:  # added by the GEMM's bias lanes
            continue
        if vi is None:
            last = em.alu(op.opcode, ((n, 1, 0, 0),), (abase, 0), int(op.values[0]))
        else:
            dims = ((tb, tco * S, 0, 0), (tco, S, 1, 0), (S, 1, 0, 0))
            last = em.alu(op.opcode, dims, (abase, vbase + vi * tco), None)
    return last
