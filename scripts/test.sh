#!/usr/bin/env bash
# Fresh machine -> set up, lint, and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check python tests benchmarks
exec .venv/bin/python -m pytest -q "$@"
