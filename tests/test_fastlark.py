"""tcdsl's Lark speed-ups give exactly the tokens, trees and errors of stock Lark."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lark import Lark, Token
from lark.exceptions import UnexpectedInput
from lark.lexer import PatternStr

from tcdsl import fastlark
from tcdsl.fastlark import PLUGINS, FastContextualLexer
from tcdsl.frontend.reader import Reader, grammar_text
from tests.conftest import DIAGNOSTICS, POLICIES

LARK = Lark(grammar_text(), parser="lalr", lexer="contextual")
FAST = Lark(
    grammar_text(),
    parser="lalr",
    lexer="contextual",
    _plugins={"ContextualLexer": FastContextualLexer},
)


FULL = Lark(grammar_text(), parser="lalr", lexer="contextual", _plugins=PLUGINS)

KEYWORDS = sorted(
    (t.pattern.value for t in LARK.terminals if isinstance(t.pattern, PatternStr)), key=len
)
GLUED = re.compile(
    rf"(?<![\w-])(?:{'|'.join(re.escape(k) for k in reversed(KEYWORDS) if k[-1:].isalnum())})[\w-]"
)
"""A keyword with a word character right after it: stock Lark reads the keyword and goes on
with the rest ('protoudp' as 'proto' 'udp'), fastlark reads one name (the test below)."""


def tree(parser: Lark, text: str) -> object:
    try:
        return parser.parse(text)
    except UnexpectedInput as err:
        return (type(err).__name__, err.line, err.column, sorted(getattr(err, "expected", ())))


def tokens(parser: Lark, text: str) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    try:
        for tok in parser.parse_interactive(text).iter_parse():
            assert isinstance(tok, Token)
            out.append((tok.type, str(tok), tok.line, tok.column, tok.end_line, tok.end_column))
    except UnexpectedInput as err:
        out.append((type(err).__name__, err.line, err.column))
    return out


# E020's case nests thousands of levels deep: comparing its trees would itself recurse too deep.
ALL_TEXTS = sorted(
    p for p in [*POLICIES.rglob("*.tcp"), *DIAGNOSTICS.rglob("*.tcp")] if "E020" not in p.name
)
GLUED_CASES = ("E001-keyword-glued-to-a-word.tcp", "E001-tc-words.tcp")
"""The diagnostic cases with a keyword glued to more of a word, which stock Lark reads as the
keyword and the rest (the test below)."""
TEXTS = [p for p in ALL_TEXTS if p.name not in GLUED_CASES]


def test_only_the_glued_keyword_cases_are_read_otherwise() -> None:
    """The cases left out of the comparisons with stock Lark are read otherwise by it."""
    left_out = [p for p in ALL_TEXTS if p.name in GLUED_CASES]
    assert len(left_out) == len(GLUED_CASES)
    for path in left_out:
        text = path.read_text(encoding="utf-8")
        differ = tokens(FAST, text) != tokens(LARK, text)
        differ = differ or syntax_errors(text, PLUGINS) != syntax_errors(text, {})
        assert GLUED.search(text) and differ, path.name


@pytest.mark.parametrize("path", TEXTS, ids=[p.name for p in TEXTS])
def test_same_tokens_on_every_policy_and_diagnostic_case(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert tokens(FAST, text) == tokens(LARK, text)
    assert tree(FULL, text) == tree(LARK, text)


PIECES = [
    "interface",
    " eth0",
    " s1-eth1",
    ' "a b"',
    " htb",
    " rate",
    " 10mbit",
    " 1.5kbit",
    " ceil",
    " 90%",
    " {",
    "}",
    "\n",
    "\r\n",
    "  ",
    "\t",
    " # note\n",
    " \\\n",
    " class",
    " web",
    " match",
    " dport",
    " 80",
    ",",
    " 1000-2000",
    " 3072/0xfc00",
    " src",
    " 10.0.0.0/8",
    " tos",
    " 0x10",
    " sfq",
    " perturb",
    " id",
    " 1:10",
    " handle",
    " 20:",
    ";",
    " const",
    " LINK",
    " =",
    " -",
    " *",
    " 0.9",
    " $",
    " @",
    " tcp-ack",
    " u16",
    " at",
    " 2",
    " pref",
]


def test_a_keyword_glued_to_more_of_a_word_is_a_name() -> None:
    """Found by a tester: 'protoudp', 'dscpef', 'matchall' and 'defaultbulk' were read as
    two words, 'protocol tcp' as 'proto' 'col'. A word that goes on past a keyword is one
    name: taken where a name may come, refused elsewhere (with the keyword suggested)."""
    text = "interface eth0 htb rate 10mbit default bulk {\n  class a rate 1mbit match protoudp\n}\n"
    found = tokens(FAST, text)
    assert ("NAME", "protoudp", 2, 28, 2, 36) in found, found
    assert found[-1][0] == "UnexpectedToken", found
    named = "const matchx = 5\n"
    assert [t[:2] for t in tokens(FAST, named)][:2] == [("CONST", "const"), ("NAME", "matchx")]
    assert GLUED.search(text) and GLUED.search(named) and not GLUED.search("match proto udp")


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_same_tokens_on_random_text(pieces: list[str]) -> None:
    text = "".join(pieces)
    assume(not GLUED.search(text))
    assert tokens(FAST, text) == tokens(LARK, text)
    assert tree(FULL, text) == tree(LARK, text)


# Every state of this parser's lexer makes its combined regex (blanks and token in one match)
# on its first token, as a big policy's busy states do after fastlark.COMBINE_AFTER tokens:
# the policies here are too small to reach that path otherwise.
COMBINED = Lark(grammar_text(), parser="lalr", lexer="contextual", _plugins=PLUGINS)


@pytest.mark.parametrize("path", TEXTS, ids=[p.name for p in TEXTS])
def test_same_tokens_through_the_combined_regexes(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastlark, "COMBINE_AFTER", 1)
    text = path.read_text(encoding="utf-8")
    assert tokens(COMBINED, text) == tokens(LARK, text)
    assert tree(COMBINED, text) == tree(LARK, text)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_same_tokens_on_random_text_through_the_combined_regexes(pieces: list[str]) -> None:
    saved = fastlark.COMBINE_AFTER
    fastlark.COMBINE_AFTER = 1  # (hypothesis runs the examples in one call of the test)
    try:
        text = "".join(pieces)
        assume(not GLUED.search(text))
        assert tokens(COMBINED, text) == tokens(LARK, text)
        assert tree(COMBINED, text) == tree(LARK, text)
    finally:
        fastlark.COMBINE_AFTER = saved


def test_the_combined_regexes_are_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two tests above do go through the combined regexes."""
    monkeypatch.setattr(fastlark, "COMBINE_AFTER", 1)
    tree(COMBINED, TEXTS[0].read_text(encoding="utf-8"))
    lexer = COMBINED.parser.lexer
    assert isinstance(lexer, FastContextualLexer)
    assert any(s.combined is not None for s in lexer._scanners().values())


