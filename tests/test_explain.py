"""tcdsl explain: golden texts for every example policy (both formats), the facts students rely
on, the kernel's TOS tables, the command line, and the example pasted in docs/explain.md.

Golden files live in tests/golden_explain/<name>.txt and .md (not under tests/golden/, whose
orphan check expects backend output only); rewrite them with --update-golden and read the diff:
these texts are what students read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl import ir
from tcdsl.cli import cli
from tcdsl.driver import analyse
from tcdsl.tcmath import DEFAULT_PRIOMAP, IP_TOS2PRIO, tos_priority
from tcdsl.teach.explain import WIDTH, explain, tos_band
from tcdsl.words import families_words, match_phrase, match_text
from tests.conftest import ROOT, golden_name, policy_files

GOLDEN = ROOT / "tests" / "golden_explain"
FORMATS = {"text": "txt", "markdown": "md"}
CASES = [(fmt, p) for fmt in FORMATS for p in policy_files()]


def _policy(path: str | Path) -> ir.Policy:
    cwd = os.getcwd()
    os.chdir(ROOT)  # the text names the policy by its repository path
    try:
        result = analyse(Path(path).as_posix())
    finally:
        os.chdir(cwd)
    assert result.policy is not None, result.diagnostics
    return result.policy


def _inline(text: str) -> ir.Policy:
    result = analyse("inline.tcp", lambda _path: text)
    assert result.policy is not None, result.diagnostics
    return result.policy


@pytest.mark.parametrize(("fmt", "policy"), CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_golden(fmt: str, policy: Path, update_golden: bool) -> None:
    actual = explain(_policy(policy), "markdown" if fmt == "markdown" else "text")
    golden = GOLDEN / f"{golden_name(policy)}.{FORMATS[fmt]}"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual, encoding="utf-8")
        return
    assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
    assert actual == golden.read_text(encoding="utf-8"), f"{golden} differs; --update-golden"


def test_no_orphan_golden_files() -> None:
    expected = {GOLDEN / f"{golden_name(p)}.{ext}" for p in policy_files() for ext in ("txt", "md")}
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert not sorted(present - expected), "golden files without a policy"


def test_deterministic() -> None:
    for policy in policy_files():
        for fmt in ("text", "markdown"):
            assert explain(_policy(policy), fmt) == explain(_policy(policy), fmt)


@pytest.mark.parametrize("policy", policy_files(), ids=[p.as_posix() for p in policy_files()])
def test_text_fits_the_width(policy: Path) -> None:
    for line in explain(_policy(policy), "text").splitlines():
        assert len(line) <= WIDTH or " " not in line.strip(), line


# ---- facts ---------------------------------------------------------------------------------


def _class_section(text: str, heading: str) -> str:
    """The lines of one class in the text output, up to the next blank line."""
    start = text.index(heading)
    end = text.find("\n\n", start)
    return " ".join(text[start:end].split())


def test_a_line_an_earlier_one_hides_is_said_never_to_match() -> None:
    """Found by a tester: explain described a line check reports as never matching (W312,
    W313) as if it took its packets; it says so now, where the line is listed."""
    text = " ".join(
        explain(
            _inline(
                "interface eth0 htb rate 10mbit default b {\n"
                "    class ssh rate 1mbit match proto tcp dport 22\n"
                "    class ssh2 rate 1mbit match proto tcp dport 22 src 10.0.0.1\n"
                "    class web rate 1mbit match dport 80\n"
                "    class web2 rate 1mbit match dport 80\n"
                "    class ok rate 1mbit match dport 81\n"
                "    class b rate 1mbit\n}\n"
            ),
            "text",
        ).split()
    )
    assert "IPv4 TCP packets from 10.0.0.1 to port 22 (it never matches: an earlier line " \
        "sends every packet it would match to class 'ssh'; W312)" in text, text  # fmt: skip
    assert "packets to port 80 (it never matches: class 'web' matches exactly these packets " \
        "with an earlier line; W313)" in text, text  # fmt: skip
    assert text.count("it never matches") == 2, text


def test_a_leaf_that_shapes_below_the_ceil_is_said_to_cap_the_class() -> None:
    """Found by a tester: a class with a 3mbit tbf leaf was said to be guaranteed 5mbit and to
    borrow up to 17mbit; it never sends more than 3mbit (W309), and explain says so."""
    policy = (
        "interface eth0 htb rate 20mbit default bulk {\n"
        "    class web rate 10mbit ceil 20mbit match dport 80\n"
        "    class bulk rate 5mbit ceil 17mbit {\n"
        "        tbf rate 3mbit burst 10k latency 50ms\n    }\n}\n"
    )
    text = explain(_inline(policy), "text")
    bulk = " ".join(_class_section(text, "class 'bulk' (1:20)").split())
    assert "Its leaf tbf sends at most 3mbit, so the class never sends more (W309)." in bulk
    web = " ".join(_class_section(text, "class 'web' (1:10)").split())
    assert "at most" not in web
    wide = explain(_inline(policy.replace("tbf rate 3mbit", "tbf rate 30mbit")), "text")
    assert "at most" not in wide


def test_office_web_borrows_from_the_link() -> None:
    text = explain(_policy("policies/office.tcp"), "text")
    web = _class_section(text, "class 'web' (1:30)")
    assert "guaranteed 40mbit; may borrow up to 90mbit (50mbit more) from the link class 1:1" in web
    assert "Priority: 1." in web
    assert "match dport 80, 443: IPv6 and IPv4 packets to port 80 or 443" in web
    assert "fq_codel" in web
    voip = _class_section(text, "class 'voip' (1:20)")
    assert "ceil = rate, so it never borrows" in voip
    alice = _class_section(text, "class 'alice' (1:50)")
    assert "packets from 10.3.34.11" in alice
    bulk = _class_section(text, "class 'bulk' (1:70)")
    assert "Default: this is the htb's default class" in bulk
    assert "pfifo (handle 70:): one first-in, first-out queue of up to 20 packets" in bulk
    assert "Packets no filter matches go to 'bulk' (1:70), the htb's default class" in text


def test_office_classification_order() -> None:
    text = explain(_policy("policies/office.tcp"), "text")
    order = text[text.index("How packets reach the classes") :]
    steps = re.findall(r"^ *\d+\. (.*)$", order, flags=re.M)
    assert steps[0] == "ICMP or ICMPv6 packets -> 'interactive' (1:10)"
    assert steps[2] == "IPv6 and IPv4 packets to port 5001 -> 'voip' (1:20)"
    assert len(steps) == 6


def test_nested_class_borrows_through_its_parent() -> None:
    policy = _inline(
        "interface eth0 htb rate 100mbit default b {\n"
        "    class p rate 50mbit ceil 60mbit {\n"
        "        class c rate 10mbit ceil 80mbit match src 10.0.0.1\n"
        "    }\n"
        "    class b rate 1mbit\n"
        "}\n"
    )
    c = _class_section(explain(policy, "text"), "class 'c'")
    assert "from 'p' (1:10), and through it from the link class 1:1" in c
    assert "It can never get more than 60mbit, what 'p' (1:10) can have." in c


def test_root_classes_cannot_borrow() -> None:
    text = explain(_policy("policies/seeds/s000-6.1-htb-limit.tcp"), "text")
    assert "no parent to borrow from and never sends more than 10mbit" in " ".join(text.split())


def test_no_default_means_the_unshaped_direct_queue() -> None:
    text = " ".join(explain(_policy("policies/seeds/s001-htb-700-300.tcp"), "text").split())
    assert "There is no default class" in text
    assert "htb's direct queue: unshaped" in text
    for family, unseen in (
        ("", "neither IPv4 nor IPv6 (ARP; the filters look at IPv4 and IPv6 headers only)"),
        ("family ipv4 ", "not IPv4 (ARP, IPv6; the filters look at IPv4 headers only)"),
        ("family ipv6 ", "not IPv6 (ARP, IPv4; the filters look at IPv6 headers only)"),
    ):
        policy = _inline(
            f"interface eth0 {family}htb rate 10mbit {{\n"
            "    class a rate 1mbit match dport 22\n}\n"
        )
        assert unseen in " ".join(explain(policy, "text").split())
    with_default = " ".join(explain(_policy("policies/office.tcp"), "text").split())
    assert "direct queue" not in with_default


def test_marks_are_explained() -> None:
    text = " ".join(explain(_policy("policies/seeds/s000-10.1-marks.tcp"), "text").split())
    assert (
        "packets the firewall marks 10 (chain 'INSHAPER', for packets arriving on 'eth1')" in text
    )
    families = families_words(_policy("policies/seeds/s000-10.1-marks.tcp").interfaces[0].families)
    assert f"1. {families} TCP packets to port 5001: mark 10 -> 'app5001' (1:10)" in text
    assert "3. every packet still unmarked: mark 30 -> 'others' (1:30)" in text


# ---- nested classful qdiscs --------------------------------------------------------------------

# The issue's case: an htb in a 720kbit htb class, whose own link class says 800kbit.
HTB_IN_HTB = """\
interface eth0 htb rate 1mbit default rest {
    class site rate 720kbit match dst 10.0.0.0/8 {
        htb rate 800kbit default other {
            class voip rate 200kbit ceil 800kbit prio 0 match dport 5060
            class other rate 100kbit ceil 800kbit
        }
    }
    class rest rate 100kbit ceil 1mbit
}
"""


def _part(text: str, start: str, end: str | None = None) -> str:
    """The text from the line ``start`` up to the line ``end`` (or the end), spaces collapsed."""
    first = text.index(f"\n{start}\n")
    last = text.index(f"\n{end}\n", first) if end is not None else len(text)
    return " ".join(text[first:last].split())


def test_inner_htb_is_explained_at_its_own_level() -> None:
    text = explain(_inline(HTB_IN_HTB), "text")
    outer = _part(text, "Classes, in tree order:", "htb 10: in 'site' (1:10):")
    assert "'site' (1:10)" in outer and "'rest' (1:20)" in outer
    assert "'voip'" not in outer and "10:1" not in outer
    assert "u32 filters on 1: look" in outer and "-> 'site' (1:10)" in outer
    assert "u32 filters on 10:" not in outer
    assert "go to 'rest' (1:20), the htb's default class" in outer
    assert "explained below, under htb 10:" in outer
    inner = _part(text, "htb 10: in 'site' (1:10):")
    assert "The packets sent to 'site' (1:10) wait in htb 10:" in inner
    assert "It can send no more than 720kbit, what 'site' (1:10) can have." in inner
    assert "Its classes are guaranteed 800kbit together, more than that" in inner
    link = _part(text, "link class 10:1", "  class 'voip' (10:10)")
    assert "800kbit: the most the classes below send together" in link
    assert "It can never get more than 720kbit, what 'site' (1:10) can have." in link
    voip = _class_section(text, "class 'voip' (10:10)")
    assert "It can never get more than 720kbit, what 'site' (1:10) can have." in voip
    assert "u32 filters on 10: look" in inner and "-> 'voip' (10:10)" in inner
    unmatched = _part(text, "htb 10:, unmatched traffic:")
    assert "that none of its filters matches go to 'other' (10:20), its default class" in unmatched
    other = _class_section(text, "class 'other' (10:20)")
    assert "this is the default class of htb 10:" in other


def test_inner_root_classes_name_their_own_qdisc_line() -> None:
    text = " ".join(explain(_inline(HTB_IN_HTB.replace(" rate 800kbit", "")), "text").split())
    assert "root class of htb 10: (its qdisc line gives no rate" in text
    assert "the interface line gives no rate" not in text
    assert "htb 10: has no default class" not in text
    no_default = HTB_IN_HTB.replace(" default other", "")
    text = " ".join(explain(_inline(no_default), "text").split())
    assert "htb 10: has no default class" in text
    assert "leave through its direct queue, unshaped by its classes and ahead of them" in text
    assert "(never faster than 720kbit)" in text


def test_prio_in_an_htb_class_has_its_bands_and_table() -> None:
    text = explain(_policy("policies/nested.tcp"), "text")
    inner = _part(text, "prio 20: in 'branch' (1:20):")
    assert "It can send no more than 5mbit, what 'branch' (1:20) can have." in inner
    assert "band 0: class 'dns' (20:1)" in inner and "band 2: class 'rest' (20:3)" in inner
    assert "TOS byte -> Linux priority -> band (prio 20:):" in inner
    assert (
        "Packets that reach prio 20: and that none of its filters matches go to the band" in inner
    )
    assert "band 0: class 'dns'" not in _part(text, "Classes, in tree order:", "Unmatched traffic:")


def test_htb_under_tbf_and_netem() -> None:
    text = explain(_policy("policies/wan-lab.tcp"), "text")
    inner = _part(text, "htb 3: under tbf 2:")
    assert "The packets that tbf 2: sends wait in htb 3:, its child qdisc" in inner
    assert "It can send no more than 10mbit, the rate of tbf 2:." in inner
    assert "u32 filters on 3: look" in inner
    assert "go to 'bulk' (3:20), its default class" in inner
    slower = _inline(
        "interface eth0 tbf rate 5mbit burst 10k latency 50ms {\n"
        "    htb rate 10mbit default b {\n"
        "        class a rate 4mbit ceil 10mbit match dport 22\n"
        "        class b rate 6mbit ceil 10mbit\n"
        "    }\n"
        "}\n"
    )
    text = " ".join(explain(slower, "text").split())
    assert "htb 2: under tbf 1:" in text
    assert "It can never get more than 5mbit, the rate of tbf 1:." in text
    assert "Its classes are guaranteed 10mbit together, more than that" in text


def test_src_matches_on_private_addresses_mention_nat() -> None:
    office = " ".join(explain(_policy("policies/office.tcp"), "text").split())
    assert "'src' matches private addresses (10.3.34.11 and 10.3.34.33)" in office
    assert "behind source NAT" in office and "router's public address" in office
    public = _inline("interface eth0 htb rate 10mbit {\n class a rate 1mbit match src 8.8.8.8\n}\n")
    assert "NAT" not in explain(public, "text")
    by_dst = _inline(
        "interface eth0 htb rate 10mbit {\n class a rate 1mbit match dst 10.0.0.1\n}\n"
    )
    assert "NAT" not in explain(by_dst, "text")
    # Marked in PREROUTING on the LAN side, before NAT: the private source is still there.
    marked = _inline(
        "interface eth0 htb rate 10mbit default b {\n"
        "    classify by mark from eth1\n"
        "    class a rate 1mbit match src 10.0.0.1\n"
        "    class b rate 1mbit\n"
        "}\n"
    )
    assert "NAT" not in explain(marked, "text")


def _said(policy: ir.Policy) -> str:
    return " ".join(explain(policy, "text").split())


def test_egress_only_policies_say_traffic_control_acts_on_egress() -> None:
    assert "Traffic control acts on egress" in _said(_policy("policies/office.tcp"))
    home = _said(_policy("policies/home-ifb.tcp"))
    assert "Traffic control acts on egress" not in home
    assert "on one interface" in home
    assert "a download is redirected as it arrives to an IFB device" in home


def test_downloads_are_explained_with_their_ifb_nat_and_connmark() -> None:
    home = _said(_policy("policies/home-ifb.tcp"))
    assert "Interface 'eth0', upload" in home
    assert "Interface 'eth0', download (via 'ifb4eth0')" in home
    assert (
        "Downloads arriving on 'eth0' are redirected (every protocol, IPv6 included) to the IFB "
        "device 'ifb4eth0', named by tcdsl, and shaped there by the tree below" in home
    )
    assert "before the firewall" in home and "before NAT is undone" in home
    assert "the router's public address" in home
    assert "connmark" not in home
    marked = _said(
        _inline(
            "interface eth0 {\n    download via ifb9 connmark htb rate 10mbit default b {\n"
            "        classify by mark from eth0\n"
            "        class a rate 1mbit match proto udp dport 5060\n        class b rate 9mbit\n"
            "    }\n}\n"
        )
    )
    assert "the IFB device 'ifb9' and shaped" in marked
    assert "restores the connection's firewall mark" in marked
    assert "first packets arrive before the firewall has marked it" in marked
    assert "A download's packets get those marks through their connection" in marked


@pytest.mark.parametrize(
    ("verdict", "said"),
    [
        ("", "they are dropped"),
        ("drop", "they are dropped"),
        ("pass", "they are sent to 'a' (1:10) all the same (the policer only measures)"),
        ("continue", "they go on to the next filter, as if this line did not match"),
        (
            "reclassify",
            "they are classified again from the first filter; a packet still sent back after "
            "16 restarts is dropped",
        ),
    ],
)
def test_police_verdicts_in_words(verdict: str, said: str) -> None:
    text = _said(
        _inline(
            "interface eth0 htb rate 10mbit default b {\n"
            f"    class a rate 1mbit match dport 80 police rate 1mbit burst 10k {verdict}\n"
            "    class b rate 9mbit\n}\n"
        )
    )
    assert f"match dport 80 police rate 1mbit burst 10k {verdict or 'drop'}:" in text
    assert (
        f"IPv6 and IPv4 packets to port 80 -> 'a' (1:10); above 1mbit (burst 10k), {said}" in text
    )


def test_ingress_policers_are_explained() -> None:
    text = _said(_policy("policies/ingress-policer.tcp"))
    assert "Interface 'eth0', ingress policers" in text
    assert "It has no queue and no classes: it cannot delay or shape, only police" in text
    assert (
        "1. every IPv6 and IPv4 packet: one policer for the line's 2 filters, so what they "
        "match shares its rate: above 800kbit (burst 10k), they are dropped; below, let in"
        in " ".join(text.split())
    )
    mtu = _said(
        _inline(
            "interface eth0 {\n    ingress {\n"
            "        match src 10.0.0.0/8 police rate 1mbit burst 10k mtu 2k pass\n    }\n}\n"
        )
    )
    assert (
        "packets from 10.0.0.0/8: above 1mbit (burst 10k, packets up to 2k), they are let in "
        "all the same" in mtu
    )
    ordered = _said(
        _inline(
            "interface eth0 {\n    ingress {\n"
            "        match src 10.0.0.0/8 pref 20 police rate 1mbit burst 10k\n"
            "        match src 10.1.0.0/16 pref 10 police rate 2mbit burst 10k continue\n"
            "    }\n}\n"
        )
    )
    assert "1. pref 10: IPv4 packets from 10.1.0.0/16: above 2mbit" in ordered
    assert "2. pref 20: IPv4 packets from 10.0.0.0/8: above 1mbit" in ordered


# ---- the TOS tables ----------------------------------------------------------------------------


def test_kernel_tables() -> None:
    # net/ipv4/route.c ip_tos2prio (current kernels) and sch_generic.c prio2band.
    assert IP_TOS2PRIO == (0, 0, 0, 0, 2, 2, 2, 2, 6, 6, 6, 6, 4, 4, 4, 4)
    assert DEFAULT_PRIOMAP == (1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
    assert tos_priority(0x10) == 6 and tos_priority(0x08) == 2 and tos_priority(0x18) == 4
    assert tos_priority(0x11) == tos_priority(0xF0 | 0x10) == 6  # only the 0x1e bits count


def test_pfifo_fast_tos_bands() -> None:
    policy = _policy("policies/seeds/s004-pfifo-fast.tcp")
    root = policy.interfaces[0].root
    assert isinstance(root, ir.PfifoFast)
    assert (tos_band(root, 0x10), tos_band(root, 0x00), tos_band(root, 0x08)) == (0, 1, 2)
    text = explain(policy, "text")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^(0x[0-9a-f]{2})  .*$", text, re.M)}
    assert len(rows) == 16
    assert rows["0x10"].split()[-1] == "0" and "6 (interactive)" in rows["0x10"]
    assert rows["0x00"].split()[-1] == "1" and "0 (best effort)" in rows["0x00"]
    assert rows["0x08"].split()[-1] == "2" and "2 (bulk)" in rows["0x08"]


def test_prio_bands_name_their_classes_and_honour_a_priomap() -> None:
    text = explain(_policy("policies/seeds/s000-7.4-prio.tcp"), "text")
    assert re.search(r"^0x10 .* 0 +'high'$", text, re.M)
    assert re.search(r"^0x08 .* 2 +'low'$", text, re.M)
    policy = _inline(
        "interface eth0 prio priomap 2 2 2 2 2 2 1 1 2 2 2 2 2 2 2 2 {\n"
        "    class a\n    class b\n    class c match dport 22\n}\n"
    )
    root = policy.interfaces[0].root
    assert isinstance(root, ir.Prio)
    assert tos_band(root, 0x10) == 1 and tos_band(root, 0x00) == 2
    text = explain(policy, "text")
    assert "the priomap this policy gives" in " ".join(text.split())
    assert re.search(r"^0x10 .* 1 +'b'$", text, re.M)
    assert "no TOS value maps to this band" in " ".join(text.split())


# ---- words ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "phrase"),
    [
        ("match dport 80, 443", "TCP or UDP packets to port 80 or 443"),
        ("match proto tcp dport 1024-2047", "TCP packets to ports 1024-2047"),
        ("match src 10.0.0.0/8 sport 53", "TCP or UDP packets from 10.0.0.0/8 port 53"),
        ("match sport 3072/0xfc00", "TCP or UDP packets from ports 3072-4095"),
        ("match dscp ef", "packets with DSCP EF (46)"),
        ("match tos 0x14", "packets with TOS 0x14 (minimize delay + maximize reliability)"),
        ("match tcp-ack", "small TCP ACKs (TCP packets under 64 bytes with only the ACK flag set)"),
        ("match u8 0x40 at 8", "packets whose TTL (u8 at byte 8) is 0x40"),
        ("match all", "every packet"),
        ("match proto udp, tcp dst 10.1.1.1", "UDP or TCP packets to 10.1.1.1"),
    ],
)
def test_match_phrases(line: str, phrase: str) -> None:
    policy = _inline(
        f"interface eth0 htb rate 10mbit default b {{\n    class a rate 1mbit {line}\n"
        "    class b rate 1mbit\n}\n"
    )
    root = policy.interfaces[0].root
    assert isinstance(root, ir.Htb)
    match = root.classes[0].children[0].matches[0]
    assert match_phrase(match) == phrase
    assert match_text(match) == line.replace("0x40 at", "0x40/0xff at")


@pytest.mark.parametrize(
    ("tree", "line", "phrase"),
    [
        ("", "match dport 443", "IPv6 and IPv4 packets to port 443"),
        ("", "match src 2001:db8::/32", "IPv6 packets from 2001:db8::/32"),
        ("", "match dst 10.0.0.0/8", "IPv4 packets to 10.0.0.0/8"),
        ("", "match family ipv6 dport 22", "IPv6 TCP or UDP packets to port 22"),
        ("", "match proto icmpv6", "ICMPv6 packets"),
        ("", "match proto icmp", "ICMP packets"),
        ("", "match all", "every IPv6 and IPv4 packet"),
        ("family ipv4 ", "match dport 443", "IPv4 packets to port 443"),
        ("classifier flower ", "match dport 443", "IPv6 and IPv4 TCP or UDP packets to port 443"),
        ("family ipv6 ", "match dscp ef", "IPv6 packets with DSCP EF (46)"),
        # IPv6 calls the byte its traffic class, without RFC 1349's meanings (found by a tester)
        ("family ipv6 ", "match tos 0x10", "IPv6 packets with traffic class 0x10"),
        (
            "",
            "match family ipv6 tos 0x10/0xfc",
            "IPv6 packets whose traffic class, under mask 0xfc, is 0x10",
        ),
        ("", "match tos 0x10", "IPv6 and IPv4 packets with TOS 0x10 (minimize delay)"),
        (
            "",
            "match tcp-ack",
            "small IPv6 and IPv4 TCP ACKs (TCP packets with only the ACK flag set and under 64 "
            "bytes, not counting IPv6's 40-byte header)",
        ),
    ],
)
def test_match_phrases_say_the_family(tree: str, line: str, phrase: str) -> None:
    """With its tree's families, a line says which families its filters are for: both by
    default, an address's own, the line's or the tree's 'family'."""
    policy = _inline(
        f"interface eth0 {tree}htb rate 10mbit default b {{\n    class a rate 1mbit {line}\n"
        "    class b rate 1mbit\n}\n"
    )
    iface = policy.interfaces[0]
    assert isinstance(iface.root, ir.Htb)
    match = iface.root.classes[0].children[0].matches[0]
    any_protocol = iface.classifier == "u32"  # u32 on IPv4 reads ports in any packet
    assert match_phrase(match, iface.families, any_protocol) == phrase
    assert match_text(match) == line
    said = _said(policy)
    assert f"{line}: {phrase}" in said


