"""``tcdsl status``: the live tree by the policy's names, with rates measured from the counters.

A report joins the trees of a compiled policy (``ir.Policy.interfaces``: each class with its
name, line, rate, ceil and allocated class id) with the kernel's counters
(``tcdsl.ops.counters``) by class id. Without a policy it shows the kernel's tree with tc's own
ids. A class of the policy the kernel lacks is reported as ``not applied``; a class the kernel
has on a policy's device and the policy does not, as ``not in policy``.

Rates come from two readings: "now" is the byte delta of the last two over the time between
them, the average the delta since the session's first reading. ``watch`` takes the readings;
``build`` makes a report of three of them; ``render_text``, ``render_json`` and
``render_prometheus`` print it (docs/operations.md describes the keys and metrics).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from io import StringIO
from pathlib import PurePath
from typing import Literal

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic
from tcdsl.frontend.tables import circuit_name
from tcdsl.ops.counters import (
    ClassCounters,
    DeviceCounters,
    NoSuchDevice,
    QdiscCounters,
    XStats,
    read_device,
)
from tcdsl.units import format_rate

MISSING_DEVICE = "E602"

State = Literal["ok", "not applied", "not in policy"]
LINK = "(link)"
"""The name shown for the link class tcdsl makes from ``interface eth0 htb rate ...``."""


@dataclass(frozen=True, slots=True)
class ClassStatus:
    """One class: what the policy says of it and what the kernel counts."""

    name: str
    """The policy's name (``LINK`` for the link class); the class id without a policy."""
    classid: str
    parent: str | None
    """The parent class's name (or id), None at the top of a tree."""
    depth: int
    file: str | None
    line: int | None
    """Where the policy declares the class; None without a policy."""
    rate: int | None
    """bits/s: the policy's rate (the kernel's without a policy); None for kinds without."""
    ceil: int | None
    state: State
    counters: ClassCounters | None
    """The kernel's counters now; None when the class is not applied."""
    rate_now: int | None
    """bits/s between the last two readings; None when not applied or the counters reset."""
    rate_avg: int | None
    """bits/s since the first reading of the session."""
    leaf: QdiscCounters | None
    """The qdisc below the class in the kernel (its flow statistics), if one was added."""
    title: str | None = None
    """What the class stands for (a subscriber's Circuit Name), None where the policy has
    nothing."""

    @property
    def limit(self) -> int | None:
        """What the class may send at most: its ceil, else its rate (bits/s)."""
        return self.ceil if self.ceil is not None else self.rate


@dataclass(frozen=True, slots=True)
class TreeStatus:
    """One tree: a policy interface (or a device without a policy) and its classes."""

    device: str
    label: str
    kind: str
    """The root qdisc's kind (the policy's; the kernel's without a policy, or ``none``)."""
    handle: str
    state: State
    root: QdiscCounters | None
    rate_now: int | None
    rate_avg: int | None
    classes: tuple[ClassStatus, ...]
    hidden: int = 0
    """Classes of the tree that ``select`` left out."""


@dataclass(frozen=True, slots=True)
class Report:
    """One status sample of every tree."""

    policy: str | None
    """The policy's path, None for the kernel's tree."""
    elapsed: float
    """Seconds from the session's first reading to this sample's last."""
    interval: float
    """Seconds between this sample's two readings."""
    trees: tuple[TreeStatus, ...]


Readings = Mapping[str, DeviceCounters]
"""One reading of every device, by name."""


# ==== readings =================================================================================


def read_all(devices: Iterable[str], netns: str | None = None) -> dict[str, DeviceCounters]:
    """Read every device once (``NoSuchDevice`` for the first that does not exist)."""
    return {device: read_device(device, netns) for device in dict.fromkeys(devices)}


def watch(
    devices: Sequence[str],
    interval: float,
    count: int | None,
    read: Callable[[Sequence[str]], Readings] = read_all,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[Readings, Readings, Readings]]:
    """Yield (first, previous, now) readings every ``interval`` seconds, ``count`` times (None:
    until stopped). The first sample needs two readings: one is taken, then one after
    ``interval``."""
    first = previous = read(devices)
    done = 0
    while count is None or done < count:
        sleep(interval)
        now = read(devices)
        yield first, previous, now
        previous = now
        done += 1


def devices_of(policy: ir.Policy, only: Collection[str] = ()) -> list[str]:
    """The devices a policy's trees are on (IFBs for downloads), in order, once each; with
    ``only``, of the trees whose device or interface is in it."""
    return list(
        dict.fromkeys(
            i.name for i in policy.interfaces if not only or i.name in only or i.interface in only
        )
    )


