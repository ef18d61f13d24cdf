"""Lints against an independent model: a match line the lints call dead never classifies a packet.

The lints (``tcdsl.lint``) reason about u32 keys as header bits, per address family (the
sources are IPv4 and IPv6; a line without an address is a filter of each family). Here a plain
first-match classifier over packet fields (written without u32 keys) is run on every packet of
a small universe; a line the lints report as never matching (W312 for a whole line, W313,
and every line after a W314 catch-all) must never be the first match of any packet. The
kernel version of this claim, for a few policies, is in ``tests/test_lint_kernel.py``.
"""

from __future__ import annotations

import ipaddress
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tcdsl import ir, u32layout
from tcdsl.driver import analyse

SRCS = (
    *("10.0.0.0/8", "10.1.0.0/16", "10.1.2.3", "192.168.0.0/16"),
    *("2001:db8::/32", "2001:db8:1::/48", "2001:db8:1::5"),
)
PORTS = ("22", "53", "80", "443", "1500", "1024-2047", "0-1023", "80-90", "80-87", "88-90")
PROTOS = {"tcp": 6, "udp": 17}
PACKET_SRCS = (
    *("10.1.2.3", "10.1.9.9", "10.9.9.9", "192.168.1.1", "8.8.8.8"),
    *("2001:db8:1::5", "2001:db8:1::9", "2001:db8:9::9", "2001:db9::1"),
)
PACKET_PORTS = (22, 53, 80, 85, 88, 90, 443, 1023, 1024, 1500, 2047, 3000)


@dataclass(frozen=True)
class Line:
    """One generated match line: each field a tuple of alternatives (empty: not tested)."""

    srcs: tuple[str, ...]
    ports: tuple[str, ...]
    protos: tuple[str, ...]
    tos: bool
    catch_all: bool
    pref: int | None

    def text(self) -> str:
        words = ["match"]
        if self.catch_all:
            words.append("all")
        if self.srcs:
            words += ["src", ", ".join(self.srcs)]
        if self.ports:
            words += ["dport", ", ".join(self.ports)]
        if self.protos:
            words += ["proto", ", ".join(self.protos)]
        if self.tos:
            words += ["tos", "0x10"]
        if self.pref is not None:
            words += ["pref", str(self.pref)]
        return " ".join(words)

    def matches(self, src: str, port: int, proto: int, tos: int) -> bool:
        addr = ipaddress.ip_address(src)  # an address is in no network of the other family
        if self.srcs and not any(addr in ipaddress.ip_network(s) for s in self.srcs):
            return False
        if self.ports and not any(_port_in(port, p) for p in self.ports):
            return False
        if self.protos and proto not in {PROTOS[p] for p in self.protos}:
            return False
        return not (self.tos and tos != 0x10)


def _port_in(port: int, spec: str) -> bool:
    lo, _, hi = spec.partition("-")
    return int(lo) <= port <= int(hi or lo)


def _lines() -> st.SearchStrategy[Line]:
    def subset(values: tuple[str, ...]) -> st.SearchStrategy[tuple[str, ...]]:
        some = st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True).map(tuple)
        return st.just(()) | some  # each field is left out half the time

    pref = st.none() | st.integers(min_value=1, max_value=3)
    regular = st.builds(
        Line,
        subset(SRCS),
        subset(PORTS),
        subset(tuple(PROTOS)),
        st.booleans(),
        st.just(False),
        pref,
    ).filter(lambda ln: bool(ln.srcs or ln.ports or ln.protos or ln.tos))
    catch_all = st.builds(
        Line, st.just(()), st.just(()), st.just(()), st.just(False), st.just(True), pref
    )
    # One line in fifteen is a catch-all (hypothesis draws the branches of one_of evenly).
    return st.integers(0, 14).flatmap(lambda n: catch_all if n == 0 else regular)


