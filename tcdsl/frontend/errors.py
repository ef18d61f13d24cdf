"""Syntax errors in words: a Lark error becomes a diagnostic at the offending place."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternRE, PatternStr, TerminalDef

from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.qdiscs import (
    CLASS_CURVES,
    CLASS_FLAGS,
    CLASS_PARAMS,
    QDISC_FLAGS,
    QDISC_PARAMS,
    WITH_DEFAULT,
    default_on_a_class,
    param_dimensions,
)
from tcdsl.frontend.syntax import continuation_broken, suggestion
from tcdsl.frontend.values import (
    decimal_comma,
    dotted_mask,
    spaced_unit,
    span_of,
    unit_misfit,
)
from tcdsl.units import Dimension

# Grammar terminals in words, for syntax errors.
EXPECTED_WORDS: dict[str, str] = {
    "QUANTITY": "a value such as 10mbit",
    "NUMBER": "a number",
    "INT": "a whole number",
    "HEX": "a hex number such as 0x10",
    "PERCENT": "a percentage",
    "NAME": "a name",
    "IFNAME": "an interface name",
    "STRING": 'a quoted string such as "other.tcp"',
    "HANDLE": "a handle such as 1:10",
    "IPV4": "an IPv4 address",
    "IPV6": "an IPv6 address",
    "FAMILY": "'family'",
    "FAMILY_NAME": "ipv4, ipv6 or both",
    "CLASSIFIER_KW": "'classifier'",
    "CLASSIFIER_NAME": "u32 or flower",
    "PORT_RANGE": "a port range such as 1024-2047",
    "QDISC_KIND": (
        "a qdisc (htb, prio, tbf, netem, cbq, sfq, fq_codel, pfifo, bfifo, pfifo_fast, hfsc, "
        "cake, codel, fq, fq_pie, red)"
    ),
    "PARAM": "a parameter such as rate",
    "FLAG": "a flag",
    "CURVE": "a service curve (rt, ls, ul or sc)",
    "_NL": "the end of the line",
    "LPAR": "'('",
    "RPAR": "')'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "COMMA": "','",
    "EQUAL": "'='",
    "HANDLE_KW": "'id' or 'handle'",
    "SEMICOLON": "';'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "CLASS": "'class'",
    "MATCH": "'match'",
    "ADDR_FIELD": "'src' or 'dst'",
    "PORT_FIELD": "'sport' or 'dport'",
    "RAW_SIZE": "u8, u16 or u32",
    "WHERE_OP": "'==' or '!='",
    "$END": "the end of the file",
}


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "_NL":
        return "end of line"
    return f"'{token}'"


def first_on_its_line(token: Token, text: str) -> bool:
    """Whether only blanks come before ``token`` on its line."""
    start = token.start_pos or 0
    line_start = text.rfind("\n", 0, start) + 1
    return not text[line_start:start].strip()


def _is_keyword(word: str, terminals: Collection[TerminalDef]) -> bool:
    """Whether ``word`` is one of the language's keywords."""
    return any(word.lower() in words for words in _terminal_words(tuple(terminals)).values())


