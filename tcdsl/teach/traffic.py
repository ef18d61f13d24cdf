"""Packets and flows as users describe them to ``classify``, ``simulate`` and ``measure``.

A packet spec is a few words, in any order (``tcp src 10.3.34.11 dport 5001 tos 0x10``,
``ipv6 tcp src 2001:db8::1 dport 443``):

- a family: ``ipv4`` or ``ipv6``; an address implies its own, and so do ``icmp`` (IPv4) and
  ``icmpv6`` and the extension headers (IPv6); a spec that implies neither is IPv4;
- a protocol: ``tcp``, ``udp``, ``icmp``, ``icmpv6`` or any name of the language, or ``proto N``;
- ``src A``, ``dst A`` (IPv4 or IPv6 addresses), ``sport N``, ``dport N``;
- ``tos V`` (0-255, decimal or 0x..; on IPv6 the traffic class) or ``dscp X`` (a number or a
  name such as ``ef``);
- ``size B`` (bytes on the wire, as tc counts them: the IP packet plus the 14-byte Ethernet
  header; ``1500b``, ``1k`` and bare numbers as in tc), or ``iplen B``, the IP packet's own
  length (IPv4's total length, IPv6's 40-byte header plus its payload length; what tcpdump and
  ``ip -s`` report): ``iplen 52`` is ``size 66``;
- ``ack``: a TCP packet with only ACK set and no payload (what the ``tcp-ack`` match finds);
- ``flags F,...``: a TCP packet with exactly these flags set (``flags syn``, ``flags syn,ack``;
  a TCP packet without it has ACK and PSH set);
- IPv6 extension headers, in the order written, between the fixed header and the protocol's:
  ``hbh`` (hop-by-hop options), ``rthdr`` (a routing header), ``dstopt`` (destination options),
  ``auth`` (an IPsec authentication header), ``frag`` (a fragment header: the first fragment,
  which holds the protocol's header) or ``laterfrag`` (a later fragment: payload only). On IPv4
  ``frag`` and ``laterfrag`` set the header's fragment fields.

A flow spec is ``[NAME:] PACKET-WORDS [rate R] [start T] [stop T]``: packets like that one,
sent at rate R (at most ``MAX_RATE``, 1tbit; greedy when no rate is given: as fast as the
policy lets it) from time ``start`` (default 0s) to ``stop`` (default: the end of the run).
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tcdsl.frontend.syntax import DSCP_NAMES, PROTOCOLS
from tcdsl.ir import TCP_FLAGS, Family
from tcdsl.units import BYTE_RATE_UNITS, format_rate, parse_rate, parse_size, parse_time
from tcdsl.words import protocol_name

ETHERNET_HEADER = 14
DEFAULT_SIZE = 1514
"""A full-size Ethernet frame, the default packet size."""
MAX_RATE = 10**12
"""The highest rate a flow (or ``simulate --link``) may have, 1tbit: a hundred times the fastest
common Ethernet port, and already more packets a second than the simulator runs in minutes."""


class SpecError(ValueError):
    """A packet or flow spec that does not parse; the message says what is wrong."""


DEFAULT_PROTO = 17
"""A packet spec without a protocol is UDP."""

V4_SRC = int(ipaddress.IPv4Address("10.0.0.1"))
V4_DST = int(ipaddress.IPv4Address("10.0.0.2"))
V6_SRC = int(ipaddress.IPv6Address("2001:db8::1"))
"""The addresses of a packet whose spec gives none (IPv6: the documentation prefix)."""
V6_DST = int(ipaddress.IPv6Address("2001:db8::2"))

HOP_BY_HOP, ROUTING, FRAGMENT, AUTH, DEST_OPTS = 0, 43, 44, 51, 60
LATER_FRAGMENT = -44
"""In ``Packet.ext``: a fragment header of a later fragment (the protocol's header is in the
first)."""
EXTENSION_WORDS: dict[str, int] = {
    "hbh": HOP_BY_HOP,
    "rthdr": ROUTING,
    "dstopt": DEST_OPTS,
    "auth": AUTH,
    "frag": FRAGMENT,
    "laterfrag": LATER_FRAGMENT,
}
"""The spec's words for IPv6 extension headers (``frag`` and ``laterfrag`` on IPv4 too)."""
EXTENSION_NAMES = {v: k for k, v in EXTENSION_WORDS.items()}
FRAGMENT_OFFSET = 185
"""A later fragment's offset, in 8-byte units: right after a first fragment of 1480 bytes."""


