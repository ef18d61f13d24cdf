"""Syntax errors in words: a Lark error becomes a diagnostic at the offending place."""

from __future__ import annotations

from collections.abc import Iterable

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tcdsl.diagnostics import Diagnostic, Span
from tcdsl.frontend.values import span_of

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
    "PORT_RANGE": "a port range such as 1024-2047",
    "QDISC_KIND": "a qdisc (htb, prio, tbf, netem, cbq, sfq, fq_codel, pfifo, bfifo, pfifo_fast)",
    "PARAM": "a parameter such as rate",
    "FLAG": "a flag",
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
    "$END": "the end of the file",
}


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "_NL":
        return "end of line"
    return f"'{token}'"


def _first_on_its_line(token: Token, text: str) -> bool:
    start = token.start_pos or 0
    line_start = text.rfind("\n", 0, start) + 1
    return not text[line_start:start].strip()


def syntax_error(err: UnexpectedInput, path: str, text: str) -> Diagnostic:
    """Translate a Lark error into words, at the offending place."""
    line = getattr(err, "line", 1) or 1
    column = getattr(err, "column", 1) or 1
    brace_hint = "; a '{' must be on the same line as the statement it opens"
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
            span = Span(path, line, column, line, column + 1)
        else:
            span = span_of(token, path)
            if token.type == "_NL":
                span = Span(path, span.line, span.column, span.line, span.column + 1)
        if token.type == "LBRACE" and _first_on_its_line(token, text):
            return Diagnostic.error("E002", f"unexpected character '{{'{brace_hint}", span)
        try:
            accepted = (
                err.interactive_parser.accepts()  # type: ignore[no-untyped-call]
                if err.interactive_parser
                else err.expected
            )
        except UnexpectedInput:  # pragma: no cover - accepts() is best effort
            accepted = err.expected
        expected = _expected_words(accepted or err.expected)
        return Diagnostic.error(
            "E001", f"unexpected {_describe_token(token)}; expected {expected}", span
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


# Listed last, in this order, so the words that say most survive the cut to six.
_LAST = ("PLUS", "MINUS", "STAR", "SLASH", "_NL")


def _expected_words(expected: Iterable[str]) -> str:
    names = set(expected)
    if len(names) > 1:
        names.discard("$END")
    if "_NL" in names:
        names.discard("SEMICOLON")
    order = sorted(names, key=lambda n: (_LAST.index(n) if n in _LAST else -1, n))
    words: list[str] = []
    for name in order:
        word = EXPECTED_WORDS.get(name)
        if word is None:
            word = f"'{name.lower()}'" if name.isupper() else name
        if word not in words:
            words.append(word)
    if len(words) > 6:
        words = [*words[:6], "..."]
    return (
        ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]
        if words
        else "something else"
    )
