"""Apply generated scripts to a real kernel, read the state back with tc, compare with the IR.

Each policy runs in a fresh network namespace holding one veth device per interface the policy
names. The script is applied twice (it must be idempotent); after each run ``tc`` is asked what
the kernel holds, the text is parsed by ``tcdsl.verify.readback``, and every qdisc, class,
filter and iptables rule is compared with the allocated IR (``Result.policy``) by
``tcdsl.verify.expect`` and ``tcdsl.verify.compare`` (the code behind ``tcdsl verify``), which
derive the expected values from the IR independently of ``tcdsl.commands``: the test checks the
whole path IR -> tc words -> tc's parser -> kernel -> tc's printer.

A few policies also get traffic: UDP packets sent out of the interface must be counted by the
class the policy puts them in.

Policies needing a qdisc, classifier or tool this host lacks are skipped, naming what is
missing. The whole module is skipped when not root; every test is skipped when ``ip netns``
does not work.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import (
    DeviceState,
    KernelState,
    TcFilter,
    parse_classes,
    parse_filters,
    parse_iptables_save,
    parse_qdiscs,
)
from tcdsl.verify.runner import HostSupport, KernelUnavailable, host_support
from tests.conftest import ROOT, policy_files

if os.geteuid() != 0:
    pytest.skip("apply tests need root (network namespaces, tc)", allow_module_level=True)
for _tool in ("ip", "tc"):
    if shutil.which(_tool) is None:
        pytest.skip(f"apply tests need '{_tool}' (iproute2)", allow_module_level=True)

APPLY_POLICIES = ROOT / "tests" / "apply_policies"
"""Extra policies for the apply and verify tests, for more coverage (a host may lack some of
their qdiscs: ``tests/test_verify.py`` runs those in user-mode Linux)."""

TIMEOUT = 20
SCRIPT_TIMEOUT = 300
"""A generated script's bound: thousands of tc commands on a loaded host (found in a CI run
beside other kernel work: 5,000 filters took more than 20 s, 3 s on an idle host). A bound
catches a hang; speed is measured in bench/."""


_COUNTERS = re.compile(r"\b(direct_packets_stat) \d+")


# ==== host support, namespaces, running things =================================================


def run(
    args: list[str], check: bool = True, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the assertion shows its output."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert proc.returncode == 0, (
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


_names = itertools.count()


def _netns_name() -> str:
    return f"tcdsl-test-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="session")
def host() -> HostSupport:
    """What this host's kernel and tools can do (``tcdsl verify``'s probe, once per process)."""
    try:
        return host_support()
    except KernelUnavailable as exc:
        pytest.skip(str(exc))


def missing(host: HostSupport, result: Result) -> str | None:
    """Why the policy of ``result`` cannot be applied here, or None."""
    assert result.policy is not None
    lacks = host.lacks(expected_policy(result.policy).requirements)
    if not lacks:
        return None
    return "host lacks " + ", ".join(r.feature for r in lacks)


@pytest.fixture
def make_netns() -> Iterator[Callable[[], str]]:
    """A factory of fresh network namespaces, all deleted when the test ends, however it ends."""
    made: list[str] = []

    def make() -> str:
        name = _netns_name()
        run(["ip", "netns", "add", name])
        made.append(name)
        return name

    try:
        yield make
    finally:
        for name in made:
            run(["ip", "netns", "del", name], check=False)
        listed = run(["ip", "netns", "list"], check=False).stdout
        assert not any(name in listed.split() for name in made), f"namespaces left: {listed}"


def create_links(ns: str, policy: ir.Policy) -> list[str]:
    """One veth per interface the policy names (``classify ... from`` ones too), all up."""
    names: list[str] = []
    for iface in policy.interfaces:
        for name in (iface.name, iface.marking.from_interface if iface.marking else None):
            if name is not None and name not in names:
                names.append(name)
    peers = (p for p in (f"tcdslp{i}" for i in itertools.count()) if p not in names)
    for name in names:
        peer = next(peers)
        run(["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer])
        run(["ip", "-n", ns, "link", "set", name, "up"])
        run(["ip", "-n", ns, "link", "set", peer, "up"])
    return names


def apply_script(ns: str, script: Path) -> None:
    proc = run(["ip", "netns", "exec", ns, "sh", str(script)], check=False, timeout=SCRIPT_TIMEOUT)
    assert proc.returncode == 0, f"the script failed ({proc.returncode}):\n{proc.stderr}"


def read_device(ns: str, dev: str) -> DeviceState:
    """What tc shows for ``dev``; ``text`` (for idempotence) has the counters blanked."""

    def tc(*args: str) -> str:
        return run(["tc", "-n", ns, *args]).stdout

    qtext = tc("-d", "qdisc", "show", "dev", dev)
    ctext = tc("-d", "class", "show", "dev", dev)
    qdiscs, classes = parse_qdiscs(qtext), parse_classes(ctext)
    # Filters hang off qdiscs, and (for classful qdiscs) may hang off classes too.
    parents = [q.handle for q in qdiscs if q.handle != "0:"]
    parents += [c.classid for c in classes]
    texts = [qtext, ctext]
    filters: dict[str, list[TcFilter]] = {}
    for parent in parents:
        ftext = tc("filter", "show", "dev", dev, "parent", parent)
        texts.append(f"== filters of {parent}\n{ftext}")
        found = parse_filters(ftext)
        if found:
            filters[parent] = found
    # A packet the kernel sends on its own (IPv6 neighbour discovery) between two commands of
    # the script may take htb's direct queue; that counter is not state the script sets.
    text = _COUNTERS.sub(r"\1 N", "".join(texts))
    return DeviceState(dev, qdiscs, classes, filters, text)


def read_iptables(ns: str) -> str:
    return run(["ip", "netns", "exec", ns, "iptables-save", "-t", "mangle"]).stdout


def check_state(result: Result, state: KernelState) -> None:
    """Every qdisc, class, filter and iptables rule is as the policy says (``tcdsl verify``'s
    comparison, which reports the difference at its policy line)."""
    assert result.policy is not None
    problems = compare_state(expected_policy(result.policy, result.sources), state)
    texts = "".join(f"== {name}\n{dev.text}" for name, dev in state.devices.items())
    assert not problems, render(problems, result.sources) + texts


# ==== the tests ================================================================================


def _cases() -> list[Path]:
    extra = sorted(p.relative_to(ROOT) for p in APPLY_POLICIES.glob("*.tcp"))
    return [*policy_files(), *extra]


def _compile(path: Path) -> Result:
    result = compile_policy(str(ROOT / path))
    assert result.output is not None and result.policy is not None, render(
        result.diagnostics, result.sources
    )
    return result


def apply_and_check(ns: str, result: Result, tmp_path: Path) -> None:
    """Apply ``result`` twice in ``ns``; check the state after each run against the IR."""
    assert result.policy is not None and result.output is not None
    policy = result.policy
    create_links(ns, policy)
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    marking = any(i.marking for i in policy.interfaces)
    snapshots = []
    for _ in range(2):
        apply_script(ns, script)
        state = KernelState({i.name: read_device(ns, i.name) for i in policy.interfaces})
        if marking:
            state.iptables = parse_iptables_save(read_iptables(ns))
        check_state(result, state)
        snapshot = {name: dev.text for name, dev in state.devices.items()}
        if state.iptables is not None:
            rules = [r.text for rules in state.iptables.chains.values() for r in rules]
            snapshot["iptables"] = "\n".join(rules)
        snapshots.append(snapshot)
    assert snapshots[0] == snapshots[1], "the second run left a different state"


@pytest.mark.parametrize("policy", _cases(), ids=[str(p) for p in _cases()])
def test_apply(
    policy: Path, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    result = _compile(policy)
    assert result.policy is not None
    lacks = missing(host, result)
    if lacks:
        pytest.skip(f"{lacks} (needed by {policy})")
    apply_and_check(make_netns(), result, tmp_path)


# Policies tc cannot apply as written, or applies with another meaning (unaligned raw keys,
# contradicting conditions, peakrate without mtu): the compiler must reject them, or make
# them apply with their meaning.
def _htb(body: str) -> str:
    return f"interface eth0 htb rate 10mbit {{\n    {body}\n}}\n"


def _compile_text(tmp_path: Path, text: str) -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return compile_policy(str(path))


BUGS = [
    pytest.param(
        _htb("class a rate 1mbit match u32 0x12345678/0xffffffff at 2"),
        id="u32-unaligned",
    ),
    pytest.param(
        _htb("class a rate 1mbit match u16 0x1234/0xffff at 1"),
        id="u16-odd-offset",
    ),
    pytest.param(
        _htb("class a rate 1mbit match u16 0x1234/0xffff at 3"),
        id="u16-crosses-word",
    ),
    pytest.param(
        _htb("class a rate 1mbit match src 10.0.0.1 src 10.0.0.2"),
        id="contradictory-src",
    ),
    pytest.param(
        _htb("class a rate 1mbit match proto udp tcp-ack"),
        id="contradictory-proto",
    ),
    pytest.param(
        "interface eth0 tbf rate 1mbit burst 10k latency 50ms peakrate 2mbit\n",
        id="tbf-peakrate-without-mtu",
    ),
]


@pytest.mark.parametrize("text", BUGS)
def test_accepted_policy_applies_as_meant(
    text: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Whatever the compiler accepts, tc must apply, with the keys the policy means."""
    result = _compile_text(tmp_path, text)
    if result.output is None:
        assert result.errors, "rejected without an error"
        return
    assert result.policy is not None
    lacks = missing(host, result)
    if lacks:
        pytest.skip(lacks)
    apply_and_check(make_netns(), result, tmp_path)


