"""Diagnostics: source spans, severities, stable codes, and their rendering."""

from __future__ import annotations

import json
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

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def prefix(self, width: int) -> Span:
        """The first ``width`` columns of this span (a keyword that starts a block's span)."""
        return Span(self.file, self.line, self.column, self.line, self.column + width)


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


def _excerpt(span: Span, sources: Mapping[str, str]) -> list[str]:
    text = sources.get(span.file)
    if text is None:
        return []
    lines = text.splitlines()
    if not 1 <= span.line <= len(lines):
        return []
    line = lines[span.line - 1].expandtabs(1)
    width = len(str(span.line))
    end = span.end_column if span.end_line == span.line else len(line) + 1
    length = max(1, end - span.column)
    caret = " " * (span.column - 1) + "^" + "~" * (length - 1)
    return [f" {span.line} | {line}", f" {' ' * width} | {caret}"]


def render(diagnostics: Iterable[Diagnostic], sources: Mapping[str, str]) -> str:
    """Render diagnostics as GNU-style text with source excerpts and carets."""
    out: list[str] = []
    for d in diagnostics:
        out.append(f"{d.span}: {d.severity.value}: {d.message} [{d.code}]")
        out.extend(_excerpt(d.span, sources))
        for note in d.notes:
            out.append(f"{note.span}: note: {note.message}")
            out.extend(_excerpt(note.span, sources))
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
        }
        for d in diagnostics
    ]
    return json.dumps(items, indent=2) + "\n"
