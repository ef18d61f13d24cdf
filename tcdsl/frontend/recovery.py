"""Syntax-error recovery: after an error the parse goes on at the next statement boundary, so
every statement of a file is read and every syntax error reported; the statements an error
touched are recorded, so that later stages skip what depends on them.

A statement ends at the end of its line, at ``;`` or at the ``}`` that closes the block it is
in; a ``{`` on its line opens its block, which belongs to it up to the matching ``}``. The
parser is LALR with the Transformer run during the parse, so recovery edits the parser's
stacks: it keeps as much of the failed statement as still parses (dropping the bad words up to
its ``{`` or its end) or, when nothing does, drops the whole statement with its block.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.parsers.lalr_analysis import Shift
from lark.parsers.lalr_interactive_parser import InteractiveParser
from lark.parsers.lalr_parser_state import ParserState

from tcdsl.diagnostics import Diagnostic, Span

# The lexer's view of structure: blanks, comments and line continuations are skipped; strings
# and words hide their braces. A lone '"' or '\' is a word of its own.
_PIECE = re.compile(
    r"""(?P<skip>[ \t\f\r]+|\#[^\n]*|\\[ \t]*\r?\n)
      | (?P<open>\{) | (?P<close>\}) | (?P<sep>[;\n])
      | (?P<word>"[^"\n]*"|[^\s{};"\#\\]+|.)""",
    re.X,
)

_SEPARATORS = re.compile(r"(?:[ \t\f\r;\n]+|\#[^\n]*|\\[ \t]*\r?\n)*")

# Statement lists: parser states that can start a statement of the file or of a block.
_TOP, _BLOCK = "item", "stmt"
_BOUNDARY_TOKENS = {"\n": "_NL", ";": "SEMICOLON", "}": "RBRACE", "{": "LBRACE"}


# ---- statements as the text shows them ---------------------------------------------------------


@dataclass(slots=True)
class Statement:
    """One statement's place in the text, as character offsets."""

    start: int
    header_end: int
    """Where its ``{`` is, or its end when it has no block."""
    end: int
    """Its last character: the separator or ``}`` that ends it (inclusive)."""
    parent: int
    """The index of the statement whose block holds it; -1 at the top level."""


def statements(text: str) -> list[Statement]:
    """Every statement of ``text`` in the order it starts (a parent before its children)."""
    out: list[Statement] = []
    blocks: list[int] = []
    current: int | None = None
    previous: int | None = None
    for m in _PIECE.finditer(text):
        kind = m.lastgroup
        if kind == "skip":
            continue
        pos = m.start()
        if kind == "word" or (kind == "close" and not blocks):
            if current is None:
                current = len(out)
                out.append(Statement(pos, -1, m.end(), blocks[-1] if blocks else -1))
            out[current].end = m.end()
        elif kind == "open":
            if current is None:
                # A '{' at the start of a line belongs to the statement before it (E002).
                current = previous
            if current is None:
                current = len(out)
                out.append(Statement(pos, -1, pos, blocks[-1] if blocks else -1))
            if out[current].header_end < 0:
                out[current].header_end = pos
            blocks.append(current)
            current = None
        elif kind == "close":
            if current is not None:
                out[current].end = pos
            current = blocks.pop()
            out[current].end = pos
        else:
            if current is not None:
                out[current].end = pos
                previous = current
            else:
                previous = None if previous is None or text[pos] != "\n" else previous
            current = None
    for index in blocks:
        out[index].end = len(text)
    for s in out:
        if s.header_end < 0:
            s.header_end = s.end
    return out


