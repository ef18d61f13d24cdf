"""Assign handles, class ids, firewall marks, filter prefs, police indexes and chain names,
once.

Explicit values are reserved first, so an automatic value never collides with one the user
wrote. Automatic class ids follow the convention of the tc literature: the link class is
``1:1`` and the other classes get ``1:10``, ``1:20``, ... in the order they are written; the
leaf qdisc of class ``1:20`` is ``20:`` (``N0:`` for single-digit minors, as prio bands are).
With ``classify by mark`` the mark of class ``1:20`` is 20 where that is free. An htb without
``r2q`` gets the r2q (or class quanta) that keep its quanta where the kernel keeps them. A
policed match line of several filters gets one police index, which its filters share.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import sys
import zlib
from collections.abc import Iterator, Mapping

from tcdsl import ir, lower, u32layout
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.chains import default_chain
from tcdsl.tcmath import HTB_DEFAULT_R2Q, htb_quantum, htb_r2q_fits, htb_r2q_range

MAX = 0xFFFF
DEFAULT_PREF = ir.DEFAULT_PREF
IPV6_PREF_OFFSET = 0x8000
"""An IPv6 filter's pref is its IPv4 counterpart's plus this: the kernel keeps one filter
list per (pref, protocol) and refuses a second protocol at a pref in use, and the order among
one family's filters is the order of their prefs."""
MAX_PREF = IPV6_PREF_OFFSET - 1
"""The largest ``pref`` a match line may give (its IPv6 filters are above it)."""


def qdisc_bucket(major: int) -> int:
    """The bucket of a device's qdisc hash that handle ``major:`` falls in.

    The kernel keeps every qdisc of a device but the root in a hash of 16 buckets
    (``DECLARE_HASHTABLE(qdisc_hash, 4)`` in ``struct net_device``, keyed by ``hash_32(handle,
    4)``), new entries first, and each command that names a qdisc walks its bucket: to find a
    parent, and to its end to see that a new handle is free."""
    return ((major << 16) * 0x61C88647 & 0xFFFFFFFF) >> 28


SHARD_BUCKET = qdisc_bucket(MAX)
"""The bucket of ``ffff:``, the clsact qdisc's handle: the kernel finds clsact only after
walking this bucket of the egress hash to its end, once per filter added to it (mq's steering
filters). An mq tree's per-queue htbs take their handles from it (found after a few steps);
its other qdiscs avoid it and bucket 0, where every class's default pfifo (handle ``0:``)
is, so that a walk to a queue's htb or to clsact passes no leaf qdisc. At 50,000 subscribers
with a pfifo each on 16 queues this took a first apply from about 30-34 s to 26 s."""


def _majors_by_bucket(buckets: tuple[int, ...], keep: bool) -> Iterator[int]:
    """The majors from 2 up whose bucket is (``keep``) or is not (not ``keep``) in ``buckets``."""
    return (m for m in range(2, MAX) if (qdisc_bucket(m) in buckets) == keep)


@functools.cache
def shard_majors() -> tuple[int, ...]:
    """The majors in ``SHARD_BUCKET``: queue N's qdisc prefers the Nth (``12:``, ``14:``,
    ``27:``, ``3c:``, ...). Made on first use (a walk of every major: a tenth of the time
    every command spent importing this module)."""
    return tuple(_majors_by_bucket((SHARD_BUCKET,), True))


def _shard_major(queue: int) -> int | None:
    majors = shard_majors()
    return majors[queue - 1] if queue <= len(majors) else None


POLICE_INDEX_BASE = 0x10000000
POLICE_BLOCK = 0x1000
"""A tree's shared police actions get the indexes ``block + 1 ..`` of a block of this size:
block ``POLICE_INDEX_BASE + (crc32(label) & 0xffff) * POLICE_BLOCK``, so two trees (of one
policy or two) rarely meet; the kernel numbers a filter's own policers from 1 up."""
POLICE_INDEX_MAX = POLICE_BLOCK - 1


def police_block(label: str, taken: set[int]) -> int:
    """The first index of the block of shared policers of the tree labelled ``label``: from
    its label's checksum, the next free one if another tree of the policy has that block."""
    slot = zlib.crc32(label.encode()) & 0xFFFF
    while POLICE_INDEX_BASE + slot * POLICE_BLOCK in taken:
        slot = (slot + 1) & 0xFFFF
    block = POLICE_INDEX_BASE + slot * POLICE_BLOCK
    taken.add(block)
    return block


def kernel_pref(pref: int, family: ir.Family) -> int:
    """The pref a filter of ``family`` gets for the policy's ``pref``."""
    return pref if family == "ipv4" else pref + IPV6_PREF_OFFSET


STEER_GROUP = 2000
"""The most steering filters of one family at one pref (u32 keeps the order of at most 2,048
filters at one pref: E262)."""