def syntax_error(
    err: UnexpectedInput,
    path: str,
    text: str,
    accepted: Collection[str],
    stack: Sequence[Any],
    terminals: Collection[TerminalDef],
) -> Diagnostic:
    """Translate a Lark error into words, at the offending place.

    ``accepted`` is the set of terminals that could have come there (``recovery.accepted``),
    ``stack`` the parser's values (they tell which qdisc or class a word was meant for) and
    ``terminals`` the grammar's terminals (their keywords are what a misspelling may mean).
    """
    line = getattr(err, "line", 1) or 1
    column = getattr(err, "column", 1) or 1
    brace_hint = "; a '{' must be on the same line as the statement it opens"
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            lines = text.split("\n")  # "\n" alone ends a line, as for the lexer
            if len(lines) > 1 and not lines[-1]:
                lines.pop()  # the end of the last line
            line, column = len(lines), len(lines[-1]) + 1
            span = Span(path, line, column, line, column + 1)
        else:
            span = span_of(token, path)
            if token.type == "_NL":
                span = Span(path, span.line, span.column, span.line, span.column + 1)
        if token.type == "LBRACE" and first_on_its_line(token, text):
            return Diagnostic.error("E002", f"unexpected character '{{'{brace_hint}", span)
        names = set(accepted)
        context = _context(stack)
        word = str(token)
        hint = ""
        broken: tuple[str, Note] | None = None
        single = _single_valued(stack) if token.type == "COMMA" else None
        if single is not None:
            # (found by a tester: 'tos 0x10, 0x08' was told a hex number takes no unit)
            hint = f"; {single} takes one value: write a match line for each"
        elif _after_hex(token, text):
            hint = f"; {HEX_TAKES_NO_UNIT}"
        elif not word.isascii() and token.type not in ("STRING", "$END", "_NL"):
            # (found by a tester: 'сlass' with a Cyrillic 'с' read "unexpected 'сlass';
            # expected 'class'", two words that look the same)
            char = next(c for c in word if not c.isascii())
            rule = (
                "numbers are written with the digits 0-9"
                if char.isdigit()
                else "keywords and names are ASCII letters, digits, '_' and '-'"
            )
            if char in "\u201c\u201d\u201e\u201f\u2018\u2019\u00ab\u00bb":
                rule = 'a string is written between straight quotes, "subs.csv"'
            name = unicodedata.name(char, "a character")
            hint = f"; {char!r} is U+{ord(char):04X} {name}, not ASCII: {rule}"
        elif (
            context is not None
            and context[0] == "class"
            and _after_default(stack, text, token, terminals)
        ):
            # (noticed by a tester: 'class voip rate 1mbit default' meant "the default class")
            hint = f"; {default_on_a_class(context[1])}"
        elif (mask := dotted_mask(text, token.start_pos or 0)) is not None:
            # (noticed by a tester: '10.0.0.0/255.0.0.0' read as /25 and "unexpected '5.0.0.0'")
            hint = f"; {mask}"
        elif (misfit := unit_misfit(text, token.start_pos or 0, param_dimensions)) is not None:
            # (found by a tester: 'prio 1 ms' was told to write 1ms)
            if param_dimensions(misfit) == {Dimension.COUNT}:
                hint = f"; {misfit} takes a number with no unit"
        elif (joined := spaced_unit(text, token.start_pos or 0, param_dimensions)) is not None:
            hint = f"; a unit follows its number without a blank: {joined}"
        elif (comma := decimal_comma(text, token.start_pos or 0)) is not None:
            # (noticed by a tester: 'rate 1,5mbit' said only "unexpected ',5mbit'")
            hint = f"; a decimal number is written with a '.': {comma}"
        elif word == "\\":
            # (found by a tester: 'rate 10mbit \ # why' said only "unexpected '\'")
            hint = (
                "; a '\\' goes on with the next line only as the last thing on its line: no "
                "comment may follow it (put the comment on a line of its own)"
            )
        elif word.lower() == "egress" and {"UPLOAD", "INGRESS"} <= names:
            # (found writing a test: "did you mean 'ingress'?", the other direction)
            hint = (
                "; the interface's egress is written 'upload' in its block (what leaves the "
                "interface), as 'interface NAME htb ...' without a block says"
            )
        elif (
            token.type not in ("$END", "_NL")
            and (first := _first_keyword(text, token.start_pos or 0, terminals)) is not None
            and (broken := continuation_broken(text, first, token.line or 1, path)) is not None
        ):
            # (a keyword that belongs to the statement above: a word that is none, 'clas',
            # keeps its "did you mean 'class'?", found by a review)
            hint, note = broken
        elif word in TC_WORDS and token.type not in ("STRING", "$END", "_NL"):
            # (found by a tester: 'dst_port' was asked "did you mean 'sport'?")
            hint = f"; {TC_WORDS[word]}"
        elif re.fullmatch(r"[A-Za-z_][\w-]*", word):
            known = tuple(terminals)
            hint = suggestion(word, _keywords(names, context, known))
        expected = _expected_words(names, context)
        if "STRING" in names:  # an example that fits what the string is for
            expected = _string_expected(stack, names) or expected
        if "UPLOAD" in names and token.type in ("CLASS", "MATCH", *_KINDS):
            expected += (
                "; a block right after the interface name holds its directions; for one "
                "egress tree, name the qdisc first: 'interface eth0 htb rate 10mbit {'"
            )
        notes: tuple[Note, ...] = (note,) if broken is not None else ()
        opened = [v for v in stack if isinstance(v, Token) and v.type == "LBRACE"]
        if token.type == "$END" and opened:
            # the innermost block still open (found by a tester: only the file's end was shown)
            notes = (Note("this '{' is not closed", span_of(opened[-1], path)),)
            hint = "; a '}' is missing"
        if opened and (token.type == "$END" or token.type in _TOP_LEVEL):
            # Where the indentation says a block ended without its '}' (found by a tester:
            # the note named the interface's '{', the '}' was missing from a class above).
            guess = _missing_close(text, token.line if token.type != "$END" else None)
            if guess is not None:
                (line, column), before, first = guess
                raw = text.split("\n")[before - 1]
                start, end = len(raw) - len(raw.lstrip()) + 1, len(raw.rstrip()) + 1
                notes = (
                    Note("this '{' looks unclosed", Span(path, line, column, line, column + 1)),
                    Note(
                        f"a '}}' is likely missing before this line, indented as line {first}",
                        Span(path, before, start, before, end),
                    ),
                )
                hint = "; a '}' is missing"
        return Diagnostic.error(
            "E001", f"unexpected {_describe_token(token)}{hint}; expected {expected}", span, *notes
        )
    if isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream or 0
        char = text[pos] if pos < len(text) else ""
        span = Span(path, line, column, line, column + 1)
        hint = brace_hint if char == "{" else ""
        if char == '"':
            hint = "; a string must end with '\"' on the same line"
        return Diagnostic.error("E002", f"unexpected character {char!r}{hint}", span)
    if isinstance(err, UnexpectedEOF):
        return Diagnostic.error(
            "E001", "unexpected end of file", Span(path, line, column, line, column + 1)
        )
    return Diagnostic.error(
        "E001", str(err).splitlines()[0], Span(path, line, column, line, column + 1)
    )


