"""Per-qdisc parameters: which parameters and flags each qdisc and class kind takes, in which
dimension, and the builder that turns one qdisc's options and body into its IR node."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from tcdsl import ir, linklayer
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.syntax import (
    ClassSyntax,
    CurveOpt,
    DefaultOpt,
    Flag,
    HandleOpt,
    Opt,
    Param,
    PriomapOpt,
    QdiscSyntax,
    SetDscpOpt,
    continuation_broken,
    suggestion,
)
from tcdsl.frontend.tables import SubscribersSyntax, placeholder
from tcdsl.frontend.values import EvalError, Lit, Ref, evaluate, size_in_bits
from tcdsl.units import Dimension, scale

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
    "hfsc": {"mark": C},
}
CLASS_FLAGS: dict[str, frozenset[str]] = {
    "htb": frozenset({"overbook"}),
    "cbq": frozenset({"bounded", "isolated", "overbook"}),
    "prio": frozenset(),
    "hfsc": frozenset(),
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
        "distribution": C,
        "delay_correlation": C,
        "loss_correlation": C,
        "reorder": C,
        "reorder_correlation": C,
        "gap": C,
        "slot": T,
        "slot_max": T,
        "packetoverhead": C,
        "cellsize": C,
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
    "hfsc": {},
    "codel": {"limit": C, "target": T, "interval": T, "ce_threshold": T},
    "fq": {
        "limit": C,
        "flow_limit": C,
        "quantum": S,
        "initial_quantum": S,
        "maxrate": R,
        "buckets": C,
        "refill_delay": T,
        "low_rate_threshold": R,
        "orphan_mask": C,
        "ce_threshold": T,
        "horizon": T,
    },
    "fq_pie": {
        "limit": C,
        "flows": C,
        "target": T,
        "tupdate": T,
        "alpha": C,
        "beta": C,
        "quantum": S,
        "memory_limit": S,
        "ecn_prob": C,
    },
    "red": {
        "limit": S,
        "min": S,
        "max": S,
        "avpkt": S,
        "burst": C,
        "bandwidth": R,
        "probability": C,
    },
}
QDISC_PARAMS["mq"] = {"queues": C}
"""mq: ``queues N`` spreads the tree after it (``tcdsl.frontend.mq``, which builds mq)."""
QDISC_PARAMS["cake"] = {"bandwidth": R, "rtt": T, "memlimit": S, "fwmark": C, "isolate": C}
QDISC_FLAGS: dict[str, frozenset[str]] = {k: frozenset() for k in QDISC_PARAMS}
QDISC_FLAGS["fq_codel"] = frozenset({"ecn", "noecn"})
CAKE_FLAG_GROUPS: dict[str, tuple[str, ...]] = {
    "unlimited": ("unlimited",),
    "diffserv": ("diffserv3", "diffserv4", "diffserv8", "besteffort", "precedence"),
    "nat": ("nat", "nonat"),
    "wash": ("wash", "nowash"),
    "ack_filter": ("ack-filter", "ack-filter-aggressive", "no-ack-filter"),
    "split_gso": ("split-gso", "no-split-gso"),
    "mode": ("ingress", "egress"),
}
"""cake's keyword groups: one word of a group at most (tc keeps the last, silently)."""
QDISC_FLAGS["cake"] = frozenset(w for group in CAKE_FLAG_GROUPS.values() for w in group)
CAKE_ISOLATION = (
    "flowblind",
    "srchost",
    "dsthost",
    "hosts",
    "flows",
    "dual-srchost",
    "dual-dsthost",
    "triple-isolate",
)
LINK_LAYER_PARAMS: dict[str, Dimension] = {"overhead": C, "linklayer": C, "mpu": C}
"""On a root qdisc (its size table) or on a cake (its own compensation)."""
STAB_PARAMS: dict[str, Dimension] = {"mtu": S, "tsize": C}
"""A size table's own: on a root qdisc other than cake (a tbf's ``mtu`` stays the tbf's)."""


def default_on_a_class(kind: str) -> str:
    """What E001 and E007 add for ``default`` written on a class's line."""
    return (
        f"a class takes no 'default': the {kind}'s default class is named on its qdisc's line, "
        f"'{kind} rate 10mbit default NAME'"
    )


@functools.cache
def param_dimensions(word: str) -> frozenset[Dimension]:
    """What a parameter of that name measures, in any qdisc or class (empty: no parameter)."""
    tables = (*CLASS_PARAMS.values(), *QDISC_PARAMS.values(), LINK_LAYER_PARAMS, STAB_PARAMS)
    return frozenset(t[word] for t in tables if word in t)