# ==== htb quanta: tcdsl keeps every quantum in the kernel's range ==============================

QUANTA = [
    # The README's example: tc's r2q 10 suits the leaves, the link class gets its quantum.
    pytest.param(
        "interface eth0 htb rate 100mbit default bulk {\n"
        "    class voip prio 0 rate 6mbit match dport 5001\n"
        "    class bulk prio 2 rate 1mbit ceil 100mbit\n"
        "}\n",
        {"1:10": 75000, "1:20": 12500},
        id="readme-voip",
    ),
    # r2q 10 suits no leaf: tcdsl chooses r2q 100.
    pytest.param(
        "interface eth0 htb rate 100mbit default bulk {\n"
        "    class web rate 60mbit match dport 80\n"
        "    class bulk rate 40mbit\n"
        "}\n",
        {"1:10": 75000, "1:20": 50000},
        id="chosen-r2q",
    ),
    # 32kbit and 90mbit: no r2q suits both, so each leaf gets the quantum the kernel would keep.
    pytest.param(
        "interface eth0 htb rate 100mbit default bulk {\n"
        "    class ack rate 32kbit match tcp-ack\n"
        "    class bulk rate 90mbit\n"
        "}\n",
        {"1:10": 1000, "1:20": 200000},
        id="chosen-quanta",
    ),
]


