"""Parse policy text into the IR: a Lark LALR parser whose Transformer runs during the parse.

Constants are resolved as they are read (a constant must be defined before it is used), values
are evaluated into base units with the dimension the parameter expects, and ``include``
parses the named file in place. Class names (``default bulk``) and percentages are left for
``tcdsl.resolve``. Every problem becomes a ``Diagnostic``; nothing here raises for bad input.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tcdsl import fastlark, ir
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


@dataclass(frozen=True, slots=True)
class Address:
    """An IPv4 constant."""

    network: ipaddress.IPv4Network
    span: Span


class EvalError(Exception):
    """A value could not be evaluated; carries the diagnostic."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


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


Opt = Param | Flag | DefaultOpt | HandleOpt | PriomapOpt | ir.Match


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


@dataclass(frozen=True, slots=True)
class Body:
    items: tuple[Any, ...]


# ---- parameter tables ------------------------------------------------------------------------

R, S, T, C = Dimension.RATE, Dimension.SIZE, Dimension.TIME, Dimension.COUNT
PERCENT_OK = frozenset({"rate", "ceil"})

LINK_PARAMS: dict[str, Dimension] = {"rate": R, "ceil": R, "burst": S, "cburst": S, "quantum": S}
CLASS_PARAMS: dict[str, dict[str, Dimension]] = {
    "htb": {**LINK_PARAMS, "prio": C, "mark": C},
    "cbq": {
        "rate": R,
        "allot": S,
        "avpkt": S,
        "prio": C,
        "weight": R,
        "maxburst": C,
        "minburst": C,
        "mark": C,
    },
    "prio": {"mark": C},
}
CLASS_FLAGS: dict[str, frozenset[str]] = {
    "htb": frozenset(),
    "cbq": frozenset({"bounded", "isolated"}),
    "prio": frozenset(),
}
QDISC_PARAMS: dict[str, dict[str, Dimension]] = {
    "htb": {**LINK_PARAMS, "r2q": C},
    "prio": {"bands": C},
    "cbq": {"bandwidth": R, "avpkt": S},
    "tbf": {"rate": R, "burst": S, "buffer": S, "latency": T, "limit": S, "peakrate": R, "mtu": S},
    "netem": {
        "delay": T,
        "jitter": T,
        "loss": C,
        "duplicate": C,
        "corrupt": C,
        "limit": C,
        "rate": R,
    },
    "sfq": {"perturb": C, "quantum": S, "limit": C, "depth": C, "divisor": C},
    "fq_codel": {
        "limit": C,
        "flows": C,
        "target": T,
        "interval": T,
        "quantum": S,
        "memory_limit": S,
    },
    "pfifo": {"limit": C},
    "bfifo": {"limit": S},
    "pfifo_fast": {},
}
QDISC_FLAGS: dict[str, frozenset[str]] = {k: frozenset() for k in QDISC_PARAMS}
QDISC_FLAGS["fq_codel"] = frozenset({"ecn", "noecn"})
NETEM_PERCENT = frozenset({"loss", "duplicate", "corrupt"})
CLASSFUL = frozenset({"htb", "prio", "cbq"})
CHAINING = frozenset({"tbf", "netem"})

