"""``tcdsl verify``: read-back parsers, expected state, comparison, runners, CLI.

The parsers and normalisers are tested on lines real kernels printed: the host's (htb, tbf,
fifos, u32; iptables nft) and Debian's 6.1 run as user-mode Linux (sfq, prio, netem, fq_codel,
fw, iptables legacy), captured in ``tests/verify_data/``. The comparison is tested on those
captures, unchanged (kernel and policy agree) and with one value changed (the exact diagnostic,
at the policy line). The rest runs ``tcdsl verify`` for real: on the host kernel for every
policy it supports (root and network namespaces needed; other policies are skipped naming the
missing module), with the state tampered with after the script ran, and in one user-mode Linux
boot for the policies the host cannot run (skipped where user-mode Linux cannot run).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl import ir
from tcdsl.backend import BackendOptions
from tcdsl.cli import cli
from tcdsl.diagnostics import Diagnostic, render
from tcdsl.driver import Result, compile_policy
from tcdsl.verify import compare, expect, readback, runner, verifier
from tcdsl.verify.expect import (
    codel_shown_time,
    expected_keys,
    expected_policy,
    htb_shown_burst,
    netem_shown_percent,
    netem_shown_time,
    tbf_shown_latency,
    tbf_shown_size,
    tc_shown_rate,
    tc_shown_size,
    tc_shown_time,
)
from tcdsl.verify.readback import (
    IptRule,
    TcFilter,
    parse_filters,
    parse_iptables_save,
    parse_qdiscs,
    parse_rate,
    parse_size,
    parse_time,
)
from tests.conftest import ROOT, policy_files

DATA = ROOT / "tests" / "verify_data"
APPLY_POLICIES = ROOT / "tests" / "apply_policies"
ALL_POLICIES = [*policy_files(), *sorted(p.relative_to(ROOT) for p in APPLY_POLICIES.glob("*.tcp"))]


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policies are named relative to the repository root, as in the messages."""
    monkeypatch.chdir(ROOT)


def _compile(path: str | Path) -> Result:
    """The shell script as verify applies it: one tc per command."""
    result = compile_policy(str(path), options=BackendOptions(batch=False))
    assert result.policy is not None and result.output is not None, render(
        result.diagnostics, result.sources
    )
    return result


def _write(tmp_path: Path, text: str, name: str = "policy.tcp") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _lines(diagnostics: list[Diagnostic]) -> list[str]:
    """The header line of each diagnostic, as the CLI prints it."""
    return [f"{d.span}: {d.severity.value}: {d.message} [{d.code}]" for d in diagnostics]


# ==== values ===================================================================================


def test_parse_rate_and_size() -> None:
    assert parse_rate("10Mbit") == 10_000_000
    assert parse_rate("1500Kbit") == 1_500_000
    assert parse_rate("1Gbit") == 10**9
    assert parse_rate("999bit") == 999
    assert parse_rate("8Kibit") == 8192
    assert parse_size("15Kb/1") == 15 * 1024
    assert parse_size("1539b/1") == 1539
    assert parse_size("2560Kb") == 2560 * 1024
    assert parse_size("4Mb") == 4 * 1024 * 1024
    assert tc_shown_rate(10_800_000) == 10_800_000
    assert tc_shown_rate(3_333_333) == 3_333_000  # 416666 bytes/s, printed 3333Kbit
    assert tc_shown_rate(999_999) == 999_992  # bytes/s granularity below 1Mbit
    assert tc_shown_size(15 * 1024) == 15 * 1024
    assert tc_shown_size(3000) == 3000
    assert tc_shown_size(1030) == 1024
    with pytest.raises(ValueError):
        parse_rate("10mbit")  # tc prints the unit as Mbit: another spelling is not tc's


def test_times_as_tc_prints_them() -> None:
    assert parse_time("26.2ms") == 26_200
    assert parse_time("99us") == 99
    assert parse_time("1.5s") == 1_500_000
    assert parse_time("1e+03s") == 10**9
    # sprint_time: %.3g in s and ms, whole us below.
    assert tc_shown_time(26_214.8) == 26_200
    assert tc_shown_time(123_456) == 123_000
    assert tc_shown_time(999) == 999
    # netem keeps psched ticks of 64 ns: 100us -> 1562 ticks -> 99us (seen on Linux 6.1).
    assert netem_shown_time(100) == 99
    assert netem_shown_time(20_000) == 20_000
    assert netem_shown_time(123_456) == 123_000
    # codel keeps units of 1024 ns: 5ms -> 4999us, printed 5ms; 100us -> 99us.
    assert codel_shown_time(5_000) == 5_000
    assert codel_shown_time(100) == 99
    # netem probabilities are fractions of 2^32-1 printed with %g (seen: 0.00100001%).
    from fractions import Fraction

    assert netem_shown_percent(Fraction(1, 1000)) == 0.00100001
    assert netem_shown_percent(Fraction(3, 2)) == 1.5


def test_bursts_as_tc_prints_them() -> None:
    """Values seen on the host kernel (iproute2 6.1). An htb burst goes through tc's whole
    microseconds and 64-ns ticks; a tbf burst or mtu through the kernel's nanoseconds."""
    assert htb_shown_burst(742_688_528, 1601) == 1485  # "burst 1485b/1"
    assert htb_shown_burst(12 * 10**9, 1600) == 0  # "cburst 0b/1": under a microsecond
    assert htb_shown_burst(10**7, 15 * 1024) == 15 * 1024  # "15Kb"
    assert tbf_shown_size(10**10, 1600) == 1250  # "burst 1250b/1"
    assert tbf_shown_size(4_129_242_464, 100_000) == 99_617
    assert tbf_shown_size(4_229_242_464, 5317) == 5286  # mtu at the peak rate
    assert tbf_shown_size(20 * 10**9, 94) == 0  # no ticks: tc prints no mtu at all
    # sizes of a million Kb and more are printed with %g: "limit 2.64303e+06Kb"
    assert tc_shown_size(2_706_459_662) == parse_size("2.64303e+06Kb") == 2_706_462_720


def test_netem_limit_and_hidden_jitter() -> None:
    (q,) = parse_qdiscs("qdisc netem 1: root refcnt 2 limit -1 loss 100% rate 20Gbit")
    assert q.options["limit"].value == 2**32 - 1  # a u32 that tc prints with %d
    text = "interface eth0 netem delay 0us jitter 5ms"  # tc shows no jitter without a delay
    result = compile_policy("<text>", loader=lambda _: text)
    assert result.policy is not None
    (iface,) = expected_policy(result.policy).interfaces
    assert "jitter" not in {w.key for w in iface.qdiscs[0].wants}


def test_tbf_latency_as_tc_prints_it() -> None:
    """``lat`` is computed by tc from rate, burst and limit; values seen on the host."""
    for text, lat in [
        ("interface eth0 tbf rate 220kbit latency 50ms burst 1540", 50_000),
        ("interface eth0 tbf rate 10mbit burst 32k limit 64k", 26_200),
        ("interface eth0 tbf rate 1gbit burst 500000 limit 2621440", 17_000),
        (
            "interface eth0 tbf rate 2mbit burst 16k latency 40ms peakrate 4mbit mtu 1600",
            40_000,
        ),
    ]:
        result = compile_policy("<text>", loader=lambda _: text)  # noqa: B023
        assert result.policy is not None, result.diagnostics
        root = result.policy.interfaces[0].root
        assert isinstance(root, ir.Tbf)
        assert tbf_shown_latency(root) == lat, text


def test_expected_keys_merge_like_tc() -> None:
    words = (
        ("ip", "protocol", "6", "0xff"),
        ("u8", "0x05", "0x0f", "at", "0"),
        ("u16", "0x0000", "0xffc0", "at", "2"),
        ("u8", "0x10", "0xff", "at", "33"),
        ("ip", "tos", "0x14", "0xff"),
        ("ip", "dport", "5001", "0xffff"),
        ("ip", "sport", "3072", "0xfc00"),
        ("ip", "src", "10.0.0.0/8"),
        ("ip", "dst", "0.0.0.0/0"),
    )
    assert expected_keys(words) == (
        (0x00060000, 0x00FF0000, 8),
        (0x05140000, 0x0FFFFFC0, 0),
        (0x00100000, 0x00FF0000, 32),
        (0x0C001389, 0xFC00FFFF, 20),
        (0x0A000000, 0xFF000000, 12),
        (0, 0, 16),
    )
    with pytest.raises(expect.UnpackableKey):
        expected_keys((("ip", "src", "10.0.0.1"), ("ip", "src", "10.0.0.2")))


# ==== tc's lines, as iproute2 6.1 prints them ==================================================

