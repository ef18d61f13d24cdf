"""``tcdsl.teach.classify`` against the kernel: for random htb + u32 policies and random packets,
the class ``classify`` names is the class whose counter the kernel moves.

Each generated policy is compiled and applied in a fresh network namespace holding one veth
(``tests/test_lint_kernel.py``'s ``_applied``); a sender inside the namespace writes each
packet on a raw IPv4 socket (``IPPROTO_RAW``, so protocol, TOS, addresses, ports and TCP flags
are exactly the generated ones: the bytes are ``Packet.header()`` plus zero payload to the
packet's size) to a neighbour with a static ARP entry, so it leaves through the veth's qdiscs.
After each packet exactly one leaf class counter (or htb's direct-queue counter) must have
moved, by one packet, and it must be the one of ``classify``'s verdict.

Skipped (with the reason) when not root, without iproute2, or when network namespaces do not
work (the fixtures of ``tests/test_apply.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from tcdsl import ir
from tcdsl.teach.classify import Verdict, classify
from tcdsl.teach.traffic import ETHERNET_HEADER, Packet, parse_packet
from tcdsl.verify.runner import HostSupport
from tests.test_apply import class_packets, run
from tests.test_lint_kernel import _applied, host, make_netns

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

DEV = "eth0"
NEIGHBOUR = "10.99.0.2"
"""``_applied`` gives the veth 10.99.0.1/24 and this neighbour a static ARP entry; a default
route through it sends every generated destination out of the veth."""

SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
for line in sys.stdin:
    data = bytes.fromhex(line.strip())
    s.sendto(data, (socket.inet_ntoa(data[16:20]), 0))
    print("sent", flush=True)
"""

# ---- generated policies and packets ----------------------------------------------------------

NETWORKS = ("10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "192.168.0.0/16", "172.16.5.5")
PORTS = ("22", "53", "80", "443", "5001", "1000-2000", "80-90", "3072/0xfc00")
TOS = ("tos 0x10", "tos 0x08/0x08", "dscp ef", "dscp af41", "tos 0x14/0xfc")
ADDRESSES = ("10.1.2.3", "10.1.9.9", "192.168.1.1", "172.16.5.5", "8.8.8.8")
PACKET_PORTS = (22, 53, 80, 85, 443, 1000, 1500, 2000, 2001, 3072, 4095, 5001, 40000)
PACKET_TOS = (0x00, 0x10, 0x08, 0xB8, 0x88, 0x14, 0x0C)


@st.composite
def match_lines(draw: st.DrawFn) -> str:
    """One match line from the pool: a few conditions, each field at most once."""
    conds: list[str] = []
    proto = draw(st.sampled_from((None, "tcp", "udp", "icmp", "tcp, udp")))
    if proto is not None:
        conds.append(f"proto {proto}")
    for field in ("src", "dst"):
        if draw(st.booleans()):
            conds.append(f"{field} {draw(st.sampled_from(NETWORKS))}")
    if proto != "icmp":  # icmp has no ports (E214)
        for field in ("sport", "dport"):
            if draw(st.integers(0, 2)) == 0:
                values = draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=2, unique=True))
                conds.append(f"{field} {', '.join(values)}")
    if draw(st.integers(0, 3)) == 0:
        conds.append(draw(st.sampled_from(TOS)))
    if proto in (None, "tcp") and draw(st.integers(0, 5)) == 0:
        conds.append("tcp-ack")
    if not conds:
        conds.append("all")
    pref = draw(st.sampled_from((None, None, 1, 2, 3)))
    return "match " + " ".join(conds) + (f" pref {pref}" if pref else "")


@st.composite
def policies(draw: st.DrawFn) -> str:
    """An htb policy: 2-4 classes with 0-2 match lines each, a default or none."""
    count = draw(st.integers(2, 4))
    names = [f"c{i}" for i in range(1, count + 1)]
    default = draw(st.sampled_from((None, *names)))
    head = "interface eth0 htb rate 100mbit r2q 100"
    lines = [head + (f" default {default}" if default else "") + " {  # tcdsl: disable=W310"]
    for name in names:
        matches = draw(st.lists(match_lines(), max_size=2))
        body = "".join(f"        {m}\n" for m in matches)
        lines.append(
            f"    class {name} rate 1mbit {{\n{body}    }}"
            if body
            else f"    class {name} rate 1mbit"
        )
    return "\n".join(lines) + "\n}\n"


@st.composite
def packets(draw: st.DrawFn) -> Packet:
    """A packet from the pool of addresses, ports, TOS values and sizes the policies use."""
    proto = draw(st.sampled_from(("tcp", "udp", "icmp")))
    words = [proto]
    words += ["src", draw(st.sampled_from(ADDRESSES)), "dst", draw(st.sampled_from(ADDRESSES))]
    if proto != "icmp":
        words += ["sport", str(draw(st.sampled_from(PACKET_PORTS)))]
        words += ["dport", str(draw(st.sampled_from(PACKET_PORTS)))]
    words += ["tos", str(draw(st.sampled_from(PACKET_TOS)))]
    if proto == "tcp" and draw(st.integers(0, 3)) == 0:
        words.append("ack")
    else:
        words += ["size", str(draw(st.sampled_from((54, 60, 78, 200, 1514))))]
    return parse_packet(" ".join(words))


