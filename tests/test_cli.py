"""The command line: click's CliRunner for the commands, a subprocess for the entry point."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import tcdsl.cli
from tcdsl import __version__
from tcdsl.cli import cli, main
from tcdsl.cliutil import EXIT_INTERRUPTED
from tests.conftest import ROOT

OFFICE = "policies/office.tcp"
BROKEN = "interface eth0 htb rate 10mbit {\n    class web rate 5mbit ceil 2mbit\n}\n"
BROKEN_AT = ("2", str(BROKEN.splitlines()[1].index("2mbit") + 1))  # the ceil: E202
WARNING_ONLY = "interface eth0 htb rate 10mbit default web {\n    class web rate 1mbps\n}\n"
DIAGNOSTIC = re.compile(
    r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): error: .+ \[E\d{3}\]$", re.M
)


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from the repository root, so policies are named as in the golden files."""
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in (("broken", BROKEN), ("warn", WARNING_ONLY)):
        path = tmp_path / f"{name}.tcp"
        path.write_text(text, encoding="utf-8")
        out[name] = path
    return out


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# ---- help and version ----------------------------------------------------------------------------


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tcdsl, version {__version__}"
    assert run("-V").stdout == result.stdout


@pytest.mark.parametrize(
    ("args", "example"),
    [
        (["--help"], "tcdsl check policies/*.tcp"),
        (["-h"], "tcdsl compile office.tcp > apply.sh"),
        (["compile", "--help"], "tcdsl compile -o apply.sh office.tcp"),
        (["check", "--help"], "tcdsl check --werror policies/*.tcp"),
    ],
)
def test_help_shows_examples(args: list[str], example: str) -> None:
    result = run(*args)
    assert result.exit_code == 0
    assert "Examples:" in result.stdout
    assert example in result.stdout
    assert result.stderr == ""


def test_help_lists_commands_and_options() -> None:
    top = run("--help").stdout
    assert "compile" in top and "check" in top
    sub = run("compile", "--help").stdout
    for option in ("--backend", "--output", "--diagnostics", "--werror"):
        assert option in sub


# ---- compile -------------------------------------------------------------------------------------


def _tc_lines(script: str) -> list[str]:
    """The script's lines that run tc (its teardown, guarded by ``|| true``, left out)."""
    return [x for x in script.splitlines() if re.match(r"(if ! \S+=\$\()?tc ", x) and "||" not in x]


def test_compile_prints_the_script(in_root: Path) -> None:
    """By default every tc command goes to one tc -batch (a here-document, no tc per line)."""
    result = run("compile", OFFICE)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("#!/bin/sh\n")
    assert _tc_lines(result.stdout) == ["if ! tcdsl_said=$(tc -batch - 2>&1 <<TCDSL_FED"]
    assert "\nqdisc add dev eth0 root handle 1: htb default" in result.stdout
    assert result.stderr == ""
    golden = in_root / "tests" / "golden" / "shell" / "office.sh"
    assert result.stdout == golden.read_text(encoding="utf-8")
    assert run("compile", "--batch", OFFICE).stdout == result.stdout


def test_compile_per_command_runs_one_tc_per_command(in_root: Path) -> None:
    result = run("compile", "--per-command", OFFICE)
    assert result.exit_code == 0, result.stderr
    assert "tc -batch" not in result.stdout and "TCDSL_BATCH" not in result.stdout
    tc = _tc_lines(result.stdout)
    batch = run("compile", OFFICE).stdout
    body = batch[batch.index("<<'TCDSL_BATCH'\n") : batch.index("\nTCDSL_BATCH\n")]
    commands = [x for x in body.splitlines()[1:] if not x.startswith("#")]
    assert tc == [f"tc {x}" for x in commands]  # the same commands, in the same order
    assert tc[0] == "tc qdisc add dev eth0 root handle 1: htb default 70 r2q 100"
    golden = in_root / "tests" / "golden" / "shell-per-command" / "office.sh"
    assert result.stdout == golden.read_text(encoding="utf-8")


