"""Semantic checks: each is a function from a resolved policy to the diagnostics it finds.

A check never raises for a user error and reports every instance it finds. Checks are named
for the invariant they enforce; ``CHECKS`` lists them in the order the driver runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note
from tcdsl.units import format_rate

Check = Callable[[ir.Policy], Iterator[Diagnostic]]


@dataclass(frozen=True, slots=True)
class Site:
    """A class in context: its interface, the qdisc that owns it, and its parent class."""

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
            if isinstance(q, ir.Htb | ir.Prio | ir.Cbq):
                parents = ir.parent_map(q)
                found.extend(Site(iface, q, cls, parents[id(cls)]) for cls in ir.classes_of(q))
    # The checks all walk the same policy; keep the last walk (the policy is immutable).
    _SITES.clear()
    _SITES[id(policy)] = (policy, tuple(found))
    return _SITES[id(policy)][1]


_SITES: dict[int, tuple[ir.Policy, tuple[Site, ...]]] = {}


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
                case _:
                    pass


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
                yield Diagnostic.error("E208", f"{name} must be above 0bit", value.span)
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
                    yield Diagnostic.error(
                        "E205",
                        f"prio has {bands} bands but {len(q.classes)} classes",
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


U32_MAX = 2**32 - 1
MAX_RATE = (2**64 - 1) * 8  # tc keeps rates as 64-bit bytes per second


_SKIP_FIELDS = frozenset({"span", "explicit_handle", "explicit_id", "handle", "classid", "kind"})
CLASS_VALUE_FIELDS = ("rate", "ceil", "burst", "cburst", "prio", "quantum", "allot", "avpkt")


def _node_values(node: object) -> Iterator[tuple[str, object]]:
    for name in getattr(node, "__slots__", ()):
        if name not in _SKIP_FIELDS:
            value = getattr(node, name)
            if isinstance(value, ir.Rate | ir.Size | ir.Time | ir.Count):
                yield name, value


def values_fit_the_kernel(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Numbers fit the fields tc and the kernel keep them in (tc would refuse or wrap them)."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            for name, value in _node_values(q):
                yield from _fits(q.kind, name, value, q)
            for cls in ir.classes_of(q):
                for name in CLASS_VALUE_FIELDS:
                    value = getattr(cls, name)
                    if value is not None:
                        yield from _fits(cls.label, name, value, q)


def _fits(what: str, name: str, value: object, q: ir.Qdisc) -> Iterator[Diagnostic]:
    match value:
        case ir.Rate() if value.bits_per_second > MAX_RATE:
            yield Diagnostic.error("E208", f"{name} of {what} is too large for tc", value.span)
        case ir.Rate() if 0 < value.bits_per_second < 8:
            yield Diagnostic.error(
                "E208",
                f"{name} {value.bits_per_second}bit of {what} is below 8bit; "
                "tc keeps rates in whole bytes per second",
                value.span,
            )
        case ir.Rate() if value.bits_per_second == 0 and isinstance(q, ir.Tbf | ir.Netem | ir.Cbq):
            yield Diagnostic.error("E208", f"{name} of {what} must be above 0bit", value.span)
        case ir.Size() if value.bytes > U32_MAX:
            msg = f"{name} of {what} is {value.bytes} bytes; tc takes at most {U32_MAX} (4g - 1)"
            yield Diagnostic.error("E208", msg, value.span)
        case ir.Size() if value.bytes == 0 and name in ("burst", "cburst", "quantum", "mtu"):
            yield Diagnostic.error("E208", f"{name} of {what} must be above 0", value.span)
        case ir.Time() if value.microseconds > U32_MAX:
            msg = f"{name} of {what} is above tc's limit of {U32_MAX}us (about 71 minutes)"
            yield Diagnostic.error("E208", msg, value.span)
        case ir.Count() if value.value > U32_MAX:
            msg = f"{name} {value.value} of {what} is above tc's limit of {U32_MAX}"
            yield Diagnostic.error("E208", msg, value.span)
        case ir.Count() if name == "flows" and not 1 <= value.value <= 65536:
            msg = f"fq_codel flows {value.value} is outside 1-65536"
            yield Diagnostic.error("E205", msg, value.span)
        case _:
            pass


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


def children_fit_parent(policy: ir.Policy) -> Iterator[Diagnostic]:
    """The guaranteed rates of a class's children add up to no more than its own rate."""
    for s in sites(policy):
        parent_rate = rate_of(s.cls.rate)
        children = [c for c in s.cls.children if rate_of(c.rate) is not None]
        if parent_rate is None or not children:
            continue
        total = sum(r.bits_per_second for c in children if (r := rate_of(c.rate)) is not None)
        ceil = effective_ceil(s.cls)
        if ceil is not None and total > ceil.bits_per_second and ceil is not parent_rate:
            yield Diagnostic.error(
                "E203",
                f"children of {s.cls.label} are guaranteed {_fmt(total)} in all, "
                f"above its ceil {_fmt(ceil)}",
                children[-1].span,
                Note("ceil given here", ceil.span),
            )
        elif total > parent_rate.bits_per_second:
            yield Diagnostic.error(
                "E201",
                f"children of {s.cls.label} are guaranteed {_fmt(total)} in all, "
                f"above its rate {_fmt(parent_rate)}",
                children[-1].span,
                Note("rate given here", parent_rate.span),
            )
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Cbq) and q.bandwidth is not None:
                tops = [r for c in q.classes if (r := rate_of(c.rate)) is not None]
                total = sum(r.bits_per_second for r in tops)
                if tops and total > q.bandwidth.bits_per_second:
                    yield Diagnostic.error(
                        "E201",
                        f"top-level cbq classes are guaranteed {_fmt(total)} in all, "
                        f"above the bandwidth {_fmt(q.bandwidth)}",
                        tops[-1].span,
                        Note("bandwidth given here", q.bandwidth.span),
                    )