QDISC_LINES = [
    pytest.param(
        "qdisc htb 1: root refcnt 3 r2q 5 default 0x70 direct_packets_stat 0 ver 3.17 "
        "direct_qlen 1000",
        {"r2q": 5, "default": 0x70, "direct_packets_stat": 0, "direct_qlen": 1000},
        id="htb",
    ),
    pytest.param(
        "qdisc tbf 1: root refcnt 3 rate 220Kbit burst 1539b/1 mpu 0b lat 50ms linklayer ethernet ",
        {
            "rate": 220_000,
            "burst": 1539,
            "mpu": 0,
            "lat": 50_000,
            "linklayer": "ethernet",
        },
        id="tbf",
    ),
    pytest.param(
        "qdisc tbf 1: root refcnt 3 rate 2Mbit burst 16Kb/1 mpu 0b peakrate 4Mbit "
        "mtu 1600b/1 mpu 0b lat 40ms linklayer ethernet ",
        {
            "rate": 2_000_000,
            "burst": 16384,
            "mpu": 0,
            "peakrate": 4_000_000,
            "mtu": 1600,
            "lat": 40_000,
            "linklayer": "ethernet",
        },
        id="tbf-peakrate",
    ),
    pytest.param(
        "qdisc prio 1: root refcnt 2 bands 4 priomap 3 2 1 0 1 2 0 0 1 1 1 1 1 1 1 1",
        {"bands": 4, "priomap": (3, 2, 1, 0, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)},
        id="prio",
    ),
    pytest.param(
        "qdisc pfifo_fast 1: root refcnt 2 bands 3 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1",
        {"bands": 3, "priomap": expect.DEFAULT_PRIOMAP},
        id="pfifo_fast",
    ),
    pytest.param(
        "qdisc sfq 10: parent 1:1 limit 100p quantum 3000b depth 50 flows 100 divisor 512 "
        "perturb 10sec ",
        {
            "limit": 100,
            "quantum": 3000,
            "depth": 50,
            "flows": 100,
            "divisor": 512,
            "perturb": 10,
        },
        id="sfq",
    ),
    pytest.param(
        "qdisc sfq 10: parent 1:10 limit 127p quantum 1514b depth 127 flows 128 divisor 1024 ",
        {"limit": 127, "quantum": 1514, "depth": 127, "flows": 128, "divisor": 1024},
        id="sfq-defaults",
    ),
    pytest.param(
        "qdisc fq_codel 30: parent 1:3 limit 2000p flows 512 quantum 300 target 3ms "
        "interval 70ms memory_limit 4Mb drop_batch 64 ",
        {
            "limit": 2000,
            "flows": 512,
            "quantum": 300,
            "target": 3000,
            "interval": 70_000,
            "memory_limit": 4 * 1024 * 1024,
            "drop_batch": 64,
        },
        id="fq_codel-noecn",
    ),
    pytest.param(
        "qdisc fq_codel 40: parent 1:4 limit 10240p flows 1024 quantum 1514 target 5ms "
        "interval 100ms memory_limit 32Mb ecn drop_batch 64 ",
        {
            "limit": 10240,
            "flows": 1024,
            "quantum": 1514,
            "target": 5000,
            "interval": 100_000,
            "memory_limit": 32 * 1024 * 1024,
            "ecn": True,
            "drop_batch": 64,
        },
        id="fq_codel",
    ),
    pytest.param(
        "qdisc netem 20: parent 1:2 limit 500 delay 20ms  5ms loss 1.5% duplicate 0.333333% "
        "corrupt 0.1% rate 1Mbit",
        {
            "limit": 500,
            "delay": 20_000,
            "jitter": 5_000,
            "loss": 1.5,
            "duplicate": 0.333333,
            "corrupt": 0.1,
            "rate": 1_000_000,
        },
        id="netem",
    ),
    pytest.param(
        "qdisc netem 1: root refcnt 2 limit 1000 delay 1.5s  123ms loss 0.00100001%",
        {"limit": 1000, "delay": 1_500_000, "jitter": 123_000, "loss": 0.00100001},
        id="netem-seconds",
    ),
    pytest.param(
        "qdisc netem 1: root refcnt 2 limit 1000 delay 10ms  2ms 25% loss 0.3% 25% ecn gap 5",
        {
            "limit": 1000,
            "delay": 10_000,
            "jitter": 2_000,
            "delay_correlation": 25.0,
            "loss": 0.3,
            "loss_correlation": 25.0,
            "ecn": True,
            "gap": 5,
        },
        id="netem-correlations",  # the format of q_netem.c's print_corr, not seen on a kernel
    ),
    pytest.param("qdisc pfifo 70: parent 1:70 limit 20p", {"limit": 20}, id="pfifo"),
    pytest.param(
        "qdisc bfifo 5: dev a1 root refcnt 3 limit 64Kb", {"limit": 65536}, id="bfifo-dev"
    ),
]


@pytest.mark.parametrize(("line", "options"), QDISC_LINES)
def test_qdisc_options(line: str, options: dict[str, object]) -> None:
    (q,) = parse_qdiscs(line)
    assert {k: v.value for k, v in q.options.items()} == options


def test_qdisc_header() -> None:
    qdiscs = parse_qdiscs(
        "qdisc htb 1: root refcnt 3 r2q 10 default 0 direct_packets_stat 3\n"
        "qdisc pfifo 10: parent 1:10 limit 20p\n"
        "qdisc noqueue 0: dev tv0p root refcnt 2 \n"
        "garbage\n"
    )
    assert [(q.kind, q.handle, q.parent) for q in qdiscs] == [
        ("htb", "1:", "root"),
        ("pfifo", "10:", "1:10"),
        ("noqueue", "0:", "root"),
    ]
    assert qdiscs[0].opt("default") == "0"


def test_class_lines() -> None:
    classes = readback.parse_classes(
        "class htb 1:10 parent 1:1 leaf 10: prio 2 quantum 3000 rate 3333Kbit ceil 8Mbit "
        "linklayer ethernet burst 15Kb/1 mpu 0b cburst 1600b/1 mpu 0b level 0 \n"
        "class htb 1:1 root rate 100Mbit ceil 100Mbit linklayer ethernet burst 1600b/1 mpu 0b "
        "cburst 1600b/1 mpu 0b level 7 \n"
        "class prio 1:1 parent 1: leaf 10: \n"
        "class netem 20:1 parent 20: leaf 21: \n"
        "class tbf 21:1 parent 21: \n"
    )
    leaf, inner, band, netem, tbf = classes
    assert (leaf.classid, leaf.parent, leaf.leaf) == ("1:10", "1:1", "10:")
    assert {k: v.value for k, v in leaf.options.items()} == {
        "prio": 2,
        "quantum": 3000,
        "rate": 3_333_000,
        "ceil": 8_000_000,
        "linklayer": "ethernet",
        "burst": 15 * 1024,
        "cburst": 1600,
        "level": 0,
    }
    assert (inner.parent, inner.leaf, inner.options["level"].value) == ("root", None, 7)
    assert "prio" not in inner.options  # tc shows prio and quantum of leaf classes only
    assert (band.kind, band.parent, band.leaf) == ("prio", "1:", "10:")
    assert (netem.leaf, tbf.leaf) == ("21:", None)


def test_filter_lines() -> None:
    text = (
        "filter parent 1: protocol ip pref 1 u32 chain 0 \n"
        "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 \n"
        "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 "
        "bkt 0 *flowid 1:10 not_in_hw \n"
        "  match 00001389/0000ffff at 20\n"
        "  match 0a000000/ff000000 at 12\n"
        "filter protocol ip pref 1 fw chain 0 \n"
        "filter protocol ip pref 1 fw chain 0 handle 0xa classid 1:1 \n"
        "filter protocol ip pref 1 fw chain 0 handle 0x20/0xff classid 1:2 \n"
        "filter protocol all pref 49152 matchall chain 0 \n"
        "filter protocol all pref 49152 matchall chain 0 handle 0x1 \n"
        "  not_in_hw\n"
    )
    u32, fw1, fw2, other = parse_filters(text)
    assert u32 == TcFilter(
        "u32", "ip", 1, "1:10", ((0x1389, 0xFFFF, 20), (0x0A000000, 0xFF000000, 12))
    )
    assert u32.node == 0x800
    assert fw1 == TcFilter("fw", "ip", 1, "1:1", mark=10)
    assert (fw2.mark, fw2.mask) == (0x20, 0xFF)
    assert (other.kind, other.protocol, other.pref) == ("matchall", "all", 49152)


IPV6_U32 = """\
filter parent 1: protocol ipv6 pref 2 u32 chain 0 
filter parent 1: protocol ipv6 pref 2 u32 chain 0 fh 800: ht divisor 1 
filter parent 1: protocol ipv6 pref 2 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:1 not_in_hw 
  match 20010db8/ffffffff at 8
  match 00000000/ffffffff at 12
  match 000001bb/0000ffff at 40
  match 00000600/0000ff00 at 4
  match 0b800000/0fc00000 at 0
"""  # noqa: W291, E501
"""The host kernel (6.18, iproute2 6.1) for ``protocol ipv6 pref 2 u32 match ip6 src
2001:db8::/64 match ip6 dport 443 0xffff match ip6 protocol 6 0xff match ip6 priority 0xb8
0xfc flowid 1:1`` (research notes of issue 11)."""


def test_ipv6_u32_keys_pack_like_tc() -> None:
    """ip6 words as tc packs them (each printed by the host kernel): an address in one key a
    32-bit word its prefix reaches, the traffic class in bits 4-11 of the first word, the next
    header at byte 6, ports 40 bytes in; keys in one word merged."""
    (f,) = parse_filters(IPV6_U32)
    assert (f.kind, f.protocol, f.pref, f.flowid) == ("u32", "ipv6", 2, "1:1")
    words = (
        ("ip6", "src", "2001:db8::/64"),
        ("ip6", "dport", "443", "0xffff"),
        ("ip6", "protocol", "6", "0xff"),
        ("ip6", "priority", "0xb8", "0xfc"),
    )
    assert expected_keys(words) == f.keys
    assert expected_keys(
        (("ip6", "sport", "1024", "0xffff"), ("ip6", "dport", "443", "0xffff"))
    ) == ((0x040001BB, 0xFFFFFFFF, 40),)
    assert expected_keys((("ip6", "dst", "2001:db8:1:2:3:4:5:6/100"), ("ip6", "src", "::/0"))) == (
        (0x20010DB8, 0xFFFFFFFF, 24),
        (0x00010002, 0xFFFFFFFF, 28),
        (0x00030004, 0xFFFFFFFF, 32),
        (0x00000000, 0xF0000000, 36),
    )
    assert expected_keys((("ip6", "dst", "2001:db8::1"),))[-1] == (1, 0xFFFFFFFF, 36)
    assert expected_keys((("u8", "0x10", "0xff", "at", "53"),)) == ((0x100000, 0xFF0000, 52),)
    # ip6 icmp_code's key is relative to the next header: kept, and told apart from "at 40"
    (code,) = parse_filters(
        IPV6_U32.replace(
            "  match 0b800000/0fc00000 at 0", "  match 00000000/00ff0000 at nexthdr+40"
        )
    )
    assert code.keys[-1] == (0, 0xFF0000, readback.NEXTHDR + 40)
    assert expect.describe_keys(code.keys[-1:]) == "match 00000000/00ff0000 at nexthdr+40"
    with pytest.raises(expect.UnpackableKey):
        expected_keys((("ip6", "src", "2001:db8::1"), ("ip6", "src", "2001:db8::2")))


FLOWER = """\
filter protocol ip pref 1 flower chain 0 
filter protocol ip pref 1 flower chain 0 handle 0x1 classid 1:3 
  eth_type ipv4
  ip_proto tcp
  tcp_flags 0x10/17
  not_in_hw
filter protocol ip pref 1 flower chain 0 handle 0x2 classid 1:4 
  eth_type ipv4
  ip_proto 2f
  not_in_hw
filter protocol ip pref 1 flower chain 0 handle 0x3 classid 1:5 
  eth_type ipv4
  ip_proto tcp
  dst_port 1-1023
  not_in_hw
filter protocol ip pref 1 flower chain 0 handle 0x4 classid 1:6 
  eth_type ipv4
  ip_proto tcp
  ip_tos 16
  dst_ip 10.0.0.0/8
  not_in_hw
\taction order 1:  police 0x1 rate 1Mbit burst 10Kb mtu 2Kb action drop overhead 0b 
\tref 1 bind 1 

filter protocol ipv6 pref 32769 flower chain 0 
filter protocol ipv6 pref 32769 flower chain 0 handle 0x1 classid 1:1 
  eth_type ipv6
  ip_proto tcp
  ip_tos 184/0xfc
  dst_ip 2001:db8::/64
  src_ip 2001:db8::1
  dst_port 443
  not_in_hw
filter protocol ipv6 pref 32769 flower chain 0 handle 0x2 classid 1:2 
  eth_type ipv6
  ip_proto udp
  dst_port 53
  src_port 1024/0xfc00
  ip_ttl 1
  not_in_hw
"""  # noqa: W291
"""Debian's 6.1 in user-mode Linux (iproute2 6.1), for ``flower ip_proto tcp tcp_flags
0x10/0x17``, ``ip_proto 0x2f``, ``dst_port 1-1023``, ``ip_tos 0x10 dst_ip 10.0.0.0/8 action
police ...``, ``ip_proto tcp dst_ip 2001:db8::/64 src_ip 2001:db8::1 dst_port 443 ip_tos
0xb8/0xfc`` and ``ip_proto udp src_port 1024/0xfc00 dst_port 53 ip_ttl 1``."""


