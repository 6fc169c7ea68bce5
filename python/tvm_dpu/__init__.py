"""DPU target: a Xilinx-DPU-style FPGA overlay (DPUV3INT8 / DNNVM papers) as a TVM BYOC target.

Hardware side, one module each: ``hw_config`` (JSON config: DDR regions, PM, per-PE FM, unit
parallelism and timing), ``codegen`` (256-bit ISA with DPON/DPBY dependency fields: encoder,
decoder, assembly formatter and parser), ``simulator`` (binding of the C simulator in
``sim/dpu``), ``timeline`` (Chrome trace -> PNG timeline).
"""
