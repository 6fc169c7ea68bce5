"""DPU assembly: the ISA's text form (formatter, disassembler, parser, assembler).

One instruction per line, mnemonic then DPON and DPBY (like Fig. 3 of the DPUV3INT8 paper), then
``key=value`` operands; MISC instructions use their op as mnemonic::

    LOAD DPON=- DPBY=CONV dst=FM0:0:0x0000 src=INPUT+0x0 size=8x56x64 src_stride=64,3584 \
        dst_stride=64,3584 img_stride=0x31000
    LOAD DPON=- DPBY=CONV dst=PM:0x000000 src=PARAM+0x0 size=9x64x64 src_stride=64,4096
    CONV DPON=LOAD DPBY=MISC in=FM0:0:0x0000 in_stride=64,3584 ic=64 out=FM1:0:0x0000 \
        out_stride=64,3584 out_size=8x56x64 kernel=3x3 stride=1x1 pad=1,1,1,1 \
        params=PM:0x000000 shift=7 clip=0,127
    MAXPOOL DPON=CONV DPBY=SAVE in=FM1:0:0x0000 in_stride=64,3584 out=FM2:0:0x0000 \
        out_stride=64,1792 out_size=4x28x64 kernel=2x2 stride=2x2 pad=0,0,0,0 clip=-128,127
    SAVE DPON=MISC DPBY=- src=FM2:0:0x0000 dst=OUTPUT+0x0 size=4x28x64 src_stride=64,1792 \
        dst_stride=64,1792 img_stride=0xc400
    END

(each instruction on one line). Fields not shown by a group and different from their default are
printed as ``name=value``, so disassembling any decodable word and parsing it back gives the same
bits. ``;`` and ``#`` start comments; ``N:`` listing prefixes are ignored.
"""

from __future__ import annotations

import re
from dataclasses import fields

from tvm_accel.errors import AsmError, EncodeError
from tvm_dpu.codegen import (
    CLASS_OF,
    ELEMENTWISE,
    INSN_BYTES,
    LAYOUTS,
    MISC_AVGPOOL,
    MISC_MAXPOOL,
    Conv,
    EltAdd,
    EltMul,
    End,
    Insn,
    Load,
    Pool,
    Save,
    Upsample,
    decode,
    decode_stream,
    deps_text,
    encode,
    encode_stream,
    mnemonic,
    units_mask,
)
from tvm_dpu.hw_config import REGION_NAMES, DPUConfig


def _hex(v: int) -> str:
    return f"0x{v:x}"