def test_flower_filter_lines() -> None:
    """flower prints one key a line: ip_tos in decimal with a 0x mask, tcp_flags in hex with a
    mask without 0x, a number protocol in hex, a host without /128; read back normalised."""
    flags, gre, ports, policed, web, dns = parse_filters(FLOWER)
    assert (flags.kind, flags.protocol, flags.pref, flags.flowid) == ("flower", "ip", 1, "1:3")
    assert flags.flower == readback.FlowerMatch("ipv4", 6, tcp_flags=(0x10, 0x17))
    assert gre.flower == readback.FlowerMatch("ipv4", 47)
    assert ports.flower == readback.FlowerMatch("ipv4", 6, dport=(1, 1023))
    assert policed.flower == readback.FlowerMatch("ipv4", 6, dst="10.0.0.0/8", tos=(16, 0xFF))
    assert policed.actions == (("police", 1_000_000, 10240, 2048, "drop"),)
    assert (web.protocol, web.pref, web.flowid) == ("ipv6", 32769, "1:1")
    assert web.flower == readback.FlowerMatch(
        "ipv6", 6, "2001:db8::1/128", "2001:db8::/64", dport=(443, 443), tos=(0xB8, 0xFC)
    )
    # a masked port is the range it spans; a key not modelled (ip_ttl) is kept, to differ
    assert dns.flower == readback.FlowerMatch(
        "ipv6", 17, sport=(1024, 2047), dport=(53, 53), other=("ip_ttl 1",)
    )
    # messages spell a match as tc prints it
    assert web.flower is not None and web.flower.describe() == (
        "eth_type ipv6 ip_proto tcp ip_tos 184/0xfc dst_ip 2001:db8::/64 src_ip 2001:db8::1 "
        "dst_port 443"
    )
    assert gre.flower is not None and gre.flower.describe() == "eth_type ipv4 ip_proto 2f"
    assert flags.flower is not None and flags.flower.describe().endswith("tcp_flags 0x10/17")


# ==== iptables-save ============================================================================

IPTABLES_LEGACY = """\
# Generated by iptables-save v1.8.9 on Sun Nov 22 01:13:26 2026
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:INSHAPER - [0:0]
-A PREROUTING -i eth1 -j INSHAPER
-A INSHAPER -p tcp -m tcp --dport 5001 -m mark --mark 0x0 -j MARK --set-xmark 0xa/0xffffffff
-A INSHAPER -p ipip -m dscp --dscp 0x2e -m mark --mark 0x0 -j MARK --set-xmark 0xb/0xffffffff
-A INSHAPER -p ipencap -m tos --tos 0x10/0x1e -m mark --mark 0x0 -j MARK --set-xmark 0xc/0xffffffff
COMMIT
*filter
:INPUT ACCEPT [0:0]
-A INPUT -j DROP
COMMIT
"""
"""iptables 1.8.9 (legacy) in the UML guest, from ``-p 94``, ``-p 4`` and ``--set-mark``."""

IPTABLES_NFT_RULES = [
    "-A INSHAPER -s 10.0.0.1/32 -p udp -m udp --sport 1000:2000 -m mark --mark 0x0 -j MARK "
    "--set-xmark 0x28/0xffffffff",
    "-A INSHAPER -p gre -m tos --tos 0x10/0xff -m mark --mark 0x0 -j MARK "
    "--set-xmark 0x29/0xffffffff",
    "-A INSHAPER -p 200 -m mark --mark 0x0 -j MARK --set-xmark 0x2b/0xffffffff",
]
"""iptables 1.8.9 (nf_tables) on the host, from ``-s 10.0.0.1 -d 0.0.0.0/0 -p udp --sport
1000:2000``, ``-p 47`` and ``-p 200``."""


def test_iptables_save() -> None:
    state = parse_iptables_save(IPTABLES_LEGACY)
    assert list(state.chains) == ["PREROUTING", "INPUT", "INSHAPER"]  # the mangle table only
    (jump,) = state.chains["PREROUTING"]
    assert jump == IptRule("PREROUTING", in_iface="eth1", target="INSHAPER")
    tcp, ipip, tos = state.chains["INSHAPER"]
    mark = dict(mark=(0, 0xFFFFFFFF), target="MARK")
    assert tcp == IptRule(
        "INSHAPER", protocol=6, dport=(5001, 5001), set_mark=(10, 0xFFFFFFFF), **mark
    )
    assert ipip == IptRule("INSHAPER", protocol=94, dscp=46, set_mark=(11, 0xFFFFFFFF), **mark)
    assert tos.protocol == 4 and tos.tos == (0x10, 0x1E)


IP6TABLES_LEGACY = """\
# Generated by ip6tables-save v1.8.9 on Wed Nov 25 03:22:00 2026
*mangle
:PREROUTING ACCEPT [0:0]
:X - [0:0]
-A PREROUTING -i a1 -j X
-A X -s 2001:db8::1/128 -p tcp -m tcp --dport 443 -m mark --mark 0x0 -j MARK --set-xmark 0x5/0xffffffff
-A X -d 2001:db8::/32 -p ipv6-icmp -m mark --mark 0x0 -j MARK --set-xmark 0x6/0xffffffff
-A X -s ::/0 -m mark --mark 0x5 -j DSCP --set-dscp 0x0a
COMMIT
"""  # noqa: E501
"""ip6tables 1.8.9 (legacy) in the UML guest (``-s 2001:db8::1``, ``-p icmpv6``)."""


def test_ip6tables_save() -> None:
    state = parse_iptables_save(IP6TABLES_LEGACY)
    mark = dict(mark=(0, 0xFFFFFFFF), target="MARK")
    web, icmp, dscp = state.chains["X"]
    assert web == IptRule(
        "X", src="2001:db8::1/128", protocol=6, dport=(443, 443), set_mark=(5, 0xFFFFFFFF), **mark
    )
    assert icmp == IptRule("X", dst="2001:db8::/32", protocol=58, set_mark=(6, 0xFFFFFFFF), **mark)
    assert dscp == IptRule("X", mark=(5, 0xFFFFFFFF), target="DSCP", set_dscp=10)
    assert readback.KernelState(ip6tables=state).table("ipv6") is state


def test_iptables_spellings_compare_equal() -> None:
    """A rule as the script writes it and as iptables-save prints it is the same rule."""
    written = [
        "-A INSHAPER -s 10.0.0.1 -d 0.0.0.0/0 -p udp --sport 1000:2000 -m mark --mark 0 "
        "-j MARK --set-mark 40",
        "-A INSHAPER -p 47 -m tos --tos 0x10/0xff -m mark --mark 0 -j MARK --set-mark 41",
        "-A INSHAPER -p 200 -m mark --mark 0 -j MARK --set-mark 43",
    ]
    for script, saved in zip(written, IPTABLES_NFT_RULES, strict=True):
        assert readback.parse_rule(script.split()) == readback.parse_rule(saved.split())
    negated = readback.parse_rule(shlex.split("-A X ! -s 10.0.0.1 -j MARK --set-mark 1"))
    plain = readback.parse_rule(shlex.split("-A X -s 10.0.0.1 -j MARK --set-mark 1"))
    assert negated.other == ("!",) and negated != plain


# ==== expected objects carry their policy text ==================================================


def test_expected_objects_carry_labels_and_spans() -> None:
    result = _compile("policies/office.tcp")
    assert result.policy is not None
    (eth0,) = expected_policy(result.policy, result.sources).interfaces
    root = eth0.qdiscs[0]
    assert (root.label, root.kind, root.handle, str(root.span)) == (
        "htb qdisc of eth0",
        "htb",
        "1:",
        "policies/office.tcp:4:16",
    )
    wants = {w.key: (w.value, w.policy, str(w.span)) for w in root.wants}
    assert wants["default"] == (0x70, "bulk (0x70)", "policies/office.tcp:4:49")
    voip = next(c for c in eth0.classes if c.label == "class 'voip'")
    values = {w.key: (w.value, w.policy, str(w.span)) for w in voip.wants}
    assert values["rate"] == (6_000_000, "6mbit", "policies/office.tcp:10:28")
    assert values["ceil"] == (6_000_000, "6mbit, its rate", "policies/office.tcp:10:28")
    assert values["prio"] == (0, "0", "policies/office.tcp:10:21")
    sfq = next(q for q in eth0.qdiscs if q.kind == "sfq")
    assert (sfq.label, str(sfq.span)) == ("sfq qdisc of 1:10", "policies/office.tcp:8:9")
    labels = [(f.label, f.protocol, str(f.span)) for f in eth0.filters]
    # every line has filters in both families (IPv6 ones 0x8000 prefs later); ICMP is IPv4's,
    # ICMPv6 IPv6's; a port on IPv6 needs its protocol (TCP, then UDP); src 10.3.34.11 is IPv4
    assert labels[:7] == [
        ("IPv4 filter to 1:10 (pref 1)", "ip", "policies/office.tcp:6:9"),
        ("IPv6 filter to 1:10 (pref 32769)", "ipv6", "policies/office.tcp:6:9"),
        ("IPv4 filter to 1:10 (pref 1)", "ip", "policies/office.tcp:7:9"),
        ("IPv6 filter to 1:10 (pref 32769)", "ipv6", "policies/office.tcp:7:9"),
        ("IPv4 filter to 1:20 (pref 1)", "ip", "policies/office.tcp:10:34"),
        ("IPv6 filter to 1:20 (pref 32769)", "ipv6", "policies/office.tcp:10:34"),
        ("IPv6 filter to 1:20 (pref 32769)", "ipv6", "policies/office.tcp:10:34"),
    ]
    assert labels[-1] == ("IPv4 filter to 1:60 (pref 1)", "ip", "policies/office.tcp:17:41")
    assert [f.keys for f in eth0.filters[5:7]] == [
        ((0x600, 0xFF00, 4), (5001, 0xFFFF, 40)),
        ((0x1100, 0xFF00, 4), (5001, 0xFFFF, 40)),
    ]


def test_expected_chain_of_a_marking_policy() -> None:
    result = _compile("policies/seeds/s000-10.1-marks.tcp")
    assert result.policy is not None
    (eth0,) = expected_policy(result.policy).interfaces
    assert eth0.chain is not None
    assert eth0.chain.jump.rule == IptRule("PREROUTING", in_iface="eth1", target="INSHAPER")
    assert [(r.label, str(r.span)) for r in eth0.chain.rules] == [
        ("mark rule for 'app5001'", "policies/seeds/s000-10.1-marks.tcp:29:48"),
        ("mark rule for 'app5002'", "policies/seeds/s000-10.1-marks.tcp:32:48"),
        ("mark rule for unmarked traffic", "policies/seeds/s000-10.1-marks.tcp:27:52"),
    ]
    assert [c.family for c in eth0.chains] == ["ipv4"]  # the seed says 'family ipv4'


