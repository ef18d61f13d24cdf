"""Safety of what tcdsl writes: chain names it may own, teardowns that touch only the policy's
own objects, the per-interface lock, and the failure message of the generated script.

The kernel tests run the real tc, iptables(-restore) and nft in throwaway network namespaces;
they are skipped (with the reason) when not root or when a tool is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tcdsl.backend import BackendOptions
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tcdsl.lock import interface_locks
from tcdsl.verify.runner import HostSupport
from tests.test_apply import create_links, host, make_netns, run

__all__ = ["host", "make_netns"]  # fixtures, used by name

if os.geteuid() != 0:
    pytest.skip("safety kernel tests need root (network namespaces)", allow_module_level=True)

HOSTILE_CHAINS = [
    "web&mail",
    "a b",
    "it's",
    "say`hi`",
    "$(id)",
    "semi;colon",
    "back\\slash",
    "star*",
    "-dash",
    "!bang",
    "a:b",
    "pct%d",
    "x" * 29,
    "ACCEPT",
    "output",
    "Mark.web-1_x",
]
"""Chain names an adversarial policy may give; the last one is fine as it is."""

MARKING = """interface eth0 htb rate 10mbit default rest {{
    classify by mark from {source}{chain}
    class web rate 5mbit match proto tcp dport 80
    class rest rate 1mbit
}}
"""


def _compile(
    tmp_path: Path, text: str, backend: str = "shell", marks: str = "iptables", batch: bool = False
) -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    options = BackendOptions(marks="nft" if marks == "nft" else "iptables", batch=batch)
    return compile_policy(str(path), backend, options=options)


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"'{tool}' is not installed")


def _marking(source: str = "eth1", chain: str | None = None) -> str:
    return MARKING.format(source=f'"{source}"', chain=f' chain "{chain}"' if chain else "")


def _start(ns: str, script: Path, tmp_path: Path, path: str = "") -> subprocess.Popen[str]:
    """Start ``script`` in namespace ``ns``, its lock folder in ``tmp_path`` (``path`` goes
    first in PATH)."""
    env = {**os.environ, "TCDSL_LOCK_DIR": str(tmp_path / "locks")}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, "sh", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _apply(ns: str, script: Path, tmp_path: Path, path: str = "") -> tuple[int, str]:
    """Run ``script`` in namespace ``ns`` (as :func:`_start`); its exit status and stderr."""
    proc = _start(ns, script, tmp_path, path)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


# ==== chain names ===============================================================================


@pytest.mark.parametrize("chain", HOSTILE_CHAINS)
def test_hostile_chain_name_is_refused_or_restores(
    chain: str, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """The tc-batch backend's .iptables file loads with the real iptables-restore, or the
    chain name gets a located E215/E216."""
    _need("iptables-restore")
    result = _compile(tmp_path, _marking(source="i;n'o&x", chain=chain), "tc-batch")
    if result.output is None:
        assert [d.code for d in result.errors] in (["E215"], ["E216"]), render(
            result.diagnostics, result.sources
        )
        assert result.errors[0].span.line == 2
        return
    assert chain == "Mark.web-1_x"
    restore = tmp_path / "policy.iptables"
    restore.write_text(result.files["policy.iptables"], encoding="utf-8")
    ns = make_netns()
    run(["ip", "netns", "exec", ns, "iptables-restore", "--noflush", "--test", str(restore)])
    run(["ip", "netns", "exec", ns, "iptables-restore", "--noflush", str(restore)])
    saved = run(["ip", "netns", "exec", ns, "iptables-save", "-t", "mangle"]).stdout
    assert f":{chain} - [0:0]" in saved


@pytest.mark.parametrize("iface", ["web&mail", "it's", "$(id)", "a\\b", "-x"])
def test_default_chain_of_a_hostile_interface_restores(
    iface: str, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    _need("iptables-restore")
    text = _marking(source=iface).replace("interface eth0", f'interface "{iface}"')
    result = _compile(tmp_path, text, "tc-batch")
    assert result.output is not None, render(result.diagnostics, result.sources)
    restore = tmp_path / "policy.iptables"
    restore.write_text(result.files["policy.iptables"], encoding="utf-8")
    ns = make_netns()
    run(["ip", "netns", "exec", ns, "iptables-restore", "--noflush", "--test", str(restore)])


# ==== teardowns touch only the policy's objects ================================================

FOREIGN_IPTABLES = [
    ["-A", "OUTPUT", "-p", "udp", "--dport", "53", "-j", "MARK", "--set-mark", "7"],
    ["-A", "PREROUTING", "-i", "eth1", "-p", "tcp", "--dport", "22", "-j", "RETURN"],
    ["-N", "theirs"],
    ["-A", "theirs", "-p", "tcp", "--dport", "25", "-j", "MARK", "--set-mark", "9"],
]


def _mangle(ns: str) -> list[str]:
    """The rules and foreign chain of the mangle tables, iptables' then ip6tables'."""
    lines = []
    for tool in ("iptables-save", "ip6tables-save"):
        saved = run(["ip", "netns", "exec", ns, tool, "-t", "mangle"]).stdout
        lines += [f"{tool}: {line}" for line in saved.splitlines()]
    return [line for line in lines if line.split(": ", 1)[1].startswith(("-A", ":theirs"))]


def _without_fw_filters(tmp_path: Path) -> Path:
    """A folder with a ``tc`` that runs the real one, except that it skips fw filters."""
    folder = tmp_path / "shim"
    folder.mkdir()
    real = shutil.which("tc")
    assert real is not None
    shim = folder / "tc"
    shim.write_text(
        f'#!/bin/sh\ncase " $* " in *" filter add "*" fw "*) exit 0 ;; esac\nexec {real} "$@"\n',
        encoding="utf-8",
    )
    shim.chmod(0o755)
    return folder


@pytest.mark.parametrize("marks", ["iptables", "nft"])
def test_teardown_leaves_other_rules_alone(
    marks: str, tmp_path: Path, make_netns: Callable[[], str], host: HostSupport
) -> None:
    """Running the script twice keeps every rule, chain and table it did not make."""
    _need("iptables", "ip6tables", "nft", "flock")
    result = _compile(tmp_path, _marking(), marks=marks)
    assert result.output is not None and result.policy is not None
    shim = ""
    if "fw" not in host.filters:
        # What is under test is iptables and nft; a host without cls_fw still runs them.
        shim = str(_without_fw_filters(tmp_path))
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    ns = make_netns()
    create_links(ns, result.policy)
    for rule in FOREIGN_IPTABLES:
        for tool in ("iptables", "ip6tables"):
            run(["ip", "netns", "exec", ns, tool, "-t", "mangle", *rule])
    run(["ip", "netns", "exec", ns, "nft", "add", "table", "inet", "theirs"])
    before = _mangle(ns)
    for _ in range(2):
        status, err = _apply(ns, script, tmp_path, shim)
        assert status == 0, err
    after = _mangle(ns)
    assert [line for line in after if "TCDSL-eth0" not in line] == before
    if marks == "iptables":
        for tool in ("iptables-save", "ip6tables-save"):
            assert any(line.startswith(tool) and "-j TCDSL-eth0" in line for line in after)
    tables = run(["ip", "netns", "exec", ns, "nft", "list", "tables"]).stdout
    assert "table inet theirs" in tables
    assert ("table inet tcdsl_eth0" in tables) == (marks == "nft")
    # The removal a failure message offers removes what the policy made, and only that.
    undo = next(line for line in result.output.splitlines() if line.startswith("tcdsl_undo='"))
    run(["ip", "netns", "exec", ns, "sh", "-c", f'{undo}; eval "$tcdsl_undo"'])
    assert _mangle(ns) == before
    tables = run(["ip", "netns", "exec", ns, "nft", "list", "tables"]).stdout
    assert "table inet theirs" in tables and "tcdsl" not in tables
    assert "htb" not in run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"]).stdout


# ==== the lock ==================================================================================

EIGHT_U32 = """interface eth0 htb rate 10mbit default rest {
    class a rate 1mbit match dport 22
    class b rate 1mbit match dport 25
    class c rate 1mbit match dport 53
    class d rate 1mbit match dport 80
    class e rate 1mbit match dport 443
    class f rate 1mbit match dport 993
    class g rate 1mbit match dport 5060
    class rest rate 1mbit
}
"""


def _filter_count(ns: str, dev: str) -> int:
    shown = run(["tc", "-n", ns, "filter", "show", "dev", dev, "parent", "1:"]).stdout
    return sum(1 for line in shown.splitlines() if "flowid" in line)


@pytest.mark.parametrize("batch", [False, True], ids=["commands", "batch"])
def test_two_runs_at_once_leave_the_policy(
    batch: bool, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """Cron and a person run the script at the same moment: the lock makes one wait, so the
    interface ends with the policy's filters, never both runs' (without the lock this fails
    within a few rounds)."""
    _need("flock")
    result = _compile(tmp_path, EIGHT_U32, batch=batch)
    assert result.output is not None and result.policy is not None
    want = len(result.policy.interfaces[0].filters)
    assert want == 21  # per port: one IPv4 filter, IPv6 ones for TCP and UDP
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    ns = make_netns()
    create_links(ns, result.policy)
    for _ in range(15):
        procs = [_start(ns, script, tmp_path) for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        assert _filter_count(ns, "eth0") == want


def test_script_waits_for_tcdsl_lock(tmp_path: Path, make_netns: Callable[[], str]) -> None:
    """tcdsl's own lock (tcdsl.lock) is the one the script takes: the script waits for it."""
    _need("flock")
    result = _compile(tmp_path, EIGHT_U32)
    assert result.output is not None and result.policy is not None
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    ns = make_netns()
    create_links(ns, result.policy)
    locks = tmp_path / "locks"
    os.environ["TCDSL_LOCK_DIR"] = str(locks)
    try:
        with interface_locks(["eth0"]):
            proc = _start(ns, script, tmp_path)
            time.sleep(1.5)
            assert proc.poll() is None, "the script ran while tcdsl held the interface's lock"
            assert _filter_count(ns, "eth0") == 0
    finally:
        del os.environ["TCDSL_LOCK_DIR"]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _filter_count(ns, "eth0") == 21
    assert (locks / "tcdsl-eth0.lock").exists()


