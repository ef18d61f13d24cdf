"""The tcng backend: units, the mapping of tcdsl constructs, E501 rejections, determinism, and
(when a tcng compiler is at hand) that tcng's ``tcc`` accepts every golden tcng file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tcdsl.backends.tcng import rate, size, variable_names

from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tests.conftest import GOLDEN

TCC = os.environ.get("TCNG_TCC", "")
"""Path of tcng's compiler ``tcc`` (built from tcng 10b); the tcc tests skip without it."""


def compile_text(text: str) -> Result:
    """Compile policy text as ``t.tcp`` with the tcng backend."""
    return compile_policy("t.tcp", "tcng", loader=lambda _path: text)


def emit(text: str) -> str:
    """The tcng text of a policy that must compile."""
    result = compile_text(text)
    assert result.output is not None, render(result.diagnostics, result.sources)
    return result.output


def body(text: str) -> list[str]:
    """The emitted lines without comments, stripped."""
    return [line.strip() for line in emit(text).splitlines() if line.strip() and "//" not in line]


def errors(text: str) -> str:
    """The rendered diagnostics of a policy that must be rejected."""
    result = compile_text(text)
    assert result.output is None
    return render(result.diagnostics, result.sources)


# ---- units ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bits", "spelled"),
    [
        (6_000_000, "6Mbps"),
        (1_000_000_000, "1Gbps"),
        (220_000, "220kbps"),
        (10_800_000, "10800kbps"),
        (1500, "1500bps"),
        (0, "0bps"),
    ],
)
def test_rate_is_spelled_in_tcng_bits_per_second(bits: int, spelled: str) -> None:
    assert rate(bits) == spelled


@pytest.mark.parametrize(
    ("size_bytes", "spelled"),
    [(1540, "1540B"), (2048, "2kB"), (15 * 1024, "15kB"), (1 << 20, "1MB"), (1000, "1000B")],
)
def test_size_is_spelled_in_tcng_bytes_with_binary_prefixes(size_bytes: int, spelled: str) -> None:
    assert size(size_bytes) == spelled


def test_tc_units_become_tcng_units() -> None:
    lines = body(
        "interface eth0 htb rate 100mbit {\n"
        "    class a rate 6mbit ceil 1mbps burst 15k\n"  # mbps: tc's megaBYTES per second
        "}\n"
    )
    assert "class (0x10, rate 6Mbps, ceil 8Mbps, burst 15kB);" in lines


def test_tbf_latency_becomes_the_limit_tc_derives() -> None:
    lines = body("interface eth0 tbf rate 220kbit latency 50ms burst 1540\n")
    # 220kbit/s = 27500 B/s; 50ms of it is 1375 bytes, plus the 1540-byte burst
    assert lines[1] == "tbf (0x1, rate 220kbps, burst 1540B, limit 2915B);"


# ---- mapping --------------------------------------------------------------------------------

MATCHES = """\
interface eth1 family ipv4 htb rate 100mbit default bulk {
    class web prio 1 rate 40mbit ceil 90mbit {
        match dport 80, 443 proto tcp
        match sport 1024-2047 pref 5
        match dport 3072/0xfc00 src 10.0.0.0/8, 192.168.1.1
        sfq perturb 10 quantum 1514
    }
    class ack rate 1mbit {
        match tcp-ack pref 2
        match tos 0x10/0x1e
        match dscp ef
        match u8 0x45 at 0
        match u16 0x1200/0xff00 at 6 u32 0x0a000001 at 16
        bfifo limit 30k
    }
    class bulk rate 1mbit ceil 5mbit {
        match all
        pfifo limit 20
    }
}
"""


