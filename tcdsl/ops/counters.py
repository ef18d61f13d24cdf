"""Read the live counters of a device from the kernel: what ``tc -s`` shows per qdisc and class.

Qdiscs come from ``tc -s -j qdisc show dev X``. Classes come from ``tc -s class show dev X`` as
text: iproute2 6.1 prints classes as text even with ``-j`` (``tc_class.c`` opens no JSON
object; checked on this host and in the Debian 6.1 guest), so the class lines are read by
``tcdsl.verify.readback.parse_classes`` and the statistics lines below each by this module.

What tc 6.1 prints, as captured in ``tests/ops_data/``:

- every qdisc object: ``bytes``, ``packets``, ``drops``, ``overlimits``, ``requeues``,
  ``backlog`` (bytes), ``qlen`` (packets); htb's ``options.direct_packets_stat``;
- fq_codel's extended statistics flat in the qdisc object (``maxpacket``, ``drop_overlimit``,
  ``new_flow_count``, ``ecn_mark``, ``new_flows_len``, ``old_flows_len``; newer kernels add
  ``ce_mark``, ``memory_used``, ``drop_overmemory``);
- cake's flat too (``memory_used``, ``capacity_estimate``, ...) plus ``tins``, one object per
  tin (``sent_bytes``, ``drops``, ``sparse_flows``, ``bulk_flows``, ...);
- a class: ``Sent B bytes P pkt (dropped D, overlimits O requeues R)``, ``backlog 32302b 31p``
  (the size in tc's units, rounded above 1 KiB), for htb ``lended: L borrowed: B giants: G``
  and ``tokens: T ctokens: C`` (signed: a class in debt has negative tokens);
- sfq, fq_codel and cake list one class per active flow (``class fq_codel 10:f0 parent 10:``,
  without a ``Sent`` line): these are counted as the qdisc's ``flows``, not kept as classes.

Every number is kept as tc gives it, in base units (bytes, packets); unknown keys and lines are
skipped, so a newer tc that prints more still parses.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tcdsl.verify.readback import parse_classes, parse_size

FLOW_KINDS = frozenset({"sfq", "fq_codel", "cake"})
"""Qdiscs whose classes tc lists are their active flows, not classes anyone configured."""

TIMEOUT = 20
"""Seconds a ``tc`` command may take."""


@dataclass(frozen=True, slots=True)
class Stats:
    """The counters every qdisc and class has."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0
    backlog_bytes: int = 0
    backlog_packets: int = 0


@dataclass(frozen=True, slots=True)
class HtbStats:
    """An htb class's extended statistics (``tc -s``: lended, borrowed, giants, tokens)."""

    lended: int
    """Packets this class sent on its own rate while it lent to others (tc's word)."""
    borrowed: int
    """Packets sent on tokens borrowed from an ancestor."""
    giants: int
    """Packets larger than the class's mtu."""
    tokens: int
    """Rate tokens left, in the kernel's units (negative: in debt)."""
    ctokens: int
    """Ceil tokens left."""


XStats = tuple[tuple[str, int], ...]
"""Extended statistics as tc names them, in the order it prints them."""


@dataclass(frozen=True, slots=True)
class QdiscCounters:
    """One qdisc's counters."""

    kind: str
    handle: str
    """As tc prints it: ``1:``."""
    parent: str
    """``root``, a class id such as ``1:10``, or tc's parent id (``ffff:fff1`` for ingress)."""
    stats: Stats
    xstats: XStats = ()
    """The kind's extended statistics (fq_codel, cake; htb's ``direct_packets_stat``)."""
    tins: tuple[XStats, ...] = ()
    """cake: each tin's statistics, lowest priority tin first as tc lists them."""
    flows: int = 0
    """Flows tc lists as classes of an sfq, fq_codel or cake (the active ones)."""


@dataclass(frozen=True, slots=True)
class ClassCounters:
    """One class's counters and the configuration tc shows with them."""

    kind: str
    classid: str
    parent: str
    """``root`` or the parent's id (a class, or the qdisc as ``1:``)."""
    leaf: str | None
    """The handle of the qdisc below (``10:``); None for inner classes and default qdiscs."""
    rate: int | None
    """The configured rate in bits/s (htb, cbq), None for kinds without one."""
    ceil: int | None
    stats: Stats
    htb: HtbStats | None = None