class ISA:
    """Encoder, decoder and assembler of one config (the config gives FM banks for display)."""

    def __init__(self, cfg: DPUConfig):
        self.cfg = cfg
        self.bank_bytes = cfg.FM_BANK_BYTES

    encode = staticmethod(encode)
    encode_stream = staticmethod(encode_stream)
    decode = staticmethod(decode)
    decode_stream = staticmethod(decode_stream)

    # formatting ------------------------------------------------------------------------------
    def fm(self, mem: int, addr: int) -> str:
        bank, off = divmod(addr, self.bank_bytes)
        return f"FM{mem}:{bank}:0x{off:04x}"

    def format(self, insn: Insn) -> str:
        """One line: mnemonic, DPON, DPBY, then the operands (``key=value``)."""
        if isinstance(insn, End):
            return "END"
        parts = [mnemonic(insn), f"DPON={deps_text(insn.dpon)}",
                 f"DPBY={deps_text(insn.dpby)}"]
        shown: set[str] = set()

        def put(key: str, text: str, *names: str) -> None:
            parts.append(f"{key}={text}")
            shown.update(names)

        if isinstance(insn, Load):
            self._load_operands(insn, put)
        elif isinstance(insn, Save):
            self._save_operands(insn, put)
        else:
            self._compute_operands(insn, put)
            self._compute_attributes(insn, put)
        parts += _other_fields(insn, shown)
        return " ".join(parts)

    def _load_operands(self, i: Load, put) -> None:
        if i.to_pm:
            put("dst", f"PM:0x{i.dst_addr:06x}", "to_pm", "dst_addr")
        else:
            put("dst", self.fm(i.fm_mem, i.dst_addr), "to_pm", "fm_mem", "dst_addr")
        put("src", self._ddr(i.region, i.ddr_offset), "region", "ddr_offset")
        put("size", f"{i.rows}x{i.cols}x{i.chans}", "rows", "cols", "chans")
        put("src_stride", f"{i.ddr_pix_stride},{i.ddr_row_stride}", "ddr_pix_stride",
            "ddr_row_stride")
        if not i.to_pm:
            put("dst_stride", f"{i.fm_pix_stride},{i.fm_row_stride}", "fm_pix_stride",
                "fm_row_stride")
            if i.img_stride:
                put("img_stride", _hex(i.img_stride), "img_stride")

    def _save_operands(self, i: Save, put) -> None:
        put("src", self.fm(i.fm_mem, i.src_addr), "fm_mem", "src_addr")
        put("dst", self._ddr(i.region, i.ddr_offset), "region", "ddr_offset")
        put("size", f"{i.rows}x{i.cols}x{i.chans}", "rows", "cols", "chans")
        put("src_stride", f"{i.fm_pix_stride},{i.fm_row_stride}", "fm_pix_stride",
            "fm_row_stride")
        put("dst_stride", f"{i.ddr_pix_stride},{i.ddr_row_stride}", "ddr_pix_stride",
            "ddr_row_stride")
        if i.img_stride:
            put("img_stride", _hex(i.img_stride), "img_stride")

    def _compute_operands(self, i: Insn, put) -> None:
        """CONV / MISC: the FM operands and the output size."""
        a = "a" if isinstance(i, ELEMENTWISE) else "in"
        put(a, self.fm(i.in_mem, i.in_addr), "in_mem", "in_addr")
        put(f"{a}_stride", f"{i.in_pix_stride},{i.in_row_stride}", "in_pix_stride",
            "in_row_stride")
        if isinstance(i, Conv):
            put("ic", str(i.ic), "ic")
        if isinstance(i, ELEMENTWISE):
            put("b", self.fm(i.b_mem, i.b_addr), "b_mem", "b_addr")
            put("b_stride", f"{i.b_pix_stride},{i.b_row_stride}", "b_pix_stride",
                "b_row_stride")
        put("out", self.fm(i.out_mem, i.out_addr), "out_mem", "out_addr")
        put("out_stride", f"{i.out_pix_stride},{i.out_row_stride}", "out_pix_stride",
            "out_row_stride")
        c = i.oc if isinstance(i, Conv) else i.chans
        put("out_size", f"{i.out_h}x{i.out_w}x{c}", "out_h", "out_w",
            "oc" if isinstance(i, Conv) else "chans")

    @staticmethod
    def _compute_attributes(i: Insn, put) -> None:
        """CONV / MISC: window, parameters, rescaling and clipping."""
        if isinstance(i, (Conv, Pool)):
            put("kernel", f"{i.kernel_h}x{i.kernel_w}", "kernel_h", "kernel_w")
            put("stride", f"{i.stride_h}x{i.stride_w}", "stride_h", "stride_w")
            put("pad", f"{i.pad_top},{i.pad_bottom},{i.pad_left},{i.pad_right}",
                "pad_top", "pad_bottom", "pad_left", "pad_right")
        if isinstance(i, Conv):
            put("params", f"PM:0x{i.param_addr:06x}", "param_addr")
            put("shift", str(i.shift), "shift")
        if isinstance(i, Pool) and i.op == MISC_AVGPOOL:
            put("mult", str(i.mult), "mult")
            put("shift", str(i.shift), "shift")
        if isinstance(i, EltAdd):
            put("shift_a", str(i.shift_a), "shift_a")
            put("shift_b", str(i.shift_b), "shift_b")
            put("shift", str(i.shift), "shift")
        if isinstance(i, EltMul):
            put("shift", str(i.shift), "shift")
        if isinstance(i, Upsample):
            put("factor", f"{i.factor_h}x{i.factor_w}", "factor_h", "factor_w")
        if isinstance(i, (Conv, Pool, *ELEMENTWISE)):
            put("clip", f"{i.clip_lo},{i.clip_hi}", "clip_lo", "clip_hi")

    @staticmethod
    def _ddr(region: int, offset: int) -> str:
        r = REGION_NAMES[region] if region < len(REGION_NAMES) else f"REGION{region}"
        return f"{r}+{_hex(offset)}"

    def disassemble(self, data: bytes) -> list[str]:
        """Numbered listing of a stream; undecodable words are shown as ``.word``, not raised."""
        lines = []
        n = len(data) // INSN_BYTES
        for k in range(n):
            chunk = data[k * INSN_BYTES:(k + 1) * INSN_BYTES]
            try:
                text = self.format(decode(chunk))
            except EncodeError as e:
                text = f".word 0x{int.from_bytes(chunk, 'little'):064x}  ; {e}"
            lines.append(f"{k:6d}: {text}")
        return lines

    # parsing ---------------------------------------------------------------------------------
    def parse(self, text: str) -> list[Insn]:
        """Parse assembly (one instruction per line; ``;`` / ``#`` comments, blank lines and
        ``N:`` listing prefixes are ignored) into instructions."""
        return [insn for _, insn in self._parse_lines(text, encode_too=False)]

    def assemble(self, text: str) -> bytes:
        """Parse and encode; errors (also fields too wide for their bits) name the line."""
        return b"".join(data for data, _ in self._parse_lines(text, encode_too=True))

    def _parse_lines(self, text: str, encode_too: bool):
        out = []
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = re.split(r"[;#]", raw, maxsplit=1)[0].strip()
            line = re.sub(r"^\d+:\s*", "", line)
            if not line:
                continue
            try:
                insn = self.parse_line(line)
                out.append((encode(insn) if encode_too else None, insn))
            except (AsmError, EncodeError, ValueError) as e:
                raise AsmError(f"line {lineno}: {e} in {raw.strip()!r}") from None
        return out

    def parse_line(self, line: str) -> Insn:
        toks = line.split()
        mn = toks[0].upper()
        if mn == "END":
            if len(toks) > 1:
                raise AsmError("END takes no operands")
            return End()
        if mn not in CLASS_OF:
            raise AsmError(f"unknown mnemonic {toks[0]!r} (known: {', '.join(CLASS_OF)})")
        cls = CLASS_OF[mn]
        kw: dict = {}
        if cls is Pool:
            kw["op"] = MISC_MAXPOOL if mn == "MAXPOOL" else MISC_AVGPOOL
        names = {f.name: f for f in fields(cls)}
        for tok in toks[1:]:
            key, eq, val = tok.partition("=")
            k = key.lower()
            if not eq:
                if k in names and names[k].type == "bool":
                    kw[k] = True
                    continue
                raise AsmError(f"token {tok!r} is not key=value")
            self._operand(cls, mn, k, val, kw, names)
        return cls(**kw)

    def _operand(self, cls, mn: str, k: str, val: str, kw: dict, names: dict) -> None:
        def ints(n: int, sep: str) -> list[int]:
            items = val.lower().split(sep)
            if len(items) != n:
                raise AsmError(f"{k}={val}: expected {n} values separated by {sep!r}")
            return [_int(x) for x in items]

        if k == "dpon" or k == "dpby":
            kw[k] = units_mask(val)
            return
        move = cls in (Load, Save)
        if (self._move_operand(cls, k, val, kw, ints) if move
                else self._compute_operand(cls, k, val, kw, ints)):
            return
        if k in names and k not in ("op",):
            kw[k] = bool(_int(val)) if names[k].type == "bool" else _int(val)
        else:
            raise AsmError(f"unknown operand {k!r} for {mn}")

    def _move_operand(self, cls, k: str, val: str, kw: dict, ints) -> bool:
        """A LOAD / SAVE operand into ``kw``; False when ``k`` is not one."""
        load = cls is Load
        if load and k == "dst":
            if val.upper().startswith("PM:"):
                kw["to_pm"], kw["dst_addr"] = True, _int(val[3:])
            else:
                kw["to_pm"] = False
                kw["fm_mem"], kw["dst_addr"] = self._parse_fm(val)
        elif not load and k == "src":
            kw["fm_mem"], kw["src_addr"] = self._parse_fm(val)
        elif k == ("src" if load else "dst"):
            kw["region"], kw["ddr_offset"] = _parse_ddr(val)
        elif k == "size":
            kw["rows"], kw["cols"], kw["chans"] = ints(3, "x")
        elif k == ("src_stride" if load else "dst_stride"):
            kw["ddr_pix_stride"], kw["ddr_row_stride"] = ints(2, ",")
        elif k == ("dst_stride" if load else "src_stride"):
            kw["fm_pix_stride"], kw["fm_row_stride"] = ints(2, ",")
        elif load and k == "pad":
            kw["pad_top"], kw["pad_bottom"], kw["pad_left"], kw["pad_right"] = ints(4, ",")
        else:
            return False
        return True

    def _compute_operand(self, cls, k: str, val: str, kw: dict, ints) -> bool:
        """A CONV / MISC FM operand into ``kw``; False when ``k`` is not one."""
        a = "a" if cls in ELEMENTWISE else "in"
        fm = {a: ("in_mem", "in_addr"), "out": ("out_mem", "out_addr")}
        strides = {f"{a}_stride": ("in_pix_stride", "in_row_stride"),
                   "out_stride": ("out_pix_stride", "out_row_stride")}
        if cls in ELEMENTWISE:
            fm["b"] = ("b_mem", "b_addr")
            strides["b_stride"] = ("b_pix_stride", "b_row_stride")
        if k in fm:
            kw[fm[k][0]], kw[fm[k][1]] = self._parse_fm(val)
        elif k in strides:
            kw[strides[k][0]], kw[strides[k][1]] = ints(2, ",")
        elif k == "out_size":
            kw["out_h"], kw["out_w"], kw["oc" if cls is Conv else "chans"] = ints(3, "x")
        else:
            return _attribute_operand(cls, k, val, kw, ints)
        return True

    def _parse_fm(self, val: str) -> tuple[int, int]:
        m = re.fullmatch(r"FM(\d+):([0-9a-fA-Fx]+)(?::([0-9a-fA-Fx]+))?", val.strip(),
                         flags=re.IGNORECASE)
        if not m:
            raise AsmError(f"{val!r} is not an FM address (FM<mem>:<bank>:<offset> or "
                           "FM<mem>:<address>)")
        mem = int(m.group(1))
        if m.group(3) is None:
            return mem, _int(m.group(2))
        return mem, _int(m.group(2)) * self.bank_bytes + _int(m.group(3))