def test_where_ipv6_goes() -> None:
    """The unmatched-traffic sentence says IPv6 goes to the default class only when the tree
    has no IPv6 filters: restricted to IPv4, or every line naming an IPv4 address."""
    for lines, unseen in (
        ("match dport 22", "neither IPv4 nor IPv6, such as ARP"),
        ("match src 10.0.0.0/8", "not IPv4, such as ARP and IPv6"),
        ("match src 2001:db8::/32", "not IPv6, such as ARP and IPv4"),
    ):
        said = _said(
            _inline(
                f"interface eth0 htb rate 10mbit default b {{\n    class a rate 1mbit {lines}\n"
                "    class b rate 1mbit\n}\n"
            )
        )
        assert f"So does everything that is {unseen}" in said


def test_ipv6_notes_per_classifier() -> None:
    """The notes say what each classifier sees of IPv6 extension headers and fragments."""
    text = "htb rate 10mbit default b {\n    class a rate 1mbit match proto tcp dport 22\n" + (
        "    class b rate 1mbit\n}\n"
    )
    u32 = _said(_inline(f"interface eth0 {text}"))
    assert "On IPv6, u32 reads the next header and the ports right after the 40-byte" in u32
    assert "'classifier flower' reads past those headers" in u32
    flower = _said(_inline(f"interface eth0 classifier flower {text}"))
    assert "flower filters on 1: look at each IPv4 and IPv6 packet" in flower
    assert "it reads no ports or TCP flags in a fragment" in flower
    assert "On IPv6, u32" not in flower
    v4 = _said(_inline(f"interface eth0 family ipv4 {text}"))
    assert "On IPv6" not in v4 and "flower" not in v4


