"""A changed filter group that lives in u32 tables (``tcdsl.u32layout``), changed node by node.

Such a group cannot be built again beside itself, as other groups are (``plan``): u32 frees a
deleted pref's table ids only after an RCU grace period, so the same ids cannot be made again
in one batch. But when its tables stay as they were (the same table and link commands) and
only filters inside hash buckets change, as when a subscriber is added, removed or given
another class, the change can be made inside the live tables, bucket by bucket:

1. each new or changed filter is added at a spare node id past the end of its bucket (at its
   own node id, when the bucket had no node there);
2. the old filters of the changed nodes are deleted;
3. the new filters are added at their own node ids;
4. the spare copies are deleted.

A line is never missing from its bucket on the way (it is at its old node, its spare node or
its new node), and a packet can match at most one line of a changed bucket, because this is
done only where the lines of the bucket, old and new, are pairwise disjoint (as subscribers'
addresses are) and the bucket holds no link: so the order of the nodes, which the steps
shuffle for a moment, decides nothing, and every packet is classified as the old policy or the
new one says. Anything else (a new or removed table, a line that overlaps another, a change
in a bucket that links further) is left to the caller, which builds the tree again.
"""

from __future__ import annotations

from collections.abc import Sequence

from tcdsl.commands import Command
from tcdsl.ops.desired import Obj, word_after
from tcdsl.verify.expect import UnpackableKey, expected_keys
from tcdsl.verify.readback import Key

NODE_IDS = 0xFFF
"""Node ids of one bucket (1 to 0xfff)."""
_ENDS = frozenset({"flowid", "classid", "action", "police", "link", "hashkey", "ht", "match"})

Bucket = tuple[str, str]
"""A bucket: (table, bucket) of a node handle ``TABLE:BUCKET:NODE`` (hex, as tc writes it)."""


def node_changes(old: Obj, new: Obj) -> list[Command] | None:
    """The commands that take the live group ``old`` to ``new`` node by node, or None when
    that cannot be done safely (see the module's docstring)."""
    old_structure, old_nodes = _split(old.commands)
    new_structure, new_nodes = _split(new.commands)
    if old_structure is None or new_structure is None or old_structure != new_structure:
        return None
    assert old_nodes is not None and new_nodes is not None
    linking = _links(new_structure)
    changed: dict[Bucket, list[int]] = {}
    for handle in old_nodes.keys() | new_nodes.keys():
        a, b = old_nodes.get(handle), new_nodes.get(handle)
        if a is None or b is None or a.args != b.args:
            table, bucket, node = handle
            changed.setdefault((table, bucket), []).append(node)
    spare_adds: list[Command] = []
    deletes: list[Command] = []
    adds: list[Command] = []
    spare_deletes: list[Command] = []
    old_buckets, new_buckets = _by_bucket(old_nodes, changed), _by_bucket(new_nodes, changed)
    for where, nodes in sorted(changed.items()):
        old_bucket, new_bucket = old_buckets.get(where, {}), new_buckets.get(where, {})
        if where in linking or not _disjoint(list(old_bucket.values()), list(new_bucket.values())):
            return None
        spare = max([*old_bucket, *new_bucket]) + 1
        for node in sorted(nodes):
            made = new_bucket.get(node)
            if made is not None and node not in old_bucket:
                spare_adds.append(made)  # a free node id: added where it goes, at once
            elif made is not None:
                if spare > NODE_IDS:
                    return None
                spare_adds.append(_at(made, where, spare))
                spare_deletes.append(_delete(_at(made, where, spare)))
                adds.append(made)
                spare += 1
            if node in old_bucket:
                deletes.append(_delete(old_bucket[node]))
    return [*spare_adds, *deletes, *adds, *spare_deletes]


def _by_bucket(
    nodes: dict[tuple[str, str, int], Command], wanted: dict[Bucket, list[int]]
) -> dict[Bucket, dict[int, Command]]:
    """The nodes of the ``wanted`` buckets, by bucket and node id."""
    out: dict[Bucket, dict[int, Command]] = {}
    for (table, bucket, node), c in nodes.items():
        if (table, bucket) in wanted:
            out.setdefault((table, bucket), {})[node] = c
    return out


