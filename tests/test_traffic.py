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


def test_a_bare_ack_may_carry_tcp_options() -> None:
    """'ack iplen 52' is an ACK with timestamps (12 bytes of options), as Linux sends them."""
    assert parse_packet("ack iplen 52").size == 66
    assert parse_packet("ack iplen 80").ack_only


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
        ("src 10.0.0.300", "src needs an IPv4 or IPv6 address"),
        ("udp ack", "'ack' is a TCP packet"),
        ("tcp ack ack", "gives its ack twice; give it once"),
        ("ack size 3000", "at most 40 bytes of TCP options \\(size 54-94\\)"),
        ("ack iplen 81", "\\(iplen 40-80\\); for an ACK with a payload write 'flags ack'"),
        ("ipv6 ack iplen 101", "\\(iplen 60-100\\)"),
        ("tcp dport", "'dport' needs a value"),
        ("tcp rate 1mbit", "unexpected 'rate'"),
        ("size 10", "size 10 is outside 42-65549 bytes: size counts the frame on the wire"),
        (
            "tcp size 52",
            "the 14-byte Ethernet header included; for an IP packet of 52 bytes write "
            "'iplen 52' \\(size 66\\)",
        ),
        ("size 65550", "size 65550 is outside 42-65549 bytes: size counts the frame"),
        ("iplen 27", "iplen 27 is outside 28-65535 bytes \\(an IP header and 8 bytes of UDP"),
        ("tcp iplen 39", "iplen 39 is outside 40-65535 bytes \\(an IP header and 20 bytes"),
        ("iplen 65536", "iplen 65536 is outside 28-65535 bytes$"),
        ("iplen many", "iplen needs a size such as 1500 or 1k, found 'many'"),
        ("iplen 100 size 114", "gives its size twice \\(as 'iplen' and as 'size'\\); give it once"),
        ("tcp dport 80 dport 81", "gives its dport twice; give it once"),
        ("udp tos 0x10 dscp ef", "gives its tos twice \\(as 'tos' and as 'dscp'\\)"),
        ("tcp proto udp", "gives its protocol twice \\(as 'tcp' and as 'proto'\\)"),
        ("icmp dport 80", "icmp has no ports: drop 'dport', or make it a tcp or udp packet"),
        ("proto 47 sport 1", "gre has no ports: drop 'sport'"),
        ("", "the packet spec is empty; describe a packet, such as 'tcp dport 80'"),
        # found by a tester: said "gives 'laterfrag' twice", and "unexpected 'flags'"
        ("ipv6 frag laterfrag udp", "gives 'frag' and 'laterfrag': a packet is a first"),
        ("ipv6 frag frag udp", "gives 'frag' twice; give each header once"),
        ("tcp flags", "'flags' needs a value, such as 'flags syn'"),
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
    # no packet at all, as classify refuses one (found by a tester: a default UDP flow)
    for empty in ("", "x:", "x:   "):
        with pytest.raises(SpecError, match="the flow spec gives no packet"):
            parse_flow(empty)


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


# ---- IPv6 -------------------------------------------------------------------------------------


def _v6(text: str) -> int:
    return int(ipaddress.IPv6Address(text))


