"""Semantic checks: each is a function from a resolved policy to the diagnostics it finds.

A check never raises for a user error and reports every instance it finds. Checks are named
for the invariant they enforce; ``CHECKS`` lists them in the order the driver runs them.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tcdsl import directions, families, ir, linklayer
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.tcmath import (
    DEFAULT_PRIOMAP,
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
from tcdsl.units import format_rate, format_time

Check = Callable[[ir.Policy], Iterator[Diagnostic]]


class Site(NamedTuple):
    """A class in context: its interface, the qdisc that owns it, and its parent class.

    (A named tuple, not a frozen dataclass: there is one for each class of a large policy,
    and a tuple is made several times faster.)"""

    iface: ir.Interface
    qdisc: ir.ClassfulQdisc
    cls: ir.Class
    parent: ir.Class | None


def sites(policy: ir.Policy) -> tuple[Site, ...]:
    """Every class of every classful qdisc, pre-order, with its context."""
    cached = _SITES.get(id(policy))
    if cached is not None and cached[0] is policy:
        return cached[1]
    found: list[Site] = []
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
                parents = ir.parent_map(q)
                found.extend(Site(iface, q, cls, parents[id(cls)]) for cls in ir.classes_of(q))
    # The checks all walk the same policy; keep the last walk (the policy is immutable).
    _SITES.clear()
    _SITES[id(policy)] = (policy, tuple(found))
    return _SITES[id(policy)][1]


_SITES: dict[int, tuple[ir.Policy, tuple[Site, ...]]] = {}


_BELOW_ONE = " (this is below 1bit a second; tc keeps rates in whole bytes a second: 8bit at least)"
"""What E208 adds for a rate of 0: a rate written as a fraction of a bit (found by a tester:
'rate 0.0000001mbit' was said to be 0bit, with no word of why)."""


def rate_of(value: ir.Rate | ir.Percent | None) -> ir.Rate | None:
    """The absolute rate of a resolved value (percentages are gone after resolve)."""
    return value if isinstance(value, ir.Rate) else None


def effective_ceil(cls: ir.Class) -> ir.Rate | None:
    """A class's ceiling: ``ceil`` if given, else its rate (as the kernel does)."""
    return rate_of(cls.ceil) or rate_of(cls.rate)


def _fmt(rate: ir.Rate | int) -> str:
    return format_rate(rate if isinstance(rate, int) else rate.bits_per_second)


# ---- parameters each kind needs and accepts ---------------------------------------------------


def required_parameters_present(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Every qdisc and class has the parameters the kernel requires of its kind."""
    for s in sites(policy):
        cls = s.cls
        if s.qdisc.kind in ("htb", "cbq") and cls.rate is None and not cls.implicit:
            yield Diagnostic.error("E019", f"{cls.label} needs a rate", cls.span)
        if s.qdisc.kind == "cbq" and cls.allot is None and cls.avpkt is None:
            yield Diagnostic.error(
                "E019", f"{cls.label} needs 'allot' or 'avpkt' (tc requires one for cbq)", cls.span
            )
        burst = cls.maxburst or cls.minburst
        if s.qdisc.kind == "cbq" and burst is not None and cls.avpkt is None:
            # (found by a tester: tc refused the class, 'CBQ: avpkt is required for
            # max/minburst', which check had let through)
            word = "maxburst" if cls.maxburst is not None else "minburst"
            yield Diagnostic.error(
                "E019",
                f"{cls.label} needs 'avpkt' with '{word}': tc computes the idle times from it "
                "and refuses the class without ('avpkt is required for max/minburst')",
                burst.span,
            )
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            match q:
                case ir.Tbf():
                    missing = [k for k in ("rate", "burst") if getattr(q, k) is None]
                    if missing:
                        names = " and ".join(f"'{k}'" for k in missing)
                        yield Diagnostic.error("E019", f"tbf needs {names}", q.span)
                    if q.peakrate is not None and q.mtu is None:
                        yield Diagnostic.error(
                            "E019", "tbf 'peakrate' needs 'mtu' (tc requires both)", q.peakrate.span
                        )
                    if (
                        q.peakrate is not None
                        and q.rate is not None
                        and q.peakrate.bits_per_second // 8 <= q.rate.bits_per_second // 8
                    ):
                        # (found by a tester: the kernel refuses it, EINVAL, half-way through
                        # the script)
                        yield Diagnostic.error(
                            "E019",
                            f"tbf 'peakrate' {format_rate(q.peakrate.bits_per_second)} is not "
                            f"above its rate {format_rate(q.rate.bits_per_second)}: the kernel "
                            "refuses it (a peakrate caps the bursts "
                            "above the rate); raise it or leave it out",
                            q.peakrate.span,
                        )
                    if (q.latency is None) == (q.limit is None):
                        yield Diagnostic.error(
                            "E019", "tbf needs exactly one of 'latency' or 'limit'", q.span
                        )
                case ir.Cbq():
                    if q.bandwidth is None or q.avpkt is None:
                        yield Diagnostic.error("E019", "cbq needs 'bandwidth' and 'avpkt'", q.span)
                case ir.Netem():
                    if q.jitter is not None and q.delay is None:
                        yield Diagnostic.error(
                            "E019", "netem 'jitter' needs a 'delay'", q.jitter.span
                        )
                    yield from _netem_needs(q)
                case ir.Red():
                    missing = [k for k in ("limit", "avpkt") if getattr(q, k) is None]
                    if missing:
                        names = " and ".join(f"'{k}'" for k in missing)
                        yield Diagnostic.error("E019", f"red needs {names}", q.span)
                case _:
                    pass


def _given(value: ir.Time | ir.Percent | ir.Count | None) -> bool:
    """A netem value tc counts as given (tc takes 0 for 'not given'); a percentage may be
    written without '%' (tc reads ``loss 1`` as 1%)."""
    match value:
        case ir.Time():
            return value.microseconds > 0
        case ir.Percent() | ir.Count():
            return value.value > 0
        case _:
            return False


def _netem_needs(q: ir.Netem) -> Iterator[Diagnostic]:
    """netem options that only work with another one (tc refuses or has no place for them)."""
    delay = "a 'delay'" if not _given(q.delay) else None
    jitter = "a 'jitter'" if not _given(q.jitter) else None
    needs: list[tuple[str, object, str | None]] = [
        ("distribution", q.distribution, "a 'delay' and a 'jitter'" if delay or jitter else None),
        ("delay_correlation", q.delay_correlation, jitter),
        ("loss_correlation", q.loss_correlation, None if _given(q.loss) else "a 'loss'"),
        ("reorder", q.reorder, delay),
        (
            "reorder_correlation",
            q.reorder_correlation,
            None if _given(q.reorder) else "a 'reorder'",
        ),
        ("gap", q.gap, None if _given(q.reorder) else "a 'reorder'"),
        ("slot_max", q.slot_max, None if q.slot is not None else "a 'slot'"),
        ("packetoverhead", q.packetoverhead, None if q.rate is not None else "a 'rate'"),
        ("cellsize", q.cellsize, None if q.rate is not None else "a 'rate'"),
    ]
    for name, value, missing in needs:
        span = getattr(value, "span", None)
        if span is not None and missing is not None:
            yield Diagnostic.error("E019", f"netem '{name}' needs {missing} above 0", span)
    if q.slot and q.slot_max and q.slot_max.microseconds < q.slot.microseconds:
        yield Diagnostic.error(
            "E240",
            f"netem slot_max {format_time(q.slot_max.microseconds)} is below slot "
            f"{format_time(q.slot.microseconds)}; tc refuses it",
            q.slot_max.span,
            Note("slot given here", q.slot.span),
        )


def values_in_range(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Priorities, bands, marks and counts are inside the ranges the kernel accepts."""
    for s in sites(policy):
        cls = s.cls
        if cls.prio is not None:
            lo, hi = (1, 8) if s.qdisc.kind == "cbq" else (0, 7)
            if not lo <= cls.prio.value <= hi:
                yield Diagnostic.error(
                    "E205",
                    f"{s.qdisc.kind} class prio {cls.prio.value} is outside {lo}-{hi}",
                    cls.prio.span,
                )
        if cls.mark is not None and not 1 <= cls.mark.value <= 0xFFFFFFFF:
            yield Diagnostic.error(
                "E207",
                f"mark {cls.mark.value} is out of range 1-4294967295 (0 means unmarked)",
                cls.mark.span,
            )
        for name in ("rate", "ceil"):
            value = rate_of(getattr(cls, name))
            if value is not None and value.bits_per_second == 0:
                yield Diagnostic.error("E208", f"{name} must be above 0bit{_BELOW_ONE}", value.span)
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Prio):
                bands = q.bands.value if q.bands else 3
                if q.bands is not None and not 2 <= bands <= 16:
                    yield Diagnostic.error(
                        "E205", f"prio bands {bands} is outside 2-16", q.bands.span
                    )
                if q.priomap is not None:
                    if len(q.priomap) != 16:
                        yield Diagnostic.error(
                            "E205",
                            f"priomap needs 16 values (one band for each priority 0-15), "
                            f"found {len(q.priomap)}",
                            q.priomap[0].span,
                        )
                    for v in q.priomap:
                        if v.value >= bands:
                            yield Diagnostic.error(
                                "E205",
                                f"priomap band {v.value} does not exist (bands are 0-{bands - 1})",
                                v.span,
                            )
                if len(q.classes) > bands:
                    count = len(q.classes)
                    fix = (
                        f"write 'bands {count}' on the prio"
                        if count <= 16
                        else "a prio takes at most 16 bands: nest a prio in a class for more"
                    )
                    default = " (its default)" if q.bands is None else ""
                    yield Diagnostic.error(
                        "E205",
                        f"prio has {bands} bands{default} but {count} classes: {fix}",
                        q.classes[bands].span,
                    )
            if isinstance(q, ir.Sfq):
                yield from _sfq_limits(q)
            if isinstance(q, ir.Htb) and q.r2q is not None and q.r2q.value < 1:
                yield Diagnostic.error("E205", "r2q must be at least 1", q.r2q.span)
            if isinstance(q, ir.Netem):
                for pct in (q.loss, q.duplicate, q.corrupt):
                    if pct is not None and pct.value > 100:
                        yield Diagnostic.error("E208", f"{pct.value}% is above 100%", pct.span)


