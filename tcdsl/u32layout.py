"""Lay out each pref's u32 filters so that the kernel tries them in the policy's order, and
hash long runs of filters that fix one header byte (docs/scale.md, "Classification order and
hashed u32 filters").

u32 keeps one tree of tables per parent, protocol and pref, whose root table (``800:``) has
one bucket. The nodes of a bucket are tried by node id; a node made without a handle gets
0x800 to 0xfff, then 0x001 to 0x7ff (tried first), and past that 0xfff again. So:

- a pref of at most ``ORDER_KEPT`` filters and no run worth hashing is left as it is
  (no handles: the kernel numbers them in the order made, which is the order tried);
- otherwise every node gets an explicit ``TABLE:BUCKET:NODE`` handle, node ids counting up
  from 1 in the order tried. A run of at least ``HASH_MIN`` consecutive filters that all fix
  one byte of the fixed headers goes into a table of 256 buckets hashed on that byte (two
  levels when a bucket is still long); a packet can only match filters of its own bucket, in
  which they keep their order, and when none matches u32 goes back to the node after the
  link. A bucket of more than ``NODES`` nodes is cut into sub-lists of divisor 1, linked in
  order. Table ids (0x1 to 0x7ff) are unique under one parent.

Pure: ``layout`` takes an interface's allocated filters and returns them with places, and
the tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import cast

from tcdsl import ir, lower
from tcdsl.diagnostics import Span

ORDER_KEPT = 2048
"""How many filters one pref keeps in their order without handles (node ids 0x800-0xfff)."""
NODES = 0xFFF
"""Node ids of one bucket (1 to 0xfff)."""
TABLE_IDS = 0x7FF
"""User table ids under one parent: 0x1 to 0x7ff (0x800 and up are the prefs' root tables)."""
HASH_MIN = 32
"""The shortest run hashed, and the longest bucket not hashed again. Measured with
``bench/hash_bench.py --threshold`` (docs/scale.md): a packet matching the last of N lines
costs the same hashed or linear within noise (0.05 us of 2.9 us) up to 32 lines, linear
costs 3% more at 32 and 14% more at 64 (about 7 ns a line)."""
DIVISOR = 256
HEADER = {"ipv4": 20, "ipv6": 40}
"""Bytes of the fixed header, where every packet of the family has the byte hashed on."""
LEVELS = 2
"""Hash tables one inside the other at most (u32 follows links up to TC_U32_MAXDEPTH, 8,
deep; sub-lists of divisor 1 add a level per 4,095 nodes)."""


@dataclass(frozen=True, slots=True)
class _Leaf:
    index: int


@dataclass(frozen=True, slots=True)
class _Hash:
    byte: int
    buckets: tuple[tuple[int, tuple[_Item, ...]], ...]


@dataclass(frozen=True, slots=True)
class _List:
    items: tuple[_Item, ...]


_Item = _Leaf | _Hash | _List


def fixed_bytes(f: ir.U32Filter) -> dict[int, int]:
    """The bytes of the fixed header (offset -> value) that every packet ``f`` matches has."""
    fixed: dict[int, int] = {}
    header = HEADER[f.family]
    for key in f.keys:
        address = lower.address_bytes(key)  # most keys of long runs: no words to make
        if address is not None and address[0] + len(address[1]) <= header:
            at, whole = address
            fixed.update(zip(range(at, at + len(whole)), whole, strict=True))
            continue
        for offset, value, mask in lower.pack_words(key):
            if mask == 0xFFFFFFFF and offset + 4 <= header:  # a whole word (an address's)
                fixed[offset] = (value >> 24) & 0xFF
                fixed[offset + 1] = (value >> 16) & 0xFF
                fixed[offset + 2] = (value >> 8) & 0xFF
                fixed[offset + 3] = value & 0xFF
                continue
            for i in range(4):
                shift = 24 - 8 * i
                if (mask >> shift) & 0xFF == 0xFF and offset + i < header:
                    fixed[offset + i] = (value >> shift) & 0xFF
    return fixed


class _Planner:
    def __init__(self, filters: Sequence[ir.U32Filter], hash_min: int) -> None:
        self.filters = filters
        self.hash_min = hash_min
        self.fixed = [fixed_bytes(f) for f in filters] if len(filters) >= hash_min else []

    def items(self, indexes: Sequence[int], level: int, used: frozenset[int]) -> list[_Item]:
        """``indexes`` (in order) as leaves, with the runs worth it hashed.

        From each filter, every byte it fixes starts a run (the filters from it on that fix
        that byte); the run saving the most nodes to the longest bucket is hashed, if it
        saves at least ``hash_min // 2`` and is ``hash_min`` long. A byte not worth it from
        one filter is not from any later one of its run either (the run only shortens), so
        each run of each byte is weighed once."""
        if level >= LEVELS or len(indexes) < self.hash_min or not self.fixed:
            return [_Leaf(i) for i in indexes]
        fixed = [self.fixed[i] for i in indexes]
        ends = _run_ends(fixed, used)
        useless: dict[int, int] = {}
        out: list[_Item] = []
        start = 0
        while start < len(indexes):
            best: tuple[int, int, int] | None = None
            for byte in fixed[start].keys() - used:
                if useless.get(byte, 0) > start:
                    continue
                end = ends[byte][start]
                saved = self._saved(fixed, start, end, byte)
                if saved is None:
                    useless[byte] = end
                elif best is None or (saved, -byte) > (best[0], -best[2]):
                    best = (saved, end, byte)
            if best is None:
                out.append(_Leaf(indexes[start]))
                start += 1
                continue
            _, end, byte = best
            out.append(self._hash(indexes[start:end], byte, level, used))
            start = end
        return out

    def _saved(self, fixed: list[dict[int, int]], start: int, end: int, byte: int) -> int | None:
        """How many nodes hashing ``fixed[start:end]`` on ``byte`` saves the packets of the
        longest bucket, or None when not worth it."""
        if end - start < self.hash_min:
            return None
        sizes = Counter(map(itemgetter(byte), fixed[start:end]))
        saved = end - start - max(sizes.values())
        return saved if saved >= self.hash_min // 2 else None

    def _hash(self, run: Sequence[int], byte: int, level: int, used: frozenset[int]) -> _Hash:
        buckets: dict[int, list[int]] = {}
        for i in run:
            buckets.setdefault(self.fixed[i][byte], []).append(i)
        inner = used | {byte}
        return _Hash(
            byte,
            tuple(
                (value, tuple(self.items(members, level + 1, inner)))
                for value, members in sorted(buckets.items())
            ),
        )


def _run_ends(fixed: list[dict[int, int]], used: frozenset[int]) -> dict[int, list[int]]:
    """For each byte some filter fixes: at each index, where the run of filters fixing it
    from there ends."""
    # Consecutive filters mostly fix the same bytes (a table's lines differ in values only):
    # work on the stretches of filters fixing the same bytes, not filter by filter.
    stretches: list[tuple[int, int, Set[int]]] = []
    n = start = 0
    for shape, members in groupby(fixed, key=dict.keys):  # dict views compare as sets
        n += len(list(members))
        stretches.append((start, n, shape))
        start = n
    bytes_ = {b for _, _, fixes in stretches for b in fixes} - used
    ends: dict[int, list[int]] = {}
    for b in bytes_:
        column = [n] * (n + 1)
        end = n  # the first filter not fixing b after the stretch
        for first, after, fixes in reversed(stretches):
            if b in fixes:
                column[first:after] = [end] * (after - first)
            else:
                column[first:after] = range(first, after)
                end = first
        ends[b] = column
    return ends


class _Placer:
    """Gives nodes their places and makes the tables, ids counting up per parent."""

    def __init__(self, filters: Sequence[ir.U32Filter], ids: Iterator[int]) -> None:
        first = filters[0]
        self.parent, self.pref, self.family = first.parent, first.pref, first.family
        self.filters = filters
        self.ids = ids
        self.places: dict[int, ir.U32Place] = {}
        self.tables: list[ir.U32Table] = []

    def bucket(self, items: Sequence[_Item], table: int | None, bucket: int) -> None:
        while len(items) > NODES:
            items = [_List(tuple(items[i : i + NODES])) for i in range(0, len(items), NODES)]
        for node, item in enumerate(items, 1):
            place = ir.U32Place(table, bucket, node)
            match item:
                case _Leaf():
                    self.places[item.index] = place
                case _List():
                    self._table(place, 1, None, self._lister(item))
                case _Hash():
                    self._table(place, DIVISOR, _hashkey(item.byte), self._filler(item))

    def _lister(self, item: _List) -> _Fill:
        def fill(table: int) -> None:
            self.bucket(item.items, table, 0)

        return fill

    def _filler(self, item: _Hash) -> _Fill:
        def fill(table: int) -> None:
            for value, members in item.buckets:
                self.bucket(members, table, value)

        return fill

    def _table(
        self, link: ir.U32Place, divisor: int, hashkey: tuple[int, int] | None, fill: _Fill
    ) -> None:
        table = next(self.ids)
        slot = len(self.tables)
        self.tables.append(
            ir.U32Table(self.parent, self.pref, self.family, table, divisor, link, _NOWHERE)
        )
        before = len(self.places)
        fill(table)
        inside = list(self.places)[before:]
        span = self.filters[min(inside)].span
        self.tables[slot] = ir.replace(
            self.tables[slot], span=span, hashkey=hashkey, count=len(inside)
        )


_Fill = Callable[[int], None]
_NOWHERE = Span("", 0, 0, 0, 0)


def _hashkey(byte: int) -> tuple[int, int]:
    return 0xFF << (8 * (3 - byte % 4)), byte - byte % 4


class _IdsExhausted(Exception):
    """More tables under one parent than u32 has ids for."""


def _ids(taken: set[int]) -> Iterator[int]:
    for table in range(1, TABLE_IDS + 1):
        if table not in taken:
            taken.add(table)
            yield table
    raise _IdsExhausted


def layout(
    filters: tuple[ir.Filter, ...], hash_min: int | None = None
) -> tuple[tuple[ir.Filter, ...], tuple[ir.U32Table, ...]]:
    """``filters`` (allocated, in the order tried) with their u32 places, and the tables they
    are in; unchanged, and no table, for every pref of at most ``ORDER_KEPT`` u32 filters and
    no run of ``hash_min`` to hash (``hash_min=0``: never hash). When a parent runs out of
    table ids, a pref is laid out without hashing, and failing that left as it is (lint's
    E262). ``hash_min`` None: ``HASH_MIN``."""
    if hash_min is None:
        hash_min = HASH_MIN
    groups: dict[tuple[ir.Handle, ir.Family, int], list[int]] = {}
    for i, f in enumerate(filters):
        if isinstance(f, ir.U32Filter):
            groups.setdefault((f.parent, f.family, f.pref), []).append(i)
    smallest = hash_min if hash_min > 0 else ORDER_KEPT + 1
    if all(len(g) < smallest and len(g) <= ORDER_KEPT for g in groups.values()):
        return filters, ()
    placed = list(filters)
    tables: list[ir.U32Table] = []
    taken: dict[ir.Handle, set[int]] = {}
    for indexes in groups.values():
        group = [cast(ir.U32Filter, filters[i]) for i in indexes]
        for attempt in (hash_min, 0) if hash_min > 0 else (0,):
            used = set(taken.get(group[0].parent, set()))
            placer = _place(group, attempt, used)
            if placer is not None:
                break
        if placer is None or not placer.places:
            continue
        taken[group[0].parent] = used
        for local, place in placer.places.items():
            f = group[local]
            # ir.replace(f, place=place), spelt out (once per filter): _U32_FIELDS
            placed[indexes[local]] = ir.U32Filter(
                f.parent,
                f.pref,
                f.keys,
                f.flowid,
                f.span,
                f.police,
                f.family,
                f.police_index,
                place,
            )
        tables.extend(placer.tables)
    return tuple(placed), tuple(tables)


_U32_FIELDS = ("parent", "pref", "keys", "flowid", "span", "police", "family", "police_index")
assert ir.U32Filter.__match_args__ == (*_U32_FIELDS, "place"), "layout() builds U32Filters"


def _place(group: list[ir.U32Filter], hash_min: int, used: set[int]) -> _Placer | None:
    """The places of one pref's filters (none when it is left as it is), or None when the
    parent's table ids run out."""
    planner = _Planner(group, hash_min if hash_min > 0 else len(group) + 1)
    items = planner.items(range(len(group)), 0, frozenset())
    placer = _Placer(group, _ids(used))
    if len(group) <= ORDER_KEPT and all(isinstance(it, _Leaf) for it in items):
        return placer
    try:
        placer.bucket(items, None, 0)
    except _IdsExhausted:
        return None
    return placer


Node = ir.U32Filter | ir.U32Table
"""What a bucket holds: a filter, or the node linking to a table."""
Buckets = dict[tuple[int | None, int], list[Node]]
"""(table, bucket) -> its nodes in the order tried (table None: the pref's root table)."""


def buckets(iface: ir.Interface) -> dict[tuple[ir.Handle, ir.Family, int], Buckets]:
    """The laid-out prefs of ``iface`` (those with tables), keyed by (parent, family, pref):
    every bucket's nodes by node id, as u32 tries them."""
    out: dict[tuple[ir.Handle, ir.Family, int], Buckets] = {}
    for t in iface.u32_tables:
        group = out.setdefault((t.parent, t.family, t.pref), {})
        group.setdefault((t.link.table, t.link.bucket), []).append(t)
    for f in iface.filters:
        if isinstance(f, ir.U32Filter) and f.place is not None:
            found = out.get((f.parent, f.family, f.pref))
            if found is not None:
                found.setdefault((f.place.table, f.place.bucket), []).append(f)
    for group in out.values():
        for nodes in group.values():
            nodes.sort(key=lambda n: n.link.node if isinstance(n, ir.U32Table) else _node(n))
    return out


def _node(f: ir.U32Filter) -> int:
    assert f.place is not None
    return f.place.node


def bucket_of(t: ir.U32Table, header: bytes) -> int | None:
    """The bucket of table ``t`` u32 takes a packet with ``header`` (from the network header
    on) to: 0 for divisor 1, the hashed byte's value; None when the header is too short (u32
    then gives up on the whole pref)."""
    if t.hashkey is None:
        return 0
    mask, offset = t.hashkey
    if offset + 4 > len(header):
        return None
    word = int.from_bytes(header[offset : offset + 4], "big") & mask
    return (word >> ((mask & -mask).bit_length() - 1)) & (t.divisor - 1)
