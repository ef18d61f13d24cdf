"""Lower match conditions to u32 keys and iptables words; split match lines into alternatives.

A match line ANDs its conditions and ORs the values listed in one condition, so it stands for
the cartesian product of its values. Port ranges become the fewest prefix-style value/mask pairs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tcdsl import ir


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


def u32_keys(conds: tuple[ir.Cond, ...]) -> Iterator[tuple[ir.U32Key, ...]]:
    """Yield the u32 key sets (one filter each) for one alternative of a match line."""
    choices: list[list[tuple[ir.U32Key, ...]]] = []
    for cond in conds:
        match cond:
            case ir.AddrCond():
                net = cond.networks[0][0]
                text = str(net.network_address) if net.prefixlen == 32 else str(net)
                choices.append([(ir.U32Key(("ip", cond.field, text)),)])
            case ir.PortCond():
                port = cond.ports[0]
                if port.mask is not None:
                    pairs = [(port.lo, port.mask)]
                else:
                    pairs = range_to_masks(port.lo, port.hi)
                choices.append(
                    [(ir.U32Key(("ip", cond.field, str(v), _hex(m, 16))),) for v, m in pairs]
                )
            case ir.ProtoCond():
                number = cond.protocols[0][0]
                choices.append([(ir.U32Key(("ip", "protocol", str(number), "0xff")),)])
            case ir.TosCond():
                choices.append(
                    [(ir.U32Key(("ip", "tos", _hex(cond.value, 8), _hex(cond.mask, 8))),)]
                )
            case ir.TcpAckCond():
                choices.append([TCP_ACK_KEYS])
            case ir.TcpFlagsCond():
                choices.append([tcp_flags_keys(cond)])
            case ir.RawCond():
                key = (f"u{cond.bits}", _hex(cond.value, cond.bits), _hex(cond.mask, cond.bits))
                choices.append([(ir.U32Key((*key, "at", str(cond.offset))),)])
            case ir.AllCond():
                choices.append([(ir.U32Key(("u32", "0", "0", "at", "0")),)])
    for combo in itertools.product(*choices):
        keys: list[ir.U32Key] = []
        for group in combo:
            for u32key in group:
                if u32key not in keys:
                    keys.append(u32key)
        if not keys:
            keys.append(ir.U32Key(("u32", "0", "0", "at", "0")))
        yield tuple(keys)


PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 132: "sctp", 47: "gre", 50: "esp", 51: "ah"}


def iptables_words(conds: tuple[ir.Cond, ...]) -> tuple[str, ...]:
    """The iptables match words for one alternative (checks reject what iptables can't say)."""
    words: list[str] = []
    for cond in conds:
        match cond:
            case ir.ProtoCond():
                number = cond.protocols[0][0]
                words += ["-p", PROTO_NAMES.get(number, str(number))]
    if not words and any(isinstance(c, ir.TcpFlagsCond) for c in conds):
        words += ["-p", "tcp"]
    for cond in conds:
        match cond:
            case ir.AddrCond():
                net = cond.networks[0][0]
                text = str(net.network_address) if net.prefixlen == 32 else str(net)
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


def _network(text: str) -> tuple[int, int]:
    """``a.b.c.d[/len]`` (as :func:`u32_keys` writes it) as (address, netmask) integers; a
    hand parse, since ``ipaddress`` costs tens of microseconds per call on large policies."""
    addr, _, length = text.partition("/")
    a, b, c, d = (int(x) for x in addr.split("."))
    bits = int(length) if length else 32
    mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
    return ((a << 24) | (b << 16) | (c << 8) | d) & mask, mask


def pack(key: ir.U32Key) -> tuple[int, int, int]:
    """The 32-bit word a u32 key tests, as tc packs it: (offset, value, mask)."""
    w = key.words
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
    seen: dict[int, tuple[int, int]] = {}
    for key in keys:
        offset, value, mask = pack(key)
        if offset in seen:
            v, m = seen[offset]
            if (v ^ value) & m & mask:
                return True
            seen[offset] = (v | value, m | mask)
        else:
            seen[offset] = (value & mask, mask)
    return False


def nft_words(conds: tuple[ir.Cond, ...]) -> tuple[str, ...]:
    """The nft match words for one alternative, the same packets as :func:`iptables_words`.

    iptables rules see IPv4 only; in an ``inet`` table the rule says so (``meta nfproto
    ipv4``). A port needs a protocol (the checks see to it), so ``th`` (the transport header)
    is always defined.
    """
    words: list[str] = ["meta", "nfproto", "ipv4"]
    for cond in conds:
        match cond:
            case ir.ProtoCond():
                number = cond.protocols[0][0]
                words += ["meta", "l4proto", PROTO_NAMES.get(number, str(number))]
    if len(words) == 3 and any(isinstance(c, ir.TcpFlagsCond) for c in conds):
        words += ["meta", "l4proto", "tcp"]
    for cond in conds:
        match cond:
            case ir.AddrCond():
                net = cond.networks[0][0]
                text = str(net.network_address) if net.prefixlen == 32 else str(net)
                words += ["ip", "saddr" if cond.field == "src" else "daddr", text]
            case ir.PortCond():
                port = cond.ports[0]
                text = str(port.lo) if port.lo == port.hi else f"{port.lo}-{port.hi}"
                words += ["th", cond.field, text]
            case ir.TosCond():
                if cond.dscp is not None:
                    words += ["ip", "dscp", str(cond.dscp)]
                else:
                    # iptables' "--tos V/M" is (tos & M) == V: the second byte of the header.
                    words += ["@nh,8,8", "&", _hex(cond.mask, 8), "==", _hex(cond.value, 8)]
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
