"""The ``mq`` root: its queues as written (``mq { queue 1 htb ... }``), or one htb tree spread
over N TX queues (``mq queues N htb ...``) by bin-packing its top-level classes by rate,
largest first onto the least-loaded queue (as LibreQoS spreads circuits over CPUs).

Each queue gets an htb of its own: a copy of the tree's link class (the whole link's rate, as
any one queue may carry all the traffic), the top-level classes packed onto it, and the
default class (the original on its own queue, a copy ``NAME@Q`` on every other one, since a
packet no line matches stays on the queue the kernel picked for it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.syntax import DefaultOpt, HandleOpt, Param, QdiscSyntax
from tcdsl.units import Dimension

if TYPE_CHECKING:
    from tcdsl.allocate import LiveQueues
    from tcdsl.frontend.builder import Builder

MAX_QUEUES = 4096
"""The most TX queues tcdsl spreads a tree over, or numbers a queue up to."""


class MqQueueSyntax:
    """``queue N QDISC`` as written (``number`` None: a bad number, already reported)."""

    __slots__ = ("number", "span", "tree")

    def __init__(self, number: int | None, span: Span, tree: QdiscSyntax) -> None:
        self.number, self.span, self.tree = number, span, tree


def build_mq(
    b: Builder,
    span: Span,
    opts: tuple[Any, ...],
    body: tuple[Any, ...] | None,
    inner: QdiscSyntax | None,
) -> QdiscSyntax:
    """The IR of one ``mq``: its options, then its queues (explicit) or its spread tree."""
    from tcdsl.frontend.qdiscs import LINK_LAYER_PARAMS, STAB_PARAMS  # which imports this module

    link = {**LINK_LAYER_PARAMS, **STAB_PARAMS}
    shards: ir.Count | None = None
    handle: ir.HandleRef | None = None
    seen: dict[str, Span] = {}  # the options given, even with a bad value
    # the size table every queue's qdisc gets: packets are queued to those, never to the mq
    link_words = [o for o in opts if isinstance(o, Param) and o.key in link]
    stab = _stab(b, span, link_words, link) if link_words else None
    for opt in opts:
        if isinstance(opt, Param) and opt.key in link:
            continue
        if (isinstance(opt, Param) and opt.key == "queues") or (
            isinstance(opt, HandleOpt) and opt.keyword == "handle"
        ):
            key = "queues" if isinstance(opt, Param) else "handle"
            if key in seen:
                first = Note("first given here", seen[key])
                b.error(Diagnostic.error("E014", f"'{key}' is given twice", opt.span, first))
            elif isinstance(opt, Param):
                shards = _queues(b, opt)
            else:
                handle = opt.ref
            seen.setdefault(key, opt.span)
            continue
        at = opt.name.span if isinstance(opt, DefaultOpt) else opt.span
        word = getattr(opt, "key", None) or getattr(opt, "keyword", None) or "this"
        b.error(
            Diagnostic.error(
                "E007",
                f"'{word}' is not a parameter of mq; it takes queues, handle and the "
                "link-layer words (the shaping belongs to the qdisc of each queue)",
                at,
            )
        )
    if inner is not None and body is not None:  # the grammar allows one of them only
        raise AssertionError("mq with both a block and a tree")
    if inner is not None:
        if shards is None and "queues" not in seen:
            b.error(
                Diagnostic.error(
                    "E267",
                    "a tree after mq is spread over its queues: say how many, as "
                    f"'mq queues 16 {inner.qdisc.kind} ...'",
                    span,
                )
            )
        if inner.stab is not None and stab is not None:
            first = Note("first given here", stab.span)
            b.error(
                Diagnostic.error("E014", "link-layer words are given twice", inner.stab.span, first)
            )
        stab = stab or inner.stab  # the spread tree's: every queue's qdisc gets it
        if shards is None:
            return QdiscSyntax(ir.Mq(span, (), None, handle), inner.classify, stab)
        # Spread once the interface's tree is built (Builder.spread_root): a statement's
        # circuits are top-level classes by then, each packed by its own rate, and the tree's
        # label says which queue each live class is on.
        mq = ir.Mq(span, (), shards, handle)
        b.unspread[id(mq)] = (mq, inner.qdisc)
        return QdiscSyntax(mq, inner.classify, stab)
    if shards is not None:
        b.error(
            Diagnostic.error(
                "E267",
                f"mq queues {shards.value} spreads a tree: write the tree after it "
                f"('mq queues {shards.value} htb rate 1gbit default NAME {{ ... }}'), or "
                "number each queue in a block without 'queues'",
                shards.span,
            )
        )
    return QdiscSyntax(ir.Mq(span, _explicit(b, span, body), None, handle), (), stab)


def _stab(
    b: Builder, span: Span, words: list[Param], link: dict[str, Dimension]
) -> ir.Overhead | None:
    """The size table of an mq's link-layer words."""
    from tcdsl.frontend.qdiscs import QdiscBuilder

    made = QdiscBuilder(b, "mq", span, tuple(words), None)
    values, _, _ = made._values(words, link, frozenset(), "mq")
    return made._overhead(values, stab=True)


