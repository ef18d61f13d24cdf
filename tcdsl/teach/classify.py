"""Which class a packet ends in, and why, as the kernel decides it (no kernel needed).

``classify(policy, packet)`` walks an allocated policy's qdisc tree from the root the way the
kernel's enqueue path does and returns a ``Verdict``: one ``Step`` per qdisc that decides, with
the filter, default or priomap entry that decided and its place in the policy.

What is modelled, after the kernel's code:

- u32 filters of a classful qdisc are tried by pref, then in the order they were added
  (``kernel_order``, which the lints share); a filter matches when every key's 32-bit word,
  under its mask, equals its value in the packet (its bytes from the IP header to its end,
  the payload zeros), read in tc's order of the keys (``kernel_words``); a word past the
  packet's end, read before one fails, makes u32 give up the whole pref, its tables too
  (``words_verdict``; the kernel goes on at the next pref);
- htb (``htb_classify``): a filter's flowid names a leaf class, which takes the packet; an
  inner class goes on with the filters attached to that class (tcdsl attaches none there); no
  match: the ``default`` class, or htb's direct queue when there is none (or it is not a leaf);
- prio (``prio_classify``): a filter's flowid names the band; no match: the priomap entry of
  the packet's priority. The priority of a forwarded packet (and of a locally sent one whose
  socket set ``IP_TOS``) is ``rt_tos2priority(tos)``, the table ``ip_tos2prio`` of
  net/ipv4/route.c (``tcmath.IP_TOS2PRIO``); pfifo_fast uses the same bands with its fixed
  priomap;
- a class whose leaf qdisc is classful (or a tbf/netem holding one) goes on there;
- ``classify by mark``: the iptables rules in order (each marks only unmarked packets, so the
  first matching rule wins; the rule for unmarked packets gives the default class's mark),
  then each qdisc's fw filters map the mark to a class;
- cbq: its filters; what cbq does when none matches (defmap, split) is not modelled;
- families: a filter sees the packets of its protocol only (``protocol ip`` IPv4,
  ``protocol ipv6`` IPv6; the fw filters and the iptables / ip6tables rules too). u32 reads
  fixed offsets: an IPv6 key reads the next header and ports right after the 40-byte fixed
  header, whatever extension headers are there. flower filters see what the kernel's flow
  dissector finds (``flow_keys``): it walks hop-by-hop, routing and destination-options
  headers, stops at a fragment header (the protocol is known, the ports and TCP flags are 0
  in every fragment) and at AH; its ``ip_tos`` is IPv6's traffic class. ip6tables finds the
  protocol past those headers and a first fragment's ports, not past AH (the host kernel's
  ``-p 51`` matches TCP behind AH), and a later fragment has no ports for it;
- IPv6 packets have priority 0 (neither forwarding nor ``IPV6_TCLASS`` derives one from the
  traffic class, as IPv4's TOS does), which the priomaps of prio and pfifo_fast read.

The packet's priority is never a class id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from tcdsl import commands, ir, lower, u32layout, words
from tcdsl.allocate import default_minor
from tcdsl.commands import mark_text, queue_words
from tcdsl.diagnostics import Span
from tcdsl.frontend.chains import default_chain
from tcdsl.frontend.syntax import PROTOCOLS
from tcdsl.matching import bits_match, filter_bits, filters_at, kernel_words, words_verdict
from tcdsl.tcmath import DEFAULT_PRIOMAP, tos_priority
from tcdsl.teach.traffic import (
    DEST_OPTS,
    ETHERNET_HEADER,
    EXTENSION_NAMES,
    FRAGMENT,
    HOP_BY_HOP,
    LATER_FRAGMENT,
    PORTED,
    ROUTING,
    Packet,
)

T = TypeVar("T")


# ---- the verdict ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One decision on the packet's way down the qdisc tree."""

    qdisc: ir.Qdisc
    """The qdisc deciding."""
    cls: ir.Class | None
    """The class it chose (None: the packet stays in this qdisc: a classless qdisc, htb's
    direct queue, or a prio band the policy gives no class)."""
    why: str
    """In words: which filter matched, or which default or priomap entry took it."""
    span: Span | None
    """The policy text that decided (the match line, the default, the priomap), if any."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where a packet ends on one interface, and the decisions that put it there."""

    interface: ir.Interface
    steps: tuple[Step, ...]
    """From the root qdisc down."""
    later: Verdict | None = None
    """Where the packet's later fragments end, when a 1500-byte MTU does not hold it and the
    fragments can end elsewhere (:func:`fragments`); ``steps`` are then the first
    fragment's."""
    whole: Verdict | None = None
    """With ``later``: where the packet would end whole (on a device whose MTU holds it), when
    that is not where its first fragment ends."""

    @property
    def leaf(self) -> ir.Qdisc | None:
        """The qdisc the packet is queued in: the chosen class's leaf qdisc, or a classless
        qdisc; None in a leaf class without a leaf qdisc (the kernel gives it a pfifo), in
        htb's direct queue, or in a prio band without a class."""
        last = self.steps[-1]
        if last.cls is not None:
            return last.cls.leaf
        if isinstance(last.qdisc, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
            return None
        return last.qdisc

    @property
    def cls(self) -> ir.Class | None:
        """The last class chosen, if any."""
        for step in reversed(self.steps):
            if step.cls is not None:
                return step.cls
        return None

    @property
    def direct(self) -> bool:
        """True if the packet ends in htb's direct queue (unshaped)."""
        last = self.steps[-1]
        return last.cls is None and isinstance(last.qdisc, ir.Htb)

    @property
    def dropped(self) -> bool:
        """True if the packet is dropped: hfsc drops what reaches no leaf class."""
        last = self.steps[-1]
        return last.cls is None and isinstance(last.qdisc, ir.Hfsc)


DROPPED = "DROPPED (hfsc has no direct queue)"


class UnknownInterface(ValueError):
    """``classify`` was asked about an interface the policy does not name."""

    option = "--interface"
    """The command-line option to blame."""

    def __init__(self, name: str, known: tuple[str, ...], message: str | None = None) -> None:
        self.name = name
        self.known = known
        super().__init__(
            message
            or f"the policy has no interface '{name}' (it has: {', '.join(known) or 'none'})"
        )


class UnknownDirection(UnknownInterface):
    """The interface is the policy's, but has no tree in the direction asked for."""

    option = "--direction"

    def __init__(self, name: str, direction: str, has: tuple[str, ...]) -> None:
        said = f"interface '{name}' has no {direction} tree (it has: {', '.join(has)})"
        super().__init__(name, has, said)


DIRECTIONS = ("upload", "download", "ingress")
"""How ``classify`` names an interface's trees (``upload`` is its egress)."""
_DIRECTION_OF = {"egress": "upload", "download": "download", "ingress": "ingress"}


def direction_of(iface: ir.Interface) -> str:
    """``upload``, ``download`` or ``ingress``: which of its interface's trees ``iface`` is."""
    return _DIRECTION_OF[iface.direction]


def classify(
    policy: ir.Policy,
    packet: Packet,
    interface: str | None = None,
    direction: str | None = None,
    skip: frozenset[Span] = frozenset(),
) -> Verdict:
    """Classify ``packet`` on ``interface`` (default: the policy's first; a download's IFB
    names its download) in ``direction`` (``upload``, ``download`` or ``ingress``; default:
    the upload, else the interface's only tree) of an allocated ``policy``; raises
    ``UnknownInterface``. The filters of the match lines in ``skip`` are passed over (where
    a policer's ``continue`` sends the traffic above its rate).

    A packet a 1500-byte MTU does not hold (:func:`fragments`) reaches the tree in fragments:
    the verdict is its first fragment's, with ``later`` (and ``whole``) beside it. The
    marking rules see it whole (an upload's before IP cuts it, or after conntrack put it
    together again; a download's connection mark was set on whole packets); an upload by
    mark whose fragments all end alike gets neither."""
    iface = select_tree(policy, interface, direction)
    whole = Verdict(iface, tuple(_Walk(iface, packet, skip).start()))
    cut = fragments(packet)
    if cut is None:
        return whole
    head, rest = (Verdict(iface, tuple(_Walk(iface, p, skip, packet).start())) for p in cut)
    upload_by_mark = iface.marking is not None and iface.direction == "egress"
    if upload_by_mark and _alike(head, rest) and _alike(head, whole):
        return whole
    return Verdict(iface, head.steps, rest, None if _alike(head, whole) else whole)


def _alike(a: Verdict, b: Verdict) -> bool:
    """Whether two verdicts end in the same place by the same line (an ingress tree ends in
    its qdisc whether a policer took the packet or not)."""
    return outcome(a) == outcome(b) and a.steps[-1].span == b.steps[-1].span


MTU = 1500
"""The MTU the fragments are cut for (Ethernet's)."""


def fragments(packet: Packet) -> tuple[Packet, Packet] | None:
    """The first and a later fragment of ``packet`` (full-size) when a 1500-byte MTU does not
    hold it and it is cut into fragments before a qdisc sees it; only the first carries the
    protocol's header (ports, TCP flags). None for a packet that fits, a fragment already,
    or TCP (a TCP packet over the MTU is a GSO packet, cut after the qdisc, every segment
    with its header). The fragment header goes after the headers every fragment repeats
    (``ip6_find_1stfragopt``): hop-by-hop, a routing header and destination options before
    it."""
    if packet.fragment or packet.proto == PROTOCOLS["tcp"] or packet.size <= MTU + ETHERNET_HEADER:
        return None
    at, routed = 0, False
    for kind in packet.ext:
        if kind == ROUTING:
            routed = True
        elif kind != HOP_BY_HOP and (kind != DEST_OPTS or routed):
            break
        at += 1
    ext, size = packet.ext, MTU + ETHERNET_HEADER

    def cut(mark: int) -> Packet:
        return dataclasses.replace(packet, ext=(*ext[:at], mark, *ext[at:]), size=size)

    return cut(FRAGMENT), cut(LATER_FRAGMENT)


def select_tree(
    policy: ir.Policy, interface: str | None = None, direction: str | None = None
) -> ir.Interface:
    """The tree of ``policy`` that ``interface`` (default: the first) has in ``direction``
    (default: its upload, else its only tree); raises ``UnknownInterface``."""
    trees = list(policy.interfaces)
    names = tuple(dict.fromkeys(i.interface for i in trees))
    if interface is None:
        if not trees:
            raise UnknownInterface("(none)", names)
        interface = trees[0].interface
    found = [i for i in trees if interface in (i.interface, i.name)]
    if not found:
        raise UnknownInterface(interface, names)
    if direction is not None:
        chosen = [i for i in found if direction_of(i) == direction]
        if not chosen:
            raise UnknownDirection(interface, direction, tuple(direction_of(i) for i in found))
        found = chosen
    else:
        found.sort(key=lambda i: DIRECTIONS.index(direction_of(i)))
    return found[0]


# ---- what the kernel reads past the IP header ------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlowKeys:
    """A packet's fields as a parser past the IP header finds them (0: not found)."""

    ip_proto: int
    """The protocol found at the end of the extension headers walked."""
    sport: int
    dport: int
    tcp_flags: int
    fragment: bool
    first_fragment: bool
    walked: tuple[int, ...]
    """The extension headers walked past (their next-header numbers)."""


WALKED_BY_DISSECTOR = frozenset({0, 43, 60})
"""The IPv6 extension headers the flow dissector walks: hop-by-hop, routing, destination
options (``__skb_flow_dissect``, ``ip_proto_again``)."""
_PORTS_AT = {6: 0, 17: 0, 33: 0, 50: 0, 132: 0, 136: 0, 51: 4}
"""``proto_ports_offset``: where the dissector reads "ports" (AH: its SPI)."""
MAX_DISSECT_HEADERS = 15
"""``MAX_FLOW_DISSECT_HDRS``: how many headers the dissector walks at most."""


def flow_keys(packet: Packet, netfilter: bool = False) -> FlowKeys:
    """What the kernel finds in ``packet``'s bytes past the IP header.

    Both walk the hop-by-hop, routing and destination-options headers and stop at AH (its
    protocol is then AH's, 51). The flow dissector (flower; ``netfilter`` False) stops at a
    fragment header with the fragment's protocol and no ports or TCP flags (flower does not
    ask it to parse a first fragment). ip6tables (``netfilter`` True) reads a first fragment's
    ports; a later fragment has none (measured on the host: ``-p 51`` matches TCP behind AH,
    ``-p 6`` does not). IPv4: the protocol field, ports unless a
    fragment (flower) or a later fragment (iptables)."""
    header = packet.header()
    fragment = first = False
    walked: list[int] = []
    if packet.family == "ipv4":
        nh, off = header[9], (header[0] & 0x0F) * 4
        frag_field = int.from_bytes(header[6:8], "big")
        fragment = bool(frag_field & 0x3FFF)
        first = fragment and not frag_field & 0x1FFF
    else:
        nh, off = header[6], 40
        while len(walked) < MAX_DISSECT_HEADERS and off + 8 <= len(header):
            if nh in WALKED_BY_DISSECTOR:
                walked.append(nh)
                nh, off = header[off], off + (header[off + 1] + 1) * 8
            elif nh == 44:
                walked.append(nh)
                fragment = True
                first = not int.from_bytes(header[off + 2 : off + 4], "big") >> 3
                nh, off = header[off], off + 8
                if not (netfilter and first):
                    break
            else:
                break
    sport = dport = flags = 0
    readable = not fragment or (netfilter and first)
    at = _PORTS_AT.get(nh)
    if readable and at is not None and off + at + 4 <= len(header):
        sport = int.from_bytes(header[off + at : off + at + 2], "big")
        dport = int.from_bytes(header[off + at + 2 : off + at + 4], "big")
    if readable and nh == 6 and off + 14 <= len(header):
        flags = int.from_bytes(header[off + 12 : off + 14], "big") & 0x0FFF
    return FlowKeys(nh, sport, dport, flags, fragment, first, tuple(walked))


def flower_matches(f: ir.FlowerFilter, packet: Packet, keys: FlowKeys) -> bool:
    """True if flower filter ``f`` (of ``packet``'s family) matches: every field it gives
    equals the dissected one, under its mask or within its range."""
    if f.ip_proto is not None and keys.ip_proto != f.ip_proto:
        return False
    for net, address in ((f.src, packet.src), (f.dst, packet.dst)):
        if net is not None and not _in_network(address, net):
            return False
    for ports, port in ((f.sport, keys.sport), (f.dport, keys.dport)):
        if ports is not None and not ports[0] <= port <= ports[1]:
            return False
    if f.tos is not None and (packet.tos ^ f.tos[0]) & f.tos[1]:
        return False
    return f.tcp_flags is None or not (keys.tcp_flags ^ f.tcp_flags[0]) & f.tcp_flags[1]


def _in_network(address: int, net: ir.Network) -> bool:
    mask = int(net.netmask)
    return address & mask == int(net.network_address)


def _port_matches(port: ir.PortValue, value: int) -> bool:
    if port.mask is not None:
        return not (value ^ port.lo) & port.mask
    return port.lo <= value <= port.hi


def rule_matches(conds: tuple[ir.Cond, ...], packet: Packet) -> bool:
    """True if an iptables / ip6tables rule with ``conds`` (one alternative of a marking line,
    of ``packet``'s family) matches: the protocol past the extension headers (up to AH), ports
    and TCP flags but in a later fragment (``flow_keys(..., netfilter=True)``)."""
    keys = flow_keys(packet, netfilter=True)
    ported = keys.ip_proto in PORTED and not (keys.fragment and not keys.first_fragment)
    for cond in conds:
        match cond:
            case ir.AddrCond():
                for net, _ in cond.networks:
                    if ir.family_of(net) != packet.family:
                        return False
                    address = packet.src if cond.field == "src" else packet.dst
                    if not _in_network(address, net):
                        return False
            case ir.PortCond():
                port = keys.sport if cond.field == "sport" else keys.dport
                if not ported or not _port_matches(cond.ports[0], port):
                    return False
            case ir.ProtoCond():
                if keys.ip_proto != cond.protocols[0][0]:
                    return False
            case ir.TosCond():
                if (packet.tos ^ cond.value) & cond.mask:
                    return False
            case ir.TcpFlagsCond():
                if keys.ip_proto != 6 or not ported or (keys.tcp_flags ^ cond.value) & cond.mask:
                    return False
            case ir.AllCond():
                pass
            case ir.TcpAckCond() | ir.RawCond():  # checks refuse them in marking lines
                header = packet.ip_packet()
                if not any(
                    (bits := filter_bits(keys_)) is not None and bits_match(bits, header)
                    for keys_ in lower.u32_keys((cond,), packet.family)
                ):
                    return False
    return True


def packet_priority(packet: Packet) -> int:
    """The packet's priority (``skb->priority``) as the priomaps read it: IPv4's from its
    TOS (``rt_tos2priority``); 0 on IPv6, whose traffic class sets none."""
    return tos_priority(packet.tos) if packet.family == "ipv4" else 0


def _family_words(family: ir.Family) -> str:
    return "IPv4" if family == "ipv4" else "IPv6"


# ---- the walk ---------------------------------------------------------------------------------


class _GiveUp(Exception):
    """u32 read past the packet's end: it gives up the pref it is walking (tables and all)."""


@dataclass(frozen=True, slots=True)
class _Hit:
    """A filter that matched: the class id it names and the words saying why."""

    flowid: ir.Handle
    why: str
    span: Span


@ir.per_node
def _matches_by_span(iface: ir.Interface) -> dict[Span, ir.Match]:
    """The interface's match lines by span (made once: classify walks packet by packet)."""
    return {m.span: m for q in ir.walk_qdiscs(iface.root) for _, m in ir.matches_of(q)}


@ir.per_node
def _buckets(iface: ir.Interface) -> dict[tuple[ir.Handle, ir.Family, int], u32layout.Buckets]:
    """The interface's prefs laid out in u32 tables (made once, as above)."""
    return u32layout.buckets(iface) if iface.u32_tables else {}


@ir.per_node
def _classes_by_id(q: ir.Qdisc) -> dict[ir.Handle | None, ir.Class]:
    return {c.classid: c for c in ir.classes_of(q)}


class _Walk:
    """Classify one packet on one interface."""

    def __init__(
        self,
        iface: ir.Interface,
        packet: Packet,
        skip: frozenset[Span] = frozenset(),
        marked: Packet | None = None,
    ) -> None:
        """``marked``: the packet the marking rules see (default ``packet``): a fragment's
        whole packet."""
        self.iface = iface
        self.skip = skip
        self.packet = packet
        self.header = packet.ip_packet()
        self.keys = flow_keys(packet)
        self.matches = _matches_by_span(iface)
        self.tables = _buckets(iface)
        self.gave_up: list[int] = []
        """The prefs u32 gave up on, reading past the packet's end."""
        self.mark = 0
        self.mark_why = ""
        self.mark_span: Span | None = None
        if iface.marking is not None:
            if iface.download is not None and packet.later_fragment:
                self.mark_why = (
                    "a later fragment has no ports: connmark finds no connection for it and "
                    "restores no mark (the packet is unmarked)"
                )
            else:
                self._mark(iface.marking, marked or packet)

    def start(self) -> list[Step]:
        """The decisions from the root of the tree (after a download's redirect)."""
        steps = self.qdisc(self.iface.root)
        d = self.iface.download
        if d is None:
            return steps
        why = (
            f"arrives on {d.interface}; its ingress filter redirects every packet (every "
            f"protocol) to {self.iface.name}, where this tree shapes it"
        )
        if d.connmark:
            why += (
                "; connmark restores the connection's firewall mark first (the mark the "
                "firewall set on an earlier packet of the connection)"
            )
        redirect = Step(ir.Ingress(d.span, (), None, ir.INGRESS_HANDLE), None, why, d.span)
        return [redirect, *steps]

    def _mark(self, marking: ir.Marking, packet: Packet) -> None:
        chain = marking.chain or default_chain(self.iface.name)
        where = f"iptables chain {chain} ({marking.source(self.iface.name, 'packets')})"
        if packet.family == "ipv6":
            where = where.replace("iptables", "ip6tables", 1)
        rules = [r for r in marking.rules if r.family == packet.family]
        for number, rule in enumerate(rules, 1):
            if not rule_matches(rule.conds, packet):
                continue
            self.mark, self.mark_span = rule.mark, rule.span
            if rule.unmarked:
                self.mark_why = (
                    f"no marking rule matched; {where} gives still-unmarked packets "
                    f"the default's mark {mark_text(marking, rule.mark)}"
                )
            else:
                self.mark_why = (
                    f"{where}, rule {number} ({_conds(rule.conds)}) set mark "
                    f"{mark_text(marking, rule.mark)}"
                )
            return
        self.mark_why = f"no rule of {where} matched: the packet is unmarked"

    # ---- filters ----
    def _first_hit(self, parent: ir.Handle) -> _Hit | None:
        walked: set[tuple[ir.Handle, ir.Family, int]] = set()
        for f in filters_at(self.iface, parent):
            if f.span in self.skip or f.family != self.packet.family:
                continue
            group = (f.parent, f.family, f.pref)
            if group in walked:  # laid out in tables and walked, or given up
                continue
            if isinstance(f, ir.U32Filter) and group in self.tables:
                walked.add(group)
                try:
                    hit = self._u32_walk(self.tables[group], None, 0, [])
                except _GiveUp:
                    self.gave_up.append(f.pref)
                    continue
                if hit is not None:
                    return hit
                continue
            if isinstance(f, ir.FlowerFilter):
                if not flower_matches(f, self.packet, self.keys):
                    continue
                return self._hit(f, f"flower filter pref {f.pref}")
            if isinstance(f, ir.U32Filter):
                found = self._found(f)
                if found is None:
                    walked.add(group)
                    self.gave_up.append(f.pref)
                if not found:
                    continue
                return self._hit(f, f"filter pref {f.pref}")
            if isinstance(f, ir.FwFilter) and f.mark == self.mark:
                shown = mark_text(self.iface.marking, f.mark) if self.iface.marking else f.mark
                why = f"{self.mark_why}; fw filter pref {f.pref} maps mark {shown} to it"
                return _Hit(f.flowid, why, self.mark_span or f.span)
        return None

    def _u32_walk(
        self, group: u32layout.Buckets, table: int | None, bucket: int, path: list[str]
    ) -> _Hit | None:
        """u32's walk of a laid-out pref: a bucket's nodes by node id, into a linked table's
        bucket (the hashed byte's value), back to the node after the link when nothing in
        it matches."""
        for node in group.get((table, bucket), ()):
            if isinstance(node, ir.U32Table):
                inner = u32layout.bucket_of(node, self.header)
                if inner is None:  # the hashed word lies past the packet's end
                    raise _GiveUp
                step = f"table {node.table:x}: bucket {inner:#04x}"
                if node.hashed_byte is not None:
                    step += f" (byte {node.hashed_byte} of the {_header_name(node.family)})"
                hit = self._u32_walk(group, node.table, inner, [*path, step])
                if hit is not None:
                    return hit
                continue
            if node.span in self.skip:
                continue
            found = self._found(node)
            if found is None:
                raise _GiveUp
            if not found:
                continue
            where = f"; u32 went to {', then '.join(path)}" if path else ""
            return self._hit(node, f"filter pref {node.pref}", where)
        return None

    def _found(self, f: ir.U32Filter) -> bool | None:
        """Whether u32 finds ``f``'s keys in the packet; None: it read past the packet's end
        first, and gives up the filter's whole pref."""
        words = kernel_words(f.keys)
        return False if words is None else words_verdict(words, self.header)

    def _hit(self, f: ir.U32Filter | ir.FlowerFilter, name: str, where: str = "") -> _Hit:
        match = self.matches.get(f.span)
        if match is not None:
            text = _conds(match.conds)
        elif isinstance(f, ir.U32Filter):
            text = "match " + " ".join(w for k in f.keys for w in k.words)
        else:
            text = "match " + " ".join(commands.flower_words(f))
        if f.family == "ipv6" or isinstance(f, ir.FlowerFilter):
            text = f"{_family_words(f.family)}: {text}"
        why = f"{name} matched ({text}){where}{self._gave_up_note()}"
        if match is not None and isinstance(f, ir.U32Filter):
            why += self._portless_note(match)
        if isinstance(f, ir.FlowerFilter) and self.keys.walked:
            headers = words.or_list([EXTENSION_NAMES[h] for h in self.keys.walked], "and")
            why += f"; the flow dissector read past the {headers} header"
            why += "s" if len(self.keys.walked) > 1 else ""
        if f.police is not None:
            target = None if f.parent == ir.INGRESS_HANDLE else str(f.flowid)
            shared = words.shared_filters(self.iface.filters, f.span)
            why += f"; {words.police_phrase(f.police, target, shared)}"
        return _Hit(f.flowid, why, f.span)

    def _no_hit(self) -> str:
        if self.iface.marking is None:
            why = "no filter matched"
        else:
            why = f"{self.mark_why}; no fw filter maps mark {self.mark}"
        family = self.packet.family
        if family not in self.iface.families:
            only = _family_words(self.iface.families[0])
            why += (
                f" (the tree classifies {only} only: no filter of it sees {_family_words(family)})"
            )
        elif self.iface.marking is None:
            why += self._gave_up_note() + self._fixed_offsets_note()
        return why

    def _portless_note(self, match: ir.Match) -> str:
        """Why a u32 port line matched a packet without ports: its keys read the bytes where
        ports would be, whatever the protocol."""
        packet = self.packet
        if packet.proto in PORTED or packet.later_fragment:
            return ""
        if not any(isinstance(c, ir.PortCond) for c in match.conds):
            return ""
        at = 40 if packet.family == "ipv6" else 20  # where u32's port keys read
        first = int.from_bytes(self.header[at : at + 2], "big")
        second = int.from_bytes(self.header[at + 2 : at + 4], "big")
        name = words.protocol_name(packet.proto)
        if packet.proto in (1, 58) and (packet.proto == 1) == (packet.family == "ipv4"):
            what = f"the echo request's type and code as sport {first} and its checksum"
        else:
            what = f"the first bytes of its header as sport {first} and the next"
        return (
            f" ({name} has no ports: u32's port keys read the 4 bytes after the IP header, "
            f"here {what} as dport {second})"
        )

    def _gave_up_note(self) -> str:
        if not self.gave_up:
            return ""
        prefs = ", ".join(str(p) for p in self.gave_up)
        return (
            f" (u32 gave up pref {prefs}: a key of it lies past the end of this "
            f"{len(self.header)}-byte packet, and u32 then tries no other filter of that pref)"
        )

    def _priority_words(self) -> str:
        prio = packet_priority(self.packet)
        if self.packet.family == "ipv6":
            return f"IPv6 (its traffic class sets no priority) -> priority {prio}"
        return f"TOS 0x{self.packet.tos:02x} -> priority {prio}"

    def _fixed_offsets_note(self) -> str:
        """Why an IPv6 packet with extension headers, or a fragment, can miss what its
        protocol and ports would match."""
        packet = self.packet
        first = packet.ext[0] if packet.ext else None
        if self.iface.classifier == "u32" and packet.family == "ipv6" and first is not None:
            name = EXTENSION_NAMES[first]
            return (
                f" (u32 reads IPv6's next header and ports right after the 40-byte header, "
                f"where this packet has its {name} header)"
            )
        if self.iface.classifier == "flower" and packet.fragment:
            return " (the flow dissector gives a fragment no ports and no TCP flags)"
        if packet.ext and LATER_FRAGMENT in packet.ext:
            return " (a later fragment holds no ports)"
        return ""

    # ---- qdiscs ----
    def qdisc(self, q: ir.Qdisc) -> list[Step]:
        match q:
            case ir.Htb() | ir.Hfsc():
                return self._htb(q)
            case ir.Prio():
                return self._prio(q)
            case ir.Cbq():
                return self._cbq(q)
            case ir.PfifoFast():
                prio = packet_priority(self.packet)
                band = DEFAULT_PRIOMAP[prio]
                why = f"{self._priority_words()} -> band {band} (pfifo_fast's priomap)"
                return [Step(q, None, why, q.span.prefix(len(q.kind)))]
            case ir.Ingress():
                hit = self._first_hit(ir.INGRESS_HANDLE)
                if hit is None:
                    why = "no policer's match takes it: it is accepted as it is"
                    return [Step(q, None, why, q.span.prefix(len(q.kind)))]
                return [Step(q, None, hit.why, hit.span)]
            case ir.Mq():
                return self._mq(q)
            case ir.Tbf() | ir.Netem() if q.child is not None:
                why = f"{q.kind} has no classes: every packet goes to its child {q.child.kind}"
                step = Step(q, None, why, q.span.prefix(len(q.kind)))
                return [step, *self.qdisc(q.child)] if _descends(q.child) else [step]
            case _:
                why = f"{q.kind} has no classes: every packet is queued here"
                return [Step(q, None, why, q.span.prefix(len(q.kind)))]

    def _mq(self, q: ir.Mq) -> list[Step]:
        """The clsact's egress filters pick the TX queue (the first that matches), then that
        queue's qdisc classifies; a packet none matches stays on the queue the kernel picked
        (XPS, or a hash of its flow), shown on the first queue."""
        at = q.span.prefix(len(q.kind))
        if not q.queues:
            return [Step(q, None, "mq with no queue of the policy's: the device's defaults", at)]
        hit = self._first_hit(ir.CLSACT_EGRESS)
        queue = q.queues[0]
        if hit is not None:
            queue = next((mq for mq in q.queues if mq.number == hit.flowid.minor), queue)
            why = f"clsact egress: {hit.why} -> {queue_words(hit.flowid)}"
            span: Span | None = hit.span
        else:
            why = (
                "no steering filter matched: the kernel picks the TX queue (XPS, or a hash of "
                f"the flow); shown on {queue_words(ir.Handle(q.handle.major, queue.number))}"
                if q.handle is not None
                else "no steering filter matched"
            )
            span = at
        step = Step(q, None, why, span)
        return [step, *self.qdisc(queue.qdisc)] if _descends(queue.qdisc) else [step]

    def _into(self, q: ir.Qdisc, cls: ir.Class, why: str, span: Span | None) -> list[Step]:
        step = Step(q, cls, f"{why} -> {cls.label} ({cls.classid})", span)
        if cls.leaf is not None and _descends(cls.leaf):
            return [step, *self.qdisc(cls.leaf)]
        return [step]

    def _htb(self, q: ir.Htb | ir.Hfsc) -> list[Step]:
        """htb and hfsc classify alike: filters from the root down to a leaf, then the default
        class; what has no class goes to htb's direct queue (unshaped) or is dropped by hfsc."""
        assert q.handle is not None
        nowhere = "the direct queue, unshaped" if isinstance(q, ir.Htb) else DROPPED
        classes = _classes_by_id(q)
        parent, head = q.handle, ""
        while (hit := self._first_hit(parent)) is not None:
            if hit.flowid == q.handle:
                why = f"{hit.why} -> the {q.kind} itself ({q.handle}): {nowhere}"
                return [Step(q, None, why, hit.span)]
            cls = classes.get(hit.flowid)
            if cls is None:
                head = f"{hit.why}, but no class {hit.flowid} exists"
                break
            if not cls.children:
                return self._into(q, cls, hit.why, hit.span)
            assert cls.classid is not None
            head = f"{hit.why} -> {cls.label}, an inner class, and no filter below it matched"
            parent = cls.classid
        head = head or self._no_hit()
        minor = default_minor(q)
        default = next(
            (c for c in classes.values() if c.classid is not None and c.classid.minor == minor),
            None,
        )
        if q.default is None or default is None:
            why = f"{head} and {q.kind} has no default: {nowhere}"
            return [Step(q, None, why, q.span.prefix(len(q.kind)))]
        if default.children:
            why = f"{head}; {q.kind}'s default '{default.name}' is not a leaf: {nowhere}"
            return [Step(q, None, why, q.default.span)]
        return self._into(q, default, f"{head}: {q.kind} default '{default.name}'", q.default.span)

    def _prio(self, q: ir.Prio) -> list[Step]:
        assert q.handle is not None
        bands = q.bands.value if q.bands is not None else 3
        priomap = tuple(c.value for c in q.priomap) if q.priomap else DEFAULT_PRIOMAP
        hit = self._first_hit(q.handle)
        span: Span | None
        if hit is not None:
            band, why, span = hit.flowid.minor - 1, hit.why, hit.span
            if not 0 <= band < bands:
                band = priomap[0]
                why += f"; {hit.flowid} is no band, so priomap[0]: band {band}"
        else:
            prio = packet_priority(self.packet)
            band = priomap[prio]
            which = "priomap" if q.priomap else "the default priomap"
            why = f"{self._no_hit()}: {self._priority_words()} -> band {band} ({which})"
            span = q.priomap[prio].span if q.priomap else q.span.prefix(len(q.kind))
        cls = next(
            (c for c in ir.classes_of(q) if c.classid is not None and c.classid.minor == band + 1),
            None,
        )
        if cls is None:
            why += f"; the policy gives band {band} no class (the kernel's default pfifo)"
            return [Step(q, None, why, span)]
        return self._into(q, cls, why, span)

    def _cbq(self, q: ir.Cbq) -> list[Step]:
        assert q.handle is not None
        classes = {c.classid: c for c in ir.classes_of(q)}
        hit = self._first_hit(q.handle)
        if hit is not None and (cls := classes.get(hit.flowid)) is not None and not cls.children:
            return self._into(q, cls, hit.why, hit.span)
        why = (
            f"{self._no_hit() if hit is None else hit.why}: what cbq does then (its defmap "
            "and split classes) is not modelled"
        )
        return [Step(q, None, why, q.span.prefix(len(q.kind)))]


def _descends(q: ir.Qdisc) -> bool:
    """True if classification goes on inside ``q`` (it has classes or bands to choose)."""
    if isinstance(q, ir.Htb | ir.Prio | ir.Cbq | ir.PfifoFast | ir.Hfsc):
        return True
    if isinstance(q, ir.Tbf | ir.Netem) and q.child is not None:
        return _descends(q.child)
    return False


def _header_name(family: ir.Family) -> str:
    return "IPv6 header" if family == "ipv6" else "IP header"


def _conds(conds: tuple[ir.Cond, ...]) -> str:
    """Conditions in the policy's short words (``tcdsl.words``): ``match tcp dport 80, 443``."""
    return "match " + (" ".join(words.cond_words(c) for c in conds) or "all traffic")


# ---- output -------------------------------------------------------------------------------------


def _qdisc_name(q: ir.Qdisc) -> str:
    return f"{q.kind} {q.handle}" if q.handle is not None else q.kind


def outcome(verdict: Verdict) -> str:
    """Where the packet ends, in a few words (``class 'voip' (1:20), leaf sfq``)."""
    last = verdict.steps[-1]
    if verdict.direct:
        return f"the direct queue of {_qdisc_name(last.qdisc)} (unshaped)"
    if verdict.dropped:
        return f"dropped by {_qdisc_name(last.qdisc)} (no class takes it)"
    if last.cls is not None:
        return f"{last.cls.label} ({last.cls.classid}), leaf {words.leaf_words(last.cls.leaf)}"
    if isinstance(last.qdisc, ir.Prio | ir.Cbq):
        return f"{_qdisc_name(last.qdisc)} itself (no class of the policy takes it)"
    cls = verdict.cls
    where = f"{cls.label} ({cls.classid}), leaf " if cls is not None else "qdisc "
    return where + _qdisc_name(last.qdisc)


def render_text(verdict: Verdict, packet: Packet) -> str:
    """The verdict as ``tcdsl classify`` prints it: the packet and where it ends, then each
    decision with the policy line that made it."""
    iface = verdict.interface
    where = "" if iface.direction == "egress" else f" ({direction_of(iface)} of {iface.interface})"
    lines = [f"{packet.describe()}{where} -> {outcome(verdict)}"]
    for step in verdict.steps:
        where = f"{step.span}: " if step.span is not None else ""
        lines.append(f"    {where}{_qdisc_name(step.qdisc)} {step.why}")
    if verdict.later is not None:
        lines.append(f"    note: {fragments_note(verdict, packet)}")
    return "".join(line + "\n" for line in lines)


def fragments_split(verdict: Verdict) -> bool:
    """Whether a packet's later fragments are decided otherwise than its first: another
    outcome, or another line deciding it."""
    return verdict.later is not None and not _alike(verdict.later, verdict)


def _elsewhere(other: Verdict, verdict: Verdict, verb: str) -> str:
    """Where ``other`` ends, said beside ``verdict``'s (``there too`` when alike)."""
    ended = outcome(other)
    if ended != outcome(verdict):
        return f"{verb} in {ended}"
    if _alike(other, verdict):
        return f"{verb} there too"
    return f"{verb} there too, but not by that line: {other.steps[-1].why}"


def fragments_note(verdict: Verdict, packet: Packet) -> str:
    """What happens to the fragments of a packet a 1500-byte MTU does not hold: the verdict
    shown is the first fragment's; where the later ones end, and where the packet would end
    whole when that differs."""
    assert verdict.later is not None
    iface = verdict.interface
    header = "ports" if packet.proto in PORTED else "protocol's header"
    size = f"a packet of {packet.size - ETHERNET_HEADER} bytes is more than a {MTU}-byte MTU holds"
    if iface.direction == "egress":
        cut = "unless the device's MTU is larger, it leaves in fragments"
        if packet.family == "ipv6":
            cut += (
                " (IPv6: cut by the host that sends it; a router drops it and answers Packet "
                "Too Big)"
            )
    else:
        cut = "it arrives in fragments (cut by " + (
            "the host that sent it)"
            if packet.family == "ipv6"
            else "its sender or a router on the way)"
        )
    first = "the first (classify '... frag') ends as shown"
    if verdict.whole is not None:
        first += f" (whole, it would {_elsewhere(verdict.whole, verdict, 'end')})"
    later = _elsewhere(verdict.later, verdict, "end")
    if iface.download is not None and iface.marking is not None:
        later += " (without the ports, connmark finds no connection for them: they stay unmarked)"
    elif iface.classifier == "u32" and packet.family == "ipv4" and packet.proto in PORTED:
        later += (
            " (u32 reads a later fragment's payload where the ports would be: zeros here, "
            "other bytes may match a port line)"
        )
    return (
        f"{size}: {cut}, and only the first has the {header}: {first}; "
        f"the later ones (classify '... laterfrag') {later}"
    )


def to_json(verdict: Verdict, packet: Packet) -> dict[str, object]:
    """The verdict as a JSON-ready dict (``tcdsl classify --format json``)."""

    def span(s: Span | None) -> dict[str, object] | None:
        if s is None:
            return None
        return {"file": s.file, "line": s.line, "column": s.column}

    def cls_id(c: ir.Class | None) -> str | None:
        return None if c is None or c.classid is None else str(c.classid)

    cls = verdict.cls
    return {
        "packet": packet.describe(),
        "family": packet.family,
        "interface": verdict.interface.interface,
        "direction": direction_of(verdict.interface),
        "device": verdict.interface.name,
        "class": None if cls is None else cls.name,
        "classid": cls_id(cls),
        "leaf": None if verdict.leaf is None else verdict.leaf.kind,
        "direct": verdict.direct,
        "dropped": verdict.dropped,
        "outcome": outcome(verdict),
        "later_fragments": None if verdict.later is None else outcome(verdict.later),
        "later_fragments_why": None if verdict.later is None else verdict.later.steps[-1].why,
        "whole": None if verdict.whole is None else outcome(verdict.whole),
        "whole_why": None if verdict.whole is None else verdict.whole.steps[-1].why,
        "steps": [
            {
                "qdisc": s.qdisc.kind,
                "handle": None if s.qdisc.handle is None else str(s.qdisc.handle),
                "class": None if s.cls is None else s.cls.name,
                "classid": cls_id(s.cls),
                "why": s.why,
                "span": span(s.span),
            }
            for s in verdict.steps
        ],
    }
