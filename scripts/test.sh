#!/usr/bin/env bash
# Fresh machine -> set up, lint, type-check and run the test suite (slowest tests listed), on
# every core (pytest-xdist; whole test files per worker, so module fixtures are built once;
# pass -n 0 to run in one process).
# The simulator the tests load is built with -Werror, so any compiler warning fails the run
# (rebuilt only when sim/ changed since the last -Werror build, see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ACCELSIM_WERROR=1 ./scripts/setup.sh
.venv/bin/ruff check python tests benchmarks
.venv/bin/mypy
exec .venv/bin/python -m pytest -q --durations=25 -n auto --dist loadfile "$@"