def test_compile_output_file(in_root: Path, tmp_path: Path) -> None:
    target = tmp_path / "apply.sh"
    result = run("compile", "-o", str(target), OFFICE)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert target.read_text(encoding="utf-8") == run("compile", OFFICE).stdout


def test_compile_output_in_a_missing_folder_is_refused(in_root: Path, tmp_path: Path) -> None:
    """Found by a tester: '-o /nonexist/x.sh' made /nonexist (as root: at /). A file's folder
    must exist (exit 1, nothing made); a directory output (-o out/) makes that one folder."""
    target = tmp_path / "nonexist" / "x.sh"
    result = run("compile", "-o", str(target), OFFICE)
    assert result.exit_code == 1 and "cannot write" in result.stderr, result.stderr
    assert not target.parent.exists()
    batch = run("compile", "-b", "tc-batch", "-o", f"{tmp_path / 'out'}/", OFFICE)
    assert batch.exit_code == 0 and (tmp_path / "out" / "office.batch").is_file(), batch.stderr


@pytest.mark.parametrize(
    "args", [["compile", OFFICE], ["explain", OFFICE], ["check", "--format", "json", OFFICE]]
)
def test_output_dash_is_stdout(in_root: Path, tmp_path: Path, args: list[str]) -> None:
    """``-o -`` writes to stdout, as for most tools (it wrote a file named ``-``)."""
    args = [str(in_root / a) if a == OFFICE else a for a in args]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        dashed = CliRunner().invoke(cli, [args[0], "-o", "-", *args[1:]])
        plain = CliRunner().invoke(cli, args)
    finally:
        os.chdir(cwd)
    assert dashed.exit_code == plain.exit_code == 0, dashed.output
    assert dashed.output == plain.output and not (tmp_path / "-").exists()


def test_compile_error(files: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "apply.sh"
    result = run("compile", "-o", str(target), str(files["broken"]))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert not target.exists()
    found = DIAGNOSTIC.search(result.stderr)
    assert found, result.stderr
    assert found["file"] == str(files["broken"])
    assert (found["line"], found["col"]) == BROKEN_AT
    assert "[E202]" in result.stderr
    assert "nothing generated" in result.stderr


def test_compile_error_to_stdout_leaves_it_empty(files: dict[str, Path]) -> None:
    result = run("compile", str(files["broken"]))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert DIAGNOSTIC.search(result.stderr)


def test_warnings_do_not_fail_without_werror(files: dict[str, Path]) -> None:
    result = run("compile", str(files["warn"]))
    assert result.exit_code == 0
    assert result.stdout.startswith("#!/bin/sh\n")
    assert "warning:" in result.stderr and "[W302]" in result.stderr


def test_werror(files: dict[str, Path]) -> None:
    result = run("compile", "--werror", str(files["warn"]))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "[W302]" in result.stderr
    checked = run("check", "--werror", str(files["warn"]))
    assert checked.exit_code == 1
    assert run("check", str(files["warn"])).exit_code == 0


def test_json_diagnostics(files: dict[str, Path]) -> None:
    result = run("compile", "--diagnostics", "json", str(files["broken"]))
    assert result.exit_code == 1
    assert result.stdout == ""
    items = json.loads(result.stderr)
    assert [d["code"] for d in items] == ["E202"]
    first = items[0]
    assert first["severity"] == "error"
    assert first["span"]["file"] == str(files["broken"])
    assert (str(first["span"]["line"]), str(first["span"]["column"])) == BROKEN_AT
    assert first["notes"] and first["notes"][0]["span"]["line"] == 2


def test_json_on_success_is_an_empty_list(in_root: Path) -> None:
    result = run("compile", "--diagnostics", "json", OFFICE)
    assert result.exit_code == 0
    assert json.loads(result.stderr) == []


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.tcp"
    result = run("compile", str(missing))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert f"{missing}:1:1: error: cannot read" in result.stderr
    assert "[E006]" in result.stderr


def test_unknown_option_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["compile", "--frobnicate", OFFICE])
    assert result.exit_code == 2
    assert "No such option" in result.stderr


def test_unknown_backend_is_a_usage_error() -> None:
    assert CliRunner().invoke(cli, ["compile", "-b", "nftables", OFFICE]).exit_code == 2


