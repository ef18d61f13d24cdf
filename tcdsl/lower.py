"""Lower match conditions to u32 keys and iptables words; split match lines into alternatives.

A match line ANDs its conditions and ORs the values listed in one condition, so it stands for
the cartesian product of its values. Port ranges become the fewest prefix-style value/mask pairs.
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Iterator
from ipaddress import IPv4Network

from tcdsl import ir
from tcdsl.diagnostics import Span


def range_to_masks(lo: int, hi: int, width: int = 16) -> list[tuple[int, int]]:
    """Cover ``lo..hi`` with the fewest aligned power-of-two blocks, as (value, mask) pairs."""
    full = (1 << width) - 1
    out: list[tuple[int, int]] = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << width
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, full ^ (size - 1)))
        lo += size
    return out


def _split(cond: ir.Cond) -> list[ir.Cond]:
    """One single-valued condition per value listed in ``cond``."""
    match cond:
        case ir.AddrCond():
            return [ir.AddrCond(cond.field, (n,), n[1]) for n in cond.networks]
        case ir.PortCond():
            return [ir.PortCond(cond.field, (p,), p.span) for p in cond.ports]
        case ir.ProtoCond():
            return [ir.ProtoCond((p,), p[1]) for p in cond.protocols]
        case _:
            return [cond]


def alternatives(match: ir.Match) -> Iterator[tuple[ir.Cond, ...]]:
    """Yield each AND-combination of single values that ``match`` stands for, in order."""
    if not match.conds:
        yield ()
        return
    yield from itertools.product(*(_split(c) for c in match.conds))


FAMILY_PROTOCOLS: dict[int, ir.Family] = {1: "ipv4", 58: "ipv6"}
"""Protocols that exist in one family only: ICMP (1) and ICMPv6 (58)."""


def match_families(match: ir.Match, tree: tuple[ir.Family, ...]) -> tuple[ir.Family, ...]:
    """The families a match line applies to before its values narrow it: its own ``family``,
    else the tree's; a raw ``u8|u16|u32 ... at`` line reads offsets of the IPv4 header, so
    without ``family`` it applies to IPv4 only."""
    if match.family is not None:
        return match.family.families
    if any(isinstance(c, ir.RawCond) for c in match.conds):
        return tuple(f for f in tree if f == "ipv4")
    return tree


def implied_families(conds: tuple[ir.Cond, ...]) -> tuple[ir.Family, ...]:
    """The families one alternative can match at all: an address names its own; ICMP and
    ICMPv6 exist in one family each; anything else exists in both."""
    families = ir.FAMILIES
    for cond in conds:
        if isinstance(cond, ir.AddrCond):
            only = ir.family_of(cond.networks[0][0])
        elif isinstance(cond, ir.ProtoCond) and cond.protocols[0][0] in FAMILY_PROTOCOLS:
            only = FAMILY_PROTOCOLS[cond.protocols[0][0]]
        else:
            continue
        families = (only,) if only in families else ()
    return families


@ir.per_node
def family_alternatives(
    match: ir.Match, tree: tuple[ir.Family, ...]
) -> tuple[tuple[ir.Family, tuple[ir.Cond, ...]], ...]:
    """(family, alternative) for every alternative of ``match`` and every family it applies
    to (``tree``: the families of the tree the line is in), in order."""
    conds = match.conds
    if len(conds) == 1 and isinstance(conds[0], ir.AddrCond) and match.family is None:
        return address_alternatives(conds[0], tree)
    wanted = match_families(match, tree)
    return tuple(
        (family, alt)
        for alt in alternatives(match)
        for family in implied_families(alt)
        if family in wanted
    )


def address_alternatives(
    cond: ir.AddrCond, tree: tuple[ir.Family, ...]
) -> tuple[tuple[ir.Family, tuple[ir.Cond, ...]], ...]:
    """:func:`family_alternatives` of a line of one address condition (every subscriber's),
    without the general case's products: each address alone, in its family."""
    field = cond.field
    return tuple(
        (family, (ir.AddrCond(field, (n,), n[1]),))
        for n in cond.networks
        if (family := ir.family_of(n[0])) in tree
    )


GUARD_PROTOCOLS = (6, 17)
"""What a port match without ``proto`` reads on IPv6 (and under flower): TCP and UDP."""


def _needs_guard(family: ir.Family, conds: tuple[ir.Cond, ...], classifier: ir.Classifier) -> bool:
    """Whether :func:`guarded` adds protocols to ``conds``."""
    if family != "ipv6" and classifier != "flower":
        return False
    has_port = any(isinstance(c, ir.PortCond) for c in conds)
    return has_port and not any(
        isinstance(c, ir.ProtoCond | ir.TcpAckCond | ir.TcpFlagsCond) for c in conds
    )


def guarded(
    family: ir.Family, conds: tuple[ir.Cond, ...], classifier: ir.Classifier
) -> Iterator[tuple[ir.Cond, ...]]:
    """``conds`` with the protocol a port needs, where the filter must name it.

    u32 reads an IPv6 packet's ports 40 bytes in, whatever the next header is: without a
    protocol key, bytes of an extension header or of ICMPv6 would be read as ports. flower
    (either family) matches ports only under ``ip_proto``. A port match without ``proto``
    becomes one alternative for TCP and one for UDP; IPv4 u32 filters keep reading the
    ports of any protocol, as tc's ``ip dport`` does."""
    if not _needs_guard(family, conds, classifier):
        yield conds
        return
    span = next(c.span for c in conds if isinstance(c, ir.PortCond))
    for number in GUARD_PROTOCOLS:
        yield (ir.ProtoCond(((number, span),), span), *conds)


@ir.per_node
def filter_alternatives(
    match: ir.Match, tree: tuple[ir.Family, ...], classifier: ir.Classifier = "u32"
) -> tuple[tuple[ir.Family, tuple[ir.Cond, ...]], ...]:
    """(family, alternative) for each filter a match line becomes (before u32 splits port
    ranges), with the protocol guards of :func:`guarded`."""
    pairs = family_alternatives(match, tree)
    if not any(_needs_guard(family, alt, classifier) for family, alt in pairs):
        return pairs  # the same pairs (most lines): kept once
    return tuple(
        (family, conds) for family, alt in pairs for conds in guarded(family, alt, classifier)
    )


def _hex(value: int, width: int) -> str:
    return f"0x{value:0{width // 4}x}"


TCP_ACK_KEYS: tuple[ir.U32Key, ...] = (
    ir.U32Key(("ip", "protocol", "6", "0xff")),
    ir.U32Key(("u8", "0x05", "0x0f", "at", "0")),
    ir.U32Key(("u16", "0x0000", "0xffc0", "at", "2")),
    ir.U32Key(("u8", "0x10", "0xff", "at", "33")),
)


def tcp_flags_keys(cond: ir.TcpFlagsCond) -> tuple[ir.U32Key, ...]:
    """u32 keys for TCP flags: TCP, a 20-byte IP header (u32 reads the TCP header at a fixed
    offset, as the tcp-ack idiom does), the first fragment, and the flags byte (33)."""
    return (
        ir.U32Key(("ip", "protocol", "6", "0xff")),
        ir.U32Key(("u8", "0x05", "0x0f", "at", "0")),
        ir.U32Key(("u16", "0x0000", "0x1fff", "at", "6")),
        ir.U32Key(("u8", _hex(cond.value, 8), _hex(cond.mask, 8), "at", "33")),
    )


TCP_ACK_KEYS_6: tuple[ir.U32Key, ...] = (
    ir.U32Key(("ip6", "protocol", "6", "0xff")),
    ir.U32Key(("u16", "0x0000", "0xffc0", "at", "4")),
    ir.U32Key(("u8", "0x10", "0xff", "at", "53")),
)
"""The TCP-ACK idiom on IPv6: TCP right after the fixed header, a payload under 64 bytes,
only ACK set (byte 13 of the TCP header, 40 bytes in)."""


def tcp_flags_keys_6(cond: ir.TcpFlagsCond) -> tuple[ir.U32Key, ...]:
    """u32 keys for TCP flags on IPv6: TCP right after the fixed header (an extension header,
    a fragment's included, makes the next header something else), and the flags byte (53)."""
    return (
        ir.U32Key(("ip6", "protocol", "6", "0xff")),
        ir.U32Key(("u8", _hex(cond.value, 8), _hex(cond.mask, 8), "at", "53")),
    )


def address_text(net: ir.Network) -> str:
    """An address as tc and iptables take it: a host without its ``/32`` or ``/128``."""
    addr = net.network_address
    length = net.prefixlen
    # ``str`` of an ipaddress object costs 5-15 us (IPv6 most); the C formatters spell the
    # same text (RFC 5952 for IPv6), but for IPv6 addresses holding IPv4 ones
    # (``::ffff:1.2.3.4``, which ipaddress writes in hex) and scoped ones: those keep ``str``.
    if isinstance(net, IPv4Network):
        text = socket.inet_ntoa(addr.packed)
        return text if length == 32 else f"{text}/{length}"
    text = socket.inet_ntop(socket.AF_INET6, addr.packed)
    if "." in text or addr.scope_id is not None:  # type: ignore[union-attr]
        text = str(addr)
    return text if length == 128 else f"{text}/{length}"


@ir.per_node
def u32_keys(
    conds: tuple[ir.Cond, ...], family: ir.Family = "ipv4"
) -> tuple[tuple[ir.U32Key, ...], ...]:
    """The u32 key sets (one filter each) for one alternative of a match line, in tc's
    ``ip`` or ``ip6`` words by ``family``: one set per combination of the conditions' key
    sets (a port range is several), each key once, in order."""
    ip = "ip" if family == "ipv4" else "ip6"
    choices = [keys for cond in conds if (keys := _cond_keys(cond, ip, family))]
    if len(choices) == 1:
        return choices[0]  # one condition (most lines): its key sets repeat no key
    if not choices:
        return ((ALL_KEY,),)
    return tuple(_key_union(combo) for combo in itertools.product(*choices))


ALL_KEY = ir.U32Key(("u32", "0", "0", "at", "0"))
"""The key every packet matches."""


def _key_union(groups: tuple[tuple[ir.U32Key, ...], ...]) -> tuple[ir.U32Key, ...]:
    """The keys of ``groups`` in order, each once."""
    keys: dict[tuple[str, ...], ir.U32Key] = {}
    for group in groups:
        for key in group:
            keys.setdefault(key.words, key)
    return tuple(keys.values())


_PROTOCOL_KEYS: dict[tuple[str, int], tuple[ir.U32Key, ...]] = {}
"""``ip[6] protocol N 0xff`` keys by (ip, N): one object each, shared by every filter."""


def _cond_keys(
    cond: ir.Cond, ip: str, family: ir.Family
) -> tuple[tuple[ir.U32Key, ...], ...] | None:
    """The key sets one (single-valued) condition may take, one of which a filter has."""
    match cond:
        case ir.AddrCond():
            return ((ir.U32Key((ip, cond.field, address_text(cond.networks[0][0]))),),)
        case ir.PortCond():
            port = cond.ports[0]
            if port.mask is not None:
                pairs = [(port.lo, port.mask)]
            else:
                pairs = range_to_masks(port.lo, port.hi)
            return tuple((ir.U32Key((ip, cond.field, str(v), _hex(m, 16))),) for v, m in pairs)
        case ir.ProtoCond():
            number = cond.protocols[0][0]
            found = _PROTOCOL_KEYS.get((ip, number))
            if found is None:
                found = _PROTOCOL_KEYS[ip, number] = (
                    ir.U32Key((ip, "protocol", str(number), "0xff")),
                )
            return (found,)
        case ir.TosCond():
            field = "tos" if family == "ipv4" else "priority"
            return ((ir.U32Key((ip, field, _hex(cond.value, 8), _hex(cond.mask, 8))),),)
        case ir.TcpAckCond():
            return (TCP_ACK_KEYS if family == "ipv4" else TCP_ACK_KEYS_6,)
        case ir.TcpFlagsCond():
            return (tcp_flags_keys(cond) if family == "ipv4" else tcp_flags_keys_6(cond),)
        case ir.RawCond():
            key = (f"u{cond.bits}", _hex(cond.value, cond.bits), _hex(cond.mask, cond.bits))
            return ((ir.U32Key((*key, "at", str(cond.offset))),),)
        case ir.AllCond():
            return ((ALL_KEY,),)
    return None


PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 132: "sctp", 47: "gre", 50: "esp", 51: "ah"}


