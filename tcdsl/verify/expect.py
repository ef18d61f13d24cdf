"""The kernel state an allocated policy should produce, as tc would show it.

Every expected object (qdisc, class, filter, iptables rule) and every value it should have
carries the ``Span`` of the policy text it comes from and a label for messages (``class
'voip'``, ``sfq qdisc of 1:10``, ``filter to 1:20 (pref 1)``, ``mark rule for 'voip'``), so a
difference found in the kernel is reported at the policy line that asked for it.

Values are derived from the IR (not from ``tcdsl.commands``, whose spelling is what is being
checked) and normalised the way the kernel stores them and tc prints them: a rate through
bytes/s and tc's unit choice, a size through tc's Kb/Mb rounding, a netem time through psched
ticks and ``%.3g``, a codel time through the kernel's 1024-ns units, a netem percentage through
a 32-bit fraction and ``%g``. Only what the policy says is checked (plus the few defaults the
policy relies on, such as htb's ``default 0`` or prio's priomap).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from ipaddress import IPv4Network, IPv6Address, ip_network

from tcdsl import ir, linklayer
from tcdsl.commands import (
    CAKE_LINKLAYER,
    DOWNLOAD_HOOKS,
    LINK_KEY,
    REDIRECT_PREF,
    curve_words,
    link_words,
    queue_words,
    table_text,
)
from tcdsl.diagnostics import Span
from tcdsl.tcmath import (
    DEFAULT_PRIOMAP,
    HTB_DEFAULT_R2Q,
    RED_DEFAULT_BANDWIDTH,
    TICKS_PER_US,
    U32_MAX,
    fq_buckets_kept,
    psched_l2t_ns,
    red_scell_log,
    red_thresholds,
    red_wlog,
    tc_xmittime_ticks,
)
from tcdsl.units import format_rate, format_size, format_time
from tcdsl.verify.readback import NEXTHDR, Action, FlowerMatch, IptRule, Key, Value, parse_time

# ==== how tc shows what it was given ===========================================================

TIME_UNITS_PER_SEC = 1_000_000


def tc_shown_rate(bits_per_second: int) -> int:
    """The rate tc prints for one it was given, in bits/s (tc keeps bytes/s; see readback)."""
    rate = bits_per_second // 8 * 8
    scale = 1
    for _ in range(4):
        if rate < 1000 or (rate % 1000 and rate < 1000 * 1000):
            break
        rate //= 1000
        scale *= 1000
    return rate * scale


def tc_shown_size(size: int) -> int:
    """The size tc prints for one it was given, in bytes (iproute2's sprint_size): in Mb or Kb
    when within 1 KiB or 16 bytes of a whole number of them, printed with ``%g`` (six
    significant digits: 2643027 Kb shows as ``2.64303e+06Kb``)."""
    kilo, mega = 1024, 1024 * 1024
    if size >= mega and abs(mega * round(size / mega) - size) < 1024:
        return round(float(f"{round(size / mega):g}") * mega)
    if size >= kilo and abs(kilo * round(size / kilo) - size) < 16:
        return round(float(f"{round(size / kilo):g}") * kilo)
    return size


def sprint_time(microseconds: float) -> str:
    """iproute2's ``sprint_time``: ``%.3gs``, ``%.3gms`` or whole ``us``."""
    time = int(microseconds) & U32_MAX  # the C function takes a __u32
    if time >= TIME_UNITS_PER_SEC:
        return f"{time / TIME_UNITS_PER_SEC:.3g}s"
    if time >= TIME_UNITS_PER_SEC // 1000:
        return f"{time / (TIME_UNITS_PER_SEC // 1000):.3g}ms"
    return f"{time}us"


def tc_shown_time(microseconds: float) -> int:
    """A time as tc prints it, read back in microseconds (three significant digits)."""
    return parse_time(sprint_time(microseconds))


def _time2tick(microseconds: int) -> int:
    return int(microseconds * TICKS_PER_US) & U32_MAX


def _tick2time(ticks: int) -> int:
    return int(ticks / TICKS_PER_US)


def netem_shown_time(microseconds: int) -> int:
    """A netem delay or jitter as tc shows it: through psched ticks (64 ns), then ``%.3g``."""
    return tc_shown_time(_tick2time(_time2tick(microseconds)))


def codel_shown_time(microseconds: int) -> int:
    """An fq_codel target or interval as tc shows it: the kernel keeps units of 1024 ns."""
    codel = (microseconds * 1000) >> 10
    return tc_shown_time((codel << 10) // 1000)


def netem_shown_percent(percent: Fraction) -> float:
    """A netem probability as tc shows it: a fraction of 2^32-1, printed with ``%g``."""
    scaled = round(float(percent) / 100 * U32_MAX)
    return float(f"{100.0 * scaled / U32_MAX:g}")


def _xmitsize(rate_bytes: int, ticks: int) -> int:
    """iproute2's ``tc_calc_xmitsize``: the bytes sent in ``ticks`` at ``rate_bytes`` (the time
    truncated to whole microseconds first)."""
    return int(rate_bytes * _tick2time(ticks) / TIME_UNITS_PER_SEC)


def htb_shown_burst(rate_bits: int, size: int) -> int:
    """An htb ``burst`` (or ``cburst``, at the ceil) as tc shows it, in bytes.

    tc hands the kernel the time to send the burst at the rate, in 64-ns ticks
    (``tc_calc_xmittime``: whole microseconds, then whole ticks), and computes the size back
    from that time when it prints the class. At 1 Gbit/s a microsecond is 125 bytes, so the
    round trip loses up to twice that. The tick count is a 32-bit field: a burst that takes
    longer than about 274.9 s at the rate wraps around in tc, which this does not model (the
    kernel then disagrees with the policy, rightly).
    """
    rate = rate_bits // 8
    return tc_shown_size(_xmitsize(rate, tc_xmittime_ticks(rate, size)))


def tbf_ticks(rate_bits: int, size: int) -> int:
    """The ticks a tbf keeps for a burst (or, at the peak rate, an mtu) of ``size`` bytes.

    tc 6.1 sends the burst in bytes (``TCA_TBF_BURST``, ``TCA_TBF_PBURST``); the kernel turns
    it into nanoseconds at the rate and reports it back in 64-ns ticks."""
    return psched_l2t_ns(rate_bits // 8, size) >> 6


def tbf_shown_size(rate_bits: int, size: int) -> int:
    """A tbf ``burst`` (at the rate) or ``mtu`` (at the peak rate) as tc shows it, in bytes."""
    return tc_shown_size(_xmitsize(rate_bits // 8, tbf_ticks(rate_bits, size)))


def tbf_shown_latency(q: ir.Tbf) -> int | None:
    """The ``lat`` tc prints for a tbf, in microseconds, or None without rate/burst/limit."""
    if q.rate is None or q.burst is None:
        return None
    rate = q.rate.bits_per_second // 8
    prate = q.peakrate.bits_per_second // 8 if q.peakrate is not None else 0
    burst = q.burst.bytes
    mtu = q.mtu.bytes if q.mtu is not None else 0
    if rate == 0:
        return None
    if q.limit is not None:
        limit = q.limit.bytes
    elif q.latency is not None:
        lim = rate * q.latency.microseconds / TIME_UNITS_PER_SEC + burst
        if prate:
            lim = min(lim, prate * q.latency.microseconds / TIME_UNITS_PER_SEC + mtu)
        limit = int(lim)
    else:
        return None
    # tc prints it from the limit and the ticks the kernel reports (see tbf_ticks)
    latency = TIME_UNITS_PER_SEC * (limit / rate) - _tick2time(tbf_ticks(rate * 8, burst))
    if prate:
        lat2 = TIME_UNITS_PER_SEC * (limit / prate) - _tick2time(tbf_ticks(prate * 8, mtu))
        latency = max(latency, lat2)
    return tc_shown_time(latency) if latency >= 0 else None


# ==== u32 keys =================================================================================


class UnpackableKey(Exception):
    """Keys tc cannot hold as the policy means them: the compiler should have refused them."""


def _pack(keys: list[list[int]], value: int, mask: int, offset: int) -> None:
    """Add one key the way tc's pack_key does: merge keys on the same word, refuse conflicts."""
    value &= mask
    for key in keys:
        if key[2] == offset:
            if (value ^ key[0]) & mask & key[1]:
                raise UnpackableKey(f"keys at offset {offset} contradict each other (tc refuses)")
            key[0] |= value
            key[1] |= mask
            return
    keys.append([value, mask, offset])


def _field(value: int, mask: int, width: int, offset: int) -> tuple[int, int, int]:
    """Place a ``width``-bit field starting at byte ``offset`` in its 32-bit word."""
    byte = offset % 4
    if byte * 8 + width > 32:
        raise UnpackableKey(f"a u{width} key at offset {offset} crosses a 32-bit word")
    shift = 32 - width - byte * 8
    return value << shift, mask << shift, offset - byte


IP_FIELDS = {"tos": (8, 1), "protocol": (8, 9), "sport": (16, 20), "dport": (16, 22)}
"""``ip FIELD VALUE MASK`` -> (width in bits, byte offset in the IPv4 header, no options)."""

IP6_FIELDS = {"protocol": (8, 6), "sport": (16, 40), "dport": (16, 42)}
"""``ip6 FIELD VALUE MASK`` -> (width in bits, byte offset from the IPv6 header): the next
header of the fixed header, and the ports 40 bytes in (whatever header is there)."""


def _ip6_address(keys: list[list[int]], text: str, offset: int) -> None:
    """An IPv6 address or prefix as tc packs it: one key per 32-bit word the prefix reaches
    (``/64``: two, ``/0``: none)."""
    address, _, length = text.partition("/")
    bits = int(length) if length else 128
    value = int(IPv6Address(address))
    for word in range(4):
        used = min(max(bits - 32 * word, 0), 32)
        if used:
            mask = (U32_MAX << (32 - used)) & U32_MAX
            _pack(keys, (value >> (96 - 32 * word)) & U32_MAX, mask, offset + 4 * word)


def expected_keys(words: tuple[tuple[str, ...], ...]) -> tuple[Key, ...]:
    """The kernel keys for a filter's ``match`` words, as the policy means them (``ip``,
    ``ip6`` and raw words, as tc's f_u32.c packs them)."""
    keys: list[list[int]] = []
    for w in words:
        if w[0] == "ip" and w[1] in ("src", "dst"):
            net = IPv4Network(w[2])
            offset = 12 if w[1] == "src" else 16
            _pack(keys, int(net.network_address), int(net.netmask), offset)
            continue
        if w[0] == "ip6" and w[1] in ("src", "dst"):
            _ip6_address(keys, w[2], 8 if w[1] == "src" else 24)
            continue
        if w[0] == "ip6" and w[1] == "priority":
            # the traffic class: bits 4-11 of the first word (after the version)
            _pack(keys, int(w[2], 0) << 20, int(w[3], 0) << 20, 0)
            continue
        if w[0] in ("ip", "ip6"):
            width, offset = (IP_FIELDS if w[0] == "ip" else IP6_FIELDS)[w[1]]
            value, mask = int(w[2], 0), int(w[3], 0)
        else:
            assert w[0] in ("u8", "u16", "u32") and w[3] == "at", w
            width, value, mask, offset = int(w[0][1:]), int(w[1], 0), int(w[2], 0), int(w[4])
        _pack(keys, *_field(value, mask, width, offset))
    return tuple((k[0], k[1], k[2]) for k in keys)


def describe_keys(keys: tuple[Key, ...]) -> str:
    """Keys as tc prints them: ``match 00001389/0000ffff at 20``, comma-separated."""

    def at(offset: int) -> str:
        return f"nexthdr+{offset - NEXTHDR}" if offset >= NEXTHDR else str(offset)

    return ", ".join(f"match {v:08x}/{m:08x} at {at(o)}" for v, m, o in keys) or "no keys"


# ==== the expected objects =====================================================================


@dataclass(frozen=True, slots=True)
class Want:
    """One value the kernel should show for an object.

    ``value`` is in the units readback parses to (bits/s, bytes, microseconds, packets,
    percentage points), already normalised the way tc shows it; ``policy`` is how the policy
    says it, for messages. A shown value within ``tolerance`` of ``value`` agrees. ``absent``
    is what it means when tc does not print the key at all (a flag that is off, a zero jitter);
    None means the key must be printed.
    """

    key: str
    value: Value
    policy: str
    span: Span
    tolerance: float = 0
    absent: Value | None = None
    name: str = ""
    """How messages name the value, when not by ``key`` (``latency`` for tc's ``lat``)."""

    @property
    def label(self) -> str:
        """The name of the value in messages."""
        return self.name or self.key


@dataclass(frozen=True, slots=True)
class ExpectedQdisc:
    """A qdisc the kernel should hold."""

    label: str
    kind: str
    handle: str
    parent: str
    span: Span
    wants: tuple[Want, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpectedClass:
    """A class the kernel should hold: created by the script (htb, cbq) or implied by its
    qdisc (a prio band), which exists whether or not the policy names it."""

    label: str
    kind: str
    classid: str
    parent: str
    leaf: str | None
    span: Span
    wants: tuple[Want, ...] = ()
    created: bool = True


@dataclass(frozen=True, slots=True)
class ExpectedFilter:
    """A filter the kernel should hold: u32 keys or an fw mark, sending packets to flowid."""

    label: str
    kind: str
    parent: str
    pref: int
    flowid: str
    span: Span
    keys: tuple[Key, ...] = ()
    mark: int | None = None
    mask: int | None = None
    """fw only: the mark mask (``handle V/M``), None for all 32 bits."""
    words: str = ""
    """The policy's condition as tc's words (``ip dport 5001 0xffff``), for messages."""
    unpackable: str | None = None
    """Why u32 cannot hold the keys as the policy means them (a compiler bug), or None."""
    protocol: str = "ip"
    """``ip`` or ``ipv6`` by the filter's family (``all`` for a download's redirect)."""
    actions: tuple[Action, ...] = ()
    """The actions as readback parses them, with tc's rounding (see :func:`police_action`)."""
    flower: FlowerMatch | None = None
    """flower only: what it should match, as readback normalises it."""
    place: str = ""
    """u32, in a laid-out pref: the node's handle (``::N``, ``T:B:N``); "" otherwise."""
    link: str = ""
    """A u32 link node: the table it jumps to (``1:``)."""
    hashkey: tuple[int, int] | None = None
    """A u32 link node's (mask, offset), or None."""


@dataclass(frozen=True, slots=True)
class ExpectedRule:
    """An iptables rule the mangle table should hold."""

    label: str
    rule: IptRule
    span: Span


@dataclass(frozen=True, slots=True)
class ExpectedChain:
    """The policy's iptables chain (ip6tables for ``family`` ipv6), the jump into it, and its
    rules in order."""

    name: str
    span: Span
    jump: ExpectedRule
    rules: tuple[ExpectedRule, ...]
    more_jumps: tuple[ExpectedRule, ...] = ()
    """A download's second jump (it marks in FORWARD and INPUT)."""
    family: ir.Family = "ipv4"

    @property
    def tool(self) -> str:
        """``iptables`` or ``ip6tables``, as messages name the table."""
        return "iptables" if self.family == "ipv4" else "ip6tables"

    @property
    def jumps(self) -> tuple[ExpectedRule, ...]:
        """Every jump into the chain."""
        return (self.jump, *self.more_jumps)


@dataclass(frozen=True, slots=True)
class ExpectedInterface:
    """Everything one interface of the policy should create."""

    name: str
    span: Span
    qdiscs: tuple[ExpectedQdisc, ...]
    classes: tuple[ExpectedClass, ...]
    filters: tuple[ExpectedFilter, ...]
    chains: tuple[ExpectedChain, ...] = ()
    """The marking chain in each table that marks a family of the tree (iptables first)."""
    mark_from: str | None = None
    """The interface ``classify by mark from`` names (the script's iptables rules use it)."""

    @property
    def chain(self) -> ExpectedChain | None:
        """The first marking chain (iptables' when the tree marks IPv4), or None."""
        return self.chains[0] if self.chains else None

    def owner_span(self, handle_or_class: str) -> Span:
        """The policy text that owns a kernel object hanging off ``handle_or_class``: the class
        with that id, else the qdisc with that major, else the interface's root qdisc."""
        for cls in self.classes:
            if cls.classid == handle_or_class:
                return cls.span
        major = handle_or_class.split(":")[0] + ":"
        for q in self.qdiscs:
            if q.handle == major:
                return q.span
        return self.qdiscs[0].span if self.qdiscs else self.span


@dataclass(frozen=True, slots=True)
class Requirement:
    """A kernel feature the policy needs (``sch_sfq``, ``cls_fw``, ``iptables``) and the first
    policy text that needs it."""

    feature: str
    what: str
    """Human words: ``the sfq qdisc``, ``fw filters``, ``iptables (mangle table, MARK)``."""
    span: Span


@dataclass(frozen=True, slots=True)
class ExpectedPolicy:
    """The whole expected kernel state of a policy."""

    source: str
    interfaces: tuple[ExpectedInterface, ...]
    requirements: tuple[Requirement, ...]

    def spans(self) -> Iterator[Span]:
        """Every span an expected object carries (to find a span from a script comment)."""
        for iface in self.interfaces:
            yield iface.span
            for q in iface.qdiscs:
                yield q.span
            for c in iface.classes:
                yield c.span
            for f in iface.filters:
                yield f.span
            for chain in iface.chains:
                yield chain.span
                for r in chain.rules:
                    yield r.span

    def needs(self, feature: str) -> Requirement | None:
        """The requirement for ``feature``, if the policy has it."""
        return next((r for r in self.requirements if r.feature == feature), None)


# ==== building them from the IR ================================================================


@dataclass
class _Builder:
    sources: Mapping[str, str]
    qdiscs: list[ExpectedQdisc] = field(default_factory=list)
    classes: list[ExpectedClass] = field(default_factory=list)
    lines: dict[str, list[str]] = field(default_factory=dict)
    """Each source's lines, split once (split per value, 10,000 classes took 15 s)."""

    def written(self, span: Span) -> str | None:
        """The policy's text at ``span`` (one line), if the sources are at hand."""
        if span.end_line != span.line:
            return None
        lines = self.lines.get(span.file)
        if lines is None:
            text = self.sources.get(span.file)
            if text is None:
                return None
            lines = self.lines[span.file] = text.splitlines()
        if not 1 <= span.line <= len(lines):
            return None
        return lines[span.line - 1][span.column - 1 : span.end_column - 1].strip() or None

    def spell(self, span: Span, canonical: str) -> str:
        """How the policy says a value: its text at ``span``, with the canonical spelling when
        the text differs (``LINK (12mbit)``, ``60% (60mbit)``)."""
        written = self.written(span)
        if not written or written.lower() == canonical.lower():
            return canonical
        return f"{written} ({canonical})"

    # ---- values ----
    def rate(self, key: str, value: ir.Rate | ir.Percent | None) -> Want | None:
        if not isinstance(value, ir.Rate):
            return None
        bits = value.bits_per_second
        return Want(key, tc_shown_rate(bits), self.spell(value.span, format_rate(bits)), value.span)

    def size(self, key: str, value: ir.Size | None, approx: bool = False) -> Want | None:
        if value is None:
            return None
        size = value.bytes
        tolerance = size // 100 + 16 if approx else 0
        shown = size if approx else tc_shown_size(size)
        return Want(key, shown, self.spell(value.span, format_size(size)), value.span, tolerance)

    def burst(
        self, key: str, value: ir.Size | None, rate: ir.Rate | ir.Percent | None, how: str
    ) -> Want | None:
        """A size tc keeps as the time to send it at ``rate``: an htb burst or cburst
        (``how="htb"``), a tbf burst or mtu (``how="tbf"``)."""
        if value is None or not isinstance(rate, ir.Rate) or rate.bits_per_second < 8:
            return self.size(key, value, approx=True)
        size, bits = value.bytes, rate.bits_per_second
        shown = htb_shown_burst(bits, size) if how == "htb" else tbf_shown_size(bits, size)
        policy = self.spell(value.span, format_size(size))
        if shown != size:
            policy += f", which tc shows as {format_size(shown)} at {format_rate(bits)}"
        # tc prints a tbf's mtu only when the kernel keeps some ticks of it (not for 94 bytes
        # at 20gbit, 37 ns)
        absent = 0 if key == "mtu" else None
        return Want(key, shown, policy, value.span, absent=absent)

    def count(self, key: str, value: ir.Count | None) -> Want | None:
        if value is None:
            return None
        return Want(key, value.value, self.spell(value.span, str(value.value)), value.span)

    # ---- qdiscs ----
    def qdisc(self, q: ir.Qdisc, parent: str, label: str) -> None:
        assert q.handle is not None
        wants = [w for w in self.qdisc_wants(q) if w is not None]
        self.qdiscs.append(
            ExpectedQdisc(label, q.kind, q.handle.qdisc, parent, q.span, tuple(wants))
        )
        match q:
            case ir.Htb() | ir.Cbq() | ir.Hfsc():
                parents = ir.parent_map(q)
                # hfsc's top classes hang off its own root class, shown as the qdisc (1:)
                top = q.handle.qdisc if isinstance(q, ir.Hfsc) else "root"
                for cls in ir.classes_of(q):
                    up = parents[id(cls)]
                    self.klass(q, cls, top if up is None else str(up.classid))
            case ir.Prio():
                for cls in q.classes:
                    self.band(q, cls)
            case ir.Tbf() | ir.Netem():
                if q.child is not None:
                    below = q.handle.qdisc  # (the kernel shows 1:1 for one added there)
                    self.qdisc(q.child, below, f"{q.child.kind} qdisc of {below}")
            case ir.Mq():
                for queue in q.queues:
                    below = f"{q.handle.major:x}:{queue.number:x}"
                    self.qdisc(queue.qdisc, below, f"{queue.qdisc.kind} qdisc of {below}")
            case _:
                pass

    def qdisc_wants(self, q: ir.Qdisc) -> Iterator[Want | None]:
        match q:
            case ir.Htb():
                yield self.htb_default(q)
                yield (
                    self.count("r2q", q.r2q)
                    or self.chosen("r2q", q.chosen_r2q, q.span)
                    or self.default("r2q", HTB_DEFAULT_R2Q, q.span)
                )
            case ir.Prio():
                yield from self.prio_bands(q.span, q.bands, q.priomap)
            case ir.PfifoFast():
                yield from self.prio_bands(q.span, None, None)
            case ir.Tbf():
                yield self.rate("rate", q.rate)
                yield self.burst("burst", q.burst, q.rate, "tbf")
                yield self.rate("peakrate", q.peakrate) or Want(
                    "peakrate", 0, "none", q.span, absent=0
                )
                if q.peakrate is not None:
                    yield self.burst("mtu", q.mtu, q.peakrate, "tbf")
                yield self.tbf_latency(q)
            case ir.Netem():
                yield from self.netem(q)
            case ir.Sfq():
                yield self.count("limit", q.limit)
                yield self.size("quantum", q.quantum)
                yield self.count("depth", q.depth)
                yield self.count("divisor", q.divisor)
                if q.perturb is not None:
                    p = q.perturb
                    policy = self.spell(p.span, str(p.value))
                    yield Want("perturb", p.value, policy, p.span, absent=0)
                else:
                    yield Want("perturb", 0, "none (no perturbation)", q.span, absent=0)
            case ir.FqCodel():
                yield self.count("limit", q.limit)
                yield self.count("flows", q.flows)
                if q.quantum is not None:
                    s = q.quantum
                    yield Want("quantum", s.bytes, self.spell(s.span, format_size(s.bytes)), s.span)
                for key, time in (("target", q.target), ("interval", q.interval)):
                    if time is not None:
                        us = time.microseconds
                        policy = self.spell(time.span, format_time(us))
                        yield Want(key, codel_shown_time(us), policy, time.span)
                yield self.size("memory_limit", q.memory_limit)
                if q.ecn is not None:
                    policy = "on (ecn)" if q.ecn else "off (noecn)"
                    yield Want("ecn", q.ecn, policy, q.span, absent=False)
            case ir.Pfifo():
                yield self.count("limit", q.limit)
            case ir.Bfifo():
                yield self.size("limit", q.limit)
            case ir.Cbq():
                pass  # no kernel that runs tc 6.1's cbq is at hand: structure only
            case ir.Hfsc():
                if q.default is None:  # tc prints no default 0 for hfsc
                    yield Want("default", 0, "none", q.span, absent=0)
                else:
                    yield self.htb_default(q)
            case ir.Cake():
                yield from self.cake(q)
            case ir.Codel():
                yield self.count("limit", q.limit) or self.default("limit", 1000, q.span)
                yield self.codel_time("target", q.target, 5000, q.span)
                yield self.codel_time("interval", q.interval, 100_000, q.span)
                yield self.codel_time("ce_threshold", q.ce_threshold, None, q.span)
                policy = "on (ecn)" if q.ecn else "off"
                yield Want("ecn", bool(q.ecn), policy, q.span, absent=False)
            case ir.Fq():
                yield from self.fq(q)
            case ir.FqPie():
                pass  # no kernel at hand has fq_pie (Debian 12's 6.1 does not build it)
            case ir.Red():
                yield from self.red(q)

    def codel_time(
        self, key: str, time: ir.Time | None, default: int | None, span: Span
    ) -> Want | None:
        """A codel time as tc shows it (kept in 1024-ns units); ``default`` when not given."""
        if time is None:
            if default is None:
                return Want(key, 0, "none", span, absent=0)
            return Want(key, tc_shown_time(default), f"{format_time(default)} (the default)", span)
        us = time.microseconds
        return Want(key, codel_shown_time(us), self.spell(time.span, format_time(us)), time.span)

    def fq(self, q: ir.Fq) -> Iterator[Want | None]:
        yield self.count("limit", q.limit) or self.default("limit", 10000, q.span)
        yield self.count("flow_limit", q.flow_limit) or self.default("flow_limit", 100, q.span)
        if q.buckets is not None and q.buckets.value > 0:
            kept = fq_buckets_kept(q.buckets.value)
            yield Want("buckets", kept, self.spell(q.buckets.span, str(kept)), q.buckets.span)
        else:
            yield self.default("buckets", 1024, q.span)
        yield self.count("orphan_mask", q.orphan_mask) or self.default("orphan_mask", 1023, q.span)
        yield self.size("quantum", q.quantum)
        yield self.size("initial_quantum", q.initial_quantum)
        yield self.rate("maxrate", q.maxrate) or Want("maxrate", 0, "none", q.span, absent=0)
        yield self.rate("low_rate_threshold", q.low_rate_threshold)
        if q.refill_delay is not None:
            # the kernel keeps it in jiffies: a tick either way (HZ 100 at the coarsest)
            us = q.refill_delay.microseconds
            policy = self.spell(q.refill_delay.span, format_time(us))
            yield Want("refill_delay", tc_shown_time(us), policy, q.refill_delay.span, 10_000)
        for key in ("ce_threshold", "horizon"):
            time = getattr(q, key)
            if time is not None:
                us = time.microseconds
                yield Want(
                    key, tc_shown_time(us), self.spell(time.span, format_time(us)), time.span
                )
        yield Want(
            "nopacing",
            q.pacing is False,
            "off (nopacing)" if q.pacing is False else "on",
            q.span,
            absent=False,
        )
        if q.horizon_drop is not None:
            key = "horizon_drop" if q.horizon_drop else "horizon_cap"
            yield Want(key, True, key, q.span, absent=False)

    def red(self, q: ir.Red) -> Iterator[Want | None]:
        if q.limit is None or q.avpkt is None:
            return
        qmin, qmax, burst = red_thresholds(q)
        yield self.size("limit", q.limit)
        for key, given, value in (("min", q.min, qmin), ("max", q.max, qmax)):
            if given is not None:
                yield self.size(key, given)
            else:
                yield Want(key, tc_shown_size(value), f"{value} (derived by tc)", q.span)
        for key in ("ecn", "harddrop", "adaptive"):
            on = bool(getattr(q, key))
            yield Want(key, on, "on" if on else "off", q.span, absent=False)
        wlog = red_wlog(qmin, burst, q.avpkt.bytes)
        if wlog is not None:
            where = q.burst.span if q.burst else q.span
            yield Want("ewma", wlog, f"{wlog} (from burst {burst})", where)
            bandwidth = q.bandwidth.bits_per_second if q.bandwidth else RED_DEFAULT_BANDWIDTH
            scell = red_scell_log(wlog, q.avpkt.bytes, bandwidth)
            if scell is not None:
                where = q.bandwidth.span if q.bandwidth else q.span
                policy = f"{scell} (from bandwidth {format_rate(bandwidth)} and avpkt)"
                yield Want("Scell_log", scell, policy, where)
        if not q.adaptive:  # adaptive red moves its probability at run time
            pct = q.probability.value if q.probability is not None else Fraction(2)
            max_p = int(float(pct) / 100 * 2**32) & U32_MAX
            shown = float(f"{max_p / 2**32:g}")
            where = q.probability.span if q.probability is not None else q.span
            yield Want("probability", shown, f"{float(pct) / 100:g}", where, shown * 1e-5)

    def word(self, key: str, word: ir.Word | None, default: str, span: Span) -> Want:
        """A keyword of a group (cake's), or the group's default when the policy has none."""
        if word is None:
            return Want(key, default, f"{default} (the default)", span)
        return Want(key, word.value, word.value, word.span)

    def cake(self, q: ir.Cake) -> Iterator[Want | None]:
        if q.bandwidth is not None:
            yield self.rate("bandwidth", q.bandwidth)
        else:
            span = q.unlimited.span if q.unlimited else q.span
            yield Want("bandwidth", "unlimited", "unlimited", span)
        yield self.word("diffserv", q.diffserv, "diffserv3", q.span)
        yield self.word("isolate", q.isolate, "triple-isolate", q.span)
        yield self.word("nat", q.nat, "nonat", q.span)
        yield self.word("wash", q.wash, "nowash", q.span)
        yield self.word("ack_filter", q.ack_filter, "no-ack-filter", q.span)
        if q.split_gso is not None:  # the kernel's default changed over the years
            yield self.word("split_gso", q.split_gso, "split-gso", q.span)
        mode = self.word("mode", q.mode, "egress", q.span)
        yield replace(mode, absent="egress", name="ingress mode")
        us = q.rtt.microseconds if q.rtt is not None else 100_000
        span = q.rtt.span if q.rtt is not None else q.span
        policy = self.spell(span, format_time(us)) if q.rtt is not None else "100ms (the default)"
        yield Want("rtt", tc_shown_time(us), policy, span, tolerance=us / 200)
        if q.memlimit is not None:
            m = q.memlimit
            yield Want(
                "memlimit", tc_shown_size(m.bytes), self.spell(m.span, format_size(m.bytes)), m.span
            )
        if q.fwmark is not None:
            f = q.fwmark
            yield Want("fwmark", f.value, f"{f.value:#x}", f.span, absent=0)
        o = q.overhead
        if o is None:
            yield Want("raw", True, "no overhead (raw)", q.span, absent=False)
            return
        yield Want("raw", False, "an overhead", o.span, absent=False)
        yield Want("overhead", o.overhead.value, self.overhead_text(o), o.overhead.span)
        atm = CAKE_LINKLAYER[o.linklayer]
        yield Want("atm", atm, atm, o.linklayer_word.span if o.linklayer_word else o.span)
        mpu = o.mpu.value if o.mpu is not None else 0
        yield Want("mpu", mpu, str(mpu), o.mpu.span if o.mpu else o.span, absent=0)

    def overhead_text(self, o: ir.Overhead) -> str:
        """``pppoe-llc (40)``, or the number as written."""
        n = o.overhead.value
        return f"{o.preset.value} ({n})" if o.preset else self.spell(o.overhead.span, str(n))

    def stab(self, o: ir.Overhead | None, span: Span) -> Iterator[Want]:
        """A size table as tc -d shows it (its overhead 14 bytes below tcdsl's)."""
        if o is None:
            yield Want("stab", False, "none", span, absent=False)
            return
        yield Want("stab", True, "a size table", o.span, absent=False)
        n = linklayer.stab_overhead(o.overhead.value)
        policy = f"{n} ({self.overhead_text(o)} beyond the IP packet, less the Ethernet header)"
        yield Want("stab overhead", n, policy, o.overhead.span, absent=0)
        where = o.linklayer_word.span if o.linklayer_word else o.span
        yield Want("stab linklayer", o.linklayer, o.linklayer, where)
        mpu = o.mpu.value if o.mpu is not None else 0
        yield Want("stab mpu", mpu, str(mpu), o.mpu.span if o.mpu else o.span, absent=0)
        table = linklayer.stab_for(o.overhead.value, o.linklayer, mpu, None, None).has_table
        for key, given, default in (
            ("mtu", o.mtu.bytes if o.mtu else None, linklayer.STAB_DEFAULT_MTU),
            ("tsize", o.tsize.value if o.tsize else None, linklayer.STAB_DEFAULT_TSIZE),
        ):
            value = (given or default) if table else 0
            text = (
                str(value)
                if given
                else f"{value} (tc's {'default' if table else 'without a table'})"
            )
            yield Want(f"stab {key}", value, text, o.span, absent=0)

    def htb_default(self, q: ir.Htb | ir.Hfsc) -> Want:
        if q.default is None:
            return Want("default", 0, "none (0)", q.span)
        minor = next(
            (
                c.classid.minor
                for c in ir.classes_of(q)
                if c.name == q.default.name and not c.implicit and c.classid is not None
            ),
            0,
        )
        return Want("default", minor, f"{q.default.name} ({minor:#x})", q.default.span)

    def prio_bands(
        self, span: Span, bands: ir.Count | None, priomap: tuple[ir.Count, ...] | None
    ) -> Iterator[Want]:
        if bands is None:
            yield Want("bands", 3, "3 (the default)", span)
        else:
            yield Want("bands", bands.value, self.spell(bands.span, str(bands.value)), bands.span)
        given = tuple(c.value for c in priomap or ())
        full = given + DEFAULT_PRIOMAP[len(given) :]
        text = " ".join(map(str, full))
        if priomap:
            first, last = priomap[0].span, priomap[-1].span
            where = Span(first.file, first.line, first.column, last.end_line, last.end_column)
            yield Want("priomap", full, text, where)
        else:
            yield Want("priomap", full, f"{text} (the default)", span)

    def tbf_latency(self, q: ir.Tbf) -> Want | None:
        shown = tbf_shown_latency(q)
        if shown is None:
            return None
        given = q.latency if q.latency is not None else q.limit
        assert given is not None
        if isinstance(given, ir.Time):
            policy = f"latency {self.spell(given.span, format_time(given.microseconds))}"
        else:
            policy = f"limit {self.spell(given.span, format_size(given.bytes))}"
        policy += f" ({sprint_time(shown)})"
        return Want("lat", shown, policy, given.span, shown // 100 + 2, name="latency")

    def netem(self, q: ir.Netem) -> Iterator[Want | None]:
        # netem does nothing the policy does not ask for: what it leaves out must be 0.
        yield self.count("limit", q.limit) or self.default("limit", 1000, q.span)
        for key, time in (("delay", q.delay), ("jitter", q.jitter)):
            if time is None:
                yield Want(key, 0, "none", q.span, absent=0)
                continue
            if key == "jitter" and (q.delay is None or _time2tick(q.delay.microseconds) == 0):
                continue  # tc prints the jitter only after a delay: a zero delay hides it
            us = time.microseconds
            policy = self.spell(time.span, format_time(us))
            yield Want(key, netem_shown_time(us), policy, time.span, absent=0)
        for key, pct in (("loss", q.loss), ("duplicate", q.duplicate), ("corrupt", q.corrupt)):
            if pct is None:
                yield Want(key, 0.0, "none", q.span, absent=0.0)
                continue
            shown = netem_shown_percent(pct.value)
            policy = self.spell(pct.span, f"{float(pct.value):g}%")
            yield Want(key, shown, policy, pct.span, shown * 1e-6, absent=0.0)
        yield self.rate("rate", q.rate) or Want("rate", 0, "none", q.span, absent=0)
        yield from self.netem_more(q)

    def netem_more(self, q: ir.Netem) -> Iterator[Want | None]:
        """netem's correlations, reordering, slots and rate overhead (its distribution table
        is not shown: nothing to compare)."""
        for key, pct in (
            ("delay_correlation", q.delay_correlation),
            ("loss_correlation", q.loss_correlation),
            ("reorder", q.reorder),
            ("reorder_correlation", q.reorder_correlation),
        ):
            if pct is None:
                yield Want(key, 0.0, "none", q.span, absent=0.0)
                continue
            shown = netem_shown_percent(pct.value)
            policy = self.spell(pct.span, f"{float(pct.value):g}%")
            yield Want(key, shown, policy, pct.span, shown * 1e-6, absent=0.0)
        if q.reorder is not None:
            yield self.count("gap", q.gap) or Want("gap", 1, "1 (tc's default)", q.reorder.span)
        else:
            yield Want("gap", 0, "none", q.span, absent=0)
        for key, time in (("slot", q.slot), ("slot_max", q.slot_max or q.slot)):
            if time is None:
                yield Want(key, 0, "none", q.span, absent=0)
            else:
                us = time.microseconds
                policy = self.spell(time.span, format_time(us))
                yield Want(key, tc_shown_time(us), policy, time.span, absent=0)
        if q.rate is not None:  # tc shows them only when not 0
            for key, count in (("packetoverhead", q.packetoverhead), ("cellsize", q.cellsize)):
                want = self.count(key, count)
                yield replace(want, absent=0) if want else Want(key, 0, "none", q.span, absent=0)

    def default(self, key: str, value: int, span: Span) -> Want:
        """A value the policy leaves to tc's default, which the kernel must then show."""
        return Want(key, value, f"{value} (the default)", span)

    def chosen(self, key: str, value: int | None, span: Span) -> Want | None:
        """A value allocation chose for the policy (an htb's r2q, a class's quantum)."""
        if value is None:
            return None
        return Want(key, value, f"{value} (chosen by tcdsl)", span)

    # ---- classes ----
    def curves(self, cls: ir.Class) -> Iterator[Want]:
        """An hfsc class's curves as the kernel keeps them (tc's umax/dmax form converted; the
        kernel's internal slopes give back the bytes/s and microseconds it was given)."""
        for key, curve in (("rt", cls.rt), ("ls", cls.ls), ("ul", cls.ul)):
            if curve is None:
                yield Want(f"{key}.m2", 0, "none", cls.span, absent=0)
                continue
            words = self.written(curve.span) or f"{key} {' '.join(curve_words(curve))}"
            m1, m2, d = curve.m1_bits, curve.m2.bits_per_second, curve.d_us
            for part, value, text in (
                ("m1", tc_shown_rate(m1), format_rate(m1)),
                ("d", tc_shown_time(d), format_time(d)),
                ("m2", tc_shown_rate(m2), format_rate(m2)),
            ):
                yield Want(f"{key}.{part}", value, f"{text} ({words})", curve.span)

    def klass(self, q: ir.Htb | ir.Cbq | ir.Hfsc, cls: ir.Class, parent: str) -> None:
        assert cls.classid is not None
        leaf = cls.leaf.handle.qdisc if cls.leaf is not None and cls.leaf.handle else None
        wants: list[Want | None] = []
        if isinstance(q, ir.Hfsc):
            wants.extend(self.curves(cls))
        if isinstance(q, ir.Htb):
            wants.append(self.rate("rate", cls.rate))
            if cls.ceil is not None:
                wants.append(self.rate("ceil", cls.ceil))
            elif isinstance(cls.rate, ir.Rate):
                r = cls.rate
                policy = f"{self.spell(r.span, format_rate(r.bits_per_second))}, its rate"
                wants.append(Want("ceil", tc_shown_rate(r.bits_per_second), policy, r.span))
            if not cls.children:  # tc shows prio and quantum of leaf classes only (level 0)
                if cls.prio is not None:
                    wants.append(self.count("prio", cls.prio))
                else:
                    wants.append(Want("prio", 0, "0 (the default)", cls.span))
                if cls.quantum is not None:
                    s = cls.quantum
                    wants.append(
                        Want("quantum", s.bytes, self.spell(s.span, format_size(s.bytes)), s.span)
                    )
                wants.append(self.chosen("quantum", cls.chosen_quantum, cls.span))
            wants.append(self.burst("burst", cls.burst, cls.rate, "htb"))
            ceil = cls.ceil if cls.ceil is not None else cls.rate
            wants.append(self.burst("cburst", cls.cburst, ceil, "htb"))
            # The class's own size accounting, which tcdsl never sets (an overhead goes in the
            # root's size table): one set by hand charges each packet otherwise (found by a
            # tester: 'overhead 100 linklayer atm' on a class, never seen as drift).
            wants.append(Want("overhead", 0, "none (0)", cls.span, absent=0))
            wants.append(Want("linklayer", "ethernet", "ethernet", cls.span, absent="ethernet"))
        self.classes.append(
            ExpectedClass(
                cls.label,
                q.kind,
                str(cls.classid),
                parent,
                leaf,
                cls.span,
                tuple(w for w in wants if w is not None),
            )
        )
        if cls.leaf is not None:
            self.qdisc(cls.leaf, str(cls.classid), f"{cls.leaf.kind} qdisc of {cls.classid}")

    def band(self, q: ir.Prio, cls: ir.Class) -> None:
        assert cls.classid is not None and q.handle is not None
        leaf = cls.leaf.handle.qdisc if cls.leaf is not None and cls.leaf.handle else None
        self.classes.append(
            ExpectedClass(
                cls.label, "prio", str(cls.classid), q.handle.qdisc, leaf, cls.span, created=False
            )
        )
        if cls.leaf is not None:
            self.qdisc(cls.leaf, str(cls.classid), f"{cls.leaf.kind} qdisc of {cls.classid}")


"""The priomap of prio and pfifo_fast when none is given (TOS -> band)."""


POLICE_DEFAULT_MTU = 2047
"""The mtu tc gives a policer without one (m_police.c); tc shows it as 2Kb."""


INGRESS_PARENT = "ffff:fff1"
"""The parent tc shows for an ingress qdisc (TC_H_INGRESS)."""


def police_action(p: ir.Police) -> Action:
    """A policer as :func:`readback.parse_action` reads it back: the rate as tc shows it, the
    burst after its round trip through a time at the rate, the mtu (tc's default if none)."""
    rate = p.rate.bits_per_second
    mtu = p.mtu.bytes if p.mtu is not None else POLICE_DEFAULT_MTU
    return (
        "police",
        tc_shown_rate(rate),
        htb_shown_burst(rate, p.burst.bytes),
        tc_shown_size(mtu),
        p.exceed,
    )


def redirect_filter(iface: ir.Interface) -> ExpectedFilter:
    """The filter that sends a download's arrivals to its IFB."""
    d = iface.download
    assert d is not None
    actions: tuple[Action, ...] = (("connmark",),) if d.connmark else ()
    return ExpectedFilter(
        f"redirect of {d.interface}'s arrivals to {iface.name}",
        "u32",
        ir.INGRESS_HANDLE.qdisc,
        REDIRECT_PREF,
        "",
        d.span,
        expected_keys((("u32", "0", "0", "at", "0"),)),
        words="u32 0 0 at 0",
        protocol="all",
        actions=(*actions, ("mirred", "egress", "redirect", iface.name)),
    )


FAMILY_WORDS: dict[ir.Family, str] = {"ipv4": "IPv4", "ipv6": "IPv6"}
"""How messages name a family."""

FILTER_PROTOCOLS: dict[ir.Family, str] = {"ipv4": "ip", "ipv6": "ipv6"}
"""The ``protocol`` tc shows for a filter of each family."""


def expected_flower(f: ir.FlowerFilter) -> FlowerMatch:
    """What a flower filter should match, normalised as :func:`readback.parse_flower` reads
    it back (an address prefix of length 0 is no key at all)."""

    def net(n: ir.Network | None) -> str | None:
        return None if n is None or n.prefixlen == 0 else str(ip_network(n, strict=False))

    def masked(pair: tuple[int, int] | None) -> tuple[int, int] | None:
        return None if pair is None else (pair[0] & pair[1], pair[1])

    return FlowerMatch(
        eth_type=f.family,
        ip_proto=f.ip_proto,
        src=net(f.src),
        dst=net(f.dst),
        sport=f.sport,
        dport=f.dport,
        tos=masked(f.tos),
        tcp_flags=masked(f.tcp_flags),
    )


def _filters(iface: ir.Interface) -> Iterator[ExpectedFilter]:
    for f in iface.filters:
        family = FAMILY_WORDS[f.family]
        protocol = FILTER_PROTOCOLS[f.family]
        label = f"{family} filter to {f.flowid} (pref {f.pref})"
        if isinstance(iface.root, ir.Ingress):
            label = f"{family} ingress policer (pref {f.pref})"
        match f:
            case ir.U32Filter():
                words = " ".join(" ".join(k.words) for k in f.keys)
                try:
                    keys = expected_keys(tuple(k.words for k in f.keys))
                except UnpackableKey as exc:
                    yield ExpectedFilter(
                        label,
                        "u32",
                        str(f.parent),
                        f.pref,
                        str(f.flowid),
                        f.span,
                        words=words,
                        unpackable=str(exc),
                        protocol=protocol,
                    )
                    continue
                police = (police_action(f.police),) if f.police is not None else ()
                flowid = str(f.flowid)
                if f.parent == ir.CLSACT_EGRESS:  # an mq tree's: sets the TX queue, no class
                    queue = str(f.flowid.minor - 1)
                    label = f"{family} filter to {queue_words(f.flowid)} (pref {f.pref})"
                    flowid, police = "", (("skbedit", "queue_mapping", queue),)
                yield ExpectedFilter(
                    label,
                    "u32",
                    str(f.parent),
                    f.pref,
                    flowid,
                    f.span,
                    keys,
                    words=words,
                    protocol=protocol,
                    actions=police,
                    place=f.place.handle if f.place is not None else "",
                )
            case ir.FlowerFilter():
                police = (police_action(f.police),) if f.police is not None else ()
                flower = expected_flower(f)
                yield ExpectedFilter(
                    label,
                    "flower",
                    str(f.parent),
                    f.pref,
                    str(f.flowid),
                    f.span,
                    words=flower.describe(),
                    protocol=protocol,
                    actions=police,
                    flower=flower,
                )
            case ir.FwFilter():
                label = f"{family} fw filter for mark {f.mark} to {f.flowid} (pref {f.pref})"
                yield ExpectedFilter(
                    label,
                    "fw",
                    str(f.parent),
                    f.pref,
                    str(f.flowid),
                    f.span,
                    mark=f.mark,
                    mask=f.mask,
                    protocol=protocol,
                )
    for t in iface.u32_tables:
        yield ExpectedFilter(
            f"{FAMILY_WORDS[t.family]} link to {table_text(t)} (pref {t.pref})",
            "u32",
            str(t.parent),
            t.pref,
            "",
            t.span,
            expected_keys((LINK_KEY[1:],)),
            words=" ".join(link_words(t)),
            protocol=FILTER_PROTOCOLS[t.family],
            place=t.link.handle,
            link=f"{t.table:x}:",
            hashkey=t.hashkey,
        )


def expected_rule(
    chain: str, conds: tuple[ir.Cond, ...], mark: int, mask: int = U32_MAX
) -> IptRule:
    """The rule the policy means for one mark rule, normalised like ``readback.parse_rule``."""
    rule = IptRule(chain, mark=(0, mask), target="MARK", set_mark=(mark, mask))
    values: dict[str, object] = {}
    for cond in conds:
        match cond:
            case ir.ProtoCond():
                values["protocol"] = cond.protocols[0][0]
            case ir.AddrCond():
                net = cond.networks[0][0]
                values["src" if cond.field == "src" else "dst"] = (
                    None if net.prefixlen == 0 else str(net)
                )
            case ir.PortCond():
                port = cond.ports[0]
                values[cond.field] = (port.lo, port.hi)
            case ir.TcpFlagsCond():
                values.setdefault("protocol", 6)
                values["tcp_flags"] = (cond.value, cond.mask)
            case ir.TosCond():
                if cond.dscp is not None:
                    values["dscp"] = cond.dscp
                else:
                    values["tos"] = (cond.value, cond.mask)
            case _:
                pass  # checks (E209) reject what iptables cannot say
    return _replace_rule(rule, values)


def _replace_rule(rule: IptRule, values: Mapping[str, object]) -> IptRule:
    return replace(rule, **values)  # type: ignore[arg-type]


def _chains(iface: ir.Interface) -> Iterator[ExpectedChain]:
    """The marking chain in iptables (IPv4) and in ip6tables (IPv6), for each family the tree
    marks: the same name, jumps and rules (each table's rules for its own family)."""
    m = iface.marking
    if m is None or m.chain is None:
        return
    by_mark: dict[int, str] = {}
    for q in ir.walk_qdiscs(iface.root):
        for c in ir.classes_of(q):
            if c.fwmark is not None and c.fwmark not in by_mark:
                by_mark[c.fwmark] = c.label
    for family in iface.families:
        # An IPv4 object keeps its plain name; an IPv6 one says so.
        prefix = "" if family == "ipv4" else "IPv6 "
        tool = "" if family == "ipv4" else "ip6tables "
        hook = m.hook.upper()
        more: list[ExpectedRule] = []
        if iface.download is not None:
            first, *others = DOWNLOAD_HOOKS
            on = m.from_interface or "every interface"
            for other in others:
                label = f"jump from {other} on {on} to {tool}chain {m.chain}"
                more.append(
                    ExpectedRule(
                        label, IptRule(other, in_iface=m.from_interface, target=m.chain), m.span
                    )
                )
            jump_rule = IptRule(first, in_iface=m.from_interface, target=m.chain)
            where = f"{first} on {on}"
        elif m.hook != "prerouting":
            jump_rule = IptRule(hook, out_iface=iface.name, target=m.chain)
            where = f"{hook} out of {iface.name}"
        else:
            jump_rule = IptRule(hook, in_iface=m.from_interface, target=m.chain)
            where = f"{hook} on {m.from_interface or 'every interface'}"
        jump = ExpectedRule(f"jump from {where} to {tool}chain {m.chain}", jump_rule, m.span)
        rules = []
        for rule in m.rules:
            if rule.family != family:
                continue
            if rule.unmarked:
                label = f"{prefix}mark rule for unmarked traffic"
            else:
                owner = by_mark.get(rule.mark)
                label = f"{prefix}mark rule" + (
                    f" for {owner.removeprefix('class ')}" if owner else ""
                )
            rule_words = expected_rule(m.chain, rule.conds, rule.mark, m.mask_value)
            rules.append(ExpectedRule(label, rule_words, rule.span))
        for d in m.dscp_rules:
            if d.family != family:
                continue
            dscp_rule = IptRule(
                m.chain, mark=(d.mark, m.mask_value), target="DSCP", set_dscp=d.dscp
            )
            rules.append(ExpectedRule(f"{prefix}DSCP rule for mark {d.mark}", dscp_rule, d.span))
        if iface.download is not None:
            mask = m.mask.value if m.mask is not None else 0xFFFFFFFF
            save = IptRule(m.chain, target="CONNMARK", save_mark=(mask, mask))
            label = f"{prefix}rule saving the mark on the connection"
            rules.append(ExpectedRule(label, save, m.span))
        yield ExpectedChain(m.chain, m.span, jump, tuple(rules), tuple(more), family)


_QDISC_WORDS = {
    "htb": "the htb qdisc",
    "prio": "the prio qdisc",
    "cbq": "the cbq qdisc",
    "tbf": "the tbf qdisc",
    "netem": "the netem qdisc",
    "sfq": "the sfq qdisc",
    "fq_codel": "the fq_codel qdisc",
    "pfifo": "the pfifo qdisc",
    "bfifo": "the bfifo qdisc",
    "pfifo_fast": "the pfifo_fast qdisc",
    "ingress": "the ingress qdisc",
    "hfsc": "the hfsc qdisc",
    "cake": "the cake qdisc",
    "codel": "the codel qdisc",
    "fq": "the fq qdisc",
    "fq_pie": "the fq_pie qdisc",
    "red": "the red qdisc",
    "mq": "the mq qdisc",
}


def requirements(policy: ir.Policy) -> tuple[Requirement, ...]:
    """The kernel features and tools ``policy`` needs, each with the first text needing it."""
    found: dict[str, Requirement] = {}
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            feature = f"sch_{q.kind}"
            found.setdefault(feature, Requirement(feature, _QDISC_WORDS[q.kind], q.span))
        if ir.mq_steers(iface):
            span = iface.root.span
            found.setdefault("sch_clsact", Requirement("sch_clsact", "the clsact qdisc", span))
            steering = next((f for f in iface.filters if f.parent == ir.CLSACT_EGRESS), None)
            if steering is not None:
                what = "the skbedit action (queue_mapping)"
                found.setdefault("act_skbedit", Requirement("act_skbedit", what, steering.span))
        for f in iface.filters:
            match f:
                case ir.U32Filter():
                    found.setdefault("cls_u32", Requirement("cls_u32", "u32 filters", f.span))
                case ir.FlowerFilter():
                    where = iface.classifier_span or f.span  # 'classifier flower'
                    req = Requirement("cls_flower", "flower filters", where)
                    found.setdefault("cls_flower", req)
                case ir.FwFilter():
                    # at the line that asks for them (found by a tester: a class's)
                    where = iface.marking.span if iface.marking is not None else f.span
                    found.setdefault("cls_fw", Requirement("cls_fw", "fw filters", where))
        if iface.download is not None:
            d = iface.download
            found.setdefault("ifb", Requirement("ifb", "ifb devices", d.span))
            found.setdefault("sch_ingress", Requirement("sch_ingress", "the ingress qdisc", d.span))
            found.setdefault("act_mirred", Requirement("act_mirred", "the mirred action", d.span))
            if d.connmark:
                what = "the connmark action"
                found.setdefault("act_connmark", Requirement("act_connmark", what, d.span))
        for f in iface.filters:
            if isinstance(f, ir.U32Filter | ir.FlowerFilter) and f.police is not None:
                what = "the police action"
                found.setdefault("act_police", Requirement("act_police", what, f.police.span))
        if iface.marking is not None:
            for family in iface.families:
                tool = "iptables" if family == "ipv4" else "ip6tables"
                what = f"{tool} (the mangle table, mark match and MARK target)"
                found.setdefault(tool, Requirement(tool, what, iface.marking.span))
    return tuple(found.values())


def expected_policy(policy: ir.Policy, sources: Mapping[str, str] | None = None) -> ExpectedPolicy:
    """Everything an allocated ``policy`` should create in the kernel, as tc shows it.

    ``sources`` (file -> text, as ``Result.sources``) lets messages quote how the policy wrote
    a value (``LINK (12mbit)``); without it values are spelled canonically.
    """
    devices: dict[str, ExpectedInterface] = {}

    def add(found: ExpectedInterface) -> None:
        # Trees on one device (an upload and its interface's ingress) are read back together.
        old = devices.get(found.name)
        if old is None:
            devices[found.name] = found
            return
        devices[found.name] = replace(
            old,
            qdiscs=old.qdiscs + found.qdiscs,
            classes=old.classes + found.classes,
            filters=old.filters + found.filters,
            chains=old.chains or found.chains,
            mark_from=old.mark_from or found.mark_from,
        )

    for iface in policy.interfaces:
        b = _Builder(sources or {})
        if isinstance(iface.root, ir.Ingress):
            label = f"ingress qdisc of {iface.name}"
            b.qdiscs.append(
                ExpectedQdisc(label, "ingress", "ffff:", INGRESS_PARENT, iface.root.span)
            )
        else:
            b.qdisc(iface.root, "root", f"{iface.root.kind} qdisc of {iface.name}")
            if ir.mq_steers(iface):  # after the mq, as the commands make it
                label = "clsact qdisc (TX queue steering)"
                clsact = ExpectedQdisc(label, "clsact", "ffff:", "ffff:fff1", iface.root.span)
                b.qdiscs.insert(1, clsact)
            # the size table is the root's; an mq's is each queue's qdisc's (they queue)
            mq = iface.root.handle if isinstance(iface.root, ir.Mq) else None
            for n, q in enumerate(b.qdiscs):
                queue = mq is not None and q.parent.startswith(f"{mq.major:x}:")
                if n == 0 or queue:
                    stab = iface.stab if (mq is None) == (n == 0) else None
                    b.qdiscs[n] = replace(q, wants=q.wants + tuple(b.stab(stab, q.span)))
        add(
            ExpectedInterface(
                iface.name,
                iface.span,
                tuple(b.qdiscs),
                tuple(b.classes),
                tuple(_filters(iface)),
                tuple(_chains(iface)),
                iface.marking.from_interface if iface.marking else None,
            )
        )
        if iface.download is not None:
            d = iface.download
            ingress = ExpectedQdisc(
                f"ingress qdisc of {d.interface} (for its download)",
                "ingress",
                "ffff:",
                INGRESS_PARENT,
                d.span,
            )
            add(ExpectedInterface(d.interface, d.span, (ingress,), (), (redirect_filter(iface),)))
    interfaces = list(devices.values())
    return ExpectedPolicy(policy.source, tuple(interfaces), requirements(policy))


def approx_equal(shown: Value, want: Want) -> bool:
    """Whether a shown value agrees with ``want`` (within its tolerance for numbers)."""
    if isinstance(shown, bool) or isinstance(want.value, bool):
        return shown == want.value
    if isinstance(shown, int | float) and isinstance(want.value, int | float):
        return math.isclose(shown, want.value, rel_tol=0, abs_tol=want.tolerance + 1e-9)
    return shown == want.value
