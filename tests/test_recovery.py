"""Syntax-error recovery: every syntax error of a file is reported, none caused by an earlier one,
and the later stages report only what those errors cannot have caused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark.exceptions import UnexpectedInput

from tcdsl.diagnostics import Diagnostic
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.frontend import recovery
from tcdsl.frontend.builder import Builder
from tcdsl.frontend.errors import syntax_error
from tcdsl.frontend.reader import Reader, _parser
from tests.conftest import DIAGNOSTICS, POLICIES

MAIN = "policy.tcp"
SYNTAX = ("E001", "E002")


def loader_of(text: str) -> Callable[[str], str]:
    """Read ``text`` as ``policy.tcp``; there is no other file."""

    def load(path: str) -> str:
        if path != MAIN:
            raise FileNotFoundError(2, "No such file or directory", path)
        return text

    return load


def check_text(text: str) -> Result:
    """``tcdsl check`` on ``text`` as ``policy.tcp``, without touching the disk."""
    return analyse(MAIN, loader=loader_of(text))


def codes(result: Result) -> list[tuple[str, int]]:
    """(code, line) of every diagnostic, in order."""
    return [(d.code, d.span.line) for d in result.diagnostics]


def syntax_errors(text: str) -> list[Diagnostic]:
    """The syntax errors the reader reports for ``text``."""
    reader = Reader(loader=loader_of(text))
    reader.read(MAIN)
    return [d for d in reader.diagnostics if d.code in SYNTAX]


def first_error_without_recovery(text: str) -> Diagnostic | None:
    """The one syntax error a parse that stops at the first one reports."""
    parser = _parser(Builder(Reader(loader=lambda _path: ""), MAIN))
    try:
        parser.parse(text)
    except UnexpectedInput as err:
        state = err.interactive_parser.parser_state
        values = list(state.value_stack)
        return syntax_error(err, MAIN, text, recovery.accepted(err), values, parser.terminals)
    return None


# ---- every syntax error, none twice ----------------------------------------------------------


def test_three_errors_three_reports_with_suggestions() -> None:
    text = (
        "interface eth0 htb rate 10mbit default web {\n"
        "    clas voip rate 1mbit\n"
        "    class web rate 5mbit ciel 8mbit\n"
        "    class bulk rate 1mbit { match dprot 80 }\n"
        "}\n"
    )
    errors = syntax_errors(text)
    assert [(d.span.line, d.span.column) for d in errors] == [(2, 5), (3, 26), (4, 35)]
    assert "(did you mean 'class'?)" in errors[0].message
    assert "(did you mean 'ceil'?)" in errors[1].message
    assert "(did you mean 'dport'?)" in errors[2].message


@pytest.mark.parametrize(
    ("word", "meant"),
    [("interfce", "interface"), ("cnost", "const"), ("inclde", "include")],
)
def test_misspelled_top_level_keyword(word: str, meant: str) -> None:
    (error,) = syntax_errors(f"{word} x\n")
    assert f"(did you mean '{meant}'?)" in error.message


def test_no_suggestion_for_an_unlike_word() -> None:
    (error,) = syntax_errors("interface eth0 htb rate 10mbit {\n    zzzz\n}\n")
    assert "did you mean" not in error.message


def test_a_failed_statement_keeps_its_block() -> None:
    """The block of a statement that failed is skipped whole: what is inside is not read at
    the outer level, and its '}' closes nothing outside."""
    text = (
        "interface eth0 htb rate 10mbit default web {\n"
        "    clas voip rate 1mbit {\n"
        "        match dport 5060\n"
        "        sfq\n"
        "    }\n"
        "    class web rate 5mbit\n"
        "    class web rate 5mbit\n"
        "}\n"
    )
    result = check_text(text)
    assert codes(result) == [("E001", 2), ("E101", 7)]


def test_a_block_is_read_when_the_bad_words_come_before_its_brace() -> None:
    """Words that do not parse are dropped up to the statement's '{', whose block is read."""
    text = (
        "interface eth0 htb rate 10mbit default web {\n"
        "    class web rate 5mbit cel 8mbit {\n"
        "        class a rate 1mbit rat\n"
        "        class b rate 1mbit {\n"
        "            sfq perturb\n"
        "        }\n"
        "    }\n"
        "}\n"
    )
    errors = syntax_errors(text)
    assert [d.span.line for d in errors] == [2, 3, 5]


def test_a_block_is_read_when_the_error_is_at_its_brace() -> None:
    text = (
        "interface eth0 htb rate 10mbit default web {\n"
        "    class web rate 5mbit ceil {\n"
        "        clas inner rate 1mbit\n"
        "    }\n"
        "    class x rate 1mbit\n"
        "    class x rate 1mbit\n"
        "}\n"
    )
    assert codes(check_text(text)) == [("E001", 2), ("E001", 3), ("E101", 6)]


def test_errors_after_a_nested_error_are_still_found() -> None:
    text = (
        "interface eth0 htb rate 10mbit {\n"
        "    class a rate 1mbit {\n"
        "        class b rate 1mbit {\n"
        "            match dport\n"
        "        }\n"
        "        class c rate 1mbit {\n"
        "            match sport 80,\n"
        "        }\n"
        "    }\n"
        "}\n"
        "interface eth1 tbf rate 1mbit burst 10k latency\n"
        'interface eth2 tbf "unterminated\n'
    )
    assert [(d.code, d.span.line) for d in syntax_errors(text)] == [
        ("E001", 4),
        ("E001", 7),
        ("E001", 11),
        ("E002", 12),
    ]


def test_brace_on_the_next_line_is_one_error() -> None:
    text = "interface eth0 htb rate 10mbit\n{\n    class web rate 5mbit\n}\ninterface eth1 sfq\n"
    assert codes(check_text(text)) == [("E002", 2)]


def test_a_stray_closing_brace_is_one_error() -> None:
    text = "interface eth0 sfq\n}\n}\ninterface eth1 sfq\n"
    assert codes(check_text(text)) == [("E001", 2), ("E001", 3)]


def test_unterminated_block_is_reported_once() -> None:
    text = "interface eth0 htb rate 10mbit {\n    class a rate 1mbit {\n        sfq\n"
    assert codes(check_text(text)) == [("E001", 3)]


def test_a_constant_whose_declaration_failed_is_not_reported_at_its_uses() -> None:
    text = (
        "const R = 10mbit +\n"
        "const ADDR = 10.0.0.1 +\n"
        "interface eth0 htb rate R default a {\n"
        "    class a rate R match src ADDR\n"
        "    class b rate R\n"
        "}\n"
    )
    assert codes(check_text(text)) == [("E001", 1), ("E001", 2)]


def test_expected_list_has_no_trailing_dots_and_no_impossible_option() -> None:
    (error,) = syntax_errors("interface eth0 htb rate 10mbit {\n    class a rate 1mbit @\n}\n")
    assert "..." not in error.message
    assert "default" not in error.message  # a class takes no 'default'
    (error,) = syntax_errors("interface eth0 pfifo_fast limt\n")  # it takes no parameter
    assert error.message == "unexpected 'limt'; expected 'handle', '{' or the end of the line"


def test_parameter_of_another_qdisc_gets_a_suggestion() -> None:
    result = check_text("interface eth0 netem delay 10ms peakrate 1mbit\n")
    (error,) = result.errors
    assert error.code == "E007"
    assert "(did you mean 'rate'?)" in error.message


# ---- later stages after errors ---------------------------------------------------------------


def test_one_error_of_each_stage_in_one_run() -> None:
    text = (
        "interface eth0 htb rate 10mbit default web {\n"
        "    clas typo rate 1mbit\n"  # syntax
        "    class web rate 2mbit {\n"
        "        sfq\n"
        "        pfifo\n"  # structure (E018)
        "    }\n"
        "    class big rate 5mbit {\n"
        "        class k1 rate 4mbit match dport 80\n"
        "        class k2 rate 4mbit match dport 443\n"  # checks (W350, a warning)
        "    }\n"
        "    class lonely rate 1mbit\n"  # lint (W311)
        "}\n"
    )
    assert codes(check_text(text)) == [("E001", 2), ("E018", 5), ("W350", 9), ("W311", 11)]
    assert compile_policy(MAIN, loader=loader_of(text)).output is None


@pytest.mark.parametrize(
    "text",
    [
        # the rate was dropped: no "needs a rate", no percentage without a parent rate
        "interface eth0 htb rate 10mbit default a {\n"
        "    class a rate 10mbt {\n"
        "        class b rate 50%\n"
        "    }\n"
        "}\n",
        "interface eth0 htb rat 10mbit default a {\n    class a rate 50%\n}\n",
        # the default class's statement was dropped: no "default names no class"
        "interface eth0 htb rate 10mbit default a {\n    clas a rate 1mbit\n}\n",
        # the leaf's parameters were dropped: no "tbf needs a rate"
        "interface eth0 htb rate 10mbit default a {\n"
        "    class a rate 1mbit { tbf rate 1mbit burst 10k latncy 50ms }\n"
        "}\n",
        # the match was dropped: no "no packet can reach class"
        "interface eth0 htb rate 10mbit default a {\n"
        "    class a rate 1mbit\n"
        "    class b rate 1mbit { match dprot 80 }\n"
        "}\n",
    ],
)
def test_no_follow_on_from_later_stages(text: str) -> None:
    result = check_text(text)
    assert {d.code for d in result.diagnostics} <= {*SYNTAX, "E005"}, codes(result)


def test_later_stages_stop_where_lint_is_not_sound() -> None:
    """A check error other than a sum of rates stops before lint (its IR may break lint)."""
    text = "interface eth0 htb rate 10mbit {\n    class a ceil 1mbit\n}\n"
    assert codes(check_text(text)) == [("E019", 2)]


# ---- properties ------------------------------------------------------------------------------

SEEDS = sorted(
    p
    for p in [*POLICIES.rglob("*.tcp"), *DIAGNOSTICS.glob("*.tcp")]
    if "E020" not in p.name and p.stat().st_size < 4000
)
JUNK = ["clas", "{", "}", "\n", ";", "rate", "@", '"', "ciel", "match", "10mbit", "sfq", "%"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A policy or corpus case with a few words deleted, duplicated or replaced by junk."""
    text = draw(st.sampled_from(SEEDS)).read_text(encoding="utf-8")
    words = text.replace("\n", " \n ").split(" ")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(words) - 1))
        match draw(st.sampled_from(["delete", "junk", "repeat"])):
            case "delete":
                del words[at]
            case "junk":
                words[at] = draw(st.sampled_from(JUNK))
            case _:
                words.insert(at, words[at])
        if not words:
            words = [""]
    return " ".join(words).replace(" \n ", "\n")


@settings(
    max_examples=250,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated())
def test_recovery_never_crashes_and_starts_with_the_first_error(text: str) -> None:
    result = check_text(text)  # an exception here is exit 3
    errors = [d for d in result.diagnostics if d.code in SYNTAX]
    first = first_error_without_recovery(text)
    if first is None:
        assert not errors
    else:
        assert errors
        assert min(errors, key=lambda d: (d.span.line, d.span.column)) == first
        assert len(errors) == len(set(errors))  # none twice


# ---- statements as the text shows them --------------------------------------------------------


def test_statement_extents() -> None:
    """A statement runs to its separator (inclusive), its block and a '{' on the next line
    included; braces in strings and comments do not count."""
    text = 'a b {\n  c "}" # }\n  d {\n  }\n}\ne\n{\n}\n'
    found = recovery.statements(text)
    assert [text[s.start : s.end + 1] for s in found] == [
        'a b {\n  c "}" # }\n  d {\n  }\n}\n',
        'c "}" # }\n',
        "d {\n  }\n",
        "e\n{\n}\n",
    ]
    assert [text[s.start : s.header_end] for s in found] == ["a b ", 'c "}" # }', "d ", "e\n"]
    assert [s.parent for s in found] == [-1, 0, 0, -1]


def test_includes_nested_too_deep_report_no_unknown_constants(tmp_path: Path) -> None:
    """61 files each including the next, the last defining Z: one E006 at the 32nd level, not
    32 more 'unknown constant' errors where Z is used."""
    for i in range(61):
        body = f'include "f{i + 1}.tcp"\n' if i < 60 else "const Z = 1mbit\n"
        (tmp_path / f"f{i}.tcp").write_text(body, encoding="utf-8")
    main = tmp_path / "main.tcp"
    main.write_text('include "f0.tcp"\ninterface eth0 tbf rate Z burst 10k latency 50ms\n', "utf-8")
    result = analyse(str(main))
    assert [d.code for d in result.diagnostics] == ["E006"]


def test_a_missing_brace_is_found_by_the_statements_indentation() -> None:
    """Found by a review: with statements fmt breaks over lines, the continuation lines'
    deeper indentation made the guess name the wrong block; the guess reads each statement's
    first line. A file that indents nothing gets no guess (the innermost open brace's note)."""
    text = (
        "interface eth0 {\n"
        "    download htb rate 10mbit burst 15k cburst 15k \\\n"
        "            default other {\n"
        "        class a rate 1mbit \\\n"
        "                match src 10.0.0.1\n"
        "        class c rate 1mbit {\n"
        "            sfq\n"
        "        class other rate 1mbit\n"
        "    }\n"
        "}\n"
    )
    result = analyse(MAIN, loader=loader_of(text))
    (end,) = [d for d in result.errors if d.code == "E001"]
    assert [(n.message, n.span.line, n.span.column) for n in end.notes] == [
        ("this '{' looks unclosed", 6, 28),
        ("a '}' is likely missing before this line, indented as line 6", 8, 9),
    ]
    flat = "".join(line.lstrip() + "\n" for line in text.split("\n") if line)
    result = analyse(MAIN, loader=loader_of(flat))
    (end,) = [d for d in result.errors if d.code == "E001"]
    assert [n.message for n in end.notes] == ["this '{' is not closed"]
