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


def test_iplen_is_the_ip_packets_length() -> None:
    """``iplen`` is what tcpdump reports; ``size`` adds the 14-byte Ethernet header, as tc."""
    assert parse_packet("tcp iplen 52").size == 66
    assert parse_packet("tcp iplen 52") == parse_packet("tcp size 66")
    header = parse_packet("tcp iplen 52").header()
    assert int.from_bytes(header[2:4], "big") == 52  # the IP header's total length
    assert parse_packet("udp iplen 1500").size == 1514
    assert parse_packet("udp iplen 1k").size == 1024 + 14


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tcp dport 70000", "dport 70000 is outside 0-65535"),
        ("src 10.0.0.300", "src needs an IPv4 address"),
        ("udp ack", "'ack' is a TCP packet"),
        ("tcp dport", "'dport' needs a value"),
        ("tcp rate 1mbit", "unexpected 'rate'"),
        ("size 10", "size 10 is outside 54-65549 bytes: size counts the frame on the wire"),
        (
            "size 52",
            "the 14-byte Ethernet header included; for an IP packet of 52 bytes write "
            "'iplen 52' \\(size 66\\)",
        ),
        ("size 65550", "size 65550 is outside 54-65549 bytes: size counts the frame"),
        ("iplen 39", "iplen 39 is outside 40-65535 bytes \\(an IP header and 20 bytes"),
        ("iplen 65536", "iplen 65536 is outside 40-65535 bytes$"),
        ("iplen many", "iplen needs a size such as 1500 or 1k, found 'many'"),
        ("iplen 100 size 114", "gives its size twice \\(as 'iplen' and as 'size'\\); give it once"),
        ("tcp dport 80 dport 81", "gives its dport twice; give it once"),
        ("udp tos 0x10 dscp ef", "gives its tos twice \\(as 'tos' and as 'dscp'\\)"),
        ("tcp proto udp", "gives its protocol twice \\(as 'tcp' and as 'proto'\\)"),
        ("icmp dport 80", "icmp has no ports: drop 'dport', or make it a tcp or udp packet"),
        ("proto 47 sport 1", "gre has no ports: drop 'sport'"),
        ("", "the packet spec is empty; describe a packet, such as 'tcp dport 80'"),
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


def test_ports_without_a_protocol_are_udp_ports() -> None:
    """The default protocol (udp) has ports: 'dport 80' alone is a UDP packet to port 80."""
    packet = parse_packet("dport 80")
    assert (packet.proto, packet.dport) == (17, 80)
