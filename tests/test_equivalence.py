"""The shell script and the tc batch build the same kernel state; iptables and nft set the
same marks on the same packets.

Each policy is applied twice in fresh network namespaces, once as the shell script and once as
the tc-batch output (``tc -batch`` + ``iptables-restore``), and the read-back (qdiscs, classes
with their parameters, filters in order, the mangle chain) must be identical. Policies the host
kernel cannot hold run, all together, in one user-mode Linux boot. Marking is compared with
traffic: UDP and TCP packets from a peer namespace go through the iptables rules, then through
the nft ruleset, and per-mark counters must agree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tcdsl.driver import Result, compile_policy
from tcdsl.verify import runner, verifier
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import KernelState
from tcdsl.verify.verifier import batch_applier
from tests.conftest import ROOT, policy_files

if os.geteuid() != 0:
    pytest.skip("equivalence tests need root (network namespaces, tc)", allow_module_level=True)

APPLY_POLICIES = ROOT / "tests" / "apply_policies"
MARKING = [
    ROOT / "policies/seeds/s000-10.1-marks.tcp",
    ROOT / "policies/seeds/s000-10.2-marks-sharing.tcp",
]


def _policies() -> list[Path]:
    return [ROOT / p for p in policy_files()] + sorted(APPLY_POLICIES.glob("*.tcp"))


def _compile(path: Path, backend: str) -> Result:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = compile_policy(path.relative_to(ROOT).as_posix(), backend)
    finally:
        os.chdir(cwd)
    assert result.output is not None and result.policy is not None
    return result


def _cases(path: Path) -> tuple[runner.Case, runner.Case, list[str], bool]:
    """The shell case and the batch case of one policy, the devices to read, iptables or not."""
    shell, batch = _compile(path, "shell"), _compile(path, "tc-batch")
    assert shell.policy is not None and batch.policy is not None
    create, read = verifier.devices(shell.policy)
    queues = verifier.tx_queues(shell.policy)
    ipt = any(i.marking is not None for i in shell.policy.interfaces)
    applier, files = batch_applier(batch.policy, batch.files)
    applier += applier  # applied twice: re-applying must change nothing
    return (
        runner.Case(
            f"{path.name} shell",
            runner.case_script(
                "shell", shell.output or "", create, read, iptables=ipt, queues=queues
            ),
        ),
        runner.Case(
            f"{path.name} batch",
            runner.case_script(
                "batch", applier, create, read, iptables=ipt, files=files, queues=queues
            ),
        ),
        read,
        ipt,
    )


def _state(result: runner.CaseResult | None, read: list[str]) -> KernelState:
    assert result is not None, "the guest stopped before this case"
    found = runner.sections(result.stdout)
    applied = found.get("apply-stderr")
    assert applied is not None and applied.status == 0, (
        f"{result.name} failed:\n{result.stdout}{result.stderr}"
    )
    return runner.read_state(found, read)


_COUNTERS = re.compile(
    r"(?<=direct_packets_stat )\d+|(?<=police 0x)[0-9a-f]+|index \d+ ref \d+ bind \d+"
)
"""What tc prints that is not configuration: packets htb's direct queue has seen (a packet the
guest sends while a tree is being built, such as an IPv6 router solicitation), and the index
and reference counts the kernel gives each action as it is created."""


_FLOW_CLASS = re.compile(r"^class (sfq|fq_codel|cake) [0-9a-f]+:[0-9a-f]+ .*\n", re.M)
"""A class sfq, fq_codel and cake show for each flow while it holds packets: traffic the guest
itself sends (IPv6 neighbour discovery) makes some, at no fixed moment."""
_FLOW_KINDS = ("sfq", "fq_codel", "cake")


def _config(text: str, majors: frozenset[str] = frozenset()) -> str:
    """``text`` without counters and flow classes (those under the flow qdiscs ``majors``,
    whose filters the read-back lists too: a flow class may come between reading the classes
    and listing the parents, so it is left out by its major, not by the class list)."""
    text = _FLOW_CLASS.sub("", text)
    text = "".join(
        line
        for line in text.splitlines(keepends=True)
        if not (line.startswith("== filters of ") and _under(line[14:].strip(), majors))
    )
    return _COUNTERS.sub("#", text)


def _under(key: str, majors: frozenset[str]) -> bool:
    """Whether a class id is a flow class of one of the qdiscs ``majors`` (``30:``)."""
    return key.split(":")[0] + ":" in majors and not key.endswith(":")


def _same(shell: KernelState, batch: KernelState) -> None:
    for name, dev in shell.devices.items():
        other = batch.devices[name]
        assert [(q.kind, q.handle, q.parent, _config(" ".join(q.words))) for q in dev.qdiscs] == [
            (q.kind, q.handle, q.parent, _config(" ".join(q.words))) for q in other.qdiscs
        ]
        # the flow classes of either read-back: classes under a flow qdisc's handle
        majors = frozenset(q.handle for q in [*dev.qdiscs, *other.qdiscs] if q.kind in _FLOW_KINDS)
        configured = [c for c in dev.classes if c.kind not in _FLOW_KINDS]
        assert configured == [c for c in other.classes if c.kind not in _FLOW_KINDS]
        assert {k: v for k, v in dev.filters.items() if not _under(k, majors)} == {
            k: v for k, v in other.filters.items() if not _under(k, majors)
        }
        assert _config(dev.text, majors) == _config(other.text, majors)
    if shell.iptables is None or batch.iptables is None:
        assert shell.iptables is batch.iptables
    else:
        assert shell.iptables.chains == batch.iptables.chains


def _support() -> runner.HostSupport:
    try:
        return runner.host_support()
    except runner.KernelUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")


def _split() -> tuple[list[Path], list[Path]]:
    """Policies the host can hold, and the others (cbq, which no kernel has, left out)."""
    support = _support()
    host, guest = [], []
    for path in _policies():
        result = _compile(path, "shell")
        assert result.policy is not None
        expected = expected_policy(result.policy, result.sources)
        if expected.needs("sch_cbq") is not None:
            continue
        (guest if support.lacks(expected.requirements) else host).append(path)
    return host, guest


def test_shell_and_batch_build_the_same_state_on_the_host() -> None:
    host, _ = _split()
    if not host:
        pytest.skip("the host kernel holds none of the policies")
    planned = [_cases(p) for p in host]
    cases = [c for shell, batch, _, _ in planned for c in (shell, batch)]
    results = runner.run_on_host(cases)
    for n, (_, _, read, _) in enumerate(planned):
        _same(_state(results[2 * n], read), _state(results[2 * n + 1], read))
    print(f"host: {len(planned)} policies: {', '.join(p.name for p in host)}")


def test_shell_and_batch_build_the_same_state_in_uml() -> None:
    _, guest = _split()
    if not guest:
        pytest.skip("the host kernel holds every policy")
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    planned = [_cases(p) for p in guest]
    cases = [c for shell, batch, _, _ in planned for c in (shell, batch)]
    results = runner.run_on_uml(cases)
    for n, (_, _, read, _) in enumerate(planned):
        _same(_state(results[2 * n], read), _state(results[2 * n + 1], read))
    print(f"uml: {len(planned)} policies: {', '.join(p.name for p in guest)}")


# ==== iptables vs nft: the same marks on the same packets ======================================

_SEND = r"""
import socket
udp = [("udp", p, t) for p in (22, 53, 80, 443, 5001, 5002, 5003) for t in (0, 0x10, 0xb8)]
tcp = [("tcp", p, t) for p in (22, 80, 443, 5001, 5002) for t in (0, 0x10)]
for proto, port, tos in udp + tcp:
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    s.settimeout(0.2)
    try:
        if proto == "udp":
            s.sendto(b"x", ("10.99.0.1", port))
        else:
            s.connect(("10.99.0.1", port))
    except OSError:
        pass
    s.close()