def extension_bytes(kind: int, next_header: int) -> bytes:
    """One IPv6 extension header as sent, ``next_header`` the header after it: 8 bytes
    (options are one PadN; the routing header is of the experimental type 253 with no segment
    left, which every node skips), 24 for AH (an SPI of 0x100 and a 12-byte ICV)."""
    if kind in (HOP_BY_HOP, DEST_OPTS):
        return bytes([next_header, 0, 1, 4, 0, 0, 0, 0])
    if kind == ROUTING:
        return bytes([next_header, 0, 253, 0, 0, 0, 0, 0])
    if kind == AUTH:
        return (
            bytes([next_header, 4, 0, 0])
            + (0x100).to_bytes(4, "big")
            + (1).to_bytes(4, "big")
            + bytes(12)
        )
    offset, more = (0, 1) if kind == FRAGMENT else (FRAGMENT_OFFSET, 0)
    return (
        bytes([next_header, 0]) + (offset << 3 | more).to_bytes(2, "big") + (1).to_bytes(4, "big")
    )


@dataclass(frozen=True, slots=True)
class Packet:
    """One IPv4 or IPv6 packet, as far as classification looks at it."""

    proto: int = DEFAULT_PROTO
    src: int = V4_SRC
    """The source address as an integer (of ``family``: give both addresses for IPv6)."""
    dst: int = V4_DST
    sport: int = 40000
    dport: int = 9
    tos: int = 0
    """The TOS byte (IPv4) or traffic class (IPv6): DSCP << 2 | ECN."""
    size: int = DEFAULT_SIZE
    """Bytes on the wire (IP packet + Ethernet header), as qdiscs count them."""
    ack_only: bool = False
    """TCP with only ACK set and a 20-byte header, no payload (the ``tcp-ack`` idiom)."""
    tcp_flags: int | None = None
    """The TCP flags byte (``flags syn``); None: ACK and PSH (or only ACK with ``ack``)."""
    family: Family = "ipv4"
    ext: tuple[int, ...] = ()
    """IPv6 extension headers in order (``HOP_BY_HOP``, ``ROUTING``, ``DEST_OPTS``, ``AUTH``,
    ``FRAGMENT``, ``LATER_FRAGMENT``); on IPv4 at most one fragment marker."""

    @property
    def later_fragment(self) -> bool:
        """True for a fragment after the first: it holds no header of ``proto``."""
        return LATER_FRAGMENT in self.ext

    @property
    def fragment(self) -> bool:
        """True for any fragment, the first included."""
        return FRAGMENT in self.ext or self.later_fragment

    def _transport(self, length: int) -> bytes:
        """The first 20 bytes after the IP header and its extension headers, ``length`` bytes
        long in all: the protocol's header as a host sends it, or payload (zeros) in a later
        fragment. TCP's data offset covers the header alone (options up to the end of a bare
        ACK); UDP's length is ``length``; ICMP and ICMPv6 are echo requests (type 8, 128;
        identifier, sequence and payload zeros) with their true checksum. Checksums that
        depend on a payload (TCP's, UDP's) are 0, as is every byte a protocol without ports
        has there: what a u32 key at those places finds in a real packet differs."""
        if self.later_fragment:
            return bytes(20)
        proto = self.proto
        ports = self.sport.to_bytes(2, "big") + self.dport.to_bytes(2, "big")
        if proto == 6:
            flags = 0x10 if self.ack_only else 0x18
            if self.tcp_flags is not None:
                flags = self.tcp_flags
            words = min(length, 60) // 4 if self.ack_only else 5
            return ports + bytes(8) + bytes([words << 4, flags]) + bytes(6)
        if proto in (17, 136):
            return ports + min(length, 0xFFFF).to_bytes(2, "big") + bytes(14)
        if proto in PORTED:
            return ports + bytes(16)
        if (proto, self.family) in ((1, "ipv4"), (58, "ipv6")):
            kind = 8 if proto == 1 else 128
            total = kind << 8
            if proto == 58:  # ICMPv6's checksum covers a pseudo-header too
                pseudo = self.src.to_bytes(16, "big") + self.dst.to_bytes(16, "big")
                pseudo += length.to_bytes(4, "big") + (58).to_bytes(4, "big")
                total += sum(int.from_bytes(pseudo[i : i + 2], "big") for i in range(0, 40, 2))
            while total > 0xFFFF:
                total = (total & 0xFFFF) + (total >> 16)
            return bytes([kind, 0]) + (~total & 0xFFFF).to_bytes(2, "big") + bytes(16)
        return bytes(20)

    def header(self) -> bytes:
        """The packet's bytes from the IP header on, as the kernel's u32 reads them: the IPv4
        header without options, or IPv6's 40-byte fixed header and its extension headers;
        then the first 20 bytes of the transport header (all a key of the language reads), or
        fewer: the packet ends there (a key past its end makes u32 give up)."""
        if self.family == "ipv6":
            chain = [*self.ext, self.proto]
            exts = b"".join(
                extension_bytes(kind, chain[i + 1] if chain[i + 1] >= 0 else FRAGMENT)
                for i, kind in enumerate(self.ext)
            )
            first = chain[0] if chain[0] >= 0 else FRAGMENT
            payload = max(self.size - ETHERNET_HEADER, 40 + len(exts)) - 40
            fixed = bytes([0x60 | self.tos >> 4, (self.tos & 0x0F) << 4, 0, 0])
            fixed += payload.to_bytes(2, "big") + bytes([first, 64])
            fixed += self.src.to_bytes(16, "big") + self.dst.to_bytes(16, "big")
            return (fixed + exts + self._transport(payload - len(exts)))[: 40 + payload]
        total = max(self.size - ETHERNET_HEADER, 20)
        transport = self._transport(total - 20)[: total - 20]
        frag = 0x4000
        if self.ext:
            frag = 0x2000 if FRAGMENT in self.ext else FRAGMENT_OFFSET
        ip = bytes([0x45, self.tos, total >> 8, total & 0xFF, 0, 0, frag >> 8, frag & 0xFF])
        ip += bytes([64, self.proto, 0, 0])
        ip += self.src.to_bytes(4, "big") + self.dst.to_bytes(4, "big")
        return ip + transport

    def ip_packet(self) -> bytes:
        """The whole IP packet as sent (a raw socket's ``IP_HDRINCL`` bytes, or an IPv6 packet
        from its fixed header on): ``header()`` and zeros up to the packet's size."""
        header = self.header()
        return header + bytes(max(self.size - ETHERNET_HEADER - len(header), 0))

    def address_text(self, address: int) -> str:
        """``src`` or ``dst`` in the usual spelling of the packet's family (an IPv4-mapped
        IPv6 address as ``::ffff:192.0.2.1``, as RFC 4291 writes it)."""
        if self.family == "ipv4":
            return str(ipaddress.IPv4Address(address))
        v6 = ipaddress.IPv6Address(address)
        return f"::ffff:{v6.ipv4_mapped}" if v6.ipv4_mapped is not None else str(v6)

    def describe(self) -> str:
        """The packet in the spec's own words."""
        names = {v: k for k, v in reversed(PROTOCOLS.items())}
        words = ["ipv6"] if self.family == "ipv6" else []
        words.append(names.get(self.proto, f"proto {self.proto}"))
        words += ["src", self.address_text(self.src), "dst", self.address_text(self.dst)]
        if self.proto in PORTED:
            words += ["sport", str(self.sport), "dport", str(self.dport)]
        if self.tos:
            words += ["tos", f"0x{self.tos:02x}"]
        if self.ack_only:
            words.append("ack")
        if self.tcp_flags is not None:
            words += ["flags", ",".join(n for n, b in TCP_FLAGS.items() if self.tcp_flags & b)]
        words += [EXTENSION_NAMES[kind] for kind in self.ext]
        words += ["size", str(self.size)]
        return " ".join(words)


