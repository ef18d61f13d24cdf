"""Packets and flows as users describe them to ``classify``, ``simulate`` and ``measure``.

A packet spec is a few words, in any order (``tcp src 10.3.34.11 dport 5001 tos 0x10``):

- a protocol: ``tcp``, ``udp``, ``icmp`` or any name of the language, or ``proto N``;
- ``src A``, ``dst A`` (IPv4 addresses), ``sport N``, ``dport N``;
- ``tos V`` (0-255, decimal or 0x..) or ``dscp X`` (a number or a name such as ``ef``);
- ``size B`` (bytes on the wire, as tc counts them: the IP packet plus the 14-byte Ethernet
  header; ``1500b``, ``1k`` and bare numbers as in tc), or ``iplen B``, the IP packet's own
  length (its total-length field, what tcpdump and ``ip -s`` report): ``iplen 52`` is ``size 66``;
- ``ack``: a TCP packet with only ACK set and no payload (what the ``tcp-ack`` match finds);
- ``flags F,...``: a TCP packet with exactly these flags set (``flags syn``, ``flags syn,ack``;
  a TCP packet without it has ACK and PSH set).

A flow spec is ``[NAME:] PACKET-WORDS [rate R] [start T] [stop T]``: packets like that one,
sent at rate R (at most ``MAX_RATE``, 1tbit; greedy when no rate is given: as fast as the
policy lets it) from time ``start`` (default 0s) to ``stop`` (default: the end of the run).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from tcdsl.frontend.syntax import DSCP_NAMES, PROTOCOLS
from tcdsl.ir import TCP_FLAGS
from tcdsl.units import format_rate, parse_rate, parse_size, parse_time
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


@dataclass(frozen=True, slots=True)
class Packet:
    """One IPv4 packet, as far as classification looks at it."""

    proto: int = DEFAULT_PROTO
    src: int = int(ipaddress.IPv4Address("10.0.0.1"))
    dst: int = int(ipaddress.IPv4Address("10.0.0.2"))
    sport: int = 40000
    dport: int = 9
    tos: int = 0
    size: int = DEFAULT_SIZE
    """Bytes on the wire (IP packet + Ethernet header), as qdiscs count them."""
    ack_only: bool = False
    """TCP with only ACK set and a 20-byte header, no payload (the ``tcp-ack`` idiom)."""
    tcp_flags: int | None = None
    """The TCP flags byte (``flags syn``); None: ACK and PSH (or only ACK with ``ack``)."""

    def header(self) -> bytes:
        """The first 40 bytes of the IP packet (IP header without options, then the first
        20 bytes of the transport header), which is all a u32 key of the language reads."""
        total = max(self.size - ETHERNET_HEADER, 40)
        ip = bytes([0x45, self.tos, total >> 8, total & 0xFF, 0, 0, 0x40, 0, 64, self.proto, 0, 0])
        ip += self.src.to_bytes(4, "big") + self.dst.to_bytes(4, "big")
        transport = self.sport.to_bytes(2, "big") + self.dport.to_bytes(2, "big")
        if self.proto == 6:
            flags = 0x10 if self.ack_only else 0x18
            if self.tcp_flags is not None:
                flags = self.tcp_flags
            transport += bytes(8) + bytes([0x50, flags]) + bytes(6)
        else:
            transport += bytes(16)
        return ip + transport

    def describe(self) -> str:
        """The packet in the spec's own words."""
        names = {v: k for k, v in reversed(PROTOCOLS.items())}
        words = [names.get(self.proto, f"proto {self.proto}")]
        words += ["src", str(ipaddress.IPv4Address(self.src))]
        words += ["dst", str(ipaddress.IPv4Address(self.dst))]
        if self.proto in (6, 17, 132):
            words += ["sport", str(self.sport), "dport", str(self.dport)]
        if self.tos:
            words += ["tos", f"0x{self.tos:02x}"]
        if self.ack_only:
            words.append("ack")
        if self.tcp_flags is not None:
            words += ["flags", ",".join(n for n, b in TCP_FLAGS.items() if self.tcp_flags & b)]
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


