#!/usr/bin/env bash
# Create .venv (Python 3.10+) and install the toolchain with its test extras; builds the C simulator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/python -c "import tvm_accel.simlib as s; s.get_lib()" 
