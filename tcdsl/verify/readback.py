"""Read the kernel's traffic-control state back from the text ``tc`` and ``iptables-save`` print.

The formats are iproute2 6.1's (``tc/q_*.c``, ``tc/f_*.c``, ``lib/json_print*.c``) and
iptables 1.8's ``-save`` output, checked against real kernels where one was at hand (the host's
htb, tbf, fifos and u32; a Debian 6.1 kernel for sfq, prio, netem, fq_codel, codel, fq, red and
fw). Parsing is tolerant: an unknown word is kept (``TcQdisc.words``), never an exception, so a
newer ``tc`` that prints one more field still parses.

How tc prints values:

- rates in bits/s with a decimal unit chosen so the number is an integer, dividing (and
  truncating) by 1000 while the value is at least 1Mbit (``3333333bit`` shows as 3333Kbit);
- sizes in bytes with binary Kb/Mb units rounded to the nearest unit when within 16 bytes
  (1 KiB for Mb), ``15Kb/1`` with ``-d`` (the cell size after the slash);
- times with ``%.3g`` (three significant digits) in s, ms, or whole us;
- netem percentages with ``%g`` (six significant digits);
- u32 keys as 32-bit value/mask words at a word-aligned offset, the keys of one filter that fall
  in the same word merged into one;
- fw marks in hex (``handle 0xa``);
- a flower filter's keys one a line (``  ip_proto tcp``, ``  dst_port 1-1023``), in a fixed
  order, ``ip_tos`` in decimal with a ``/0x`` mask, ``tcp_flags`` in hex with a mask without
  ``0x``, ``ip_proto`` by name or in hex (iproute2's ``f_flower.c``, checked on Debian's 6.1).
"""

from __future__ import annotations

import itertools
import re
import shlex
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from ipaddress import ip_network

from tcdsl.frontend.qdiscs import CAKE_FLAG_GROUPS, CAKE_ISOLATION

# ==== values ===================================================================================

_RATE = re.compile(r"(\d+)([KMGT]?)(i?)bit")
_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:e\+\d+)?)([KMG]?)b(?:/\d+)?")
_TIME = re.compile(r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)(s|ms|us|ns)")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)%")
_COUNT = re.compile(r"(\d+)p?")
_SIGNED = re.compile(r"-?\d+")
_KEY = re.compile(r"match ([0-9a-f]{8})/([0-9a-f]{8}) at (nexthdr\+)?(-?\d+)")
NEXTHDR = 0x10000
"""Added to the offset of a key tc prints ``at nexthdr+N`` (relative to the header a hash
table's link found; ``ip6 icmp_code`` makes one): never equal to a plain offset."""
_FH = re.compile(r"([0-9a-f]*):([0-9a-f]*):([0-9a-f]*)")


def parse_rate(text: str) -> int:
    """``10Mbit`` -> 10000000; ``1500Kbit`` -> 1500000; ``800bit`` -> 800 (bits/s)."""
    m = _RATE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc rate: {text!r}")
    base = 1024 if m.group(3) else 1000
    scale = {"": 1, "K": base, "M": base**2, "G": base**3, "T": base**4}[m.group(2)]
    return int(m.group(1)) * scale


