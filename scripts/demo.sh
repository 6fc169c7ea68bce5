#!/usr/bin/env bash
# Fresh machine -> set up, then compile the bundled quantized model for each finished target,
# run it on the simulator, check it bit-exactly against the CPU reference and print per-layer costs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m tvm_accel.demo "$@"
