"""Per-qdisc parameters: which parameters and flags each qdisc and class kind takes, in which
dimension, and the builder that turns one qdisc's options and body into its IR node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.syntax import (
    ClassSyntax,
    DefaultOpt,
    Flag,
    HandleOpt,
    Opt,
    Param,
    PriomapOpt,
    QdiscSyntax,
    SetDscpOpt,
    suggestion,
)
from tcdsl.frontend.values import EvalError, evaluate
from tcdsl.units import Dimension

if TYPE_CHECKING:
    from tcdsl.frontend.builder import Builder


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
    ) -> tuple[dict[str, Any], ir.HandleRef | None, list[ir.Match]]:
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
            if isinstance(opt, SetDscpOpt) and key not in params:
                self.error(
                    Diagnostic.error("E007", f"'set dscp' belongs on a class, not on {what}", span)
                )
                continue
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
                    self._unknown(opt.keyword, span, params, flags, what, handle_kw)
                else:
                    handle = opt.ref
                continue
            if isinstance(opt, Flag):
                if opt.key not in flags:
                    self._unknown(opt.key, span, params, flags, what, handle_kw)
                else:
                    values[opt.key] = True
                continue
            if isinstance(opt, DefaultOpt | PriomapOpt):
                if key not in params:
                    self._unknown(key, span, params, flags, what, handle_kw)
                else:
                    values[key] = opt.name if isinstance(opt, DefaultOpt) else opt.values
                continue
            if isinstance(opt, SetDscpOpt):
                values[key] = opt.value
                continue
            dim = params.get(opt.key)
            if dim is None:
                self._unknown(opt.key, span, params, flags, what, handle_kw)
                continue
            values[opt.key] = self._value(opt, dim, opt.key in percent)
        return values, handle, matches

    def _value(self, opt: Param, dim: Dimension, percent: bool) -> Any:
        try:
            result = evaluate(opt.value, dim, self.b.scope, percent=percent)
        except EvalError as err:
            self.b.eval_error(err)
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
        handle_kw: str,
    ) -> None:
        if key in ("id", "handle"):  # the other one of the two numbering keywords
            text = f"{what} takes '{handle_kw}', not '{key}'"
            if key == "id" and self.kind == "htb":
                text += (
                    "; its link class is N:1 (under 'handle N:'): to number it, leave 'rate' off "
                    "this line and write a top class, as 'class link id 1:5 rate 10mbit { ... }'"
                )
            self.error(Diagnostic.error("E007", text, span))
            return
        accepted = sorted({*params, *flags, handle_kw})
        hint = suggestion(key, sorted({*params, *flags}))
        takes = ", ".join(accepted) if len(accepted) > 1 else f"only {handle_kw}"
        self.error(
            Diagnostic.error(
                "E007", f"'{key}' is not a parameter of {what}{hint}; it takes {takes}", span
            )
        )

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
            {**CLASS_PARAMS[kind], SET_DSCP: C},
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
        values["set_dscp"] = values.pop(SET_DSCP, None)
        fields = {k: val for k, val in values.items() if val is not None}
        return ir.Class(
            syn.name,
            syn.span,
            explicit_id=handle,
            matches=tuple(matches),
            children=tuple(children),
            leaf=leaves[0] if leaves and not children else None,
            **flags,
            **fields,
        )


SET_DSCP = "set dscp"
"""The key of a class's ``set dscp`` among its options (two words: never a parameter name)."""


def _opt_key(opt: Param | Flag | DefaultOpt | HandleOpt | PriomapOpt | SetDscpOpt) -> str:
    match opt:
        case SetDscpOpt():
            return SET_DSCP
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
