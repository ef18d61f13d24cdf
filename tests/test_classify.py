"""``tcdsl.teach.classify``: which class a packet ends in, and why, without a kernel.

Unit cases on the example policies and small written ones (filter order by pref, ranges,
masks, tcp-ack, TOS and the priomap, marks, the direct queue), then the ``classify`` command.
The kernel's own answer for random policies and packets is in ``tests/test_classify_kernel.py``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tcdsl import ir
from tcdsl.cli import cli
from tcdsl.driver import analyse
from tcdsl.matching import kernel_order
from tcdsl.tcmath import DEFAULT_PRIOMAP, tos_priority
from tcdsl.tcmath import IP_TOS2PRIO as TOS_TO_PRIORITY
from tcdsl.teach.classify import UnknownInterface, Verdict, classify, direction_of
from tcdsl.teach.traffic import SpecError, parse_packet
from tests.conftest import ROOT

OFFICE = ROOT / "policies" / "office.tcp"
SEEDS = ROOT / "policies" / "seeds"


def _policy(path: Path) -> ir.Policy:
    result = analyse(str(path))
    assert result.policy is not None, result.diagnostics
    return result.policy


def _text_policy(tmp_path: Path, text: str) -> ir.Policy:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return _policy(path)


def _verdict(policy: ir.Policy, spec: str, interface: str | None = None) -> Verdict:
    return classify(policy, parse_packet(spec), interface)


def _name(verdict: Verdict) -> str | None:
    return None if verdict.direct or verdict.cls is None else verdict.cls.name


# ---- office.tcp ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "name", "leaf"),
    [
        ("icmp", "interactive", "sfq"),
        ("udp tos 0x10", "interactive", "sfq"),
        ("udp dport 5001", "voip", None),
        ("tcp dport 443", "web", "fq_codel"),
        ("tcp dport 80", "web", "fq_codel"),
        ("tcp src 10.3.34.11 dport 22", "alice", None),
        ("udp src 10.3.34.33", "bob", None),
        ("tcp dport 22", "bulk", "pfifo"),
        ("udp src 10.3.34.12 dport 5002", "bulk", "pfifo"),
    ],
)
def test_office(spec: str, name: str, leaf: str | None) -> None:
    verdict = _verdict(_policy(OFFICE), spec)
    assert _name(verdict) == name
    assert (verdict.leaf.kind if verdict.leaf else None) == leaf
    assert not verdict.direct
    assert len(verdict.steps) == 1


def test_office_first_line_wins_and_says_why() -> None:
    # dport 5001 from alice: voip's line comes first in the same pref.
    verdict = _verdict(_policy(OFFICE), "tcp src 10.3.34.11 dport 5001 tos 0x10")
    (step,) = verdict.steps
    # tos 0x10 is interactive's second line, written before voip's: it wins.
    assert step.cls is not None and step.cls.name == "interactive"
    assert step.why == "filter pref 1 matched (match tos 0x10/0xfc) -> class 'interactive' (1:10)"
    assert step.span is not None and (step.span.line, step.span.column) == (7, 9)
    verdict = _verdict(_policy(OFFICE), "tcp src 10.3.34.11 dport 5001")
    assert _name(verdict) == "voip"
    assert verdict.steps[0].why.startswith("filter pref 1 matched (match dport 5001)")


def test_default_says_so() -> None:
    (step,) = _verdict(_policy(OFFICE), "udp dport 9").steps
    assert step.why == "no filter matched: htb default 'bulk' -> class 'bulk' (1:70)"
    assert step.span is not None and step.span.line == 4


# ---- TOS, priority and bands ---------------------------------------------------------------


def test_tos_table_is_the_kernels() -> None:
    # net/ipv4/route.c ip_tos2prio, indexed by IPTOS_TOS(tos) >> 1.
    assert TOS_TO_PRIORITY == (0, 0, 0, 0, 2, 2, 2, 2, 6, 6, 6, 6, 4, 4, 4, 4)
    cases = {0x00: 0, 0x02: 0, 0x04: 0, 0x08: 2, 0x10: 6, 0x18: 4, 0x1E: 4, 0xB8: 4}
    assert {tos: tos_priority(tos) for tos in cases} == cases
    assert tos_priority(0xE1) == 0  # precedence bits and ECN do not count


@pytest.mark.parametrize(
    ("tos", "band"),
    [(0x00, 1), (0x10, 0), (0x08, 2), (0x18, 1), (0x04, 1), (0x02, 1), (0x14, 0), (0xB8, 1)],
)
def test_pfifo_fast_bands(tos: int, band: int) -> None:
    verdict = _verdict(_policy(SEEDS / "s004-pfifo-fast.tcp"), f"udp tos {tos}")
    (step,) = verdict.steps
    assert step.cls is None and verdict.cls is None and not verdict.direct
    assert verdict.leaf is not None and verdict.leaf.kind == "pfifo_fast"
    prio = tos_priority(tos)
    assert DEFAULT_PRIOMAP[prio] == band
    assert step.why == f"TOS 0x{tos:02x} -> priority {prio} -> band {band} (pfifo_fast's priomap)"


@pytest.mark.parametrize(
    ("tos", "name"), [(0x10, "high"), (0x00, "middle"), (0x08, "low"), (0x18, "middle")]
)
def test_prio_default_priomap(tos: int, name: str) -> None:
    verdict = _verdict(_policy(SEEDS / "s000-7.4-prio.tcp"), f"udp tos {tos}")
    assert _name(verdict) == name
    assert "(the default priomap)" in verdict.steps[0].why


def test_prio_given_priomap_and_filters(tmp_path: Path) -> None:
    text = (
        "interface eth0 prio bands 2 priomap 1 1 1 1 1 1 0 1 1 1 1 1 1 1 1 1 {\n"
        "    class fast match dport 53\n"
        "    class slow\n"
        "}\n"
    )
    policy = _text_policy(tmp_path, text)
    assert _name(_verdict(policy, "udp dport 53")) == "fast"
    verdict = _verdict(policy, "udp tos 0x10")  # priority 6 -> band 0
    assert _name(verdict) == "fast"
    step = verdict.steps[0]
    assert "priority 6 -> band 0 (priomap)" in step.why
    assert step.span is not None and step.span.column == text.index("0 1 1 1") + 1
    assert _name(_verdict(policy, "udp")) == "slow"


# ---- htb: direct queue, pref order, ranges, tcp-ack, nesting --------------------------------


def test_no_default_is_the_direct_queue() -> None:
    policy = _policy(SEEDS / "s001-htb-700-300.tcp")
    assert _name(_verdict(policy, "udp src 10.0.0.2")) == "h2"
    verdict = _verdict(policy, "udp src 10.0.0.3")
    assert verdict.direct and verdict.cls is None and verdict.leaf is None
    assert verdict.steps[0].why == (
        "no filter matched and htb has no default: the direct queue, unshaped"
    )


def _htb(body: str, default: str = "bulk") -> str:
    head = f"interface eth0 htb rate 10mbit default {default} {{\n"
    return f"{head}{body}    class bulk rate 1mbit\n}}\n"


def test_pref_order(tmp_path: Path) -> None:
    policy = _text_policy(
        tmp_path,
        _htb(
            "    class sip rate 2mbit match proto udp dport 5060 pref 2\n"
            "    class udp rate 2mbit match proto udp pref 1\n"
            "    class late rate 2mbit match dport 5060 pref 3\n"
        ),
    )
    verdict = _verdict(policy, "udp dport 5060")
    assert _name(verdict) == "udp"
    assert verdict.steps[0].why.startswith("filter pref 1 matched (match udp) -> class 'udp'")
    assert _name(_verdict(policy, "tcp dport 5060")) == "late"


def test_kernel_order_is_stable_by_pref() -> None:
    items = [("a", 2), ("b", 1), ("c", 2), ("d", 1)]
    assert kernel_order(items, lambda t: t[1]) == [("b", 1), ("d", 1), ("a", 2), ("c", 2)]


def test_port_range_and_mask(tmp_path: Path) -> None:
    policy = _text_policy(
        tmp_path,
        _htb(
            "    class ranged rate 2mbit match dport 1000-2000\n"
            "    class masked rate 2mbit match sport 3072/0xfc00\n"
        ),
    )
    for port, name in [(999, "bulk"), (1000, "ranged"), (1500, "ranged"), (2000, "ranged")]:
        assert _name(_verdict(policy, f"udp dport {port}")) == name, port
    assert _name(_verdict(policy, "udp dport 2001")) == "bulk"
    assert _name(_verdict(policy, "udp sport 3072")) == "masked"
    assert _name(_verdict(policy, "udp sport 4095")) == "masked"
    assert _name(_verdict(policy, "udp sport 4096")) == "bulk"


def test_tcp_ack(tmp_path: Path) -> None:
    policy = _text_policy(tmp_path, _htb("    class acks rate 2mbit match tcp-ack\n"))
    assert _name(_verdict(policy, "ack")) == "acks"
    assert _name(_verdict(policy, "tcp ack iplen 64")) == "bulk"  # too long (TCP options)
    assert _name(_verdict(policy, "tcp ack iplen 63")) == "acks"
    assert _name(_verdict(policy, "tcp size 54")) == "bulk"  # PSH too
    assert _name(_verdict(policy, "udp size 54")) == "bulk"


def test_dscp_and_tos_mask(tmp_path: Path) -> None:
    policy = _text_policy(
        tmp_path,
        _htb(
            "    class ef rate 2mbit match dscp ef\n    class low rate 2mbit match tos 0x08/0x08\n"
        ),
    )
    assert _name(_verdict(policy, "udp dscp ef")) == "ef"
    assert _name(_verdict(policy, "udp tos 0xb9")) == "ef"  # ECN bits ignored
    assert _name(_verdict(policy, "udp tos 0x0c")) == "low"
    assert _name(_verdict(policy, "udp tos 0x04")) == "bulk"


def test_raw_keys(tmp_path: Path) -> None:
    policy = _text_policy(
        tmp_path,
        _htb("    class ttl rate 2mbit match u8 64/0xff at 8\n"),
    )
    assert _name(_verdict(policy, "udp")) == "ttl"  # Packet's TTL is 64


def _sum16(data: bytes) -> int:
    """RFC 1071's one's complement sum of ``data`` (0xffff over a message whose checksum is
    right)."""
    data += bytes(len(data) % 2)
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def test_the_bytes_after_the_ip_header_are_what_a_host_sends() -> None:
    """Found by a tester sending from real sockets: classify wrote ports 40000/9 after the IP
    header of every packet (an ICMP echo request's type and code, which a port line reads as
    sport 2048, were not there), a UDP length of 0 and a TCP data offset of 5 for an ACK with
    timestamps; the kernel sent such packets elsewhere."""
    ping = parse_packet("icmp src 10.1.2.3 dst 8.8.8.8 iplen 84").ip_packet()
    assert ping[20:22] == bytes([8, 0]) and _sum16(ping[20:]) == 0xFFFF
    six = parse_packet("icmpv6 src 2001:db8::5 dst 2600::1 iplen 104").ip_packet()
    pseudo = six[8:40] + (len(six) - 40).to_bytes(4, "big") + (58).to_bytes(4, "big")
    assert six[40:42] == bytes([128, 0]) and _sum16(pseudo + six[40:]) == 0xFFFF
    udp = parse_packet("udp iplen 1028").ip_packet()
    assert int.from_bytes(udp[24:26], "big") == 1008
    ack = parse_packet("tcp ack iplen 52").ip_packet()
    assert ack[32] >> 4 == 8 and parse_packet("tcp iplen 1000").ip_packet()[32] >> 4 == 5
    assert parse_packet("proto gre").ip_packet()[20:24] == bytes(4)


@pytest.mark.parametrize(
    ("spec", "length", "refused"),
    [
        ("udp iplen 28", 28, "udp iplen 27"),
        ("icmp iplen 28", 28, "icmp iplen 27"),
        ("tcp iplen 40", 40, "tcp iplen 39"),
        ("proto gre iplen 20", 20, "proto gre iplen 19"),
        ("ipv6 udp iplen 48", 48, "ipv6 udp iplen 47"),
        ("ipv6 udp hbh iplen 56", 56, "ipv6 udp hbh iplen 55"),
    ],
)
def test_the_shortest_packet_is_the_protocols(spec: str, length: int, refused: str) -> None:
    """Found by a tester: every packet had to hold 20 bytes after its IP headers, so an
    empty UDP datagram (28 bytes) could not be asked about; the least is the protocol's
    header, and the bytes a key reads end with the packet."""
    packet = parse_packet(spec)
    assert len(packet.header()) == length == packet.size - 14
    with pytest.raises(SpecError, match="is outside"):
        parse_packet(refused)


def test_a_port_line_matching_a_packet_without_ports_says_what_it_read(tmp_path: Path) -> None:
    policy = _text_policy(
        tmp_path,
        _htb(
            "    class echo rate 2mbit match sport 2048\n"
            "    class short rate 2mbit match proto udp u16 0x0000/0xff00 at 24\n"
            "    class opts rate 2mbit match proto tcp u8 0x80/0xf0 at 32\n"
        ),
    )
    ping = _verdict(policy, "icmp iplen 84")
    assert _name(ping) == "echo"
    assert "(ICMP has no ports: u32's port keys read the 4 bytes after the IP header, here the " \
        "echo request's type and code as sport 2048 and its checksum as dport 63487)" \
        in ping.steps[-1].why  # fmt: skip
    assert _name(_verdict(policy, "udp dport 2048 iplen 100")) == "short"
    assert _name(_verdict(policy, "udp iplen 1028")) == "bulk"
    assert _name(_verdict(policy, "tcp ack iplen 52")) == "opts"
    assert _name(_verdict(policy, "tcp ack iplen 40")) == "bulk"
    assert "no ports" not in _verdict(policy, "udp sport 2048").steps[-1].why


def test_nested_htb(tmp_path: Path) -> None:
    text = (
        "interface eth0 htb rate 10mbit default bulk {\n"
        "    class inner rate 5mbit match dport 80 {\n"
        "        htb default rest {\n"
        "            class ssh rate 1mbit match sport 22\n"
        "            class rest rate 1mbit\n"
        "        }\n"
        "    }\n"
        "    class bulk rate 1mbit\n"
        "}\n"
    )
    policy = _text_policy(tmp_path, text)
    verdict = _verdict(policy, "tcp sport 22 dport 80")
    assert [s.cls.name if s.cls else None for s in verdict.steps] == ["inner", "ssh"]
    assert verdict.cls is not None and verdict.cls.name == "ssh"
    verdict = _verdict(policy, "tcp sport 23 dport 80")
    assert [s.cls.name if s.cls else None for s in verdict.steps] == ["inner", "rest"]
    assert _name(_verdict(policy, "tcp sport 22 dport 81")) == "bulk"


# ---- marks ------------------------------------------------------------------------------------


def test_marks() -> None:
    policy = _policy(SEEDS / "s000-10.1-marks.tcp")
    verdict = _verdict(policy, "tcp dport 5001")
    assert _name(verdict) == "app5001"
    why = verdict.steps[0].why
    assert "rule 1 (match tcp dport 5001) set mark 10" in why
    assert "fw filter pref 1 maps mark 10" in why
    assert "eth1" in why
    assert _name(_verdict(policy, "tcp dport 5002")) == "app5002"
    verdict = _verdict(policy, "udp dport 5001")  # iptables' --dport needs the protocol
    assert _name(verdict) == "others"
    assert "still-unmarked packets the default's mark 30" in verdict.steps[0].why


def test_marks_without_default(tmp_path: Path) -> None:
    text = (
        "interface eth0 htb rate 10mbit {  # tcdsl: disable=W310\n"
        "    classify by mark from eth1\n"
        "    class app rate 2mbit match proto tcp dport 22\n"
        "}\n"
    )
    policy = _text_policy(tmp_path, text)
    assert _name(_verdict(policy, "tcp dport 22")) == "app"
    verdict = _verdict(policy, "tcp dport 23")
    assert verdict.direct
    assert "the packet is unmarked; no fw filter maps mark 0" in verdict.steps[0].why


# ---- interfaces ----------------------------------------------------------------------------


def test_interfaces(tmp_path: Path) -> None:
    text = "interface eth0 pfifo_fast\ninterface eth1 htb rate 1mbit default a {\n" + (
        "    class a rate 1mbit\n}\n"
    )
    policy = _text_policy(tmp_path, text)
    assert _verdict(policy, "udp").interface.name == "eth0"
    assert _name(_verdict(policy, "udp", "eth1")) == "a"
    with pytest.raises(UnknownInterface, match=r"no interface 'eth9' \(it has: eth0, eth1\)"):
        _verdict(policy, "udp", "eth9")


def test_every_example_policy_classifies() -> None:
    """No example policy makes classify fail, for a few packets."""
    specs = (
        *("udp", "tcp dport 80 tos 0x10", "icmp src 10.0.0.1", "ack", "udp dport 5001"),
        *("ipv6 tcp dport 443", "ipv6 hbh udp dport 5001", "icmpv6", "ipv6 frag ack"),
    )
    for path in sorted((ROOT / "policies").rglob("*.tcp")):
        policy = _policy(path)
        for iface in policy.interfaces:
            for spec in specs:
                verdict = classify(policy, parse_packet(spec), iface.name, direction_of(iface))
                assert verdict.interface is iface, path
                # A download's first step is the redirect that brings the packet to its tree.
                first = 1 if iface.download is not None else 0
                assert verdict.steps[first].qdisc is iface.root, path
                for step in verdict.steps:
                    assert step.why, path


# ---- the command ------------------------------------------------------------------------------


def _run(monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.chdir(ROOT)
    return CliRunner().invoke(cli, ["classify", *args])


def test_cli_text(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/office.tcp", "--packet", "tcp src 10.3.34.11 dport 22")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "tcp src 10.3.34.11 dst 10.0.0.2 sport 40000 dport 22 size 1514 -> class 'alice' "
        "(1:50), leaf pfifo (kernel default)\n"
        "    policies/office.tcp:16:43: htb 1: filter pref 1 matched (match src 10.3.34.11) "
        "-> class 'alice' (1:50)\n"
    )


def test_cli_on_a_policy_without_interfaces_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: an empty policy was a usage error blaming '--interface', which was
    not given ('no interface '(none)''); now it says what simulate says, exit 1."""
    policy = tmp_path / "empty.tcp"
    policy.write_text("", encoding="utf-8")
    said = _run(monkeypatch, str(policy), "--packet", "udp")
    assert said.exit_code == 1, said.output
    assert said.stderr == "tcdsl: the policy has no interface: no packet reaches a tree\n"