def test_constants_are_quoted_as_written() -> None:
    result = _compile("policies/seeds/s004-tos-htb.tcp")
    assert result.policy is not None
    (eth0,) = expected_policy(result.policy, result.sources).interfaces
    paid = next(c for c in eth0.classes if c.label == "class 'paid'")
    ceil = next(w for w in paid.wants if w.key == "ceil")
    assert ceil.policy == "PAID_CEIL (10800kbit)"


# ==== comparing captured kernel output with the policy ==========================================


def _captured(name: str, kernel: str = "uml") -> dict[str, runner.Section]:
    return runner.sections((DATA / f"{name}.{kernel}.out").read_text(encoding="utf-8"))


def _state(found: dict[str, runner.Section], result: Result) -> readback.KernelState:
    assert result.policy is not None
    return runner.read_state(found, [i.name for i in result.policy.interfaces])


def _tamper(found: dict[str, runner.Section], name: str, old: str, new: str) -> None:
    section = found[name]
    assert old in section.text, f"{old!r} not in {name}"
    found[name] = runner.Section(section.text.replace(old, new), section.status)


LEAF_QDISCS = "tests/apply_policies/leaf-qdiscs.tcp"
MARKS = "policies/seeds/s000-10.1-marks.tcp"


@pytest.mark.parametrize("name", [LEAF_QDISCS, MARKS])
def test_captured_kernel_state_agrees_with_its_policy(name: str) -> None:
    result = _compile(name)
    assert result.policy is not None
    found = _captured(Path(name).stem)
    expected = expected_policy(result.policy, result.sources)
    assert compare.compare_state(expected, _state(found, result)) == []
    outcome = runner.apply_outcome(found)
    assert outcome is not None and not outcome.failed
    origins = compare.script_origins(result.output or "", expected.spans())
    assert compare.apply_diagnostics(outcome, origins, expected.interfaces[0].span) == []


CHANGED = [
    pytest.param(
        "qdisc 0",
        "target 3ms interval 70ms",
        "target 4ms interval 70ms",
        [
            f"{LEAF_QDISCS}:12:46: error: fq_codel qdisc of 1:3 target is 4ms in the kernel, "
            "policy says 3ms [E402]"
        ],
        id="fq_codel-target",
    ),
    pytest.param(
        "qdisc 0",
        "memory_limit 4Mb drop_batch 64 ",
        "memory_limit 4Mb ecn drop_batch 64 ",
        [
            f"{LEAF_QDISCS}:12:9: error: fq_codel qdisc of 1:3 ecn is on in the kernel, "
            "policy says off (noecn) [E402]"
        ],
        id="fq_codel-ecn",
    ),
    pytest.param(
        "qdisc 0",
        "divisor 512 perturb 10sec",
        "divisor 512",
        [
            f"{LEAF_QDISCS}:5:29: error: sfq qdisc of 1:1 perturb is none in the kernel, "
            "policy says 10 [E402]"
        ],
        id="sfq-perturb",
    ),
    pytest.param(
        "qdisc 0",
        "delay 20ms  5ms loss 1.5%",
        "delay 20ms  5ms 30% loss 1.6%",
        [
            f"{LEAF_QDISCS}:7:52: error: netem qdisc of 1:2 loss is 1.6% in the kernel, "
            "policy says 1.5% [E402]",
            # a correlation the policy does not ask for is a difference too
            f"{LEAF_QDISCS}:7:9: error: netem qdisc of 1:2 delay_correlation is 30% in the "
            "kernel, policy says none [E402]",
        ],
        id="netem-loss",
    ),
    pytest.param(
        "qdisc 0",
        "bands 4 priomap 3 2 1 0",
        "bands 4 priomap 3 2 1 1",
        [
            f"{LEAF_QDISCS}:4:37: error: prio qdisc of eth0 priomap is "
            "3 2 1 1 1 2 0 0 1 1 1 1 1 1 1 1 in the kernel, policy says "
            "3 2 1 0 1 2 0 0 1 1 1 1 1 1 1 1 [E402]"
        ],
        id="prio-priomap",
    ),
    pytest.param(
        "qdisc 0",
        "qdisc tbf 21: parent 20:1 rate 1Gbit",
        "qdisc tbf 22: parent 20:1 rate 1Gbit",
        [
            f"{LEAF_QDISCS}:7:9: error: unexpected tbf qdisc 22: under 20:1 in the kernel [E403]",
            f"{LEAF_QDISCS}:8:13: error: tbf qdisc of 20: is missing in the kernel (expected "
            "tbf 21: under 20:) [E401]",
        ],
        id="tbf-handle",
    ),
    pytest.param(
        "class 0",
        "class prio 1:4 parent 1: leaf 40: \n",
        "",
        [
            f"{LEAF_QDISCS}:14:11: error: class 'plain' is missing in the kernel (expected "
            "prio class 1:4 under 1:) [E401]"
        ],
        id="prio-band",
    ),
]


@pytest.mark.parametrize(("section", "old", "new", "want"), CHANGED)
def test_captured_state_with_one_change(section: str, old: str, new: str, want: list[str]) -> None:
    """A kernel that differs in one value: one diagnostic, at the policy text that says it."""
    result = _compile(LEAF_QDISCS)
    assert result.policy is not None
    found = _captured("leaf-qdiscs")
    _tamper(found, section, old, new)
    problems = compare.compare_state(
        expected_policy(result.policy, result.sources), _state(found, result)
    )
    assert sorted(_lines(problems)) == sorted(want)


def test_captured_marks_with_changes() -> None:
    result = _compile(MARKS)
    assert result.policy is not None
    found = _captured("s000-10.1-marks")
    _tamper(found, "iptables", "--dport 5002", "--dport 5003")
    _tamper(found, "iptables", "-A PREROUTING -i eth1", "-A PREROUTING -i eth2")
    _tamper(found, "filter 0 1:", "handle 0x14 classid 1:20", "handle 0x14 classid 1:30")
    _tamper(found, "class 0", "leaf 30: prio 2", "leaf 30: prio 3")
    problems = compare.compare_state(
        expected_policy(result.policy, result.sources), _state(found, result)
    )
    assert sorted(_lines(problems)) == [
        f"{MARKS}:28:5: error: jump from PREROUTING on eth1 to chain INSHAPER is missing in "
        "the kernel's mangle table [E401]",
        f"{MARKS}:32:11: error: IPv4 fw filter for mark 20 to 1:20 (pref 1) classid is 1:30 in "
        "the kernel, policy says 1:20 [E402]",
        f"{MARKS}:32:48: error: mark rule for 'app5002' dport is 5003 in the kernel, policy "
        "says 5002 [E402]",
        f"{MARKS}:35:45: error: class 'others' prio is 3 in the kernel, policy says 2 [E402]",
    ]


DUAL_U32 = "tests/verify_data/dual-stack-u32.tcp"
DUAL_FLOWER = "tests/verify_data/dual-stack-flower.tcp"
DUAL_MARKS = "tests/verify_data/dual-stack-marks.tcp"
FLOWER_POLICE = "tests/verify_data/flower-police.tcp"
DUAL_STACK = [
    (DUAL_U32, "host"),
    (DUAL_FLOWER, "uml"),
    (DUAL_MARKS, "uml"),
    (FLOWER_POLICE, "uml"),
]
"""Dual-stack policies and the kernel they were captured on: u32 filters of both families on
the host (6.18); flower filters, fw filters of both families, iptables and ip6tables marking
and a policer on IPv6 filters in user-mode Linux (Debian's 6.1)."""


@pytest.mark.parametrize(("name", "kernel"), DUAL_STACK)
def test_captured_dual_stack_state_agrees_with_its_policy(name: str, kernel: str) -> None:
    result = _compile(name)
    assert result.policy is not None
    found = _captured(Path(name).stem, kernel)
    expected = expected_policy(result.policy, result.sources)
    state = _state(found, result)
    assert compare.compare_state(expected, state) == []
    # not vacuous: both families' filters were read back and compared
    protocols = {
        f.protocol for dev in state.devices.values() for fs in dev.filters.values() for f in fs
    }
    assert protocols == {"ip", "ipv6"}
    expected_protocols = {f.protocol for i in expected.interfaces for f in i.filters}
    assert expected_protocols == {"ip", "ipv6"}


def _differences(policy: str, kernel: str, *changes: tuple[str, str, str]) -> list[str]:
    """What verify says of ``policy`` against its state captured on ``kernel``, with each
    (section, old, new) change made to the capture first."""
    result = _compile(policy)
    assert result.policy is not None
    found = _captured(Path(policy).stem, kernel)
    for change in changes:
        _tamper(found, *change)
    expected = expected_policy(result.policy, result.sources)
    return _lines(compare.compare_state(expected, _state(found, result)))


def test_captured_dual_stack_u32_with_changes() -> None:
    problems = _differences(
        DUAL_U32,
        "host",
        ("filter 0 1:", "0b800000/0fc00000 at 0", "0b000000/0fc00000 at 0"),
        (
            "filter 0 1:",
            "protocol ipv6 pref 32769 u32 chain 0 fh 801::812",
            "protocol ip pref 32769 u32 chain 0 fh 801::812",
        ),
        (
            "filter 0 1:",
            "00000080/ffffffff at 36\n  match 00500000",
            "00000081/ffffffff at 36\n  match 00500000",
        ),
    )
    assert problems == [
        f"{DUAL_U32}:8:26: error: IPv6 filter to 1:40 (pref 32769) keys are match "
        "0b000000/0fc00000 at 0 in the kernel, policy says ip6 priority 0xb8 0xfc (match "
        "0b800000/0fc00000 at 0) [E402]",
        *(
            f"{DUAL_U32}:11:27: error: IPv6 filter to 1:70 (pref 32769) keys are match "
            f"0000{p}00/0000ff00 at 4, match 20010db8/ffffffff at 24, match 00000000/ffffffff "
            "at 28, match 00000000/ffffffff at 32, match 00000081/ffffffff at 36, match "
            "00500000/ffff0000 at 40 in the kernel, policy says ip6 protocol "
            f"{int(p, 16)} 0xff ip6 dst 2001:db8::80 ip6 sport 80 0xffff (match "
            f"0000{p}00/0000ff00 at 4, match 20010db8/ffffffff at 24, match 00000000/ffffffff "
            "at 28, match 00000000/ffffffff at 32, match 00000080/ffffffff at 36, match "
            "00500000/ffff0000 at 40) [E402]"
            for p in ("06", "11")
        ),
        f"{DUAL_U32}:10:26: error: IPv6 filter to 1:60 (pref 32769) protocol is ip in the "
        "kernel, policy says ipv6 [E402]",
    ]


