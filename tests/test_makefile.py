"""``make lint`` works in the README's venv, where ruff (a dev extra) is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_ruff_pin_is_the_same_in_makefile_and_setup_cfg() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    setup = (ROOT / "setup.cfg").read_text(encoding="utf-8")
    pinned = re.search(r"^RUFF_VERSION = (\S+)", makefile, re.M)
    assert pinned is not None
    assert f"ruff=={pinned.group(1)}" in setup.split()


def test_make_lint_installs_ruff_when_missing(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-m", "ruff", "--version"], capture_output=True).returncode
    done = subprocess.run(
        ["make", "-C", str(ROOT), "lint", f"PY={python}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if "make lint: installing ruff" in done.stdout and "ruff" not in _installed(python):
        pytest.skip(f"cannot install ruff from the package index here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make lint: installing ruff" in done.stdout


def _installed(python: Path) -> str:
    return subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.lower()
