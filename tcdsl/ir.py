"""The typed, immutable intermediate representation of a policy.

Values are integers in base units (bits/s, bytes, microseconds). Every node the user wrote
carries the ``Span`` it came from. Fields marked "allocated" are ``None`` until
``tcdsl.allocate`` fills them; no other stage and no backend assigns them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from ipaddress import IPv4Address, IPv4Network, IPv6Network
from operator import attrgetter
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, cast

from tcdsl.diagnostics import Span
from tcdsl.linklayer import LinkLayerName, SizeTable, stab_for

N = TypeVar("N")
P = ParamSpec("P")
R = TypeVar("R")

MEMO_SIZE = 1 << 17
"""How many results each :func:`per_node` function keeps (then it starts again)."""

_MEMOS: list[dict[object, Any]] = []
_HANDLE_TEXT: dict[tuple[int, int], str] = {}
"""``str`` of the handles made so far (forgotten with the memos)."""
_MEMOS.append(_HANDLE_TEXT)  # type: ignore[arg-type]
_VARIADIC = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def per_node(f: Callable[Concatenate[N, P], R]) -> Callable[Concatenate[N, P], R]:
    """Memoise ``f(node, *args)`` (pure, returning something immutable) by the identity of
    ``node``: the stages walk the same trees and split the same match lines again and again,
    and identity costs nothing to hash. The node is kept with its result, so its id cannot be
    another object's while the entry lives; a value-equal node elsewhere (the same policy
    parsed again) gets results of its own, made of its own objects."""
    entries: dict[object, tuple[N, R]] = {}
    _MEMOS.append(entries)
    code = f.__code__
    if code.co_argcount == 1 and not code.co_kwonlyargcount and not code.co_flags & _VARIADIC:
        # The node alone (the traversal helpers, called a million times on large policies):
        # no argument tuple to build, the id is the key.
        def memoised_node(node: N, /) -> R:
            key = id(node)
            hit = entries.get(key)
            if hit is not None:
                return hit[1]
            if len(entries) >= MEMO_SIZE:
                entries.clear()
            result = f(node)  # type: ignore[call-arg]
            entries[key] = (node, result)
            return result

        functools.update_wrapper(memoised_node, f)
        return cast(Callable[Concatenate[N, P], R], memoised_node)

    def memoised(node: N, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs:
            return f(node, *args, **kwargs)
        # most calls pass the node alone: its id is the key (never equal to a tuple key)
        key = (id(node), *args) if args else id(node)
        hit = entries.get(key)
        if hit is not None:
            return hit[1]
        if len(entries) >= MEMO_SIZE:
            entries.clear()
        result = f(node, *args, **kwargs)
        entries[key] = (node, result)
        return result

    functools.update_wrapper(memoised, f)
    return memoised


def forget() -> None:
    """Drop what every :func:`per_node` function remembers, and the nodes it holds (the
    driver does, after each compile)."""
    for entries in _MEMOS:
        entries.clear()


# ---- values --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate in bits per second; ``byte_units`` are literals written in tc's bytes/s units."""

    bits_per_second: int
    span: Span
    byte_units: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class Percent:
    """A percentage of the parent's rate (for ``rate``) or ceiling (for ``ceil``)."""

    value: Fraction
    span: Span


@dataclass(frozen=True, slots=True)
class Size:
    """A size in bytes."""

    bytes: int
    span: Span


@dataclass(frozen=True, slots=True)
class Time:
    """A duration in microseconds."""

    microseconds: int
    span: Span


@dataclass(frozen=True, slots=True)
class Count:
    """A plain number: packets, seconds for sfq perturb, a priority, a mark."""

    value: int
    span: Span


@dataclass(frozen=True, slots=True)
class Name:
    """A reference to a class by name."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Word:
    """A keyword the user chose from a fixed set (``diffserv4``, ``dual-srchost``, ``atm``)."""

    value: str
    span: Span


@dataclass(frozen=True, slots=True, order=True)
class Handle:
    """A tc handle or class id, ``major:minor`` (printed in hex, as tc does)."""

    major: int
    minor: int

    def __str__(self) -> str:
        # The backends spell every filter's parent and class id: the same few texts, each
        # made once (and shared) per compile.
        key = (self.major, self.minor)
        text = _HANDLE_TEXT.get(key)
        if text is None:
            if len(_HANDLE_TEXT) >= MEMO_SIZE:
                _HANDLE_TEXT.clear()
            text = f"{self.major:x}:{self.minor:x}" if self.minor else f"{self.major:x}:"
            _HANDLE_TEXT[key] = text
        return text

    @property
    def qdisc(self) -> str:
        """The handle spelled as a qdisc handle (``10:``)."""
        return f"{self.major:x}:"


@dataclass(frozen=True, slots=True)
class HandleRef:
    """A handle the user wrote explicitly (``id 1:10``, ``handle 10:``)."""

    handle: Handle
    span: Span


@dataclass(frozen=True, slots=True)
class Curve:
    """An hfsc service curve: slope ``m1`` for the first ``d``, then ``m2`` (tc's ``m1 d m2``).

    Written as ``umax SIZE dmax TIME rate RATE``, ``umax`` and ``dmax`` keep the words and
    ``m1``/``d`` hold tc's conversion (a concave curve, ``m1 = umax / dmax``, when that is
    above ``rate``; else a convex one, ``m1 = 0``, ``d = dmax - umax / rate``).
    """

    m2: Rate
    span: Span
    m1: Rate | None = None
    d: Time | None = None
    umax: Size | None = None
    dmax: Time | None = None

    @property
    def m1_bits(self) -> int:
        """The first slope in bits/s (0 when not given)."""
        return self.m1.bits_per_second if self.m1 is not None else 0

    @property
    def d_us(self) -> int:
        """The length of the first segment in microseconds (0 when not given)."""
        return self.d.microseconds if self.d is not None else 0


# ---- matches --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PortValue:
    """One port spec: a single port (lo == hi), a range, or a value/mask pair."""

    lo: int
    hi: int
    mask: int | None
    span: Span


Family = Literal["ipv4", "ipv6"]
"""An address family: what a filter's ``protocol ip`` / ``protocol ipv6`` selects."""

