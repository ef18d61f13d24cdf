"""The TextMate grammar for editors (editors/vscode/syntaxes/tcdsl.tmLanguage.json).

The keywords are read from grammar/tcdsl.lark (its quoted literals and its keyword-set
terminals such as ``/(htb|prio|...)(?![\\w-])/``), so a keyword added to the language without
a highlighting rule fails here. Policies are tokenized with a small TextMate engine written
below: the grammar's ``match`` rules are tried at each position and the leftmost match wins,
the earlier rule on a tie, line by line, as vscode-textmate does. The grammar keeps to regex
syntax that Oniguruma and Python's ``re`` read alike, which is checked too.

Besides the keywords, every token the Lark parser makes of the policies under policies/ (and of
the samples below) must get the scope its terminal stands for, and every non-space character
of those policies must get some scope.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lark import Lark, Token

ROOT = Path(__file__).resolve().parent.parent
TM_PATH = ROOT / "editors" / "vscode" / "syntaxes" / "tcdsl.tmLanguage.json"
LARK_PATH = ROOT / "grammar" / "tcdsl.lark"
POLICIES = sorted((ROOT / "policies").rglob("*.tcp"))
BASE = "source.tcdsl"

# ---- the TextMate grammar, as an engine sees it ----------------------------------------------


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    name: str | None
    captures: dict[int, str]


def _load() -> dict[str, Any]:
    grammar: dict[str, Any] = json.loads(TM_PATH.read_text(encoding="utf-8"))
    return grammar


def _flatten(
    patterns: list[dict[str, Any]], repository: dict[str, Any], seen: tuple[str, ...] = ()
) -> Iterator[dict[str, Any]]:
    """The rules in the order an engine tries them, with `include`s expanded in place."""
    for pattern in patterns:
        if "include" in pattern:
            ref = pattern["include"]
            assert ref.startswith("#") and ref[1:] in repository, f"unknown include {ref}"
            assert ref not in seen, f"include cycle through {ref}"
            yield from _flatten(repository[ref[1:]]["patterns"], repository, (*seen, ref))
        elif "patterns" in pattern and "match" not in pattern:
            yield from _flatten(pattern["patterns"], repository, seen)
        else:
            yield pattern


def _rules() -> list[Rule]:
    grammar = _load()
    rules = []
    for pattern in _flatten(grammar["patterns"], grammar.get("repository", {})):
        # Multi-line begin/end rules would need the engine's rule stack; the grammar has none.
        assert set(pattern) <= {"match", "name", "captures", "comment"}, pattern
        captures = {int(k): v["name"] for k, v in pattern.get("captures", {}).items()}
        rules.append(Rule(re.compile(pattern["match"]), pattern.get("name"), captures))
    return rules


RULES = _rules()


def tokenize_line(line: str) -> list[tuple[int, int, tuple[str, ...]]]:
    """(start, end, scopes) for each matched piece of one line (with its newline, if any)."""
    out: list[tuple[int, int, tuple[str, ...]]] = []
    pos = 0
    while pos < len(line):
        best: tuple[re.Match[str], Rule] | None = None
        for rule in RULES:
            m = rule.regex.search(line, pos)
            if m and (best is None or m.start() < best[0].start()):
                best = (m, rule)
        if best is None:
            break
        m, rule = best
        assert m.end() > m.start(), f"rule {rule.regex.pattern!r} matched the empty string"
        outer = (BASE, rule.name) if rule.name else (BASE,)
        cuts = {m.start(), m.end()}
        for group in rule.captures:
            if m.start(group) >= 0:
                cuts |= {m.start(group), m.end(group)}
        edges = sorted(cuts)
        for a, b in itertools.pairwise(edges):
            inner = tuple(
                name
                for group, name in sorted(rule.captures.items())
                if m.start(group) >= 0 and m.start(group) <= a and b <= m.end(group)
            )
            out.append((a, b, outer + inner))
        pos = m.end()
    return out


def scopes_of(text: str) -> list[tuple[str, ...]]:
    """The scope stack of each character of `text`; (BASE,) where no rule matched."""
    scopes: list[tuple[str, ...]] = [(BASE,)] * len(text)
    offset = 0
    for line in text.splitlines(keepends=True):
        for a, b, stack in tokenize_line(line):
            scopes[offset + a : offset + b] = [stack] * (b - a)
        offset += len(line)
    return scopes


def tokens(line: str) -> list[tuple[str, str]]:
    """(text, innermost scope) for each scoped piece of one line."""
    return [(line[a:b], stack[-1]) for a, b, stack in tokenize_line(line) if len(stack) > 1]


def scope_of_word(line: str, word: str) -> str:
    """The innermost scope of the piece that is exactly `word` (it must be one piece)."""
    found = [scope for text, scope in tokens(line) if text == word]
    assert found, f"{word!r} is not one token of {line!r}: {tokens(line)}"
    return found[0]


# ---- the keywords of grammar/tcdsl.lark ------------------------------------------------------

LARK_TEXT = LARK_PATH.read_text(encoding="utf-8")
_CODE = re.sub(r"//[^\n]*", "", LARK_TEXT)
# Word literals of the rules: "interface", "by", "tcp-ack"... (punctuation literals aside).
LITERALS = sorted(
    {w for w in re.findall(r'"([^"\\\n]+)"', _CODE) if re.fullmatch(r"[A-Za-z][\w-]*", w)}
)
# Keyword sets: NAME: /(a|b|c)(?![\w-])/ -> {NAME: [a, b, c]}
KEYWORD_SETS = {
    name: words.split("|")
    for name, words in re.findall(
        r"^([A-Z_][A-Z0-9_]*)(?:\.\d+)?\s*:\s*/\(([\w|-]+)\)\(\?!\[\\w-\]\)/", _CODE, re.M
    )
}

# The scope each Lark terminal must get (a prefix of the innermost scope).
FIELD = "support.variable.field."
SET_SCOPES = {
    "QDISC_KIND": "support.type.qdisc.",
    "MQ": "support.type.qdisc.",
    "QUEUE": "keyword.",
    "PARAM": "variable.parameter.",
    "FLAG": "constant.language.flag.",
    "HANDLE_KW": "keyword.",
    "ADDR_FIELD": FIELD,
    "PORT_FIELD": FIELD,
    "RAW_SIZE": FIELD,
    "VERDICT": "constant.language.verdict.",
    "FAMILY_NAME": "constant.language.family.",
    "CLASSIFIER_NAME": "support.type.classifier.",
    **dict.fromkeys(("CURVE", "M1", "M2", "D", "UMAX", "DMAX"), "variable.parameter.curve."),
}
FIELD_LITERALS = {"proto", "tos", "dscp"}
VALUE_SCOPES: dict[str, tuple[str, ...]] = {
    "QUANTITY": ("constant.numeric.quantity.", "keyword.other.unit."),
    "PERCENT": ("constant.numeric.percentage.", "keyword.other.unit.percent."),
    "NUMBER": ("constant.numeric.decimal.",),
    "INT": ("constant.numeric.decimal.",),
    "HEX": ("constant.numeric.hex.",),
    "HANDLE": ("constant.numeric.handle.",),
    "IPV4": ("constant.numeric.ipv4.",),
    "IPV6": ("constant.numeric.ipv6.",),
    "PORT_RANGE": ("constant.numeric.range.",),
    "STRING": ("string.quoted.double.", "punctuation.definition.string."),
    "IFNAME": ("entity.name.interface.",),
    "NAME": ("variable.other.", "entity.name."),
}
PUNCTUATION = {
    "=": "keyword.operator.assignment.",
    "+": "keyword.operator.arithmetic.",
    "-": "keyword.operator.arithmetic.",
    "*": "keyword.operator.arithmetic.",
    "/": "keyword.operator.arithmetic.",
    ",": "punctuation.separator.comma.",
    ";": "punctuation.terminator.",
    "{": "punctuation.section.block.begin.",
    "}": "punctuation.section.block.end.",
    "(": "punctuation.section.parens.begin.",
    ")": "punctuation.section.parens.end.",
    "==": "keyword.operator.comparison.",
    "!=": "keyword.operator.comparison.",
}
SKIPPED_TERMINALS = {"_NL"}


def expected_scopes(token: Token) -> tuple[str, ...]:
    """The scope prefixes a token of the Lark parse may get."""
    if token.type in SET_SCOPES:
        return (SET_SCOPES[token.type],)
    if token.type in VALUE_SCOPES:
        return VALUE_SCOPES[token.type]
    if token.value in LITERALS:
        return (FIELD,) if token.value in FIELD_LITERALS else ("keyword.",)
    if token.value in PUNCTUATION:
        return (PUNCTUATION[token.value],)
    raise AssertionError(
        f"terminal {token.type} ({token.value!r}) of grammar/tcdsl.lark has no scope in this "
        "test: add a highlighting rule to the TextMate grammar and its scope here"
    )


_LARK = Lark(LARK_TEXT, parser="lalr", lexer="contextual", keep_all_tokens=True)


def lark_tokens(text: str) -> list[Token]:
    tree = _LARK.parse(text)
    return [t for t in tree.scan_values(lambda v: isinstance(v, Token))]


def mismatches(text: str, value: str | None = None) -> list[str]:
    """Tokens of the Lark parse of `text` (those spelt `value`, if given) whose characters do
    not all get the scope their terminal stands for."""
    scopes = scopes_of(text)
    bad = []
    for token in lark_tokens(text):
        if token.type in SKIPPED_TERMINALS or value not in (None, token.value):
            continue
        allowed = expected_scopes(token)
        assert token.start_pos is not None and token.end_pos is not None
        got = {scopes[i][-1] for i in range(token.start_pos, token.end_pos)}
        if not all(any((s + ".").startswith(p) for p in allowed) for s in got):
            bad.append(
                f"line {token.line}: {token.value!r} ({token.type}) got {sorted(got)}, "
                f"expected {' or '.join(allowed)}"
            )
    return bad


# A policy with every literal keyword of the grammar where the grammar takes it.
SAMPLE = """\
# every keyword once
const UPLINK = 100mbit - 10% * 2  # a constant
const SERVER = 10.0.0.0/24
const SERVER6 = 2001:db8::/32
include "other#1.tcp" # a '#' in a string is no comment
interface eth0.100 htb rate UPLINK handle 1: r2q 10 default bulk {
    classify by mark from "eth 1" chain "TC#1"; classify by mark from wg-0
    classify by mark at postrouting mask 0xff00 pref 2
    class web-2 prio 1 rate (UPLINK / 2) ceil 90% mark 0x10 set dscp af41 {
        match src SERVER, 192.168.1.1 dst 10.1.2.3 sport 1024-2048, 80/0xfff0 pref 3
        match proto tcp, 17 tos 0x10/0x1e dscp ef tcp-ack tcp-flags syn of syn,ack
        match u32 0x06/0xff at 9 u16 80 at 22 \\
            u8 1 at 0
        match all
        prio bands 3 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1 {
            class a { netem delay 50ms jitter 5ms loss 1.5% }
            class b { tbf rate 1mbit burst 15k latency 50ms }
            class c { fq_codel target 5ms interval 100ms noecn }
        }
    }
    class bulk prio 2 rate 1mbit { sfq perturb 10 }
}
interface eth1 cbq bandwidth 10mbit avpkt 1000 {
    class x rate 1mbit allot 1514 bounded isolated { pfifo_fast }
}
interface "eth 2" prio { class z { bfifo limit 10k } }
interface eth3 {
    upload htb rate 10mbit {
        class up rate 1mbit
        subscribers from "subs.csv" where parent_node == "a", "b" and "Device Name" != "x" \\
            pref 4 prio 2 rate min ceil max * 1.05 { fq_codel }
        subscribers download from "subs.csv"
    }
    download via ifb3 connmark htb rate 90mbit {
        class down rate 1mbit match dport 80 police rate 1mbit burst 9k continue
    }
}
interface eth4 { ingress { match all police rate 800kbit burst 10k drop } }
interface eth5 family ipv4 classifier flower {
    upload family both classifier u32 linear htb rate 1mbit {
        class v6 rate 1mbit match family ipv6 src SERVER6, ::1 dst fe80::/10, ::ffff:10.0.0.1
    }
    download via ifb5 connmark family ipv6 htb rate 1mbit { class d rate 1mbit }
    ingress family ipv4 classifier u32 { match src 0.0.0.0/0 police rate 1mbit burst 9k drop }
}
"""


def _keyword_samples() -> Iterator[tuple[str, str, str]]:
    """(terminal, word, policy) with the word of a keyword set where the grammar takes it."""
    templates = {
        "QDISC_KIND": "interface eth0 {w}\ninterface eth0 htb {{\n  class c {{ {w} }}\n}}\n",
        "MQ": "interface eth0 {w} {{\n  queue 1 htb {{ class c }}\n}}\n",
        "QUEUE": "interface eth0 mq {{\n  {w} 1 htb {{ class c }}\n}}\n",
        "PARAM": "interface eth0 htb {{\n  class c {w} 1\n}}\n",
        "FLAG": "interface eth0 htb {{\n  class c {w}\n}}\n",
        "HANDLE_KW": "interface eth0 htb {w} 1: {{\n  class c {w} 1:10\n}}\n",
        "ADDR_FIELD": "interface eth0 htb {{\n  class c match {w} 10.0.0.1\n}}\n",
        "PORT_FIELD": "interface eth0 htb {{\n  class c match {w} 80\n}}\n",
        "RAW_SIZE": "interface eth0 htb {{\n  class c match {w} 0x1 at 0\n}}\n",
        "VERDICT": "interface eth0 htb {{\n  class c match all police rate 1mbit burst 9k {w}\n}}",
        "FAMILY_NAME": "interface eth0 family {w} htb {{\n  class c match family {w} dport 1\n}}\n",
        "CLASSIFIER_NAME": "interface eth0 {{\n  upload classifier {w} htb {{ class c }}\n}}\n",
        "CURVE": "interface eth0 hfsc {{\n  class c {w} m2 1mbit\n}}\n",
        "M1": "interface eth0 hfsc {{\n  class c rt {w} 2mbit d 10ms m2 1mbit\n}}\n",
        "D": "interface eth0 hfsc {{\n  class c rt m1 2mbit {w} 10ms m2 1mbit\n}}\n",
        "M2": "interface eth0 hfsc {{\n  class c rt {w} 1mbit\n}}\n",
        "UMAX": "interface eth0 hfsc {{\n  class c rt {w} 1500b dmax 5ms rate 1mbit\n}}\n",
        "DMAX": "interface eth0 hfsc {{\n  class c rt {w} 5ms rate 1mbit\n}}\n",
    }
    for terminal, words in KEYWORD_SETS.items():
        assert terminal in templates, f"keyword set {terminal} is new: add a template here"
        for word in words:
            yield terminal, word, templates[terminal].format(w=word)


# ---- tests -----------------------------------------------------------------------------------


def test_grammar_file() -> None:
    grammar = _load()
    assert grammar["scopeName"] == BASE
    assert grammar["fileTypes"] == ["tcp"]
    assert len(RULES) > 20


def test_every_regex_is_python_re_and_matches_no_empty_string() -> None:
    for rule in RULES:
        assert not rule.regex.match(""), rule.regex.pattern
        assert rule.regex.groups >= max(rule.captures, default=0), rule.regex.pattern
        # Oniguruma-only syntax (possessive or atomic groups, \h, \G, \A, \z, named
        # back-references) would be read otherwise or refused by Python.
        assert not re.search(r"\\[hHGAzZK]|\(\?>|[*+?}]\+|\\k<", rule.regex.pattern)


def test_keywords_found_in_lark_grammar() -> None:
    # Guards the parsing of the .lark above: if these are not found, the tests below say nothing.
    assert {"interface", "class", "include", "const", "priomap", "tcp-ack", "at"} <= set(LITERALS)
    assert "pfifo_fast" in KEYWORD_SETS["QDISC_KIND"]
    assert "ceil" in KEYWORD_SETS["PARAM"] and "ecn" in KEYWORD_SETS["FLAG"]
    assert set(SET_SCOPES) <= set(KEYWORD_SETS)


@pytest.mark.parametrize("literal", LITERALS)
def test_literal_keyword_is_scoped(literal: str) -> None:
    found = [t for t in lark_tokens(SAMPLE) if t.value == literal]
    assert found, f"keyword {literal!r} of grammar/tcdsl.lark is not in SAMPLE: add it"
    assert mismatches(SAMPLE, literal) == []


@pytest.mark.parametrize(("terminal", "word", "policy"), list(_keyword_samples()))
def test_keyword_set_word_is_scoped(terminal: str, word: str, policy: str) -> None:
    found = [t for t in lark_tokens(policy) if t.value == word and t.type == terminal]
    assert found, f"{word!r} is not lexed as {terminal} in {policy!r}"
    assert mismatches(policy, word) == []
    for line in policy.splitlines():
        if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", line):
            assert scope_of_word(line, word).startswith(SET_SCOPES[terminal]), line


def test_words_inside_longer_words_are_not_keywords() -> None:
    line = "interface eth0 prio priomap 1 2 { class c { pfifo_fast } }"
    assert scope_of_word(line, "prio").startswith("support.type.qdisc.")
    assert scope_of_word(line, "priomap").startswith("keyword.")
    assert scope_of_word(line, "pfifo_fast").startswith("support.type.qdisc.")
    assert ("pfifo", "support.type.qdisc.tcdsl") not in tokens(line)
    assert scope_of_word("match tcp-ack", "tcp-ack").startswith("keyword.")
    assert ("tcp", "variable.other.tcdsl") not in tokens("match tcp-ack")
    # prio the parameter and prio the qdisc
    assert scope_of_word("class c prio 1", "prio").startswith("variable.parameter.")
    assert scope_of_word("    prio", "prio").startswith("support.type.qdisc.")
    assert scope_of_word("class c prio prio", "prio").startswith("support.type.qdisc.")


def test_near_misses_tokenize() -> None:
    assert scope_of_word(NEAR_MISSES[0], "ceilx") == "variable.other.tcdsl"
    assert scope_of_word(NEAR_MISSES[0], "tcp-ackx") == "variable.other.tcdsl"


@pytest.mark.parametrize("word", ["ceilx", "cel", "rate-limit", "xrate", "htbx", "ecn_", "ids"])
def test_near_keywords_are_plain_names(word: str) -> None:
    assert tokens(f"class c {word} 1") == [
        ("class", "keyword.declaration.class.tcdsl"),
        ("c", "entity.name.type.class.tcdsl"),
        (word, "variable.other.tcdsl"),
        ("1", "constant.numeric.decimal.tcdsl"),
    ]


def test_values() -> None:
    line = "rate 10mbit 1.5% 0x1f 1:10 10: 10.0.0.0/8 1024-2048 50ms 15k 3"
    assert tokens(line) == [
        ("rate", "variable.parameter.tcdsl"),
        ("10", "constant.numeric.quantity.tcdsl"),
        ("mbit", "keyword.other.unit.tcdsl"),
        ("1.5", "constant.numeric.percentage.tcdsl"),
        ("%", "keyword.other.unit.percent.tcdsl"),
        ("0x1f", "constant.numeric.hex.tcdsl"),
        ("1:10", "constant.numeric.handle.tcdsl"),
        ("10:", "constant.numeric.handle.tcdsl"),
        ("10.0.0.0/8", "constant.numeric.ipv4.tcdsl"),
        ("1024-2048", "constant.numeric.range.tcdsl"),
        ("50", "constant.numeric.quantity.tcdsl"),
        ("ms", "keyword.other.unit.tcdsl"),
        ("15", "constant.numeric.quantity.tcdsl"),
        ("k", "keyword.other.unit.tcdsl"),
        ("3", "constant.numeric.decimal.tcdsl"),
    ]


def test_ipv6_addresses_and_handles() -> None:
    line = (
        "match src 2001:db8::/32, ::1, fe80::1 dst ::ffff:192.0.2.1, 1:2:3:4:5:6:7:8 classid 1:10"
    )
    assert tokens(line) == [
        ("match", "keyword.other.tcdsl"),
        ("src", "support.variable.field.tcdsl"),
        ("2001:db8::/32", "constant.numeric.ipv6.tcdsl"),
        (",", "punctuation.separator.comma.tcdsl"),
        ("::1", "constant.numeric.ipv6.tcdsl"),
        (",", "punctuation.separator.comma.tcdsl"),
        ("fe80::1", "constant.numeric.ipv6.tcdsl"),
        ("dst", "support.variable.field.tcdsl"),
        ("::ffff:192.0.2.1", "constant.numeric.ipv6.tcdsl"),
        (",", "punctuation.separator.comma.tcdsl"),
        ("1:2:3:4:5:6:7:8", "constant.numeric.ipv6.tcdsl"),
        ("classid", "variable.other.tcdsl"),
        ("1:10", "constant.numeric.handle.tcdsl"),
    ]
    # A hex letter that is a keyword ('d' of a curve) does not split an address.
    assert scope_of_word("match dst d::1", "d::1") == "constant.numeric.ipv6.tcdsl"
    assert scope_of_word("handle 10:", "10:") == "constant.numeric.handle.tcdsl"


def test_family_and_classifier() -> None:
    line = "interface eth0 family ipv6 classifier u32 { match family both u32 1/0xff at 0"
    assert ("u32", "support.type.classifier.tcdsl") in tokens(line)
    assert ("u32", "support.variable.field.tcdsl") in tokens(line)
    assert scope_of_word(line, "family") == "keyword.other.family.tcdsl"
    assert scope_of_word(line, "ipv6") == "constant.language.family.tcdsl"
    assert scope_of_word(line, "both") == "constant.language.family.tcdsl"
    assert scope_of_word(line, "classifier") == "keyword.other.classifier.tcdsl"
    # Elsewhere the words are names (a class may be called 'flower').
    assert scope_of_word("class flower rate 1mbit", "flower") == "entity.name.type.class.tcdsl"


def test_comments_and_strings() -> None:
    line = 'include "a#b.tcp" # the rest'
    assert tokens(line) == [
        ("include", "keyword.control.import.tcdsl"),
        ('"', "punctuation.definition.string.begin.tcdsl"),
        ("a#b.tcp", "string.quoted.double.tcdsl"),
        ('"', "punctuation.definition.string.end.tcdsl"),
        ("#", "punctuation.definition.comment.tcdsl"),
        (" the rest", "comment.line.number-sign.tcdsl"),
    ]
    assert tokens("class c rate 1mbit # ceil 2mbit")[-2:] == [
        ("#", "punctuation.definition.comment.tcdsl"),
        (" ceil 2mbit", "comment.line.number-sign.tcdsl"),
    ]
    assert tokens("# class c rate 1mbit")[1] == (
        " class c rate 1mbit",
        "comment.line.number-sign.tcdsl",
    )
    # An unterminated string (E002) stays one token to the end of the line.
    assert tokens('include "a # b') == [
        ("include", "keyword.control.import.tcdsl"),
        ('"a # b', "invalid.illegal.unterminated-string.tcdsl"),
    ]


def test_sample_scopes_agree_with_lark_tokens() -> None:
    assert mismatches(SAMPLE) == []


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_policy_scopes_agree_with_lark_tokens(policy: Path) -> None:
    assert mismatches(policy.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("policy", [*POLICIES, None], ids=lambda p: p.name if p else "SAMPLE")
def test_every_non_space_character_is_scoped(policy: Path | None) -> None:
    text = policy.read_text(encoding="utf-8") if policy else SAMPLE
    scopes = scopes_of(text)
    bare = [
        f"line {text.count(chr(10), 0, i) + 1}: {text[max(0, i - 10) : i + 10]!r}"
        for i, ch in enumerate(text)
        if not ch.isspace() and scopes[i] == (BASE,)
    ]
    assert bare == []


def test_policies_found() -> None:
    assert any(p.name == "office.tcp" for p in POLICIES)


def test_vscode_extension_points_at_the_grammar() -> None:
    folder = ROOT / "editors" / "vscode"
    package = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    (language,) = package["contributes"]["languages"]
    assert language["id"] == "tcdsl" and language["extensions"] == [".tcp"]
    (grammar,) = package["contributes"]["grammars"]
    assert grammar["language"] == "tcdsl" and grammar["scopeName"] == BASE
    assert (folder / grammar["path"]).resolve() == TM_PATH
    config = json.loads((folder / language["configuration"]).read_text(encoding="utf-8"))
    assert config["comments"]["lineComment"] == "#"
    assert ["{", "}"] in config["brackets"]
    # One copy of the grammar in the tree.
    copies = [p for p in (ROOT / "editors").rglob("*.tmLanguage*") if p.is_file()]
    assert copies == [TM_PATH]


def _oniguruma_scopes(text: str) -> list[tuple[str, ...]]:
    """The scope stack of each character as textmate-grammar-python (a port of vscode-textmate
    on the Oniguruma regex engine, as editors run it) tokenizes `text`."""
    base = pytest.importorskip("textmate_grammar.parsers.base")
    element = base.LanguageParser(_load()).parse_string(text)
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    scopes: list[tuple[str, ...]] = [(BASE,)] * len(text)
    for (line_no, column), piece, stack in element.flatten():
        start = starts[line_no] + column
        assert text[start : start + len(piece)] == piece
        scopes[start : start + len(piece)] = [tuple(stack)] * len(piece)
    return scopes


@pytest.mark.parametrize("policy", [*POLICIES, None], ids=lambda p: p.name if p else "SAMPLE")
def test_oniguruma_engine_agrees(policy: Path | None) -> None:
    """The scopes above are the ones a real TextMate engine gives (whitespace aside)."""
    text = policy.read_text(encoding="utf-8") if policy else SAMPLE
    text += "".join(f"{line}\n" for line in NEAR_MISSES)
    real, ours = _oniguruma_scopes(text), scopes_of(text)
    differ = [
        f"{text[i]!r} at {i}: {real[i]} != {ours[i]}"
        for i in range(len(text))
        if not text[i].isspace() and real[i] != ours[i]
    ]
    assert differ == []


NEAR_MISSES = [
    "class c ceilx 1 cel 2 priomap prio 1 pfifo_fast pfifo tcp-ack tcp-ackx rate-limit 1:",
    'include "a#b" # c',
    'include "a # b',
    "const X = 10mbit-2mbit*3 + (1.5% / 2) 1024-2048 80/0xfff0 10.0.0.0/8",
    "const Y = 2001:db8::/32 ::1 fe80::1 d::1 ::ffff:10.0.0.1 1:10 10: family ipv6 classifier u32",
]
