"""Generated policies that a kernel must hold exactly as written.

``verifiable_policies(kernel)`` (a hypothesis strategy) and ``random_policies(kernel, count,
seed)`` (a batch from a seeded random generator) write VALID policies, with no error and no
warning, for ``tcdsl verify`` to apply: the kernel must then agree with the policy in every
value (tests/test_verify_properties.py). The generator follows the one of
tests/test_properties.py (one drawing object, values spelled in several ways, constants and
arithmetic) with stricter rules, since verify reports compiler warnings too.

``kernel="host"`` (what every kernel with htb has):

- htb roots with or without a link class (interface ``rate``), ``r2q``, ``default``, explicit
  handles; class trees 1-4 levels deep; rates and ceilings that are multiples of 8 bit/s (tc
  keeps whole bytes per second), children's rates summing within the parent's rate, ceilings
  within the parent's ceiling (W301 otherwise), percentages where they resolve exactly; ``prio``
  0-7, ``burst``, ``cburst``, ``quantum``, explicit class ids;
- u32 matches: src/dst networks, single ports, port lists, ranges and value/mask pairs,
  protocols, tos, dscp, tcp-ack, raw ``u8``/``u16``/``u32 V/M at OFF`` keys (aligned, on bytes
  no other condition of the line tests, so that they cannot contradict), ``all``, ``pref``;
- both address families: IPv4 and IPv6 addresses and prefixes (compressed, IPv4-mapped, with
  host bits under the prefix; constants of either), ``family ipv4|ipv6|both`` on trees,
  directions, ingress blocks and match lines, ICMPv6; a line keeps to one family where it names
  addresses (E258 otherwise), a raw key on IPv6 says ``family ipv6`` and keeps off the IPv6
  header's fields, prefs stay below 32768 where IPv6 filters take the prefs above (E260);
- pfifo, bfifo and tbf leaves (a tbf holding a child at times); tbf, pfifo, bfifo and
  pfifo_fast roots.

- link-layer overhead (a size table) on htb and tbf roots: a preset or a number, ``linklayer``,
  ``mpu``, and the table's ``mtu`` and ``tsize`` where tc keeps them.

- an interface's directions: an upload and a download (through an IFB, ``via`` a named one at
  times), and in user-mode Linux ingress policers, ``connmark`` and policers on match lines.

``kernel="uml"`` adds what the host may lack: ``classifier flower`` (not with marks; no
tcp-ack, raw keys or port masks that are not a range: E259), prio roots (``bands``,
``priomap``), hfsc roots (curves in both of tc's spellings, ``sc``, ``ul``, nested classes,
``default``), netem roots with a child, sfq, fq_codel, netem and cake leaves, cake roots
(every keyword group, rtt names, overhead presets and numbers), and ``classify by mark from
eth1`` (iptables and ip6tables marks and fw filters) with the matches iptables can say
(``proto tcp``/``udp`` with ports).

Numbers are drawn over the whole range the compiler accepts, ends included (``wide``), except
where the kernel or tc does not hold a value tcdsl accepts: those are compiler bugs, each
steered around below under a ``KNOWN BUG`` comment, to be removed once the compiler reports
the case. htb also warns (W406) when a class's quantum, its rate in bytes/s divided by
``r2q``, lies outside 1000-200000 bytes: such a class gets an explicit ``quantum``.
"""

from __future__ import annotations

import functools
import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from hypothesis import strategies as st

from tcdsl.allocate import MAX_PREF
from tcdsl.driver import analyse
from tcdsl.frontend.qdiscs import CAKE_FLAG_GROUPS, CAKE_ISOLATION
from tcdsl.linklayer import PRESETS, RTT_PRESETS

Kernel = Literal["host", "uml"]

U32_MAX = 2**32 - 1
INT_MAX = 2**31 - 1
MAX_RATE = 10 * 10**9
RATE_UNITS = {
    "bit": 1,
    "kbit": 1000,
    "mbit": 10**6,
    "gbit": 10**9,
    "kibit": 1024,
    "mibit": 1024**2,
    "gibit": 1024**3,
}
"""Rate spellings (not the bps family: tc reads those as bytes per second, warning W302)."""
SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "kbit": 128}
TIME_UNITS = {"us": 1, "usec": 1, "usecs": 1, "ms": 1000, "msec": 1000, "s": 10**6, "sec": 10**6}
PROTOCOLS = (
    *("tcp", "udp", "icmp", "gre", "esp", "ah", "sctp", "ipip", "igmp", "ospf", "vrrp", "pim"),
    *("17", "47", "200", "TCP", "Udp"),
)
TCP = ("tcp", "TCP", "6")
PORTLESS = frozenset({"icmp", "gre", "esp", "ah", "ipip", "igmp", "ospf", "vrrp", "pim", "47"})
"""Protocols without ports: a port next to one is an error (E214)."""
PORTED = tuple(p for p in PROTOCOLS if p.lower() not in PORTLESS)
DSCP_NAMES = ("ef", "af11", "af21", "af32", "af43", "cs0", "cs1", "cs5", "cs7", "be", "va")
NAMES = (
    *("web", "bulk", "voip", "A", "_x", "staff-1", "ssh_in", "Video2", "p2p", "alice"),
    *("dns-udp-53", "x9_y-z", "interactive", "l", "QoS", "ratex", "classy", "matches"),
)
IFNAMES = ("eth0", "wan0", "s2-eth2", '"br-lan"', "eth0.100", "lan-1")
MARK_FROM = "eth1"
"""The interface ``classify by mark`` reads from (none of IFNAMES)."""

CAKE_WORDS = tuple(words for group, words in CAKE_FLAG_GROUPS.items() if group != "unlimited")
RTT_NAMES = tuple(RTT_PRESETS)

MAX_CLASSES = {"host": 10, "uml": 4}
"""htb classes per interface. Policies for user-mode Linux are kept smaller: every program it
runs costs ~15 ms there (0.5 ms on the host), and each tc command is one."""
MAX_FILTERS = {"host": 12, "uml": 4}
"""u32 filters (or iptables rules) one match line may stand for, per family it applies to."""
MAX_MATCHES = {"host": 2, "uml": 1}
"""Match lines per class."""
HTB_QUANTUM = (1000, 200_000)
"""The quantum htb takes without a warning (sch_htb.c, htb_change_class)."""

# Bytes of the IPv4 header (no options) each condition tests, so a raw key can keep off them.
FIELD_BYTES: dict[str, frozenset[int]] = {
    "src": frozenset(range(12, 16)),
    "dst": frozenset(range(16, 20)),
    "sport": frozenset({20, 21}),
    "dport": frozenset({22, 23}),
    "proto": frozenset({9}),
    "tos": frozenset({1}),
    "dscp": frozenset({1}),
    "tcp-ack": frozenset({0, 2, 3, 9, 33}),
}