def test_selectors_spell_every_condition_in_filter_order() -> None:
    ip = "class (<$%s>) if meta_protocol == ETH_P_IP"
    selectors = [line for line in body(MATCHES) if line.startswith("class (<")]
    assert selectors == [
        ip % "web" + " && (raw[22].ns == 80 || raw[22].ns == 443) && ip_proto == IPPROTO_TCP;",
        ip % "web" + " && (raw[22].ns & 0xfc00) == 3072"
        " && (ip_src:8 == 10.0.0.0 || ip_src == 192.168.1.1);",
        ip % "ack" + " && (ip_tos & 0x1e) == 0x10;",
        ip % "ack" + " && (ip_tos & 0xfc) == 0xb8;",
        ip % "ack" + " && raw[0] == 0x45;",
        ip % "ack" + " && (raw[6].ns & 0xff00) == 0x1200 && raw[16].nl == 0x0a000001;",
        ip % "bulk" + ";",
        # pref 2, then pref 5: after every unwritten (pref 1) line, as tc tries them
        ip % "ack" + " && ip_proto == IPPROTO_TCP && (raw[0] & 0x0f) == 0x05"
        " && (raw[2].ns & 0xffc0) == 0x0000 && raw[33] == 0x10;",
        ip % "web" + " && (raw[20].ns >= 1024 && raw[20].ns <= 2047);",
    ]


def test_qdisc_tree_keeps_tc_handles_and_moves_the_default_class_to_a_decimal_safe_minor() -> None:
    lines = body(MATCHES)
    # r2q 100: tcdsl's choice, as tc's default 10 would put web's quantum above 200000
    tree = lines[lines.index("htb (0x1, r2q 100) {") :]
    assert tree == [
        "htb (0x1, r2q 100) {",
        "class (0x1, rate 100Mbps, ceil 100Mbps) {",
        "$web = class (0x10, rate 40Mbps, ceil 90Mbps, prio 1) {",
        "sfq (0x10, perturb 10s, quantum 1514B);",
        "}",
        "$ack = class (0x20, rate 1Mbps, ceil 1Mbps) {",
        "fifo (0x20, limit 30kB);",
        "}",
        "$bulk = class (0x2, rate 1Mbps, ceil 5Mbps, default) {",
        "fifo (0x30, limit 20p);",
        "}",
        "}",
        "}",
        "}",
        "}",
    ]
    assert "// tc class 1:30 here: tcc writes htb's default in decimal" in emit(MATCHES)


def test_children_do_not_inherit_what_tcng_would_pass_on() -> None:
    lines = body(
        "interface eth0 htb rate 10mbit burst 10k {\n"
        "    class p prio 2 rate 4mbit cburst 2k {\n"
        "        class q rate 1mbit\n"
        "    }\n"
        "}\n"
    )
    assert "class (0x20, rate 1Mbps, ceil 1Mbps, burst 0B, cburst 0B, prio 0);" in lines


def test_prio_priomap_names_the_band_classes() -> None:
    lines = body(
        "interface eth0 prio bands 3 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1 {\n"
        "    class hi { sfq }\n    class mid\n    class lo\n}\n"
    )
    assert lines[1] == (
        "prio (0x1, bands 3, priomap $mid $lo $lo $lo $mid $lo $hi $hi"
        " $mid $mid $mid $mid $mid $mid $mid $mid) {"
    )


def test_names_that_are_not_tcng_identifiers_are_respelled_uniquely() -> None:
    policy = compile_text(
        "interface eth0 prio {\n    class a-b\n    class a_b\n    class __x\n}\n"
    ).policy
    assert policy is not None
    root = policy.interfaces[0].root
    assert sorted(variable_names(root).values()) == ["a_b", "a_b_2", "c___x"]


def test_classes_under_a_chained_qdisc_are_reached_through_it() -> None:
    out = emit(
        "interface eth2 tbf rate 1mbit burst 10k latency 20ms peakrate 2mbit mtu 1514 {\n"
        "    prio bands 4 {\n"
        "        class a {\n            match dst 10.1.0.0/16\n        }\n"
        "        class b { tbf rate 500kbit burst 5k limit 10k }\n"
        "    }\n"
        "}\n"
    )
    assert "class (<$a>) if meta_protocol == ETH_P_IP && ip_dst:16 == 10.1.0.0;" in out
    # the smaller of 1mbit x 20ms + burst and 2mbit x 20ms + mtu
    assert "tbf (0x1, rate 1Mbps, burst 10kB, limit 6514B, peakrate 2Mbps, mtu 1514B) {" in out


