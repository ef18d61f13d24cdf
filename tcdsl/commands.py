"""The tc and iptables commands that build an allocated policy, shared by the backends that
drive those tools (the shell script, ``tc -batch`` files).

Commands come in an order that never leaves a packet unshaped or in a wrong class while
they run: a qdisc, the path to its default class, its filters in their final order (each
once the class it sends to is complete), then the classes no filter names (see ``_below``).
Every word is a plain string; backends quote.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, assert_never

from tcdsl import ir, linklayer
from tcdsl.allocate import default_minor
from tcdsl.diagnostics import Diagnostic, Span
from tcdsl.frontend.chains import default_chain as default_chain  # for the backends
from tcdsl.lower import address_text, iptables_words, nft_words
from tcdsl.matching import kernel_order
from tcdsl.units import format_rate, format_size, format_time


@ir.quick_init
@dataclass(frozen=True, slots=True)
class Command:
    """One command: the tool, its arguments, and the policy text it comes from."""

    tool: Literal["tc", "iptables", "ip6tables", "ip"]
    args: tuple[str, ...]
    span: Span
    what: str

    @property
    def origin(self) -> str:
        """The policy text it comes from, as scripts and files name it: ``FILE:LINE:COL: what``."""
        s = self.span
        return f"{s.file}:{s.line}:{s.column}: {self.what}"


def _pct(value: Fraction) -> str:
    return f"{float(value):.12g}%"  # tc reads it with strtod: 1e-07% is fine


def _opt(words: list[str], key: str, value: object) -> None:
    match value:
        case None | False:
            return
        case True:
            words.append(key)
        case ir.Rate():
            words += [key, format_rate(value.bits_per_second)]
        case ir.Size() if key in ("quantum", "initial_quantum"):
            # htb, fq_codel and fq read quantum as a plain number ("quantum 2k" is Illegal).
            words += [key, str(value.bytes)]
        case ir.Size():
            words += [key, format_size(value.bytes)]
        case ir.Time():
            words += [key, format_time(value.microseconds)]
        case ir.Count():
            words += [key, str(value.value)]
        case ir.Percent():
            words += [key, _pct(value.value)]
        case _:
            raise TypeError(f"cannot spell {value!r}")


def _opts(words: list[str], node: object, keys: tuple[str, ...]) -> None:
    """``_opt`` for each of ``node``'s attributes ``keys`` (most are None: skipped here)."""
    for key in keys:
        value = getattr(node, key)
        if value is not None:
            _opt(words, key, value)


def qdisc_words(q: ir.Qdisc) -> list[str]:
    """The kind and options of a qdisc, as tc takes them after ``handle N:``."""
    words: list[str] = [q.kind]
    match q:
        case ir.Htb():
            minor = default_minor(q)
            if minor is not None:
                words += ["default", f"{minor:x}"]
            _opt(words, "r2q", q.r2q)
            if q.chosen_r2q is not None:
                words += ["r2q", str(q.chosen_r2q)]
        case ir.Hfsc():
            minor = default_minor(q)
            if minor is not None:
                words += ["default", f"{minor:x}"]
        case ir.Prio():
            _opt(words, "bands", q.bands)
            if q.priomap is not None:
                words += ["priomap", *(str(v.value) for v in q.priomap)]
        case ir.Cbq():
            _opt(words, "bandwidth", q.bandwidth)
            _opt(words, "avpkt", q.avpkt)
        case ir.Tbf():
            _opts(words, q, ("rate", "burst", "latency", "limit", "peakrate", "mtu"))
        case ir.Netem():
            _netem_words(words, q)
        case ir.Sfq():
            _opts(words, q, ("limit", "perturb", "quantum", "depth", "divisor"))
        case ir.FqCodel():
            _opts(words, q, ("limit", "flows", "target", "interval", "quantum", "memory_limit"))
            if q.ecn is not None:
                words.append("ecn" if q.ecn else "noecn")
        case ir.Pfifo() | ir.Bfifo():
            _opt(words, "limit", q.limit)
        case ir.PfifoFast():
            pass
        case ir.Cake():
            words += cake_words(q)
        case ir.Codel():
            _opts(words, q, ("limit", "target", "interval", "ce_threshold"))
            _either(words, q.ecn, "ecn", "noecn")
        case ir.Fq():
            _opts(words, q, ("limit", "flow_limit", "quantum", "initial_quantum", "maxrate"))
            _opts(words, q, ("buckets", "refill_delay", "low_rate_threshold", "orphan_mask"))
            _opts(words, q, ("ce_threshold", "horizon"))
            _either(words, q.pacing, "pacing", "nopacing")
            _either(words, q.horizon_drop, "horizon_drop", "horizon_cap")
        case ir.FqPie():
            _opts(words, q, ("limit", "flows", "target", "tupdate", "alpha", "beta", "quantum"))
            _opt(words, "memory_limit", q.memory_limit)
            _opt(words, "ecn_prob", q.ecn_prob)
            _either(words, q.ecn, "ecn", "noecn")
            _either(words, q.bytemode, "bytemode", "nobytemode")
        case ir.Red():
            _opts(words, q, ("limit", "min", "max", "avpkt", "burst", "bandwidth"))
            if q.probability is not None:
                words += ["probability", f"{float(q.probability.value / 100):.12g}"]
            _opts(words, q, ("ecn", "harddrop", "adaptive"))
    return words


def cake_words(q: ir.Cake) -> list[str]:
    """A cake's options; a link layer is always spelled with a number (``overhead 40 atm``)."""
    words: list[str] = []
    _opt(words, "bandwidth", q.bandwidth)
    for word in (q.unlimited, q.diffserv, q.isolate, q.nat, q.wash, q.ack_filter, q.split_gso):
        if word is not None:
            words.append(word.value)
    if q.mode is not None:
        words.append(q.mode.value)
    _opt(words, "rtt", q.rtt)
    _opt(words, "memlimit", q.memlimit)
    if q.fwmark is not None:
        words += ["fwmark", f"{q.fwmark.value:#x}"]
    if q.overhead is not None:
        words += cake_overhead_words(q.overhead)
    return words


def cake_overhead_words(o: ir.Overhead) -> list[str]:
    """A cake's link layer: ``overhead N`` (which makes cake count from the IP packet), the
    framing, the mpu."""
    words = ["overhead", str(o.overhead.value), CAKE_LINKLAYER[o.linklayer]]
    if o.mpu is not None and o.mpu.value:
        words += ["mpu", str(o.mpu.value)]
    return words


CAKE_LINKLAYER = {"ethernet": "noatm", "atm": "atm", "ptm": "ptm"}


def stab_words(o: ir.Overhead) -> list[str]:
    """A root qdisc's size table (tc-stab(8)), before its kind: the overhead is 14 bytes less
    than tcdsl's, as the kernel adds it to a length that holds the Ethernet header."""
    words = ["stab", "overhead", str(linklayer.stab_overhead(o.overhead.value))]
    words += ["linklayer", o.linklayer]
    if o.mpu is not None and o.mpu.value:
        words += ["mpu", str(o.mpu.value)]
    if o.mtu is not None:
        words += ["mtu", str(o.mtu.bytes)]
    if o.tsize is not None:
        words += ["tsize", str(o.tsize.value)]
    return words


def curve_words(curve: ir.Curve) -> list[str]:
    """One hfsc service curve's words after ``rt``/``ls``/``ul``/``sc``: always ``m1 d m2``.

    A curve written as ``umax dmax rate`` is given to tc converted (by the frontend, as tc
    converts it): tc 6.1 computes a convex curve's ``umax * 1000000 / rate`` in 32 bits, so a
    umax above 4294 bytes would wrap and give another ``d`` than the one meant.
    """
    words: list[str] = []
    _opt(words, "m1", curve.m1)
    _opt(words, "d", curve.d)
    _opt(words, "m2", curve.m2)
    return words