# ==== the failure message =======================================================================

TWO_INTERFACES = """interface eth0 htb rate 10mbit default rest {
    class rest rate 1mbit
}
interface eth9 htb rate 10mbit default rest {
    class rest rate 1mbit match dport 80
}
"""


@pytest.mark.parametrize("batch", [False, True], ids=["commands", "batch"])
def test_failure_names_the_policy_line(
    batch: bool, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """A command the kernel refuses stops the script, which names the policy line, says the
    interface is left partly configured, and how to remove it."""
    _need("flock")
    path = tmp_path / "policy.tcp"
    result = _compile(tmp_path, TWO_INTERFACES, batch=batch)
    assert result.output is not None
    script = tmp_path / "apply.sh"
    # eth9's first command is one tc refuses (an htb parameter that does not exist)
    bad = result.output.replace("dev eth9 root handle 1: htb", "dev eth9 root handle 1: htb bogus")
    assert bad != result.output
    script.write_text(bad, encoding="utf-8")
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p0"])
    run(["ip", "-n", ns, "link", "add", "eth9", "type", "veth", "peer", "name", "p9"])
    status, err = _apply(ns, script, tmp_path)
    assert status != 0
    last = err.splitlines()[-1]
    assert last.startswith(f"tcdsl: {path}:4:16: interface eth9: htb qdisc: failed (exit "), last
    assert last.endswith(
        "eth9 is left partly configured; re-run after fixing, or remove it with: "
        "tc qdisc del dev eth9 root"
    ), last
    assert "qdisc htb 1:" in run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"]).stdout


@pytest.mark.parametrize("batch", [False, True])
def test_a_missing_interface_changes_nothing(
    batch: bool, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """Checked before anything changes: eth9 missing, eth0 (first in the script) keeps its
    own qdisc and no error claims it was left partly configured."""
    _need("flock")
    result = _compile(tmp_path, TWO_INTERFACES, batch=batch)
    assert result.output is not None
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p0"])
    run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "7:", "pfifo"])
    status, err = _apply(ns, script, tmp_path)
    assert (status, err) == (1, "tcdsl: there is no interface eth9 here; nothing was changed\n")
    assert "qdisc pfifo 7:" in run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"]).stdout