NAMED_VALUES: dict[str, tuple[str, ...]] = {
    "overhead": (*linklayer.PRESETS, *linklayer.PRESET_ALIASES),
    "linklayer": tuple(linklayer.LINKLAYERS),
    "rtt": tuple(linklayer.RTT_PRESETS),
    "isolate": CAKE_ISOLATION,
}
"""Parameters that take a name from a fixed set where a value goes (``overhead pppoe-llc``)."""
NAME_ONLY = frozenset({"linklayer", "isolate"})
CLASSFUL = frozenset({"htb", "prio", "cbq", "hfsc"})
CHANGE_IN_PLACE = frozenset({"tbf", "pfifo", "bfifo", "sfq", "fq_codel", "cake", "netem", "red"})
"""Kinds whose parameters ``tc qdisc change`` sets on the live qdisc (their sch_*.c has a change
operation), keeping its queue and counters; htb's (default, r2q) cannot change: a new tree."""
CHANGE_SETS_ALL = frozenset({"tbf", "pfifo", "bfifo"})
"""Kinds whose ``tc qdisc change`` with the policy's command sets every value a drift check
compares (tc sends the whole parameter block; found by a review: sfq, fq_codel, cake, netem
and red keep a value the command leaves out, so a hand change of one survives a change):
drift of their values alone is set again in place (``tcdsl.ops.live.drift``)."""
REPAIRABLE_CLASSES = frozenset({"htb"})
"""Class kinds the same holds for (htb sends the whole rate spec; an hfsc change keeps a
curve it is not given)."""
TC_DEFAULTS: dict[str, dict[str, str]] = {"htb": {"r2q": "10"}}
"""Options whose value, as tc's words spell it, is what tc sends when the option is left out
(htb_parse_opt's ``r2q 10``): a command with or without one makes the same qdisc."""
WITH_DEFAULT = frozenset({"htb", "hfsc"})
"""Qdiscs whose ``default NAME`` names the class for unclassified packets."""
CLASS_CURVES: dict[str, frozenset[str]] = {"hfsc": frozenset({"rt", "ls", "ul", "sc"})}
"""The service curves each class kind takes (``sc`` is rt and ls at once)."""
CURVE_PARTS: dict[str, Dimension] = {"m1": R, "d": T, "m2": R, "umax": S, "dmax": T, "rate": R}
U32_MAX = 0xFFFFFFFF
QDISC_FLAGS["codel"] = frozenset({"ecn", "noecn"})
QDISC_FLAGS["fq"] = frozenset({"pacing", "nopacing", "horizon_drop", "horizon_cap"})
QDISC_FLAGS["fq_pie"] = frozenset({"ecn", "noecn", "bytemode", "nobytemode"})
QDISC_FLAGS["red"] = frozenset({"ecn", "harddrop", "adaptive"})
QDISC_FLAGS["htb"] = frozenset({"overbook"})
QDISC_FLAGS["cbq"] = frozenset({"overbook"})
NETEM_PERCENT = frozenset(
    {
        "loss",
        "duplicate",
        "corrupt",
        "delay_correlation",
        "loss_correlation",
        "reorder",
        "reorder_correlation",
    }
)
DISTRIBUTIONS = ("normal", "pareto", "paretonormal")
"""netem's jitter distributions (the tables iproute2 installs in /usr/lib/tc)."""
OPPOSITE_FLAGS: tuple[tuple[str, str], ...] = (
    ("ecn", "noecn"),
    ("pacing", "nopacing"),
    ("horizon_drop", "horizon_cap"),
    ("bytemode", "nobytemode"),
)
"""Flags that say opposite things; a qdisc gets at most one of each pair."""
CHAINING = frozenset({"tbf", "netem"})


