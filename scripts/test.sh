#!/usr/bin/env bash
# Fresh machine -> set up, lint, type-check and run the test suite (slowest tests listed).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# the simulator the tests load, rebuilt so that any compiler warning fails the run
ACCELSIM_WERROR=1 .venv/bin/python setup.py -q build_sim
.venv/bin/ruff check python tests benchmarks
.venv/bin/mypy
exec .venv/bin/python -m pytest -q --durations=25 "$@"