def parse_size(text: str) -> int:
    """``15Kb/1`` -> 15360; ``1539b`` -> 1539; ``1Mb`` -> 1048576 (bytes)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc size: {text!r}")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)]
    return round(float(m.group(1)) * scale)


def parse_time(text: str) -> int:
    """``26.2ms`` -> 26200; ``99us`` -> 99; ``1.5s`` -> 1500000 (microseconds, rounded)."""
    m = _TIME.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc time: {text!r}")
    scale = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}[m.group(2)]
    return round(float(m.group(1)) * scale)


def parse_percent(text: str) -> float:
    """``1.5%`` -> 1.5 (percentage points)."""
    m = _PERCENT.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc percentage: {text!r}")
    return float(m.group(1))


def parse_count(text: str) -> int:
    """``127p`` -> 127; ``1000`` -> 1000 (packets, or a plain number)."""
    m = _COUNT.fullmatch(text)
    if m is None:
        raise ValueError(f"not a count: {text!r}")
    return int(m.group(1))


Value = int | float | str | bool | tuple[int, ...]
"""A value tc shows, in base units: bits/s, bytes, microseconds, packets, percentage points."""


@dataclass(frozen=True, slots=True)
class Shown:
    """One value as tc printed it (``text``) and what it means (``value``, in base units)."""

    text: str
    value: Value


def _after(words: Sequence[str], key: str) -> str | None:
    """The word after the first ``key`` in ``words``."""
    try:
        return words[list(words).index(key) + 1]
    except (ValueError, IndexError):
        return None


# ==== option scanners ==========================================================================
#
# Each qdisc kind prints ``key value`` pairs (and a few bare flags) after its header. A scanner
# walks the words once: a known key takes its value with the parser of its dimension; an unknown
# word is skipped, so a field a newer tc adds does not derail the rest.


def _rate(text: str) -> Value:
    return parse_rate(text)


def _size(text: str) -> Value:
    return parse_size(text)


def _time(text: str) -> Value:
    return parse_time(text)


def _count(text: str) -> Value:
    return parse_count(text)


def _int0(text: str) -> Value:
    return int(text, 16) if text.lower().startswith(("0x", "-0x")) else int(text)


def _hexint(text: str) -> Value:
    return int(text, 16)


def _perturb(text: str) -> Value:
    return int(text.removesuffix("sec"))


_PARSERS: dict[str, Callable[[str], Value]] = {
    "rate": _rate,
    "size": _size,
    "time": _time,
    "count": _count,
    "int": _int0,
    "hex": _hexint,
    "perturb": _perturb,
    "text": str,
    "float": float,
}

_VALUE_PATTERNS = {
    "rate": _RATE,
    "size": _SIZE,
    "time": _TIME,
    "count": _COUNT,
    "int": re.compile(r"-?(?:0x[0-9a-fA-F]+|\d+)"),
    "hex": re.compile(r"(?:0x)?[0-9a-fA-F]+"),
    "perturb": re.compile(r"\d+(?:sec)?"),
    "text": re.compile(r"\S+"),
    "float": re.compile(r"\d+(?:\.\d+)?(?:e[+-]\d+)?"),
}

FLAG = "flag"
"""A bare word (``ecn``, ``headdrop``): its value is True when present."""


def _scan(words: Sequence[str], spec: dict[str, str]) -> dict[str, Shown]:
    """Pick ``key value`` pairs and flags out of ``words`` as ``spec`` (key -> dimension) says."""
    out: dict[str, Shown] = {}
    i = 0
    while i < len(words):
        word = words[i]
        dim = spec.get(word)
        if dim == FLAG:
            out[word] = Shown(word, True)
        elif dim is not None and i + 1 < len(words):
            text = words[i + 1]
            if _VALUE_PATTERNS[dim].fullmatch(text):
                out.setdefault(word, Shown(text, _PARSERS[dim](text)))
                i += 1
        i += 1
    return out


def unread(words: Sequence[str], spec: dict[str, str]) -> list[str]:
    """``key value`` pairs of ``words`` whose key ``spec`` names and whose value is none of
    its dimension (``prio x``): what :func:`_scan` passes over."""
    return [
        f"{key} {value}"
        for key, value in itertools.pairwise(words)
        if spec.get(key) not in (None, FLAG) and not _VALUE_PATTERNS[spec[key]].fullmatch(value)
    ]


HFSC_CURVE_PARTS = {"m1": "rate", "d": "time", "m2": "rate"}


def hfsc_curves(words: Sequence[str]) -> dict[str, Shown]:
    """An hfsc class's curves (``rt m1 2Mbit d 10ms m2 1Mbit ls m1 0bit d 0us m2 1Mbit``) as
    ``rt.m1``, ``rt.d``, ``rt.m2`` and so on; tc prints ``sc`` for equal rt and ls curves."""
    out: dict[str, Shown] = {}
    for i, word in enumerate(words):
        if word not in ("rt", "ls", "ul", "sc"):
            continue
        part = _scan(words[i + 1 : i + 7], HFSC_CURVE_PARTS)
        for curve in ("rt", "ls") if word == "sc" else (word,):
            for key, shown in part.items():
                out.setdefault(f"{curve}.{key}", shown)
    return out


def _bands_and_priomap(words: Sequence[str], out: dict[str, Shown]) -> None:
    """``bands 3 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1`` (prio and pfifo_fast)."""
    bands = _after(words, "bands")
    if bands is not None and bands.isdigit():
        out["bands"] = Shown(bands, int(bands))
    if "priomap" in words:
        start = list(words).index("priomap") + 1
        items: list[int] = []
        for word in words[start : start + 16]:
            if not word.isdigit():
                break
            items.append(int(word))
        out["priomap"] = Shown(" ".join(map(str, items)), tuple(items))


def _netem(words: Sequence[str]) -> dict[str, Shown]:
    """netem: ``limit 1000 delay 20ms  5ms 25% loss 1% 25% reorder 25% 50% gap 5 rate 1Mbit
    packetoverhead 20 cellsize 100 slot 800us 1ms`` (the distribution is not shown).

    The jitter and each correlation follow their value without a key of their own."""
    out: dict[str, Shown] = {}
    i = 0
    n = len(words)

    def nxt(pattern: re.Pattern[str]) -> str | None:
        return words[i + 1] if i + 1 < n and pattern.fullmatch(words[i + 1]) else None

    while i < n:
        word = words[i]
        if word == "limit" and (text := nxt(_SIGNED)) is not None:
            # the kernel's limit is a u32 that tc prints with %d: 4294967295 shows as -1
            out["limit"] = Shown(text, int(text) & 0xFFFFFFFF)
            i += 1
        elif word == "delay" and (text := nxt(_TIME)) is not None:
            out["delay"] = Shown(text, parse_time(text))
            i += 1
            if (text := nxt(_TIME)) is not None:
                out["jitter"] = Shown(text, parse_time(text))
                i += 1
            if (text := nxt(_PERCENT)) is not None:
                out["delay_correlation"] = Shown(text, parse_percent(text))
                i += 1
        elif word in ("loss", "duplicate", "corrupt", "reorder"):
            if (text := nxt(_PERCENT)) is not None:
                out[word] = Shown(text, parse_percent(text))
                i += 1
                if (text := nxt(_PERCENT)) is not None:
                    out[f"{word}_correlation"] = Shown(text, parse_percent(text))
                    i += 1
            elif word == "loss" and i + 1 < n:
                out["loss_model"] = Shown(words[i + 1], words[i + 1])  # "state" or "gemodel"
                i += 1
        elif word == "rate" and (text := nxt(_RATE)) is not None:
            out["rate"] = Shown(text, parse_rate(text))
            i += 1
        elif word in ("gap", "packetoverhead", "cellsize") and (text := nxt(_SIGNED)) is not None:
            out[word] = Shown(text, int(text))
            i += 1
        elif word == "slot" and (text := nxt(_TIME)) is not None:
            out["slot"] = Shown(text, parse_time(text))
            i += 1
            if (text := nxt(_TIME)) is not None:
                out["slot_max"] = Shown(text, parse_time(text))
                i += 1
        elif word == "ecn":
            out["ecn"] = Shown(word, True)
        i += 1
    return out


STAB_KEYS = ("linklayer", "overhead", "mpu", "mtu", "tsize")
"""What tc -d prints of a size table, on the line after its qdisc (tc_stab.c)."""


def _stab(words: Sequence[str]) -> dict[str, Shown]:
    """A size table's line (``linklayer atm overhead 26 mtu 2047 tsize 512``), keys prefixed
    ``stab ``; ``stab`` itself says there is one."""
    out = {"stab": Shown(" ".join(words), True)}
    for key, shown in _scan(
        words, {"linklayer": "text", **dict.fromkeys(STAB_KEYS[1:], "int")}
    ).items():
        out[f"stab {key}"] = shown
    return out


_CAKE_WORDS = {
    **{k: v for k, v in CAKE_FLAG_GROUPS.items() if k not in ("unlimited", "mode")},
    "isolate": CAKE_ISOLATION,
    "mode": ("ingress",),
    "atm": ("atm", "ptm", "noatm"),
    "raw": ("raw",),
}
_CAKE_KEY = {word: key for key, words in _CAKE_WORDS.items() for word in words}


def _cake(words: Sequence[str]) -> dict[str, Shown]:
    """cake: ``bandwidth 20Mbit diffserv4 dual-srchost nat nowash ingress ack-filter split-gso
    rtt 100ms noatm overhead 18 mpu 64 memlimit 32Mb fwmark 0xff`` (q_cake.c); the bare words
    of one group are kept under the group's key."""
    out = _scan(
        words,
        {"rtt": "time", "overhead": "int", "mpu": "int", "memlimit": "size", "fwmark": "hex"},
    )
    bandwidth = _after(words, "bandwidth")
    if bandwidth == "unlimited":
        out["bandwidth"] = Shown(bandwidth, bandwidth)
    elif bandwidth is not None and _RATE.fullmatch(bandwidth):
        out["bandwidth"] = Shown(bandwidth, parse_rate(bandwidth))
    for word in words:
        key = _CAKE_KEY.get(word)
        if key is not None:
            out.setdefault(key, Shown(word, True if key == "raw" else word))
    return out