MAX_RATE = (2**64 - 1) * 8  # tc keeps rates as 64-bit bytes per second


_SKIP_FIELDS = frozenset({"span", "explicit_handle", "explicit_id", "handle", "classid", "kind"})
CLASS_VALUE_FIELDS = ("rate", "ceil", "burst", "cburst", "prio", "quantum", "allot", "avpkt")


_VALUES = (ir.Rate, ir.Size, ir.Time, ir.Count)


def _node_values(node: object) -> Iterator[tuple[str, object]]:
    fields, read = _value_fields(type(node))
    for name, value in zip(fields, read(node), strict=True):
        if value is not None and isinstance(value, _VALUES):
            yield name, value


_Reader = Callable[[object], tuple[object, ...]]
_FIELDS: dict[type, tuple[tuple[str, ...], _Reader]] = {}


def _value_fields(kind: type) -> tuple[tuple[str, ...], _Reader]:
    """The fields of a node type that may hold a value, and a function reading them all from
    a node at once (worked out once per type, not per node: most of a node's fields are
    None, and a large policy has tens of thousands of leaf qdiscs)."""
    found = _FIELDS.get(kind)
    if found is None:
        fields = tuple(n for n in getattr(kind, "__slots__", ()) if n not in _SKIP_FIELDS)
        read: _Reader
        if len(fields) == 1:  # attrgetter of one name returns the value, not a 1-tuple
            read = lambda node: (getattr(node, fields[0]),)  # noqa: E731
        else:
            read = operator.attrgetter(*fields) if fields else lambda node: ()
        found = _FIELDS[kind] = (fields, read)
    return found


_CLASS_VALUES = operator.attrgetter(*CLASS_VALUE_FIELDS)


