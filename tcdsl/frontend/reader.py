"""Read a policy file and its includes with the grammar's LALR parser."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lark import Lark, Token
from lark.exceptions import UnexpectedInput, UnexpectedToken

from tcdsl import fastlark, ir
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend import recovery, tables
from tcdsl.frontend.builder import Builder
from tcdsl.frontend.errors import first_on_its_line, syntax_error
from tcdsl.frontend.source import (
    Access,
    SourceError,
    normalise_newlines,
    read_policy,
    source_diagnostic,
)
from tcdsl.frontend.values import Scope, span_of

if TYPE_CHECKING:
    from tcdsl.allocate import LiveQueues

# ---- reading files -----------------------------------------------------------------------------


@functools.cache
def grammar_text() -> str:
    from importlib import resources

    return resources.files("tcdsl.grammar").joinpath("tcdsl.lark").read_text()


MAX_INCLUDE_DEPTH = 32


def nesting_too_deep(err: fastlark.NestingTooDeep, path: str) -> Diagnostic:
    """E020 at the brace or parenthesis of ``path`` that nests one level too deep."""
    msg = (
        f"blocks and parentheses nest more than {fastlark.MAX_NESTING} levels deep here; "
        "tcdsl follows at most that many"
    )
    return Diagnostic.error("E020", msg, span_of(err.token, path))


_UNKNOWN = re.compile(r"unknown constant '([^']+)'")
"""E103's message for a name no constant has (yet)."""