"""


def _sh(ns: str, script: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, "sh", "-ec", script],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"{script}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    """A namespace with the policy's incoming interface, and a peer that sends into it."""
    pid = os.getpid()
    ns, peer = f"tcdsl-eq-{pid}", f"tcdsl-eqp-{pid}"
    try:
        for name in (ns, peer):
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        yield ns, peer
    finally:
        for name in (ns, peer):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


XTABLES = ("iptables", "ip6tables")


def _counts(ns: str, marks: list[int], tool: str) -> dict[int, int]:
    if tool == "iptables":
        got = dict.fromkeys(marks, 0)
        for table in XTABLES:
            listed = subprocess.run(
                ["ip", "netns", "exec", ns, table, "-t", "mangle", "-nvxL", "TCDSL-COUNT"],
                capture_output=True,
                text=True,
                check=False,
            )
            rows = [line.split() for line in listed.stdout.splitlines()[2:]]
            for m, row in zip(marks, rows, strict=len(rows) > 0):
                got[m] += int(row[0])
        return got
    text = _sh(ns, "nft list table inet tcdsl_count")
    got = {}
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["meta", "mark"] and "packets" in words:
            got[int(words[2], 0)] = int(words[words.index("packets") + 1])
    return got


@pytest.mark.parametrize("path", MARKING, ids=lambda p: p.name)
def test_iptables_and_nft_set_the_same_marks(path: Path, namespaces: tuple[str, str]) -> None:
    for tool in ("iptables", "iptables-restore", "ip6tables-restore", "nft", "python3"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs '{tool}'")
    ns, peer = namespaces
    ipt, batch, nft = (_compile(path, b) for b in ("shell", "tc-batch", "nft"))
    assert ipt.policy is not None and nft.output is not None
    marking = [i.marking for i in ipt.policy.interfaces if i.marking is not None]
    marks = sorted({r.mark for m in marking for r in m.rules})
    src = marking[0].from_interface
    # The packets sent are IPv4: no IPv6 chatter, whose timing would make the counts differ.
    off = "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
    for name in (ns, peer):
        _sh(name, off)
    link = f"ip link add {src} type veth peer name tvp netns {peer}"
    _sh(ns, f"{link}; ip addr add 10.99.0.1/24 dev {src}; ip link set {src} up")
    _sh(peer, "ip addr add 10.99.0.2/24 dev tvp; ip link set tvp up; ip link set lo up")
    results: dict[str, dict[int, int]] = {}
    for tool in ("iptables", "nft"):
        if tool == "iptables":
            # iptables for IPv4, ip6tables for IPv6
            for name, text in batch.files.items():
                for family in XTABLES:
                    if name.endswith(f".{family}"):
                        _sh(ns, f"{family}-restore --noflush", text)
                        count = ["-N TCDSL-COUNT", "-A PREROUTING -j TCDSL-COUNT"]
                        count += [f"-A TCDSL-COUNT -m mark --mark {m}" for m in marks]
                        _sh(ns, "; ".join(f"{family} -t mangle {c}" for c in count))
        else:
            _sh(ns, "; ".join(f"{t} -t mangle -F; {t} -t mangle -X" for t in XTABLES))
            try:
                _sh(ns, "nft -f -", nft.output)
            except AssertionError as exc:
                pytest.skip(f"nft does not work here: {exc}")
            hook = "type filter hook prerouting priority mangle + 10;"
            counting = "".join(f"meta mark {m} counter\n" for m in marks)
            _sh(
                ns, "nft -f -", f"table inet tcdsl_count {{\nchain c {{\n{hook}\n{counting}}}\n}}\n"
            )
        _sh(peer, "python3 -", _SEND)
        results[tool] = _counts(ns, marks, tool)
    assert results["iptables"] == results["nft"]
    assert sum(results["nft"].values()) > 0 and len([v for v in results["nft"].values() if v]) > 1
    print(f"{path.name}: packets per mark {results['nft']}")