# ... and of the IPv6 header (no extension headers): a port without ``proto`` is guarded by the
# next header (byte 6), and tcp-ack reads the payload length (4-5), next header and flags (53).
FIELD_BYTES_6: dict[str, frozenset[int]] = {
    "src": frozenset(range(8, 24)),
    "dst": frozenset(range(24, 40)),
    "sport": frozenset({6, 40, 41}),
    "dport": frozenset({6, 42, 43}),
    "proto": frozenset({6}),
    "tos": frozenset({0, 1}),
    "dscp": frozenset({0, 1}),
    "tcp-ack": frozenset({4, 5, 6, 53}),
}
FAMILIES: dict[str, tuple[str, ...]] = {
    "ipv4": ("ipv4",),
    "ipv6": ("ipv6",),
    "both": ("ipv4", "ipv6"),
}
"""``family`` words and the families they name."""
# No IPv4-mapped address: a match on one warns (W365), and generated policies are warning-free.
IPV6_SPELLINGS = (
    *("::1", "::", "::/0", "fe80::/10", "2001:db8::/32", "2001:db8:0:1::/64", "2001:DB8::1"),
    *("ff02::1", "2001:db8::1:0:0:1/112", "fd00::/8", "64:ff9b::/96"),
)
"""IPv6 addresses and prefixes as people write them."""

# ---- KNOWN BUGS: policies tc or the kernel does not hold as written --------------------------
# Found by tests/test_verify_properties.py (Debian's Linux 6.1.176 as user-mode Linux, the
# host's 6.18; iproute2 6.1). Each limit keeps the generator off one. Except QUANTUM_PLAIN
# (fixed in the backends), the compiler now reports each (tcdsl/checks.py,
# values_kept_as_written; bounds in tests/test_checks_kernel_values.py): the limits stay, since
# the generator writes policies with no error and no warning.

BURST_SECONDS = 270
"""KNOWN BUG (burst too long for its rate): tc keeps an htb burst/cburst and the kernel a tbf
burst/mtu as the time to send it at the rate in 64-ns ticks, a 32-bit field that wraps past
~274.9 s (``rate 8bit burst 1600``: the kernel holds 225 bytes). Bursts stay within 270 s.
Reported: E208 for htb, W330 for tbf (the kernel keeps its nanoseconds right, but reports
the wrapped ticks)."""
QUANTUM_PLAIN = 1024
"""KNOWN BUG (quantum spelled with a unit): tcdsl writes an htb or fq_codel quantum that is a
multiple of 1024 as ``quantum 2k``; tc reads both as plain numbers (``Illegal "quantum"``, the
script stops). Such quanta are avoided."""
HTB_MAX_QUANTUM = INT_MAX
"""KNOWN BUG (htb quantum range): the kernel keeps an htb class's quantum in an int, so one
above INT_MAX is negative there (tc shows ``quantum -2147483648``). Reported: E205."""
FQ_CODEL_QUANTUM = (256, 1 << 20)
"""KNOWN BUG (fq_codel quantum range): the kernel raises a quantum below 256 to 256 and refuses
one above 1 MiB (``Error: Invalid quantum.``). Reported: W330 below, E205 above."""
FQ_CODEL_MEMORY = 1 << 31
"""KNOWN BUG (fq_codel memory_limit): the kernel lowers one above 2 GiB to 2 GiB, and tc drops
``memory_limit 4294967295`` (its 'not given' value): the kernel keeps its 32 MiB default.
Reported: W330 above 2 GiB, E208 for 4294967295."""
FQ_CODEL_NONZERO = 1
"""KNOWN BUG (fq_codel zero values): tc drops ``limit 0``, ``target 0us`` and ``interval 0us``
(0 is its 'not given' value): the kernel keeps its defaults (10240p, 5ms, 100ms). Reported:
E208."""
TBF_NONZERO = 1
"""KNOWN BUG (tbf latency/limit 0): tc refuses ``latency 0us`` and ``limit 0`` ('either "limit"
or "latency" is required'). Reported: E208."""
# KNOWN BUG (tbf latency too long): tc computes the limit as rate x latency + burst (with a peak
# rate, the smaller of that and peakrate x latency + mtu) into a 32-bit field that wraps, so
# the kernel's latency differs; latencies are kept below that (tbf_latency_cap). Reported:
# E208.
SFQ_MIN_LIMIT = 2
"""KNOWN BUG (sfq limit 0 or 1): tc refuses them (``Illegal "limit", must be > 1``).
Reported: E205."""
SFQ_MAX_PERTURB = INT_MAX // 1000
"""KNOWN BUG (sfq perturb range): tc refuses a perturb above INT_MAX (``Illegal "perturb"``),
and Linux (6.1.y, 6.13+) one above INT_MAX / HZ (``sch_sfq: invalid perturb period``; HZ is
100-1000). Reported: E205 above 2147483 s."""
SFQ_MAX_QUANTUM = INT_MAX
"""KNOWN BUG (sfq quantum range): the kernel refuses a quantum above INT_MAX (``sch_sfq:
invalid quantum``). Reported: E205."""
NETEM_MAX_DELAY = U32_MAX * 64 // 1000 // 1000
"""KNOWN BUG (netem delay range): tc keeps the delay in 32-bit ticks and refuses one above
~274.9 s (``Illegal ... time (too large)``). Reported: E205 above 274877906us (a jitter too).
This limit is in microseconds, so it keeps delays below ~0.275 s: 1000 times stricter than
needed."""
NETEM_MAX_JITTER = INT_MAX // 1000
"""KNOWN BUG (netem jitter range): the kernel lowers a jitter above INT_MAX ns (~2.147 s) to
that. Reported: W330."""
# KNOWN BUG (prio bands 2 without priomap): tc sends its default priomap, which names band 2,
# and the kernel refuses the qdisc (RTNETLINK: Invalid argument); prio bands 2 always gets a
# priomap here. Reported: E205.
# KNOWN BUG (duplicating netem next to another netem): Linux (6.1.y, 6.17+) refuses a netem
# when the device's tree would hold a duplicating netem and another netem ("netem: cannot mix
# duplicating netems with other netems in tree"): only an interface's first netem duplicates,
# and no netem follows a duplicating one. Reported: E208 (with a note at the other netem).

FLOWER_PORTED = frozenset({"tcp", "udp", "sctp", "6", "17", "132"})
"""tc's flower takes ports under ``ip_proto`` tcp, udp or sctp only (``Illegal "dst_port"``);
tcdsl refuses a port line of another protocol under flower (E259). Flower lines with ports
name these protocols only."""

FQ_QUANTUM_MAX = 1 << 20
"""The largest fq quantum the kernel takes (E205 above)."""


@functools.lru_cache(maxsize=4096)
def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """st.integers, made once per range: making a strategy costs more than drawing from it."""
    return st.integers(min_value=lo, max_value=hi)


def range_keys(lo: int, hi: int) -> int:
    """How many aligned value/mask pairs cover the ports lo-hi (the compiler's expansion)."""
    count = 0
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size //= 2
        lo += size
        count += 1
    return count