PROTO_NAMES_6 = {**{n: w for n, w in PROTO_NAMES.items() if n != 1}, 58: "icmpv6"}
"""Protocol names as ip6tables and nft take them for IPv6 (ICMPv6 is ``icmpv6``)."""


def iptables_words(conds: tuple[ir.Cond, ...], family: ir.Family = "ipv4") -> tuple[str, ...]:
    """The iptables (ip6tables for ``family`` ipv6) match words for one alternative (checks
    reject what iptables can't say). ``-m tos``/``-m dscp`` read the traffic class on IPv6."""
    names = PROTO_NAMES if family == "ipv4" else PROTO_NAMES_6
    words: list[str] = []
    for cond in conds:
        match cond:
            case ir.ProtoCond():
                number = cond.protocols[0][0]
                words += ["-p", names.get(number, str(number))]
    if not words and any(isinstance(c, ir.TcpFlagsCond) for c in conds):
        words += ["-p", "tcp"]
    for cond in conds:
        match cond:
            case ir.AddrCond():
                text = address_text(cond.networks[0][0])
                words += ["-s" if cond.field == "src" else "-d", text]
            case ir.PortCond():
                port = cond.ports[0]
                text = str(port.lo) if port.lo == port.hi else f"{port.lo}:{port.hi}"
                words += [f"--{cond.field}", text]
            case ir.TosCond():
                if cond.dscp is not None:
                    words += ["-m", "dscp", "--dscp", str(cond.dscp)]
                else:
                    words += ["-m", "tos", "--tos", f"{_hex(cond.value, 8)}/{_hex(cond.mask, 8)}"]
            case ir.TcpFlagsCond():
                examined = ",".join(cond.names(cond.mask)).upper()
                comp = ",".join(cond.names(cond.value)).upper() or "NONE"
                words += ["--tcp-flags", examined, comp]
            case _:
                pass
    return tuple(words)