def _number(word: str, what: str, hi: int) -> int:
    try:
        value = int(word, 16) if word[:2].lower() == "0x" else int(word)
        if not word.isascii() or "_" in word:  # int() takes "٣" and "1_0"
            raise ValueError(word)
    except ValueError:
        raise SpecError(f"{what} needs a number, found {word!r}") from None
    if not 0 <= value <= hi:
        raise SpecError(f"{what} {value} is outside 0-{hi}")
    return value


def _address(word: str, what: str) -> int:
    try:
        return int(ipaddress.IPv4Address(word))
    except ValueError:
        raise SpecError(f"{what} needs an IPv4 address, found {word!r}") from None


MIN_IP_LENGTH = 40
"""The shortest packet modelled: an IP header and 20 bytes of transport header."""


def _length(word: str, value: str) -> int:
    """``size B`` (the frame, as tc counts it) or ``iplen B`` (the IP packet), as a size."""
    try:
        number = int(str(parse_size(value)))
    except ValueError:
        raise SpecError(f"{word} needs a size such as 1500 or 1k, found {value!r}") from None
    extra = ETHERNET_HEADER if word == "iplen" else 0
    lo, hi = MIN_IP_LENGTH + ETHERNET_HEADER - extra, 65535 + ETHERNET_HEADER - extra
    if lo <= number <= hi:
        return number + extra
    if word == "iplen":
        least = " (an IP header and 20 bytes of TCP or UDP header)" if number < lo else ""
        raise SpecError(f"iplen {number} is outside {lo}-{hi} bytes{least}")
    hint = ""
    if MIN_IP_LENGTH <= number < lo:
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


def _parse_packet_words(words: list[str]) -> tuple[Packet, list[str]]:
    fields: dict[str, object] = {}
    given: dict[str, str] = {}  # field -> the word that gave it

    def once(key: str, word: str) -> None:
        if key in given:
            same = "" if given[key] == word else f" (as '{given[key]}' and as '{word}')"
            raise SpecError(f"the packet spec gives its {key} twice{same}; give it once")
        given[key] = word

    i = 0
    while i < len(words):
        word = words[i].lower()
        value = words[i + 1] if i + 1 < len(words) else None
        if word in PROTOCOLS:
            once("protocol", word)
            fields["proto"] = PROTOCOLS[word]
            i += 1
            continue
        if word == "ack":
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
            fields[word] = _address(value, word)
        elif word in ("sport", "dport"):
            fields[word] = _number(value, word, 65535)
        elif word == "tos":
            fields["tos"] = _number(value, "tos", 255)
        elif word == "dscp":
            code = DSCP_NAMES.get(value.lower())
            fields["tos"] = (code if code is not None else _number(value, "dscp", 63)) << 2
        else:
            fields["size"] = _length(word, value)
        i += 2
    ports = [p for p in ("sport", "dport") if p in fields]
    proto = fields.get("proto", DEFAULT_PROTO)
    assert isinstance(proto, int)
    if ports and proto not in PORTED:
        name = protocol_name(proto).lower()
        raise SpecError(f"{name} has no ports: drop '{ports[0]}', or make it a tcp or udp packet")
    if "tcp_flags" in fields and proto != 6:
        raise SpecError("'flags' are TCP flags; the packet cannot have another protocol")
    if fields.get("ack_only"):
        if fields.get("proto") != 6:
            raise SpecError("'ack' is a TCP packet; it cannot have another protocol")
        fields.setdefault("size", 40 + ETHERNET_HEADER)  # headers only
    return Packet(**fields), words[i:]  # type: ignore[arg-type]


def parse_flow(text: str, index: int = 0) -> Flow:
    """Parse a flow spec (see the module docstring); raises ``SpecError``.

    A flow without a name is called ``flowN`` (N = ``index`` + 1).
    """
    name, sep, rest = text.partition(":")
    if not sep or " " in name.strip() or not name.strip():
        name, rest = f"flow{index + 1}", text
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
