#!/usr/bin/env bash
# Install opsplit (and, with "test", its test dependencies) without replacing an
# installed torch >= 2.2 and without pulling CUDA builds: a missing or too old torch is
# installed as the CPU wheel torch==2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" - <<'PY' 2>/dev/null
import sys, torch
v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if v >= (2, 2) else 1)
PY
then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
"$PY" -m pip install --quiet -e ".${extra}"
