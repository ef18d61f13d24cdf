"""What applying a policy changes, and in which order: the difference between the objects of
the policy live now (``old``: what the state recorded the last apply built, or its text
compiled again) and those of the new one, as changes a person reads (``+ class guest``,
``~ class voip: rate 6mbit -> 8mbit``, ``- filter to 1:30``, ``! qdisc eth0 root: htb -> cake
(rebuild)``) and as the steps ``apply`` runs.

The order keeps every packet classified and shaped: shared police actions first (filters bind
to them; and the leaf qdisc of a class that gets children, which htb destroys as the first
child comes), then new classes and their leaf qdiscs with parameter changes in place (``class
change``, ``qdisc change``: no counter reset, no queue flush), then filters (a changed group of
filters is built at a free pref next to its own, so that it is tried in the same place, before
the old group goes and the group is built again at its own pref; one in u32 hash tables is
changed node by node inside them, ``tcdsl.ops.u32nodes``, or, when its tables change,
swapped in two more steps, ``tcdsl.ops.u32swap``), and only then deletions
(filters before the classes they send to, children before parents). A tree the kernel cannot
change in place (an htb root's ``default``, a class moving to another parent, marking rules,
drift) is built again: its teardown and build in one ``tc -batch``.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tcdsl import ir
from tcdsl.commands import (
    LINK_KEY,
    MARK_TOOL,
    Command,
    batch_teardown,
    chain_teardown,
    interface_commands,
    mark_families,
    marking_commands,
    restore_lines,
)
from tcdsl.diagnostics import Span
from tcdsl.frontend.qdiscs import CHANGE_IN_PLACE
from tcdsl.ops.desired import Key, Obj, Tree, by_key, trees_of, word_after
from tcdsl.ops.u32nodes import node_changes
from tcdsl.ops.u32swap import (
    TABLE_IDS,
    Swaps,
    at_pref,
    is_u32,
    pref_deletion,
    table_ids,
    table_of,
)
from tcdsl.verify.compare import default_qdisc

Sign = Literal["+", "~", "-", "!"]
_BUILT_AGAIN = ("(rebuild)", "(its subtree is built again)")
"""How the lines of a plan that build a tree or a subtree again end."""
Names = tuple[Mapping[str, str], Mapping[str, str]]
"""A tree's class names (class id -> name) in the old policy and in the new one: a class id
is a tree's own (another tree's 1:10 is another class), and may name another class after a
change."""
Tool = Literal["tc", "ip", "iptables", "ip6tables"]


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the plan as a person reads it."""

    sign: Sign
    text: str
    span: Span | None = None
    tree: str | None = None
    """The label of the tree it changes in place (``eth0``, ``eth0 download (via ifb4eth0)``)."""

    def render(self, tree: bool = False) -> str:
        """``~ class voip: rate 6mbit -> 8mbit  (office.tcp:5)``; what goes is at its line in
        the text live now, which another line may hold in the files since: ``- class old
        (was office.tcp:12)`` (found by a tester). ``tree``: its tree said after it, where a
        plan changes several (``(subs.csv:7; eth0 download (via ifb4eth0))``: one subscriber
        has a class of one name in each direction, found by a tester)."""
        named = self.tree if tree else None
        if self.span is None:
            return f"{self.sign} {self.text}" + (f"  ({named})" if named else "")
        was = "was " if self.sign == "-" else ""
        where = f"; {named}" if named else ""
        return f"{self.sign} {self.text}  ({was}{self.span.file}:{self.span.line}{where})"