def missing_device(policy: ir.Policy | None, error: NoSuchDevice) -> Diagnostic | None:
    """E602 at the first policy tree on the device that does not exist (None without a
    policy: the caller names the ``-i`` device)."""
    if policy is None:
        return None
    iface = next((i for i in policy.interfaces if i.name == error.device), None)
    if iface is None:
        return None
    if iface.download is not None:
        what = f"the IFB '{iface.name}' that shapes the download of '{iface.download.interface}'"
        hint = "apply the policy first (its script creates the IFB)"
    else:
        what = f"device '{iface.name}'"
        hint = "check the name with 'ip link', or run in the namespace that has it"
    return Diagnostic.error(MISSING_DEVICE, f"{what} does not exist here; {hint}", iface.span)


# ==== joining ==================================================================================


def _rate(new: int, old: int, seconds: float) -> int | None:
    if seconds <= 0 or new < old:
        return None
    return round((new - old) * 8 / seconds)


def _rates(
    get: Callable[[DeviceCounters], ClassCounters | QdiscCounters | None],
    device: str,
    first: Readings,
    previous: Readings,
    now: Readings,
) -> tuple[int | None, int | None]:
    """(rate now, average) in bits/s of what ``get`` picks out of a device's readings."""
    cur = get(now[device])
    if cur is None:
        return None, None
    out: list[int | None] = []
    for old in (previous[device], first[device]):
        before = get(old)
        start = before.stats.bytes if before is not None else 0
        out.append(_rate(cur.stats.bytes, start, now[device].at - old.at))
    return out[0], out[1]


def _class_rates(classid: str, device: str, *readings: Readings) -> tuple[int | None, int | None]:
    return _rates(lambda d: d.klass(classid), device, *readings)


def _qdisc_rates(handle: str, device: str, *readings: Readings) -> tuple[int | None, int | None]:
    return _rates(lambda d: d.qdisc(handle), device, *readings)


def _id_key(classid: str) -> tuple[int, int]:
    major, _, minor = classid.partition(":")
    try:
        return int(major or "0", 16), int(minor or "0", 16)
    except ValueError:
        return (1 << 32, 0)


@dataclass(frozen=True, slots=True)
class _Declared:
    cls: ir.Class
    depth: int
    parent: ir.Class | None