def _int(text: str) -> int:
    t = text.strip().lower()
    try:
        return int(t, 0)
    except ValueError:
        raise AsmError(f"{text!r} is not an integer") from None


def _parse_ddr(val: str) -> tuple[int, int]:
    name, plus, off = val.partition("+")
    name = name.strip().upper()
    if name in REGION_NAMES:
        region = REGION_NAMES.index(name)
    elif name.startswith("REGION") and name[6:].isdigit():
        region = int(name[6:])
    else:
        raise AsmError(f"{val!r}: unknown DDR region (regions: {', '.join(REGION_NAMES)})")
    return region, _int(off) if plus else 0


def _other_fields(i: Insn, shown: set[str]) -> list[str]:
    """Every field not shown by a group that differs from its default (``name=value``, a set
    flag by its name), so any decoded word round-trips."""
    out = []
    defaults = type(i)()
    for name in [n for n, _, _ in LAYOUTS.get(mnemonic(i), ())]:
        if name in shown or name == "op":
            continue
        v = getattr(i, name)
        if v != getattr(defaults, name):
            out.append(name if isinstance(v, bool) else f"{name}={v}")
    return out


#: ``key=AxB`` / ``key=a,b,c,d`` attributes of CONV / MISC: (classes, fields, separator)
_ATTRIBUTES = {
    "kernel": ((Conv, Pool), ("kernel_h", "kernel_w"), "x"),
    "stride": ((Conv, Pool), ("stride_h", "stride_w"), "x"),
    "pad": ((Conv, Pool), ("pad_top", "pad_bottom", "pad_left", "pad_right"), ","),
    "clip": ((Conv, Pool, *ELEMENTWISE), ("clip_lo", "clip_hi"), ","),
    "factor": ((Upsample,), ("factor_h", "factor_w"), "x"),
}


def _attribute_operand(cls, k: str, val: str, kw: dict, ints) -> bool:
    """A CONV / MISC window, clip, factor or params operand into ``kw``; False otherwise."""
    if k in _ATTRIBUTES and cls in _ATTRIBUTES[k][0]:
        _, names, sep = _ATTRIBUTES[k]
        kw.update(zip(names, ints(len(names), sep), strict=True))
        return True
    if k == "params" and cls is Conv:
        if not val.upper().startswith("PM:"):
            raise AsmError(f"params={val}: expected PM:<address>")
        kw["param_addr"] = _int(val[3:])
        return True
    return False