def hfsc_curves(cls: ir.Class) -> list[tuple[str, ir.Curve]]:
    """A class's curves as tc takes them: ``sc`` for one curve given as both rt and ls."""
    if cls.rt is not None and cls.rt is cls.ls:
        named = [("sc", cls.rt)]
    else:
        named = [(k, c) for k, c in (("rt", cls.rt), ("ls", cls.ls)) if c is not None]
    return named + ([("ul", cls.ul)] if cls.ul is not None else [])


def _either(words: list[str], value: bool | None, on: str, off: str) -> None:
    if value is not None:
        words.append(on if value else off)


def _netem_words(words: list[str], q: ir.Netem) -> None:
    """netem's words: positional values follow their keyword (``delay 10ms 5ms 25%``)."""
    _opt(words, "limit", q.limit)
    if q.delay is not None:
        words += ["delay", format_time(q.delay.microseconds)]
        if q.jitter is not None:
            words.append(format_time(q.jitter.microseconds))
            if q.delay_correlation is not None:
                words.append(_pct(q.delay_correlation.value))
    if q.distribution is not None:
        words += ["distribution", q.distribution.name]
    for key in ("loss", "duplicate", "corrupt"):
        _opt(words, key, getattr(q, key))
        if key == "loss" and q.loss is not None and q.loss_correlation is not None:
            words.append(_pct(q.loss_correlation.value))
    if q.reorder is not None:
        _opt(words, "reorder", q.reorder)
        if q.reorder_correlation is not None:
            words.append(_pct(q.reorder_correlation.value))
        _opt(words, "gap", q.gap)
    if q.rate is not None:
        _opt(words, "rate", q.rate)
        if q.packetoverhead is not None or q.cellsize is not None:
            words.append(str(q.packetoverhead.value if q.packetoverhead else 0))
        if q.cellsize is not None:
            words.append(str(q.cellsize.value))
    if q.slot is not None:
        words += ["slot", format_time(q.slot.microseconds)]
        if q.slot_max is not None:
            words.append(format_time(q.slot_max.microseconds))


def class_words(kind: str, cls: ir.Class) -> list[str]:
    """The kind and options of a class."""
    words = [kind]
    if kind == "hfsc":
        for key, curve in hfsc_curves(cls):
            words += [key, *curve_words(curve)]
        return words
    keys: tuple[str, ...] = ("rate", "ceil", "burst", "cburst", "prio", "quantum")
    if kind == "cbq":
        keys = (
            "rate",
            "allot",
            "prio",
            "avpkt",
            "weight",
            "maxburst",
            "minburst",
            "bounded",
            "isolated",
        )
    _opts(words, cls, keys)
    if cls.chosen_quantum is not None:
        words += ["quantum", str(cls.chosen_quantum)]
    return words


def _label(q: ir.Qdisc) -> str:
    return f"{q.kind} qdisc"


@ir.per_node
def interface_commands(iface: ir.Interface) -> tuple[Command, ...]:
    """The commands that build ``iface``, teardown excluded (remembered: a backend's
    ``unsupported`` and its ``emit`` both go through them)."""
    return tuple(_interface_commands(iface))


def _interface_commands(iface: ir.Interface) -> Iterator[Command]:
    """Yield the commands that build ``iface``, teardown excluded.

    A download first creates its IFB and builds the tree on it, and only then redirects the
    interface's arrivals to it, so no packet meets a half-built tree.
    """
    dev = ("dev", iface.name)
    root = iface.root
    assert root.handle is not None
    download = iface.download
    if download is not None:
        what = f"interface {download.interface}: download via {iface.name}"
        # ifb's default queue length (32 packets) would also be every default leaf queue's.
        add = ("link", "add", iface.name, "txqueuelen", str(IFB_TXQUEUELEN), "type", "ifb")
        yield Command("ip", add, download.span, what)
        yield Command("ip", ("link", "set", "dev", iface.name, "up"), download.span, what)
    if isinstance(root, ir.Ingress):
        yield Command(
            "tc",
            ("qdisc", "add", *dev, "handle", root.handle.qdisc, "ingress"),
            root.span,
            f"interface {iface.name}: ingress qdisc",
        )
    else:
        # an mq's size table is its queues' qdiscs' (_Tree.below): packets are queued to them
        stab = stab_words(iface.stab) if iface.stab is not None and root.kind != "mq" else []
        yield Command(
            "tc",
            ("qdisc", "add", *dev, "root", "handle", root.handle.qdisc, *stab, *qdisc_words(root)),
            root.span,
            f"interface {iface.name}: {_label(root)}",
        )
    yield from shared_police_actions(iface)
    tree: list[Command] = []
    _Tree(iface, tree).below(root)
    yield from tree
    if iface.marking is not None:
        yield from marking_commands(iface)
    if download is not None:
        yield from redirect_commands(iface, download)


REDIRECT_PREF = 1
IFB_TXQUEUELEN = 1000
"""The queue length tcdsl gives an IFB, an Ethernet device's (the kernel's default for ifb is
32 packets, which default leaf qdiscs would take as their limit)."""


def redirect_commands(iface: ir.Interface, download: ir.Download) -> Iterator[Command]:
    """The ingress qdisc on the downloading interface and its one filter, which sends every
    packet (every protocol, IPv6 and ARP too) to the IFB, restoring the connection's mark
    first when the download classifies by connmark."""
    dev = ("dev", download.interface)
    what = f"interface {download.interface}: download via {iface.name}"
    ingress = ir.INGRESS_HANDLE.qdisc
    yield Command("tc", ("qdisc", "add", *dev, "handle", ingress, "ingress"), download.span, what)
    actions: tuple[str, ...] = ("action", "connmark") if download.connmark else ()
    yield Command(
        "tc",
        (
            "filter",
            "add",
            *dev,
            "parent",
            ingress,
            "protocol",
            "all",
            "prio",
            str(REDIRECT_PREF),
            "u32",
            "match",
            "u32",
            "0",
            "0",
            *actions,
            "action",
            "mirred",
            "egress",
            "redirect",
            "dev",
            iface.name,
        ),
        download.span,
        what,
    )


FILTER_PROTOCOL: dict[ir.Family, str] = {"ipv4": "ip", "ipv6": "ipv6"}
"""A filter's ``protocol`` by family."""


def flower_words(f: ir.FlowerFilter) -> list[str]:
    """The match words of a flower filter (``ip_proto tcp dst_port 443 ...``)."""
    words: list[str] = []
    if f.ip_proto is not None:
        # tc reads a number here as hex (f_flower.c: get_u8(..., 16)): write it so.
        words += ["ip_proto", FLOWER_PROTO_NAMES.get(f.ip_proto, f"{f.ip_proto:#04x}")]
    for key, net in (("src_ip", f.src), ("dst_ip", f.dst)):
        if net is not None:
            words += [key, address_text(net)]
    for key, port in (("src_port", f.sport), ("dst_port", f.dport)):
        if port is not None:
            words += [key, flower_port_text(*port)]
    if f.tos is not None:
        words += ["ip_tos", f"{f.tos[0]:#04x}/{f.tos[1]:#04x}"]
    if f.tcp_flags is not None:
        words += ["tcp_flags", f"{f.tcp_flags[0]:#x}/{f.tcp_flags[1]:#x}"]
    return words