def test_ipv6_priority_in_the_tos_table() -> None:
    said = _said(_inline("interface eth0 pfifo_fast\n"))
    assert "IPv6 packets have priority 0 (band 1)" in said
    assert "IPv6 packets have" not in _said(_inline("interface eth0 family ipv4 pfifo_fast\n"))


# ---- the command line --------------------------------------------------------------------------


def _run(*args: str) -> tuple[int, str, str]:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(cwd)
    return result.exit_code, result.stdout, result.stderr


def test_cli_prints_the_explanation() -> None:
    code, out, err = _run("explain", "policies/office.tcp")
    assert code == 0 and not err
    assert out == explain(_policy("policies/office.tcp"), "text")


def test_cli_markdown_tables_are_well_formed() -> None:
    code, out, _ = _run("explain", "--format", "markdown", "policies/seeds/s000-7.4-prio.tcp")
    assert code == 0 and out.startswith("# What policies/seeds/s000-7.4-prio.tcp does\n")
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 18  # header, separator, 16 TOS values
    columns = {len(re.findall(r"(?<!\\)\|", row)) for row in rows}
    assert columns == {6}, columns
    assert rows[1] == "|---|---|---|---|---|"
    assert "**Queue:**" in out and "`match" not in out.split("## Interface")[0]