PROTOCOLS: dict[str, int] = {
    "icmp": 1,
    "igmp": 2,
    "ipip": 4,
    "tcp": 6,
    "udp": 17,
    "ipv6": 41,
    "gre": 47,
    "esp": 50,
    "ah": 51,
    "icmpv6": 58,
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


def describe_dimension(dim: Dimension) -> str:
    """A dimension in words, with an example."""
    return f"a {dim.value} such as {dim.example}" if dim is not Dimension.COUNT else "a number"


# ---- evaluation --------------------------------------------------------------------------------


@dataclass
class Scope:
    """Constants shared by a file and everything it includes."""

    constants: dict[str, tuple[Expr | Address, Span]] = field(default_factory=dict)


def evaluate(
    expr: Expr, dim: Dimension, scope: Scope, *, percent: bool = False
) -> tuple[Fraction | int, tuple[Span, ...]] | ir.Percent:
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
        if found is None:
            hint = ""
            if "-" in expr.name:
                hint = f"; to subtract, put spaces around '-' ({expr.name.replace('-', ' - ')})"
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
        try:
            result = evaluate(value, dim, scope, percent=percent)
        except EvalError as err:
            d = err.diagnostic
            raise EvalError(
                Diagnostic(
                    d.severity,
                    d.code,
                    d.message,
                    d.span,
                    (*d.notes, Note(f"'{expr.name}' used here", expr.span)),
                )
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
        return value, left[1]
    left = evaluate(expr.left, dim, scope)
    right = evaluate(expr.right, dim, scope)
    assert not isinstance(left, ir.Percent) and not isinstance(right, ir.Percent)
    value = left[0] + right[0] if expr.op == "+" else left[0] - right[0]
    if value < 0:
        raise EvalError(Diagnostic.error("E013", "this value is negative", expr.span))
    return value, left[1] + right[1]


def _literal(lit: Lit, dim: Dimension) -> tuple[Fraction | int, tuple[Span, ...]]:
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
            raise EvalError(Diagnostic.error("E011", msg, lit.span))
        hint = (
            RATE_HINT
            if dim is Dimension.RATE
            else {
                Dimension.SIZE: "sizes take b, k/kb, m/mb, g/gb, kbit, mbit, gbit",
                Dimension.TIME: "times take s, ms, us",
            }.get(dim, "")
        )
        raise EvalError(Diagnostic.error("E005", f"unknown unit '{lit.unit}'; {hint}", lit.span))
    byte_units = (
        (lit.span,) if dim is Dimension.RATE and lit.unit.lower() in BYTE_RATE_UNITS else ()
    )
    return lit.number * factor, byte_units


# ---- the transformer ---------------------------------------------------------------------------


class Builder(Transformer[Token, Any]):
    """Build IR during the LALR parse; rule methods are named after grammar rules."""

    def __init__(self, reader: Reader, file: str) -> None:
        super().__init__()
        self.reader = reader
        self.file = file
        self.interfaces: list[ir.Interface] = []

    @property
    def scope(self) -> Scope:
        return self.reader.scope

    def error(self, d: Diagnostic) -> None:
        self.reader.diagnostics.append(d)

    def sp(self, token: Token) -> Span:
        return span_of(token, self.file)

    # ---- top level ----
    def const_decl(self, c: list[Any]) -> None:
        name, value = c
        span = self.sp(name)
        if str(name) in self.scope.constants:
            prev = self.scope.constants[str(name)][1]
            self.error(
                Diagnostic.error(
                    "E101",
                    f"constant '{name}' is already defined",
                    span,
                    Note("first defined here", prev),
                )
            )
            return
        if isinstance(value, Token):  # an address
            net = self._network(value)
            if net is None:
                return
            self.scope.constants[str(name)] = (Address(net, self.sp(value)), span)
            return
        self.scope.constants[str(name)] = (value, span)

    def include(self, c: list[Token]) -> None:
        (path_token,) = c
        target = os.path.normpath(os.path.join(os.path.dirname(self.file), str(path_token)[1:-1]))
        self.interfaces.extend(self.reader.read(target, self.sp(path_token)))

    def interface(self, c: list[Any]) -> None:
        (name, name_span), q = c
        assert isinstance(q, QdiscSyntax)
        self._check_ifname(name, name_span)
        marking = None
        for extra in q.classify[1:]:
            self.error(
                Diagnostic.error(
                    "E014",
                    "'classify' is given twice",
                    extra.span,
                    Note("first given here", q.classify[0].span),
                )
            )
        if q.classify:
            marking = q.classify[0]
        self.interfaces.append(ir.Interface(name, name_span, q.qdisc, marking))

    def ifname(self, c: list[Token]) -> tuple[str, Span]:
        (tok,) = c
        text = str(tok)
        if tok.type == "STRING":
            text = text[1:-1]
        return text, self.sp(tok)

    def _check_ifname(self, name: str, span: Span) -> None:
        problem = None
        if not name:
            problem = "is empty"
        elif len(name.encode()) > 15:
            problem = f"is {len(name.encode())} bytes long; Linux allows at most 15"
        elif name in (".", ".."):
            problem = "is not allowed by Linux"
        else:
            bad = [ch for ch in name if ch in "/:%" or ch.isspace() or not ch.isprintable()]
            if bad:
                problem = f"contains {bad[0]!r}, which Linux does not allow in interface names"
        if problem:
            self.error(Diagnostic.error("E009", f"interface name '{name}' {problem}", span))

    # ---- values ----
    def quantity(self, c: list[Token]) -> Lit:
        (tok,) = c
        text = str(tok)
        i = 0
        while i < len(text) and (text[i].isdigit() or text[i] == "."):
            i += 1
        digits = text[:i]
        number = Fraction(digits) if "." in digits else int(digits)
        return Lit(number, text[i:], text, self.sp(tok))

    def number(self, c: list[Token]) -> Lit:
        (tok,) = c
        text = str(tok)
        if text.lower().startswith("0x"):
            value: Fraction | int = int(text, 16)
        else:
            value = Fraction(text) if "." in text else int(text)
        return Lit(value, None, text, self.sp(tok))

    def percent(self, c: list[Token]) -> Pct:
        (tok,) = c
        return Pct(Fraction(str(tok)[:-1]), self.sp(tok))

    def ref(self, c: list[Token]) -> Ref:
        (tok,) = c
        return Ref(str(tok), self.sp(tok))

    def _bin(self, op: Literal["+", "-", "*", "/"], c: list[Any]) -> Bin:
        left, right = c
        if isinstance(right, Token):
            right = self.number([right])
        return Bin(op, left, right, join(left.span, right.span))

    def add(self, c: list[Any]) -> Bin:
        return self._bin("+", c)

    def sub(self, c: list[Any]) -> Bin:
        return self._bin("-", c)

    def mul(self, c: list[Any]) -> Bin:
        return self._bin("*", c)

    def div(self, c: list[Any]) -> Bin:
        return self._bin("/", c)

    # ---- options ----
    def param(self, c: list[Any]) -> Param:
        key, value = c
        return Param(str(key), value, join(self.sp(key), value.span))

    def flag(self, c: list[Token]) -> Flag:
        (tok,) = c
        return Flag(str(tok), self.sp(tok))

    def default_opt(self, c: list[Token]) -> DefaultOpt:
        (tok,) = c
        return DefaultOpt(ir.Name(str(tok), self.sp(tok)))

    def handle_opt(self, c: list[Token]) -> HandleOpt:
        kw, tok = c
        span = self.sp(tok)
        major_text, _, minor_text = str(tok).partition(":")
        major, minor = int(major_text, 16), int(minor_text or "0", 16)
        if major == 0 or major == 0xFFFF:
            self.error(
                Diagnostic.error(
                    "E204", f"handle major {major:x} is reserved by the kernel; use 1-fffe", span
                )
            )
            return HandleOpt(str(kw), None, span)
        return HandleOpt(str(kw), ir.HandleRef(ir.Handle(major, minor), span), span)

    def priomap_opt(self, c: list[Token]) -> PriomapOpt:
        values = tuple(ir.Count(int(t), self.sp(t)) for t in c)
        return PriomapOpt(values, join(values[0].span, values[-1].span))

    # ---- matches ----
    def match(self, c: list[Any]) -> ir.Match:
        kw, *conds = c
        span = self.sp(kw)
        pref = None
        real: list[ir.Cond] = []
        for cond in conds:
            if isinstance(cond, ir.Count):
                if pref is not None:
                    first = Note("first given here", pref.span)
                    self.error(Diagnostic.error("E014", "'pref' is given twice", cond.span, first))
                pref = cond
            elif cond is not None:
                real.append(cond)
        last = real[-1].span if real else span
        return ir.Match(tuple(real), join(span, last), pref)

    def _network(self, tok: Token) -> ipaddress.IPv4Network | None:
        try:
            return ipaddress.IPv4Network(str(tok), strict=False)
        except ValueError:
            self.error(
                Diagnostic.error(
                    "E010", f"'{tok}' is not a valid IPv4 address or network", self.sp(tok)
                )
            )
            return None

    def address(self, c: list[Token]) -> tuple[ipaddress.IPv4Network, Span] | None:
        (tok,) = c
        net = self._network(tok)
        return None if net is None else (net, self.sp(tok))

    def address_ref(self, c: list[Token]) -> tuple[ipaddress.IPv4Network, Span] | None:
        (tok,) = c
        span = self.sp(tok)
        found = self.scope.constants.get(str(tok))
        if found is None:
            msg = f"unknown constant '{tok}'; expected an IPv4 address"
            self.error(Diagnostic.error("E103", msg, span))
            return None
        if not isinstance(found[0], Address):
            msg = f"'{tok}' is not an address constant; expected an IPv4 address"
            self.error(Diagnostic.error("E011", msg, span, Note(f"'{tok}' defined here", found[1])))
            return None
        return found[0].network, span

    def addr_cond(self, c: list[Any]) -> ir.AddrCond | None:
        fld, *addrs = c
        nets = tuple(a for a in addrs if a is not None)
        if len(nets) != len(addrs):
            return None
        return ir.AddrCond(str(fld), nets, join(self.sp(fld), nets[-1][1]))  # type: ignore[arg-type]

    def _port_number(self, text: str, span: Span) -> int | None:
        value = int(text)
        if value > 65535:
            self.error(Diagnostic.error("E207", f"port {value} is out of range 0-65535", span))
            return None
        return value

    def port(self, c: list[Token]) -> ir.PortValue | None:
        (tok,) = c
        span = self.sp(tok)
        value = self._port_number(str(tok), span)
        return None if value is None else ir.PortValue(value, value, None, span)

    def port_range(self, c: list[Token]) -> ir.PortValue | None:
        (tok,) = c
        span = self.sp(tok)
        lo_text, hi_text = str(tok).split("-")
        lo, hi = self._port_number(lo_text, span), self._port_number(hi_text, span)
        if lo is None or hi is None:
            return None
        if lo > hi:
            self.error(
                Diagnostic.error("E207", f"port range {lo}-{hi} is empty (start above end)", span)
            )
            return None
        return ir.PortValue(lo, hi, None, span)

    def port_mask(self, c: list[Token]) -> ir.PortValue | None:
        value_tok, mask_tok = c
        span = join(self.sp(value_tok), self.sp(mask_tok))
        value = self._port_number(str(value_tok), span)
        mask = int(str(mask_tok), 16)
        if value is None:
            return None
        if mask > 0xFFFF:
            self.error(
                Diagnostic.error("E207", f"port mask {mask_tok} is wider than 16 bits", span)
            )
            return None
        if value & ~mask:
            self.error(
                Diagnostic.error(
                    "E207",
                    f"port {value} has bits outside mask {mask_tok} (did you mean {value & mask}?)",
                    span,
                )
            )
            return None
        return ir.PortValue(value, value | (~mask & 0xFFFF), mask, span)

    def port_ref(self, c: list[Token]) -> ir.PortValue | None:
        (tok,) = c
        span = self.sp(tok)
        try:
            value = evaluate(Ref(str(tok), span), Dimension.COUNT, self.scope)
        except EvalError as err:
            self.error(err.diagnostic)
            return None
        assert not isinstance(value, ir.Percent)
        port = self._port_number(str(int(value[0])), span)
        return None if port is None else ir.PortValue(port, port, None, span)

    def port_cond(self, c: list[Any]) -> ir.PortCond | None:
        fld, *ports = c
        good = tuple(p for p in ports if p is not None)
        if len(good) != len(ports):
            return None
        return ir.PortCond(str(fld), good, join(self.sp(fld), good[-1].span))  # type: ignore[arg-type]

    def proto_name(self, c: list[Token]) -> tuple[int, Span] | None:
        (tok,) = c
        number = PROTOCOLS.get(str(tok).lower())
        if number is None:
            known = ", ".join(PROTOCOLS)
            self.error(
                Diagnostic.error(
                    "E015",
                    f"unknown protocol '{tok}'; use a number or one of {known}",
                    self.sp(tok),
                )
            )
            return None
        return number, self.sp(tok)

    def proto_number(self, c: list[Token]) -> tuple[int, Span] | None:
        (tok,) = c
        if int(tok) > 255:
            self.error(
                Diagnostic.error(
                    "E015", f"protocol number {tok} is out of range 0-255", self.sp(tok)
                )
            )
            return None
        return int(tok), self.sp(tok)

    def proto_cond(self, c: list[Any]) -> ir.ProtoCond | None:
        good = tuple(p for p in c if p is not None)
        if len(good) != len(c):
            return None
        return ir.ProtoCond(good, join(good[0][1], good[-1][1]))

    def _mask_bits(
        self, toks: list[Token], width: int, default_mask: int
    ) -> tuple[int, int, Span] | None:
        span = join(self.sp(toks[0]), self.sp(toks[-1]))
        nums = [int(str(t), 0) for t in toks]
        value, mask = nums[0], nums[1] if len(nums) > 1 else default_mask
        limit = (1 << width) - 1
        if value > limit or mask > limit:
            self.error(
                Diagnostic.error("E016", f"value {toks[0]} does not fit in {width} bits", span)
            )
            return None
        if value & ~mask:
            self.error(
                Diagnostic.error("E016", f"value {value:#x} has bits outside mask {mask:#x}", span)
            )
            return None
        return value, mask, span

    def tos_cond(self, c: list[Token]) -> ir.TosCond | None:
        bits = self._mask_bits(c, 8, 0xFF)
        return None if bits is None else ir.TosCond(bits[0], bits[1], bits[2])

    def dscp_cond(self, c: list[Token]) -> ir.TosCond | None:
        (tok,) = c
        span = self.sp(tok)
        if tok.type == "NAME":
            dscp = DSCP_NAMES.get(str(tok).lower())
            if dscp is None:
                self.error(
                    Diagnostic.error(
                        "E016", f"unknown DSCP name '{tok}'; use 0-63, ef, afXY or csN", span
                    )
                )
                return None
        else:
            dscp = int(tok)
            if dscp > 63:
                self.error(Diagnostic.error("E016", f"DSCP {dscp} is out of range 0-63", span))
                return None
        return ir.TosCond(dscp << 2, 0xFC, span, dscp)

    def tcp_ack(self, c: list[Token]) -> ir.TcpAckCond:
        (tok,) = c
        return ir.TcpAckCond(self.sp(tok))

    def raw_cond(self, c: list[Token]) -> ir.RawCond | None:
        size, *bits, at = c
        width = int(str(size)[1:])
        parsed = self._mask_bits(bits, width, (1 << width) - 1)
        if parsed is None:
            return None
        offset = int(at)
        span = join(self.sp(size), self.sp(at))
        # tc aligns keys silently: u16 at 1 would match bytes 0-1, u32 at 2 is refused.
        align = {8: 1, 16: 2, 32: 4}[width]
        if offset % align:
            what = "an even offset" if width == 16 else "an offset that is a multiple of 4"
            self.error(Diagnostic.error("E016", f"a u{width} key must start at {what}", span))
            return None
        return ir.RawCond(width, parsed[0], parsed[1], offset, span)  # type: ignore[arg-type]

    def all_cond(self, c: list[Token]) -> ir.AllCond:
        (tok,) = c
        return ir.AllCond(self.sp(tok))

    def pref(self, c: list[Token]) -> ir.Count | None:
        (tok,) = c
        value = int(tok)
        if not 1 <= value <= 0xFFFF:
            self.error(
                Diagnostic.error(
                    "E207", f"filter pref {value} is out of range 1-65535", self.sp(tok)
                )
            )
            return None
        return ir.Count(value, self.sp(tok))

    # ---- blocks ----
    def body(self, c: list[Any]) -> Body:
        return Body(tuple(c))

    def classify(self, c: list[Any]) -> ir.Marking:
        kw, (name, span), *rest = c
        self._check_ifname(name, span)
        chain = None
        if rest:
            tok = rest[0]
            chain = str(tok)[1:-1] if tok.type == "STRING" else str(tok)
            if (
                not chain
                or len(chain) > 28
                or chain[0] in "-!"
                or any(ch.isspace() for ch in chain)
            ):
                self.error(
                    Diagnostic.error(
                        "E009", f"'{chain}' is not a valid iptables chain name", self.sp(tok)
                    )
                )
                chain = None
        return ir.Marking(name, join(self.sp(kw), span), chain)

    def chain_name(self, c: list[Token]) -> Token:
        return c[0]

    def class_decl(self, c: list[Any]) -> ClassSyntax:
        name, *rest = c
        body: tuple[Any, ...] = ()
        if rest and isinstance(rest[-1], Body):
            body = rest.pop().items
        return ClassSyntax(str(name), self.sp(name), tuple(rest), body)

    def qdisc(self, c: list[Any]) -> QdiscSyntax:
        kind_tok, *rest = c
        kind = str(kind_tok)
        body: tuple[Any, ...] | None = None
        if rest and isinstance(rest[-1], Body):
            body = rest.pop().items
        return QdiscBuilder(self, kind, self.sp(kind_tok), tuple(rest), body).build()


class QdiscBuilder:
    """Turn one qdisc's options and body into its IR node (and its classes)."""

    def __init__(
        self, b: Builder, kind: str, span: Span, opts: tuple[Opt, ...], body: tuple[Any, ...] | None
    ):
        self.b, self.kind, self.span, self.opts, self.body = b, kind, span, opts, body

    def error(self, d: Diagnostic) -> None:
        self.b.error(d)

    def _values(
        self,
        opts: Iterable[Opt],
        params: Mapping[str, Dimension],
        flags: frozenset[str],
        what: str,
        percent: frozenset[str] = frozenset(),
        handle_kw: str = "handle",
    ) -> tuple[dict[str, Any], HandleRef | None, list[ir.Match]]:
        values: dict[str, Any] = {}
        seen: dict[str, Span] = {}
        handle: ir.HandleRef | None = None
        matches: list[ir.Match] = []
        for opt in opts:
            if isinstance(opt, ir.Match):
                matches.append(opt)
                continue
            key = _opt_key(opt)
            span = opt.name.span if isinstance(opt, DefaultOpt) else opt.span
            if key in seen:
                self.error(
                    Diagnostic.error(
                        "E014", f"'{key}' is given twice", span, Note("first given here", seen[key])
                    )
                )
                continue
            seen[key] = span
            if isinstance(opt, HandleOpt):
                if opt.keyword != handle_kw:
                    self.error(
                        Diagnostic.error(
                            "E007", f"{what} takes '{handle_kw}', not '{opt.keyword}'", span
                        )
                    )
                else:
                    handle = opt.ref
                continue
            if isinstance(opt, Flag):
                if opt.key not in flags:
                    self._unknown(opt.key, span, params, flags, what)
                else:
                    values[opt.key] = True
                continue
            if isinstance(opt, DefaultOpt | PriomapOpt):
                if key not in params:
                    self._unknown(key, span, params, flags, what)
                else:
                    values[key] = opt.name if isinstance(opt, DefaultOpt) else opt.values
                continue
            dim = params.get(opt.key)
            if dim is None:
                self._unknown(opt.key, span, params, flags, what)
                continue
            values[opt.key] = self._value(opt, dim, opt.key in percent)
        return values, handle, matches

    def _value(self, opt: Param, dim: Dimension, percent: bool) -> Any:
        try:
            result = evaluate(opt.value, dim, self.b.scope, percent=percent)
        except EvalError as err:
            self.error(err.diagnostic)
            return None
        if isinstance(result, ir.Percent):
            if dim is Dimension.COUNT and result.value > 100:
                self.error(Diagnostic.error("E208", f"{result.value}% is above 100%", result.span))
                return None
            return result
        number, byte_units = result
        value = int(number)  # truncates, as tc does
        span = opt.value.span
        match dim:
            case Dimension.RATE:
                return ir.Rate(value, span, byte_units)
            case Dimension.SIZE:
                return ir.Size(value, span)
            case Dimension.TIME:
                return ir.Time(value, span)
            case Dimension.COUNT:
                if number != value:
                    self.error(
                        Diagnostic.error(
                            "E011", f"expected a whole number, found {float(number):g}", span
                        )
                    )
                    return None
                return ir.Count(value, span)

    def _unknown(
        self,
        key: str,
        span: Span,
        params: Mapping[str, Dimension],
        flags: frozenset[str],
        what: str,
    ) -> None:
        accepted = sorted({*params, *flags})
        takes = f"; it takes {', '.join(accepted)}" if accepted else "; it takes no parameters"
        self.error(Diagnostic.error("E007", f"'{key}' is not a parameter of {what}{takes}", span))

    # ---- qdiscs ----
    def build(self) -> QdiscSyntax:
        kind = self.kind
        pct = NETEM_PERCENT if kind == "netem" else frozenset()
        values, handle, matches = self._values(
            self.opts,
            {
                **QDISC_PARAMS[kind],
                **({"default": C} if kind == "htb" else {}),
                **({"priomap": C} if kind == "prio" else {}),
            },
            QDISC_FLAGS[kind],
            f"{kind}",
            pct | (PERCENT_OK if kind == "htb" else frozenset()),
        )
        for m in matches:
            self.error(Diagnostic.error("E017", "a match belongs inside a class", m.span))
        classes: list[ClassSyntax] = []
        children: list[QdiscSyntax] = []
        classify: list[ir.Marking] = []
        for item in self.body or ():
            if isinstance(item, ClassSyntax):
                classes.append(item)
            elif isinstance(item, QdiscSyntax):
                children.append(item)
                classify.extend(item.classify)
            elif isinstance(item, ir.Match):
                self.error(Diagnostic.error("E017", "a match belongs inside a class", item.span))
            elif isinstance(item, ir.Marking):
                classify.append(item)
        if self.body is not None and kind not in CLASSFUL | CHAINING:
            self.error(
                Diagnostic.error("E018", f"{kind} is classless and takes no block", self.span)
            )
        if kind in CLASSFUL:
            for nested in children:
                self.error(
                    Diagnostic.error(
                        "E018",
                        f"a qdisc inside {kind} must be the leaf of a class",
                        nested.qdisc.span,
                    )
                )
        elif classes:
            for cls in classes:
                self.error(
                    Diagnostic.error(
                        "E018", f"{kind} has no classes; 'class' needs htb, prio or cbq", cls.span
                    )
                )
        child: ir.Qdisc | None = None
        if kind in CHAINING:
            if len(children) > 1:
                self.error(
                    Diagnostic.error(
                        "E018", f"{kind} holds at most one child qdisc", children[1].qdisc.span
                    )
                )
            child = children[0].qdisc if children else None
        built = [self.klass(c) for c in classes] if kind in CLASSFUL else []
        q = self._make(kind, values, handle, tuple(built), child)
        return QdiscSyntax(q, tuple(classify))

    def _make(
        self,
        kind: str,
        v: dict[str, Any],
        handle: ir.HandleRef | None,
        classes: tuple[ir.Class, ...],
        child: ir.Qdisc | None,
    ) -> ir.Qdisc:
        span = self.span
        if handle is not None and handle.handle.minor != 0:
            self.error(
                Diagnostic.error(
                    "E204",
                    f"a qdisc handle has no minor part; write {handle.handle.qdisc}",
                    handle.span,
                )
            )
            handle = None
        match kind:
            case "htb":
                link = {k: v[k] for k in LINK_PARAMS if v.get(k) is not None}
                if link:
                    if "rate" not in link:
                        self.error(
                            Diagnostic.error(
                                "E019", "the interface's link class needs a rate", span
                            )
                        )
                    classes = (ir.Class("", span, children=classes, implicit=True, **link),)
                return ir.Htb(span, v.get("default"), v.get("r2q"), classes, handle)
            case "prio":
                return ir.Prio(span, v.get("bands"), v.get("priomap"), classes, handle)
            case "cbq":
                return ir.Cbq(span, v.get("bandwidth"), v.get("avpkt"), classes, handle)
            case "tbf":
                burst = v.get("burst")
                if burst is not None and v.get("buffer") is not None:
                    self.error(
                        Diagnostic.error(
                            "E014", "'buffer' and 'burst' are the same parameter", v["buffer"].span
                        )
                    )
                burst = burst or v.get("buffer")
                return ir.Tbf(
                    span,
                    v.get("rate"),
                    burst,
                    v.get("latency"),
                    v.get("limit"),
                    v.get("peakrate"),
                    v.get("mtu"),
                    child,
                    handle,
                )
            case "netem":
                return ir.Netem(
                    span,
                    v.get("delay"),
                    v.get("jitter"),
                    v.get("loss"),
                    v.get("duplicate"),
                    v.get("corrupt"),
                    v.get("limit"),
                    v.get("rate"),
                    child,
                    handle,
                )
            case "sfq":
                return ir.Sfq(
                    span,
                    v.get("perturb"),
                    v.get("quantum"),
                    v.get("limit"),
                    v.get("depth"),
                    v.get("divisor"),
                    handle,
                )
            case "fq_codel":
                ecn = True if v.get("ecn") else (False if v.get("noecn") else None)
                return ir.FqCodel(
                    span,
                    v.get("limit"),
                    v.get("flows"),
                    v.get("target"),
                    v.get("interval"),
                    v.get("quantum"),
                    v.get("memory_limit"),
                    ecn,
                    handle,
                )
            case "pfifo":
                return ir.Pfifo(span, v.get("limit"), handle)
            case "bfifo":
                return ir.Bfifo(span, v.get("limit"), handle)
            case _:
                return ir.PfifoFast(span, handle)

    def klass(self, syn: ClassSyntax) -> ir.Class:
        kind = self.kind
        values, handle, matches = self._values(
            syn.opts,
            CLASS_PARAMS[kind],
            CLASS_FLAGS[kind],
            f"{'an' if kind == 'htb' else 'a'} {kind} class",
            PERCENT_OK if kind != "prio" else frozenset(),
            handle_kw="id",
        )
        children: list[ir.Class] = []
        leaves: list[ir.Qdisc] = []
        for item in syn.body:
            if isinstance(item, ClassSyntax):
                children.append(self.klass(item))
            elif isinstance(item, ir.Match):
                matches.append(item)
            elif isinstance(item, QdiscSyntax):
                leaves.append(item.qdisc)
                for m in item.classify:
                    self.error(
                        Diagnostic.error(
                            "E014", "'classify' belongs at the top of an interface", m.span
                        )
                    )
            elif isinstance(item, ir.Marking):
                self.error(
                    Diagnostic.error(
                        "E014", "'classify' belongs at the top of an interface", item.span
                    )
                )
        if kind == "prio" and children:
            self.error(
                Diagnostic.error("E018", "prio classes cannot have child classes", children[0].span)
            )
            children = []
        if len(leaves) > 1:
            self.error(
                Diagnostic.error(
                    "E018", f"{syn_label(syn)} has more than one leaf qdisc", leaves[1].span
                )
            )
        if leaves and children:
            self.error(
                Diagnostic.error(
                    "E018",
                    f"{syn_label(syn)} has child classes, so it cannot have a leaf qdisc",
                    leaves[0].span,
                )
            )
        flags = {k: values.pop(k, False) for k in ("bounded", "isolated")}
        fields = {k: val for k, val in values.items() if val is not None}
        return ir.Class(
            syn.name,
            syn.span,
            explicit_id=handle,
            matches=tuple(matches),
            children=tuple(children),
            leaf=leaves[0] if leaves else None,
            **flags,
            **fields,
        )


def _opt_key(opt: Param | Flag | DefaultOpt | HandleOpt | PriomapOpt) -> str:
    match opt:
        case Param() | Flag():
            return opt.key
        case DefaultOpt():
            return "default"
        case HandleOpt():
            return opt.keyword
        case PriomapOpt():
            return "priomap"


def syn_label(syn: ClassSyntax) -> str:
    return f"class '{syn.name}'"


HandleRef = ir.HandleRef

# ---- reading files -----------------------------------------------------------------------------


@functools.cache
def _grammar_text() -> str:
    from importlib import resources

    return resources.files("tcdsl.grammar").joinpath("tcdsl.lark").read_text()


MAX_INCLUDE_DEPTH = 32


class Reader:
    """Read a policy file and its includes; collect interfaces, diagnostics and sources."""

    def __init__(self, loader: Callable[[str], str] | None = None) -> None:
        self.scope = Scope()
        self.diagnostics: list[Diagnostic] = []
        self.sources: dict[str, str] = {}
        self.stack: list[str] = []
        self.loader = loader or (lambda p: Path(p).read_text(encoding="utf-8"))

    def read(self, path: str, include_span: Span | None = None) -> list[ir.Interface]:
        """Parse ``path``; report problems at ``include_span`` when it cannot be read."""
        if path in self.stack or len(self.stack) >= MAX_INCLUDE_DEPTH:
            assert include_span is not None
            if path in self.stack:
                msg = f"include cycle: {' -> '.join([*self.stack, path])}"
            else:
                msg = f"includes nest more than {MAX_INCLUDE_DEPTH} deep"
            self.diagnostics.append(Diagnostic.error("E006", msg, include_span))
            return []
        try:
            text = self.loader(path)
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            span = include_span or Span(path, 1, 1, 1, 1)
            self.diagnostics.append(
                Diagnostic.error("E006", f"cannot read '{path}': {reason.lower()}", span)
            )
            return []
        return self.read_text(path, text)

    def read_text(self, path: str, text: str) -> list[ir.Interface]:
        """Parse ``text`` as the file ``path``."""
        self.sources[path] = text
        self.stack.append(path)
        builder = Builder(self, path)
        try:
            _parser(builder).parse(text)
        except UnexpectedInput as err:
            self.diagnostics.append(syntax_error(err, path, text))
        finally:
            self.stack.pop()
        return builder.interfaces


def _parser(builder: Builder) -> Lark:
    return Lark(
        _grammar_text(),
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

    digest = hashlib.sha256(_grammar_text().encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"tcdsl-grammar-{digest}.lark-cache")


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