QDISC_OPTIONS: dict[str, dict[str, str]] = {
    "htb": {"r2q": "int", "default": "hex", "direct_packets_stat": "int", "direct_qlen": "int"},
    "hfsc": {"default": "hex"},
    "tbf": {
        "rate": "rate",
        "burst": "size",
        "mpu": "size",
        "peakrate": "rate",
        "mtu": "size",
        "minburst": "size",
        "lat": "time",
        "limit": "size",
        "overhead": "int",
        "linklayer": "text",
    },
    "sfq": {
        "limit": "count",
        "quantum": "size",
        "depth": "int",
        "headdrop": FLAG,
        "flows": "int",
        "divisor": "int",
        "perturb": "perturb",
    },
    "fq_codel": {
        "limit": "count",
        "flows": "int",
        "quantum": "int",
        "target": "time",
        "ce_threshold": "time",
        "interval": "time",
        "memory_limit": "size",
        "ecn": FLAG,
        "drop_batch": "int",
    },
    "pfifo": {"limit": "count"},
    "bfifo": {"limit": "size"},
    "codel": {
        "limit": "count",
        "target": "time",
        "ce_threshold": "time",
        "interval": "time",
        "ecn": FLAG,
    },
    "fq": {
        "limit": "count",
        "flow_limit": "count",
        "buckets": "int",
        "orphan_mask": "int",
        "nopacing": FLAG,
        "quantum": "size",
        "initial_quantum": "size",
        "maxrate": "rate",
        "low_rate_threshold": "rate",
        "refill_delay": "time",
        "ce_threshold": "time",
        "timer_slack": "time",
        "horizon": "time",
        "horizon_drop": FLAG,
        "horizon_cap": FLAG,
    },
    "red": {
        "limit": "size",
        "min": "size",
        "max": "size",
        "ecn": FLAG,
        "harddrop": FLAG,
        "adaptive": FLAG,
        "nodrop": FLAG,
        "ewma": "int",
        "probability": "float",
        "Plog": "int",
        "Scell_log": "int",
    },
    "cbq": {"rate": "rate", "cell": "size", "mpu": "size", "prio": "text", "allot": "size"},
}
"""What each qdisc kind prints after its header, key -> dimension (iproute2 6.1 ``*_print_opt``).

prio, pfifo_fast and netem have scanners of their own (positional values)."""

CLASS_OPTIONS: dict[str, dict[str, str]] = {
    "htb": {
        "prio": "int",
        "quantum": "int",
        "rate": "rate",
        "overhead": "int",
        "ceil": "rate",
        "linklayer": "text",
        "burst": "size",
        "cburst": "size",
        "level": "int",
    },
    "cbq": {"rate": "rate", "prio": "text", "allot": "size", "weight": "rate", "level": "int"},
}
"""What each class kind prints (``htb_print_opt`` serves classes too; the first ``mpu`` is the
rate's, and only the first occurrence of a key is kept)."""


# ==== tc objects ===============================================================================


def _header(words: list[str]) -> tuple[str, list[str]]:
    """The parent (``root`` or a class id) and the words after ``kind handle``, minus the
    ``dev X``, ``root``/``parent P`` and ``refcnt N`` of the header."""
    rest = words[3:]
    parent = "?"
    out: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "root" and parent == "?":
            parent = "root"
        elif word in ("parent", "dev", "refcnt") and i + 1 < len(rest) and not out:
            if word == "parent":
                parent = rest[i + 1]
            i += 1
        else:
            out.append(word)
        i += 1
    return parent, out