FAMILIES: tuple[Family, ...] = ("ipv4", "ipv6")
"""Both families, in the order their filters are written."""

Network = IPv4Network | IPv6Network


def family_of(network: Network) -> Family:
    """The family of an address or network."""
    return "ipv4" if isinstance(network, IPv4Network | IPv4Address) else "ipv6"


def mapped_ipv4(network: Network) -> IPv4Network | None:
    """The IPv4 network an IPv4-mapped IPv6 one stands for (``::ffff:10.0.0.0/120`` ->
    ``10.0.0.0/24``), which no IPv6 packet carries: a socket sends IPv4 to it. None for any
    other network."""
    if network.version != 6 or network.prefixlen < 96:
        return None
    mapped = network.network_address.ipv4_mapped
    return None if mapped is None else IPv4Network((mapped, network.prefixlen - 96))


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """``family ipv4|ipv6|both`` on an interface, a direction or a match line."""

    families: tuple[Family, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class AddrCond:
    """``src``/``dst`` address or network (either family); several values OR."""

    field: Literal["src", "dst"]
    networks: tuple[tuple[Network, Span], ...]
    span: Span


@dataclass(frozen=True, slots=True)
class PortCond:
    """``sport``/``dport``; several values OR."""

    field: Literal["sport", "dport"]
    ports: tuple[PortValue, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ProtoCond:
    """IP protocol by number; several values OR."""

    protocols: tuple[tuple[int, Span], ...]
    span: Span


@dataclass(frozen=True, slots=True)
class TosCond:
    """The IPv4 TOS byte under a mask (``dscp`` is stored as its TOS value/mask)."""

    value: int
    mask: int
    span: Span
    dscp: int | None = None


@dataclass(frozen=True, slots=True)
class TcpAckCond:
    """Small, option-less TCP packets with only ACK set (the lartc TCP-ACK idiom)."""

    span: Span


TCP_FLAGS: dict[str, int] = {
    "fin": 0x01,
    "syn": 0x02,
    "rst": 0x04,
    "psh": 0x08,
    "ack": 0x10,
    "urg": 0x20,
    "ece": 0x40,
    "cwr": 0x80,
}
"""The TCP flags by name, as bits of the flags byte (byte 13 of the TCP header)."""


@dataclass(frozen=True, slots=True)
class TcpFlagsCond:
    """``tcp-flags F,... [of G,...]``: TCP, and of the flags in ``mask`` (G, or F without
    ``of``) exactly those in ``value`` (F) are set."""

    value: int
    mask: int
    span: Span

    def names(self, bits: int) -> list[str]:
        """The names of the flags in ``bits``, in header order (fin first)."""
        return [name for name, bit in TCP_FLAGS.items() if bits & bit]


@dataclass(frozen=True, slots=True)
class RawCond:
    """A raw u32 key: ``u8|u16|u32 VALUE/MASK at OFFSET`` from the IP header."""

    bits: Literal[8, 16, 32]
    value: int
    mask: int
    offset: int
    span: Span


@dataclass(frozen=True, slots=True)
class AllCond:
    """Matches every packet."""

    span: Span


Cond = AddrCond | PortCond | ProtoCond | TosCond | TcpAckCond | RawCond | AllCond | TcpFlagsCond


Verdict = Literal["drop", "pass", "continue", "reclassify"]


@dataclass(frozen=True, slots=True)
class Police:
    """``police rate R burst B [mtu M] [VERDICT]`` on a match: traffic within the rate (and
    burst) is classified as the match says; what exceeds it gets ``exceed`` (tc's police
    action, conform action ``ok``)."""

    rate: Rate
    burst: Size
    span: Span
    mtu: Size | None = None
    exceed: Verdict = "drop"
    exceed_span: Span | None = None


@dataclass(frozen=True, slots=True)
class Match:
    """One ``match`` line: its conditions AND; the values listed in one condition OR."""

    conds: tuple[Cond, ...]
    span: Span
    pref: Count | None = None
    police: Police | None = None
    family: FamilySpec | None = None
    """``match family ...``: the families the line applies to; None: the tree's (see
    :func:`tcdsl.lower.family_alternatives` for what addresses and protocols imply)."""
    broken: bool = False
    """A condition of the line was in error and is left out: what is left is not what the
    line says (lints leave the line alone; the policy is not emitted)."""


# ---- classes and qdiscs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Class:
    """A class of a classful qdisc (htb, cbq, prio, hfsc), with its matches and children."""

    name: str
    span: Span
    rate: Rate | Percent | None = None
    ceil: Rate | Percent | None = None
    burst: Size | None = None
    cburst: Size | None = None
    prio: Count | None = None
    quantum: Size | None = None
    allot: Size | None = None
    avpkt: Size | None = None
    weight: Rate | None = None
    maxburst: Count | None = None
    minburst: Count | None = None
    bounded: bool = False
    isolated: bool = False
    overbook: bool = False
    """The children's rates may add up to more than this class's (over-booking on purpose)."""
    mark: Count | None = None
    rt: Curve | None = None
    """hfsc: the real-time service curve."""
    ls: Curve | None = None
    """hfsc: the link-sharing service curve (``sc`` sets rt and ls to one curve)."""
    ul: Curve | None = None
    """hfsc: the upper-limit service curve."""
    set_dscp: Count | None = None
    """``set dscp CODE``: the DSCP the marking rules write into the class's packets."""
    explicit_id: HandleRef | None = None
    matches: tuple[Match, ...] = ()
    children: tuple[Class, ...] = ()
    leaf: Qdisc | None = None
    implicit: bool = False
    """True for the link class tcdsl creates from ``interface eth0 htb rate ...``."""
    from_table: bool = False
    """Made from a subscriber table's rows: its span is the circuit id's cell, not ``class``."""
    title: str | None = None
    """What the class stands for, shown beside its name: a subscriber's Circuit Name from its
    table (printable text; None where there is none)."""
    classid: Handle | None = None
    """Allocated."""
    fwmark: int | None = None
    """Allocated when the interface classifies by mark."""
    chosen_quantum: int | None = None
    """Allocated: the htb quantum (bytes) tcdsl gives a class without ``quantum`` whose
    rate / r2q would leave the kernel's range (``tcdsl.allocate`` says when)."""

    @property
    def label(self) -> str:
        """How messages name this class."""
        return "the interface's link class" if self.implicit else f"class '{self.name}'"

    @property
    def head(self) -> Span:
        """Where a message about the class as a whole points: its name as written (where
        its span starts), or the circuit id of a subscriber table's class."""
        return self.span if self.from_table else self.span.prefix(len(self.name))

    def walk(self) -> Iterator[Class]:
        """Yield this class and its descendants in pre-order."""
        return iter(_subtree(self))


@dataclass(frozen=True, slots=True)
class Htb:
    """Hierarchical token bucket."""

    span: Span
    default: Name | None = None
    r2q: Count | None = None
    classes: tuple[Class, ...] = ()
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["htb"] = "htb"
    chosen_r2q: int | None = None
    """Allocated: the r2q tcdsl chose where the policy gives none and tc's default would put
    a leaf class's quantum out of the kernel's range."""


@dataclass(frozen=True, slots=True)
class Prio:
    """Strict priority bands, one class per band."""

    span: Span
    bands: Count | None = None
    priomap: tuple[Count, ...] | None = None
    classes: tuple[Class, ...] = ()
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["prio"] = "prio"


@dataclass(frozen=True, slots=True)
class Cbq:
    """Class-based queueing (removed from Linux 6.3; still parsed by tc 6.1)."""

    span: Span
    bandwidth: Rate | None = None
    avpkt: Size | None = None
    classes: tuple[Class, ...] = ()
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["cbq"] = "cbq"
    overbook: bool = False
    """The top-level classes' rates may add up to more than the bandwidth, on purpose."""


@dataclass(frozen=True, slots=True)
class Hfsc:
    """Hierarchical fair service curve: classes with real-time, link-sharing and upper-limit
    curves. Without ``default``, the kernel drops unclassified packets."""

    span: Span
    default: Name | None = None
    classes: tuple[Class, ...] = ()
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["hfsc"] = "hfsc"


@dataclass(frozen=True, slots=True)
class Tbf:
    """Token bucket filter; may hold one child qdisc."""

    span: Span
    rate: Rate | None = None
    burst: Size | None = None
    latency: Time | None = None
    limit: Size | None = None
    peakrate: Rate | None = None
    mtu: Size | None = None
    child: Qdisc | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["tbf"] = "tbf"


@dataclass(frozen=True, slots=True)
class Netem:
    """Network emulator: delay, jitter, loss; may hold one child qdisc."""

    span: Span
    delay: Time | None = None
    jitter: Time | None = None
    loss: Percent | None = None
    duplicate: Percent | None = None
    corrupt: Percent | None = None
    limit: Count | None = None
    rate: Rate | None = None
    child: Qdisc | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["netem"] = "netem"
    distribution: Name | None = None
    """The jitter's distribution table: ``normal``, ``pareto`` or ``paretonormal``."""
    delay_correlation: Percent | None = None
    loss_correlation: Percent | None = None
    reorder: Percent | None = None
    reorder_correlation: Percent | None = None
    gap: Count | None = None
    slot: Time | None = None
    """The shortest gap between transmission slots (``slot MIN [MAX]``)."""
    slot_max: Time | None = None
    packetoverhead: Count | None = None
    """Bytes the ``rate`` adds to each packet."""
    cellsize: Count | None = None


@dataclass(frozen=True, slots=True)
class Sfq:
    """Stochastic fairness queueing."""

    span: Span
    perturb: Count | None = None
    quantum: Size | None = None
    limit: Count | None = None
    depth: Count | None = None
    divisor: Count | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["sfq"] = "sfq"


@dataclass(frozen=True, slots=True)
class FqCodel:
    """Fair queueing with CoDel AQM."""

    span: Span
    limit: Count | None = None
    flows: Count | None = None
    target: Time | None = None
    interval: Time | None = None
    quantum: Size | None = None
    memory_limit: Size | None = None
    ecn: bool | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["fq_codel"] = "fq_codel"


@dataclass(frozen=True, slots=True)
class Codel:
    """Controlled delay AQM on one FIFO."""

    span: Span
    limit: Count | None = None
    target: Time | None = None
    interval: Time | None = None
    ce_threshold: Time | None = None
    ecn: bool | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["codel"] = "codel"


@dataclass(frozen=True, slots=True)
class Fq:
    """Fair queueing per flow with pacing."""

    span: Span
    limit: Count | None = None
    flow_limit: Count | None = None
    quantum: Size | None = None
    initial_quantum: Size | None = None
    maxrate: Rate | None = None
    buckets: Count | None = None
    refill_delay: Time | None = None
    low_rate_threshold: Rate | None = None
    orphan_mask: Count | None = None
    ce_threshold: Time | None = None
    horizon: Time | None = None
    pacing: bool | None = None
    horizon_drop: bool | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["fq"] = "fq"


@dataclass(frozen=True, slots=True)
class FqPie:
    """Fair queueing with PIE AQM per flow."""

    span: Span
    limit: Count | None = None
    flows: Count | None = None
    target: Time | None = None
    tupdate: Time | None = None
    alpha: Count | None = None
    beta: Count | None = None
    quantum: Size | None = None
    memory_limit: Size | None = None
    ecn_prob: Count | None = None
    ecn: bool | None = None
    bytemode: bool | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["fq_pie"] = "fq_pie"


@dataclass(frozen=True, slots=True)
class Red:
    """Random early detection on a byte-limited queue."""

    span: Span
    limit: Size | None = None
    min: Size | None = None
    max: Size | None = None
    avpkt: Size | None = None
    burst: Count | None = None
    """Packets; tc derives (2 min + max) / (3 avpkt) when not given."""
    bandwidth: Rate | None = None
    probability: Percent | None = None
    ecn: bool = False
    harddrop: bool = False
    adaptive: bool = False
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["red"] = "red"


@dataclass(frozen=True, slots=True)
class Pfifo:
    """Packet-limited FIFO."""

    span: Span
    limit: Count | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["pfifo"] = "pfifo"


@dataclass(frozen=True, slots=True)
class Bfifo:
    """Byte-limited FIFO."""

    span: Span
    limit: Size | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["bfifo"] = "bfifo"


@dataclass(frozen=True, slots=True)
class PfifoFast:
    """Three-band priority FIFO keyed on TOS (the classic Linux default)."""

    span: Span
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["pfifo_fast"] = "pfifo_fast"


@dataclass(frozen=True, slots=True)
class Ingress:
    """tc's ``ingress`` qdisc (handle ``ffff:``): no queue and no classes, only filters that
    police arriving traffic (``interface eth0 { ingress { match ... police ... } }``)."""

    span: Span
    matches: tuple[Match, ...] = ()
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["ingress"] = "ingress"


INGRESS_HANDLE = Handle(0xFFFF, 0)
"""The ingress qdisc's handle, fixed by the kernel."""
CLSACT_EGRESS = Handle(0xFFFF, 0xFFF3)
"""The egress hook of a clsact qdisc (tc's ``egress``), where an mq tree's filters pick the
TX queue (``TC_H_MIN_EGRESS``)."""
CLSACT_INGRESS = Handle(0xFFFF, 0xFFF2)
"""The ingress hook of a clsact qdisc (tc's ``ingress``, ``TC_H_MIN_INGRESS``)."""


@dataclass(frozen=True, slots=True)
class Overhead:
    """Link-layer overhead (``tcdsl.linklayer``): on a root qdisc, its size table (tc's stab); on
    a cake, cake's own compensation. ``overhead`` is in bytes beyond the IP packet, whichever
    way the kernel is told (a stab gets it 14 bytes smaller)."""

    span: Span
    """The first link-layer word written."""
    overhead: Count
    """The bytes added (a preset's, spanned at the preset's name); 0 when only a link layer or
    an mpu is given."""
    linklayer: LinkLayerName = "ethernet"
    mpu: Count | None = None
    preset: Word | None = None
    linklayer_word: Word | None = None
    mtu: Size | None = None
    """A stab's table range (``mtu``), never a cake's."""
    tsize: Count | None = None
    """A stab's table size (``tsize``), never a cake's."""
    overhead_written: bool = True
    """False when neither ``overhead N`` nor a preset is written (``overhead`` is then 0)."""

    def size_table(self) -> SizeTable:
        """The size table tc builds for it on a root qdisc."""
        return stab_for(
            self.overhead.value,
            self.linklayer,
            self.mpu.value if self.mpu is not None else 0,
            self.mtu.bytes if self.mtu is not None else None,
            self.tsize.value if self.tsize is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Cake:
    """Common Applications Kept Enhanced: shaper, diffserv tins, flow isolation and AQM in one
    classless qdisc. A keyword group left out is the kernel's default."""

    span: Span
    bandwidth: Rate | None = None
    unlimited: Word | None = None
    diffserv: Word | None = None
    """diffserv3 (the kernel's default), diffserv4, diffserv8, besteffort or precedence."""
    isolate: Word | None = None
    """The flow isolation mode (triple-isolate by default)."""
    nat: Word | None = None
    wash: Word | None = None
    ack_filter: Word | None = None
    split_gso: Word | None = None
    mode: Word | None = None
    """``ingress`` or ``egress`` (the default)."""
    rtt: Time | None = None
    rtt_preset: Word | None = None
    memlimit: Size | None = None
    fwmark: Count | None = None
    overhead: Overhead | None = None
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["cake"] = "cake"


@dataclass(frozen=True, slots=True)
class MqQueue:
    """One TX queue of an mq root and the qdisc on it (``queue N QDISC``): the mq's class
    ``M:N``, the device's TX queue ``N - 1``."""

    number: int
    qdisc: Qdisc
    span: Span
    ranks: tuple[int, ...] = ()
    """``mq queues N``: the place of each of the qdisc's top-level classes among the spread
    tree's, which is the order their lines are tried in (:func:`mq_line_order`)."""


@dataclass(frozen=True, slots=True)
class Mq:
    """A root ``mq``: one qdisc per TX queue of the device, each shaping on its own (its own
    lock, its own CPU). Written queue by queue, or ``mq queues N TREE``: the frontend spreads
    the top-level classes of one htb tree over N queues (see docs/scale.md, "mq sharding").
    Match lines also pick the queue: the tree adds a clsact qdisc whose egress filters set
    the packet's TX queue (``Interface.filters`` with parent :data:`CLSACT_EGRESS`)."""

    span: Span
    queues: tuple[MqQueue, ...] = ()
    shards: Count | None = None
    """``queues N`` of the automatic form (the queues are already spread); None: explicit."""
    explicit_handle: HandleRef | None = None
    handle: Handle | None = None
    kind: Literal["mq"] = "mq"


ClassfulQdisc = Htb | Prio | Cbq | Hfsc
ChainQdisc = Tbf | Netem
Qdisc = (
    Htb
    | Prio
    | Cbq
    | Tbf
    | Netem
    | Sfq
    | FqCodel
    | Pfifo
    | Bfifo
    | PfifoFast
    | Hfsc
    | Cake
    | Codel
    | Fq
    | FqPie
    | Red
    | Ingress
    | Mq
)

# ---- classification (allocated) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class U32Key:
    """One u32 key as tc spells it after ``match`` (``ip dport 5001 0xffff``)."""

    words: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class U32Place:
    """Where a u32 node sits: ``handle TABLE:BUCKET:NODE``. u32 tries the nodes of one bucket
    by node id."""

    table: int | None
    """The hash table's id (``100:`` is 0x100); None: the pref's root table (``800:``, or
    ``801:`` and on for later prefs), which commands leave out."""
    bucket: int
    node: int
    """1 to 0xfff."""

    @property
    def handle(self) -> str:
        """The handle as tc spells it (``100:7:3``, ``::3`` in the root table)."""
        if self.table is None:
            return f"::{self.node:x}"
        return f"{self.table:x}:{self.bucket:x}:{self.node:x}"


@dataclass(frozen=True, slots=True)
class U32Table:
    """A u32 hash table tcdsl makes (``handle 100: u32 divisor 256``) and the node linking to
    it (``link 100: hashkey mask M at OFF``): a run of filters kept in their order, spread
    over buckets by one byte every filter of the run fixes (``hashkey``), or, with divisor
    1, a sub-list of a bucket too long for u32's node ids."""

    parent: Handle
    pref: int
    family: Family
    table: int
    """Its id, 0x1 to 0x7ff, unique under ``parent``."""
    divisor: int
    """1 (a sub-list) or 256 (hashed)."""
    link: U32Place
    """Where the node that links to it sits."""
    span: Span
    """The first filter's match line."""
    hashkey: tuple[int, int] | None = None
    """(mask, offset) of the 32-bit word whose masked byte picks the bucket; None: divisor 1."""
    count: int = 0
    """How many filters are in it (its sub-tables' included)."""

    @property
    def hashed_byte(self) -> int | None:
        """The offset from the network header of the byte the bucket is (None: divisor 1)."""
        if self.hashkey is None:
            return None
        mask, offset = self.hashkey
        return offset + 3 - (mask.bit_length() - 1) // 8


@dataclass(frozen=True, slots=True)
class U32Filter:
    """A u32 filter: every key must match; the packet goes to ``flowid`` (through ``police``
    when the match has one). ``protocol ip`` or ``protocol ipv6`` by ``family``."""

    parent: Handle
    pref: int
    keys: tuple[U32Key, ...]
    flowid: Handle
    span: Span
    police: Police | None = None
    family: Family = "ipv4"
    police_index: int | None = None
    """Allocated when the line's policer spans several filters: the index of the tree's police
    action (made before the filters) that every filter of the line binds to, so that they
    share one token bucket; None: the filter's own policer (a line of one filter)."""
    place: U32Place | None = None
    """Allocated (``tcdsl.u32layout``) when its pref's filters are laid out in u32 tables:
    the table, bucket and node id it is made at; None: made without a handle, in the pref's
    root table, tried in the order made."""


@dataclass(frozen=True, slots=True)
class FlowerFilter:
    """A flower filter (``classifier flower``): the kernel's flow dissector parses the headers
    (past IPv6 extension headers), and every field given must match."""

    parent: Handle
    pref: int
    family: Family
    flowid: Handle
    span: Span
    ip_proto: int | None = None
    src: Network | None = None
    dst: Network | None = None
    sport: tuple[int, int] | None = None
    """A port or range, (lo, hi)."""
    dport: tuple[int, int] | None = None
    tos: tuple[int, int] | None = None
    """(value, mask) of the TOS byte (IPv4) or traffic class (IPv6)."""
    tcp_flags: tuple[int, int] | None = None
    """(value, mask) of the TCP flags."""
    police: Police | None = None
    police_index: int | None = None
    """As :attr:`U32Filter.police_index`."""


@dataclass(frozen=True, slots=True)
class FwFilter:
    """An fw filter mapping a firewall mark to a class."""

    parent: Handle
    pref: int
    mark: int
    flowid: Handle
    span: Span
    mask: int | None = None
    """The mark bits the filter compares (``handle V/M``); None: all of them."""
    family: Family = "ipv4"


Filter = U32Filter | FwFilter | FlowerFilter

Classifier = Literal["u32", "flower"]


@dataclass(frozen=True, slots=True)
class MarkRule:
    """Set ``mark`` on packets matching ``conds`` (one alternative of a match line)."""

    conds: tuple[Cond, ...]
    mark: int
    span: Span
    unmarked: bool = False
    """True for the rule giving still-unmarked traffic the default class's mark."""
    family: Family = "ipv4"
    """iptables (ipv4) or ip6tables (ipv6); nft says ``meta nfproto``."""


MarkHook = Literal["prerouting", "output", "postrouting"]
"""Where marking rules run: the mangle table's PREROUTING (``from IFACE``, ``from any``),
OUTPUT (``from local``: the host's own traffic) or POSTROUTING (``at postrouting``)."""


DEFAULT_PREF = 1
"""The pref of a match line that gives none (and of the fw filters without ``pref``)."""


@dataclass(frozen=True, slots=True)
class Marking:
    """``classify by mark (from IFACE|any|local | at postrouting) [chain NAME] [mask M]``:
    classify with iptables (or nft) marks and fw filters."""

    from_interface: str | None
    """The input interface (PREROUTING); None for every input interface, or for the OUTPUT
    and POSTROUTING hooks, whose rules select the shaped interface as output (``-o``)."""
    span: Span
    explicit_chain: str | None = None
    chain: str | None = None
    """Allocated."""
    rules: tuple[MarkRule, ...] = ()
    """Allocated."""
    hook: MarkHook = "prerouting"
    mask: Count | None = None
    """The mark bits tcdsl owns (``mask 0xff``); None: all 32 bits."""
    pref: Count | None = None
    """The fw filters' pref (``pref N``), which orders them among match lines that keep
    their own ``pref`` (u32 filters); None: 1."""
    dscp_rules: tuple[DscpRule, ...] = ()
    """Allocated: ``set dscp`` of the classes, one rule per marked class."""

    @property
    def fw_pref(self) -> int:
        """The fw filters' pref: ``pref N``, or :data:`DEFAULT_PREF`."""
        return self.pref.value if self.pref is not None else DEFAULT_PREF

    @property
    def mask_value(self) -> int:
        """The mask as a number (0xffffffff without ``mask``)."""
        return self.mask.value if self.mask is not None else 0xFFFFFFFF

    def source(self, shaped: str, noun: str = "traffic") -> str:
        """How messages name the traffic the rules see (``shaped``: the shaped interface)."""
        match self.hook:
            case "output":
                return f"{noun} this host sends out of {shaped}"
            case "postrouting":
                return f"{noun} leaving by {shaped}"
            case _:
                if self.from_interface is None:
                    return f"{noun} arriving on any interface"
                return f"{noun} arriving on {self.from_interface}"


@dataclass(frozen=True, slots=True)
class DscpRule:
    """Set the DSCP of packets carrying ``mark`` (a class's ``set dscp``)."""

    mark: int
    dscp: int
    span: Span
    family: Family = "ipv4"


@dataclass(frozen=True, slots=True)
class Download:
    """How a download tree gets its packets: everything arriving on ``interface`` is
    redirected (mirred, every protocol) to the IFB device the tree is on, through an
    ingress qdisc on ``interface``; with ``connmark``, the redirect first restores the
    connection's firewall mark (tc's connmark action)."""

    interface: str
    span: Span
    connmark: bool = False
    ifb_span: Span | None = None
    """Where the policy names the IFB (``via NAME``); None when tcdsl derives the name."""


Direction = Literal["egress", "download", "ingress"]


@dataclass(frozen=True, slots=True)
class Interface:
    """A tree of qdiscs on one device: the egress of a network interface (``upload``, or the
    classic ``interface eth0 htb ...``), the egress of the IFB that shapes its downloads,
    or its ingress qdisc (policers only)."""

    name: str
    """The device the tree is on: for a download, the IFB."""
    span: Span
    root: Qdisc
    marking: Marking | None = None
    filters: tuple[Filter, ...] = ()
    """Allocated."""
    direction: Direction = "egress"
    download: Download | None = None
    """For ``direction == "download"``: the interface whose arrivals the IFB shapes."""
    stab: Overhead | None = None
    """Link-layer overhead on the root qdisc (a size table); a cake root keeps its own."""
    family: FamilySpec | None = None
    """``family ipv4|ipv6|both`` on the interface or direction; None: both."""
    classifier: Classifier = "u32"
    classifier_span: Span | None = None
    """Where the policy says ``classifier flower``; None when u32 by default."""
    u32_linear: bool = False
    """``classifier u32 linear``: each pref's u32 filters in one list, never in hash tables
    (as hand-written scripts have them: ``tcdsl import`` writes it for such a tree)."""
    u32_tables: tuple[U32Table, ...] = ()
    """Allocated: the u32 tables its filters are laid out in (``tcdsl.u32layout``), each made
    before its filters and linked after them; ``filters`` stays every filter in the order
    tried."""

    @property
    def families(self) -> tuple[Family, ...]:
        """The families this tree classifies (both unless ``family`` restricts it)."""
        return self.family.families if self.family is not None else FAMILIES

    @property
    def interface(self) -> str:
        """The network interface the policy names (for a download, not the IFB)."""
        return self.download.interface if self.download is not None else self.name

    @property
    def label(self) -> str:
        """How messages name this tree: ``eth0``, ``eth0 download (ifb4eth0)``, ``eth0 ingress``."""
        download = self.download.interface if self.download is not None else None
        return tree_label(self.name, self.direction, download)


def tree_label(name: str, direction: str | None, download: str | None = None) -> str:
    """``Interface.label`` of the tree on device ``name`` (for a download, the IFB; ``download``:
    the interface whose arrivals it shapes), before the tree is built."""
    if download is not None:
        return f"{download} download (via {name})"
    return f"{name} ingress" if direction == "ingress" else name


@dataclass(frozen=True, slots=True)
class Policy:
    """A whole policy: the interfaces of the main file and of everything it includes."""

    source: str
    interfaces: tuple[Interface, ...]


# ---- copying ----------------------------------------------------------------------------------

T = TypeVar("T")


def replace(node: T, /, **changes: Any) -> T:
    """``dataclasses.replace(node, **changes)`` in half the time, for the passes that copy
    every class of a large policy: IR classes have no ``__post_init__`` and no field outside
    ``__init__``, so building the class from all its fields' values is the same thing."""
    cls: type[Any] = type(node)
    fields, index = _FIELDS.get(cls) or _fields(cls)
    values = list(fields(node))
    for name, value in changes.items():
        values[index[name]] = value
    return cls(*values)  # type: ignore[no-any-return]


_Fields = tuple[Callable[[Any], tuple[Any, ...]], dict[str, int]]
_FIELDS: dict[type, _Fields] = {}


def _fields(cls: type) -> _Fields:
    names = [f.name for f in dataclasses.fields(cls)]
    assert not hasattr(cls, "__post_init__") and all(f.init for f in dataclasses.fields(cls))
    get = attrgetter(*names) if len(names) > 1 else lambda node: (getattr(node, names[0]),)
    found = _FIELDS[cls] = (get, {name: i for i, name in enumerate(names)})
    return found


# ---- traversal helpers -------------------------------------------------------------------------


@per_node
def _subtree(top: Class) -> tuple[Class, ...]:
    found = []
    stack = [top]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(reversed(cls.children))
    return tuple(found)


def tx_queues_used(iface: Interface) -> int:
    """How many TX queues the device of ``iface`` needs: the highest queue its mq root puts
    a qdisc on, and at least 2 (0 without an mq root). mq makes one class per TX queue the
    device has, so a queue beyond them has nowhere to go; on a device of one TX queue the
    kernel refuses mq itself (EOPNOTSUPP)."""
    root = iface.root
    if not isinstance(root, Mq):
        return 0
    return max(2, highest_queue(iface))


def highest_queue(iface: Interface) -> int:
    """The highest queue the mq root of ``iface`` puts a qdisc on (0 without one): how many
    TX queues must be in use, since skbedit sends a packet steered past them to queue 0
    (``netdev_cap_txqueue``)."""
    root = iface.root
    if not isinstance(root, Mq):
        return 0
    return max((q.number for q in root.queues), default=0)


def most_queues_in_use(iface: Interface) -> int:
    """The most TX queues the device of ``iface`` may have in use: a spread tree's N, a
    written tree's highest queue (a packet the kernel puts on a later queue meets that queue's
    default qdisc, unshaped); 0 without an mq root."""
    return spread_queues(iface) or highest_queue(iface)


def spread_queues(iface: Interface) -> int:
    """The N of ``mq queues N``: how many TX queues a spread tree shapes, and so the most
    the device may have in use (a packet no steering filter sends stays on the queue the
    kernel picks; past the tree's, it meets the kernel's default qdisc); 0 for a tree
    written queue by queue, or no mq."""
    root = iface.root
    if not isinstance(root, Mq) or root.shards is None:
        return 0
    return root.shards.value


def queue_tops(q: Qdisc) -> tuple[Class, ...]:
    """The top-level classes of an mq queue's qdisc: below its link class, if it has one
    (a spread tree's queues have the tree's)."""
    if not isinstance(q, Htb | Prio | Cbq | Hfsc):
        return ()
    tops = q.classes
    if len(tops) == 1 and tops[0].implicit:
        return tops[0].children
    return tops


def _below_chain(q: Qdisc | None) -> Qdisc | None:
    """``q``, or below a tbf or netem the qdisc every packet of it goes on to."""
    while isinstance(q, Tbf | Netem) and q.child is not None:
        q = q.child
    return q


DEFAULT_PRIOMAP: tuple[int, ...] = (1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
"""The kernel's default priomap (``TC_PRIO`` -> band): what a prio without ``priomap`` uses,
and what fills a shorter one's missing entries."""


def priority_bands(q: Prio) -> frozenset[int]:
    """The bands (0, 1, ...) a packet no filter of ``q`` takes can reach by its priority."""
    given = tuple(c.value for c in q.priomap) if q.priomap else ()
    return frozenset(given + DEFAULT_PRIOMAP[len(given) :])


def _unsteered(q: ClassfulQdisc) -> Iterator[Qdisc]:
    """The qdiscs below ``q`` that a packet none of ``q``'s lines takes can reach: below an
    htb's or hfsc's default (a leaf class), below each band of a prio its priority can pick."""
    if isinstance(q, Htb | Hfsc) and q.default is not None:
        name = q.default.name
        default = next((c for c in classes_of(q) if c.name == name and not c.implicit), None)
        if default is not None and not default.children and default.leaf is not None:
            yield default.leaf
    elif isinstance(q, Prio):
        reached = priority_bands(q)
        for place, band in enumerate(q.classes):
            number = band.classid.minor if band.classid is not None else None
            if number is None and band.explicit_id is not None:
                number = band.explicit_id.handle.minor
            if (number - 1 if number is not None else place) in reached and band.leaf is not None:
                yield band.leaf


def steered_qdiscs(mq: Mq, banded: bool = True) -> Iterator[tuple[int, int, ClassfulQdisc]]:
    """Yield (level, queue index, qdisc) for each qdisc of ``mq``'s queues whose match lines
    pick the queue (their copies on the clsact egress hook steer to it). Level 0: a queue's
    own qdisc, or the one below its tbf or netem, which every packet of the queue reaches.
    In queues written one by one, level 1, 2, ...: the qdiscs that the packets no line of
    the level above takes reach (below an htb's default class, below a prio's bands), so
    their lines steer after every queue's lines above them. A spread tree has its default on
    every queue, its leaf's lines with it: they need no steering. ``banded`` False leaves
    out the qdiscs below a prio's bands (one queue's bands are tried as one list by no one:
    a packet meets the qdisc below one band only)."""
    for index, queue in enumerate(mq.queues):
        todo: list[tuple[int, Qdisc | None, bool]] = [(0, _below_chain(queue.qdisc), False)]
        while todo:
            level, q, below_band = todo.pop()
            if not isinstance(q, Htb | Prio | Cbq | Hfsc) or (below_band and not banded):
                continue
            yield level, index, q
            if mq.shards is None:
                band = below_band or isinstance(q, Prio)
                below = [(level + 1, _below_chain(leaf), band) for leaf in _unsteered(q)]
                todo.extend(reversed(below))


def mq_steers(iface: Interface) -> bool:
    """Whether ``iface``'s tree is an mq tree that picks TX queues itself: some match line of
    its steered qdisc (:func:`steered_qdiscs`) has steering filters, which need a clsact
    qdisc in the device's ingress slot. An mq tree with none leaves the queue to the kernel
    (XPS, or a hash of the flow) and puts nothing in that slot."""
    root = iface.root
    return isinstance(root, Mq) and any(
        cls.matches for _, _, q in steered_qdiscs(root) for cls in classes_of(q)
    )


def mq_line_order(mq: Mq, banded: bool = True) -> dict[int, tuple[int, int, int, int]]:
    """Where each class of ``mq``'s steered qdiscs (:func:`steered_qdiscs`, by id) stands in
    the order the policy's lines are tried at one pref: by level, then the tree as written.
    A spread tree's top-level classes in their places before the spread
    (``MqQueue.ranks``), queues written out one after the other; within a top-level class,
    the classes in pre-order."""
    order: dict[int, tuple[int, int, int, int]] = {}
    for level, index, q in steered_qdiscs(mq, banded):
        queue = mq.queues[index]
        tops = queue_tops(q)
        if tops is not q.classes:
            order[id(q.classes[0])] = (level, -1, index, 0)
        for place, top in enumerate(tops):
            rank = queue.ranks[place] if place < len(queue.ranks) else len(queue.ranks)
            for position, cls in enumerate(_subtree(top)):
                order[id(cls)] = (level, rank, index, position)
    return order


# A large policy's qdiscs are mostly leaves (a subscriber's fq_codel): the walkers answer for
# them without remembering anything, which keeps the memos (and their memory) to the few
# qdiscs that hold others.
_CLASSFUL = (Htb, Prio, Cbq, Hfsc)
NESTING = (*_CLASSFUL, Tbf, Netem, Mq)
"""The qdisc kinds with classes or qdiscs below them (the others are leaves)."""


def child_qdiscs(qdisc: Qdisc) -> Iterator[Qdisc]:
    """Yield the qdiscs directly below ``qdisc`` (class leaves, or a chained child)."""
    if not isinstance(qdisc, NESTING):
        return iter(())
    return iter(_child_qdiscs(qdisc))


@per_node
def _child_qdiscs(qdisc: Qdisc) -> tuple[Qdisc, ...]:
    match qdisc:
        case Htb() | Prio() | Cbq() | Hfsc():
            return tuple(cls.leaf for cls in _own_classes(qdisc) if cls.leaf is not None)
        case Tbf() | Netem():
            return () if qdisc.child is None else (qdisc.child,)
        case Mq():
            return tuple(q.qdisc for q in qdisc.queues)
        case _:
            return ()


def walk_qdiscs(qdisc: Qdisc) -> Iterator[Qdisc]:
    """Yield ``qdisc`` and every qdisc below it, in pre-order."""
    if not isinstance(qdisc, NESTING):
        return iter((qdisc,))
    return iter(_qdisc_tree(qdisc))


@per_node
def _qdisc_tree(qdisc: Qdisc) -> tuple[Qdisc, ...]:
    found = [qdisc]
    for child in _child_qdiscs(qdisc):
        if isinstance(child, NESTING):
            found += _qdisc_tree(child)
        else:
            found.append(child)
    return tuple(found)


def classes_of(qdisc: Qdisc) -> Iterator[Class]:
    """Yield the classes that belong to ``qdisc`` itself (not to nested qdiscs), pre-order."""
    if not isinstance(qdisc, _CLASSFUL):
        return iter(())
    return iter(_own_classes(qdisc))


@per_node
def _own_classes(qdisc: Qdisc) -> tuple[Class, ...]:
    if isinstance(qdisc, _CLASSFUL):
        return tuple(cls for top in qdisc.classes for cls in _subtree(top))
    return ()


def matches_of(qdisc: Qdisc) -> Iterator[tuple[Class | None, Match]]:
    """Yield the match lines of ``qdisc`` itself (not of nested qdiscs), in the order written,
    each with the class it sends to (None on an ingress qdisc, whose lines only police)."""
    if isinstance(qdisc, Ingress):
        return iter([(None, m) for m in qdisc.matches])
    if not isinstance(qdisc, Htb | Prio | Cbq | Hfsc):
        return iter(())  # a leaf (a subscriber's pfifo): no classes, no lines
    return iter([(cls, m) for cls in _own_classes(qdisc) for m in cls.matches])


def policy_matches(policy: Policy) -> Iterator[Match]:
    """Every match line of ``policy``: its classes' and its ingress trees' policing lines."""
    for iface in policy.interfaces:
        for q in walk_qdiscs(iface.root):
            for _, m in matches_of(q):
                yield m


def parent_map(qdisc: ClassfulQdisc) -> dict[int, Class | None]:
    """Map ``id(class)`` to its parent class (None for top-level classes)."""
    parents: dict[int, Class | None] = {id(top): None for top in qdisc.classes}
    for top in qdisc.classes:
        for cls in top.walk():
            for child in cls.children:
                parents[id(child)] = cls
    return parents


# ---- what a nested qdisc can send --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    """The most a class or qdisc can send (bits/s), and the class or chaining qdisc that sets it."""

    bits_per_second: int
    by: Class | Tbf | Netem


def _least(bounds: Iterator[Bound | None]) -> Bound | None:
    known = [b for b in bounds if b is not None]
    return min(known, key=lambda b: b.bits_per_second) if known else None


def own_bound(qdisc: ClassfulQdisc, cls: Class, parents: dict[int, Class | None]) -> Bound | None:
    """The most ``cls`` can send by its own parameters, not counting its ancestors.

    An htb class never sends more than its ceil (its rate without one), and one with no parent
    never more than its rate, as it has nothing to borrow from; a bounded cbq class keeps to its
    rate; a prio band has no rate of its own; an hfsc class keeps to its ul, except that its
    real-time curve is served even above it.
    """
    if isinstance(qdisc, Hfsc):
        if cls.ul is None:
            return None
        rt = cls.rt.m2.bits_per_second if cls.rt is not None and not cls.children else 0
        return Bound(max(cls.ul.m2.bits_per_second, rt), cls)
    rate = cls.rate.bits_per_second if isinstance(cls.rate, Rate) else None
    if isinstance(qdisc, Htb) and parents.get(id(cls)) is not None and isinstance(cls.ceil, Rate):
        return Bound(cls.ceil.bits_per_second, cls)
    if rate is None or (isinstance(qdisc, Cbq) and not cls.bounded) or isinstance(qdisc, Prio):
        return None
    return Bound(rate, cls)


def class_bound(
    qdisc: ClassfulQdisc,
    cls: Class,
    parents: dict[int, Class | None],
    outer: Bound | None = None,
) -> Bound | None:
    """The most ``cls`` can send: the least of its own bound, its ancestors' and ``outer`` (what
    holds ``qdisc``); the first of equals (the class itself before its ancestors)."""

    def chain() -> Iterator[Bound | None]:
        node: Class | None = cls
        while node is not None:
            yield own_bound(qdisc, node, parents)
            node = parents.get(id(node))
        yield outer

    return _least(chain())


def held_qdiscs(
    qdisc: Qdisc, outer: Bound | None = None
) -> Iterator[tuple[Qdisc, Class | Tbf | Netem, Bound | None]]:
    """Yield every qdisc below ``qdisc`` (pre-order) with what holds it, a class or a chaining
    qdisc, and the most it can send (``outer`` bounds ``qdisc`` itself; None: unbounded)."""
    match qdisc:
        case Htb() | Prio() | Cbq() | Hfsc():
            parents = parent_map(qdisc)
            for cls in classes_of(qdisc):
                if cls.leaf is not None:
                    bound = class_bound(qdisc, cls, parents, outer)
                    yield cls.leaf, cls, bound
                    yield from held_qdiscs(cls.leaf, bound)
        case Tbf() | Netem():
            if qdisc.child is not None:
                own = Bound(qdisc.rate.bits_per_second, qdisc) if qdisc.rate is not None else None
                bound = _least(iter((own, outer)))
                yield qdisc.child, qdisc, bound
                yield from held_qdiscs(qdisc.child, bound)
        case _:
            pass


# ---- construction --------------------------------------------------------------------------------


def quick_init(cls: type[N]) -> type[N]:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets each field through
    its slot's own setter: the same object, made in about a third less time than by the
    generated one (which goes through ``object.__setattr__`` for a frozen class). A large
    policy makes millions of nodes, so every stage gains. Classes this cannot copy exactly
    (a ``__post_init__``, a default factory, an init-only or keyword-only field) are left as
    they are."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in vars(cls):
        return cls
    fields = dataclasses.fields(cast(Any, cls))
    if hasattr(cls, "__post_init__") or any(
        not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING for f in fields
    ):
        return cls
    namespace: dict[str, Any] = {}
    args, body = [], []
    for f in fields:
        namespace[f"_set_{f.name}"] = vars(cls)[f.name].__set__
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # our own text, made from the class's fields
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


for _node in list(globals().values()):  # every node type of the IR
    if isinstance(_node, type) and _node.__module__ == __name__ and dataclasses.is_dataclass(_node):
        quick_init(_node)
del _node