_FIELD_AT = {"src": 12, "dst": 16}
_FIELD_AT_6 = {"src": 8, "dst": 24}
_IP6_AT = {"sport": (40, 16), "dport": (40, 0), "protocol": (4, 8), "priority": (0, 20)}
"""ip6 fields but addresses: (offset of the 32-bit word, shift in it), as tc's f_u32.c packs
them (the next header is byte 6, the traffic class bits 20-27 of the first word)."""


def _network(text: str) -> tuple[int, int]:
    """``a.b.c.d[/len]`` (as :func:`u32_keys` writes it) as (address, netmask) integers; a
    hand parse, since ``ipaddress`` costs tens of microseconds per call on large policies."""
    addr, _, length = text.partition("/")
    bits = int(length) if length else 32
    mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
    return int.from_bytes(socket.inet_aton(addr), "big") & mask, mask


_WORDS6 = struct.Struct(">4I")


def _network6(text: str, at: int) -> tuple[tuple[int, int, int], ...]:
    """An IPv6 address or prefix as the 32-bit words tc packs for it (only words the prefix
    reaches: ``/64`` is two)."""
    addr, _, length = text.partition("/")
    bits = int(length) if length else 128
    packed = socket.inet_pton(socket.AF_INET6, addr)  # ipaddress: 10x
    words = []
    for i, value in enumerate(_WORDS6.unpack(packed)):
        left = bits - 32 * i  # bits of the prefix in this word and after it
        if left <= 0:
            break
        mask = 0xFFFFFFFF if left >= 32 else (0xFFFFFFFF << (32 - left)) & 0xFFFFFFFF
        words.append((at + 4 * i, value & mask, mask))
    return tuple(words)