def _missing_close(text: str, until: int | None) -> tuple[tuple[int, int], int, int] | None:
    """Where a '}' is most likely missing, by indentation: the (line, column) of the first
    '{' whose block holds a statement indented no deeper than the statement of the '{' (before
    ``until``, the failing line), that statement's line, and the first line of the statement
    of the '{'; None when the indentation tells nothing."""
    # (line, column of '{', its line's indentation, whether a line of the block is deeper:
    # a file that indents nothing tells nothing)
    stack: list[list[int]] = []
    continued = False  # the line before ended with '\': this one goes on its statement
    start = indent = 0  # the statement's first line, and its indentation
    for number, raw in enumerate(text.split("\n"), 1):
        if until is not None and number > until:
            break
        code = _code_of(raw)
        stripped = code.strip()
        if not stripped:
            continue
        if not continued:  # (a continuation, as fmt indents it, says nothing of blocks)
            start = number
            indent = len(raw.expandtabs(8)) - len(raw.expandtabs(8).lstrip())
            if stack and not stripped.startswith("}"):
                line, column, outer, deeper, first = stack[-1]
                if indent <= outer and deeper:
                    return (line, column), number, first
                stack[-1][3] = stack[-1][3] or indent > outer
        continued = stripped.endswith("\\")
        for at, ch in enumerate(code):
            if ch == "{":
                stack.append([number, at + 1, indent, 0, start])
            elif ch == "}" and stack:
                stack.pop()
    return None


TC_WORDS = {
    **{
        tc: f"tc's '{tc}' is '{ours}' here"
        for tc, ours in (
            ("dst_port", "dport"),
            ("src_port", "sport"),
            ("dst_ip", "dst"),
            ("src_ip", "src"),
            ("ip_proto", "proto"),
            ("protocol", "proto"),
        )
    },
    "flowid": "a match line sends to the class it is written in (tc's flowid)",
    "classid": "a class's id is 'id 1:10'; a match line sends to the class it is written in",
    "parent": "a class's parent is the class (or qdisc) whose block holds it",
}
"""tc's words for what the language says otherwise, and what to write instead."""

_TOP_LEVEL = frozenset({"INTERFACE", "CONST", "INCLUDE"})
"""Statements that only start a file's top level: one inside a block says a '}' is missing."""


def _code_of(line: str) -> str:
    """``line`` without its comment (a '#' outside a string), strings blanked."""
    out = []
    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
            out.append(" ")
        elif quoted:
            out.append(" ")
        elif ch == "#":
            break
        else:
            out.append(ch)
    return "".join(out)