def _queues(b: Builder, opt: Param) -> ir.Count | None:
    from tcdsl.frontend.qdiscs import QdiscBuilder  # which imports this module

    count = QdiscBuilder(b, "mq", opt.span, (), None)._value(opt, Dimension.COUNT, False)
    if not isinstance(count, ir.Count):
        return None
    if not 1 <= count.value <= MAX_QUEUES:
        msg = f"queues {count.value} is not between 1 and {MAX_QUEUES}"
        b.error(Diagnostic.error("E267", msg, count.span))
        return None
    return count


def _explicit(
    b: Builder, span: Span, body: tuple[MqQueueSyntax, ...] | None
) -> tuple[ir.MqQueue, ...]:
    queues: list[ir.MqQueue] = []
    seen: dict[int, Span] = {}
    for item in body or ():  # the grammar lets only `queue N QDISC` lines in
        if item.number is None:
            continue
        for m in item.tree.classify:
            b.error(
                Diagnostic.error(
                    "E268", "an mq tree classifies with its match lines, not by mark", m.span
                )
            )
        if item.number in seen:
            first = Note("first given here", seen[item.number])
            msg = f"queue {item.number} is given twice"
            b.error(Diagnostic.error("E269", msg, item.span, first))
            continue
        if item.tree.stab is not None:
            b.error(
                Diagnostic.error(
                    "E232",
                    "link-layer words of an mq tree go on the mq ('mq overhead 18 { ... }'): "
                    "every queue's qdisc gets its size table",
                    item.tree.stab.span,
                )
            )
        seen[item.number] = item.span
        queues.append(ir.MqQueue(item.number, item.tree.qdisc, item.span))
    if body is not None and not body:  # a queue with a bad number is already reported
        b.error(Diagnostic.error("E266", "an mq needs at least one 'queue N QDISC'", span))
    return tuple(queues)


def mq_queue(b: Builder, number: str, span: Span, tree: QdiscSyntax) -> MqQueueSyntax:
    """One ``queue N QDISC`` line, its number checked."""
    value = int(number, 0)
    if not 1 <= value <= MAX_QUEUES:
        b.error(
            Diagnostic.error(
                "E269",
                f"queue {value} is not between 1 and {MAX_QUEUES} (queue N is the device's TX "
                "queue N-1, the mq's class M:N)",
                span,
            )
        )
        return MqQueueSyntax(None, span, tree)
    return MqQueueSyntax(value, span, tree)


def _weight(cls: ir.Class, link: ir.Class | None) -> int:
    """The rate a top-level class is packed by (a percentage of the link's)."""
    rate = cls.rate
    if isinstance(rate, ir.Rate):
        return rate.bits_per_second
    if isinstance(rate, ir.Percent) and link is not None and isinstance(link.rate, ir.Rate):
        return int(link.rate.bits_per_second * rate.value / 100)
    return 0


QUEUE_CLASSES = 0xFFFF - 1
"""The classes one queue's htb holds besides its link class (class ids ``:2`` to ``:ffff``)."""