def ceil_within_parent_ceil(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A class's ceil above its parent's can never be reached (warning)."""
    for s in sites(policy):
        if s.parent is None or s.qdisc.kind != "htb":
            continue
        ceil, parent_ceil = rate_of(s.cls.ceil), effective_ceil(s.parent)
        if (
            ceil is not None
            and parent_ceil is not None
            and ceil.bits_per_second > parent_ceil.bits_per_second
        ):
            yield Diagnostic.warning(
                "W301",
                f"ceil {_fmt(ceil)} is above the ceiling {_fmt(parent_ceil)} of "
                f"{s.parent.label}; it can never be reached",
                ceil.span,
                Note("parent's ceiling given here", parent_ceil.span),
            )


def rates_spelled_in_bits(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Warn on ``mbps``-style units: tc reads them as bytes per second."""
    seen: set[tuple[str, int, int]] = set()
    for iface in policy.interfaces:
        for rate in _all_rates(iface):
            for span in rate.byte_units:
                key = (span.file, span.line, span.column)
                if key in seen:
                    continue
                seen.add(key)
                yield Diagnostic.warning(
                    "W302",
                    "tc reads bps/kbps/mbps/gbps as BYTES per second; "
                    f"this is {_fmt(rate.bits_per_second)} (write 'bit' units to mean bits)",
                    span,
                )


def _all_rates(iface: ir.Interface) -> Iterator[ir.Rate]:
    for q in ir.walk_qdiscs(iface.root):
        for value in (
            getattr(q, "rate", None),
            getattr(q, "bandwidth", None),
            getattr(q, "peakrate", None),
        ):
            if isinstance(value, ir.Rate):
                yield value
        for cls in ir.classes_of(q):
            for value in (cls.rate, cls.ceil, cls.weight):
                if isinstance(value, ir.Rate):
                    yield value


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
    """A match line names each field once; alternatives are listed with commas."""
    for s in sites(policy):
        for m in s.cls.matches:
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
        case ir.RawCond():
            return f"u{cond.bits} at {cond.offset}"
        case ir.AllCond():
            return "all"


IPTABLES_PORT_PROTOS = {6: "tcp", 17: "udp", 132: "sctp", 33: "dccp", 136: "udplite"}


def marks_expressible(policy: ir.Policy) -> Iterator[Diagnostic]:
    """With ``classify by mark``, every match must be expressible as an iptables rule."""
    for s in sites(policy):
        if s.iface.marking is None:
            if s.cls.mark is not None:
                yield Diagnostic.warning(
                    "W303",
                    "'mark' has no effect without 'classify by mark' on the interface",
                    s.cls.mark.span,
                )
            continue
        for m in s.cls.matches:
            if m.pref is not None:
                yield Diagnostic.error(
                    "E209",
                    "'pref' orders u32 filters; with 'classify by mark' the order is the "
                    "order of the match lines",
                    m.pref.span,
                )
            protos = [c for c in m.conds if isinstance(c, ir.ProtoCond)]
            for cond in m.conds:
                if isinstance(cond, ir.RawCond | ir.TcpAckCond):
                    what = "raw u32 keys" if isinstance(cond, ir.RawCond) else "tcp-ack"
                    yield Diagnostic.error(
                        "E209",
                        f"{what} cannot be expressed as an iptables rule; "
                        "use u32 classification (drop 'classify by mark')",
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
                    if not protos or any(
                        n not in IPTABLES_PORT_PROTOS for p in protos for n, _ in p.protocols
                    ):
                        yield Diagnostic.error(
                            "E209",
                            "iptables matches ports only with 'proto tcp' or 'proto udp' "
                            "on the same match line",
                            cond.span,
                        )


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


CHECKS: tuple[Check, ...] = (
    required_parameters_present,
    values_in_range,
    values_fit_the_kernel,
    ceil_not_below_rate,
    children_fit_parent,
    ceil_within_parent_ceil,
    rates_spelled_in_bits,
    htb_tree_fits,
    matches_reach_leaves,
    conditions_given_once,
    marks_expressible,
    marks_unique,
)


def run_checks(policy: ir.Policy) -> list[Diagnostic]:
    """Run every check and return all diagnostics."""
    return [d for check in CHECKS for d in check(policy)]