def _nested(depth: int, family: str = "ipv4") -> str:
    """An htb in the default class of an htb, ``depth`` times, each class also matched."""
    text = f"interface eth0 family {family} htb rate 100mbit default c0 {{\n"
    for level in range(depth):
        text += f"class c{level} rate 1mbit ceil 100mbit match dport {level + 1} {{\n"
        if level + 1 < depth:
            text += f"htb rate 100mbit default c{level + 1} {{\n"
    return text + "}\n" + "}\n}\n" * (depth - 1) + "}\n"


def test_nested_classful_qdiscs_give_text_linear_in_the_depth() -> None:
    for family in ("ipv4", "both"):
        sizes = {depth: len(emit(_nested(depth, family))) for depth in (10, 20, 40)}
        # each level adds the same text: one macro, one selector, one qdisc and its classes
        assert sizes[40] - sizes[20] == pytest.approx(2 * (sizes[20] - sizes[10]), rel=0.1)
        assert sizes[40] < 100_000  # the old path-per-selector text doubled every level


def test_inner_selectors_are_written_once_behind_the_outer_class_macro() -> None:
    out = emit(_nested(3))
    assert "#define TCDSL_IN_c0 (raw[22].ns == 1 || !TCDSL_SEEN_1_0)" in out
    assert "#define TCDSL_SEEN_1_0 (raw[22].ns == 1)" in out
    selectors = [line.strip() for line in out.splitlines() if "class (<" in line]
    assert selectors == [
        "class (<$c2>) if meta_protocol == ETH_P_IP && TCDSL_IN_c1 && raw[22].ns == 3;",
        "class (<$c1>) if meta_protocol == ETH_P_IP && TCDSL_IN_c0 && raw[22].ns == 2;",
        "class (<$c0>) if meta_protocol == ETH_P_IP && raw[22].ns == 1;",
    ]


def test_a_class_after_other_match_lines_excludes_them() -> None:
    out = emit(
        "interface eth0 family ipv4 htb rate 10mbit {\n"
        "    class a rate 1mbit match dst 10.1.0.0/16\n"
        "    class b rate 1mbit match dst 10.2.0.0/16 match dport 80 {\n"
        "        htb rate 1mbit { class x rate 1mbit match sport 22 }\n"
        "    }\n"
        "}\n"
    )
    assert (
        "#define TCDSL_IN_b (ip_dst:16 == 10.2.0.0 && !TCDSL_SEEN_1_0"
        " || raw[22].ns == 80 && !TCDSL_SEEN_1_1)" in out
    )
    assert "#define TCDSL_SEEN_1_1 (TCDSL_SEEN_1_0 || ip_dst:16 == 10.2.0.0)" in out


def test_each_interface_has_its_own_macro_names() -> None:
    one = "family ipv4 htb rate 10mbit { class a rate 1mbit match dport 1 { htb rate 1mbit {\n"
    one += "class b rate 1mbit match dport 2 } } }\n"
    out = emit(f"interface eth0 {one}interface eth1 {one}")
    assert out.count("#define TCDSL_IN_a (raw[22].ns == 1)") == 1
    assert "#define TCDSL2_IN_a (raw[22].ns == 1)" in out


def test_a_class_named_like_a_macro_is_respelled() -> None:
    out = emit(
        "interface eth0 family ipv4 htb rate 10mbit {\n"
        "class a rate 1mbit match dport 1 { htb rate 1mbit {\n"
        "class TCDSL_IN_a rate 1mbit match dport 2 } } }\n"
    )
    assert "class (<$c_TCDSL_IN_a>) if meta_protocol == ETH_P_IP && TCDSL_IN_a && " in out


DUAL = """\
interface eth0 htb rate 10mbit default bulk {
    class web rate 4mbit match dport 443 proto tcp
    class lan rate 2mbit match src 10.0.0.0/8, 2001:db8::/32 dport 53
    class v6 rate 1mbit match dst 2001:db8::1 tos 0xb8/0xfc
    class ping rate 1mbit match proto icmp, icmpv6
    class ack rate 1mbit match tcp-ack pref 2
    class bulk rate 1mbit
}
"""


