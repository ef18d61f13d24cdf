"""The class tree as a diagram model, shared by the ``dot`` and ``mermaid`` backends.

Not a backend itself: it turns an allocated policy into clusters (one per interface) of nodes
(one per qdisc and class) and parent -> child edges, with every label line in plain words.
The backends only escape and lay out those words in their own syntax.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, assert_never

from tcdsl import ir
from tcdsl.allocate import default_minor
from tcdsl.commands import MARK_TOOL, curve_words, hfsc_curves, qdisc_words, stab_words
from tcdsl.lower import family_alternatives
from tcdsl.units import format_rate, format_size
from tcdsl.words import leaf_words, match_words, rate_line

NodeKind = Literal["qdisc", "class"]


@dataclass(frozen=True, slots=True)
class Node:
    """One box: a bold title and lines of plain text, never escaped."""

    id: str
    kind: NodeKind
    title: str
    lines: tuple[str, ...]
    default: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    """Parent -> child."""

    tail: str
    head: str


@dataclass(frozen=True, slots=True)
class Cluster:
    """One interface: its title lines, its nodes in pre-order, and the edges between them."""

    id: str
    title: tuple[str, ...]
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]


# ---- node labels -----------------------------------------------------------------------------


def _qdisc_title(q: ir.Qdisc) -> str:
    assert q.handle is not None
    return f"{q.kind} {q.handle.qdisc}"


FAMILY_WORDS: dict[tuple[ir.Family, ...], str] = {
    ("ipv4",): "IPv4",
    ("ipv6",): "IPv6",
    ("ipv4", "ipv6"): "IPv4+IPv6",
}


def family_words(families: tuple[ir.Family, ...]) -> str:
    """``IPv4``, ``IPv6``, ``IPv4+IPv6``."""
    return FAMILY_WORDS.get(families, "no family")


def line_words(m: ir.Match, families: tuple[ir.Family, ...]) -> str:
    """A match line in short words, after the families it applies to when those are fewer
    than the tree's (``families``): ``IPv6 src 2001:db8::/64``, ``IPv4 proto icmp``."""
    own = {f for f, _ in family_alternatives(m, families)}
    applies = tuple(f for f in ir.FAMILIES if f in own)
    words = match_words(m)
    return words if applies == families else f"{family_words(applies)} {words}"


def qdisc_lines(q: ir.Qdisc, families: tuple[ir.Family, ...] = ir.FAMILIES) -> tuple[str, ...]:
    """The options of a qdisc, as tc spells them; an htb's default class by name."""
    if isinstance(q, ir.Htb | ir.Hfsc):
        lines: list[str] = []
        minor = default_minor(q)
        if q.default is not None and q.handle is not None and minor is not None:
            lines.append(f"default {q.default.name} ({ir.Handle(q.handle.major, minor)})")
        elif isinstance(q, ir.Hfsc):
            lines.append("no default: drops unclassified packets")
        if isinstance(q, ir.Htb) and q.r2q is not None:
            lines.append(f"r2q {q.r2q.value}")
        return tuple(lines)
    if isinstance(q, ir.Ingress):
        return tuple(f"match {line_words(m, families)}" for m in q.matches) or ("no policers",)
    options = " ".join(qdisc_words(q)[1:])
    return (options,) if options else ()


def _extras(cls: ir.Class) -> str | None:
    words: list[str] = []
    for key in ("burst", "cburst", "quantum", "allot", "avpkt"):
        size = getattr(cls, key)
        if size is not None:
            words.append(f"{key} {format_size(size.bytes)}")
    if cls.weight is not None:
        words.append(f"weight {format_rate(cls.weight.bits_per_second)}")
    for key in ("maxburst", "minburst"):
        count = getattr(cls, key)
        if count is not None:
            words.append(f"{key} {count.value}")
    return ", ".join(words) or None


def bound_words(bound: ir.Bound) -> str:
    """What sets a bound, briefly: ``site 1:10``, ``the link class 1:1``, ``tbf 2:``."""
    by = bound.by
    if isinstance(by, ir.Class):
        return f"{'the link class' if by.implicit else by.name} {by.classid}"
    return _qdisc_title(by)