def test_batch_failure_in_the_middle_names_its_line(
    tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """tc -batch names the failed line of its input; the script maps it to the policy line
    (here the fourth class, whose rate is edited to one tc refuses)."""
    _need("flock")
    path = tmp_path / "policy.tcp"
    result = _compile(tmp_path, EIGHT_U32, batch=True)
    assert result.output is not None and result.policy is not None
    bad = result.output.replace("classid 1:40 htb rate 1mbit", "classid 1:40 htb rate 0bit")
    assert bad != result.output
    script = tmp_path / "apply.sh"
    script.write_text(bad, encoding="utf-8")
    ns = make_netns()
    create_links(ns, result.policy)
    status, err = _apply(ns, script, tmp_path)
    assert status != 0
    assert "Command failed -:" in err
    assert err.splitlines()[-1].startswith(f"tcdsl: {path}:5:11: class d: failed"), err


@pytest.mark.parametrize("sigpipe", ["default", "ignored"])
def test_batch_failure_early_in_a_long_batch_names_its_line(
    sigpipe: str, tmp_path: Path, make_netns: Callable[[], str]
) -> None:
    """tc stops at the failed line and leaves the rest of a long batch (far more than a
    pipe holds) unread: the script still names the failed line's policy text, read back from
    the batch it kept, and says nothing about the unread rest, whether SIGPIPE kills the
    writer or (a shell started with it ignored) the writer's write fails."""
    _need("flock")
    path = tmp_path / "policy.tcp"
    classes = "".join(f"    class c{i} rate 1kbit match dport {1000 + i}\n" for i in range(1500))
    text = (
        f"interface eth0 htb rate 100mbit default rest {{\n{classes}    class rest rate 1mbit\n}}\n"
    )
    result = _compile(tmp_path, text, batch=True)
    assert result.output is not None and result.policy is not None
    bad = result.output.replace(" htb rate 1kbit", " htb rate 0bit", 3)
    assert bad != result.output and len(bad) > 200_000
    script = tmp_path / "apply.sh"
    script.write_text(bad, encoding="utf-8")
    ns = make_netns()
    create_links(ns, result.policy)
    disposition = signal.SIG_IGN if sigpipe == "ignored" else signal.SIG_DFL
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "sh", str(script)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TCDSL_LOCK_DIR": str(tmp_path / "locks")},
        preexec_fn=lambda: signal.signal(signal.SIGPIPE, disposition),
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.splitlines()
    assert lines[-1].startswith(f"tcdsl: {path}:2:11: class c0: failed (exit 1)"), err
    assert len(lines) == 3 and lines[1].startswith("Command failed -:"), err
