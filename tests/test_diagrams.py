"""The dot and mermaid backends: Graphviz renders every policy; Mermaid output is well formed."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tcdsl.backends.dot import DotBackend
from tcdsl.backends.mermaid import MermaidBackend

from tcdsl import ir
from tcdsl.backend import Backend
from tcdsl.driver import analyse, compile_policy
from tests.conftest import ROOT, policy_files

POLICIES = policy_files()
IDS = [p.as_posix() for p in POLICIES]

WEIRD = """\
interface "e-th.0@x" htb rate 10mbit default b {
    class a rate 5mbit ceil 10mbit match dport 80, 443
    class b rate 5mbit
}
interface "a<b>&c#d'`]}" htb rate 10mbit {
    classify by mark from "i<n>"
    class x rate 5mbit match proto tcp sport 1024-2047
}
"""


def _compile(policy: Path, backend: str) -> str:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = compile_policy(policy.as_posix(), backend)
    finally:
        os.chdir(cwd)
    assert result.output is not None
    return result.output


def _weird_policy() -> ir.Policy:
    """Names a policy can hold that mean something to DOT or Mermaid, plus a quote and a
    newline that the language cannot write but the backends must survive anyway."""
    result = analyse("weird.tcp", lambda path: WEIRD)
    assert result.policy is not None, result.diagnostics
    first, second = result.policy.interfaces
    assert second.marking is not None
    # A chain name E216 refuses, as an IR from elsewhere (json) could still hold one.
    second = dataclasses.replace(
        second, marking=dataclasses.replace(second.marking, chain="C#'<&>\\")
    )
    odd = dataclasses.replace(first, name='q"z\n<&>')
    return dataclasses.replace(result.policy, interfaces=(first, second, odd))


# ---- dot ---------------------------------------------------------------------------------------


def _dot_to_svg(text: str) -> str:
    if shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' is not installed (apt-get install graphviz)")
    run = subprocess.run(
        ["dot", "-Tsvg"], input=text, capture_output=True, text=True, check=False, timeout=60
    )
    assert run.returncode == 0 and not run.stderr, run.stderr
    assert "<svg" in run.stdout
    return run.stdout


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_dot_renders_every_policy(policy: Path) -> None:
    _dot_to_svg(_compile(policy, "dot"))


def test_dot_renders_hostile_names() -> None:
    text = DotBackend().emit(_weird_policy(), 'weird"\n.tcp')
    svg = _dot_to_svg(text)
    # Graphviz writes '-' as &#45; in SVG text.
    assert ">interface e&#45;th.0@x<" in svg
    assert ">interface a&lt;b&gt;&amp;c#d&#39;`]}<" in svg
    assert ">interface q&quot;z?&lt;&amp;&gt;<" in svg


def test_dot_shows_borrowing_leaf_filters_and_default() -> None:
    text = _compile(Path("policies/office.tcp"), "dot")
    assert "rate 40mbit, may borrow to 90mbit (+50mbit)" in text
    assert "rate 6mbit, no borrowing" in text
    assert "leaf: pfifo (kernel default)" in text
    assert "leaf: sfq perturb 10" in text
    # A line applies to both families unless it says less (an IPv4 address: IPv4 only).
    assert "interface eth0<BR" in text and ">IPv4+IPv6<BR" in text
    assert "match dport 80, 443<BR" in text
    assert "match IPv4 src 10.3.34.11<BR" in text
    assert "default class" in text
    marks = _compile(Path("policies/seeds/s000-10.1-marks.tcp"), "dot")
    assert "mark 10: tcp dport 5001" in marks
    assert "mark 30: unmarked traffic" in marks


DIRECTIONS = """\
interface eth0 {
    upload htb rate 19mbit default bulk {
        class voip rate 2mbit match dport 5060
        class bulk rate 17mbit
    }
    download via ifbx connmark htb rate 95mbit default bulk {
        class voip rate 5mbit match sport 5060 police rate 4mbit burst 10k continue
        class bulk rate 90mbit
    }
}
interface eth1 {
    ingress {
        match src 10.0.0.0/8 police rate 800kbit burst 10k mtu 2k
    }
}
"""


@pytest.mark.parametrize("backend", [DotBackend(), MermaidBackend()], ids=["dot", "mermaid"])
def test_diagrams_draw_directions_redirects_and_policers(backend: Backend) -> None:
    result = analyse("dirs.tcp", lambda path: DIRECTIONS)
    assert result.policy is not None, result.diagnostics
    text = backend.emit(result.policy, "dirs.tcp")
    for title in (
        "interface eth0 upload",
        "interface eth0 download (via ifbx)",
        "interface eth1 ingress",
        "ingress ffff: on eth0",
        "connmark: restores the connection",
        "every protocol: mirred redirect to ifbx",
        "match sport 5060, police rate 4mbit burst 10k continue",
        "match IPv4 src 10.0.0.0/8, police rate 800kbit burst 10k mtu 2k drop",
    ):
        assert title in text
    # The redirect feeds the download's root qdisc, the next node drawn.
    redirect = re.search(r"\b(n(\d+))\b[^\n]*ingress ffff: on eth0", text)
    assert redirect is not None
    root = f"n{int(redirect[2]) + 1}"
    assert re.search(rf"\b{root}\b[^\n]*htb 1:", text)
    assert re.search(rf"{redirect[1]} -+> {root};?\n", text)


def _node_lines(text: str, title: str) -> list[str]:
    """The label lines of the mermaid node titled ``title``."""
    found = re.search(rf'\["<b>{re.escape(title)}</b><br/>(.*?)"\\?\]', text)
    assert found is not None, title
    return found[1].split("<br/>")


def test_nested_qdiscs_show_what_holds_them_back() -> None:
    result = analyse(
        "nested.tcp",
        lambda _path: (
            "interface eth0 htb rate 1mbit default rest {\n"
            "    class site rate 720kbit match dst 10.0.0.0/8 {\n"
            "        htb rate 800kbit default other {\n"
            "            class voip rate 200kbit ceil 800kbit prio 0 match dport 5060\n"
            "            class other rate 100kbit ceil 700kbit\n"
            "        }\n"
            "    }\n"
            "    class rest rate 100kbit ceil 1mbit\n"
            "}\n"
        ),
    )
    assert result.policy is not None, result.diagnostics
    text = MermaidBackend().emit(result.policy, "nested.tcp")
    check_mermaid(text)
    assert "leaf: htb 10: (classful, below)" in _node_lines(text, "site")
    inner = re.search(r'\[/"<b>htb 10:</b><br/>(.*?)"\\\]', text)
    assert inner is not None
    assert inner[1].split("<br/>") == ["default other (10:20)", "sends at most 720kbit (site 1:10)"]
    assert "capped at 720kbit by site 1:10" in _node_lines(text, "voip")
    assert not any(line.startswith("capped") for line in _node_lines(text, "other"))
    assert not any(line.startswith("capped") for line in _node_lines(text, "rest"))
    dot = DotBackend().emit(result.policy, "nested.tcp")
    assert "capped at 720kbit by site 1:10" in dot
    assert dot.count("capped at") == 2  # the inner link class (800kbit) and voip
    _dot_to_svg(dot)


# ---- mermaid -----------------------------------------------------------------------------------

_LABEL = re.compile(r'"([^"]*)"')
_TAGS = re.compile(r"</?b>|<br/>")
_ENTITY = re.compile(r"#(?:[a-z]+|[0-9]+);")
_NODE = re.compile(r"(n[0-9]+)(?:\[/?L[/\\]?\])$")
_EDGE = re.compile(r"(n[0-9]+) --> (n[0-9]+)$")
_CLASS = re.compile(r"class ((?:n[0-9]+,)*n[0-9]+) (qdisc|cls|dflt)$")
_PAIRS = {"]": "[", ")": "(", "}": "{"}


def check_mermaid(text: str) -> None:
    """Fail unless ``text`` is a flowchart whose labels are quoted and escaped, whose brackets
    balance, whose subgraphs end, and whose edges and styles name defined nodes."""
    lines = text.splitlines()
    assert lines[0].startswith("%% ") and lines[1] == "flowchart TB"
    defined: list[str] = []
    used: list[str] = []
    depth = 0
    for number, line in enumerate(lines[2:], start=3):
        where = f"line {number}: {line!r}"
        assert line.count('"') % 2 == 0, f"unbalanced quotes, {where}"
        for label in _LABEL.findall(line):
            bare = _TAGS.sub("", label)
            assert not re.search(r"[<>`\n]", bare), f"unescaped markup, {where}"
            assert "#" not in _ENTITY.sub("", bare), f"a '#' that is not an entity, {where}"
        code = _LABEL.sub("L", line).strip()
        stack: list[str] = []
        for ch in code:
            if ch in "[({":
                stack.append(ch)
            elif ch in _PAIRS:
                assert stack and stack.pop() == _PAIRS[ch], f"unbalanced brackets, {where}"
        assert not stack, f"unbalanced brackets, {where}"
        if code.startswith("subgraph "):
            assert re.fullmatch(r"subgraph if[0-9]+\[L\]", code), where
            depth += 1
        elif code == "end":
            depth -= 1
            assert depth >= 0, where
        elif code == "direction TB" or code.startswith("classDef "):
            pass
        elif m := _NODE.match(code):
            defined.append(m[1])
        elif m := _EDGE.match(code):
            used += [m[1], m[2]]
        elif m := _CLASS.match(code):
            used += m[1].split(",")
        else:
            raise AssertionError(f"unexpected statement, {where}")
    assert depth == 0, "a subgraph is not closed"
    assert len(defined) == len(set(defined)), "a node is defined twice"
    assert set(used) <= set(defined), f"undefined nodes: {sorted(set(used) - set(defined))}"
    assert set(defined) <= set(used), "a node has no edge and no style"


@pytest.mark.parametrize("policy", POLICIES, ids=IDS)
def test_mermaid_is_well_formed(policy: Path) -> None:
    check_mermaid(_compile(policy, "mermaid"))


def test_mermaid_escapes_hostile_names() -> None:
    text = MermaidBackend().emit(_weird_policy(), 'weird"\n.tcp')
    check_mermaid(text)
    assert "interface e-th.0@x" in text
    assert "a#lt;b#gt;#amp;c#35;d'#96;]}" in text
    assert "q#quot;z?#lt;#amp;#gt;" in text


def test_mermaid_checker_catches_mistakes() -> None:
    good = _compile(Path("policies/office.tcp"), "mermaid")
    check_mermaid(good)
    for bad in (
        good.replace("n2 --> n3", "n2 --> n99"),
        good.replace("<b>web</b>", '<b>w"eb</b>'),
        good.replace("<b>web</b>", "<b>w<e>b</b>"),
        good.replace("  end\n", ""),
        good.replace('n1[/"', 'n1[["'),
    ):
        with pytest.raises(AssertionError):
            check_mermaid(bad)


def test_diagrams_say_the_families_of_trees_and_lines(tmp_path: Path) -> None:
    """The title says what a tree classifies (both families unless restricted, flower when
    chosen, both marking tables); a line applying to fewer families than its tree says so."""
    path = tmp_path / "dual.tcp"
    path.write_text(
        "interface eth0 htb rate 10mbit default rest {\n"
        "    classify by mark from eth1\n"
        "    class web rate 5mbit match src 2001:db8::/64 proto tcp dport 443\n"
        "    class ping rate 1mbit match proto icmp\n"
        "    class ssh rate 1mbit match family ipv6 proto tcp dport 22\n"
        "    class rest rate 1mbit match proto udp dport 53\n"
        "}\n"
        "interface eth1 classifier flower family ipv6 htb rate 10mbit default rest {\n"
        "    class web rate 5mbit match proto tcp dport 443\n"
        "    class rest rate 5mbit\n"
        "}\n",
        encoding="utf-8",
    )
    text = _compile(path, "mermaid")
    for words in (
        'subgraph if0["interface eth0<br/>IPv4+IPv6<br/>classified by mark from eth1, '
        'iptables and ip6tables chain TCDSL-eth0"]',
        "mark 10: IPv6 src 2001:db8::/64 tcp dport 443",
        "mark 20: IPv4 icmp",
        "mark 30: IPv6 tcp dport 22",
        "mark 40: udp dport 53",
        'subgraph if1["interface eth1<br/>IPv6 only, flower filters"]',
        "match tcp dport 443",
    ):
        assert words in text, words


def test_a_root_class_of_an_htb_without_a_rate_is_drawn_without_borrowing() -> None:
    """Found by a tester: with no link class (the htb's line gives no rate), a class right
    under the htb has nothing to borrow from (explain says so; measured: it sends at its
    rate), but the diagrams said it 'may borrow to' its ceil; its children stay capped by it."""
    result = analyse(
        "roots.tcp",
        lambda _path: (
            "interface eth0 htb default b2 {\n"
            "    class a rate 2mbit ceil 8mbit match dport 1\n"
            "    class b rate 3mbit ceil 3mbit {\n"
            "        class b1 rate 1mbit ceil 3mbit match dport 2\n"
            "        class b2 rate 1mbit ceil 3mbit\n"
            "    }\n"
            "}\n"
        ),
    )
    assert result.policy is not None, result.diagnostics
    for backend in (MermaidBackend(), DotBackend()):
        text = backend.emit(result.policy, "roots.tcp")
        assert "rate 2mbit, no borrowing (no parent to borrow from; ceil 8mbit unused)" in text
        assert "rate 3mbit, no borrowing" in text
        assert "may borrow to 8mbit" not in text
        assert "rate 1mbit, may borrow to 3mbit" in text