VOIP = """\
interface eth0 htb rate 10mbit default bulk {
    class voip rate 2mbit match proto udp dport 5060
    class other rate 1mbit match src 10.0.0.0/8
    class bulk rate 1mbit
}
"""


def test_cli_says_where_the_fragments_of_a_big_packet_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: a UDP packet of 3000 bytes was said to go to 'voip' with no word
    that it leaves in fragments and that the later ones, without the ports, end elsewhere.
    Now a note names where they end (the class of 'laterfrag'), in text and JSON; a packet
    that fits, a fragment already, and TCP (a GSO packet, cut after the qdisc) get none."""
    policy = tmp_path / "voip.tcp"
    policy.write_text(VOIP, encoding="utf-8")
    big = _run(monkeypatch, str(policy), "--packet", "udp dport 5060 size 3000")
    assert big.exit_code == 0, big.output
    lines = big.stdout.splitlines()
    assert lines[0].endswith("-> class 'voip' (1:10), leaf pfifo (kernel default)"), lines
    assert lines[-1].startswith("    note: a packet of 2986 bytes is more than a 1500-byte MTU")
    assert "end in class 'other' (1:20), leaf pfifo (kernel default) (u32 reads" in lines[-1]
    later = _run(monkeypatch, str(policy), "--packet", "udp dport 5060 laterfrag")
    assert "-> class 'other' (1:20)" in later.stdout.splitlines()[0], later.stdout
    same = _run(monkeypatch, str(policy), "--packet", "udp dport 9 src 1.2.3.4 size 2000")
    assert "the later ones (classify '... laterfrag') end there too" in same.stdout, same.stdout
    v6 = _run(monkeypatch, str(policy), "--packet", "ipv6 udp dport 5060 iplen 4000")
    assert "(IPv6: cut by the host that sends it;" in v6.stdout, v6.stdout
    assert "-> class 'bulk' (1:30)" in v6.stdout.splitlines()[0], v6.stdout
    for fits in ("udp dport 5060", "tcp dport 5060 size 9000", "udp dport 5060 frag size 3000"):
        quiet = _run(monkeypatch, str(policy), "--packet", fits)
        assert quiet.exit_code == 0 and "note:" not in quiet.stdout, (fits, quiet.stdout)
    shown = _run(monkeypatch, str(policy), "--packet", "udp dport 5060 size 3000", "--packet",
                 "udp dport 5060", "--format", "json")  # fmt: skip
    first, second = json.loads(shown.stdout)
    assert first["later_fragments"] == "class 'other' (1:20), leaf pfifo (kernel default)"
    assert second["later_fragments"] is None


MARKS_AND_FLOWER = """\
interface eth0 {
    upload htb rate 10mbit default bulk {
        classify by mark from local
        class voip rate 2mbit match proto udp dport 5060
        class bulk rate 1mbit
    }
    download connmark htb rate 50mbit default rest {
        classify by mark from eth0
        class voip rate 2mbit match proto udp sport 5060
        class rest rate 1mbit
    }
}
interface eth1 classifier flower htb rate 10mbit default bulk {
    class voip rate 2mbit match proto udp dport 5060
    class bulk rate 1mbit
}
"""


def test_a_big_datagram_is_classified_as_its_first_fragment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: the fragments note was right for IPv4 under u32 only. The verdict
    is now the first fragment's (flower and IPv6's u32 find no ports in it), with where the
    packet would end whole; an upload by mark gets no note (iptables marks the packet before
    it is cut, every fragment keeps the mark); a download's fragments arrive cut, and its
    later ones keep no mark (connmark finds no connection without the ports)."""
    policy = tmp_path / "marks.tcp"
    policy.write_text(MARKS_AND_FLOWER, encoding="utf-8")
    flower = _run(monkeypatch, str(policy), "--interface", "eth1",
                  "--packet", "udp dport 5060 size 3000", "--format", "json")  # fmt: skip
    (shown,) = json.loads(flower.stdout)
    assert shown["class"] == "bulk", shown
    assert shown["whole"] == "class 'voip' (1:10), leaf pfifo (kernel default)", shown
    assert shown["later_fragments"] == "class 'bulk' (1:20), leaf pfifo (kernel default)"
    text = _run(
        monkeypatch, str(policy), "--interface", "eth1", "--packet", "ipv6 udp dport 5060 size 3000"
    )
    assert "-> class 'bulk' (1:20)" in text.stdout.splitlines()[0], text.stdout
    assert "ends as shown (whole, it would end in class 'voip'" in text.stdout
    upload = _run(
        monkeypatch, str(policy), "--interface", "eth0", "--packet", "udp dport 5060 size 3000"
    )
    assert "-> class 'voip' (1:10)" in upload.stdout.splitlines()[0], upload.stdout
    assert "note: a packet" not in upload.stdout, upload.stdout
    download = _run(monkeypatch, str(policy), "--interface", "eth0", "--direction", "download",
                    "--packet", "udp sport 5060 size 3000")  # fmt: skip
    assert "-> class 'voip' (1:10)" in download.stdout.splitlines()[0], download.stdout
    assert "it arrives in fragments (cut by its sender or a router on the way)" in download.stdout
    assert download.stdout.rstrip().endswith(
        "end in class 'rest' (1:20), leaf pfifo (kernel default) (without the ports, connmark "
        "finds no connection for them: they stay unmarked)"
    )
    ingress = tmp_path / "ingress.tcp"
    ingress.write_text(
        "interface eth0 {\n    ingress {\n"
        "        match proto udp dport 5060 police rate 1mbit burst 10k\n    }\n}\n",
        encoding="utf-8",
    )
    policed = _run(monkeypatch, str(ingress), "--packet", "udp dport 5060 size 3000")
    said = " ".join(policed.stdout.split())
    assert "the later ones (classify '... laterfrag') end there too, but not by that line: no " \
        "policer's match takes it: it is accepted as it is" in said, said  # fmt: skip
    later = _run(monkeypatch, str(policy), "--interface", "eth0", "--direction", "download",
                 "--packet", "udp sport 5060 laterfrag")  # fmt: skip
    assert "-> class 'rest' (1:20)" in later.stdout.splitlines()[0], later.stdout
    assert "connmark finds no connection for it and restores no mark" in later.stdout