# ---- check ---------------------------------------------------------------------------------------


def test_check_several_files(in_root: Path, files: dict[str, Path]) -> None:
    result = run("check", OFFICE, str(files["broken"]), "policies/seeds/s001-htb-700-300.tcp")
    assert result.exit_code == 1
    assert result.stdout == ""
    locations = {m["file"] for m in DIAGNOSTIC.finditer(result.stderr)}
    assert locations == {str(files["broken"])}
    assert "tcdsl: 1 error" in result.stderr


def test_check_good_files(in_root: Path) -> None:
    result = run("check", OFFICE, "policies/seeds/s001-htb-700-300.tcp")
    assert result.exit_code == 0
    assert result.stdout == result.stderr == ""


def test_check_json(in_root: Path, files: dict[str, Path]) -> None:
    result = run("check", "--diagnostics", "json", OFFICE, str(files["broken"]), str(files["warn"]))
    assert result.exit_code == 1
    items = json.loads(result.stderr)
    assert {(Path(d["span"]["file"]).stem, d["code"]) for d in items} == {
        ("broken", "E202"),
        ("warn", "W302"),
    }


def test_check_needs_a_file() -> None:
    assert CliRunner().invoke(cli, ["check"]).exit_code == 2


# ---- the console entry point ---------------------------------------------------------------------


def _entry_point() -> list[str]:
    script = shutil.which("tcdsl", path=str(Path(sys.executable).parent))
    if script:
        return [script]
    return [sys.executable, "-m", "tcdsl"]


def _run_entry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_entry_point(), *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--version"], 0),
        (["compile", OFFICE], 0),
        (["check", OFFICE, "tests/diagnostics/E202-ceil-below-rate.tcp"], 1),
        (["compile", "does/not/exist.tcp"], 1),
        (["compile", "--frobnicate", OFFICE], 2),
        (["frobnicate"], 2),
        (["compile"], 2),
    ],
)
def test_entry_point_exit_codes(args: list[str], code: int) -> None:
    proc = _run_entry(*args)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 2:
        assert "Usage:" in proc.stderr or "Error:" in proc.stderr
    if args == ["compile", OFFICE]:
        assert proc.stdout == _run_entry("compile", OFFICE).stdout  # deterministic


@pytest.mark.parametrize(
    "args",
    [
        ["compile", OFFICE],
        ["compile", "-b", "json", OFFICE],
        ["explain", OFFICE],
        ["check", "--format", "sarif", OFFICE],
        ["classify", "--packet", "icmp", OFFICE],
    ],
)
def test_an_output_that_cannot_be_written_is_said_without_a_traceback(args: list[str]) -> None:
    """Found by a tester: '> /dev/full' ended in a traceback and 'internal error' (exit 3).
    Now it is one line saying why, and exit 1, as '-o /dev/full' already was."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w", encoding="utf-8") as full:
        proc = subprocess.run(
            [*_entry_point(), *args], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "tcdsl: cannot write the output: No space left on device\n"


@pytest.mark.parametrize(
    "args",
    [["compile", OFFICE], ["explain", OFFICE], ["check", "--format", "sarif", OFFICE]],
)
def test_an_output_to_a_closed_stdout_is_a_failure(args: list[str]) -> None:
    """Found by a tester: with stdout closed ('>&-'), compile, explain and SARIF exited 0
    having written nothing (Python starts such a process with no sys.stdout, where click
    writes nothing); a check with nothing to print still succeeds."""
    script = 'exec "$@" >&-'
    run = [*_entry_point()]
    proc = subprocess.run(
        ["sh", "-c", script, "sh", *run, *args], cwd=ROOT, stderr=subprocess.PIPE,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.endswith("tcdsl: cannot write the output: standard output is closed\n")
    quiet = subprocess.run(
        ["sh", "-c", script, "sh", *run, "check", OFFICE], cwd=ROOT, stderr=subprocess.PIPE,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr


def _buffered_env() -> dict[str, str]:
    """The environment, with stdout and stderr buffered as for a user (not as in CI)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _big_policy(classes: int) -> str:
    lines = [f"interface eth0 htb rate {classes}mbit default c0 {{"]
    # a pref every 1,000 lines: a port line is two IPv6 filters, and one pref keeps 2,048 (E262)
    lines += [
        f"    class c{i} rate 1mbit match dport {1024 + i} pref {1 + i // 1000}"
        for i in range(classes)
    ]
    return "\n".join([*lines, "}", ""])


