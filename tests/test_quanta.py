"""htb quanta: allocation keeps every class's quantum (rate / r2q) inside the kernel's
1000..200000 bytes unless the policy sets r2q, every htb backend writes what it chose, and W316
warns once per htb about an r2q the policy writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.tcmath import htb_class_quantum, htb_r2q
from tcdsl.teach.explain import explain
from tcdsl.verify.expect import expected_policy


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _analyse(tmp_path: Path, text: str) -> Result:
    result = analyse(_write(tmp_path, text))
    assert not result.errors, result.diagnostics
    return result


def _htb(result: Result) -> ir.Htb:
    assert result.policy is not None
    root = result.policy.interfaces[0].root
    assert isinstance(root, ir.Htb)
    return root


def _quanta(q: ir.Htb) -> dict[str, int | None]:
    r2q = htb_r2q(q)
    return {c.name or "link": htb_class_quantum(c, r2q) for c in ir.classes_of(q)}


def _chosen(q: ir.Htb) -> dict[str, int]:
    return {c.name or "link": c.chosen_quantum for c in ir.classes_of(q) if c.chosen_quantum}


def _policy(link: str, *classes: str, r2q: str = "") -> str:
    body = "".join(
        f"    class c{i} rate {rate} match dport {i + 1}\n" for i, rate in enumerate(classes)
    )
    return f"interface eth0 htb rate {link}{r2q} {{\n{body}}}\n"


@pytest.mark.parametrize(
    ("link", "leaves", "r2q", "chosen"),
    [
        # tc's default suits every class: nothing changes.
        ("10mbit", ("6mbit", "3mbit"), None, {}),
        # the default suits the leaves, not the link class (unused): the link class gets the
        # quantum the kernel would clamp it to, r2q stays the kernel's default.
        ("100mbit", ("6mbit", "1mbit"), None, {"link": 200000}),
        # the default suits no leaf: the round r2q nearest 10 that suits every class
        ("1gbit", ("700mbit", "300mbit"), 1000, {}),
        ("100mbit", ("60mbit", "40mbit"), 100, {}),
        # small leaves: r2q goes down
        ("400kbit", ("40kbit", "360kbit"), 5, {}),
        # the leaves suit r2q 438..37500 but the link class needs 625 or more: 1000
        ("2gbit", ("700mbit", "300mbit"), 2000, {}),
        # rates 2812 times apart: no r2q suits both leaves; each leaf out of range, and the
        # link class, gets the quantum the kernel would keep
        ("100mbit", ("32kbit", "90mbit"), None, {"link": 200000, "c0": 1000, "c1": 200000}),
    ],
)
def test_allocation_chooses_r2q_or_quanta(
    tmp_path: Path, link: str, leaves: tuple[str, ...], r2q: int | None, chosen: dict[str, int]
) -> None:
    result = _analyse(tmp_path, _policy(link, *leaves))
    q = _htb(result)
    assert q.chosen_r2q == r2q
    assert _chosen(q) == chosen
    assert all(1000 <= v <= 200000 for v in _quanta(q).values() if v is not None)
    assert not [d for d in result.diagnostics if d.code == "W316"]


def test_what_the_policy_sets_is_kept(tmp_path: Path) -> None:
    # r2q written: nothing is chosen (W316 says what the kernel will do)
    q = _htb(_analyse(tmp_path, _policy("1gbit", "700mbit", "300mbit", r2q=" r2q 10")))
    assert q.chosen_r2q is None and _chosen(q) == {}
    # a class's own quantum is kept, and its rate does not choose r2q
    text = (
        "interface eth0 htb rate 10mbit default b {\n"
        "    class a rate 9mbit quantum 60000 match dport 1\n"
        "    class b rate 20kbit\n"
        "}\n"
    )
    q = _htb(_analyse(tmp_path, text))
    # b alone chooses: 20kbit needs r2q 2 or less (the link class, not a leaf, gets a quantum)
    assert q.chosen_r2q == 2 and _chosen(q) == {"link": 200000}
    assert _quanta(q) == {"link": 200000, "a": 60000, "b": 1250}


def test_nested_htb_chooses_its_own_r2q(tmp_path: Path) -> None:
    text = (
        "interface eth0 htb rate 1gbit default a {\n"
        "    class a rate 700mbit {\n"
        "        htb {\n"
        "            class x rate 20kbit match dport 1\n"
        "            class y rate 30kbit\n"
        "        }\n"
        "    }\n"
        "    class b rate 300mbit match dport 2\n"
        "}\n"
    )
    result = _analyse(tmp_path, text)
    outer = _htb(result)
    a = next(c for c in outer.classes[0].children if c.name == "a")
    assert isinstance(a.leaf, ir.Htb)
    assert outer.chosen_r2q == 1000
    assert a.leaf.chosen_r2q == 2


def _compile(tmp_path: Path, text: str, backend: str) -> str:
    result = compile_policy(_write(tmp_path, text), backend)
    assert result.output is not None, result.diagnostics
    return result.output


CHOSEN_R2Q = _policy("1gbit", "700mbit", "300mbit")
CHOSEN_QUANTA = _policy("100mbit", "32kbit", "90mbit")


@pytest.mark.parametrize("backend", ["shell", "tc-batch"])
def test_tc_backends_write_the_chosen_values(tmp_path: Path, backend: str) -> None:
    out = _compile(tmp_path, CHOSEN_R2Q, backend)
    assert "root handle 1: htb r2q 1000\n" in out
    out = _compile(tmp_path, CHOSEN_QUANTA, backend)
    assert "classid 1:1 htb rate 100mbit quantum 200000\n" in out
    assert "classid 1:10 htb rate 32kbit quantum 1000\n" in out
    assert "classid 1:20 htb rate 90mbit quantum 200000\n" in out


def test_tcng_writes_the_chosen_values_of_leaves_only(tmp_path: Path) -> None:
    assert "htb (0x1, r2q 1000) {" in _compile(tmp_path, CHOSEN_R2Q, "tcng")
    out = _compile(tmp_path, CHOSEN_QUANTA, "tcng")
    # tcng would pass the link class's quantum on to its children: leaves only
    assert "class (0x1, rate 100Mbps, ceil 100Mbps) {" in out
    assert "class (0x10, rate 32kbps, ceil 32kbps, quantum 1000B)" in out


def test_json_holds_the_chosen_values(tmp_path: Path) -> None:
    doc = json.loads(_compile(tmp_path, CHOSEN_R2Q, "json"))
    root = doc["interfaces"][0]["root"]
    assert (root["r2q"], root["chosen_r2q"], root["tc"]) == (None, 1000, "htb r2q 1000")
    doc = json.loads(_compile(tmp_path, CHOSEN_QUANTA, "json"))
    link = doc["interfaces"][0]["root"]["classes"][0]
    assert link["chosen_quantum"] == 200000
    assert [c["chosen_quantum"] for c in link["children"]] == [1000, 200000]


def test_verify_expects_the_chosen_values(tmp_path: Path) -> None:
    for text, key, value in ((CHOSEN_R2Q, "r2q", 1000), (CHOSEN_QUANTA, "quantum", 1000)):
        result = _analyse(tmp_path, text)
        assert result.policy is not None
        (iface,) = expected_policy(result.policy, result.sources).interfaces
        wants = [w for q in iface.qdiscs for w in q.wants if w.key == key]
        wants += [w for c in iface.classes for w in c.wants if w.key == key]
        assert any(w.value == value and "chosen by tcdsl" in w.policy for w in wants), wants


def test_explain_says_what_tcdsl_chose(tmp_path: Path) -> None:
    result = _analyse(tmp_path, CHOSEN_R2Q)
    assert result.policy is not None
    text = " ".join(explain(result.policy).split())
    assert "r2q 1000, chosen by tcdsl" in text
    result = _analyse(tmp_path, CHOSEN_QUANTA)
    assert result.policy is not None
    text = " ".join(explain(result.policy).split())
    assert "1000 bytes, chosen by tcdsl: rate / r2q would be 400" in text
    assert "no single r2q suits every leaf class of this htb" in text


def test_one_w316_per_htb_names_the_classes(tmp_path: Path) -> None:
    rates = [f"{20 + i}mbit" for i in range(40)]
    text = _policy("2gbit", *rates, r2q=" r2q 10")
    found = [d for d in _analyse(tmp_path, text).diagnostics if d.code == "W316"]
    assert len(found) == 1
    (w316,) = found
    assert "of the interface's link class, class 'c0', class 'c1' and 38 more classes" in (
        w316.message
    )
    assert "write an r2q between 1250 and 2500, or leave r2q out" in w316.message
    assert len(w316.notes) == 41
    assert w316.span.line == 1  # at the r2q the policy writes


def test_w316_on_inner_classes_only_says_it_is_harmless(tmp_path: Path) -> None:
    text = _policy("100mbit", "6mbit", "1mbit", r2q=" r2q 10")
    (w316,) = [d for d in _analyse(tmp_path, text).diagnostics if d.code == "W316"]
    assert w316.message.endswith("harmless, as only leaf classes use their quantum")
