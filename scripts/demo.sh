#!/usr/bin/env bash
# Set up (idempotent), then run the kvwatch demo. Extra arguments go to `kvwatch demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvwatch demo "$@"