def test_console_script_is_the_fast_exit() -> None:
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="tcdsl")
    assert script.value == "tcdsl.__main__:entry"


def test_interrupt_while_the_cli_loads_is_quiet() -> None:
    """A Ctrl-C before ``main`` runs (while the CLI's modules load) ends as one during a run:
    exit 130 and one line, no traceback. The import is made to raise it, as SIGINT does."""
    program = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tcdsl.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from tcdsl.__main__ import entry\n"
        "entry()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (EXIT_INTERRUPTED, "tcdsl: interrupted\n")


@pytest.mark.parametrize("to_file", [False, True], ids=["pipe", "file"])
def test_entry_point_output_complete_before_its_quick_exit(tmp_path: Path, to_file: bool) -> None:
    """``entry`` ends the process with ``os._exit``: what it printed must all be there, on a
    pipe and in a file, well past a pipe's buffer, with the exit codes of ``main``."""
    policy = tmp_path / "big.tcp"
    policy.write_text(_big_policy(1500), encoding="utf-8")
    broken = tmp_path / "broken.tcp"
    broken.write_text(BROKEN, encoding="utf-8")
    cases = [
        (["compile", str(policy)], 0),
        (["check", str(broken), str(policy)], 1),
        (["compile", "--frobnicate", str(policy)], 2),
    ]
    for args, code in cases:
        if to_file:
            out, err = tmp_path / "out", tmp_path / "err"
            with out.open("w") as stdout, err.open("w") as stderr:
                proc = subprocess.run(
                    [*_entry_point(), *args],
                    cwd=ROOT,
                    stdout=stdout,
                    stderr=stderr,
                    env=_buffered_env(),
                    timeout=120,
                )
            stdout_text, stderr_text = out.read_text(), err.read_text()
        else:
            piped = subprocess.run(
                [*_entry_point(), *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                env=_buffered_env(),
                timeout=120,
            )
            proc, stdout_text, stderr_text = piped, piped.stdout, piped.stderr
        assert proc.returncode == code, stderr_text
        if code == 2:
            assert "Usage:" in stderr_text and "--frobnicate" in stderr_text
            continue
        expected = CliRunner().invoke(cli, args)  # main's own output, in this process
        assert expected.exit_code == code
        assert stdout_text == expected.stdout
        assert stderr_text == expected.stderr
        if code == 0:
            assert len(stdout_text) > 200_000  # far more than a pipe holds
        else:
            assert "[E202]" in stderr_text


@pytest.mark.parametrize("code", [0, 1, 2, 3])
def test_entry_flushes_what_main_left_buffered(code: int) -> None:
    """Output written without click (which flushes each echo) is not lost by ``os._exit``."""
    program = (
        "import sys\n"
        "from tcdsl import cli\n"
        "def main():\n"
        "    sys.stdout.write('o' * 100)\n"
        "    sys.stderr.write('e' * 10)\n"
        f"    sys.exit({code} or None)\n"
        "cli.main = main\n"
        "cli.entry()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env=_buffered_env(),
        timeout=60,
    )
    assert (proc.returncode, len(proc.stdout), proc.stderr) == (code, 100, "e" * 10)


def test_check_loads_neither_the_verifier_nor_the_live_operations_nor_jinja2() -> None:
    """Start-up time: what ``check`` never uses loads on use (the group still lists it all;
    the backends registry still names every backend)."""
    program = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tcdsl.cli import cli\n"
        f"result = CliRunner().invoke(cli, ['check', {OFFICE!r}])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tcdsl.verify.', 'tcdsl.ops', "
        "'tcdsl.teach', 'jinja2', 'tcdsl.backends.'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "[]\n", "")
    listed = CliRunner().invoke(cli, ["--help"]).output
    assert all(f"  {name} " in listed for name in ("plan", "apply", "verify", "check"))
    helped = CliRunner().invoke(cli, ["compile", "--help"]).output
    assert all(name in helped for name in ("shell", "tc-batch", "mermaid", "json"))


COMPLEX = """\
const LINK = 100mbit
interface eth0 htb rate LINK default bulk {
    class a prio 1 rate 10mbit ceil 50% {
        match proto tcp, udp dport 1000-2000, 80, 443 src 10.0.0.0/8, 192.168.1.1
        match tos 0x10/0xfc sport 22
        sfq perturb 10
    }
    class b rate 20% { match dscp ef; match tcp-ack proto tcp; fq_codel ecn }
    class bulk rate 1mbit ceil 5mbit { pfifo limit 20 }
}
interface wan0 htb rate 50mbit default rest {
    classify by mark from eth1
    class x rate 10mbit match proto tcp dport 22, 80-90 dst 1.2.3.0/24, 5.6.7.8
    class y rate 10mbit mark 77 match proto udp sport 53 dscp af41
    class rest rate 1mbit
}
"""


def test_output_does_not_depend_on_hash_seed(tmp_path: Path) -> None:
    policy = tmp_path / "complex.tcp"
    policy.write_text(COMPLEX, encoding="utf-8")
    outputs = set()
    for seed in ("1", "2"):
        proc = subprocess.run(
            [*_entry_point(), "compile", str(policy)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert proc.returncode == 0, proc.stderr
        outputs.add(proc.stdout)
    assert len(outputs) == 1


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["tcdsl", *args])
    try:
        main()
    except SystemExit as exit_:
        return 0 if exit_.code is None else int(exit_.code)
    return 0


def test_main_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], in_root: Path
) -> None:
    def explode(*args: object, **kwargs: object) -> object:
        raise RuntimeError("simulated compiler bug")

    monkeypatch.setattr(tcdsl.cli, "compile_policy", explode)
    assert _main(monkeypatch, "compile", OFFICE) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: simulated compiler bug" in err
    assert "internal error" in err


