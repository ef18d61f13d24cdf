"""``tcdsl.teach.classify`` against the kernel: for random htb policies and random IPv4 and
IPv6 packets, the class ``classify`` names is the class whose counter the kernel moves.

Each packet is written whole, as an Ethernet frame (``frame``: a header, then
``Packet.ip_packet()``, the bytes ``classify`` reads), on an ``AF_PACKET`` socket bound to the
shaped device, so it passes the device's qdiscs exactly as generated: protocol, TOS or traffic
class, addresses, ports, TCP flags, IPv6 extension headers (hop-by-hop, routing, destination
options, AH, a first or a later fragment) and IPv4 fragments. After each packet exactly one
leaf class counter (or htb's direct-queue counter) must have moved, by one packet, and it
must be the one of ``classify``'s verdict.

- The host kernel (u32; it has no flower): each generated policy is applied in a fresh network
  namespace holding one veth (``tests/test_lint_kernel.py``'s ``_applied``); a Python sender
  in the namespace writes the frames. One hypothesis example per policy.
- User-mode Linux (flower, and u32 too): a batch of policies drawn up front from a seeded
  generator, one case each in one boot; the guest has no Python, so the sender is
  ``tests/packet_sender.c``, compiled here (without a C library) and carried in the case
  script.

Both print how many packets ran per kernel, classifier, family and extension header (``-s``).
Skipped (with the reason) when not root, without iproute2, when network namespaces do not
work (the fixtures of ``tests/test_apply.py``), where user-mode Linux cannot run, or without a
C compiler for the guest's sender.
"""

from __future__ import annotations

import base64
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from tcdsl import ir
from tcdsl.driver import Result
from tcdsl.kernels import uml
from tcdsl.teach.classify import Verdict, classify
from tcdsl.teach.traffic import EXTENSION_NAMES, Packet, parse_packet
from tcdsl.verify import runner
from tcdsl.verify.runner import HostSupport
from tests.test_apply import _compile_text, class_packets
from tests.test_lint_kernel import _applied, host, make_netns

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

DEV = "eth0"
NEIGHBOUR_MAC = bytes.fromhex("020000000002")
OWN_MAC = bytes.fromhex("020000000001")
ETHERTYPES = {"ipv4": 0x0800, "ipv6": 0x86DD}

SENDER = """
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
for line in sys.stdin:
    frame = bytes.fromhex(line.strip())
    s.sendto(frame, (sys.argv[1], int.from_bytes(frame[12:14], "big")))
    print("sent", flush=True)
"""

# ---- generated policies and packets ----------------------------------------------------------