class Reader:
    """Read a policy file and its includes; collect interfaces, diagnostics and sources.

    Files are read with ``tcdsl.frontend.source.read_policy`` unless a ``loader`` (path ->
    text) is given; includes must stay where ``access`` allows (by default, below the main
    policy's directory). A file is read once: including it again does nothing. Subscriber
    tables are read from the disk unless ``table_loader`` (path -> text, or None: read the
    disk) has them: the saved text of an applied policy, compiled again as it was applied.
    """

    def __init__(
        self,
        loader: Callable[[str], str] | None = None,
        access: Access | None = None,
        table_loader: Callable[[str], str | None] | None = None,
        queues: Mapping[str, LiveQueues] | None = None,
    ) -> None:
        self.scope = Scope()
        self.queues = queues or {}
        """Tree label -> its live mq tree's queues (``tcdsl.allocate.live_queues``): a spread
        tree keeps each class on its queue."""
        self.diagnostics: list[Diagnostic] = []
        self.follow_ons: list[Diagnostic] = []
        """Errors caused only by an earlier one: not reported, but they taint like errors."""
        self.taint = recovery.Taint()
        """Where errors are: later stages report nothing that depends on those places."""
        self.sources: dict[str, str] = {}
        self.stack: list[str] = []
        self.loader = loader or read_policy
        self.table_loader = table_loader
        self.access = access or Access()
        self.tree: str | None = None
        """The main policy's directory: where includes may read."""
        self.done: set[str] = set()
        """The real paths of the files read so far."""
        self.tables: dict[str, tables.Table | None] = {}
        """The subscriber tables read so far, by real path (None: unusable, reported)."""

    def read(self, path: str, include_span: Span | None = None) -> list[ir.Interface]:
        """Parse ``path``; report problems at ``include_span`` when it cannot be read."""
        if self.tree is None:
            self.tree = os.path.dirname(path) or "."
        real = os.path.realpath(path)
        cycle = real in map(os.path.realpath, self.stack)
        if cycle or len(self.stack) >= MAX_INCLUDE_DEPTH:
            assert include_span is not None
            if cycle:
                msg = f"include cycle: {' -> '.join([*self.stack, path])}"
            else:
                msg = f"includes nest more than {MAX_INCLUDE_DEPTH} deep"
            self.diagnostics.append(Diagnostic.error("E006", msg, include_span))
            return self._unread(include_span)
        if real in self.done:
            return []
        span = include_span or Span(path, 1, 1, 1, 1)
        if not self.access.allows(path, self.tree):
            # For the policy itself: a symlink (named.tcp -> /etc/shadow) that leaves its own
            # directory, as a pull request could add and a pre-commit hook would name.
            verb = "cannot include" if include_span is not None else "not reading"
            msg = f"{verb} {self.access.refusal(path, self.tree)}"
            self.diagnostics.append(Diagnostic.error("E023", msg, span))
            return self._unread(include_span)
        try:
            text = normalise_newlines(self.loader(path))
        except SourceError as err:
            self.diagnostics.append(source_diagnostic(err, path, include_span))
            return self._unread(include_span)
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            self.diagnostics.append(
                Diagnostic.error("E006", f"cannot read '{path}': {reason.lower()}", span)
            )
            return self._unread(include_span)
        self.done.add(real)
        first = len(self.diagnostics)
        try:
            interfaces = self.read_text(path, text)
        except fastlark.NestingTooDeep as err:
            self.diagnostics.append(nesting_too_deep(err, path))
            return self._unread(include_span)
        if include_span is None:
            self.tables.clear()  # read by now: the classes have what they need of the rows
            self._defined_later()
            if not interfaces and not self.scope.constants and not self.diagnostics:
                # (an interface with an empty block has said so)
                # Nothing at all (an empty file, comments only): said, where a script that
                # changes nothing would pass in silence. A file of constants is a library.
                msg = (
                    "the policy is empty: it has no 'interface' statement, "
                    "so its script changes nothing"
                )
                self.diagnostics.append(Diagnostic.warning("W308", msg, Span(path, 1, 1, 1, 2)))
        if include_span is not None:
            refusal = _not_a_policy(path, text, self.diagnostics[first:], include_span)
            if refusal is not None:
                # Anything more would show the text of a file that may hold secrets.
                del self.diagnostics[first:]
                self.sources.pop(path, None)
                self.diagnostics.append(refusal)
                return self._unread(include_span)
        return interfaces

    def _defined_later(self) -> None:
        """E103 for a constant the policy defines after its use says where (found by a
        tester: 'unknown constant' for one defined further down the file)."""
        for n, d in enumerate(self.diagnostics):
            found = _UNKNOWN.match(d.message) if d.code == "E103" else None
            declared = self.scope.constants.get(found.group(1)) if found else None
            if declared is None:
                continue
            self.diagnostics[n] = dataclasses.replace(
                d,
                message=f"{d.message}: it is defined after this use; constants must be "
                "defined before they are used",
                notes=(*d.notes, Note("defined here", declared[1])),
            )

    def _unread(self, include_span: Span | None) -> list[ir.Interface]:
        """Nothing, for a file that could not be read; if it was included, the constants it
        may define are missing, and unknown constants are no longer reported."""
        if include_span is not None:
            self.scope.incomplete = True
        return []

    def read_text(self, path: str, text: str) -> list[ir.Interface]:
        """Parse ``text`` as the file ``path``, going on after syntax errors."""
        self.sources[path] = text
        self.stack.append(path)
        first, first_follow_on = len(self.diagnostics), len(self.follow_ons)
        builder = Builder(self, path)
        parser = _parser(builder)

        def report(err: UnexpectedInput, accepted: set[str], stack: list[Any]) -> None:
            self.diagnostics.append(
                syntax_error(err, path, text, accepted, stack, parser.terminals)
            )
            self._mark_broken_constant(stack, path)
            misspelled = _MISSPELLED_CONST.match(_line_at(err, text))
            if (
                misspelled
                and isinstance(err, UnexpectedToken)
                and first_on_its_line(err.token, text)
            ):
                # 'cosnt LINK = 10mbit': LINK's uses would each say it is unknown
                self.scope.broken.setdefault(misspelled.group(1), span_of(err.token, path))

        try:
            recovery.parse(parser, text, report)
        finally:
            self.stack.pop()
        self.diagnostics[first:] = _without_glued_follow_ons(self.diagnostics[first:])
        errors = [d for d in self.diagnostics[first:] if d.is_error]
        self.taint.add(path, text, [*errors, *self.follow_ons[first_follow_on:]])
        syntax = recovery.Taint()
        syntax.add(path, text, [d for d in errors if d.code in SYNTAX_CODES])
        if syntax:
            # What a statement that did not parse selects is a follow-on of its syntax error
            # (found by a tester: a 'where' value cut short also said no row meets it).
            self.diagnostics[first:] = [
                d
                for d in self.diagnostics[first:]
                if d.code not in SELECTION_CODES or not syntax.covers(d)
            ]
        if errors:
            # A warning in a statement an error broke speaks of what the error left (W371:
            # rows that a half-parsed 'where' no longer takes); later stages' are dropped too.
            self.diagnostics[first:] = [
                d for d in self.diagnostics[first:] if d.is_error or not self.taint.covers(d)
            ]
        return builder.interfaces

    def _mark_broken_constant(self, stack: list[Any], path: str) -> None:
        """A constant whose declaration failed: its uses are follow-on errors."""
        for keyword, name in itertools.pairwise(stack):
            if isinstance(keyword, Token) and keyword.type == "CONST" and isinstance(name, Token):
                self.scope.broken.setdefault(str(name), span_of(name, path))