@settings(max_examples=150, deadline=None)
@given(classes=st.lists(st.lists(_lines(), min_size=1, max_size=2), min_size=1, max_size=6))
def test_dead_lines_never_classify_a_packet(
    classes: list[list[Line]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    text = ["interface eth0 htb rate 10mbit default rest {"]
    order: list[tuple[int, int, int, Line]] = []  # (pref, sequence, file line, match)
    for i, lines in enumerate(classes):
        text.append(f"    class c{i} rate 1mbit {{")
        for line in lines:
            text.append(f"        {line.text()}")
            order.append((line.pref or 1, len(order), len(text), line))
        text.append("    }")
    text += ["    class rest rate 1mbit", "}"]
    path = tmp_path_factory.mktemp("lint") / "p.tcp"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    result = analyse(str(path))
    assert not result.errors, result.diagnostics
    dead: set[int] = set()
    for d in result.diagnostics:
        event(d.code)
    for d in result.diagnostics:
        if d.code in ("W313",) or (d.code == "W312" and "match line" in d.message):
            dead.add(d.span.line)
        if d.code == "W314":
            catch_line = d.span.line
            tried = sorted(order)
            after = False
            for _, _, line_no, _ in tried:
                if after:
                    dead.add(line_no)
                after = after or line_no == catch_line
    tried = sorted(order)
    for src, port, proto, tos in itertools.product(
        PACKET_SRCS, PACKET_PORTS, PROTOS.values(), (0, 0x10)
    ):
        first = next((n for _, _, n, ln in tried if ln.matches(src, port, proto, tos)), None)
        assert first not in dead, (
            f"line {first} is reported dead but classifies {src} dport {port} proto {proto} "
            f"tos {tos:#x}:\n" + "\n".join(text)
        )


def _many(lines: list[str]) -> str:
    body = "".join(f"    class c{i} rate 1kbit {line}\n" for i, line in enumerate(lines))
    return "interface eth0 htb rate 100mbit default c0 {\n" + body + "}\n"


def test_more_u32_filters_at_one_pref_than_the_kernel_orders_keeps_their_order() -> None:
    """Past 2,048 filters at one pref, allocate numbers the nodes itself (u32 would try the
    2,049th first); E262 only where the parent has no u32 table id left for a pref that needs
    one (its 2,049th line)."""
    ports = [f"match dport {1000 + i}" for i in range(2049)]  # past the hashed header
    result = analyse("many.tcp", loader=lambda _p: _many(ports))
    assert not result.errors and result.policy is not None
    filters = result.policy.interfaces[0].filters
    places = [f.place for f in filters if isinstance(f, ir.U32Filter) and f.family == "ipv4"]
    assert [(p.table, p.node) for p in places if p is not None] == [
        (None, n) for n in range(1, 2050)
    ]
    fewer = analyse("few.tcp", loader=lambda _p: _many(ports[:2048]))
    assert fewer.policy is not None
    assert not any(
        isinstance(f, ir.U32Filter) and f.family == "ipv4" and f.place
        for f in fewer.policy.interfaces[0].filters
    )


def test_no_table_id_left_is_e262(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pref of more than 4,095 filters needs a table; none left under the parent: E262 at
    the 2,049th line."""
    monkeypatch.setattr(u32layout, "TABLE_IDS", 0)
    addresses = [f"match src 10.{i >> 8}.{i & 255}.1" for i in range(4096)]
    result = analyse("many.tcp", loader=lambda _p: _many(addresses))
    found = [d for d in result.diagnostics if d.code == "E262"]
    assert len(found) == 1 and found[0].span.line == 2050, found
    assert "no u32 table id is left under 1:" in found[0].message
    assert result.policy is None


def test_shadowing_is_found_in_hashed_prefs() -> None:
    """Lines hashed into u32 tables are still every filter, in the order tried: a /32 after
    a /24 that takes its packets is shadowed (W312), hashed or not."""
    lines = [f"match dst 10.0.0.{i}" for i in range(40)]
    lines.insert(0, "match dst 10.0.0.0/24")
    result = analyse("hashed.tcp", loader=lambda _p: _many(lines))
    assert result.policy is not None and result.policy.interfaces[0].u32_tables
    shadowed = {d.span.line for d in result.diagnostics if d.code == "W312"}
    assert shadowed == set(range(3, 43)), shadowed


def test_a_line_of_one_family_after_a_catch_all_is_hidden() -> None:
    """Found by a review: an IPv4 address line after 'match all' got neither W314 nor W312
    (it has no IPv6 filters, and the IPv6 list dropped it from what the catch-all hides)."""
    text = (
        "interface eth0 htb rate 10mbit default c {\n    class a rate 1mbit match all\n"
        "    class b rate 1mbit match dst 10.0.0.2\n    class c rate 1mbit\n}\n"
    )
    result = analyse("all.tcp", loader=lambda _p: text)
    found = [(d.code, d.span.line) for d in result.diagnostics]
    assert found == [("W314", 2)], found
    (w314,) = result.diagnostics
    assert w314.notes[0].span.line == 3


def test_lines_of_either_family_after_a_catch_all_are_hidden() -> None:
    """Found by a tester: an IPv6 line after 'match all' got no W314 (the lines it hides were
    taken from the IPv4 list alone), and with lines of both families the count fell short."""
    head = "interface eth0 htb rate 10mbit default z {\n    class a rate 1mbit match all\n"
    for lines, count, example in (
        (["src 2001:db8::/32"], 1, 3),
        (["proto icmpv6"], 1, 3),
        (["dst ::/0", "dport 80", "dst 0.0.0.0/0"], 3, 3),
        (["dst 10.0.0.2", "dst 2001:db8::2"], 2, 3),
    ):
        body = "".join(f"    class c{i} rate 1mbit match {m}\n" for i, m in enumerate(lines))
        text = f"{head}{body}    class z rate 1mbit\n}}\n"
        result = analyse("all.tcp", loader=lambda _p, t=text: t)
        found = [(d.code, d.span.line) for d in result.diagnostics]
        assert found == [("W314", 2)], (lines, found)
        (w314,) = result.diagnostics
        assert f"the {count} match line" in w314.message, (lines, w314.message)
        assert w314.notes[0].span.line == example, lines


def test_flower_filters_past_their_familys_prefs(tmp_path: Path) -> None:
    """Each flower filter takes a pref of its own: IPv4's 32,769th would share IPv6's first
    (the kernel refuses a second protocol at one pref), so it is E263."""
    lines = "".join(f"        match dst 10.0.{i >> 8 & 255}.{i & 255}\n" for i in range(32769))
    text = (
        "interface eth0 classifier flower htb rate 10mbit default bulk {\n"
        f"    class a rate 1mbit {{\n{lines}        match dst 2001:db8::1\n    }}\n"
        "    class bulk rate 1mbit\n}\n"
    )
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    result = analyse(str(path))
    assert [(d.code, d.span.line) for d in result.errors] == [("E263", 2 + 32769)]
    # without IPv6 filters under the parent, IPv4 may use the whole range
    path.write_text(text.replace("        match dst 2001:db8::1\n", ""), encoding="utf-8")
    assert analyse(str(path)).errors == []


def test_shadowing_across_the_queues_of_an_mq_tree(tmp_path: Path) -> None:
    """The steering filters try every queue's lines in one list: a line of one queue is
    hidden by an earlier line of another (W312), as in the tree written without mq."""
    text = (
        "interface eth0 mq queues 2 htb rate 900mbit default other {\n"
        "    class big rate 500mbit match dst 10.0.0.0/8\n"
        "    class site rate 400mbit match dst 10.0.0.1\n"
        "    class other rate 1mbit\n"
        "}\n"
    )
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    result = analyse(str(path))
    assert result.policy is not None
    root = result.policy.interfaces[0].root
    assert isinstance(root, ir.Mq) and len(root.queues) == 2  # big and site on two queues
    assert [(d.code, d.span.line) for d in result.diagnostics if d.code[0] != "I"] == [("W312", 3)]
    path.write_text(text.replace("10.0.0.0/8", "10.1.0.0/16"), encoding="utf-8")
    assert [d.code for d in analyse(str(path)).diagnostics if d.code[0] != "I"] == []


def test_a_continuing_policer_below_a_queues_own_qdisc_is_fine(tmp_path: Path) -> None:
    """E264 is for the lines the steering filters copy (each queue's own qdisc); an htb
    below a queue's class tries its own lines, continue included, as without mq."""
    inner = (
        "        htb rate 300mbit default rest {\n"
        "            class fast rate 100mbit match proto udp police rate 1mbit burst 10k continue\n"
        "            class rest rate 100mbit match proto udp\n"
        "        }\n"
    )
    text = (
        "interface eth0 mq queues 2 htb rate 900mbit default other {\n"
        f"    class a rate 300mbit match dst 10.0.0.0/24 {{\n{inner}    }}\n"
        "    class other rate 10mbit\n"
        "}\n"
    )
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    assert [d.code for d in analyse(str(path)).errors] == []
    top = text.replace(
        "match dst 10.0.0.0/24 {", "match dst 10.0.0.0/24 police rate 1mbit burst 10k continue {"
    )
    path.write_text(top, encoding="utf-8")
    assert [d.code for d in analyse(str(path)).errors] == ["E264"]
