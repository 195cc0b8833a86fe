"""scripts/install.sh: the torch build is the user's choice (issue 8, finding 10)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install.sh"


def _dry_run(tmp_path, **env):
    # a python without torch, so the script decides to install it
    fake = tmp_path / "python_without_torch"
    fake.write_text(
        f'#!/bin/sh\nexport PYTHONPATH={tmp_path}/shadow\nexec "{sys.executable}" "$@"\n'
    )
    fake.chmod(0o755)
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no torch here')\n")
    full = {**os.environ, "PYTHON": str(fake), "OPSPLIT_INSTALL_DRY_RUN": "1", **env}
    out = subprocess.run(
        ["bash", str(SCRIPT), "test"], env=full, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_torch_index_is_chosen_by_the_user(tmp_path):
    lines = _dry_run(tmp_path, OPSPLIT_TORCH_INDEX="https://download.pytorch.org/whl/cpu")
    torch_line = next(line for line in lines if "torch==" in line)
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line
    assert lines[-1].endswith("-e .[test]")


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_default_uses_the_configured_index_and_the_pinned_version(tmp_path):
    env = {k: "" for k in ("OPSPLIT_TORCH_INDEX", "OPSPLIT_TORCH")}
    lines = _dry_run(tmp_path, **env)
    torch_line = next(line for line in lines if "torch==" in line)
    assert "torch==2.13.0" in torch_line and "--index-url" not in torch_line


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_an_installed_torch_is_kept(tmp_path):
    env = {**os.environ, "OPSPLIT_INSTALL_DRY_RUN": "1", "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    )
    assert "torch==" not in out.stdout and out.stdout.strip().endswith("-e .")


def test_install_script_keeps_exactly_pyprojects_torch_range():
    """install.sh keeps an installed torch only inside pyproject.toml's range, whose ends
    are what CI tests: the lower end the pinned release (scripts/test.sh), the upper end the
    newest release CI tests (.ci/run, scripts/test_newest_torch.sh)."""
    import re

    root = SCRIPT.parents[1]
    spec = re.search(r'"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)"',
                     (root / "pyproject.toml").read_text(encoding="utf-8"))
    assert spec, "pyproject.toml: expected torch>=A.B,<C.D"
    lo, hi = spec.groups()[:2], spec.groups()[2:]
    line = f"({lo[0]}, {lo[1]}) <= v < ({hi[0]}, {hi[1]})"
    assert line in SCRIPT.read_text(encoding="utf-8")
    pinned = re.search(r"OPSPLIT_TORCH:-torch==(\d+)\.(\d+)\.", SCRIPT.read_text(encoding="utf-8"))
    assert pinned and pinned.groups() == lo, "the range's lower end is the pinned torch CI tests"
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test.sh" in ci and "scripts/test_newest_torch.sh" in ci
