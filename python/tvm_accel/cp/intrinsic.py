"""The dataflow graph of a GEMM intrinsic (the CP paper, section 3.1 and Fig. 1c).

``acc[b][o] += sum_i inp[b][i] * wgt[o][i]`` with ``b < X`` (batch lanes), ``o < Y`` (output
lanes) and ``i < Z`` (reduction lanes) is generated from its three sizes, so a new GEMM shape
(VTA's 1x16x16, the paper's 8x8x8, ...) needs no code:

- data nodes ``inp[b,i]``, ``wgt[o,i]`` (inputs) and ``out[b,o]`` (results);
- operation nodes ``mul[b,o,i]`` and ``add[b,o,i]``;
- sequential edges ``inp -> mul``, ``wgt -> mul`` (access relations), ``mul -> add`` (same
  instance), ``add[b,o,i] -> add[b,o,i+1]`` (the reduction chain, the contracted self-edge),
  ``add[b,o,Z-1] -> out[b,o]`` (output access);
- spatial edges between parallel multiplications, as a star from ``mul[0,0,i]`` to every
  ``mul[b,o,i]`` (the paper prunes the clique to a star; transitivity keeps the information).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DFGEdge", "DFGNode", "InstructionDFG", "gemm_intrinsic"]


@dataclass(frozen=True)
class DFGNode:
    kind: str  # "inp" | "wgt" | "mul" | "add" | "out"
    index: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.kind}[{','.join(map(str, self.index))}]"


@dataclass(frozen=True)
class DFGEdge:
    src: DFGNode
    dst: DFGNode
    label: str  # "sequential" | "spatial"
    relation: str  # "access:in" | "access:wgt" | "same" | "reduce" | "output" | "parallel"


@dataclass
class InstructionDFG:
    """Nodes and labelled edges of an intrinsic, with its axis sizes ``x, y, z``."""

    name: str
    x: int
    y: int
    z: int
    nodes: list[DFGNode]
    edges: list[DFGEdge]

    def of_kind(self, kind: str) -> list[DFGNode]:
        return [n for n in self.nodes if n.kind == kind]

    @property
    def macs(self) -> int:
        return self.x * self.y * self.z


def gemm_intrinsic(x: int, y: int, z: int, name: str = "gemm") -> InstructionDFG:
    """DFG of a ``x`` (batch) by ``y`` (output) by ``z`` (reduction) GEMM instruction."""
    if min(x, y, z) < 1:
        raise ValueError(f"GEMM sizes must be >= 1, got {x}x{y}x{z}")
    inp = {(b, i): DFGNode("inp", (b, i)) for b in range(x) for i in range(z)}
    wgt = {(o, i): DFGNode("wgt", (o, i)) for o in range(y) for i in range(z)}
    mul = {(b, o, i): DFGNode("mul", (b, o, i)) for b in range(x) for o in range(y)
           for i in range(z)}
    add = {(b, o, i): DFGNode("add", (b, o, i)) for b in range(x) for o in range(y)
           for i in range(z)}
    out = {(b, o): DFGNode("out", (b, o)) for b in range(x) for o in range(y)}
    edges = []
    for (b, o, i), m in mul.items():
        edges.append(DFGEdge(inp[b, i], m, "sequential", "access:in"))
        edges.append(DFGEdge(wgt[o, i], m, "sequential", "access:wgt"))
        edges.append(DFGEdge(m, add[b, o, i], "sequential", "same"))
        if i + 1 < z:
            edges.append(DFGEdge(add[b, o, i], add[b, o, i + 1], "sequential", "reduce"))
        else:
            edges.append(DFGEdge(add[b, o, i], out[b, o], "sequential", "output"))
        if (b, o) != (0, 0):
            edges.append(DFGEdge(mul[0, 0, i], m, "spatial", "parallel"))
    nodes = [*inp.values(), *wgt.values(), *mul.values(), *add.values(), *out.values()]
    return InstructionDFG(name, x, y, z, nodes, edges)
