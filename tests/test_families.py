"""Dual-stack checks (tcdsl/families.py) and the checks that compare addresses across families.

The corpus (tests/diagnostics/E258-*, W363-*, E259-*, E260-*, I321-*, W362-*, W364-*) shows each
message; here: no check crashes on policies mixing IPv4 and IPv6 wherever an address can be,
E258 agrees with what allocation emits, and ordinary dual-stack policies stay quiet.
"""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl import ir, lower
from tcdsl.cli import cli
from tcdsl.driver import analyse, compile_policy
from tcdsl.frontend.reader import Reader

V4 = ("10.0.0.0/8", "192.0.2.1", "0.0.0.0/0")
V6 = ("2001:db8::/32", "::1", "fe80::/10", "::/0", "::ffff:192.0.2.1")

# Every place an address can be: constants, src and dst lists, class lines, nested qdiscs,
# upload, download, ingress policers, classify by mark (both firewalls), lines with pref,
# flower, one-family trees, and lines with their own family.
MIXED = """\
const A4 = 10.0.0.0/8
const A6 = 2001:db8::/32
interface eth0 htb rate 100mbit default bulk {{
    class web rate 10mbit {{
        match src A4, A6, {v4}, {v6} dst {v6}, {v4} dport 443
        match src {v4} dst {v6}
        match src {v6}, {v4} proto icmp, icmpv6, tcp
        match family ipv6 dst {v6}, {v4} sport 1024-2047
        match family ipv4 src {v4}, {v6} tcp-ack
        match src {v6} u8 6/0xff at 9
    }}
    class nest rate 10mbit {{
        prio {{ class p {{ match dst {v6}, {v4} }} }}
    }}
    class bulk rate 1mbit
}}
interface eth1 {{
    upload family ipv6 htb rate 10mbit default u {{
        class u rate 1mbit match src {v4}, {v6} dport 80 pref 40000
    }}
    download via ifb1 family ipv4 htb rate 10mbit default d {{
        class d rate 1mbit match dst {v6}, {v4} proto icmpv6
    }}
}}
interface eth2 {{ ingress {{ match src {v4}, {v6} police rate 1mbit burst 10k drop }} }}
interface eth3 htb rate 10mbit default c {{
    classify by mark at postrouting
    class c rate 1mbit match src {v6}, {v4} proto tcp dport 80
    class e rate 1mbit match dst {v4}, {v6} dport 53
    class f rate 1mbit match dst {v6} pref 3
}}
interface eth4 classifier flower htb rate 10mbit default c {{
    class c rate 1mbit match src {v6}, {v4} dport 80/0xf0f0, 22
    class e rate 1mbit match dst {v4} dst {v6}
}}
interface eth5 family ipv6 classifier flower prio {{
    class a match src {v4} tcp-ack
    class b match src {v6} proto 44 dport 80
}}
"""