def _split(
    commands: Sequence[Command],
) -> tuple[list[tuple[str, ...]] | None, dict[tuple[str, str, int], Command] | None]:
    """(what must stay as it is: the tables, the links and the filters of the pref's root
    table, whose bucket holds the links; the other filters by handle), or (None, None) when a
    filter has no explicit ``TABLE:BUCKET:NODE`` handle."""
    structure: list[tuple[str, ...]] = []
    nodes: dict[tuple[str, str, int], Command] = {}
    for c in commands:
        if "divisor" in c.args:
            structure.append(c.args)
            continue
        handle = word_after(c.args, "handle")
        parts = handle.split(":") if handle is not None else []
        if len(parts) != 3 or not parts[2]:
            return None, None
        if not parts[0] or "link" in c.args:
            structure.append(c.args)
        else:
            nodes[(parts[0], parts[1], int(parts[2], 16))] = c
    return structure, nodes


def _links(structure: Sequence[tuple[str, ...]]) -> set[Bucket]:
    """The buckets that hold a link to another table."""
    out: set[Bucket] = set()
    for args in structure:
        handle = word_after(args, "handle")
        if "link" in args and handle is not None and handle.count(":") == 2:
            table, bucket, _ = handle.split(":")
            out.add((table, bucket))
    return out


def _disjoint(old: Sequence[Command], new: Sequence[Command]) -> bool:
    """Whether no packet can match two different lines among ``old`` and ``new`` (the two
    versions of one line, with the same keys, count as one), each list holding a line once."""
    found: set[tuple[Key, ...]] = set()
    for version in (old, new):
        keys = [line_keys(c) for c in version]
        if any(k is None for k in keys) or len(set(keys)) != len(keys):
            return False
        found.update(k for k in keys if k is not None)
    distinct = [{offset: (value, mask) for value, mask, offset in k} for k in found]
    common = (
        set.intersection(
            *(set(d.items()) for d in [{o: m for o, (_, m) in d.items()} for d in distinct])
        )
        if distinct
        else set()
    )
    for offset, mask in common:  # one word all fix the same bits of: distinct values suffice
        if len({d[offset][0] & mask for d in distinct}) == len(distinct):
            return True
    return all(_apart(a, b) for i, a in enumerate(distinct) for b in distinct[i + 1 :])


def _apart(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> bool:
    """Whether two filters' keys (offset -> value, mask) differ in a bit both fix."""
    for offset, (value, mask) in a.items():
        other = b.get(offset)
        if other is not None and (value ^ other[0]) & mask & other[1]:
            return True
    return False


def line_keys(c: Command) -> tuple[Key, ...] | None:
    """The u32 keys of a filter's ``match`` words (sorted), or None when they cannot be
    read (then nothing is assumed about them)."""
    args = c.args
    groups: list[tuple[str, ...]] = []
    i = 0
    while i < len(args):
        if args[i] != "match":
            i += 1
            continue
        j = i + 1
        while j < len(args) and args[j] not in _ENDS:
            j += 1
        groups.append(args[i + 1 : j])
        i = j
    if not groups:
        return None
    try:
        return tuple(sorted(expected_keys(tuple(groups))))
    except (UnpackableKey, ValueError, KeyError, IndexError, AssertionError):
        return None


def _at(c: Command, where: Bucket, node: int) -> Command:
    """``c`` with its handle moved to ``node`` of its bucket."""
    args = list(c.args)
    args[args.index("handle") + 1] = f"{where[0]}:{where[1]}:{node:x}"
    return Command(c.tool, tuple(args), c.span, c.what)


def _delete(c: Command) -> Command:
    """The command deleting the node ``c`` adds: ``filter del ... handle H u32``."""
    args = c.args
    handle = args.index("handle")
    kind = args.index("u32")
    return Command("tc", ("filter", "del", *args[2:handle + 2], *args[kind:kind + 1]),
                   c.span, c.what)  # fmt: skip