def tbf_latency_cap(rate: int, burst: int, peak: int | None, mtu: int) -> int:
    """The longest latency (us) whose limit tc can compute in 32 bits (see KNOWN BUG above);
    below 1 when there is none (a burst of nearly 4 GiB)."""
    cap = (U32_MAX - burst) * 10**6 // (rate // 8)
    if peak is not None:
        cap = max(cap, (U32_MAX - mtu) * 10**6 // (peak // 8))  # tc takes the smaller limit
    return min(U32_MAX, cap - 1)


@dataclass(frozen=True)
class Policy:
    """A drawn policy: its text and the kernel it is written for."""

    text: str
    kernel: Kernel


@dataclass
class VGen:
    """The state of one generated policy, and how it draws each part."""

    between: Callable[[int, int], int]
    """Draws an integer in [lo, hi]: hypothesis (``verifiable_policies``) or a seeded random
    generator (``random_policies``). Every choice goes through it."""
    kernel: Kernel
    consts: list[str] = field(default_factory=list)
    marked: bool = False
    """Whether a tree of the policy classifies by mark (one at most: two marking from one
    interface, with marks sharing bits, are E273)."""
    # per interface
    names: set[str] = field(default_factory=set)
    majors: set[int] = field(default_factory=set)
    """Qdisc handle majors taken explicitly on the interface."""
    minors: set[int] = field(default_factory=set)
    """Class id minors taken explicitly on its htb."""
    marks: set[int] = field(default_factory=set)
    leaves: list[str] = field(default_factory=list)
    classes: int = 0
    r2q: int = 10
    root_major: int = 1
    netems: int = 0
    duplicating: bool = False
    """Whether one of the interface's netems duplicates packets."""
    stab: bool = False
    """Whether the interface's root has a size table (no cake with an overhead below: W341)."""
    stab_words: list[str] = field(default_factory=list)
    families: tuple[str, ...] = ("ipv4", "ipv6")
    """The families of the tree being written (``family``)."""
    classifier: str = "u32"
    tree_words: str = ""
    """``family ...``/``classifier ...`` of the tree, each followed by a space."""

    # ---- drawing ----
    def chance(self, p: float) -> bool:
        """True with probability about ``p``; False for a draw of 0, where hypothesis starts
        and shrinks to (so a small example leaves the options out)."""
        return self.between(0, 999) >= 1000 - int(p * 1000)

    def wide(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]: an end of the range, or one of any magnitude in it."""
        how = self.between(0, 5)
        if how == 0 or lo == hi:
            return lo
        if how == 1:
            return hi
        if how == 2:
            return self.between(lo, hi)
        e = self.between(max(1, lo.bit_length()), hi.bit_length())
        return self.between(max(lo, 1 << (e - 1)), min(hi, (1 << e) - 1))

    def pick(self, options: tuple[str, ...] | list[str]) -> str:
        return options[self.between(0, len(options) - 1)]

    def sample(self, options: list[str], k: int) -> list[str]:
        """``k`` different ones of ``options`` (fewer if there are not that many)."""
        out: list[str] = []
        left = list(options)  # an option listed twice is twice as likely
        while left and len(out) < k:
            out.append(left[self.between(0, len(left) - 1)])
            left = [x for x in left if x != out[-1]]
        return out

    @property
    def uml(self) -> bool:
        return self.kernel == "uml"

    def name(self) -> str:
        raw = self.pick(NAMES)
        name, n = raw, 1
        while name in self.names:
            name, n = f"{raw}_{n}", n + 1
        self.names.add(name)
        return name

    # ---- values ----
    def bits(self, lo: int, hi: int) -> int:
        """A rate in [lo, hi], a multiple of 8: often a round one, of any magnitude."""
        lo8, hi8 = -(-max(lo, 8) // 8), hi // 8
        how = self.between(0, 3)
        if how == 0:
            return 8 * self.between(lo8, hi8)
        if how == 1:  # a whole number of some unit
            unit = RATE_UNITS[self.pick(("kbit", "mbit", "kibit", "gbit"))]
            step = unit if unit % 8 == 0 else unit * 8
            if hi8 * 8 // step >= -(-lo8 * 8 // step):
                return step * self.between(-(-lo8 * 8 // step), hi8 * 8 // step)
        return 8 * self.wide(lo8, hi8)

    def rate(self, bits: int, depth: int = 0) -> str:
        """Spell exactly ``bits`` bit/s: units, arithmetic, constants."""
        how = self.between(0, 12) if depth < 2 else 12
        if how == 0 and bits % 2 == 0 and bits >= 16:
            half = self.rate(bits // 2, depth + 1)
            return f"({half}) * 2" if " " in half else f"{half} * 2"
        if how == 1 and bits >= 16:
            part = self.between(1, bits - 1)
            text = f"{self.rate(part, depth + 1)} + {self.rate(bits - part, depth + 1)}"
            return f"({text})" if self.chance(0.5) else text
        if how == 2:
            extra = self.between(1, 10**6)
            return f"{self.rate(bits + extra, depth + 1)} - {extra}bit"
        if how == 3:
            # tcdsl computes exactly and truncates only the final value to whole bits, so a
            # remainder may be dropped at the top of the expression only
            rest = self.between(0, 3) if depth == 0 else 0
            return f"({self.rate(4 * bits + rest, depth + 1)}) / 4"
        if how == 4:
            value = self.rate(bits, depth + 1)  # may define constants of its own first
            const = f"c{len(self.consts)}_{self.between(0, 99)}"
            self.consts.append(f"const {const} = {value}")
            return const
        if how == 5 and bits % 10**5 == 0 and bits % 10**6:
            return f"{bits // 10**6}.{bits % 10**6 // 10**5}mbit"
        unit = self.pick([u for u, f in RATE_UNITS.items() if bits % f == 0])
        spelled = self.pick((unit, unit.upper(), unit.capitalize()))
        return f"{bits // RATE_UNITS[unit]}{spelled}"

    def spell(self, size: int) -> str:
        """Spell a size in bytes with a unit that divides it (or none)."""
        unit = self.pick([u for u, f in SIZE_UNITS.items() if size % f == 0 and (size or not u)])
        return f"{size // SIZE_UNITS[unit]}{unit}"

    def time(self, lo: int, hi: int) -> str:
        """A time in [lo, hi] microseconds, spelled with a unit that divides it."""
        value = self.wide(lo, hi)
        if self.chance(0.5):  # a whole number of ms or s
            unit = int(self.pick(("1000", "1000000")))
            if hi // unit >= max(1, -(-lo // unit)):
                value = unit * self.wide(max(1, -(-lo // unit)), hi // unit)
        unit_name = self.pick([u for u, f in TIME_UNITS.items() if value % f == 0])
        return f"{value // TIME_UNITS[unit_name]}{unit_name}"

    def percent(self) -> str:
        """A netem probability, 0-100% with up to six decimals (``1.5%``)."""
        whole = self.wide(0, 100)
        frac = self.between(0, 999_999) if whole < 100 and self.chance(0.5) else 0
        return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") + "%"

    def burst_size(self, rate: int) -> int:
        """A burst (or tbf mtu) for ``rate``, at most BURST_SECONDS' worth (KNOWN BUG)."""
        cap = min(U32_MAX, rate // 8 * BURST_SECONDS)
        if self.chance(0.3):
            return min(cap, int(self.pick(("1540", "1600", "3000", "15360", "65536", "500000"))))
        return self.wide(1, cap)

    def plain_quantum(self, lo: int, hi: int) -> int:
        """A quantum tcdsl writes as a plain number (KNOWN BUG QUANTUM_PLAIN)."""
        value = self.wide(lo, hi)
        return value if value % QUANTUM_PLAIN else value - 1

    def handle(self) -> str:
        """Sometimes an explicit qdisc handle (`` handle 2a:``), unique on the interface."""
        if not self.chance(0.15):
            return ""
        major = self.between(1, 0xFFFE)
        if major in self.majors:
            return ""
        self.majors.add(major)
        return f" handle {major:x}:"

    # ---- matches ----
    def address(self, family: str = "ipv4") -> str:
        """An address or network of ``family`` (IPv6: compressed spellings, IPv4-mapped ones,
        host bits under the prefix), at times through a constant."""
        if family == "ipv6":
            if self.chance(0.3):
                text = self.pick(IPV6_SPELLINGS)
            else:
                value = self.between(0, 2**128 - 1) >> self.between(0, 128)
                text = str(ipaddress.IPv6Address(value))
                text = text if self.chance(0.3) else f"{text}/{self.between(0, 128)}"
        else:
            first = self.between(0, 255)
            if first in (10, 172, 192):  # no private destination in a download (W360)
                first += 1
            octets = ".".join(str(n) for n in (first, *(self.between(0, 255) for _ in range(3))))
            text = octets if self.chance(0.3) else f"{octets}/{self.between(0, 32)}"
        if self.chance(0.1):
            const = f"net{len(self.consts)}_{self.between(0, 99)}"
            self.consts.append(f"const {const} = {text}")
            return const
        return text

    def tree_options(self, marking: bool) -> str:
        """``family`` and (user-mode Linux, not with marks) ``classifier flower`` of a tree, as
        words before its qdisc; sets ``families`` and ``classifier``."""
        self.families, self.classifier = FAMILIES["both"], "u32"
        words: list[str] = []
        if self.chance(0.3):
            name = self.pick(tuple(FAMILIES))
            self.families = FAMILIES[name]
            words.append(f"family {name}")
        if self.uml and not marking and self.chance(0.35):
            self.classifier = "flower"
            words.append("classifier flower")
        if len(words) == 2 and self.chance(0.5):
            words.reverse()
        return "".join(f"{w} " for w in words)

    def port(self, masks: bool, flower: bool = False) -> tuple[str, int]:
        """A port, a range or a value/mask, and how many u32 keys it becomes (flower: one, and
        only masks that are a range)."""
        kind = self.between(0, 3)
        if kind == 1:
            lo = self.between(0, 65535)
            hi = self.between(lo, min(65535, lo + int(self.pick(("0", "1", "7", "1000", "65535")))))
            return f"{lo}-{hi}", 1 if flower else range_keys(lo, hi)
        if kind == 2 and masks:
            prefix = flower or self.chance(0.7)
            mask = (0xFFFF << self.between(0, 16)) & 0xFFFF if prefix else self.between(0, 0xFFFF)
            return f"{self.between(0, 65535) & mask}/0x{mask:04x}", 1
        return str(self.between(1 if flower else 0, 65535)), 1

    def line_family(self) -> str | None:
        """The family a match line keeps to: None (each of the tree's), or one of them."""
        if len(self.families) == 1 or self.chance(0.4):
            return self.pick(self.families)
        return None

    def match(self, marking: bool) -> str | None:
        """One match line that can match (no field twice, nothing contradictory, one family
        where it names addresses, ICMP or a raw offset), or None when it would stand for more
        filters than MAX_FILTERS allows."""
        flower = self.classifier == "flower"
        if self.chance(0.05):
            return "match all"
        kinds = ["src", "dst", "sport", "dport", "proto", "tos", "dscp"]
        if not marking and not flower:  # iptables (E209) and flower (E259) cannot say these
            kinds += ["tcp-ack", "raw", "raw"]
        chosen = self.sample(kinds, self.between(1, 3))
        if "tos" in chosen and "dscp" in chosen:
            chosen.remove("dscp")  # both test the tos byte: they may contradict (E211)
        ported = bool({"sport", "dport"} & set(chosen))
        if marking and ported and "proto" in chosen:
            chosen.remove("proto")  # ports need proto tcp or udp with marks: written below
        family = self.line_family()
        word = family if family is not None and self.chance(0.2) else None
        if "raw" in chosen:
            family = family or "ipv4"
            word = "ipv6" if family == "ipv6" else word  # raw offsets are IPv4's otherwise
        if family is None and {"src", "dst"} & set(chosen):
            family = self.pick(self.families)  # addresses keep the line to their family
        fields = FIELD_BYTES_6 if family == "ipv6" else FIELD_BYTES
        used = set().union(*(fields.get(k, frozenset()) for k in chosen))
        conds: list[str] = []
        filters = 1
        guarded = ported and "proto" not in chosen and "tcp-ack" not in chosen
        for kind in chosen:
            if kind in ("src", "dst"):
                n = self.between(1, 2)
                filters *= n
                af = family or self.pick(self.families)
                conds.append(f"{kind} " + ", ".join(self.address(af) for _ in range(n)))
            elif kind in ("sport", "dport"):
                ports = [self.port(not marking, flower) for _ in range(self.between(1, 3))]
                filters *= len(ports) if marking else sum(keys for _, keys in ports)
                conds.append(f"{kind} " + ", ".join(text for text, _ in ports))
            elif kind == "proto":
                if "tcp-ack" in chosen:
                    protos = [self.pick(TCP)]  # another protocol would contradict tcp-ack
                else:
                    choices = PORTED if ported else PROTOCOLS
                    if ported and flower:  # E259: flower has no ports of other protocols
                        choices = tuple(p for p in choices if p.lower() in FLOWER_PORTED)
                    if not ported and family == "ipv6":
                        choices = (*(p for p in choices if p != "icmp"), "icmpv6", "ipv6-icmp")
                    elif not ported and family is None:  # either: ICMP is IPv4's only
                        choices = (*choices, "icmpv6", "ipv6-icmp")
                    protos = [self.pick(choices)]
                    other = self.pick(choices)
                    same = {"tcp": "6", "udp": "17", "gre": "47", "icmpv6": "ipv6-icmp"}
                    a, b = protos[0].lower(), other.lower()
                    if self.chance(0.3) and a != b and same.get(a) != b and same.get(b) != a:
                        protos.append(other)
                filters *= len(protos)
                conds.append("proto " + ", ".join(protos))
            elif kind == "tos":
                mask = self.between(1, 255) if self.chance(0.6) else 0xFF
                value = self.between(0, 255) & mask
                if mask == 0xFF and self.chance(0.5):
                    conds.append(f"tos {value}" if self.chance(0.5) else f"tos 0x{value:02x}")
                else:
                    conds.append(f"tos 0x{value:02x}/0x{mask:02x}")
            elif kind == "dscp":
                conds.append(
                    f"dscp {self.pick(DSCP_NAMES) if self.chance(0.5) else self.between(0, 63)}"
                )
            elif kind == "tcp-ack":
                conds.append("tcp-ack")
            elif kind == "raw" and (raw := self.raw(used)) is not None:
                conds.append(raw)
        if marking and ported:
            protos = ["tcp", "udp"] if self.chance(0.2) else [self.pick(("tcp", "udp"))]
            filters *= len(protos)
            conds.insert(0, "proto " + ", ".join(protos))
            guarded = False
        families = (family,) if family else self.families
        # IPv6 (and flower) filters name TCP and UDP for a port without a protocol
        total = sum(
            2 * filters if guarded and (f == "ipv6" or flower) else filters for f in families
        )
        if not conds or total > MAX_FILTERS[self.kernel] * len(families):
            return None
        if word is not None:
            conds.insert(self.between(0, len(conds)), f"family {word}")
        if not marking and self.chance(0.2):
            # E260 goes by the tree's families, not the line's
            conds.append(f"pref {self.wide(1, MAX_PREF if 'ipv6' in self.families else 65535)}")
        if not marking and self.uml and self.chance(0.25):
            police = self.police()  # drawn in any case: the draws after it stay the same
            if not self.stab:  # a size table may charge a frame above any burst drawn (W376)
                conds.append(police)
        return "match " + " ".join(conds)

    def police(self) -> str:
        """``police ...``: a burst of at least its mtu (or a full frame: E253)."""
        rate = self.bits(8000, MAX_RATE)
        mtu = self.wide(1514, 65535) if self.chance(0.3) else None
        least = max(mtu or 2048, 2048)  # E253 (a full frame, as any size table charges it)
        burst = self.wide(least, max(least, min(1 << 20, rate // 8 * BURST_SECONDS)))  # E208
        words = ["police", "rate", self.rate(rate), "burst", self.spell(burst)]
        if mtu is not None:
            words += ["mtu", self.spell(mtu)]
        if self.chance(0.6):
            words.append(self.pick(("drop", "pass", "continue", "reclassify")))
        return " ".join(words)

    def raw(self, used: set[int]) -> str | None:
        """A raw key at an aligned offset whose bytes no other condition of the line tests."""
        width = (8, 16, 32)[self.between(0, 2)]
        step = width // 8
        at = self.between(0, 64 // step) * step
        if used & set(range(at, at + step)):
            return None
        used |= set(range(at, at + step))
        full = (1 << width) - 1
        mask = self.wide(0, full) if self.chance(0.7) else full
        value = self.between(0, full) & mask
        if mask == full and self.chance(0.3):
            return f"u{width} {value} at {at}"
        return f"u{width} 0x{value:x}/0x{mask:x} at {at}"

    # ---- qdiscs ----
    def leaf_qdisc(self, indent: str, depth: int = 0) -> list[str]:
        """A leaf qdisc as lines (a tbf or netem holds a child of its own at times)."""
        kinds = ["pfifo", "bfifo", "tbf"]
        if self.uml:
            kinds += ["sfq", "fq_codel", "cake"] + ([] if self.duplicating else ["netem"])
            kinds += ["codel", "fq", "red"]
        kind = self.pick(kinds)
        line = " ".join([kind + self.handle(), *self.qdisc_options(kind)])
        if kind in ("tbf", "netem") and depth < 1 and self.chance(0.3):
            child = self.leaf_qdisc(indent + "    ", depth + 1)
            return [f"{indent}{line} {{", *child, f"{indent}}}"]
        return [f"{indent}{line}"]

    def qdisc_options(self, kind: str) -> list[str]:
        if kind == "pfifo":
            return [f"limit {self.wide(0, U32_MAX)}"] if self.chance(0.6) else []
        if kind == "bfifo":
            return [f"limit {self.spell(self.wide(0, U32_MAX))}"] if self.chance(0.6) else []
        return {
            "tbf": self.tbf_options,
            "sfq": self.sfq_options,
            "fq_codel": self.fq_codel_options,
            "netem": self.netem_options,
            "cake": self.cake_options,
            "codel": self.codel_options,
            "fq": self.fq_options,
            "red": self.red_options,
        }[kind]()

    def link_layer(self, stab: bool, tbf: bool = False) -> list[str]:
        """Link-layer words: a size table's (``stab``) or a cake's."""
        names = [n for n, p in PRESETS.items() if not stab or p.linklayer != "ptm"]
        opts: list[str] = []
        layer, mpu = "ethernet", 0
        if self.chance(0.6):
            name = self.pick(names)
            opts.append(f"overhead {name}")
            layer, mpu = PRESETS[name].linklayer, PRESETS[name].mpu
        else:
            opts.append(f"overhead {self.wide(0, 256)}")
        if self.chance(0.7):
            word = self.pick(("ethernet", "atm", "adsl") if stab else ("ethernet", "atm", "ptm"))
            opts.append(f"linklayer {word}")
            layer = "atm" if word == "adsl" else word
        if self.chance(0.6):
            mpu = self.wide(0, 256)
            opts.append(f"mpu {mpu}")
        if stab and (layer == "atm" or mpu):  # tc keeps a table's mtu and tsize (E230)
            if not tbf and self.chance(0.5):
                opts.append(f"mtu {self.wide(1, 65535)}")
            if self.chance(0.8):
                opts.append(f"tsize {self.wide(1, 16384)}")
        return opts

    def cake_options(self) -> list[str]:
        opts: list[str] = []
        if self.chance(0.6):
            opts.append(f"bandwidth {self.rate(self.bits(8, MAX_RATE))}")
        elif self.chance(0.5):
            opts.append("unlimited")
        for words in CAKE_WORDS:
            if self.chance(0.3):
                opts.append(self.pick(words))
        if self.chance(0.3):
            opts.append(f"isolate {self.pick(CAKE_ISOLATION)}")
        if self.chance(0.3):
            opts.append(
                f"rtt {self.pick(RTT_NAMES)}"
                if self.chance(0.5)
                else f"rtt {self.time(1, U32_MAX)}"
            )
        if self.chance(0.2):
            opts.append(f"memlimit {self.spell(self.wide(1, U32_MAX))}")
        if self.chance(0.2):
            mark = self.wide(0, U32_MAX)
            opts.append(f"fwmark {mark:#x}" if self.chance(0.5) else f"fwmark {mark}")
        if not self.stab and self.chance(0.5):
            opts += self.link_layer(stab=False)
        return opts

    def tbf_options(self) -> list[str]:
        rate = self.bits(8, MAX_RATE)
        burst = self.burst_size(rate)
        peak, mtu = None, 0
        if self.chance(0.25):
            peak = self.bits(rate + 8, 2 * MAX_RATE)
            mtu = self.burst_size(peak)
        opts = [f"rate {self.rate(rate)}", f"{self.pick(('burst', 'buffer'))} {self.spell(burst)}"]
        cap = tbf_latency_cap(rate, burst, peak, mtu)
        if cap >= TBF_NONZERO and self.chance(0.5):
            opts.append(f"latency {self.time(TBF_NONZERO, cap)}")
        else:
            opts.append(f"limit {self.spell(self.wide(TBF_NONZERO, U32_MAX))}")
        if peak is not None:
            opts += [f"peakrate {self.rate(peak)}", f"mtu {self.spell(mtu)}"]
        return opts

    def sfq_options(self) -> list[str]:
        opts: list[str] = []
        depth = self.between(1, 127) if self.chance(0.3) else None
        divisor = 1 << self.between(0, 16) if self.chance(0.3) else None
        if self.chance(0.5):
            opts.append(f"perturb {self.wide(0, SFQ_MAX_PERTURB)}")
        if self.chance(0.3):
            opts.append(f"quantum {self.spell(self.wide(1, SFQ_MAX_QUANTUM))}")
        if depth is not None:
            opts.append(f"depth {depth}")
        if divisor is not None:
            opts.append(f"divisor {divisor}")
        cap = (depth or 127) * min(128, divisor or 1024)  # the most it holds (W305 above)
        if cap >= SFQ_MIN_LIMIT and self.chance(0.3):
            opts.append(f"limit {self.wide(SFQ_MIN_LIMIT, cap)}")
        return opts

    def fq_codel_options(self) -> list[str]:
        opts: list[str] = []
        if self.chance(0.3):
            opts.append(f"limit {self.wide(FQ_CODEL_NONZERO, U32_MAX)}")
        if self.chance(0.3):
            opts.append(f"flows {self.wide(1, 65536)}")
        if self.chance(0.3):
            opts.append(f"target {self.time(FQ_CODEL_NONZERO, U32_MAX)}")
        if self.chance(0.3):
            opts.append(f"interval {self.time(FQ_CODEL_NONZERO, U32_MAX)}")
        if self.chance(0.3):
            opts.append(f"quantum {self.spell(self.plain_quantum(*FQ_CODEL_QUANTUM))}")
        if self.chance(0.2):
            opts.append(f"memory_limit {self.spell(self.wide(0, FQ_CODEL_MEMORY))}")
        if self.chance(0.3):
            opts.append(self.pick(("ecn", "noecn")))
        return opts

    def netem_options(self) -> list[str]:
        opts: list[str] = []
        delayed = jittered = False
        if self.chance(0.6):
            delayed = self.chance(0.8)  # above 0: reorder and distribution need a delay
            opts.append(f"delay {self.time(1 if delayed else 0, NETEM_MAX_DELAY)}")
            if self.chance(0.6):
                jittered = delayed and self.chance(0.7)
                opts.append(f"jitter {self.time(1 if jittered else 0, NETEM_MAX_JITTER)}")
        if jittered and self.chance(0.3):
            opts.append(f"delay_correlation {self.percent()}")
        if jittered and self.chance(0.8):
            opts.append(f"distribution {self.pick(('normal', 'pareto', 'paretonormal'))}")
        self.netems += 1
        for key in ("loss", "duplicate", "corrupt"):
            if key == "duplicate" and self.netems > 1:
                continue  # KNOWN BUG (duplicating netem next to another netem)
            if self.chance(0.25):
                pct = self.percent()
                opts.append(f"{key} {pct}")
                self.duplicating |= key == "duplicate"
                if key == "loss" and float(pct[:-1]) > 0 and self.chance(0.3):
                    opts.append(f"loss_correlation {self.percent()}")
        if delayed and self.chance(0.4):
            opts.append(f"reorder {self.between(1, 100)}%")
            if self.chance(0.3):
                opts.append(f"reorder_correlation {self.percent()}")
            if self.chance(0.3):
                opts.append(f"gap {self.wide(1, U32_MAX)}")
        if self.chance(0.3):
            opts.append(f"limit {self.wide(0, U32_MAX)}")
        if self.chance(0.3):
            opts.append(f"rate {self.rate(self.bits(8, 2 * MAX_RATE))}")
            if self.chance(0.3):
                opts.append(f"packetoverhead {self.wide(0, INT_MAX)}")
            if self.chance(0.3):
                opts.append(f"cellsize {self.wide(0, U32_MAX)}")
        if self.chance(0.2):
            slot = self.wide(0, U32_MAX)
            opts.append(f"slot {slot}us")
            if self.chance(0.5):
                opts.append(f"slot_max {self.wide(slot, U32_MAX)}us")
        return opts

    def codel_options(self) -> list[str]:
        opts: list[str] = []
        if self.chance(0.3):
            opts.append(f"limit {self.wide(1, U32_MAX)}")
        for key in ("target", "interval", "ce_threshold"):
            if self.chance(0.3):
                opts.append(f"{key} {self.time(1, U32_MAX - 1)}")
        if self.chance(0.3):
            opts.append(self.pick(("ecn", "noecn")))
        return opts

    def fq_options(self) -> list[str]:
        opts: list[str] = []
        for key in ("limit", "flow_limit", "orphan_mask"):
            if self.chance(0.25):
                opts.append(f"{key} {self.wide(0, U32_MAX)}")
        if self.chance(0.25):
            opts.append(f"quantum {self.plain_quantum(1, FQ_QUANTUM_MAX)}")
        if self.chance(0.2):
            opts.append(f"initial_quantum {self.plain_quantum(1, INT_MAX)}")
        for key in ("maxrate", "low_rate_threshold"):
            if self.chance(0.25):  # maxrate of U32_MAX bytes/s is 'no limit' (E208)
                opts.append(f"{key} {self.rate(self.bits(8, (U32_MAX - 1) * 8))}")
        if self.chance(0.25):
            opts.append(f"buckets {1 << self.between(1, 18)}")
        if self.chance(0.2):  # in whole jiffies at any HZ: the kernel keeps jiffies
            opts.append(f"refill_delay {10_000 * self.between(0, 100)}us")
        for key in ("ce_threshold", "horizon"):
            if self.chance(0.25):
                opts.append(f"{key} {self.time(0, U32_MAX - 1)}")
        for flags in (("pacing", "nopacing"), ("horizon_drop", "horizon_cap")):
            if self.chance(0.25):
                opts.append(self.pick(flags))
        return opts

    def red_options(self) -> list[str]:
        """red values tcdsl's checks take without a word (else a usual set)."""
        avpkt = self.between(64, 9000)
        qmin = avpkt * self.between(2, 200)
        qmax = qmin * self.between(2, 6)
        limit = qmax * self.between(2, 8)
        bandwidth = self.bits(1_000_000, MAX_RATE)
        opts = [f"limit {self.spell(limit)}", f"avpkt {avpkt}"]
        if self.chance(0.7):
            opts.append(f"min {self.spell(qmin)}")
        if self.chance(0.7):
            opts.append(f"max {self.spell(qmax)}")
        opts.append(f"bandwidth {self.rate(bandwidth)}")
        if self.chance(0.4):
            opts.append(f"probability {self.between(1, 99)}%")
        for flag in ("ecn", "harddrop", "adaptive"):
            if self.chance(0.2):
                opts.append(flag)
        text = f"interface eth0 red {' '.join(opts)}\n"
        if analyse("policy.tcp", loader=lambda path: text).diagnostics:
            return ["limit 400k", "min 30k", "max 90k", "avpkt 1000", "bandwidth 10mbit"]
        return opts

    # ---- htb ----
    def htb_options(self, rate: int, ceil: int) -> list[str]:
        """burst, cburst and quantum of a class (or the link class) of ``rate`` and ``ceil``."""
        opts: list[str] = []
        if self.chance(0.2):
            opts.append(f"burst {self.spell(self.burst_size(rate))}")
        if self.chance(0.15):
            opts.append(f"cburst {self.spell(self.burst_size(ceil))}")
        quantum = rate // 8 // self.r2q
        if not HTB_QUANTUM[0] <= quantum <= HTB_QUANTUM[1] or self.chance(0.1):
            opts.append(f"quantum {self.spell(self.plain_quantum(1, HTB_MAX_QUANTUM))}")
        return opts

    def split(self, rate: int, ceil: int, n: int) -> list[tuple[int, int]]:
        """Rates for ``n`` children, multiples of 8 that sum within ``rate``, and ceilings
        within ``ceil``."""
        out: list[tuple[int, int]] = []
        left = rate
        for i in range(n):
            most = left - 8 * (n - i - 1)
            if self.chance(0.5):
                r = max(8, min(most, rate * self.between(1, 100 // n) // 100 // 8 * 8))
            else:
                r = self.bits(8, most)
            left -= r
            out.append((r, self.bits(r, ceil) if self.chance(0.5) else r))
        return out

    def rate_options(self, rate: int, ceil: int, parent: tuple[int, int] | None) -> list[str]:
        """``rate`` and ``ceil`` of a class, as percentages of the ``parent``'s rate and ceil
        at times (where they resolve to exactly these values)."""
        out: list[str] = []
        for key, value, base in (
            ("rate", rate, parent and parent[0]),
            ("ceil", ceil, parent and parent[1]),
        ):
            if key == "ceil" and value == rate and not self.chance(0.2):
                continue  # the ceil defaults to the rate
            text = None
            if base and self.chance(0.3):
                for digits in (0, 1, 2):
                    scaled = value * 100 * 10**digits
                    if scaled % base == 0:
                        whole, frac = divmod(scaled // base, 10**digits)
                        text = f"{whole}.{frac:0{digits}d}%" if frac else f"{whole}%"
                        break
            out.append(f"{key} {text or self.rate(value)}")
        return out

    def klass(
        self,
        rate: int,
        ceil: int,
        parent: tuple[int, int] | None,
        depth: int,
        max_depth: int,
        marking: bool,
        indent: str,
    ) -> list[str]:
        """One htb class of ``rate`` and ``ceil`` and its subtree, as lines; ``parent`` is the
        parent's rate and ceil (None for a root class)."""
        name = self.name()
        self.classes += 1
        opts: list[str] = []
        if self.chance(0.1):
            minor = self.between(2, 0xFFFF)
            if minor not in self.minors:
                self.minors.add(minor)
                opts.append(f"id {self.root_major:x}:{minor:x}")
        opts += self.rate_options(rate, ceil, parent) + self.htb_options(rate, ceil)
        if self.chance(0.5):
            opts.append(f"prio {self.between(0, 7)}")  # tc shows it for leaves only
        children = 0
        if depth < max_depth and self.classes < MAX_CLASSES[self.kernel] and rate >= 16:
            children = self.between(0, min(3, rate // 8))
        body: list[str] = []
        inline: list[str] = []
        if children:
            for r, c in self.split(rate, ceil, children):
                body += self.klass(
                    r, c, (rate, ceil), depth + 1, max_depth, marking, indent + "    "
                )
        else:
            self.leaves.append(name)
            if marking and self.chance(0.15):
                opts += self.mark()
            for _ in range(self.between(0, MAX_MATCHES[self.kernel])):
                if (m := self.match(marking)) is not None:
                    (inline if self.chance(0.3) and not inline else body).append(m)
            body = [f"{indent}    {m}" for m in body]
            if self.chance(0.6):
                body += self.leaf_qdisc(indent + "    ")
        head = f"{indent}class {name} " + " ".join(opts + inline)
        if not body:
            return [head]
        if self.chance(0.2) and all("{" not in b and "}" not in b for b in body):
            return [f"{head} {{ " + "; ".join(b.strip() for b in body) + " }"]
        return [f"{head} {{", *body, f"{indent}}}"]

    def mark(self) -> list[str]:
        mark = self.wide(1, U32_MAX)
        if mark in self.marks:
            return []
        self.marks.add(mark)
        return [f"mark {mark}"]

    def htb(self, ifname: str, classify: str) -> list[str]:
        handle = self.handle()
        self.root_major = int(handle.split()[1][:-1], 16) if handle else 1
        marking = bool(classify)
        max_depth = self.between(1, 4)
        opts: list[str] = []
        if self.chance(0.25):
            self.r2q = self.wide(1, 1000)
            opts.append(f"r2q {self.r2q}")
        body = [f"    {classify}"] if marking else []
        if self.chance(0.7):  # a link class
            link = self.bits(8 * 8, MAX_RATE)
            link_ceil = self.bits(link, 2 * MAX_RATE) if self.chance(0.2) else link
            opts.append(f"rate {self.rate(link)}")
            if link_ceil != link:
                opts.append(f"ceil {self.rate(link_ceil)}")
            opts += self.htb_options(link, link_ceil)
            for r, c in self.split(link, link_ceil, self.between(1, min(4, link // 8))):
                body += self.klass(r, c, (link, link_ceil), 1, max_depth, marking, "    ")
        else:  # root classes, each on its own
            for _ in range(self.between(1, 4)):
                r = self.bits(8, MAX_RATE)
                c = self.bits(r, MAX_RATE) if self.chance(0.5) else r
                body += self.klass(r, c, None, 1, max_depth, marking, "    ")
        if self.chance(0.6):
            opts.insert(0, f"default {self.pick(self.leaves)}")
        opts += self.stab_words
        head = f"interface {ifname} {self.tree_words}htb{handle} " + " ".join(opts)
        return [f"{head.rstrip()} {{", *body, "}"]

    def prio(self, ifname: str, classify: str) -> list[str]:
        marking = bool(classify)
        opts: list[str] = []
        bands = 3
        if self.chance(0.5):
            bands = self.between(2, 16)
            opts.append(f"bands {bands}")
        if bands < 3 or self.chance(0.4):  # KNOWN BUG (prio bands 2 without priomap)
            opts.append("priomap " + " ".join(str(self.between(0, bands - 1)) for _ in range(16)))
        body = [f"    {classify}"] if marking else []
        for _ in range(self.between(1, min(bands, 4))):
            head = f"    class {self.name()}"
            if marking and self.chance(0.15):
                head = " ".join([head, *self.mark()])
            count = self.between(0, MAX_MATCHES[self.kernel])
            lines = [f"        {m}" for _ in range(count) if (m := self.match(marking))]
            if self.chance(0.7):
                lines += self.leaf_qdisc("        ")
            body += [f"{head} {{", *lines, "    }"] if lines else [head]
        head = f"interface {ifname} {self.tree_words}prio{self.handle()} " + " ".join(opts)
        return [f"{head.rstrip()} {{", *body, "}"]

    # ---- hfsc ----
    def curve(self) -> str:
        """One hfsc service curve in either of tc's spellings, slopes in whole bytes/s."""
        if self.chance(0.25):  # umax/dmax/rate; umax / dmax stays within tc's 32 bits
            parts = []
            if self.chance(0.7):
                if self.chance(0.7):
                    parts.append(f"umax {self.spell(self.wide(1, 65535))}")
                parts.append(f"dmax {self.time(16, 10**6)}")
            return " ".join([*parts, f"rate {self.rate(self.bits(8, MAX_RATE))}"])
        parts = []
        m1 = self.chance(0.4)
        if m1:
            parts.append(f"m1 {self.rate(self.bits(8, MAX_RATE)) if self.chance(0.9) else '0bit'}")
        if m1 or self.chance(0.2):
            parts.append(f"d {self.time(0, 10**7)}")
        m2 = "0bit" if m1 and "0bit" not in parts[0] and self.chance(0.05) else None
        return " ".join([*parts, f"m2 {m2 or self.rate(self.bits(8, MAX_RATE))}"])

    def hfsc_class(self, depth: int, max_depth: int, marking: bool, indent: str) -> list[str]:
        """One hfsc class and its subtree: curves the kernel takes (rt or ls; ls with ul and
        on a class with children)."""
        name = self.name()
        self.classes += 1
        opts: list[str] = []
        if self.chance(0.1):
            minor = self.between(2, 0xFFFF)
            if minor not in self.minors:
                self.minors.add(minor)
                opts.append(f"id {self.root_major:x}:{minor:x}")
        children = 0
        if depth < max_depth and self.classes < MAX_CLASSES[self.kernel]:
            children = self.between(0, 2)
        inner = ("ls", "sc", "ls", "ls ul")
        curves = self.pick(inner if children else ("rt", "ls", "rt ls", "sc", "ls ul", "sc ul"))
        opts += [f"{key} {self.curve()}" for key in curves.split()]
        body: list[str] = []
        if children:
            for _ in range(children):
                body += self.hfsc_class(depth + 1, max_depth, marking, indent + "    ")
        else:
            self.leaves.append(name)
            if marking and self.chance(0.15):
                opts += self.mark()
            for _ in range(self.between(0, MAX_MATCHES[self.kernel])):
                if (m := self.match(marking)) is not None:
                    body.append(f"{indent}    {m}")
            if self.chance(0.5):
                body += self.leaf_qdisc(indent + "    ")
        head = f"{indent}class {name} " + " ".join(opts)
        return [f"{head} {{", *body, f"{indent}}}"] if body else [head]

    def hfsc(self, ifname: str, classify: str) -> list[str]:
        handle = self.handle()
        self.root_major = int(handle.split()[1][:-1], 16) if handle else 1
        body = [f"    {classify}"] if classify else []
        max_depth = self.between(1, 3)
        for _ in range(self.between(1, 3)):
            body += self.hfsc_class(1, max_depth, bool(classify), "    ")
        default = f" default {self.pick(self.leaves)}" if self.chance(0.8) else ""
        return [f"interface {ifname} {self.tree_words}hfsc{handle}{default} {{", *body, "}"]

    def chained_root(self, ifname: str) -> list[str]:
        kind = self.pick(("tbf", "netem") if self.uml else ("tbf",))
        opts = self.qdisc_options(kind) + (self.stab_words if kind == "tbf" else [])
        head = f"interface {ifname} {kind}{self.handle()} " + " ".join(opts)
        if self.chance(0.7):
            return [f"{head.rstrip()} {{", *self.leaf_qdisc("    "), "}"]
        return [head.rstrip()]

    def interface(self, ifname: str, index: int) -> list[str]:
        """The lines of one interface: one egress tree, or a block of directions (an upload,
        a download through an IFB, ingress policers)."""
        if not self.chance(0.25):
            return self.tree(ifname, index)
        parts: list[str] = []
        upload = self.chance(0.6)
        if upload:
            parts += _direction("upload", self.tree(ifname, index))
        if self.uml and self.chance(0.4):
            self.stab = False  # an ingress qdisc has no size table: its lines keep their policers
            self.families, self.classifier, words = FAMILIES["both"], "u32", ""
            if self.chance(0.3):
                name = self.pick(tuple(FAMILIES))
                self.families, words = FAMILIES[name], f"family {name} "
            lines = [f"        {m}" for _ in range(self.between(1, 3)) if (m := self.match(False))]
            policed = [
                f"{line} {self.police()}" if " police " not in line else line for line in lines
            ]
            parts += [f"    ingress {words}{{", *policed, "    }"]
        elif not upload or self.chance(0.7):
            via = f" via ifb{index}{self.between(0, 9)}" if self.chance(0.8) else ""
            connmark = " connmark" if self.uml and self.chance(0.3) else ""
            tree = self.tree(ifname, index, marking=False)
            parts += _direction(f"download{via}{connmark}", tree)
        return [f"interface {ifname} {{", *parts, "}"]

    def tree(self, ifname: str, index: int, marking: bool = True) -> list[str]:
        """The lines of one tree: ``interface NAME QDISC ...`` and its block."""
        self.names, self.leaves, self.minors, self.marks = set(), [], set(), set()
        self.classes, self.r2q, self.netems, self.duplicating = 0, 10, 0, False
        self.majors = {1}  # the root's automatic handle is 1: unless 1: is taken explicitly
        # user-mode Linux: mostly what the host lacks (the host run covers htb at length)
        kinds = ["htb", "hfsc", "prio", "prio", "tbf", "hfsc"] if self.uml else ["htb"] * 6
        kind = self.pick([*kinds, "tbf", "fifo", *(["cake"] if self.uml else [])])
        self.stab = kind in ("htb", "tbf") and self.chance(0.5)
        self.stab_words = self.link_layer(stab=True, tbf=kind == "tbf") if self.stab else []
        if kind == "cake":
            return [f"interface {ifname} cake{self.handle()} " + " ".join(self.cake_options())]
        classify = ""
        if (
            marking
            and self.uml
            and kind in ("htb", "prio", "hfsc")
            and not self.marked
            and (self.chance(0.3))
        ):
            self.marked = True
            chain = self.pick(("", f" chain SHAPE{index}", f' chain "MARK-{index}"'))
            classify = f"classify by mark from {MARK_FROM}{chain}"
        self.tree_words = ""
        self.families, self.classifier = FAMILIES["both"], "u32"
        if kind in ("htb", "prio", "hfsc"):
            self.tree_words = self.tree_options(bool(classify))
        if kind == "htb":
            return self.htb(ifname, classify)
        if kind == "prio":
            return self.prio(ifname, classify)
        if kind == "hfsc":
            return self.hfsc(ifname, classify)
        if kind == "tbf":
            return self.chained_root(ifname)
        fifo = self.pick(("pfifo", "bfifo", "pfifo_fast"))
        opts = self.qdisc_options(fifo) if fifo != "pfifo_fast" else []
        return [f"interface {ifname} {fifo}{self.handle()} " + " ".join(opts)]


def _direction(word: str, tree: list[str]) -> list[str]:
    """A tree written as ``interface NAME QDISC ...`` as one direction of a block."""
    head, *body = tree
    _, _, rest = head.split(" ", 2)
    return [f"    {word} {rest}", *(f"    {line}" for line in body)]


def _policy(gen: VGen) -> Policy:
    count = 2 if gen.chance(0.4 if gen.kernel == "host" else 0.2) else 1
    lines = [f"# generated for tcdsl verify on {gen.kernel}"]
    for i, ifname in enumerate(gen.sample(list(IFNAMES), count)):
        lines += gen.interface(ifname, i)
    return Policy("\n".join([*gen.consts, *lines]) + "\n", gen.kernel)


@st.composite
def verifiable_policies(draw: st.DrawFn, kernel: Kernel = "host") -> Policy:
    """A valid policy that ``kernel`` must hold exactly as written (see the module's doc)."""
    return _policy(VGen(lambda lo, hi: draw(_integers(lo, hi)), kernel))


def random_policies(kernel: Kernel, count: int, seed: int) -> list[Policy]:
    """``count`` different policies as ``verifiable_policies`` writes them, from a seeded
    random generator instead of hypothesis: for a batch that is verified as a whole (no
    shrinking), hypothesis would only add its bias towards small examples (a third of a
    hypothesis batch of 100 were one-line policies), repeats (a third again: draws that differ
    in choices without effect) and ~10 ms a policy."""
    rng = random.Random(seed)
    out: dict[str, Policy] = {}
    for _ in range(100 * count):
        if len(out) == count:
            break
        policy = _policy(VGen(rng.randint, kernel))
        out.setdefault(policy.text, policy)
    return list(out.values())