MIXED = """\
interface eth0 htb rate 10mbit default bulk {
    classify by mark from local pref 10
    class rtp rate 2mbit match proto udp dport 5004 pref 5
    class voip rate 2mbit match proto udp dport 5060
    class bulk rate 1mbit
}
"""


def test_fragments_under_marks_and_lines_of_their_own_pref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: an upload by mark got no fragments note even where a u32 line of
    its own pref runs before the fw filters. The marking rules see the datagram whole (the
    default's mark here), and the u32 line sees each fragment: on IPv6 none of them has the
    port where u32 reads it, so every fragment is 'bulk' (whole, 'rtp'); on IPv4 the later
    ones are. A line the marks take alone still gets no note."""
    policy = tmp_path / "mixed.tcp"
    policy.write_text(MIXED, encoding="utf-8")
    v6 = _run(monkeypatch, str(policy), "--packet", "ipv6 udp dport 5004 size 3000",
              "--format", "json")  # fmt: skip
    (shown,) = json.loads(v6.stdout)
    assert shown["class"] == "bulk" and shown["whole"].startswith("class 'rtp'"), shown
    assert shown["whole_why"].startswith("filter pref 32773 matched"), shown
    assert shown["later_fragments"].startswith("class 'bulk'"), shown
    v4 = _run(monkeypatch, str(policy), "--packet", "udp dport 5004 size 3000")
    assert "-> class 'rtp' (1:10)" in v4.stdout.splitlines()[0], v4.stdout
    said = " ".join(v4.stdout.split())
    assert "the later ones (classify '... laterfrag') end in class 'bulk' (1:30)" in said, said
    assert "u32 reads a later fragment's payload where the ports would be" in said, said
    marked = _run(monkeypatch, str(policy), "--packet", "udp dport 5060 size 3000")
    assert "-> class 'voip' (1:20)" in marked.stdout and "note:" not in marked.stdout


def test_an_ipv6_fragment_header_goes_after_the_routing_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: the fragment header of a cut packet was put after every extension
    header; Linux puts it after hop-by-hop and routing headers and before the destination
    options that follow a routing header (ip6_find_1stfragopt), so flower reads protocol 60
    and 'match proto udp' misses, as for the packet written with 'frag' there."""
    policy = tmp_path / "flower.tcp"
    policy.write_text(
        "interface eth1 classifier flower htb rate 10mbit default bulk {\n"
        "    class udp rate 2mbit match proto udp\n    class bulk rate 1mbit\n}\n",
        encoding="utf-8",
    )
    for spec in ("ipv6 rthdr dstopt udp size 3000", "ipv6 rthdr frag dstopt udp"):
        got = _run(monkeypatch, str(policy), "--packet", spec)
        assert "-> class 'bulk' (1:20)" in got.stdout.splitlines()[0], (spec, got.stdout)
    # destination options before the routing header stay ahead of it: the fragment header
    # then says udp, which flower reads (without ports)
    before = _run(monkeypatch, str(policy), "--packet", "ipv6 dstopt rthdr udp size 3000")
    assert "-> class 'udp' (1:10)" in before.stdout.splitlines()[0], before.stdout
    assert "past the dstopt, rthdr and frag headers" in before.stdout, before.stdout


def test_cli_says_when_the_name_given_is_not_this_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: 'classify --name typo' answered silently with the file's own class
    ids, as if they were the kernel's. Now a note says nothing is applied as that name (or
    another file is); without --name, and with nothing applied, no note."""
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    policy = tmp_path / "voip.tcp"
    policy.write_text(VOIP, encoding="utf-8")
    named = _run(monkeypatch, str(policy), "--name", "typo", "--packet", "udp dport 5060")
    assert named.exit_code == 0, named.output
    assert "tcdsl: note: nothing is applied as 'typo': the class ids here are this file's own" in (
        named.stderr
    ), named.stderr
    assert "-> class 'voip' (1:10)" in named.stdout
    plain = _run(monkeypatch, str(policy), "--packet", "udp dport 5060")
    assert plain.exit_code == 0 and plain.stderr == "", plain.stderr


def test_cli_blames_the_option_that_names_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a tester: '--direction download' on a policy without a download was blamed on
    '--interface' ("no interface 'eth0 download'"); now on '--direction', with the trees the
    interface has. An unknown interface still blames '--interface'."""
    office = "policies/office.tcp"
    wrong = _run(monkeypatch, office, "--direction", "download", "--packet", "udp")
    assert wrong.exit_code == 2, wrong.output
    said = " ".join(wrong.output.split())
    assert "Invalid value for '--direction': interface 'eth0' has no download tree (it has: " \
        "upload)" in said, said  # fmt: skip
    unknown = _run(monkeypatch, office, "--interface", "eth9", "--packet", "udp")
    assert unknown.exit_code == 2 and "Invalid value for '--interface'" in unknown.output