@dataclass(frozen=True, slots=True)
class DeviceCounters:
    """Everything tc counts on one device at one moment."""

    device: str
    at: float
    """``time.monotonic()`` when the reading was taken."""
    qdiscs: tuple[QdiscCounters, ...]
    classes: tuple[ClassCounters, ...]
    _by_handle: dict[str, QdiscCounters] = field(init=False, repr=False, compare=False)
    _by_classid: dict[str, ClassCounters] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # status looks up every class of a policy: 10,000 subscribers would be 10^8 steps
        by_handle: dict[str, QdiscCounters] = {}
        for q in self.qdiscs:
            by_handle.setdefault(q.handle, q)  # the first, as tc lists them (mq's 0: children)
        by_classid: dict[str, ClassCounters] = {}
        for c in self.classes:
            by_classid.setdefault(c.classid, c)
        object.__setattr__(self, "_by_handle", by_handle)
        object.__setattr__(self, "_by_classid", by_classid)

    def qdisc(self, handle: str) -> QdiscCounters | None:
        """The qdisc with this handle (``1:``), or None."""
        return self._by_handle.get(handle)

    def klass(self, classid: str) -> ClassCounters | None:
        """The class with this id (``1:10``), or None."""
        return self._by_classid.get(classid)


class CountersError(Exception):
    """tc could not read a device's counters; the message says why."""


class NoSuchDevice(CountersError):
    """The device does not exist (here, or in the network namespace asked for)."""

    def __init__(self, device: str) -> None:
        super().__init__(f"device '{device}' does not exist")
        self.device = device


# ==== parsing ==================================================================================

_COMMON = frozenset(
    {"kind", "handle", "parent", "root", "refcnt", "options", "tins"}
    | {"bytes", "packets", "drops", "overlimits", "requeues", "backlog", "qlen"}
)


def _int(value: object) -> int:
    """A JSON counter: an int (not a bool), anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _xstats(obj: Mapping[str, object], skip: frozenset[str] = frozenset()) -> XStats:
    """The integer fields of ``obj`` not in ``skip``, in tc's order."""
    return tuple(
        (key, value)
        for key, value in obj.items()
        if key not in skip and isinstance(value, int) and not isinstance(value, bool)
    )


def _qdisc(obj: Mapping[str, object]) -> QdiscCounters:
    stats = Stats(
        bytes=_int(obj.get("bytes")),
        packets=_int(obj.get("packets")),
        drops=_int(obj.get("drops")),
        overlimits=_int(obj.get("overlimits")),
        requeues=_int(obj.get("requeues")),
        backlog_bytes=_int(obj.get("backlog")),
        backlog_packets=_int(obj.get("qlen")),
    )
    xstats = _xstats(obj, _COMMON)
    options = obj.get("options")
    if obj.get("kind") == "htb" and isinstance(options, dict):
        xstats = (("direct_packets_stat", _int(options.get("direct_packets_stat"))), *xstats)
    tins = obj.get("tins")
    parent = "root" if obj.get("root") is True else str(obj.get("parent", "?"))
    return QdiscCounters(
        kind=str(obj.get("kind", "?")),
        handle=str(obj.get("handle", "?")),
        parent=parent,
        stats=stats,
        xstats=xstats,
        tins=tuple(_xstats(t) for t in tins if isinstance(t, dict))
        if isinstance(tins, list)
        else (),
    )


def parse_qdisc_json(text: str) -> tuple[QdiscCounters, ...]:
    """Parse ``tc -s -j qdisc show dev X`` (an empty output is no qdiscs)."""
    if not text.strip():
        return ()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CountersError(f"tc printed qdiscs that are not JSON: {err}") from None
    if not isinstance(data, list):
        raise CountersError("tc printed qdiscs as JSON that is not a list")
    return tuple(_qdisc(obj) for obj in data if isinstance(obj, dict))


_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt")
_DROPPED = re.compile(r"\(dropped (\d+), overlimits (\d+) requeues (\d+)\)")
_BACKLOG = re.compile(r"backlog (\S+) (\d+)p")
_LENDED = re.compile(r"lended: (\d+) borrowed: (\d+) giants: (\d+)")
_TOKENS = re.compile(r"tokens: (-?\d+) ctokens: (-?\d+)")


