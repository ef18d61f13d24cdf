"""Name resolution: class names are unique per interface, ``default`` names a class, and
percentages become absolute rates (of the parent's rate for ``rate``, its ceiling for ``ceil``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note


def resolve(policy: ir.Policy) -> tuple[ir.Policy, list[Diagnostic]]:
    """Return the policy with percentages resolved, and every naming problem found."""
    diagnostics: list[Diagnostic] = []
    interfaces = []
    seen: dict[tuple[str, str], ir.Interface] = {}
    devices: dict[str, tuple[ir.Interface, bool]] = {}  # device -> a tree using it, as an IFB?
    for iface in policy.interfaces:
        clash = next((seen[slot] for slot in _slots(iface) if slot in seen), None)
        if clash is not None:
            diagnostics.append(_clash(iface, clash))
            continue
        found = _ifb_taken(iface, devices)
        if found is not None:
            diagnostics.append(found)
            continue
        seen.update((slot, iface) for slot in _slots(iface))
        for device, ifb in _devices(iface):
            devices.setdefault(device, (iface, ifb))
        diagnostics.extend(unique_class_names(iface))
        diagnostics.extend(default_names_a_class(iface))
        root = _resolve_qdisc(iface.root, diagnostics)
        interfaces.append(dataclasses.replace(iface, root=root))
    return dataclasses.replace(policy, interfaces=tuple(interfaces)), diagnostics


def _slots(iface: ir.Interface) -> tuple[tuple[str, str], ...]:
    """What a tree occupies on which device: an egress root, an ingress qdisc (a download
    takes both: its IFB's root and its interface's ingress)."""
    if iface.download is not None:
        return (("root", iface.name), ("ingress", iface.download.interface))
    return (("ingress" if iface.direction == "ingress" else "root", iface.name),)


def _devices(iface: ir.Interface) -> tuple[tuple[str, bool], ...]:
    """The devices a tree uses, each with whether it is the IFB of a download (which the
    script and ``tcdsl down`` delete and make again)."""
    if iface.download is not None:
        return ((iface.name, True), (iface.download.interface, False))
    return ((iface.name, False),)


def _ifb_taken(
    iface: ir.Interface, devices: dict[str, tuple[ir.Interface, bool]]
) -> Diagnostic | None:
    """E254 for a download's IFB that is a device another tree (or the download itself)
    uses as its interface, or an interface that an earlier download uses as its IFB: making
    the IFB deletes that device, with what is on it."""
    download = iface.download
    if download is not None and iface.name == download.interface:
        msg = (
            f"the download of '{iface.name}' is shaped on '{iface.name}' itself: a download "
            "needs an IFB of its own, which its script deletes and makes again; name another "
            "(download via NAME) or leave 'via' out"
        )
        return Diagnostic.error("E254", msg, download.span)
    for device, ifb in _devices(iface):
        other, other_ifb = devices.get(device, (None, False))
        if other is None or ifb == other_ifb:  # (both IFBs: the slot check's)
            continue
        shaped, user = (iface, other) if ifb else (other, iface)
        assert shaped.download is not None
        msg = (
            f"the download of '{shaped.download.interface}' is shaped on '{device}', an IFB "
            f"its script deletes and makes again, and {_tree_words(user)} uses '{device}' as "
            "its interface; name another IFB (download via NAME)"
        )
        return Diagnostic.error("E254", msg, iface.span, Note("first declared here", other.span))
    return None


def _clash(iface: ir.Interface, first: ir.Interface) -> Diagnostic:
    note = Note("first declared here", first.span)
    if iface.download is None and first.download is None:
        what = "'s ingress" if iface.direction == "ingress" else ""
        return Diagnostic.error(
            "E104", f"interface '{iface.name}'{what} is declared twice", iface.span, note
        )
    download = iface if iface.download is not None else first
    assert download.download is not None
    other = first if first is not download else iface
    msg = (
        f"the download of '{download.download.interface}' is shaped on '{download.name}', "
        f"which {_tree_words(other)} also uses"
    )
    return Diagnostic.error("E254", msg, iface.span, note)


def _tree_words(iface: ir.Interface) -> str:
    """A tree of the policy in words: ``the download of 'eth0'``, ``the egress of 'eth1'``."""
    if iface.download is not None:
        return f"the download of '{iface.download.interface}'"
    return f"the {'ingress' if iface.direction == 'ingress' else 'egress'} of '{iface.name}'"


def unique_class_names(iface: ir.Interface) -> Iterator[Diagnostic]:
    """Class names are unique within an interface (they name the class in messages and marks)."""
    first: dict[str, ir.Class] = {}
    for q in ir.walk_qdiscs(iface.root):
        for cls in ir.classes_of(q):
            if cls.implicit:
                continue
            if cls.name in first:
                yield Diagnostic.error(
                    "E101",
                    f"class '{cls.name}' is already defined on interface '{iface.name}'",
                    cls.span,
                    Note("first defined here", first[cls.name].span),
                )
            else:
                first[cls.name] = cls


_UNCLASSIFIED = {
    "htb": "leave unshaped through htb's direct queue",
    "hfsc": "be dropped (hfsc has no direct queue)",
}


def default_names_a_class(iface: ir.Interface) -> Iterator[Diagnostic]:
    """``default NAME`` on an htb or hfsc qdisc names one of its own leaf classes."""
    for q in ir.walk_qdiscs(iface.root):
        if isinstance(q, ir.Htb | ir.Hfsc) and q.default is not None:
            by_name = {c.name: c for c in ir.classes_of(q) if not c.implicit}
            names = set(by_name)
            target = by_name.get(q.default.name)
            if target is not None and target.children:
                yield Diagnostic.error(
                    "E102",
                    f"default class '{q.default.name}' has child classes, so it cannot hold "
                    f"packets; unclassified traffic would {_UNCLASSIFIED[q.kind]}: name a leaf "
                    "class",
                    q.default.span,
                    Note("class declared here", target.span),
                )
            if q.default.name not in names:
                known = ", ".join(sorted(names)) or "none"
                yield Diagnostic.error(
                    "E102",
                    f"default class '{q.default.name}' is not a class of this {q.kind} "
                    f"(classes: {known})",
                    q.default.span,
                )


def _resolve_qdisc(q: ir.Qdisc, diagnostics: list[Diagnostic]) -> ir.Qdisc:
    if not isinstance(q, ir.NESTING):
        return q  # a leaf qdisc (a subscriber's fq_codel): nothing below it to resolve
    match q:
        case ir.Htb() | ir.Prio() | ir.Cbq() | ir.Hfsc():
            link: ir.Rate | None = q.bandwidth if isinstance(q, ir.Cbq) else None
            classes = tuple(_resolve_class(c, link, link, diagnostics) for c in q.classes)
            return dataclasses.replace(q, classes=classes)
        case ir.Tbf() | ir.Netem():
            if q.child is None:
                return q
            return dataclasses.replace(q, child=_resolve_qdisc(q.child, diagnostics))
        case ir.Mq():
            queues = tuple(
                dataclasses.replace(mq, qdisc=_resolve_qdisc(mq.qdisc, diagnostics))
                for mq in q.queues
            )
            return dataclasses.replace(q, queues=queues)
        case _:
            return q


def _absolute(
    value: ir.Rate | ir.Percent | None,
    base: ir.Rate | None,
    what: str,
    diagnostics: list[Diagnostic],
) -> ir.Rate | None:
    if not isinstance(value, ir.Percent):
        return value
    if base is None:
        diagnostics.append(
            Diagnostic.error(
                "E208",
                f"{what} {value.value}% needs a parent with a rate",
                value.span,
            )
        )
        return None
    if value.value > 100:
        diagnostics.append(
            Diagnostic.error(
                "E208",
                f"{what} {value.value}% is above 100% of the parent",
                value.span,
            )
        )
        return None
    bps = int(base.bits_per_second * value.value / 100)
    if bps < 1:
        diagnostics.append(
            Diagnostic.error(
                "E208",
                f"{what} {value.value}% of the parent is below 1bit",
                value.span,
            )
        )
        return None
    return ir.Rate(bps, value.span, base.byte_units)


def _resolve_class(
    cls: ir.Class,
    parent_rate: ir.Rate | None,
    parent_ceil: ir.Rate | None,
    diagnostics: list[Diagnostic],
) -> ir.Class:
    rate = _absolute(cls.rate, parent_rate, "rate", diagnostics)
    ceil = _absolute(cls.ceil, parent_ceil or parent_rate, "ceil", diagnostics)
    leaf = None if cls.leaf is None else _resolve_qdisc(cls.leaf, diagnostics)
    unchanged = rate is cls.rate and ceil is cls.ceil and leaf is cls.leaf
    if not cls.children:  # a leaf class: most classes of a large policy
        return cls if unchanged else dataclasses.replace(cls, rate=rate, ceil=ceil, leaf=leaf)
    own_ceil = ceil if ceil is not None else rate
    children = tuple(_resolve_class(c, rate, own_ceil, diagnostics) for c in cls.children)
    if unchanged and all(a is b for a, b in zip(children, cls.children, strict=True)):
        return cls
    return dataclasses.replace(cls, rate=rate, ceil=ceil, leaf=leaf, children=children)