@dataclass(frozen=True, slots=True)
class Flow:
    """Packets like ``packet`` at ``rate`` bit/s (None: greedy) between ``start`` and ``stop``
    (microseconds; ``stop`` None: until the end of the run)."""

    name: str
    packet: Packet
    rate: int | None = None
    start: int = 0
    stop: int | None = None


def _number(word: str, what: str, hi: int, hint: str = "") -> int:
    """``word`` as a number of 0..``hi``; ``hint`` ends the message when it is none."""
    try:
        value = int(word, 16) if word[:2].lower() == "0x" else int(word)
        if not word.isascii() or "_" in word:  # int() takes "٣" and "1_0"
            raise ValueError(word)
    except ValueError:
        if "," in word and not hint:  # one packet has one port (found by a tester)
            hint = f"; a packet has one {what}: give --packet once for each"
        raise SpecError(f"{what} needs a number, found {word!r}{hint}") from None
    if not 0 <= value <= hi:
        raise SpecError(f"{what} {value} is outside 0-{hi}")
    return value


def _address(word: str, what: str) -> tuple[Family, int]:
    try:
        address = ipaddress.ip_address(word)
    except ValueError:
        raise SpecError(f"{what} needs an IPv4 or IPv6 address, found {word!r}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        raise SpecError(
            f"{what} {word!r} has a zone (%{address.scope_id}): a packet's header carries no "
            f"zone, so classification cannot use it; give {what} {word.split('%')[0]}"
        )
    return ("ipv4" if address.version == 4 else "ipv6"), int(address)


