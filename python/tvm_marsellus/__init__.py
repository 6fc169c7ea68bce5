"""MARSELLUS target (device half): a RISC-V SoC with the RBE convolution engine and a 16-core
XpulpNN cluster (MARSELLUS paper, seeds/001).

Modules: ``hw_config`` (JSON config + cycle-model constants), ``energy`` (operating points and
energy), ``codegen`` (64-byte command ISA with semaphore sync, encoder/decoder, assembly, RBE
bit-plane layouts, program container and blob), ``simulator`` (binding of ``sim/marsellus``).
The compiler half (patterns, tiling, target registration) builds on these interfaces.
"""

__all__ = ["codegen", "energy", "hw_config", "simulator"]