def class_lines(
    kind: str,
    cls: ir.Class,
    marking: bool,
    default: bool,
    capped: ir.Bound | None = None,
    families: tuple[ir.Family, ...] = ir.FAMILIES,
    root: bool = False,
) -> tuple[str, ...]:
    """The lines of a class box below its name: id, rates, prio, leaf qdisc, what reaches it.

    ``capped``: what keeps the class below its own ceiling (an ancestor, or what holds its
    qdisc), if anything does; ``families``: the tree's (a match line names its own when it
    applies to fewer); ``root``: no class is above it (an htb one has nothing to borrow from).
    """
    assert cls.classid is not None
    lines = [f"classid {cls.classid}"]
    rate = rate_line(kind, cls, root)
    if rate is not None:
        lines.append(rate)
    lines.extend(" ".join([key, *curve_words(curve)]) for key, curve in hfsc_curves(cls))
    if capped is not None:
        lines.append(f"capped at {format_rate(capped.bits_per_second)} by {bound_words(capped)}")
    if cls.prio is not None:
        lines.append(f"prio {cls.prio.value}")
    extras = _extras(cls)
    if extras is not None:
        lines.append(extras)
    if isinstance(cls.leaf, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
        lines.append(f"leaf: {_qdisc_title(cls.leaf)} (classful, below)")
    elif not cls.children:
        lines.append(f"leaf: {leaf_words(cls.leaf)}")
    for m in cls.matches:
        # With marks, a line that keeps its own pref is still a u32 filter.
        if marking and cls.fwmark is not None and m.pref is None:
            lines.append(f"mark {cls.fwmark}: {line_words(m, families)}")
        else:
            lines.append(f"match {line_words(m, families)}")
    if marking and cls.fwmark is not None and default:
        lines.append(f"mark {cls.fwmark}: unmarked traffic")
    if marking and cls.set_dscp is not None:
        lines.append(f"set dscp {cls.set_dscp.value}")
    if default:
        lines.append("default class")
    return tuple(lines)


# ---- the tree ----------------------------------------------------------------------------------


@dataclass
class _Builder:
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    count: int = 0
    bounds: dict[int, ir.Bound | None] = field(default_factory=dict)
    """``id(qdisc)`` -> the most it can send, for the qdiscs below a root."""
    families: tuple[ir.Family, ...] = ir.FAMILIES
    """The families of the tree being built."""

    def new_id(self) -> str:
        self.count += 1
        return f"n{self.count}"

    def add(self, node: Node, parent: str | None) -> None:
        self.nodes.append(node)
        if parent is not None:
            self.edges.append(Edge(parent, node.id))

    def qdisc(self, q: ir.Qdisc, parent: str | None, marking: bool) -> None:
        lines = qdisc_lines(q, self.families)
        bound = self.bounds.get(id(q))
        if bound is not None and isinstance(q, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
            rate = format_rate(bound.bits_per_second)
            lines += (f"sends at most {rate} ({bound_words(bound)})",)
        node = Node(self.new_id(), "qdisc", _qdisc_title(q), lines)
        self.add(node, parent)
        match q:
            case ir.Htb() | ir.Prio() | ir.Cbq() | ir.Hfsc():
                default = None
                if isinstance(q, ir.Htb | ir.Hfsc) and q.handle is not None:
                    minor = default_minor(q)
                    default = None if minor is None else ir.Handle(q.handle.major, minor)
                parents = ir.parent_map(q)
                for cls in q.classes:
                    self.klass(q, cls, node.id, default, marking, parents)
            case ir.Tbf() | ir.Netem():
                if q.child is not None:
                    self.qdisc(q.child, node.id, marking)
            case ir.Mq():
                for queue in q.queues:
                    self.qdisc(queue.qdisc, node.id, marking)
            case (
                ir.Sfq()
                | ir.FqCodel()
                | ir.Pfifo()
                | ir.Bfifo()
                | ir.PfifoFast()
                | ir.Ingress()
                | ir.Cake()
            ):
                pass
            case ir.Codel() | ir.Fq() | ir.FqPie() | ir.Red():
                pass
            case _:
                assert_never(q)

    def klass(
        self,
        q: ir.ClassfulQdisc,
        cls: ir.Class,
        parent: str,
        default: ir.Handle | None,
        marking: bool,
        parents: dict[int, ir.Class | None],
    ) -> None:
        is_default = default is not None and cls.classid == default
        title = "link class" if cls.implicit else cls.name
        outer = self.bounds.get(id(q))
        above = parents.get(id(cls))
        bound = ir.class_bound(q, above, parents, outer) if above is not None else outer
        own = ir.own_bound(q, cls, parents)
        capped = bound if own and bound and bound.bits_per_second < own.bits_per_second else None
        root = above is None and not cls.implicit
        lines = class_lines(q.kind, cls, marking, is_default, capped, self.families, root)
        node = Node(self.new_id(), "class", title, lines, is_default)
        self.add(node, parent)
        for child in cls.children:
            self.klass(q, child, node.id, default, marking, parents)
        if cls.leaf is not None:
            self.qdisc(cls.leaf, node.id, marking)


def interface_title(iface: ir.Interface, upload: bool = False) -> tuple[str, ...]:
    """``interface eth0`` (``interface eth0 upload`` when ``upload`` says the policy also
    shapes or polices its arrivals, ``interface eth0 download (via ifb4eth0)``, ``interface
    eth0 ingress``), the families it classifies (``IPv4+IPv6``; ``IPv6 only, flower filters``),
    and how its packets are classified when that is by mark."""
    title = [f"interface {iface.label}{' upload' if upload else ''}"]
    families = family_words(iface.families)
    only = " only" if len(iface.families) == 1 else ""
    flower = ", flower filters" if iface.classifier == "flower" else ""
    title.append(f"{families}{only}{flower}")
    m = iface.marking
    if m is not None:
        tables = " and ".join(MARK_TOOL[f] for f in iface.families)
        chain = f", {tables} chain {m.chain}" if m.chain else ""
        where = {"output": "from local", "postrouting": "at postrouting"}.get(
            m.hook, f"from {m.from_interface or 'any'}"
        )
        title.append(f"classified by mark {where}{chain}")
    if iface.stab is not None:
        title.append(" ".join(stab_words(iface.stab)))
    return tuple(title)


def redirect_node(node_id: str, iface: ir.Interface, download: ir.Download) -> Node:
    """The ingress qdisc on the downloading interface, whose one filter redirects every
    arriving packet to the IFB ``iface`` is on (restoring its connection mark first)."""
    lines = [f"every protocol: mirred redirect to {iface.name}"]
    if download.connmark:
        lines.insert(0, "connmark: restores the connection's mark")
    title = f"ingress {ir.INGRESS_HANDLE.qdisc} on {download.interface}"
    return Node(node_id, "qdisc", title, tuple(lines))


def clusters(policy: ir.Policy) -> Iterator[Cluster]:
    """Yield one cluster per tree (an interface's egress, the IFB of its downloads with the
    redirect into it, its ingress policers), in the order written; node ids are unique
    overall."""
    builder = _Builder()
    arriving = {i.interface for i in policy.interfaces if i.direction != "egress"}
    for index, iface in enumerate(policy.interfaces):
        first_node, first_edge = len(builder.nodes), len(builder.edges)
        builder.bounds = {id(q): bound for q, _, bound in ir.held_qdiscs(iface.root)}
        builder.families = iface.families
        redirect = None
        if iface.download is not None:
            redirect = redirect_node(builder.new_id(), iface, iface.download)
            builder.add(redirect, None)
        builder.qdisc(iface.root, redirect.id if redirect else None, iface.marking is not None)
        upload = iface.direction == "egress" and iface.name in arriving
        yield Cluster(
            f"if{index}",
            interface_title(iface, upload),
            tuple(builder.nodes[first_node:]),
            tuple(builder.edges[first_edge:]),
        )
