#!/usr/bin/env bash
# The suite on the newest torch that pyproject.toml's range admits (CI runs it after
# scripts/test.sh, which tests the pinned torch==2.13.0): a fresh virtualenv in
# .venv-newest-torch/, torch installed from the range itself (pip picks the newest release it
# can get), then scripts/test.sh there. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${OPSPLIT_NEWEST_VENV:-.venv-newest-torch}
RANGE=$("$PY" - <<'PY'
import re
text = open("pyproject.toml", encoding="utf-8").read()
print(re.search(r'"(torch[<>=!~][^"]*)"', text).group(1))
PY
)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "$RANGE"
"$VENV/bin/python" -c "import torch; print('newest torch in the range $RANGE:', torch.__version__)"
PYTHON="$VENV/bin/python" bash scripts/test.sh "$@"