@dataclass(frozen=True)
class TcQdisc:
    """One line of ``tc -d qdisc show``: kind, handle (``10:``), parent and the option words."""

    kind: str
    handle: str
    parent: str
    """``root`` or a class id such as ``1:10``."""
    words: tuple[str, ...]
    """Everything after ``kind handle``, as printed."""
    stab: tuple[str, ...] | None = None
    """The size table's line below the qdisc's (``tc -d``), or None without one."""

    def opt(self, key: str) -> str | None:
        """The word after ``key``, as printed."""
        return _after(self.words, key)

    @property
    def options(self) -> dict[str, Shown]:
        """The options this kind prints, parsed (keys as tc prints them, e.g. ``lat``), and
        its size table's under ``stab ...`` keys."""
        _, words = _header(["qdisc", self.kind, self.handle, *self.words])
        stab = _stab(self.stab) if self.stab is not None else {}
        match self.kind:
            case "prio" | "pfifo_fast":
                out: dict[str, Shown] = {}
                _bands_and_priomap(words, out)
                return out | stab
            case "netem":
                return _netem(words) | stab
            case "cake":
                return _cake(words) | stab
            case _:
                return _scan(words, QDISC_OPTIONS.get(self.kind, {})) | stab

    @property
    def unread(self) -> list[str]:
        """The options of a kind :attr:`options` scans whose value it cannot read."""
        if self.kind in ("prio", "pfifo_fast", "netem", "cake"):
            return []
        return unread(_header(["qdisc", self.kind, self.handle, *self.words])[1],
                      QDISC_OPTIONS.get(self.kind, {}))  # fmt: skip


@dataclass(frozen=True)
class TcClass:
    """One line of ``tc -d class show``."""

    kind: str
    classid: str
    parent: str
    """``root`` or the parent's id (a class, or the qdisc as ``1:``)."""
    leaf: str | None
    """The handle of the qdisc below (``10:``); None for inner classes and default qdiscs."""
    words: tuple[str, ...]

    def opt(self, key: str) -> str | None:
        """The word after ``key``, as printed."""
        return _after(self.words, key)

    @property
    def options(self) -> dict[str, Shown]:
        """The options this class kind prints, parsed."""
        _, words = _header(["class", self.kind, self.classid, *self.words])
        if self.kind == "hfsc":
            return hfsc_curves(words)
        return _scan(words, CLASS_OPTIONS.get(self.kind, {}))

    @property
    def unread(self) -> list[str]:
        """The options :attr:`options` scans whose value it cannot read (``prio x``)."""
        if self.kind == "hfsc":
            return []
        words = _header(["class", self.kind, self.classid, *self.words])[1]
        return unread(words, CLASS_OPTIONS.get(self.kind, {}))


Key = tuple[int, int, int]
"""A u32 key as the kernel holds it: (value, mask, offset), value and mask in host order."""


FLOWER_PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}
"""The ``ip_proto`` values tc prints by name (any other in hex: ``2f``)."""

FLOWER_FLAGS = frozenset({"skip_hw", "skip_sw", "in_hw", "not_in_hw", "verbose"})
"""Lines of a flower filter that say where it runs, not what it matches."""


@dataclass(frozen=True)
class FlowerMatch:
    """What a flower filter matches, normalised so that equal matches compare equal: an
    address as ``str(ip_network)`` (``2001:db8::1/128``), a port, a port range and a port
    with a prefix mask all as (lo, hi), ``ip_tos`` and ``tcp_flags`` as (value & mask,
    mask). A key this does not model is kept in ``other`` (it makes two matches differ)."""

    eth_type: str | None = None
    """``ipv4`` or ``ipv6`` (from the filter's protocol), as tc prints it."""
    ip_proto: int | None = None
    src: str | None = None
    dst: str | None = None
    sport: tuple[int, int] | None = None
    dport: tuple[int, int] | None = None
    tos: tuple[int, int] | None = None
    """(value, mask) of the TOS byte (IPv4) or the traffic class (IPv6)."""
    tcp_flags: tuple[int, int] | None = None
    other: tuple[str, ...] = ()

    def describe(self) -> str:
        """The match in tc's words, in the order tc prints them (``eth_type ipv6 ip_proto tcp
        dst_port 443``)."""
        words: list[str] = []
        if self.eth_type is not None:
            words += ["eth_type", self.eth_type]
        if self.ip_proto is not None:
            names = {n: name for name, n in FLOWER_PROTOCOLS.items()}
            words += ["ip_proto", names.get(self.ip_proto, f"{self.ip_proto:02x}")]
        if self.tos is not None:
            value, mask = self.tos
            words += ["ip_tos", str(value) if mask == 0xFF else f"{value}/{mask:#x}"]
        for key, net in (("dst_ip", self.dst), ("src_ip", self.src)):
            if net is not None:
                words += [key, net.removesuffix("/32") if "." in net else net.removesuffix("/128")]
        for key, port in (("dst_port", self.dport), ("src_port", self.sport)):
            if port is not None:
                words += [key, str(port[0]) if port[0] == port[1] else f"{port[0]}-{port[1]}"]
        if self.tcp_flags is not None:
            words += ["tcp_flags", f"{self.tcp_flags[0]:#x}/{self.tcp_flags[1]:x}"]
        return " ".join([*words, *self.other]) or "everything"


def flower_port(text: str) -> tuple[int, int] | None:
    """``443`` -> (443, 443); ``1-1023`` -> (1, 1023); ``1024/0xfc00`` -> (1024, 2047); None
    for a mask that is not a range (``1/0x0101``)."""
    if "-" in text:
        lo, _, hi = text.partition("-")
        return int(lo), int(hi)
    value, mask = _value_mask(text, 0xFFFF)
    free = ~mask & 0xFFFF
    if free & (free + 1):
        return None
    return value & mask, (value & mask) | free


def _masked(text: str, value_base: int, full: int) -> tuple[int, int]:
    """``184/0xfc`` (value in ``value_base``, mask in hex) -> (value & mask, mask)."""
    value_text, _, mask_text = text.partition("/")
    value = int(value_text, value_base)
    mask = int(mask_text, 16) if mask_text else full
    return value & mask, mask


