"""Disabling diagnostics: ``--disable CODE`` and ``# tcdsl: disable=CODE`` comments.

Three comment forms are recognised (several codes are separated by commas; anything after the
codes and a space is a free-text reason):

- ``# tcdsl: disable=W310`` at the end of a line, or alone on a line: drops those codes for
  diagnostics whose primary span starts on that line;
- ``# tcdsl: disable-next-line=W310``: the same for the line after the comment;
- ``# tcdsl: disable-file=W310`` anywhere: the same for the whole file.

Comments are found the way the lexer finds them: a ``#`` outside a string (strings cannot span
lines, and ``#`` cannot appear in a name). Errors cannot be disabled: tc would refuse the policy
or build something else than it says.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from tcdsl.codes import CODES, RETIRED
from tcdsl.diagnostics import Diagnostic, Severity, Span

DIRECTIVES = ("disable", "disable-next-line", "disable-file")

_DIRECTIVE = re.compile(r"#\s*tcdsl\s*:\s*(?P<kind>[\w-]*)\s*(?P<eq>=?)\s*(?P<rest>.*)")
_CODE = re.compile(r"[^\s,]+")


@dataclass(frozen=True, slots=True)
class Comment:
    """A comment in a source file: its text (from ``#``) and where it starts."""

    line: int
    column: int
    text: str


def comments(text: str) -> Iterator[Comment]:
    """Yield the comments of a policy text, skipping ``#`` inside strings."""
    # lines end at "\n" alone, as the lexer's do (splitlines() also splits at a form feed,
    # U+0085 or U+2028, which would put every later comment on the wrong line)
    for number, line in enumerate(text.split("\n"), 1):
        if "#" not in line:
            continue
        if '"' not in line:
            at = line.index("#")
            yield Comment(number, at + 1, line[at:])
            continue
        i = 0
        while i < len(line):
            ch = line[i]
            if ch == '"':
                close = line.find('"', i + 1)
                if close < 0:
                    break  # an unterminated string (E002): the rest is no comment
                i = close + 1
                continue
            if ch == "#":
                yield Comment(number, i + 1, line[i:])
                break
            i += 1


@dataclass(frozen=True, slots=True)
class Directive:
    """One code named by a disable comment: which lines it covers (None: the whole file)."""

    code: str
    line: int | None
    span: Span


@dataclass
class Suppressions:
    """The disable comments of the sources, and the warnings about malformed ones."""

    directives: list[Directive] = field(default_factory=list)
    problems: list[Diagnostic] = field(default_factory=list)


def disable_problem(code: str) -> str | None:
    """Why ``code`` cannot be disabled (unknown, retired, or an error), or None if it can."""
    info = CODES.get(code)
    if code in RETIRED:
        return f"{code} is retired: {RETIRED[code]}"
    if info is None:
        return f"unknown code '{code}'"
    if info.severity is Severity.ERROR:
        return f"{code} is an error and cannot be disabled"
    return None


def parse_directives(file: str, text: str) -> Suppressions:
    """The disable directives in one source text, with a W307 for each bad code or form."""
    found = Suppressions()
    if "tcdsl" not in text:
        return found  # no directive: skip the scan (most policies)
    for c in comments(text):
        m = _DIRECTIVE.match(c.text)
        if m is None:
            continue
        kind = m.group("kind")
        if kind not in DIRECTIVES or not m.group("eq"):
            if not m.group("eq") and not kind.startswith("disable"):
                continue  # prose that happens to start with 'tcdsl:'
            found.problems.append(
                Diagnostic.warning(
                    "W307",
                    f"'{m.group(0).strip()}' is not a tcdsl directive; write "
                    "'# tcdsl: disable=CODE' (or disable-next-line=, disable-file=)",
                    Span(file, c.line, c.column, c.line, c.column + len(c.text.rstrip())),
                )
            )
            continue
        line = {"disable": c.line, "disable-next-line": c.line + 1}.get(kind)
        rest, offset = m.group("rest"), c.column + m.start("rest")
        pos = 0
        while True:
            code_match = _CODE.match(rest, pos)
            if code_match is None:
                break
            code = code_match.group(0).upper()  # as --disable takes it (found by a tester)
            span = Span(file, c.line, offset + pos, c.line, offset + code_match.end())
            problem = disable_problem(code)
            if problem is None:
                found.directives.append(Directive(code, line, span))
            else:
                known = code in CODES or code in RETIRED
                text = problem if known else f"{problem} in a disable comment"
                found.problems.append(Diagnostic.warning("W307", text, span))
            comma = re.compile(r"\s*,\s*").match(rest, code_match.end())
            if comma is None:
                break  # the codes end here: the rest is a reason
            pos = comma.end()
    return found


def suppress(
    diagnostics: Iterable[Diagnostic],
    sources: Mapping[str, str],
    disabled: Iterable[str] = (),
    *,
    complete: bool = False,
) -> list[Diagnostic]:
    """Drop the disabled warnings and infos; add a W307 for each malformed disable comment.

    ``disabled`` are the codes disabled everywhere (``--disable``); the comments come from
    ``sources``. With ``complete`` (every stage ran, so every diagnostic that could be reported
    was), a comment that suppressed nothing gets an I308. Errors are never dropped.
    """
    everywhere = frozenset(disabled)
    per_file = {file: parse_directives(file, text) for file, text in sources.items()}
    used: set[Directive] = set()

    def keep(d: Diagnostic) -> bool:
        if d.is_error:
            return True
        hit = False
        found = per_file.get(d.span.file)
        for directive in found.directives if found else ():
            if directive.code == d.code and directive.line in (None, d.span.line):
                used.add(directive)
                hit = True
        return not hit and d.code not in everywhere

    problems = [d for s in per_file.values() for d in s.problems]
    kept = [d for d in [*diagnostics, *problems] if keep(d)]
    if complete:
        unused = [
            Diagnostic.info(
                "I308",
                f"this comment disables {directive.code}, but no {directive.code} is reported "
                "here; remove it",
                directive.span,
            )
            for s in per_file.values()
            for directive in s.directives
            if directive not in used
        ]
        kept += [d for d in unused if keep(d)]
    return kept
