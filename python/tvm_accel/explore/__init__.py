"""Design-space exploration: the hardware varied, not only the model (issue 26).

- :mod:`~tvm_accel.explore.measure`: one model on one hardware point (compile, bit-exactness
  against the CPU reference, run, the profiler's totals);
- :mod:`~tvm_accel.explore.sweep`: a grid of hardware configs x models (``tvmc sweep``): CSV,
  resume, process parallelism, Pareto front;
- :mod:`~tvm_accel.explore.targets`: one model on several targets (``tvmc compare-targets``);
- :mod:`~tvm_accel.explore.plots`: their pictures.

Every target-specific fact comes through :class:`~tvm_accel.target.AccelTarget` and the
target's hardware config (``on_chip_bytes``, ``quantize_scheme``, its options).
"""