def _class_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """Each ``class ...`` line with the indented lines below it."""
    head: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("class "):
            if head is not None:
                yield head, body
            head, body = line, []
        elif head is not None and line.strip():
            body.append(line)
    if head is not None:
        yield head, body


def _class_stats(lines: Sequence[str]) -> tuple[Stats, HtbStats | None]:
    text = "\n".join(lines)
    sent = _SENT.search(text)
    dropped = _DROPPED.search(text)
    backlog = _BACKLOG.search(text)
    backlog_bytes = 0
    if backlog is not None:
        try:
            backlog_bytes = parse_size(backlog.group(1))
        except ValueError:
            backlog_bytes = 0
    stats = Stats(
        bytes=int(sent.group(1)) if sent else 0,
        packets=int(sent.group(2)) if sent else 0,
        drops=int(dropped.group(1)) if dropped else 0,
        overlimits=int(dropped.group(2)) if dropped else 0,
        requeues=int(dropped.group(3)) if dropped else 0,
        backlog_bytes=backlog_bytes,
        backlog_packets=int(backlog.group(2)) if backlog else 0,
    )
    lended, tokens = _LENDED.search(text), _TOKENS.search(text)
    htb = None
    if lended is not None and tokens is not None:
        a, b, c = (int(g) for g in lended.groups())
        htb = HtbStats(a, b, c, int(tokens.group(1)), int(tokens.group(2)))
    return stats, htb


def _configured(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_class_stats(text: str) -> tuple[tuple[ClassCounters, ...], dict[str, int]]:
    """Parse ``tc -s class show dev X``: the classes, and per qdisc handle the number of flows
    an sfq, fq_codel or cake lists as classes (``FLOW_KINDS``)."""
    classes: list[ClassCounters] = []
    flows: dict[str, int] = {}
    for head, body in _class_blocks(text):
        parsed = parse_classes(head)
        if not parsed:
            continue
        cls = parsed[0]
        if cls.kind in FLOW_KINDS:
            owner = cls.classid.split(":", 1)[0] + ":"
            flows[owner] = flows.get(owner, 0) + 1
            continue
        stats, htb = _class_stats(body)
        options = cls.options
        rate = options.get("rate")
        ceil = options.get("ceil")
        classes.append(
            ClassCounters(
                kind=cls.kind,
                classid=cls.classid,
                parent=cls.parent,
                leaf=cls.leaf,
                rate=_configured(rate.value) if rate is not None else None,
                ceil=_configured(ceil.value) if ceil is not None else None,
                stats=stats,
                htb=htb,
            )
        )
    return tuple(classes), flows


def device_counters(device: str, at: float, qdisc_json: str, class_text: str) -> DeviceCounters:
    """Join what ``tc -s -j qdisc show`` and ``tc -s class show`` printed for ``device``."""
    classes, flows = parse_class_stats(class_text)
    qdiscs = tuple(
        replace(q, flows=flows[q.handle]) if q.handle in flows else q
        for q in parse_qdisc_json(qdisc_json)
    )
    return DeviceCounters(device, at, qdiscs, classes)


# ==== reading the kernel =======================================================================


def _tc(args: Sequence[str], device: str, netns: str | None) -> str:
    argv = ["tc", *(("-n", netns) if netns else ()), *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        raise CountersError("'tc' (iproute2) is not installed") from None
    except subprocess.TimeoutExpired:
        raise CountersError(f"'{' '.join(argv)}' did not finish in {TIMEOUT} s") from None
    if proc.returncode != 0:
        if "Cannot find device" in proc.stderr:
            raise NoSuchDevice(device)
        message = proc.stderr.strip() or f"exit {proc.returncode}"
        raise CountersError(f"'{' '.join(argv)}' failed: {message}")
    return proc.stdout


def read_device(device: str, netns: str | None = None) -> DeviceCounters:
    """Read ``device``'s qdisc and class counters now (in network namespace ``netns``, or in
    this process's); raises ``NoSuchDevice`` or ``CountersError``."""
    before = time.monotonic()
    qdiscs = _tc(["-s", "-j", "qdisc", "show", "dev", device], device, netns)
    classes = _tc(["-s", "class", "show", "dev", device], device, netns)
    at = (before + time.monotonic()) / 2
    return device_counters(device, at, qdiscs, classes)
