"""The kernel objects a compiled policy wants, each with an identity, so that two versions of a
policy can be compared object by object.

The objects come from the commands the backends emit (``tcdsl.commands``), so what ``apply``
changes is exactly what the script would build: a qdisc (by device and parent), a class (by
device and class id), a filter group (by device, parent, protocol and pref: the kernel keeps
one classifier instance per pref, and its filters in creation order), a shared police action
(by index), and a tree's marking rules and download link (changed as a whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tcdsl import ir
from tcdsl.commands import Command, chain_teardown, interface_commands, teardown_commands
from tcdsl.diagnostics import Span
from tcdsl.frontend.qdiscs import QDISC_PARAMS, TC_DEFAULTS

QDISC_KINDS = frozenset({*QDISC_PARAMS, "ingress", "clsact"})

Kind = Literal["qdisc", "class", "filters", "action", "marking", "link"]

Key = tuple[str, ...]
"""An object's identity: ``("qdisc", dev, parent)``, ``("class", dev, classid)``,
``("filters", dev, parent, protocol, pref)``, ``("action", "police", index)``,
``("marking", tree)``, ``("link", dev)``."""


@dataclass(frozen=True, slots=True)
class Obj:
    """One kernel object (or a group changed together) and the commands that make it."""

    key: Key
    tree: str
    """The label of the tree it belongs to (``eth0``, ``eth0 ingress``, ...)."""
    commands: tuple[Command, ...]

    @property
    def kind(self) -> Kind:
        """What it is."""
        kind: Kind = self.key[0]  # type: ignore[assignment]
        return kind

    @property
    def dev(self) -> str:
        """The device it lives on ("" for actions and marking)."""
        return self.key[1] if self.kind in ("qdisc", "class", "filters", "link") else ""

    @property
    def words(self) -> tuple[tuple[str, ...], ...]:
        """What is compared between two versions: the words of its commands (a qdisc's
        without the options that say what tc sends anyway: ``r2q 10`` written or not)."""
        return tuple((c.tool, *_canonical(c.args)) for c in self.commands)

    @property
    def span(self) -> Span:
        """Where the policy says it (its first command's origin)."""
        return self.commands[0].span

    @property
    def what(self) -> str:
        """The policy's name for it (``class voip``, ``filter to 1:10``)."""
        return self.commands[0].what

    @property
    def handle(self) -> str | None:
        """A qdisc's handle (``1:``), a class's id; None for the rest."""
        if self.kind == "qdisc":
            return word_after(self.commands[0].args, "handle")
        if self.kind == "class":
            return self.key[2]
        return None

    @property
    def parent(self) -> str | None:
        """A class's parent (``1:`` or ``1:1``), a qdisc's parent (``root``, ``ingress`` or a
        class id), a filter group's parent; None for the rest."""
        if self.kind == "class":
            return word_after(self.commands[0].args, "parent")
        if self.kind in ("qdisc", "filters"):
            return self.key[2]
        return None

    @property
    def qdisc_kind(self) -> str | None:
        """A qdisc's kind (``htb``); a class's (its qdisc's) kind."""
        args = self.commands[0].args
        if self.kind == "qdisc":
            # after its handle, or its device where it has none (``qdisc add dev eth0 clsact``)
            start = args.index("handle" if "handle" in args else "dev") + 2
            return next((w for w in args[start:] if w in QDISC_KINDS), None)
        if self.kind == "class":
            return args[args.index("classid") + 2]
        return None


def _canonical(args: tuple[str, ...]) -> tuple[str, ...]:
    """A command's words without a qdisc's options that tc sends when they are left out."""
    if args[0] != "qdisc":
        return args
    for kind, defaults in TC_DEFAULTS.items():
        if kind in args:
            start = args.index(kind) + 1
            out = list(args[:start])
            at = start
            while at < len(args):
                if args[at] in defaults and args[at + 1 : at + 2] == (defaults[args[at]],):
                    at += 2
                    continue
                out.append(args[at])
                at += 1
            return tuple(out)
    return args


def word_after(args: Sequence[str], word: str) -> str | None:
    """The word after ``word`` in a command, or None."""
    try:
        return args[args.index(word) + 1]
    except (ValueError, IndexError):
        return None


def _key(cmd: Command, tree: str) -> Key:
    """The identity of the object a command makes or belongs to."""
    args = cmd.args
    if cmd.tool == "ip":
        return ("link", word_after(args, "add") or word_after(args, "dev") or "")
    if cmd.tool != "tc":
        return ("marking", tree)
    dev = word_after(args, "dev") or ""
    match args[0]:
        case "qdisc":
            if "root" in args:
                where = "root"
            elif args[-1] in ("ingress", "clsact"):  # both take the ingress slot, ffff:
                where = "ingress"
            else:
                where = word_after(args, "parent") or ""
            return ("qdisc", dev, where)
        case "class":
            return ("class", dev, word_after(args, "classid") or "")
        case "filter":
            parent = str(ir.CLSACT_EGRESS) if "egress" in args else word_after(args, "parent") or ""
            return (
                "filters",
                dev,
                parent,
                word_after(args, "protocol") or "",
                word_after(args, "prio") or "",
            )
        case "actions":
            return ("action", "police", word_after(args, "index") or "")
    raise ValueError(f"no identity for {args}")


def tree_objects(iface: ir.Interface) -> Iterator[Obj]:
    """The objects of one tree, in the order its commands make them (a filter group where
    its first filter is)."""
    groups: dict[Key, list[Command]] = {}
    for cmd in interface_commands(iface):
        groups.setdefault(_key(cmd, iface.label), []).append(cmd)
    for key, cmds in groups.items():
        yield Obj(key, iface.label, tuple(cmds))


def policy_objects(policy: ir.Policy) -> tuple[Obj, ...]:
    """Every object of every tree of ``policy``, tree by tree."""
    return tuple(o for iface in policy.interfaces for o in tree_objects(iface))


def by_key(objects: Iterable[Obj]) -> dict[Key, Obj]:
    """Objects by identity."""
    return {o.key: o for o in objects}


def class_ids(policy: ir.Policy) -> dict[str, dict[str, ir.Handle]]:
    """Every named class's id, by tree label and class name (the link class tcdsl makes for
    ``interface eth0 htb rate ...`` left out)."""
    out: dict[str, dict[str, ir.Handle]] = {}
    for iface in policy.interfaces:
        ids = out.setdefault(iface.label, {})
        for q in ir.walk_qdiscs(iface.root):
            for cls in ir.classes_of(q):
                if cls.classid is not None and not cls.implicit and cls.name:
                    ids.setdefault(cls.name, cls.classid)
    return out


@dataclass(frozen=True, slots=True)
class Tree:
    """One tree of a policy as the live operations see it: its objects, its class names, the
    commands that remove it; and its IR when it was compiled here (None when it was read
    from the state, which records what an apply built)."""

    label: str
    span: Span
    objects: tuple[Obj, ...]
    names: Mapping[str, str]
    """Class id (``1:10``) -> the policy's name for the class."""
    removal: tuple[tuple[str, ...], ...]
    """The commands that remove it, the tool first (each may fail harmlessly, but for a
    qdisc still there after its delete: ``tcdsl.ops.apply.run_step``)."""
    iface: ir.Interface | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices its objects are on, in order of first use."""
        return tuple(dict.fromkeys(o.dev for o in self.objects if o.dev))


def trees_of(policy: ir.Policy | None) -> tuple[Tree, ...]:
    """The trees of a compiled policy (none for None)."""
    if policy is None:
        return ()
    ids = class_ids(policy)
    return tuple(
        Tree(
            iface.label,
            iface.root.span,
            tuple(tree_objects(iface)),
            {str(h): name for name, h in ids.get(iface.label, {}).items()},
            (*teardown_commands(iface), *(chain_teardown(iface) if iface.marking else ())),
            iface,
        )
        for iface in policy.interfaces
    )


TREES_FORMAT = 2
"""The version of :func:`trees_json`'s layout (a record of another is compiled again). 2: a
tbf's or netem's child qdisc at 'parent 1:', where 1 had it at 'parent 1:1' (its key)."""


def trees_json(trees: Sequence[Tree]) -> dict[str, Any]:
    """Trees as JSON (their IR left out), for the state."""

    def span(s: Span) -> list[object]:
        return [s.file, s.line, s.column, s.end_line, s.end_column]

    return {
        "format": TREES_FORMAT,
        "trees": [
            {
                "label": t.label,
                "span": span(t.span),
                "names": dict(t.names),
                "removal": [list(c) for c in t.removal],
                "objects": [
                    [
                        list(o.key),
                        [[c.tool, list(c.args), span(c.span), c.what] for c in o.commands],
                    ]
                    for o in t.objects
                ],
            }
            for t in trees
        ],
    }


def trees_from_json(data: Mapping[str, Any]) -> tuple[Tree, ...] | None:
    """Trees read back from :func:`trees_json`; None for another format, or for one damaged
    (edited by hand, cut short): the caller compiles the policy again instead."""
    if data.get("format") != TREES_FORMAT:
        return None
    try:
        return _trees(data)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        return None


def _trees(data: Mapping[str, Any]) -> tuple[Tree, ...]:
    spans: dict[tuple[object, ...], Span] = {}

    def span(words: list[Any]) -> Span:
        key = tuple(words)
        if key not in spans:
            spans[key] = Span(str(words[0]), *(int(w) for w in words[1:]))
        return spans[key]

    out = []
    for t in data["trees"]:
        label = _text(t["label"])  # (found by a tester: a null label was '- tree None')
        objects = tuple(
            Obj(
                tuple(key),
                label,
                tuple(
                    Command(_tool(tool), tuple(map(_text, args)), span(where), _text(what))
                    for tool, args, where, what in commands
                ),
            )
            for key, commands in t["objects"]
        )
        names = {_text(k): _text(v) for k, v in t["names"].items()}
        removal = tuple(tuple(map(_text, c)) for c in t["removal"])
        out.append(Tree(label, span(t["span"]), objects, names, removal))
    return tuple(out)


def _tool(value: object) -> Literal["tc", "iptables", "ip6tables", "ip"]:
    if value == "tc" or value == "iptables" or value == "ip6tables" or value == "ip":
        return value
    raise TypeError(f"{value!r} is no tool tcdsl runs")


def _text(value: object) -> str:
    """A string of a record, as it was written; TypeError for anything else (a hand edit)."""
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is no text")
    return value