def test_ipv6_packet_words() -> None:
    """The family word, an IPv6 address, icmpv6 or an extension header make an IPv6 packet;
    a spec that implies no family stays IPv4."""
    p = parse_packet("ipv6 tcp src 2001:db8::1 dport 443")
    assert (p.family, p.proto, p.src, p.dport) == ("ipv6", 6, _v6("2001:db8::1"), 443)
    assert p.dst == _v6("2001:db8::2")  # the documentation prefix when not given
    assert parse_packet("udp dst fe80::1").family == "ipv6"
    assert parse_packet("icmpv6").family == "ipv6"
    assert parse_packet("hbh tcp").family == "ipv6"
    assert parse_packet("tcp dport 443").family == "ipv4"
    assert parse_packet("ipv4 udp").family == "ipv4"
    assert parse_packet("tcp frag").family == "ipv4"  # IPv4 fragments exist too
    assert parse_packet("ipv6 ack").size == 14 + 40 + 20
    assert parse_packet("ipv6 hbh ack").size == 14 + 40 + 8 + 20
    assert parse_packet("ipv6 tcp iplen 60").size == 74
    # an IPv4-mapped address as RFC 4291 writes it, not ::ffff:102:304 (found by a tester)
    mapped = parse_packet("tcp src ::ffff:1.2.3.4")
    assert mapped.family == "ipv6"
    assert mapped.describe().split()[3] == "::ffff:1.2.3.4"
    assert parse_packet(mapped.describe()) == mapped


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ipv4 src 2001:db8::1", "'ipv4' is IPv4 and 'src 2001:db8::1' is IPv6"),
        ("src 10.0.0.1 dst ::1", "'src 10.0.0.1' is IPv4 and 'dst ::1' is IPv6"),
        ("icmp hbh", "'icmp' is IPv4 and 'hbh' is IPv6"),
        ("ipv6 icmp", "'icmp' is IPv4 and 'ipv6' is IPv6"),
        ("ipv6 ipv6 tcp", "gives its family twice"),
        ("ipv6 hbh hbh", "gives 'hbh' twice"),
        ("ipv6 frag laterfrag", "gives 'frag' and 'laterfrag'"),
        ("ipv6 hbh iplen 55", "iplen 55 is outside 56-65575 bytes \\(the IPv6 headers"),
        ("ipv6 size 60", "size 60 is outside 62-65589 bytes"),
        # a zone was dropped without a word (found by a tester)
        ("tcp dst fe80::1%eth0", "dst 'fe80::1%eth0' has a zone \\(%eth0\\).*give dst fe80::1$"),
    ],
)
def test_bad_ipv6_packets(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_packet(text)


def test_ipv6_header_bytes() -> None:
    """The 40-byte fixed header (version 6, traffic class, payload length, next header, hop
    limit, addresses), then the first 20 bytes of TCP: ports at 40, flags at 53."""
    p = parse_packet("ipv6 tcp src 2001:db8::1 dst 2001:db8:1::9 sport 1024 dport 443 dscp ef")
    h = p.header()
    assert len(h) == 60
    assert h[0] >> 4 == 6
    assert (int.from_bytes(h[0:4], "big") >> 20) & 0xFF == 0xB8  # the traffic class
    assert int.from_bytes(h[4:6], "big") == 1514 - 14 - 40  # payload length
    assert (h[6], h[7]) == (6, 64)
    assert h[8:24] == ipaddress.IPv6Address("2001:db8::1").packed
    assert h[24:40] == ipaddress.IPv6Address("2001:db8:1::9").packed
    assert (int.from_bytes(h[40:42], "big"), int.from_bytes(h[42:44], "big")) == (1024, 443)
    assert h[53] == 0x18  # ACK and PSH
    assert len(p.ip_packet()) == 1500
    assert p.describe() == (
        "ipv6 tcp src 2001:db8::1 dst 2001:db8:1::9 sport 1024 dport 443 tos 0xb8 size 1514"
    )
    assert parse_packet(p.describe()) == p


def test_extension_headers_chain() -> None:
    """Extension headers sit between the fixed header and TCP, in the order written, each
    naming the next; the fixed header's next header is the first of them."""
    p = parse_packet("ipv6 hbh dstopt rthdr frag tcp dport 443")
    h = p.header()
    assert h[6] == 0  # hop-by-hop first
    assert [h[40], h[48], h[56], h[64]] == [60, 43, 44, 6]
    assert h[41] == 0  # 8 bytes each
    assert int.from_bytes(h[66:68], "big") == 1  # first fragment: offset 0, more fragments
    assert int.from_bytes(h[72 + 2 : 72 + 4], "big") == 443  # TCP after 32 bytes of headers
    assert parse_packet(p.describe()) == p
    later = parse_packet("ipv6 laterfrag udp dport 53").header()
    assert (later[6], later[40]) == (44, 17)
    assert int.from_bytes(later[42:44], "big") >> 3 == 185  # a later fragment's offset
    assert later[48:] == bytes(20)  # payload, no UDP header
    ah = parse_packet("ipv6 auth tcp").header()
    assert (ah[6], ah[40], ah[41]) == (51, 6, 4)  # AH: 24 bytes, (4 + 2) * 4
    assert len(ah) == 40 + 24 + 20


def test_ipv4_fragments() -> None:
    """On IPv4, 'frag' sets more-fragments at offset 0, 'laterfrag' an offset (no DF)."""
    assert parse_packet("tcp").header()[6:8] == bytes([0x40, 0])
    assert parse_packet("tcp frag").header()[6:8] == bytes([0x20, 0])
    later = parse_packet("udp laterfrag dport 53").header()
    assert int.from_bytes(later[6:8], "big") == 185
    assert later[20:] == bytes(20)


@pytest.mark.parametrize(
    ("keys", "spec", "hit"),
    [
        ((U32Key(("ip6", "src", "2001:db8::/32")),), "ipv6 src 2001:db8:5::1", True),
        ((U32Key(("ip6", "src", "2001:db8::/32")),), "ipv6 src 2001:db9::1", False),
        ((U32Key(("ip6", "dst", "2001:db8::2")),), "ipv6 udp", True),
        ((U32Key(("ip6", "dport", "443", "0xffff")),), "ipv6 tcp dport 443", True),
        ((U32Key(("ip6", "sport", "53", "0xffff")),), "ipv6 udp sport 53", True),
        ((U32Key(("ip6", "protocol", "17", "0xff")),), "ipv6 udp", True),
        ((U32Key(("ip6", "protocol", "17", "0xff")),), "ipv6 hbh udp", False),
        ((U32Key(("ip6", "priority", "0xb8", "0xfc")),), "ipv6 dscp ef", True),
        (lower.TCP_ACK_KEYS_6, "ipv6 ack", True),
        (lower.TCP_ACK_KEYS_6, "ipv6 tcp", False),
        (lower.TCP_ACK_KEYS_6, "ipv6 hbh ack", False),
    ],
)
def test_ipv6_header_is_what_u32_reads(keys: tuple[U32Key, ...], spec: str, hit: bool) -> None:
    """tc's ip6 keys find their fields in the IPv6 header bytes."""
    header = parse_packet(spec).header()
    words = [w for k in keys for w in lower.pack_words(k)]
    assert all(int.from_bytes(header[o : o + 4], "big") & m == v & m for o, v, m in words) == hit