def test_captured_dual_stack_flower_with_changes() -> None:
    problems = _differences(
        DUAL_FLOWER,
        "uml",
        ("filter 0 1:", "ip_proto icmpv6", "ip_proto icmp"),
        ("filter 0 1:", "src_port 1024-2047", "src_port 1024-2048"),
        ("filter 0 1:", "handle 0x1 classid 1:70", "handle 0x1 classid 1:80"),
    )
    assert problems == [
        f"{DUAL_FLOWER}:7:26: error: IPv4 filter to 1:30 (pref 5) matches eth_type ipv4 "
        "ip_proto udp dst_ip 192.0.2.0/24 src_port 1024-2048 in the kernel, policy says "
        "eth_type ipv4 ip_proto udp dst_ip 192.0.2.0/24 src_port 1024-2047 [E402]",
        f"{DUAL_FLOWER}:10:27: error: IPv6 filter to 1:60 (pref 32777) matches eth_type ipv6 "
        "ip_proto icmp in the kernel, policy says eth_type ipv6 ip_proto icmpv6 [E402]",
        f"{DUAL_FLOWER}:11:27: error: IPv6 filter to 1:70 (pref 32778) classid is 1:80 in the "
        "kernel, policy says 1:70 [E402]",
    ]


def test_captured_flower_policers_with_changes() -> None:
    """A policer on flower filters reads back as on u32 ones: the line's four filters (TCP and
    UDP, both families) share one police action (ref 4 bind 4), so a changed verdict shows on
    each of them."""
    problems = _differences(
        FLOWER_POLICE,
        "uml",
        ("filter 0 1:", "action drop overhead 0b", "action pass overhead 0b"),
    )
    assert len(problems) == 4
    for family, pref in (("IPv4", 1), ("IPv4", 2), ("IPv6", 32769), ("IPv6", 32770)):
        assert (
            f"{FLOWER_POLICE}:4:26: error: {family} filter to 1:10 (pref {pref}) actions are "
            "police rate 1mbit burst 10k mtu 2k pass in the kernel, policy says police rate "
            "1mbit burst 10k mtu 2k drop [E402]"
        ) in problems


def test_captured_dual_stack_marks_with_changes() -> None:
    problems = _differences(
        DUAL_MARKS,
        "uml",
        ("ip6tables", "-s 2001:db8::/32", "-s 2001:db8::/48"),
        ("ip6tables", "-A PREROUTING -i eth1", "-A PREROUTING -i eth9"),
        ("iptables", "-s 10.0.0.0/8 ", "-s 2001:db8::/32 "),
        (
            "filter 0 1:",
            "protocol ipv6 pref 32769 fw chain 0 handle 0x1e classid 1:30",
            "protocol ipv6 pref 32769 fw chain 0 handle 0x1e classid 1:20",
        ),
        ("filter 1 1:", "police 0x2 rate 1Mbit", "police 0x2 rate 2Mbit"),
        (
            "filter 0 1:",
            "protocol ipv6 pref 32769 fw chain 0 handle 0x14",
            "protocol ip pref 32769 fw chain 0 handle 0x14",
        ),
    )
    assert problems == [
        f"{DUAL_MARKS}:7:11: error: IPv6 fw filter for mark 20 to 1:20 (pref 32769) protocol "
        "is ip in the kernel, policy says ipv6 [E402]",
        f"{DUAL_MARKS}:8:11: error: IPv6 fw filter for mark 30 to 1:30 (pref 32769) classid is "
        "1:20 in the kernel, policy says 1:30 [E402]",
        f"{DUAL_MARKS}:8:26: error: mark rule for 'v4' src is 2001:db8::/32 in the kernel, "
        "policy says 10.0.0.0/8 [E402]",
        f"{DUAL_MARKS}:5:5: error: jump from PREROUTING on eth1 to ip6tables chain TCDSL-eth0 "
        "is missing in the kernel's ip6tables mangle table [E401]",
        f"{DUAL_MARKS}:7:26: error: IPv6 mark rule for 'v6' src is 2001:db8::/48 in the "
        "kernel, policy says 2001:db8::/32 [E402]",
        f"{DUAL_MARKS}:13:26: error: IPv6 filter to 1:10 (pref 32769) actions are police rate "
        "2mbit burst 10k mtu 2k drop in the kernel, policy says police rate 1mbit burst 10k "
        "mtu 2k drop [E402]",
    ]


HTB_TEXT = """\
interface eth0 family ipv4 htb rate 100mbit default voip {
    class voip prio 0 rate 6mbit ceil 8mbit match dport 5001
    class web rate 10mbit match dport 80, 443
}
"""
HTB_KERNEL = """\
class htb 1:1 root rate 100Mbit ceil 100Mbit linklayer ethernet burst 1600b/1 mpu 0b cburst 1600b/1 mpu 0b level 7
class htb 1:10 parent 1:1 prio 0 quantum 75000 rate 6Mbit ceil 6Mbit linklayer ethernet burst 1599b/1 mpu 0b cburst 1599b/1 mpu 0b level 0
class htb 1:20 parent 1:1 prio 0 quantum 125000 rate 10Mbit ceil 10Mbit linklayer ethernet burst 1600b/1 mpu 0b cburst 1600b/1 mpu 0b level 0
"""  # noqa: E501
HTB_QDISC = "qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000"
HTB_FILTERS = """\
filter protocol ip pref 1 u32 chain 0
filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1
filter protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:10 not_in_hw
  match 00001389/0000ffff at 20
filter protocol ip pref 1 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 *flowid 1:20 not_in_hw
  match 000001bb/0000ffff at 20
filter protocol ip pref 1 u32 chain 0 fh 800::802 order 2050 key ht 800 bkt 0 *flowid 1:20 not_in_hw
  match 00000050/0000ffff at 20
filter protocol ip pref 1 u32 chain 0 fh 800::803 order 2051 key ht 800 bkt 0 *flowid 1:30 not_in_hw
  match 00000016/0000ffff at 20
"""


def test_wrong_kernel_state_reports_at_the_policy_line(tmp_path: Path) -> None:
    """The issue's example: a class whose ceil differs; plus filters out of order, a stray one."""
    path = _write(tmp_path, HTB_TEXT)
    result = _compile(path)
    assert result.policy is not None
    dev = readback.DeviceState(
        "eth0",
        parse_qdiscs(HTB_QDISC),
        readback.parse_classes(HTB_KERNEL),
        {"1:": parse_filters(HTB_FILTERS)},
    )
    problems = compare.compare_state(
        expected_policy(result.policy, result.sources), readback.KernelState({"eth0": dev})
    )
    assert render(sorted(problems, key=lambda d: (d.span.line, d.span.column)), result.sources) == (
        f"{path}:1:28: error: unexpected u32 filter under 1: in the kernel: pref 1, "
        "match 00000016/0000ffff at 20, flowid 1:30 [E403]\n"
        " 1 | interface eth0 family ipv4 htb rate 100mbit default voip {\n"
        "   |                            ^~~\n"
        f"{path}:2:39: error: class 'voip' ceil is 6Mbit in the kernel, policy says 8mbit [E402]\n"
        " 2 |     class voip prio 0 rate 6mbit ceil 8mbit match dport 5001\n"
        "   |                                       ^~~~~\n"
        f"{path}:3:27: error: IPv4 filter to 1:20 (pref 1) for ip dport 443 0xffff comes 2nd of "
        "the pref 1 filters under 1: in the kernel, policy puts it 3rd (the first match wins) "
        "[E402]\n"
        " 3 |     class web rate 10mbit match dport 80, 443\n"
        "   |                           ^~~~~~~~~~~~~~~~~~~\n"
    )


def test_keys_tcdsl_never_writes_are_drift(tmp_path: Path) -> None:
    """A node tcdsl made that also tests the firewall mark, or reads its keys past the IP
    header (both added by hand, or by another tool), takes other packets than the line."""
    path = _write(tmp_path, HTB_TEXT)
    result = _compile(path)
    assert result.policy is not None
    head = "*flowid 1:10 not_in_hw\n"
    marked = HTB_FILTERS.replace(head, head + "  mark 0x0007 0x00ff (success 0)\n")
    key = "match 00000050/0000ffff at 20\n"  # web's port 80
    moved = marked.replace(key, key + "    offset plus 4 \n")

    def problems(filters: str) -> list[str]:
        dev = readback.DeviceState(
            "eth0",
            parse_qdiscs(HTB_QDISC),
            readback.parse_classes(HTB_KERNEL),
            {"1:": parse_filters(filters)},
        )
        expected = expected_policy(result.policy, result.sources)  # type: ignore[arg-type]
        found = compare.compare_state(expected, readback.KernelState({"eth0": dev}))
        return [f"{d.span.line}: {d.message}" for d in found]

    before = problems(HTB_FILTERS)
    assert not any("mark" in p or "offset" in p for p in before), before
    after = problems(moved)
    added = [p for p in after if p not in before]
    assert added == [
        "2: IPv4 filter to 1:10 (pref 1) also matches mark 0x7/0xff in the kernel, policy says "
        "ip dport 5001 0xffff alone",
        "3: IPv4 filter to 1:20 (pref 1) reads its keys at 'offset plus 4' in the kernel, "
        "policy says from the IP header",
    ], after


# ==== the script's failures, mapped back through its comments ==================================


def test_script_origins_map_commands_to_policy_text() -> None:
    result = _compile("policies/office.tcp")
    assert result.policy is not None and result.output is not None
    expected = expected_policy(result.policy)
    origins = compare.script_origins(result.output, expected.spans())
    assert len(origins) == 1 + 8 + 3 + 15  # root, classes, leaf qdiscs, filters (8 IPv6)
    first = origins[0]
    assert (first.words, first.what) == (
        "tc qdisc add dev eth0 root handle 1: htb default 70 r2q 100",
        "interface eth0: htb qdisc",
    )
    # The span is the policy's own (its full width), not just the comment's point.
    assert (first.span.line, first.span.column, first.span.end_column) == (4, 16, 19)
    assert origins[-1].what == "filter to 1:60" and origins[-1].span.line == 17