def _without_glued_follow_ons(found: list[Diagnostic]) -> list[Diagnostic]:
    """``found`` without the syntax error of the rest of a word whose start a value error
    already explains (found by a tester: '0x10mbit' said both that a hex number takes no unit
    and that 'mbit' was unexpected; '1e6bit' that 'e' is no unit and '6bit' unexpected)."""
    ends = {(d.span.file, d.span.end_line, d.span.end_column) for d in found if d.code in GLUED}
    if not ends:
        return found
    return [
        d
        for d in found
        if d.code != "E001" or (d.span.file, d.span.line, d.span.column) not in ends
    ]


GLUED = frozenset({"E004", "E005"})
"""Value errors of a number and the unit glued to it (no unit on a hex number, an unknown
unit), whose word's rest the parser then finds unexpected."""

SYNTAX_CODES = frozenset({"E001", "E002"})
"""The syntax errors: a statement with one is parsed only in part."""
SELECTION_CODES = frozenset({"E034"})
"""Errors about what a statement selects (a subscribers statement's rows), which a statement
parsed only in part selects wrongly."""

_MISSPELLED_CONST = re.compile(r"[ \t]*\S+[ \t]+([A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)[ \t]*=")


def _line_at(err: UnexpectedInput, text: str) -> str:
    """The source line where ``err`` happened."""
    pos = getattr(err, "pos_in_stream", None) or 0
    if isinstance(err, UnexpectedToken):
        pos = err.token.start_pos or 0
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start : end if end >= 0 else len(text)]


def _not_a_policy(
    path: str, text: str, found: list[Diagnostic], include_span: Span
) -> Diagnostic | None:
    """An error at the include when the included file's first statement does not parse.

    Such a file is not policy text (an ``include ".env"`` in an untrusted policy): its
    diagnostics would echo its content, so they are replaced by this one, which shows none.
    """
    first_error = next((d for d in found if d.is_error and d.span.file == path), None)
    if first_error is None or first_error.code not in ("E001", "E002"):
        return None
    code_line = next(
        (n for n, line in enumerate(text.split("\n"), 1) if line.strip()[:1] not in ("", "#")),
        1,
    )
    if first_error.span.line > code_line:
        return None
    where = f"line {first_error.span.line}, column {first_error.span.column}"
    return Diagnostic.error(
        first_error.code,
        f"'{path}' is not a tcdsl policy: its first statement does not parse ({where}); "
        "its text is not shown",
        include_span,
    )


def _parser(builder: Builder) -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        transformer=builder,
        maybe_placeholders=False,
        cache=_cache_path(),
        _plugins=fastlark.PLUGINS,
    )


@functools.cache
def _cache_path() -> bool | str:
    import hashlib
    import tempfile

    digest = hashlib.sha256(grammar_text().encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"tcdsl-grammar-{digest}.lark-cache")
