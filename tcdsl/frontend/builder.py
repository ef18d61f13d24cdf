"""The Lark Transformer that builds the IR during the LALR parse; rule methods are named after
grammar rules. Constants are resolved as they are read, values evaluated as they are used."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import zlib
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from lark import Token, Transformer

from tcdsl import ir
from tcdsl.addresses import ipv4_network
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend import tables
from tcdsl.frontend.chains import chain_name_problem
from tcdsl.frontend.mq import MqQueueSyntax, build_mq, mq_queue, spread
from tcdsl.frontend.qdiscs import QdiscBuilder, param_dimensions
from tcdsl.frontend.recovery import line_starts, span_offset
from tcdsl.frontend.syntax import (
    DSCP_NAMES,
    PROTOCOLS,
    Body,
    ClassSyntax,
    CurveOpt,
    DefaultOpt,
    Flag,
    HandleOpt,
    Param,
    PoliceSyntax,
    PriomapOpt,
    QdiscSyntax,
    SetDscpOpt,
    suggestion,
)
from tcdsl.frontend.values import (
    Address,
    Bin,
    EvalError,
    Lit,
    Pct,
    Ref,
    Scope,
    decimal_comma,
    evaluate,
    join,
    parse_decimal,
    parse_int,
    refs,
    size_in_bits,
    spaced_unit,
)
from tcdsl.units import Dimension

if TYPE_CHECKING:
    from tcdsl.frontend.reader import Reader


POLICE_PARAMS = {"rate": Dimension.RATE, "burst": Dimension.SIZE, "mtu": Dimension.SIZE}
IFB_PREFIX = "ifb4"


def ifb_name_for(interface: str) -> str:
    """The IFB a download of ``interface`` is shaped on when the policy names none:
    ``ifb4eth0``, or (when that would pass Linux's 15 bytes) ``ifb`` and a checksum of the name."""
    name = IFB_PREFIX + interface
    if len(name.encode()) <= 15:
        return name
    return f"ifb{zlib.crc32(interface.encode()):08x}"


def _ipv4_network(text: str) -> ipaddress.IPv4Network | None:
    """``IPv4Network(text, strict=False)`` for the usual ``IPV4`` token (four octets, maybe a
    prefix length), from its numbers, which ipaddress takes in a third of the time; None when
    ipaddress should read it (and tell what is wrong): an octet above 255 or with a leading
    zero, a prefix above 32."""
    address, _, prefix = text.partition("/")
    number = 0
    for octet in address.split("."):
        if len(octet) > 1 and octet[0] == "0":
            return None
        value = int(octet)
        if value > 255:
            return None
        number = number << 8 | value
    length = int(prefix) if prefix else 32
    if length > 32:
        return None
    return ipv4_network(number, length)


@dataclasses.dataclass(frozen=True, slots=True)
class TreeOpts:
    """A tree's ``family`` and ``classifier`` (an interface's, or a direction's own)."""

    family: ir.FamilySpec | None = None
    classifier: ir.Classifier = "u32"
    classifier_span: Span | None = None
    u32_linear: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Via:
    """``via NAME`` on a download."""

    name: tuple[str, Span]


# ---- the transformer ---------------------------------------------------------------------------


class Builder(Transformer[Token, Any]):
    """Build IR during the LALR parse; rule methods are named after grammar rules."""

    def __init__(self, reader: Reader, file: str) -> None:
        super().__init__()
        self.reader = reader
        self.file = file
        self.interfaces: list[ir.Interface] = []
        self.pending: dict[int, tuple[ir.Class, tables.Pending]] = {}
        """The stand-ins of subscribers statements, until their tree is built."""
        self.unspread: dict[int, tuple[ir.Mq, ir.Qdisc]] = {}
        """The ``mq queues N`` (by id) and the tree each spreads, until the interface's tree
        is built (``_tree``): its label says which queue each live class is on, and a
        subscribers statement among the top-level classes is classes by then."""
        self._line_starts: dict[str, list[int]] = {}
        """Where each line of a file starts (:meth:`source_at`)."""

    @property
    def scope(self) -> Scope:
        return self.reader.scope

    def error(self, d: Diagnostic) -> None:
        self.reader.diagnostics.append(d)

    def eval_error(self, err: EvalError, value: Span | None = None) -> None:
        """Report a value that could not be evaluated (not if an earlier error caused it, nor
        for the '1' of '1,5mbit', or the '2' of '2 * 1,5mbit', whose syntax error tells to
        write '1.5mbit'). ``value``: the span of the whole value written."""
        said = err.diagnostic
        follow_on = err.follow_on or (
            said.code == "E004" and self._before_split_value(value or said.span)
        )
        (self.reader.follow_ons if follow_on else self.reader.diagnostics).append(said)

    def source_at(self, span: Span) -> tuple[str, int] | None:
        """The text of ``span``'s file and where ``span`` starts in it (None for a file not
        read); each file's line starts found once (only errors ask)."""
        text = self.reader.sources.get(span.file)
        if text is None:
            return None
        starts = self._line_starts.get(span.file)
        if starts is None:
            starts = self._line_starts[span.file] = line_starts(text)
        return text, span_offset(starts, span)

    def _before_split_value(self, span: Span) -> bool:
        """Whether a decimal comma (1,5mbit) or a blank and a unit (10 mbit) follow ``span``."""
        found = self.source_at(span)
        if found is None or span.end_line != span.line:
            return False
        text, start = found
        end = start + span.end_column - span.column
        if decimal_comma(text, end) is not None:
            return True
        unit = len(text) - len(text[end:].lstrip(" \t"))  # where a unit after a blank is
        return unit > end and spaced_unit(text, unit, param_dimensions) is not None

    def sp(self, token: Token) -> Span:
        """``span_of(token, self.file)``, written out: the parse makes one for most tokens."""
        line = token.line or 1
        column = token.column or 1
        return Span(
            self.file,
            line,
            column,
            token.end_line or line,
            token.end_column or column + len(str(token)),
        )

    def sp_to(self, token: Token, end: Span) -> Span:
        """``join(self.sp(token), end)``: from ``token`` to the end of ``end``."""
        return Span(self.file, token.line or 1, token.column or 1, end.end_line, end.end_column)

    # ---- top level ----
    def const_decl(self, c: list[Any]) -> None:
        name, value = c
        span = self.sp(name)
        if str(name) in self.scope.constants:
            prev = self.scope.constants[str(name)][1]
            self.scope.broken.setdefault(str(name), span)
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
            if net is None:  # said why; its uses say nothing more
                self.scope.broken.setdefault(str(name), span)
                return
            self.scope.constants[str(name)] = (Address(net, self.sp(value)), span)
            return
        unknown = [r for r in refs(value) if r.name not in self.scope.constants]
        if unknown:  # evaluated at each use, it would see later constants, or itself
            ref = unknown[0]
            why = (
                "refers to itself"
                if ref.name == str(name)
                else f"uses '{ref.name}', which is not defined before it"
            )
            if "-" in ref.name:
                why += f" (to subtract, put spaces around '-': {ref.name.replace('-', ' - ')})"
            said = ref.name in self.scope.broken  # that constant's own error says it
            self.scope.broken.setdefault(str(name), span)
            if said:
                return
            msg = f"constant '{name}' {why}; constants must be defined before they are used"
            self.error(Diagnostic.error("E103", msg, ref.span))
            return
        self.scope.constants[str(name)] = (value, span)

    def include(self, c: list[Token]) -> None:
        (path_token,) = c
        target = self._file(path_token, "policy")
        if target is not None:
            self.interfaces.extend(self.reader.read(target, self.sp(path_token)))

    def _file(self, path_token: Token, kind: str) -> str | None:
        """The file a quoted name names, relative to this file's folder; None (E024) for an
        empty name (which would name that folder)."""
        name = str(path_token)[1:-1]
        if not name:
            msg = f"an empty file name names no file; give the {kind}'s path"
            self.error(Diagnostic.error("E024", msg, self.sp(path_token)))
            return None
        return os.path.normpath(os.path.join(os.path.dirname(self.file), name))

    def interface(self, c: list[Any]) -> None:
        (name, name_span), *opts, body = c
        self._check_ifname(name, name_span)
        outer = self._tree_opts(opts, TreeOpts())
        if isinstance(body, QdiscSyntax):
            self.interfaces.append(self._tree(name, name_span, body, outer, label=name))
            return
        if not body:
            # (found by a tester: W308 said the file had no 'interface' statement)
            self.error(
                Diagnostic.warning(
                    "W308",
                    f"interface '{name}' has an empty block: nothing is shaped on it; write "
                    "its upload, download or ingress in the block",
                    name_span,
                )
            )
        seen: dict[str, Span] = {}
        for kw, span, item, own in body:
            if kw in seen:
                first = Note("first given here", seen[kw])
                self.error(Diagnostic.error("E014", f"'{kw}' is given twice", span, first))
                continue
            seen[kw] = span
            here = self._tree_opts(own, outer)
            if kw == "upload":
                self.interfaces.append(
                    self._tree(name, name_span, item, here, "upload", label=name)
                )
            elif kw == "ingress":
                self.interfaces.append(
                    ir.Interface(
                        name,
                        span,
                        item,
                        direction="ingress",
                        family=here.family,
                        classifier=here.classifier,
                        classifier_span=here.classifier_span,
                        u32_linear=here.u32_linear,
                    )
                )
            else:
                via, connmark, q = item
                ifb_name, ifb_span = via if via is not None else (ifb_name_for(name), None)
                if ifb_span is not None:
                    self._check_ifname(ifb_name, ifb_span)
                label = ir.tree_label(ifb_name, "download", name)
                tree = self._tree(ifb_name, span, q, here, "download", label)
                download = ir.Download(name, span, connmark, ifb_span)
                self.interfaces.append(
                    dataclasses.replace(tree, direction="download", download=download)
                )
        if "download" in seen and "ingress" in seen:
            self.error(
                Diagnostic.error(
                    "E251",
                    f"interface '{name}' has both 'download' and 'ingress': the download's "
                    "redirect needs the interface's ingress qdisc; police downloads with "
                    "'police' on the download's matches instead",
                    seen["ingress"],
                    Note("the download is here", seen["download"]),
                )
            )

    def spread_root(self, root: ir.Qdisc, label: str) -> ir.Qdisc:
        """``root`` spread over its queues if it is an ``mq queues N`` not spread yet; the
        tree's ``label`` says which queue each class of the live policy is on."""
        if not isinstance(root, ir.Mq) or id(root) not in self.unspread:
            return root
        _, tree = self.unspread.pop(id(root))
        assert root.shards is not None
        live = self.reader.queues.get(label)
        return ir.replace(root, queues=spread(self, tree, root.shards, live))

    def _tree_opts(self, items: list[Any], outer: TreeOpts) -> TreeOpts:
        """The ``family`` and ``classifier`` given in ``items``; what is not given comes from
        ``outer`` (a direction inherits the interface's)."""
        family: ir.FamilySpec | None = None
        classifier: tuple[ir.Classifier, Span, bool] | None = None
        for item in items:
            if isinstance(item, ir.FamilySpec):
                if family is not None:
                    first = Note("first given here", family.span)
                    msg = "'family' is given twice"
                    self.error(Diagnostic.error("E014", msg, item.span, first))
                family = item
            else:
                if classifier is not None:
                    first = Note("first given here", classifier[1])
                    msg = "'classifier' is given twice"
                    self.error(Diagnostic.error("E014", msg, item[1], first))
                classifier = item
        if classifier is None:
            return TreeOpts(
                family if family is not None else outer.family,
                outer.classifier,
                outer.classifier_span,
                outer.u32_linear,
            )
        return TreeOpts(family if family is not None else outer.family, *classifier)

    def family_opt(self, c: list[Token]) -> ir.FamilySpec:
        kw, name = c
        span = join(self.sp(kw), self.sp(name))
        if str(name) == "both":
            return ir.FamilySpec(ir.FAMILIES, span)
        return ir.FamilySpec((str(name),), span)  # type: ignore[arg-type]

    family_cond = family_opt

    def classifier_opt(self, c: list[Token]) -> tuple[ir.Classifier, Span, bool]:
        kw, name, *linear = c
        span = join(self.sp(kw), self.sp(linear[0] if linear else name))
        if linear and str(name) != "u32":
            msg = "'linear' is a layout of u32 filters; flower filters have a pref each"
            self.error(Diagnostic.error("E014", msg, self.sp(linear[0])))
            linear = []
        return str(name), span, bool(linear)  # type: ignore[return-value]

    def _tree(
        self,
        name: str,
        span: Span,
        q: QdiscSyntax,
        opts: TreeOpts,
        direction: tables.Direction | None = None,
        label: str = "",
    ) -> ir.Interface:
        root = q.qdisc
        if self.pending:
            by_mark = q.classify[0] if q.classify else None
            root = tables.expand_tree(self, root, direction, name, by_mark, opts.family, label)
        root = self.spread_root(root, label)
        for extra in q.classify[1:]:
            self.error(
                Diagnostic.error(
                    "E014",
                    "'classify' is given twice",
                    extra.span,
                    Note("first given here", q.classify[0].span),
                )
            )
        marking = q.classify[0] if q.classify else None
        return ir.Interface(
            name,
            span,
            root,
            marking,
            stab=q.stab,
            family=opts.family,
            classifier=opts.classifier,
            classifier_span=opts.classifier_span,
            u32_linear=opts.u32_linear,
        )

    def directions(self, c: list[Any]) -> list[tuple[str, Span, Any]]:
        return c

    def upload(self, c: list[Any]) -> tuple[str, Span, Any, list[Any]]:
        kw, *opts, q = c
        return "upload", self.sp(kw), q, opts

    def download(self, c: list[Any]) -> tuple[str, Span, Any, list[Any]]:
        kw, *rest, q = c
        via = next((r for r in rest if isinstance(r, Via)), None)
        connmark = any(isinstance(r, Token) and r.type == "CONNMARK" for r in rest)
        opts = [r for r in rest if not isinstance(r, Via | Token)]
        return "download", self.sp(kw), (via.name if via else None, connmark, q), opts

    def via(self, c: list[Any]) -> Via:
        (found,) = c
        return Via(found)

    def ingress(self, c: list[Any]) -> tuple[str, Span, ir.Ingress, list[Any]]:
        kw, *items = c
        span = self.sp(kw)
        matches = [m for m in items if isinstance(m, ir.Match)]
        opts = [m for m in items if not isinstance(m, ir.Match)]
        for m in matches:
            # (a police that failed said why: found by a tester, 'police rate 1mbit' without
            # its burst was told it needs 'police' too)
            if m.police is None and not m.broken:
                self.error(
                    Diagnostic.error(
                        "E252",
                        "a match on ingress needs 'police': the ingress qdisc has no classes, "
                        "so a match without a policer does nothing",
                        m.span,
                    )
                )
        return "ingress", span, ir.Ingress(span, tuple(matches)), opts

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
    def _whole(self, text: str, span: Span) -> int | None:
        """A whole number (decimal or 0x hex), or None after reporting one too long."""
        try:
            return parse_int(text, span)
        except EvalError as err:
            self.error(err.diagnostic)
            return None

    def _decimal(self, text: str, span: Span) -> Fraction | int:
        """A decimal number; one too long is reported, and read as 1 to go on."""
        try:
            return parse_decimal(text, span)
        except EvalError as err:
            self.error(err.diagnostic)
            return 1

    def quantity(self, c: list[Token]) -> Lit:
        (tok,) = c
        text = str(tok)
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        span = self.sp(tok)
        return Lit(self._decimal(digits, span), text[len(digits) :], text, span)

    def number(self, c: list[Token]) -> Lit:
        (tok,) = c
        text = str(tok)
        span = self.sp(tok)
        if text.lower().startswith("0x"):
            value: Fraction | int = self._whole(text, span) or 0
        else:
            value = self._decimal(text, span)
        return Lit(value, None, text, span)

    def percent(self, c: list[Token]) -> Pct:
        (tok,) = c
        span = self.sp(tok)
        return Pct(Fraction(self._decimal(str(tok)[:-1], span)), span)

    def ref(self, c: list[Token]) -> Ref:
        (tok,) = c
        return Ref(str(tok), self.sp(tok))

    def _bin(self, op: Literal["+", "-", "/"], c: list[Any]) -> Bin:
        left, right = c
        if isinstance(right, Token):
            right = self.number([right])
        return Bin(op, left, right, join(left.span, right.span))

    def add(self, c: list[Any]) -> Bin:
        return self._bin("+", c)

    def sub(self, c: list[Any]) -> Bin:
        return self._bin("-", c)

    def mul(self, c: list[Any]) -> Bin:
        left, right = c
        if isinstance(right, Token):
            right = self.number([right])
        if _plain(right):
            return Bin("*", left, right, join(left.span, right.span))
        if _plain(left):  # 1.05 * max: the number on the left
            return Bin("*", right, left, join(left.span, right.span))
        span = join(left.span, right.span)
        self.error(
            Diagnostic.error(
                "E011",
                "a product needs a plain number on one side (such as 'max * 1.05' or '2 * 10mbit')",
                span,
            )
        )
        return Bin("*", left, Lit(1, None, "1", right.span), span)

    def div(self, c: list[Any]) -> Bin:
        return self._bin("/", c)

    # ---- options ----
    def param(self, c: list[Any]) -> Param:
        key, value = c
        return Param(str(key), value, self.sp_to(key, value.span))

    def flag(self, c: list[Token]) -> Flag:
        (tok,) = c
        return Flag(str(tok), self.sp(tok))

    def curve(self, c: list[Any]) -> CurveOpt:
        kw, parts = c
        return CurveOpt(str(kw), parts, join(self.sp(kw), parts[-1].span))

    def curve_slopes(self, c: list[Any]) -> tuple[Param, ...]:
        return tuple(self.param([k, v]) for k, v in zip(c[::2], c[1::2], strict=True))

    curve_umax = curve_slopes

    def default_opt(self, c: list[Token]) -> DefaultOpt:
        (tok,) = c
        return DefaultOpt(ir.Name(str(tok), self.sp(tok)))

    def handle_opt(self, c: list[Token]) -> HandleOpt:
        kw, tok = c
        span = self.sp(tok)
        major_text, _, minor_text = str(tok).partition(":")
        major, minor = int(major_text, 16), int(minor_text or "0", 16)
        if major > 0xFFFF or minor > 0xFFFF:  # (tc takes leading zeros: 1:0010 is 1:10)
            part = "major" if major > 0xFFFF else "minor"
            self.error(
                Diagnostic.error(
                    "E204",
                    f"{'class id' if str(kw) == 'id' else 'handle'} {part} "
                    f"{major if part == 'major' else minor:x} is above ffff, the "
                    "largest the kernel takes (majors and minors are 16 bits, in hex)",
                    span,
                )
            )
            return HandleOpt(str(kw), None, span)
        if major == 0 or major == 0xFFFF:
            self.error(
                Diagnostic.error(
                    "E204", f"handle major {major:x} is reserved by the kernel; use 1-fffe", span
                )
            )
            return HandleOpt(str(kw), None, span)
        return HandleOpt(str(kw), ir.HandleRef(ir.Handle(major, minor), span), span)

    def priomap_opt(self, c: list[Token]) -> PriomapOpt:
        values = tuple(ir.Count(self._whole(t, self.sp(t)) or 0, self.sp(t)) for t in c)
        return PriomapOpt(values, join(values[0].span, values[-1].span))

    # ---- matches ----
    def match(self, c: list[Any]) -> ir.Match:
        kw, *conds = c
        span = self.sp(kw)
        pref = None
        police = None
        family: ir.FamilySpec | None = None
        real: list[ir.Cond] = []
        broken = False
        for cond in conds:
            if isinstance(cond, ir.FamilySpec):
                if family is not None:
                    first = Note("first given here", family.span)
                    msg = "'family' is given twice"
                    self.error(Diagnostic.error("E014", msg, cond.span, first))
                family = cond
            elif isinstance(cond, ir.Count):
                if pref is not None:
                    first = Note("first given here", pref.span)
                    self.error(Diagnostic.error("E014", "'pref' is given twice", cond.span, first))
                pref = cond
            elif isinstance(cond, PoliceSyntax):
                police = self._police(cond)
                broken |= police is None  # (reported where it failed)
            elif cond is not None:
                real.append(cond)
            else:  # reported where it failed
                broken = True
        last = real[-1].span if real else (family.span if family else span)
        return ir.Match(tuple(real), join(span, last), pref, police, family, broken)

    def police(self, c: list[Any]) -> PoliceSyntax:
        kw, *items = c
        return PoliceSyntax(self.sp(kw), tuple(items))

    def verdict(self, c: list[Token]) -> Flag:
        (tok,) = c
        return Flag(str(tok), self.sp(tok))

    def _police(self, syn: PoliceSyntax) -> ir.Police | None:
        values: dict[str, Any] = {}
        seen: dict[str, Span] = {}
        verdict: Flag | None = None
        ok = True
        for item in syn.items:
            key = "verdict" if isinstance(item, Flag) else item.key
            if key in seen:
                first = Note("first given here", seen[key])
                what = "what happens above the rate" if key == "verdict" else f"'{key}'"
                self.error(Diagnostic.error("E014", f"{what} is given twice", item.span, first))
                ok = False
                continue
            seen[key] = item.span
            if isinstance(item, Flag):
                verdict = item
                continue
            dim = POLICE_PARAMS.get(item.key)
            if dim is None:
                hint = suggestion(item.key, sorted(POLICE_PARAMS))
                self.error(
                    Diagnostic.error(
                        "E007",
                        f"'{item.key}' is not a parameter of police{hint}; it takes rate, burst, "
                        "mtu and drop|pass|continue|reclassify (class parameters go before "
                        "'match')",
                        item.span,
                    )
                )
                ok = False
                continue
            try:
                result = evaluate(item.value, dim, self.scope)
            except EvalError as err:
                self.eval_error(err, item.value.span)
                ok = False
                continue
            if isinstance(result, ir.Percent):
                msg = f"police {item.key} takes an absolute value, not a percentage"
                self.error(Diagnostic.error("E011", msg, result.span))
                ok = False
                continue
            number, byte_units = result
            span = item.value.span
            if dim is Dimension.RATE:
                values[item.key] = ir.Rate(int(number), span, byte_units)
            else:
                values[item.key] = size = ir.Size(int(number), span)
                for said in size_in_bits(size, byte_units):
                    self.error(said)
        missing = [k for k in ("rate", "burst") if k not in seen]
        if missing:
            self.error(
                Diagnostic.error(
                    "E252",
                    f"police needs {' and '.join(repr(k) for k in missing)}",
                    syn.span,
                )
            )
            return None
        if not ok:
            return None
        return ir.Police(
            values["rate"],
            values["burst"],
            syn.span,
            values.get("mtu"),
            verdict.key if verdict is not None else "drop",  # type: ignore[arg-type]
            verdict.span if verdict is not None else None,
        )

    def _network(self, tok: Token) -> ir.Network | None:
        text = str(tok)
        try:
            net: ir.Network
            if tok.type == "IPV6":
                net = ipaddress.IPv6Network(text, strict=False)
            else:
                net = _ipv4_network(text) or ipaddress.IPv4Network(text, strict=False)
            address, slash, _ = text.partition("/")
            if slash and ipaddress.ip_address(address) != net.network_address:
                # (found by a tester: '10.0.0.1/24' was 10.0.0.0/24 without a word, where a
                # subscriber table refuses it, E029)
                self.error(
                    Diagnostic.warning(
                        "W330",
                        f"'{text}' has host bits set: the filter matches the network {net}; "
                        f"write {net}, or {address} for that host alone",
                        self.sp(tok),
                    )
                )
            return net
        except ValueError:
            family = "IPv6" if tok.type == "IPV6" else "IPv4"
            self.error(
                Diagnostic.error(
                    "E010", f"'{tok}' is not a valid {family} address or network", self.sp(tok)
                )
            )
            return None

    def address(self, c: list[Token]) -> tuple[ir.Network, Span] | None:
        (tok,) = c
        net = self._network(tok)
        return None if net is None else (net, self.sp(tok))

    def address_ref(self, c: list[Token]) -> tuple[ir.Network, Span] | None:
        (tok,) = c
        span = self.sp(tok)
        found = self.scope.constants.get(str(tok))
        if str(tok) in self.scope.broken:
            return None
        if found is None:
            msg = f"unknown constant '{tok}'; expected an IPv4 or IPv6 address"
            self.eval_error(EvalError(Diagnostic.error("E103", msg, span), self.scope.incomplete))
            return None
        if not isinstance(found[0], Address):
            msg = f"'{tok}' is not an address constant; expected an IPv4 or IPv6 address"
            self.error(Diagnostic.error("E011", msg, span, Note(f"'{tok}' defined here", found[1])))
            return None
        return found[0].network, span

    def addr_cond(self, c: list[Any]) -> ir.AddrCond | None:
        fld, *addrs = c
        nets = tuple(a for a in addrs if a is not None)
        if len(nets) != len(addrs):
            return None
        return ir.AddrCond(str(fld), nets, self.sp_to(fld, nets[-1][1]))  # type: ignore[arg-type]

    def _port_number(self, text: str, span: Span) -> int | None:
        value = self._whole(text, span)
        if value is None:
            return None
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
        mask = self._whole(str(mask_tok), span)
        if value is None or mask is None:
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
            self.eval_error(err)
            return None
        assert not isinstance(value, ir.Percent)
        port = self._port_number(str(int(value[0])), span)
        return None if port is None else ir.PortValue(port, port, None, span)

    def port_cond(self, c: list[Any]) -> ir.PortCond | None:
        fld, *ports = c
        good = tuple(p for p in ports if p is not None)
        if len(good) != len(ports):
            return None
        return ir.PortCond(str(fld), good, self.sp_to(fld, good[-1].span))  # type: ignore[arg-type]

    def proto_name(self, c: list[Token]) -> tuple[int, Span] | None:
        (tok,) = c
        if str(tok).lower() in ("ipv6", "ip6", "ipv4", "ip"):
            family = "ipv6" if "6" in str(tok) else "ipv4"
            tunnel = 41 if family == "ipv6" else 4
            what = "IPv6 tunnelled in IPv4, 6in4" if tunnel == 41 else "IPv4 in IPv4"
            self.error(
                Diagnostic.error(
                    "E257",
                    f"'proto {tok}' is not a protocol of the packet's own header: write "
                    f"'family {family}' to match {family[:2].upper()}{family[2:]} packets (or "
                    f"'proto {tunnel}' for {what})",
                    self.sp(tok),
                )
            )
            return None
        number = PROTOCOLS.get(str(tok).lower())
        if number is None:
            known = ", ".join(PROTOCOLS)
            hint = suggestion(str(tok), PROTOCOLS)
            self.error(
                Diagnostic.error(
                    "E015",
                    f"unknown protocol '{tok}'{hint}; use a number or one of {known}",
                    self.sp(tok),
                )
            )
            return None
        return number, self.sp(tok)

    def proto_number(self, c: list[Token]) -> tuple[int, Span] | None:
        (tok,) = c
        number = self._whole(tok, self.sp(tok))
        if number is None:
            return None
        if number > 255:
            self.error(
                Diagnostic.error(
                    "E015", f"protocol number {tok} is out of range 0-255", self.sp(tok)
                )
            )
            return None
        return number, self.sp(tok)

    def proto_cond(self, c: list[Any]) -> ir.ProtoCond | None:
        good = tuple(p for p in c if p is not None)
        if len(good) != len(c):
            return None
        return ir.ProtoCond(good, join(good[0][1], good[-1][1]))

    def _mask_bits(
        self, toks: list[Token], width: int, default_mask: int
    ) -> tuple[int, int, Span] | None:
        span = join(self.sp(toks[0]), self.sp(toks[-1]))
        nums = [n for n in (self._whole(t, span) for t in toks) if n is not None]
        if len(nums) != len(toks):
            return None
        value, mask = nums[0], nums[1] if len(nums) > 1 else default_mask
        limit = (1 << width) - 1
        if value > limit or mask > limit:
            # (found by a tester: a mask too wide was blamed on the value)
            what, tok = ("value", toks[0]) if value > limit else ("mask", toks[-1])
            self.error(
                Diagnostic.error("E016", f"{what} {tok} does not fit in {width} bits", self.sp(tok))
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
        dscp = self._dscp(tok)
        if dscp is None:
            return None
        return ir.TosCond(dscp << 2, 0xFC, span, dscp)

    def set_dscp_opt(self, c: list[Token]) -> SetDscpOpt:
        kw, tok = c
        dscp = self._dscp(tok)
        span = join(self.sp(kw), self.sp(tok))
        return SetDscpOpt(ir.Count(dscp, self.sp(tok)) if dscp is not None else None, span)

    def _dscp(self, tok: Token) -> int | None:
        """A DSCP code point by name (``ef``, ``af41``, ``cs1``) or number 0-63."""
        span = self.sp(tok)
        if tok.type == "NAME":
            dscp = DSCP_NAMES.get(str(tok).lower())
            if dscp is None:
                self.error(
                    Diagnostic.error(
                        "E016",
                        f"unknown DSCP name '{tok}'{suggestion(str(tok), DSCP_NAMES)}; "
                        "use 0-63, ef, afXY or csN",
                        span,
                    )
                )
                return None
        else:
            dscp = self._whole(tok, span)
            if dscp is None:
                return None
            if dscp > 63:
                self.error(Diagnostic.error("E016", f"DSCP {dscp} is out of range 0-63", span))
                return None
        return dscp

    def tcp_ack(self, c: list[Token]) -> ir.TcpAckCond:
        (tok,) = c
        return ir.TcpAckCond(self.sp(tok))

    def tcp_flags(self, c: list[Any]) -> ir.TcpFlagsCond | None:
        kw, listed, *examined = c
        if listed is None or (examined and examined[0] is None):
            return None
        value, value_span = listed
        mask, mask_span = examined[0] if examined else listed
        span = join(self.sp(kw), mask_span)
        missing = value & ~mask
        if missing:
            names = ",".join(ir.TcpFlagsCond(0, 0, span).names(missing))
            self.error(
                Diagnostic.error(
                    "E247",
                    f"tcp-flags: {names} must be set but is not among the flags examined; add "
                    "it to the 'of' list, or drop it",
                    value_span,
                )
            )
            return None
        return ir.TcpFlagsCond(value, mask, span)

    def flag_names(self, c: list[Token]) -> tuple[int, Span] | None:
        bits = 0
        for tok in c:
            bit = ir.TCP_FLAGS.get(str(tok).lower())
            if bit is None:
                known = ", ".join(ir.TCP_FLAGS)
                self.error(
                    Diagnostic.error(
                        "E247", f"unknown TCP flag '{tok}'; the flags are {known}", self.sp(tok)
                    )
                )
                return None
            bits |= bit
        return bits, join(self.sp(c[0]), self.sp(c[-1]))

    def raw_cond(self, c: list[Token]) -> ir.RawCond | None:
        size, *bits, at = c
        width = int(str(size)[1:])
        parsed = self._mask_bits(bits, width, (1 << width) - 1)
        if parsed is None:
            return None
        offset = self._whole(at, self.sp(at))
        if offset is None:
            return None
        span = join(self.sp(size), self.sp(at))
        if offset > 0x7FFFFFFF:  # (found by a tester: the script failed half-way)
            self.error(
                Diagnostic.error(
                    "E016",
                    f"offset {offset} is past tc's 2147483647 (it reads 'at' as a signed 32-bit "
                    "number and refuses the match); a key that far in a packet never matches",
                    self.sp(at),
                )
            )
            return None
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
        span = self.sp(tok)
        value = self._whole(tok, span)
        if value is None:
            return None
        if not 1 <= value <= 0xFFFF:
            self.error(
                Diagnostic.error("E207", f"filter pref {value} is out of range 1-65535", span)
            )
            return None
        return ir.Count(value, span)

    # ---- blocks ----
    def body(self, c: list[Any]) -> Body:
        return Body(tuple(c))

    def classify(self, c: list[Any]) -> ir.Marking:
        kw, (hook, name, span), *rest = c
        chain = None
        mask = None
        pref = None
        for tok in rest:
            if tok is None or isinstance(tok, ir.Count):
                pref = tok
                continue
            if tok.type in ("INT", "HEX"):
                mask = self._mark_mask(tok)
                continue
            chain = str(tok)[1:-1] if tok.type == "STRING" else str(tok)
            problem = chain_name_problem(chain)
            if problem is not None:
                self.error(Diagnostic.error(*problem, self.sp(tok)))
                chain = None
        return ir.Marking(name, join(self.sp(kw), span), chain, hook=hook, mask=mask, pref=pref)

    def mark_from(self, c: list[Token]) -> tuple[ir.MarkHook, str | None, Span]:
        """``from IFACE``; unquoted ``any`` is every input interface, ``local`` the host's own
        traffic (a quoted ``"any"`` is an interface of that name)."""
        (tok,) = c
        span = self.sp(tok)
        if tok.type == "IFNAME" and str(tok) == "any":
            return "prerouting", None, span
        if tok.type == "IFNAME" and str(tok) == "local":
            return "output", None, span
        name = str(tok)[1:-1] if tok.type == "STRING" else str(tok)
        self._check_ifname(name, span)
        return "prerouting", name, span

    def mark_at(self, c: list[Token]) -> tuple[ir.MarkHook, str | None, Span]:
        (tok,) = c
        return "postrouting", None, self.sp(tok)

    def _mark_mask(self, tok: Token) -> ir.Count | None:
        span = self.sp(tok)
        value = self._whole(str(tok), span)
        if value is None:
            return None
        if not 0 < value <= 0xFFFFFFFF:
            self.error(
                Diagnostic.error(
                    "E245",
                    f"mark mask {tok!s} is out of range: a mask is 1-0xffffffff (32 bits, "
                    "at least one of them)",
                    span,
                )
            )
            return None
        return ir.Count(value, span)

    def chain_name(self, c: list[Token]) -> Token:
        return c[0]

    def subscribers(self, c: list[Any]) -> tables.SubscribersSyntax:
        kw, *rest = c
        direction: tables.Direction | None = None
        if isinstance(rest[0], Token) and rest[0].type in ("UPLOAD", "DOWNLOAD"):
            direction = "upload" if rest[0].type == "UPLOAD" else "download"
            rest = rest[1:]
        path_token, *rest = rest
        body: tuple[Any, ...] = ()
        if rest and isinstance(rest[-1], Body):
            body = rest.pop().items
        where: tables.Where | None = None
        if rest and isinstance(rest[0], tables.Where):
            where = rest.pop(0)
        pref: ir.Count | None = None
        if rest and (rest[0] is None or isinstance(rest[0], ir.Count)):
            pref = rest.pop(0)
        at = self.sp(path_token)
        span = join(self.sp(kw), at)
        target = self._file(path_token, "table")
        table = tables.read_table(self, target, at) if target is not None else None
        rows: tuple[tables.Row, ...] = ()
        column = None
        if table is not None:
            rows, column, ok = tables.select(
                self, table, where.conditions if where else [], where.span if where else at
            )
            if not ok:
                table = None
        return tables.SubscribersSyntax(
            span, direction, table, rows, column, tuple(rest), body, pref
        )

    def where(self, c: list[Any]) -> tables.Where:
        kw, *conds = c
        found = [x for x in conds if isinstance(x, tuple)]
        return tables.Where(found, join(self.sp(kw), found[-1][1] if found else self.sp(kw)))

    def where_cond(self, c: list[Token]) -> tuple[str, Span, bool, list[str]]:
        column, op, *values = c
        name = str(column)[1:-1] if column.type == "STRING" else str(column)
        span = join(self.sp(column), self.sp(values[-1]))
        return name, span, str(op) == "==", [str(v)[1:-1] for v in values]

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
        inner: QdiscSyntax | None = None
        if rest and isinstance(rest[-1], Body):
            body = rest.pop().items
        elif rest and isinstance(rest[-1], QdiscSyntax):
            inner = rest.pop()
        if kind == "mq":  # the grammar gives only mq a tree after its options
            return build_mq(self, self.sp(kind_tok), tuple(rest), body, inner)
        return QdiscBuilder(self, kind, self.sp(kind_tok), tuple(rest), body).build()

    def mq_body(self, c: list[MqQueueSyntax]) -> Body:
        return Body(tuple(c))

    def mq_queue(self, c: list[Token | QdiscSyntax]) -> MqQueueSyntax:
        kw, number, tree = c
        assert isinstance(kw, Token) and isinstance(number, Token)
        assert isinstance(tree, QdiscSyntax)
        return mq_queue(self, str(number), join(self.sp(kw), self.sp(number)), tree)


def _plain(value: object) -> bool:
    """Whether ``value`` is a number without a unit (``1.05``, ``0x10``)."""
    return isinstance(value, Lit) and value.unit is None
