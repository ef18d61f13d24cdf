"""The hfsc qdisc: service curves through the frontend, tc's words, verify's read-back,
classify, simulate and explain; and the kernel's own view in the user-mode Linux guest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.commands import class_words, qdisc_words
from tcdsl.diagnostics import render
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.teach.classify import classify, outcome
from tcdsl.teach.explain import explain
from tcdsl.teach.report import Run
from tcdsl.teach.simulate import simulate
from tcdsl.teach.traffic import parse_flow, parse_packet
from tcdsl.verify import runner, verifier
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import parse_classes
from tests.conftest import ROOT

ROUTER = "policies/hfsc-router.tcp"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _compile(tmp_path: Path, text: str) -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path))
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return result


def _classes(result: Result) -> dict[str, ir.Class]:
    assert result.policy is not None
    root = result.policy.interfaces[0].root
    return {c.name: c for c in ir.classes_of(root)}


def _codes(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return [d.code for d in analyse(str(path)).diagnostics]


# ---- the language ----------------------------------------------------------------------------


def test_both_curve_spellings_and_sc(tmp_path: Path) -> None:
    result = _compile(
        tmp_path,
        "interface eth0 hfsc default b {\n"
        "  class a rt m1 2mbit d 10ms m2 1mbit ls m2 3mbit ul rate 5mbit match dport 22\n"
        "  class b sc umax 1500b dmax 10ms rate 2mbit\n"
        "}\n",
    )
    a, b = _classes(result).values()
    assert a.rt is not None and (a.rt.m1_bits, a.rt.d_us, a.rt.m2.bits_per_second) == (
        2_000_000,
        10_000,
        1_000_000,
    )
    assert a.ul is not None and (a.ul.m1, a.ul.d, a.ul.m2.bits_per_second) == (
        None,
        None,
        5_000_000,
    )
    assert b.rt is b.ls, "sc is rt and ls at once"
    # tc's conversion: 1500 bytes in 10ms is 150000 B/s (1.2mbit), below the 2mbit rate: a
    # convex curve, nothing for dmax - umax / rate = 10ms - 6ms = 4ms, then the rate
    assert b.rt is not None and (b.rt.m1_bits, b.rt.d_us) == (0, 4000)
    assert class_words("hfsc", a) == [
        "hfsc",
        *("rt", "m1", "2mbit", "d", "10ms", "m2", "1mbit"),
        *("ls", "m2", "3mbit", "ul", "m2", "5mbit"),
    ]
    # given to tc converted (tc would compute a convex curve's umax * 10^6 in 32 bits)
    assert class_words("hfsc", b) == ["hfsc", "sc", "m1", "0bit", "d", "4ms", "m2", "2mbit"]
    assert result.policy is not None
    assert qdisc_words(result.policy.interfaces[0].root) == ["hfsc", "default", "20"]


def test_umax_curves_are_given_to_tc_converted(tmp_path: Path) -> None:
    result = _compile(
        tmp_path,
        "interface eth0 hfsc default v {\n class v ls umax 65535 dmax 10ms rate 10gbit\n}\n",
    )
    ls = _classes(result)["v"].ls
    # convex: 10ms - 65535 bytes / 1.25e9 B/s (52.4us) = 9948us; tc 6.1 would compute the
    # 65535 * 10^6 in 32 bits and keep 10ms
    assert ls is not None and (ls.m1_bits, ls.d_us) == (0, 9948)
    assert class_words("hfsc", _classes(result)["v"])[1:] == [
        "ls",
        "m1",
        "0bit",
        "d",
        "9948us",
        "m2",
        "10gbit",
    ]


def test_concave_umax_curve_is_converted_as_tc_does(tmp_path: Path) -> None:
    result = _compile(
        tmp_path,
        "interface eth0 hfsc default v {\n  class v rt umax 1500b dmax 5ms rate 1mbit\n}\n",
    )
    rt = _classes(result)["v"].rt
    # 1500 bytes in 5ms = 300000 B/s (2.4mbit), above the rate: m1 = umax / dmax for dmax
    assert rt is not None and (rt.m1_bits, rt.d_us, rt.m2.bits_per_second) == (
        2_400_000,
        5000,
        1_000_000,
    )


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("class b ls m2 0bit", "E235"),
        ("class b rt umax 1500b rate 1mbit", "E235"),
        ("class b ls m2 40gbit", "E235"),
        ("class b ls m1 4bit d 1ms m2 1mbit", "E235"),
        ("class b ls umax 65535 dmax 1us rate 1mbit", "E235"),
        ("class b ul m2 1mbit", "E236"),
        ("class b rt m2 1mbit ul m2 2mbit", "E237"),
        ("class a rt m2 1mbit {\n class b ls m2 1mbit\n }", "E238"),
        ("class b rate 1mbit", "E007"),
        ("class b rt umax 1b dmax 2ms ceil 1mbit", "E007"),
        ("class b ls m2 1mbit ls m2 2mbit", "E014"),
        ("class b sc m2 1mbit ls m2 2mbit", "E014"),
    ],
)
def test_refused_curves_are_located_errors(tmp_path: Path, text: str, code: str) -> None:
    codes = _codes(tmp_path, f"interface eth0 hfsc default b {{\n {text}\n}}\n")
    assert code in codes, codes


def test_curves_belong_to_hfsc_classes_only(tmp_path: Path) -> None:
    codes = _codes(tmp_path, "interface eth0 htb default b {\n class b rate 1mbit rt m2 1mbit\n}\n")
    assert codes == ["E007"]


def test_the_example_policy_is_clean() -> None:
    assert analyse(ROUTER).diagnostics == []


def test_no_default_is_a_loud_warning(tmp_path: Path) -> None:
    codes = _codes(tmp_path, "interface eth0 hfsc {\n class b ls m2 1mbit match dport 22\n}\n")
    assert codes == ["W345"]


# ---- classify, simulate, explain ---------------------------------------------------------------


def test_classify_drops_what_no_class_takes_without_a_default(tmp_path: Path) -> None:
    result = _compile(tmp_path, "interface eth0 hfsc {\n class b ls m2 1mbit match dport 22\n}\n")
    assert result.policy is not None
    ssh = classify(result.policy, parse_packet("tcp dport 22"))
    dns = classify(result.policy, parse_packet("udp dport 53"))
    assert ssh.cls is not None and ssh.cls.name == "b" and not ssh.dropped
    assert dns.dropped and "dropped" in outcome(dns)


def test_classify_uses_the_default_class() -> None:
    result = compile_policy(ROUTER)
    assert result.policy is not None
    voip = classify(result.policy, parse_packet("udp dport 5060"))
    mail = classify(result.policy, parse_packet("tcp dport 25"))
    assert voip.cls is not None and voip.cls.name == "voip"
    assert mail.cls is not None and mail.cls.name == "bulk"


def _mbit(run: Run, name: str) -> float:
    return run.rate_between(run.series(name), 0, run.duration) / 1e6


def test_simulate_shares_by_ls_and_caps_by_ul() -> None:
    result = compile_policy(ROUTER)
    assert result.policy is not None
    alone = simulate(result.policy, [parse_flow("bulk: tcp dport 25")], 3_000_000)
    assert _mbit(alone, "bulk") == pytest.approx(15, rel=0.03)  # its ul, below the 19mbit link
    flows = [parse_flow(f) for f in ("ssh: tcp dport 22", "bulk: tcp dport 25")]
    both = simulate(result.policy, flows, 3_000_000)
    # ls 6mbit against 4mbit of 19mbit (interactive's rt service counts towards its share)
    assert _mbit(both, "interactive") == pytest.approx(19 * 6 / 10, rel=0.05)
    assert _mbit(both, "bulk") == pytest.approx(19 * 4 / 10, rel=0.05)


def test_simulate_keeps_real_time_guarantees(tmp_path: Path) -> None:
    result = _compile(
        tmp_path,
        "interface eth0 hfsc default bulk {\n"
        "  class link ls m2 10mbit ul m2 10mbit {\n"
        "    class voip rt m2 3mbit ls m2 1mbit match proto udp dport 5060\n"
        "    class bulk ls m2 9mbit\n"
        "  }\n"
        "}\n",
    )
    assert result.policy is not None
    flows = [parse_flow(f) for f in ("v: udp dport 5060", "b: udp dport 1")]
    run = simulate(result.policy, flows, 3_000_000)
    # link-sharing alone would give voip 1mbit of 10; its real-time curve guarantees 3mbit
    assert _mbit(run, "voip") == pytest.approx(3, rel=0.05)
    assert _mbit(run, "bulk") == pytest.approx(7, rel=0.05)


def test_explain_says_the_curves_in_words(tmp_path: Path) -> None:
    result = _compile(
        tmp_path,
        "interface eth0 hfsc default b {\n"
        "  class b rt umax 1500b dmax 10ms rate 2mbit ls m2 3mbit ul m2 5mbit\n"
        "}\n",
    )
    assert result.policy is not None
    text = explain(result.policy)
    assert (
        "Guaranteed 2mbit with 10ms delay for the first 1500 bytes, shares the rest by 3mbit, "
        "never more than 5mbit." in " ".join(text.split())
    )


# ---- verify ------------------------------------------------------------------------------------

# What tc 6.1 prints for hfsc classes (user-mode Linux, the example policy): the root class 1:,
# equal rt and ls as sc, times through sprint_time.
HFSC_CLASSES = """\
class hfsc 1: root
class hfsc 1:10 parent 1: ls m1 0bit d 0us m2 19Mbit ul m1 0bit d 0us m2 19Mbit
class hfsc 1:20 parent 1:10 leaf 20: rt m1 2400Kbit d 5ms m2 1Mbit ls m1 0bit d 0us m2 1Mbit
class hfsc 1:30 parent 1:10 leaf 30: sc m1 0bit d 0us m2 2Mbit
"""


def test_readback_of_curves() -> None:
    classes = {c.classid: c for c in parse_classes(HFSC_CLASSES)}
    voip = classes["1:20"].options
    assert voip["rt.m1"].value == 2_400_000 and voip["rt.d"].value == 5000
    assert voip["ls.m2"].value == 1_000_000 and "ul.m2" not in voip
    both = classes["1:30"].options
    assert both["rt.m2"].value == both["ls.m2"].value == 2_000_000


def test_expected_curves_of_the_example() -> None:
    result = compile_policy(ROUTER)
    assert result.policy is not None
    (eth0,) = expected_policy(result.policy, result.sources).interfaces
    voip = next(c for c in eth0.classes if c.label == "class 'voip'")
    wants = {w.key: w.value for w in voip.wants}
    assert wants["rt.m1"] == 2_400_000 and wants["rt.d"] == 5000 and wants["rt.m2"] == 1_000_000
    assert wants["ul.m2"] == 0  # none: the kernel must show no ul
    link = next(c for c in eth0.classes if c.label == "class 'link'")
    assert link.parent == "1:", "hfsc's top classes hang off its root class"


def test_verify_reads_curves_back_in_user_mode_linux(tmp_path: Path) -> None:
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    other = tmp_path / "curves.tcp"
    other.write_text(
        "interface eth0 hfsc default b {\n"
        "  class a sc umax 1500b dmax 10ms rate 2mbit ul m2 3mbit match dport 22\n"
        "  class b ls m1 4mbit d 3ms m2 1mbit\n"
        "}\n",
        encoding="utf-8",
    )
    nested = tmp_path / "nested.tcp"
    nested.write_text(NESTED_AND_MARKS, encoding="utf-8")
    change = "tc class change dev eth0 parent 1:10 classid 1:40 hfsc ls m2 7mbit"
    paths = [ROUTER, str(other), str(nested)]
    changed, *clean = verifier.verify_many(paths, kernel="uml", after={ROUTER: change})
    lines = [d.message for d in changed.errors]
    assert lines == ["class 'web' ls.m2 is 7Mbit in the kernel, policy says 8mbit (ls m2 8mbit)"]
    for v in clean:
        assert v.ok, render(v.diagnostics, v.sources) + v.output


NESTED_AND_MARKS = """\
interface eth0 htb rate 10mbit default inner {
    class inner rate 10mbit {
        hfsc default b {
            class a sc m2 2mbit match dport 22
            class b ls m2 8mbit
        }
    }
}
interface eth1 hfsc default b {
    classify by mark from eth2
    class a rt m2 2mbit ls m2 1mbit match proto tcp dport 22
    class b ls m2 8mbit
}
"""


def test_an_hfsc_root_classifies_by_mark(tmp_path: Path) -> None:
    result = _compile(tmp_path, NESTED_AND_MARKS)
    assert result.policy is not None
    eth1 = result.policy.interfaces[1]
    assert eth1.marking is not None
    fw = [(f.mark, str(f.flowid), f.family) for f in eth1.filters if isinstance(f, ir.FwFilter)]
    assert fw == [
        (10, "1:10", "ipv4"),
        (10, "1:10", "ipv6"),
        (20, "1:20", "ipv4"),
        (20, "1:20", "ipv6"),
    ]
    assert eth1.marking.rules[-1].unmarked and eth1.marking.rules[-1].mark == 20


def test_an_hfsc_default_with_children_is_refused(tmp_path: Path) -> None:
    text = "interface eth0 hfsc default a {\n class a ls m2 1mbit {\n class b ls m2 1mbit\n }\n}"
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    (d,) = analyse(str(path)).diagnostics
    assert d.code == "E102" and "be dropped (hfsc has no direct queue)" in d.message


def test_a_leaf_qdisc_is_fed_at_most_the_class_ul(tmp_path: Path) -> None:
    text = "interface eth0 hfsc default b {\n class b ls m2 1mbit ul m2 10mbit { netem delay 5s }}"
    assert _codes(tmp_path, text) == ["W321"]  # 5s at 10mbit is more than netem's 1000 packets
    text = text.replace("10mbit", "1mbit")
    assert _codes(tmp_path, text) == []
