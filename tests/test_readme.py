"""The README's examples are real: its commands exist and its outputs are what tcdsl prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)


def _block_after(marker: str) -> str:
    start = README.index(marker)
    match = re.compile(r"```\w*\n(.*?)```", re.S).search(README, start)
    assert match is not None, f"no code block after {marker!r}"
    return match.group(1)


def test_readme_leads_with_install_and_test_commands() -> None:
    shell_blocks = [body for lang, body in BLOCKS if lang == "sh"]
    install, test = shell_blocks[0].strip(), shell_blocks[1].strip()
    assert "tcdsl compile policies/office.tcp" in install
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test in ci.splitlines(), "'.ci/run' must run exactly the README's test command"
    assert shlex.split(test)[0].endswith("python") and "pytest" in test


def test_install_command_works_as_root_on_a_fresh_debian() -> None:
    """Root Debian has no sudo, and an empty apt cache needs an update before any install."""
    install = next(body for lang, body in BLOCKS if lang == "sh").strip()
    steps = [shlex.split(step) for step in install.split("&&")]
    assert "sudo" not in {word for step in steps for word in step}
    assert steps[0] == ["apt-get", "update"]
    apt = steps[1]
    assert apt[:3] == ["apt-get", "install", "-y"]
    wanted = set(apt[3:])
    # what the tests need for real: tc/ip, iptables, nft, shellcheck, dot, pgrep, make
    assert {"iproute2", "iptables", "nftables", "shellcheck", "graphviz", "procps"} <= wanted
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    listed = re.search(r"for pkg in ([^;]+); do", ci)
    assert listed is not None and set(listed.group(1).split()) == wanted


def test_office_policy_in_readme_is_the_file() -> None:
    block = _block_after("A short tour")
    assert block == (ROOT / "policies" / "office.tcp").read_text(encoding="utf-8")


@pytest.fixture
def voip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "voip.tcp"
    path.write_text(_block_after("The VoIP line of that example"), encoding="utf-8")
    return path


def test_voip_example_output_is_current(voip: Path) -> None:
    result = CliRunner().invoke(cli, ["compile", "voip.tcp"])
    assert result.exit_code == 0, result.output
    assert result.stdout == _block_after("compiles (`tcdsl compile voip.tcp > apply.sh`)")


def test_voip_example_compiles_without_a_warning(voip: Path) -> None:
    # A newcomer's first compile: tc's default r2q would give the 100mbit link class a quantum
    # above the kernel's 200000 (W316); tcdsl chooses quanta itself, so nothing is printed.
    for argv in (["compile", "voip.tcp"], ["check", "--werror", "voip.tcp"]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0, result.output
        assert result.stderr == "", argv


def test_error_example_is_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    office = (ROOT / "policies" / "office.tcp").read_text(encoding="utf-8")
    broken = office.replace("rate 10mbit ceil 100mbit {", "rate 10mbit ceil 5mbit {")
    (tmp_path / "office.tcp").write_text(broken, encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", "office.tcp"])
    assert result.exit_code == 1
    assert result.stderr == _block_after("Mistakes are reported like a compiler does")


def test_both_directions_example_checks_clean(tmp_path: Path) -> None:
    path = tmp_path / "home.tcp"
    path.write_text(_block_after("Both directions of a link"), encoding="utf-8")
    got = CliRunner().invoke(cli, ["check", str(path)])
    assert got.exit_code == 0 and got.stderr == "", got.stderr