def steering_filters(mq: ir.Mq, filters: tuple[ir.Filter, ...]) -> tuple[ir.Filter, ...]:
    """The filters on the clsact egress hook that pick each packet's TX queue (flowid: the
    mq's class of the queue, ``M:N`` for TX queue N-1): one per filter of a queue's steered
    qdiscs (:func:`ir.steered_qdiscs`), in the order the policy's lines are tried (their
    level, their pref, then where they are written), a new pref at each level and pref of
    the policy's and every :data:`STEER_GROUP` filters."""
    assert mq.handle is not None
    queue_of: dict[ir.Handle, tuple[ir.Handle, int]] = {}
    for level, index, q in ir.steered_qdiscs(mq):
        assert q.handle is not None
        queue_of[q.handle] = (ir.Handle(mq.handle.major, mq.queues[index].number), level)
    picked = [f for f in filters if f.parent in queue_of and not isinstance(f, ir.FwFilter)]
    # The tree as written, not the lines' spans: a table's rows are in another file.
    order = ir.mq_line_order(mq)
    by_classid = {
        c.classid: order[id(c)]
        for _, _, q in ir.steered_qdiscs(mq)
        for c in ir.classes_of(q)
        if c.classid is not None and id(c) in order
    }
    last = (sys.maxsize, 0, 0, 0)

    def tried(f: ir.Filter) -> tuple[int, int, tuple[int, int, int, int]]:
        return queue_of[f.parent][1], f.pref, by_classid.get(f.flowid, last)

    picked.sort(key=tried)
    steering: list[ir.Filter] = []
    # family -> ((level, policy pref), pref, count)
    group: dict[ir.Family, tuple[tuple[int, int], int, int]] = {}
    for f in picked:
        at = (queue_of[f.parent][1], f.pref)
        was, pref, count = group.get(f.family, (at, DEFAULT_PREF, 0))
        if was != at or count == STEER_GROUP:
            pref, count = pref + 1, 0
        group[f.family] = (at, pref, count + 1)
        steering.append(
            ir.replace(
                f,
                parent=ir.CLSACT_EGRESS,
                pref=kernel_pref(pref, f.family),
                flowid=queue_of[f.parent][0],
                police=None,
                police_index=None,
            )
        )
    return tuple(steering)


def flower_prefs(filters: tuple[ir.Filter, ...]) -> tuple[ir.Filter, ...]:
    """Give every flower filter a pref of its own, in the order the kernel is to try them.

    Within one pref, cls_flower tries its masks in the order they were first created, not
    its filters in order (a later, more specific filter can win over an earlier one), and
    refuses a second filter with the same keys: one filter per pref keeps "the first line
    that matches wins". The prefs count up from 1 per parent and family (IPv6 from 0x8001),
    in the order of the policy's prefs; fw filters in a row at one pref keep sharing one.
    """
    renumbered: dict[int, ir.Filter] = {}
    groups: dict[tuple[ir.Handle, ir.Family], list[ir.Filter]] = {}
    for f in filters:
        groups.setdefault((f.parent, f.family), []).append(f)
    for (_, family), group in groups.items():
        n = 0
        previous: ir.Filter | None = None
        for f in sorted(group, key=lambda g: g.pref):
            shares = (
                isinstance(f, ir.FwFilter)
                and isinstance(previous, ir.FwFilter)
                and previous.pref == f.pref
            )
            if not shares:
                n += 1
            renumbered[id(f)] = ir.replace(f, pref=kernel_pref(n, family))
            previous = f
    return tuple(renumbered[id(f)] for f in filters)


def _decimal_looking_minors() -> Iterator[int]:
    for k in range(1, 1000):
        yield int(str(10 * k), 16)
    yield from range(2, MAX + 1)


class Pool:
    """Hands out free numbers: a preferred one if free, else the next candidate."""

    def __init__(
        self,
        candidates: Iterator[int],
        used: set[int],
        limit: int = MAX,
        avoid: tuple[int, ...] = (),
    ) -> None:
        self.candidates = candidates
        self.used = used
        self.limit = limit
        self.avoid = avoid
        """Qdisc hash buckets a preferred major is not taken from (candidates still may)."""

    def take(self, preferred: int | None = None) -> int | None:
        if preferred is not None and self.avoid and qdisc_bucket(preferred) in self.avoid:
            preferred = None
        if preferred is not None and 0 < preferred <= self.limit and preferred not in self.used:
            self.used.add(preferred)
            return preferred
        for value in self.candidates:
            if value not in self.used:
                self.used.add(value)
                return value
        return None