MIN_TRANSPORT: dict[int, int] = {6: 20, 17: 8, 136: 8, 1: 8, 58: 8, 132: 12, 33: 12}
"""The shortest header of a protocol (TCP, UDP, UDP-Lite, ICMP, ICMPv6, SCTP, DCCP): what a
packet of it holds at least after the IP headers (0 for another protocol)."""


def _length(word: str, value: str, least: tuple[int, str], family: Family) -> int:
    """``size B`` (the frame, as tc counts it) or ``iplen B`` (the IP packet), as a size;
    ``least``: the shortest IP packet of this spec, and what it holds (:func:`_least`)."""
    try:
        number = int(str(parse_size(value)))
    except ValueError:
        raise SpecError(f"{word} needs a size such as 1500 or 1k, found {value!r}") from None
    extra = ETHERNET_HEADER if word == "iplen" else 0
    lo, hi = least[0] + ETHERNET_HEADER - extra, 65535 + ETHERNET_HEADER - extra
    if family == "ipv6":  # the payload length has 16 bits, the fixed header apart
        hi += 40
    if lo <= number <= hi:
        return number + extra
    if word == "iplen":
        least_words = f" ({least[1]})" if number < lo else ""
        raise SpecError(f"iplen {number} is outside {lo}-{hi} bytes{least_words}")
    hint = ""
    if least[0] <= number < lo:
        frame = number + ETHERNET_HEADER
        hint = f"; for an IP packet of {number} bytes write 'iplen {number}' (size {frame})"
    raise SpecError(
        f"size {number} is outside {lo}-{hi} bytes: size counts the frame on the wire, as tc "
        f"does, the 14-byte Ethernet header included{hint}"
    )


def _flags(text: str) -> int:
    bits = 0
    for name in text.lower().split(","):
        if name not in TCP_FLAGS:
            raise SpecError(f"unknown TCP flag {name!r}; the flags are {', '.join(TCP_FLAGS)}")
        bits |= TCP_FLAGS[name]
    return bits


TCP_OPTIONS = 40
"""The most TCP options a header holds (a data offset of 15 words)."""


def parse_packet(text: str) -> Packet:
    """Parse a packet spec (see the module docstring); raises ``SpecError``."""
    if not text.split():
        raise SpecError("the packet spec is empty; describe a packet, such as 'tcp dport 80'")
    packet, rest = _parse_packet_words(text.split())
    if rest:
        raise SpecError(f"unexpected {rest[0]!r} in the packet spec")
    return packet


PORTED = frozenset({6, 17, 33, 132, 136})
"""The protocols whose header starts with source and destination ports (tcp, udp, dccp, sctp,
udplite)."""

FAMILY_WORDS: dict[str, Family] = {"ipv4": "ipv4", "ipv6": "ipv6"}
_ONE_FAMILY: dict[int, Family] = {1: "ipv4", 58: "ipv6"}


def _ip_headers(family: Family, ext: tuple[int, ...]) -> int:
    """The length of the IP header and the extension headers."""
    if family == "ipv4":
        return 20
    return 40 + sum(24 if kind == AUTH else 8 for kind in ext)


