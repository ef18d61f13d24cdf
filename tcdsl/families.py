"""Checks of a dual-stack policy: the address families match lines apply to, what flower can
say, the prefs IPv6 filters take, and what u32 reads on IPv6.

They rest on :mod:`tcdsl.lower`'s semantics (``match_families``, ``implied_families``,
``family_alternatives``, ``flower_problem``), so what a check reports and what allocation
emits agree.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from tcdsl import allocate, ir, lower
from tcdsl.diagnostics import Diagnostic, Note, Span

NAMES: dict[ir.Family, str] = {"ipv4": "IPv4", "ipv6": "IPv6"}


def _families_text(families: tuple[ir.Family, ...]) -> str:
    return " and ".join(NAMES[f] for f in families) if families else "no family"


def _spec_text(spec: ir.FamilySpec) -> str:
    return "both" if len(spec.families) == 2 else spec.families[0]


@ir.per_node
def lines_of(iface: ir.Interface) -> tuple[ir.Match, ...]:
    """Every match line of a tree (classes' lines and ingress policers), in order."""
    return tuple(m for q in ir.walk_qdiscs(iface.root) for _, m in ir.matches_of(q))


@ir.per_node
def filter_lines(iface: ir.Interface) -> tuple[ir.Match, ...]:
    """The match lines of a tree that become filters (with ``classify by mark``, those with
    their own ``pref``; the others become firewall rules)."""
    marks = iface.marking is not None
    return tuple(m for m in lines_of(iface) if not marks or m.pref is not None)


# ---- E258 / W363: families that cannot meet ---------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class _Value:
    """One value of a condition (the ``index``-th of ``cond``), with the families it can match
    (both for most); its words are made only for a message."""

    families: frozenset[ir.Family]
    span: Span
    cond: ir.Cond
    index: int = 0

    @property
    def text(self) -> str:
        match self.cond:
            case ir.AddrCond():
                net = self.cond.networks[self.index][0]
                return f"{self.cond.field} {lower.address_text(net)}"
            case ir.ProtoCond():
                number = self.cond.protocols[self.index][0]
                return f"proto {_PROTO_NAMES.get(number, number)}"
            case _:
                return ""


_BOTH = frozenset(ir.FAMILIES)
_ONLY: dict[ir.Family, frozenset[ir.Family]] = {f: frozenset({f}) for f in ir.FAMILIES}


def _values(cond: ir.Cond) -> tuple[_Value, ...]:
    match cond:
        case ir.AddrCond():
            return tuple(
                _Value(_ONLY[ir.family_of(net)], span, cond, i)
                for i, (net, span) in enumerate(cond.networks)
            )
        case ir.ProtoCond():
            return tuple(
                _Value(_ONLY[only] if (only := lower.FAMILY_PROTOCOLS.get(number)) else _BOTH,
                       span, cond, i)
                for i, (number, span) in enumerate(cond.protocols)
            )  # fmt: skip
        case _:
            return (_Value(_BOTH, cond.span, cond),)


_PROTO_NAMES = {1: "icmp", 58: "icmpv6"}


def _tree_family_note(iface: ir.Interface) -> tuple[Note, ...]:
    return (Note("the tree's family", iface.family.span),) if iface.family is not None else ()


def _why_excluded(m: ir.Match, iface: ir.Interface) -> tuple[str, tuple[Note, ...]]:
    """Why ``m`` applies to the families it does (what :func:`lower.match_families` says)."""
    if m.family is not None:
        return f"its 'family {_spec_text(m.family)}'", (Note("the line's family", m.family.span),)
    if any(isinstance(c, ir.RawCond) for c in m.conds):
        return (
            "its raw offsets read the IPv4 header; give the line 'family ipv6' for offsets "
            "in the IPv6 header",
            (),
        )
    assert iface.family is not None
    return f"the tree's 'family {_spec_text(iface.family)}'", _tree_family_note(iface)


def _left_out(
    value: _Value, conds: list[tuple[_Value, ...]], wanted: tuple[ir.Family, ...]
) -> tuple[ir.Family, _Value | None] | None:
    """None when ``value`` takes part in some alternative that matches a family of ``wanted``;
    else (its family, the first value of the condition that rules it out, or None when the
    line's families do)."""
    (family, *_) = sorted(value.families)
    if not value.families & set(wanted):
        return family, None
    for other in conds:
        if value in other:
            continue
        if not any(value.families & o.families for o in other):
            return family, other[0]
    return None


def _possible(conds: list[tuple[_Value, ...]], wanted: tuple[ir.Family, ...]) -> bool:
    return any(all(any(f in v.families for v in values) for values in conds) for f in wanted)


def _reason(
    value: _Value,
    family: ir.Family,
    other: _Value | None,
    m: ir.Match,
    iface: ir.Interface,
) -> tuple[str, tuple[Note, ...]]:
    if other is None:
        why, notes = _why_excluded(m, iface)
        wanted = lower.match_families(m, iface.families)
        return (
            f"'{value.text}' is {NAMES[family]}, and this line applies to "
            f"{_families_text(wanted)} only ({why})",
            notes,
        )
    (theirs, *_) = sorted(other.families)
    return (
        f"'{value.text}' is {NAMES[family]} and '{other.text}' is {NAMES[theirs]}: a packet is "
        "of one family",
        (Note(f"the {NAMES[theirs]} value", other.span),),
    )


def match_families_meet(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E258 / W363: a match line asks for families its tree classifies, and its values (the
    families of its addresses, ICMP or ICMPv6) can meet in one packet."""
    for iface, m in ((i, m) for i in policy.interfaces for m in lines_of(i)):
        if m.family is not None:
            missing = [f for f in m.family.families if f not in iface.families]
            if missing:
                yield Diagnostic.error(
                    "E258",
                    f"'family {_spec_text(m.family)}' asks for {_families_text(tuple(missing))}, "
                    f"which this tree does not classify: it classifies "
                    f"{_families_text(iface.families)} only",
                    m.family.span,
                    *_tree_family_note(iface),
                )
                continue
        wanted = lower.match_families(m, iface.families)
        if len(m.conds) < 2 and len(wanted) == len(ir.FAMILIES):
            # (most lines) the values of one condition, under both families: each matches
            # a family the line applies to, and no other condition rules it out
            continue
        if not wanted:
            yield Diagnostic.error(
                "E258",
                "this line reads raw offsets of the IPv4 header, and its tree classifies IPv6 "
                "only: it never matches; give the line 'family ipv6' for offsets in the IPv6 "
                "header",
                m.span,
                *_tree_family_note(iface),
            )
            continue
        conds = [_values(c) for c in m.conds]
        left_out = [
            (value, out)
            for values in conds
            for value in values
            if len(value.families) == 1 and (out := _left_out(value, conds, wanted))
        ]
        if left_out and not _possible(conds, wanted):
            value, out = left_out[0]
            message, notes = _reason(value, *out, m, iface)
            yield Diagnostic.error(
                "E258", f"this match line never matches: {message}", value.span, *notes
            )
            continue
        for value, out in left_out:
            message, notes = _reason(value, *out, m, iface)
            advice = "" if out[1] is None else ": write it on a match line of its own"
            yield Diagnostic.warning(
                "W363",
                f"{message}; it is left out of this line (the line's other values still "
                f"match){advice}",
                value.span,
                *notes,
            )


# ---- E259: what flower cannot say -------------------------------------------------------------


def _flower_words(cond: ir.Cond) -> str:
    match cond:
        case ir.TcpAckCond():
            return (
                "flower cannot say 'tcp-ack': the idiom tests the packet length (a payload "
                "under 64 bytes), which flower does not see"
            )
        case ir.RawCond():
            return (
                f"flower cannot say raw offsets ('u{cond.bits} ... at {cond.offset}'): it "
                "matches header fields by name"
            )
        case ir.PortCond():
            port = cond.ports[0]
            return (
                f"flower takes a port or a range of ports, and {port.lo:#06x}/{port.mask:#06x} "
                "is neither; write the ports as ranges"
            )
        case ir.ProtoCond():
            number = cond.protocols[0][0]
            name = lower.PROTO_NAMES.get(number, f"protocol {number}")
            return f"flower reads ports of TCP, UDP and SCTP only, not of {name}"
        case _:
            return "flower cannot say this condition"


def flower_says_every_line(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E259: under ``classifier flower``, every filter's conditions are fields flower has."""
    for iface in policy.interfaces:
        if iface.classifier != "flower":
            continue
        span = iface.classifier_span
        notes = (Note("flower chosen here", span),) if span is not None else ()
        for m in filter_lines(iface):
            seen: set[Span] = set()
            for _, alt in lower.filter_alternatives(m, iface.families, "flower"):
                cond = lower.flower_problem(alt)
                if cond is None or cond.span in seen:
                    continue
                seen.add(cond.span)
                yield Diagnostic.error(
                    "E259",
                    f"{_flower_words(cond)}; 'classifier u32' can (on the tree, or on a "
                    "direction of its own)",
                    cond.span,
                    *notes,
                )


# ---- E260: prefs of IPv6 filters --------------------------------------------------------------


def prefs_leave_room_for_ipv6(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E260: in a tree with IPv6 filters, every ``pref`` is at most ``allocate.MAX_PREF``."""
    for iface in policy.interfaces:
        if "ipv6" not in iface.families:
            continue
        prefs = [m.pref for m in lines_of(iface)]
        if iface.marking is not None:
            prefs.append(iface.marking.pref)
        for pref in prefs:
            if pref is not None and pref.value > allocate.MAX_PREF:
                yield Diagnostic.error(
                    "E260",
                    f"pref {pref.value} is above {allocate.MAX_PREF}: this tree classifies "
                    f"IPv6 too, and an IPv6 filter's pref is its line's pref + "
                    f"{allocate.IPV6_PREF_OFFSET} (the kernel holds one protocol per pref, up "
                    f"to {allocate.MAX}), so prefs above {allocate.MAX_PREF} are the IPv6 "
                    "filters'; give a lower pref, or 'family ipv4' to the tree",
                    pref.span,
                )


# ---- I321: where IPv6 goes in an IPv4-only tree ----------------------------------------------


def _unclassified(root: ir.Qdisc) -> str:
    match root:
        case ir.Ingress():
            return "pass unpoliced"
        case ir.Htb() | ir.Hfsc() if root.default is not None:
            return f"go to the default class '{root.default.name}'"
        case ir.Htb():
            return "leave through htb's direct queue, unshaped (the htb has no default class)"
        case ir.Hfsc():
            return "are dropped (the hfsc has no default class)"
        case ir.Prio():
            return "go to the band the priomap gives their traffic class"
        case _:
            return "go where the qdisc sends unclassified packets"


def ipv6_has_a_place(policy: ir.Policy) -> Iterator[Diagnostic]:
    """I321: a tree whose filters are all IPv4 says where IPv6 packets go, once."""
    for iface in policy.interfaces:
        lines = lines_of(iface)
        if not lines:
            continue
        families: set[ir.Family] = set()
        for m in lines:  # until a line has an IPv6 filter (the first, mostly)
            families.update(f for f, _ in lower.family_alternatives(m, iface.families))
            if "ipv6" in families:
                break
        if "ipv6" in families or not families:
            continue
        where = _unclassified(iface.root)
        if iface.family is not None and iface.families == ("ipv4",):
            yield Diagnostic.info(
                "I321",
                f"this tree classifies IPv4 only: its IPv6 packets {where}",
                iface.family.span,
            )
        else:
            yield Diagnostic.info(
                "I321",
                "every match line of this tree matches IPv4 only (IPv4 addresses, ICMP or raw "
                f"offsets): its IPv6 packets {where}; a line without addresses matches both "
                "families",
                iface.span,
            )


# ---- W362: ports u32 cannot find on IPv6 ------------------------------------------------------

EXTENSION_HEADERS = {
    0: "hop-by-hop options",
    43: "routing",
    44: "fragment",
    60: "destination options",
    135: "mobility",
    139: "HIP",
    140: "shim6",
}
"""IPv6 next headers that are extension headers (ESP and AH have no ports: E214)."""


def _ipv6_protocols(
    iface: ir.Interface, numbers: Collection[int]
) -> Iterator[tuple[ir.Match, ir.ProtoCond]]:
    """The ``proto`` values in ``numbers`` of the filter lines of ``iface``, where the line
    applies to IPv6, once each."""
    for m in filter_lines(iface):
        if not any(isinstance(c, ir.ProtoCond) for c in m.conds):
            continue  # (most lines) no proto value in any alternative
        seen: set[Span] = set()
        for family, alt in lower.family_alternatives(m, iface.families):
            for cond in alt:
                if family != "ipv6" or not isinstance(cond, ir.ProtoCond):
                    continue
                if cond.protocols[0][0] in numbers and cond.span not in seen:
                    seen.add(cond.span)
                    yield m, cond


def ipv6_ports_where_u32_reads(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W362: an IPv6 u32 filter reads ports right after the fixed header; with the next header
    an extension header, those bytes are the extension header's, never the ports (ip6tables,
    for lines that become marking rules, finds ports past extension headers)."""
    for iface in policy.interfaces:
        if iface.classifier != "u32" or "ipv6" not in iface.families:
            continue
        for m, cond in _ipv6_protocols(iface, EXTENSION_HEADERS):
            ports = next((c for c in m.conds if isinstance(c, ir.PortCond)), None)
            if ports is None:
                continue
            number = cond.protocols[0][0]
            yield Diagnostic.warning(
                "W362",
                f"next header {number} is the IPv6 {EXTENSION_HEADERS[number]} header: u32 "
                "reads the ports 40 bytes in, right after the fixed header, which are that "
                "header's bytes, never the ports; 'classifier flower' finds ports past "
                "hop-by-hop, routing and destination options headers (in no fragment), and "
                "ip6tables ('classify by mark') past every extension header (in first "
                "fragments)",
                ports.span,
                Note("the extension header given here", cond.span),
            )


FLOWER_WALKS = (0, 43, 44, 60)
"""The extension headers the flow dissector walks past on IPv6 (hop-by-hop, routing, fragment,
destination options): flower's ``ip_proto`` is what follows them, never they."""


def extension_headers_flower_sees(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W364: under flower, ``proto`` of an extension header the flow dissector walks past never
    matches an IPv6 packet."""
    for iface in policy.interfaces:
        if iface.classifier != "flower" or "ipv6" not in iface.families:
            continue
        for _, cond in _ipv6_protocols(iface, FLOWER_WALKS):
            number = cond.protocols[0][0]
            yield Diagnostic.warning(
                "W364",
                f"flower's protocol is the one after the IPv6 {EXTENSION_HEADERS[number]} "
                f"header (the kernel's flow dissector walks past it), never {number}: this "
                "value matches no IPv6 packet; 'classifier u32' compares the next header of "
                "the fixed header",
                cond.span,
            )


# ---- W365: IPv4-mapped IPv6 addresses ---------------------------------------------------------


def mapped_addresses(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W365: an IPv4-mapped IPv6 address or network (``::ffff:10.0.0.1``) on a match line.
    No IPv6 packet carries one (a socket sends IPv4 to it), so it matches nothing; the IPv4
    address it stands for does. (A subscriber table refuses one: E029.)"""
    for iface in policy.interfaces:
        for m in lines_of(iface):
            for cond in m.conds:
                if not isinstance(cond, ir.AddrCond):
                    continue
                for net, span in cond.networks:
                    v4 = ir.mapped_ipv4(net)
                    if v4 is None:
                        continue
                    yield Diagnostic.warning(
                        "W365",
                        "an IPv4-mapped IPv6 address, which no IPv6 packet carries (a socket "
                        "sends IPv4 to it): this value matches nothing; write "
                        + lower.address_text(v4),
                        span,
                    )


CHECKS = (
    match_families_meet,
    mapped_addresses,
    flower_says_every_line,
    prefs_leave_room_for_ipv6,
    ipv6_ports_where_u32_reads,
    extension_headers_flower_sees,
    ipv6_has_a_place,
)