class InterfaceAllocator:
    """Allocate everything on one interface."""

    def __init__(
        self,
        iface: ir.Interface,
        diagnostics: list[Diagnostic],
        blocks: set[int] | None = None,
        pins: Mapping[str, ir.Handle] | None = None,
        hash_min: int | None = None,
    ) -> None:
        self.iface = iface
        self.hash_min = hash_min
        self.pins = pins or {}
        self.pinned: dict[str, int] = {}
        self.moved: set[str] = set()
        """Classes pinned to an id they cannot keep (moved): their leaf handle is not kept."""
        self.reserved = {
            h
            for n, h in self.pins.items()
            if not n.endswith((LEAF_PIN, PARENT_PIN, R2Q_PIN, QUEUE_PIN)) and NESTED_PIN not in n
        }
        """The ids of the live classes (and link classes): not given to a new class."""
        self.leaf_pins = {
            name.removesuffix(LEAF_PIN): h.major
            for name, h in self.pins.items()
            if name.endswith(LEAF_PIN)
        }
        """Class name -> the major its leaf qdisc had; kept free for it (unless an explicit
        handle takes it), so that a new qdisc made before it cannot take it."""
        self.nested_pins: dict[tuple[str, int], int] = {}
        """(class name, depth) -> the major of the qdisc that deep below the class (2: a
        tbf's or netem's child), kept free for it as ``leaf_pins`` are."""
        for key, h in self.pins.items():
            name, nested, depth = key.rpartition(NESTED_PIN)
            if nested and depth.isdigit():
                self.nested_pins[(name, int(depth))] = h.major
        self.diagnostics = diagnostics
        self.blocks = blocks if blocks is not None else set()
        self.police_block: int | None = None
        self.police_count = 0
        self.majors: set[int] = {MAX}  # ffff: is the ingress qdisc
        self.major_owner: dict[int, Span] = {}
        self.without_id: dict[int, list[Span]] = {}
        """A classful qdisc's major -> the classes its ids ran out for (one E210 for them)."""
        self.major_pool = Pool(iter(range(2, MAX)), self.majors)
        self.shard_pool = self.major_pool
        if isinstance(iface.root, ir.Mq):
            hot = (0, SHARD_BUCKET)
            self.shard_pool = Pool(itertools.chain(shard_majors(), range(2, MAX)), self.majors)
            self.major_pool = Pool(
                itertools.chain(_majors_by_bucket(hot, False), _majors_by_bucket(hot, True)),
                self.majors,
                avoid=hot,
            )
        self.families = iface.families

    def error(self, code: str, message: str, span: Span, *notes: Note) -> None:
        self.diagnostics.append(Diagnostic.error(code, message, span, *notes))

    def run(self) -> ir.Interface:
        iface = self._run()
        if iface.classifier == "flower":
            return dataclasses.replace(iface, filters=flower_prefs(iface.filters))
        filters, tables = u32layout.layout(iface.filters, 0 if iface.u32_linear else self.hash_min)
        if filters is iface.filters:
            return iface
        # Numbered (a pref past ORDER_KEPT filters), hashed, or both: a pref numbered alone
        # has no table.
        return dataclasses.replace(iface, filters=filters, u32_tables=tables)

    def _run(self) -> ir.Interface:
        if isinstance(self.iface.root, ir.Ingress):
            return self.ingress(self.iface.root)
        for q in ir.walk_qdiscs(self.iface.root):
            if q.explicit_handle is not None:
                major = q.explicit_handle.handle.major
                if major in self.major_owner:
                    self.error(
                        "E204",
                        f"handle {major:x}: is used twice on interface '{self.iface.name}'",
                        q.explicit_handle.span,
                        Note("first used here", self.major_owner[major]),
                    )
                self.majors.add(major)
                self.major_owner[major] = q.explicit_handle.span
        self.leaf_pins = {n: m for n, m in self.leaf_pins.items() if m not in self.majors}
        self.nested_pins = {k: m for k, m in self.nested_pins.items() if m not in self.majors}
        self.majors |= set(self.leaf_pins.values()) | set(self.nested_pins.values())
        root = self.qdisc(self.iface.root, preferred=1)
        iface = dataclasses.replace(self.iface, root=root)
        if iface.marking is not None:
            return self.marks(iface)
        filters = tuple(self.u32_filters(root))
        if isinstance(root, ir.Mq):
            filters += steering_filters(root, filters)
        return dataclasses.replace(iface, filters=filters)

    # ---- handles and class ids ----
    def qdisc(
        self,
        q: ir.Qdisc,
        preferred: int | None,
        kept: bool = False,
        below: tuple[str, int] | None = None,
    ) -> ir.Qdisc:
        """``q`` with its handle and what is below it allocated; ``below``: the class it is
        that deep below (1: its leaf), whose pinned handles the qdiscs below it keep."""
        if q.explicit_handle is not None:
            major = q.explicit_handle.handle.major
        elif kept and preferred is not None:
            major = preferred  # a pinned leaf's major, or a queue's: kept free for it
        else:
            taken = self.major_pool.take(preferred)
            if taken is None:
                self.error("E210", "no free qdisc handle is left (65534 in use)", q.span)
            major = taken or 0
        handle = ir.Handle(major, 0)
        match q:
            case ir.Htb():
                classes = self.classes(q, major)
                live_r2q = self.pins.get(f"{major:x}:{R2Q_PIN}")
                return choose_quanta(
                    ir.replace(q, handle=handle, classes=classes),
                    None if live_r2q is None else live_r2q.major,
                )
            case ir.Prio() | ir.Cbq() | ir.Hfsc():
                classes = self.classes(q, major)
                return ir.replace(q, handle=handle, classes=classes)
            case ir.Tbf() | ir.Netem():
                deeper = None if below is None else (below[0], below[1] + 1)
                pin = self.nested_pins.pop(deeper, None) if deeper is not None else None
                child = (
                    None
                    if q.child is None
                    else self.qdisc(
                        q.child, major + 1 if pin is None else pin, pin is not None, deeper
                    )
                )
                return ir.replace(q, handle=handle, child=child)
            case ir.Mq():
                majors = self._queue_majors(q)
                queues = tuple(
                    ir.replace(mq, qdisc=self.qdisc(mq.qdisc, majors.get(mq.number), True))
                    for mq in q.queues
                )
                return ir.replace(q, handle=handle, queues=queues)
            case _:
                return ir.replace(q, handle=handle)

    def _queue_majors(self, mq: ir.Mq) -> dict[int, int]:
        """Queue number -> its qdisc's major, reserved before any qdisc below the queues
        takes one: the live one (``QUEUE_PIN``), else queue N's of ``shard_majors()``, where
        free; else the next free one of ``shard_majors()`` (so one taken by an explicit handle
        moves no other queue's). A queue's explicit handle is its own (not here)."""
        live = {queue: major for major, queue in _queue_pins(self.pins).items()}
        chosen: dict[int, int] = {}
        rest = []
        for queue in mq.queues:
            if queue.qdisc.explicit_handle is not None:
                continue
            for want in (live.get(queue.number), _shard_major(queue.number)):
                if want is not None and want not in self.majors:
                    chosen[queue.number] = want
                    self.majors.add(want)
                    break
            else:
                rest.append(queue)
        for queue in rest:
            taken = self.shard_pool.take()
            if taken is None:
                self.error("E210", "no free qdisc handle is left (65534 in use)", queue.span)
            chosen[queue.number] = taken or 0
        return chosen

    def classes(self, q: ir.ClassfulQdisc, major: int) -> tuple[ir.Class, ...]:
        used: set[int] = set()
        owner: dict[int, Span] = {}
        for cls in ir.classes_of(q):
            ref = cls.explicit_id
            if ref is None:
                continue
            h = ref.handle
            if h.major != major:
                self.error(
                    "E204",
                    f"class id {h} does not belong to qdisc {major:x}: "
                    f"(write {major:x}:{h.minor:x}, or give the qdisc 'handle {h.major:x}:')",
                    ref.span,
                )
            elif h.minor == 0:
                self.error(
                    "E204", f"class id {h} names the qdisc itself; a class needs a minor", ref.span
                )
            elif h.minor in owner:
                self.error(
                    "E204",
                    f"class id {h} is used twice",
                    ref.span,
                    Note("first used here", owner[h.minor]),
                )
            elif isinstance(q, ir.Prio) and h.minor > (q.bands.value if q.bands else 3):
                self.error("E204", f"class id {h} is not a band of this prio", ref.span)
            elif h.minor == 1 and not cls.implicit and any(c.implicit for c in q.classes):
                # (found by a tester: the link class moved to another id without a word)
                self.error(
                    "E204",
                    f"class id {h} is the link class's, which the rate on the qdisc's line "
                    f"makes: give this class another id, or leave the rate off that line and "
                    f"make this class the top one ('class link id {h} rate ... {{ ... }}')",
                    ref.span,
                )
            used.add(h.minor)
            owner[h.minor] = ref.span
        self._pin(q.classes, ir.Handle(major, 0), used)
        # The ids of live classes this policy removes are not given to its new ones: a new
        # class would take over the removed one's counters, and the plan would not show it.
        used |= {p.minor for p in self.reserved if p.major == major}
        if isinstance(q, ir.Prio):
            bands = q.bands.value if q.bands else 3
            pool = Pool(iter(range(1, bands + 1)), used)
        else:
            pool = Pool(_decimal_looking_minors(), used)
        classes = tuple(self.klass(c, q, major, pool) for c in q.classes)
        spans = self.without_id.pop(major, None)
        if spans:
            after = len(spans) - 1
            more = f" (nor for the {after:,} class{'es' if after > 1 else ''} after it)"
            more = more if after else ""
            self.error("E210", f"no free class id is left under {major:x}:{more}", spans[0])
        return classes

    def _pin(self, classes: tuple[ir.Class, ...], parent: ir.Handle | None, used: set[int]) -> None:
        """Give ``classes`` (under ``parent``, None when its id is not known yet) the ids
        pinned for them that are free, unless a class moved: its live parent (pinned too) is
        not its parent now. htb cannot move a class, so a moved one (and its subtree) is a new
        class: it gets a new id and leaf handle; its old ones stay reserved."""
        for cls in classes:
            pin = self.pins.get(cls.name)
            if pin is None:
                kept = None
            elif cls.explicit_id is not None:
                kept = pin if pin == cls.explicit_id.handle else None
            else:
                live_parent = self.pins.get(f"{cls.name}{PARENT_PIN}", parent)
                free = parent is not None and pin.major == parent.major and pin.minor not in used
                kept = pin if free and live_parent == parent else None
                if kept is not None:
                    used.add(pin.minor)
                    self.pinned[cls.name] = pin.minor
            if pin is not None and kept is None:
                self.moved.add(cls.name)
            if cls.explicit_id is not None:
                here: ir.Handle | None = cls.explicit_id.handle
            elif cls.implicit and parent is not None:
                # the link class keeps its live id, else takes the first free minor from 1
                link = self.pins.get(f"{parent.major:x}:{LINK_PIN}")
                if link is not None and link.major == parent.major and link.minor not in used:
                    used.add(link.minor)
                    self.pinned[f"{parent.major:x}:{LINK_PIN}"] = link.minor
                    here = link
                else:  # (as klass will: the ids of live classes are reserved by then)
                    free = 1 not in used and ir.Handle(parent.major, 1) not in self.reserved
                    here = ir.Handle(parent.major, 1) if free else None
            else:
                here = kept
            self._pin(cls.children, here, used)

    def klass(self, cls: ir.Class, q: ir.ClassfulQdisc, major: int, pool: Pool) -> ir.Class:
        if cls.explicit_id is not None:
            minor = cls.explicit_id.handle.minor
        elif cls.name in self.pinned and not cls.implicit:
            minor = self.pinned[cls.name]
        elif cls.implicit and f"{major:x}:{LINK_PIN}" in self.pinned:
            minor = self.pinned[f"{major:x}:{LINK_PIN}"]
        else:
            taken = pool.take(1 if cls.implicit else None)
            if taken is None:
                self.without_id.setdefault(major, []).append(cls.span)
            minor = taken or 0
        leaf = None
        if cls.leaf is not None:
            moved = cls.implicit or cls.name in self.moved
            kept = None if moved else self.leaf_pins.pop(cls.name, None)
            preferred = minor if minor >= 0x10 else minor * 0x10
            below = None if moved else (cls.name, 1)
            leaf = self.qdisc(
                cls.leaf, preferred if kept is None else kept, kept is not None, below
            )
        children = tuple([self.klass(c, q, major, pool) for c in cls.children])
        return ir.replace(cls, classid=ir.Handle(major, minor), leaf=leaf, children=children)

    def ingress(self, q: ir.Ingress) -> ir.Interface:
        root = dataclasses.replace(q, handle=ir.INGRESS_HANDLE)
        # The ingress qdisc has no classes: a filter's class id only labels it (tc's own
        # examples write ``flowid :1``).
        flowid = ir.Handle(ir.INGRESS_HANDLE.major, 1)
        filters = [f for m in q.matches for f in self._match_filters(m, ir.INGRESS_HANDLE, flowid)]
        return dataclasses.replace(self.iface, root=root, filters=tuple(filters))

    # ---- filters ----
    def u32_filters(self, root: ir.Qdisc) -> list[ir.Filter]:
        filters: list[ir.Filter] = []
        for q in ir.walk_qdiscs(root):
            if q.handle is None:
                continue
            for cls in ir.classes_of(q):
                assert cls.classid is not None
                for m in cls.matches:
                    filters += self._match_filters(m, q.handle, cls.classid)
        return filters

    def _match_filters(self, m: ir.Match, parent: ir.Handle, flowid: ir.Handle) -> list[ir.Filter]:
        filters = self._line_filters(m, parent, flowid)
        if m.police is None or len(filters) < 2:
            return filters
        index = self._police_index(m.police)
        return [ir.replace(f, police_index=index) for f in filters]

    def _police_index(self, police: ir.Police) -> int:
        """The index of a line's shared police action (E261 when the tree has no more)."""
        if self.police_block is None:
            self.police_block = police_block(self.iface.label, self.blocks)
        self.police_count += 1
        if self.police_count > POLICE_INDEX_MAX:
            self.error(
                "E261",
                f"more than {POLICE_INDEX_MAX} match lines with a policer of several filters "
                f"in the tree of {self.iface.label}: no police index is left for this one",
                police.span,
            )
        return self.police_block + self.police_count

    def _line_filters(self, m: ir.Match, parent: ir.Handle, flowid: ir.Handle) -> list[ir.Filter]:
        pref = m.pref.value if m.pref else DEFAULT_PREF
        total = dropped = 0
        families = self.families
        classifier = self.iface.classifier
        filters: list[ir.Filter] = []
        for family, alt in lower.filter_alternatives(m, families, classifier):
            fpref = kernel_pref(pref, family)
            if classifier == "flower":
                for part in lower.flower_splits(alt):
                    total += 1
                    flower = lower.flower_filter(
                        part, family, parent, fpref, flowid, m.span, m.police
                    )
                    if flower is None:
                        dropped += 1
                    else:
                        filters.append(flower)
                continue
            for keys in lower.u32_keys(alt, family):
                total += 1
                if len(keys) > 1 and lower.contradicts(keys):
                    dropped += 1
                else:
                    filters.append(
                        ir.U32Filter(parent, fpref, keys, flowid, m.span, m.police, family)
                    )
        if dropped and dropped == total:
            self.error(
                "E211",
                "the conditions of this match line contradict each other, so it can never match",
                m.span,
            )
        elif dropped:
            self.diagnostics.append(
                Diagnostic.warning(
                    "W304",
                    f"{dropped} of the {total} combinations this match line stands for can never "
                    "match (their conditions contradict each other) and are left out",
                    m.span,
                )
            )
        return filters

    def marks(self, iface: ir.Interface) -> ir.Interface:
        marking = iface.marking
        assert marking is not None
        root = iface.root
        if not isinstance(root, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
            self.error(
                "E209",
                "'classify by mark' needs a classful root qdisc (htb, hfsc, prio, cbq)",
                marking.span,
            )
            return iface
        for inner, holder, _ in ir.held_qdiscs(root):
            for cls in ir.classes_of(inner):
                if not marked_lines(cls) and cls.mark is None:
                    continue
                where = f"class '{holder.name}'" if isinstance(holder, ir.Class) else holder.kind
                span = marked_lines(cls)[0].span if marked_lines(cls) else cls.span
                self.error(
                    "E220",
                    f"with 'classify by mark', marks classify only the root qdisc's classes: "
                    f"{cls.label} is in the {inner.kind} held by {where}, so this would select "
                    "nothing; drop 'classify by mark' (u32 filters classify inside nested "
                    "qdiscs) or move the class to the root qdisc",
                    span,
                )
        default = None
        if isinstance(root, ir.Htb | ir.Hfsc) and root.default is not None:
            default = next(
                (c for c in ir.classes_of(root) if c.name == root.default.name and not c.implicit),
                None,
            )
        used = {
            c.mark.value
            for q in ir.walk_qdiscs(root)
            for c in ir.classes_of(q)
            if c.mark is not None
        }
        mask = marking.mask_value
        width = mask.bit_count()
        pool = Pool((deposit(k, mask) for k in range(1, 1 << width)), used, limit=mask)
        marked: dict[int, int] = {}
        filters: list[ir.Filter] = []
        rules: list[ir.MarkRule] = []
        new_root = self._with_marks(root, default, pool, marked)
        fw_pref = marking.fw_pref
        families = iface.families
        fw_mask = marking.mask.value if marking.mask is not None else None
        if marking.mask is not None and None in marked.values():
            wanted = len(marked)
            self.error(
                "E246",
                f"mark mask {mask:#x} holds {(1 << width) - 1} marks, and the interface needs "
                f"{wanted}: widen the mask",
                marking.mask.span,
            )
            return iface
        for q in ir.walk_qdiscs(new_root):
            if q.handle is None:
                continue
            for cls in ir.classes_of(q):
                assert cls.classid is not None
                for m in cls.matches:
                    if m.pref is not None:  # a u32 filter, ordered by its pref among the fw ones
                        filters.extend(self._match_filters(m, q.handle, cls.classid))
                if cls.fwmark is None:
                    continue
                filters.extend(
                    ir.FwFilter(
                        q.handle,
                        kernel_pref(fw_pref, family),
                        cls.fwmark,
                        cls.classid,
                        cls.span,
                        fw_mask,
                        family,
                    )
                    for family in families
                )
                for m in marked_lines(cls):
                    rules.extend(
                        ir.MarkRule(alt, cls.fwmark, m.span, family=family)
                        for family, alt in lower.family_alternatives(m, families)
                    )
        if default is not None:
            assert isinstance(root, ir.Htb | ir.Hfsc) and root.default is not None
            rules.extend(
                ir.MarkRule((), marked[id(default)], root.default.span, True, family)
                for family in families
            )
        for q in ir.walk_qdiscs(new_root):
            for cls in ir.classes_of(q):
                if cls.set_dscp is not None and cls.fwmark is None:
                    self.error(
                        "E248",
                        f"no mark reaches {cls.label}, so 'set dscp' would change nothing: the "
                        "marking rules write the DSCP of packets carrying a class's mark; give "
                        "it a match line without 'pref', or a 'mark'",
                        cls.set_dscp.span,
                    )
        dscp = tuple(
            ir.DscpRule(cls.fwmark, cls.set_dscp.value, cls.set_dscp.span, family)
            for family in families
            for cls in ir.classes_of(new_root)
            if cls.set_dscp is not None and cls.fwmark is not None
        )
        chain = marking.explicit_chain or default_chain(iface.name)
        new_marking = dataclasses.replace(marking, chain=chain, rules=tuple(rules), dscp_rules=dscp)
        return dataclasses.replace(
            iface, root=new_root, marking=new_marking, filters=tuple(filters)
        )

    def _with_marks(
        self, q: ir.Qdisc, default: ir.Class | None, pool: Pool, marked: dict[int, int]
    ) -> ir.Qdisc:
        def visit(cls: ir.Class, original: ir.Class) -> ir.Class:
            fwmark = None
            # An explicit mark gets its fw filter even without a match line: the mark may be
            # set by another firewall rule (the lints say so).
            if marked_lines(cls) or original is default or cls.mark is not None:
                preferred = None
                minor_text = f"{cls.classid.minor:x}" if cls.classid else ""
                if minor_text.isdigit() and int(minor_text) < 1 << pool.limit.bit_count():
                    preferred = deposit(int(minor_text), pool.limit)
                fwmark = cls.mark.value if cls.mark is not None else pool.take(preferred)
                marked[id(original)] = fwmark  # type: ignore[assignment]
            children = tuple(
                visit(c, o) for c, o in zip(cls.children, original.children, strict=True)
            )
            return ir.replace(cls, fwmark=fwmark, children=children)

        if isinstance(q, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
            return dataclasses.replace(q, classes=tuple(visit(c, c) for c in q.classes))
        return q


def marked_lines(cls: ir.Class) -> list[ir.Match]:
    """The match lines of ``cls`` that marking rules carry on an interface that classifies by
    mark: those without their own ``pref`` (a line with one stays a u32 filter)."""
    return [m for m in cls.matches if m.pref is None]


def deposit(value: int, mask: int) -> int:
    """Spread the bits of ``value``, lowest first, over the set bits of ``mask`` (x86's pdep):
    the ``value``-th mark that lives under ``mask``."""
    out = 0
    bit = 1
    while value and mask:
        low = mask & -mask
        if value & bit:
            out |= low
        mask ^= low
        value &= ~bit
        bit <<= 1
    return out


def _round_near(lowest: int, highest: int, target: int) -> int:
    """The number in [lowest, highest] nearest to ``target``, preferring a round one
    (1, 2 or 5 times a power of ten)."""
    if lowest <= target <= highest:
        return target
    rounds = sorted(m * 10**k for k in range(11) for m in (1, 2, 5))
    if target < lowest:
        return next((r for r in rounds if lowest <= r <= highest), lowest)
    return next((r for r in reversed(rounds) if lowest <= r <= highest), highest)


def choose_quanta(q: ir.Htb, kept: int | None = None) -> ir.Htb:
    """Give an htb without ``r2q`` the r2q, or class quanta, that keep every class's quantum
    (rate / r2q, in bytes) inside the kernel's 1000..200000, changing as little as possible.
    ``kept``: the r2q the htb has live (``tcdsl apply`` pins it: a live htb cannot change its
    r2q, so choosing another would build the tree again), kept as it is.

    Only leaf classes take turns by quantum, so only their rates choose: tc's default r2q if
    it suits them all, else the round number nearest to it that does (one that suits the inner
    classes too, where there is one). Where none suits every leaf (rates more than 200 times
    apart), r2q stays tc's default. Then each class still out of range (a leaf, or an inner
    class whose quantum is never used) gets the quantum the kernel would clamp it to: the same
    value, without the kernel's warning.
    """
    if q.r2q is not None:
        return q
    rates = {
        id(c): c.rate.bits_per_second
        for c in ir.classes_of(q)
        if c.quantum is None and isinstance(c.rate, ir.Rate)
    }
    leaves = [rates[id(c)] // 8 for c in ir.classes_of(q) if not c.children and id(c) in rates]
    r2q = HTB_DEFAULT_R2Q if kept is None else kept
    fits = htb_r2q_range(leaves) if leaves else None
    if kept is None and fits is not None and not fits[0] <= r2q <= fits[1]:
        suited = htb_r2q_fits(leaves, [bits // 8 for bits in rates.values()])
        assert suited is not None  # the leaves' range exists: fits
        r2q = _round_near(*suited, HTB_DEFAULT_R2Q)
    quanta: dict[int, int] = {}
    for key, bits in rates.items():
        computed, kept = htb_quantum(bits, r2q)
        if computed != kept:
            quanta[key] = kept

    def visit(cls: ir.Class) -> ir.Class:
        children = tuple(visit(c) for c in cls.children)
        quantum = quanta.get(id(cls))
        if quantum == cls.chosen_quantum and all(map(operator.is_, children, cls.children)):
            return cls  # nothing to change here or below: no copy
        return ir.replace(cls, chosen_quantum=quantum, children=children)

    chosen = None if r2q == HTB_DEFAULT_R2Q else r2q
    if chosen is None and not quanta:
        return q
    return dataclasses.replace(q, chosen_r2q=chosen, classes=tuple(visit(c) for c in q.classes))


Pins = Mapping[str, Mapping[str, ir.Handle]]
"""Class ids to keep: tree label -> class name -> the id it had (``tcdsl apply`` pins those of
the policy live now, so that adding or removing a class leaves its siblings' ids alone); under
the class's name with ``LEAF_PIN`` after it, the handle of its leaf qdisc; and the r2q of each
htb (``R2Q_PIN``)."""

LEAF_PIN = " leaf"
"""After a class name in ``Pins``: its leaf qdisc's handle (no class name has a blank)."""
NESTED_PIN = f"{LEAF_PIN} "
"""After a class name in ``Pins``, with a depth after it (``voip leaf 2``): the handle of the
qdisc that deep below the class, a tbf's or netem's child (2), its child (3), ..."""
LINK_PIN = " link"
"""After an htb's handle (``1:``) in ``Pins``: the id of the link class tcdsl made for it
(``interface eth0 htb rate ...``), which has no name of its own."""
PARENT_PIN = " parent"
"""After a class name in ``Pins``: the id of its live parent (``1:`` for a top class); a class
whose parent is another now moved, and is given a new id."""
QUEUE_PIN = " queue"
"""After the handle of an mq queue's qdisc (``12:``) in ``Pins``: the queue's number, as the
major of a handle (``3:``). A spread tree (``mq queues N``) keeps each top-level class whose
live id has that major on that queue (``live_queues``)."""
R2Q_PIN = " r2q"
"""After an htb's handle (``1:``) in ``Pins``: the r2q it was given, as the major of a handle
(``5:``), when the policy did not say one."""


LiveQueues = tuple[int, dict[str, int]]
"""A live mq tree's queues: how many, and class name -> the queue (from 1) it is on."""


def live_queues(pins: Pins) -> dict[str, LiveQueues]:
    """Tree label -> the live mq tree's ``LiveQueues``: the queues whose qdiscs ``pins`` has
    (``QUEUE_PIN``), and the queue of each class whose pinned id is under one of them."""
    found: dict[str, LiveQueues] = {}
    for label, ids in pins.items():
        queue_of = _queue_pins(ids)
        if queue_of:
            names = {
                name: queue_of[h.major]
                for name, h in ids.items()
                if " " not in name and h.major in queue_of
            }
            found[label] = (len(queue_of), names)
    return found


def _queue_pins(ids: Mapping[str, ir.Handle]) -> dict[int, int]:
    """The major of each live mq queue's qdisc -> its queue's number (``QUEUE_PIN``)."""
    return {
        int(key.partition(":")[0], 16): h.major for key, h in ids.items() if key.endswith(QUEUE_PIN)
    }


def allocate(
    policy: ir.Policy, pins: Pins | None = None, hash_min: int | None = None
) -> tuple[ir.Policy, list[Diagnostic]]:
    """Return the policy with every handle, class id, mark, pref and chain assigned; a class
    named in ``pins`` (by its tree's label) keeps its id when that id is free and of its
    qdisc (an explicit id wins). ``hash_min``: the shortest run of u32 filters put in a hash
    table (0: none, None: ``u32layout.HASH_MIN``; tests compare both forms)."""
    diagnostics: list[Diagnostic] = []
    blocks: set[int] = set()
    pins = pins or {}
    interfaces = tuple(
        InterfaceAllocator(i, diagnostics, blocks, pins.get(i.label), hash_min).run()
        for i in policy.interfaces
    )
    chains: dict[str, ir.Interface] = {}
    for iface in interfaces:
        if iface.marking is None or iface.marking.chain is None:
            continue
        if iface.marking.chain in chains:
            diagnostics.append(
                Diagnostic.error(
                    "E204",
                    f"iptables chain '{iface.marking.chain}' is used by two interfaces",
                    iface.marking.span,
                    Note("first used here", chains[iface.marking.chain].marking.span),  # type: ignore[union-attr]
                )
            )
        chains[iface.marking.chain] = iface
    return dataclasses.replace(policy, interfaces=interfaces), diagnostics


def default_minor(q: ir.Htb | ir.Hfsc) -> int | None:
    """The minor of an allocated htb's or hfsc's default class, or None."""
    if q.default is None:
        return None
    for cls in ir.classes_of(q):
        if cls.name == q.default.name and not cls.implicit and cls.classid is not None:
            return cls.classid.minor
    return None