def parse_flower(lines: Sequence[str]) -> FlowerMatch:
    """A flower filter's key lines (``eth_type ipv6``, ``ip_proto tcp``, ...), as
    ``flower_print_opt`` prints them; flags (``not_in_hw``) and actions are not keys."""
    values: dict[str, object] = {}
    other: list[str] = []
    for line in lines:
        words = line.split()
        if not words or words[0] in FLOWER_FLAGS or parse_action(line) is not None:
            continue
        if words[0] in ("ref", "used", "Sent", "backlog", "index"):
            continue  # an action's counters (tc -s)
        key, text = words[0], " ".join(words[1:])
        try:
            match key:
                case "eth_type":
                    values["eth_type"] = text
                case "ip_proto":
                    values["ip_proto"] = FLOWER_PROTOCOLS.get(text) or int(text, 16)
                case "src_ip" | "dst_ip":
                    values[key[:3]] = _network(text)
                case "src_port" | "dst_port":
                    port = flower_port(text)
                    if port is None:
                        other.append(line.strip())
                    else:
                        values[key[0] + "port"] = port
                case "ip_tos":
                    values["tos"] = _masked(text, 10, 0xFF)
                case "tcp_flags":
                    values["tcp_flags"] = _masked(text, 16, 0xFFF)
                case _:
                    other.append(line.strip())
        except ValueError:
            other.append(line.strip())
    return FlowerMatch(**values, other=tuple(other))  # type: ignore[arg-type]


@dataclass(frozen=True)
class TcFilter:
    """One filter node of ``tc filter show``: a u32 rule (with keys), an fw mapping, or another
    kind (kept with its words, so that it can be reported)."""

    kind: str
    protocol: str
    pref: int
    flowid: str
    keys: tuple[Key, ...] = ()
    mark: int | None = None
    mask: int | None = field(default=None, compare=False)
    """fw only: the mark mask, when it is not 0xffffffff."""
    node: int = field(default=0, compare=False)
    """The u32 node number (``fh 800::801`` -> 0x801): the order within one pref."""
    words: tuple[str, ...] = field(default=(), compare=False)
    """The filter's lines, as printed."""
    actions: tuple[Action, ...] = ()
    """The filter's actions in order (police, connmark, mirred), as :func:`parse_action` reads
    them."""
    flower: FlowerMatch | None = None
    """flower only: what it matches."""
    place: str = field(default="", compare=False)
    """u32 only: the node's handle, ``::N`` in the pref's root table (800:, 801:, ...),
    ``T:B:N`` in a table tcdsl made (as :attr:`tcdsl.ir.U32Place.handle` spells it)."""
    link: str = field(default="", compare=False)
    """u32 only: the table a link node jumps to (``1:``), or ""."""
    hashkey: tuple[int, int] | None = field(default=None, compare=False)
    """u32 only: a link node's (mask, offset), or None."""
    offset: str = ""
    """u32 only: the node's ``offset ...``/``eat`` line as tc prints it (``offset plus 20``,
    ``offset 0f00>>6 at 0  eat``): the keys of the node, or of the table it links to, are
    then read from another place than the IP header; "" when it has none (tcdsl writes
    none)."""
    unread: bool = field(default=False, compare=False)
    """u32 only: keys the text shows other than as tc shows them without ``-p`` (``match IP
    src 10.0.0.0/8``), so ``keys`` are not all the node's."""
    u32_mark: tuple[int, int] | None = None
    """u32 only: a ``mark VALUE MASK`` key (the packet's firewall mark), which tcdsl never
    writes (its marks are fw filters'), or None."""
    keyless: bool = field(default=False, compare=False)
    """u32 only: the text shows no key of the node at all. tc without ``-p`` shows every key,
    so the node has none (``ip6 dst ::/0`` makes one: it matches every packet); ``tc -p``
    prints no IPv6 key and no key of mask 0 of a ``protocol ip`` or ``ipv6`` node, so there
    its keys are unknown."""


ROOT_TABLES = 0x800
"""u32 numbers the root table of each pref 800:, 801:, ...; tables tcdsl makes are below."""


def u32_place(fh: re.Match[str]) -> str:
    """A node's handle as :attr:`tcdsl.ir.U32Place.handle` spells it (the root table left out:
    its id depends on the order prefs were made)."""
    table, bucket, node = (int(fh.group(i) or "0", 16) for i in (1, 2, 3))
    if table >= ROOT_TABLES:
        return f"::{node:x}"
    return f"{table:x}:{bucket:x}:{node:x}"


_HASHKEY = re.compile(r"hash mask ([0-9a-f]{8}) at (\d+)")
_U32_MARK = re.compile(r"\s*mark 0x([0-9a-f]+) 0x([0-9a-f]+)")
"""A u32 node's ``mark VALUE MASK`` key (CONFIG_CLS_U32_MARK; FireQOS writes it)."""
_OFFSET = re.compile(r"\s*(offset\b|eat\b)")
"""A u32 node's line of ``offset plus N``, ``offset MASK>>SHIFT at N`` and/or ``eat``."""


Action = tuple[str | int, ...]
"""An action of a filter: ``("police", rate, burst, mtu, verdict)`` (bits/s, bytes),
``("connmark",)``, ``("mirred", "egress", "redirect", DEVICE)``; another as its first word."""

UNREADABLE_POLICE = "police (a value unreadable)"
"""The action :func:`parse_action` gives for a ``police`` line whose rate or size is not tc's."""

_MIRRED = re.compile(r"mirred \((Egress|Ingress) (Redirect|Mirror) to device (\S+)\)")


