#!/usr/bin/env bash
# Set up (idempotent), then run the whole test suite. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not integration"` for the pure-logic part alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
exec .venv/bin/python -m pytest "$@"