def syntax_errors(text: str, plugins: dict[str, object]) -> list[object]:
    """Every syntax error the reader reports on ``text`` (as ``policy.tcp``) with ``plugins``."""
    saved = fastlark.PLUGINS
    fastlark.PLUGINS = plugins  # read when the reader builds its parser
    try:
        reader = Reader(loader=lambda _path: text)
        reader.read_text("policy.tcp", text)
    finally:
        fastlark.PLUGINS = saved
    return [d for d in reader.diagnostics if d.code in ("E001", "E002")]


@pytest.mark.parametrize("path", TEXTS, ids=[p.name for p in TEXTS])
def test_same_recovery_on_every_policy_and_diagnostic_case(path: Path) -> None:
    """Recovery edits the parser's stacks and moves its lexer: fastlark's loop and lexer must
    go on from there exactly as Lark's own."""
    text = path.read_text(encoding="utf-8")
    assert syntax_errors(text, PLUGINS) == syntax_errors(text, {})


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_same_recovery_on_random_text(pieces: list[str]) -> None:
    text = "".join(pieces)
    assume(not GLUED.search(text))
    assert syntax_errors(text, PLUGINS) == syntax_errors(text, {})


def test_reductions_take_the_lean_callbacks() -> None:
    """The flattened table calls generated child filters and ``Tree`` directly, and passes a
    one-symbol ``?rule``'s child up: a Lark upgrade that renames its builders fails here."""
    from lark import Tree
    from lark.parse_tree_builder import ChildFilterLALR_NoPlaceholders

    from tcdsl.frontend.builder import Builder
    from tcdsl.frontend.reader import _parser

    parser = _parser(Builder(Reader(), "x.tcp"))
    inner = parser.parser.parser.parser
    flat, _ = inner._table(inner.callbacks)
    reductions = {(a[3], a[1]): a[2] for row in flat.values() for a in row.values() if not a[0]}
    assert not any(isinstance(f, ChildFilterLALR_NoPlaceholders) for f in reductions.values())
    assert reductions[("term", 1)] is None
    bits = reductions[("_bits", 1)]
    assert getattr(bits, "func", None) is Tree and bits(["x"]) == Tree("_bits", ["x"])
    # A one-symbol rule of alternatives passes its child up without a call (``?opt``).
    assert reductions[("opt", 1)] is None