def _string_expected(stack: Sequence[Any], names: set[str]) -> str | None:
    """What a subscribers statement expected where only a quoted string (or a column's
    name) could come, after the words on ``stack``: a file, a column or a ``where`` value."""
    last = stack[-1] if stack else None
    if not isinstance(last, Token) or not names <= {"STRING", "NAME"}:
        return None
    if last.type in ("WHERE", "AND"):
        return 'a column, such as parent_node or "Parent Node"'
    if names != {"STRING"}:
        return None
    if last.type == "WHERE_OP" or (
        last.type == "COMMA"
        and any(isinstance(v, Token) and v.type == "WHERE_OP" for v in stack[-3:])
    ):
        return 'a quoted value such as "north-tower"'
    if str(last) == "from":
        return 'a quoted file name such as "subscribers.csv"'
    return None


HEX_TAKES_NO_UNIT = (
    "a hex number takes no unit: write a rate, size or time in decimal with its unit "
    "(100kbit, not 0x64kbit)"
)


def _single_valued(stack: Sequence[Any]) -> str | None:
    """The condition (``tos``, ``dscp``) a comma came after, when it takes a single value."""
    for value in reversed(stack[-4:]):
        if isinstance(value, Token) and str(value) in ("tos", "dscp"):
            return str(value)
    return None


def _after_hex(token: Token, text: str) -> bool:
    """Whether ``token`` (a unit) is glued to a hex number before it (``0x64`` + ``kbit``)."""
    start = token.start_pos
    if not start or not str(token)[:1].isalpha() or not text[start - 1].isalnum():
        return False
    word = start
    while word > 0 and text[word - 1].isalnum():
        word -= 1
    return re.fullmatch(r"0[xX][0-9a-fA-F]+", text[word:start]) is not None


# ---- what a word was meant for -------------------------------------------------------------


_FIRST_WORD = re.compile(r"[ \t]*(\S+)")


def _first_keyword(text: str, at: int, terminals: Collection[TerminalDef]) -> int | None:
    """Where the first word of the line holding ``at`` starts, if it is a keyword (a line
    that a broken continuation made a statement of its own: 'ceil 2mbit', 'prio 1')."""
    begin = text.rfind("\n", 0, at) + 1
    found = _FIRST_WORD.match(text, begin)
    if found is None or not _is_keyword(found.group(1), terminals):
        return None
    return found.start(1)


_DEFAULT_THEN_WORD = re.compile(r"\bdefault[ \t]+\S+[ \t]+$")


def _after_default(
    stack: Sequence[Any], text: str, token: Token, terminals: Collection[TerminalDef]
) -> bool:
    """Whether the failed word comes right after a class's ``default`` (with no name) or after
    ``default`` and a keyword it took as the name (``default match dport 80``)."""
    last = stack[-1] if stack else None
    if isinstance(last, Token) and last.type == "DEFAULT":
        return True
    start = token.start_pos or 0
    line_start = text.rfind("\n", 0, start) + 1
    found = _DEFAULT_THEN_WORD.search(text, line_start, start)
    return found is not None and _is_keyword(found.group().split()[1], terminals)


_OPTIONS = ("PARAM", "FLAG", "HANDLE_KW", "DEFAULT", "PRIOMAP", "CURVE", "SET")


def _context(stack: Sequence[Any]) -> tuple[str, str] | None:
    """("qdisc", kind) or ("class", kind of its qdisc) when the failed words are options on a
    qdisc's or a class's line; None elsewhere."""
    owner = None
    for value in reversed(stack):
        if not isinstance(value, Token):
            continue
        if owner is None:
            if value.type == "LBRACE":
                return None
            if value.type == "CLASS":
                owner = "class"
            elif value.type in _KINDS:
                return ("qdisc", str(value))
        elif value.type in _KINDS:
            return (owner, str(value))
    return None


def _options(context: tuple[str, str] | None) -> list[str] | None:
    """The options the context takes, "rate" first if it takes one; None when unknown."""
    if context is None:
        return None
    owner, kind = context
    if owner == "qdisc" and kind in QDISC_PARAMS:
        extra = ["default"] if kind in WITH_DEFAULT else ["priomap"] if kind == "prio" else []
        words = [*QDISC_PARAMS[kind], *extra, *sorted(QDISC_FLAGS[kind]), "handle"]
    elif owner == "class" and kind in CLASS_PARAMS:
        curves = sorted(CLASS_CURVES.get(kind, ()))
        words = [*CLASS_PARAMS[kind], *sorted(CLASS_FLAGS[kind]), *curves, "id"]
    else:
        return None
    return sorted(words, key=lambda w: (w != "rate", w in ("handle", "id"), w))


_ALTERNATIVES = re.compile(r"\(([\w|-]+)\)\(\?!\[\\w-\]\)")


