#!/usr/bin/env bash
# Install opsplit (and, with "test", its test dependencies) without replacing an installed
# torch in opsplit's range (>= 2.13, < 2.15: pyproject.toml). A missing or out-of-range torch is installed as torch==2.13.0 from the index pip
# is configured with -- on a stock Linux machine that is PyPI, whose torch==2.13.0 wheel is the
# CUDA build (several GB of CUDA packages). To choose the build, set:
#   OPSPLIT_TORCH_INDEX=https://download.pytorch.org/whl/cpu   (CPU-only wheel; or a cuXXX index)
#   OPSPLIT_TORCH=torch==2.13.0                                (the requirement to install)
# OPSPLIT_INSTALL_DRY_RUN=1 prints the pip commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_REQ=${OPSPLIT_TORCH:-torch==2.13.0}
run() {
  if [ -n "${OPSPLIT_INSTALL_DRY_RUN:-}" ]; then echo "$*"; else "$@"; fi
}
if ! "$PY" - <<'PY' 2>/dev/null
import sys, torch
v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (2, 13) <= v < (2, 15) else 1)  # pyproject.toml's torch range
PY
then
  if [ -n "${OPSPLIT_TORCH_INDEX:-}" ]; then
    run "$PY" -m pip install --quiet "$TORCH_REQ" --index-url "$OPSPLIT_TORCH_INDEX"
  else
    run "$PY" -m pip install --quiet "$TORCH_REQ"
  fi
fi
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
run "$PY" -m pip install --quiet -e ".${extra}"
