"""Values as written (numbers with units, percentages, constants, arithmetic) and their
evaluation into base units with the dimension a parameter expects."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from lark import Token

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.units import BYTE_RATE_UNITS, Dimension, dimensions_of, scale

# ---- values before evaluation -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lit:
    """A number with an optional unit suffix, as written."""

    number: Fraction | int
    unit: str | None
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class Pct:
    """A percentage, as written."""

    value: Fraction
    span: Span


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a constant."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Bin:
    """``left op right``; for ``*`` and ``/`` the right side is a plain number."""

    op: Literal["+", "-", "*", "/"]
    left: Expr
    right: Expr
    span: Span


Expr = Lit | Pct | Ref | Bin


_NO_EXPONENT = "such as 1mbit for 1e6bit"


def refs(expr: Expr) -> list[Ref]:
    """The constants ``expr`` names, left to right."""
    if isinstance(expr, Ref):
        return [expr]
    if isinstance(expr, Bin):
        return refs(expr.left) + refs(expr.right)
    return []


@dataclass(frozen=True, slots=True)
class Address:
    """An address constant (IPv4 or IPv6)."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    span: Span


_DECIMAL_COMMA = re.compile(r"([0-9]+),([0-9]+)([A-Za-z]+|%)(?![\w.])")


def decimal_comma(text: str, at: int) -> str | None:
    """The value written with a decimal comma whose ',' is at ``at`` in ``text``
    (``1,5mbit``), spelled with a '.' (``1.5mbit``); None if there is none. Only a decimal
    number with a unit (or ``%``) is one: ``dscp 10,12`` or ``0x10,0x08`` are lists (found by
    a review: they were told to write 10.12 and 10.0x)."""
    start = at
    while start > 0 and "0" <= text[start - 1] <= "9":
        start -= 1
    if start == at or (start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._")):
        return None
    found = _DECIMAL_COMMA.match(text, start)
    if found is None or found.start(2) != at + 1:
        return None
    unit = found.group(3)
    if unit != "%" and not dimensions_of(unit):
        return None
    return f"{found.group(1)}.{found.group(2)}{unit}"


_SPACED_UNIT = re.compile(r"([0-9]+(?:\.[0-9]+)?)[ \t]+([A-Za-z]+\b|%)")


_DOTTED_MASK = re.compile(
    r"(?<![\w.])([0-9]{1,3}(?:\.[0-9]{1,3}){3})/([0-9]{1,3}(?:\.[0-9]{1,3}){3})(?![\w.])"
)


def dotted_mask(text: str, at: int) -> str | None:
    """What to write for an IPv4 prefix with a dotted netmask around ``at`` in ``text``
    (``10.0.0.0/255.0.0.0``, which the lexer reads as ``10.0.0.0/25`` and ``5.0.0.0``): the
    prefix with its length, or what is wrong with the mask; None if there is none there."""
    line_start = text.rfind("\n", 0, at) + 1
    line_end = text.find("\n", at)
    for m in _DOTTED_MASK.finditer(text, line_start, len(text) if line_end < 0 else line_end):
        if not m.start() < at < m.end():
            continue
        octets = [int(o) for o in m.group(2).split(".")]
        if any(o > 255 for o in octets):
            return None
        bits = int.from_bytes(bytes(octets), "big")
        length = bin(bits).count("1")
        if bits != (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF:
            return f"a prefix is written with its length (10.0.0.0/8); {m.group(2)} is no netmask"
        return f"a prefix is written with its length: {m.group(1)}/{length}"
    return None


_WORD_BEFORE = re.compile(r"([A-Za-z_][\w-]*)[ \t]+$")


def spaced_unit(
    text: str, at: int, takes: Callable[[str], frozenset[Dimension]] | None = None
) -> str | None:
    """The value written with a blank between its number and its unit whose unit starts at
    ``at`` in ``text`` (``10 mbit``), spelled as one word (``10mbit``); None if there is none
    (found by a tester: 'rate 10 mbit' was told "write 10bit", ten bits a second), or if
    ``takes`` (a parameter's name -> what it measures) says the word before the number takes
    nothing that unit measures (``prio 1 ms``: ``unit_misfit``)."""
    start = at
    while start > 0 and text[start - 1] in " \t":
        start -= 1
    while start > 0 and (text[start - 1].isdigit() or text[start - 1] == "."):
        start -= 1
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_"):
        return None
    found = _SPACED_UNIT.match(text, start)
    if found is None or found.start(2) != at:
        return None
    if found.group(2) != "%" and not dimensions_of(found.group(2)):
        return None
    if takes is not None and unit_misfit(text, at, takes) is not None:
        return None
    return f"{found.group(1)}{found.group(2)}"


def unit_misfit(text: str, at: int, takes: Callable[[str], frozenset[Dimension]]) -> str | None:
    """The parameter before the number whose unit, after a blank, starts at ``at``, when it
    takes nothing that unit measures (``prio 1 ms``: 'prio'); None otherwise."""
    unit = _UNIT_WORD.match(text, at)
    number = _NUMBER_BEFORE.search(text, 0, at)
    if unit is None or number is None:
        return None
    line_start = text.rfind("\n", 0, number.start()) + 1
    word = _WORD_BEFORE.search(text, line_start, number.start())
    if word is None:
        return None
    wanted = takes(word.group(1))
    if not wanted or wanted & set(dimensions_of(unit.group())):
        return None
    return word.group(1)


_UNIT_WORD = re.compile(r"[A-Za-z]+\b")
_NUMBER_BEFORE = re.compile(r"[0-9]+(?:\.[0-9]+)?[ \t]+$")


CONDITION_WORDS = frozenset({"src", "dst", "sport", "dport", "proto", "tos", "dscp"})
"""The words that start a match line's conditions."""


class EvalError(Exception):
    """A value could not be evaluated; carries the diagnostic."""

    def __init__(self, diagnostic: Diagnostic, follow_on: bool = False) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic
        self.follow_on = follow_on
        """Caused only by an earlier error (a constant whose declaration failed)."""


MAX_DIGITS = 100
"""The most digits a number may have, as written or evaluated (tc takes at most 20)."""

_LIMIT = 10**MAX_DIGITS


def parse_int(text: str, span: Span) -> int:
    """A whole number as the grammar reads it (``INT``: ASCII decimal, or hex with ``0x``).

    Raises ``EvalError`` (E026) past ``MAX_DIGITS`` digits, before Python would refuse.
    """
    if len(text) <= MAX_DIGITS and text.isdigit() and text.isascii():
        return int(text)  # the common case: a short decimal number
    hex_ = text[:2].lower() == "0x"
    digits = text[2:] if hex_ else text
    if not digits.isascii() or not (digits.isalnum() if hex_ else digits.isdigit()):
        raise ValueError(f"not a whole number: {text!r}")
    _check_length(digits.lstrip("0"), text, span)
    return int(digits, 16 if hex_ else 10)


def parse_decimal(text: str, span: Span) -> Fraction | int:
    """A number as the grammar reads it (``NUMBER``: ASCII decimal, maybe with a fraction).

    Raises ``EvalError`` (E026) past ``MAX_DIGITS`` digits."""
    if len(text) <= MAX_DIGITS and text.isdigit():
        return int(text)  # the common case: a short whole number
    whole, _, fraction = text.partition(".")
    _check_length(whole.lstrip("0") + fraction, text, span)
    return Fraction(text) if fraction else int(whole)


def _check_length(digits: str, text: str, span: Span) -> None:
    if len(digits) > MAX_DIGITS:
        shown = text if len(text) <= 24 else f"{text[:10]}...{text[-10:]}"
        raise EvalError(
            Diagnostic.error(
                "E026",
                f"'{shown}' has {len(digits)} digits; tcdsl reads numbers of at most "
                f"{MAX_DIGITS} digits (tc takes far smaller values)",
                span,
            )
        )


def bounded(value: Fraction | int, span: Span) -> Fraction | int:
    """``value``, if it (and, for a fraction, its parts) has at most ``MAX_DIGITS`` digits.

    Raises ``EvalError`` (E026): arithmetic on constants can build numbers that no message
    could print and no float could hold.
    """
    if value.__class__ is int and -_LIMIT < value < _LIMIT:
        return value  # the common case
    parts = (value.numerator, value.denominator) if isinstance(value, Fraction) else (value,)
    if any(abs(part) >= _LIMIT for part in parts):
        raise EvalError(
            Diagnostic.error(
                "E026",
                f"this value needs more than {MAX_DIGITS} digits; tcdsl takes values below "
                f"10^{MAX_DIGITS} (tc takes far smaller ones)",
                span,
            )
        )
    return value


HEX = ("0x", "0X")

RATE_HINT = "rates take bit, kbit, mbit, gbit, tbit (or bps, kbps, mbps: BYTES per second)"


def span_of(token: Token, file: str) -> Span:
    """The span of a token."""
    return Span(
        file,
        token.line or 1,
        token.column or 1,
        token.end_line or token.line or 1,
        token.end_column or (token.column or 1) + len(str(token)),
    )


def join(a: Span, b: Span) -> Span:
    """The span from the start of ``a`` to the end of ``b``."""
    return Span(a.file, a.line, a.column, b.end_line, b.end_column)


_METRIC = {"k": "k", "m": "M", "g": "G"}
"""A unit's prefix, as a rate's is spoken (``10 Mbit/s``)."""


def describe_dimension(dim: Dimension) -> str:
    """A dimension in words, with an example."""
    return f"a {dim.value} such as {dim.example}" if dim is not Dimension.COUNT else "a number"


# ---- evaluation --------------------------------------------------------------------------------


Value = tuple[Fraction | int, tuple[Span, ...]]
"""An evaluated value in base units, with the spans of the byte-rate units it was written in."""


@dataclass
class Scope:
    """Constants shared by a file and everything it includes."""

    constants: dict[str, tuple[Expr | Address, Span]] = field(default_factory=dict)
    values: dict[tuple[str, Dimension, bool], Value | ir.Percent | EvalError] = field(
        default_factory=dict
    )
    """Each constant evaluated once per dimension (``const C2 = C1 + C1`` chains would
    otherwise take exponential time); a constant is never redefined, so this stays true."""
    broken: dict[str, Span] = field(default_factory=dict)
    """Constants whose declaration has an error (a syntax error, or a second declaration): their
    uses are left out, without an error of their own."""
    incomplete: bool = False
    """An include could not be read: an unknown constant may be defined there, so its uses
    are left out too."""


def evaluate(
    expr: Expr, dim: Dimension, scope: Scope, *, percent: bool = False
) -> Value | ir.Percent:
    """Evaluate ``expr`` as ``dim`` in base units; return a Percent only when ``percent``."""
    if isinstance(expr, Pct):
        if not percent:
            raise EvalError(
                Diagnostic.error(
                    "E012",
                    f"a percentage is not allowed here; expected {describe_dimension(dim)}",
                    expr.span,
                )
            )
        return ir.Percent(expr.value, expr.span)
    if isinstance(expr, Ref):
        found = scope.constants.get(expr.name)
        if expr.name in scope.broken or (found is None and scope.incomplete):
            msg = f"constant '{expr.name}' has an error in its declaration"  # never shown
            raise EvalError(Diagnostic.error("E103", msg, expr.span), follow_on=True)
        if found is None:
            hint = ""
            if "-" in expr.name:
                hint = f"; to subtract, put spaces around '-' ({expr.name.replace('-', ' - ')})"
            elif expr.name in CONDITION_WORDS:
                # (found by a tester: 'dport 80, dport 443')
                hint = (
                    f"; '{expr.name}' starts a condition, and a list after one holds its values "
                    f"only: '{expr.name} 80, 443'"
                    if expr.name in ("dport", "sport")
                    else f"; '{expr.name}' starts a condition, and a list after one holds its "
                    "values only"
                )
            raise EvalError(
                Diagnostic.error("E103", f"unknown constant '{expr.name}'{hint}", expr.span)
            )
        value, where = found
        if isinstance(value, Address):
            raise EvalError(
                Diagnostic.error(
                    "E011",
                    f"constant '{expr.name}' is an address; expected {describe_dimension(dim)}",
                    expr.span,
                    Note(f"'{expr.name}' defined here", where),
                )
            )
        key = (expr.name, dim, percent)
        result = scope.values.get(key)
        if result is None:
            try:
                result = evaluate(value, dim, scope, percent=percent)
            except EvalError as err:
                result = err
            scope.values[key] = result
        if isinstance(result, EvalError):
            d = result.diagnostic
            raise EvalError(
                Diagnostic(
                    d.severity,
                    d.code,
                    d.message,
                    d.span,
                    (*d.notes, Note(f"'{expr.name}' used here", expr.span)),
                ),
                result.follow_on,
            ) from None
        return result
    return _arith(expr, dim, scope)


def _no_percent(expr: Expr) -> None:
    if isinstance(expr, Pct):
        msg = "a percentage cannot be used in arithmetic"
        raise EvalError(Diagnostic.error("E012", msg, expr.span))


def _arith(
    expr: Lit | Bin, dim: Dimension, scope: Scope
) -> tuple[Fraction | int, tuple[Span, ...]]:
    if isinstance(expr, Lit):
        return _literal(expr, dim)
    _no_percent(expr.left)
    _no_percent(expr.right)
    if expr.op in "*/":
        factor = expr.right
        assert isinstance(factor, Lit)
        left = evaluate(expr.left, dim, scope)
        assert not isinstance(left, ir.Percent)
        if factor.number == 0 and expr.op == "/":
            raise EvalError(Diagnostic.error("E013", "division by zero", factor.span))
        value = left[0] * factor.number if expr.op == "*" else Fraction(left[0]) / factor.number
        return bounded(value, expr.span), left[1]
    left = evaluate(expr.left, dim, scope)
    right = evaluate(expr.right, dim, scope)
    assert not isinstance(left, ir.Percent) and not isinstance(right, ir.Percent)
    value = left[0] + right[0] if expr.op == "+" else left[0] - right[0]
    if value < 0:
        raise EvalError(Diagnostic.error("E013", "this value is negative", expr.span))
    return bounded(value, expr.span), left[1] + tuple(s for s in right[1] if s not in left[1])


def _literal(lit: Lit, dim: Dimension) -> tuple[Fraction | int, tuple[Span, ...]]:
    if lit.unit is None and dim in (Dimension.RATE, Dimension.TIME) and lit.text[:2] in HEX:
        raise EvalError(
            Diagnostic.error(
                "E004",
                f"'{lit.text}' has no unit, and a hex number takes none: write this "
                f"{dim.value} in decimal with its unit, such as {dim.example}",
                lit.span,
            )
        )
    if lit.unit is None:
        if dim is Dimension.RATE:
            raise EvalError(
                Diagnostic.error(
                    "E004",
                    f"'{lit.text}' has no unit; tc would read it as bits per second, "
                    f"write {lit.text}bit or use kbit/mbit/gbit",
                    lit.span,
                )
            )
        if dim is Dimension.TIME:
            raise EvalError(
                Diagnostic.error(
                    "E004",
                    f"'{lit.text}' has no unit; tc would read it as microseconds, "
                    f"write {lit.text}us or use ms/s",
                    lit.span,
                )
            )
        return lit.number, ()
    if dim is Dimension.COUNT:
        raise EvalError(
            Diagnostic.error("E011", f"expected a plain number, found '{lit.text}'", lit.span)
        )
    factor = scale(lit.unit, dim)
    if factor is None:
        others = [d for d in dimensions_of(lit.unit) if d is not dim]
        if others:
            msg = f"expected {describe_dimension(dim)}, found {others[0].value} '{lit.text}'"
            if dim is Dimension.RATE and others[0] is Dimension.SIZE:
                # '10Mb', '1m': to tc a size in bytes; the writer meant a rate (a tester's)
                number = lit.text[: len(lit.text) - len(lit.unit)]
                prefix = lit.unit.lower()[:1] if lit.unit.lower()[:1] in _METRIC else ""
                msg += (
                    f"; for {number} {_METRIC.get(prefix, '')}bit/s write {number}{prefix}bit "
                    f"({number}{prefix}bps is bytes a second)"
                )
            raise EvalError(Diagnostic.error("E011", msg, lit.span))
        hint = (
            RATE_HINT
            if dim is Dimension.RATE
            else {
                Dimension.SIZE: "sizes take b, k/kb, m/mb, g/gb, kbit, mbit, gbit",
                Dimension.TIME: "times take s, ms, us",
            }.get(dim, "")
        )
        if lit.unit in ("e", "E"):  # '1e6bit' (a tester's): the rest of the word is no unit
            hint = f"a number takes no exponent: write its unit's prefix ({_NO_EXPONENT}); {hint}"
        raise EvalError(Diagnostic.error("E005", f"unknown unit '{lit.unit}'; {hint}", lit.span))
    unit = lit.unit.lower()
    # A unit tc reads in the other base: bytes for a rate (W302), bits for a size (W323).
    other_base = (
        (lit.span,)
        if (dim is Dimension.RATE and unit in BYTE_RATE_UNITS)
        or (dim is Dimension.SIZE and unit.endswith("bit"))
        else ()
    )
    return bounded(lit.number * factor, lit.span), other_base


def size_in_bits(size: ir.Size, written: tuple[Span, ...]) -> Iterator[Diagnostic]:
    """W323 for each literal of a size written in bit units (``burst 10kbit``, 1280 bytes to
    tc): later warnings give the size in bytes, which the policy's text does not show (found
    by a tester: W317 said 'burst 1280' of a 'burst 10kbit'). The bytes are said where the
    literal is the whole value; where it is part of one (a constant, arithmetic), what a
    'kbit' is."""
    bytes_ = "sizes in bytes take b, k/kb, m/mb, g/gb"
    if written != (size.span,):
        for span in written:
            msg = f"a size in bit units counts bits: tc reads 1kbit as 128 bytes; {bytes_}"
            yield Diagnostic.warning("W323", msg, span)
        return
    number, unit, name = size.bytes * 8, "", " bytes"  # the number as written, in bytes
    for power, prefix, word in ((3, "g", " GiB"), (2, "m", " MiB"), (1, "k", " KiB")):
        if number and number % 1024**power == 0:
            number, unit, name = number // 1024**power, prefix, word
            break
    yield Diagnostic.warning(
        "W323",
        f"a size in bit units counts bits: tc reads this as {size.bytes} bytes; write "
        f"{number}{unit} for {number}{name} ({bytes_})",
        size.span,
    )