NETWORKS = {
    "ipv4": ("10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "192.168.0.0/16", "172.16.5.5"),
    "ipv6": ("2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::5", "fe80::/10", "::1"),
}
PORTS = ("22", "53", "80", "443", "5001", "1000-2000", "80-90", "3072/0xfc00")
TOS = ("tos 0x10", "tos 0x08/0x08", "dscp ef", "dscp af41", "tos 0x14/0xfc")
ADDRESSES = {
    "ipv4": ("10.1.2.3", "10.1.9.9", "192.168.1.1", "172.16.5.5", "8.8.8.8"),
    "ipv6": ("2001:db8:1::5", "2001:db8:2::9", "fe80::1", "::1", "2001:db9::1"),
}
PACKET_PORTS = (22, 53, 80, 85, 443, 1000, 1500, 2000, 2001, 3072, 4095, 5001, 40000)
PACKET_TOS = (0x00, 0x10, 0x08, 0xB8, 0x88, 0x14, 0x0C)
PROTOS = {"ipv4": ("tcp", "udp", "icmp"), "ipv6": ("tcp", "udp", "icmpv6")}
EXTENSIONS = ("hbh", "dstopt", "rthdr", "auth", "frag", "laterfrag")
"""IPv6 extension headers a packet may carry (``frag`` and ``laterfrag`` on IPv4 too)."""
FAMILY_WORDS = {"ipv4": ("ipv4",), "ipv6": ("ipv6",), "both": ("ipv4", "ipv6")}

Between = Callable[[int, int], int]
"""Draws an integer in [lo, hi]: hypothesis on the host, a seeded generator for the batch."""


def _pick(between: Between, options: tuple[str, ...]) -> str:
    return options[between(0, len(options) - 1)]


def _chance(between: Between, p: float) -> bool:
    """True with probability about ``p``; False for a draw of 0 (where hypothesis starts)."""
    return between(0, 999) >= 1000 - int(p * 1000)


def match_line(between: Between, families: tuple[str, ...], flower: bool) -> str:
    """One match line from the pool: a few conditions, each field at most once, keeping to
    one family where it names addresses or ICMP (flower: nothing flower cannot say)."""
    conds: list[str] = []
    family: str | None = None
    if _chance(between, 0.5):
        family = _pick(between, families)
        if _chance(between, 0.3):
            conds.append(f"family {family}")
    protos = ("tcp", "udp", "tcp, udp") + (
        ("icmp",) if family == "ipv4" else ("icmpv6",) if family == "ipv6" else ("icmp, icmpv6",)
    )
    proto = _pick(between, ("", *protos))
    if proto:
        conds.append(f"proto {proto}")
    for field in ("src", "dst"):
        if family is not None and _chance(between, 0.4):
            conds.append(f"{field} {_pick(between, NETWORKS[family])}")
    if "icmp" not in proto:  # icmp has no ports (E214)
        for field in ("sport", "dport"):
            if between(0, 2) == 0:
                count = between(1, 2)
                values = dict.fromkeys(_pick(between, PORTS) for _ in range(count))
                conds.append(f"{field} {', '.join(values)}")
    if between(0, 3) == 0:
        conds.append(_pick(between, TOS))
    if not flower and proto in ("", "tcp") and between(0, 5) == 0:
        conds.append("tcp-ack")
    if not conds:
        conds.append("all")
    pref = _pick(between, ("", "", "1", "2", "3"))
    return "match " + " ".join(conds) + (f" pref {pref}" if pref else "")


def policy_text(between: Between, classifiers: tuple[str, ...] = ("u32",)) -> str:
    """An htb policy: 2-4 classes with 0-2 match lines each, a default or none; both families
    or one (``family``), ``classifier`` one of ``classifiers``."""
    count = between(2, 4)
    names = [f"c{i}" for i in range(1, count + 1)]
    default = _pick(between, ("", *names))
    family = _pick(between, ("", "", "both", "ipv4", "ipv6"))
    classifier = _pick(between, classifiers)
    words = ["interface", DEV]
    words += [f"family {family}"] if family else []
    words += [f"classifier {classifier}"] if classifier != "u32" else []
    words += ["htb", "rate", "100mbit", "r2q", "100"] + ([f"default {default}"] if default else [])
    lines = [" ".join(words) + " {  # tcdsl: disable=W310"]
    families = FAMILY_WORDS[family or "both"]
    for name in names:
        matches = [
            match_line(between, families, classifier == "flower") for _ in range(between(0, 2))
        ]
        body = "".join(f"        {m}\n" for m in matches)
        lines.append(
            f"    class {name} rate 10mbit {{\n{body}    }}"
            if body
            else f"    class {name} rate 10mbit"
        )
    return "\n".join(lines) + "\n}\n"


def packet_spec(between: Between) -> str:
    """A packet from the pool of addresses, ports, TOS values, extension headers and sizes the
    policies use, in ``classify --packet``'s words."""
    family = _pick(between, ("ipv4", "ipv6"))
    proto = _pick(between, PROTOS[family])
    words = [family, proto]
    words += ["src", _pick(between, ADDRESSES[family]), "dst", _pick(between, ADDRESSES[family])]
    if not proto.startswith("icmp"):
        words += ["sport", str(_pick(between, tuple(map(str, PACKET_PORTS))))]
        words += ["dport", str(_pick(between, tuple(map(str, PACKET_PORTS))))]
    words += ["tos", _pick(between, tuple(map(str, PACKET_TOS)))]
    if family == "ipv6" and _chance(between, 0.4):
        words += dict.fromkeys(_pick(between, EXTENSIONS) for _ in range(between(1, 2)))
        if "frag" in words and "laterfrag" in words:
            words.remove("laterfrag")
    elif family == "ipv4" and _chance(between, 0.1):
        words.append(_pick(between, ("frag", "laterfrag")))
    if proto == "tcp" and between(0, 3) == 0:
        words.append("ack")
    else:
        words += ["size", _pick(between, ("110", "200", "600", "1514"))]
    return " ".join(words)


@st.composite
def policies(draw: st.DrawFn) -> str:
    """``policy_text`` for the host kernel (u32 only: it has no flower)."""
    return policy_text(lambda lo, hi: draw(st.integers(lo, hi)))


@st.composite
def packets(draw: st.DrawFn) -> Packet:
    """``packet_spec``, parsed."""
    return parse_packet(packet_spec(lambda lo, hi: draw(st.integers(lo, hi))))


def frame(packet: Packet) -> bytes:
    """The Ethernet frame the sender writes: to the neighbour, then the whole IP packet."""
    kind = ETHERTYPES[packet.family].to_bytes(2, "big")
    return NEIGHBOUR_MAC + OWN_MAC + kind + packet.ip_packet()


def kind_of(packet: Packet) -> str:
    """How the counts name a packet: its family and its extension headers, if any."""
    exts = "+".join(EXTENSION_NAMES[e] for e in packet.ext)
    return packet.family + (f" {exts}" if exts else "")


# ---- the kernel's side ------------------------------------------------------------------------


@dataclass
class Sender:
    """A process inside the namespace writing frames on an AF_PACKET socket, one per request."""

    proc: subprocess.Popen[str]

    def send(self, packet: Packet) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(frame(packet).hex() + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer == "sent\n", f"the sender failed: {answer!r}"


@contextmanager
def _sender(ns: str) -> Iterator[Sender]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, DEV],
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


def moved_counter(before: dict[str, int], after: dict[str, int]) -> str:
    """The one counter that moved, by one packet, between two readings."""
    moved = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert len(moved) == 1 and next(iter(moved.values())) == 1, (
        f"expected one counter to move by one packet, got {moved}"
    )
    return next(iter(moved))


def kernel_class(ns: str, sender: Sender, packet: Packet, leaves: set[str]) -> str:
    """Send ``packet`` and return the one counter it moved: a leaf class id, or ``direct``."""
    before = _leaf_counters(ns, leaves)
    sender.send(packet)
    for _ in range(50):  # class counters move when the packet is dequeued
        if _leaf_counters(ns, leaves) != before:
            break
        time.sleep(0.01)
    time.sleep(0.005)
    return moved_counter(before, _leaf_counters(ns, leaves))


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
    leaves = _leaves(result.policy)
    out = []
    with _sender(ns) as sender:
        for packet in sends:
            verdict = classify(result.policy, packet)
            out.append((packet, kernel_class(ns, sender, packet, leaves), verdict))
    return out


COUNTS: Counter[str] = Counter()
"""Packets sent and agreed on, by kernel, classifier, family and extension headers."""


def _print_counts(kernel: str) -> None:
    mine = sorted((k, n) for k, n in COUNTS.items() if k.startswith(kernel + " "))
    families: Counter[str] = Counter()
    for k, n in mine:
        families[" ".join(k.split()[:3])] += n
    print(
        f"\nclassify agrees with {kernel}: " + ", ".join(f"{k}: {n}" for k, n in families.items())
    )
    print("  by extension header: " + ", ".join(f"{k}: {n}" for k, n in mine))


# ---- the host kernel (u32) --------------------------------------------------------------------

HOST_EXAMPLES = 40


def test_classify_agrees_with_the_host_kernel(
    host: HostSupport, make_netns: Callable[[], str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """IPv4 and IPv6 packets, extension headers and fragments among them, on u32 filters."""

    @settings(
        derandomize=True,
        max_examples=HOST_EXAMPLES,
        deadline=None,
        database=None,
        # Each example applies a policy to a kernel: shrinking would take minutes, and a
        # failure already shows the policy, the packet and classify's reasons.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(text=policies(), sends=st.lists(packets(), min_size=8, max_size=8))
    def agrees(text: str, sends: list[Packet]) -> None:
        note(text)
        tmp_path = tmp_path_factory.mktemp("classify")
        for packet, kernel, verdict in _run_case(text, sends, host, make_netns, tmp_path):
            assert_agrees(kernel, verdict, text, packet)
            COUNTS[f"host u32 {kind_of(packet)}"] += 1
            reason = verdict.steps[0].why.split(":")[0]
            event(f"{packet.family}: " + ("direct queue" if verdict.direct else reason))

    agrees()
    _print_counts("host")
    for family in ("ipv4", "ipv6"):
        assert COUNTS[f"host u32 {family}"], f"no {family} packet without extension headers ran"
    assert any(" hbh" in k or " dstopt" in k for k in COUNTS), "no extension header ran"


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


SHORT = """\
interface eth0 htb rate 1gbit default b {
    class a rate 1mbit match u8 0x00/0xff at 60
    class c rate 1mbit match dst 10.0.0.9
    class d rate 1mbit match dst 10.0.0.10 pref 2
    class b rate 1mbit
}
"""
"""A key 60 bytes in, before lines of its pref and of the next (found by a helper's review:
``classify`` said 'c' where the kernel gave up the pref)."""


@pytest.mark.parametrize(
    ("spec", "counter", "policy"),
    [
        ("udp dport 5001", "1:10", OFFICE_LIKE),
        ("ack", "1:20", OFFICE_LIKE),
        ("tcp ack iplen 80", "1:30", OFFICE_LIKE),
        ("tcp dport 5001", "1:30", OFFICE_LIKE),
        ("ipv6 udp dport 5001", "1:10", OFFICE_LIKE),
        ("ipv6 tcp ack", "1:20", OFFICE_LIKE),
        # u32 reads an IPv6 port 40 bytes in, guarded by the fixed header's next header:
        # behind a hop-by-hop header, or in a fragment, the port is not seen.
        ("ipv6 udp dport 5001 hbh", "1:30", OFFICE_LIKE),
        ("ipv6 udp dport 5001 frag", "1:30", OFFICE_LIKE),
        ("ipv6 tcp ack dstopt", "1:30", OFFICE_LIKE),
        # past the end of a 40-byte packet: u32 gives up pref 1, not just the filter...
        ("udp dst 10.0.0.9 iplen 40", "1:40", SHORT),
        # ... and goes on at pref 2
        ("udp dst 10.0.0.10 iplen 40", "1:30", SHORT),
        # a packet of 64 bytes has a byte 60 (payload, zero): the key reads it
        ("udp dst 10.0.0.9 iplen 64", "1:10", SHORT),
        ("udp dst 10.0.0.9 size 200", "1:10", SHORT),
    ],
)
def test_fixed_cases(
    spec: str,
    counter: str,
    policy: str,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    """A few packets whose class is known by hand, so the sender itself is checked."""
    packet = parse_packet(spec)
    ((_, kernel, verdict),) = _run_case(policy, [packet], host, make_netns, tmp_path)
    assert kernel == counter
    assert_agrees(kernel, verdict, policy, packet)


# ---- a datagram the kernel cuts into fragments -------------------------------------------------

FRAGMENTED = """\
interface eth0 htb rate 10mbit default bulk {
    class voip rate 2mbit match proto udp dport 5060
    class own rate 1mbit match src 10.99.0.0/24, 2001:db8:99::/64
    class bulk rate 1mbit
}
"""

DATAGRAM = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM)
s.sendto(bytes(int(sys.argv[2])), (sys.argv[1], 5060))
"""


@pytest.mark.parametrize(
    ("family", "src", "dst"),
    [("ipv4", "10.99.0.1", "10.99.0.2"), ("ipv6", "2001:db8:99::1", "2001:db8:99::2")],
)
def test_a_big_datagram_ends_where_classify_says_its_fragments_do(
    family: str,
    src: str,
    dst: str,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    """Found by a tester: for a UDP datagram a 1500-byte MTU does not hold, classify showed
    where the whole packet would go, though the tree sees its fragments: under u32 an IPv6
    first fragment has its fragment header where u32 reads the protocol and ports. Sent by a
    socket in the namespace, the kernel cuts the datagram; the first fragment moves the
    counter of the verdict, the later ones that of ``later`` (for IPv4 the first keeps its
    ports: 'voip'; for IPv6 it goes to 'own' like the rest; a fragment in another class
    leaves one of these two short)."""
    result, ns = _applied(FRAGMENTED, host, make_netns, tmp_path)
    assert result.policy is not None
    if family == "ipv6":
        for conf in ("all", "default", DEV):
            run_ns = ["ip", "netns", "exec", ns, "sysctl", "-qw"]
            subprocess.run([*run_ns, f"net.ipv6.conf.{conf}.disable_ipv6=0"], check=True)
        subprocess.run(
            ["ip", "-n", ns, "addr", "add", f"{src}/64", "dev", DEV, "nodad"], check=True
        )
        subprocess.run(
            ["ip", "-n", ns, "neigh", "add", dst, "lladdr", "02:00:00:00:00:02", "dev", DEV],
            check=True,
        )
    data = 4000
    header = 20 if family == "ipv4" else 40
    per_fragment = (1500 - header - (0 if family == "ipv4" else 8)) // 8 * 8
    fragments = -(-(8 + data) // per_fragment)
    packet = parse_packet(f"{family} udp src {src} dst {dst} dport 5060 iplen {header + 8 + data}")
    verdict = classify(result.policy, packet)
    assert verdict.later is not None and verdict.cls is not None and verdict.later.cls is not None
    first, later = str(verdict.cls.classid), str(verdict.later.cls.classid)
    assert (first, later) == (("1:10", "1:20") if family == "ipv4" else ("1:20", "1:20"))
    # IPv6 being turned on sends neighbour discovery and MLD, to 'bulk': count the other two
    leaves = {"1:10", "1:20"}
    before = _leaf_counters(ns, leaves)
    send = ["ip", "netns", "exec", ns, sys.executable, "-c", DATAGRAM, dst, str(data)]
    subprocess.run(send, check=True)
    expected = Counter({first: 1}) + Counter({later: fragments - 1})
    for _ in range(100):  # class counters move when the packets are dequeued
        after = _leaf_counters(ns, leaves)
        moved = Counter({k: after[k] - before.get(k, 0) for k in leaves})
        if +moved == expected:
            break
        time.sleep(0.02)
    assert +moved == expected, f"{fragments} fragments: the kernel moved {dict(+moved)}"


HOST_SENT = """\
interface eth0 htb rate 10mbit default bulk {
    class echo rate 1mbit match sport 2048
    class echo6 rate 1mbit match family ipv6 u16 0x8000 at 40
    class short rate 1mbit match proto udp u16 0x0000/0xff00 at 24
    class bulk rate 1mbit
}
"""

SOCKETS = """
import socket, sys
kind, dst, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = socket.AF_INET6 if ":" in dst else socket.AF_INET
if kind == "ping":  # a ping socket: the kernel sets the identifier and the checksum
    proto = socket.IPPROTO_ICMPV6 if ":" in dst else socket.IPPROTO_ICMP
    s = socket.socket(family, socket.SOCK_DGRAM, proto)
    s.sendto(bytes([128 if ":" in dst else 8, 0, 0, 0, 0, 0, 0, 1]) + bytes(size), (dst, 0))
else:
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind(("", 40000))
    s.sendto(bytes(size), (dst, 9))
"""


@pytest.mark.parametrize(
    ("sent", "spec"),
    [
        ("ping 10.99.0.2 56", "icmp src 10.99.0.1 dst 10.99.0.2 iplen 84"),
        ("ping 2001:db8:99::2 56", "icmpv6 src 2001:db8:99::1 dst 2001:db8:99::2 iplen 104"),
        ("udp 10.99.0.2 100", "udp src 10.99.0.1 dst 10.99.0.2 iplen 128"),
        ("udp 10.99.0.2 1000", "udp src 10.99.0.1 dst 10.99.0.2 iplen 1028"),
        ("udp 10.99.0.2 0", "udp src 10.99.0.1 dst 10.99.0.2 iplen 28"),
    ],
    ids=["ping", "ping6", "udp-100", "udp-1000", "udp-empty"],
)
def test_a_packet_a_socket_sends_ends_where_classify_says(
    sent: str, spec: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Found by a tester: classify wrote ports after the IP header of every packet, a UDP
    length of 0 and no ICMP header, so a ping (whose type and code a port line reads as
    sport 2048) and a long datagram (its length at byte 24) went elsewhere in the kernel than
    classify said. Here the kernel builds the packets (ping sockets, a UDP socket) and the
    counter of classify's class moves (an empty datagram too: classify took no packet
    shorter than 40 bytes)."""
    result, ns = _applied(HOST_SENT, host, make_netns, tmp_path)
    assert result.policy is not None
    run_ns = ["ip", "netns", "exec", ns, "sysctl", "-qw"]
    subprocess.run([*run_ns, "net.ipv4.ping_group_range=0 0"], check=True)
    if ":" in sent:
        for conf in ("all", "default", DEV):
            subprocess.run([*run_ns, f"net.ipv6.conf.{conf}.disable_ipv6=0"], check=True)
        subprocess.run(
            ["ip", "-n", ns, "addr", "add", "2001:db8:99::1/64", "dev", DEV, "nodad"], check=True
        )
        neigh = ["ip", "-n", ns, "neigh", "add", "2001:db8:99::2"]
        subprocess.run([*neigh, "lladdr", "02:00:00:00:00:02", "dev", DEV], check=True)
    verdict = classify(result.policy, parse_packet(spec))
    assert verdict.cls is not None
    want = str(verdict.cls.classid)
    # IPv6 being turned on sends neighbour discovery and MLD, to 'bulk': count the others
    leaves = {"1:10", "1:20", "1:30"}
    before = _leaf_counters(ns, leaves)
    send = ["ip", "netns", "exec", ns, sys.executable, "-c", SOCKETS, *sent.split()]
    subprocess.run(send, check=True)
    expected = Counter({want: 1}) if want in leaves else Counter()
    for _ in range(100):  # class counters move when the packets are dequeued
        after = _leaf_counters(ns, leaves)
        moved = Counter({k: after[k] - before.get(k, 0) for k in leaves})
        if +moved == expected and (expected or _ > 10):
            break
        time.sleep(0.02)
    assert +moved == expected, f"{spec}: classify says {want}, the kernel moved {dict(+moved)}"


# ---- user-mode Linux (flower, u32) ------------------------------------------------------------

UML_POLICIES = 30
UML_PACKETS = 8
UML_SEED = 11

GUEST_CASE = r"""
mkdir -p bin && printf '#!/bin/sh\n:\n' >bin/flock && chmod +x bin/flock && PATH=$PWD/bin:$PATH
# ip6tables (in the script) loads IPv6, whose neighbour discovery would move counters
modprobe ipv6 2>/dev/null
for conf in all default; do
    [ -e /proc/sys/net/ipv6/conf/$conf ] && echo 1 >/proc/sys/net/ipv6/conf/$conf/disable_ipv6
done
ip link add eth0 type veth peer name p0 && ip link set p0 up && ip link set eth0 up
base64 -d >sender <<'END'
@SENDER@
END
chmod +x sender
cat >apply.sh <<'END'
@SCRIPT@END
sh ./apply.sh >/dev/null || exit 1
index=$(ip -o link show eth0 | cut -d: -f1)
snap() {
    tc -s class show dev eth0 | awk '/^class/ {id = $3} /Sent/ {print id, $4}'
    tc -s qdisc show dev eth0 |
        awk '{for (i = 1; i < NF; i++) if ($i == "direct_packets_stat") print "direct", $(i + 1)}'
}
before=$(snap)
echo "== start"; echo "$before"
for hex in @FRAMES@; do
    ./sender "$index" "$hex" || exit 2
    sleep 0.02
    n=0
    now=$(snap)
    while [ "$now" = "$before" ] && [ $n -lt 40 ]; do sleep 0.05; now=$(snap); n=$((n + 1)); done
    echo "== packet"; echo "$now"
    before=$now
done
"""
"""One policy in the guest: a veth (IPv6 off on it: no neighbour discovery moves a counter),
the policy's script, then each frame and the counters after it."""


def guest_counters(stdout: str) -> list[dict[str, int]]:
    """The counter readings a guest case printed: at the start, then after each packet."""
    readings: list[dict[str, int]] = []
    for line in stdout.splitlines():
        if line.startswith("== "):
            readings.append({})
        elif line.strip():
            name, count = line.split()
            readings[-1][name] = int(count)
    return readings


FLOWER_FIXED = (
    "interface eth0 classifier flower htb rate 100mbit r2q 100 default bulk {\n"
    "    class voip rate 10mbit match proto udp dport 5001\n"
    "    class ssh rate 10mbit match family ipv6 proto tcp\n"
    "    class bulk rate 10mbit\n"
    # the same keys as voip's: flower refuses equal keys at one pref, so each filter has a
    # pref of its own (this one is never reached)
    "    class again rate 10mbit match proto udp dport 5001\n"
    "}\n"
)
FLOWER_CASES = [
    ("ipv6 udp dport 5001", "1:10"),
    ("udp dport 5001", "1:10"),
    # the flow dissector walks hop-by-hop, routing and destination options headers ...
    ("ipv6 udp dport 5001 hbh", "1:10"),
    ("ipv6 udp dport 5001 dstopt", "1:10"),
    ("ipv6 udp dport 5001 rthdr", "1:10"),
    ("ipv6 udp dport 5001 hbh dstopt", "1:10"),
    # ... and a fragment header, but reads no ports in any fragment ...
    ("ipv6 udp dport 5001 frag", "1:30"),
    ("ipv6 udp dport 5001 laterfrag", "1:30"),
    ("udp dport 5001 frag", "1:30"),
    # ... though the protocol of every fragment ...
    ("ipv6 tcp dport 22 frag", "1:20"),
    ("ipv6 tcp dport 22 laterfrag", "1:20"),
    ("ipv6 tcp dport 22 hbh frag", "1:20"),
    # ... and stops at AH (6.1): the protocol is AH's
    ("ipv6 udp dport 5001 auth", "1:30"),
    ("ipv6 tcp dport 22 auth", "1:30"),
]
"""flower's view of extension headers and fragments, known by hand (from the source of the
6.1 flow dissector, net/core/flow_dissector.c), as a first case of the batch: each packet
and its class."""


def test_classify_agrees_with_user_mode_linux(guest_sender: bytes, tmp_path: Path) -> None:
    """flower (and u32) in a real 6.1 kernel: IPv4 and IPv6 packets, extension headers and
    fragments among them. flower's flow dissector walks hop-by-hop, routing and destination
    options headers to the ports; not past a fragment header (no ports in any fragment) or
    AH."""
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    rng = random.Random(UML_SEED)
    cases: list[tuple[str, ir.Policy, list[Packet]]] = []
    scripts: list[uml.Case] = []
    encoded = base64.b64encode(guest_sender).decode()

    def case(name: str, text: str, result: Result, sends: list[Packet]) -> None:
        assert result.output is not None and result.policy is not None, result.diagnostics
        cases.append((text, result.policy, sends))
        script = (
            GUEST_CASE.replace("@SENDER@", encoded)
            .replace("@SCRIPT@", result.output)
            .replace("@FRAMES@", " ".join(frame(p).hex() for p in sends))
        )
        scripts.append(uml.Case(name, script))

    fixed = [parse_packet(spec) for spec, _ in FLOWER_CASES]
    case("flower-fixed", FLOWER_FIXED, _compile_text(tmp_path, FLOWER_FIXED), fixed)
    for n in range(UML_POLICIES):
        text = policy_text(rng.randint, ("flower", "flower", "u32"))
        result = _compile_text(tmp_path, text)
        sends = [parse_packet(packet_spec(rng.randint)) for _ in range(UML_PACKETS)]
        case(f"classify{n}", text, result, sends)
    start = time.monotonic()
    done = uml.run_cases(scripts, timeout=900)
    print(f"\nuser-mode Linux: {len(done)} policies in {time.monotonic() - start:.1f} s")
    failures: list[str] = []
    seen: list[str] = []
    for (text, policy, sends), ran in zip(cases, done, strict=True):
        if ran.exit_code != 0:
            failures.append(f"the case failed ({ran.exit_code}):\n{text}{ran.stderr}")
            continue
        readings = guest_counters(ran.stdout)
        assert len(readings) == len(sends) + 1, ran.stdout
        leaves = _leaves(policy) | {"direct"}
        classifier = policy.interfaces[0].classifier
        for packet, before, after in zip(sends, readings, readings[1:], strict=False):
            verdict = classify(policy, packet)
            try:
                kernel = moved_counter(
                    {k: v for k, v in before.items() if k in leaves},
                    {k: v for k, v in after.items() if k in leaves},
                )
                assert_agrees(kernel, verdict, text, packet)
            except AssertionError as err:
                failures.append(f"{packet.describe()}: {err}")
                continue
            seen.append(kernel)
            COUNTS[f"uml {classifier} {kind_of(packet)}"] += 1
    _print_counts("uml")
    assert seen[: len(FLOWER_CASES)] == [c for _, c in FLOWER_CASES], failures
    assert not failures, f"{len(failures)} packets disagree:\n\n" + "\n\n".join(failures)
    for family in ("ipv4", "ipv6"):
        assert COUNTS[f"uml flower {family}"], f"no {family} packet ran on flower"