def test_dual_stack_selectors_test_each_family_at_its_offsets() -> None:
    """A line applies to both families: one part per family, each after its protocol test,
    IPv6 read at its own offsets (ports 40 bytes in, behind a TCP or UDP next header);
    addresses and protocols of one family only restrict the line to it."""
    v4, v6 = "meta_protocol == ETH_P_IP", "meta_protocol == ETH_P_IPV6"
    tcp_or_udp = "(ip6_nxt == IPPROTO_TCP || ip6_nxt == IPPROTO_UDP)"
    selectors = [line for line in body(DUAL) if line.startswith("class (<")]
    assert selectors == [
        f"class (<$web>) if ({v4} && raw[22].ns == 443 && ip_proto == IPPROTO_TCP"
        f" || {v6} && raw[42].ns == 443 && ip6_nxt == IPPROTO_TCP);",
        f"class (<$lan>) if ({v4} && ip_src:8 == 10.0.0.0 && raw[22].ns == 53"
        f" || {v6} && {tcp_or_udp} && ip6_src:32 == 2001:0db8:0000:0000:0000:0000:0000:0000"
        " && raw[42].ns == 53);",
        f"class (<$v6>) if {v6} && ip6_dst == 2001:0db8:0000:0000:0000:0000:0000:0001"
        " && (raw[0].ns & 0x0fc0) == 0x0b80;",
        f"class (<$ping>) if ({v4} && ip_proto == IPPROTO_ICMP"
        f" || {v6} && ip6_nxt == IPPROTO_ICMPV6);",
        f"class (<$ack>) if ({v4} && ip_proto == IPPROTO_TCP && (raw[0] & 0x0f) == 0x05"
        " && (raw[2].ns & 0xffc0) == 0x0000 && raw[33] == 0x10"
        f" || {v6} && ip6_nxt == IPPROTO_TCP && (raw[4].ns & 0xffc0) == 0x0000"
        " && raw[53] == 0x10);",
    ]


def test_dual_stack_macros_test_the_family_of_each_line() -> None:
    """A macro is read for packets of either family, so each line's part names its own."""
    out = emit(_nested(2, "both"))
    v4, v6 = "meta_protocol == ETH_P_IP", "meta_protocol == ETH_P_IPV6"
    guard = "(ip6_nxt == IPPROTO_TCP || ip6_nxt == IPPROTO_UDP)"
    assert (
        f"#define TCDSL_SEEN_1_0 ((({v4} && raw[22].ns == 1) || ({v6} && {guard} && raw[42].ns"
        " == 1)))" in out
    ), out
    ipv6_only = emit(_nested(2, "ipv6"))
    assert f"#define TCDSL_SEEN_1_0 (({v6} && {guard} && raw[42].ns == 1))" in ipv6_only
    assert f"{v4} " not in ipv6_only.split("#define", 1)[1]


def test_flower_is_refused_in_tcng() -> None:
    text = errors(
        "interface eth0 classifier flower htb rate 1mbit default a {\n    class a rate 1mbit\n}\n"
    )
    assert text.startswith("t.tcp:1:16: error: tcng writes u32 filters (its tcc has no flower)")
    assert "[E501]" in text


def test_a_match_line_below_nested_prio_bands_is_reported_once() -> None:
    depth = 12
    text = "interface eth0 prio {\n"
    for level in range(depth):
        text += f"class c{level} match dport {level + 1} {{\n" + (
            "prio {\n" if level + 1 < depth else ""
        )
    text += "}\n" + "}\n}\n" * (depth - 1) + "}\n"
    result = compile_text(text)
    assert result.output is None
    found = [d for d in result.diagnostics if d.code == "E501"]
    assert len(found) == depth - 1  # each inner match line, at its nearest prio band
    assert "reach class 'c0' of a prio" in render(found[:1], result.sources)


# ---- rejections -----------------------------------------------------------------------------


def test_fq_codel_is_rejected_at_the_qdisc() -> None:
    assert errors("interface eth0 fq_codel\n") == (
        "t.tcp:1:16: error: tcng has no fq_codel qdisc; use sfq, or the shell backend [E501]\n"
        " 1 | interface eth0 fq_codel\n"
        "   |                ^~~~~~~~\n"
    )