def values_fit_the_kernel(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Numbers fit the fields tc and the kernel keep them in (tc would refuse or wrap them)."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            for name, value in _node_values(q):
                if (found := _misfit(q, name, value, q)) is not None:
                    yield found
            for cls in ir.classes_of(q):
                values = _CLASS_VALUES(cls)
                for name, value in zip(CLASS_VALUE_FIELDS, values, strict=True):
                    if value is not None and (found := _misfit(cls, name, value, q)) is not None:
                        yield found


def _misfit(owner: ir.Qdisc | ir.Class, name: str, value: object, q: ir.Qdisc) -> Diagnostic | None:
    """The diagnostic for a value of ``owner`` (``q`` or one of its classes) that does not
    fit, if it does not (a function, not a generator: it runs for every value of a policy)."""
    if (
        type(value) is ir.Rate
        and 8 <= value.bits_per_second <= MAX_RATE
        and (value.bits_per_second <= U32_MAX * 8 or not isinstance(q, ir.Cbq))
    ):
        return None  # the common case, which no case below reports
    match value:
        case ir.Rate() if value.bits_per_second > MAX_RATE:
            return Diagnostic.error(
                "E208", f"{name} of {_what(owner)} is too large for tc", value.span
            )
        case ir.Rate() if 0 < value.bits_per_second < 8:
            return Diagnostic.error(
                "E208",
                f"{name} {value.bits_per_second}bit of {_what(owner)} is below 8bit; "
                "tc keeps rates in whole bytes per second",
                value.span,
            )
        case ir.Rate() if isinstance(q, ir.Cbq) and value.bits_per_second > U32_MAX * 8:
            # (found by a tester: tc says 'Illegal "rate"'; cbq has no 64-bit rates)
            return Diagnostic.error(
                "E208",
                f"{name} {_fmt(value)} of {_what(owner)} is above tc's limit for cbq, "
                f"{U32_MAX} bytes per second (about 34.36gbit: cbq's rates are 32-bit)",
                value.span,
            )
        case ir.Rate() if value.bits_per_second == 0 and isinstance(q, ir.Tbf | ir.Netem | ir.Cbq):
            return Diagnostic.error(
                "E208", f"{name} of {_what(owner)} must be above 0bit{_BELOW_ONE}", value.span
            )
        case ir.Size() if value.bytes > U32_MAX:
            msg = (
                f"{name} of {_what(owner)} is {value.bytes} bytes; tc takes at most {U32_MAX} "
                "(4g - 1)"
            )
            return Diagnostic.error("E208", msg, value.span)
        case ir.Size() if value.bytes == 0 and name in ("burst", "cburst", "quantum", "mtu"):
            return Diagnostic.error("E208", f"{name} of {_what(owner)} must be above 0", value.span)
        case ir.Time() if value.microseconds > U32_MAX:
            msg = f"{name} of {_what(owner)} is above tc's limit of {U32_MAX}us (about 71 minutes)"
            return Diagnostic.error("E208", msg, value.span)
        case ir.Count() if value.value > U32_MAX:
            msg = f"{name} {value.value} of {_what(owner)} is above tc's limit of {U32_MAX}"
            return Diagnostic.error("E208", msg, value.span)
        case ir.Count() if name == "flows" and not 1 <= value.value <= 65536:
            msg = f"{q.kind} flows {value.value} is outside 1-65536"
            return Diagnostic.error("E205", msg, value.span)
        case _:
            return None


def _what(owner: ir.Qdisc | ir.Class) -> str:
    """How a value's message names its owner: a class by its label, a qdisc by its kind."""
    return owner.label if isinstance(owner, ir.Class) else owner.kind


SFQ_MAX_DEPTH = 127  # packets per flow (SFQ_MAX_DEPTH in sch_sfq.c)
SFQ_DEFAULT_FLOWS = 128


def _sfq_limits(q: ir.Sfq) -> Iterator[Diagnostic]:
    if q.depth is not None and not 1 <= q.depth.value <= SFQ_MAX_DEPTH:
        msg = f"sfq depth {q.depth.value} is outside 1-{SFQ_MAX_DEPTH} (packets per flow)"
        yield Diagnostic.error("E205", msg, q.depth.span)
        return
    if q.divisor is not None and (
        q.divisor.value < 1 or q.divisor.value > 65536 or q.divisor.value & (q.divisor.value - 1)
    ):
        msg = f"sfq divisor {q.divisor.value} is not a power of two up to 65536"
        yield Diagnostic.error("E205", msg, q.divisor.span)
        return
    if q.limit is not None:
        depth = q.depth.value if q.depth else SFQ_MAX_DEPTH
        flows = min(SFQ_DEFAULT_FLOWS, q.divisor.value if q.divisor else 1024)
        cap = depth * flows
        if q.limit.value > cap:
            yield Diagnostic.warning(
                "W305",
                f"sfq limit {q.limit.value} is above depth x flows = {depth} x {flows}; "
                f"the kernel lowers it to {cap}",
                q.limit.span,
            )


# ---- rates -------------------------------------------------------------------------------------


def ceil_not_below_rate(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A class's ceil is at least its rate."""
    for s in sites(policy):
        rate, ceil = rate_of(s.cls.rate), rate_of(s.cls.ceil)
        if rate is not None and ceil is not None and ceil.bits_per_second < rate.bits_per_second:
            yield Diagnostic.error(
                "E202",
                f"ceil {_fmt(ceil)} is below rate {_fmt(rate)}",
                ceil.span,
                Note("rate given here", rate.span),
            )


@dataclass(frozen=True, slots=True)
class Overbooking:
    """Children guaranteed ``total`` bits/s under a parent that has ``limit`` for them."""

    total: int
    limit: ir.Rate
    what: str
    """How messages name the limit: ``its rate``, ``its ceil`` or ``the bandwidth``."""
    shares: tuple[tuple[int, int], ...] | None = None
    """What the children get of their rates (percent, rounded to the nearest) when the link
    gives them ``limit`` alone, by prio, the lowest number first: htb serves the leaves within
    their rates in prio order (tested on the kernel: 6mbit at prio 0 and 6mbit at prio 1 on a
    10mbit link got 6 and 4). None where ``limit`` is less than the link (a class within its
    rate sends whatever its parent's rate, so no figure holds) or a child is an inner class
    (its leaves' rates and prios share the link, not its own)."""

    def __str__(self) -> str:
        above = (
            f"{_fmt(self.total - self.limit.bits_per_second)} above {self.what} {_fmt(self.limit)}"
        )
        if self.shares is None:
            return (
                f"{above}: htb keeps each child's rate even past its parent's, so the "
                "guarantees hold while the link has room, and shrink, the highest prio numbers "
                "first, only when it is full"
            )
        when = f"when only {_fmt(self.limit)} is there for them, under full load"
        if len(self.shares) == 1:
            return f"{above}: {when} each gets about {self.shares[0][1]}% of its rate"
        said = ", ".join(
            f"prio {prio} {'all of' if share == 100 else f'about {share}% of'} their rates"
            for prio, share in self.shares
        )
        return f"{above}: {when} the lowest prio numbers get theirs first: {said}"


def _cbq_overbooking(tops: tuple[ir.Class, ...], total: int, bandwidth: ir.Rate) -> Overbooking:
    """Top-level cbq classes over-booking the bandwidth (the link's speed)."""
    leaves = not any(c.children for c in tops)
    shares = _shares(tops, bandwidth.bits_per_second, total) if leaves else None
    return Overbooking(total, bandwidth, "the bandwidth", shares)


def link_rate(qdisc: ir.Qdisc) -> ir.Rate | None:
    """The rate of the link class of ``qdisc`` (``interface eth0 htb rate 10mbit``): the
    link's speed as the policy says it; None where it has none."""
    classes = qdisc.classes if isinstance(qdisc, ir.Htb | ir.Hfsc) else ()
    if len(classes) == 1 and classes[0].implicit:
        return rate_of(classes[0].rate)
    return None


def _equal_share(limit: int, total: int) -> int:
    """The percent of its rate each child gets where ``total`` over-books ``limit`` equally:
    rounded to the nearest (76.9% is about 77%), and below 100 (the total is above it)."""
    return min((limit * 200 + total) // (2 * total), 99)


def _shares(children: tuple[ir.Class, ...], limit: int, total: int) -> tuple[tuple[int, int], ...]:
    """(prio, percent of its rate) for the children's prios, as :attr:`Overbooking.shares`."""
    by_prio: dict[int, int] = {}
    for c in children:
        if (r := rate_of(c.rate)) is not None:
            prio = c.prio.value if c.prio is not None else 0
            by_prio[prio] = by_prio.get(prio, 0) + r.bits_per_second
    if len(by_prio) == 1:
        return ((next(iter(by_prio)), _equal_share(limit, total)),)
    left = limit
    out = []
    for prio, rates in sorted(by_prio.items()):
        got = min(left, rates)
        # "all" only where all fit (found by a review: 10001kbit in 10mbit was 'all')
        out.append((prio, 100 if got == rates else min((got * 200 + rates) // (2 * rates), 99)))
        left -= got
    return tuple(out)


def children_overbook(
    cls: ir.Class, link: ir.Rate | None, sole: bool = False, htb: bool = True
) -> Overbooking | None:
    """How the children of ``cls`` over-book it (their rates add up to more than its rate; the
    limit named is its ceil when they pass that too), or None. ``link`` is the link's rate
    (:func:`link_rate`); ``sole``: ``cls`` is the one class below the link class. Under htb
    the shares are said only for the link class's children, or a sole class's that has the
    whole link (another class below the link class would take its part of it: found by a
    review); under cbq (``htb`` False), as an equal share of the limit, as before."""
    parent_rate = rate_of(cls.rate)
    total = sum(r.bits_per_second for c in cls.children if (r := rate_of(c.rate)) is not None)
    if parent_rate is None or total <= parent_rate.bits_per_second:
        return None
    ceil = effective_ceil(cls)
    limit, what = parent_rate, "its rate"
    if ceil is not None and total > ceil.bits_per_second and ceil is not parent_rate:
        limit, what = ceil, "its ceil"
    shares: tuple[tuple[int, int], ...] | None = None
    # The leaves' rates and prios share the link: an inner child's say nothing of it.
    leaves = not any(c.children for c in cls.children)
    whole = cls.implicit or (
        sole and link is not None and limit.bits_per_second >= link.bits_per_second
    )
    if not htb:
        shares = ((0, _equal_share(limit.bits_per_second, total)),)
    elif leaves and whole:
        shares = _shares(cls.children, limit.bits_per_second, total)
    return Overbooking(total, limit, what, shares)


def _beyond_tc(cls: ir.Class) -> bool:
    """Whether ``cls`` or a child has a rate too large for tc (E208), from which no sum
    says anything (found by a tester: W350 beside the E208, of a rate of 99999999999999tbit)."""
    rates = (rate_of(c.rate) for c in (cls, *cls.children))
    return any(r is not None and r.bits_per_second > MAX_RATE for r in rates)


def overbooking_is_declared(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Children guaranteed more than their parent's rate (or ceil), or top-level cbq classes
    more than the bandwidth, say ``overbook`` on the parent (warning W350); an ``overbook``
    that over-books nothing is a warning too (W351)."""
    trees = len(policy.interfaces) > 1
    for s in sites(policy):
        parent_rate = rate_of(s.cls.rate)
        if parent_rate is None or s.qdisc.kind == "prio":
            continue
        # a leaf class over-books nothing (its children's rates add up to 0)
        sole = s.parent is not None and s.parent.implicit and len(s.parent.children) == 1
        over = (
            children_overbook(s.cls, link_rate(s.qdisc), sole, s.qdisc.kind == "htb")
            if s.cls.children
            else None
        )
        if over is not None and not s.cls.overbook and not _beyond_tc(s.cls):
            last = s.cls.children[-1]
            # subscribers' rates come from a table's rows: the statement's class is the place
            at = last.span
            if last.from_table:
                at = s.cls.span if s.cls.implicit else s.cls.head
            yield Diagnostic.warning(
                "W350",
                f"children of {s.cls.label}{f' ({s.iface.label})' if trees else ''} are "
                f"guaranteed {_fmt(over.total)} in all, {over}; write 'overbook' on "
                f"{'the interface line' if s.cls.implicit else 'the class'} if this is on "
                "purpose",
                at,
                Note(f"{over.what[4:]} given here", over.limit.span),
            )
        elif over is None and s.cls.overbook:
            total = sum(r.bits_per_second for c in s.cls.children if (r := rate_of(c.rate)))
            yield Diagnostic.warning(
                "W351",
                f"'overbook' on {s.cls.label}, whose children are guaranteed {_fmt(total)} "
                f"of its rate {_fmt(parent_rate)}: nothing is over-booked",
                s.cls.span,
            )
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Cbq) and q.bandwidth is not None:
                tops = [r for c in q.classes if (r := rate_of(c.rate)) is not None]
                total = sum(r.bits_per_second for r in tops)
                if tops and total > q.bandwidth.bits_per_second and not q.overbook:
                    yield Diagnostic.warning(
                        "W350",
                        f"top-level cbq classes are guaranteed {_fmt(total)} in all, "
                        f"{_cbq_overbooking(q.classes, total, q.bandwidth)}; write 'overbook' "
                        "on the cbq's line if this is on purpose",
                        tops[-1].span,
                        Note("bandwidth given here", q.bandwidth.span),
                    )
                elif q.overbook and total <= q.bandwidth.bits_per_second:
                    yield Diagnostic.warning(
                        "W351",
                        f"'overbook' on a cbq whose top-level classes are guaranteed "
                        f"{_fmt(total)} of its bandwidth {_fmt(q.bandwidth)}: nothing is "
                        "over-booked",
                        q.span,
                    )


def htb_ceiling(cls: ir.Class, root: bool) -> ir.Rate | None:
    """The most an htb class sends: its ceil (its rate without one); a root class's rate, as
    it has no parent to borrow from (``root``: no class is above it)."""
    return rate_of(cls.rate) if root else effective_ceil(cls)


def top_class(cls: ir.Class, q: ir.ClassfulQdisc) -> bool:
    """Whether no class of ``q`` is above ``cls``."""
    return any(c is cls for c in q.classes)


def ceil_within_parent_ceil(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A class's ceil above its parent's can never be reached (warning); nor one above the
    rate of a class no class is above, which has nothing to borrow from (found by a tester:
    the diagrams said such a class borrowed, and W301 measured its children against its
    ceil)."""
    for s in sites(policy):
        if s.qdisc.kind != "htb":
            continue
        ceil = rate_of(s.cls.ceil)
        if s.parent is None:
            rate = rate_of(s.cls.rate)
            if ceil is None or rate is None or ceil.bits_per_second <= rate.bits_per_second:
                continue
            if s.cls.implicit:
                # A ceil written on the htb's line (found by a tester: nothing said so).
                yield Diagnostic.warning(
                    "W301",
                    f"ceil {_fmt(ceil)} can never be reached: the interface's link class has "
                    f"no parent to borrow from, so it sends at most its rate {_fmt(rate)}; "
                    "write the link's speed as the rate, and leave out the ceil",
                    ceil.span,
                    Note("its rate given here", rate.span),
                )
                continue
            yield Diagnostic.warning(
                "W301",
                f"ceil {_fmt(ceil)} can never be reached: {s.cls.label} is a root class of its "
                f"htb (no class is above it: the htb's line gives no rate, so there is no link "
                f"class) and has nothing to borrow from, so it sends at most its rate "
                f"{_fmt(rate)}; give the htb a rate (a link class to borrow from), or write "
                "ceil = rate",
                ceil.span,
                Note("its rate given here", rate.span),
            )
            continue
        parent_ceil = htb_ceiling(s.parent, top_class(s.parent, s.qdisc))
        if (
            ceil is not None
            and parent_ceil is not None
            and ceil.bits_per_second > parent_ceil.bits_per_second
        ):
            # a root class's rate, where its ceil is above it (the link class's too)
            below = effective_ceil(s.parent)
            root = below is not None and below.bits_per_second > parent_ceil.bits_per_second
            what = "rate" if root else "ceiling"
            why = " (it has no parent to borrow from)" if root else ""
            yield Diagnostic.warning(
                "W301",
                f"ceil {_fmt(ceil)} is above the {what} {_fmt(parent_ceil)} of "
                f"{s.parent.label}{why}; it can never be reached",
                ceil.span,
                Note(f"parent's {what} given here", parent_ceil.span),
            )


def leaf_cap(qdisc: ir.Qdisc | None) -> tuple[ir.Rate, str] | None:
    """The least rate a class's leaf qdisc (and what it holds) sends at, and what it is (``tbf``,
    ``htb``'s link class, ``cake``'s bandwidth), or None where it shapes nothing."""
    found: list[tuple[ir.Rate, str]] = []
    while qdisc is not None:
        if isinstance(qdisc, ir.Tbf):
            if qdisc.rate is not None:
                found.append((qdisc.rate, "tbf"))
            qdisc = qdisc.child
            continue
        if isinstance(qdisc, ir.Cake) and qdisc.bandwidth is not None:
            found.append((qdisc.bandwidth, "cake"))
        elif (
            isinstance(qdisc, ir.Htb | ir.Hfsc)
            and (link := link_rate(qdisc)) is not None
            # (its leaves within their rates send whatever their link class's: over-booked,
            # it caps nothing; found by a review)
            and children_overbook(qdisc.classes[0], link) is None
        ):
            found.append((link, qdisc.kind))
        break
    return min(found, key=lambda f: f[0].bits_per_second) if found else None


def ceil_within_leaf(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A class whose leaf qdisc shapes below its ceil (a tbf, an htb's link class, cake's
    bandwidth) never sends more than the leaf's rate: its ceil, and maybe its rate, can never
    be reached (warning W309; found by a tester: explain and the diagrams said such a class
    may borrow up to its ceil)."""
    for s in sites(policy):
        if s.qdisc.kind != "htb" or s.cls.children:
            continue
        cap = leaf_cap(s.cls.leaf)
        ceil = effective_ceil(s.cls)
        if cap is None or ceil is None or cap[0].bits_per_second >= ceil.bits_per_second:
            continue
        rate = rate_of(s.cls.rate)
        if s.cls.ceil is None:  # its ceil is its rate
            what, note = f"its rate {_fmt(ceil)} (its ceil too) can", "the class's rate is here"
        elif rate is not None and cap[0].bits_per_second < rate.bits_per_second:
            what, note = f"its rate {_fmt(rate)} and ceil {_fmt(ceil)} can", "its ceil is here"
        else:
            what, note = f"its ceil {_fmt(ceil)} can", "the class's ceil is here"
        leaf = {"tbf": "its leaf tbf's rate", "cake": "its leaf cake's bandwidth"}.get(
            cap[1], f"the rate of its leaf {cap[1]}'s link class"
        )
        yield Diagnostic.warning(
            "W309",
            f"{s.cls.label} never sends more than {_fmt(cap[0])}, {leaf}: {what} never be "
            "reached; write the class's rate and ceil within it, or shape in the class alone",
            cap[0].span,
            Note(note, ceil.span),
        )


def rates_spelled_in_bits(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Warn on ``mbps``-style units: tc reads them as bytes per second.

    Once per file: a file that writes byte units several times (the HTB user guide writes
    ``kbps`` throughout) gets one warning at the first, with the count, and a note at each other.
    """
    found: dict[str, dict[tuple[int, int], tuple[Span, int]]] = {}
    for iface in policy.interfaces:
        for rate in _all_rates(iface):
            for span in rate.byte_units:
                at = found.setdefault(span.file, {})
                at.setdefault((span.line, span.column), (span, rate.bits_per_second))
    for spans in found.values():
        (first, bits), *others = (spans[key] for key in sorted(spans))
        message = f"tc reads bps/kbps/mbps/gbps as BYTES per second; this is {_fmt(bits)}"
        if others:
            message += (
                f", and this file uses byte units {len(others) + 1} times (notes show the "
                "others; write 'bit' units to mean bits)"
            )
        else:
            message += " (write 'bit' units to mean bits)"
        notes = [Note(f"byte units again: this is {_fmt(b)}", span) for span, b in others]
        yield Diagnostic.warning("W302", message, first, *notes)


def _all_rates(iface: ir.Interface) -> Iterator[ir.Rate]:
    """Every rate written in ``iface``'s tree: each qdisc's (whatever its kind calls them:
    fq's maxrate too, found by a tester), its classes', and its policers'."""
    for q in ir.walk_qdiscs(iface.root):
        kind: type = type(q)
        for name in _rate_fields(kind):
            value = getattr(q, name)
            if isinstance(value, ir.Rate):
                yield value
        yield from _police_rates(getattr(q, "matches", ()))
        for cls in ir.classes_of(q):
            for value in (cls.rate, cls.ceil, cls.weight):
                if isinstance(value, ir.Rate):
                    yield value
            yield from _police_rates(cls.matches)
            if cls.rt is None and cls.ls is None and cls.ul is None:
                continue  # not an hfsc class
            for curve in (cls.rt, cls.ls, cls.ul):
                if curve is not None:
                    yield from (r for r in (curve.m1, curve.m2) if r is not None)


def _police_rates(matches: Iterable[ir.Match]) -> Iterator[ir.Rate]:
    return (m.police.rate for m in matches if m.police is not None)


@functools.cache
def _rate_fields(kind: type) -> tuple[str, ...]:
    """The fields of a qdisc's dataclass that may hold a rate (by their annotation)."""
    return tuple(f.name for f in dataclasses.fields(kind) if "Rate" in str(f.type))


# ---- classification ----------------------------------------------------------------------------


HTB_MAX_DEPTH = 8  # TC_HTB_MAXDEPTH: the kernel refuses deeper class trees


def htb_tree_fits(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An htb class tree is at most 8 levels deep (the kernel says "tree is too deep")."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if not isinstance(q, ir.Htb):
                continue
            stack = [(top, 1) for top in q.classes]
            while stack:
                cls, depth = stack.pop()
                if depth > HTB_MAX_DEPTH:
                    yield Diagnostic.error(
                        "E212",
                        f"{cls.label} is at level {depth} of the htb tree; the kernel allows "
                        f"at most {HTB_MAX_DEPTH} (counting the link class)",
                        cls.span,
                    )
                    continue
                stack.extend((child, depth + 1) for child in cls.children)


def matches_reach_leaves(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Filters send packets to leaf classes; a class with children can't hold packets."""
    for s in sites(policy):
        if s.cls.children and s.cls.matches:
            yield Diagnostic.error(
                "E206",
                f"{s.cls.label} has child classes, so packets cannot be classified into it; "
                "move the match into a child",
                s.cls.matches[0].span,
            )


def conditions_given_once(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A match line names each field once; alternatives are listed with commas (on an
    ingress tree's policing lines too: found by the property tests, they went unchecked)."""
    for m in ir.policy_matches(policy):
        if len(m.conds) < 2:
            continue  # one condition: nothing given twice
        first: dict[str, ir.Cond] = {}
        for cond in m.conds:
            name = _cond_name(cond)
            if name in first:
                yield Diagnostic.error(
                    "E211",
                    f"'{name}' is given twice on one match line (a packet has one {name}); "
                    f"list alternatives with commas, or write two match lines",
                    cond.span,
                    Note("first given here", first[name].span),
                )
            else:
                first[name] = cond


def tcp_flags_only_on_tcp(policy: ir.Policy) -> Iterator[Diagnostic]:
    """``tcp-flags`` (which imply TCP) never share a match line with another protocol."""
    for m in ir.policy_matches(policy):
        if len(m.conds) < 2:
            continue  # no room for tcp-flags and a protocol
        flags = next((c for c in m.conds if isinstance(c, ir.TcpFlagsCond)), None)
        if flags is None:
            continue
        for cond in m.conds:
            if not isinstance(cond, ir.ProtoCond):
                continue
            for number, span in cond.protocols:
                if number != 6:
                    yield Diagnostic.error(
                        "E247",
                        "tcp-flags match TCP packets only, so this protocol never matches "
                        "with them; put the other protocols on a match line of their own",
                        span,
                        Note("tcp-flags given here", flags.span),
                    )


def _cond_name(cond: ir.Cond) -> str:
    match cond:
        case ir.AddrCond() | ir.PortCond():
            return cond.field
        case ir.ProtoCond():
            return "proto"
        case ir.TosCond():
            return "tos" if cond.dscp is None else "dscp"
        case ir.TcpAckCond():
            return "tcp-ack"
        case ir.TcpFlagsCond():
            return "tcp-flags"
        case ir.RawCond():
            return f"u{cond.bits} at {cond.offset}"
        case ir.AllCond():
            return "all"


IPTABLES_PORT_PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 33: "dccp", 136: "udplite"}


def marks_expressible(policy: ir.Policy) -> Iterator[Diagnostic]:
    """With ``classify by mark``, every match must be expressible as an iptables rule."""
    for s in sites(policy):
        if s.iface.marking is None:
            if s.cls.set_dscp is not None:
                yield Diagnostic.error(
                    "E248",
                    "'set dscp' needs 'classify by mark' on the interface: the marking rules "
                    "write the DSCP of the class's packets",
                    s.cls.set_dscp.span,
                )
            if s.cls.mark is not None:
                yield Diagnostic.warning(
                    "W303",
                    "'mark' has no effect without 'classify by mark' on the interface",
                    s.cls.mark.span,
                )
            continue
        if isinstance(s.iface.root, ir.Mq):
            continue  # no marking there at all (E268): what it would say is moot
        mask = s.iface.marking.mask
        mark = s.cls.mark
        if mask is not None and mark is not None and mark.value & ~mask.value:
            yield Diagnostic.error(
                "E246",
                f"mark {mark.value:#x} has bits outside the mark mask {mask.value:#x}; "
                "a mark under the mask keeps to its bits",
                mark.span,
                Note("mask given here", mask.span),
            )
        fw_pref = s.iface.marking.pref
        for m in s.cls.matches:
            if m.pref is not None:
                # A u32 filter at its own pref, tried in pref order with the fw filters.
                if m.pref.value == s.iface.marking.fw_pref:
                    notes = (Note("the fw filters' pref", fw_pref.span),) if fw_pref else ()
                    yield Diagnostic.error(
                        "E249",
                        f"pref {m.pref.value} is the pref of the fw filters 'classify by mark' "
                        "makes, and one pref holds one kind of filter; give this line another "
                        "pref (lower: tried before the marks; higher: after), or give the "
                        "marks theirs with 'classify by mark ... pref N'",
                        m.pref.span,
                        *notes,
                    )
                continue
            protos = [c for c in m.conds if isinstance(c, ir.ProtoCond)]
            for cond in m.conds:
                if isinstance(cond, ir.RawCond | ir.TcpAckCond):
                    what = "raw u32 keys" if isinstance(cond, ir.RawCond) else "tcp-ack"
                    yield Diagnostic.error(
                        "E209",
                        f"{what} cannot be expressed as an iptables rule; give this match line "
                        "its own 'pref' (it stays a u32 filter), or drop 'classify by mark'",
                        cond.span,
                    )
                if isinstance(cond, ir.PortCond):
                    for port in cond.ports:
                        if port.mask is not None:
                            yield Diagnostic.error(
                                "E209",
                                "iptables has no port masks; write a range such as "
                                f"{port.lo}-{port.hi}",
                                port.span,
                            )
                    implied = any(isinstance(c, ir.TcpFlagsCond) for c in m.conds)
                    if (not protos and not implied) or any(
                        n not in IPTABLES_PORT_PROTOS for p in protos for n, _ in p.protocols
                    ):
                        yield Diagnostic.error(
                            "E209",
                            f"{_firewall(s.iface)} can match ports only with 'proto tcp' or "
                            "'proto udp' on the same match line",
                            cond.span,
                        )


def _firewall(iface: ir.Interface) -> str:
    """The tools that write the marking rules of ``iface``'s families."""
    return " and ".join({"ipv4": "iptables", "ipv6": "ip6tables"}[f] for f in iface.families)


def marks_unique(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Explicit marks on one interface are distinct (each names one class)."""
    for iface in policy.interfaces:
        first: dict[int, ir.Class] = {}
        for q in ir.walk_qdiscs(iface.root):
            for cls in ir.classes_of(q):
                if cls.mark is None:
                    continue
                if cls.mark.value in first:
                    yield Diagnostic.error(
                        "E207",
                        f"mark {cls.mark.value} is already used by {first[cls.mark.value].label}",
                        cls.mark.span,
                        Note("first used here", first[cls.mark.value].mark.span),  # type: ignore[union-attr]
                    )
                else:
                    first[cls.mark.value] = cls


# ---- values the kernel keeps differently ----------------------------------------------------
# Values tcdsl accepts that tc refuses, leaves out, or wraps (errors), or that the kernel clamps
# or reports differently (W330). Each was found by the property tests on real kernels (Linux
# 6.1 and 6.18, iproute2 6.1; tests/strategies.py) and checked against the sources.

INT_MAX = 2**31 - 1
MAX_TICK_US = 274_877_906
"""The longest time (us) tc can turn into 64-ns ticks in 32 bits: 274877907us is 2^32 ticks."""
FQ_CODEL_QUANTUM = (256, 1 << 20)  # sch_fq_codel.c: raised to 256, refused above 1 MiB
FQ_CODEL_MEMORY = 1 << 31  # sch_fq_codel.c: memory_limit lowered to 2 GiB
SFQ_MAX_PERTURB = INT_MAX // 1000
"""Seconds: tc takes an int, Linux (6.1.y, 6.13+) refuses above INT_MAX / HZ (HZ up to 1000)."""
NETEM_MAX_JITTER_NS = INT_MAX  # sch_netem.c caps the jitter to what tabledist() takes


def _kernel_ticks(rate_bytes: int, size: int) -> int:
    """The ticks the kernel reports for a tbf burst or mtu (``psched_l2t_ns`` >> 6)."""
    return psched_l2t_ns(rate_bytes, size) >> 6


def _largest(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest value in [lo, hi] that ``fits`` (monotone, true at ``lo``)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _ticks_fit(ticks: Callable[[int, int], int], rate_bytes: int, size: int) -> bool:
    return ticks(rate_bytes, size) <= U32_MAX


def _bytes(count: int) -> str:
    return f"{count} byte" if count == 1 else f"{count} bytes"


def _seconds(microseconds: float) -> str:
    return f"{microseconds / 1e6:.4g}s"


def values_kept_as_written(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Values tc and the kernel hold as written: nothing tc refuses, leaves out or wraps (E205,
    E208), nothing the kernel clamps or reports differently (W330)."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            match q:
                case ir.Htb():
                    for cls in ir.classes_of(q):
                        yield from _htb_class_values(cls)
                case ir.Tbf():
                    yield from _tbf_values(q)
                case ir.FqCodel():
                    yield from _fq_codel_values(q)
                case ir.Sfq():
                    yield from _sfq_values(q)
                case ir.Netem():
                    yield from _netem_values(q)
                case ir.Codel() | ir.Fq() | ir.FqPie():
                    yield from _aqm_values(q)
                case ir.Red():
                    yield from red_values(q)
                case ir.Prio() if q.bands is not None and q.priomap is None:
                    # with more classes than bands (E205 above), more bands fix both
                    few = 2 <= q.bands.value < len(set(DEFAULT_PRIOMAP))
                    if few and len(q.classes) <= q.bands.value:
                        yield Diagnostic.error(
                            "E205",
                            f"prio bands {q.bands.value} needs a priomap: tc sends its default "
                            f"priomap ({' '.join(map(str, DEFAULT_PRIOMAP))}), which names "
                            "band 2, and the kernel refuses the qdisc; give a priomap naming "
                            f"bands 0-{q.bands.value - 1}",
                            q.bands.span,
                        )
                case _:
                    pass
        yield from _netems_mix(iface)


def _htb_class_values(cls: ir.Class) -> Iterator[Diagnostic]:
    if cls.burst is not None or cls.cburst is not None:  # most classes give neither
        ceil = rate_of(cls.ceil) or rate_of(cls.rate)
        pairs = (("burst", cls.burst, rate_of(cls.rate)), ("cburst", cls.cburst, ceil))
        for name, size, rate in pairs:
            raise_ = "rate" if name == "burst" else "ceil"
            yield from _ticks_wrap(name, size, rate, cls.label, raise_)

    if cls.quantum is not None and INT_MAX < cls.quantum.bytes <= U32_MAX:
        yield Diagnostic.error(
            "E205",
            f"quantum {cls.quantum.bytes} of {cls.label} is above {INT_MAX}: the kernel keeps an "
            f"htb quantum in an int, where it is {cls.quantum.bytes - 2**32}; write at most "
            f"{INT_MAX}",
            cls.quantum.span,
        )


def _ticks_wrap(
    name: str, size: ir.Size | None, rate: ir.Rate | None, owner: str, raise_: str
) -> Iterator[Diagnostic]:
    """E208 for a size that takes tc longer than its 32-bit count of 64-ns ticks holds at
    ``rate`` (an htb burst, a policer's burst): tc wraps it silently."""
    if size is None or rate is None or not 0 < size.bytes <= U32_MAX:
        return
    rate_bytes = rate.bits_per_second // 8
    if rate_bytes == 0 or rate.bits_per_second > MAX_RATE:
        return
    ticks = tc_xmittime_ticks(rate_bytes, size.bytes)
    if ticks <= U32_MAX:
        return
    us = int(1_000_000 * (size.bytes / rate_bytes)) & U32_MAX  # tc's unsigned int
    held = int(us * TICKS_PER_US) & U32_MAX
    kept = held * 64 * rate_bytes // 10**9
    most = _largest(functools.partial(_ticks_fit, tc_xmittime_ticks, rate_bytes), 0, size.bytes)
    yield Diagnostic.error(
        "E208",
        f"{name} {size.bytes} of {owner} takes {_seconds(size.bytes * 1e6 / rate_bytes)} "
        f"at {_fmt(rate)}; tc hands the kernel that time in 64-ns ticks, a 32-bit count that "
        f"wraps past about 274.9s, so the kernel would get {_bytes(kept)}; write {name} {most} "
        f"or less, or raise the {raise_}",
        size.span,
    )


def police_bursts_fit_tc(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E208 for a policer's burst or mtu above tc's 32 bits (found by a tester: 'burst 6g'
    passed check, and tc refused the script half-way), or a burst that wraps in tc's ticks
    (see ``_ticks_wrap``)."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            for _, m in ir.matches_of(q):
                if m.police is not None:
                    p = m.police
                    for name, size in (("burst", p.burst), ("mtu", p.mtu)):
                        if size is not None and size.bytes > U32_MAX:
                            msg = (
                                f"{name} of the policer is {size.bytes} bytes; tc takes at "
                                f"most {U32_MAX} (4g - 1)"
                            )
                            yield Diagnostic.error("E208", msg, size.span)
                    yield from _ticks_wrap("burst", p.burst, p.rate, "the policer", "rate")


def _tbf_values(q: ir.Tbf) -> Iterator[Diagnostic]:
    if q.latency is not None and q.latency.microseconds == 0:
        yield Diagnostic.error(
            "E208",
            "tc refuses a tbf latency of 0 (it takes 0 for 'not given' and then says 'either "
            '"limit" or "latency" is required\'); give a latency above 0',
            q.latency.span,
        )
    if q.limit is not None and q.limit.bytes == 0:
        yield Diagnostic.error(
            "E208",
            "tc refuses a tbf limit of 0 (it takes 0 for 'not given' and then says 'either "
            '"limit" or "latency" is required\'); give a limit above 0',
            q.limit.span,
        )
    rate, peak = q.rate, q.peakrate
    if rate is None or not 8 <= rate.bits_per_second <= MAX_RATE:
        return
    if peak is not None and not 8 <= peak.bits_per_second <= MAX_RATE:
        return
    for name, size, at in (("burst", q.burst, rate), ("mtu", q.mtu, peak)):
        if size is None or at is None or not 0 < size.bytes <= U32_MAX:
            continue
        rate_bytes = at.bits_per_second // 8
        ticks = _kernel_ticks(rate_bytes, size.bytes)
        if ticks <= U32_MAX:
            continue
        shown = int(rate_bytes * int((ticks & U32_MAX) / TICKS_PER_US) / 1e6)
        most = _largest(functools.partial(_ticks_fit, _kernel_ticks, rate_bytes), 0, size.bytes)
        yield Diagnostic.warning(
            "W330",
            f"tbf {name} {size.bytes} takes {_seconds(size.bytes * 1e6 / rate_bytes)} at "
            f"{_fmt(at)}; the kernel keeps it, but reports it in 64-ns ticks, a 32-bit count "
            f"that wraps past about 274.9s: tc shows {_bytes(shown)}, and 'tcdsl verify' a "
            f"difference; write {name} {most} or less to see what was set",
            size.span,
        )
    yield from _tbf_latency_fits(q, rate, peak)


def _tbf_latency_fits(q: ir.Tbf, rate: ir.Rate, peak: ir.Rate | None) -> Iterator[Diagnostic]:
    """tc computes a tbf's limit from its latency into a 32-bit field (q_tbf.c)."""
    burst = q.burst.bytes if q.burst is not None else None
    mtu = q.mtu.bytes if q.mtu is not None else None
    if q.latency is None or burst is None or burst > U32_MAX or q.latency.microseconds > U32_MAX:
        return  # (a latency above tc's own limit is E208 already; found by a tester: twice)
    if peak is not None and (mtu is None or mtu > U32_MAX):
        return
    rate64, prate64 = (
        float(rate.bits_per_second // 8),
        float(peak.bits_per_second // 8 if peak else 0),
    )

    def limit(latency: int) -> float:
        lim = rate64 * float(latency) / 1_000_000 + burst
        if prate64 and mtu is not None:
            lim = min(lim, prate64 * float(latency) / 1_000_000 + mtu)
        return lim

    lim = limit(q.latency.microseconds)
    if lim < 2**32:
        return
    most = _largest(lambda t: limit(t) < 2**32, 0, q.latency.microseconds)
    formula = "rate x latency + burst"
    if peak is not None:
        formula = f"the smaller of {formula} and peakrate x latency + mtu"
    fix = f"write latency {format_time(most)} or less, or" if most else "give"
    yield Diagnostic.error(
        "E208",
        f"with latency {format_time(q.latency.microseconds)}, tc computes the tbf limit as "
        f"{formula} = {int(lim)} bytes, beyond its 32-bit field (at most {U32_MAX}): it wraps "
        f"and the kernel would get a limit of {int(lim) & U32_MAX} bytes; {fix} a limit",
        q.latency.span,
    )


Default = tuple[str, ir.Count | ir.Time | None, str, str]
"""A value tc leaves out when 0: its name, the value, the kernel's default, and the fix."""


def _zeros_left_out(kind: str, defaults: tuple[Default, ...]) -> Iterator[Diagnostic]:
    """E208 for each value of 0 that tc takes for 'not given' (the kernel keeps its default)."""
    for name, value, default, fix in defaults:
        zero = isinstance(value, ir.Count) and value.value == 0
        zero |= isinstance(value, ir.Time) and value.microseconds == 0
        if value is not None and zero:
            yield Diagnostic.error(
                "E208",
                f"tc takes {kind} {name} 0 for 'not given' and leaves it out: the kernel keeps "
                f"its default {name} of {default}; give {fix}",
                value.span,
            )


def _fq_codel_values(q: ir.FqCodel) -> Iterator[Diagnostic]:
    if q.limit is not None or q.target is not None or q.interval is not None:
        # (a subscriber's fq_codel usually gives none: nothing to leave out)
        yield from _zeros_left_out(
            q.kind,
            (
                ("limit", q.limit, "10240 packets", "a limit of 1 or more"),
                ("target", q.target, "5ms", "a target of 1us or more"),
                ("interval", q.interval, "100ms", "an interval of 1us or more"),
            ),
        )
    lo, hi = FQ_CODEL_QUANTUM
    if q.quantum is not None and 0 < q.quantum.bytes < lo:
        yield Diagnostic.warning(
            "W330",
            f"the kernel raises an fq_codel quantum of {q.quantum.bytes} to {lo}; write quantum "
            f"{lo} or more",
            q.quantum.span,
        )
    if q.quantum is not None and hi < q.quantum.bytes <= U32_MAX:
        yield Diagnostic.error(
            "E205",
            f"fq_codel quantum {q.quantum.bytes} is above {hi} (1 MiB): the kernel refuses it "
            f"('Invalid quantum'); write at most {hi}",
            q.quantum.span,
        )
    memory = q.memory_limit
    if memory is not None and memory.bytes == U32_MAX:
        yield Diagnostic.error(
            "E208",
            f"tc takes fq_codel memory_limit {U32_MAX} for 'not given' and leaves it out: the "
            f"kernel keeps its default of 32 MiB; write at most {FQ_CODEL_MEMORY} (2 GiB)",
            memory.span,
        )
    elif memory is not None and FQ_CODEL_MEMORY < memory.bytes < U32_MAX:
        yield Diagnostic.warning(
            "W330",
            f"the kernel lowers an fq_codel memory_limit of {memory.bytes} bytes to "
            f"{FQ_CODEL_MEMORY} (2 GiB); write memory_limit 2g or less",
            memory.span,
        )


def _aqm_values(q: ir.Codel | ir.Fq | ir.FqPie) -> Iterator[Diagnostic]:
    """codel, fq and fq_pie: zeros tc takes for 'not given', and what the kernel refuses."""
    match q:
        case ir.Codel():
            defaults: tuple[Default, ...] = (
                ("limit", q.limit, "1000 packets", "a limit of 1 or more"),
                ("target", q.target, "5ms", "a target of 1us or more"),
                ("interval", q.interval, "100ms", "an interval of 1us or more"),
            )
        case ir.Fq():
            defaults = (("buckets", q.buckets, "1024", "a power of two from 2 to 262144"),)
        case ir.FqPie():
            defaults = (
                ("limit", q.limit, "10240 packets", "a limit of 1 or more"),
                ("target", q.target, "15ms", "a target of 1us or more"),
                ("tupdate", q.tupdate, "15ms", "a tupdate of 1us or more"),
            )
    yield from _zeros_left_out(q.kind, defaults)
    ce = q.ce_threshold if isinstance(q, ir.Codel | ir.Fq) else None
    if ce is not None and ce.microseconds == U32_MAX:
        yield Diagnostic.error(
            "E208",
            f"tc takes {q.kind} ce_threshold {U32_MAX}us for 'not given' and leaves it out; "
            f"give at most {U32_MAX - 1}us",
            ce.span,
        )
    if isinstance(q, ir.Fq):
        buckets = q.buckets.value if q.buckets else 0
        # (found by a tester: tc's ilog2 rounds up, not down; 262145 is sent as 19)
        if q.buckets is not None and buckets > 0 and not 2 <= buckets <= FQ_MAX_BUCKETS:
            yield Diagnostic.error(
                "E205",
                f"fq buckets {buckets} is outside 2-{FQ_MAX_BUCKETS}: tc sends its log2 (rounded "
                f"up), which the kernel takes from 1 to 18 (2 to {FQ_MAX_BUCKETS} buckets)",
                q.buckets.span,
            )
        yield from _u32_rate(q.kind, "maxrate", q.maxrate)
        yield from _u32_rate(q.kind, "low_rate_threshold", q.low_rate_threshold)
        if q.maxrate is not None and q.maxrate.bits_per_second // 8 == U32_MAX:
            yield Diagnostic.error(
                "E208",
                f"fq takes maxrate {_fmt(q.maxrate)} ({U32_MAX} bytes/s) for 'no limit'; give "
                "a lower maxrate, or none",
                q.maxrate.span,
            )
        initial = q.initial_quantum
        if initial is not None and INT_MAX < initial.bytes <= U32_MAX:
            yield Diagnostic.error(
                "E205",
                f"fq initial_quantum {initial.bytes} is above {INT_MAX}: the kernel refuses it "
                "('Numerical result out of range')",
                initial.span,
            )
        if (
            q.buckets is not None
            and 2 <= q.buckets.value <= FQ_MAX_BUCKETS
            and q.buckets.value & (q.buckets.value - 1)
        ):
            kept = fq_buckets_kept(q.buckets.value)
            yield Diagnostic.warning(
                "W330",
                f"tc rounds fq buckets {q.buckets.value} up to a power of two, {kept}; write "
                f"buckets {kept}",
                q.buckets.span,
            )
        if q.quantum is not None and FQ_QUANTUM_MAX < q.quantum.bytes <= U32_MAX:
            yield Diagnostic.error(
                "E205",
                f"fq quantum {q.quantum.bytes} is above {FQ_QUANTUM_MAX} (1 MiB): the kernel "
                "refuses it",
                q.quantum.span,
            )
    if isinstance(q, ir.FqPie):
        for name, value, hi in (
            ("alpha", q.alpha, 32),
            ("beta", q.beta, 32),
            ("ecn_prob", q.ecn_prob, 99),
        ):
            if value is not None and value.value > hi:
                yield Diagnostic.error(
                    "E205", f"fq_pie {name} {value.value} is outside 0-{hi}", value.span
                )


def _u32_rate(kind: str, name: str, rate: ir.Rate | None) -> Iterator[Diagnostic]:
    """A rate tc reads into 32 bits of bytes per second (``get_rate``), refusing more."""
    if rate is not None and rate.bits_per_second // 8 > U32_MAX:
        yield Diagnostic.error(
            "E208",
            f"{kind} {name} {_fmt(rate)} is above what tc takes for it, {_fmt(U32_MAX * 8)} "
            "(32 bits of bytes per second)",
            rate.span,
        )


FQ_QUANTUM_MAX = 1 << 20  # sch_fq.c refuses a quantum of 0 or above 1 MiB
FQ_MAX_BUCKETS = 256 * 1024  # sch_fq.c takes a buckets log of 1 to ilog2(256k)
RED_WLOG_WARNED = 10  # q_red.c warns at an ewma of 10 or more


def red_values(q: ir.Red) -> Iterator[Diagnostic]:
    """red thresholds tc refuses (E240) or that leave RED nothing to do (W352); a missing
    ``bandwidth`` (W353)."""
    yield from _u32_rate(q.kind, "bandwidth", q.bandwidth)
    if q.limit is None or q.avpkt is None or q.avpkt.bytes == 0:
        return
    qmin, qmax, burst = red_thresholds(q)
    where = q.max.span if q.max else q.min.span if q.min else q.span
    if qmax < qmin:
        assert q.max is not None
        yield Diagnostic.error(
            "E240",
            f"red max {qmax} is below min {qmin} (bytes): tc refuses it ('failed to calculate "
            "probability'); make max larger than min",
            q.max.span,
            *([Note("min given here", q.min.span)] if q.min is not None else []),
        )
        return
    wlog = red_wlog(qmin, burst, q.avpkt.bytes)
    if wlog is None:
        span = q.burst.span if q.burst is not None else q.span
        yield Diagnostic.error(
            "E240",
            f"red burst {burst} is too small for min {qmin} at avpkt {q.avpkt.bytes}: tc refuses "
            f"it ('failed to calculate EWMA constant'); write burst {1 + qmin // q.avpkt.bytes} "
            "or more, or leave it out (tc computes (2 min + max) / (3 avpkt))",
            span,
        )
        return
    bandwidth = q.bandwidth.bits_per_second if q.bandwidth else RED_DEFAULT_BANDWIDTH
    if red_scell_log(wlog, q.avpkt.bytes, bandwidth) is None:
        yield Diagnostic.error(
            "E240",
            f"red bandwidth {_fmt(bandwidth)} is too low for avpkt {q.avpkt.bytes}: the time "
            "red must age its average over while idle does not fit tc's table, and tc refuses "
            "it ('failed to calculate idle damping table'); raise bandwidth or lower avpkt",
            q.bandwidth.span if q.bandwidth else q.avpkt.span,
        )
    if max(qmin, qmax).bit_length() + wlog >= 32:
        yield Diagnostic.error(
            "E240",
            f"red max {qmax} with the averaging constant tc derives from burst {burst} "
            f"(ewma {wlog}) is too large for the kernel's fixed-point average (it refuses it); "
            "lower max or burst",
            where,
        )
    if wlog >= RED_WLOG_WARNED:
        yield Diagnostic.warning(
            "W352",
            f"red burst {burst} makes the average follow the queue very slowly (ewma {wlog}); "
            f"tc warns 'Burst {burst} seems to be too large'; lower burst, or leave it out",
            q.burst.span if q.burst is not None else q.span,
        )
    if qmin == qmax:
        yield Diagnostic.warning(
            "W352",
            f"red min and max are both {qmin} bytes: there is no range where red drops early at "
            "random, so it drops every packet above that average like a tail drop",
            where,
        )
    elif q.limit.bytes <= qmax:
        yield Diagnostic.warning(
            "W352",
            f"red limit {q.limit.bytes} is not above max {qmax} (bytes): the queue is full "
            "before red's average reaches max; give a limit well above max (tc-red(8): "
            "max + a few bursts)",
            q.limit.span,
        )
    if q.bandwidth is None:
        yield Diagnostic.warning(
            "W353",
            "red without 'bandwidth': tc assumes 10Mbit (and says so on stderr) to age the "
            "average while the queue is idle; give the rate of the link it queues for",
            q.span,
        )


def _sfq_values(q: ir.Sfq) -> Iterator[Diagnostic]:
    if q.limit is not None and q.limit.value < 2:
        yield Diagnostic.error(
            "E205",
            f"tc refuses sfq limit {q.limit.value} ('Illegal \"limit\", must be > 1'); "
            "write 2 or more",
            q.limit.span,
        )
    if q.perturb is not None and SFQ_MAX_PERTURB < q.perturb.value <= U32_MAX:
        yield Diagnostic.error(
            "E205",
            f"sfq perturb {q.perturb.value} (seconds) is above {SFQ_MAX_PERTURB}: tc refuses one "
            f"above {INT_MAX}, and Linux one above {INT_MAX} / HZ ('sch_sfq: invalid perturb "
            f"period'; HZ is up to 1000); write at most {SFQ_MAX_PERTURB}",
            q.perturb.span,
        )
    if q.quantum is not None and INT_MAX < q.quantum.bytes <= U32_MAX:
        yield Diagnostic.error(
            "E205",
            f"sfq quantum {q.quantum.bytes} is above {INT_MAX}: the kernel refuses it "
            f"('sch_sfq: invalid quantum'); write at most {INT_MAX}",
            q.quantum.span,
        )


def _netem_values(q: ir.Netem) -> Iterator[Diagnostic]:
    for name, time in (("delay", q.delay), ("jitter", q.jitter)):
        if time is None or not MAX_TICK_US < time.microseconds <= U32_MAX:
            continue
        yield Diagnostic.error(
            "E205",
            f"netem {name} {format_time(time.microseconds)} is above {MAX_TICK_US}us (about "
            f"274.9s): tc keeps it in 64-ns ticks in 32 bits and refuses it ('Illegal ... time "
            f"(too large)'); write at most {MAX_TICK_US}us",
            time.span,
        )
    jitter = q.jitter
    if jitter is not None and jitter.microseconds <= MAX_TICK_US:
        ns = int(jitter.microseconds * TICKS_PER_US) * 64
        if ns > NETEM_MAX_JITTER_NS:
            most = _largest(
                lambda us: int(us * TICKS_PER_US) * 64 <= NETEM_MAX_JITTER_NS,
                0,
                jitter.microseconds,
            )
            yield Diagnostic.warning(
                "W330",
                f"the kernel lowers a netem jitter of {format_time(jitter.microseconds)} to "
                f"{NETEM_MAX_JITTER_NS}ns (about 2.147s); write jitter {most}us or less",
                jitter.span,
            )


def _duplicates(q: ir.Netem) -> bool:
    """Whether tc hands the kernel a duplicate probability above 0 (a 32-bit fraction)."""
    pct = q.duplicate
    return pct is not None and round(float(pct.value) / 100 * U32_MAX) != 0


def _netems_mix(iface: ir.Interface) -> Iterator[Diagnostic]:
    """Linux (6.1.y, 6.17+) refuses a netem when the device's tree would then hold a duplicating
    netem and another netem; tc adds an interface's qdiscs in pre-order."""
    netems = [q for q in ir.walk_qdiscs(iface.root) if isinstance(q, ir.Netem)]
    for i, later in enumerate(netems):
        other = next((n for n in netems[:i] if _duplicates(n) or _duplicates(later)), None)
        if other is None:
            continue
        where = later.duplicate.span if _duplicates(later) and later.duplicate else later.span
        there = other.duplicate.span if _duplicates(other) and other.duplicate else other.span
        what = "duplicating netem" if _duplicates(other) else "other netem"
        yield Diagnostic.error(
            "E208",
            f"the kernel refuses this netem on {iface.name}: its tree already holds "
            f"{'a duplicating' if _duplicates(other) else 'another'} netem ('netem: cannot mix "
            "duplicating netems with other netems in tree'); keep 'duplicate' on an "
            "interface's only netem",
            where,
            Note(f"{what} here", there),
        )


# ---- hfsc service curves -----------------------------------------------------------------------


def hfsc_curves_complete(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Every hfsc class has the curves tc and the kernel require: rt or ls (tc: "no parameters
    given", the kernel: EINVAL), ls with ul (tc: "Upper-limit Service Curve without Link-Share
    Service Curve"), and ls on a class with children (the kernel: "Invalid parent - parent class
    must have FSC", since the fix for CVE-2023-4623)."""
    for s in sites(policy):
        cls = s.cls
        if not isinstance(s.qdisc, ir.Hfsc):
            continue
        head = cls.head
        if cls.rt is None and cls.ls is None:
            hint = " (ul limits only what ls shares)" if cls.ul is not None else ""
            yield Diagnostic.error(
                "E236",
                f"{cls.label} has no rt or ls curve; an hfsc class needs rt, ls or sc{hint}",
                head,
            )
        elif cls.ul is not None and cls.ls is None:
            yield Diagnostic.error(
                "E237",
                f"{cls.label} has ul but no ls: tc refuses an upper limit without a link-sharing "
                "curve; add 'ls' (ul caps what ls shares)",
                cls.ul.span,
            )
        if cls.children and cls.ls is None and (cls.rt is not None or cls.ul is not None):
            yield Diagnostic.error(
                "E238",
                f"{cls.label} has child classes but no ls curve; the kernel refuses children "
                'under a class without link-sharing ("parent class must have FSC")',
                head,
            )


def link_layer_values_kept(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Link-layer and cake values tc takes as written: E230 for what it refuses (cake's
    overhead and mpu ranges, which tcdsl keeps a size table to as well), takes for 'not given'
    and leaves out, or drops (a size table's mtu and tsize when it needs no table)."""
    for iface in policy.interfaces:
        if iface.stab is not None:
            yield from _overhead_values(iface.stab, stab=True)
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Cake):
                yield from _cake_values(q)


def _outside(value: ir.Count | ir.Size | None, lo: int, hi: int) -> bool:
    if value is None:
        return False
    number = value.bytes if isinstance(value, ir.Size) else value.value
    return not lo <= number <= hi


def _overhead_values(o: ir.Overhead, stab: bool) -> Iterator[Diagnostic]:
    lo, hi = linklayer.OVERHEAD_RANGE
    if o.preset is None and _outside(o.overhead, lo, hi):
        yield Diagnostic.error(
            "E230",
            f"overhead {o.overhead.value} is above {hi} bytes, the most tc's cake takes "
            "(tcdsl keeps a size table to it too; no link adds more)",
            o.overhead.span,
        )
    lo, hi = linklayer.MPU_RANGE
    if o.mpu is not None and _outside(o.mpu, lo, hi):
        yield Diagnostic.error(
            "E230",
            f"mpu {o.mpu.value} is above {hi} bytes, the most tc's cake takes (tcdsl keeps a "
            "size table to it too)",
            o.mpu.span,
        )
    if not stab:
        return
    for name, value, (lo, hi) in (
        ("mtu", o.mtu, linklayer.STAB_MTU_RANGE),
        ("tsize", o.tsize, linklayer.STAB_TSIZE_RANGE),
    ):
        if value is None:
            continue
        if _outside(value, lo, hi):
            number = value.bytes if isinstance(value, ir.Size) else value.value
            why = (
                "tc takes 0 for 'not given'"
                if number == 0
                else "a larger table does not fit in tc's request"
            )
            yield Diagnostic.error(
                "E230", f"size table {name} {number} is outside {lo}-{hi} ({why})", value.span
            )
        elif o.linklayer == "ethernet" and (o.mpu is None or o.mpu.value == 0):
            yield Diagnostic.error(
                "E230",
                f"tc drops a size table's {name} when it needs no table (linklayer ethernet "
                f"without mpu: the overhead alone is added); leave {name} out, or give an mpu",
                value.span,
            )


def _cake_values(q: ir.Cake) -> Iterator[Diagnostic]:
    if q.overhead is not None:
        yield from _overhead_values(q.overhead, stab=False)
    if q.bandwidth is not None and q.bandwidth.bits_per_second < 8:
        yield Diagnostic.error(
            "E230",
            "tc takes a cake bandwidth of 0 for 'not given' and leaves it out (cake then does "
            "not shape); write 'unlimited', or a bandwidth of 8bit or more",
            q.bandwidth.span,
        )
    for name, value in (("rtt", q.rtt), ("memlimit", q.memlimit)):
        zero = isinstance(value, ir.Time) and value.microseconds == 0
        zero |= isinstance(value, ir.Size) and value.bytes == 0
        if value is not None and zero:
            default = "100ms" if name == "rtt" else "a limit from the bandwidth"
            least = "1us" if name == "rtt" else "1b"  # (found by a tester: 'rtt 1' has no unit)
            yield Diagnostic.error(
                "E230",
                f"tc takes cake {name} 0 for 'not given' and leaves it out: the kernel keeps "
                f"{default}; give {name} {least} or more",
                value.span,
            )


def mq_only_at_the_root(policy: ir.Policy) -> Iterator[Diagnostic]:
    """mq is a device's root (one qdisc per TX queue), on an interface's egress."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Mq) and (q is not iface.root or iface.download is not None):
                where = "a download's IFB" if q is iface.root else "a class or a tbf/netem"
                yield Diagnostic.error(
                    "E266",
                    f"mq is only a root qdisc, on an interface's egress: it holds one qdisc per "
                    f"TX queue of the device, and cannot be under {where}",
                    q.span,
                )


def mq_steering_owns_clsact(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An mq tree picks TX queues with the filters of a clsact qdisc, which takes the
    device's ingress slot (ffff:), and with its match lines (not marks)."""
    ingress = {i.name: i for i in policy.interfaces if i.direction == "ingress"}
    downloads = {i.download.interface: i for i in policy.interfaces if i.download is not None}
    for iface in policy.interfaces:
        if not isinstance(iface.root, ir.Mq):
            continue
        if iface.marking is not None:
            yield Diagnostic.error(
                "E268",
                "an mq tree picks each packet's TX queue with its match lines, not by mark; "
                "drop 'classify by mark'",
                iface.marking.span,
            )
        other = ingress.get(iface.name) or downloads.get(iface.name)
        if other is not None and ir.mq_steers(iface):
            what = (
                "its ingress policers need"
                if other.direction == "ingress"
                else "its download needs"
            )
            yield Diagnostic.error(
                "E268",
                f"the mq tree of '{iface.name}' steers packets to TX queues from a clsact "
                f"qdisc, which takes the ingress qdisc's place (ffff:) that {what}",
                other.span,
                Note("the mq tree is here", iface.root.span),
            )


def mq_policers_end_classification(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A policer in an mq tree drops or passes what exceeds it: its steering filter picked
    the queue before anything policed, so 'continue' or 'reclassify' could not reach a line
    of another queue."""
    for iface in policy.interfaces:
        if not isinstance(iface.root, ir.Mq):
            continue
        for queue in iface.root.queues:
            # (a qdisc below a queue's own tries its lines as without mq)
            for _, m in ir.matches_of(queue.qdisc):
                police = m.police
                if police is not None and police.exceed in ("continue", "reclassify"):
                    yield Diagnostic.error(
                        "E264",
                        f"'{police.exceed}' on a policer of an mq tree: the steering "
                        "filters pick each packet's TX queue before any policer runs, so "
                        "what exceeds the rate would go on only among the lines of this "
                        "line's queue, not to the next line of the policy; use 'drop' or "
                        "'pass'",
                        police.exceed_span or police.span,
                    )


CHECKS: tuple[Check, ...] = (
    required_parameters_present,
    values_in_range,
    values_fit_the_kernel,
    ceil_not_below_rate,
    overbooking_is_declared,
    ceil_within_parent_ceil,
    ceil_within_leaf,
    rates_spelled_in_bits,
    htb_tree_fits,
    matches_reach_leaves,
    conditions_given_once,
    tcp_flags_only_on_tcp,
    marks_expressible,
    marks_unique,
    values_kept_as_written,
    police_bursts_fit_tc,
    *directions.CHECKS,
    *families.CHECKS,
    hfsc_curves_complete,
    link_layer_values_kept,
    mq_only_at_the_root,
    mq_steering_owns_clsact,
    mq_policers_end_classification,
)


def run_checks(policy: ir.Policy) -> list[Diagnostic]:
    """Run every check and return all diagnostics."""
    return [d for check in CHECKS for d in check(policy)]