@dataclass(frozen=True, slots=True)
class Step:
    """Commands run together: ``tc`` ones as one ``tc -batch`` (stopping at the first that
    fails, when ``fatal``), others one by one. ``origins``: the command each one is (for its
    policy text), None for a cleanup no policy line asks for."""

    tool: Literal["tc", "ip", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore"]
    commands: tuple[tuple[str, ...], ...]
    origins: tuple[Command | None, ...]
    fatal: bool = True
    stdin: str | None = None
    """What a ``-restore`` step's one command reads."""
    settle: bool = False
    """A step of a u32 swap (``tcdsl.ops.u32swap``): a command the kernel says is in use (a
    table whose last link went, not yet let go of) is tried again a moment later."""
    force: bool = False
    """Every command is tried, whichever fail (``tc -force -batch``): undoing a change that
    stopped half-way, where the objects it had not got to yet are not there to undo."""


DRIFT_SHOWN = 5
"""The drift lines of one tree a plan's text shows (its JSON has all)."""


@dataclass(slots=True)
class Plan:
    """The changes and the steps that make them."""

    changes: list[Change] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    drift: list[Change] = field(default_factory=list)
    """What differs between the kernel and the policy live now (changed by hand)."""
    notes: list[Change] = field(default_factory=list)
    """What changed in the kernel that the policy does not say (no drift: apply keeps it)."""
    replaced: list[str] = field(default_factory=list)
    """Root qdiscs no state records that a new tree replaces (``tbf qdisc 9: on eth0``)."""

    @property
    def empty(self) -> bool:
        """Nothing to change."""
        return not self.changes

    @property
    def builds_again(self) -> bool:
        """Whether it builds a tree, or a qdisc's subtree, again (their counters start over)."""
        return any(c.sign == "!" and c.text.endswith(_BUILT_AGAIN) for c in self.changes)

    def render(self, summary_only: bool = False) -> str:
        """The plan as text: drift first, then the changes (unless ``summary_only``) and their
        count, or that there are none."""
        lines = self._drift_lines() + [c.render() for c in self.notes]
        if not self.changes:
            lines.append("no changes")
        elif not summary_only:
            several = len({c.tree for c in self.changes if c.tree is not None}) > 1
            lines += [c.render(several) for c in self.changes]
        if self.changes:
            lines.append(self.summary())
        return "\n".join(lines) + "\n"

    def _drift_lines(self) -> list[str]:
        """The first :data:`DRIFT_SHOWN` drift lines of each tree, then how many more."""
        lines: list[str] = []
        hidden: dict[str, int] = {}
        shown: Counter[str] = Counter()
        for c in self.drift:
            tree = c.text.partition(": ")[0]
            shown[tree] += 1
            if shown[tree] <= DRIFT_SHOWN:
                lines.append(c.render())
            else:
                hidden[tree] = hidden.get(tree, 0) + 1
        for tree, more in hidden.items():
            lines.append(f"! {tree}: {more} more (plan --format json lists them all)")
        return lines

    def counts(self) -> dict[str, dict[str, int]]:
        """The changes by what they do (``add``, ``change``, ``remove``, ``replace``) and
        by what they change (``class``, ``filter``, ... ``other``), in that order."""
        out: dict[str, dict[str, int]] = {}
        for sign, verb in _SIGNS:
            kinds: Counter[str] = Counter()
            groups: set[str] = set()
            for c in self.changes:
                if c.sign != sign:
                    continue
                kind = _kind(c.text)
                if kind == "filters":
                    # a group once, whatever lines say how it changes (found by a tester:
                    # its lines tried in another order and its tables made again were two)
                    found = _GROUP.match(c.text)
                    group = found.group() if found is not None else c.text
                    if group in groups:
                        continue
                    groups.add(group)
                kinds[kind] += 1
            out[verb.removeprefix("to ")] = dict(sorted(kinds.items(), key=_other_last))
        return out

    def summary(self) -> str:
        """``plan: 2 to add (1 class, 1 filter), 300 to remove (100 classes, 200 filters)``:
        the changes counted by sign, and by what they change (a table of thousands of rows
        makes a plan of thousands of lines)."""
        parts = []
        for kinds, (_, words) in zip(self.counts().values(), _SIGNS, strict=True):
            if kinds:
                named = ", ".join(
                    f"{n} {_KINDS[k][n != 1]}" for k, n in kinds.items() if k in _KINDS
                )
                parts.append(f"{sum(kinds.values())} {words}" + (f" ({named})" if named else ""))
        return f"plan: {', '.join(parts)}"

    def to_json(self) -> dict[str, object]:
        """The plan for a program: its drift, notes and changes (each with its sign, what it
        changes, its text and the policy line) and their counts."""

        def change(c: Change) -> dict[str, object]:
            return {
                "sign": c.sign,
                "kind": _kind(c.text),
                "text": c.text,
                "tree": c.tree,
                "file": c.span.file if c.span is not None else None,
                "line": c.span.line if c.span is not None else None,
            }

        return {
            "format": 1,
            "empty": self.empty,
            "drift": [change(c) for c in self.drift],
            "notes": [change(c) for c in self.notes],
            "changes": [change(c) for c in self.changes],
            "counts": self.counts(),
        }


_SIGNS: tuple[tuple[Sign, str], ...] = (
    ("+", "to add"), ("~", "to change"), ("-", "to remove"), ("!", "to replace"),
)  # fmt: skip
_KINDS = {
    "class": ("class", "classes"),
    "filter": ("filter", "filters"),
    "filters": ("filter group", "filter groups"),
    "qdisc": ("qdisc", "qdiscs"),
    "tree": ("tree", "trees"),
    "police": ("police action", "police actions"),
    "marking": ("marking", "markings"),
    "hash table": ("hash table", "hash tables"),
    "hash link": ("hash link", "hash links"),
}
"""What a change's text starts with, and its plural."""


_GROUP = re.compile(r"filters of \S+ \S+ protocol \S+ pref \d+")
"""The name of a filter group in a change's text (:func:`_what`)."""


def _kind(text: str) -> str:
    """What a change's text says it changes: a key of ``_KINDS``, else ``other``."""
    words = text.split(" ", 2)
    kind = " ".join(words[:2]) if words[0] == "hash" else words[0]
    return kind if kind in _KINDS else "other"


def _other_last(item: tuple[str, int]) -> tuple[bool, str]:
    return item[0] == "other", item[0]


def _option_diff(old: Sequence[str], new: Sequence[str]) -> str:
    """``rate 6mbit -> 8mbit, +prio 1``: what differs between two commands' words."""
    parts = []
    matcher = difflib.SequenceMatcher(a=list(old), b=list(new), autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        key = old[i1 - 1] + " " if i1 > 0 and op == "replace" else ""
        was, now = " ".join(old[i1:i2]), " ".join(new[j1:j2])
        if op == "replace":
            parts.append(f"{key}{was} -> {now}")
        elif op == "insert":
            parts.append(f"+{now}")
        else:
            parts.append(f"-{was}")
    return ", ".join(parts)


def _what(o: Obj, names: Mapping[str, str] | None = None) -> str:
    """The plan's name for an object (``names``: its tree's class names)."""
    match o.kind:
        case "qdisc":
            owner = names.get(o.parent or "") if names is not None else None
            if owner is not None:
                return f"qdisc {o.qdisc_kind} of class {owner}"
            return f"qdisc {o.dev} {o.parent}: {o.qdisc_kind} ({o.what})"
        case "class":
            return o.what if o.what.startswith("class ") else f"class {o.handle} ({o.what})"
        case "filters":
            _, dev, parent, protocol, pref = o.key
            return f"filters of {dev} {parent} protocol {protocol} pref {pref}"
        case "action":
            return f"police action {o.key[2]}"
        case "marking":
            return f"marking of {o.tree}"
        case _:
            return f"device {o.dev}"


def _step(tool: Tool, commands: Iterable[Command], fatal: bool = True) -> Step:
    """The commands of ``tool`` among ``commands``, as one step."""
    mine = [c for c in commands if c.tool == tool]
    return Step(tool, tuple(c.args for c in mine), tuple(mine), fatal)


def _cleanup(tool: Tool, commands: Sequence[tuple[str, ...]]) -> Step:
    """Commands no policy line asks for (a teardown): every one is tried, and a failure is
    harmless but for a qdisc still there after its delete (``tcdsl.ops.apply.run_step``)."""
    return Step(tool, tuple(commands), tuple(None for _ in commands), fatal=False)


def _tc(commands: Iterable[Command]) -> Step:
    return _step("tc", commands)


def _subtree(objects: dict[Key, Obj], top: Obj) -> list[Obj]:
    """A replaced qdisc and everything below it (classes, qdiscs and filters of its major)."""
    majors = {top.handle}
    out = [top]
    for o in objects.values():
        if o is top:
            continue
        if o.kind == "class" and _major(o.handle) in majors:
            out.append(o)
        elif o.kind in ("qdisc", "filters") and _major(o.parent) in majors:
            out.append(o)
            if o.kind == "qdisc":
                majors.add(o.handle)
    return out


def _changed_filters(old: Obj, new: Obj, taken: set[int]) -> list[Command]:
    """A filter group changed in place: built at a free pref beside its own (tried where it
    stands), the old group deleted, built again at its own pref, the copy deleted. Without a
    free pref beside it: deleted and built again."""
    free = _free_beside(int(new.key[4]), taken)
    out: list[Command] = []
    if free is not None:
        out += [at_pref(c, free) for c in new.commands]
    out.append(pref_deletion(old))
    out += new.commands
    if free is not None:
        out.append(pref_deletion(new, str(free)))
    return out


def _free_beside(pref: int, taken: set[int]) -> int | None:
    """A pref next to ``pref`` that is not ``taken`` (nothing lies between them), or None."""
    return next((p for p in (pref - 1, pref + 1) if 0 < p < 0x10000 and p not in taken), None)


def _tree_rebuild(iface: ir.Interface, why: str, plan: Plan) -> None:
    """Tear ``iface``'s tree down and build it again, as the script would."""
    plan.changes.append(Change("!", f"tree {iface.label}: {why} (rebuild)", iface.root.span))
    commands = list(interface_commands(iface))
    if any(c.tool == "ip" for c in commands):
        plan.steps.append(_step("ip", commands, fatal=False))  # an IFB that exists is fine
    if iface.marking is not None:
        _cleanups(plan, chain_teardown(iface))
    what = f"teardown of {iface.label}"
    teardown = [Command("tc", c, iface.root.span, what) for c in batch_teardown(iface)]
    plan.steps.append(_tc([*teardown, *commands]))
    for tool in MARK_TOOL.values():
        if any(c.tool == tool for c in commands):
            plan.steps.append(_step(tool, commands))


def _cleanups(plan: Plan, commands: Sequence[tuple[str, ...]]) -> None:
    """Cleanup steps for commands given as words, the tool first, one step per tool."""
    for tool in ("tc", "ip", "iptables", "ip6tables"):
        mine = [c[1:] for c in commands if c[0] == tool]
        if mine:
            plan.steps.append(_cleanup(tool, mine))


def remove_tree(tree: Tree, plan: Plan) -> None:
    """Add the removal of a tree (its teardown and marking chains) to ``plan``."""
    plan.changes.append(Change("-", f"tree {tree.label}", tree.span))
    _cleanups(plan, tree.removal)


def _jumps(o: Obj) -> list[tuple[str, ...]]:
    """The jumps into a marking chain (and which tables have the chain)."""
    return [(c.tool, *c.args) for c in o.commands if "-I" in c.args or "-N" in c.args]


def _marking_in_place(iface: ir.Interface, old: Obj, plan: Plan) -> None:
    """The rules of a marking chain changed, its jumps did not: each table's chain replaced
    in one ``iptables-restore --noflush`` (one commit: no packet sees it half-written)."""
    a = [" ".join(c.args) for c in old.commands if "-A" in c.args]
    b = [" ".join(c.args) for c in marking_commands(iface) if "-A" in c.args]
    assert iface.marking is not None
    span = iface.marking.span
    plan.changes.append(Change("~", f"marking of {iface.label}: {len(a)} -> {len(b)} rules", span))
    for family in mark_families(iface):
        # the jumps stay as they are (unchanged, and a restore file cannot delete them first)
        lines = [
            line for c, line in restore_lines(iface, family) if c is None or "-I" not in c.args
        ]
        text = "*mangle\n" + "".join(f"{line}\n" for line in lines) + "COMMIT\n"
        tool: Literal["iptables-restore", "ip6tables-restore"] = (
            "iptables-restore" if MARK_TOOL[family] == "iptables" else "ip6tables-restore"
        )
        origin = Command(MARK_TOOL[family], ("--noflush",), span, f"marking of {iface.label}")
        plan.steps.append(Step(tool, (origin.args,), (origin,), True, text))


def _why_rebuild(old: dict[Key, Obj], new: dict[Key, Obj]) -> str | None:
    """Why a tree cannot change in place, or None."""
    for key, n in new.items():
        o = old.get(key)
        if o is None or o.words == n.words:
            continue
        if n.kind == "link" or (n.kind == "marking" and _jumps(o) != _jumps(n)):
            return f"{_what(n)} changed"
        if n.kind == "qdisc" and n.parent in ("root", "ingress"):
            if o.handle != n.handle or o.qdisc_kind != n.qdisc_kind:
                return f"root qdisc {o.qdisc_kind} {o.handle} -> {n.qdisc_kind} {n.handle}"
            if n.qdisc_kind not in CHANGE_IN_PLACE:
                diff = _option_diff(o.commands[0].args, n.commands[0].args)
                return f"{n.qdisc_kind} root cannot change in place ({diff})"
        if n.kind == "class" and (o.parent != n.parent or o.qdisc_kind != n.qdisc_kind):
            return f"{_what(n)} moves from {o.parent} to {n.parent}"
    for key, o in old.items():
        if key not in new and o.kind in ("marking", "link"):
            return f"{_what(o)} removed"
    return None


def has_u32_tables(o: Obj) -> bool:
    """Whether a filter group makes u32 tables (``tcdsl.u32layout``). Such a group is changed
    node by node where its tables stay (``tcdsl.ops.u32nodes``), else swapped for the new one
    in steps (``tcdsl.ops.u32swap``): u32 keeps a deleted pref's tables, under ids that are
    the qdisc's, while the qdisc has other u32 filters."""
    return o.kind == "filters" and any("divisor" in c.args for c in o.commands)


def _table_ids(objects: Iterable[Obj]) -> dict[tuple[str, str], set[int]]:
    """The u32 table ids of each (device, parent) among ``objects``."""
    out: dict[tuple[str, str], set[int]] = {}
    for o in objects:
        if o.kind == "filters":
            out.setdefault((o.dev, o.key[2]), set()).update(table_ids(o))
    return out


def _swap(o: Obj, n: Obj, taken: set[int], used: set[int], swaps: Swaps) -> int | None:
    """Swap the group ``o`` for ``n`` by way of a copy at a free pref next to it, under table
    ids no one uses (``taken`` prefs, ``used`` ids: updated): that pref, or None when there is
    no such pref or not enough ids (the caller deletes and builds it in place)."""
    free = _free_beside(int(n.key[4]), taken)
    wanted = len(table_ids(n))
    ids = [i for i in range(1, TABLE_IDS + 1) if i not in used][:wanted]
    if free is None or len(ids) < wanted or not is_u32(n):
        return None
    taken.add(free)
    used.update(ids)
    swaps.swap(o, n, free, ids)
    return free


def _through(o: Obj, there: Iterable[Obj], swaps: Swaps) -> Key | None:
    """A u32 pref of ``o``'s qdisc that is there while the tables of ``o`` (whose pref is
    deleted) are deleted (step 2 of a swap), or None when there is none (the qdisc's table
    pool then goes with its last u32 pref): a copy, or one of the groups ``there``."""
    qdisc = o.key[1:3]
    for key in swaps.copies:
        if key[1:3] == qdisc:
            return key
    return next((g.key for g in there if g.key[1:3] == qdisc and is_u32(g)), None)


def _in_place(
    old: dict[Key, Obj],
    new: dict[Key, Obj],
    plan: Plan,
    names: Names,
    swaps: Swaps,
    reset: Collection[Key] = (),
) -> tuple[list[Command], list[Command]]:
    """The commands that change one tree in place: (build and change, delete); the swaps of
    groups in u32 tables go to ``swaps``; the objects keyed in ``reset`` are set again."""
    build: list[Command] = []
    replaced: set[Key] = set()
    queues = {o.handle for o in [*old.values(), *new.values()] if _is_mq(o)}
    moves = _class_moves(old, new)
    leaves = {x.parent for x in new.values() if x.kind == "qdisc"} if moves else set()
    moved_from = {o.handle for o, _ in moves.values()}
    moved_to = {n.handle for _, n in moves.values()}
    parents_now = {n.parent for n in new.values() if n.kind == "class"}
    late = _new_leaves(old, new, parents_now, plan, names, replaced)
    for key, n in new.items():
        if key in replaced or n.kind in ("filters", "action", "marking", "link"):
            continue
        o = old.get(key)
        if o is None:
            if n.kind == "class" and n.what in moves:
                leaf = n.handle in leaves
                plan.changes.append(Change("~", _move_text(*moves[n.what], names, leaf), n.span))
            elif not (n.kind == "qdisc" and n.parent in moved_to):  # a moved class's leaf
                plan.changes.append(Change("+", _what(n, names[1]), n.span))
            if n.kind == "qdisc" and _major(n.parent) in queues:
                # the queue holds the default qdisc, maybe one an apply put back (a handle
                # of its own, which 'add' would not replace)
                build += _replacing(n.commands)
            else:
                build += n.commands
        elif o.words == n.words and key in reset:
            # (found by a tester: one subscriber's ceil changed by hand built the whole tree
            # again, every counter reset; its values are set in place as a change's are)
            what = f"{_what(n, names[1])}: set again as the policy says (changed in the kernel)"
            plan.changes.append(Change("~", what, n.span))
            build.append(_changed(n.commands[0]))
        elif o.words != n.words:
            if n.kind == "qdisc" and (
                o.handle != n.handle
                or o.qdisc_kind != n.qdisc_kind
                or n.qdisc_kind not in CHANGE_IN_PLACE
            ):
                below_new = _subtree(new, n)
                below_old = _subtree(old, o)
                if o.handle == n.handle and o.qdisc_kind == n.qdisc_kind:
                    diff = _option_diff(o.commands[0].args, n.commands[0].args)
                    how = f"{diff}, which {n.qdisc_kind} cannot change in place"
                else:
                    how = f"{o.qdisc_kind} {o.handle} -> {n.qdisc_kind} {n.handle}"
                plan.changes.append(
                    Change("!", f"{_what(n, names[1])}: {how} (its subtree is built again)", n.span)
                )
                # a class that comes into the rebuilt subtree from elsewhere (a queue of an
                # mq tree repacked): made again, as a move is
                for s in below_new[1:]:
                    if s.kind == "class" and s.key not in old and s.what in moves:
                        leaf = s.handle in leaves
                        plan.changes.append(
                            Change("~", _move_text(*moves[s.what], names, leaf), s.span)
                        )
                if _major(n.parent) in queues:  # no moment of mq's noop qdisc (drop all)
                    if o.handle == n.handle:  # replacing a qdisc by its own handle changes it
                        build.append(_default_qdisc(n))
                    build += _replacing(n.commands)
                else:
                    build.append(
                        Command(
                            "tc",
                            ("qdisc", "del", "dev", n.dev, "parent", n.parent or ""),
                            n.span,
                            n.what,
                        )
                    )
                    build += n.commands
                for s in below_new[1:]:  # (the first is n)
                    build += s.commands
                replaced |= {s.key for s in below_new} | {s.key for s in below_old}
                continue
            diff = _option_diff(o.commands[0].args, n.commands[0].args)
            plan.changes.append(Change("~", f"{_what(n, names[1])}: {diff}", n.span))
            build.append(_changed(n.commands[0]))
    filters: list[Command] = []
    # prefs are a qdisc's own: each filter's pref is free or taken among its qdisc's filters
    taken: dict[tuple[str, str], set[int]] = {}
    for k in [*old, *new]:
        if k[0] == "filters":
            taken.setdefault((k[1], k[2]), set()).add(int(k[4]))
    live_ids = _table_ids(old.values())
    used = _table_ids([*old.values(), *new.values()])
    unmade: list[Obj] = []
    """Old groups in tables deleted whole in step 2 without a copy (removed, or no copy)."""
    for key, n in new.items():
        if key in replaced or n.kind != "filters":
            continue
        o = old.get(key)
        if o is None:
            plan.changes += _filter_changes((), n.commands, names, _what(n, names[1]))
            if table_ids(n) & live_ids.get((n.dev, key[2]), set()):
                swaps.add_late(n)
            else:
                filters += n.commands
        elif o.words != n.words:
            hashed = has_u32_tables(o) or has_u32_tables(n)
            in_tables = node_changes(o, n) if has_u32_tables(o) else None
            if in_tables == []:
                # the same nodes in the same tables and buckets, listed in another order
                # (two rows swapped whose lines are in different buckets, where no packet
                # meets both): nothing changes (found by a tester: 'tried in another order')
                continue
            label = _what(n, names[1])
            plan.changes += _filter_changes(o.commands, n.commands, names, label, hashed)
            if in_tables is not None:
                filters += in_tables
            elif hashed:
                qdisc = (n.dev, key[2])
                copy = _swap(o, n, taken[qdisc], used.setdefault(qdisc, set()), swaps)
                if copy is not None:
                    why = f"its hash tables are made again, a copy at pref {copy} meanwhile"
                    plan.changes.append(Change("~", f"{_what(n, names[1])}: {why}", n.span))
                else:
                    # no pref free next to it: deleted and built again (for that moment its
                    # packets meet the prefs after it), its tables deleted with it
                    why = (
                        "deleted and built again with its hash tables (no pref free beside "
                        "it for a copy: for that moment its packets meet the prefs after it)"
                    )
                    plan.changes.append(Change("!", f"{_what(n, names[1])}: {why}", n.span))
                    unmade.append(o)
                    swaps.add_late(n)
            else:
                if _free_beside(int(n.key[4]), taken[n.dev, key[2]]) is None:
                    # (found by a tester: the docs promised a copy first)
                    why = (
                        "deleted and built again (no pref free beside it for a copy: for "
                        "that moment its packets meet the prefs after it)"
                    )
                    plan.changes.append(Change("!", f"{_what(n, names[1])}: {why}", n.span))
                filters += _changed_filters(o, n, taken[n.dev, key[2]])
    delete: list[Command] = []
    # A leaf class that gets children: htb destroys its leaf qdisc as the first child is
    # added, so that qdisc goes first (its class holds the default fifo a moment), with what
    # is below a classful one (found by a tester: its classes' deletions then failed).
    gone_keys = [key for key in old if key not in new and key not in replaced]
    removed_classes = {old[k].handle for k in gone_keys if old[k].kind == "class"}
    below = {
        k: [s.key for s in _subtree(old, old[k])[1:]]
        for k in gone_keys
        if old[k].kind == "qdisc"
        and old[k].parent in parents_now
        and old[k].parent not in removed_classes
    }
    # (what the new tree keeps of its subtree would go with it: found by a review)
    early_qdiscs = [old[k] for k, keys in below.items() if not any(s in new for s in keys)]
    swallowed = {s for q in early_qdiscs for s in below[q.key]}
    for key, o in old.items():
        if key in new or key in replaced or o.kind != "filters":
            continue
        plan.changes += _filter_changes(o.commands, (), names, _what(o, names[0]))
        if key in swallowed:
            continue  # deleted with its qdisc, first
        if has_u32_tables(o):
            unmade.append(o)
            continue
        delete.append(pref_deletion(o))
    # the groups there in step 2: each old one not deleted in it (removed ones without tables
    # go later), each new one built before it
    absent = {o.key for o in unmade} | set(swaps.swapped) | set(swaps.late)
    there = [
        g for g in [*old.values(), *new.values()] if g.kind == "filters" and g.key not in absent
    ]
    for o in unmade:
        swaps.remove(o, _through(o, there, swaps))
    gone = [old[k] for k in gone_keys]
    first: list[Command] = []
    early: set[str | None] = set()
    for o in early_qdiscs:
        plan.changes.append(Change("-", _what(o, names[0]), o.span))
        del_args = ("qdisc", "del", "dev", o.dev, "parent", o.parent or "")
        first.append(Command("tc", del_args, o.span, o.what))
        early.add(o.parent)
    for o in reversed(gone):  # children before parents
        if o.key in swallowed:
            if o.kind != "filters":
                plan.changes.append(Change("-", _what(o, names[0]), o.span))
            continue
        if o.kind == "qdisc" and _major(o.parent) in queues:
            # A TX queue whose qdisc is deleted drops every packet (mq puts noop there):
            # it gets the kernel's default back, as the queues the policy does not name have.
            plan.changes.append(Change("-", _what(o, names[0]), o.span))
            delete.append(_default_qdisc(o))
        elif o.kind == "class":
            if o.handle not in moved_from:
                plan.changes.append(Change("-", _what(o, names[0]), o.span))
            delete.append(
                Command(
                    "tc", ("class", "del", "dev", o.dev, "classid", o.handle or ""), o.span, o.what
                )
            )
        elif in_ingress_slot(o):
            # an mq tree's clsact that its lines no longer need (found by a review: deleted
            # by 'parent ingress', which tc refuses): last, after the filters on it
            plan.changes.append(Change("-", _what(o, names[0]), o.span))
            kind = o.qdisc_kind or "ingress"
            delete.append(Command("tc", ("qdisc", "del", "dev", o.dev, kind), o.span, o.what))
        elif o.kind == "qdisc" and o.parent not in removed_classes and o.parent not in early:
            plan.changes.append(Change("-", _what(o, names[0]), o.span))
            delete.append(
                Command(
                    "tc", ("qdisc", "del", "dev", o.dev, "parent", o.parent or ""), o.span, o.what
                )
            )
    return first + build + filters, delete + late


def _new_leaves(
    old: dict[Key, Obj],
    new: dict[Key, Obj],
    parents_now: set[str | None],
    plan: Plan,
    names: Names,
    replaced: set[Key],
) -> list[Command]:
    """The commands of the leaf qdiscs (and what is below them) of classes whose children
    all go: the kernel takes no qdisc on a class that has children (EINVAL; found by a
    tester: such an apply, its rollback and its confirm timer failed every time), so they come
    after the deletions, when the class holds the default fifo htb gives a class that loses
    its last child (``parents_now``: the parents of the new tree's classes). Their keys go to
    ``replaced`` (the other steps skip them)."""
    to_leaf = {o.parent for o in old.values() if o.kind == "class"} - parents_now
    late: list[Command] = []
    for n in new.values():
        if n.kind != "qdisc" or n.key in old or n.parent not in to_leaf:
            continue
        below = _subtree(new, n)
        if any(s.key in old for s in below):
            continue
        for s in below:
            if s.kind == "filters":
                plan.changes += _filter_changes((), s.commands, names, _what(s, names[1]))
            else:
                plan.changes.append(Change("+", _what(s, names[1]), s.span))
            late += s.commands
            replaced.add(s.key)
    return late


def _filter_text(c: Command, names: Mapping[str, str]) -> str:
    """``filter web (match ip dst 10.0.0.7)``: the class it sends to, by name, and its keys
    as tc takes them; a u32 hash table's own nodes as ``hash table (divisor 256)`` and ``hash
    link (hashkey mask 0x000000ff at 16)``. Table ids and buckets are left out: they follow
    from the keys, and a swap numbers the tables again (a line there before and after is no
    change to read)."""
    args = _sans_ids(c.args)
    if "divisor" in args:
        return f"hash table (divisor {word_after(args, 'divisor')})"
    flow = word_after(args, "flowid") or word_after(args, "classid") or ""
    start = next((i + 1 for i, w in enumerate(args) if w in ("u32", "flower", "fw")), len(args))
    ends = ("flowid", "classid", "police", "action")
    end = next((i for i in range(start, len(args)) if args[i] in ends), len(args))
    keys = args[start:end]
    if "link" in keys:
        keys = keys[: len(keys) - len(LINK_KEY)] if keys[-len(LINK_KEY) :] == LINK_KEY else keys
        said = " ".join(w for w in keys if w != "link")
        # a link with no hash key: into a sub-list (a bucket longer than u32 keeps in order)
        return f"hash link ({said or 'to the next sub-list of a long bucket'})"
    queue = word_after(args, "queue_mapping")
    if not flow and queue is not None and queue.isdigit():  # an mq tree's steering filter
        return f"filter to queue {int(queue) + 1}" + (f" ({' '.join(keys)})" if keys else "")
    return f"filter {names.get(flow, flow)}" + (f" ({' '.join(keys)})" if keys else "")


def _sans_ids(args: tuple[str, ...]) -> tuple[str, ...]:
    """A u32 filter's words without its node's and its tables' ids (``handle``, ``ht``, the
    table after ``link``); another filter's as they are (a fw ``handle`` is its mark)."""
    if "u32" not in args:
        return args
    out: list[str] = []
    skip = False
    for w in args:
        if skip:  # the id after one of them
            skip = False
            continue
        skip = w in ("handle", "ht", "link")
        if not skip or w == "link":  # 'link' itself stays: the node is a link
            out.append(w)
    return tuple(out)


def _filter_changes(
    old: Sequence[Command],
    new: Sequence[Command],
    names: Names,
    label: str = "",
    hashed: bool = False,
) -> list[Change]:
    """The filters a group (``label``) gains, loses or changes, one line each; the lines
    only tried in another order (rows of a table reordered) as one line saying how many.
    ``hashed``: the group is in u32 tables, whose commands go by table and bucket, not in
    the order the lines are tried; where each side's lines come from one file (a table's
    rows), they are compared in its order (found by a tester: a /24 that split a hashed run,
    making the lines before it plain nodes, was said to try a line in another order). Lines
    of several files keep the commands' order: a file's name says nothing of where its
    statement is (found by a review)."""
    a_cmds, b_cmds = old, new
    if hashed and len({c.span.file for c in old}) <= 1 and len({c.span.file for c in new}) <= 1:
        a_cmds, b_cmds = sorted(old, key=_place), sorted(new, key=_place)
    a = [_filter_text(c, names[0]) for c in a_cmds]
    b = [_filter_text(c, names[1]) for c in b_cmds]
    out: list[Change] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        out += [Change("-", a[i], a_cmds[i].span) for i in range(i1, i2)]
        out += [Change("+", b[j], b_cmds[j].span) for j in range(j1, j2)]
    out, moved = _moves(out)
    tables_moved = False
    if hashed:
        # a table or link as it was, made for a run that starts elsewhere: no line of the
        # policy moves with it (plan says the group's tables are made again)
        lines = [c for c in moved if not c.text.startswith("hash ")]
        tables_moved, moved = len(lines) < len(moved), lines
    if moved:
        text = f"{label}: " if label else ""
        out.append(Change("~", f"{text}{len(moved)} line(s) tried in another order", moved[0].span))
    if not out and not tables_moved:
        # the lines pair up in the order compared (found by a tester: paired by their place
        # in the commands, which a circuit moved to another site shifted, every later line
        # of the group was said to change its action)
        was, now = [_sans_ids(c.args) for c in a_cmds], [_sans_ids(c.args) for c in b_cmds]
        out += [Change("~", f"{_filter_text(b_cmds[j], names[1])}: its action", b_cmds[j].span)
                for j in range(len(b_cmds)) if j >= len(was) or was[j] != now[j]]  # fmt: skip
    return out


def _place(command: Command) -> tuple[str, int, int]:
    """Where a command's policy text is, to order commands as the policy does."""
    span = command.span
    return span.file, span.line, span.column


def _moves(changes: list[Change]) -> tuple[list[Change], list[Change]]:
    """``changes`` without the lines both removed and added as they are (moved), and those
    lines (as added)."""
    both = Counter(c.text for c in changes if c.sign == "-") & Counter(
        c.text for c in changes if c.sign == "+"
    )
    if not both:
        return changes, []
    pools = {"-": Counter(both), "+": Counter(both)}
    out: list[Change] = []
    moved: list[Change] = []
    for c in changes:
        pool = pools.get(c.sign)
        if pool is not None and pool[c.text] > 0:
            pool[c.text] -= 1
            if c.sign == "+":
                moved.append(c)
            continue
        out.append(c)
    return out, moved


def _class_moves(old: Mapping[Key, Obj], new: Mapping[Key, Obj]) -> dict[str, tuple[Obj, Obj]]:
    """Classes of one name that go under one id and come under another, by name: a
    subscriber moved to another parent node (htb cannot move a class: it is made again)."""
    gone = {o.what: o for k, o in old.items() if o.kind == "class" and k not in new}
    return {
        n.what: (gone[n.what], n)
        for k, n in new.items()
        if n.kind == "class" and k not in old and n.what in gone and n.what.startswith("class ")
    }


def _parent_name(names: Mapping[str, str], parent: str) -> str:
    """A class's parent as a plan line names it: its class's name; a qdisc (``1:``) or the
    interface's link class, which has none, by id."""
    if parent in names:
        return names[parent]
    return f"qdisc {parent}" if parent.endswith(":") else f"the link class {parent}"


def _move_text(o: Obj, n: Obj, names: Names, leaf: bool) -> str:
    """``class c102 moves from north to south: ...``, for a class made again elsewhere
    (``leaf``: with the leaf qdisc it has)."""
    was, now = (_parent_name(m, p or "") for m, p in zip(names, (o.parent, n.parent), strict=True))
    # the same parent's name under a new id: the parent moved, and this class with it
    where = f"from {was} to {now}" if was != now else f"with {now}"
    return (
        f"{n.what} moves {where}: made again as {n.handle} (was {o.handle})"
        f"{', with its leaf,' if leaf else ''} before the old one goes; its counters start "
        "from 0"
    )


def _actions(
    old: dict[Key, Obj], new: dict[Key, Obj], plan: Plan
) -> tuple[list[Command], list[tuple[str, ...]]]:
    made: list[Command] = []
    for key, n in new.items():
        o = old.get(key)
        if o is not None and o.words == n.words:
            continue
        if o is None:
            plan.changes.append(Change("+", _what(n), n.span))
        else:
            plan.changes.append(
                Change(
                    "~",
                    f"{_what(n)}: {_option_diff(o.commands[0].args, n.commands[0].args)}",
                    n.span,
                )
            )
        made += n.commands
    gone: list[tuple[str, ...]] = [
        ("actions", "delete", "action", "police", "index", key[2]) for key in old if key not in new
    ]
    for key in old:
        if key not in new:
            plan.changes.append(Change("-", _what(old[key]), old[key].span))
    return made, gone


def make_plan(
    old: Sequence[Tree],
    new: Sequence[Tree],
    rebuild: Iterable[str] = (),
    ifaces: Callable[[str], ir.Interface] | None = None,
    reset: Collection[Key] = (),
) -> Plan:
    """The plan that takes the kernel from the trees ``old`` (live: read from the state, or
    compiled) to the trees ``new``; trees labelled in ``rebuild`` (drift) are built again
    whatever changed; the classes and qdiscs keyed in ``reset`` (values changed by hand) are
    set again as ``new`` says, in place, where ``new`` keeps them. A new tree from a state
    record has no IR: ``ifaces`` gives it by label where the plan builds the tree anew
    (compiling its policy only then)."""
    plan = Plan()
    forced = set(rebuild)
    olds = {t.label: t for t in old}
    old_actions: dict[Key, Obj] = {}
    new_actions: dict[Key, Obj] = {}
    build: list[Command] = []
    delete: list[Command] = []
    marks: list[tuple[ir.Interface, Obj]] = []
    swaps = Swaps()
    kept = {t.label for t in new}
    # A removed tree in a device's ingress slot goes first where a new tree takes that slot:
    # its clsact or ingress qdisc would exclude the other kind (an mq tree's steering, a
    # download's redirect), so the new tree could not be built beside it.
    slots = {o.key for t in new for o in t.objects if in_ingress_slot(o)}
    first = [
        t
        for t in old
        if t.label not in kept and any(in_ingress_slot(o) and o.key in slots for o in t.objects)
    ]
    for tree in first:
        remove_tree(tree, plan)
    early = len(plan.steps)
    stale: list[tuple[str, ...]] = []
    in_place: list[Obj] = []
    """The live filter groups of the trees changed in place."""
    for tree in new:
        label = tree.label
        iface = tree.iface
        before = olds.get(label)
        new_objs = by_key(tree.objects)
        if before is None:
            iface = iface or _compiled(tree, ifaces)
            plan.changes.append(Change("+", f"tree {label}", iface.root.span))
            _tree_rebuild_quiet(iface, plan)
            continue
        old_objs = by_key(before.objects)
        why = "drift" if label in forced else _why_rebuild(old_objs, new_objs)
        why = why or _slot_wanted(old_objs, new_objs, slots)
        if why is not None:
            stale += _slot_left(old_objs, new_objs)
            _tree_rebuild(iface or _compiled(tree, ifaces), why, plan)
            continue
        old_actions |= {k: o for k, o in old_objs.items() if o.kind == "action"}
        new_actions |= {k: o for k, o in new_objs.items() if o.kind == "action"}
        in_place += [o for o in old_objs.values() if o.kind == "filters"]
        said = len(plan.changes)
        tree_build, tree_delete = _in_place(
            {k: o for k, o in old_objs.items() if o.kind != "action"},
            {k: o for k, o in new_objs.items() if o.kind != "action"},
            plan,
            (before.names, tree.names),
            swaps,
            reset,
        )
        plan.changes[said:] = [replace(c, tree=label) for c in plan.changes[said:]]
        build += tree_build
        delete += tree_delete
        marking = next((o for o in new_objs.values() if o.kind == "marking"), None)
        before_marks = next((o for o in old_objs.values() if o.kind == "marking"), None)
        if marking is not None and before_marks is not None and marking.words != before_marks.words:
            marks.append((iface or _compiled(tree, ifaces), before_marks))
    if stale:  # before any tree is built: another may need the slot
        plan.steps.insert(early, _cleanup("tc", stale))
    made, gone = _actions(old_actions, new_actions, plan)
    leftovers = _leftovers(in_place, [*build, *swaps.copy, *swaps.steps()[0]])
    if leftovers:  # every one tried, and let fail: 'not found' is the usual answer
        # settling: a table that one deleted before it linked to is let go of a moment later
        plan.steps.append(replace(_cleanup("tc", leftovers), force=True, settle=True))
    if made or build or swaps.copy:
        plan.steps.append(_tc([*made, *build, *swaps.copy]))
    for commands in swaps.steps():
        if commands:
            plan.steps.append(replace(_tc(commands), settle=True))
    for marked, was in marks:
        _marking_in_place(marked, was, plan)
    if delete:
        plan.steps.append(_tc(delete))
    if gone:
        plan.steps.append(_cleanup("tc", gone))
    for tree in old:
        if tree.label not in kept and tree not in first:
            remove_tree(tree, plan)
    return plan


def _changed(made: Command) -> Command:
    """The ``tc class|qdisc change`` of what ``made`` adds."""
    return Command("tc", (made.args[0], "change", *made.args[2:]), made.span, made.what)


def _leftovers(old: Sequence[Obj], made: Iterable[Command]) -> list[tuple[str, ...]]:
    """The deletion of each u32 table ``made`` makes under an id no live group holds,
    through a live u32 group of its qdisc. A swap cut short (a kill, a power cut; found by
    a tester in an undo) can leave tables of no pref in the qdisc's pool, where no listing
    shows them, and 'exists' on one's id would stop every apply of the change; by the live
    policy and the drift check, whatever holds such an id is no one's."""
    through: dict[tuple[str, str], Obj] = {}
    for o in old:
        if is_u32(o):
            through.setdefault((o.dev, o.key[2]), o)
    live = _table_ids(old)
    out: dict[tuple[str, ...], None] = {}
    for c in made:
        if "divisor" not in c.args or c.args[:2] != ("filter", "add"):
            continue
        qdisc = (word_after(c.args, "dev") or "", word_after(c.args, "parent") or "")
        table = table_of(c.args)
        group = through.get(qdisc)
        if group is not None and table not in live.get(qdisc, set()):
            out[(*pref_deletion(group).args, "handle", f"{table:x}:", "u32")] = None
    return list(out)


def _default_qdisc(o: Obj) -> Command:
    """The kernel's default qdisc put on the TX queue of an mq tree that ``o`` is on."""
    args = ("qdisc", "replace", "dev", o.dev, "parent", o.parent or "", default_qdisc())
    return Command("tc", args, o.span, o.what)


def _replacing(commands: Sequence[Command]) -> list[Command]:
    """A qdisc's commands, the first (its ``qdisc add``) made ``qdisc replace``."""
    first, *rest = commands
    return [replace(first, args=(first.args[0], "replace", *first.args[2:])), *rest]


def _is_mq(o: Obj) -> bool:
    return o.kind == "qdisc" and o.qdisc_kind == "mq"


def _major(handle: str | None) -> str:
    """The qdisc part of a class id or handle (``1:`` of ``1:3``)."""
    return f"{(handle or '').partition(':')[0]}:"


def _slot_left(old: Mapping[Key, Obj], new: Mapping[Key, Obj]) -> list[tuple[str, ...]]:
    """The deletion of a rebuilt tree's clsact or ingress qdisc that its new version does
    not have (an mq tree's clsact, under what is no mq tree now): its teardown, the new
    version's, would leave it, and with it the ingress slot that a download needs."""
    return [
        ("qdisc", "del", "dev", o.dev, o.qdisc_kind or "ingress")
        for key, o in old.items()
        if in_ingress_slot(o) and (key not in new or new[key].qdisc_kind != o.qdisc_kind)
    ]


def _slot_wanted(
    old: Mapping[Key, Obj], new: Mapping[Key, Obj], slots: Collection[Key]
) -> str | None:
    """Why a tree whose ingress-slot qdisc goes (an mq tree's clsact, its lines steering no
    more) is built again: another tree of the new policy puts its qdisc there (a download
    on the device), so it must go before that is built, ahead of the filters on it that the
    tree changes in place (found by a review)."""
    for key, o in old.items():
        if in_ingress_slot(o) and key not in new and key in slots:
            return f"its {o.qdisc_kind} qdisc makes way for another tree's in the ingress slot"
    return None


def in_ingress_slot(o: Obj) -> bool:
    """Whether ``o`` is the qdisc in its device's ingress slot (clsact or ingress)."""
    return o.key[0] == "qdisc" and o.key[-1] == "ingress"


def _compiled(tree: Tree, ifaces: Callable[[str], ir.Interface] | None) -> ir.Interface:
    """The IR of ``tree``: its own, else what ``ifaces`` compiles for its label."""
    if tree.iface is not None:
        return tree.iface
    assert ifaces is not None, "a new tree is a compiled one, or its IR is given"
    return ifaces(tree.label)


def restore_plan(
    old: ir.Policy | None, new: ir.Policy, astray: Collection[str] | None = None
) -> Plan:
    """After a failed apply from ``old`` to ``new``: every tree of ``old`` built again (only
    those labelled in ``astray``, where the others are known to be as ``old`` builds them)
    and ``new``'s other trees removed (or, without ``old``, ``new``'s trees removed)."""
    if old is None:
        return make_plan(trees_of(new), ())
    old_trees, new_trees = trees_of(old), trees_of(new)
    restore = make_plan((), [t for t in old_trees if astray is None or t.label in astray])
    # the new policy's clsact or ingress qdisc where the old one's is of the other kind goes
    # first: the old tree's teardown replaces the slot's qdisc, which the other kind refuses
    was = by_key(o for t in old_trees for o in t.objects)
    now = by_key(o for t in new_trees for o in t.objects)
    stale = _slot_left({k: o for k, o in now.items() if k in was}, was)
    if stale:
        restore.steps.insert(0, _cleanup("tc", stale))
    extra = make_plan(new_trees, old_trees)
    restore.steps += [s for s in extra.steps if not s.fatal]
    return restore


def _tree_rebuild_quiet(iface: ir.Interface, plan: Plan) -> None:
    """A tree applied for the first time: built as the script builds it."""
    before = len(plan.changes)
    _tree_rebuild(iface, "", plan)
    del plan.changes[before:]