class QdiscBuilder:
    """Turn one qdisc's options and body into its IR node (and its classes)."""

    def __init__(
        self, b: Builder, kind: str, span: Span, opts: tuple[Opt, ...], body: tuple[Any, ...] | None
    ):
        self.b, self.kind, self.span, self.opts, self.body = b, kind, span, opts, body
        self._flag_spans: dict[str, ir.Word] = {}

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
            if isinstance(opt, Param):  # the common case: straight to the parameter's checks
                key, span = opt.key, opt.span
            else:
                key = _opt_key(opt)
                span = opt.name.span if isinstance(opt, DefaultOpt) else opt.span
                if isinstance(opt, CurveOpt):
                    self._curve_opt(opt, values, seen, params, flags, what, handle_kw)
                    continue
                if isinstance(opt, SetDscpOpt) and key not in params:
                    self.error(
                        Diagnostic.error(
                            "E007", f"'set dscp' belongs on a class, not on {what}", span
                        )
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
            if not isinstance(opt, Param):
                if isinstance(opt, HandleOpt):
                    if opt.keyword != handle_kw:
                        self._unknown(opt.keyword, span, params, flags, what, handle_kw)
                    else:
                        handle = opt.ref
                elif isinstance(opt, Flag):
                    if opt.key not in flags:
                        self._unknown(opt.key, span, params, flags, what, handle_kw)
                    else:
                        values[opt.key] = True
                        self._flag_spans[opt.key] = ir.Word(opt.key, span)
                elif isinstance(opt, DefaultOpt | PriomapOpt):
                    if key not in params:
                        self._unknown(key, span, params, flags, what, handle_kw)
                    else:
                        values[key] = opt.name if isinstance(opt, DefaultOpt) else opt.values
                elif isinstance(opt, SetDscpOpt):
                    values[key] = opt.value
                continue
            dim = params.get(opt.key)
            if dim is None:
                self._unknown(opt.key, span, params, flags, what, handle_kw)
                continue
            if opt.key in NAMED_VALUES:
                named, word = self._named(opt)
                if named:
                    values[opt.key] = word
                    continue
            if self.kind == "netem" and opt.key == "distribution":
                values[opt.key] = self._distribution(opt)
                continue
            if self.kind == "red" and opt.key == "probability":
                values[opt.key] = self._probability(opt)
                continue
            values[opt.key] = self._value(opt, dim, opt.key in percent)
        return values, handle, matches

    def _curve_opt(
        self,
        opt: CurveOpt,
        values: dict[str, Any],
        seen: dict[str, Span],
        params: Mapping[str, Dimension],
        flags: frozenset[str],
        what: str,
        handle_kw: str,
    ) -> None:
        if opt.key not in CLASS_CURVES.get(self.kind, frozenset()) or not what.endswith("class"):
            self._unknown(opt.key, opt.span, params, flags, what, handle_kw)
            return
        # sc is rt and ls at once: either of them with sc is the same curve given twice.
        for key in ("rt", "ls") if opt.key == "sc" else (opt.key,):
            if key in seen:
                first = Note("first given here", seen[key])
                self.error(Diagnostic.error("E014", f"'{key}' is given twice", opt.span, first))
                return
        curve = self._curve(opt)
        for key in ("rt", "ls") if opt.key == "sc" else (opt.key,):
            seen[key] = opt.span
            values[key] = curve

    def _curve(self, opt: CurveOpt) -> ir.Curve | None:
        """Evaluate one service curve, converting tc's umax/dmax/rate form as tc does."""
        got: dict[str, Any] = {}
        for part in opt.parts:
            if part.key not in CURVE_PARTS:
                self.error(
                    Diagnostic.error(
                        "E007",
                        f"'{part.key}' is not part of a service curve; after umax and dmax "
                        "comes 'rate'",
                        part.span.prefix(len(part.key)),
                    )
                )
                return None
            got[part.key] = self._value(part, CURVE_PARTS[part.key], False)
        if any(v is None for v in got.values()):
            return None
        for key, v in got.items():
            limit = U32_MAX * 8 if isinstance(v, ir.Rate) else U32_MAX
            amount = v.bits_per_second if isinstance(v, ir.Rate) else getattr(v, "bytes", None)
            if amount is None:
                amount = v.microseconds
            if isinstance(v, ir.Rate) and 0 < amount < 8:
                self.error(
                    Diagnostic.error(
                        "E235",
                        f"{opt.key} {key} {amount}bit is below 8bit; tc keeps rates in whole "
                        "bytes per second",
                        v.span,
                    )
                )
                return None
            if amount > limit:
                shown = "34.36gbit (tc's 32-bit bytes/s)" if isinstance(v, ir.Rate) else "2^32-1"
                self.error(
                    Diagnostic.error("E235", f"{opt.key} {key} is above tc's limit {shown}", v.span)
                )
                return None
        curve: ir.Curve | None
        if "m2" in got:
            curve = ir.Curve(got["m2"], opt.span, got.get("m1"), got.get("d"))
        else:
            curve = self._umax_curve(opt, got)
        if curve is None:
            return None
        if curve.m1_bits // 8 == 0 and curve.m2.bits_per_second // 8 == 0:
            self.error(
                Diagnostic.error(
                    "E235",
                    f"{opt.key} has two zero slopes (below 8bit, a byte per second, counts as "
                    "zero); tc refuses such a curve",
                    opt.span,
                )
            )
            return None
        return curve

    def _umax_curve(self, opt: CurveOpt, got: dict[str, Any]) -> ir.Curve | None:
        rate: ir.Rate = got["rate"]
        umax: ir.Size | None = got.get("umax")
        dmax: ir.Time | None = got.get("dmax")
        if umax is None and dmax is None:
            return ir.Curve(rate, opt.span)
        u = umax.bytes if umax is not None else 0
        dm = dmax.microseconds if dmax is not None else 0
        if umax is not None and u and not dm:
            self.error(
                Diagnostic.error(
                    "E235", f"{opt.key} gives umax without dmax; tc refuses it", umax.span
                )
            )
            return None
        per_second = rate.bits_per_second // 8
        first = -(-u * 1_000_000 // dm) if dm else 0
        if first > U32_MAX and umax is not None:
            self.error(
                Diagnostic.error(
                    "E235",
                    f"{opt.key}: umax {u} bytes in dmax {dm}us is {first} bytes/s, above tc's "
                    f"32-bit limit {U32_MAX}",
                    umax.span,
                )
            )
            return None
        if first > per_second:  # concave: m1 = umax / dmax
            m1 = ir.Rate(first * 8, umax.span if umax else rate.span)
            return ir.Curve(rate, opt.span, m1, dmax, umax, dmax)
        if per_second == 0:
            return ir.Curve(rate, opt.span, None, None, umax, dmax)  # two zero slopes: refused
        d = dm - u * 1_000_000 // per_second  # convex: ceil(dmax - umax / rate), as tc does
        at = dmax.span if dmax is not None else rate.span
        return ir.Curve(rate, opt.span, ir.Rate(0, at), ir.Time(d, at), umax, dmax)

    def _named(self, opt: Param) -> tuple[bool, ir.Word | None]:
        """(True, the name) when ``opt`` gives a name from its fixed set, (True, None) after
        an error, (False, None) for a value to evaluate (a number or a constant)."""
        names = NAMED_VALUES[opt.key]
        value = opt.value
        if isinstance(value, Ref) and value.name in names:
            return True, ir.Word(value.name, value.span)
        if opt.key not in NAME_ONLY and (
            not isinstance(value, Ref)
            or value.name in self.b.scope.constants
            or value.name in self.b.scope.broken
            or self.b.scope.incomplete
        ):
            return False, None
        shown = [n for n in names if n not in linklayer.PRESET_ALIASES]
        found = value.name if isinstance(value, Ref) else "a value"
        quoted = f"'{found}'" if isinstance(value, Ref) else found
        hint = suggestion(found, shown) if isinstance(value, Ref) else ""
        what = {
            "overhead": "an overhead in bytes or a preset",
            "linklayer": "a link layer",
            "rtt": "a time or a named rtt",
            "isolate": "a flow isolation mode",
        }[opt.key]
        self.error(
            Diagnostic.error(
                "E231",
                f"{opt.key} takes {what}, found {quoted}{hint}; names are {', '.join(shown)}",
                value.span,
            )
        )
        return True, None

    def _match_outside(self, span: Span, previous: Any = None) -> Diagnostic:
        """E017 for a match line outside a class; ``previous`` is the statement before it."""
        said = self._maybe_continued("E017", "a match belongs inside a class", span)
        if isinstance(previous, ClassSyntax) and not said.notes and span.line > previous.span.line:
            # (noticed by a tester: a match on the line below its class, as tc's filters are)
            where = "on its line" if not previous.body else "in its block"
            said = Diagnostic.error(
                "E017",
                f"a match belongs inside a class: a line of its own is a statement of its own; "
                f"for class '{previous.name}' write it {where}"
                + (f", 'class {previous.name} ... match ...'" if not previous.body else ""),
                span,
            )
        return said

    def _maybe_continued(self, code: str, msg: str, span: Span) -> Diagnostic:
        """The error, saying so where a comment ended the statement above that a '\\' meant
        to continue onto the line at ``span`` (found by a tester: its 'match' was "outside a
        class", its 'prio 1' a prio qdisc inside the htb)."""
        found = self.b.source_at(span)
        broken = None if found is None else continuation_broken(*found, span.line, span.file)
        if broken is None:
            return Diagnostic.error(code, msg, span)
        return Diagnostic.error(code, msg + broken[0], span, broken[1])

    def _value(self, opt: Param, dim: Dimension, percent: bool) -> Any:
        try:
            result = evaluate(opt.value, dim, self.b.scope, percent=percent)
        except EvalError as err:
            said = err.diagnostic
            lit = opt.value
            sized = isinstance(lit, Lit) and lit.unit and scale(lit.unit, Dimension.SIZE)
            if self.kind == "pfifo" and opt.key == "limit" and sized and said.code == "E011":
                # (noticed by a tester: 'pfifo limit 10kb' said only "expected a plain number")
                hint = f"; {self.kind}'s limit counts packets: for a limit in bytes, use bfifo"
                err.diagnostic = dataclasses.replace(said, message=said.message + hint)
            self.b.eval_error(err, opt.value.span)
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
                size = ir.Size(value, span)
                for said in size_in_bits(size, byte_units):
                    self.error(said)
                return size
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

    def _distribution(self, opt: Param) -> ir.Name | None:
        """netem's ``distribution NAME``: one of the tables tc installs, by name."""
        value = opt.value
        if isinstance(value, Ref) and value.name in DISTRIBUTIONS:
            return ir.Name(value.name, value.span)
        found = f"'{value.name}'" if isinstance(value, Ref) else "a value"
        self.error(
            Diagnostic.error(
                "E011",
                f"expected a distribution (normal, pareto or paretonormal), found {found}",
                value.span,
            )
        )
        return None

    def _probability(self, opt: Param) -> ir.Percent | None:
        """red's ``probability``: a fraction such as 0.02 (as tc reads it), or a percentage."""
        try:
            result = evaluate(opt.value, Dimension.COUNT, self.b.scope, percent=True)
        except EvalError as err:
            self.b.eval_error(err)
            return None
        fraction = result.value / 100 if isinstance(result, ir.Percent) else Fraction(result[0])
        if not 0 < fraction < 1:
            # (found by a tester: 0 was said to be outside 0 to 1, and to overflow)
            why = (
                "tc cannot compute a mark probability of none ('failed to calculate "
                "probability'); give more than 0"
                if fraction == 0
                else "the kernel keeps it as a fraction of 2^32, which 1 overflows; give less "
                "than 1"
            )
            self.error(
                Diagnostic.error(
                    "E208",
                    f"red probability {float(fraction):g} must be above 0 and below 1 (tc reads "
                    f"0.02 as 2%): {why}",
                    opt.value.span,
                )
            )
            return None
        return ir.Percent(fraction * 100, opt.value.span)

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
        curves = CLASS_CURVES.get(self.kind, frozenset()) if what.endswith("class") else set()
        if self.kind != "cake":  # the link-layer words belong to the root, not to its kind
            params = {k: d for k, d in params.items() if k not in LINK_LAYER_PARAMS}
            params = {
                k: d
                for k, d in params.items()
                if k not in STAB_PARAMS or k in QDISC_PARAMS.get(self.kind, {})
            }
        accepted = sorted({*params, *flags, *curves, handle_kw})
        hint = suggestion(key, sorted({*params, *flags, *curves}))
        takes = ", ".join(accepted) if len(accepted) > 1 else f"only {handle_kw}"
        text = f"'{key}' is not a parameter of {what}{hint}; it takes {takes}"
        if curves and key in ("rate", "ceil"):
            text += " (an hfsc class has service curves: 'ls m2 RATE' shares, 'rt m2 RATE' "
            text += "guarantees, 'ul m2 RATE' caps)"
        if key == "default" and what.endswith("class") and self.kind in WITH_DEFAULT:
            # (noticed by a tester: 'class voip rate 1mbit default' meant "the default class")
            text += f"; {default_on_a_class(self.kind)}"
        self.error(Diagnostic.error("E007", text, span))

    # ---- qdiscs ----
    def build(self) -> QdiscSyntax:
        kind = self.kind
        pct = NETEM_PERCENT if kind == "netem" else frozenset()
        stab_params = {
            k: d for k, d in STAB_PARAMS.items() if kind != "cake" and (kind, k) != ("tbf", "mtu")
        }
        values, handle, matches = self._values(
            self.opts,
            {
                **QDISC_PARAMS[kind],
                **({"default": C} if kind in WITH_DEFAULT else {}),
                **({"priomap": C} if kind == "prio" else {}),
                **LINK_LAYER_PARAMS,
                **stab_params,
            },
            QDISC_FLAGS[kind],
            f"{kind}",
            pct | (PERCENT_OK if kind == "htb" else frozenset()),
        )
        for m in matches:
            self.error(self._match_outside(m.span))
        for on, off in OPPOSITE_FLAGS:
            if values.get(on) and values.get(off):
                self.error(
                    Diagnostic.error(
                        "E014",
                        f"'{on}' and '{off}' contradict each other; keep one",
                        self._flag_span(off),
                    )
                )
        classes: list[ClassSyntax | SubscribersSyntax] = []
        children: list[QdiscSyntax] = []
        classify: list[ir.Marking] = []
        previous: Any = None
        for item in self.body or ():
            if isinstance(item, ClassSyntax | SubscribersSyntax):
                classes.append(item)
            elif isinstance(item, QdiscSyntax):
                children.append(item)
                classify.extend(item.classify)
            elif isinstance(item, ir.Match):
                self.error(self._match_outside(item.span, previous))
            elif isinstance(item, ir.Marking):
                classify.append(item)
            previous = item
        if self.body is not None and kind not in CLASSFUL | CHAINING:
            self.error(
                Diagnostic.error("E018", f"{kind} is classless and takes no block", self.span)
            )
        if kind in CLASSFUL:
            for nested in children:
                self.error(
                    self._maybe_continued(
                        "E018",
                        f"a qdisc inside {kind} must be the leaf of a class",
                        nested.qdisc.span,
                    )
                )
        elif classes:
            for cls in classes:
                self.error(
                    Diagnostic.error(
                        "E018",
                        f"{kind} has no classes; 'class' needs htb, hfsc, prio or cbq",
                        cls.span,
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
            if children:
                nested_stab(self.b, children[0])
        overhead = self._overhead(values, stab=kind != "cake")
        if kind == "cake":
            values["overhead"] = overhead
            overhead = None
        built = [self._member(c) for c in classes] if kind in CLASSFUL else []
        q = self._make(kind, values, handle, tuple(c for c in built if c is not None), child)
        return QdiscSyntax(q, tuple(classify), overhead)

    def _overhead(self, v: dict[str, Any], stab: bool) -> ir.Overhead | None:
        """Take the link-layer words out of ``v``: a preset fills in what is not given."""
        own = [k for k in STAB_PARAMS if stab and (self.kind, k) != ("tbf", "mtu")]
        words = {k: v.pop(k, None) for k in (*LINK_LAYER_PARAMS, *own)}
        given = [w for w in words.values() if w is not None]
        words.setdefault("mtu", None)
        words.setdefault("tsize", None)
        if not given:
            return None
        first = min((w.span for w in given), key=lambda s: (s.line, s.column))
        amount, layer, mpu = words["overhead"], words["linklayer"], words["mpu"]
        preset = linklayer.preset(amount.value) if isinstance(amount, ir.Word) else None
        if preset is not None:
            assert isinstance(amount, ir.Word)
            overhead = ir.Count(preset.overhead, amount.span)
            layer_name = preset.linklayer
            if mpu is None and preset.mpu:
                mpu = ir.Count(preset.mpu, amount.span)
        else:
            overhead = amount if isinstance(amount, ir.Count) else ir.Count(0, first)
            layer_name = "ethernet"
        if isinstance(layer, ir.Word):
            layer_name = linklayer.LINKLAYERS[layer.value]
            if stab and layer_name == "ptm":
                self.error(
                    Diagnostic.error(
                        "E232",
                        "a size table (the link-layer words of a root qdisc other than cake) has "
                        "no ptm: tc's stab takes ethernet or atm; use cake, or linklayer ethernet "
                        "with a rate 64/65 of the line's",
                        layer.span,
                    )
                )
        if stab and preset is not None and preset.linklayer == "ptm" and layer is None:
            self.error(
                Diagnostic.error(
                    "E232",
                    f"{preset.name} is a PTM link, which a size table (tc's stab, the link-layer "
                    "words of a root qdisc other than cake) cannot describe; use cake, or "
                    f"overhead {preset.overhead} linklayer ethernet with a rate 64/65 of the "
                    "line's",
                    amount.span,
                )
            )
        return ir.Overhead(
            first,
            overhead,
            layer_name,
            mpu,
            amount if isinstance(amount, ir.Word) else None,
            layer if isinstance(layer, ir.Word) else None,
            words["mtu"],
            words["tsize"],
            amount is not None,
        )

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
                    overbook = bool(v.get("overbook"))
                    classes = (
                        ir.Class(
                            "", span, children=classes, implicit=True, overbook=overbook, **link
                        ),
                    )
                elif v.get("overbook"):
                    self.error(
                        Diagnostic.error(
                            "E007",
                            "'overbook' needs the interface's link class: give this htb a rate, "
                            "or write 'overbook' on the class whose children over-book it",
                            self._flag_span("overbook"),
                        )
                    )
                return ir.Htb(span, v.get("default"), v.get("r2q"), classes, handle)
            case "prio":
                return ir.Prio(span, v.get("bands"), v.get("priomap"), classes, handle)
            case "cbq":
                return ir.Cbq(
                    span,
                    v.get("bandwidth"),
                    v.get("avpkt"),
                    classes,
                    handle,
                    overbook=bool(v.get("overbook")),
                )
            case "hfsc":
                return ir.Hfsc(span, v.get("default"), classes, handle)
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
                    distribution=v.get("distribution"),
                    delay_correlation=v.get("delay_correlation"),
                    loss_correlation=v.get("loss_correlation"),
                    reorder=v.get("reorder"),
                    reorder_correlation=v.get("reorder_correlation"),
                    gap=v.get("gap"),
                    slot=v.get("slot"),
                    slot_max=v.get("slot_max"),
                    packetoverhead=v.get("packetoverhead"),
                    cellsize=v.get("cellsize"),
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
                ecn = _either(v, "ecn", "noecn")
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
            case "codel":
                return ir.Codel(
                    span,
                    v.get("limit"),
                    v.get("target"),
                    v.get("interval"),
                    v.get("ce_threshold"),
                    _either(v, "ecn", "noecn"),
                    handle,
                )
            case "fq":
                return ir.Fq(
                    span,
                    **_fields(v, "fq"),
                    pacing=_either(v, "pacing", "nopacing"),
                    horizon_drop=_either(v, "horizon_drop", "horizon_cap"),
                    explicit_handle=handle,
                )
            case "fq_pie":
                return ir.FqPie(
                    span,
                    **_fields(v, "fq_pie"),
                    ecn=_either(v, "ecn", "noecn"),
                    bytemode=_either(v, "bytemode", "nobytemode"),
                    explicit_handle=handle,
                )
            case "red":
                return ir.Red(
                    span,
                    **_fields(v, "red"),
                    ecn=bool(v.get("ecn")),
                    harddrop=bool(v.get("harddrop")),
                    adaptive=bool(v.get("adaptive")),
                    explicit_handle=handle,
                )
            case "pfifo":
                return ir.Pfifo(span, v.get("limit"), handle)
            case "bfifo":
                return ir.Bfifo(span, v.get("limit"), handle)
            case "cake":
                return self._cake(v, handle)
            case _:
                return ir.PfifoFast(span, handle)

    def _cake(self, v: dict[str, Any], handle: ir.HandleRef | None) -> ir.Cake:
        groups: dict[str, ir.Word] = {}
        for group, names in CAKE_FLAG_GROUPS.items():
            given = sorted(
                (self._flag_spans[n] for n in names if v.get(n)),
                key=lambda w: (w.span.line, w.span.column),
            )
            for word in given[1:]:
                self.error(
                    Diagnostic.error(
                        "E233",
                        f"'{word.value}' contradicts '{given[0].value}': cake takes one of "
                        f"{', '.join(names)}",
                        word.span,
                        Note("given here", given[0].span),
                    )
                )
            if given:
                groups[group] = given[0]
        if "unlimited" in groups and v.get("bandwidth") is not None:
            self.error(
                Diagnostic.error(
                    "E233",
                    "'unlimited' contradicts 'bandwidth': cake shapes at a bandwidth or not at all",
                    groups["unlimited"].span,
                    Note("bandwidth given here", v["bandwidth"].span),
                )
            )
        rtt = v.get("rtt")
        rtt_preset = rtt if isinstance(rtt, ir.Word) else None
        if rtt_preset is not None:
            rtt = ir.Time(linklayer.RTT_PRESETS[rtt_preset.value], rtt_preset.span)
        return ir.Cake(
            self.span,
            v.get("bandwidth"),
            groups.get("unlimited"),
            groups.get("diffserv"),
            v.get("isolate"),
            groups.get("nat"),
            groups.get("wash"),
            groups.get("ack_filter"),
            groups.get("split_gso"),
            groups.get("mode"),
            rtt,
            rtt_preset,
            v.get("memlimit"),
            v.get("fwmark"),
            v.get("overhead"),
            handle,
        )

    def _flag_span(self, key: str) -> Span:
        """Where this qdisc's line gives the flag ``key`` (the qdisc's span if it does not)."""
        return next((o.span for o in self.opts if isinstance(o, Flag) and o.key == key), self.span)

    def _prio_after_a_match(self, syn: ClassSyntax) -> None:
        """W379: 'prio' after a match on a class's line is the class's priority, not the
        match's (found by a tester: 'match dport 80 prio 1', tc's filter prio, changed the
        class's and no filter's)."""
        matched = None
        for opt in syn.opts:
            if isinstance(opt, ir.Match):
                matched = opt
            elif matched is not None and isinstance(opt, Param) and opt.key == "prio":
                self.error(
                    Diagnostic.warning(
                        "W379",
                        f"'prio' after a match is the priority of class '{syn.name}' (which class "
                        "is offered spare bandwidth first), not the match's: tc's filter 'prio' is "
                        "'pref' here ('match dport 80 pref 1'); write the class's prio before "
                        "its matches",
                        opt.span.prefix(len("prio")),
                        Note("after this match", matched.span),
                    )
                )
                return

    def _member(self, syn: ClassSyntax | SubscribersSyntax) -> ir.Class | None:
        """A class of the body, or the stand-in of a subscribers statement."""
        if isinstance(syn, SubscribersSyntax):
            return placeholder(self, syn)
        return self.klass(syn)

    def klass(self, syn: ClassSyntax) -> ir.Class:
        kind = self.kind
        self._prio_after_a_match(syn)
        values, handle, matches = self._values(
            syn.opts,
            _class_params(kind),
            CLASS_FLAGS[kind],
            f"{'an' if kind in ('htb', 'hfsc') else 'a'} {kind} class",
            PERCENT_OK if kind != "prio" else frozenset(),
            handle_kw="id",
        )
        children: list[ir.Class] = []
        leaves: list[ir.Qdisc] = []
        for item in syn.body:
            if isinstance(item, ClassSyntax):
                children.append(self.klass(item))
            elif isinstance(item, SubscribersSyntax):
                stand_in = placeholder(self, item)
                if stand_in is not None:
                    children.append(stand_in)
            elif isinstance(item, ir.Match):
                matches.append(item)
            elif isinstance(item, QdiscSyntax):
                leaves.append(item.qdisc)
                nested_stab(self.b, item)
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
        flags = {k: values.pop(k, False) for k in ("bounded", "isolated", "overbook")}
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


def _fields(values: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The values of ``kind``'s parameters, by name (None where not given)."""
    return {key: values.get(key) for key in QDISC_PARAMS[kind]}


def _either(values: Mapping[str, Any], on: str, off: str) -> bool | None:
    """A pair of flags (``ecn``/``noecn``): True, False, or None when neither is given."""
    return True if values.get(on) else (False if values.get(off) else None)


SET_DSCP = "set dscp"
"""The key of a class's ``set dscp`` among its options (two words: never a parameter name)."""


@functools.cache
def _class_params(kind: str) -> Mapping[str, Dimension]:
    """The parameters of a class of ``kind``, with its ``set dscp`` (made once per kind)."""
    return {**CLASS_PARAMS[kind], SET_DSCP: C}


def _opt_key(
    opt: Param | Flag | DefaultOpt | HandleOpt | PriomapOpt | CurveOpt | SetDscpOpt,
) -> str:
    match opt:
        case SetDscpOpt():
            return SET_DSCP
        case Param() | Flag() | CurveOpt():
            return opt.key
        case DefaultOpt():
            return "default"
        case HandleOpt():
            return opt.keyword
        case PriomapOpt():
            return "priomap"


def nested_stab(b: Builder, syn: QdiscSyntax) -> None:
    """Report link-layer words on a qdisc below the root (a size table is the root's)."""
    if syn.stab is not None:
        b.error(
            Diagnostic.error(
                "E232",
                f"link-layer words belong on the interface's root qdisc (its size table) or on "
                f"a cake; this {syn.qdisc.kind} is below the root",
                syn.stab.span,
            )
        )


def syn_label(syn: ClassSyntax) -> str:
    return f"class '{syn.name}'"