def test_sfq_limit_is_rejected_at_its_value() -> None:
    text = errors("interface eth0 sfq limit 100\n")
    assert text.startswith(
        "t.tcp:1:26: error: tcng's sfq has no 'limit' (only perturb and quantum) [E501]\n"
    )


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("interface eth0 netem delay 20ms\n", "tcng has no netem qdisc"),
        ("interface eth0 pfifo_fast\n", "tcng has no pfifo_fast qdisc"),
        ("interface eth0 bfifo\n", "tcng's fifo without a limit is a pfifo"),
        (
            "interface eth0 cbq bandwidth 10mbit avpkt 1000 {\n"
            "    class a rate 1mbit allot 1514 prio 1\n}\n",
            "the tcng backend does not emit cbq",
        ),
        (
            "interface eth0 htb rate 10mbit default o {\n"
            "    classify by mark from eth1\n"
            "    class a rate 1mbit match proto tcp dport 80\n    class o rate 1mbit\n}\n",
            "tcng cannot set firewall marks",
        ),
        (
            "interface eth0 htb rate 10mbit {\n    class p rate 5mbit quantum 3000 {\n"
            "        class c rate 1mbit\n    }\n}\n",
            "tcng passes the quantum of class 'p' on to class 'c'",
        ),
        (
            "interface eth0 prio {\n    class a {\n        htb {\n"
            "            class x rate 1mbit match dport 80\n        }\n    }\n}\n",
            "it cannot classify packets that reach class 'a' of a prio through its priomap",
        ),
        (
            "interface eth0 prio priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 0 {\n"
            "    class a match dport 80\n    class b\n}\n",
            "tcng cannot combine a priomap with classification",
        ),
        (
            "interface eth0 {\n    download htb rate 10mbit {\n        class a rate 1mbit\n"
            "    }\n}\n",
            "t.tcp:2:5: error: tcng has no ifb device and no redirect action",
        ),
        (
            "interface eth0 {\n    ingress {\n"
            "        match src 0.0.0.0/0 police rate 800kbit burst 10k\n    }\n}\n",
            "t.tcp:2:5: error: the tcng backend does not write policers",
        ),
        (
            "interface eth0 htb rate 10mbit {\n"
            "    class a rate 1mbit match dport 80 police rate 1mbit burst 10k continue\n}\n",
            "t.tcp:2:39: error: the tcng backend does not write policers",
        ),
    ],
)
def test_what_tcng_cannot_express_is_an_e501(policy: str, message: str) -> None:
    text = errors(policy)
    assert message in text and "[E501]" in text


# ---- determinism and tcc --------------------------------------------------------------------


def test_emit_is_deterministic() -> None:
    assert emit(MATCHES) == emit(MATCHES)


def _golden_tcng_files() -> list[Path]:
    return sorted(
        p
        for p in (GOLDEN / "tcng").glob("*.tc")
        if not p.read_text(encoding="utf-8").startswith("# rejected")
    )


@pytest.mark.skipif(not TCC, reason="set TCNG_TCC to tcng's tcc to check the golden files")
@pytest.mark.parametrize("golden", _golden_tcng_files(), ids=lambda p: p.stem)
def test_tcc_accepts_golden_output(golden: Path) -> None:
    done = subprocess.run([TCC, str(golden)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert "tc qdisc add" in done.stdout


@pytest.mark.skipif(not TCC, reason="set TCNG_TCC to tcng's tcc to check the golden files")
def test_tcc_writes_ipv6_filters_for_the_ipv6_parts(tmp_path: Path) -> None:
    """tcc writes a filter per protocol a selector tests: the IPv6 parts become 'protocol
    ipv6' u32 filters reading the next header at 6, ports at 42, addresses at 8 and 24."""
    path = tmp_path / "dual.tc"
    path.write_text(emit(DUAL), encoding="utf-8")
    done = subprocess.run([TCC, str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and not done.stderr, done.stderr
    v6 = [line for line in done.stdout.splitlines() if " protocol ipv6 " in line]
    assert "match u16 0x1bb 0xffff at 42 match u8 0x6 0xff at 6 classid 2:1" in v6[0]
    assert any("match u32 0x20010db8 0xffffffff at 24" in line for line in v6)
    assert any("match u8 0x3a 0xff at 6" in line for line in v6)  # ICMPv6
    v4 = [line for line in done.stdout.splitlines() if " protocol ip " in line]
    assert any("match u8 0x1 0xff at 9" in line for line in v4)  # ICMP