def pack(
    weights: list[int],
    bins: int,
    kept: Sequence[int | None] = (),
    sizes: Sequence[int] = (),
    room: int | None = None,
) -> list[int]:
    """The bin of each weight: ``kept[i]`` where it is a bin (a live class stays on its
    queue), the others largest first (ties in the order given) onto the least-loaded bin
    (ties to the one holding fewest, then the lowest-numbered) that has ``room`` for its
    size (``sizes[i]``, 1 if not given); where none has, onto the bin with the most room
    left. Deterministic."""
    load = [0] * bins
    held = [0] * bins
    placed = [0] * len(weights)
    free = []
    for i, weight in enumerate(weights):
        bin_ = kept[i] if i < len(kept) else None
        if bin_ is not None and 0 <= bin_ < bins:
            placed[i] = bin_
            load[bin_] += weight
            held[bin_] += sizes[i] if sizes else 1
        else:
            free.append(i)
    every = range(bins)
    for i in sorted(free, key=lambda i: (-weights[i], i)):
        size = sizes[i] if sizes else 1
        fits = every if room is None else [n for n in every if held[n] + size <= room]
        if fits:
            target = min(fits, key=lambda n: (load[n], held[n], n))
        else:
            target = min(every, key=held.__getitem__)
        placed[i] = target
        load[target] += weights[i]
        held[target] += size
    return placed