def flower_port_text(lo: int, hi: int) -> str:
    """A port or range as tc's flower takes it: tc refuses a range or port starting at 0
    (``Illegal "dst_port"``), which is written as a value/mask block instead (``0/0xfc00``;
    lower.flower_splits leaves no other range from 0)."""
    if lo == 0:
        return f"0/{0xFFFF ^ hi:#06x}"
    return str(lo) if lo == hi else f"{lo}-{hi}"


FLOWER_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}
"""The ``ip_proto`` values tc's flower takes by name (others as numbers)."""


def police_words(p: ir.Police) -> list[str]:
    """``police rate R burst B [mtu M] VERDICT`` as tc takes it in a filter."""
    words = ["police", "rate", format_rate(p.rate.bits_per_second)]
    words += ["burst", format_size(p.burst.bytes)]
    if p.mtu is not None:
        words += ["mtu", format_size(p.mtu.bytes)]
    return [*words, p.exceed]


def filter_police_words(f: ir.U32Filter | ir.FlowerFilter) -> list[str]:
    """A filter's policer: ``police ...`` (u32) or ``action police ...`` (flower takes only
    actions). A line whose policer spans several filters binds each of them to the tree's
    shared action (``police index N``, made by :func:`shared_police_actions`), so the line has
    one token bucket."""
    if f.police is None:
        return []
    words = police_words(f.police)
    if f.police_index is not None:
        words = ["police", "index", str(f.police_index)]
    return ["action", *words] if isinstance(f, ir.FlowerFilter) else words


def shared_police(iface: ir.Interface) -> dict[int, ir.Police]:
    """The tree's shared police actions: index -> the policer of the line that owns it."""
    out: dict[int, ir.Police] = {}
    for f in iface.filters:
        if isinstance(f, ir.U32Filter | ir.FlowerFilter) and f.police_index is not None:
            assert f.police is not None
            out.setdefault(f.police_index, f.police)
    return out


def shared_police_actions(iface: ir.Interface) -> Iterator[Command]:
    """For each shared police action of the tree, before its filters:
    ``tc actions replace action police RATE ... index N``, which makes it or gives the one a
    previous apply left its rate, burst and verdict.

    The index is the tree's own (its block comes from the tree's label), and ``replace``
    is what keeps re-applying safe: a filter that names an existing index binds to that
    action as it is (tcf_police_init ignores a bound filter's parameters), and the action of
    the filters a moment ago deleted goes only when the kernel has freed them, later (an RCU
    grace period), so an ``add`` there fails with EEXIST and a filter's own parameters would
    not count. The action stays when the tree goes (it holds a reference of its own);
    :func:`teardown_commands` deletes it."""
    for index, police in shared_police(iface).items():
        what = f"police index {index}: the one policer of the filters of this line"
        words = ("actions", "replace", "action", *police_words(police), "index", str(index))
        yield Command("tc", words, police.span, what)