@functools.cache
def _terminal_words(terminals: tuple[TerminalDef, ...]) -> dict[str, tuple[str, ...]]:
    words: dict[str, tuple[str, ...]] = {}
    for t in terminals:
        if isinstance(t.pattern, PatternStr) and t.pattern.value.replace("-", "").isalpha():
            words[t.name] = (t.pattern.value,)
        elif isinstance(t.pattern, PatternRE):
            m = _ALTERNATIVES.fullmatch(t.pattern.value)
            if m:
                words[t.name] = tuple(m.group(1).split("|"))
    return words


def _keywords(
    names: Collection[str], context: tuple[str, str] | None, terminals: Collection[TerminalDef]
) -> list[str]:
    """The keywords that could have come where the error is."""
    by_terminal = _terminal_words(tuple(terminals))
    options = _options(context)
    words: list[str] = []
    for name in sorted(names):
        if name in _OPTIONS and options is not None:
            continue
        words.extend(by_terminal.get(name, ()))
    if options is not None and any(n in names for n in _OPTIONS):
        words.extend(options)
    return words


# ---- what could have come there, in words ----------------------------------------------------

_VALUE_START = ("QUANTITY", "NUMBER", "HEX", "PERCENT", "LPAR")
_CONDITIONS = (
    "ADDR_FIELD",
    "PORT_FIELD",
    "PROTO",
    "TOS",
    "DSCP",
    "TCP_ACK",
    "TCP_FLAGS",
    "RAW_SIZE",
    "ALL",
    "PREF",
    "FAMILY",
)
_STATEMENTS = {"CLASS": "'class'", "MATCH": "'match'", "QDISC_KIND": "a qdisc such as htb"}
_OPERATORS = {"PLUS": "+", "MINUS": "-", "STAR": "*", "SLASH": "/"}
# Listed last, in this order.
_LAST = ("COMMA", "LBRACE", "RBRACE", "_NL", "$END")


_KINDS = ("QDISC_KIND", "MQ")
"""The terminals that name a qdisc (mq has its own: only it takes a qdisc after its options)."""


def _expected_words(expected: Iterable[str], context: tuple[str, str] | None = None) -> str:
    names = set(expected)
    if "MQ" in names:
        names = (names - {"MQ"}) | {"QDISC_KIND"}
    if len(names) > 1:
        names.discard("$END")
    if "_NL" in names:
        names.discard("SEMICOLON")
    words: list[str] = []
    if names & set(_OPTIONS):
        options = _options(context)
        if options is None:
            words.append("a parameter such as rate")
        elif len(options) == 1:
            words.append(f"'{options[0]}'")
        elif options:
            words.append(f"a parameter such as {options[0]}")
        names -= set(_OPTIONS)
    if "MATCH" in names and context is not None:
        if context[0] == "class":
            words.append("a match")
        names.discard("MATCH")
    if "QUANTITY" in names:
        words.append(
            "a value such as 10mbit" + (" or a constant's name" if "NAME" in names else "")
        )
        names -= {*_VALUE_START, "NAME"}
    conditions = names & set(_CONDITIONS)
    if len(conditions) > 2:
        words.append("a condition such as 'dport 80' or 'src 10.0.0.0/8'")
        names -= conditions
    if "QDISC_KIND" in names and len(names) > 1:
        words.extend(word for name, word in _STATEMENTS.items() if name in names)
        names -= set(_STATEMENTS)
    operators = [op for name, op in _OPERATORS.items() if name in names]
    names -= set(_OPERATORS)
    last = [n for n in _LAST if n in names]
    names -= set(_LAST)
    for name in sorted(names):
        if name == "HANDLE" and context is not None:
            # (found by a tester: 'handle 1' on a qdisc was shown 1:10, a class's id)
            words.append(
                "a qdisc handle such as 1:" if context[0] == "qdisc" else "an id such as 1:10"
            )
            continue
        words.append(EXPECTED_WORDS.get(name) or _keyword(name))
    if len(operators) > 1:
        words.append(f"an operator ({' '.join(operators)})")
    elif operators:
        words.append(f"'{operators[0]}'")
    words.extend(EXPECTED_WORDS[n] for n in last)
    unique = list(dict.fromkeys(words))
    if not unique:
        return "something else"
    return ", ".join(unique[:-1]) + (" or " if len(unique) > 1 else "") + unique[-1]


def _keyword(name: str) -> str:
    return f"'{name.lower()}'" if name.isupper() else name
