"""Policy pieces in plain words: the one place that says what a match, a rate or a queue means.

Two registers. The short words stay close to the policy text (``dport 80, 443``,
``rate 6mbit, no borrowing``); the diagram backends (``dot``, ``mermaid``) label their boxes
with them. The long words are phrases for people learning traffic control (``TCP or UDP packets
to port 80 or 443``); ``tcdsl explain`` builds its sentences from them. Nothing here escapes or
lays out text: callers do that for their own format.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

from tcdsl import ir
from tcdsl.commands import police_words, qdisc_words
from tcdsl.diagnostics import Span
from tcdsl.frontend.syntax import DSCP_NAMES, PROTOCOLS
from tcdsl.lower import FAMILY_PROTOCOLS, PROTO_NAMES, address_text, family_alternatives
from tcdsl.units import format_rate, format_size, format_time

# ---- short words, close to how the policy is written -------------------------------------------


SHORT_PROTO_NAMES = {**PROTO_NAMES, 58: "icmpv6"}
"""Protocols as the policy writes them."""


def _port(p: ir.PortValue) -> str:
    if p.mask is not None:
        return f"{p.lo}/0x{p.mask:04x}"
    return str(p.lo) if p.lo == p.hi else f"{p.lo}-{p.hi}"


def cond_words(cond: ir.Cond) -> str:
    """A condition in short words, close to how it is written (``dport 80, 443``)."""
    match cond:
        case ir.AddrCond():
            return f"{cond.field} {', '.join(address_text(n) for n, _ in cond.networks)}"
        case ir.PortCond():
            return f"{cond.field} {', '.join(_port(p) for p in cond.ports)}"
        case ir.ProtoCond():
            names = [SHORT_PROTO_NAMES.get(n, f"proto {n}") for n, _ in cond.protocols]
            return ", ".join(names)
        case ir.TosCond():
            if cond.dscp is not None:
                return f"dscp {cond.dscp}"
            if cond.mask == 0xFF:
                return f"tos 0x{cond.value:02x}"
            return f"tos 0x{cond.value:02x}/0x{cond.mask:02x}"
        case ir.TcpAckCond():
            return "tcp-ack"
        case ir.TcpFlagsCond():
            return tcp_flags_text(cond)
        case ir.RawCond():
            digits = cond.bits // 4
            return (
                f"u{cond.bits} 0x{cond.value:0{digits}x}/0x{cond.mask:0{digits}x} at {cond.offset}"
            )
        case ir.AllCond():
            return "all traffic"
        case _:
            assert_never(cond)


def match_words(match: ir.Match) -> str:
    """A match line in short words: its conditions, then its pref if one was written."""
    words = " ".join(cond_words(c) for c in match.conds) or "all traffic"
    if match.pref is not None:
        words += f" (pref {match.pref.value})"
    if match.police is not None:
        words += ", " + " ".join(police_words(match.police))
    return words


def leaf_words(q: ir.Qdisc | None) -> str:
    """The qdisc a leaf class queues in, with its options (the kernel's pfifo if none)."""
    if q is None:
        return "pfifo (kernel default)"
    return " ".join(qdisc_words(q))


def _rate(value: ir.Rate | ir.Percent | None) -> int | None:
    return value.bits_per_second if isinstance(value, ir.Rate) else None


def rate_line(kind: str, cls: ir.Class, root: bool = False) -> str | None:
    """Guaranteed rate and how far the class may borrow (``rate 6mbit, may borrow to 10mbit``);
    ``root``: no class is above it (an htb one has nothing to borrow from, whatever its ceil:
    found by a tester, the diagrams said it borrowed)."""
    rate = _rate(cls.rate)
    if rate is None:
        return None
    text = f"rate {format_rate(rate)}"
    if kind == "htb":
        ceil = _rate(cls.ceil)
        if root and ceil is not None and ceil > rate:
            return (
                f"{text}, no borrowing (no parent to borrow from; ceil {format_rate(ceil)} unused)"
            )
        if ceil is None or ceil == rate:
            return f"{text}, no borrowing"
        return f"{text}, may borrow to {format_rate(ceil)} (+{format_rate(ceil - rate)})"
    if kind == "cbq":
        flags = [w for w, on in (("bounded", cls.bounded), ("isolated", cls.isolated)) if on]
        if not cls.bounded:
            flags.append("may borrow from its parent")
        return ", ".join([text, *flags])
    return text


def _curve_phrase(curve: ir.Curve, what: str) -> str:
    m2 = format_rate(curve.m2.bits_per_second)
    if what != "guaranteed":  # link-sharing and upper limits: the long-run rate matters
        if curve.d is None or curve.d.microseconds == 0:
            return f"{what} {m2}"
        d = format_time(curve.d.microseconds)
        if curve.m1_bits == 0:
            return f"{what} {m2} (nothing for the first {d})"
        return f"{what} {m2} ({format_rate(curve.m1_bits)} for the first {d})"
    if curve.umax is not None and curve.dmax is not None and curve.umax.bytes:
        return (
            f"{what} {m2} with {format_time(curve.dmax.microseconds)} delay for the first "
            f"{curve.umax.bytes} bytes"
        )
    if curve.d is None or curve.d.microseconds == 0:
        return f"{what} {m2}"
    d = format_time(curve.d.microseconds)
    if curve.m1_bits == 0:
        return f"{what} {m2} after the first {d} of a backlog"
    return f"{what} {format_rate(curve.m1_bits)} for the first {d} of a backlog, then {m2}"


def curve_phrases(cls: ir.Class) -> list[str]:
    """An hfsc class's curves in words: ``guaranteed 2mbit with 10ms delay for the first 1500
    bytes``, ``shares the rest by 3mbit``, ``never more than 5mbit``."""
    phrases: list[str] = []
    if cls.rt is not None:
        phrases.append(_curve_phrase(cls.rt, "guaranteed"))
    if cls.ls is not None:
        phrases.append(_curve_phrase(cls.ls, "shares the rest by"))
    if cls.ul is not None:
        phrases.append(_curve_phrase(cls.ul, "never more than"))
    return phrases


# ---- long words, for people ------------------------------------------------------------------

TOS_BITS: tuple[tuple[int, str], ...] = (
    (0x10, "minimize delay"),
    (0x08, "maximize throughput"),
    (0x04, "maximize reliability"),
    (0x02, "minimize cost"),
)
"""The RFC 1349 TOS bits, highest first (the byte's 0x1e bits, which Linux maps to priority)."""

_PROTOCOL_NAMES: dict[int, str] = {}
for _name, _number in PROTOCOLS.items():
    _PROTOCOL_NAMES.setdefault(_number, _name.upper())
_PROTOCOL_NAMES[58] = "ICMPv6"
_DSCP_NAMES: dict[int, str] = {}
for _name, _number in DSCP_NAMES.items():
    if _name != "be":
        _DSCP_NAMES.setdefault(_number, _name.upper())

_IP_FIELDS: dict[tuple[int, int, int], str] = {
    (8, 0, 0xF0): "IP version",
    (8, 0, 0x0F): "IP header length (in 32-bit words)",
    (8, 1, 0xFF): "TOS byte",
    (16, 2, 0xFFFF): "total length",
    (16, 4, 0xFFFF): "identification",
    (16, 6, 0xFFFF): "flags and fragment offset",
    (8, 8, 0xFF): "TTL",
    (8, 9, 0xFF): "protocol number",
    (16, 10, 0xFFFF): "header checksum",
    (32, 12, 0xFFFFFFFF): "source address",
    (32, 16, 0xFFFFFFFF): "destination address",
    (16, 20, 0xFFFF): "source port (if the IP header has no options)",
    (16, 22, 0xFFFF): "destination port (if the IP header has no options)",
    (8, 33, 0xFF): "TCP flags (if the IP header has no options)",
}
"""Fields of the IPv4 header (and of TCP/UDP right after a 20-byte one) by (bits, offset, mask)."""

_FIELD_OF: dict[tuple[int, int], str] = {
    (bits, offset): name for (bits, offset, mask), name in _IP_FIELDS.items()
}


def protocol_name(number: int) -> str:
    """An IP protocol as people write it (``TCP``, ``ICMP``, ``protocol 200``)."""
    return _PROTOCOL_NAMES.get(number, f"protocol {number}")


def tos_meaning(tos: int) -> str:
    """The RFC 1349 bits set in a TOS byte (``minimize delay``), or ``normal service``."""
    names = [name for bit, name in TOS_BITS if tos & bit]
    return " + ".join(names) if names else "normal service"


def dscp_name(dscp: int) -> str:
    """A DSCP code point by name and number (``EF (46)``), or its number alone."""
    name = _DSCP_NAMES.get(dscp)
    return f"{name} ({dscp})" if name else str(dscp)


def or_list(items: list[str], conjunction: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c`` (or with ``and``)."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def _network_words(network: ir.Network) -> str:
    if network.prefixlen == 0:
        return "any address"
    return address_text(network)


def _port_words(p: ir.PortValue) -> tuple[str, bool]:
    """One port spec in words, and whether it stands for several ports."""
    if p.mask is None:
        return (str(p.lo), False) if p.lo == p.hi else (f"{p.lo}-{p.hi}", True)
    mask = p.mask & 0xFFFF
    low_bits = ~mask & 0xFFFF
    if low_bits & (low_bits + 1) == 0:  # a prefix mask: the ports form one aligned range
        lo = p.lo & mask
        if low_bits == 0:
            return str(lo), False
        return f"{lo}-{lo | low_bits}", True
    return f"any whose bits 0x{mask:04x} equal 0x{p.lo & mask:04x}", True


def _ports_words(cond: ir.PortCond) -> str:
    parts = [_port_words(p) for p in cond.ports]
    word = "ports" if any(many for _, many in parts) else "port"
    return f"{word} {or_list([text for text, _ in parts])}"


def tos_words(cond: ir.TosCond, ipv6: bool = False) -> str:
    """A ``tos`` or ``dscp`` condition as a phrase (``with TOS 0x10 (minimize delay)``);
    ``ipv6``: for IPv6 packets only, whose header calls the byte the traffic class (RFC 8200)
    and has no RFC 1349 meanings."""
    if cond.dscp is not None:
        return f"with DSCP {dscp_name(cond.dscp)}"
    value = cond.value & cond.mask
    if ipv6:
        if cond.mask == 0xFF:
            return f"with traffic class 0x{value:02x}"
        return f"whose traffic class, under mask 0x{cond.mask:02x}, is 0x{value:02x}"
    if cond.mask == 0xFF:
        return f"with TOS 0x{cond.value:02x} ({tos_meaning(cond.value)})"
    meaning = tos_meaning(value) if cond.mask & 0x1E == 0x1E else None
    text = f"whose TOS byte, under mask 0x{cond.mask:02x}, is 0x{value:02x}"
    return f"{text} ({meaning})" if meaning else text


def tcp_flags_text(cond: ir.TcpFlagsCond) -> str:
    """A ``tcp-flags`` condition as the policy writes it."""
    text = f"tcp-flags {','.join(cond.names(cond.value))}"
    if cond.mask != cond.value:
        text += f" of {','.join(cond.names(cond.mask))}"
    return text


def tcp_flags_words(cond: ir.TcpFlagsCond) -> str:
    """A ``tcp-flags`` condition as a phrase (``with TCP flag SYN set and ACK clear``)."""
    up = [n.upper() for n in cond.names(cond.value)]
    down = [n.upper() for n in cond.names(cond.mask & ~cond.value)]
    text = f"with TCP flag{'s' if len(up) > 1 else ''} {or_list(up, 'and')} set"
    if down:
        text += f" and {or_list(down, 'and')} clear"
    return text


def raw_words(cond: ir.RawCond) -> str:
    """A raw u32 key spelled out (``whose TTL (u8 at byte 8) is 0x40``)."""
    digits = cond.bits // 4
    full = (1 << cond.bits) - 1
    field = _IP_FIELDS.get((cond.bits, cond.offset, cond.mask & full))
    if field is not None:
        where = f"u{cond.bits} at byte {cond.offset}"
    else:
        named = _FIELD_OF.get((cond.bits, cond.offset))
        field = f"{named}, masked" if named else f"{cond.bits}-bit word at byte {cond.offset}"
        where = f"u{cond.bits} at byte {cond.offset}, mask 0x{cond.mask:0{digits}x}"
    value = cond.value & cond.mask
    return f"whose {field} ({where}) is 0x{value:0{digits}x}"


FAMILY_NAMES: dict[ir.Family, str] = {"ipv4": "IPv4", "ipv6": "IPv6"}


def families_words(families: Iterable[ir.Family]) -> str:
    """Families as an adjective: ``IPv4``, ``IPv6``, ``IPv6 and IPv4`` (IPv6 first: the
    family a reader of an old IPv4-only tool does not expect)."""
    present = set(families)
    return " and ".join(FAMILY_NAMES[f] for f in ("ipv6", "ipv4") if f in present)


def line_families(match: ir.Match, tree: tuple[ir.Family, ...]) -> tuple[ir.Family, ...]:
    """The families a match line's filters are for, in a tree of families ``tree``: its own
    ``family``, else the tree's, narrowed by its addresses and protocols."""
    found = {family for family, _ in family_alternatives(match, tree)}
    return tuple(f for f in ir.FAMILIES if f in found)


def match_phrase(
    match: ir.Match, tree: tuple[ir.Family, ...] | None = None, any_protocol: bool = False
) -> str:
    """A match line in words for people (``TCP or UDP packets to port 80 or 443``; with the
    families of its tree, ``IPv6 and IPv4 TCP or UDP packets to port 80 or 443``).
    ``any_protocol``: ports alone check no protocol (u32's IPv4 filters read the bytes where
    TCP and UDP keep them in any packet): ``packets to port 80``.

    Conditions AND, so they become one noun phrase: the protocol makes the noun, addresses
    and ports say where packets come from and go to, the rest qualifies. A ``pref`` is left
    to the caller, which knows the order filters are tried in. The family is left out when
    the protocols name it (ICMP is IPv4's, ICMPv6 IPv6's).
    """
    family = ""
    if tree is not None:
        families = line_families(match, tree)
        named = {
            FAMILY_PROTOCOLS.get(n)
            for c in match.conds
            if isinstance(c, ir.ProtoCond)
            for n, _ in c.protocols
        }
        if None in named or not named:
            family = families_words(families) + " " if families else "no "
        any_protocol = any_protocol and "ipv4" in families
        ipv6 = families == ("ipv6",)
    else:
        ipv6 = match.family is not None and match.family.families == ("ipv6",)
    phrase = _match_phrase(match, any_protocol, ipv6)
    if not family:
        return phrase
    if phrase == "every packet":
        return f"every {family}packet"
    if phrase.startswith("small TCP ACKs"):
        if "ipv6" in families:
            phrase = phrase.replace(ACK_WORDS, ACK_WORDS_6)
        return phrase.replace("small TCP ACKs", f"small {family}TCP ACKs", 1)
    return family + phrase


ACK_WORDS = "TCP packets under 64 bytes with only the ACK flag set"
ACK_WORDS_6 = (
    "TCP packets with only the ACK flag set and under 64 bytes, not counting IPv6's 40-byte header"
)


def _match_phrase(match: ir.Match, any_protocol: bool = False, ipv6: bool = False) -> str:
    protos: list[str] = []
    src: list[str] = []
    dst: list[str] = []
    sport: list[str] = []
    dport: list[str] = []
    extra: list[str] = []
    ack = False
    for cond in match.conds:
        match cond:
            case ir.AddrCond():
                target = src if cond.field == "src" else dst
                target.append(or_list([_network_words(n) for n, _ in cond.networks]))
            case ir.PortCond():
                (sport if cond.field == "sport" else dport).append(_ports_words(cond))
            case ir.ProtoCond():
                protos.append(or_list([protocol_name(n) for n, _ in cond.protocols]))
            case ir.TosCond():
                extra.append(tos_words(cond, ipv6))
            case ir.TcpAckCond():
                ack = True
            case ir.TcpFlagsCond():
                extra.append(tcp_flags_words(cond))
            case ir.RawCond():
                extra.append(raw_words(cond))
            case ir.AllCond():
                pass
            case _:
                assert_never(cond)
    if ack:
        noun = f"small TCP ACKs ({ACK_WORDS})"
        if protos:
            extra.insert(0, f"that are also {' and '.join(protos)}")
    elif protos:
        noun = " and ".join(protos) + " packets"
    elif (sport or dport) and not any_protocol:
        noun = "TCP or UDP packets"
    elif sport or dport or src or dst or extra:  # (ports alone: in any packet)
        noun = "packets"
    else:
        return "every packet"
    words = [noun]
    for addrs, ports, preposition in ((src, sport, "from"), (dst, dport, "to")):
        if addrs or ports:
            where = " and ".join(addrs) + (" " if addrs and ports else "") + " and ".join(ports)
            words.append(f"{preposition} {where}")
    words += extra
    return " ".join(words)


def match_text(match: ir.Match) -> str:
    """A match line as the policy writes it (``match proto tcp dport 5001 pref 2``)."""
    words = ["match"]
    if match.family is not None:
        families = match.family.families
        words += ["family", "both" if len(families) == 2 else families[0]]
    for cond in match.conds:
        match cond:
            case ir.ProtoCond():
                words.append(
                    "proto "
                    + ", ".join(SHORT_PROTO_NAMES.get(n, str(n)) for n, _ in cond.protocols)
                )
            case ir.TosCond() if cond.dscp is not None:
                words.append(f"dscp {_DSCP_NAMES.get(cond.dscp, str(cond.dscp)).lower()}")
            case ir.AllCond():
                words.append("all")
            case _:
                words.append(cond_words(cond))
    if match.pref is not None:
        words.append(f"pref {match.pref.value}")
    if match.police is not None:
        words += police_words(match.police)
    return " ".join(words)


RECLASSIFY_LIMIT = 16
"""How often the kernel restarts classification for one packet before it drops it
(net/sched/cls_api.c, ``max_reclassify_loop``: 16 since Linux 5.14, 4 before)."""


def shared_filters(filters: Iterable[ir.Filter], span: Span) -> int:
    """How many filters of the match line at ``span`` share its one police action (0 when
    the line is one filter, whose policer is its own)."""
    return sum(
        1
        for f in filters
        if isinstance(f, ir.U32Filter | ir.FlowerFilter)
        and f.span == span
        and f.police_index is not None
    )


def police_phrase(p: ir.Police, target: str | None, shared: int = 0) -> str:
    """What a policer does with the packets of its match line, in words (``above 800kbit
    (burst 10k), they are dropped``); ``target`` is where the line sends packets (None on
    ingress, where packets within the rate are simply let in); ``shared``: how many filters
    the line's one policer meters together (:func:`shared_filters`)."""
    if shared > 1:
        return (
            f"one policer for the line's {shared} filters, so what they match shares its "
            f"rate: {police_phrase(p, target)}"
        )
    mtu = f", packets up to {format_size(p.mtu.bytes)}" if p.mtu is not None else ""
    above = f"above {format_rate(p.rate.bits_per_second)} (burst {format_size(p.burst.bytes)}{mtu})"
    match p.exceed:
        case "drop":
            verdict = "they are dropped"
        case "pass":
            where = "let in" if target is None else f"sent to {target}"
            verdict = f"they are {where} all the same (the policer only measures)"
        case "continue":
            verdict = (
                "they go on to the next filter, as if this line did not match (and where no "
                "filter takes them, where unmatched traffic goes)"
            )
        case "reclassify":
            verdict = (
                "they are classified again from the first filter; a packet still sent back "
                f"after {RECLASSIFY_LIMIT} restarts is dropped (the kernel's loop limit)"
            )
        case _:
            assert_never(p.exceed)
    return f"{above}, {verdict}"
