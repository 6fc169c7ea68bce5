"""Constraint-programming embedding of hardware intrinsics into tensor operators.

The method of Rieber et al., "Joint Program and Layout Transformations to enable Convolutional
Operators on Specialized Hardware based on Constraint Programming" (the VTA target's paper):
operators as polyhedral instance sets and access relations (:mod:`.operator`), the intrinsic as
a scalar dataflow graph (:mod:`.intrinsic`), the embedding as a CSP (:mod:`.constraints`,
:mod:`.embedding`) solved by a small propagation + backtracking engine (:mod:`.solver`).
Target independent: a target turns embeddings into layouts and programs.
"""

from tvm_accel.cp.embedding import (
    Embedding,
    Options,
    SearchResult,
    enumerate_embeddings,
    find_embedding,
)
from tvm_accel.cp.intrinsic import InstructionDFG, gemm_intrinsic
from tvm_accel.cp.operator import TensorOp, conv2d_op, conv_transpose2d_op, dense_op

__all__ = ["Embedding", "InstructionDFG", "Options", "SearchResult", "TensorOp", "conv2d_op",
           "conv_transpose2d_op", "dense_op", "enumerate_embeddings", "find_embedding",
           "gemm_intrinsic"]