def _least(family: Family, ext: tuple[int, ...], proto: int) -> tuple[int, str]:
    """The shortest IP packet of a spec, and what it holds in words."""
    ip = "the IPv6 headers" if family == "ipv6" else "an IP header"
    transport = 0 if LATER_FRAGMENT in ext else MIN_TRANSPORT.get(proto, 0)
    words = ip
    if transport:
        words += f" and {transport} bytes of {protocol_name(proto)} header"
    return _ip_headers(family, ext) + transport, words


def _parse_packet_words(words: list[str]) -> tuple[Packet, list[str]]:
    fields: dict[str, object] = {}
    given: dict[str, str] = {}  # field -> the word that gave it
    families: dict[Family, str] = {}  # family -> the word that implied it first
    ext: list[int] = []
    length: tuple[str, str] | None = None

    def once(key: str, word: str) -> None:
        if key in given:
            same = "" if given[key] == word else f" (as '{given[key]}' and as '{word}')"
            raise SpecError(f"the packet spec gives its {key} twice{same}; give it once")
        given[key] = word

    i = 0
    while i < len(words):
        word = words[i].lower()
        value = words[i + 1] if i + 1 < len(words) else None
        if word in FAMILY_WORDS:
            once("family", word)
            families.setdefault(FAMILY_WORDS[word], word)
            i += 1
            continue
        if word in EXTENSION_WORDS:
            kind = EXTENSION_WORDS[word]
            if kind in ext:
                raise SpecError(f"the packet spec gives '{word}' twice; give each header once")
            if kind in (FRAGMENT, LATER_FRAGMENT) and -kind in ext:
                # (found by a tester: 'frag laterfrag' was said to give 'laterfrag' twice)
                raise SpecError(
                    "the packet spec gives 'frag' and 'laterfrag': a packet is a first fragment "
                    "('frag') or a later one ('laterfrag'), not both"
                )
            if kind not in (FRAGMENT, LATER_FRAGMENT):
                families.setdefault("ipv6", word)
            ext.append(kind)
            i += 1
            continue
        if word in PROTOCOLS:
            once("protocol", word)
            fields["proto"] = PROTOCOLS[word]
            i += 1
            continue
        if word == "ack":
            once("ack", word)
            fields["ack_only"] = True
            fields.setdefault("proto", 6)
            i += 1
            continue
        if word == "flags" and value is not None:
            once("tcp flags", word)
            fields["tcp_flags"] = _flags(value)
            fields.setdefault("proto", 6)
            i += 2
            continue
        if word == "flags":  # (no value: found by a tester, it was an 'unexpected' word)
            raise SpecError("'flags' needs a value, such as 'flags syn' or 'flags syn,ack'")
        if word not in ("proto", "src", "dst", "sport", "dport", "tos", "dscp", "size", "iplen"):
            break  # the flow's words start here
        if value is None:
            raise SpecError(f"'{word}' needs a value")
        once(
            {"proto": "protocol", "dscp": "tos", "iplen": "size"}.get(word, word),
            word,
        )
        if word == "proto":
            fields["proto"] = PROTOCOLS.get(value.lower()) or _number(value, "proto", 255)
        elif word in ("src", "dst"):
            implied, fields[word] = _address(value, word)
            families.setdefault(implied, f"{word} {value}")
        elif word in ("sport", "dport"):
            fields[word] = _number(value, word, 65535)
        elif word == "tos":
            fields["tos"] = _number(value, "tos", 255)
        elif word == "dscp":
            code = DSCP_NAMES.get(value.lower())
            names = "; or a name such as ef, af41 or cs1"  # found by a tester: names work too
            fields["tos"] = (code if code is not None else _number(value, "dscp", 63, names)) << 2
        else:
            length = (word, value)
        i += 2
    proto = fields.get("proto", DEFAULT_PROTO)
    assert isinstance(proto, int)
    if proto in _ONE_FAMILY:
        families.setdefault(_ONE_FAMILY[proto], protocol_name(proto).lower())
    if len(families) > 1:
        four, six = families["ipv4"], families["ipv6"]
        raise SpecError(f"'{four}' is IPv4 and '{six}' is IPv6: a packet has one family")
    family: Family = next(iter(families), "ipv4")
    fields["family"] = family
    fields["ext"] = tuple(ext)
    if family == "ipv6":
        fields.setdefault("src", V6_SRC)
        fields.setdefault("dst", V6_DST)
    ports = [p for p in ("sport", "dport") if p in fields]
    if ports and proto not in PORTED:
        name = protocol_name(proto).lower()
        raise SpecError(f"{name} has no ports: drop '{ports[0]}', or make it a tcp or udp packet")
    if "tcp_flags" in fields and proto != 6:
        raise SpecError("'flags' are TCP flags; the packet cannot have another protocol")
    shortest = _least(family, tuple(ext), proto)
    least = _ip_headers(family, tuple(ext)) + MIN_TRANSPORT[6]  # a bare ACK's, below
    if length is not None:
        fields["size"] = _length(*length, shortest, family)
    if fields.get("ack_only"):
        if fields.get("proto") != 6:
            raise SpecError("'ack' is a TCP packet; it cannot have another protocol")
        if "tcp_flags" in fields:
            raise SpecError(
                "'ack' is a bare ACK (only ACK set, no payload); for other flags write "
                "'flags ...' alone (flags ack is an ACK with a payload)"
            )
        size = fields.setdefault("size", least + ETHERNET_HEADER)  # headers only
        assert isinstance(size, int)
        if size > least + TCP_OPTIONS + ETHERNET_HEADER:
            shift = ETHERNET_HEADER if length is not None and length[0] == "size" else 0
            word = "size" if shift else "iplen"
            bounds = f"{word} {least + shift}-{least + TCP_OPTIONS + shift}"
            raise SpecError(
                f"'ack' is a bare ACK: no payload, at most {TCP_OPTIONS} bytes of TCP options "
                f"({bounds}); for an ACK with a payload write 'flags ack'"
            )
    return Packet(**fields), words[i:]  # type: ignore[arg-type]


