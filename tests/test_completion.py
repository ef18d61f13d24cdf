"""Shell completion (README, "Shell completion"): click writes the script for bash, zsh and fish
when ``_TCDSL_COMPLETE`` asks for it, and the script's callback completes commands and options."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tests.conftest import ROOT

SCRIPTS = {
    "bash": "complete -o nosort -F _tcdsl_completion tcdsl",
    "zsh": "compdef _tcdsl_completion tcdsl",
    "fish": 'complete --no-files --command tcdsl --arguments "(_tcdsl_completion)"',
}


def _complete(env: dict[str, str]) -> str:
    result = CliRunner().invoke(cli, [], prog_name="tcdsl", env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("shell", sorted(SCRIPTS))
def test_completion_script_is_written(shell: str) -> None:
    script = _complete({"_TCDSL_COMPLETE": f"{shell}_source"})
    assert SCRIPTS[shell] in script
    assert f"_TCDSL_COMPLETE={shell}_complete" in script


def test_bash_script_is_valid_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    script = _complete({"_TCDSL_COMPLETE": "bash_source"})
    run = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_completions_name_commands_and_backends() -> None:
    def words(line: str, cword: int) -> list[str]:
        env = {"_TCDSL_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(cword)}
        return _complete(env).split()

    assert words("tcdsl comp", 1) == ["plain,compile"]
    assert {"plain,check", "plain,explain", "plain,fmt"} <= set(words("tcdsl ", 1))
    assert "plain,mermaid" in words("tcdsl compile -b ", 3)
    assert "plain,--werror" in words("tcdsl check --w", 2)


def test_the_installed_command_writes_the_script() -> None:
    """What the README tells users to run, through the console script and ``main``."""
    tcdsl = Path(sys.executable).with_name("tcdsl")
    if not tcdsl.exists():
        pytest.skip("no tcdsl console script next to this Python")
    env = {**os.environ, "_TCDSL_COMPLETE": "bash_source"}
    run = subprocess.run(
        [str(tcdsl)], env=env, capture_output=True, text=True, check=False, cwd=ROOT, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert SCRIPTS["bash"] in run.stdout


def test_readme_documents_completion() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for shell in SCRIPTS:
        assert f"_TCDSL_COMPLETE={shell}_source tcdsl" in readme
