#!/usr/bin/env bash
# The README's test command: install with test dependencies, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
PY=${PYTHON:-python3}
exec "$PY" -m pytest -q "$@"