def parse_action(line: str) -> Action | None:
    """The action a line of ``tc filter show`` starts, or None (keys, counters)."""
    text = re.sub(r"^action order \d+:\s*", "", line.strip())
    if text == line.strip() and not text.startswith("police "):
        return None
    words = text.split()
    if not words:
        return None
    if words[0] == "police":
        verdict = _after(words, "action") or "?"
        try:
            return (
                "police",
                parse_rate(_after(words, "rate") or "0bit"),
                parse_size(_after(words, "burst") or "0b"),
                parse_size(_after(words, "mtu") or "0b"),
                verdict.split("/")[0],
            )
        except ValueError:  # saved text edited by hand: tc prints every value
            return (UNREADABLE_POLICE,)
    if (m := _MIRRED.match(text)) is not None:
        return ("mirred", m.group(1).lower(), m.group(2).lower(), m.group(3))
    if words[0] == "skbedit" and (queue := _after(words, "queue_mapping")) is not None:
        if words[1:] == ["queue_mapping", queue, "pipe"]:  # tcdsl's: the queue, then on
            return ("skbedit", "queue_mapping", queue)
        # another verb (continue: u32 tries its next rule) or more fields (priority,
        # which htb takes before its filters) steer otherwise: kept, to differ
        return ("skbedit", *words[1:])
    return (words[0],)


def parse_qdiscs(text: str) -> list[TcQdisc]:
    """Parse ``tc -d qdisc show dev X`` (a size table's line joins the qdisc above it)."""
    out: list[TcQdisc] = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in STAB_KEYS and line[:1].isspace() and out:
            out[-1] = replace(out[-1], stab=tuple(words))
            continue
        if len(words) < 3 or words[0] != "qdisc":
            continue
        parent, _ = _header(words)
        out.append(TcQdisc(words[1], words[2], parent, tuple(words[3:])))
    return out


def parse_classes(text: str) -> list[TcClass]:
    """Parse ``tc -d class show dev X``."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] != "class":
            continue
        parent, _ = _header(words)
        out.append(TcClass(words[1], words[2], parent, _after(words, "leaf"), tuple(words[3:])))
    return out


def _filter_blocks(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """Each ``filter ...`` line with the indented lines that follow it."""
    head: list[str] | None = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("filter "):
            if head is not None:
                yield head, body
            head, body = line.split(), []
        elif head is not None and line.strip():
            body.append(line.strip())
    if head is not None:
        yield head, body


_FW_HANDLE = re.compile(r"(0x[0-9a-f]+|[0-9]+)(?:/(0x[0-9a-f]+|[0-9]+))?", re.IGNORECASE)


def _fw_handle(handle: str) -> tuple[int | None, int | None]:
    """An fw filter's ``handle MARK[/MASK]`` as tc prints it: (mark, mask or None); (None,
    None) for text tc does not print (a saved file edited by hand)."""
    m = _FW_HANDLE.fullmatch(handle)
    if m is None:
        return None, None
    mark, mask = _strtoul(m.group(1)), _strtoul(m.group(2)) if m.group(2) else None
    if mark is None or (m.group(2) and mask is None):
        return None, None
    return mark, mask


def _strtoul(text: str) -> int | None:
    """A number as tc's ``strtoul(text, 0)`` reads it (``0x`` hex, a leading ``0`` octal);
    None when it is not one."""
    base = 16 if text[:2].lower() == "0x" else 8 if text.startswith("0") else 10
    try:
        return int(text, base)
    except ValueError:
        return None


def parse_filters(text: str) -> list[TcFilter]:
    """Parse ``tc filter show dev X parent P``: the rules, not the u32 hash tables and the
    per-pref heads, in the order tc lists them (the order the kernel tries them in)."""
    out = []
    for words, body in _filter_blocks(text):
        pref_text = _after(words, "pref")
        if pref_text is None or not pref_text.isdigit():
            continue
        protocol = _after(words, "protocol") or "all"
        kind = words[words.index("pref") + 2] if words.index("pref") + 2 < len(words) else "?"
        if kind == "u32":
            m = _FH.fullmatch(_after(words, "fh") or "")
            if m is None or not m.group(3) or int(m.group(3), 16) == 0:
                continue  # the filter head or a hash table, not a rule
            flowid = _after(words, "*flowid") or _after(words, "flowid") or "?"
            if flowid == "not_in_hw":  # "terminal flowid not_in_hw": no class id
                flowid = ""
            link = _after(words, "link") or ""
            if link:
                flowid = ""
            hashkey: tuple[int, int] | None = None
            keys = []
            actions: list[Action] = []
            moved = ""
            unread = "match" in words  # tc -p's first key, on the node's own line
            marked: tuple[int, int] | None = None
            for line in body:
                if _OFFSET.match(line) is not None:
                    moved = " ".join(line.split())
                elif (mk := _U32_MARK.match(line)) is not None:
                    marked = (int(mk.group(1), 16), int(mk.group(2), 16))
                elif (h := _HASHKEY.search(line)) is not None:
                    hashkey = (int(h.group(1), 16), int(h.group(2)))
                elif (k := _KEY.search(line)) is not None:
                    offset = int(k.group(4)) + (NEXTHDR if k.group(3) else 0)
                    keys.append((int(k.group(1), 16), int(k.group(2), 16), offset))
                elif (action := parse_action(line)) is not None:
                    actions.append(action)
                elif line.lstrip().startswith("match "):
                    unread = True
            out.append(
                TcFilter(
                    kind,
                    protocol,
                    int(pref_text),
                    flowid,
                    tuple(keys),
                    node=int(m.group(3), 16),
                    words=tuple([" ".join(words), *body]),
                    actions=tuple(actions),
                    place=u32_place(m),
                    link=link,
                    hashkey=hashkey,
                    offset=moved,
                    unread=unread,
                    keyless=not (keys or moved or unread or marked),
                    u32_mark=marked,
                )
            )
        elif kind == "fw":
            handle = _after(words, "handle")
            if handle is None:
                continue  # the head of the pref
            mark, mask = _fw_handle(handle)
            flowid = _after(words, "classid") or _after(words, "flowid") or "?"
            out.append(
                TcFilter(
                    kind,
                    protocol,
                    int(pref_text),
                    flowid,
                    mark=mark,
                    mask=mask,
                    words=tuple([" ".join(words), *body]),
                )
            )
        else:
            # flower, or another classifier (matchall, bpf, ...) that the script never adds
            # (reported as it is); the head line of a pref (without handle) is skipped like u32's.
            if "handle" not in words and not body:
                continue
            flowid = _after(words, "classid") or _after(words, "flowid") or "?"
            out.append(
                TcFilter(
                    kind,
                    protocol,
                    int(pref_text),
                    flowid,
                    words=tuple([" ".join(words), *body]),
                    actions=tuple(a for line in body if (a := parse_action(line)) is not None),
                    flower=parse_flower(body) if kind == "flower" else None,
                )
            )
    return out


# ==== iptables-save ============================================================================

PROTOCOL_NUMBERS: dict[str, int] = {
    "ip": 0,
    "all": 0,
    "hopopt": 0,
    "icmp": 1,
    "igmp": 2,
    "ggp": 3,
    "ipencap": 4,
    "st": 5,
    "tcp": 6,
    "egp": 8,
    "igp": 9,
    "pup": 12,
    "udp": 17,
    "hmp": 20,
    "xns-idp": 22,
    "rdp": 27,
    "iso-tp4": 29,
    "dccp": 33,
    "xtp": 36,
    "ddp": 37,
    "idpr-cmtp": 38,
    "ipv6": 41,
    "ipv6-route": 43,
    "ipv6-frag": 44,
    "idrp": 45,
    "rsvp": 46,
    "gre": 47,
    "esp": 50,
    "ah": 51,
    "skip": 57,
    "ipv6-icmp": 58,
    "icmpv6": 58,
    "ipv6-nonxt": 59,
    "ipv6-opts": 60,
    "rspf": 73,
    "vmtp": 81,
    "eigrp": 88,
    "ospf": 89,
    "ax.25": 93,
    "ipip": 94,
    "etherip": 97,
    "encap": 98,
    "pim": 103,
    "ipcomp": 108,
    "vrrp": 112,
    "l2tp": 115,
    "isis": 124,
    "sctp": 132,
    "fc": 133,
    "mobility-header": 135,
    "mh": 135,
    "udplite": 136,
    "mpls-in-ip": 137,
    "manet": 138,
    "hip": 139,
    "shim6": 140,
    "wesp": 141,
    "rohc": 142,
    "ethernet": 143,
}
"""iptables-save prints a protocol by the name ``/etc/protocols`` gives it (Debian's netbase
list, here), or by iptables' own name, or as a number when neither knows it."""


