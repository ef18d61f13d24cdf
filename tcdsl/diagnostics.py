"""Diagnostics: source spans, severities, stable codes, and their rendering."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file; lines and columns are 1-based, the end is exclusive."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __init__(self, file: str, line: int, column: int, end_line: int, end_column: int) -> None:
        # The dataclass's own __init__ of a frozen class sets each field through
        # object.__setattr__; the slots' own setters do the same in a third less time, which
        # counts for the hundreds of thousands of spans a large policy makes.
        _set_file(self, file)
        _set_line(self, line)
        _set_column(self, column)
        _set_end_line(self, end_line)
        _set_end_column(self, end_column)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def prefix(self, width: int) -> Span:
        """The first ``width`` columns of this span (a keyword that starts a block's span)."""
        return Span(self.file, self.line, self.column, self.line, self.column + width)


# The setters of Span's slots, for its __init__.
_set_file = vars(Span)["file"].__set__
_set_line = vars(Span)["line"].__set__
_set_column = vars(Span)["column"].__set__
_set_end_line = vars(Span)["end_line"].__set__
_set_end_column = vars(Span)["end_column"].__set__


class Severity(Enum):
    """How bad a diagnostic is."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    """Advice that is not a problem (borrowing is normal); shown with ``check --info``."""
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Note:
    """A secondary location attached to a diagnostic."""

    message: str
    span: Span


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem found in a policy, with a stable code and the place it was found."""

    severity: Severity
    code: str
    message: str
    span: Span
    notes: tuple[Note, ...] = ()
    hidden: int = 0
    """How many more of its severity this one stands for, not shown (a table's errors past
    the first 50): counted in the summary, in JSON as ``hidden``."""

    @staticmethod
    def error(code: str, message: str, span: Span, *notes: Note) -> Diagnostic:
        """Build an error."""
        return Diagnostic(Severity.ERROR, code, message, span, notes)

    @staticmethod
    def warning(code: str, message: str, span: Span, *notes: Note) -> Diagnostic:
        """Build a warning."""
        return Diagnostic(Severity.WARNING, code, message, span, notes)

    @staticmethod
    def info(code: str, message: str, span: Span, *notes: Note) -> Diagnostic:
        """Build an informational diagnostic (never fails a check, even with --werror)."""
        return Diagnostic(Severity.INFO, code, message, span, notes)

    @property
    def is_error(self) -> bool:
        """True for errors."""
        return self.severity is Severity.ERROR


class PolicyError(Exception):
    """Raised by the driver when a stage reports errors; carries every diagnostic so far."""

    def __init__(self, diagnostics: tuple[Diagnostic, ...]) -> None:
        super().__init__(f"{sum(d.is_error for d in diagnostics)} error(s)")
        self.diagnostics = diagnostics


def sort_key(d: Diagnostic) -> tuple[str, int, int, str]:
    """Order diagnostics by place, then code, so output is deterministic."""
    return (d.span.file, d.span.line, d.span.column, d.code)


EXCERPT_WIDTH = 100
"""Source lines longer than this are cut around the caret in excerpts."""
_CONTEXT = 30  # columns kept before the caret when a line is cut


def escape(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (control characters and escape
    sequences, line and paragraph separators, bidi controls) spelled as ``\\x1b`` or
    ``\\u2028``, except those in ``keep``: policy text must not drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escaped(c) for c in text)


def _message(text: str) -> str:
    """A message as shown: escaped, its later lines indented, so that no line of it (a
    table's cell may hold a line break) reads as a diagnostic of its own."""
    return escape(text, keep="\n").replace("\n", "\n    ")


def _escaped(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _display(line: str) -> tuple[str, list[int]]:
    """``line`` as shown (a tab as one blank, other unprintables escaped), and where each
    character starts on screen (one entry more, for the end of the line)."""
    if line.isprintable():
        return line, list(range(len(line) + 1))
    shown: list[str] = []
    starts: list[int] = []
    at = 0
    for c in line:
        starts.append(at)
        piece = " " if c == "\t" else c if c.isprintable() else _escaped(c)
        shown.append(piece)
        at += len(piece)
    starts.append(at)
    return "".join(shown), starts


def _excerpt(span: Span, raw: str, shown: tuple[str, list[int]]) -> list[str]:
    """The source line of ``span`` and a caret line under it (``raw``: that line of the file,
    split at LF only as the lexer counts lines; ``shown``: ``_display(raw)``)."""
    line, starts = shown
    first = min(max(span.column, 1), len(raw) + 1) - 1
    last = span.end_column - 1 if span.end_line == span.line else len(raw)
    last = min(max(last, first + 1), len(raw) + 1)
    start = starts[first]
    end = starts[last] if last <= len(raw) else starts[-1] + 1
    if len(line) > EXCERPT_WIDTH:
        begin = 0 if start + _CONTEXT <= EXCERPT_WIDTH else start - _CONTEXT
        begin = max(0, min(begin, len(line) - EXCERPT_WIDTH))
        prefix = "..." if begin else ""
        stop = begin + EXCERPT_WIDTH
        suffix = "..." if stop < len(line) else ""
        line = prefix + line[begin:stop] + suffix
        start, end = start - begin + len(prefix), min(end, stop) - begin + len(prefix)
    width = len(str(span.line))
    # in terminal columns: a wide character (CJK, most emoji) takes two, a combining one none
    # (found by a tester: the caret stood under a circuit's Japanese name, not its address)
    caret = " " * _columns(line[:start]) + "^" + "~" * max(0, _columns(line[start:end]) - 1)
    return [f" {span.line} | {line}", f" {' ' * width} | {caret}"]


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes: two for a wide character, none for a mark
    that joins the one before (Mn, Me: a combining accent, Thai's and Devanagari's vowel
    signs) or a format character (Cf), one for the rest."""
    if text.isascii():
        return len(text)
    return sum(
        0
        if unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in "WF"
        else 1
        for c in text
    )


def render(diagnostics: Iterable[Diagnostic], sources: Mapping[str, str]) -> str:
    """Render diagnostics as GNU-style text with source excerpts and carets.

    Each source is split into lines once, and each line escaped once, however many
    diagnostics it has; policy text in
    excerpts, messages and file names is escaped (``escape``).
    """
    split: dict[str, list[str] | None] = {}
    # Many diagnostics can share one long line: each line is escaped and measured once.
    shown: dict[tuple[str, int], tuple[str, list[int]]] = {}

    def excerpt(span: Span) -> list[str]:
        if span.file not in split:
            text = sources.get(span.file)
            split[span.file] = None if text is None else text.split("\n")
        lines = split[span.file]
        if lines is None or not 1 <= span.line <= len(lines):
            return []
        raw = lines[span.line - 1]
        key = (span.file, span.line)
        if key not in shown:
            shown[key] = _display(raw)
        return _excerpt(span, raw, shown[key])

    def place(span: Span) -> str:
        return f"{escape(span.file)}:{span.line}:{span.column}"

    out: list[str] = []
    for d in diagnostics:
        out.append(f"{place(d.span)}: {d.severity.value}: {_message(d.message)} [{d.code}]")
        out.extend(excerpt(d.span))
        for note in d.notes:
            out.append(f"{place(note.span)}: note: {_message(note.message)}")
            out.extend(excerpt(note.span))
    return "".join(line + "\n" for line in out)


def _span_json(span: Span) -> dict[str, object]:
    return {
        "file": span.file,
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
    }


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    """Render diagnostics as a JSON array for tools."""
    items = [
        {
            "severity": d.severity.value,
            "code": d.code,
            "message": d.message,
            "span": _span_json(d.span),
            "notes": [{"message": n.message, "span": _span_json(n.span)} for n in d.notes],
            **({"hidden": d.hidden} if d.hidden else {}),
        }
        for d in diagnostics
    ]
    return json.dumps(items, indent=2) + "\n"