def boundary(text: str, pos: int, top_level: bool) -> tuple[int, int | None]:
    """Where the statement holding ``pos`` ends (the offset of its separator, of the ``}`` that
    closes its block, or the end of the text), and the offset of its own ``{`` if one follows
    ``pos``. At the top level a stray ``}`` closes nothing and is skipped."""
    depth = 0
    brace = None
    for m in _PIECE.finditer(text, pos):
        kind = m.lastgroup
        if kind == "open":
            if depth == 0 and brace is None:
                brace = m.start()
            depth += 1
        elif kind == "close":
            if depth:
                depth -= 1
            elif not top_level:
                return m.start(), brace
        elif kind == "sep" and not depth:
            return m.start(), brace
    return len(text), brace


# ---- where errors are ------------------------------------------------------------------------


class Taint:
    """The places of a policy that an error touched: later stages report nothing there.

    An error taints the whole statement at each of its places (the error's and its notes'): its
    values may have been dropped, its block may be incomplete; and the header of the statement
    holding that one, which may have lost a child, or a value its children's percentages
    refer to.
    """

    def __init__(self) -> None:
        self._regions: dict[str, list[tuple[int, int]]] = {}
        self._lines: dict[str, list[int]] = {}
        self._statements: dict[str, list[Statement]] = {}
        self._merged: dict[str, list[tuple[int, int]]] = {}

    def __bool__(self) -> bool:
        return bool(self._regions)

    def add(self, file: str, text: str, errors: Iterable[Diagnostic]) -> None:
        """Taint the statements of ``file`` (whose text is ``text``) that hold ``errors``."""
        spans = [s for d in errors for s in (d.span, *(n.span for n in d.notes)) if s.file == file]
        if not spans:
            return
        if file not in self._lines:
            self._lines[file] = line_starts(text)
            self._statements[file] = statements(text)
        lines = self._lines[file]
        found = sorted({span_offset(lines, span) for span in spans})
        regions = self._regions.setdefault(file, [])
        self._merged.pop(file, None)
        stmts = self._statements[file]
        open_: list[int] = []
        i = 0
        for pos in found:
            while i < len(stmts) and stmts[i].start <= pos:
                while open_ and stmts[open_[-1]].end < stmts[i].start:
                    open_.pop()
                open_.append(i)
                i += 1
            while open_ and stmts[open_[-1]].end < pos:
                open_.pop()
            if not open_:
                continue
            s = stmts[open_[-1]]
            regions.append((s.start, s.end))
            if s.parent >= 0:
                p = stmts[s.parent]
                regions.append((p.start, p.header_end))

    def covers(self, d: Diagnostic) -> bool:
        """True if ``d`` or one of its notes is in a tainted place."""
        return any(self._covers(span) for span in (d.span, *(n.span for n in d.notes)))

    def _covers(self, span: Span) -> bool:
        regions = self._regions.get(span.file)
        if not regions:
            return False
        merged = self._merged.get(span.file)
        if merged is None:
            merged = self._merged[span.file] = _union(regions)
        pos = span_offset(self._lines[span.file], span)
        at = bisect.bisect_right(merged, (pos, math.inf)) - 1
        return at >= 0 and merged[at][1] >= pos