def protocol_number(text: str) -> int | None:
    """``tcp`` -> 6; ``47`` -> 47; an unknown name -> the host's /etc/protocols, else None."""
    if text.isdigit():
        return int(text)
    number = PROTOCOL_NUMBERS.get(text.lower())
    if number is None:
        try:
            number = socket.getprotobyname(text)
        except OSError:
            return None
    return number


def _network(text: str) -> str | None:
    """``10.0.0.1/32`` -> itself; ``10.0.0.1`` -> ``10.0.0.1/32``; ``0.0.0.0/0`` -> None; the
    same for IPv6 (``ip6tables-save``: ``2001:db8::1/128``, ``::/0``)."""
    net = ip_network(text, strict=False)
    return None if net.prefixlen == 0 else str(net)


def _ports(text: str) -> tuple[int, int]:
    """``80`` -> (80, 80); ``1000:2000`` -> (1000, 2000); ``:1023`` -> (0, 1023)."""
    if ":" not in text:
        return int(text), int(text)
    lo, _, hi = text.partition(":")
    return int(lo or 0), int(hi or 65535)


def _value_mask(text: str, full: int) -> tuple[int, int]:
    value, _, mask = text.partition("/")
    return int(value, 0), int(mask, 0) if mask else full


@dataclass(frozen=True)
class IptRule:
    """One ``-A CHAIN ...`` rule, normalised so that equivalent spellings compare equal
    (``--set-mark 10`` and ``--set-xmark 0xa/0xffffffff``; ``-s 10.0.0.1`` and ``/32``;
    ``-p 47`` and ``-p gre``; ``-d 0.0.0.0/0`` and nothing)."""

    chain: str
    src: str | None = None
    dst: str | None = None
    in_iface: str | None = None
    out_iface: str | None = None
    protocol: int | None = None
    sport: tuple[int, int] | None = None
    dport: tuple[int, int] | None = None
    tos: tuple[int, int] | None = None
    dscp: int | None = None
    mark: tuple[int, int] | None = None
    """``-m mark --mark V[/M]``."""
    target: str | None = None
    set_mark: tuple[int, int] | None = None
    """``-j MARK --set-xmark V/M`` (``--set-mark V`` is V/0xffffffff)."""
    set_dscp: int | None = None
    """``-j DSCP --set-dscp N``."""
    tcp_flags: tuple[int, int] | None = None
    """``--tcp-flags MASK COMP`` as (flags that must be set, flags examined) bits."""
    save_mark: tuple[int, int] | None = None
    """``-j CONNMARK --save-mark``: (nfmask, ctmask), 0xffffffff each unless given."""
    other: tuple[str, ...] = ()
    """Words this parser does not model (negations, other matches): any makes a rule differ."""
    text: str = field(default="", compare=False)
    """The rule as printed."""

    def fields(self) -> dict[str, object]:
        """The fields that carry meaning, for field-by-field comparison."""
        return {
            "src": self.src,
            "dst": self.dst,
            "in-interface": self.in_iface,
            "out-interface": self.out_iface,
            "protocol": self.protocol,
            "sport": self.sport,
            "dport": self.dport,
            "tos": self.tos,
            "dscp": self.dscp,
            "mark match": self.mark,
            "target": self.target,
            "set-mark": self.set_mark,
            "set-dscp": self.set_dscp,
            "tcp-flags": self.tcp_flags,
            "save-mark": self.save_mark,
            "other words": self.other,
        }


