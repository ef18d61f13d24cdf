"""u32 keys (and flower's keys) back into the conditions of a match line.

A u32 filter holds 32-bit value/mask keys at word offsets (tc merges the keys of one word);
this module finds in them the fields tcdsl's conditions write (addresses, ports, protocol,
TOS/DSCP, the tcp-ack and tcp-flags idioms), and leaves what is left as raw ``u32 V/M at OFF``
conditions. Each condition also says in which order tcdsl writes its words (the word offsets
its keys go to), so that a line can be written with its conditions in the order that gives the
kernel the same keys in the same order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from tcdsl.lint import PORTLESS
from tcdsl.verify.readback import NEXTHDR, FlowerMatch, Key

FULL = 0xFFFFFFFF
TCP_FLAG_NAMES = ("fin", "syn", "rst", "psh", "ack", "urg", "ece", "cwr")
PROTO_NAMES = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}


@dataclass(frozen=True, slots=True)
class Cond:
    """One condition of a match line."""

    text: str
    """As the policy writes it: ``dport 80``."""
    words: tuple[int, ...]
    """The word offsets of the keys tcdsl writes for it, in order."""
    identity: tuple[object, ...]
    """What it means, the same for IPv4 and IPv6 where the condition is family-neutral (ports,
    protocol, TOS, tcp-ack, tcp-flags, all); family-specific ones (addresses, raw keys) carry
    their family."""


class Undecodable(Exception):
    """Keys no match line gives (offsets past the next header, negative offsets)."""


class _Words:
    """The keys as words: offset -> [value, mask], with the bits taken out as fields are found."""

    def __init__(self, keys: Sequence[Key]) -> None:
        self.words: dict[int, list[int]] = {}
        for value, mask, offset in keys:
            if offset >= NEXTHDR or offset < 0 or offset % 4:
                where = f"nexthdr+{offset - NEXTHDR}" if offset >= NEXTHDR else str(offset)
                raise Undecodable(f"a key at offset {where}")
            word = self.words.setdefault(offset, [0, 0])
            word[0] |= value & mask
            word[1] |= mask

    def peek(self, offset: int, shift: int, width: int) -> tuple[int, int]:
        value, mask = self.words.get(offset, [0, 0])
        field_mask = (1 << width) - 1
        return (value >> shift) & field_mask, (mask >> shift) & field_mask

    def take(self, offset: int, shift: int, width: int) -> None:
        word = self.words.get(offset)
        if word is not None:
            clear = ~(((1 << width) - 1) << shift) & FULL
            word[0] &= clear
            word[1] &= clear

    def left(self) -> list[tuple[int, int, int]]:
        return [(v, m, o) for o, (v, m) in sorted(self.words.items()) if m]


def _flags(bits: int) -> str:
    return ", ".join(name for n, name in enumerate(TCP_FLAG_NAMES) if bits & (1 << n))


def _prefix(words: _Words, offsets: Sequence[int]) -> int | None:
    """The prefix length the masks of ``offsets`` (one address) make, or None if they are
    not a prefix (or the address is not there at all)."""
    mask = 0
    for off in offsets:
        mask = (mask << 32) | words.peek(off, 0, 32)[1]
    bits = 32 * len(offsets)
    if mask == 0:
        return None
    length = bin(mask).count("1")
    if mask != ((1 << length) - 1) << (bits - length):
        return None
    return length


def _address(words: _Words, offsets: Sequence[int], v6: bool) -> str | None:
    length = _prefix(words, offsets)
    if length is None:
        return None
    value = 0
    for off in offsets:
        value = (value << 32) | words.peek(off, 0, 32)[0]
    for off in offsets:
        words.take(off, 0, 32)
    text = str(IPv6Address(value) if v6 else IPv4Address(value))
    return text if length == (128 if v6 else 32) else f"{text}/{length}"


def _port(value: int, mask: int) -> str:
    return str(value) if mask == 0xFFFF else f"{value}/{mask:#06x}"


def decode(keys: Sequence[Key], family: str) -> list[Cond]:
    """The conditions of a match line of ``family`` (``ipv4`` or ``ipv6``) whose filter has
    ``keys``; Undecodable when no line gives them."""
    if [(m, o) for _, m, o in keys] == [(0, 0)]:
        return [Cond("all", (0,), ("all",))]
    if not keys and family == "ipv6":  # what 'ip6 dst ::/0' makes (tc writes no key for it)
        return [Cond("dst ::/0", (), ("dst", family, "::/0"))]
    words = _Words(keys)
    v6 = family == "ipv6"
    out: list[Cond] = []
    # where the fields are: (word, shift, width)
    proto_at = (4, 8, 8) if v6 else (8, 16, 8)
    flags_at = (52, 16, 8) if v6 else (32, 16, 8)
    proto_word = proto_at[0]
    proto = words.peek(*proto_at)
    flags = words.peek(*flags_at)
    if v6:
        length = words.peek(4, 16, 16)
        ihl = (5, 0xF)
        frag = (0, 0x1FFF)
    else:
        length = words.peek(0, 0, 16)
        ihl = words.peek(0, 24, 4)
        frag = words.peek(4, 0, 13)
    tcp_ok = proto == (6, 0xFF) and ihl == (5, 0xF)
    if tcp_ok and length == (0, 0xFFC0) and flags == (0x10, 0xFF):
        out.append(Cond("tcp-ack", (4, 4, 52) if v6 else (8, 0, 0, 32), ("tcp-ack",)))
        words.take(*proto_at)
        words.take(*flags_at)
        if v6:
            words.take(4, 16, 16)
        else:
            words.take(0, 0, 16)
            words.take(0, 24, 4)
    elif (
        tcp_ok
        and (v6 or frag == (0, 0x1FFF))
        and flags[0] & ~flags[1] == 0
        and flags[0]
        and flags[1]
    ):
        set_bits, of = flags
        text = f"tcp-flags {_flags(set_bits)}"
        if of != set_bits:
            text += f" of {_flags(of)}"
        out.append(Cond(text, (4, 52) if v6 else (8, 0, 4, 32), ("tcp-flags", set_bits, of)))
        words.take(*proto_at)
        words.take(*flags_at)
        if not v6:
            words.take(0, 24, 4)
            words.take(4, 0, 13)
    tos = words.peek(0, 20, 8) if v6 else words.peek(0, 16, 8)
    if tos[1]:
        out.append(_tos(*tos, (0,)))
        words.take(0, 20 if v6 else 16, 8)
    proto = words.peek(*proto_at)
    if proto[1] == 0xFF:
        name = PROTO_NAMES.get(proto[0], str(proto[0]))
        out.append(Cond(f"proto {name}", (proto_word,), ("proto", proto[0])))
        words.take(*proto_at)
    for field, offsets in (
        ("src", (8, 12, 16, 20) if v6 else (12,)),
        ("dst", (24, 28, 32, 36) if v6 else (16,)),
    ):
        used = tuple(o for o in offsets if words.peek(o, 0, 32)[1])
        address = _address(words, offsets, v6)
        if address is not None:
            out.append(Cond(f"{field} {address}", used, (field, family, address)))
    port_word = 40 if v6 else 20
    portless = proto[1] == 0xFF and proto[0] in PORTLESS
    # on IPv6, tcdsl tests the next header next to a port: ports without one stay raw keys
    portless = portless or (v6 and not has_proto(out))
    for field, shift in () if portless else (("sport", 16), ("dport", 0)):
        value, mask = words.peek(port_word, shift, 16)
        if mask:
            out.append(Cond(f"{field} {_port(value, mask)}", (port_word,), (field, value, mask)))
            words.take(port_word, shift, 16)
    left = words.left()
    taken = {w for c in out for w in c.words} | {o for _, _, o in left}
    # a key that tests nothing (mask 0) is still a key of the filter: kept, as tc keeps it
    left += [(0, 0, o) for _, m, o in keys if m == 0 and o not in taken]
    for value, mask, offset in left:
        text = f"u32 {value:#x}/{mask:#x} at {offset}"
        out.append(Cond(text, (offset,), ("raw", family, value, mask, offset)))
    return out


def has_ports(conds: Sequence[Cond]) -> bool:
    """Whether a line of ``conds`` names ports (then tcdsl adds the next header on IPv6)."""
    return any(c.identity[0] in ("sport", "dport") for c in conds)


def has_proto(conds: Sequence[Cond]) -> bool:
    """Whether a line of ``conds`` fixes the protocol (``proto``, tcp-ack, tcp-flags)."""
    return any(c.identity[0] in ("proto", "tcp-ack", "tcp-flags") for c in conds)


def key_order(conds: Sequence[Cond], auto_proto: bool = False) -> list[int]:
    """The word offsets of the kernel's keys, in order, for a line of ``conds`` written in that
    order (``auto_proto``: the IPv6 next header tcdsl puts first on a port line)."""
    order: list[int] = [4] if auto_proto else []
    for cond in conds:
        for word in cond.words:
            if word not in order:
                order.append(word)
    return order


def ordered(conds: list[Cond], keys: Sequence[Key], family: str, limit: int = 6) -> list[Cond]:
    """``conds`` in an order whose keys come out in the order of ``keys`` (the first such
    order, trying the order found first); as found when none does."""
    want = list(dict.fromkeys(o for _, _, o in keys))
    if key_order(conds) == want or len(conds) > limit:
        return conds
    tcp = [c for c in conds if c.identity[0] in ("tcp-ack", "tcp-flags")]
    tries = [conds]
    if tcp and not any(c.identity[0] == "proto" for c in conds):
        # 'proto tcp' written before tcp-ack puts the protocol's key first
        tries.append([Cond("proto tcp", tcp[0].words[:1], ("proto", 6)), *conds])
    # a key that tests nothing, written before the condition that shares its word, puts the
    # word first: merged into that condition's key, it leaves no trace but the order
    if len(conds) < limit:
        tries += [
            [*t, Cond(f"u32 0x0/0x0 at {word}", (word,), ("raw", family, 0, 0, word))]
            for word in want
            for t in list(tries)
        ]
    for candidate in tries:
        for perm in itertools.permutations(candidate):
            if key_order(perm) == want:
                return list(perm)
    return conds


def _tos(value: int, mask: int, words: tuple[int, ...]) -> Cond:
    if mask == 0xFC and value & 3 == 0:
        return Cond(f"dscp {value >> 2}", words, ("tos", value, mask))
    if mask == 0xFF:
        return Cond(f"tos {value:#04x}", words, ("tos", value, mask))
    return Cond(f"tos {value:#04x}/{mask:#04x}", words, ("tos", value, mask))


def flower_conds(m: FlowerMatch, family: str) -> list[Cond] | str:
    """The conditions of a flower filter's match, or why there are none (a key the language
    has no word for)."""
    if m.other:
        return f"flower's '{m.other[0]}' has no word in the language"
    out: list[Cond] = []
    for field, net in (("src", m.src), ("dst", m.dst)):
        if net is not None:
            text = net.removesuffix("/128" if ":" in net else "/32")
            out.append(Cond(f"{field} {text}", (), (field, family, text)))
    if m.ip_proto is not None and not (m.ip_proto == 6 and m.tcp_flags is not None):
        name = PROTO_NAMES.get(m.ip_proto, str(m.ip_proto))
        out.append(Cond(f"proto {name}", (), ("proto", m.ip_proto)))
    for field, port in (("sport", m.sport), ("dport", m.dport)):
        if port is not None:
            text = str(port[0]) if port[0] == port[1] else f"{port[0]}-{port[1]}"
            out.append(Cond(f"{field} {text}", (), (field, *port)))
    if m.tos is not None:
        out.append(_tos(*m.tos, ()))
    if m.tcp_flags is not None:
        set_bits, of = m.tcp_flags
        if not set_bits or set_bits & ~of:
            return f"flower's tcp_flags {set_bits:#x}/{of:#x} have no word in the language"
        text = f"tcp-flags {_flags(set_bits)}" + (f" of {_flags(of)}" if of != set_bits else "")
        out.append(Cond(text, (), ("tcp-flags", set_bits, of)))
    return out or [Cond("all", (), ("all",))]
