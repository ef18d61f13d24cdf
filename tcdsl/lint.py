"""Lints: advice over the allocated policy, where filter order, prefs and marks are final.

The checks (``tcdsl.checks``) find what tc or the kernel would refuse; the lints find what the
kernel accepts but that silently does something other than what the policy seems to say:
filters that never see a packet, classes nothing reaches, quanta and bursts the kernel adjusts,
queues that drop everything. Every lint is a function from an allocated policy to diagnostics;
``LINTS`` lists them in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tcdsl import ir, linklayer, lower, u32layout
from tcdsl.allocate import IPV6_PREF_OFFSET
from tcdsl.checks import effective_ceil, htb_ceiling, rate_of, sites
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.directions import marks_kept_apart
from tcdsl.matching import Bits, filter_bits, kernel_order, match_pref
from tcdsl.tcmath import HTB_QUANTUM, htb_quantum, htb_r2q_fits
from tcdsl.units import format_rate, format_size, format_time

Lint = Callable[[ir.Policy], Iterator[Diagnostic]]

HZ = 250
"""Debian's CONFIG_HZ; tc-tbf(8) sizes the smallest useful tbf burst as rate / HZ."""
NETEM_DEFAULT_LIMIT = 1000
"""sch_netem: packets it holds when no ``limit`` is given."""
SFQ_MIN_PERTURB = 10


def _rate(bits: int) -> str:
    return format_rate(bits)


# ---- defaults and reachability -----------------------------------------------------------------