def _declared(qdisc: ir.Qdisc, depth: int, parent: ir.Class | None) -> Iterator[_Declared]:
    """The classes of ``qdisc`` and of the qdiscs below it, pre-order, with depth and parent."""
    if isinstance(qdisc, ir.Tbf | ir.Netem):
        if qdisc.child is not None:
            yield from _declared(qdisc.child, depth, parent)
        return
    if isinstance(qdisc, ir.Mq):
        for queue in qdisc.queues:
            yield from _declared(queue.qdisc, depth, parent)
        return
    if not isinstance(qdisc, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
        return

    def visit(cls: ir.Class, level: int, up: ir.Class | None) -> Iterator[_Declared]:
        yield _Declared(cls, level, up)
        for child in cls.children:
            yield from visit(child, level + 1, cls)
        if cls.leaf is not None:
            yield from _declared(cls.leaf, level + 1, cls)

    for top in qdisc.classes:
        yield from visit(top, depth, parent)


def _name(cls: ir.Class) -> str:
    return LINK if cls.implicit else cls.name


def _bits(value: ir.Rate | ir.Percent | None) -> int | None:
    return value.bits_per_second if isinstance(value, ir.Rate) else None


def _row(
    facts: tuple[str, str, str | None, int],
    declared: tuple[str | None, int | None, int | None, int | None],
    state: State,
    counters: ClassCounters | None,
    device: str,
    readings: tuple[Readings, Readings, Readings],
    title: str | None = None,
) -> ClassStatus:
    """A row from its (name, classid, parent, depth), what declares it (file, line, rate,
    ceil) and the kernel's ``counters`` (None: the class is not applied)."""
    name, classid, parent, depth = facts
    file, line, rate, ceil = declared
    now_rate = avg = leaf = None
    if counters is not None:
        now_rate, avg = _class_rates(classid, device, *readings)
        if counters.leaf is not None:
            leaf = readings[2][device].qdisc(counters.leaf)
    return ClassStatus(
        name=name,
        classid=classid,
        parent=parent,
        depth=depth,
        file=file,
        line=line,
        rate=rate,
        ceil=ceil,
        state=state if counters is not None else "not applied",
        counters=counters,
        rate_now=now_rate,
        rate_avg=avg,
        leaf=leaf,
        title=title,
    )


def _kernel_tree_rows(
    classes: Sequence[ClassCounters],
    state: State,
    device: str,
    readings: tuple[Readings, Readings, Readings],
) -> list[ClassStatus]:
    """``classes`` as a tree by their parents (tc's ids), pre-order, siblings by id."""
    ids = {c.classid for c in classes}
    children: dict[str | None, list[ClassCounters]] = {}
    for c in sorted(classes, key=lambda c: _id_key(c.classid)):
        children.setdefault(c.parent if c.parent in ids else None, []).append(c)
    rows: list[ClassStatus] = []

    def visit(c: ClassCounters, depth: int, parent: str | None) -> None:
        facts = (c.classid, c.classid, parent, depth)
        rows.append(_row(facts, (None, None, c.rate, c.ceil), state, c, device, readings))
        for child in children.get(c.classid, []):
            visit(child, depth + 1, c.classid)

    for top in children.get(None, []):
        visit(top, 0, None)
    return rows


def _policy_tree(
    iface: ir.Interface,
    readings: tuple[Readings, Readings, Readings],
    extra: Sequence[ClassCounters],
) -> TreeStatus:
    now = readings[2][iface.name]
    root = iface.root
    handle = root.handle.qdisc if root.handle is not None else "?"
    kernel_root = now.qdisc(handle)
    applied = kernel_root is not None and kernel_root.kind == root.kind
    rows: list[ClassStatus] = []
    for d in _declared(root, 0, None):
        classid = str(d.cls.classid) if d.cls.classid is not None else "?"
        parent = _name(d.parent) if d.parent is not None else None
        facts = (_name(d.cls), classid, parent, d.depth)
        span = d.cls.span
        declared = (span.file, span.line, _bits(d.cls.rate), _bits(d.cls.ceil))
        counters = now.klass(classid) if applied else None
        rows.append(_row(facts, declared, "ok", counters, iface.name, readings, d.cls.title))
    rows += _kernel_tree_rows(extra, "not in policy", iface.name, readings)
    now_rate, avg = _qdisc_rates(handle, iface.name, *readings) if applied else (None, None)
    return TreeStatus(
        device=iface.name,
        label=iface.label,
        kind=root.kind,
        handle=handle,
        state="ok" if applied else "not applied",
        root=kernel_root if applied else None,
        rate_now=now_rate,
        rate_avg=avg,
        classes=tuple(rows),
    )


def _kernel_tree(device: str, readings: tuple[Readings, Readings, Readings]) -> TreeStatus:
    now = readings[2][device]
    root = next((q for q in now.qdiscs if q.parent == "root"), None)
    handle = root.handle if root is not None else "?"
    now_rate, avg = _qdisc_rates(handle, device, *readings) if root else (None, None)
    return TreeStatus(
        device=device,
        label=device,
        kind=root.kind if root is not None else "none",
        handle=handle,
        state="ok",
        root=root,
        rate_now=now_rate,
        rate_avg=avg,
        classes=tuple(_kernel_tree_rows(now.classes, "ok", device, readings)),
    )


def build(
    policy: ir.Policy | None,
    devices: Sequence[str],
    first: Readings,
    previous: Readings,
    now: Readings,
    source: str | None = None,
) -> Report:
    """The report of one sample: ``policy``'s trees (only those on ``devices``), or without
    a policy the kernel's tree of each device."""
    readings = (first, previous, now)
    trees: list[TreeStatus] = []
    if policy is None:
        trees = [_kernel_tree(device, readings) for device in devices]
    else:
        ifaces = [i for i in policy.interfaces if i.name in devices]
        claimed = {(i.name, str(d.cls.classid)) for i in ifaces for d in _declared(i.root, 0, None)}
        # an mq's classes are the device's TX queues, which the kernel makes (one for each,
        # those the policy leaves to the kernel's default qdisc too)
        mq = {
            (i.name, f"{i.root.handle.major:x}:")
            for i in ifaces
            if isinstance(i.root, ir.Mq) and i.root.handle is not None
        }
        for i in ifaces:
            # and a tbf's or netem's one class (X:1), which holds its child qdisc
            claimed |= {
                (i.name, f"{q.handle.major:x}:1")
                for q in ir.walk_qdiscs(i.root)
                if isinstance(q, ir.Tbf | ir.Netem) and q.handle is not None
            }
        placed: set[str] = set()
        for iface in ifaces:
            extra: list[ClassCounters] = []
            if iface.name not in placed:  # the device's unknown classes go to its first tree
                placed.add(iface.name)
                extra = [
                    c
                    for c in now[iface.name].classes
                    if (iface.name, c.classid) not in claimed
                    and (iface.name, f"{c.classid.partition(':')[0]}:") not in mq
                ]
            trees.append(_policy_tree(iface, readings, extra))
    some = next(iter(now.values()), None)
    elapsed = interval = 0.0
    if some is not None:
        elapsed = some.at - first[some.device].at
        interval = some.at - previous[some.device].at
    return Report(source, elapsed, interval, tuple(trees))


# ==== selecting =================================================================================


class NoSuchClass(ValueError):
    """A pattern of ``select`` that matches no class of the report."""

    def __init__(self, pattern: str, message: str | None = None) -> None:
        super().__init__(
            message or f"no class shown here is named {pattern!r}, has that id or that title"
        )
        self.pattern = pattern


Picks = dict[str, frozenset[str]]
"""Classes chosen by name in each tree (by its label): those an address's lines take."""


def by_address(policy: ir.Policy, patterns: Sequence[str]) -> tuple[list[str], Picks]:
    """``patterns`` without those that are IPv4 or IPv6 addresses (``100.64.0.8``), and for
    those, the classes whose own match lines take packets from or to them, by tree (a
    subscriber's class, in each direction: support calls name a customer's address, not a
    class). Such a class is shown without the classes below it, and a class of another tree
    of the same name is not shown (found by a tester: '--class' took the names, so a site's
    line for a whole /10 showed all its subscribers, and another table's circuit of the same
    id was shown too). ``NoSuchClass`` when no line takes an address."""
    out: list[str] = []
    picks: dict[str, set[str]] = {}
    for pattern in patterns:
        try:
            address = ipaddress.ip_address(pattern)
        except ValueError:
            out.append(pattern)
            continue
        found = [
            (iface.label, cls.name)
            for iface in policy.interfaces
            for q in ir.walk_qdiscs(iface.root)
            for cls, m in ir.matches_of(q)
            if cls is not None and _takes(m, address)
        ]
        if not found:
            raise NoSuchClass(pattern, f"no class's match line takes packets from or to {pattern}")
        for label, name in found:
            picks.setdefault(label, set()).add(name)
    return list(dict.fromkeys(out)), {label: frozenset(names) for label, names in picks.items()}


def _takes(m: ir.Match, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a line tests ``src`` or ``dst`` for a network holding ``address``."""
    return any(
        isinstance(cond, ir.AddrCond)
        and any(net.version == address.version and address in net for net, _ in cond.networks)
        for cond in m.conds
    )


def select(
    report: Report, patterns: Sequence[str] = (), top: int | None = None, picks: Picks | None = None
) -> Report:
    """The report with the classes asked for: those whose name, class id or title matches
    one of the shell-style ``patterns`` (``c10*``, ``north``, ``*Campfire*``), with the
    classes below them, and those ``picks`` names in their tree, alone (every class without
    patterns or picks); with ``top``, only the ``top`` leaf classes of those in each tree
    that are busiest now (by the rate now, then the average, then bytes). The classes above
    a class shown are shown too, so that it shows where it sits; a tree with none of its
    classes matched is left out. ``NoSuchClass`` for a pattern that matches nothing."""
    asked = bool(patterns or picks)
    if not asked and top is None:
        return report
    trees: list[TreeStatus] = []
    matched: set[str] = set()
    for tree in report.trees:
        rows = tree.classes
        chosen = _matching(rows, patterns, matched) if asked else set(range(len(rows)))
        picked = picks.get(tree.label, frozenset()) if picks else frozenset()
        chosen |= {i for i, row in enumerate(rows) if row.name in picked}
        if asked and not chosen:
            continue
        if top is not None:
            leaves = [i for i in sorted(chosen) if not _has_children(rows, i)]
            leaves.sort(key=lambda i: _busy(rows[i]), reverse=True)  # stable: tree order
            chosen = set(leaves[:top])
        shown = _with_parents(rows, chosen)
        classes = tuple(rows[i] for i in sorted(shown))
        trees.append(dataclasses.replace(tree, classes=classes, hidden=len(rows) - len(classes)))
    missing = [p for p in patterns if p not in matched]
    if missing:
        raise NoSuchClass(missing[0])
    return dataclasses.replace(report, trees=tuple(trees))


def _matching(rows: Sequence[ClassStatus], patterns: Sequence[str], matched: set[str]) -> set[int]:
    """The rows a pattern matches and the rows below them; the patterns that matched go
    into ``matched``."""
    chosen: set[int] = set()
    below: int | None = None  # the depth of the matched row whose subtree this is
    # A subscriber table's circuit id ('1001', 'A-1') names its circuit's class ('c1001',
    # 'A_1_98d17d0a41'; in a tree's later tables, and where a written class has that name,
    # followed by a digest of its table and id, and '_2' on a digest's collision): support
    # calls name the id (found by a tester: only the class name was found).
    ids = {
        p: re.compile(re.escape(circuit_name(p)) + r"(?:_[0-9a-f]{10})?(?:_[0-9]+)?")
        for p in patterns
        if not _GLOB.search(p)
    }
    for i, row in enumerate(rows):
        if below is not None and row.depth <= below:
            below = None
        hits = [p for p in patterns if _names(row, p) or (p in ids and ids[p].fullmatch(row.name))]
        matched.update(hits)
        if hits and below is None:
            below = row.depth
        if below is not None:
            chosen.add(i)
    return chosen


_GLOB = re.compile(r"[*?\[]")


def _names(row: ClassStatus, pattern: str) -> bool:
    """Whether ``pattern`` matches the row's name or class id, or its title in any case (a
    Circuit Name is written as people write addresses: 'campfire' finds 'Campfire St.')."""
    return (
        fnmatchcase(row.name, pattern)
        or fnmatchcase(row.classid, pattern)
        or (row.title is not None and fnmatchcase(row.title.casefold(), pattern.casefold()))
    )


def _has_children(rows: Sequence[ClassStatus], i: int) -> bool:
    return i + 1 < len(rows) and rows[i + 1].depth > rows[i].depth


def _busy(row: ClassStatus) -> tuple[int, int, int]:
    bytes_ = row.counters.stats.bytes if row.counters is not None else -1
    now = row.rate_now if row.rate_now is not None else -1
    return now, row.rate_avg if row.rate_avg is not None else -1, bytes_


def _with_parents(rows: Sequence[ClassStatus], chosen: set[int]) -> set[int]:
    """``chosen`` and the rows above each (rows are in pre-order, with their depth)."""
    shown = set(chosen)
    path: list[int] = []  # the rows above the current one, one per depth
    for i, row in enumerate(rows):
        del path[row.depth :]
        if i in chosen:
            shown.update(path)
        path.append(i)
    return shown


# ==== rendering: JSON ==========================================================================


def _xstats_json(xstats: XStats) -> dict[str, int]:
    return dict(xstats)


def _leaf_json(leaf: QdiscCounters | None) -> dict[str, object] | None:
    if leaf is None:
        return None
    s = leaf.stats
    return {
        "kind": leaf.kind,
        "handle": leaf.handle,
        "bytes": s.bytes,
        "packets": s.packets,
        "drops": s.drops,
        "overlimits": s.overlimits,
        "requeues": s.requeues,
        "backlog_bytes": s.backlog_bytes,
        "backlog_packets": s.backlog_packets,
        "flows": leaf.flows,
        "xstats": _xstats_json(leaf.xstats),
        "tins": [_xstats_json(t) for t in leaf.tins],
    }


def _class_json(row: ClassStatus) -> dict[str, object]:
    c = row.counters
    htb = c.htb if c is not None else None
    out: dict[str, object] = {
        "name": row.name,
        "title": row.title,
        "classid": row.classid,
        "parent": row.parent,
        "depth": row.depth,
        "file": row.file,
        "line": row.line,
        "state": row.state,
        "kind": c.kind if c is not None else None,
        "rate": row.rate,
        "ceil": row.ceil,
        "rate_now": row.rate_now,
        "rate_avg": row.rate_avg,
    }
    for key in ("bytes", "packets", "drops", "overlimits", "requeues"):
        out[key] = getattr(c.stats, key) if c is not None else None
    out["backlog_bytes"] = c.stats.backlog_bytes if c is not None else None
    out["backlog_packets"] = c.stats.backlog_packets if c is not None else None
    out["htb"] = (
        None
        if htb is None
        else {
            "lended": htb.lended,
            "borrowed": htb.borrowed,
            "giants": htb.giants,
            "tokens": htb.tokens,
            "ctokens": htb.ctokens,
        }
    )
    out["leaf"] = _leaf_json(row.leaf)
    return out


def report_json(report: Report) -> dict[str, object]:
    """The report as JSON data (keys in docs/operations.md)."""
    return {
        "policy": report.policy,
        "elapsed": round(report.elapsed, 3),
        "interval": round(report.interval, 3),
        "trees": [
            {
                "device": t.device,
                "label": t.label,
                "kind": t.kind,
                "handle": t.handle,
                "state": t.state,
                "rate_now": t.rate_now,
                "rate_avg": t.rate_avg,
                "qdisc": _leaf_json(t.root),
                "classes": [_class_json(row) for row in t.classes],
                "hidden": t.hidden,
            }
            for t in report.trees
        ],
    }


def render_json(report: Report) -> str:
    """One line of JSON (sorted keys) and a newline."""
    return json.dumps(report_json(report), sort_keys=True, separators=(",", ":")) + "\n"


# ==== rendering: Prometheus ====================================================================


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family of the Prometheus output."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    value: Callable[[ClassStatus], int | None]


def _stat(key: str) -> Callable[[ClassStatus], int | None]:
    def value(row: ClassStatus) -> int | None:
        return getattr(row.counters.stats, key) if row.counters is not None else None

    return value


def _htb(key: str) -> Callable[[ClassStatus], int | None]:
    def value(row: ClassStatus) -> int | None:
        htb = row.counters.htb if row.counters is not None else None
        return getattr(htb, key) if htb is not None else None

    return value


CLASS_METRICS = (
    Metric("tcdsl_class_applied", "gauge", "1 if the kernel has the class, 0 if the policy's "
           "class is not applied", lambda r: int(r.counters is not None)),
    Metric("tcdsl_class_bytes_total", "counter", "Bytes the class sent", _stat("bytes")),
    Metric("tcdsl_class_packets_total", "counter", "Packets the class sent", _stat("packets")),
    Metric("tcdsl_class_drops_total", "counter", "Packets the class dropped", _stat("drops")),
    Metric("tcdsl_class_overlimits_total", "counter", "Times the class was over its limit",
           _stat("overlimits")),
    Metric("tcdsl_class_requeues_total", "counter", "Packets requeued", _stat("requeues")),
    Metric("tcdsl_class_backlog_bytes", "gauge", "Bytes queued", _stat("backlog_bytes")),
    Metric("tcdsl_class_backlog_packets", "gauge", "Packets queued", _stat("backlog_packets")),
    Metric("tcdsl_class_rate_bits_per_second", "gauge", "The rate the policy gives the class",
           lambda r: r.rate),
    Metric("tcdsl_class_ceil_bits_per_second", "gauge", "The ceil the policy gives the class",
           lambda r: r.ceil),
    Metric("tcdsl_class_throughput_bits_per_second", "gauge",
           "What the class sent per second over the last interval", lambda r: r.rate_now),
    Metric("tcdsl_class_lended_total", "counter", "htb: packets sent on the class's own rate",
           _htb("lended")),
    Metric("tcdsl_class_borrowed_total", "counter", "htb: packets sent on borrowed tokens",
           _htb("borrowed")),
    Metric("tcdsl_class_giants_total", "counter", "htb: packets larger than the class's mtu",
           _htb("giants")),
    Metric("tcdsl_class_tokens", "gauge", "htb: rate tokens left (kernel units)", _htb("tokens")),
    Metric("tcdsl_class_ctokens", "gauge", "htb: ceil tokens left (kernel units)",
           _htb("ctokens")),
)  # fmt: skip
"""The per-class metrics, in the order they are written."""

LEAF_STAT = "tcdsl_leaf_stat"
LEAF_TIN_STAT = "tcdsl_leaf_tin_stat"
LEAF_FLOWS = "tcdsl_leaf_flows"


def escape_label(value: str) -> str:
    """A label value as the exposition format writes it: ``\\``, ``"`` and newlines escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs) + "}"