class _Words:
    """What the commands of one interface share, spelled once: the device, each handle, each
    filter's head (``filter add dev D parent P protocol ip prio N``), each u32 bucket.

    A big tree has a class, a qdisc and a filter or two per subscriber, all naming the same
    parents, prefs and buckets: spelling those once makes the commands cheaper to build and
    lets them share the strings (keys are values, so two equal handles share one spelling).
    """

    def __init__(self, iface: ir.Interface) -> None:
        self.dev = iface.name
        self._handles: dict[tuple[int, int], str] = {}
        self._heads: dict[tuple[int, int, ir.Family, int], tuple[tuple[str, ...], bool]] = {}
        self._buckets: dict[tuple[int, int], tuple[str, str]] = {}
        self._targets: dict[str, str] = {}

    def handle(self, h: ir.Handle) -> str:
        """``str(h)``."""
        key = (h.major, h.minor)
        text = self._handles.get(key)
        if text is None:
            text = self._handles[key] = str(h)
        return text

    def head(self, f: ir.Filter | ir.U32Table) -> tuple[tuple[str, ...], bool]:
        """The words of a filter (or u32 table) up to its classifier, and whether it is an mq
        tree's steering filter (on the clsact qdisc's egress hook)."""
        parent = f.parent
        key = (parent.major, parent.minor, f.family, f.pref)
        found = self._heads.get(key)
        if found is None:
            steer = parent == ir.CLSACT_EGRESS
            where = ("egress",) if steer else ("parent", self.handle(parent))
            words = ("filter", "add", "dev", self.dev, *where)
            words += ("protocol", FILTER_PROTOCOL[f.family], "prio", str(f.pref))
            found = self._heads[key] = (words, steer)
        return found

    def place(self, place: ir.U32Place | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """:func:`u32_place_words`, with each bucket's ``ht`` spelled once."""
        if place is None or place.table is None:
            return u32_place_words(place)
        key = (place.table, place.bucket)
        ht = self._buckets.get(key)
        if ht is None:
            ht = self._buckets[key] = ("ht", f"{place.table:x}:{place.bucket:x}:")
        return ("handle", place.handle), ht

    def filter(self, f: ir.Filter) -> Command:
        """:func:`filter_command`."""
        head, steer = self.head(f)
        if steer and not isinstance(f, ir.FwFilter):
            if isinstance(f, ir.FlowerFilter):
                body = ["flower", *flower_words(f)]
            else:
                before, after = self.place(f.place)
                matches = (w for key in f.keys for w in ("match", *key.words))
                body = [*before, "u32", *after, *matches]
            queue = queue_mapping(f.flowid)
            action = ("action", "skbedit", "queue_mapping", str(queue))
            return Command("tc", (*head, *body, *action), f.span, queue_words(f.flowid))
        flowid = self.handle(f.flowid)
        match f:
            case ir.U32Filter():
                keys = [w for key in f.keys for w in ("match", *key.words)]
                police = filter_police_words(f)
                before, after = self.place(f.place)
                return Command(
                    "tc",
                    (*head, *before, "u32", *after, *keys, *police, "flowid", flowid),
                    f.span,
                    self._target(flowid),
                )
            case ir.FlowerFilter():
                police = filter_police_words(f)
                return Command(
                    "tc",
                    (*head, "flower", *flower_words(f), *police, "classid", flowid),
                    f.span,
                    self._target(flowid),
                )
            case ir.FwFilter():
                handle = str(f.mark) if f.mask is None else f"{f.mark:#x}/{f.mask:#x}"
                return Command(
                    "tc",
                    (*head, "handle", handle, "fw", "flowid", flowid),
                    f.span,
                    f"mark {f.mark if f.mask is None else hex(f.mark)} to {flowid}",
                )
            case _:
                assert_never(f)

    def _target(self, flowid: str) -> str:
        what = self._targets.get(flowid)
        if what is None:
            what = self._targets[flowid] = f"filter to {flowid}"
        return what


def made_order(filters: Sequence[ir.Filter]) -> list[ir.Filter]:
    """``filters`` (of one parent) in the order the kernel tries them, family by family:
    each family's by pref (as allocated within a pref), in the places that family's filters
    hold among the others (a class's IPv4 and IPv6 filters stay side by side). Made in that
    order, what exists of a family's filters at any moment is a prefix of what it will be: a
    line of a later pref written first (``pref 2`` on the first class) would otherwise take,
    while the rest is built, the packets of lines of pref 1 still to come."""
    by_family: dict[ir.Family, list[ir.Filter]] = {}
    for f in filters:
        by_family.setdefault(f.family, []).append(f)
    ordered = {family: iter(kernel_order(fs, _pref)) for family, fs in by_family.items()}
    return [next(ordered[f.family]) for f in filters]


def _pref(f: ir.Filter) -> int:
    return f.pref


class _Tree:
    """Appends the commands below an interface's root qdisc to ``out``, in the order that
    never leaves a packet unshaped or in a wrong class while they run (see :meth:`below`)."""

    def __init__(self, iface: ir.Interface, out: list[Command]) -> None:
        self.iface = iface
        self.out = out
        self.words = _Words(iface)
        self.tables = U32Tables(iface, self.words)
        self.filters: dict[tuple[int, int], list[ir.Filter]] = {}
        for f in iface.filters:
            self.filters.setdefault((f.parent.major, f.parent.minor), []).append(f)
        for key, found in self.filters.items():
            self.filters[key] = made_order(found)

    def below(self, q: ir.Qdisc) -> None:
        """What is below qdisc ``q`` (which exists), in the order that never leaves a packet
        unshaped or in a wrong class while it runs (docs/backends.md, "The order of the
        commands").

        First the path to the default class (its ancestors, itself, what is below it): until
        it exists htb sends every unfiltered packet direct, unshaped (htb_classify: HTB_DIRECT
        when the default class is missing), and hfsc drops it. Then ``q``'s filters in their
        final order, each once the class it sends to is complete (a filter to a missing class
        falls through to the default class). Then the classes no filter names. A class is
        complete when its ancestors, itself and its leaf qdisc, with everything below that,
        exist.
        """
        handle = q.handle
        assert handle is not None
        match q:
            case ir.Htb() | ir.Cbq() | ir.Hfsc() | ir.Prio():
                self._classes(q)
                return
            case ir.Tbf() | ir.Netem():
                if q.child is not None:
                    # 'parent 1:' as the seeds write it (the kernel shows what it was given,
                    # and grafts the child into the one class, 1:1, either way)
                    self._qdisc(ir.Handle(handle.major, 0), q.child)
            case ir.Mq():
                stab = self.iface.stab
                for queue in q.queues:
                    self._qdisc(ir.Handle(handle.major, queue.number), queue.qdisc, stab)
                self._steering(q)
                return
            case _:
                pass
        for f in self.filters.get((handle.major, handle.minor), ()):
            self.tables.add(f, self.out)

    def _classes(self, q: ir.Htb | ir.Cbq | ir.Hfsc | ir.Prio) -> None:
        assert q.handle is not None
        classes = list(ir.classes_of(q))
        parents = ir.parent_map(q)
        by_id = {(c.classid.major, c.classid.minor): c for c in classes if c.classid is not None}
        built: set[int] = set()

        def build(cls: ir.Class) -> None:
            path: list[ir.Class] = []
            at: ir.Class | None = cls
            while at is not None and id(at) not in built:
                path.append(at)
                at = parents[id(at)]
            for c in reversed(path):
                built.add(id(c))
                self._class(q, c, parents[id(c)])

        if isinstance(q, ir.Htb | ir.Hfsc):
            minor = default_minor(q)
            if minor is not None:
                build(by_id[(q.handle.major, minor)])
        for f in self.filters.get((q.handle.major, q.handle.minor), ()):
            target = by_id.get((f.flowid.major, f.flowid.minor))
            if target is not None:
                build(target)
            self.tables.add(f, self.out)
        for cls in classes:
            build(cls)

    def _class(
        self, q: ir.Htb | ir.Cbq | ir.Hfsc | ir.Prio, cls: ir.Class, parent: ir.Class | None
    ) -> None:
        """A class of ``q`` (a prio band exists with its qdisc), then its leaf qdisc and what
        is below that."""
        assert cls.classid is not None and q.handle is not None
        if not isinstance(q, ir.Prio):
            parent_id = parent.classid if parent is not None else q.handle
            assert parent_id is not None
            what = f"class {cls.name}" if not cls.implicit else "link class"
            words = self.words
            ids = ("parent", words.handle(parent_id), "classid", words.handle(cls.classid))
            self.out.append(
                Command(
                    "tc",
                    ("class", "add", "dev", words.dev, *ids, *class_words(q.kind, cls)),
                    cls.span,
                    what,
                )
            )
        if cls.leaf is not None:
            self._qdisc(cls.classid, cls.leaf)

    def _qdisc(
        self, parent_id: ir.Handle, child: ir.Qdisc, stab: ir.Overhead | None = None
    ) -> None:
        """A qdisc held by a class (or by a tbf or netem, or an mq's queue, with the
        interface's size table ``stab``), then what is below it."""
        assert child.handle is not None
        parent = self.words.handle(parent_id)
        self.out.append(
            Command(
                "tc",
                (
                    "qdisc",
                    "add",
                    "dev",
                    self.words.dev,
                    "parent",
                    parent,
                    "handle",
                    child.handle.qdisc,
                    *(stab_words(stab) if stab is not None else ()),
                    *qdisc_words(child),
                ),
                child.span,
                f"{_label(child)} of {parent}",
            )
        )
        self.below(child)

    def _steering(self, q: ir.Mq) -> None:
        """An mq tree's clsact qdisc and its egress filters, which pick each packet's TX
        queue; made once every queue's tree exists, so no packet goes to a queue still
        unshaped."""
        if not ir.mq_steers(self.iface):  # the kernel picks the queue: nothing in ffff:
            return
        name = self.iface.name
        what = f"interface {name}: the clsact qdisc whose filters pick the TX queue"
        self.out.append(Command("tc", ("qdisc", "add", "dev", name, "clsact"), q.span, what))
        egress = ir.CLSACT_EGRESS
        for f in self.filters.get((egress.major, egress.minor), ()):
            self.tables.add(f, self.out)


_TableKey = tuple[int, int, int]
"""A u32 table: its parent's major and minor, and its id."""


class U32Tables:
    """The u32 tables of an interface (``ir.Interface.u32_tables``), for commands made in the
    order of the filters: each table just before its first filter, and the node linking to
    it just after its last (so no packet enters a half-filled table)."""

    def __init__(self, iface: ir.Interface, words: _Words) -> None:
        self.words = words
        self.tables = {(t.parent.major, t.parent.minor, t.table): t for t in iface.u32_tables}
        self.made: set[_TableKey] = set()
        self.last: dict[_TableKey, int] = {}
        self.enclosing: dict[int, tuple[int, tuple[_TableKey, ...]]] = {}
        """By ``id(filter)``: its index in the interface's filters, and the tables holding it,
        innermost first."""
        if not self.tables:
            return
        chains: dict[_TableKey, tuple[_TableKey, ...]] = {}
        for i, f in enumerate(iface.filters):
            enclosing: tuple[_TableKey, ...] = ()
            if isinstance(f, ir.U32Filter) and f.place is not None and f.place.table is not None:
                key = (f.parent.major, f.parent.minor, f.place.table)
                found = chains.get(key)
                if found is None:
                    found = chains[key] = self._chain(key)
                enclosing = found
                for k in enclosing:
                    self.last[k] = i
            self.enclosing[id(f)] = (i, enclosing)

    def _chain(self, key: _TableKey) -> tuple[_TableKey, ...]:
        """Table ``key`` and the tables holding it, innermost first."""
        major, minor, table = key
        out: list[_TableKey] = []
        at: int | None = table
        while at is not None:
            out.append((major, minor, at))
            at = self.tables[(major, minor, at)].link.table
        return tuple(out)

    def add(self, f: ir.Filter, out: list[Command]) -> None:
        """Append the commands for ``f``: the tables it is in not made yet, ``f``, then the
        links of the tables it is the last filter of."""
        if not self.tables:
            out.append(self.words.filter(f))
            return
        i, enclosing = self.enclosing[id(f)]
        for key in reversed(enclosing):
            if key not in self.made:
                self.made.add(key)
                out.append(self._table_command(self.tables[key]))
        out.append(self.words.filter(f))
        for key in enclosing:
            if self.last[key] == i:
                out.append(self._link_command(self.tables[key]))

    def _table_command(self, t: ir.U32Table) -> Command:
        """The command that makes table ``t`` (empty)."""
        head, _ = self.words.head(t)
        return Command("tc", (*head, *table_words(t)), t.span, table_text(t))

    def _link_command(self, t: ir.U32Table) -> Command:
        """The command that links table ``t`` (full) into its place."""
        head, _ = self.words.head(t)
        return Command("tc", (*head, *link_words(t)), t.span, f"link to {table_text(t)}")


def queue_words(classid: ir.Handle) -> str:
    """An mq tree's queue by the policy's number, then the kernel's (which counts from 0) and
    the mq class it hangs from: ``queue 2 (TX queue 1, 1:2)``."""
    return f"queue {classid.minor} (TX queue {classid.minor - 1}, {classid})"


def queue_mapping(flowid: ir.Handle) -> int:
    """The TX queue (from 0) of an mq class ``M:N``: N - 1."""
    return flowid.minor - 1


def u32_place_words(place: ir.U32Place | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The words before ``u32`` (``handle H``) and after it (``ht T:B:``) that make a node at
    ``place`` (none for a node the kernel numbers)."""
    if place is None:
        return (), ()
    if place.table is None:
        return ("handle", place.handle), ()
    return ("handle", place.handle), ("ht", f"{place.table:x}:{place.bucket:x}:")


def table_words(t: ir.U32Table) -> tuple[str, ...]:
    """``handle 100: u32 divisor 256``."""
    return ("handle", f"{t.table:x}:", "u32", "divisor", str(t.divisor))


def link_words(t: ir.U32Table) -> tuple[str, ...]:
    """The words of the node linking to ``t``, from its handle on."""
    before, after = u32_place_words(t.link)
    hashkey: tuple[str, ...] = ()
    if t.hashkey is not None:
        hashkey = ("hashkey", "mask", f"0x{t.hashkey[0]:08x}", "at", str(t.hashkey[1]))
    return (*before, "u32", *after, "link", f"{t.table:x}:", *hashkey, *LINK_KEY)


LINK_KEY = ("match", "u32", "0", "0", "at", "0")
"""A link node's key: it takes every packet into its table."""


def table_text(t: ir.U32Table) -> str:
    """How comments name table ``t``: ``u32 table 100: (256 buckets on byte 19)``."""
    if t.hashed_byte is None:
        return f"u32 table {t.table:x}: ({t.count} filters in order)"
    return (
        f"u32 table {t.table:x}: ({t.count} filters in {t.divisor} buckets by byte {t.hashed_byte})"
    )


def filter_command(iface: ir.Interface, f: ir.Filter) -> Command:
    """The command that adds filter ``f``."""
    return _Words(iface).filter(f)


_HOOK_CHAIN = {"prerouting": "PREROUTING", "output": "OUTPUT", "postrouting": "POSTROUTING"}
DOWNLOAD_HOOKS = ("FORWARD", "INPUT")
"""Where a download's marking rules run: after routing, where NAT is undone, for the packets
forwarded to the LAN and those for this host."""
MARK_HOOKS: tuple[str, ...] = (*_HOOK_CHAIN.values(), *DOWNLOAD_HOOKS)
"""The built-in mangle chains a marking jump can sit in (teardown looks in each)."""


def jumps(iface: ir.Interface) -> tuple[tuple[str, ...], ...]:
    """Every jump into ``iface``'s marking chain, without ``-j`` (:func:`jump_words`). A
    download marks in FORWARD and INPUT, for packets that arrived on its interface (E256
    refuses another): there NAT is undone, and the mark it sets is saved on the
    connection, which the redirect restores on the connection's later packets (connmark)."""
    m = iface.marking
    assert m is not None
    if iface.download is None:
        return (jump_words(iface),)
    arriving = () if m.from_interface is None else ("-i", m.from_interface)
    return tuple((hook, *arriving) for hook in DOWNLOAD_HOOKS)


def save_mark_words(m: ir.Marking) -> tuple[str, ...]:
    """``-j CONNMARK --save-mark``: the packet's mark (under the policy's mask) onto its
    connection."""
    mask = ("--mask", f"{m.mask.value:#x}") if m.mask is not None else ()
    return ("-j", "CONNMARK", "--save-mark", *mask)


def jump_words(iface: ir.Interface) -> tuple[str, ...]:
    """The built-in chain and the match of the jump into ``iface``'s marking chain, without
    ``-j``: ``PREROUTING -i eth1``, ``PREROUTING`` (from any), ``OUTPUT -o eth0`` (from
    local), ``POSTROUTING -o eth0``."""
    m = iface.marking
    assert m is not None
    hook = _HOOK_CHAIN[m.hook]
    if m.hook != "prerouting":
        return (hook, "-o", iface.name)
    if m.from_interface is None:
        return (hook,)
    return (hook, "-i", m.from_interface)


def mark_match(m: ir.Marking, value: int) -> tuple[str, ...]:
    """``-m mark --mark V`` for packets carrying ``value`` under the policy's mark mask."""
    if m.mask is None:
        return ("-m", "mark", "--mark", str(value))
    return ("-m", "mark", "--mark", f"{value:#x}/{m.mask.value:#x}")


def mark_text(m: ir.Marking, value: int) -> str:
    """A mark as messages spell it: decimal, or hex under a mask (where its bits matter)."""
    return str(value) if m.mask is None else f"{value:#x}"


def set_mark(m: ir.Marking, value: int) -> tuple[str, ...]:
    """The MARK target that sets ``value`` (under the mask, leaving other bits alone)."""
    if m.mask is None:
        return ("-j", "MARK", "--set-mark", str(value))
    return ("-j", "MARK", "--set-xmark", f"{value:#x}/{m.mask.value:#x}")


MARK_TOOL: dict[ir.Family, Literal["iptables", "ip6tables"]] = {
    "ipv4": "iptables",
    "ipv6": "ip6tables",
}
"""The tool that marks a family's packets; both have a mangle chain of the policy's name."""


def mark_families(iface: ir.Interface) -> tuple[ir.Family, ...]:
    """The families whose packets ``iface``'s marking marks (and whose tool it needs): the
    tree's."""
    return iface.families if iface.marking is not None else ()


def marking_commands(iface: ir.Interface) -> Iterator[Command]:
    """Yield the iptables (IPv4) and ip6tables (IPv6) commands that mark packets for
    ``iface``'s fw filters: the same chain, jumps and rules in each table, for its family."""
    m = iface.marking
    assert m is not None and m.chain is not None
    mangle = ("-t", "mangle")
    for family in mark_families(iface):
        tool = MARK_TOOL[family]
        yield Command(tool, (*mangle, "-N", m.chain), m.span, f"chain {m.chain}")
        for jump in jumps(iface):
            yield Command(tool, (*mangle, "-I", *jump, "-j", m.chain), m.span, m.source(iface.name))
        for rule in m.rules:
            if rule.family != family:
                continue
            # Every rule only marks unmarked packets, so the first matching line wins, as u32.
            words = iptables_words(rule.conds, family)
            yield Command(
                tool,
                (*mangle, "-A", m.chain, *words, *mark_match(m, 0), *set_mark(m, rule.mark)),
                rule.span,
                "unmarked traffic" if rule.unmarked else f"mark {mark_text(m, rule.mark)}",
            )
        for d in m.dscp_rules:
            if d.family != family:
                continue
            yield Command(
                tool,
                (
                    *mangle,
                    "-A",
                    m.chain,
                    *mark_match(m, d.mark),
                    "-j",
                    "DSCP",
                    "--set-dscp",
                    str(d.dscp),
                ),
                d.span,
                f"DSCP {d.dscp} for mark {mark_text(m, d.mark)}",
            )
        if iface.download is not None:
            yield Command(
                tool,
                (*mangle, "-A", m.chain, *save_mark_words(m)),
                m.span,
                "the mark onto the connection (connmark restores it on the download's redirect)",
            )


def teardown_commands(iface: ir.Interface) -> tuple[tuple[str, ...], ...]:
    """The commands that remove what the policy owns in tc (and ip) for ``iface``; each may
    fail harmlessly (when there is nothing to remove).

    A download's redirect goes first, then its IFB (which takes its tree with it), then the
    tree's shared police actions (whose delete fails while the kernel has not yet freed the
    filters bound to them; the next apply's ``replace`` takes them over).
    """
    actions = tuple(
        ("tc", "actions", "delete", "action", "police", "index", str(index))
        for index in shared_police(iface)
    )
    if iface.download is not None:
        return (
            ("tc", "qdisc", "del", "dev", iface.download.interface, "ingress"),
            ("ip", "link", "del", "dev", iface.name),
            *actions,
        )
    if iface.direction == "ingress":
        return (("tc", "qdisc", "del", "dev", iface.name, "ingress"), *actions)
    root = ("tc", "qdisc", "del", "dev", iface.name, "root")
    if ir.mq_steers(iface):
        return (("tc", "qdisc", "del", "dev", iface.name, "clsact"), root, *actions)
    return (root, *actions)


def chain_teardown(iface: ir.Interface) -> tuple[tuple[str, ...], ...]:
    """The iptables and ip6tables commands that remove ``iface``'s marking: one jump into its
    chain (repeat it until it fails), then the chain's rules, then the chain, in each table
    it marks in; each may fail harmlessly.

    They touch only what the policy made: the jump it inserted and the chain it names (never
    a built-in chain: E215).
    """
    m = iface.marking
    assert m is not None and m.chain is not None
    out: list[tuple[str, ...]] = []
    for family in mark_families(iface):
        mangle = (MARK_TOOL[family], "-t", "mangle")
        out += [(*mangle, "-D", *jump, "-j", m.chain) for jump in jumps(iface)]
        out += [(*mangle, "-F", m.chain), (*mangle, "-X", m.chain)]
    return tuple(out)


# ==== the lock ================================================================================

# Names the generated shell script uses and verify reads back from its trace and stderr.
SCRIPT_AT = "tcdsl_at"
"""The script's variable naming the policy text of the command that runs next."""
SCRIPT_FAILED = "tcdsl_failed"
"""The script's exit trap, which prints the failure message."""
SCRIPT_UNMARK = "tcdsl_unmark"
"""The script's function removing a marking chain and every jump into it."""
NO_INTERFACE = "tcdsl: there is no interface %s here; nothing was changed"
"""What the script prints (a printf format) when an interface it shapes is missing."""
TOO_FEW_QUEUES = (
    "tcdsl: interface %s has fewer TX queues than the %s its mq tree uses (mq needs at "
    "least 2); give it more "
    "(ethtool -L, or numtxqueues for a veth) or use fewer queues; nothing was changed"
)
"""What the script prints (a printf format: the device, the number of queues) when the
device has fewer TX queues than its mq tree uses."""
TOO_FEW_IN_USE = (
    "tcdsl: interface %s has %s TX queues in use, fewer than the %s its mq tree shapes: "
    "no packet reaches the trees of the queues past them (those steered there leave by the "
    "first queue); use more "
    "(ethtool -L) or fewer in the tree; nothing was changed"
)
"""What the script prints (a printf format: the device, the queues in use, the highest queue
its tree shapes) when the device has fewer TX queues in use than its mq tree uses."""
TOO_MANY_QUEUES = (
    "tcdsl: interface %s has %s TX queues in use, more than the %s its mq tree is spread "
    "over: what no line matches could leave by one of the others, unshaped; use %s "
    "(ethtool -L) or spread the tree over more queues; nothing was changed"
)
"""What the script prints (a printf format: the device, the queues in use, the tree's
queues twice) when the device has more TX queues in use than a spread tree shapes."""
TOO_MANY_WRITTEN = (
    "tcdsl: interface %s has %s TX queues in use, more than the %s its mq tree writes: a "
    "packet the kernel puts on a later queue meets the default qdisc there, unshaped; use "
    "%s (ethtool -L) or write the later queues; nothing was changed"
)
"""What the script prints (a printf format: the device, the queues in use, the tree's
highest queue twice) when the device has more TX queues in use than a written tree writes."""
NO_TOOL = "tcdsl: %s is missing, and this policy needs it %s; nothing was changed"
"""What the script prints (a printf format: the tool, why) when a tool it marks with is
missing."""
NOT_IFB = (
    "tcdsl: %s exists and is not an ifb device; a download needs its own ifb; nothing was changed"
)
"""What the script prints (a printf format) when the device a download names is not an IFB."""

SLOT_TAKEN = (
    "tcdsl: interface %s has the %s qdisc in its ingress slot (ffff:), where this policy puts "
    "the %s qdisc %s; the two exclude each other. If nothing else needs it, remove it first "
    "(tc qdisc del dev %s %s); nothing was changed"
)
"""What the script prints (a printf format: the device, the kind there, the kind wanted,
what for, the device and kind again) when the device's ingress slot holds the other kind."""
SLOT_USES = {
    "clsact": "whose egress filters pick the TX queue",
    "ingress": "for its ingress filters",
}
"""What the policy puts each kind of ingress-slot qdisc there for (the message's fourth
part)."""


def ingress_slot(iface: ir.Interface) -> tuple[str, str] | None:
    """(device, kind) of the qdisc ``iface``'s tree puts in a device's ingress slot
    (``ffff:``): an mq tree's ``clsact`` (its steering), the ``ingress`` qdisc of ingress
    policing or of a download's redirect; None if it puts none there. ``clsact`` and
    ``ingress`` exclude each other."""
    if iface.download is not None:
        return iface.download.interface, "ingress"
    if iface.direction == "ingress":
        return iface.name, "ingress"
    if ir.mq_steers(iface):
        return iface.name, "clsact"
    return None


STALE_INGRESS = (
    "tcdsl: note: interface %s has an ingress qdisc with a redirect or policers in its ingress "
    "slot (ffff:), which this policy does not set up (a download or ingress policing of an "
    "earlier version of it?): left as it is; if nothing else needs it, remove it with: tc qdisc "
    "del dev %s ingress (and an ifb device it redirects to, with: ip link del dev IFB)"
)
"""What the script says (a printf format: the device, twice) when a device whose ingress slot
the policy leaves free holds an ingress qdisc such as a download or ingress policing puts
there: the policy does not own the slot, so the script does not remove it."""


def stale_ingress_devices(policy: ir.Policy) -> list[str]:
    """The devices a policy shapes an upload on whose ingress slot it leaves free: a download
    or ingress policing an earlier version of it had there would be left in place."""
    taken = {slot[0] for i in policy.interfaces if (slot := ingress_slot(i)) is not None}
    shaped = (i.name for i in policy.interfaces if i.download is None and i.direction != "ingress")
    return [name for name in dict.fromkeys(shaped) if name not in taken]


LOCK_DIR = "/run/lock"
LOCK_DIR_VARIABLE = "TCDSL_LOCK_DIR"
"""The environment variable that moves the lock folder (tests; systems without /run/lock)."""


def lock_name(interface: str) -> str:
    """The file (in the lock folder) whose ``flock`` serialises every change to ``interface``,
    by generated scripts and by tcdsl alike.

    Interface names hold no ``/`` and are never ``.`` or ``..`` (Linux and E009 refuse them),
    so the name is always one file in the folder; the shell quotes it.
    """
    return f"tcdsl-{interface}.lock"


# ==== tc -batch lines ===========================================================================

BATCH_MAX_WORDS = 99
"""tc splits a batch line into at most 100 words (with the program name) and exits on more."""

_BATCH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_BATCH_SAFE_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-"
"""The characters of :data:`_BATCH_SAFE`."""


def batch_unquotable(word: str) -> str | None:
    """Why ``word`` cannot be written on a ``tc -batch`` line, or None.

    tc (iproute2's ``getcmdline`` and ``makeargs``) cuts every line at its first ``#``, even
    inside quotes; a word may be quoted with ``"`` or ``'`` (no escapes inside), so a word
    with both quote characters, or a line break, has no spelling.
    """
    if "#" in word:
        return "tc -batch takes '#' as the start of a comment, even inside quotes"
    if "\n" in word or "\r" in word:
        return "a tc -batch command ends at a line break"
    if '"' in word and "'" in word:
        return "a tc -batch word cannot hold both quote characters"
    return None


def batch_quote(word: str) -> str:
    """Quote one word the way tc's batch parser reads it (see :func:`batch_unquotable`)."""
    if _BATCH_SAFE.fullmatch(word):
        return word
    return f"'{word}'" if '"' in word else f'"{word}"'


def batch_line(cmd: Command) -> str:
    """A tc command as one ``tc -batch`` line: no ``tc``, words quoted for tc's parser."""
    assert cmd.tool == "tc"
    args = cmd.args
    line = " ".join(args)
    # Nearly every line needs no quotes: one check of the whole line instead of one per word.
    # No word is empty, none holds a space (as many spaces as word breaks), and deleting the
    # safe characters and the spaces from the line's bytes leaves nothing (a regex over the
    # line takes several times longer).
    if (
        all(args)
        and line.count(" ") == len(args) - 1
        and line.isascii()
        and not line.encode().translate(None, _BATCH_SAFE_BYTES + b" ")
    ):
        return line
    return " ".join(batch_quote(w) for w in args)


def batch_teardown(iface: ir.Interface) -> tuple[tuple[str, ...], ...]:
    """tc commands that remove ``iface``'s tree and succeed whether or not there is one.

    ``qdisc del ... root`` fails on an interface with no qdisc of its own, which would make
    ``tc -batch`` report a failed command (and exit 1) on every first run; replacing the root
    with a pfifo first gives the delete something to delete (an ingress qdisc likewise). A
    download's redirect goes first; its IFB stays (tc cannot remove a device), its tree goes.
    """
    dev = ("dev", iface.name)
    root = (("qdisc", "replace", *dev, "root", "pfifo"), ("qdisc", "del", *dev, "root"))
    if iface.download is not None:
        return (*_ingress_teardown(iface.download.interface), *root)
    if iface.direction == "ingress":
        return _ingress_teardown(iface.name)
    if ir.mq_steers(iface):  # the tree owns the clsact qdisc it steers with
        clsact = (("qdisc", "replace", *dev, "clsact"), ("qdisc", "del", *dev, "clsact"))
        return (*clsact, *root)
    return root


def _ingress_teardown(name: str) -> tuple[tuple[str, ...], ...]:
    ingress = ir.INGRESS_HANDLE.qdisc
    return (
        ("qdisc", "replace", "dev", name, "handle", ingress, "ingress"),
        ("qdisc", "del", "dev", name, "ingress"),
    )


# ==== iptables-restore and nft ==================================================================

_RESTORE_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./!-]+")


def restore_quote(word: str) -> str:
    """Quote one word for iptables-restore (double quotes, backslash escapes inside)."""
    if _RESTORE_SAFE.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def restore_lines(
    iface: ir.Interface, family: ir.Family = "ipv4"
) -> Iterator[tuple[Command | None, str]]:
    """The ``*mangle`` lines of an iptables-restore (``family`` ipv6: ip6tables-restore) file
    for ``iface``'s marking (no ``*mangle``/``COMMIT``), each with the command it stands for
    (None for the chain line); nothing when the tree does not mark that family.

    ``:CHAIN - [0:0]`` creates the chain, or with ``--noflush`` empties it if it exists; the
    jump from PREROUTING cannot be made idempotent in a restore file (a ``-D`` of an absent
    rule fails the whole file), so whoever applies it deletes old jumps first
    (:func:`chain_teardown`).
    """
    m = iface.marking
    assert m is not None and m.chain is not None
    if family not in mark_families(iface):
        return
    yield None, f":{restore_quote(m.chain)} - [0:0]"
    for cmd in marking_commands(iface):
        if cmd.tool != MARK_TOOL[family]:
            continue
        args = cmd.args[2:]  # without "-t mangle": the file's *mangle says it
        if args[0] == "-N":
            continue
        yield cmd, " ".join(restore_quote(w) for w in args)


def owned_chains(policy: ir.Policy) -> dict[str, tuple[str, ...]]:
    """The mangle chains a policy's scripts remove (with every jump into them), by tree
    (``Interface.label``): the marking chain of a tree that marks, and the default chain
    ``TCDSL-<device>`` an earlier version of the policy may have left, unless that is the
    tree's own chain or another tree of the policy uses that name. An ingress tree owns none
    (it never marks; the egress tree of its interface looks after that interface's chain)."""
    taken = {i.marking.chain for i in policy.interfaces if i.marking and i.marking.chain}
    out: dict[str, tuple[str, ...]] = {}
    for iface in policy.interfaces:
        if iface.direction == "ingress":
            out[iface.label] = ()
            continue
        own = (iface.marking.chain,) if iface.marking and iface.marking.chain else ()
        default = default_chain(iface.name)
        out[iface.label] = own if default in taken else (*own, default)
    return out


def stale_chains(policy: ir.Policy) -> list[str]:
    """The chains of :func:`owned_chains` that the policy does not build again."""
    built = {i.marking.chain for i in policy.interfaces if i.marking and i.marking.chain}
    return [c for chains in owned_chains(policy).values() for c in chains if c not in built]


def unjump_shell(chain: str, tool: str = "iptables") -> str:
    """A shell line that deletes every jump into mangle chain ``chain`` (of ``tool``:
    iptables or ip6tables) from the built-in chains a marking jump can sit in, whatever its
    match (an earlier version of the policy may have marked from another interface or hook)."""
    return (
        f"for c in {' '.join(MARK_HOOKS)}; do while n=$({tool} -t mangle -L $c -n "
        f'--line-numbers | awk \'$2 == "{chain}" {{ print $1; exit }}\') && [ -n "$n" ]; do '
        f"{tool} -t mangle -D $c $n; done; done"
    )


_NFT_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")


def nft_table(iface: ir.Interface) -> str:
    """The name of the nft table (family ``inet``) that marks packets for ``iface``.

    One table per shaped interface, so policies for different interfaces never clash;
    characters nft does not take in a name become ``_``, plus a checksum of the real name
    when any did (so ``eth-0`` and ``eth_0`` stay apart).
    """
    return nft_table_name(iface.name)


def nft_table_name(device: str) -> str:
    """:func:`nft_table` of the tree shaped on ``device``."""
    name = _NFT_NAME_BAD.sub("_", device)
    if name != device:
        name += f"_{zlib.crc32(device.encode()):08x}"
    return f"tcdsl_{name}"


def nft_unquotable(name: str) -> str | None:
    """Why an interface name cannot be written in an nft ruleset, or None."""
    if '"' in name:
        return "an nft string cannot hold '\"'"
    if "*" in name:
        return "nft reads '*' in an interface name as a wildcard"
    if "\\" in name:
        return "nft reads '\\' in an interface name as an escape"
    return None


def iptables_unquotable(name: str) -> str | None:
    """Why an interface name cannot be written in an iptables rule, or None."""
    if name.endswith("+"):
        return (
            f"iptables reads a '+' at the end of an interface name as a wildcard (every "
            f"interface whose name starts with '{name[:-1]}')"
        )
    return None


def nft_table_lines(iface: ir.Interface, indent: str = "    ") -> Iterator[str]:
    """The lines of an ``nft -f`` file that (re)define ``iface``'s marking table.

    ``table`` then ``delete table`` then the definition: declaring an existing table is a
    no-op, so the delete never fails and the file replaces the table in one transaction.
    Rules keep tcdsl's first-match semantics: each marks only still-unmarked packets.
    """
    m = iface.marking
    assert m is not None
    table = nft_table(iface)
    hooks: tuple[str, ...] = (m.hook,)
    where = f'iifname "{m.from_interface}" ' if m.from_interface is not None else ""
    if iface.download is not None:
        hooks = tuple(h.lower() for h in DOWNLOAD_HOOKS)
    elif m.hook != "prerouting":
        where = f'oifname "{iface.name}" '
    unmarked = _nft_mark_is(m, 0)
    yield f"table inet {table}"
    yield f"delete table inet {table}"
    yield f"table inet {table} {{"
    for hook in hooks:
        yield f"{indent}chain {hook} {{"
        yield f"{indent * 2}type filter hook {hook} priority mangle; policy accept;"
        for rule in m.rules:
            s = rule.span
            what = "unmarked traffic" if rule.unmarked else f"mark {mark_text(m, rule.mark)}"
            yield f"{indent * 2}# {_comment(f'{s.file}:{s.line}:{s.column}: {what}')}"
            words = (*nft_words(rule.conds, rule.family), unmarked, _nft_set_mark(m, rule.mark))
            yield f"{indent * 2}{where}{' '.join(words)}"
        for d in m.dscp_rules:
            s = d.span
            yield f"{indent * 2}# {_comment(f'{s.file}:{s.line}:{s.column}: DSCP {d.dscp}')}"
            ip = "ip" if d.family == "ipv4" else "ip6"
            dscp = f"meta nfproto {d.family} {_nft_mark_is(m, d.mark)} {ip} dscp set {d.dscp}"
            yield f"{indent * 2}{where}{dscp}"
        if iface.download is not None:
            yield f"{indent * 2}# the mark onto the connection (connmark restores it)"
            for saved in _nft_save_mark(m):
                yield f"{indent * 2}{where}{saved}"
        yield f"{indent}}}"
    yield "}"


def _nft_save_mark(m: ir.Marking) -> Iterator[str]:
    """The rules that put a packet's mark onto its connection. Under a mask, only the mask's
    bits, the others of the connection's mark kept (as iptables' ``CONNMARK --save-mark
    --mask``; found by a tester: 'ct mark set meta mark and M' cleared them). nft takes no
    packet mark on the right of an 'or' (1.0.6: "must be constant"), so a rule for each value
    the policy's rules give those bits, and one for none."""
    if m.mask is None:
        yield "ct mark set meta mark"
        return
    keep = ~m.mask.value & 0xFFFFFFFF
    for value in sorted({0, *(rule.mark for rule in m.rules)}):
        put = f" or {value:#x}" if value else ""
        yield f"{_nft_mark_is(m, value)} ct mark set ct mark and {keep:#x}{put}"


def _nft_mark_is(m: ir.Marking, value: int) -> str:
    if m.mask is None:
        return f"meta mark {value}"
    return f"meta mark and {m.mask.value:#x} == {value:#x}"


def _nft_set_mark(m: ir.Marking, value: int) -> str:
    if m.mask is None:
        return f"meta mark set {value}"
    keep = ~m.mask.value & 0xFFFFFFFF
    return f"meta mark set meta mark and {keep:#x} or {value:#x}"


def nft_remove_lines(ifaces: Iterable[ir.Interface]) -> Iterator[str]:
    """Lines that remove the marking tables of ``ifaces`` if present (in an ``nft -f`` file)."""
    for iface in ifaces:
        yield f"table inet {nft_table(iface)}"
        yield f"delete table inet {nft_table(iface)}"


def _comment(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)


UNSPELLABLE = "E502"
"""An interface name or a command has no spelling in a backend's output format."""


def batchable(name: str, commands: Iterable[Command]) -> bool:
    """Whether an interface's ``tc -batch`` lines can hold its name and each of its tc
    ``commands`` (see :func:`unspellable`)."""
    tc = [c.args for c in commands if c.tool == "tc"]
    # every device its commands name (a download's: the interface and its IFB; found by a
    # review)
    devices = {name, *(a[i + 1] for a in tc for i, w in enumerate(a[:-1]) if w == "dev")}
    return all(batch_unquotable(d) is None for d in devices) and all(
        len(a) <= BATCH_MAX_WORDS for a in tc
    )


LIVE_BATCH = (
    "; tcdsl apply drives tc through tc -batch: rename the interface, or run the script of "
    "'tcdsl compile' (which makes such commands one at a time)"
)
"""Said after a ``batch`` E502 of a live operation (``live``)."""


def unspellable(
    policy: ir.Policy, *, batch: bool, nft: bool, live: bool = False
) -> Iterator[Diagnostic]:
    """Yield E502 for what ``tc -batch`` lines (``batch``) or nft rules (``nft``; else
    iptables rules) cannot hold; ``live``: for ``tcdsl apply`` (the tc -batch it runs), which
    says what to do instead."""
    after = LIVE_BATCH if live else ""
    for iface in policy.interfaces:
        if batch:
            why = batch_unquotable(iface.name)
            if why is not None:
                msg = f"interface name '{iface.name}' cannot be written as a tc -batch word: {why}"
                yield Diagnostic.error(UNSPELLABLE, msg + after, iface.span)
                continue
            for cmd in interface_commands(iface):
                if cmd.tool == "tc" and len(cmd.args) > BATCH_MAX_WORDS:
                    msg = (
                        f"the tc command for {cmd.what} has {len(cmd.args)} words; tc -batch "
                        f"takes at most {BATCH_MAX_WORDS}: split the match line"
                    )
                    yield Diagnostic.error(UNSPELLABLE, msg + after, cmd.span)
        m = iface.marking
        named = m.from_interface if m is not None and m.hook == "prerouting" else iface.name
        if m is None or named is None:
            continue
        # (found by a tester: 'wan+' marked what left by every wan interface)
        why = nft_unquotable(named) if nft else iptables_unquotable(named)
        if why is not None:
            rule = "an nft rule" if nft else "an iptables rule"
            instead = (
                "" if nft
                else ": rename the interface (tcdsl apply marks with iptables)" if live
                else ": rename the interface, or mark with nft (--marks nft)"
            )  # fmt: skip
            msg = f"interface name '{named}' cannot be written in {rule}: {why}{instead}"
            yield Diagnostic.error(UNSPELLABLE, msg, m.span)