def test_cli_writes_a_file(tmp_path: Path) -> None:
    target = tmp_path / "office.md"
    code, out, _ = _run("explain", "--format", "markdown", "-o", str(target), "policies/office.tcp")
    assert code == 0 and out == ""
    assert target.read_text(encoding="utf-8") == explain(_policy("policies/office.tcp"), "markdown")


def test_cli_reports_policy_errors_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tcp"
    bad.write_text("interface eth0 htb rate 10mbit default b {\n    class a rate 20mbit\n}\n")
    code, out, err = _run("explain", str(bad))
    assert code == 1 and out == ""
    assert "error:" in err and "[E102]" in err and "nothing explained" in err
    assert "Traceback" not in err


def test_cli_usage_errors() -> None:
    code, _, _ = _run("explain", "--format", "html", "policies/office.tcp")
    assert code == 2


# ---- docs/explain.md -----------------------------------------------------------------------------


def test_docs_example_is_current() -> None:
    doc = (ROOT / "docs" / "explain.md").read_text(encoding="utf-8")
    marker = "tcdsl explain policies/seeds/s000-8.2-borrowing.tcp"
    assert marker in doc
    start = doc.index("\nprints\n", doc.index(marker))
    block = re.compile(r"```\w*\n(.*?)```", re.S).search(doc, start)
    assert block is not None
    code, out, _ = _run("explain", "policies/seeds/s000-8.2-borrowing.tcp")
    assert code == 0 and block.group(1) == out