def render_prometheus(report: Report) -> str:
    """The report in the Prometheus text exposition format (node_exporter's textfile
    collector): each family's ``# HELP`` and ``# TYPE``, then its samples."""
    policy = report.policy or ""
    rows = [
        (
            t,
            row,
            [
                ("interface", t.device),
                ("class", row.name),
                ("classid", row.classid),
                ("policy", policy),
                # (a label with an empty value is no label: left out where there is none)
                *([("title", row.title)] if row.title is not None else []),
            ],
        )
        for t in report.trees
        for row in t.classes
    ]
    out: list[str] = []

    def family(name: str, kind: str, text: str, samples: list[str]) -> None:
        if samples:
            out.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples])

    for m in CLASS_METRICS:
        samples = []
        for _, row, labels in rows:
            value = m.value(row)
            if value is not None:
                samples.append(f"{m.name}{_labels(labels)} {value}")
        family(m.name, m.kind, m.help, samples)
    flows, stats, tins = [], [], []
    for _, row, labels in rows:
        if row.leaf is None:
            continue
        leaf = [*labels, ("kind", row.leaf.kind)]
        if row.leaf.kind in ("sfq", "fq_codel", "cake"):
            flows.append(f"{LEAF_FLOWS}{_labels(leaf)} {row.leaf.flows}")
        for key, value in row.leaf.xstats:
            stats.append(f"{LEAF_STAT}{_labels([*leaf, ('stat', key)])} {value}")
        for i, tin in enumerate(row.leaf.tins):
            for key, value in tin:
                tin_labels = [*leaf, ("tin", str(i)), ("stat", key)]
                tins.append(f"{LEAF_TIN_STAT}{_labels(tin_labels)} {value}")
    family(LEAF_FLOWS, "gauge", "Flows the class's sfq, fq_codel or cake lists as active", flows)
    family(LEAF_STAT, "gauge", "The leaf qdisc's extended statistics, as tc names them", stats)
    family(LEAF_TIN_STAT, "gauge", "cake: each tin's statistics, as tc names them", tins)
    return "\n".join(out) + "\n" if out else ""