@pytest.mark.parametrize(("text", "quanta"), QUANTA)
def test_htb_quanta_stay_in_the_kernels_range(
    text: str,
    quanta: dict[str, int],
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    result = _compile_text(tmp_path, text)
    assert result.output is not None and result.policy is not None
    assert result.diagnostics == [], render(result.diagnostics, result.sources)
    ns = make_netns()
    create_links(ns, result.policy)
    # The kernel's warning is observable here: tc prints it for the link class at r2q 10.
    run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb"])
    plain = ["tc", "-n", ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1"]
    assert "quantum of class 10001 is big" in run([*plain, "htb", "rate", "100mbit"]).stderr
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    proc = run(["ip", "netns", "exec", ns, "sh", str(script)])
    assert "quantum" not in proc.stdout + proc.stderr
    classes = read_device(ns, "eth0").classes
    shown = {c.classid: int(q) for c in classes if (q := c.opt("quantum")) is not None}
    assert shown == quanta
    assert all(1000 <= q <= 200000 for q in shown.values())
    check_state(result, KernelState({"eth0": read_device(ns, "eth0")}))


SEEDS_WITH_QUANTA = [
    "policies/seeds/s001-htb-700-300.tcp",
    "policies/seeds/s000-8.2-borrowing.tcp",
    "policies/seeds/s000-8.2-user-limits-routers.tcp",
]


def _quanta_state(ns: str, dev: str) -> tuple[list[str | None], dict[str, str | None]]:
    state = read_device(ns, dev)
    return [q.opt("r2q") for q in state.qdiscs], {
        c.classid: c.opt("quantum") for c in state.classes
    }


@pytest.mark.parametrize("seed", SEEDS_WITH_QUANTA)
def test_seed_keeps_the_quanta_of_its_commands(
    seed: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Where tcdsl would choose r2q or quanta, a seed policy still builds the r2q and the quanta
    of the seed's own tc commands (quoted in its comment)."""
    result = _compile(Path(seed))
    assert result.policy is not None and result.output is not None
    lacks = missing(host, result)
    if lacks:
        pytest.skip(f"{lacks} (needed by {seed})")
    (dev,) = [i.name for i in result.policy.interfaces]
    commands = [
        line.removeprefix("#   ").split()
        for line in (ROOT / seed).read_text(encoding="utf-8").splitlines()
        if line.startswith("#   tc ")
    ]
    ns = make_netns()
    create_links(ns, result.policy)
    for words in commands:
        run(["tc", "-n", ns, *words[1:]])
    seeded = _quanta_state(ns, dev)
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    apply_script(ns, script)
    assert _quanta_state(ns, dev) == seeded


# ==== traffic: packets end up in the class the policy says =====================================

SENDER = """
import socket, sys
for spec in sys.argv[2:]:
    port, tos = (int(x) for x in spec.split(","))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    for _ in range(int(sys.argv[1])):
        s.sendto(b"tcdsl", ("10.99.0.2", port))
"""
COUNT = 5


def apply_for_traffic(ns: str, result: Result, tmp_path: Path) -> None:
    """Apply ``result``'s script in ``ns``, ready for packets: the policy's first interface has
    10.99.0.1/24 and a static neighbour 10.99.0.2 (no ARP), and IPv6 is off (no chatter)."""
    assert result.policy is not None and result.output is not None
    sysctl = "net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
    run(["ip", "netns", "exec", ns, "sysctl", "-qw", *sysctl.split()])
    create_links(ns, result.policy)
    dev = result.policy.interfaces[0].name
    run(["ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", dev])
    run(["ip", "-n", ns, "neigh", "add", "10.99.0.2", "lladdr", "02:00:00:00:00:02", "dev", dev])
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    apply_script(ns, script)


def class_packets(ns: str, dev: str) -> dict[str, int]:
    """Packets sent per class (``tc -s class show``) and by htb directly (key ``direct``)."""
    out: dict[str, int] = {}
    current = None
    for line in run(["tc", "-n", ns, "-s", "class", "show", "dev", dev]).stdout.splitlines():
        words = line.split()
        if words[:1] == ["class"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current is not None:
            out[current] = int(words[3])
    qdiscs = run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev]).stdout
    out["direct"] = sum(int(n) for n in re.findall(r"direct_packets_stat (\d+)", qdiscs))
    return out


TRAFFIC = [
    pytest.param(
        "policies/seeds/s000-6.1-htb-limit.tcp", [(9, 0, "default")], id="seed-6.1-default"
    ),
    pytest.param(
        "policies/seeds/s004-tos-htb.tcp",
        [(9, 0x14, "1:10"), (9, 0x08, "1:30"), (9, 0, "default")],
        id="seed-tos",
    ),
    pytest.param(
        "tests/apply_policies/nested-htb.tcp",
        [
            (80, 0, "1:30"),
            (443, 0, "1:30"),
            (1500, 0, "1:5"),
            (2001, 0, "default"),
            (9, 0xB8, "1:40"),  # DSCP EF
            (9, 0x10, "1:40"),
        ],
        id="nested-htb",
    ),
    pytest.param(
        "interface eth0 htb rate 10mbit default staff {\n"
        "    class staff rate 5mbit { class a rate 1mbit }\n"
        "    class web rate 1mbit match dport 80\n"
        "}\n",
        [(9, 0, "default")],
        id="default-is-inner-class",
    ),
]


@pytest.mark.parametrize(("source", "sends"), TRAFFIC)
def test_traffic_reaches_its_class(
    source: str,
    sends: list[tuple[int, int, str]],
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    """UDP packets by destination port and TOS land in the class the policy says; unclassified
    ones in the default class, never in htb's unshaped direct queue."""
    if source.endswith(".tcp"):
        result = _compile(Path(source))
    else:
        result = _compile_text(tmp_path, source)
        if result.output is None:
            assert result.errors, "rejected without an error"
            return
    assert result.policy is not None and result.output is not None
    lacks = missing(host, result)
    if lacks:
        pytest.skip(lacks)
    iface = result.policy.interfaces[0]
    root = iface.root
    assert isinstance(root, ir.Htb)
    default = next(
        (c for t in root.classes for c in t.walk() if root.default and c.name == root.default.name),
        None,
    )
    ns = make_netns()
    apply_for_traffic(ns, result, tmp_path)
    dev = iface.name
    for port, tos, target in sends:
        is_default = target == "default"
        if is_default:
            assert default is not None and default.classid is not None
            target = str(default.classid)
        before = class_packets(ns, dev)
        sender = [sys.executable, "-c", SENDER, str(COUNT), f"{port},{tos}"]
        run(["ip", "netns", "exec", ns, *sender])
        after = class_packets(ns, dev)
        moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        moved = {k: v for k, v in moved.items() if v}
        where = f"UDP to port {port} with TOS {tos:#04x}"
        assert moved.get("direct", 0) == 0, f"{where} took htb's direct queue: {moved}"
        # Exactly COUNT packets; the default class may also carry the kernel's own (ARP, ...).
        got = moved.get(target, 0)
        assert got == COUNT or (is_default and got > COUNT), (
            f"{where} should reach {target}: {moved}"
        )