def pack_words(key: ir.U32Key) -> tuple[tuple[int, int, int], ...]:
    """The 32-bit words a u32 key tests, as tc packs them: (offset, value, mask) each; an
    IPv6 address takes up to four."""
    w = key.words
    if w[0] == "ip6":
        field = w[1]
        if field in _FIELD_AT_6:
            return _network6(w[2], _FIELD_AT_6[field])
        offset, shift = _IP6_AT[field]
        return ((offset, int(w[2], 0) << shift, int(w[3], 0) << shift),)
    return (pack(key),)


def address_bytes(key: ir.U32Key) -> tuple[int, bytes] | None:
    """For an address key, where its address starts (from the IP header) and the bytes its
    prefix fixes whole (a ``/56`` fixes 7): what :func:`pack_words` says under masks of
    0xff, without making the words; None for other keys."""
    w = key.words
    if w[0] == "ip":
        at, family, width = _FIELD_AT.get(w[1]), socket.AF_INET, 32
    elif w[0] == "ip6":
        at, family, width = _FIELD_AT_6.get(w[1]), socket.AF_INET6, 128
    else:
        return None
    if at is None:
        return None
    addr, _, length = w[2].partition("/")
    bits = int(length) if length else width
    return at, socket.inet_pton(family, addr)[: bits // 8]


def pack(key: ir.U32Key) -> tuple[int, int, int]:
    """The 32-bit word a u32 key of one word (every ``ip`` key, raw keys, ip6 keys but
    addresses) tests, as tc packs it: (offset, value, mask)."""
    w = key.words
    if w[0] == "ip6":
        (word,) = pack_words(key)
        return word
    if w[0] == "ip":
        field = w[1]
        if field in _FIELD_AT:
            return (_FIELD_AT[field], *_network(w[2]))
        value, mask = int(w[2], 0), int(w[3], 0)
        if field == "sport":
            return 20, value << 16, mask << 16
        if field == "dport":
            return 20, value, mask
        shift = {"protocol": 16, "tos": 16}[field]  # protocol is byte 9, tos byte 1
        return {"protocol": 8, "tos": 0}[field], value << shift, mask << shift
    bits = int(w[0][1:])
    value, mask, offset = int(w[1], 0), int(w[2], 0), int(w[4])
    shift = (4 - offset % 4 - bits // 8) * 8
    return offset - offset % 4, value << shift, mask << shift


def contradicts(keys: tuple[ir.U32Key, ...]) -> bool:
    """True if two keys demand different values of the same bits (the filter can never match;
    tc refuses it)."""
    if len(keys) < 2:
        return False  # the words of one key are at different offsets
    seen: dict[int, tuple[int, int]] = {}
    for key in keys:
        for offset, value, mask in pack_words(key):
            if offset in seen:
                v, m = seen[offset]
                if (v ^ value) & m & mask:
                    return True
                seen[offset] = (v | value, m | mask)
            else:
                seen[offset] = (value & mask, mask)
    return False


def nft_words(conds: tuple[ir.Cond, ...], family: ir.Family = "ipv4") -> tuple[str, ...]:
    """The nft match words for one alternative, the same packets as :func:`iptables_words`.

    In an ``inet`` table the rule names its family (``meta nfproto ipv4|ipv6``). A port needs
    a protocol (the checks see to it), so ``th`` (the transport header) is always defined;
    ``meta l4proto`` is the protocol found past IPv6 extension headers, as ip6tables' ``-p``.
    """
    v4 = family == "ipv4"
    ip = "ip" if v4 else "ip6"
    names = PROTO_NAMES if v4 else PROTO_NAMES_6
    words: list[str] = ["meta", "nfproto", family]
    for cond in conds:
        match cond:
            case ir.ProtoCond():
                number = cond.protocols[0][0]
                words += ["meta", "l4proto", names.get(number, str(number))]
    if len(words) == 3 and any(isinstance(c, ir.TcpFlagsCond) for c in conds):
        words += ["meta", "l4proto", "tcp"]
    for cond in conds:
        match cond:
            case ir.AddrCond():
                text = address_text(cond.networks[0][0])
                words += [ip, "saddr" if cond.field == "src" else "daddr", text]
            case ir.PortCond():
                port = cond.ports[0]
                text = str(port.lo) if port.lo == port.hi else f"{port.lo}-{port.hi}"
                words += ["th", cond.field, text]
            case ir.TosCond():
                if cond.dscp is not None:
                    words += [ip, "dscp", str(cond.dscp)]
                else:
                    # iptables' "--tos V/M" is (tos & M) == V: the second byte of an IPv4
                    # header. An IPv6 traffic class is bits 4..11: read 16 bits (nft 1.0.6
                    # compiles an unaligned "@nh,4,8" into a comparison that never holds).
                    if v4:
                        words += ["@nh,8,8", "&", _hex(cond.mask, 8), "==", _hex(cond.value, 8)]
                    else:
                        mask, value = _hex(cond.mask << 4, 16), _hex(cond.value << 4, 16)
                        words += ["@nh,0,16", "&", mask, "==", value]
            case ir.TcpFlagsCond():
                examined = "|".join(cond.names(cond.mask))
                words += ["tcp", "flags", "&", f"({examined})", "==", _nft_flags(cond)]
            case _:
                pass
    return tuple(words)


def _nft_flags(cond: ir.TcpFlagsCond) -> str:
    names = cond.names(cond.value)
    if not names:
        return "0x0"
    return names[0] if len(names) == 1 else f"({'|'.join(names)})"


def flower_port(port: ir.PortValue) -> tuple[int, int] | None:
    """A port spec as flower takes it, a port or a range (lo, hi); None for a value/mask pair
    whose ports are not one range (flower has no port masks)."""
    if port.mask is not None and ((~port.mask & 0xFFFF) + 1) & (~port.mask & 0xFFFF):
        return None
    return port.lo, port.hi


def flower_splits(conds: tuple[ir.Cond, ...]) -> Iterator[tuple[ir.Cond, ...]]:
    """``conds`` as flower filters can say them: tc refuses a flower port range that starts at
    0 (``dst_port 0-1000``), so one that is not a block of the form 0/MASK becomes the block
    below its first power of two and the rest (``0-511`` and ``512-1000``)."""
    for i, cond in enumerate(conds):
        if not isinstance(cond, ir.PortCond):
            continue
        port = cond.ports[0]
        size = port.hi + 1
        if port.lo != 0 or port.hi == 0 or size & (size - 1) == 0:
            continue
        block = 1 << (size.bit_length() - 1)
        low = ir.PortValue(0, block - 1, 0xFFFF ^ (block - 1), port.span)
        high = ir.PortValue(block, port.hi, None, port.span)
        for part in (low, high):
            yield from flower_splits(
                (*conds[:i], ir.PortCond(cond.field, (part,), cond.span), *conds[i + 1 :])
            )
        return
    yield conds


def flower_problem(conds: tuple[ir.Cond, ...]) -> ir.Cond | None:
    """The first condition flower cannot say, or None: the TCP-ACK idiom (flower has no
    packet length), raw offsets, port masks that are not a range, and a protocol other than
    TCP, UDP or SCTP on a line with ports (the ProtoCond)."""
    ported = any(isinstance(c, ir.PortCond) for c in conds)
    for cond in conds:
        match cond:
            case ir.TcpAckCond() | ir.RawCond():
                return cond
            case ir.PortCond() if flower_port(cond.ports[0]) is None:
                return cond
            case ir.ProtoCond() if ported and cond.protocols[0][0] not in FLOWER_PORTED:
                return cond
            case _:
                pass
    return None


FLOWER_PORTED = frozenset({6, 17, 132})
"""The protocols flower reads ports of: TCP, UDP, SCTP (tc: ``Illegal "dst_port"`` else)."""


def flower_filter(
    conds: tuple[ir.Cond, ...],
    family: ir.Family,
    parent: ir.Handle,
    pref: int,
    flowid: ir.Handle,
    span: Span,
    police: ir.Police | None,
) -> ir.FlowerFilter | None:
    """The flower filter for one alternative (:func:`flower_problem` is None for it), or None
    when its conditions contradict each other (TCP flags on a UDP match)."""
    fields: dict[str, object] = {}
    for cond in conds:
        match cond:
            case ir.AddrCond():
                fields[cond.field] = cond.networks[0][0]
            case ir.PortCond():
                # Every port is no port key at all (tc would write a mask of 0, which the
                # kernel keeps as nothing).
                port = flower_port(cond.ports[0])
                if port != (0, 0xFFFF):
                    fields[cond.field] = port
            case ir.ProtoCond():
                fields["ip_proto"] = cond.protocols[0][0]
            case ir.TosCond():
                fields["tos"] = (cond.value, cond.mask)
            case ir.TcpFlagsCond():
                fields["tcp_flags"] = (cond.value, cond.mask)
            case _:
                pass
    if "tcp_flags" in fields and fields.setdefault("ip_proto", 6) != 6:
        return None
    return ir.FlowerFilter(parent, pref, family, flowid, span, police=police, **fields)  # type: ignore[arg-type]
