"""``tcdsl fmt``: print a policy in its canonical layout, keeping every comment.

The formatter works on the token stream of the real grammar, read by the compiler's own lexer
(``tcdsl.fastlark``) during an LALR parse, from text whose newlines are normalised as the
compiler's are, with the ignored comments and line continuations captured as well; it
never looks at raw text with regexes, so a ``#``, ``;`` or ``{`` inside a string or a comment
is safe. The canonical layout:

- four spaces of indentation per block level; one statement per line (``;`` splits lines);
- one space between words and around ``=``, ``+``, ``-``, ``*`` and a dividing ``/``; none
  inside parentheses, before ``,`` or around the ``/`` of a value/mask (``3072/0xfc00``);
  numbers, names and strings are kept as written (``10mbit``, ``0x10``);
- ``{`` ends the line it opens, ``}`` stands alone on its line;
- no trailing whitespace; at most one blank line in a row, none right after ``{`` or before
  ``}``; the text ends with exactly one newline (an empty policy is an empty text);
- comments are kept (only trailing blanks are dropped): a comment on a line of its own is
  indented to its block, a comment after code follows it, two spaces after;
- a statement continued with ``\\`` is joined into one line; a statement longer than
  ``MAX_WIDTH`` columns is broken between words with `` \\``, the continuation lines
  indented eight more spaces than the statement (a trailing comment does not count towards
  the width and follows the last line).

Order is never changed: statements, parameters and matches stay where they were written.
Before returning, the output is parsed again and its tokens and comments are compared with
the input's, so a formatter bug cannot silently change a policy.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lark import Lark, Token
from lark.exceptions import UnexpectedInput
from lark.lark import PostLex

from tcdsl import fastlark
from tcdsl.diagnostics import Diagnostic
from tcdsl.frontend import recovery
from tcdsl.frontend.errors import syntax_error
from tcdsl.frontend.reader import grammar_text, nesting_too_deep
from tcdsl.frontend.source import normalise_newlines
from tcdsl.suppress import Directive, parse_directives

INDENT = "    "
CONTINUATION_INDENT = " " * 8
MAX_WIDTH = 100
"""Columns a statement line may take before it is broken with continuations."""

_SEPARATORS = frozenset({"_NL", "SEMICOLON"})
_TRIVIA = frozenset({"COMMENT", "CONTINUATION"})


class FormatError(Exception):
    """The text could not be formatted because it does not parse; carries the diagnostic (the
    first), and in ``diagnostics`` every syntax error, as ``tcdsl check`` reports them."""

    def __init__(self, diagnostic: Diagnostic, *more: Diagnostic) -> None:
        super().__init__(f"{diagnostic.span}: {diagnostic.message}")
        self.diagnostic = diagnostic
        self.diagnostics = (diagnostic, *more)


# ---- reading tokens ----------------------------------------------------------------------------


class _Recorder(PostLex):
    """Collect every token the parser reads, plus comments and continuations (callbacks)."""

    always_accept = ()

    def __init__(self) -> None:
        self.tokens: list[Token] = []

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        for token in stream:
            self.tokens.append(token)
            yield token

    def trivia(self, token: Token) -> Token:
        self.tokens.append(token)
        return token


@dataclass
class _Parser:
    lark: Lark
    recorder: _Recorder
    lock: threading.Lock = field(default_factory=threading.Lock)


@functools.cache
def _parser() -> _Parser:
    recorder = _Recorder()
    lark = Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        maybe_placeholders=False,
        postlex=recorder,
        lexer_callbacks={name: recorder.trivia for name in _TRIVIA},
        _plugins=fastlark.PLUGINS,
    )
    return _Parser(lark, recorder)


def tokens(text: str, path: str = "<input>") -> list[Token]:
    """Every token of ``text`` (newlines normalised) in order, comments and continuations
    included.

    Raises ``FormatError`` with the parser's diagnostic when ``text`` does not parse.
    """
    text = normalise_newlines(text)
    parser = _parser()
    with parser.lock:
        parser.recorder.tokens = []
        try:
            parser.lark.parse(text)
        except UnexpectedInput:
            raise FormatError(*_syntax_errors(parser.lark, text, path)) from None
        except fastlark.NestingTooDeep as err:
            raise FormatError(nesting_too_deep(err, path)) from None
        found = parser.recorder.tokens
        parser.recorder.tokens = []
    return sorted(found, key=lambda t: t.start_pos or 0)


def _syntax_errors(lark: Lark, text: str, path: str) -> list[Diagnostic]:
    """Every syntax error of ``text``, recovering as the compiler does."""
    found: list[Diagnostic] = []

    def report(err: UnexpectedInput, accepted: set[str], stack: list[Any]) -> None:
        found.append(syntax_error(err, path, text, accepted, stack, lark.terminals))

    recovery.parse(lark, text, report)
    return found


# ---- layout ------------------------------------------------------------------------------------


@dataclass
class _Line:
    """One output line before rendering: code words, or a comment of its own, or blank."""

    depth: int
    words: list[list[str]] = field(default_factory=list)
    """Code, as phrases of words (see ``_phrases``)."""
    comment: str | None = None
    opens: bool = False
    """The line ends with ``{``."""

    def render(self) -> list[str]:
        indent = INDENT * self.depth
        if not self.words:
            return [f"{indent}{self.comment}" if self.comment is not None else ""]
        lines = _fill(self.words, indent)
        if self.comment is not None:
            lines[-1] += f"  {self.comment}"
        return lines


# Punctuation that takes no space before it, or after it ("(a + b)", "80, 443"); the other
# operators take one space on each side, as words do. A "/" between two numbers of a match is
# a value/mask pair (3072/0xfc00) and is written without spaces; a "/" before a NUMBER is a
# division (LINK / 2).
_NO_SPACE_BEFORE = frozenset({"RPAR", "COMMA"})
_NO_SPACE_AFTER = frozenset({"LPAR"})


# A long statement is broken before one of these words where it can be (before a parameter,
# a match, a condition), so a value stays with its keyword.
_PHRASE_START = frozenset(
    {
        *("PARAM", "FLAG", "MATCH", "HANDLE_KW", "DEFAULT", "PRIOMAP", "CHAIN", "PREF"),
        *("ADDR_FIELD", "PORT_FIELD", "PROTO", "TOS", "DSCP", "TCP_ACK", "RAW_SIZE", "ALL"),
        *("FAMILY", "CLASSIFIER_KW", "WHERE", "AND"),
    }
)


def _phrases(statement: list[Token]) -> list[list[str]]:
    """The words of a statement, grouped into phrases that a line break should not split.

    Tokens are joined by the spacing rules above; "{" ends the last word.
    """
    phrases: list[list[str]] = []
    glue_next = False
    previous: str | None = None
    for i, token in enumerate(statement):
        kind = token.type
        text = str(token)
        following = statement[i + 1].type if i + 1 < len(statement) else None
        mask = kind == "SLASH" and following != "NUMBER"
        if kind == "LBRACE":
            text = " {"  # never alone on a continuation line
        if phrases and (glue_next or mask or kind in _NO_SPACE_BEFORE or kind == "LBRACE"):
            phrases[-1][-1] += text
        elif phrases and (kind not in _PHRASE_START or previous == "MATCH"):
            phrases[-1].append(text)
        else:
            phrases.append([text])
        glue_next = mask or kind in _NO_SPACE_AFTER
        previous = kind
    return phrases


def _fill(phrases: list[list[str]], indent: str) -> list[str]:
    """Lay out ``phrases`` from ``indent``, breaking with continuations past ``MAX_WIDTH``.

    Greedy: a phrase goes on the current line if it fits (leaving room for " \\" unless it is
    the last), else it starts a continuation line; a phrase too long for a line of its own is
    broken between its words in the same way. A word too long for any line stands alone.
    """
    total = sum(len(phrase) for phrase in phrases)
    lines: list[str] = []
    current = ""
    start = 0  # the index, counting words, of the first word of the current phrase
    for phrase in phrases:
        end = start + len(phrase)
        last = end == total
        text = " ".join(phrase)
        limit = MAX_WIDTH - (0 if last else 2)
        if not current:
            current = indent + text
        elif len(current) + 1 + len(text) <= limit:
            current += " " + text
        else:
            lines.append(f"{current} \\")
            current = indent + CONTINUATION_INDENT + text
        if len(current) > limit and len(phrase) > 1:
            # too long even where it starts a line: break between the phrase's words
            current = current[: len(current) - len(text)] + phrase[0]
            for j, word in enumerate(phrase[1:], start=start + 1):
                word_limit = MAX_WIDTH - (0 if j == total - 1 else 2)
                if len(current) + 1 + len(word) <= word_limit:
                    current += " " + word
                else:
                    lines.append(f"{current} \\")
                    current = indent + CONTINUATION_INDENT + word
        start = end
    lines.append(current)
    return lines


class _Layout:
    """Turn a token stream into ``_Line`` objects (see the module docstring for the rules)."""

    def __init__(self, text: str) -> None:
        self.lines: list[_Line] = []
        self.depth = 0
        self.statement: list[Token] = []  # the code tokens of the statement being read
        self.comment: str | None = None  # its trailing comment
        self.blank_before = False  # a blank line precedes the current statement
        self.on_output_line = False  # the current physical line has produced output already
        self.last_line = 0  # the source line where the last code or comment ended
        blank = [n for n, line in enumerate(text.split("\n"), start=1) if not line.strip()]
        self.blank_lines = blank

    def blank_between(self, first: int, last: int) -> bool:
        """Whether a blank source line lies strictly between lines ``first`` and ``last``."""
        i = bisect.bisect_right(self.blank_lines, first)
        return i < len(self.blank_lines) and self.blank_lines[i] < last

    def add(self, line: _Line, blank_before: bool) -> None:
        if blank_before and self.lines and not self.lines[-1].opens:
            self.lines.append(_Line(0))
        self.lines.append(line)

    def end_statement(self) -> None:
        if self.statement:
            line = _Line(self.depth, _phrases(self.statement), self.comment)
            line.opens = self.statement[-1].type == "LBRACE"
            self.add(line, self.blank_before)
        self.statement = []
        self.comment = None

    def feed(self, token: Token) -> None:
        kind = token.type
        line = token.line or 1
        if kind == "CONTINUATION":
            return
        if kind in _SEPARATORS:
            self.end_statement()
            if kind == "_NL":
                self.on_output_line = False
            return
        if kind == "COMMENT":
            self.add_comment(str(token).rstrip(), line)
        elif kind == "LBRACE":
            assert self.statement, "'{' outside a statement"
            self.statement.append(token)
            self.end_statement()
            self.depth += 1
        elif kind == "RBRACE":
            self.end_statement()
            self.depth -= 1
            self.add(_Line(self.depth, [["}"]]), blank_before=False)
        else:
            if not self.statement:
                self.blank_before = self.last_line > 0 and self.blank_between(self.last_line, line)
            self.statement.append(token)
        self.on_output_line = True
        self.last_line = line

    def add_comment(self, text: str, line: int) -> None:
        if self.statement:
            self.comment = text
        elif self.on_output_line and self.lines:
            self.lines[-1].comment = text
        else:
            blank = self.last_line > 0 and self.blank_between(self.last_line, line)
            self.add(_Line(self.depth, comment=text), blank)

    def finish(self) -> list[_Line]:
        # Blank lines are only added before a statement or a comment of their block, never
        # after an opening line: none can come right after "{", before "}" or at the end.
        self.end_statement()
        return self.lines


def _lay_out(stream: list[Token], text: str) -> str:
    layout = _Layout(text)
    for token in stream:
        layout.feed(token)
    out = [rendered for line in layout.finish() for rendered in line.render()]
    return "".join(f"{line}\n" for line in out)


# ---- the check and the entry point -------------------------------------------------------------


def _signature(stream: list[Token]) -> tuple[list[tuple[str, str]], list[str]]:
    """The code tokens with statement separators normalised, and the comments, in order."""
    code: list[tuple[str, str]] = []
    comments: list[str] = []
    for token in stream:
        kind = token.type
        if kind == "COMMENT":
            comments.append(str(token).rstrip())
        elif kind == "CONTINUATION":
            continue
        elif kind in _SEPARATORS:
            if code and code[-1] not in (("SEP", ""), ("LBRACE", "{")):
                code.append(("SEP", ""))
        elif kind == "RBRACE":
            if code and code[-1] == ("SEP", ""):
                code.pop()
            code.append((kind, "}"))
        else:
            code.append((kind, str(token)))
    if code and code[-1] == ("SEP", ""):
        code.pop()
    return code, comments


def format_source(text: str, path: str = "<input>") -> str:
    """Return ``text`` in the canonical layout; ``path`` names it in diagnostics.

    Raises ``FormatError`` (with the same diagnostic ``tcdsl check`` gives) if ``text`` does
    not parse. Pure: reads no files (``include`` is not followed) and is idempotent. CR LF and
    lone CR become LF, as the compiler reads them.
    """
    text = normalise_newlines(text)
    stream = tokens(text, path)
    result = _lay_out(stream, text)
    try:
        again = tokens(result, path)
    except FormatError as err:  # pragma: no cover - a formatter bug
        raise RuntimeError(f"tcdsl fmt produced text that does not parse: {err}") from err
    if _signature(again) != _signature(stream):  # pragma: no cover - a formatter bug
        raise RuntimeError(f"tcdsl fmt would change the meaning of {path}; nothing written")
    _directives_stay(text, stream, result, again, path)
    return result


def _directives_stay(
    text: str, stream: list[Token], result: str, again: list[Token], path: str
) -> None:
    """Refuse a layout that moves a ``# tcdsl: disable=`` comment off the code it covers.

    A disable comment covers the diagnostics that start on its line (or the next line); when
    the layout splits or joins that line, the comment would cover other code.
    """
    before, after = _covered(text, stream, path), _covered(result, again, path)
    moved: list[Diagnostic] = []  # every one (found by a tester: the first, run after run)
    for (directive, words), (_, words_after) in zip(before, after, strict=True):
        if words == words_after:
            continue
        message = (
            "tcdsl fmt would move the code of this line away from the comment that disables "
            f"{directive.code} on it; put the statement it is meant for on a line of its own, "
            "with the comment"
        )
        if words_after and words[: len(words_after)] == words_after:  # wrapped: too long
            message = (
                f"tcdsl fmt would wrap the statement this comment disables {directive.code} "
                f"on (it is longer than {MAX_WIDTH} columns), and the comment would not cover its "
                "other lines; shorten it (a constant for a long value), or disable "
                f"{directive.code} for the file ('# tcdsl: disable-file={directive.code}')"
            )
        moved.append(Diagnostic.error("E021", message, directive.span))
    if moved:
        raise FormatError(*moved)


def _covered(text: str, stream: list[Token], path: str) -> list[tuple[Directive, tuple[str, ...]]]:
    """Each line-bound disable directive, with the code words on the line it covers."""
    directives = [d for d in parse_directives(path, text).directives if d.line is not None]
    if not directives:
        return []
    words: dict[int, list[str]] = {}
    for token in stream:
        if token.type not in _TRIVIA and token.type not in _SEPARATORS:
            words.setdefault(token.line or 0, []).append(str(token))
    return [(d, tuple(words.get(d.line or 0, ()))) for d in directives]
