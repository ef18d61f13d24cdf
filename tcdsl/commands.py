"""The tc and iptables commands that build an allocated policy, shared by the backends that
drive those tools (the shell script, ``tc -batch`` files).

Commands come in kernel order: a qdisc, then its classes (parents first), then the leaf
qdiscs below them, then the qdisc's filters. Every word is a plain string; backends quote.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from tcdsl import ir
from tcdsl.allocate import default_minor
from tcdsl.diagnostics import Span
from tcdsl.lower import iptables_words
from tcdsl.units import format_rate, format_size, format_time


@dataclass(frozen=True, slots=True)
class Command:
    """One command: the tool, its arguments, and the policy text it comes from."""

    tool: Literal["tc", "iptables"]
    args: tuple[str, ...]
    span: Span
    what: str


def _pct(value: Fraction) -> str:
    return f"{float(value):.12g}%"  # tc reads it with strtod: 1e-07% is fine


def _opt(words: list[str], key: str, value: object) -> None:
    match value:
        case None | False:
            return
        case True:
            words.append(key)
        case ir.Rate():
            words += [key, format_rate(value.bits_per_second)]
        case ir.Size():
            words += [key, format_size(value.bytes)]
        case ir.Time():
            words += [key, format_time(value.microseconds)]
        case ir.Count():
            words += [key, str(value.value)]
        case ir.Percent():
            words += [key, _pct(value.value)]
        case _:
            raise TypeError(f"cannot spell {value!r}")


def qdisc_words(q: ir.Qdisc) -> list[str]:
    """The kind and options of a qdisc, as tc takes them after ``handle N:``."""
    words: list[str] = [q.kind]
    match q:
        case ir.Htb():
            minor = default_minor(q)
            if minor is not None:
                words += ["default", f"{minor:x}"]
            _opt(words, "r2q", q.r2q)
        case ir.Prio():
            _opt(words, "bands", q.bands)
            if q.priomap is not None:
                words += ["priomap", *(str(v.value) for v in q.priomap)]
        case ir.Cbq():
            _opt(words, "bandwidth", q.bandwidth)
            _opt(words, "avpkt", q.avpkt)
        case ir.Tbf():
            for key in ("rate", "burst", "latency", "limit", "peakrate", "mtu"):
                _opt(words, key, getattr(q, key))
        case ir.Netem():
            _opt(words, "limit", q.limit)
            if q.delay is not None:
                words += ["delay", format_time(q.delay.microseconds)]
                if q.jitter is not None:
                    words.append(format_time(q.jitter.microseconds))
            for key in ("loss", "duplicate", "corrupt", "rate"):
                _opt(words, key, getattr(q, key))
        case ir.Sfq():
            for key in ("limit", "perturb", "quantum", "depth", "divisor"):
                _opt(words, key, getattr(q, key))
        case ir.FqCodel():
            for key in ("limit", "flows", "target", "interval", "quantum", "memory_limit"):
                _opt(words, key, getattr(q, key))
            if q.ecn is not None:
                words.append("ecn" if q.ecn else "noecn")
        case ir.Pfifo() | ir.Bfifo():
            _opt(words, "limit", q.limit)
        case ir.PfifoFast():
            pass
    return words


def class_words(kind: str, cls: ir.Class) -> list[str]:
    """The kind and options of a class."""
    words = [kind]
    keys: tuple[str, ...] = ("rate", "ceil", "burst", "cburst", "prio", "quantum")
    if kind == "cbq":
        keys = (
            "rate",
            "allot",
            "prio",
            "avpkt",
            "weight",
            "maxburst",
            "minburst",
            "bounded",
            "isolated",
        )
    for key in keys:
        _opt(words, key, getattr(cls, key))
    return words


def _label(q: ir.Qdisc) -> str:
    return f"{q.kind} qdisc"


def interface_commands(iface: ir.Interface) -> Iterator[Command]:
    """Yield the commands that build ``iface``, teardown excluded."""
    dev = ("dev", iface.name)
    root = iface.root
    assert root.handle is not None
    yield Command(
        "tc",
        ("qdisc", "add", *dev, "root", "handle", root.handle.qdisc, *qdisc_words(root)),
        root.span,
        f"interface {iface.name}: {_label(root)}",
    )
    by_parent: dict[ir.Handle, list[ir.Filter]] = {}
    for f in iface.filters:
        by_parent.setdefault(f.parent, []).append(f)
    yield from _below(iface, root, by_parent)
    if iface.marking is not None:
        yield from marking_commands(iface)


def _below(
    iface: ir.Interface, q: ir.Qdisc, filters: dict[ir.Handle, list[ir.Filter]]
) -> Iterator[Command]:
    dev = ("dev", iface.name)
    assert q.handle is not None
    children: list[tuple[ir.Handle, ir.Qdisc]] = []
    match q:
        case ir.Htb() | ir.Cbq():
            parents = ir.parent_map(q)
            for cls in ir.classes_of(q):
                parent = parents[id(cls)]
                parent_id = parent.classid if parent is not None else q.handle
                assert cls.classid is not None and parent_id is not None
                what = f"class {cls.name}" if not cls.implicit else "link class"
                yield Command(
                    "tc",
                    (
                        "class",
                        "add",
                        *dev,
                        "parent",
                        str(parent_id),
                        "classid",
                        str(cls.classid),
                        *class_words(q.kind, cls),
                    ),
                    cls.span,
                    what,
                )
                if cls.leaf is not None:
                    children.append((cls.classid, cls.leaf))
        case ir.Prio():
            for cls in q.classes:
                if cls.leaf is not None and cls.classid is not None:
                    children.append((cls.classid, cls.leaf))
        case ir.Tbf() | ir.Netem():
            if q.child is not None:
                children.append((ir.Handle(q.handle.major, 1), q.child))
        case _:
            pass
    for parent_id, child in children:
        assert child.handle is not None
        yield Command(
            "tc",
            (
                "qdisc",
                "add",
                *dev,
                "parent",
                str(parent_id),
                "handle",
                child.handle.qdisc,
                *qdisc_words(child),
            ),
            child.span,
            f"{_label(child)} of {parent_id}",
        )
        yield from _below(iface, child, filters)
    for f in filters.get(q.handle, ()):
        head = (
            "filter",
            "add",
            *dev,
            "parent",
            str(f.parent),
            "protocol",
            "ip",
            "prio",
            str(f.pref),
        )
        match f:
            case ir.U32Filter():
                keys = [w for key in f.keys for w in ("match", *key.words)]
                yield Command(
                    "tc",
                    (*head, "u32", *keys, "flowid", str(f.flowid)),
                    f.span,
                    f"filter to {f.flowid}",
                )
            case ir.FwFilter():
                yield Command(
                    "tc",
                    (*head, "handle", str(f.mark), "fw", "flowid", str(f.flowid)),
                    f.span,
                    f"mark {f.mark} to {f.flowid}",
                )


def marking_commands(iface: ir.Interface) -> Iterator[Command]:
    """Yield the iptables commands that mark packets for ``iface``'s fw filters."""
    m = iface.marking
    assert m is not None and m.chain is not None
    mangle = ("-t", "mangle")
    yield Command("iptables", (*mangle, "-N", m.chain), m.span, f"chain {m.chain}")
    yield Command(
        "iptables",
        (*mangle, "-I", "PREROUTING", "-i", m.from_interface, "-j", m.chain),
        m.span,
        f"traffic arriving on {m.from_interface}",
    )
    for rule in m.rules:
        # Every rule only marks unmarked packets, so the first matching line wins, as with u32.
        words = iptables_words(rule.conds)
        yield Command(
            "iptables",
            (
                *mangle,
                "-A",
                m.chain,
                *words,
                "-m",
                "mark",
                "--mark",
                "0",
                "-j",
                "MARK",
                "--set-mark",
                str(rule.mark),
            ),
            rule.span,
            "unmarked traffic" if rule.unmarked else f"mark {rule.mark}",
        )


def teardown_commands(iface: ir.Interface) -> Iterator[tuple[str, ...]]:
    """Yield commands that remove what the policy owns on ``iface``; each may fail harmlessly."""
    yield ("tc", "qdisc", "del", "dev", iface.name, "root")