_FULL32 = 0xFFFFFFFF
_MODULE_ONLY = frozenset(
    {"tcp", "udp", "sctp", "udplite", "mark", "tos", "dscp", "MARK", "DSCP", "CONNMARK"}
)
TCP_FLAG_BITS = {"FIN": 0x01, "SYN": 0x02, "RST": 0x04, "PSH": 0x08, "ACK": 0x10, "URG": 0x20}
"""iptables' TCP flag names and their bits in the header's flags byte."""


def _tcp_flags(text: str) -> int:
    if text == "NONE":
        return 0
    if text == "ALL":
        return sum(TCP_FLAG_BITS.values())
    return sum(TCP_FLAG_BITS[name] for name in text.split(","))


def parse_rule(words: Sequence[str]) -> IptRule:
    """Parse the words of one iptables rule (``-A CHAIN`` first), as iptables-save prints it
    or as a script writes it."""
    if len(words) < 2 or words[0] not in ("-A", "-I"):
        raise ValueError(f"not an iptables rule: {' '.join(words)!r}")
    rule = IptRule(words[1], text=" ".join(words))
    i = 2
    if words[0] == "-I" and i < len(words) and words[i].isdigit():
        i += 1
    other: list[str] = []
    while i < len(words):
        word = words[i]
        arg = words[i + 1] if i + 1 < len(words) else ""
        step = 2
        match word:
            case "-s" | "--source":
                rule = replace(rule, src=_network(arg))
            case "-d" | "--destination":
                rule = replace(rule, dst=_network(arg))
            case "-i" | "--in-interface":
                rule = replace(rule, in_iface=arg)
            case "-o" | "--out-interface":
                rule = replace(rule, out_iface=arg)
            case "-p" | "--protocol":
                rule = replace(rule, protocol=protocol_number(arg))
            case "-m" | "--match":
                if arg not in _MODULE_ONLY:
                    other += [word, arg]
            case "--sport" | "--source-port":
                rule = replace(rule, sport=_ports(arg))
            case "--dport" | "--destination-port":
                rule = replace(rule, dport=_ports(arg))
            case "--tos":
                rule = replace(rule, tos=_value_mask(arg, 0xFF))
            case "--dscp":
                rule = replace(rule, dscp=int(arg, 0))
            case "--mark":
                rule = replace(rule, mark=_value_mask(arg, _FULL32))
            case "-j" | "--jump" | "-g" | "--goto":
                rule = replace(rule, target=arg)
            case "--set-xmark" | "--set-mark":
                rule = replace(rule, set_mark=_value_mask(arg, _FULL32))
            case "--set-dscp":
                rule = replace(rule, set_dscp=int(arg, 0))
            case "--save-mark":
                rule = replace(rule, save_mark=rule.save_mark or (_FULL32, _FULL32))
                step = 1
            case "--mask" | "--nfmask" | "--ctmask":
                nf, ct = rule.save_mark or (_FULL32, _FULL32)
                value = int(arg, 0)
                nf = value if word != "--ctmask" else nf
                ct = value if word != "--nfmask" else ct
                rule = replace(rule, save_mark=(nf, ct))
            case "--tcp-flags":
                comp = words[i + 2] if i + 2 < len(words) else ""
                try:
                    rule = replace(rule, tcp_flags=(_tcp_flags(comp), _tcp_flags(arg)))
                except KeyError:  # ECE, CWR: never in a rule tcdsl writes
                    other += [word, arg, comp]
                step = 3
            case _:
                other.append(word)
                step = 1
        i += step
    return replace(rule, other=tuple(other))


@dataclass
class IptablesState:
    """The mangle table as ``iptables-save -t mangle`` (or ``ip6tables-save``) shows it:
    chains and their rules."""

    chains: dict[str, list[IptRule]] = field(default_factory=dict)
    """Every chain (built-in and user-defined), with its rules in order."""
    text: str = ""


def parse_iptables_save(text: str, table: str = "mangle") -> IptablesState:
    """Parse ``iptables-save -t TABLE`` (or ``ip6tables-save``, the same format); other
    tables in the text are ignored."""
    state = IptablesState(text=text)
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = line[1:].strip()
        elif current != table or not line or line.startswith("#"):
            continue
        elif line.startswith(":"):
            state.chains.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            try:
                words = shlex.split(line)
            except ValueError:
                words = line.split()
            rule = parse_rule(words)
            state.chains.setdefault(rule.chain, []).append(rule)
    return state


# ==== one device, one kernel ===================================================================


@dataclass
class DeviceState:
    """What tc shows for one device."""

    name: str
    qdiscs: list[TcQdisc] = field(default_factory=list)
    classes: list[TcClass] = field(default_factory=list)
    filters: dict[str, list[TcFilter]] = field(default_factory=dict)
    """parent (qdisc handle or class id) -> its filters, in the order tc lists them."""
    text: str = ""
    """Everything tc printed for the device, for messages and idempotence checks."""


@dataclass
class KernelState:
    """Everything read back from one kernel after a script ran."""

    devices: dict[str, DeviceState] = field(default_factory=dict)
    iptables: IptablesState | None = None
    """None when the policy uses no iptables (it is then not read)."""
    ip6tables: IptablesState | None = None
    """ip6tables' mangle table; None when the policy marks no IPv6 packets."""

    def table(self, family: str) -> IptablesState | None:
        """The mangle table that marks ``family`` (``ipv4``: iptables, ``ipv6``: ip6tables)."""
        return self.ip6tables if family == "ipv6" else self.iptables
