"""Packet and flow specs: what users type for classify, simulate and measure."""

from __future__ import annotations

import ipaddress

import pytest

from tcdsl import lower
from tcdsl.ir import U32Key
from tcdsl.teach.traffic import Flow, Packet, SpecError, parse_flow, parse_packet


def test_packet_words() -> None:
    p = parse_packet("tcp src 10.3.34.11 dport 5001 tos 0x10")
    assert (p.proto, p.dport, p.tos) == (6, 5001, 0x10)
    assert p.src == int(ipaddress.IPv4Address("10.3.34.11"))
    assert parse_packet("udp dscp ef").tos == 0xB8
    assert parse_packet("proto 47 size 1k").proto == 47
    assert parse_packet("icmp size 98").size == 98
    ack = parse_packet("ack")
    assert (ack.proto, ack.ack_only, ack.size) == (6, True, 54)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tcp dport 70000", "dport 70000 is outside 0-65535"),
        ("src 10.0.0.300", "src needs an IPv4 address"),
        ("udp ack", "'ack' is a TCP packet"),
        ("tcp dport", "'dport' needs a value"),
        ("tcp rate 1mbit", "unexpected 'rate'"),
        ("size 10", "size 10 is outside 54-65549 bytes"),
    ],
)
def test_bad_packets(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_packet(text)


def test_flows() -> None:
    f = parse_flow("h1: udp dst 10.0.0.1 dport 5001 rate 20mbit start 1s stop 30s")
    assert f == Flow(
        "h1", parse_packet("udp dst 10.0.0.1 dport 5001"), 20_000_000, 10**6, 30 * 10**6
    )
    assert parse_flow("tcp dport 80", 2).name == "flow3"
    assert parse_flow("tcp dport 80").rate is None
    with pytest.raises(SpecError, match="must stop after it starts"):
        parse_flow("a: udp start 5s stop 1s")
    with pytest.raises(SpecError, match="'rate' needs a value with a unit"):
        parse_flow("a: udp rate 100")


def _key_matches(key: U32Key, header: bytes) -> bool:
    offset, value, mask = lower.pack(key)
    word = int.from_bytes(header[offset : offset + 4], "big")
    return word & mask == value & mask


@pytest.mark.parametrize(
    ("keys", "packet", "hit"),
    [
        (
            (U32Key(("ip", "src", "10.3.34.0/24")),),
            Packet(src=int(ipaddress.IPv4Address("10.3.34.11"))),
            True,
        ),
        ((U32Key(("ip", "dport", "5001", "0xffff")),), parse_packet("udp dport 5001"), True),
        ((U32Key(("ip", "sport", "53", "0xffff")),), parse_packet("udp sport 53"), True),
        ((U32Key(("ip", "tos", "0x10", "0xff")),), parse_packet("tcp tos 0x10"), True),
        ((U32Key(("ip", "protocol", "6", "0xff")),), parse_packet("udp"), False),
        (lower.TCP_ACK_KEYS, parse_packet("ack"), True),
        (lower.TCP_ACK_KEYS, parse_packet("tcp"), False),
    ],
)
def test_header_is_what_u32_reads(keys: tuple[U32Key, ...], packet: Packet, hit: bool) -> None:
    """The header bytes sit where tc's u32 keys look for them."""
    header = packet.header()
    assert len(header) == 40
    assert all(_key_matches(k, header) for k in keys) == hit
