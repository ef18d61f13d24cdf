"""The User-Mode Linux runner, ``tcdsl.kernels.uml``, against a real Debian 6.1 kernel.

One boot runs every case in ``CASES``; each test checks one case's result. The tests that
boot are skipped, with the reason, where UML cannot run here (``uml.available()``); the first
run on a machine builds the image (about 45 MB downloaded, 15 s), later ones take seconds.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path

import pytest

from tcdsl.kernels import uml

VETH = "ip link add name a type veth peer name b\n"

QDISCS = {
    "prio": "prio",
    "netem": "netem delay 10ms",
    "fq_codel": "fq_codel",
    "cake": "cake bandwidth 10mbit",
    "hfsc": "hfsc default 1",
    "htb": "htb default 10",
    "tbf": "tbf rate 1mbit burst 10k latency 50ms",
}
"""Qdiscs the host kernel may lack, as modules of the guest's; each on a veth of its own."""

AWK_STRINGS = 3000
"""Strings built by the string-heavy case (see test_glibc_string_functions_are_right)."""

CASES = [
    uml.Case(
        "sfq-on-lo",
        "tc qdisc add dev lo root sfq perturb 10\ntc qdisc show dev lo\n"
        "grep -o '^sch_sfq ' /proc/modules\n",
    ),
    *(
        uml.Case(
            f"qdisc-{kind}",
            f"{VETH}tc qdisc add dev a root handle 1: {args}\ntc qdisc show dev a\n",
        )
        for kind, args in QDISCS.items()
    ),
    uml.Case(
        "fw-filter",
        VETH + "tc qdisc add dev a root handle 1: htb default 10\n"
        "tc class add dev a parent 1: classid 1:10 htb rate 1mbit\n"
        "tc filter add dev a parent 1: protocol ip prio 1 handle 10 fw flowid 1:10\n"
        "tc filter show dev a\n",
    ),
    uml.Case(
        "iptables-mark",
        "iptables-legacy -t mangle -N X\n"
        "iptables-legacy -t mangle -A X -p tcp --dport 5001 -m mark --mark 0 "
        "-j MARK --set-mark 10\n"
        "iptables-legacy-save -t mangle\n",
    ),
    uml.Case(
        "isolation-make", VETH + "iptables -t mangle -N LEFTOVER\ntc qdisc add dev a root sfq\n"
    ),
    uml.Case("isolation-look", "ip -o link show\niptables-save -t mangle\n"),
    uml.Case("exit-status", "echo to stdout\necho to stderr >&2\nexit 7\n"),
    uml.Case("failing-command", "echo before\ntc qdisc add dev nosuch root sfq\n"),
    uml.Case("cbq", VETH + "tc qdisc add dev a root handle 1: cbq bandwidth 10mbit avpkt 1000\n"),
    uml.Case(
        "environment",
        'echo "$PATH"\nreadlink /bin/sh\niptables -V\nuname -r\npwd\nls -A\n'
        "cat /proc/sys/kernel/modprobe\n",
    ),
    uml.Case("big-output", "seq 1 100000\nseq 1 1000 >&2\n"),
    uml.Case(
        "awk-strings",
        f'busybox awk \'BEGIN {{ for (i = 0; i < {AWK_STRINGS}; i++) s = s sprintf("%d,", i);'
        " print length(s) }'\n",
    ),
]


@pytest.fixture(scope="module")
def results() -> dict[str, uml.CaseResult]:
    """Every case of ``CASES``, run in one boot."""
    reason = uml.available()
    if reason is not None:
        pytest.skip(f"UML cannot run here: {reason}")
    done = uml.run_cases(CASES, timeout=120)
    assert [r.name for r in done] == [c.name for c in CASES]
    return {r.name: r for r in done}


def ok(result: uml.CaseResult) -> str:
    """The case's stdout, after checking that it succeeded without a word on stderr."""
    assert (result.exit_code, result.stderr) == (0, ""), result
    return result.stdout


def test_sfq_loads_its_module_on_demand(results: dict[str, uml.CaseResult]) -> None:
    out = ok(results["sfq-on-lo"])
    assert re.search(r"^qdisc sfq 8001: root .* perturb 10sec", out, re.M), out
    assert "sch_sfq \n" in out  # a module the kernel loaded when tc asked for sfq


@pytest.mark.parametrize("kind", QDISCS)
def test_qdisc_on_veth(results: dict[str, uml.CaseResult], kind: str) -> None:
    out = ok(results[f"qdisc-{kind}"])
    assert re.match(rf"qdisc {kind} 1: root ", out), out


def test_fw_filter(results: dict[str, uml.CaseResult]) -> None:
    out = ok(results["fw-filter"])
    assert "filter parent 1: protocol ip pref 1 fw chain 0 handle 0xa classid 1:10" in out, out


def test_iptables_mark_rule(results: dict[str, uml.CaseResult]) -> None:
    out = ok(results["iptables-mark"])
    assert ":X - [0:0]" in out
    rule = "-A X -p tcp -m tcp --dport 5001 -m mark --mark 0x0 -j MARK --set-xmark 0xa/0xffffffff"
    assert rule in out.splitlines(), out