def htb_has_default(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An htb without ``default`` sends what no filter matches to its direct queue, unshaped."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Htb) and q.default is None:
                yield Diagnostic.warning(
                    "W310",
                    "htb has no 'default' class: packets no filter matches (ARP among them, "
                    "and a family the tree does not classify) leave through htb's direct "
                    "queue, at line rate and ahead of every class",
                    q.span.prefix(len(q.kind)),
                )


def hfsc_has_default(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An hfsc without ``default`` drops what no filter matches: the classic hfsc trap."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Hfsc) and q.default is None:
                yield Diagnostic.warning(
                    "W345",
                    "hfsc has no 'default' class: the kernel DROPS every packet no filter "
                    "matches (ARP too, so the link may stop working, and a family the tree "
                    "does not classify); name a leaf class with 'default NAME'",
                    q.span.prefix(len(q.kind)),
                )


def leaves_reachable(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Every htb or hfsc leaf class is reached by a filter, a mark, or the default."""
    for s in sites(policy):
        if not isinstance(s.qdisc, ir.Htb | ir.Hfsc) or s.cls.children or s.cls.implicit:
            continue
        default = s.qdisc.default
        if s.cls.matches or (default is not None and default.name == s.cls.name):
            continue
        if s.cls.from_table:  # its devices have no address: W372 said so where they are
            continue
        if "@" in s.cls.name:  # a spread tree's copy (NAME@N): said once, for the original
            continue
        if s.iface.marking is not None and s.cls.mark is not None:
            yield Diagnostic.warning(
                "W322",
                f"nothing in this policy sets mark {s.cls.mark.value}: only packets marked "
                f"elsewhere (another firewall rule) reach {s.cls.label}",
                s.cls.mark.span,
            )
            continue
        yield Diagnostic.warning(
            "W311",
            f"no packet can reach {s.cls.label}: it has no match line and it is not the "
            f"{s.qdisc.kind}'s default",
            s.cls.head,
        )


# ---- filter order: shadowed, duplicate and catch-all matches -----------------------------------


class Alternative(NamedTuple):
    """One alternative of a match line (one value of each comma list), as its filters.

    (A named tuple, not a frozen dataclass: there is one for each filter of a large policy,
    and a tuple is made several times faster.)"""

    match: ir.Match
    cls: ir.Class
    conds: tuple[ir.Cond, ...]
    filters: tuple[Bits, ...]


def _alternatives(
    match: ir.Match, cls: ir.Class, iface: ir.Interface
) -> dict[ir.Family, list[Alternative]]:
    """The alternatives of ``match`` that are filters, by family, as u32 bits (a flower
    filter tests the same fields, so the same bits stand for it here)."""
    by_family: dict[ir.Family, list[Alternative]] = {}
    if match.broken:  # without its failed condition it may look a catch-all (W314)
        return by_family
    for family, conds in lower.filter_alternatives(match, iface.families, iface.classifier):
        keysets = lower.u32_keys(conds, family)
        filters: tuple[Bits, ...]
        if len(keysets) == 1:  # the common case: one filter (no port range to split)
            bits = filter_bits(keysets[0])
            filters = () if bits is None else (bits,)
        else:
            filters = tuple(b for keys in keysets if (b := filter_bits(keys)) is not None)
        if filters:
            alt = Alternative(match, cls, conds, filters)
            found = by_family.get(family)
            if found is None:
                by_family[family] = [alt]
            else:
                found.append(alt)
    return by_family


_Line = tuple[ir.Match, dict[ir.Family, list[Alternative]]]
"""A match line with its alternatives by family."""


def _classification_orders(
    policy: ir.Policy,
) -> Iterator[tuple[tuple[int, int], ir.Family, list[Alternative]]]:
    """Yield (where, family, alternatives in the order the kernel tries them) for every filter
    list, ``where`` naming the list the same way for both families.

    With ``classify by mark`` the iptables rules are tried first, in the order written (first
    mark wins); match lines that keep their own ``pref`` stay u32 filters at that qdisc.
    """
    for iface in policy.interfaces:
        marks = iface.marking is not None
        # Each line's alternatives, worked out once for all the families, and the lines of
        # each qdisc that has some in the order the kernel tries them (all the alternatives
        # of a line share its pref, so sorting the lines sorts their alternatives).
        lines: list[tuple[ir.Qdisc, list[_Line], list[_Line]]] = []
        for q in ir.walk_qdiscs(iface.root):
            found = [
                (m, _alternatives(m, cls, iface)) for cls in ir.classes_of(q) for m in cls.matches
            ]
            if found:
                lines.append((q, found, kernel_order(found, lambda line: match_pref(line[0]))))
        for family in iface.families:
            if marks:
                ordered = [
                    a
                    for _, found, _ in lines
                    for m, by_family in found
                    if m.pref is None
                    for a in by_family.get(family, ())
                ]
                yield (id(iface), 0), family, ordered
            for q, _, tried in lines:
                added = [
                    a
                    for m, by_family in tried
                    if not marks or m.pref is not None
                    for a in by_family.get(family, ())
                ]
                if added:
                    yield (id(iface), id(q)), family, added
            if isinstance(iface.root, ir.Mq) and not marks:
                # the steering filters try every queue's lines in one list: by level, pref,
                # then the tree's order (not the lines below a prio's bands: a packet meets
                # the lines below one band only, which one by its priority)
                order = ir.mq_line_order(iface.root, banded=False)
                steered = sorted(
                    (
                        a
                        for _, found, _ in lines
                        for _, by_family in found
                        for a in by_family.get(family, ())
                        if id(a.cls) in order
                    ),
                    key=lambda a: (order[id(a.cls)][0], match_pref(a.match), order[id(a.cls)]),
                )
                if steered:
                    yield (id(iface), id(iface.root)), family, steered


Masks = tuple[tuple[int, ...], tuple[int, ...]]
"""The words a filter tests without their values: (offsets, masks)."""


def _split(f: Bits) -> tuple[Masks, tuple[int, ...]]:
    """A filter's tested bits and their values (the values are already masked)."""
    if not f:
        return ((), ()), ()
    offsets, values, masks = zip(*f, strict=True)
    return (offsets, masks), values


_Table = dict[tuple[int, ...], tuple[int, Alternative]]
"""Filters testing the same bits, by their values: (the order added, the alternative)."""
_Reading = tuple[tuple[int, int], ...]
"""How to read another set of bits' values from a filter's: (position, mask) per word."""


class _Earlier:
    """The filters seen so far, indexed so that finding one that matches a superset of a new
    filter's packets costs one lookup per distinct set of tested bits, not one per filter."""

    def __init__(self) -> None:
        # tested bits -> their values -> (the order the alternative was added in, it)
        self.by_masks: dict[Masks, _Table] = {}
        self.added = 0
        # A filter's tested bits -> for each earlier set of tested bits that tests a subset
        # of them, its table and how to read its values from the filter's: the positions of
        # its words among the filter's, with their masks (None: the same bits). Worked out
        # once per pair of bit sets, not per filter; forgotten when a new set is added.
        self._plans: dict[Masks, list[tuple[_Table, _Reading | None]]] = {}

    def _plan(self, masks: Masks) -> list[tuple[_Table, _Reading | None]]:
        plan = self._plans.get(masks)
        if plan is None:
            at = {o: (i, m) for i, (o, m) in enumerate(zip(*masks, strict=True))}
            plan = []
            for theirs, table in self.by_masks.items():
                where: list[int] = []
                for o, m in zip(*theirs, strict=True):
                    if o not in at or m & ~at[o][1]:
                        break
                    where.append(at[o][0])
                else:
                    reading = tuple(zip(where, theirs[1], strict=True))
                    plan.append((table, None if theirs == masks else reading))
            self._plans[masks] = plan
        return plan

    def covering(self, masks: Masks, values: tuple[int, ...]) -> Alternative | None:
        """The first earlier alternative with a filter matching every packet the filter
        testing ``masks`` for ``values`` matches."""
        best: tuple[int, Alternative] | None = None
        for table, reading in self._plan(masks):
            if reading is None:
                hit = table.get(values)
            else:
                hit = table.get(tuple(values[i] & m for i, m in reading))
            if hit is not None and (best is None or hit[0] < best[0]):
                best = hit
        return best[1] if best is not None else None

    def add(self, alt: Alternative, split: list[tuple[Masks, tuple[int, ...]]]) -> None:
        """Remember ``alt``'s filters, ``split`` by :func:`_split` (an earlier one wins for
        identical bits)."""
        for masks, values in split:
            table = self.by_masks.get(masks)
            if table is None:
                table = self.by_masks[masks] = {}
                self._plans.clear()
            table.setdefault(values, (self.added, alt))
        self.added += 1


def _is_catch_all(alt: Alternative) -> bool:
    return () in alt.filters  # a filter testing no bits


def filters_all_reachable(policy: ir.Policy) -> Iterator[Diagnostic]:
    """No match line is hidden behind an earlier one that takes every packet it would match.

    Each family's filters are a list of their own: a line or value is said to be hidden when
    it is in every family it has filters in (an IPv4 line cannot hide an IPv6 value)."""
    lists: dict[tuple[int, int], list[_Shadows]] = {}
    for where, family, ordered in _classification_orders(policy):
        lists.setdefault(where, []).append(_shadowing(ordered, family))
    for found in lists.values():
        # Only a line with an alternative another line covers can be reported: gather the
        # alternatives of every family for those lines alone.
        dead: set[int] = set()
        for shadows in found:
            dead |= shadows.dead
        by_line: dict[int, tuple[ir.Match, list[tuple[Alternative, Alternative | None]]]] = {}
        for shadows in found if dead else ():
            for key, (match, alts) in shadows.by_line.items():
                if key in dead:
                    by_line.setdefault(key, (match, []))[1].extend(alts)
        for match, alts in by_line.values():
            yield from _report_line(match, alts)
        yield from _catch_all_warning(found)


@dataclass
class _Shadows:
    """What one family's filter list shows: each line's alternatives with the earlier one that
    covers each (None: reachable), and the first catch-all with the lines tried after it."""

    family: ir.Family
    by_line: dict[int, tuple[ir.Match, list[tuple[Alternative, Alternative | None]]]]
    catch_all: Alternative | None
    after_catch_all: dict[int, ir.Match]
    dead: set[int]
    """The lines (by id) with an alternative covered by another line's: the only ones
    :func:`_report_line` can report."""


def _shadowing(ordered: Sequence[Alternative], family: ir.Family) -> _Shadows:
    earlier = _Earlier()
    catch_all: Alternative | None = None
    after_catch_all: dict[int, ir.Match] = {}  # by id, in the order tried
    by_line: dict[int, tuple[ir.Match, list[tuple[Alternative, Alternative | None]]]] = {}
    dead: set[int] = set()
    covering = earlier.covering
    for alt in ordered:
        if catch_all is not None:
            if alt.match is not catch_all.match:
                after_catch_all.setdefault(id(alt.match), alt.match)
            continue
        split = [_split(f) for f in alt.filters]
        # the alternative is hidden if each of its filters is: by the cover of its first
        culprit = covering(*split[0])
        if culprit is not None:
            for masks, values in split[1:]:
                if covering(masks, values) is None:
                    culprit = None
                    break
        match = alt.match
        line = by_line.get(id(match))
        if line is None:
            line = by_line[id(match)] = (match, [])
        line[1].append((alt, culprit))
        if _hidden(match, alt, culprit):
            dead.add(id(match))
        police = match.police
        if police is not None and police.exceed == "continue":
            # what exceeds the rate goes on to the lines after: they are not hidden
            continue
        earlier.add(alt, split)
        if _is_catch_all(alt):
            catch_all = alt
    return _Shadows(family, by_line, catch_all, after_catch_all, dead)


def _catch_all_warning(found: list[_Shadows]) -> Iterator[Diagnostic]:
    """W314 for the first catch-all of the lists, naming the lines it hides in every family
    they have filters in."""
    firsts = [s for s in found if s.catch_all is not None]
    if not firsts:
        return
    catch_all = firsts[0].catch_all
    assert catch_all is not None
    # The lines after it in any family's list (an IPv6 line is in the IPv6 list alone)
    hidden: dict[int, ir.Match] = {}
    for shadows in firsts:
        if shadows.catch_all is not None and shadows.catch_all.match is catch_all.match:
            for k, m in shadows.after_catch_all.items():
                hidden.setdefault(k, m)
    for shadows in found:
        if shadows.catch_all is None or shadows.catch_all.match is not catch_all.match:
            # This family has no catch-all (or another one): its lines with filters are seen.
            hidden = {k: m for k, m in hidden.items() if k not in shadows.by_line}
        else:  # hidden where it has filters: a line of one family has none in the other
            hidden = {
                k: m
                for k, m in hidden.items()
                if k in shadows.after_catch_all or k not in shadows.by_line
            }
    if hidden:
        n = len(hidden)
        yield Diagnostic.warning(
            "W314",
            f"this match line takes every packet for {catch_all.cls.label}, so the "
            f"{n} match line{'s' * (n != 1)} tried after it never see{'s' * (n == 1)} a packet",
            catch_all.match.span,
            Note("for example this one", min((m.span for m in hidden.values()), key=_written)),
        )


def _written(span: Span) -> tuple[str, int, int]:
    """Where a span is in the text, to take the first one written."""
    return span.file, span.line, span.column


def _report_line(
    match: ir.Match, alts: list[tuple[Alternative, Alternative | None]]
) -> Iterator[Diagnostic]:
    dead = [(a, c) for a, c in alts if _hidden(match, a, c)]
    if not dead:
        return
    # A value is reported when it is hidden in every family it has filters in.
    seen = [a for a, c in alts if not _hidden(match, a, c)]
    live = {_values_span(match, a) for a in seen}
    live_values = {span for a in seen for span in _value_spans(match, a)}
    if len(dead) != len(alts):
        dead = [
            (a, c)
            for a, c in dead
            if (_values_span(match, a) not in live if c is None or c.match is not match
                else _differing(match, a, c)[0] not in live_values)
        ]  # fmt: skip
        if not dead:
            return
    first, culprit = dead[0]
    assert culprit is not None
    if len(dead) == len(alts):
        same = {c.match.span for _, c in dead if c is not None}
        if len(same) == 1 and _same_packets(first, culprit) and culprit.cls is not first.cls:
            yield Diagnostic.warning(
                "W313",
                f"{culprit.cls.label} already matches exactly these packets with an earlier "
                f"line, so this line never sends a packet to {first.cls.label}",
                match.span,
                Note(f"the packets go to {culprit.cls.label} here", culprit.match.span),
            )
            return
        whom = "the same class" if culprit.cls is first.cls else culprit.cls.label
        yield Diagnostic.warning(
            "W312",
            f"this match line never matches: an earlier line sends every packet it would "
            f"match to {whom}",
            match.span,
            Note("that earlier line", culprit.match.span),
        )
        return
    said: set[Span] = set()
    for alt, culprit in dead:
        assert culprit is not None
        if culprit.match is match:
            span, earlier = _differing(match, alt, culprit)
            if span in said:
                continue
            said.add(span)
            yield Diagnostic.warning(
                "W312",
                "this value never matches: an earlier value of this line takes every packet "
                "it would match",
                span,
                Note("that earlier value", earlier),
            )
            continue
        span = _values_span(match, alt)
        if span in said:
            continue
        said.add(span)
        whom = "the same class" if culprit.cls is alt.cls else culprit.cls.label
        yield Diagnostic.warning(
            "W312",
            f"this value never matches: an earlier line sends every packet it would match "
            f"to {whom}",
            span,
            Note("that earlier line", culprit.match.span),
        )


def _hidden(match: ir.Match, alt: Alternative, culprit: Alternative | None) -> bool:
    """Whether ``culprit`` (what covers ``alt``, a filter of ``match``) hides it: another
    line, or another value of this line (``dst 10.0.0.0/8, 10.1.2.3``; a value is not hidden
    by its own combinations with other lists' values)."""
    if culprit is None:
        return False
    return culprit.match is not match or _value_spans(match, culprit) != _value_spans(match, alt)


def _value_spans(match: ir.Match, alt: Alternative) -> tuple[Span, ...]:
    """The spans of the values that make this alternative, one for each condition."""
    return tuple(c.span for c in alt.conds[len(alt.conds) - len(match.conds) :])


def _differing(match: ir.Match, alt: Alternative, culprit: Alternative) -> tuple[Span, Span]:
    """Where two alternatives of one line differ first: ``alt``'s value, ``culprit``'s."""
    for mine, theirs in zip(_value_spans(match, alt), _value_spans(match, culprit), strict=True):
        if mine != theirs:
            return mine, theirs
    return match.span, match.span


def _same_packets(a: Alternative, b: Alternative) -> bool:
    return set(a.filters) == set(b.filters)


def _values_span(match: ir.Match, alt: Alternative) -> Span:
    """The span of the listed value that makes this alternative (the first one from a list)."""
    # An IPv6 (or flower) port line's alternatives start with the TCP or UDP guard.
    conds = alt.conds[len(alt.conds) - len(match.conds) :]
    for original, single in zip(match.conds, conds, strict=True):
        if single is not original:
            return single.span
    return match.span


# ---- rates, bursts and quanta ------------------------------------------------------------------


def htb_quantum_in_range(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An htb's own r2q keeps its classes' quanta (rate / r2q) where the kernel keeps them.

    Without ``r2q`` allocation chooses one (or quanta) that does; so this warns, once per htb,
    only about an r2q the policy gives.
    """
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
            if not isinstance(q, ir.Htb) or q.r2q is None:
                continue
            r2q = q.r2q.value
            out: list[tuple[ir.Class, int, int, int]] = []
            rates: list[tuple[int, bool]] = []
            for cls in ir.classes_of(q):
                rate = rate_of(cls.rate)
                if cls.quantum is not None or rate is None:
                    continue
                computed, kept = htb_quantum(rate.bits_per_second, r2q)
                rates.append((rate.bits_per_second // 8, not cls.children))
                if computed != kept:
                    out.append((cls, rate.bits_per_second, computed, kept))
            if out:
                yield _quantum_warning(q.r2q, out, rates)


def _quantum_warning(
    r2q: ir.Count, out: list[tuple[ir.Class, int, int, int]], rates: list[tuple[int, bool]]
) -> Diagnostic:
    """The one W316 of an htb: ``out`` holds the classes out of range (class, rate, quantum
    computed, quantum kept), ``rates`` every class's rate in bytes and whether it is a leaf."""
    lo, hi = HTB_QUANTUM
    leaves = [cls for cls, *_ in out if not cls.children]
    fits = htb_r2q_fits([b for b, leaf in rates if leaf], [b for b, _ in rates])
    if not leaves:
        fix = "harmless, as only leaf classes use their quantum"
    elif fits is not None:
        fix = (
            f"write r2q {fits[0]}"
            if fits[0] == fits[1]
            else (f"write an r2q between {fits[0]} and {fits[1]}")
        )
        fix += ", or leave r2q out and tcdsl chooses one"
    else:
        fix = (
            f"no r2q suits every leaf class (their rates are more than {hi // lo} times apart): "
            f"give {_labels(leaves)} a 'quantum', or leave r2q out and tcdsl gives "
            f"{'it' if len(leaves) == 1 else 'them'} one"
        )
    words = sorted({"small" if computed < kept else "big" for _, _, computed, kept in out})
    notes = [
        Note(
            f"{cls.label}: rate {_rate(bits)} / r2q {r2q.value} = {computed} bytes; the kernel "
            f"uses {kept}",
            cls.rate.span if isinstance(cls.rate, ir.Rate) else cls.span,
        )
        for cls, bits, computed, kept in out
    ]
    return Diagnostic.warning(
        "W316",
        f"r2q {r2q.value} puts the htb quantum (rate / r2q, in bytes) of "
        f"{_labels([cls for cls, *_ in out])} outside the kernel's {lo}..{hi}: it warns "
        f"{' and '.join(repr(f'quantum of class is {w}') for w in words)} and clamps "
        f"{'it' if len(out) == 1 else 'them'}; {fix}",
        r2q.span,
        *notes,
    )


def _labels(classes: list[ir.Class], most: int = 3) -> str:
    """``class 'a'``, ``class 'a' and class 'b'``, ..., ``class 'a', ... and 5 more classes``."""
    names = [c.label for c in classes[:most]]
    if len(classes) > most:
        names.append(f"{len(classes) - most} more classes")
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} and {names[-1]}"


def htb_bursts_hold_a_frame(policy: ir.Policy) -> Iterator[Diagnostic]:
    """An htb burst or cburst holds at least one full-size frame: one written so, and one
    left to tc below :data:`FAST_BURST_RATE` (a tree's classes above it get one warning each,
    or one at the first with their count past :data:`FAST_SHOWN`)."""
    fast: dict[str, list[tuple[ir.Class, list[tuple[str, ir.Rate]]]]] = {}
    # by id(interface): a full-size frame as the interface's size table charges it
    frames = {id(i): linklayer.charged_frame(i.stab) for i in policy.interfaces}
    for s in sites(policy):
        if s.qdisc.kind != "htb":
            continue
        left: list[tuple[str, ir.Rate]] = []
        for name in ("burst", "cburst"):
            size = getattr(s.cls, name)
            if isinstance(size, ir.Size) and size.bytes < frames[id(s.iface)]:
                keeps = "ceil" if name == "cburst" else "rate"
                yield Diagnostic.warning(
                    "W315",
                    f"{name} {format_size(size.bytes)} is smaller than "
                    f"{linklayer.frame_words(frames[id(s.iface)])}: {s.cls.label} cannot send "
                    f"such a frame without going into debt, and will not keep to its {keeps}",
                    size.span,
                )
            rate = rate_of(s.cls.rate) if name == "burst" else effective_ceil(s.cls)
            if size is None and rate is not None and rate.bits_per_second >= FAST_BURST_RATE:
                left.append((name, rate))
        if left:
            fast.setdefault(s.iface.label, []).append((s.cls, left))
    for classes in fast.values():
        # the classes as written: an mq tree's default class has a copy on each queue
        # (``unknown@2``), with its span (found by a tester: they were counted and named)
        written: dict[Span, tuple[ir.Class, list[tuple[str, ir.Rate]]]] = {}
        for cls, left in classes:
            had = written.get(cls.span)
            if had is None or ("@" in had[0].name and "@" not in cls.name):
                written[cls.span] = (cls, left)
        found = list(written.values())
        shown = found if len(found) <= FAST_SHOWN else found[:1]
        more = len(found) - len(shown)
        for cls, left in shown:
            yield _fast_burst(cls, left, more)


FAST_BURST_RATE = 1_000_000_000
"""From 1gbit, tc's default htb burst (one 1600-byte frame, plus the rate for a nanosecond)
lasts under 13 microseconds, and the kernel keeps it as less than one full-size frame: 1375
bytes at 1gbit, 0 from about 8gbit (``tc -d class show``; ``tests/test_lint_kernel.py``).
Measured on a veth offered 6gbit of full frames, a class sent 91% of its rate at 1gbit, 60%
at 2gbit and 54% at 3gbit with it, 100% with a burst of 1 ms at its rate (2026-12-06). Below
1gbit the kernel keeps less than a frame too (from about 470mbit), but the class fell short by
1-2% at 500 and 700mbit, 6% at 900mbit: not warned."""
FAST_SHOWN = 3
"""A tree's classes that W315 names one by one for a burst left to tc above
:data:`FAST_BURST_RATE`; more are one warning, at the first, with their count."""


def _fast_burst(cls: ir.Class, left: list[tuple[str, ir.Rate]], more: int) -> Diagnostic:
    """W315 for a class whose burst (or cburst, or both) tc chooses at ``left``'s rates."""
    names = " and ".join(name for name, _ in left)
    of = [("rate" if name == "burst" else "ceil", r) for name, r in left]
    keeps = " and ".join(what for what, _ in of)
    rates = " and ".join(f"{what} {_rate(r.bits_per_second)}" for what, r in of)
    # 1 ms at the rate, in whole kilobytes (rounded up)
    wanted = " ".join(f"{name} {-(-r.bits_per_second // 8_192_000)}k" for name, r in left)
    also = f" (and {more} more classes of this tree)" if more else ""
    where = " on its subscribers statement, for all its classes" if cls.from_table else ""
    return Diagnostic.warning(
        "W315",
        f"{cls.label} has no {names}: at its {rates}, tc's default (one "
        f"1600-byte frame) lasts under 13 microseconds, the kernel keeps it as less than "
        f"one full-size frame ({linklayer.FRAME} bytes), and the class falls short of its {keeps} "
        f"(measured: by a tenth at 1gbit, by 40% at 2gbit){also}; write '{wanted}'{where} "
        "(1 ms at each, as sqm-scripts gives)",
        left[0][1].span,
    )


def tbf_bursts_fit(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A tbf burst holds a full-size frame and what the rate sends in one timer tick; with a
    peakrate, its mtu holds a full-size frame."""
    for iface in policy.interfaces:
        frame = linklayer.charged_frame(iface.stab)  # the size table made once per interface
        for q in ir.walk_qdiscs(iface.root):
            if not isinstance(q, ir.Tbf):
                continue
            if q.peakrate is not None and q.mtu is not None and q.mtu.bytes < frame:
                yield Diagnostic.warning(
                    "W317",
                    f"tbf mtu {format_size(q.mtu.bytes)} is smaller than "
                    f"{linklayer.frame_words(frame)}: with a peakrate, the tbf drops every "
                    f"packet bigger than its mtu; give an mtu of at least {frame} bytes",
                    q.mtu.span,
                    Note("peakrate given here", q.peakrate.span),
                )
            if q.burst is None or q.rate is None:
                continue
            burst, rate = q.burst.bytes, q.rate.bits_per_second
            tick = rate // 8 // HZ
            if burst < frame:
                yield Diagnostic.warning(
                    "W317",
                    f"tbf burst {format_size(burst)} is smaller than "
                    f"{linklayer.frame_words(frame)}: the tbf drops every packet bigger "
                    "than its burst",
                    q.burst.span,
                )
            elif burst < tick:
                yield Diagnostic.warning(
                    "W317",
                    f"tbf burst {format_size(burst)} is less than rate {_rate(rate)} sends in "
                    f"one timer tick at HZ={HZ} ({tick} bytes): the tbf may not reach its rate "
                    f"(tc-tbf(8): the smallest burst is rate / HZ)",
                    q.burst.span,
                    Note("rate given here", q.rate.span),
                )


def ceilings_share_sensibly(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Info: children that may together borrow far more than the parent can give."""
    for s in sites(policy):
        if s.qdisc.kind != "htb" or len(s.cls.children) < 2:
            continue
        parent = htb_ceiling(s.cls, s.parent is None)
        ceils = [c for child in s.cls.children if (c := effective_ceil(child)) is not None]
        if parent is None or len(ceils) < 2:
            continue
        total = sum(c.bits_per_second for c in ceils)
        if total > 2 * parent.bits_per_second:
            lends = "ceiling"
            if s.parent is None and not s.cls.implicit:
                lends = "rate (it has no parent to borrow from)"
            yield Diagnostic.info(
                "I320",
                f"the children of {s.cls.label} may borrow up to {_rate(total)} in all, "
                f"{total / parent.bits_per_second:.1f} times its {lends} "
                f"{_rate(parent.bits_per_second)}: when they are all busy, spare bandwidth goes "
                "first to the lowest prio, then in proportion to their quanta",
                parent.span if not s.cls.implicit else s.iface.span,
            )


# ---- matches -----------------------------------------------------------------------------------

PORTLESS = {
    1: "icmp",
    2: "igmp",
    4: "ipip",
    41: "ipv6",
    47: "gre",
    50: "esp",
    51: "ah",
    58: "icmpv6",
    89: "ospf",
    103: "pim",
    112: "vrrp",
}


def u32_lines_before_marks(policy: ir.Policy) -> Iterator[Diagnostic]:
    """With a default class, the marking chain gives every packet it sees a mark an fw
    filter takes: a match line with its own pref after the fw filters sees only the packets
    the chain does not. At postrouting that is none; marking what arrives on any interface,
    only what the host sends itself. (Marking what arrives on one interface, or what the
    host sends, leaves the rest to such a line.) One warning per written pref: the lines of a
    subscribers statement share its."""
    for iface in policy.interfaces:
        m = iface.marking
        root = iface.root
        if m is None or not isinstance(root, ir.Htb | ir.Hfsc) or root.default is None:
            continue
        if m.hook == "postrouting":
            seen_by_none = "it never matches"
        elif m.hook == "prerouting" and m.from_interface is None:
            seen_by_none = "it classifies only what this host sends itself"
        else:
            continue
        fw_pref = m.fw_pref
        warned: set[Span] = set()
        for cls in ir.classes_of(root):
            for line in cls.matches:
                if line.pref is None or line.pref.value <= fw_pref or line.pref.span in warned:
                    continue
                warned.add(line.pref.span)
                yield Diagnostic.warning(
                    "W355",
                    f"this match line is tried after the fw filters (pref {fw_pref}), which "
                    f"take every packet the marking chain sees ({m.source(iface.name)}): it "
                    f"gives each unmarked one the default class's mark; {seen_by_none}",
                    line.pref.span,
                )


U32_ORDERED = u32layout.ORDER_KEPT
"""How many u32 filters one pref keeps in their order without handles: u32 numbers a pref's
filters 0x800 to 0xfff as they are made, then goes on from 0x001 (and past 0xfff gives every
further one the same number), and tries them by number. Allocate gives a longer pref's
filters handles and tables (``tcdsl.u32layout``) unless the parent has no table id left."""


def u32_order_kept(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A pref of more u32 filters than the kernel keeps in order, left without handles
    (``u32layout`` found no table id left under its parent): the 2,049th would be tried
    before the first, so the first match would not win."""
    for iface in policy.interfaces:
        counts: dict[tuple[ir.Handle, str, int], int] = {}
        for f in iface.filters:
            if not isinstance(f, ir.U32Filter) or f.place is not None:
                continue
            key = (f.parent, f.family, f.pref)
            counts[key] = counts.get(key, 0) + 1
            if counts[key] != U32_ORDERED + 1:
                continue
            pref = f.pref - IPV6_PREF_OFFSET if f.family == "ipv6" else f.pref
            family = "IPv6" if f.family == "ipv6" else "IPv4"
            yield Diagnostic.error(
                "E262",
                f"more than {U32_ORDERED} {family} u32 filters at pref {pref} under {f.parent} "
                f"of {iface.label}, and no u32 table id is left under {f.parent} to keep them "
                "in order: the kernel would number this one and those after it below the "
                "first and try them first; give later match lines a pref of their own "
                "('pref 2')",
                f.span,
            )


U32_PREFS = 2047
"""u32 instances (a protocol and a pref each) one parent holds: each makes a root table whose
id the kernel takes from 0x801 to 0xfff (``gen_new_htid``, net/sched/cls_u32.c); the next
is refused with "Filter already exists" (measured on 6.1 and 6.18). Tables made with a
handle (1: to 7ff:) do not count."""
PREF_MAX = 0xFFFF


def prefs_fit_their_parent(policy: ir.Policy) -> Iterator[Diagnostic]:
    """No parent holds more u32 prefs (IPv4 and IPv6 apart) than the kernel makes, and no
    flower filter gets a pref past its family's range."""
    for iface in policy.interfaces:
        u32: dict[ir.Handle, set[tuple[str, int]]] = {}
        # IPv4's flower prefs stop below IPv6's first where the parent has IPv6 filters too
        # (worked out at the first flower filter: most large policies have none)
        v6: set[ir.Handle] | None = None
        for f in iface.filters:
            if isinstance(f, ir.U32Filter):
                seen = u32.get(f.parent)
                if seen is None:
                    seen = u32[f.parent] = set()
                key = (f.family, f.pref)
                if key in seen:
                    continue
                seen.add(key)
                if len(seen) == U32_PREFS + 1:
                    yield Diagnostic.error(
                        "E263",
                        f"more than {U32_PREFS} u32 prefs under {f.parent} of {iface.label} "
                        "(IPv4 and IPv6 prefs count apart): the kernel makes a root table for "
                        "each and has no table id left for this one; use fewer prefs (hashed "
                        "filters keep the order of any number of lines at one pref)",
                        f.span,
                    )
            elif isinstance(f, ir.FlowerFilter):
                if v6 is None:
                    v6 = {g.parent for g in iface.filters if g.family == "ipv6"}
                top = IPV6_PREF_OFFSET if f.family != "ipv6" and f.parent in v6 else PREF_MAX
                if f.pref > top:
                    yield Diagnostic.error(
                        "E263",
                        f"more flower filters under {f.parent} of {iface.label} than prefs: "
                        f"each takes a pref of its own, this one {f.pref}, past the last one "
                        f"its family has ({top}; IPv4 counts from 1, IPv6 from "
                        f"{IPV6_PREF_OFFSET + 1}); classify these lines with u32",
                        f.span,
                    )
                    break


def tos_leaves_ecn_out(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W380: a tos match whose mask holds the byte's two ECN bits with both 0 in its value:
    an ECN-capable packet does not match (found by a tester: tc's default mask is 0xff)."""
    for m in ir.policy_matches(policy):
        for c in m.conds:
            if (
                isinstance(c, ir.TosCond)
                and c.dscp is None
                and c.mask & 0x3 == 0x3
                and c.mask & 0xFC  # (tos 0x00/0x03 tests the ECN bits on purpose)
                and c.value & 0x3 == 0
            ):
                yield Diagnostic.warning(
                    "W380",
                    f"tos {c.value:#04x}/{c.mask:#04x} also tests the byte's two ECN bits (its "
                    "lowest), so a packet of an ECN-capable flow (most TCP today) does not "
                    f"match; write tos {c.value:#04x}/{c.mask & 0xFC:#04x} to test the TOS bits "
                    "alone",
                    c.span,
                )


def ports_need_a_port_protocol(policy: ir.Policy) -> Iterator[Diagnostic]:
    """A port condition next to a protocol that has no ports tests other header bytes."""
    for m in ir.policy_matches(policy):
        if len(m.conds) < 2:
            continue  # no room for a port and a protocol
        ports = [c for c in m.conds if isinstance(c, ir.PortCond)]
        if not ports:
            continue
        for cond in m.conds:
            if not isinstance(cond, ir.ProtoCond):
                continue
            for number, span in cond.protocols:
                if number in PORTLESS:
                    name = PORTLESS[number]
                    yield Diagnostic.error(
                        "E214",
                        f"{name} has no ports: '{ports[0].field}' would test bytes of the "
                        f"{name} header instead; drop the port, or write a separate match "
                        "line for the protocol",
                        ports[0].span,
                        Note(f"protocol {name} given here", span),
                    )


# ---- leaf queues -------------------------------------------------------------------------------


def leaf_queues_sensible(policy: ir.Policy) -> Iterator[Diagnostic]:
    """Teaching warnings on leaf queues: sfq perturbation, fifo limit 0, small netem limits."""
    for iface in policy.interfaces:
        rates: dict[int, ir.Rate | None] | None = None  # worked out at the first netem
        for q in ir.walk_qdiscs(iface.root):
            match q:
                case ir.Sfq(perturb=ir.Count(value=v, span=span)) if 0 < v < SFQ_MIN_PERTURB:
                    yield Diagnostic.warning(
                        "W318",
                        f"sfq perturb {v} rehashes the flows every {v} s; each rehash may "
                        f"reorder or drop queued packets (tc-sfq(8)); use {SFQ_MIN_PERTURB} s "
                        "or more (the man page advises 60)",
                        span,
                    )
                case (
                    ir.Pfifo(limit=ir.Count(value=0, span=span))
                    | ir.Bfifo(limit=ir.Size(bytes=0, span=span))
                ):
                    yield Diagnostic.warning(
                        "W319",
                        f"{q.kind} limit 0 holds no packet: the queue drops everything sent "
                        "through it",
                        span,
                    )
                case ir.Bfifo(limit=ir.Size(bytes=size, span=span)) if 0 < size < linklayer.FRAME:
                    # (found by a tester: 'bfifo limit 100', meant as packets, dropped all)
                    yield Diagnostic.warning(
                        "W319",
                        f"bfifo limit {size} holds no full-size frame ({linklayer.FRAME} "
                        "bytes): every such packet is dropped (bfifo's limit is in bytes; "
                        "pfifo's counts packets)",
                        span,
                    )
                case ir.Tbf(child=None, limit=ir.Size(bytes=size, span=span)) if (
                    size < linklayer.FRAME
                ):
                    # (its latency makes a queue of at least its burst: W317 below a frame)
                    yield Diagnostic.warning(
                        "W319",
                        f"tbf limit {size} holds no full-size frame ({linklayer.FRAME} bytes): "
                        "every such packet is dropped (tbf's limit is in bytes)",
                        span,
                    )
                case ir.Netem(delay=ir.Time() as delay):
                    if rates is None:
                        rates = _rates_above(iface.root, None)
                    yield from _netem_limit(q, delay, rates.get(id(q)))
                case _:
                    pass


def _rates_above(q: ir.Qdisc, rate: ir.Rate | None) -> dict[int, ir.Rate | None]:
    """Map each qdisc (by id) to the rate that feeds it: its class's ceil, or a tbf's rate."""
    out: dict[int, ir.Rate | None] = {id(q): rate}
    match q:
        case ir.Htb() | ir.Prio() | ir.Cbq():
            for top in q.classes:
                for cls in top.walk():
                    if cls.leaf is not None:
                        out |= _rates_above(cls.leaf, effective_ceil(cls) or rate)
        case ir.Hfsc():
            for cls in ir.classes_of(q):
                if cls.leaf is not None:
                    out |= _rates_above(cls.leaf, cls.ul.m2 if cls.ul is not None else rate)
        case ir.Tbf() | ir.Netem():
            if q.child is not None:
                out |= _rates_above(q.child, q.rate or rate)
        case ir.Mq():
            for queue in q.queues:
                out |= _rates_above(queue.qdisc, rate)
        case _:
            pass
    return out


def _netem_limit(q: ir.Netem, delay: ir.Time, feed: ir.Rate | None) -> Iterator[Diagnostic]:
    rate = q.rate or feed
    if rate is None:
        return
    held = rate.bits_per_second * delay.microseconds // (8 * linklayer.FRAME * 1_000_000)
    limit = q.limit.value if q.limit is not None else NETEM_DEFAULT_LIMIT
    if held <= limit:
        return
    suggestion = -(-held * 5 // 4 // 100) * 100
    what = "its limit" if q.limit is not None else "its default limit"
    yield Diagnostic.warning(
        "W321",
        f"netem holds at most {limit} packets ({what}), but {format_time(delay.microseconds)}"
        f" of delay at {_rate(rate.bits_per_second)} keeps about {held} full-size packets in "
        f"it: the rest are dropped; give netem 'limit {suggestion}'",
        q.limit.span if q.limit is not None else q.span.prefix(len(q.kind)),
        Note("delay given here", delay.span),
    )


def policers_do_not_reclassify(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W361: ``reclassify`` starts classification again at the first filter; the policer that
    sent the packet back meets it again (its tokens no fuller a moment later), and after 16
    rounds the kernel drops the packet and logs "reclassify loop" (cls_api.c)."""
    seen: set[Span] = set()
    for iface in policy.interfaces:
        for f in iface.filters:
            p = f.police if isinstance(f, ir.U32Filter) else None
            if p is None or p.exceed != "reclassify" or p.span in seen:
                continue
            seen.add(p.span)
            yield Diagnostic.warning(
                "W361",
                "'reclassify' sends traffic above the rate back to the first filter, where this "
                "policer meets it again; after 16 rounds the kernel drops it (and logs "
                "'reclassify loop'): write 'drop', or 'continue' to go on to the next filter",
                p.exceed_span or p.span,
            )


# ---- hfsc service curves -----------------------------------------------------------------------


def hfsc_curves_consistent(policy: ir.Policy) -> Iterator[Diagnostic]:
    """hfsc curves the kernel accepts but cannot honour as written: rt on an inner class (only
    leaves are served in real time), link shares of children above their parent's, ul below rt
    (rt is served even above ul), and real-time guarantees above an ancestor's ul."""
    for s in sites(policy):
        cls = s.cls
        if not isinstance(s.qdisc, ir.Hfsc):
            continue
        if cls.rt is not None and cls.children:
            yield Diagnostic.warning(
                "W346",
                f"{cls.label} has child classes, so its rt curve is never used: the kernel "
                "serves real-time curves of leaf classes only; give rt to the leaves",
                cls.rt.span,
            )
        if cls.ls is not None and cls.children:
            shares = [c for c in cls.children if c.ls is not None]
            total = sum(c.ls.m2.bits_per_second for c in shares if c.ls is not None)
            if total > cls.ls.m2.bits_per_second:
                yield Diagnostic.warning(
                    "W348",
                    f"the ls curves of {cls.label}'s children sum to {_rate(total)}, above its "
                    f"own ls {_rate(cls.ls.m2.bits_per_second)}: the kernel shares in proportion, "
                    "so each child gets less than its ls says",
                    cls.ls.span,
                    *(
                        Note(f"{c.label}: ls {_rate(c.ls.m2.bits_per_second)}", c.ls.span)
                        for c in shares
                        if c.ls is not None
                    ),
                )
        ul, rt = cls.ul, cls.rt
        below = ul is not None and rt is not None and ul.m2.bits_per_second < rt.m2.bits_per_second
        if below and ul is not None and rt is not None and not cls.children:
            yield Diagnostic.warning(
                "W349",
                f"ul {_rate(ul.m2.bits_per_second)} of {cls.label} is below its rt "
                f"{_rate(rt.m2.bits_per_second)}: the kernel serves the real-time curve "
                "even above ul, so the class sends up to its rt",
                ul.span,
            )
        if cls.ul is not None and cls.children:
            leaves = [c for c in cls.walk() if not c.children and c.rt is not None]
            total = sum(c.rt.m2.bits_per_second for c in leaves if c.rt is not None)
            if total > cls.ul.m2.bits_per_second:
                yield Diagnostic.warning(
                    "W347",
                    f"the real-time guarantees below {cls.label} sum to {_rate(total)}, above its "
                    f"ul {_rate(cls.ul.m2.bits_per_second)}: the kernel serves rt curves even "
                    "above ul, so the link is over-booked and the guarantees cannot all be met",
                    cls.ul.span,
                    *(
                        Note(f"{c.label}: rt {_rate(c.rt.m2.bits_per_second)}", c.rt.span)
                        for c in leaves
                        if c.rt is not None
                    ),
                )


def dscp_rewritten_where_shaped(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W375: ``set dscp`` with marking before routing (``classify by mark from IFACE|any``):
    the DSCP rules sit in the marking chain, in PREROUTING, so they rewrite every packet with
    a class's mark, those that then leave by another interface or are for this host too."""
    for iface in policy.interfaces:
        m = iface.marking
        if m is None or m.hook != "prerouting" or iface.download is not None:
            continue
        if not m.dscp_rules:
            continue
        first = min((d.span for d in m.dscp_rules), key=_written)
        where = m.source(iface.name, "packets")
        yield Diagnostic.warning(
            "W375",
            f"'set dscp' is applied where the marks are set, before routing: it rewrites the "
            f"{where} that carry the class's mark, also those that then leave by another "
            f"interface than {iface.name} or are for this host; write 'classify by mark at "
            f"postrouting' to rewrite only what leaves by {iface.name}",
            first,
            Note("the marks are set here", m.span),
        )


def overhead_counted_once(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W340: link-layer overhead where nothing shapes (it changes no rate); W341: a cake with
    its own overhead below a size table (cake adds its overhead to the size the table made)."""
    for iface in policy.interfaces:
        if iface.stab is None:
            continue
        shapers = [
            q
            for q in ir.walk_qdiscs(iface.root)
            if isinstance(q, ir.Htb | ir.Tbf | ir.Cbq)
            or (isinstance(q, ir.Netem) and q.rate is not None)
            or (isinstance(q, ir.Cake) and q.bandwidth is not None)
        ]
        if not shapers:
            yield Diagnostic.warning(
                "W340",
                f"nothing on {iface.name} shapes to a rate (no htb, tbf, cbq, netem rate or "
                "cake bandwidth), so the link-layer overhead changes no rate",
                iface.stab.span,
            )
        for q in ir.walk_qdiscs(iface.root):
            if isinstance(q, ir.Cake) and q.overhead is not None:
                yield Diagnostic.warning(
                    "W341",
                    "this cake adds its own overhead to the size the root's size table already "
                    "made: the overhead is counted twice; give it once, on the root or here",
                    q.overhead.span,
                    Note("size table given here", iface.stab.span),
                )


def overhead_written(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W342: link-layer words without ``overhead N`` or a preset, which count 0 bytes beyond
    the IP packet: no DSL encapsulation on an ATM or PTM link, and elsewhere 14 bytes less than
    without the words (the Ethernet header no longer counted)."""
    for iface in policy.interfaces:
        found: list[ir.Overhead | None] = [iface.stab]
        if iface.stab is None:  # (a cake's below a size table is W341's: counted twice)
            found += [q.overhead for q in ir.walk_qdiscs(iface.root) if isinstance(q, ir.Cake)]
        for o in found:
            if o is None or o.overhead_written:
                continue
            if o.linklayer in DSL_OVERHEADS:
                words = o.linklayer_word.value if o.linklayer_word else o.linklayer
                yield Diagnostic.warning(
                    "W342",
                    f"'linklayer {words}' without an overhead counts no encapsulation (each "
                    "packet is charged from its IP header on), but every "
                    f"{DSL_OVERHEADS[o.linklayer]}; give the link's preset "
                    f"({DSL_PRESETS[o.linklayer]}) or 'overhead N'",
                    o.span,
                )
            else:
                yield Diagnostic.warning(
                    "W342",
                    "link-layer words without an overhead count 0 bytes beyond the IP packet: "
                    "each packet is charged 14 bytes less than with none (the Ethernet header "
                    "is no longer counted); give 'overhead 14' to count the Ethernet header, "
                    "or the link's own (a preset such as 'overhead ethernet' or "
                    "'overhead docsis')",
                    o.span,
                )


IP_LEVEL_DEVICE = re.compile(r"(?:ppp\d|pppo[ae]-|wg[\d_-]|tun\d)")
"""Names of devices whose packets carry no link-layer header (PPP, PPPoE as OpenWrt names its
sessions, WireGuard, tun): the usual names, not a test of the device."""


def preset_on_ip_level_device(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W381: a preset's size table on a device named as one without an Ethernet header
    (``ppp0``, ``pppoe-wan``, ``wg0``, ``tun0``), where the stab, written 14 bytes smaller
    for that header, charges 14 bytes less than the preset means."""
    for iface in policy.interfaces:
        o = iface.stab
        if o is None or o.preset is None or not IP_LEVEL_DEVICE.match(iface.interface):
            continue
        bytes_ = o.overhead.value + linklayer.ETHERNET_HEADER
        yield Diagnostic.warning(
            "W381",
            f"'{iface.interface}' is named as a device without an Ethernet header (PPP, "
            "WireGuard, tun): its packets have no 14-byte MAC header, and the size table, "
            "written 14 bytes smaller for one, charges each packet 14 bytes less than "
            f"'overhead {o.preset.value}' means; write 'overhead {bytes_} "
            f"linklayer {o.linklayer}{_mpu_words(o)}' there, or use cake (it finds the IP "
            "header itself)",
            o.preset.span,
        )


def _mpu_words(o: ir.Overhead) -> str:
    return f" mpu {o.mpu.value}" if o.mpu is not None and o.mpu.value else ""


DSL_OVERHEADS = {
    "atm": "ADSL encapsulation adds 8 to 40 bytes (8 for ipoa-vcmux, 40 for pppoe-llc)",
    "ptm": "VDSL2 encapsulation adds 22 to 30 bytes (22 for bridged-ptm, 30 for pppoe-ptm)",
}
DSL_PRESETS = {
    "atm": "such as 'overhead pppoe-llc' or 'overhead pppoa-vcmux'",
    "ptm": "'overhead pppoe-ptm' or 'overhead bridged-ptm'",
}
"""What a link layer's encapsulations add beyond the IP packet, and its presets
(tcdsl.linklayer's)."""


LINTS: tuple[Lint, ...] = (
    htb_has_default,
    hfsc_has_default,
    leaves_reachable,
    filters_all_reachable,
    htb_quantum_in_range,
    htb_bursts_hold_a_frame,
    tbf_bursts_fit,
    ceilings_share_sensibly,
    u32_lines_before_marks,
    u32_order_kept,
    marks_kept_apart,
    prefs_fit_their_parent,
    ports_need_a_port_protocol,
    tos_leaves_ecn_out,
    leaf_queues_sensible,
    policers_do_not_reclassify,
    hfsc_curves_consistent,
    overhead_counted_once,
    overhead_written,
    preset_on_ip_level_device,
    dscp_rewritten_where_shaped,
)


AS_WRITTEN: tuple[Lint, ...] = (filters_all_reachable,)
"""The lints that read the lines as written, in the order tried, and nothing allocation
gives a policy: the driver runs them on the resolved policy, beside allocation (the
shadowing analysis is the costliest lint on large policies)."""


def run_lints(policy: ir.Policy, as_written: bool = True) -> list[Diagnostic]:
    """Run every lint over an allocated policy and return all diagnostics; without
    ``as_written``, those of :data:`AS_WRITTEN` are left out (run already)."""
    return [d for lint in LINTS if as_written or lint not in AS_WRITTEN for d in lint(policy)]


def run_as_written(policy: ir.Policy) -> list[Diagnostic]:
    """The lints of :data:`AS_WRITTEN` over a resolved policy (allocated or not)."""
    return [d for lint in AS_WRITTEN for d in lint(policy)]