# ==== rendering: text ==========================================================================

BAR = 10
"""Characters of a load bar."""
WIDTH = 180
"""Columns of the text table when the output is not a terminal."""


def _three_digits(n: int, scales: Sequence[tuple[str, int]]) -> str | None:
    """``n`` in three significant digits of the largest scale it reaches, or None."""
    for suffix, scale in scales:
        value = float(f"{n / scale:.3g}")
        if abs(value) >= 1:
            return (f"{value:g}" if abs(value) < 1000 else f"{value:.0f}") + suffix
    return None


def approx_rate(bits_per_second: int | None) -> str:
    """A measured rate in three significant digits (``3.46mbit``); ``-`` for None."""
    if bits_per_second is None:
        return "-"
    scales = (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3))
    return _three_digits(bits_per_second, scales) or f"{bits_per_second}bit"


def approx_count(n: int | None, unit: str = "") -> str:
    """A count exactly below 10000, else in three significant digits and a decimal suffix
    (``38.9k``, ``3.74M``); ``-`` for None."""
    if n is None:
        return "-"
    short = _three_digits(n, (("G", 10**9), ("M", 10**6), ("k", 10**3)))
    return f"{short}{unit}" if abs(n) >= 10_000 and short is not None else f"{n}{unit}"


def bar(row: ClassStatus, width: int = BAR) -> str:
    """``[#####|....]``: the rate now against the class's ceil (or rate), ``|`` at its rate
    when it has a ceil above it; empty without a limit or a measured rate."""
    limit = row.limit
    if limit is None or limit <= 0 or row.rate_now is None:
        return ""
    filled = min(width, round(row.rate_now * width / limit))
    cells = ["#"] * filled + ["."] * (width - filled)
    if row.rate is not None and row.ceil is not None and row.rate < row.ceil:
        at = min(width - 1, row.rate * width // row.ceil)
        if cells[at] == ".":
            cells[at] = "|"
    return "[" + "".join(cells) + "]"


FQ_CODEL_SUMMARY = (("new", "new_flows_len"), ("old", "old_flows_len"), ("ecn", "ecn_mark"))
"""What the text table shows of an fq_codel's statistics (word, tc's key)."""
CAKE_SUMMARY = (
    ("sparse", "sparse_flows"),
    ("bulk", "bulk_flows"),
    ("unresp", "unresponsive_flows"),
    ("ecn", "ecn_mark"),
)
"""What the text table shows of a cake's statistics, summed over its tins."""


def _leaf_text(leaf: QdiscCounters | None) -> str:
    if leaf is None:
        return ""
    parts = [leaf.kind]
    if leaf.kind in ("sfq", "fq_codel"):
        parts.append(f"flows {leaf.flows}")
    if leaf.kind == "fq_codel":
        xs = dict(leaf.xstats)
        parts += [f"{word} {xs.get(key, 0)}" for word, key in FQ_CODEL_SUMMARY]
    if leaf.kind == "cake":
        tins = [dict(t) for t in leaf.tins]
        parts += [f"{word} {sum(t.get(key, 0) for t in tins)}" for word, key in CAKE_SUMMARY]
    return " ".join(parts)


COLUMNS = (
    "class", "id", "line", "rate/ceil", "now", "load", "avg", "pkts", "bytes", "drops",
    "overlim", "backlog", "lent/borr", "tok/ctok", "leaf",
)  # fmt: skip
"""The text table's columns."""
_RIGHT = frozenset({"now", "avg", "pkts", "bytes", "drops", "overlim", "backlog"})


def _pair(a: int | None, b: int | None, text: Callable[[int | None], str]) -> str:
    return f"{text(a)}/{text(b)}"


TITLE = 32
"""Characters of a class's title the text table shows (JSON and Prometheus give it whole)."""


def _cells(row: ClassStatus, policy: str | None = None) -> list[str]:
    c = row.counters
    name = "  " * row.depth + row.name
    if row.title is not None:
        title = row.title if len(row.title) <= TITLE else row.title[: TITLE - 3] + "..."
        name += f" {title}"
    if row.state == "not in policy":
        name += " (not in policy)"
    limits = _pair(row.rate, row.ceil, lambda v: format_rate(v) if v is not None else "-")
    line = "-" if row.line is None else str(row.line)
    if row.line is not None and row.file is not None and row.file != policy:
        # a subscriber table's row (or an included file's line): its file names it
        line = f"{PurePath(row.file).name}:{row.line}"
    if c is None:
        return [name, row.classid, line, limits, "not applied", *[""] * 10]
    s, htb = c.stats, c.htb
    return [
        name, row.classid, line, limits, approx_rate(row.rate_now), bar(row),
        approx_rate(row.rate_avg), approx_count(s.packets), approx_count(s.bytes, "B"),
        approx_count(s.drops), approx_count(s.overlimits),
        f"{approx_count(s.backlog_bytes, 'B')}/{s.backlog_packets}p",
        _pair(htb.lended, htb.borrowed, approx_count) if htb else "-",
        _pair(htb.tokens, htb.ctokens, approx_count) if htb else "-",
        _leaf_text(row.leaf),
    ]  # fmt: skip


def _tree_title(tree: TreeStatus) -> str:
    return _tree_head(tree) + (
        f"  ({len(tree.classes)} of {len(tree.classes) + tree.hidden} classes shown)"
        if tree.hidden
        else ""
    )


def _tree_head(tree: TreeStatus) -> str:
    head = f"{tree.label}: {tree.kind} {tree.handle}"
    if tree.state != "ok":
        return f"{head} not applied"
    root = tree.root
    if root is None:
        return f"{head} (no qdisc)"
    s = root.stats
    parts = [
        f"now {approx_rate(tree.rate_now)}",
        f"avg {approx_rate(tree.rate_avg)}",
        f"{approx_count(s.packets)} packets",
        f"{approx_count(s.drops)} dropped",
        f"backlog {approx_count(s.backlog_bytes, 'B')}/{s.backlog_packets}p",
    ]
    leaf = _leaf_text(root) if root.kind in ("sfq", "fq_codel", "cake") else ""
    return f"{head}  " + ", ".join(parts) + (f"  ({leaf})" if leaf else "")


def render_text(report: Report, width: int = WIDTH, unicode: bool = False) -> str:
    """The report as tables, one per tree, ``width`` columns wide (box lines in ASCII unless
    ``unicode``), without colours or terminal codes."""
    what = report.policy if report.policy is not None else "the kernel's tree"
    out = [
        _rich_text(
            f"tcdsl status: {what}, over {report.interval:.1f}s (session {report.elapsed:.1f}s)",
            width,
        )
    ]
    for tree in report.trees:
        rows = [_cells(row, report.policy) for row in tree.classes]
        if not rows:
            rows = [["(no classes)", *[""] * (len(COLUMNS) - 1)]]
        title = _tree_title(tree)
        plain = _plain_table(title, rows, width, unicode)
        out.append(plain if plain is not None else _rich_table(title, rows, width, unicode))
    return "".join(out)


def _rich_text(what: object, width: int) -> str:
    """``what`` (a rich renderable or a string) as rich prints it, lines without trailing
    blanks."""
    from rich.console import Console
    from rich.text import Text

    buffer = StringIO()
    console = Console(
        file=buffer,
        width=width,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        force_interactive=False,
        legacy_windows=False,
        emoji=False,
        highlight=False,
        markup=False,
    )
    console.print(Text(what) if isinstance(what, str) else what)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def _rich_table(title: str, rows: Sequence[Sequence[str]], width: int, unicode: bool) -> str:
    """A tree's table drawn by rich, which folds cells and wraps the title to fit ``width``."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=Text(title),
        title_justify="left",
        box=box.SIMPLE_HEAD if unicode else box.ASCII2,
        safe_box=not unicode,
        show_edge=False,
        collapse_padding=True,
    )
    for column in COLUMNS:
        justify: Literal["left", "right"] = "right" if column in _RIGHT else "left"
        # folded, never cut with an ellipsis (not ASCII); the leaf's words may wrap
        table.add_column(column, justify=justify, no_wrap=column != "leaf", overflow="fold")
    for cells in rows:
        table.add_row(*(Text(cell) for cell in cells))
    return _rich_text(table, width)


def _plain_table(
    title: str, rows: Sequence[Sequence[str]], width: int, unicode: bool
) -> str | None:
    """The table ``render_text`` has rich draw, drawn directly when each cell is one line of
    ASCII and the table fits in ``width`` as it is (None otherwise: rich folds and wraps).
    rich takes about 90 us a cell, 14 s for 10,000 subscribers' rows; this, 0.1 s."""
    texts = [COLUMNS, *rows]
    if not all(cell.isascii() and cell.isprintable() for cells in texts for cell in cells):
        return None
    if not rows or not title.strip() or not title.isascii() or not title.isprintable():
        return None
    widths = [max(map(len, column)) for column in zip(*texts, strict=True)]
    # rich's padding of 1 on each side collapses between columns: " a |b |c "
    total = 1 + sum(widths) + 2 * len(widths) - 1
    if total > width or len(title) > total:
        return None
    bar, cross, rule = (" ", "\u2500", "\u2500") if unicode else ("|", "+", "-")

    def line(cells: Sequence[str]) -> str:
        parts = [
            # rich drops a right-justified cell's trailing blanks (it still measures them)
            (cell.rstrip().rjust(w) if name in _RIGHT else cell.ljust(w)) + " "
            for name, cell, w in zip(COLUMNS, cells, widths, strict=True)
        ]
        return " " + bar.join(parts)

    head = [
        line(COLUMNS),
        (rule * (widths[0] + 2)) + "".join(cross + rule * (w + 1) for w in widths[1:]),
    ]
    return "".join(text.rstrip() + "\n" for text in [title, *head, *map(line, rows)])