def test_explain_says_which_lines_are_hashed() -> None:
    lines = [f"    class c{i} rate 1mbit match dst 2001:db8::{i:x}" for i in range(40)]
    text = "interface eth0 htb rate 1gbit default c0 {\n" + "\n".join(lines) + "\n}\n"
    result = analyse("hashed.tcp", loader=lambda _p: text)
    assert result.policy is not None
    said = " ".join(explain(result.policy, result.sources).split())
    assert (
        "The 40 IPv6 filters from line 2 on are hashed on byte 16 of the destination address "
        "(u32 table 1:, 256 buckets)" in said
    ), said


def test_a_written_mq_tree_says_later_tx_queues_are_unshaped(tmp_path: Path) -> None:
    """A written mq tree owns the queues it writes: explain says a packet on a later TX queue
    is unshaped, and that apply and the script refuse more queues in use (found by a tester:
    on 4 queues, 2 written, 18 of 43 packets left unshaped and nothing said so); the spread
    form, which the script refuses on a device with more queues in use, does not say it."""
    written = tmp_path / "w.tcp"
    written.write_text(
        "interface eth5 mq {\n    queue 1 htb rate 10mbit default a {\n"
        "        class a rate 10mbit\n    }\n    queue 3 pfifo\n}\n",
        encoding="utf-8",
    )
    spread = tmp_path / "s.tcp"
    spread.write_text(
        "interface eth5 mq queues 2 htb rate 10mbit burst 15k cburst 15k default a {\n"
        "    class a rate 5mbit\n    class b rate 5mbit match dport 80\n}\n",
        encoding="utf-8",
    )
    texts = []
    for path in (written, spread):
        result = analyse(str(path))
        assert result.policy is not None, result.diagnostics
        texts.append(" ".join(explain(result.policy).split()))
    assert "up to queue 3, are the policy's" in texts[0]
    assert "refuse 'eth5' with more than 3 TX queues in use" in texts[0]
    assert "are the policy's" not in texts[1]