def wire_bytes(packet: Packet) -> bytes:
    """The whole IP packet: the header ``classify`` reads, then zeros up to the packet's size."""
    header = packet.header()
    total = max(packet.size - ETHERNET_HEADER, len(header))
    return header + bytes(total - len(header))


# ---- the kernel's side ------------------------------------------------------------------------


@dataclass
class Sender:
    """A process inside the namespace writing packets on a raw socket, one per request."""

    proc: subprocess.Popen[str]

    def send(self, packet: Packet) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(wire_bytes(packet).hex() + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer == "sent\n", f"the sender failed: {answer!r}"


@contextmanager
def _sender(ns: str) -> Iterator[Sender]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield Sender(proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _leaf_counters(ns: str, leaves: set[str]) -> dict[str, int]:
    counts = class_packets(ns, DEV)
    return {k: v for k, v in counts.items() if k in leaves or k == "direct"}


def kernel_class(ns: str, sender: Sender, packet: Packet, leaves: set[str]) -> str:
    """Send ``packet`` and return the one counter it moved: a leaf class id, or ``direct``."""
    before = _leaf_counters(ns, leaves)
    sender.send(packet)
    moved: dict[str, int] = {}
    for _ in range(50):  # class counters move when the packet is dequeued
        after = _leaf_counters(ns, leaves)
        moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        if moved:
            break
        time.sleep(0.01)
    time.sleep(0.005)
    after = _leaf_counters(ns, leaves)
    moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert len(moved) == 1 and next(iter(moved.values())) == 1, (
        f"expected one counter to move by one packet, got {moved}"
    )
    return next(iter(moved))


def expected_counter(verdict: Verdict) -> str:
    """The counter ``classify``'s verdict says the packet moves."""
    if verdict.direct:
        return "direct"
    assert verdict.cls is not None and verdict.cls.classid is not None
    return str(verdict.cls.classid)


def assert_agrees(kernel: str, verdict: Verdict, policy: str, packet: Packet) -> None:
    """Fail, showing the policy, the packet and the verdict's reasons, on a disagreement."""
    expected = expected_counter(verdict)
    steps = "".join(f"\n    {s.span}: {s.why}" for s in verdict.steps)
    assert kernel == expected, (
        f"the kernel put the packet in {kernel}, classify says {expected}\n"
        f"packet: {packet.describe()}\npolicy:\n{policy}classify's steps:{steps}"
    )


def _leaves(policy: ir.Policy) -> set[str]:
    return {
        str(c.classid)
        for q in ir.walk_qdiscs(policy.interfaces[0].root)
        for c in ir.classes_of(q)
        if not c.children and c.classid is not None
    }


def _run_case(
    text: str,
    sends: list[Packet],
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> list[tuple[Packet, str, Verdict]]:
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert result.policy is not None
    run(["ip", "-n", ns, "route", "add", "default", "via", NEIGHBOUR, "dev", DEV])
    leaves = _leaves(result.policy)
    out = []
    with _sender(ns) as sender:
        for packet in sends:
            verdict = classify(result.policy, packet)
            out.append((packet, kernel_class(ns, sender, packet, leaves), verdict))
    return out


# ---- the tests ----------------------------------------------------------------------------------


@settings(
    derandomize=True,
    max_examples=30,
    deadline=None,
    # Each example applies a policy to a kernel: shrinking would take minutes, and a failure
    # already shows the policy, the packet and classify's reasons.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=policies(), sends=st.lists(packets(), min_size=6, max_size=6))
def test_classify_agrees_with_the_kernel(
    text: str,
    sends: list[Packet],
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    note(text)
    for packet, kernel, verdict in _run_case(text, sends, host, make_netns, tmp_path):
        assert_agrees(kernel, verdict, text, packet)
        reason = verdict.steps[0].why
        event("direct queue" if verdict.direct else reason.split(":")[0].split(" (")[0])


OFFICE_LIKE = (
    "interface eth0 htb rate 100mbit r2q 100 default bulk {\n"
    "    class voip rate 1mbit match proto udp dport 5001\n"
    "    class ack rate 1mbit match tcp-ack\n"
    "    class bulk rate 1mbit\n"
    "}\n"
)


def test_a_wrong_verdict_is_caught(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """The comparison can fail: the kernel's class for one packet against ``classify``'s
    verdict for another packet that lands elsewhere must be a failure."""
    voip, other = parse_packet("udp dport 5001"), parse_packet("udp dport 5002")
    ((_, kernel, right), (_, _, wrong)) = _run_case(
        OFFICE_LIKE, [voip, other], host, make_netns, tmp_path
    )
    assert kernel == "1:10"
    assert_agrees(kernel, right, OFFICE_LIKE, voip)
    with pytest.raises(AssertionError, match="the kernel put the packet in 1:10, classify says"):
        assert_agrees(kernel, wrong, OFFICE_LIKE, voip)


@pytest.mark.parametrize(
    ("spec", "counter"),
    [
        ("udp dport 5001", "1:10"),
        ("ack", "1:20"),
        ("tcp ack size 200", "1:30"),
        ("tcp dport 5001", "1:30"),
    ],
)
def test_fixed_cases(
    spec: str, counter: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """A few packets whose class is known by hand, so the sender itself is checked."""
    packet = parse_packet(spec)
    ((_, kernel, verdict),) = _run_case(OFFICE_LIKE, [packet], host, make_netns, tmp_path)
    assert kernel == counter
    assert_agrees(kernel, verdict, OFFICE_LIKE, packet)