def test_a_bare_ack_with_flags_is_a_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """'ack' (only ACK set, no payload) and 'flags syn,ack' contradict each other: it was
    accepted and printed as both."""
    with pytest.raises(SpecError, match="'ack' is a bare ACK"):
        parse_packet("tcp ack flags syn,ack")
    done = _run(monkeypatch, "policies/office.tcp", "--packet", "tcp ack flags syn")
    assert done.exit_code == 2 and "'ack' is a bare ACK" in done.output, done.output
    assert parse_packet("tcp flags ack").tcp_flags == 0x10


def test_cli_direct_and_classless(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/seeds/s001-htb-700-300.tcp", "--packet", "udp src 1.2.3.4")
    assert result.exit_code == 0, result.output
    assert " -> the direct queue of htb 1: (unshaped)\n" in result.stdout
    result = _run(monkeypatch, "policies/seeds/s004-pfifo-fast.tcp", "--packet", "udp dscp ef")
    assert result.exit_code == 0, result.output
    assert " -> qdisc pfifo_fast 1:\n" in result.stdout
    assert "TOS 0xb8 -> priority 4 -> band 1 (pfifo_fast's priomap)" in result.stdout


def test_cli_json(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(
        monkeypatch,
        "policies/seeds/s000-10.1-marks.tcp",
        "--packet",
        "tcp dport 5002",
        "--packet",
        "icmp",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(d["class"], d["classid"], d["leaf"], d["direct"]) for d in data] == [
        ("app5002", "1:20", "sfq", False),
        ("others", "1:30", "pfifo", False),
    ]
    assert [d["family"] for d in data] == ["ipv4", "ipv4"]
    (step,) = data[0]["steps"]
    assert step["qdisc"] == "htb" and step["handle"] == "1:" and "set mark 20" in step["why"]
    assert step["span"] == {"file": "policies/seeds/s000-10.1-marks.tcp", "line": 32, "column": 48}


def test_cli_bad_packet_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/office.tcp", "--packet", "tcp dport 70000")
    assert result.exit_code == 2
    assert "'tcp dport 70000': dport 70000 is outside 0-65535" in result.stderr
    assert "Traceback" not in result.output


def test_cli_size_is_the_frame_iplen_the_ip_packet(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/office.tcp", "--packet", "tcp size 52")
    assert result.exit_code == 2
    assert "size counts the frame on the wire" in result.stderr
    assert "write 'iplen 52' (size 66)" in result.stderr
    acks = "tests/apply_policies/nested-htb.tcp"  # class acks: match tcp-ack (IP length < 64)
    result = _run(monkeypatch, acks, "--packet", "ack iplen 52", "--packet", "ack iplen 64")
    assert result.exit_code == 0, result.output
    first, second = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert first.endswith("ack size 66 -> class 'acks' (1:50), leaf pfifo (kernel default)"), first
    assert "'acks'" not in second


def test_cli_packet_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/office.tcp")
    assert result.exit_code == 2
    assert "--packet" in result.stderr


def test_cli_unknown_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, "policies/office.tcp", "--packet", "udp", "--interface", "eth9")
    assert result.exit_code == 2
    assert "no interface 'eth9' (it has: eth0)" in result.stderr


def test_cli_policy_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tcp"
    bad.write_text("interface eth0 htb rate 1mbit {\n    class a rate 2mbit rate 3mbit\n}\n")
    result = _run(monkeypatch, str(bad), "--packet", "udp")
    assert result.exit_code == 1
    assert "error: 'rate' is given twice [E014]" in result.stderr
    assert "tcdsl: 1 error; nothing classified" in result.stderr
    assert result.stdout == ""
    missing = _run(monkeypatch, str(tmp_path / "none.tcp"), "--packet", "udp")
    assert missing.exit_code == 1 and "[E006]" in missing.stderr


def test_cli_via_main_exit_codes() -> None:
    """The installed entry point: usage errors exit 2, without a traceback."""
    main = [sys.executable, "-c", "from tcdsl.cli import main; main()"]
    proc = subprocess.run(
        [*main, "classify", str(OFFICE), "--packet", "tcp dport x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "dport needs a number, found 'x'" in proc.stderr and "Traceback" not in proc.stderr


# ---- docs/classify.md ------------------------------------------------------------------------


def test_doc_example_is_the_commands_output(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (ROOT / "docs" / "classify.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```console\n\$ tcdsl (.*?)\n(.*?)```", doc, re.DOTALL)
    assert blocks, "docs/classify.md has no example"
    for command, output in blocks:
        args = shlex.split(command)
        assert args[0] == "classify"
        result = _run(monkeypatch, *args[1:])
        assert result.exit_code == 0, result.output
        assert result.stdout == output


# ---- IPv6 -------------------------------------------------------------------------------------

DUAL = (
    "interface eth0 classifier {classifier} htb rate 100mbit default bulk {{\n"
    "    class web rate 10mbit match dport 443\n"
    "    class lan rate 10mbit match src 2001:db8::/32\n"
    "    class v4lan rate 10mbit match src 10.0.0.0/8 proto tcp\n"
    "    class voice rate 10mbit match dscp ef\n"
    "    class syn rate 10mbit match tcp-flags syn of syn, ack\n"
    "    class ping rate 10mbit match proto icmpv6\n"
    "    class v6only rate 10mbit match family ipv6 dport 22\n"
    "    class bulk rate 10mbit\n"
    "}}\n"
)


def _dual(tmp_path: Path, classifier: str = "u32") -> ir.Policy:
    return _text_policy(tmp_path, DUAL.format(classifier=classifier))


@pytest.mark.parametrize("classifier", ["u32", "flower"])
@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("ipv6 tcp src 2001:db9::1 dport 443", "web"),
        ("tcp src 192.168.0.1 dport 443", "web"),
        ("ipv6 udp src 2001:db8:1::5", "lan"),
        ("tcp src 10.1.2.3", "v4lan"),
        ("ipv6 tcp src 2001:db9::1 dscp ef", "voice"),
        ("ipv6 tcp src 2001:db9::1 dport 80 flags syn", "syn"),
        ("ipv6 icmpv6 src 2001:db9::1", "ping"),
        ("ipv6 tcp src 2001:db9::1 dport 22", "v6only"),
        ("tcp src 192.168.0.1 dport 22", "bulk"),  # 'family ipv6': not for IPv4
        ("icmp", "bulk"),
    ],
)
def test_dual_stack(tmp_path: Path, classifier: str, spec: str, name: str) -> None:
    """A line without addresses matches both families, one with an address its own, and a
    'family' line only that family; u32 and flower decide alike when no extension header
    is in the way."""
    assert _name(_verdict(_dual(tmp_path, classifier), spec)) == name


def test_ipv6_decision_path_says_the_family_and_pref(tmp_path: Path) -> None:
    verdict = _verdict(_dual(tmp_path), "ipv6 tcp src 2001:db9::1 dport 443")
    assert "filter pref 32769 matched (IPv6: match dport 443)" in verdict.steps[0].why
    verdict = _verdict(_dual(tmp_path, "flower"), "ipv6 tcp src 2001:db9::1 dport 443")
    assert "flower filter pref 32769 matched (IPv6: match dport 443)" in verdict.steps[0].why
    verdict = _verdict(_dual(tmp_path, "flower"), "tcp dport 443")
    assert "flower filter pref 1 matched (IPv4: match dport 443)" in verdict.steps[0].why


@pytest.mark.parametrize("header", ["hbh", "rthdr", "dstopt"])
def test_extension_header_misses_u32_but_not_flower(tmp_path: Path, header: str) -> None:
    """u32 reads the next header and ports right after the fixed header, so a packet with a
    hop-by-hop, routing or destination-options header falls through; flower's dissector
    walks those headers to TCP and matches."""
    spec = f"ipv6 {header} tcp src 2001:db9::1 dport 443"
    u32 = _verdict(_dual(tmp_path), spec)
    assert _name(u32) == "bulk"
    assert f"where this packet has its {header} header" in u32.steps[0].why
    flower = _verdict(_dual(tmp_path, "flower"), spec)
    assert _name(flower) == "web"
    assert f"the flow dissector read past the {header} header" in flower.steps[0].why


def test_address_and_dscp_need_no_walk(tmp_path: Path) -> None:
    """Fields of the fixed header (addresses, traffic class) match past extension headers
    under u32 as well."""
    policy = _dual(tmp_path)
    assert _name(_verdict(policy, "ipv6 hbh tcp src 2001:db8::9")) == "lan"
    assert _name(_verdict(policy, "ipv6 hbh udp src 2001:db9::9 dscp ef")) == "voice"


@pytest.mark.parametrize("fragment", ["frag", "laterfrag"])
def test_fragments_under_flower(tmp_path: Path, fragment: str) -> None:
    """The flow dissector stops at a fragment header: the protocol is known, the ports and TCP
    flags are 0, so port and flag filters miss every fragment; a protocol filter matches."""
    policy = _dual(tmp_path, "flower")
    verdict = _verdict(policy, f"ipv6 {fragment} tcp src 2001:db9::1 dport 443")
    assert _name(verdict) == "bulk"
    assert "a fragment no ports and no TCP flags" in verdict.steps[0].why
    verdict = _verdict(policy, f"ipv6 {fragment} tcp src 2001:db9::1 dport 80 flags syn")
    assert _name(verdict) == "bulk"
    text = "interface eth0 classifier flower htb rate 1mbit default b {\n" + (
        "    class t rate 1mbit match proto tcp\n    class b rate 1mbit\n}\n"
    )
    proto = _text_policy(tmp_path, text)
    assert _name(_verdict(proto, f"ipv6 {fragment} tcp")) == "t"
    assert _name(_verdict(proto, f"tcp {fragment}")) == "t"  # IPv4 too
    assert _name(_verdict(proto, "ipv6 auth tcp")) == "b"  # flower stops at AH


def test_flower_ipv4_fragment_has_no_ports(tmp_path: Path) -> None:
    policy = _dual(tmp_path, "flower")
    assert _name(_verdict(policy, "tcp src 192.168.0.1 dport 443 frag")) == "bulk"
    assert _name(_verdict(_dual(tmp_path), "tcp src 192.168.0.1 dport 443 frag")) == "web"


@pytest.mark.parametrize(
    ("family", "v4", "v6"),
    [("ipv4", "web", "bulk"), ("ipv6", "bulk", "web"), ("both", "web", "web")],
)
def test_tree_family(tmp_path: Path, family: str, v4: str, v6: str) -> None:
    """A tree restricted to one family has no filter for the other: it goes to the default,
    and the decision says why."""
    text = f"interface eth0 family {family} htb rate 1mbit default bulk {{\n" + (
        "    class web rate 1mbit match dport 443\n    class bulk rate 1mbit\n}\n"
    )
    policy = _text_policy(tmp_path, text)
    assert _name(_verdict(policy, "tcp dport 443")) == v4
    verdict = _verdict(policy, "ipv6 tcp dport 443")
    assert _name(verdict) == v6
    if family == "ipv4":
        assert "the tree classifies IPv4 only: no filter of it sees IPv6" in verdict.steps[0].why


def test_ipv6_priority_is_zero(tmp_path: Path) -> None:
    """prio and pfifo_fast read the priority; an IPv6 packet's traffic class sets none."""
    policy = _text_policy(tmp_path, "interface eth0 pfifo_fast\n")
    assert "band 0" in _verdict(policy, "udp tos 0x10").steps[0].why
    verdict = _verdict(policy, "ipv6 udp tos 0x10")
    assert "IPv6 (its traffic class sets no priority) -> priority 0 -> band 1" in (
        verdict.steps[0].why
    )


def test_marks_per_family(tmp_path: Path) -> None:
    """'classify by mark': ip6tables marks IPv6 packets (finding the protocol past extension
    headers but AH, as the host kernel does), and the fw filter of IPv6 maps the mark."""
    text = (
        "interface eth0 htb rate 10mbit default other {\n"
        "    classify by mark from eth1\n"
        "    class app rate 2mbit match proto tcp dport 22\n"
        "    class net6 rate 2mbit match src 2001:db8::/32\n"
        "    class other rate 2mbit\n"
        "}\n"
    )
    policy = _text_policy(tmp_path, text)
    verdict = _verdict(policy, "ipv6 tcp src 2001:db9::1 dport 22")
    assert _name(verdict) == "app"
    why = verdict.steps[0].why
    assert "ip6tables chain" in why and "fw filter pref 32769 maps mark" in why
    assert _name(_verdict(policy, "tcp dport 22")) == "app"
    assert "fw filter pref 1 maps" in _verdict(policy, "tcp dport 22").steps[0].why
    assert _name(_verdict(policy, "ipv6 hbh dstopt tcp src 2001:db9::1 dport 22")) == "app"
    assert _name(_verdict(policy, "ipv6 auth tcp src 2001:db9::1 dport 22")) == "other"
    assert _name(_verdict(policy, "ipv6 frag tcp src 2001:db9::1 dport 22")) == "app"
    later = _verdict(policy, "ipv6 laterfrag tcp src 2001:db9::1 dport 22")
    assert _name(later) == "other"
    assert _name(_verdict(policy, "ipv6 udp src 2001:db8::7")) == "net6"
    assert _name(_verdict(policy, "udp src 10.0.0.7")) == "other"


def test_cli_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(monkeypatch, str(OFFICE), "--packet", "ipv6 tcp src 2001:db8::1 dport 443")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "ipv6 tcp src 2001:db8::1 dst 2001:db8::2 sport 40000 dport 443 size 1514 -> "
        "class 'web' (1:30)"
    )
    assert "filter pref 32769 matched (IPv6: match dport 80, 443)" in result.stdout
    result = _run(monkeypatch, str(OFFICE), "--packet", "icmpv6", "--format", "json")
    assert json.loads(result.stdout)[0]["family"] == "ipv6"


def test_ingress_policer_per_family(tmp_path: Path) -> None:
    """An ingress policer's line has a filter per family; an IPv4-only line meters no IPv6."""
    text = (
        "interface eth0 {\n  ingress {\n"
        "    match dport 80 police rate 1mbit burst 10k drop\n"
        "    match src 10.0.0.0/8 police rate 2mbit burst 10k drop\n  }\n}\n"
    )
    policy = _text_policy(tmp_path, text)
    six = classify(policy, parse_packet("ipv6 tcp dport 80"), "eth0", "ingress")
    assert (
        "filter pref 32769 matched (IPv6: match dport 80); one policer for the line's 3 "
        "filters, so what they match shares its rate: above 1mbit" in six.steps[0].why
    )
    four = classify(policy, parse_packet("tcp src 10.1.1.1"), "eth0", "ingress")
    assert "filter pref 1 matched (match src 10.0.0.0/8); above 2mbit" in four.steps[0].why
    other = classify(policy, parse_packet("ipv6 tcp src 2001:db8::5"), "eth0", "ingress")
    assert other.steps[0].why == "no policer's match takes it: it is accepted as it is"


HASHED_LINES = [f"    class c{i} rate 1mbit match dst 10.0.{i % 2}.{i}" for i in range(80)]
HASHED = (
    "interface eth0 htb rate 1gbit default rest {\n"
    + "\n".join(HASHED_LINES)
    + "\n    class wide rate 1mbit match dst 10.0.0.0/8\n    class rest rate 1mbit\n}\n"
)


@pytest.mark.parametrize(
    ("dst", "name", "path"),
    [
        ("10.0.1.41", "c41", "table 1: bucket 0x29 (byte 19 of the IP header)"),
        ("10.0.0.41", "wide", None),  # bucket 0x29 holds 10.0.1.41 only: back after the link
        ("10.9.9.9", "wide", None),
        ("11.0.0.1", "rest", None),
    ],
)
def test_classify_walks_hashed_tables(dst: str, name: str, path: str | None) -> None:
    result = analyse("hashed.tcp", loader=lambda _p: HASHED)
    assert result.policy is not None and result.policy.interfaces[0].u32_tables
    verdict = classify(result.policy, parse_packet(f"ipv4 udp dst {dst}"))
    assert verdict.cls is not None and verdict.cls.name == name
    why = verdict.steps[-1].why
    assert (f"u32 went to {path}" in why) if path else ("u32 went to" not in why), why


def test_many_packets_lay_the_tables_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a tester: classify laid out the u32 tables, sorted the filters and listed
    the match lines again for each packet, 33 ms a packet on 5,000 subscribers. They are
    made once per interface, and every packet still gets its own verdict."""
    from tcdsl import matching, u32layout

    result = analyse("hashed.tcp", loader=lambda _p: HASHED)
    assert result.policy is not None
    calls = {"buckets": 0, "sorted": 0}
    buckets, order = u32layout.buckets, matching.kernel_order

    def counted_buckets(iface: ir.Interface) -> object:
        calls["buckets"] += 1
        return buckets(iface)

    def counted_order(items: object, pref: object) -> object:
        calls["sorted"] += 1
        return order(items, pref)  # type: ignore[arg-type]

    monkeypatch.setattr(u32layout, "buckets", counted_buckets)
    monkeypatch.setattr(matching, "kernel_order", counted_order)
    for i in range(40):
        verdict = classify(result.policy, parse_packet(f"ipv4 udp dst 10.0.{i % 2}.{i}"))
        assert verdict.cls is not None and verdict.cls.name == f"c{i}"
    assert calls == {"buckets": 1, "sorted": 1}


@pytest.mark.parametrize("name", ["", "../x", ".", "a/b", "x" * 65])
def test_cli_refuses_a_name_the_state_cannot_hold(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: '--name ""' and '--name ../x' were taken (and looked up as state
    folders); a name is what 'apply --name' takes, or a usage error."""
    got = _run(monkeypatch, "policies/office.tcp", "--name", name, "--packet", "udp")
    assert got.exit_code == 2, got.output
    assert f"Invalid value for '--name': {name!r}: at most 64 letters" in got.output, got.output


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("tcp dscp foo", "dscp needs a number, found 'foo'; or a name such as ef, af41 or cs1"),
        ("tcp dport 80,443", "a packet has one dport: give --packet once for each"),
    ],
)
def test_a_bad_packet_word_says_what_is_taken(
    monkeypatch: pytest.MonkeyPatch, spec: str, said: str
) -> None:
    """Found by a tester: 'dscp foo' said a number was needed (names work too), and a list
    of ports got no word on how to classify several packets."""
    got = _run(monkeypatch, "policies/office.tcp", "--packet", spec)
    assert got.exit_code == 2 and said in got.stderr, got.stderr