def test_failure_and_warning_are_reported_at_their_commands() -> None:
    """The stderr of a real failing run (sch_sfq missing), as ``sh -x`` interleaves it."""
    result = _compile("policies/office.tcp")
    assert result.policy is not None and result.output is not None
    expected = expected_policy(result.policy)
    origins = compare.script_origins(result.output, expected.spans())
    stderr = (
        "+tcdsl+ set -eu\n"
        "+tcdsl+ tc qdisc del dev eth0 root\n"
        "+tcdsl+ true\n"
        "+tcdsl+ tc qdisc add dev eth0 root handle 1: htb default 70 r2q 100\n"
        "+tcdsl+ tc class add dev eth0 parent 1: classid 1:1 htb rate 100mbit\n"
        "Warning: sch_htb: quantum of class 10001 is big. Consider r2q change.\n"
        "+tcdsl+ tc qdisc add dev eth0 parent 1:10 handle 10: sfq perturb 10\n"
        "Error: Specified qdisc kind is unknown.\n"
    )
    found = runner.sections(
        f"@@tcdsl@@ begin apply-stdout\n\n@@tcdsl@@ end apply-stdout 2\n"
        f"@@tcdsl@@ begin apply-stderr\n{stderr}\n@@tcdsl@@ end apply-stderr 2\n"
    )
    outcome = runner.apply_outcome(found)
    assert outcome is not None and outcome.failed and len(outcome.steps) == 6
    problems = compare.apply_diagnostics(outcome, origins, expected.interfaces[0].span)
    assert _lines(problems) == [
        "policies/office.tcp:4:16: warning: tc warned on link class: Warning: sch_htb: quantum "
        "of class 10001 is big. Consider r2q change. [W406]",
        "policies/office.tcp:8:9: error: the kernel lacks the sfq qdisc (sch_sfq); tc said: "
        "Error: Specified qdisc kind is unknown. [E405]",
    ]
    refused = "+tcdsl+ tc class add dev eth0 parent 1:1 classid 1:20 htb rate 6mbit prio 0\n"
    outcome = runner.apply_outcome(
        runner.sections(
            "@@tcdsl@@ begin apply-stdout\n@@tcdsl@@ end apply-stdout 2\n"
            f"@@tcdsl@@ begin apply-stderr\n{refused}RTNETLINK answers: Invalid argument\n"
            "@@tcdsl@@ end apply-stderr 2\n"
        )
    )
    assert outcome is not None
    assert _lines(compare.apply_diagnostics(outcome, origins, expected.interfaces[0].span)) == [
        "policies/office.tcp:10:11: error: tc failed on class voip (exit 2): RTNETLINK answers: "
        "Invalid argument [E404]"
    ]


def test_a_failure_in_the_scripts_batch_form_is_named_by_its_batch_line() -> None:
    """The batch form (verify's for big policies): tc names the failed line of its heredoc
    (``Command failed -:12``), which the script prints; the failure is reported at that
    line's policy text. The stderr is a real failing run's (sch_sfq missing on the host)."""
    result = compile_policy("policies/office.tcp")
    assert result.policy is not None and result.output is not None
    expected = expected_policy(result.policy)
    origins = compare.script_origins(result.output, expected.spans())
    per_command = compare.script_origins(_compile("policies/office.tcp").output or "")
    assert [o.words for o in origins] == [o.words for o in per_command]
    assert [(o.span.line, o.what) for o in origins] == [(o.span.line, o.what) for o in per_command]
    batches = compare.script_batches(result.output)
    batched = [f"tc {line}" for line in batches[0] if not line.startswith("#")]
    assert len(batches) == 1 and batched == [o.command for o in origins][-len(batched) :]
    assert batches[0][11] == "qdisc add dev eth0 parent 1:10 handle 10: sfq perturb 10"

    def run(told: str, status: int, after: str) -> list[str]:
        """What verify says of a run whose batch said ``told`` (traced as dash traces it)."""
        stderr = (
            "+tcdsl+ tc qdisc del dev eth0 root\n+tcdsl+ true\n+tcdsl+ tc -batch -\n"
            f"+tcdsl+ tcdsl_said={told}+tcdsl+ printf %s\\n {told}{told}{after}"
        )
        outcome = runner.apply_outcome(
            runner.sections(
                f"@@tcdsl@@ begin apply-stdout\n\n@@tcdsl@@ end apply-stdout {status}\n"
                f"@@tcdsl@@ begin apply-stderr\n{stderr}\n@@tcdsl@@ end apply-stderr {status}\n"
            )
        )
        assert outcome is not None and outcome.failed == (status != 0)
        verifier._name_shell_batch_steps(outcome, batches)
        return _lines(compare.apply_diagnostics(outcome, origins, expected.interfaces[0].span))

    failed = "+tcdsl+ tcdsl_line=12\n+tcdsl+ exit 1\n+tcdsl+ tcdsl_failed\n"
    told = "Error: Specified qdisc kind is unknown.\nCommand failed -:12\n"
    assert run(told, 1, failed) == [
        "policies/office.tcp:8:9: error: the kernel lacks the sfq qdisc (sch_sfq); tc said: "
        "Error: Specified qdisc kind is unknown. [E405]",
    ]
    # a message of several lines keeps its first (in the trace of the assignment)
    line = batches[0].index("# policies/office.tcp:19:11: class bulk") + 2
    told = 'What is "bogus"?\nUsage: ... class add ...\n       [ classid CLASSID ]\n'
    told += f"Command failed -:{line}\n"
    assert run(told, 1, failed) == [
        'policies/office.tcp:19:11: error: tc failed on class bulk (exit 1): What is "bogus"? '
        "[E404]",
    ]
    # a batch that only warned: at its first line, as tc gives warnings no line
    told = "Warning: sch_htb: quantum of class 10001 is big. Consider r2q change.\n"
    assert run(told, 0, "+tcdsl+ tcdsl_at=\n") == [
        "policies/office.tcp:4:16: warning: tc warned on interface eth0: htb qdisc: Warning: "
        "sch_htb: quantum of class 10001 is big. Consider r2q change. [W406]",
    ]


def test_what_tc_warns_in_a_batch_is_reported(tmp_path: Path) -> None:
    """tc warns of the quantum of r2q 1 (W406) in the per-command form at each command, and
    in a batch (the script's batch form, the tc-batch files) at its first line that makes
    something: a warning has no line number."""
    path = tmp_path / "warn.tcp"
    path.write_text(
        "interface eth0 htb rate 100mbit r2q 1 default a {\n    class a rate 50mbit\n"
        "    class b rate 50mbit match dport 80\n}\n"
    )
    lacks = _host_lacks(path)
    if lacks:
        pytest.skip(lacks)

    def warned(backend: str, batch_from: int) -> list[str]:
        [v] = verifier.verify_many([str(path)], backend, kernel="host", batch_from=batch_from)
        assert v.ok, _lines(v.diagnostics)
        return [
            f"{d.span.line}:{d.span.column} {d.message}" for d in v.diagnostics if d.code == "W406"
        ]

    each = warned("shell", verifier.BATCH_FROM)
    assert [w.split(" tc warned")[0] for w in each] == ["1:16", "2:11", "3:11"], each
    quantum = "Warning: sch_htb: quantum of class 10001 is big. Consider r2q change."
    for backend in ("shell", "tc-batch"):
        [batched] = warned(backend, 1)
        assert batched.startswith(f"1:16 tc warned on interface eth0: htb qdisc: {quantum}")


def test_a_big_policy_is_verified_in_the_scripts_batch_form(no_stray_namespaces: None) -> None:
    """From ``batch_from`` commands on, verify applies the script as it is generated (one tc
    -batch): the kernel agrees, every object located."""
    lacks = _host_lacks(TOS_HTB)
    if lacks:
        pytest.skip(lacks)
    v = verifier.verify_many([TOS_HTB], kernel="host", batch_from=1)[0]
    assert v.ok, _lines(v.diagnostics)
    assert v.script is not None and "tcdsl_batch=$(cat <<'" in v.script
    small = verifier.verify_many([TOS_HTB], kernel="host")[0]
    assert small.ok and small.script is not None and "tc -batch -" not in small.script


TC_FAILURES = [
    # (exit status, stderr) as tc 6.1 printed them in the UML guest (no cbq in its kernel)
    pytest.param(2, "Error: Specified qdisc kind is unknown.\n", "kernel", id="qdisc-unknown"),
    pytest.param(2, "RTNETLINK answers: No such file or directory\n", "kernel", id="rtnetlink"),
    pytest.param(
        2,
        "Error: Parent Qdisc doesn't exists.\nWe have an error talking to the kernel\n",
        "kernel",
        id="filter-parent",
    ),
    pytest.param(
        1,
        'What is "boundd"?\nUsage: ... cbq\tbandwidth BPS rate BPS maxburst PKTS [ avpkt BYTES ]\n',
        "parse",
        id="what-is",
    ),
    pytest.param(
        1,
        'Illegal "r2q"\nUsage: ... qdisc add ... htb [default N] [r2q N]\n',
        "parse",
        id="illegal",
    ),
    pytest.param(1, 'Cannot find device "eth9"\n', "parse", id="no-device"),
    pytest.param(0, "", "ok", id="ok"),
]


@pytest.mark.parametrize(("status", "stderr", "kind"), TC_FAILURES)
def test_classify_tc_failures(status: int, stderr: str, kind: str) -> None:
    assert compare.classify_failure(status, stderr) == kind


def test_classify_iptables_failures() -> None:
    bad = 'iptables v1.8.9 (legacy): unknown option "--dportt"\n'
    assert compare.classify_failure(2, bad, "iptables") == "parse"
    assert compare.classify_failure(1, "iptables: Chain already exists.\n", "iptables") == "kernel"


def test_parse_check_reports_only_parse_errors() -> None:
    result = _compile("policies/seeds/s002-cbq-conditioner.tcp")
    assert result.policy is not None and result.output is not None
    origins = compare.script_origins(result.output, expected_policy(result.policy).spans())
    runs = [
        compare.CommandRun(origins[0].command, 2, "Error: Specified qdisc kind is unknown.\n"),
        compare.CommandRun(origins[1].command, 1, 'What is "boundd"?\nUsage: ... cbq ...\n'),
    ]
    assert _lines(compare.parse_check_diagnostics(runs, origins)) == [
        "policies/seeds/s002-cbq-conditioner.tcp:35:11: error: tc cannot parse the command for "
        'class main: What is "boundd"? [E404]'
    ]


# ==== the case script ==========================================================================


def test_sections() -> None:
    found = runner.sections(
        "noise\n@@tcdsl@@ begin a\nx\ny\n\n@@tcdsl@@ end a 0\n"
        "@@tcdsl@@ begin b\nno newline\n@@tcdsl@@ end b 3\n"
        "@@tcdsl@@ begin c\n\n@@tcdsl@@ end c 1\n"
        "@@tcdsl@@ begin d\ncut short\n"
    )
    assert found == {
        "a": runner.Section("x\ny\n", 0),
        "b": runner.Section("no newline\n", 3),
        "c": runner.Section("", 1),
    }