def bytes_rate(text: str) -> str | None:
    """A warning when the flow spec ``text`` gives its rate in bytes a second (``rate
    10mbps``, tc's reading, which a policy gets W302 for), else None."""
    words = text.split()
    for word, value in itertools.pairwise(words):
        unit = value.lstrip("0123456789.").lower()
        if word.lower() == "rate" and unit in BYTE_RATE_UNITS:
            bits = format_rate(parse_rate(value)) if _is_rate(value) else "?"
            return (
                f"'rate {value}' is bytes a second, as tc reads it: {bits}; for bits a "
                f"second write {value[: len(value) - len(unit)]}{unit[:-3]}bit"
            )
    return None


def _is_rate(value: str) -> bool:
    try:
        parse_rate(value)
    except ValueError:
        return False
    return True


def parse_flow(text: str, index: int = 0) -> Flow:
    """Parse a flow spec (see the module docstring); raises ``SpecError``.

    A flow without a name is called ``flowN`` (N = ``index`` + 1).
    """
    name, sep, rest = text.partition(":")
    if not sep or " " in name.strip() or not name.strip():
        name, rest = f"flow{index + 1}", text
    if not rest.split():  # as classify refuses an empty packet (found by a tester)
        raise SpecError(
            "the flow spec gives no packet; describe one, such as 'web: tcp dport 80 rate 5mbit'"
        )
    packet, words = _parse_packet_words(rest.split())
    rate: int | None = None
    start, stop = 0, None
    i = 0
    while i < len(words):
        word = words[i].lower()
        if i + 1 >= len(words):
            raise SpecError(f"unexpected {words[i]!r} in the flow spec")
        value = words[i + 1]
        try:
            if word == "rate":
                rate = parse_rate(value)
            elif word == "start":
                start = parse_time(value)
            elif word == "stop":
                stop = parse_time(value)
            else:
                raise SpecError(f"unexpected {words[i]!r} in the flow spec")
        except ValueError as err:
            if isinstance(err, SpecError):
                raise
            raise SpecError(f"'{word}' needs a value with a unit, found {value!r}") from None
        i += 2
    if rate is not None and rate <= 0:
        raise SpecError("a flow's rate must be above 0")
    if rate is not None and rate > MAX_RATE:
        raise SpecError(f"a flow's rate must be at most {format_rate(MAX_RATE)}")
    if stop is not None and stop <= start:
        raise SpecError("a flow must stop after it starts")
    return Flow(name.strip(), packet, rate, start, stop)


def flows_problem(flows: Sequence[Flow]) -> str | None:
    """Why a set of flows cannot be run together (none, or two with one name), or None."""
    if not flows:
        return "give at least one flow"
    names = [f.name for f in flows]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        return f"two flows are called '{dup}'; give them different names"
    return None
