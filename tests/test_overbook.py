"""Over-booking: children guaranteed more than their parent is a warning (W350) that says by how
much, silenced by ``overbook`` on the parent or a disable comment; the retired E201/E203."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.teach.explain import explain
from tcdsl.teach.simulate import simulate
from tcdsl.teach.traffic import parse_flow

MAIN = "policy.tcp"

ISP = """interface eth0 htb rate 1gbit burst 123k cburst 123k{link} default b {{
    class isp rate 1gbit burst 123k cburst 123k{cls} {{
        class a rate 600mbit match dport 80
        class b rate 600mbit
    }}
}}
"""


def loader_of(text: str) -> Callable[[str], str]:
    return lambda path: text


def check(text: str) -> Result:
    return analyse(MAIN, loader=loader_of(text))


def codes(text: str) -> list[str]:
    return [d.code for d in check(text).diagnostics if not d.code.startswith("I")]


def test_overbooking_is_a_warning_that_says_by_how_much() -> None:
    result = check(ISP.format(link="", cls=""))
    (d,) = result.diagnostics
    assert (d.code, d.is_error) == ("W350", False)
    assert d.message == (
        "children of class 'isp' are guaranteed 1200mbit in all, 200mbit above its rate 1gbit: "
        "when only 1gbit is there for them, under full load each gets about 83% of its rate; "
        "write 'overbook' on the class if this is on purpose"
    )
    assert result.policy is not None  # it compiles


@pytest.mark.parametrize(
    "text",
    [
        ISP.format(link="", cls=" overbook"),
        ISP.format(link="", cls="").replace(
            "b rate 600mbit", "b rate 600mbit  # tcdsl: disable=W350"
        ),
        "# tcdsl: disable-file=W350\n" + ISP.format(link="", cls=""),
    ],
    ids=["flag", "comment", "file-comment"],
)
def test_overbook_flag_or_disable_comment_silences_it(text: str) -> None:
    assert codes(text) == []


def test_the_link_class_says_overbook_on_the_interface_line() -> None:
    text = """interface eth0 htb rate 10mbit{flag} default b {{
    class a rate 6mbit match dport 80
    class b rate 6mbit
}}
"""
    result = check(text.format(flag=""))
    assert [d.code for d in result.diagnostics] == ["W350"]
    assert "write 'overbook' on the interface line" in result.diagnostics[0].message
    assert codes(text.format(flag=" overbook")) == []


def test_over_the_ceil_names_the_ceil() -> None:
    text = ISP.replace("class isp rate 1gbit", "class isp rate 500mbit ceil 1gbit")
    (d,) = check(text.format(link="", cls="")).diagnostics
    assert "200mbit above its ceil 1gbit" in d.message
    assert d.notes[0].message == "ceil given here"
    (d,) = check(text.replace("600mbit", "300mbit").format(link="", cls="")).diagnostics
    assert "100mbit above its rate 500mbit" in d.message


def test_cbq_says_overbook_on_its_line() -> None:
    text = """interface eth0 cbq bandwidth 10mbit avpkt 1000{flag} {{  # tcdsl: disable=W306
    class web rate 6mbit avpkt 1000 match dport 80
    class mail rate 5mbit avpkt 1000 match dport 25
}}
"""
    assert codes(text.format(flag="")) == ["W350"]
    assert codes(text.format(flag=" overbook")) == []


def test_overbook_that_overbooks_nothing_is_a_warning() -> None:
    text = ISP.replace("600mbit", "400mbit").format(link="", cls=" overbook")
    assert codes(text) == ["W351"]


def test_retired_codes_cannot_be_disabled_and_say_what_replaced_them() -> None:
    result = CliRunner().invoke(cli, ["check", "--disable", "E201", "x.tcp"])
    assert result.exit_code == 2
    assert "E201 is retired: over-booking a parent's rate is warning W350 now" in result.output
    text = ISP.format(link="", cls="").replace(
        "b rate 600mbit", "b rate 600mbit  # tcdsl: disable=E203"
    )
    assert codes(text) == ["W350", "W307"]


def test_json_carries_the_flag() -> None:
    text = ISP.format(link=" overbook", cls=" overbook").replace("600mbit", "700mbit")
    out = compile_policy(MAIN, "json", loader=loader_of(text)).output
    assert out is not None
    link = json.loads(out)["interfaces"][0]["root"]["classes"][0]
    assert link["overbook"] is True and link["children"][0]["overbook"] is True


def test_explain_and_simulate_say_what_overbooking_does_at_run_time() -> None:
    policy = check(ISP.format(link="", cls=" overbook")).policy
    assert policy is not None
    text = explain(policy)
    assert "Over-booked: on purpose: the policy says 'overbook'." in text
    assert "each gets about 83% of its rate" in " ".join(text.split())
    flows = [parse_flow("a: tcp dport 80", 0), parse_flow("b: tcp dport 81", 1)]
    # On a link with room, htb keeps both guarantees, past the parent's 1gbit.
    roomy = simulate(policy, flows, 50_000, link=10**10)
    assert any("over-booking its rate 1gbit" in n for n in roomy.notes)
    rates = {s.name: sum(s.bytes) * 8 * 1_000_000 // roomy.duration for s in roomy.classes}
    assert all(r > 590_000_000 for r in rates.values()), rates
    # On a 1gbit link, the guarantees cannot all hold: together they get the link's 1gbit.
    full = simulate(policy, flows, 50_000)
    rates = {s.name: sum(s.bytes) * 8 * 1_000_000 // full.duration for s in full.classes}
    assert 980_000_000 < sum(rates.values()) < 1_010_000_000, rates
    assert min(rates.values()) < 600_000_000, rates


def test_the_share_is_rounded_to_the_nearest_percent() -> None:
    """Found by a tester: 100mbit shared by 130mbit of rates is 76.9% each, said 'about 76%'."""
    text = (
        "interface eth0 htb rate 100mbit default c {\n"
        "    class a rate 60mbit match dport 1\n    class b rate 60mbit match dport 2\n"
        "    class c rate 10mbit\n}\n"
    )
    (d,) = [d for d in check(text).diagnostics if d.code == "W350"]
    assert "each gets about 77% of its rate" in d.message, d.message


def test_a_prio_is_said_to_get_all_of_its_rates_only_where_they_fit() -> None:
    """Found by a review: 9mbit at prio 0 and 1001kbit at prio 1 under 10mbit was 'prio 1 all
    of their rates'."""
    text = (
        "interface eth0 htb rate 10mbit default mail {\n"
        "    class web rate 9mbit match dport 80\n"
        "    class mail prio 1 rate 1001kbit\n}\n"
    )
    (d,) = [d for d in check(text).diagnostics if d.code == "W350"]
    assert "prio 0 all of their rates, prio 1 about 99% of their rates" in d.message, d.message


def test_no_share_is_said_where_another_class_takes_part_of_the_link() -> None:
    """Found by a review: a class with the link's ceil was said to give its children the whole
    link by prio, where a sibling's rate takes its part of it first."""
    text = (
        "interface eth0 htb rate 10mbit default b {\n"
        "    class a rate 5mbit ceil 10mbit {\n"
        "        class web rate 6mbit match dport 80\n"
        "        class mail prio 1 rate 6mbit match dport 25\n"
        "    }\n"
        "    class b rate 5mbit\n}\n"
    )
    (d,) = [d for d in check(text).diagnostics if d.code == "W350"]
    assert "%" not in d.message and "only when it is full" in d.message, d.message