def test_cases_do_not_see_each_others_network(results: dict[str, uml.CaseResult]) -> None:
    ok(results["isolation-make"])
    out = ok(results["isolation-look"])
    links = [line.split(":")[1].strip() for line in out.splitlines() if re.match(r"\d+: ", line)]
    assert links == ["lo"], out
    assert "LEFTOVER" not in out


def test_exit_status_and_both_streams_come_back(results: dict[str, uml.CaseResult]) -> None:
    result = results["exit-status"]
    assert (result.exit_code, result.stdout, result.stderr) == (7, "to stdout\n", "to stderr\n")


def test_failing_command(results: dict[str, uml.CaseResult]) -> None:
    result = results["failing-command"]
    assert (result.exit_code, result.stdout) == (1, "before\n")
    assert result.stderr == 'Cannot find device "nosuch"\n'


def test_cbq_is_not_in_this_kernel(results: dict[str, uml.CaseResult]) -> None:
    # Debian's 6.1 builds no CBQ (upstream removed it in 6.3): tc's exact answer.
    result = results["cbq"]
    assert (result.exit_code, result.stderr) == (2, "Error: Specified qdisc kind is unknown.\n")


def test_environment(results: dict[str, uml.CaseResult]) -> None:
    lines = ok(results["environment"]).splitlines()
    assert lines[0].startswith("/usr/sbin:/usr/bin")
    assert lines[1] == "dash"
    assert lines[2] == "iptables v1.8.9 (legacy)"
    assert lines[3].startswith("6.1.")
    assert re.fullmatch(r"/tmp/\d{4}", lines[4])  # an empty folder of its own
    assert lines[5] == "/usr/sbin/tcdsl-modprobe"


def test_big_output(results: dict[str, uml.CaseResult]) -> None:
    result = results["big-output"]
    assert result.stdout == "".join(f"{i}\n" for i in range(1, 100001))
    assert result.stderr == "".join(f"{i}\n" for i in range(1, 1001))


def test_glibc_string_functions_are_right(results: dict[str, uml.CaseResult]) -> None:
    # Much copying into fresh pages: on hosts with AVX-512 this goes wrong or crashes unless
    # the guest's glibc keeps to SSE (see the module's doc).
    expected = sum(len(f"{i},") for i in range(AWK_STRINGS))
    assert ok(results["awk-strings"]) == f"{expected}\n"


def test_timeout_keeps_the_finished_cases() -> None:
    reason = uml.available()
    if reason is not None:
        pytest.skip(f"UML cannot run here: {reason}")
    cases = [uml.Case("quick", "echo done"), uml.Case("hang", "sleep 60"), uml.Case("late", "")]
    with pytest.raises(uml.UmlError, match="timed out after 4 s in case 'hang'") as caught:
        uml.run_cases(cases, timeout=4)
    assert caught.value.results == [uml.CaseResult("quick", 0, "done\n", "")]


# ==== without booting ===========================================================================


def test_a_slow_boot_does_not_eat_the_cases_time(tmp_path: Path) -> None:
    # A stand-in kernel (a real process) that takes 3 s to "boot" and then runs 0.2 s: a
    # 2-second timeout counts from the boot mark, so it is not a timeout.
    booted = tmp_path / "booted"
    proc = subprocess.Popen(["sh", "-c", f"sleep 3; : > '{booted}'; sleep 0.2"])
    try:
        assert uml._wait(proc, 2, booted)
    finally:
        proc.kill()
        proc.wait()


def test_a_boot_that_never_comes_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uml, "BOOT_TIMEOUT", 0.5)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        assert not uml._wait(proc, 100, tmp_path / "booted")
        assert time.monotonic() - started < 20
    finally:
        proc.kill()
        proc.wait()


def test_image_dir_follows_tcdsl_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TCDSL_CACHE", str(tmp_path))
    assert uml.image_dir() == tmp_path / f"uml-r{uml.RECIPE}"
    monkeypatch.delenv("TCDSL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert uml.image_dir() == tmp_path / "xdg" / "tcdsl" / f"uml-r{uml.RECIPE}"


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86-64 Linux only"
)
def test_exec_program(tmp_path: Path) -> None:
    # The hand-assembled module loader: execve(path, [argv0, args...], env), nothing else.
    program = tmp_path / "program"
    program.write_bytes(uml._exec_program("/usr/bin/env", "named", ["A=1", "B=two words"]))
    program.chmod(0o755)
    done = subprocess.run([program], capture_output=True, text=True, check=False, env={})
    assert (done.returncode, done.stdout) == (0, "A=1\nB=two words\n")
    program.write_bytes(uml._exec_program("/nonexistent", "x", []))
    assert subprocess.run([program], check=False).returncode == 127


def test_elf_dependencies() -> None:
    sh = Path(os.path.realpath("/bin/sh"))
    if not sh.is_file() or sh.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("no ELF /bin/sh here")
    needed = uml._elf_dependencies(sh.read_bytes())
    assert "libc.so.6" in needed
    assert any(name.startswith("/lib") and "ld-linux" in name for name in needed)