def spread(
    b: Builder, tree: ir.Qdisc, shards: ir.Count, live: LiveQueues | None = None
) -> tuple[ir.MqQueue, ...]:
    """Spread ``tree``'s top-level classes over ``shards`` queues, each an htb of its own.
    ``live``: the live tree's queues; a top-level class on one stays there, so that adding
    or removing one moves no other. More queues than the live tree's: all packed afresh (the
    new queues would be left idle)."""
    if not isinstance(tree, ir.Htb):
        b.error(
            Diagnostic.error(
                "E267",
                f"mq queues N spreads an htb tree over the queues; found {tree.kind} (write "
                "each queue's qdisc in a block instead: 'mq { queue 1 ... }')",
                tree.span,
            )
        )
        return ()
    if tree.explicit_handle is not None:
        b.error(
            Diagnostic.error(
                "E267",
                "a spread tree gets one handle per queue; remove 'handle' (or number each "
                "queue's qdisc in a block)",
                tree.explicit_handle.span,
            )
        )
    top = tree.classes
    link = top[0] if len(top) == 1 and top[0].implicit else None
    tops = link.children if link is not None else top
    default = _find(tops, tree.default.name) if tree.default is not None else None
    count = shards.value
    on = live[1] if live is not None and live[0] >= count else {}
    kept = [on[c.name] - 1 if c.name in on else None for c in tops]
    holder = next(
        (i for i, c in enumerate(tops) if default is not None and _holds(c, default)), None
    )
    # Each queue holds the default or a copy of it: one class of its room, not of the tops'.
    sizes = [_size(c) - (i == holder) for i, c in enumerate(tops)]
    room = QUEUE_CLASSES - (default is not None)
    weights = [_weight(c, link) for c in tops]
    home = pack(weights, count, kept, sizes, room)
    if _overfull(home, sizes, count, room):
        # (a top-level class goes whole onto one queue: the total may fit and the shapes not)
        need = next(
            (n for n in range(max(count + 1, -(-sum(sizes) // room)), MAX_QUEUES + 1)
             if not _overfull(pack(weights, n, (), sizes, room), sizes, n, room)),
            MAX_QUEUES,
        )  # fmt: skip
        b.error(
            Diagnostic.error(
                "E210",
                f"mq queues {count} spreads {sum(sizes) + (default is not None):,} classes; one "
                f"queue's htb holds at most {QUEUE_CLASSES + 1:,} (its class ids), and each "
                f"top-level class goes whole onto one queue: the tree needs at least {need} "
                "queues",
                shards.span,
            )
        )
    used = set(home)
    idle = [n + 1 for n in range(count) if n not in used]
    if idle:
        kept_there = (
            " (the live classes stay where they are)" if any(k is not None for k in kept) else ""
        )
        b.error(
            Diagnostic.warning(
                "W368",
                f"mq queues {count} spreads {len(tops)} top-level class"
                f"{'es' if len(tops) != 1 else ''}: {_idle(idle)} only the default "
                f"class{kept_there}",
                shards.span,
            )
        )
    queues: list[ir.MqQueue] = []
    for n in range(count):
        mine = tuple(c for i, c in zip(range(len(tops)), tops, strict=True) if home[i] == n)
        name = tree.default
        if (
            default is not None
            and tree.default is not None
            and (holder is None or home[holder] != n)
        ):
            copy = ir.replace(
                default,
                name=f"{default.name}@{n + 1}",
                matches=(),
                children=(),
                explicit_id=None,
                leaf=_copy_leaf(default.leaf, f"@{n + 1}"),
            )
            mine += (copy,)
            name = ir.Name(copy.name, tree.default.span)
        classes = (ir.replace(link, children=mine),) if link is not None else mine
        shard = ir.replace(tree, classes=classes, default=name, explicit_handle=None)
        ranks = tuple(i for i in range(len(tops)) if home[i] == n)
        queues.append(ir.MqQueue(n + 1, shard, shards.span, ranks))
    return tuple(queues)


def _idle(queues: list[int]) -> str:
    """``queue 4 holds``, ``queues 4 to 16 hold``, ``queues 2, 5 and 6 hold``."""
    if len(queues) == 1:
        return f"queue {queues[0]} holds"
    if queues[-1] - queues[0] == len(queues) - 1:
        return f"queues {queues[0]} to {queues[-1]} hold"
    return f"queues {', '.join(map(str, queues[:-1]))} and {queues[-1]} hold"


def _copy_leaf(leaf: ir.Qdisc | None, suffix: str) -> ir.Qdisc | None:
    """The default's leaf for a copy of it: without handles or class ids of the user's (the
    original keeps them), its classes named ``NAME@Q`` as the copy is."""
    if leaf is None:
        return None
    if not isinstance(leaf, ir.NESTING):
        return leaf if leaf.explicit_handle is None else ir.replace(leaf, explicit_handle=None)
    match leaf:
        case ir.Tbf() | ir.Netem():
            return ir.replace(leaf, explicit_handle=None, child=_copy_leaf(leaf.child, suffix))
        case ir.Htb() | ir.Hfsc():
            default = leaf.default
            if default is not None:
                default = ir.Name(default.name + suffix, default.span)
            classes = tuple(_copy_class(c, suffix) for c in leaf.classes)
            return ir.replace(leaf, explicit_handle=None, classes=classes, default=default)
        case ir.Prio() | ir.Cbq():
            classes = tuple(_copy_class(c, suffix) for c in leaf.classes)
            return ir.replace(leaf, explicit_handle=None, classes=classes)
    return leaf


def _copy_class(cls: ir.Class, suffix: str) -> ir.Class:
    return ir.replace(
        cls,
        name=cls.name if cls.implicit else cls.name + suffix,
        explicit_id=None,
        children=tuple(_copy_class(c, suffix) for c in cls.children),
        leaf=_copy_leaf(cls.leaf, suffix),
    )


def _find(classes: tuple[ir.Class, ...], name: str) -> ir.Class | None:
    for top in classes:
        for cls in top.walk():
            if cls.name == name and not cls.implicit:
                return cls
    return None


def _overfull(home: list[int], sizes: list[int], bins: int, room: int) -> bool:
    """Whether a queue of the packing ``home`` holds more classes than its ``room``."""
    held = [0] * bins
    for bin_, size in zip(home, sizes, strict=True):
        held[bin_] += size
    return max(held, default=0) > room


def _size(top: ir.Class) -> int:
    """How many classes ``top`` is, with its children's."""
    return sum(1 for _ in top.walk()) if top.children else 1


def _holds(top: ir.Class, cls: ir.Class) -> bool:
    return any(c is cls for c in top.walk())