def _union(regions: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The same places as disjoint regions, in order."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(regions):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def line_starts(text: str) -> list[int]:
    """Where each line of ``text`` starts (for :func:`span_offset`)."""
    return [0, *(m.end() for m in re.finditer("\n", text))]


def span_offset(lines: Sequence[int], span: Span) -> int:
    """Where ``span`` starts in the text whose :func:`line_starts` are ``lines``."""
    if not 1 <= span.line <= len(lines):
        return lines[-1] if span.line > len(lines) else 0
    return lines[span.line - 1] + span.column - 1


# ---- the parse ---------------------------------------------------------------------------------


def parse(
    parser: Lark,
    text: str,
    report: Callable[[UnexpectedInput, set[str], list[Any]], None],
) -> None:
    """Parse ``text``, calling ``report(error, accepted, statement)`` for each syntax error that
    is not a consequence of an earlier one: ``accepted`` holds the terminals that could have
    come there, ``statement`` the parsed pieces of the failed statement and what holds it."""
    ip: InteractiveParser = parser.parse_interactive(text)
    if not getattr(ip.parser, "records_before", False):
        ip.parser_state.__class__ = _RecordingState
    resumed_at = -1
    for _ in range(len(text) + 2):
        try:
            ip.resume_parse()  # type: ignore[no-untyped-call]
            return
        except UnexpectedInput as err:
            ip = err.interactive_parser
            pos = _position(err, text)
            state = ip.parser_state
            if pos > resumed_at:
                report(err, accepted(err), list(state.value_stack))
            elif pos < len(text):
                pos = resumed_at + 1  # a consequence of the last recovery: skip a character
            if isinstance(err, UnexpectedToken) and err.token.type == "$END":
                return  # nothing left to go on with; an open block stays unbuilt
            if (goes_on := _continued(err, text)) is not None:
                # 'rate 10mbit \ # why': the '\' was meant to go on with the next line, as
                # the statement does now (found by a tester: the next line was a second error)
                _move(ip, text, goes_on, _line_of(err, text))
                resumed_at = goes_on
                continue
            if (outer := _at_top_level(ip, err, text)) is not None:
                # a file's statement at the start of a line inside a block: a '}' is missing
                # (reported); the file's statements go on from it, the unclosed one dropped
                # (found by a tester: one missing '}' was reported again at the end of the
                # file, and the interfaces after it never read)
                resumed_at = outer
                continue
            resumed_at = _recover(ip, text, pos, _line_of(err, text))
    raise AssertionError("syntax-error recovery made no progress")  # pragma: no cover


def _continued(err: UnexpectedInput, text: str) -> int | None:
    """Where the next line starts, when ``err`` is at a '\\' that only blanks and a comment
    follow on its line (a continuation the comment broke); None otherwise."""
    if not isinstance(err, UnexpectedToken) or err.token.value != "\\":
        return None
    start = err.token.end_pos or 0
    end = text.find("\n", start)
    if end < 0 or text[start:end].strip()[:1] not in ("", "#"):
        return None
    return end + 1


TOP_LEVEL = frozenset({"INTERFACE"})
"""The keyword of the statement that starts a file's top level and says a '}' is missing
(a 'const' or 'include' inside a block is more likely misplaced: found by a review)."""


def _at_top_level(ip: InteractiveParser, err: UnexpectedInput, text: str) -> int | None:
    """Where the parse goes on (the failing token) when ``err`` is a file's statement at the
    start of a line inside an open block: the stacks cut back to the file's statement list;
    None otherwise."""
    if not isinstance(err, UnexpectedToken) or err.token.type not in TOP_LEVEL:
        return None
    pos = err.token.start_pos or 0
    if text[text.rfind("\n", 0, pos) + 1 : pos].strip():
        return None
    state = ip.parser_state
    table = state.parse_conf.parse_table.states
    stack = state.state_stack
    outer = [i for i in range(len(stack)) if _TOP in table[stack[i]]]
    if not outer or outer[-1] == len(stack) - 1:
        return None
    keep = outer[-1] + 1
    if not _accepts(state, stack, err.token.type, keep):
        return None
    del stack[keep:]
    del state.value_stack[keep - 1 :]
    _move(ip, text, pos, _line_of(err, text))
    return pos


def _line_of(err: UnexpectedInput, text: str) -> tuple[int, int]:
    """An offset and its line, from the error (the lexer does not keep its line count)."""
    if isinstance(err, UnexpectedToken):
        return err.token.start_pos or 0, err.token.line or 1
    return _position(err, text), err.line or 1


def _position(err: UnexpectedInput, text: str) -> int:
    if isinstance(err, UnexpectedToken):
        if err.token.type == "$END":
            return len(text)
        return err.token.start_pos or 0
    if isinstance(err, UnexpectedCharacters):
        return err.pos_in_stream or 0
    return len(text)  # pragma: no cover


def _recover(ip: InteractiveParser, text: str, pos: int, known: tuple[int, int]) -> int:
    """Edit ``ip`` to go on after the error at ``pos``; return where it resumes. ``known`` is
    an offset and its line, for the lexer's line count."""
    state = ip.parser_state
    table = state.parse_conf.parse_table.states
    stack = state.state_stack
    top = next(i for i in reversed(range(len(stack))) if {_TOP, _BLOCK} & table[stack[i]].keys())
    end, brace = boundary(text, pos, _TOP in table[stack[top]])
    # Keep the longest prefix of the statement that can go on with its '{' (so its block is
    # read), else with its end; else drop the statement and its block.
    keep, resume = top + 1, end
    for at in (brace, end):
        if at is None or at < pos:
            continue
        ttype = _BOUNDARY_TOKENS.get(text[at], "") if at < len(text) else "$END"
        prefix = next(
            (k for k in range(len(stack), top, -1) if _accepts(state, stack, ttype, k)), 0
        )
        if prefix:
            keep, resume = prefix, at
            break
    else:
        if end < len(text) and not _accepts(state, stack, _BOUNDARY_TOKENS[text[end]], keep):
            # After a statement and its separators, the next statement must start.
            resume = end + len(_SEPARATORS.match(text, end).group())  # type: ignore[union-attr]
    del stack[keep:]
    del state.value_stack[keep - 1 :]
    _move(ip, text, resume, known)
    return resume


def _move(ip: InteractiveParser, text: str, pos: int, known: tuple[int, int]) -> None:
    """Point the lexer at ``pos``, given the line of a ``known`` (offset, line)."""
    lexer_state = ip.lexer_thread.state
    assert lexer_state is not None
    counter = lexer_state.line_ctr
    at, line = known
    counter.line = line + text.count("\n", at, pos)
    counter.char_pos = pos
    counter.line_start_pos = text.rfind("\n", 0, pos) + 1
    counter.column = pos - counter.line_start_pos + 1


def _accepts(state: Any, stack: list[int], ttype: str, size: int | None = None) -> bool:
    """Whether the parser with the first ``size`` entries of ``stack`` (all by default) would
    shift ``ttype`` (LALR, so after reductions). ``stack`` is left as it is."""
    table = state.parse_conf.parse_table.states
    end_state = state.parse_conf.end_state
    kept = len(stack) if size is None else size
    pushed: list[int] = []  # what reductions put on top of stack[:kept]
    while True:
        action = table[pushed[-1] if pushed else stack[kept - 1]].get(ttype)
        if action is None:
            return False
        kind, arg = action
        if kind is Shift:
            return True
        popped = min(len(arg.expansion), len(pushed))
        del pushed[len(pushed) - popped :]
        kept -= len(arg.expansion) - popped
        goto = table[pushed[-1] if pushed else stack[kept - 1]].get(arg.origin.name)
        if goto is None:  # pragma: no cover - the table always has the goto
            return False
        pushed.append(goto[1])
        if goto[1] == end_state:
            return ttype == "$END"


def accepted(err: UnexpectedInput) -> set[str]:
    """The terminals that could have come where ``err`` is (exact for LALR)."""
    state = err.interactive_parser.parser_state
    # LALR may have reduced on the failing token (a lookahead merged from elsewhere) before
    # failing: what could have come is what the stack from before it takes.
    stack = getattr(err, "states_before", None) or state.state_stack
    table = state.parse_conf.parse_table.states
    return {t for t in table[stack[-1]] if t.isupper() and _accepts(state, stack, t)}


class _RecordingState(ParserState[int]):
    """Lark's parser state, telling a syntax error the state stack from before the failing
    token, as fastlark's loop does."""

    __slots__ = ()

    def feed_token(self, token: Token, is_end: bool = False) -> Any:
        before = list(self.state_stack)
        try:
            return super().feed_token(token, is_end)
        except UnexpectedInput as e:
            e.states_before = before  # type: ignore[attr-defined]
            raise