def test_main_internal_error_in_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], in_root: Path
) -> None:
    def explode(*args: object, **kwargs: object) -> object:
        raise KeyError("boom")

    monkeypatch.setattr(tcdsl.cli, "analyse", explode)
    assert _main(monkeypatch, "check", OFFICE) == 3
    assert "Traceback" in capsys.readouterr().err


def test_main_usage_and_policy_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], in_root: Path
) -> None:
    assert _main(monkeypatch, "compile", "--nope", OFFICE) == 2
    assert "No such option" in capsys.readouterr().err
    assert _main(monkeypatch, "--version") == 0
    assert _main(monkeypatch, "check", OFFICE) == 0
    assert _main(monkeypatch, "check", "missing.tcp") == 1
    assert "[E006]" in capsys.readouterr().err


def test_main_unwritable_output_is_not_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    in_root: Path,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    target = blocker / "apply.sh"  # a path below a regular file can never be created
    code = _main(monkeypatch, "compile", "-o", str(target), OFFICE)
    assert code in (1, 2)
    assert "Traceback" not in capsys.readouterr().err


def test_compile_into_a_directory(in_root: Path, tmp_path: Path) -> None:
    """``-o DIR/`` writes every file of the output into DIR, named after the policy."""
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["compile", "-o", f"{out}/", OFFICE])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["office.sh"]
    assert (out / "office.sh").read_text(encoding="utf-8").startswith("#!/bin/sh\n")


def test_output_written_in_pieces_is_the_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile -o`` writes a piece at a time (no second copy of a 48 MB script): pieces
    that split the text anywhere, multi-byte characters included, give the same file."""
    from tcdsl import cliutil

    text = "# €uro ünïcode\n" * 50 + "tail"
    for size in (1, 3, 7, len(text), len(text) + 5):
        monkeypatch.setattr(cliutil, "WRITE_CHUNK", size)
        out = tmp_path / f"out{size}.sh"
        cliutil.write_text(out, text)
        assert out.read_bytes() == text.encode("utf-8")
