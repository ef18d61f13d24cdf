"""The pieces of syntax the Transformer hands from rule to rule, the names a match may use
(protocols, DSCP classes), and the guess at what a misspelled word meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tcdsl import ir
from tcdsl.diagnostics import Note, Span
from tcdsl.frontend.values import Expr

# ---- syntax pieces handed from rule to rule ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    key: str
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Flag:
    key: str
    span: Span


@dataclass(frozen=True, slots=True)
class DefaultOpt:
    name: ir.Name


@dataclass(frozen=True, slots=True)
class HandleOpt:
    keyword: str
    ref: ir.HandleRef | None
    span: Span


@dataclass(frozen=True, slots=True)
class PriomapOpt:
    values: tuple[ir.Count, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class CurveOpt:
    """An hfsc service curve as written: ``rt``/``ls``/``ul``/``sc`` and its keyed values."""

    key: str
    parts: tuple[Param, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class SetDscpOpt:
    """``set dscp CODE`` on a class (None: a bad code, already reported)."""

    value: ir.Count | None
    span: Span


Opt = Param | Flag | DefaultOpt | HandleOpt | PriomapOpt | CurveOpt | SetDscpOpt | ir.Match


@dataclass(frozen=True, slots=True)
class ClassSyntax:
    name: str
    span: Span
    opts: tuple[Opt, ...]
    body: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class QdiscSyntax:
    """A qdisc plus the ``classify`` statements found directly in its body."""

    qdisc: ir.Qdisc
    classify: tuple[ir.Marking, ...]
    stab: ir.Overhead | None = None
    """Link-layer words on a qdisc other than cake: a size table, for a root qdisc only."""


@dataclass(frozen=True, slots=True)
class PoliceSyntax:
    """``police`` and its parameters (``Param``) and verdict (``Flag``), as written."""

    span: Span
    items: tuple[Param | Flag, ...]


@dataclass(frozen=True, slots=True)
class Body:
    items: tuple[Any, ...]


PROTOCOLS: dict[str, int] = {
    "icmp": 1,
    "igmp": 2,
    "ipip": 4,
    "tcp": 6,
    "udp": 17,
    "gre": 47,
    "esp": 50,
    "ah": 51,
    "icmpv6": 58,
    "ipv6-icmp": 58,
    "ospf": 89,
    "pim": 103,
    "vrrp": 112,
    "sctp": 132,
}
DSCP_NAMES: dict[str, int] = {
    "be": 0,
    "cs0": 0,
    **{f"cs{i}": i * 8 for i in range(1, 8)},
    **{f"af{c}{d}": c * 8 + d * 2 for c in range(1, 5) for d in range(1, 4)},
    "ef": 46,
    "va": 44,
}


# ---- misspellings ------------------------------------------------------------------------------


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` is most likely a misspelling of, if one is close."""
    if len(word) > 40:
        return None
    choices = sorted(set(candidates) - {word})
    close = difflib.get_close_matches(word.lower(), choices, n=5, cutoff=0.6)
    if not close:
        return None
    # difflib ranks 'proto' above 'dport' for 'dprot'; a swapped pair of letters is one typo.
    return min(close, key=lambda c: (_typos(word.lower(), c), close.index(c)))


def suggestion(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close candidate, else nothing."""
    guess = did_you_mean(word, candidates)
    return f" (did you mean '{guess}'?)" if guess else ""


def _typos(a: str, b: str) -> int:
    """Edit distance counting a swap of neighbouring letters as one edit."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def _comment_at(line: str) -> int | None:
    """The index of the '#' that starts a comment on ``line`` (outside a string), or None."""
    quoted = False
    for i, char in enumerate(line):
        if char == '"':
            quoted = not quoted
        elif char == "#" and not quoted:
            return i
    return None


def _line_above(text: str, start: int) -> tuple[str, int] | None:
    """The line that ends just before the line starting at ``start``, and where it starts."""
    if start == 0:
        return None
    begin = text.rfind("\n", 0, start - 1) + 1
    return text[begin : start - 1], begin


def continuation_broken(text: str, at: int, row: int, path: str) -> tuple[str, Note] | None:
    """(hint, note) where line ``row`` of ``text``, holding offset ``at``, was meant to continue
    the statement above it but a comment ended that statement (found by a tester: a comment
    line between '\\'-continued lines made the next line's 'ceil' "did you mean 'codel'?",
    and its 'match' "a match belongs inside a class"): a comment line (or several) after a
    '\\', or a '\\' inside a comment. None where ``at`` is not the first word of its line.
    Reads only the lines above (a file of many errors is not split once per error)."""
    begin = text.rfind("\n", 0, at) + 1
    if text[begin:at].strip():
        return None
    found = _line_above(text, begin)
    if found is None:
        return None
    above, begin = found[0].rstrip(), found[1]
    if not above.strip():  # blank lines, after a '\'? (found by a tester)
        first = row - 1
        while (found := _line_above(text, begin)) is not None and not found[0].strip():
            first, begin = first - 1, found[1]
        before = found[0].rstrip() if found is not None else ""
        if before.endswith("\\") and _comment_at(before) is None:
            return (
                f"; the blank line {first} ends the statement that the '\\' of line "
                f"{first - 1} continues (a '\\' carries a statement over one line break, and "
                "a blank line ends it): remove the blank line",
                Note("this blank line ends the statement", Span(path, first, 1, first, 2)),
            )
        return None
    hash_at = _comment_at(above)
    if hash_at is None:
        return None
    if hash_at == len(above) - len(above.lstrip()):  # a comment line, and maybe more above it
        first, comment_line = row - 1, above
        while (found := _line_above(text, begin)) is not None and found[0].lstrip().startswith("#"):
            first, comment_line, begin = first - 1, found[0].rstrip(), found[1]
        before = found[0].rstrip() if found is not None else ""
        if before.endswith("\\") and _comment_at(before) is None:
            column = comment_line.index("#") + 1
            comment = Span(path, first, column, first, len(comment_line) + 1)
            return (
                f"; the comment line {first} ends the statement that the '\\' of "
                f"line {first - 1} continues (a '\\' carries a statement over one line "
                "break, and a comment ends it): move the comment after the statement",
                Note("this comment ends the statement", comment),
            )
        return None
    if above.endswith("\\"):
        comment = Span(path, row - 1, hash_at + 1, row - 1, len(above) + 1)
        return (
            f"; the '\\' ending line {row - 1} is inside its comment, so it continues "
            "nothing: only the last line of a continued statement may end with a comment",
            Note("this comment holds the '\\'", comment),
        )
    return None