@pytest.mark.parametrize(("v4", "v6"), list(itertools.product(V4, V6)))
def test_checks_never_crash_on_mixed_families(v4: str, v6: str, tmp_path: Path) -> None:
    path = tmp_path / "mixed.tcp"
    path.write_text(MIXED.format(v4=v4, v6=v6), encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", "--info", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.stderr
    assert result.exit_code == 1, result.stderr
    assert "Traceback" not in result.stderr
    for code in ("E258", "E259", "E260", "W363", "W364"):
        assert f"[{code}]" in result.stderr


LINES = (
    "match src 10.0.0.1 dst 2001:db8::1",
    "match src 10.0.0.1, 2001:db8::1 dst 2001:db8::2",
    "match proto icmp src 2001:db8::1",
    "match proto icmpv6, icmp src 2001:db8::1",
    "match family ipv4 src 2001:db8::1",
    "match family ipv6 proto icmp",
    "match family ipv6 proto icmp, tcp",
    "match u8 6/0xff at 9 src 2001:db8::1",
    "match family ipv6 u8 6/0xff at 6 src 2001:db8::1",
    "match dport 80",
    "match src ::/0",
)
TREES = ("", "family ipv4 ", "family ipv6 ", "family both ")


@pytest.mark.parametrize(("line", "tree"), list(itertools.product(LINES, TREES)))
def test_e258_when_and_only_when_a_line_has_no_filter(line: str, tree: str, tmp_path: Path) -> None:
    """E258 (or W363) and allocation read the same semantics: a line gets E258 exactly when
    lower.family_alternatives gives it nothing, and W363 when it drops some alternatives."""
    path = tmp_path / "p.tcp"
    path.write_text(
        f"interface eth0 {tree}htb rate 10mbit default b {{\n"
        f"    class a rate 1mbit {line}\n    class b rate 1mbit\n}}\n",
        encoding="utf-8",
    )
    result = analyse(str(path))
    codes = {d.code for d in result.diagnostics}
    iface_families: tuple[ir.Family, ...] = {
        "": ir.FAMILIES,
        "family ipv4 ": ("ipv4",),
        "family ipv6 ": ("ipv6",),
        "family both ": ir.FAMILIES,
    }[tree]
    match = _parsed_match(line, tree, tmp_path)
    asked = match.family.families if match.family else iface_families
    if any(f not in iface_families for f in asked):
        assert "E258" in codes
        return
    kept = {tuple(alt) for _, alt in lower.family_alternatives(match, iface_families)}
    every = {tuple(alt) for alt in lower.alternatives(match)}
    assert ("E258" in codes) == (not kept), result.diagnostics
    assert ("W363" in codes) == (bool(kept) and kept != every), result.diagnostics


def _parsed_match(line: str, tree: str, tmp_path: Path) -> ir.Match:
    """The line as the frontend reads it (before the checks, whose errors end the pipeline)."""
    path = tmp_path / "one.tcp"
    path.write_text(
        f"interface eth0 {tree}htb rate 10mbit default b {{\n    class a rate 1mbit {line}\n"
        "    class b rate 1mbit\n}\n",
        encoding="utf-8",
    )
    (iface,) = Reader().read(str(path))
    (m,) = (m for q in ir.walk_qdiscs(iface.root) for _, m in ir.matches_of(q))
    return m


QUIET = """\
const OFFICE4 = 192.0.2.0/24
const OFFICE6 = 2001:db8:10::/48
interface eth0 htb rate 100mbit default bulk {
    class voip rate 10mbit match proto udp dport 5060, 10000-20000
    class web rate 30mbit match dport 80, 443
    class ssh rate 5mbit match proto tcp dport 22 dscp cs6
    class office rate 20mbit match src OFFICE4, OFFICE6
    class ping rate 1mbit match proto icmp, icmpv6
    class acks rate 5mbit match tcp-ack
    class bulk rate 10mbit
}
interface eth1 classifier flower {
    upload htb rate 10mbit default b { class b rate 1mbit match dport 443, 1024-2047 }
}
"""


def test_ordinary_dual_stack_policy_is_quiet(tmp_path: Path) -> None:
    path = tmp_path / "office.tcp"
    path.write_text(QUIET, encoding="utf-8")
    result = analyse(str(path))
    assert [d.code for d in result.diagnostics] == []


def _shadowing_codes(lines: str, tmp_path: Path) -> list[tuple[str, int]]:
    path = tmp_path / "s.tcp"
    path.write_text(
        f"interface eth0 htb rate 10mbit default z {{\n{lines}    class z rate 1mbit\n}}\n",
        encoding="utf-8",
    )
    return [(d.code, d.span.line) for d in analyse(str(path)).diagnostics]


def test_an_ipv4_line_does_not_hide_an_ipv6_value(tmp_path: Path) -> None:
    lines = (
        "    class a rate 1mbit match src 10.0.0.0/8\n"
        "    class b rate 1mbit match src 10.0.0.0/8, 2001:db8::/32\n"
    )
    # The IPv4 value is hidden (said once), the line is not: its IPv6 value still matches.
    codes = _shadowing_codes(lines, tmp_path)
    assert codes == [("W312", 3)]
    (d,) = analyse(str(tmp_path / "s.tcp")).diagnostics
    assert "this value never matches" in d.message and d.span.column == 34


def test_a_line_hidden_in_both_families_is_said_once(tmp_path: Path) -> None:
    lines = "    class a rate 1mbit match dport 80\n    class b rate 1mbit match dport 80\n"
    assert _shadowing_codes(lines, tmp_path) == [("W313", 3)]


def test_an_ipv6_value_hidden_behind_a_port_line(tmp_path: Path) -> None:
    lines = (
        "    class a rate 1mbit match dport 443\n"
        "    class b rate 1mbit match dst 2001:db8::1, 10.0.0.1 dport 443\n"
    )
    assert _shadowing_codes(lines, tmp_path) == [("W312", 3)]


def test_a_catch_all_of_one_family_hides_no_line_of_the_other(tmp_path: Path) -> None:
    lines = "    class a rate 1mbit match src 0.0.0.0/0\n    class b rate 1mbit match dport 80\n"
    assert [c for c, _ in _shadowing_codes(lines, tmp_path)] == []
    lines = "    class a rate 1mbit match all\n    class b rate 1mbit match dport 80\n"
    assert [c for c, _ in _shadowing_codes(lines, tmp_path)] == ["W314"]


I321_TREES = {
    "interface eth0 family ipv4 htb rate 1mbit default b {\n class a rate 1mbit match dport 1\n"
    " class b rate 1mbit\n}\n": "go to the default class 'b'",
    "interface eth0 htb rate 1mbit {\n class a rate 1mbit match src 10.0.0.1\n}\n": (
        "leave through htb's direct queue, unshaped"
    ),
    "interface eth0 hfsc {\n class a rt m2 1mbit match proto icmp\n}\n": "are dropped",
    "interface eth0 prio {\n class a match u16 1/0xffff at 2\n}\n": "go to the band the priomap",
    "interface eth0 family ipv4 {\n ingress { match all police rate 1mbit burst 9k drop }\n}\n": (
        "pass unpoliced"
    ),
    "interface eth0 {\n download htb rate 1mbit default a {\n  class a rate 1mbit\n"
    "  class b rate 1mbit match dst 10.0.0.1 sport 80\n }\n}\n": "go to the default class 'a'",
}


@pytest.mark.parametrize(("text", "where"), I321_TREES.items())
def test_i321_says_where_ipv6_goes(text: str, where: str, tmp_path: Path) -> None:
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    found = [d for d in analyse(str(path)).diagnostics if d.code == "I321"]
    assert len(found) == 1 and f"IPv6 packets {where}" in found[0].message


@pytest.mark.parametrize(
    "line", ["match dport 80", "match src 2001:db8::1", "match proto icmpv6", "match all"]
)
def test_no_i321_when_ipv6_has_a_line(line: str, tmp_path: Path) -> None:
    path = tmp_path / "p.tcp"
    path.write_text(
        "interface eth0 htb rate 1mbit default b {\n class a rate 1mbit match src 10.0.0.1\n"
        f" class c rate 1mbit {line}\n class b rate 1mbit\n}}\n",
        encoding="utf-8",
    )
    assert "I321" not in {d.code for d in analyse(str(path)).diagnostics}


def test_family_before_a_prio_root_and_before_a_class_prio(tmp_path: Path) -> None:
    """`family ipv4 prio` on an interface is a family and a prio qdisc, and `family ipv6
    dport 2 prio 1` in a match line is followed by a class's prio (LALR once shared the state
    after `family F` between the two, and the lexer took the qdisc for a parameter)."""
    path = tmp_path / "p.tcp"
    path.write_text(
        "interface eth0 family ipv4 prio {\n"
        "    class a match dport 1\n"
        "}\n"
        "interface eth1 htb rate 1mbit {\n"
        "    class b rate 1mbit match family ipv6 dport 2 prio 1\n"
        "}\n",
        encoding="utf-8",
    )
    result = compile_policy(str(path))
    assert result.policy is not None, [d.message for d in result.diagnostics]
    eth0, eth1 = result.policy.interfaces
    assert isinstance(eth0.root, ir.Prio) and eth0.families == ("ipv4",)
    (cls,) = [c for c in ir.classes_of(eth1.root) if c.name == "b"]
    assert cls.prio is not None and cls.prio.value == 1
    assert cls.matches[0].family is not None and cls.matches[0].family.families == ("ipv6",)


_SPAN = ir.Span("t.tcp", 1, 1, 1, 2)
_NETWORKS = st.lists(
    st.sampled_from(V4 + V6).map(lambda text: (ipaddress.ip_network(text), _SPAN)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(
    networks=_NETWORKS,
    field=st.sampled_from(("src", "dst")),
    tree=st.sampled_from((ir.FAMILIES, ("ipv4",), ("ipv6",), ("ipv6", "ipv4"))),
)
def test_a_line_of_one_address_condition_lowers_as_every_other(
    networks: list[tuple[ir.Network, ir.Span]], field: str, tree: tuple[ir.Family, ...]
) -> None:
    """The shortcut for a line of one address condition (every subscriber's) gives what the
    general case gives: each alternative, in each family it can match, that the tree has."""
    cond = ir.AddrCond(field, tuple(networks), _SPAN)  # type: ignore[arg-type]
    match = ir.Match((cond,), _SPAN)
    general = tuple(
        (family, alt)
        for alt in lower.alternatives(match)
        for family in lower.implied_families(alt)
        if family in lower.match_families(match, tree)
    )
    assert lower.family_alternatives(match, tree) == general
    assert lower.address_alternatives(cond, tree) == general
