"""A filter group in u32 tables whose tables change (or that goes, or comes with table ids the
live policy holds), swapped make-before-break: never a moment without it.

A group whose tables stay is changed node by node (``tcdsl.ops.u32nodes``). When the tables
themselves change (adding subscribers in one bucket's range makes a second-level table; rows
reordered fall into runs differently), the group cannot simply be deleted and built again:
u32 keeps the tables of all of a qdisc's u32 filters in one pool, and deleting a pref leaves
its tables there, under their ids, unreachable, until the last u32 filter of the qdisc goes.
Such a table can be deleted through any other u32 pref of the qdisc, once no link points to
it: a deleted link gives up its table only after an RCU grace period. Unlinking a group's
tables while its pref stays would let packets reach the pref's later lines, which the old
policy never let them reach; so the pref goes whole. In three steps:

1. **copy**: the new group is built at a free pref next to its own (tried where it stands,
   as nothing lies between), its tables under ids neither policy uses;
2. **settle**: the old group's pref is deleted (at once: a packet meets the old group or, from
   then on, the copy); its tables are deleted through the copy's pref, top tables first,
   each tried again while the kernel says it is in use; the new group is built at its own
   pref under its own table ids (tried after or before the copy: both are the new policy),
   and the copy's pref is deleted;
3. **settle**: the copy's tables are deleted through the new group's pref.

Every packet is classified as the old policy or the new one says, and the tables of the old
group and of the copy are gone at the end. A group that goes has its pref deleted in step 2
and its tables through another u32 pref of the qdisc that stays (with none, the qdisc's
table pool goes with its last u32 pref); one that comes whose table ids the live policy holds
is built in step 2, after the old tables are gone. Without a free pref next to a changed
group (prefs 1, 2, 3 all taken), or table ids for its copy, it is deleted and built again at
its own pref in step 2, as a group without tables is: for that moment its packets meet the
prefs after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tcdsl.commands import Command
from tcdsl.ops.desired import Key, Obj, word_after

TABLE_IDS = 0x7FF
"""User table ids of one qdisc (``1:`` to ``7ff:``; the prefs' root tables are 800: and up)."""


def table_ids(o: Obj) -> set[int]:
    """The ids of the tables a filter group makes."""
    return {table_of(c.args) for c in o.commands if "divisor" in c.args}


def is_u32(o: Obj) -> bool:
    """Whether a filter group is u32 filters (through which tables can be deleted)."""
    return o.kind == "filters" and all("u32" in c.args for c in o.commands)


def table_of(args: Sequence[str]) -> int:
    """The id of the u32 table a ``divisor`` command makes (its handle's)."""
    handle = word_after(args, "handle") or ""
    return int(handle.split(":")[0], 16)


@dataclass(slots=True)
class Swaps:
    """The swaps of one plan, step by step (see the module's docstring)."""

    copy: list[Command] = field(default_factory=list)
    unmake: list[Command] = field(default_factory=list)
    orphans: list[Command] = field(default_factory=list)
    builds: list[Command] = field(default_factory=list)
    uncopy: list[Command] = field(default_factory=list)
    clear: list[Command] = field(default_factory=list)
    copies: list[Key] = field(default_factory=list)
    swapped: list[Key] = field(default_factory=list)
    late: list[Key] = field(default_factory=list)

    def swap(self, old: Obj, new: Obj, pref: int, ids: Iterable[int]) -> None:
        """``old`` swapped for the u32 group ``new``, by way of a copy at ``pref`` whose
        tables take the ``ids`` (as many as ``new`` has tables)."""
        mapping = dict(zip(sorted(table_ids(new)), ids, strict=True))
        key = (*new.key[:-1], str(pref))
        copy = Obj(key, new.tree, tuple(at_pref(c, pref, mapping) for c in new.commands))
        self.copy += copy.commands
        self.copies.append(copy.key)
        self.swapped.append(new.key)
        self.remove(old, copy.key)
        self.builds += new.commands
        self.uncopy.append(pref_deletion(copy))
        self.clear += _tables_gone(copy, new.key)

    def remove(self, old: Obj, through: Key | None) -> None:
        """``old`` removed, its tables deleted through the u32 group ``through`` (None: no
        u32 pref of the qdisc stays, and the tables go with the last)."""
        self.unmake.append(pref_deletion(old))
        if through is not None:
            self.orphans += _tables_gone(old, through)

    def add_late(self, new: Obj) -> None:
        """``new`` built once the old tables are gone (its table ids are live, or it is
        deleted and built again at its own pref, with no copy)."""
        self.builds += new.commands
        self.late.append(new.key)

    def steps(self) -> list[list[Command]]:
        """The commands of steps 2 and 3 (step 1's, ``copy``, go with the plan's other
        additions). Step 2 deletes every old table before it builds: a new group may take
        the ids another old group had."""
        return [[*self.unmake, *self.orphans, *self.builds, *self.uncopy], self.clear]


def pref_deletion(o: Obj, pref: str | None = None) -> Command:
    """The command deleting filter group ``o``'s pref (or ``pref`` of its parent, protocol)."""
    _, dev, parent, protocol, own = o.key
    where = ("dev", dev, "parent", parent, "protocol", protocol, "prio", pref or own)
    return Command("tc", ("filter", "del", *where), o.span, o.what)


def _tables_gone(o: Obj, through: Key) -> list[Command]:
    """The commands deleting the tables of ``o``, whose pref is gone, through the u32 pref
    ``through``: each table after the one linking to it."""
    above: dict[int, int | None] = {}
    for c in o.commands:
        target = word_after(c.args, "link")
        if target is not None:
            up = (word_after(c.args, "handle") or "").partition(":")[0]
            above[int(target.partition(":")[0], 16)] = int(up, 16) if up else None

    def level(table: int) -> int:
        up = above.get(table)
        return 0 if up is None else level(up) + 1

    _, dev, parent, protocol, pref = through
    where = ("dev", dev, "parent", parent, "protocol", protocol, "prio", pref)
    tables = [c for c in o.commands if "divisor" in c.args]
    tables.sort(key=lambda c: level(table_of(c.args)))
    return [
        Command("tc", ("filter", "del", *where, "handle", f"{table_of(c.args):x}:", "u32"),
                c.span, c.what)
        for c in tables
    ]  # fmt: skip


def at_pref(c: Command, pref: int, tables: dict[int, int] | None = None) -> Command:
    """``c`` at ``pref``, its table ids (in handle, ht and link) mapped by ``tables``."""
    mapping = tables or {}  # a group without tables names none
    args = list(c.args)
    args[args.index("prio") + 1] = str(pref)
    for word in ("handle", "ht", "link"):
        if word in args:
            at = args.index(word) + 1
            table, colon, rest = args[at].partition(":")
            if table and colon:
                args[at] = f"{mapping[int(table, 16)]:x}:{rest}"
    return Command(c.tool, tuple(args), c.span, c.what)