def test_case_script_is_valid_sh_with_its_script_verbatim() -> None:
    result = _compile("policies/seeds/s000-10.1-marks.tcp")
    assert result.output is not None
    text = runner.case_script("x", result.output, ["eth0", "eth1"], ["eth0"], iptables=True)
    assert result.output in text  # the here-document keeps it byte for byte
    assert "peer name tv0p" in text and "peer name tv1p" in text
    assert runner.peer_names(["tv0p", "eth0"]) == ["tv1p", "tv2p"]
    proc = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    tricky = "echo 'TCDSL_END_OF_FILE'\nTCDSL_END_OF_FILE\n"
    text = runner.case_script("x", tricky, [], [])
    assert tricky in text
    proc = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_case_prelude_names_iptables_legacy_iptables(tmp_path: Path) -> None:
    """Where only ``iptables-legacy`` exists, the case's PATH shim calls it ``iptables``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("iptables-legacy", "iptables-legacy-save"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} "$@"\n', encoding="utf-8")
        (bin_dir / tool).chmod(0o755)
    script = runner.case_script("x", "", [], []).split("tcdsl_section setup")[0]
    script = script.rsplit("(\n", 1)[0] + "iptables -V\niptables-save -t mangle\n"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert "iptables-legacy -V" in proc.stdout, proc.stdout + proc.stderr
    assert "iptables-legacy-save -t mangle" in proc.stdout
    assert not list(tmp_path.glob("tcdsl-verify.*")), "the case's folder is removed"


# ==== real kernels =============================================================================


def _host() -> runner.HostSupport:
    why = runner.host_unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        return runner.host_support()
    except runner.KernelUnavailable as exc:
        pytest.skip(str(exc))


def _host_lacks(path: Path | str) -> str | None:
    result = _compile(path)
    assert result.policy is not None
    expected = expected_policy(result.policy)
    if expected.needs("sch_cbq") is not None:
        return None  # no kernel has cbq: verify reports that and parse-checks the commands
    lacks = _host().lacks(expected.requirements)
    if not lacks:
        return None
    return f"the host kernel lacks {', '.join(r.feature for r in lacks)} (needed by {path})"


@pytest.fixture
def no_stray_namespaces() -> Iterator[None]:
    yield
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    assert f"tcdsl-verify-{os.getpid()}-" not in listed.stdout, listed.stdout


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=[str(p) for p in ALL_POLICIES])
def test_verify_on_host_through_the_cli(policy: Path, no_stray_namespaces: None) -> None:
    lacks = _host_lacks(policy)
    if lacks:
        pytest.skip(lacks)
    got = CliRunner().invoke(cli, ["verify", "--kernel", "host", str(policy)])
    if "cbq" in policy.name:
        assert got.exit_code == 1, got.stderr
        assert "[E405]" in got.stderr and "[E404]" not in got.stderr, got.stderr
        assert "no kernel available has cbq (removed in Linux 6.3)" in got.stderr
        assert got.stderr.count("error:") == 1, got.stderr
        return
    assert got.exit_code == 0, got.stderr
    assert f"tcdsl: {policy}: the kernel agrees (host kernel " in got.stderr
    assert "error:" not in got.stderr


def test_verify_on_host_through_the_api(no_stray_namespaces: None) -> None:
    supported = [str(p) for p in ALL_POLICIES if _host_lacks(p) is None and "cbq" not in p.name]
    if not supported:
        pytest.skip("the host kernel supports none of the policies")
    for v in verifier.verify_many(supported, kernel="host"):
        assert v.ok, render(v.diagnostics, v.sources) + v.output
        assert v.kernel is not None and v.kernel.startswith("host kernel ")
        assert not [d for d in v.diagnostics if d.code != "W406"]
        assert v.checked.qdiscs >= 1


TOS_HTB = "policies/seeds/s004-tos-htb.tcp"


def test_mutated_kernel_state_is_reported_at_the_policy_line(no_stray_namespaces: None) -> None:
    """The script applies; then the state is changed for real; verify names each change."""
    lacks = _host_lacks(TOS_HTB)
    if lacks:
        pytest.skip(lacks)
    tamper = (
        "tc class change dev eth0 parent 1:1 classid 1:10 htb rate 5mbit ceil 10800kbit prio 1\n"
        "tc filter del dev eth0 parent 1: protocol ip prio 1 handle 800::801 u32\n"
        "tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip tos 0x04 0xff "
        "flowid 1:20\n"
        "tc qdisc add dev eth0 parent 1:20 handle 20: pfifo\n"
    )
    v = verifier.verify(TOS_HTB, kernel="host", after=tamper)
    assert v.kernel is not None and not v.ok
    assert _lines(v.diagnostics) == [
        f"{TOS_HTB}:16:28: error: unexpected u32 filter under 1: in the kernel: pref 1, "
        "match 00040000/00ff0000 at 0, flowid 1:20 [E403]",
        f"{TOS_HTB}:17:28: error: class 'paid' rate is 5Mbit in the kernel, policy says "
        "6000kbit (6mbit) [E402]",
        f"{TOS_HTB}:18:11: error: class 'normal' leaf is qdisc 20: in the kernel, policy says "
        "none (the kernel's default) [E402]",
        f"{TOS_HTB}:18:11: error: unexpected pfifo qdisc 20: under 1:20 in the kernel [E403]",
        f"{TOS_HTB}:19:56: error: IPv4 filter to 1:30 (pref 1) is missing in the kernel (match ip "
        "tos 0x08 0xff under 1:) [E401]",
    ]


def test_dual_stack_u32_on_the_host(no_stray_namespaces: None) -> None:
    """u32 filters of both families on the host kernel: the policy agrees; then an IPv6 filter
    is deleted and a stray IPv6 one added, and verify names each by family and line."""
    lacks = _host_lacks(DUAL_U32)
    if lacks:
        pytest.skip(lacks)
    v = verifier.verify(DUAL_U32, kernel="host")
    assert v.ok and not v.diagnostics, render(v.diagnostics, v.sources) + v.output
    assert v.expected is not None
    (eth0,) = v.expected.interfaces
    assert {f.protocol for f in eth0.filters} == {"ip", "ipv6"}
    assert v.checked.filters == len(eth0.filters) == 34
    tamper = (
        "tc filter del dev eth0 parent 1: protocol ipv6 prio 32769 handle 801::810 u32\n"
        "tc filter add dev eth0 parent 1: protocol ipv6 prio 32769 u32 "
        "match ip6 dst 2001:db8::1 flowid 1:20\n"
    )
    v = verifier.verify(DUAL_U32, kernel="host", after=tamper)
    assert _lines(v.diagnostics) == [
        f"{DUAL_U32}:4:16: error: unexpected u32 filter under 1: in the kernel: pref 32769, "
        "match 20010db8/ffffffff at 24, match 00000000/ffffffff at 28, match 00000000/ffffffff "
        "at 32, match 00000001/ffffffff at 36, flowid 1:20 [E403]",
        f"{DUAL_U32}:8:26: error: IPv6 filter to 1:40 (pref 32769) is missing in the kernel "
        "(match ip6 priority 0xb8 0xfc under 1:) [E401]",
    ]


def test_marks_of_both_families_read_back_on_the_host(no_stray_namespaces: None) -> None:
    """The host has no fw classifier, so its kernel cannot verify a marking policy; but its
    iptables and ip6tables (the nf_tables variants here; the guest's are legacy) take the
    marking commands, and what their -save prints agrees with the expected chains."""
    support = _host()
    if not (support.iptables and support.ip6tables):
        pytest.skip("the host has no iptables or no ip6tables")
    from tcdsl.commands import Command, marking_commands

    result = _compile(DUAL_MARKS)
    assert result.policy is not None
    eth0 = result.policy.interfaces[0]
    marking: list[Command] = list(marking_commands(eth0))
    if not any(c.tool == "ip6tables" for c in marking):
        pytest.skip("the shell backend writes no ip6tables commands yet (before issue 11's merge)")
    script = "set -e\n" + "".join(f"{shlex.join((c.tool, *c.args))}\n" for c in marking)
    case = runner.case_script("marks", script, ["eth0", "eth1"], [], iptables=True, ip6tables=True)
    (done,) = runner.run_on_host([runner.Case("marks", case)])
    found = runner.sections(done.stdout)
    outcome = runner.apply_outcome(found)
    assert outcome is not None and not outcome.failed, done.stdout + done.stderr
    state = runner.read_state(found, [])
    (expected, _) = expected_policy(result.policy).interfaces
    assert [c.family for c in expected.chains] == ["ipv4", "ipv6"]
    assert state.iptables is not None and state.ip6tables is not None
    for chain in expected.chains:
        table = state.table(chain.family)
        assert table is not None
        assert list(compare._compare_chain(chain, table)) == [], table.text
    # not vacuous: each table holds its own family's rules only
    assert [r.src for r in state.ip6tables.chains["TCDSL-eth0"]] == [
        None,
        "2001:db8::/32",
        None,
        None,
    ]


def test_flower_on_a_host_without_it(no_stray_namespaces: None) -> None:
    """The host kernel here has no flower: --kernel host says so at 'classifier flower' (auto
    goes to user-mode Linux instead: test_dual_stack_flower_in_user_mode_linux)."""
    support = _host()
    if "flower" in support.filters:
        pytest.skip(f"the host kernel ({support.release}) has flower")
    v = verifier.verify(DUAL_FLOWER, kernel="host")
    assert v.kernel is None
    assert _lines(v.diagnostics) == [
        f"{DUAL_FLOWER}:4:16: error: the host kernel ({support.release}) lacks flower filters "
        "(cls_flower); verify with --kernel uml [E405]"
    ]


def test_a_missing_interface_is_reported_at_its_line(no_stray_namespaces: None) -> None:
    """The script checks its interfaces before changing anything: the device is gone, so it
    stops at once, and verify says so at the interface's line."""
    lacks = _host_lacks(TOS_HTB)
    if lacks:
        pytest.skip(lacks)
    v = verifier.verify(TOS_HTB, kernel="host", before="ip link del eth0")
    assert _lines(v.diagnostics) == [
        f"{TOS_HTB}:16:28: error: the script found no interface eth0 and changed nothing "
        "(exit 1); the script stopped there, so 7 objects of the policy are not checked [E404]"
    ]


def test_tc_parse_errors_are_found_without_a_cbq_kernel(no_stray_namespaces: None) -> None:
    """tc parses every command of the cbq policy; a broken one is an E404 at its line."""
    _host()
    result = _compile("policies/seeds/s002-cbq-conditioner.tcp")
    assert result.policy is not None and result.output is not None
    origins = compare.script_origins(result.output, expected_policy(result.policy).spans())
    commands = runner.commands_of(origins)
    broken = [c.replace(" bounded isolated", " boundd") for c in commands]
    case = runner.case_script("cbq", "", ["shaper0"], [], commands=broken)
    (done,) = runner.run_on_host([runner.Case("cbq", case)])
    runs = runner.command_runs(runner.sections(done.stdout), broken)
    assert len(runs) == len(commands) and all(r.exit_code != 0 for r in runs)
    broken_origins = [
        compare.Origin(b, b, o.span, o.what) for b, o in zip(broken, origins, strict=True)
    ]
    assert _lines(compare.parse_check_diagnostics(runs, broken_origins)) == [
        "policies/seeds/s002-cbq-conditioner.tcp:35:11: error: tc cannot parse the command for "
        'class main: What is "boundd"? [E404]'
    ]


def test_host_without_a_module_reports_e405(tmp_path: Path) -> None:
    support = _host()
    missing = [k for k in ("sfq", "netem", "fq_codel", "prio") if k not in support.qdiscs]
    if not missing:
        pytest.skip("the host kernel has sfq, netem, fq_codel and prio")
    kind = missing[0]
    leaf = {"prio": "prio { class a }"}.get(kind, kind)
    path = _write(
        tmp_path,
        f"interface eth0 htb rate 10mbit default a {{\n    class a rate 1mbit {{ {leaf} }}\n}}\n",
    )
    got = CliRunner().invoke(cli, ["verify", "--kernel", "host", path])
    assert got.exit_code == 1
    assert got.stderr.startswith(
        f"{path}:2:26: error: the host kernel ({support.release}) lacks the {kind} qdisc "
        f"(sch_{kind}); verify with --kernel uml [E405]\n"
    ), got.stderr
    assert f"tcdsl: {path}: not verified (1 error)" in got.stderr


def test_interrupt_removes_the_namespace() -> None:
    """Ctrl-C during a case: the KeyboardInterrupt propagates, the namespace is deleted.

    Python turns SIGINT into KeyboardInterrupt only when it did not start with SIGINT ignored
    (``nohup``, many CI runners): the test installs the handler a terminal's user has.
    """
    _host()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run_on_host([runner.Case("sleep", "sleep 9.75\n")])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    assert f"tcdsl-verify-{os.getpid()}-" not in listed.stdout
    left = subprocess.run(["pgrep", "-f", "sleep 9.75"], capture_output=True, text=True)
    assert left.stdout == "", "the case's processes are killed too"


def test_no_kernel_for_what_the_host_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto, without user-mode Linux: what the host lacks is an E405 naming both reasons."""
    support = _host()
    if "sfq" in support.qdiscs:
        pytest.skip("the host kernel has sfq")
    monkeypatch.setattr(runner, "uml_unavailable", lambda: "no image here")
    path = _write(
        tmp_path, "interface eth0 htb rate 10mbit default a {\n    class a rate 1mbit { sfq }\n}\n"
    )
    (v,) = verifier.verify_many([path], kernel="auto")
    assert v.kernel is None and _lines(v.diagnostics) == [
        f"{path}:2:26: error: the host kernel ({support.release}) lacks the sfq qdisc (sch_sfq) "
        "and user-mode Linux is unavailable: no image here [E405]"
    ]
    got = CliRunner().invoke(cli, ["verify", "--kernel", "uml", path])
    assert got.exit_code == 1
    assert got.stderr == "tcdsl: cannot verify: user-mode Linux is unavailable: no image here\n"


# ==== the command line =========================================================================


def test_cli_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> list[verifier.Verification]:
        raise KeyboardInterrupt

    monkeypatch.setattr("tcdsl.cli.verify_many", interrupted)
    got = CliRunner().invoke(cli, ["verify", "policies/office.tcp"])
    assert got.exit_code == 130
    assert "interrupted" in got.stderr


def test_cli_without_root_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.os, "geteuid", lambda: 1000)
    got = CliRunner().invoke(cli, ["verify", "--kernel", "host", "policies/office.tcp"])
    assert got.exit_code == 1
    assert got.stderr == (
        "tcdsl: cannot verify: verifying on the host kernel needs root (network namespaces and "
        "tc); run as root, or use --kernel uml\n"
    )


@pytest.mark.parametrize(
    "args",
    [["--kernel", "vm"], ["-b", "no-such-backend"], []],
    ids=["bad-kernel", "unknown-backend", "no-policy"],
)
def test_cli_usage_errors(args: list[str]) -> None:
    got = CliRunner().invoke(cli, ["verify", *args, *(["policies/office.tcp"] if args else [])])
    assert got.exit_code == 2


def test_cli_help_has_examples() -> None:
    got = CliRunner().invoke(cli, ["verify", "--help"])
    assert got.exit_code == 0
    assert "tcdsl verify --kernel uml policies/seeds/*.tcp" in got.stdout
    assert "verify" in CliRunner().invoke(cli, ["--help"]).stdout


def test_cli_policy_errors_are_compile_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "interface eth0 htb {\n    class a rate 1mbit ceil 500kbit\n}\n")
    got = CliRunner().invoke(cli, ["verify", path])
    assert got.exit_code == 1
    assert "[E202]" in got.stderr and f"tcdsl: {path}: not verified (1 error)" in got.stderr


def test_cli_json(no_stray_namespaces: None) -> None:
    lacks = _host_lacks(TOS_HTB)
    if lacks:
        pytest.skip(lacks)
    got = CliRunner().invoke(cli, ["verify", "--kernel", "host", "--diagnostics", "json", TOS_HTB])
    assert got.exit_code == 0, got.stderr
    assert got.stderr == "[]\n"


def test_documented_codes_are_the_ones_compare_reports() -> None:
    docs = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    section = docs[docs.index("### E4xx") :]
    documented = set(re.findall(r"^\| ([EW]4\d\d) \|", section, re.M))
    codes = {
        compare.MISSING,
        compare.DIFFERS,
        compare.UNEXPECTED,
        compare.APPLY_FAILED,
        compare.NO_FEATURE,
        compare.TOOL_WARNED,
    }
    assert documented == codes


# ==== user-mode Linux: every policy the host cannot run, in one boot ===========================


def _uml() -> None:
    """Skip, with the reason, where user-mode Linux cannot run (the first call builds its
    image: about 45 MB of Debian packages, 15 s; ``tests/test_uml.py`` does the same)."""
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")


def test_verify_every_policy_with_one_uml_boot(no_stray_namespaces: None) -> None:
    _uml()
    paths = [str(p) for p in ALL_POLICIES]
    office_voip = (
        "tc class change dev eth0 parent 1:1 classid 1:20 htb rate 6mbit ceil 7mbit prio 0"
    )
    results = verifier.verify_many(paths, kernel="auto", after={"policies/office.tcp": office_voip})
    on_uml = [v for v in results if v.kernel and v.kernel.startswith("user-mode Linux")]
    assert on_uml, "auto sends what the host lacks to user-mode Linux"
    for v in results:
        if v.path == "policies/office.tcp":
            assert _lines(v.errors) == [
                "policies/office.tcp:10:28: error: class 'voip' ceil is 7Mbit in the kernel, "
                "policy says 6mbit, its rate [E402]"
            ]
        elif "cbq" in v.path:
            assert [d.code for d in v.diagnostics] == ["E405"], render(v.diagnostics, v.sources)
        else:
            assert v.ok, render(v.diagnostics, v.sources) + v.output


def test_batch_applier_restores_both_tables() -> None:
    """A tc-batch output's .ip6tables file is applied with ip6tables-restore, after the jumps
    into the policy's chain are removed from ip6tables' built-in chains."""
    result = _compile(DUAL_MARKS)
    assert result.policy is not None
    files = {"p.batch": "", "p.iptables": "", "p.ip6tables": ""}
    applier, written = verifier.batch_applier(result.policy, files)
    assert written == files
    lines = applier.splitlines()
    assert "iptables-restore --noflush p.iptables" in lines
    assert lines[-1] == "ip6tables-restore --noflush p.ip6tables"
    unjump6 = next(line for line in lines if "ip6tables -t mangle -L" in line)
    assert "ip6tables -t mangle -D $c $n" in unjump6 and " iptables" not in unjump6


def test_dual_stack_flower_in_user_mode_linux(tmp_path: Path, no_stray_namespaces: None) -> None:
    """flower filters of both families (the host kernel has no flower): the policy agrees in
    the guest; a copy whose state is changed after the script ran reports each change."""
    _uml()
    changed = tmp_path / "changed.tcp"
    changed.write_text(Path(DUAL_FLOWER).read_text(encoding="utf-8"), encoding="utf-8")
    tamper = (
        "tc filter del dev eth0 parent 1: protocol ipv6 prio 32777 handle 0x1 flower\n"
        "tc filter add dev eth0 parent 1: protocol ipv6 prio 32769 flower ip_proto udp "
        "dst_port 53 classid 1:10\n"
    )
    auto, changes = verifier.verify_many(
        [DUAL_FLOWER, str(changed)], kernel="auto", after={str(changed): tamper}
    )
    assert auto.ok and not auto.diagnostics, render(auto.diagnostics, auto.sources) + auto.output
    assert auto.kernel is not None and auto.kernel.startswith("user-mode Linux")
    assert auto.checked.filters == 18
    assert _lines(changes.diagnostics) == [
        f"{changed}:4:34: error: unexpected flower filter under 1: in the kernel: pref 32769, "
        "eth_type ipv6 ip_proto udp dst_port 53, classid 1:10 [E403]",
        f"{changed}:10:27: error: IPv6 filter to 1:60 (pref 32777) is missing in the kernel "
        "(match eth_type ipv6 ip_proto icmpv6 under 1:) [E401]",
    ]


def test_dual_stack_marks_in_user_mode_linux(tmp_path: Path, no_stray_namespaces: None) -> None:
    """Marking in both families (the host kernel has no fw): the same chain in iptables and
    ip6tables, fw filters of both families, a policer on IPv6 u32 filters; a changed
    ip6tables rule and a deleted IPv6 fw filter are reported."""
    _uml()
    if "ip6tables" not in (_compile(DUAL_MARKS).output or ""):
        pytest.skip("the shell backend writes no ip6tables commands yet (before issue 11's merge)")
    changed = tmp_path / "changed.tcp"
    changed.write_text(Path(DUAL_MARKS).read_text(encoding="utf-8"), encoding="utf-8")
    tamper = (
        "ip6tables -t mangle -R TCDSL-eth0 2 -s 2001:db8::/48 -m mark --mark 0 "
        "-j MARK --set-mark 20\n"
        "tc filter del dev eth0 parent 1: protocol ipv6 prio 32769 handle 0xa fw\n"
    )
    plain, changes = verifier.verify_many(
        [DUAL_MARKS, str(changed)], kernel="uml", after={str(changed): tamper}
    )
    assert plain.ok and not plain.diagnostics, render(plain.diagnostics, plain.sources)
    assert (plain.checked.rules, plain.checked.rules6) == (1 + 4, 1 + 4)  # a jump, four rules
    assert str(plain.checked).endswith("5 iptables rules, 5 ip6tables rules")
    # the same through tc -batch, iptables-restore and ip6tables-restore
    (batch,) = verifier.verify_many([DUAL_MARKS], backend="tc-batch", kernel="uml")
    assert batch.ok and not batch.diagnostics, render(batch.diagnostics, batch.sources)
    assert _lines(changes.diagnostics) == [
        f"{changed}:6:11: error: IPv6 fw filter for mark 10 to 1:10 (pref 32769) is missing in "
        "the kernel (under 1:) [E401]",
        f"{changed}:7:26: error: IPv6 mark rule for 'v6' src is 2001:db8::/48 in the kernel, "
        "policy says 2001:db8::/32 [E402]",
    ]
