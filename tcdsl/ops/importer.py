"""``tcdsl import``: a policy that builds the kernel state tc shows of an interface.

The input is what ``tc`` shows of the interface (:mod:`tcdsl.ops.tctext`, parsed by
:mod:`tcdsl.verify.readback`); the output is a policy in which every qdisc keeps its handle and
every class its id (``class c1_10 id 1:10``: names are derived from the ids), with the
parameters tc shows, and the u32 and fw filters written back as match lines and ``classify by
mark``. IPv4 and IPv6 filters that are exactly what one dual-stack line gives become one line.

What the language cannot say (a qdisc kind it lacks, a parameter it cannot set, a filter kind
or an action it has not, hash tables) is a warning located at the line of tc's text (W610-W619)
and a comment at its place in the policy: nothing is dropped silently. Problems that leave
nothing to write are errors (E602, E605-E608). The output is deterministic: the same text gives the
same policy.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import operator
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tcdsl import __version__, ir
from tcdsl.commands import REDIRECT_PREF
from tcdsl.diagnostics import Diagnostic, Span
from tcdsl.lower import range_to_masks
from tcdsl.ops.tctext import DeviceObjects, DeviceText, FilterEntry, objects
from tcdsl.ops.u32decode import (
    Cond,
    Undecodable,
    decode,
    flower_conds,
    has_ports,
    has_proto,
    key_order,
    ordered,
)
from tcdsl.tcmath import HTB_QUANTUM, TICKS_PER_US, U32_MAX, red_scell_log, red_wlog
from tcdsl.u32layout import HASH_MIN
from tcdsl.units import format_rate, format_size, format_time
from tcdsl.verify.expect import (
    codel_shown_time,
    expected_policy,
    htb_shown_burst,
    netem_shown_time,
    sprint_time,
    tbf_shown_size,
    tbf_ticks,
)
from tcdsl.verify.readback import (
    UNREADABLE_POLICE,
    Shown,
    TcClass,
    TcFilter,
    TcQdisc,
    parse_size,
    parse_time,
)

T = TypeVar("T")
INDENT = "    "
CLASSFUL = frozenset({"htb", "hfsc", "prio"})
CHAINING = frozenset({"tbf", "netem"})
LEAVES = frozenset(
    {"pfifo", "bfifo", "sfq", "fq_codel", "codel", "fq", "fq_pie", "red", "cake", "tbf", "netem"}
)
"""Kinds the language takes below a class (classful kinds too: they nest)."""
ROOTS = CLASSFUL | LEAVES | {"pfifo_fast"}
V6_PREF = 32768
"""tcdsl gives a line's IPv6 filters the line's pref + 32768 (one protocol per pref)."""
PRIOMAP = (1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
STAB_OVERHEAD = 14
"""A root's ``overhead N`` is a size table of N - 14 (the Ethernet header the kernel counts)."""


# ==== problems and the written policy ==========================================================


@dataclass(frozen=True, slots=True)
class Problem:
    """Something the policy cannot say, at a line of tc's text."""

    code: str
    message: str
    line: int


@dataclass
class Line:
    """A match line: its conditions, family, pref, policer and the filters it stands for."""

    conds: list[Cond]
    family: str
    """``ipv4``, ``ipv6`` or ``both``."""
    pref: int
    police: tuple[str, ...]
    classid: str
    seq: tuple[float, int]
    filters: list[tuple[str, int, int]]
    """(protocol, kernel pref, index in the parent's filter list), in the kernel's order."""
    police_index: str | None
    line: int


@dataclass
class Comment:
    """A problem, written where the construct would be."""

    problem: Problem


Item = Line | Comment


@dataclass
class Marks:
    """fw filters, written as ``classify by mark``."""

    pref: int
    mask: int | None
    families: set[str] = field(default_factory=set)
    marks: dict[str, int] = field(default_factory=dict)
    line: int = 0


@dataclass
class ClassNode:
    """A class of the tree being written."""

    cls: TcClass
    line: int
    children: list[ClassNode] = field(default_factory=list)
    leaf: QdiscNode | None = None
    items: list[Item] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)


@dataclass
class QdiscNode:
    """A qdisc of the tree being written."""

    q: TcQdisc
    line: int
    classes: list[ClassNode] = field(default_factory=list)
    child: QdiscNode | None = None
    notes: list[Problem] = field(default_factory=list)
    """Problems written as comments above it."""
    body_notes: list[Problem] = field(default_factory=list)
    """Problems written as comments at the top of its body."""
    marks: Marks | None = None
    family: str = "none"
    flower: bool = False
    linear: bool = False


@dataclass
class ImportResult:
    """A policy's text (None after errors), and the diagnostics, located in ``sources``."""

    policy: str | None
    diagnostics: list[Diagnostic]
    sources: dict[str, str]


def class_name(classid: str) -> str:
    """The name a class gets from its id: ``1:10`` -> ``c1_10`` (hex digits as tc prints)."""
    major, _, minor = classid.partition(":")
    return f"c{major or '0'}_{minor or '0'}"


def _major(handle: str) -> str:
    return handle.partition(":")[0]


def _hex(text: str) -> int:
    return int(text, 16) if text else 0


def _value(options: dict[str, Shown], key: str) -> object:
    shown = options.get(key)
    return None if shown is None else shown.value


# ==== values ===================================================================================


def _burst_size(rate_bits: int, shown: int, show: Callable[[int, int], int]) -> int:
    """A size that tc shows as ``shown`` after its round trip through a time at the rate
    (``show`` models it, non-decreasing in the size): ``shown`` itself where it does, else the
    least that does, else the one shown nearest to it (the model's floating point may be a
    byte off the kernel's); at most 2^32 - 1, tc's limit."""
    shown_at = min(shown, U32_MAX)
    if shown_at > 0 and show(rate_bits, shown_at) == shown:
        return shown_at
    least = max(_least(lambda n: show(rate_bits, n) >= shown), 1)
    candidates = [n for n in (least - 1, least) if 0 < n <= U32_MAX]
    return min(candidates, key=lambda n: (abs(show(rate_bits, n) - shown), n), default=shown_at)


def _htb_default_burst(rate_bits: int) -> int:
    """The burst tc gives an htb class without one: rate / hz + 1600 (hz is 10^9 since
    Linux's high-resolution psched clock)."""
    return htb_shown_burst(rate_bits, rate_bits // 8 // 1_000_000_000 + 1600)


def _pct(shown: Shown) -> str:
    return shown.text if shown.text.endswith("%") else f"{shown.value}%"


# ==== qdisc parameters =========================================================================


DEFAULT_QLEN = 1000
"""The txqueuelen of most devices (an Ethernet NIC's, a veth's), taken where the text does not
say its device's: an IFB's is 32."""


class _Params:
    """The words of one qdisc's line, and what could not be said."""

    def __init__(self, q: TcQdisc, line: int, qlen: int = DEFAULT_QLEN) -> None:
        self.q = q
        self.line = line
        self.qlen = qlen
        self.options = q.options
        self.words: list[str] = []
        self.problems: list[Problem] = []

    def add(self, *words: str) -> None:
        self.words += words

    def problem(self, message: str, code: str = "W611") -> None:
        self.problems.append(Problem(code, f"{self.q.kind} {self.q.handle} {message}", self.line))

    def unless(self, key: str, default: object, render: Callable[[Shown], str]) -> None:
        shown = self.options.get(key)
        if shown is not None and shown.value != default:
            self.add(key, render(shown))

    def unsupported(self, key: str, default: object, what: str | None = None) -> None:
        shown = self.options.get(key)
        if shown is not None and shown.value != default:
            self.problem(f"'{what or key} {shown.text}' has no word in the language; left out")


def _size(shown: Shown) -> str:
    assert isinstance(shown.value, int)
    return format_size(shown.value)


def _time(shown: Shown) -> str:
    assert isinstance(shown.value, int)
    return format_time(shown.value)


def _rate(shown: Shown) -> str:
    assert isinstance(shown.value, int)
    return format_rate(shown.value)


def _int(shown: Shown) -> str:
    return str(shown.value)


def _stab(p: _Params) -> None:
    """A root's size table as the link-layer words (``overhead`` counts the IP packet)."""
    o = p.options
    if "stab" not in o:
        return
    overhead = _value(o, "stab overhead")
    linklayer = _value(o, "stab linklayer")
    # tc leaves out an overhead of 0: the table is there all the same
    p.add("overhead", str((overhead if isinstance(overhead, int) else 0) + STAB_OVERHEAD))
    if isinstance(linklayer, str) and linklayer != "ethernet":
        p.add("linklayer", linklayer)
    p.unless("stab mpu", 0, _int)
    if (mpu := o.get("stab mpu")) is not None and mpu.value != 0:
        p.words[-2] = "mpu"
    for key, default in (("mtu", 2047), ("tsize", 512)):
        shown = o.get(f"stab {key}")
        if shown is not None and shown.value != default:
            p.add(key, str(shown.value))


def _htb(p: _Params, names: dict[str, str]) -> None:
    r2q = _value(p.options, "r2q")
    if isinstance(r2q, int):
        p.add("r2q", str(r2q))
    default = _value(p.options, "default")
    if isinstance(default, int) and default:
        classid = f"{_major(p.q.handle)}:{default:x}"
        if classid in names:
            p.add("default", names[classid])
        else:
            p.problem(f"'default {default:#x}' names no class ({classid}): left out")
    p.unsupported("direct_qlen", p.qlen)  # the device's txqueuelen when made without one


def _hfsc(p: _Params, names: dict[str, str]) -> None:
    default = _value(p.options, "default")
    if isinstance(default, int) and default:
        classid = f"{_major(p.q.handle)}:{default:x}"
        if classid in names:
            p.add("default", names[classid])
        else:
            p.problem(f"'default {default:x}' names no class ({classid}): left out")


def _prio(p: _Params) -> None:
    bands = _value(p.options, "bands")
    if isinstance(bands, int) and bands != 3:
        p.add("bands", str(bands))
    priomap = _value(p.options, "priomap")
    if isinstance(priomap, tuple) and priomap != PRIOMAP:
        p.add("priomap", *map(str, priomap))


def _tbf_latency(rate_bits: int, burst: int, peak: int, mtu: int, limit: int) -> float:
    """The latency (microseconds, before tc rounds it to print it) of a tbf of that limit
    (bytes), as ``tcdsl.verify.expect.tbf_shown_latency`` models it."""
    rate = rate_bits // 8
    latency = 1_000_000 * (limit / rate) - int(tbf_ticks(rate_bits, burst) / TICKS_PER_US)
    if peak:
        prate = peak // 8
        lat2 = 1_000_000 * (limit / prate) - int(tbf_ticks(peak, mtu) / TICKS_PER_US)
        latency = max(latency, lat2)
    return latency


def _least(predicate: Callable[[int], bool], high: int = U32_MAX) -> int:
    """The least n in [0, high] for which a monotone ``predicate`` holds (high if none)."""
    low = 0
    while low < high:
        mid = (low + high) // 2
        if predicate(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _tbf_limit(rate_bits: int, burst: int, peak: int, mtu: int, lat: Shown) -> int | None:
    """The least limit (bytes) for which tc prints the latency ``lat`` as it did, or None."""
    if rate_bits < 8 or (peak and peak < 8) or not isinstance(lat.value, int):
        return None
    value = lat.value
    # the least whole microsecond tc prints as this text
    first = _least(lambda t: parse_time(sprint_time(t)) >= value)
    for t in range(first, first + 2000):
        if sprint_time(t) == lat.text:
            break
    else:
        return None
    limit = _least(lambda n: _tbf_latency(rate_bits, burst, peak, mtu, n) >= t)
    latency = _tbf_latency(rate_bits, burst, peak, mtu, limit)
    return limit if latency >= 0 and sprint_time(latency) == lat.text else None


def _tbf(p: _Params) -> None:
    rate = _value(p.options, "rate")
    burst = _value(p.options, "burst")
    if not isinstance(rate, int) or not isinstance(burst, int):
        p.problem("no rate or burst shown: written without them")
        return
    burst = _burst_size(rate, burst, tbf_shown_size)
    p.add("rate", format_rate(rate), "burst", format_size(burst))
    peak = _value(p.options, "peakrate")
    mtu = 0
    if isinstance(peak, int):
        # the kernel takes a peak rate above the rate only: equal as shown (tc shows rates
        # rounded down), it was above by less than the last digit shown
        peak = max(peak, rate + 8)
        p.add("peakrate", format_rate(peak))
        shown = _value(p.options, "mtu")
        shown = shown if isinstance(shown, int) else _value(p.options, "minburst")
        # tc shows no mtu when it is under a tick at the peak rate: the least mtu is that
        mtu = _burst_size(peak, shown, tbf_shown_size) if isinstance(shown, int) else 1
        p.add("mtu", format_size(mtu))
    limit = _value(p.options, "limit")
    lat = p.options.get("lat")
    if not isinstance(limit, int) and lat is not None and isinstance(lat.value, int):
        limit = _tbf_limit(rate, burst, peak if isinstance(peak, int) else 0, mtu, lat)
        if limit is None:
            p.add("latency", format_time(lat.value))
    if isinstance(limit, int):
        p.add("limit", format_size(min(max(limit, 1), U32_MAX)))
    p.unsupported("overhead", 0)
    p.unsupported("linklayer", "ethernet")
    mpu = _mpu(p.q.words)
    if mpu:
        p.problem(f"'mpu {mpu}' has no word in the language; left out")


def _mpu(words: Sequence[str]) -> str | None:
    """The minimum packet unit a qdisc's or class's rate tables count (tc's ``mpu 64b``
    after a burst), None for none."""
    shown = _word_after(words, "mpu")
    return shown if shown not in (None, "0b", "0") else None


NETEM_TIMES = ("delay", "jitter", "slot", "slot_max")
NETEM_PERCENTS = (
    "delay_correlation",
    "loss",
    "loss_correlation",
    "duplicate",
    "duplicate_correlation",
    "corrupt",
    "corrupt_correlation",
    "reorder",
    "reorder_correlation",
)


def _netem(p: _Params) -> None:
    o = p.options
    p.unless("limit", 1000, _int)
    p.unless("delay", None, _through(netem_shown_time))
    p.unless("jitter", None, _through(netem_shown_time))
    for key in NETEM_PERCENTS:
        shown = o.get(key)
        if shown is None or shown.value == 0:
            continue
        if key in ("duplicate_correlation", "corrupt_correlation"):
            p.problem(f"'{key.replace('_', ' ')} {shown.text}' has no word in the language")
            continue
        p.add(key, _pct(shown))
    for key in ("gap", "packetoverhead", "cellsize"):
        p.unless(key, 0, _int)
    p.unless("rate", None, _rate)
    for key in ("slot", "slot_max"):
        p.unless(key, None, _time)
    if "ecn" in o:
        p.problem("'ecn' has no word in the language; left out")
    if "loss_model" in o:
        p.problem(f"'loss {o['loss_model'].text}' (a loss model) has no word in the language")


def _sfq(p: _Params) -> None:
    p.unless("perturb", 0, _int)
    p.unless("quantum", 1514, _size)
    p.unless("limit", 127, _int)
    p.unless("depth", 127, _int)
    p.unless("divisor", 1024, _int)
    limit = _value(p.options, "limit")
    # the kernel keeps no more flows than a limit given
    p.unsupported("flows", min(128, limit) if isinstance(limit, int) and limit != 127 else 128)
    if "headdrop" in p.options:
        p.problem("'headdrop' has no word in the language; left out")


def _through(show: Callable[[int], int]) -> Callable[[Shown], str]:
    """A time the kernel keeps in its own units (``show`` models what tc then prints): the
    nearest that tc prints as it did (at least 1us)."""

    def render(shown: Shown) -> str:
        assert isinstance(shown.value, int)
        value = shown.value
        for delta in range(0, 4096):
            for t in (value + delta, value - delta):
                if t > 0 and show(t) == value:
                    return format_time(t)
        return format_time(max(value, 1))

    return render


def _fq_codel(p: _Params) -> None:
    p.unless("limit", 10240, _int)
    p.unless("flows", 1024, _int)
    p.unless("target", 5000, _through(codel_shown_time))
    p.unless("interval", 100000, _through(codel_shown_time))
    p.unless("quantum", 1514, _int)
    p.unless("memory_limit", 32 * 1024 * 1024, _size)
    if "ecn" not in p.options:
        p.add("noecn")
    p.unsupported("drop_batch", 64)
    p.unsupported("ce_threshold", None)


def _codel(p: _Params) -> None:
    p.unless("limit", 1000, _int)
    p.unless("target", 5000, _through(codel_shown_time))
    p.unless("interval", 100000, _through(codel_shown_time))
    p.unless("ce_threshold", None, _time)
    if "ecn" in p.options:
        p.add("ecn")


def _fq(p: _Params) -> None:
    p.unless("limit", 10000, _int)
    p.unless("flow_limit", 100, _int)
    p.unless("quantum", 3028, _size)
    p.unless("initial_quantum", 15140, _size)
    p.unless("maxrate", None, _rate)
    p.unless("buckets", 1024, _int)
    p.unless("refill_delay", 40000, _time)
    p.unless("low_rate_threshold", 550000, _rate)
    p.unless("orphan_mask", 1023, _int)
    p.unless("ce_threshold", None, _time)
    p.unless("horizon", 10_000_000, _time)
    if "nopacing" in p.options:
        p.add("nopacing")
    if "horizon_cap" in p.options:
        p.add("horizon_cap")
    p.unsupported("timer_slack", 10)


RED_AVPKT = (1000, 1500, 1514, 500, 600, 256, 1024, 2000)
RED_BANDWIDTHS = (10**7, 10**8, 10**9, 10**6, 2 * 10**7, 5 * 10**7, 10**10, 5 * 10**6)


def _red(p: _Params, rates: Sequence[int]) -> None:
    o = p.options
    limit, qmin, qmax = (_value(o, k) for k in ("limit", "min", "max"))
    if not (isinstance(limit, int) and isinstance(qmin, int) and isinstance(qmax, int)):
        p.problem("no limit, min or max shown: written as shown")
        return
    p.add("limit", format_size(limit), "min", format_size(qmin), "max", format_size(qmax))
    probability = o.get("probability")
    if probability is not None:
        p.add("probability", probability.text)
    ewma, scell = _value(o, "ewma"), _value(o, "Scell_log")
    found: tuple[int, int] | None = None
    for avpkt in RED_AVPKT:
        burst = (2 * qmin + qmax) // (3 * avpkt)
        if red_wlog(qmin, burst, avpkt) != ewma:
            continue
        for bandwidth in (*RED_BANDWIDTHS, *rates):
            if red_scell_log(red_wlog(qmin, burst, avpkt) or 1, avpkt, bandwidth) == scell:
                found = (avpkt, bandwidth)
                break
        if found:
            break
    if found is None:
        found = (1000, 10**7)
        p.problem(
            "tc does not show red's avpkt, burst and bandwidth, and no usual value gives its "
            f"ewma {ewma} and Scell_log {scell}: written as avpkt 1000 bandwidth 10mbit"
        )
    p.add("avpkt", format_size(found[0]), "bandwidth", format_rate(found[1]))
    for flag in ("ecn", "harddrop", "adaptive"):
        if flag in o:
            p.add(flag)
    if "nodrop" in o:
        p.problem("'nodrop' has no word in the language; left out")


def _cake(p: _Params) -> None:
    o = p.options
    bandwidth = o.get("bandwidth")
    if bandwidth is not None:
        p.add("unlimited" if bandwidth.value == "unlimited" else "bandwidth")
        if bandwidth.value != "unlimited":
            p.add(_rate(bandwidth))
    for key in ("diffserv", "nat", "wash", "ack_filter", "split_gso"):
        shown = o.get(key)
        if shown is not None:
            p.add(str(shown.value))
    isolate = o.get("isolate")
    if isolate is not None:
        p.add("isolate", str(isolate.value))
    if _value(o, "mode") == "ingress":
        p.add("ingress")
    p.unless("rtt", 100000, _time)
    if "raw" not in o:
        overhead = o.get("overhead")
        if overhead is not None:
            p.add("overhead", str(overhead.value))
        atm = _value(o, "atm")
        if atm in ("atm", "ptm"):
            p.add("linklayer", str(atm))
        p.unless("mpu", 0, _int)
    p.unless("memlimit", None, _size)
    fwmark = _value(o, "fwmark")
    if isinstance(fwmark, int) and fwmark:
        p.add("fwmark", f"{fwmark:#x}")


def _fifo(p: _Params) -> None:
    limit = _value(p.options, "limit")
    if isinstance(limit, int):
        p.add("limit", format_size(min(limit, U32_MAX)) if p.q.kind == "bfifo" else str(limit))


def qdisc_words(
    q: TcQdisc,
    line: int,
    names: dict[str, str],
    root: bool,
    rates: Sequence[int] = (),
    stab_said: bool = False,
    qlen: int = DEFAULT_QLEN,
) -> tuple[list[str], list[Problem]]:
    """The words of a qdisc's line (``htb handle 1: r2q 10 default c1_20``) and the problems;
    ``stab_said``: its size table is written elsewhere (an mq queue's, on the mq's line);
    ``qlen``: its device's txqueuelen."""
    p = _Params(q, line, qlen)
    if q.handle == "0:":  # the kernel's own (an mq queue's): made with no handle
        p.add(q.kind)
    else:
        p.add(q.kind, "handle", q.handle)
    match q.kind:
        case "htb":
            _htb(p, names)
        case "hfsc":
            _hfsc(p, names)
        case "prio":
            _prio(p)
        case "tbf":
            _tbf(p)
        case "netem":
            _netem(p)
        case "sfq":
            _sfq(p)
        case "fq_codel":
            _fq_codel(p)
        case "codel":
            _codel(p)
        case "fq":
            _fq(p)
        case "red":
            _red(p, rates)
        case "cake":
            _cake(p)
        case "pfifo" | "bfifo":
            _fifo(p)
        case "fq_pie":
            p.problem("tcdsl import does not read fq_pie's parameters yet: written without them")
        case _:
            pass
    for pair in q.unread:
        p.problem(_unread_words(pair))
    if root:
        _stab(p)
    elif "stab" in p.options and not stab_said:
        p.problem("a size table below the root has no word in the language; left out")
    return p.words, p.problems


# ==== class parameters =========================================================================


def _curve(words: list[str], kind: str, options: dict[str, Shown]) -> None:
    m1, d, m2 = (options.get(f"{kind}.{k}") for k in ("m1", "d", "m2"))
    if m2 is None:
        return
    words.append(kind)
    if (m1 is not None and m1.value) or (d is not None and d.value):
        assert m1 is not None and d is not None
        words += ["m1", _rate(m1), "d", _time(d)]
    words += ["m2", _rate(m2)]


def _unread_words(pair: str) -> str:
    return f"'{pair}' is no value tc prints there; left out"


def _unreadable(what: str, pair: str, line: int) -> Problem:
    return Problem("W611", f"{what}: {_unread_words(pair)}", line)


def class_words(c: TcClass, line: int, r2q: int | None) -> tuple[list[str], list[Problem]]:
    """The parameters of a class's line (``rate 10mbit ceil 100mbit prio 1``)."""
    o = c.options
    words: list[str] = []
    # (found by a tester: 'prio x' in a saved text was dropped without a word)
    problems = [_unreadable(f"class {c.classid}", pair, line) for pair in c.unread]
    if c.kind == "htb":
        rate, ceil = _value(o, "rate"), _value(o, "ceil")
        if not isinstance(rate, int):
            return words, [Problem("W611", f"class {c.classid}: no rate shown", line)]
        words += ["rate", format_rate(rate)]
        if isinstance(ceil, int) and ceil != rate:
            words += ["ceil", format_rate(ceil)]
        for key, at in (("burst", rate), ("cburst", ceil if isinstance(ceil, int) else rate)):
            shown = _value(o, key)
            if isinstance(shown, int) and shown != _htb_default_burst(at):
                words += [key, format_size(_burst_size(at, shown, htb_shown_burst))]
        prio = _value(o, "prio")
        if isinstance(prio, int) and prio:
            words += ["prio", str(prio)]
        quantum = _value(o, "quantum")
        if isinstance(quantum, int) and r2q:
            low, high = HTB_QUANTUM
            if quantum != min(max(rate // 8 // r2q, low), high):
                words += ["quantum", str(quantum)]
        overhead = _value(o, "overhead")
        if isinstance(overhead, int) and overhead:
            problems.append(
                Problem("W611", f"class {c.classid}: 'overhead {overhead}' left out", line)
            )
        # the class's own rate tables (an interface's 'overhead' is a size table instead)
        linklayer = _value(o, "linklayer")
        if linklayer not in (None, "ethernet"):
            problems.append(
                Problem("W611", f"class {c.classid}: 'linklayer {linklayer}' left out", line)
            )
        mpu = _mpu(c.words)
        if mpu:
            problems.append(Problem("W611", f"class {c.classid}: 'mpu {mpu}' left out", line))
    elif c.kind == "hfsc":
        words_in = c.words
        if "sc" in words_in:
            _curve(words, "rt", o)
            words[words.index("rt")] = "sc"
            for kind in ("ul",):
                _curve(words, kind, o)
        else:
            for kind in ("rt", "ls", "ul"):
                _curve(words, kind, o)
    return words, problems


# ==== filters ==================================================================================

_POLICE_INDEX = re.compile(r"\bpolice (0x[0-9a-f]+)")
_VERDICTS = {"drop": "drop", "pass": "pass", "continue": "continue", "reclassify": "reclassify"}


def _police(entry: FilterEntry) -> tuple[tuple[str, ...], str | None, str | None]:
    """The ``police ...`` words of a filter's policer, its index, and a problem (an action
    other than police, a verdict the language has not)."""
    f = entry.filter
    others = [a for a in f.actions if a[0] != "police"]
    if others and others[0][0] == UNREADABLE_POLICE:
        return (), None, "its policer's rate, burst or mtu is not a value tc prints"
    if others:
        return (), None, f"its action '{others[0][0]}' has no word in the language"
    police = [a for a in f.actions if a[0] == "police"]
    if not police:
        return (), None, None
    if len(police) > 1:
        return (), None, "it has several policers"
    _, rate, burst, mtu, verdict = police[0]
    assert isinstance(rate, int) and isinstance(burst, int) and isinstance(mtu, int)
    if verdict not in _VERDICTS:
        return (), None, f"its policer's verdict '{verdict}' has no word in the language"
    words = ["police", "rate", format_rate(rate)]
    words += ["burst", format_size(_burst_size(rate, burst, htb_shown_burst))]
    if mtu and mtu != parse_size("2Kb"):
        words += ["mtu", format_size(mtu)]
    if verdict != "drop":
        words.append(str(verdict))
    index = None
    for text in f.words:
        if (m := _POLICE_INDEX.search(text)) is not None:
            index = m.group(1)
    return tuple(words), index, None


def unhashed(entries: Sequence[FilterEntry]) -> tuple[list[FilterEntry], set[int]]:
    """``entries`` with each pref laid out in u32 tables the way tcdsl makes them (links that
    match every packet; in a hashed bucket, filters that fix the hashed byte to the bucket)
    in an order the first match is the same in: u32's walk, a table's buckets one after the
    other (a packet can only match filters of its own bucket), the links left out; and the
    ids of the entries so placed. Other layouts are left as they are."""
    groups: dict[tuple[str, int], list[FilterEntry]] = {}
    for e in entries:
        if e.filter.kind == "u32":
            groups.setdefault((e.filter.protocol, e.filter.pref), []).append(e)
    done: dict[int, list[FilterEntry]] = {}
    for group in groups.values():
        if not any(e.filter.link for e in group):
            continue
        order = _walk(group)
        if order is not None:
            done[id(group[0])] = order
            done.update({id(e): [] for e in group[1:]})
    if not done:
        return list(entries), set()
    out = [x for e in entries for x in done.get(id(e), [e])]
    return out, {id(e) for order in done.values() for e in order}


def _walk(group: list[FilterEntry]) -> list[FilterEntry] | None:
    nodes: dict[tuple[str, int], list[FilterEntry]] = {}
    for e in group:
        table, bucket, _ = e.filter.place.split(":")
        nodes.setdefault((table, int(bucket or "0", 16)), []).append(e)
    for members in nodes.values():
        members.sort(key=lambda e: int(e.filter.place.split(":")[2] or "0", 16))
    out: list[FilterEntry] = []
    seen: set[str] = set()
    # e -> the filters u32 must try before it: the nodes before it in its bucket, and before
    # the link into its table; the buckets of one table are tried side by side (a packet
    # can only match filters of its own bucket)
    before: dict[int, list[FilterEntry]] = {}

    def walk(
        table: str, bucket: int, fixed: tuple[tuple[int, int, int], ...], last: list[FilterEntry]
    ) -> list[FilterEntry] | None:
        for e in nodes.get((table, bucket), []):
            f = e.filter
            if f.offset:  # its keys, or its table's, are read past the IP header
                return None
            if not f.link:
                if not all(_fixes(f.keys, mask, offset, value) for mask, offset, value in fixed):
                    return None
                out.append(e)
                before[id(e)] = last
                last = [e]
                continue
            inner = f.link.rstrip(":")
            if f.keys not in ((), ((0, 0, 0),)) or inner in seen:
                return None
            seen.add(inner)
            buckets = sorted(b for t, b in nodes if t == inner)
            tails: list[FilterEntry] = []
            for b in buckets:
                more = ((*f.hashkey, b),) if f.hashkey is not None else ()
                tail = walk(inner, b, fixed + more, last)
                if tail is None:
                    return None
                tails += tail
            last = tails or last
        return last

    if walk("", 0, (), []) is None or len(out) + len(seen) != len(group):
        return None
    return _by_class(out, before)


def _by_class(out: list[FilterEntry], before: dict[int, list[FilterEntry]]) -> list[FilterEntry]:
    """``out`` (an order u32 may try the filters in) with each class's filters together, in
    an order of the classes that keeps every filter after those it must come after; ``out``
    itself when there is none (the lines alternate between classes: W615)."""
    first: dict[str, int] = {}
    for n, e in enumerate(out):
        first.setdefault(e.filter.flowid, n)
    after: dict[str, set[str]] = {c: set() for c in first}
    for e in out:
        for b in before[id(e)]:
            if b.filter.flowid != e.filter.flowid:
                after[e.filter.flowid].add(b.filter.flowid)
    # Kahn's algorithm, the class first met in ``out`` first among those free to go
    blocking = {c: len(a) for c, a in after.items()}
    freed: dict[str, list[str]] = {c: [] for c in first}
    for c, a in after.items():
        for earlier in a:
            freed[earlier].append(c)
    ready = [(first[c], c) for c, n in blocking.items() if not n]
    heapq.heapify(ready)
    done: list[str] = []
    while ready:
        _, c = heapq.heappop(ready)
        done.append(c)
        for d in freed[c]:
            blocking[d] -= 1
            if not blocking[d]:
                heapq.heappush(ready, (first[d], d))
    if len(done) != len(first):
        return out
    rank = {c: n for n, c in enumerate(done)}
    return sorted(out, key=lambda e: rank[e.filter.flowid])


def _fixes(keys: Sequence[tuple[int, int, int]], mask: int, offset: int, bucket: int) -> bool:
    """Whether ``keys`` only match packets whose word at ``offset``, masked, picks ``bucket``."""
    shift = (mask & -mask).bit_length() - 1
    for value, key_mask, key_offset in keys:
        if key_offset == offset and key_mask & mask == mask:
            return (value & mask) >> shift == bucket
    return False


def _fh_table(words: Sequence[str]) -> int | None:
    for i, word in enumerate(words[:-1]):
        if word == "fh":
            table = words[i + 1].split(":")[0]
            return int(table, 16) if table else None
    return None


@dataclass
class _Decoded:
    index: int
    entry: FilterEntry
    family: str
    conds: list[Cond]
    police: tuple[str, ...]
    police_index: str | None
    flower: bool = False


def _family_only(conds: Sequence[Cond]) -> str | None:
    """The family a line's conditions imply by themselves, or None (family-neutral)."""
    for c in conds:
        if c.identity[0] in ("src", "dst", "raw"):
            return str(c.identity[1])
        if c.identity == ("proto", 1):
            return "ipv4"
        if c.identity == ("proto", 58):
            return "ipv6"
    return None


def _neutral(conds: Sequence[Cond]) -> list[tuple[object, ...]]:
    return sorted((c.identity for c in conds), key=repr)


def _pairs_with(four: _Decoded, six: Sequence[_Decoded]) -> bool:
    """Whether IPv6 filters ``six`` are exactly what ``four``'s line gives for IPv6."""
    conds = four.conds
    auto = has_ports(conds) and not has_proto(conds)
    want = [6, 17] if auto else [None]
    if len(six) != len(want):
        return False
    f4 = four.entry.filter
    for proto, d in zip(want, six, strict=True):
        f = d.entry.filter
        if f.flowid != f4.flowid or d.police != four.police:
            return False
        got = list(d.conds)
        if proto is not None:
            first = [c for c in got if c.identity == ("proto", proto)]
            if not first:
                return False
            got.remove(first[0])
        if _neutral(got) != _neutral(conds):
            return False
        by_identity = {c.identity: c for c in got}
        six_order = [by_identity[c.identity] for c in conds]
        if key_order(six_order, auto) != list(dict.fromkeys(o for _, _, o in f.keys)):
            return False
    if four.police:
        indexes = {four.police_index, *(d.police_index for d in six)}
        if len(indexes) != 1:
            return False
    return True


@dataclass
class FilterSet:
    """What a qdisc's filters become: match lines, ``classify by mark``, and problems (each
    with the class id it is about, or None)."""

    lines: list[Line] = field(default_factory=list)
    marks: Marks | None = None
    problems: list[tuple[Problem, str | None]] = field(default_factory=list)
    flower: bool = False
    """Its filters are flower filters (the tree's ``classifier flower``)."""
    linear: bool = False
    """Its u32 filters hold a run tcdsl would lay out in hash tables, in one list at a pref
    (a hand-written script's: the tree's ``classifier u32 linear``)."""
    hashed: set[tuple[str, int]] = field(default_factory=set)
    """The (protocol, pref) of the filters tcdsl laid out in u32 hash tables: read in an
    order of the buckets, whose filters no packet meets together."""


def filter_set(
    entries: Sequence[FilterEntry], classes: set[str], ingress: bool, strays: bool = False
) -> FilterSet:
    """Decode a qdisc's filters (in tc's order) into lines. ``strays``: a filter that sends
    to no class of the qdisc (nor to the qdisc itself, X:0) is a line too, to that flowid,
    for the caller to place (htb: its default class, where such packets go)."""
    out = FilterSet()
    decoded: list[_Decoded] = []

    def problem(entry: FilterEntry, message: str, code: str = "W613") -> None:
        f = entry.filter
        where = f.flowid if f.flowid in classes else None
        text = f"filter pref {f.pref} ({f.protocol}, {f.kind}) to {f.flowid or 'no class'}"
        out.problems.append((Problem(code, f"{text}: {message}", entry.line), where))

    kinds = {e.filter.kind for e in entries if e.filter.kind in ("u32", "flower")}
    out.flower = kinds == {"flower"}
    # u32 keeps the tables of a qdisc and of its classes in one list, and shows those of a
    # pref with each of its filters: two root tables (800: and up) at one pref are two
    # filters', one of them a class's (which htb never consults for a leaf) or another
    # qdisc's; which is whose, the text does not say
    roots: dict[int, set[int]] = {}
    for e in entries:
        table = _fh_table(e.head) if e.filter.kind == "u32" else None
        if table is not None and table >= 0x800:
            roots.setdefault(e.filter.pref, set()).add(table)
    mixed = {pref: sorted(ids) for pref, ids in roots.items() if len(ids) > 1}
    entries, tabled = unhashed(entries)
    out.hashed = {(e.filter.protocol, e.filter.pref) for e in entries if id(e) in tabled}
    if not out.hashed and not out.flower:
        # (found by a tester: an ISP's script of a /32 line a subscriber at one pref was
        # imported as lines the compiler hashes, and its first apply built the tree again)
        runs = Counter((e.filter.protocol, e.filter.pref) for e in entries if e.filter.flowid)
        out.linear = max(runs.values(), default=0) >= HASH_MIN
    for index, entry in enumerate(entries):
        f = entry.filter
        chain = _word_after(entry.head, "chain")
        if chain not in (None, "0"):
            # (a policy's filters are chain 0's, which the qdisc tries; only a goto_chain
            # action, which the language has not, reaches another chain)
            problem(entry, f"it is in chain {chain}, which only a goto_chain action reaches, "
                    "and the language writes chain 0's filters only; left out")  # fmt: skip
            continue
        if f.kind == "u32" and f.pref in mixed:
            tables = ", ".join(f"{t:x}:" for t in mixed[f.pref])
            problem(entry, f"pref {f.pref} lists the u32 tables {tables} of more than one "
                    "filter (a class's filters are listed with its qdisc's): whose this one "
                    "is, tc's text does not say; left out")  # fmt: skip
            continue
        if f.kind == "fw":
            _fw(out, entry, classes, problem, entries)
            continue
        if f.kind == "flower" and out.flower:
            _flower(out, decoded, index, entry, classes, ingress, problem)
            continue
        if f.kind != "u32":
            beside = " beside u32 ones (a tree has one classifier)" if f.kind == "flower" else ""
            problem(entry, f"the language has no '{f.kind}' filter{beside}; left out", "W612")
            continue
        if f.protocol == "all" and f.pref < V6_PREF and _catch_all(entry, classes, ingress):
            # (found by a tester: sqm-scripts' 'protocol all ... match ip protocol 0 0x00' was
            # left out, and the filters behind it took what it had caught)
            police, police_index, why = _police(entry)
            if why is None and (police or not ingress):
                problem(entry, "protocol 'all', a filter every packet meets: written as "
                        "'match all' (a filter for IPv4 and one for IPv6, so the policy's "
                        "first apply builds the tree again); packets of neither family (ARP, "
                        "PPPoE discovery) go to the default class now")  # fmt: skip
                every = [Cond("all", (0,), ("all",))]
                decoded.append(_Decoded(index, entry, "both", every, police, police_index))
                continue
        if f.protocol not in ("ip", "ipv6"):
            problem(entry, f"protocol '{f.protocol}': the language writes ip and ipv6 only")
            continue
        table = _fh_table(entry.head)
        laid_out = id(entry) in tabled
        if not laid_out and ("link" in entry.head or (table is not None and table < 0x800)):
            problem(entry, "a u32 hash table or link has no word in the language; left out")
            continue
        stray = strays and bool(f.flowid) and _minor(f.flowid) != 0
        if not ingress and f.flowid not in classes and not stray:
            problem(entry, f"it sends to {f.flowid or 'no class'}, no class of this qdisc")
            continue
        if f.offset:
            problem(entry, f"its '{f.offset}' (keys read after the IP header) has no word in "
                           "the language; left out")  # fmt: skip
            continue
        if f.u32_mark is not None:
            # (found by a tester: FireQOS's 'match mark' was dropped, the line matching all)
            value, mask = f.u32_mark
            problem(entry, f"its key 'mark 0x{value:x} 0x{mask:x}' (the packet's firewall "
                    "mark) has no word in a u32 line of the language ('classify by mark' "
                    "makes fw filters); left out")  # fmt: skip
            continue
        family = "ipv4" if f.protocol == "ip" else "ipv6"
        try:
            conds = decode(f.keys, family)
        except Undecodable as err:
            problem(entry, f"{err} has no word in the language; left out")
            continue
        police, police_index, why = _police(entry)
        if why is not None:
            problem(entry, f"{why}; left out", "W614")
            continue
        if ingress and not police:
            problem(entry, "an ingress line needs a policer (the filter has none); left out")
            continue
        decoded.append(
            _Decoded(index, entry, family, ordered(conds, f.keys, family), police, police_index)
        )
    _lines(out, decoded)
    if out.marks is not None:
        for line in [fl for fl in out.lines if fl.police]:
            out.lines.remove(line)
            message = (
                f"a policed filter (pref {line.pref}) on a qdisc with fw filters: with "
                "'classify by mark' a match line cannot police; left out"
            )
            out.problems.append((Problem("W614", message, line.line), line.classid))
    return out


def _catch_all(entry: FilterEntry, classes: set[str], ingress: bool) -> bool:
    """Whether a u32 filter is one that every packet meets, and nothing else: its keys all
    of mask 0, no hash table or link, no keys after the header, no mark key, to a class."""
    f = entry.filter
    table = _fh_table(entry.head)
    return (
        all(mask == 0 for _, mask, _ in f.keys)
        and "link" not in entry.head
        and (table is None or table >= 0x800)
        and not f.offset
        and f.u32_mark is None
        and (ingress or f.flowid in classes)
    )


def _flower(
    out: FilterSet,
    decoded: list[_Decoded],
    index: int,
    entry: FilterEntry,
    classes: set[str],
    ingress: bool,
    problem: Callable[..., None],
) -> None:
    f = entry.filter
    if f.protocol not in ("ip", "ipv6") or f.flower is None:
        problem(entry, f"protocol '{f.protocol}': the language writes ip and ipv6 only")
        return
    if not ingress and f.flowid not in classes:
        problem(entry, f"it sends to {f.flowid or 'no class'}, no class of this qdisc")
        return
    family = "ipv4" if f.protocol == "ip" else "ipv6"
    conds = flower_conds(f.flower, family)
    if isinstance(conds, str):
        problem(entry, f"{conds}; left out", "W612")
        return
    police, police_index, why = _police(entry)
    if why is not None or (ingress and not police):
        problem(entry, f"{why or 'an ingress line needs a policer'}; left out", "W614")
        return
    decoded.append(_Decoded(index, entry, family, conds, police, police_index, flower=True))


def _fw(
    out: FilterSet,
    entry: FilterEntry,
    classes: set[str],
    problem: Callable[[FilterEntry, str, str], None],
    entries: Sequence[FilterEntry],
) -> None:
    f = entry.filter
    why = (
        "an fw filter without a mark"
        if f.mark is None
        else f"it sends to {f.flowid or 'no class'}, no class of this qdisc"
        if f.flowid not in classes
        else f"protocol '{f.protocol}': the language writes ip and ipv6 only"
        if f.protocol not in ("ip", "ipv6")
        else None
    )
    if why is not None or f.mark is None:
        problem(entry, f"{why}; left out", "W616")
        return
    mask = 0xFFFFFFFF if f.mask is None else f.mask
    if not 0 < f.mark <= 0xFFFFFFFF or not 0 < mask <= 0xFFFFFFFF or f.mark & ~mask:
        problem(
            entry,
            f"an fw filter with mark {f.mark:#x} and mask {mask:#x}, which a policy cannot "
            "write (a mark of 1-0xffffffff inside a mask of 1-0xffffffff)",
            "W616",
        )
        return
    family = "ipv4" if f.protocol == "ip" else "ipv6"
    pref = f.pref - V6_PREF if family == "ipv6" else f.pref
    if out.marks is None:
        out.marks = Marks(pref, f.mask, line=entry.line)
        out.problems.append(
            (
                Problem(
                    "W616",
                    "fw filters are written as 'classify by mark at postrouting' (a "
                    "download's: 'from' its interface): the firewall rules that set the marks "
                    "are not read (tcdsl writes its own chain, which also gives unmarked "
                    "packets the default class's mark, and at postrouting marks only what "
                    "leaves this interface, so imported trees do not mark each other's "
                    "packets); write match lines instead, or keep your rules and check that "
                    "each class's 'mark' is the one they set",
                    entry.line,
                ),
                None,
            )
        )
    m = out.marks
    if f.mask != m.mask or pref < 1 or (pref != m.pref and _between(m, f, entries)):
        problem(entry, "fw filters at another pref or mask than the first ones", "W616")
        return
    m.families.add(family)
    if m.marks.setdefault(f.flowid, f.mark) != f.mark:
        problem(entry, f"a second mark for {f.flowid}", "W616")


def _between(marks: Marks, f: TcFilter, entries: Sequence[FilterEntry]) -> bool:
    """Whether a filter of ``f``'s protocol lies between the first fw filters' pref and
    ``f``'s, other than fw ones of their mask. fw filters of one mask never match one packet
    together (each takes the marks equal to its own under the mask): without another filter
    between them, those at later prefs are the first ones' ``classify by mark``."""
    first = marks.pref + (V6_PREF if f.protocol == "ipv6" else 0)
    low, high = sorted((first, f.pref))
    return any(
        e.filter.protocol == f.protocol
        and low < e.filter.pref < high
        and not (e.filter.kind == "fw" and e.filter.mask == marks.mask)
        for e in entries
    )


def _lines(out: FilterSet, decoded: list[_Decoded]) -> None:
    """Pair IPv4 and IPv6 filters into lines and order the lines as the kernel holds them."""
    v6_by_pref: dict[int, list[_Decoded]] = {}
    for d in decoded:
        if d.family == "ipv6":
            v6_by_pref.setdefault(d.entry.filter.pref, []).append(d)
    used: set[int] = set()
    start: dict[int, int] = {}
    pairs: dict[int, list[_Decoded]] = {}
    for d in decoded:
        if d.family != "ipv4" or _family_only(d.conds) is not None or d.flower:
            continue
        pref = d.entry.filter.pref + V6_PREF
        cands = v6_by_pref.get(pref, [])
        need = 2 if has_ports(d.conds) and not has_proto(d.conds) else 1
        for at in range(start.get(pref, 0), len(cands) - need + 1):
            run = cands[at : at + need]
            if any(r.index in used for r in run):
                continue
            if _pairs_with(d, run):
                pairs[d.index] = run
                used.update(r.index for r in run)
                start[pref] = at + need
                break
    v6_pos = {d.index: n for n, d in enumerate(x for x in decoded if x.family == "ipv6")}
    dual_marks = sorted((v6_pos[run[0].index], index) for index, run in pairs.items())
    # Without a line of both families, the IPv6 lines go after the IPv4 ones, unless the
    # kernel made their u32 first (its root table has the lower id: 800: before 801:), as a
    # tree whose first line is IPv6 does: the policy then keeps the kernel's table ids.
    tables: dict[str, int] = {}
    for d in decoded:
        table = _fh_table(d.entry.head)
        tables[d.family] = min(tables.get(d.family, U32_MAX), U32_MAX if table is None else table)
    unanchored = float("inf")
    if not dual_marks and tables.get("ipv6", U32_MAX) < tables.get("ipv4", U32_MAX):
        unanchored = float("-inf")
    # IPv6 filters at prefs up to 32768 (sqm-scripts' DSCP filters): where all of them come
    # before the IPv6 filters above, written 32768 higher, their order kept
    six = [d.entry.filter.pref for d in decoded if d.family == "ipv6" and not d.flower]
    low = [p for p in six if p <= V6_PREF]
    high = [p for p in six if p > V6_PREF]
    lifted = bool(low) and (not high or max(low) + V6_PREF < min(high))
    lifted_said: set[int] = set()
    for d in decoded:
        f = d.entry.filter
        if d.index in used:
            continue
        if d.flower:
            # flower's prefs are counted, one per filter, in the order of the lines
            family, filters, pref = d.family, [(f.protocol, 0, d.index)], 1
            seq: tuple[float, int] = (float(d.index), 0)
        elif d.family == "both":  # a protocol 'all' filter every packet meets
            family, filters = "both", [(f.protocol, f.pref, d.index)]
            seq, pref = (float(d.index), 0), f.pref
        elif d.family == "ipv4":
            run = pairs.get(d.index, [])
            family = "both" if run else "ipv4"
            filters = [(f.protocol, f.pref, d.index)]
            filters += [(r.entry.filter.protocol, r.entry.filter.pref, r.index) for r in run]
            seq = (float(d.index), 0)
            pref = f.pref
        else:
            pref = f.pref - V6_PREF
            if f.pref <= V6_PREF and not lifted:
                out.problems.append(
                    (
                        Problem(
                            "W613",
                            f"IPv6 filter at pref {f.pref}: tcdsl puts a line's IPv6 filters at "
                            "its pref + 32768, so prefs up to 32768 are IPv4's, and those "
                            "above hold IPv6 filters that come after it; left out",
                            d.entry.line,
                        ),
                        f.flowid,
                    )
                )
                continue
            if f.pref <= V6_PREF:
                pref = f.pref
                if f.pref not in lifted_said:
                    lifted_said.add(f.pref)
                    message = (
                        f"ipv6 filters at pref {f.pref}: tcdsl puts a line's IPv6 filters at "
                        f"its pref + {V6_PREF}; written as pref {pref} (kernel pref "
                        f"{pref + V6_PREF}), in the same order among the IPv6 filters; the "
                        "policy's first apply builds the tree again (its counters start over) "
                        "rather than take it over"
                    )
                    out.problems.append((Problem("W615", message, d.entry.line), f.flowid))
            family = "ipv6"
            filters = [(f.protocol, f.pref, d.index)]
            pos = v6_pos[d.index]
            after = [four for six, four in dual_marks if six > pos]
            seq = (min(after) - 0.5 if after else unanchored, pos)
        out.lines.append(
            Line(
                d.conds,
                family,
                pref,
                d.police,
                f.flowid,
                seq,
                filters,
                d.police_index,
                d.entry.line,
            )
        )
    _renumbered(out)
    out.lines = _one_policer_one_line(_port_ranges(out.lines))
    shared: dict[str, list[Line]] = {}
    for line in out.lines:
        if line.police_index is not None:
            shared.setdefault(line.police_index, []).append(line)
    for index, lines in sorted(shared.items()):
        if len(lines) > 1:
            out.problems.append(
                (
                    Problem(
                        "W617",
                        f"{len(lines)} lines share one policer (police {index}); each line "
                        "gets a policer of its own",
                        lines[0].line,
                    ),
                    lines[0].classid,
                )
            )


LISTED = ("src", "dst", "sport", "dport", "proto")
"""The conditions a line may give several values of (``dport 80, 443``)."""


def _renumbered(out: FilterSet) -> None:
    """IPv4 lines above pref 32768 in a tree with IPv6 lines (tc's own prefs, 49152 and
    down, for filters added without one), which such a tree cannot write: moved, in their
    order, just above its other IPv4 prefs (W615). The order of a protocol's filters is all
    that classifies its packets."""
    if not any(line.family != "ipv4" for line in out.lines):
        return
    fours = sorted({line.pref for line in out.lines if line.family == "ipv4"})
    high = [p for p in fours if p > V6_PREF]
    start = max((p for p in fours if p <= V6_PREF), default=0) + 1
    if not high or start + len(high) - 1 > V6_PREF:
        return
    new = {p: start + n for n, p in enumerate(high)}
    seen: set[int] = set()
    for line in out.lines:
        if line.family != "ipv4" or line.pref not in new:
            continue
        was = line.pref
        line.pref = new[was]
        if was in seen:
            continue
        seen.add(was)
        message = (
            f"ip filters at pref {was}: a tree with IPv6 lines writes IPv4 prefs up to "
            f"{V6_PREF} (its IPv6 filters take the prefs above); written as pref {line.pref}, "
            "in the same order among the IPv4 filters"
        )
        out.problems.append((Problem("W615", message, line.line), line.classid))


def _merged(group: list[Line]) -> Line | None:
    """One line for lines that differ in the values of one condition only, or None."""
    first = group[0]
    if any(
        len(x.conds) != len(first.conds) or (x.family, x.pref) != (first.family, first.pref)
        for x in group
    ):
        return None
    differ = [
        n for n, cond in enumerate(first.conds) if any(x.conds[n].text != cond.text for x in group)
    ]
    if len(differ) != 1:
        return None
    n = differ[0]
    field = first.conds[n].text.split()[0]
    if field not in LISTED or any(x.conds[n].text.split()[0] != field for x in group):
        return None
    values = ", ".join(x.conds[n].text.split(" ", 1)[1] for x in group)
    conds = [
        *first.conds[:n],
        Cond(f"{field} {values}", first.conds[n].words, first.conds[n].identity),
        *first.conds[n + 1 :],
    ]
    filters = [f for x in group for f in x.filters]
    return Line(
        conds,
        first.family,
        first.pref,
        first.police,
        first.classid,
        first.seq,
        filters,
        first.police_index,
        first.line,
    )


def _port_at(line: Line) -> int | None:
    """Where a line's only port condition is, or None."""
    at = [n for n, c in enumerate(line.conds) if c.identity[0] in ("sport", "dport")]
    return at[0] if len(at) == 1 else None


def _but_port(a: Line, b: Line, n: int) -> bool:
    """Whether lines ``a`` and ``b`` are alike but for the value of their port condition n."""
    return (
        len(a.conds) == len(b.conds)
        and _port_at(b) == n
        and a.conds[n].identity[0] == b.conds[n].identity[0]
        and all(
            x.text == y.text
            for k, (x, y) in enumerate(zip(a.conds, b.conds, strict=True))
            if k != n
        )
        and (a.family, a.pref, a.police, a.police_index, a.classid)
        == (b.family, b.pref, b.police, b.police_index, b.classid)
    )


def _as_range(run: Sequence[Line], n: int) -> tuple[int, int] | None:
    """The port range whose blocks tcdsl writes as the port values of ``run``, or None."""
    blocks = [cast(tuple[int, int], x.conds[n].identity[1:3]) for x in run]
    lo = blocks[0][0]
    hi = blocks[-1][0] | (~blocks[-1][1] & 0xFFFF)
    return (lo, hi) if range_to_masks(lo, hi) == blocks else None


def _six_of(lines: Sequence[Line], run: Sequence[Line], used: set[int]) -> list[Line] | None:
    """The IPv6 lines that the IPv4 lines ``run`` of one range have beside them, in the order
    tcdsl gives a range's filters (its TCP ones, then its UDP ones, on a line without a
    protocol), or None."""
    auto = not has_proto(run[0].conds)
    want = [(p, x) for p in ((6, 17) if auto else (None,)) for x in run]
    six = [x for x in lines if x.family == "ipv6" and id(x) not in used]

    def fits(line: Line, proto: int | None, four: Line) -> bool:
        got = [c.identity for c in line.conds]
        if proto is not None:
            if ("proto", proto) not in got:
                return False
            got.remove(("proto", proto))
        return sorted(got, key=repr) == sorted((c.identity for c in four.conds), key=repr) and (
            line.pref,
            line.police,
            line.police_index,
            line.classid,
        ) == (four.pref, four.police, four.police_index, four.classid)

    for start in range(len(six) - len(want) + 1):
        if all(fits(six[start + k], p, x) for k, (p, x) in enumerate(want)):
            return six[start : start + len(want)]
    return None


def _port_ranges(lines: list[Line]) -> list[Line]:
    """Lines of one port range (the value/mask blocks tcdsl compiles a range to, IPv4 and,
    beside them, IPv6) as that one line: ``dport 1000-2000``."""
    out: list[Line] = []
    used: set[int] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        n = _port_at(line)
        if id(line) in used or line.family == "ipv6" or n is None:
            if id(line) not in used:
                out.append(line)
            i += 1
            continue
        run = [line]
        while i + len(run) < len(lines) and _but_port(line, lines[i + len(run)], n):
            run.append(lines[i + len(run)])
        for k in range(len(run), 1, -1):
            found = _as_range(run[:k], n)
            six = _six_of(lines, run[:k], used) if found and line.family == "ipv4" else []
            if found is not None and six is not None:
                break
        else:
            out.append(line)
            i += 1
            continue
        lo, hi = found
        cond = line.conds[n]
        field = str(cond.identity[0])
        conds = [*line.conds[:n], Cond(f"{field} {lo}-{hi}", cond.words, (field, lo, hi))]
        conds += line.conds[n + 1 :]
        used.update(id(x) for x in six)
        family = "both" if six else line.family
        filters = [f for x in [*run[:k], *six] for f in x.filters]
        out.append(
            Line(
                conds,
                family,
                line.pref,
                line.police,
                line.classid,
                line.seq,
                filters,
                line.police_index,
                line.line,
            )
        )
        i += k
    return out


def _one_policer_one_line(lines: list[Line]) -> list[Line]:
    """Lines next to each other that share a police action (one policer of a line with a
    list of values, in tcdsl's words) as that one line, where they differ in one list."""
    out: list[Line] = []
    for _, run in itertools.groupby(
        lines, key=lambda x: (x.police_index, x.classid) if x.police_index else id(x)
    ):
        group = list(run)
        merged = _merged(group) if len(group) > 1 else None
        out += [merged] if merged is not None else group
    return out


# ==== the tree =================================================================================


@dataclass
class _Device:
    """One device's objects, looked up."""

    text: DeviceText
    objs: DeviceObjects
    root: tuple[TcQdisc, int] | None
    ingress: tuple[TcQdisc, int] | None
    below: dict[str, tuple[TcQdisc, int]]
    """class id -> the qdisc below it (a leaf, or a chaining qdisc's child)."""
    filters: dict[str, list[FilterEntry]]
    problems: list[Problem]


def _device(text: DeviceText) -> _Device:
    objs = objects(text.text)
    problems = [
        Problem("W619", f"not a line of tc's qdisc, class or filter output: {line!r}", n)
        for line, n in objs.unknown
    ]
    root = ingress = None
    below: dict[str, tuple[TcQdisc, int]] = {}
    for q, line in objs.qdiscs:
        if q.parent == "root":
            root = (q, line)
        elif q.kind in ("ingress", "clsact"):
            ingress = (q, line)
        else:
            below[q.parent] = (q, line)
    # a qdisc below a class the text does not show (text saved in part: found by a tester,
    # it was left out without a word)
    kinds = {_major(q.handle): q.kind for q, _ in objs.qdiscs}
    shown = {c.classid for c, _ in objs.classes}
    for above, (q, line) in below.items():
        major = _major(above)
        if kinds.get(major) in CLASSFUL and above not in shown and above != f"{major}:":
            problems.append(Problem(
                "W611", f"the {q.kind} qdisc {q.handle} is below class {above}, which is not "
                "in the text (saved in part?); left out, with what is below it", line))  # fmt: skip
    majors = {_major(q.handle) for q, _ in objs.qdiscs}
    filters: dict[str, list[FilterEntry]] = {}
    for entry in objs.filters:
        parent = entry.parent
        if parent is None:
            # tc names no parent when asked for one: the flowid's major tells the qdisc
            major = _major(entry.filter.flowid.strip("?"))
            redirects = any(a[:3] == ("mirred", "egress", "redirect") for a in entry.filter.actions)
            if ingress is not None and (major in ("", "ffff") or redirects):
                # (sqm-scripts' redirect names a flowid, 1:1, of no use at ingress)
                parent = ingress[0].handle
            elif major in majors:
                parent = f"{major}:"
            else:
                parent = root[0].handle if root is not None else "?"
        filters.setdefault(parent, []).append(entry)
    # tcdsl's own layouts are read back into lines: their tables need no word
    walked: set[tuple[str | None, str, int]] = set()
    for parent, entries in filters.items():
        _, placed = unhashed(entries)
        for e in entries:
            if id(e) in placed:
                walked |= {
                    (parent, e.filter.protocol, e.filter.pref),
                    (None, e.filter.protocol, e.filter.pref),
                }
    for table, line in objs.hash_tables:
        words = table.split()
        pref = _word_after(words, "pref")
        key = (
            _word_after(words, "parent"),  # None: tc named no parent, listing one
            _word_after(words, "protocol") or "",
            int(pref) if pref and pref.isdigit() else -1,
        )
        if key in walked:
            continue
        problems.append(
            Problem("W613", f"a u32 hash table ({table}) has no word in the language", line)
        )
    return _Device(text, objs, root, ingress, below, filters, problems)


def _word_after(words: Sequence[str], key: str) -> str | None:
    return words[words.index(key) + 1] if key in words[:-1] else None


def _names(dev: _Device) -> dict[str, str]:
    return {c.classid: class_name(c.classid) for c, _ in dev.objs.classes}


def _build(dev: _Device, q: TcQdisc, line: int, problems: list[Problem]) -> QdiscNode:
    """The node of qdisc ``q`` with its classes, filters and the qdiscs below."""
    node = QdiscNode(q, line)
    major = _major(q.handle)
    if q.kind in CHAINING:
        # its one class is :1; a child added with 'parent 1:' is shown there as that
        child = dev.below.get(f"{major}:1") or dev.below.get(f"{major}:")
        if child is not None:
            node.child = _leaf(dev, child, problems)
        return node
    if q.kind not in CLASSFUL:
        return node
    mine = [(c, n) for c, n in dev.objs.classes if _major(c.classid) == major and c.kind == q.kind]
    nodes = {c.classid: ClassNode(c, n) for c, n in mine if c.classid != q.handle}
    top: list[ClassNode] = []
    for cn in nodes.values():
        parent = cn.cls.parent
        if parent in nodes:
            nodes[parent].children.append(cn)
        else:
            top.append(cn)
            if parent not in ("root", q.handle):  # (found by a tester: moved without a word)
                cn.notes.append(Problem(
                    "W611", f"class {cn.cls.classid}: its parent, class {parent}, is not in the "
                    "text (saved in part?); written at the top of the tree, where it borrows "
                    "from no class", cn.line))  # fmt: skip
        below = dev.below.get(cn.cls.classid)
        if below is not None:
            cn.leaf = _leaf(dev, below, cn.notes)
    node.classes = top
    htb = q.kind == "htb"
    fs = filter_set(dev.filters.get(q.handle, []), set(nodes), ingress=False, strays=htb)
    for problem, classid in fs.problems:
        if classid is not None and classid in nodes:
            nodes[classid].items.append(Comment(problem))
        else:
            node.body_notes.append(problem)
    if htb:
        _to_missing_classes(q, nodes, fs, node)
    for fl in fs.lines:
        nodes[fl.classid].items.append(fl)
    if htb:
        _to_inner_classes(q, nodes, dev, fs)
    if fs.marks is not None:
        _default_mark(q, fs.marks, set(nodes), dev.filters.get(q.handle, []))
    node.marks = fs.marks
    node.flower = fs.flower
    node.linear = fs.linear
    node.family = _tree_family(fs)
    _order(node, fs, problems)
    return node


def _default_mark(q: TcQdisc, marks: Marks, classes: set[str], entries: list[FilterEntry]) -> None:
    """Give the default class a mark of its own (tcdsl's chain gives unmarked packets that
    mark) that no fw filter of the qdisc names, those left out (W616) too: the compiler would
    choose the first free one among the marks written, which may be a left-out filter's,
    and packets the firewall rules kept mark for another class would go to the default."""
    default = _value(q.options, "default")
    classid = f"{_major(q.handle)}:{default:x}" if isinstance(default, int) and default else ""
    if classid not in classes or classid in marks.marks:
        return
    mask = 0xFFFFFFFF if marks.mask is None else marks.mask
    fw = [(e.filter, e.filter.mark) for e in entries if e.filter.kind == "fw" and e.filter.mark]
    own = [mark for f, mark in fw if f.flowid == classid and f.mask == marks.mask]
    if own:  # its own filter's, left out: the marks the firewall sets keep their classes
        marks.marks[classid] = own[0]
        return
    taken = {mark & mask for _, mark in fw}
    taken |= {mark & mask for mark in marks.marks.values()}
    step = mask & -mask
    mark = next((m for m in range(step, mask + 1, step) if m & ~mask == 0 and m not in taken), 0)
    if mark:
        marks.marks[classid] = mark


def _default_leaf(q: TcQdisc, nodes: dict[str, ClassNode]) -> str:
    """The class id of an htb qdisc's default class where it is a leaf, else ''."""
    default = _value(q.options, "default")
    leaf = f"{_major(q.handle)}:{default:x}" if isinstance(default, int) and default else ""
    return "" if leaf not in nodes or nodes[leaf].children else leaf


def _to_missing_classes(
    q: TcQdisc, nodes: dict[str, ClassNode], fs: FilterSet, node: QdiscNode
) -> None:
    """Lines whose filter sends to no class of the htb qdisc: htb stops classifying there
    and sends the packet to its default class (its direct queue, unshaped, when the default
    is no leaf). Written in the default class (W613); with no leaf default, left out (W613).
    (Found by a tester: such a filter was left out, and the packets it stopped went on to
    the later filters, on the kernel the imported policy made and in classify.)"""
    leaf = _default_leaf(q, nodes)
    for fl in [fl for fl in fs.lines if fl.classid not in nodes]:
        head = (
            f"filter pref {fl.pref} to {fl.classid}: it sends to no class of this qdisc, and "
            "htb then stops classifying and sends the packet to"
        )
        said = _to_default(fl, leaf, head, "W613", fs)
        if leaf:
            nodes[leaf].items.append(Comment(said))
        else:
            node.body_notes.append(said)


def _to_default(fl: Line, leaf: str, head: str, code: str, fs: FilterSet) -> Problem:
    """Send line ``fl`` where htb sends its packets: the default class ``leaf``, or with
    none (the direct queue) out of ``fs``; what to say of it (``head`` and where it went)."""
    if leaf:
        fl.classid = leaf
        return Problem(code, f"{head} the default class {leaf}: written there", fl.line)
    fs.lines.remove(fl)
    message = (
        f"{head} its direct queue (unshaped: no leaf is its default), which no line says; "
        "left out (a later line may take its packets now)"
    )
    return Problem(code, message, fl.line)


def _to_inner_classes(q: TcQdisc, nodes: dict[str, ClassNode], dev: _Device, fs: FilterSet) -> None:
    """Lines whose filter gives an inner class: htb goes on with that class's own filters,
    and with none, sends the packet to the default class (its direct queue, unshaped, when
    the default is no leaf). Written in the default class (W621); with no leaf default, left
    out (W621); an inner class with filters of its own keeps them (E609 then says so)."""
    leaf = _default_leaf(q, nodes)
    for fl in list(fs.lines):
        inner = nodes[fl.classid]
        if not inner.children or dev.filters.get(fl.classid):
            continue
        inner.items.remove(fl)
        head = (
            f"a filter (pref {fl.pref}) sends to {fl.classid}, an inner class without filters "
            "of its own, and htb then sends the packet to"
        )
        said = _to_default(fl, leaf, head, "W621", fs)
        held = nodes[leaf] if leaf else inner
        if leaf:
            held.items.append(fl)
        held.items.append(Comment(said))


def _one_family(*roots: QdiscNode) -> None:
    """Give every qdisc of a tree (of an mq's queues) the tree's family: one family word
    covers them all."""
    nodes = [n for root in roots for n in _all_qdiscs(root)]
    families = {n.family for n in nodes if n.family != "none"}
    family = families.pop() if len(families) == 1 else "both"
    flower = any(n.flower for n in nodes)
    linear = any(n.linear for n in nodes) and not flower
    for n in nodes:
        n.family = family
        n.flower = flower
        n.linear = linear


def _leaf(dev: _Device, found: tuple[TcQdisc, int], notes: list[Problem]) -> QdiscNode | None:
    q, line = found
    if q.kind not in LEAVES | CLASSFUL:
        what = (
            "tcdsl import does not read cbq (removed from Linux in 6.3)"
            if q.kind == "cbq"
            else f"the language has no '{q.kind}' qdisc"
        )
        notes.append(Problem("W610", f"{what} ({q.handle}); left out", line))
        return None
    return _build(dev, q, line, notes)


def _tree_family(fs: FilterSet) -> str:
    """``ipv4`` or ``ipv6`` when every filter is of that family, ``none`` without filters,
    else ``both``."""
    families = {line.family for line in fs.lines}
    if fs.marks is not None:
        families |= fs.marks.families
    if not families:
        return "none"
    if families == {"ipv4"}:
        return "ipv4"
    if families == {"ipv6"}:
        return "ipv6"
    return "both"


def _classes(nodes: Sequence[ClassNode]) -> list[ClassNode]:
    out: list[ClassNode] = []
    for n in nodes:
        out.append(n)
        out += _classes(n.children)
    return out


def _first(node: ClassNode) -> tuple[float, int]:
    seqs = [i.seq for i in node.items if isinstance(i, Line)]
    seqs += [_first(c) for c in node.children]
    return min(seqs, default=(float("inf"), 0))


def _minor(classid: str) -> int:
    return _hex(classid.partition(":")[2])


def _topological(items: list[T], edges: set[tuple[int, int]], key: Callable[[T], Any]) -> list[T]:
    """``items`` in an order where item j comes after item i for each (i, j) in ``edges``
    (indexes), ties broken by ``key``; a cycle, which no order satisfies, is broken at the
    item of the least key."""
    n = len(items)
    after: dict[int, list[int]] = {}
    waiting = [0] * n
    for i, j in edges:
        if i != j:
            after.setdefault(i, []).append(j)
            waiting[j] += 1
    heap = [(key(items[i]), i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    out: list[T] = []
    placed = [False] * n
    while len(out) < n:
        if not heap:
            i = min((i for i in range(n) if not placed[i]), key=lambda i: (key(items[i]), i))
            heapq.heappush(heap, (key(items[i]), i))
        _, i = heapq.heappop(heap)
        if placed[i]:
            continue
        placed[i] = True
        out.append(items[i])
        for j in after.get(i, []):
            waiting[j] -= 1
            if waiting[j] == 0 and not placed[j]:
                heapq.heappush(heap, (key(items[j]), j))
    return out


def _lines_below(node: ClassNode) -> list[Line]:
    return [i for c in _classes([node]) for i in c.items if isinstance(i, Line)]


def _sort(nodes: list[ClassNode], succ: dict[int, list[int]]) -> None:
    """Order sibling classes, and each class's lines, so that every line comes after those
    whose filters the kernel tries before its own (``succ``: ``id(line)`` -> the ids of the
    lines that come right after it)."""
    owner = {id(x): n for n, node in enumerate(nodes) for x in _lines_below(node)}
    between = {(owner[a], owner[b]) for a in owner for b in succ.get(a, ()) if b in owner}
    nodes[:] = _topological(nodes, between, lambda n: (_first(n), _minor(n.cls.classid)))
    for node in nodes:
        lines = [i for i in node.items if isinstance(i, Line)]
        comments = [i for i in node.items if not isinstance(i, Line)]
        at = {id(x): n for n, x in enumerate(lines)}
        among = {(at[a], at[b]) for a in at for b in succ.get(a, ()) if b in at}
        node.items = [*_topological(lines, among, lambda x: x.seq), *comments]
        _sort(node.children, succ)


def _edges(lines: Sequence[Line]) -> dict[int, list[int]]:
    """For each line (by ``id``), the lines whose filter comes right after one of its own in
    a pref of one protocol, as the kernel lists them."""
    at: dict[tuple[str, int], list[tuple[int, Line]]] = {}
    for line in lines:
        for protocol, pref, index in line.filters:
            at.setdefault((protocol, pref), []).append((index, line))
    out: dict[int, list[int]] = {}
    for listed in at.values():
        listed.sort(key=lambda x: x[0])
        for (_, a), (_, b) in itertools.pairwise(listed):
            if a is not b:
                out.setdefault(id(a), []).append(id(b))
    return out


def _order(node: QdiscNode, fs: FilterSet, problems: list[Problem]) -> None:
    """Order classes and lines as the kernel tries the filters; where the filters of a pref
    alternate between classes (x y x, which no order of the classes gives), the lines after
    the first class's run get prefs of their own, the free ones just above, in the kernel's
    order; warn where none are free."""
    while True:  # each split leaves its pref with one run: no pref is split twice
        _sort(node.classes, _edges(fs.lines))
        got: dict[tuple[str, int], list[int]] = {}
        for cn in _classes(node.classes):
            for item in cn.items:
                if isinstance(item, Line):
                    for protocol, pref, index in item.filters:
                        got.setdefault((protocol, pref), []).append(index)
        mixed = [key for key, indexes in sorted(got.items()) if indexes != sorted(indexes)]
        if not [key for key in mixed if _split(node, fs, key, problems)]:
            break
    for key in mixed:
        line = min(fl.line for fl in fs.lines if any(f[:2] == key for f in fl.filters))
        problems.append(
            Problem(
                "W615",
                f"the {key[0]} filters at pref {key[1] or '(flower: all)'} of "
                f"{node.q.handle} alternate between "
                "classes: a policy tries a class's lines together, and prefs of their own "
                "cannot keep their order here (a line of both families among them, or no "
                "pref left), so they are written in another order, which matters only where "
                "they overlap",
                line,
            )
        )


def _split(node: QdiscNode, fs: FilterSet, key: tuple[str, int], problems: list[Problem]) -> bool:
    """Give the lines of ``key``'s pref after its first run of one class's lines the next
    prefs up, one per run, in the kernel's order (W615), when they are free below the next
    pref of the parent and the lines are of ``key``'s family alone; whether it did."""
    protocol, pref = key
    family = _FAMILY_OF.get(protocol)
    listed = sorted((i, line) for line in fs.lines for p, k, i in line.filters if (p, k) == key)
    if family in (None, "both") or not pref or key in fs.hashed:
        return False
    if any(line.family != family for _, line in listed):
        # a line of both families among them: its family's part may need a pref of its own
        # (the other family's filters in another order), so it becomes a line per family
        both = [line for _, line in listed if line.family == "both"]
        if not both or any(line.police for line in both):  # one policer: kept one line
            return False
        for line in {id(x): x for x in both}.values():
            _part_families(node, fs, line)
        return True
    runs: list[list[Line]] = []
    for _, line in listed:
        if runs and runs[-1][-1].classid == line.classid:
            runs[-1].append(line)
        else:
            runs.append([line])
    written = listed[0][1].pref  # the line's pref (an IPv6 filter's is 32768 below)
    more = len(runs) - 1
    above = [line for line in fs.lines if line.pref > written]
    highest = V6_PREF - 1 if any(line.family != "ipv4" for line in fs.lines) else 0xFFFF
    if any(line.pref + more > highest for line in above):
        return False
    moved = written + more < min((line.pref for line in above), default=highest + 1)
    for line in [] if moved else above:  # no free prefs: the prefs above go up
        line.pref += more
        line.filters = [(p, k + more, i) for p, k, i in line.filters]
    for shift, run in enumerate(runs[1:], start=1):
        for line in run:
            line.pref += shift
            line.filters = [(p, k + shift if (p, k) == key else k, i) for p, k, i in line.filters]
    first = listed[0][1].line
    message = (
        f"the {protocol} filters at pref {pref} of {node.q.handle} alternate between classes, "
        "and a policy tries a class's lines at one pref together: written at prefs "
        f"{written}-{written + more}, one per run of one class's lines, in the kernel's order"
        + ("" if moved else f" (the prefs above {written} are {more} higher)")
        + ", so that apply builds them again"
    )
    problems.append(Problem("W615", message, first))
    return True


def _part_families(node: QdiscNode, fs: FilterSet, line: Line) -> None:
    """Put an IPv4 line and an IPv6 line in the place of ``line``, a line of both families:
    the same conditions and pref, each with its family's filters."""
    parts = [
        Line(
            line.conds,
            family,
            line.pref,
            line.police,
            line.classid,
            line.seq,
            [f for f in line.filters if _FAMILY_OF.get(f[0]) == family],
            line.police_index,
            line.line,
        )
        for family in ("ipv4", "ipv6")
    ]
    at = next(n for n, x in enumerate(fs.lines) if x is line)
    fs.lines[at : at + 1] = parts
    for cn in _classes(node.classes):
        for n, item in enumerate(cn.items):
            if item is line:
                cn.items[n : n + 1] = parts
                return


# ==== writing ==================================================================================


class _Writer:
    """An indenting writer that records every problem it writes as a comment (so that each
    warning is also a comment, and each comment a warning)."""

    def __init__(self, source: str) -> None:
        self.lines: list[str] = []
        self.source = source
        self.written: list[tuple[Problem, str]] = []
        self.qlen = DEFAULT_QLEN
        """The txqueuelen of the device whose tree is written."""

    def line(self, depth: int, text: str) -> None:
        self.lines.append(f"{INDENT * depth}{text}")

    def comment(self, depth: int, problem: Problem) -> None:
        self.written.append((problem, self.source))
        message = problem.message.replace("\n", " ")
        self.line(depth, f"# tcdsl import: {problem.code} at line {problem.line}: {message}")


def _match_text(line: Line, tree_family: str, marking: bool) -> str:
    words = ["match"]
    implied = _family_only(line.conds)
    raw = any(c.identity[0] == "raw" for c in line.conds)
    if line.family != "both" and (
        (tree_family in ("both", "none") and implied != line.family)
        or (line.family == "ipv6" and raw)
    ):
        words += ["family", line.family]
    words += [c.text for c in line.conds]
    if len(words) == 1:  # a node without keys, of the tree's family: every packet
        words.append("all")
    if line.pref != 1 or marking:
        words += ["pref", str(line.pref)]
    words += line.police
    return " ".join(words)


def _write_qdisc(
    w: _Writer,
    depth: int,
    node: QdiscNode,
    names: dict[str, str],
    root: bool,
    head: str = "",
    rates: Sequence[int] = (),
    marked: str = "at postrouting",
    stab_said: bool = False,
) -> None:
    """Write ``node`` (``marked``: where its fw filters' marks are said to be set;
    ``stab_said`` as for :func:`qdisc_words`)."""
    words, problems = qdisc_words(node.q, node.line, names, root, rates, stab_said, w.qlen)
    for problem in node.notes + problems:
        w.comment(depth, problem)
    text = f"{head}{' '.join(words)}"
    body = node.classes or node.child or node.body_notes or node.marks
    if not body:
        w.line(depth, text)
        return
    w.line(depth, f"{text} {{")
    for problem in node.body_notes:
        w.comment(depth + 1, problem)
    if node.marks is not None:
        m = node.marks
        words = [f"classify by mark {marked}"]
        if m.mask is not None:
            words.append(f"mask {m.mask:#x}")
        if m.pref != 1:
            words.append(f"pref {m.pref}")
        w.line(depth + 1, " ".join(words))
    if node.child is not None:
        _write_qdisc(w, depth + 1, node.child, names, False, rates=rates)
    r2q = node.q.options.get("r2q")
    for cn in node.classes:
        _write_class(w, depth + 1, cn, node, names, r2q.value if r2q is not None else None)
    w.line(depth, "}")


def _write_class(
    w: _Writer, depth: int, cn: ClassNode, q: QdiscNode, names: dict[str, str], r2q: object
) -> None:
    words, problems = class_words(cn.cls, cn.line, r2q if isinstance(r2q, int) else None)
    for problem in problems:
        w.comment(depth, problem)
    head = ["class", names[cn.cls.classid], "id", cn.cls.classid, *words]
    rate = _value(cn.cls.options, "rate")
    children = [_value(c.cls.options, "rate") for c in cn.children]
    if isinstance(rate, int) and sum(r for r in children if isinstance(r, int)) > rate:
        head.append("overbook")  # the kernel shows no such thing: it only silences W350
    if q.marks is not None and cn.cls.classid in q.marks.marks:
        head += ["mark", f"{q.marks.marks[cn.cls.classid]:#x}"]
    text = " ".join(head)
    if not (cn.children or cn.leaf or cn.items or cn.notes):
        w.line(depth, text)
        return
    w.line(depth, f"{text} {{")
    for item in cn.items:
        if isinstance(item, Line):
            w.line(depth + 1, _match_text(item, q.family, q.marks is not None))
        else:
            w.comment(depth + 1, item.problem)
    for child in cn.children:
        _write_class(w, depth + 1, child, q, names, r2q)
    for problem in cn.notes:
        w.comment(depth + 1, problem)
    if cn.leaf is not None:
        rates = [v for k in ("rate", "ceil") if isinstance(v := _value(cn.cls.options, k), int)]
        _write_qdisc(w, depth + 1, cn.leaf, names, False, rates=rates)
    w.line(depth, "}")


@dataclass
class _Mq:
    """An mq root: its qdisc, and the qdiscs written on its queues, by queue number."""

    q: TcQdisc
    line: int
    queues: list[tuple[int, QdiscNode]]


def _mq(dev: _Device, q: TcQdisc, line: int, problems: list[Problem]) -> _Mq:
    """The mq root ``q`` with the qdiscs of its queues but the kernel's own (handle ``0:``,
    what it puts on each queue, as tcdsl leaves a queue the policy does not write), except on
    the queues in use past the last other one: a written tree owns no queue past its highest,
    and apply refuses a device with more in use (found by a tester: the policy import wrote
    was refused on the device it came from), so those are written as their kind."""
    major = _major(q.handle)
    queues = []
    own = [
        _minor(parent)
        for parent, found in dev.below.items()
        if _major(parent) == major and found[0].handle != "0:"
    ]
    in_use = dev.text.tx_in_use or 0
    past = max(own, default=in_use)
    for parent, found in dev.below.items():
        if _major(parent) != major:
            continue
        if found[0].handle == "0:" and not past < _minor(parent) <= in_use:
            continue
        # a queue takes what a root does (pfifo_fast too), and what a class does
        node = (
            _build(dev, *found, problems) if found[0].kind in ROOTS else _leaf(dev, found, problems)
        )
        if node is not None:
            queues.append((_minor(parent), node))
    queues.sort(key=lambda queue: queue[0])
    _one_family(*(node for _, node in queues))
    return _Mq(q, line, queues)


def _write_mq(w: _Writer, depth: int, mq: _Mq, names: dict[str, str], head: str) -> None:
    """Write an mq root and its queues; the queues' size table on the mq's line, where the
    language has it (every queue's qdisc gets it)."""
    words = ["mq", "handle", mq.q.handle]
    tables = []
    for _, node in mq.queues:
        p = _Params(node.q, node.line)
        _stab(p)
        tables.append(tuple(p.words))
    said = next((table for table in tables if table), ())
    words += said
    if "stab" in mq.q.options:
        message = (
            f"mq {mq.q.handle} has a size table of its own, which counts nothing (packets are "
            "queued to its queues' qdiscs); left out"
        )
        w.comment(depth, Problem("W611", message, mq.line))
    for (n, node), table in zip(mq.queues, tables, strict=True):
        if table != said:
            w.comment(
                depth,
                Problem(
                    "W611",
                    f"the size table of queue {n}'s {node.q.kind} ({' '.join(table) or 'none'}) "
                    f"is not another queue's ({' '.join(said)}): the language gives every "
                    "queue the mq's, written here",
                    node.line,
                ),
            )
    if not mq.queues:
        w.line(depth, f"{head}{' '.join(words)}")
        return
    w.line(depth, f"{head}{' '.join(words)} {{")
    for n, node in mq.queues:
        _write_qdisc(w, depth + 1, node, names, False, head=f"queue {n} ", stab_said=True)
    w.line(depth, "}")


def _clsact(dev: _Device) -> tuple[TcQdisc, int] | None:
    """The device's clsact qdisc (in its ingress slot), or None."""
    return dev.ingress if dev.ingress is not None and dev.ingress[0].kind == "clsact" else None


def _clsact_ingress(dev: _Device) -> list[Problem]:
    """W613 for each filter on the ingress hook of an mq tree's clsact qdisc (listed under
    it, or without a parent but with a class or a redirect): the language has none there."""
    clsact = _clsact(dev)
    if clsact is None:
        return []
    found = dev.filters.get(str(ir.CLSACT_INGRESS), [])
    found += [e for e in dev.filters.get(clsact[0].handle, []) if _at_ingress(e)]
    return [
        Problem(
            "W613",
            f"filter pref {e.filter.pref} ({e.filter.protocol}, {e.filter.kind}) on the "
            "ingress hook of the clsact qdisc: an mq tree's interface has no ingress and no "
            "download (E268); left out",
            e.line,
        )
        for e in found
    ]


def _at_ingress(entry: FilterEntry) -> bool:
    """Whether a clsact's filter listed without its parent is an ingress one: it gives a
    class or redirects (an mq tree's steering does neither)."""
    return bool(entry.filter.flowid) or any(a[0] == "mirred" for a in entry.filter.actions)


STEERING = str(ir.CLSACT_EGRESS)
"""Where an mq tree's steering filters are: the egress of a clsact qdisc."""


def _steered(dev: _Device, mq: _Mq, policy: ir.Policy | None) -> list[Problem]:
    """W622 when the filters that steer packets to the TX queues (a clsact qdisc's egress
    filters) are not those the policy written makes: one per line of a queue's qdisc, in the
    policy's order, each setting its TX queue. Compared protocol by protocol, the prefs one
    after the other in u32's order (a hashed pref's buckets side by side)."""
    if policy is None:
        return []
    clsact = _clsact(dev)
    entries = list(dev.filters.get(STEERING, []))
    if clsact is not None:  # listed without their parent: those that set no class
        entries += [e for e in dev.filters.get(clsact[0].handle, []) if not _at_ingress(e)]
    walked, _ = unhashed(entries)
    got: dict[str, list[tuple[int, Rule]]] = {}
    for e in walked:
        f = e.filter
        if not f.link:
            rule = (f.kind, f.keys, f.flower, f.actions)
            got.setdefault(f.protocol, []).append((f.pref, rule))
    want: dict[str, list[tuple[int, Rule]]] = {}
    for iface in expected_policy(policy).interfaces:
        for x in iface.filters:
            if x.parent == STEERING and not x.link:
                rule = (x.kind, x.keys, x.flower, x.actions)
                want.setdefault(x.protocol, []).append((x.pref, rule))

    def rules(found: list[tuple[int, Rule]]) -> list[Rule]:  # the prefs in order
        return [rule for _, rule in sorted(found, key=lambda item: item[0])]

    paired = [(rules(want[k]), rules(got[k])) for k in want] if want.keys() == got.keys() else []
    same_rules = want.keys() == got.keys() and all(_same_rules(a, b) for a, b in paired)
    if same_rules and all(_same_first_match(a, b) for a, b in paired):
        return []
    made = sum(map(len, want.values()))
    shown = sum(map(len, got.values()))
    if not made:
        assert clsact is not None  # else neither has a filter: the same
        message = (
            f"the clsact qdisc's {shown} egress filter(s) are not the policy's: its queues' "
            "lines steer nothing, so applying it leaves the clsact qdisc and its filters as "
            "they are (not in the policy; they may go on picking a packet's queue)"
        )
        return [Problem("W622", message, clsact[1])]
    if clsact is None:
        return [
            Problem(
                "W622",
                f"nothing here steers packets to {dev.text.device}'s TX queues (no clsact "
                "qdisc): the kernel picks a packet's queue (XPS, or a hash of its flow) and "
                f"the lines only classify within it; the policy written adds {made} filter(s) "
                "on a clsact qdisc that set each matching packet's queue",
                mq.line,
            )
        ]
    kinds = sorted({rule[0] for found in got.values() for _, rule in found} - {"u32", "flower"})
    other = (
        f" ({' and '.join(kinds)} among them, which the language has no word for: a program "
        "there may pick the queue, and the class too, as xdp-cpumap-tc's do for LibreQoS)"
        if kinds
        else ""
    )
    if same_rules:
        message = (
            f"the clsact qdisc's {shown} egress filter(s) are those of the policy written, "
            "in another order: lines that one packet can match are on different queues (a "
            "spread tree tries them in the tree's order, the written form queue by queue), "
            "so applying it sends such a packet to another queue, and another class, than now"
        )
    else:
        message = (
            f"the clsact qdisc's {shown} egress filter(s){other} are not the {made} that "
            "steer the policy written (one per line of a queue's qdisc, in the policy's "
            "order, setting its TX queue): applying it replaces them, and a packet may leave "
            "by another queue than now"
        )
    return [Problem("W622", message, clsact[1])]


Rule = tuple[str, tuple[tuple[int, int, int], ...], object, tuple[object, ...]]
"""A steering filter: its kind, u32 keys, flower match and actions (the queue it sets)."""


def _same_rules(want: list[Rule], got: list[Rule]) -> bool:
    """Whether two lists hold the same rules, in whatever order."""
    return want == got or sorted(map(repr, want)) == sorted(map(repr, got))


def _same_first_match(want: list[Rule], got: list[Rule]) -> bool:
    """Whether two lists of the same rules (:func:`_same_rules`), tried in order, steer
    every packet alike: any two that one packet can match and that set other queues are in
    the same order (a spread tree lists its rules in the tree's order, the written form
    queue by queue, which matters only where they overlap; so does how the rules fall into
    prefs)."""
    if want == got:
        return True
    if any(rule[0] != "u32" for rule in want):
        return False
    place: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    for n, rule in enumerate(got):
        text = repr(rule)
        place[(text, seen.get(text, 0))] = n
        seen[text] = seen.get(text, 0) + 1
    seen.clear()
    order = []
    for rule in want:
        text = repr(rule)
        order.append(place[(text, seen.get(text, 0))])
        seen[text] = seen.get(text, 0) + 1

    def swapped(a: int, b: int) -> bool:  # a pair in another order that matters
        if (a < b) == (order[a] < order[b]) or want[a][3] == want[b][3]:
            return False
        return _overlap(want[a], want[b])

    # Rules overlap only where their keys agree at the offsets they share. Bucketed by the
    # bits most rules fix at one offset (a /32 each: a bucket each; of the offsets all rules
    # have keys at, the one that parts them most), a pair of two buckets never overlaps; the
    # few rules that fix fewer bits there (a /16 among /32s) are paired with every rule.
    offsets = set.intersection(*({k[2] for k in rule[1]} for rule in want))
    buckets: dict[int, list[int]] = {}
    broad = list(range(len(want)))
    for offset in sorted(offsets):
        fixed = [_fixed(rule, offset) for rule in want]
        mask = max(Counter(fixed).items(), key=lambda item: (item[1], item[0]))[0]
        parted: dict[int, list[int]] = {}
        for n, rule in enumerate(want):
            if fixed[n] & mask == mask:
                value = functools.reduce(
                    operator.or_, (k[0] & k[1] for k in rule[1] if k[2] == offset), 0
                )
                parted.setdefault(value & mask, []).append(n)
        if len(parted) > len(buckets):
            buckets = parted
            broad = [n for n, m in enumerate(fixed) if m & mask != mask]
    if not buckets:
        buckets = {0: []}  # no offset in common: every pair is compared
    pairs = sum(len(members) ** 2 for members in buckets.values())
    if pairs + len(broad) * len(want) > _MOST_PAIRS:
        return False  # (said as not the same: a warning too many, not a wrong silence)
    for members in buckets.values():
        if any(swapped(a, b) for i, a in enumerate(members) for b in members[i + 1 :]):
            return False
    return not any(swapped(a, b) for a in broad for b in range(len(want)) if a != b)


_MOST_PAIRS = 5_000_000
"""The most pairs of rules whose order is compared (beyond it, W622 without a look)."""


def _fixed(rule: Rule, offset: int) -> int:
    """The bits a rule's keys at ``offset`` fix."""
    return functools.reduce(operator.or_, (k[1] for k in rule[1] if k[2] == offset), 0)


def _overlap(a: Rule, b: Rule) -> bool:
    """Whether one packet can match both u32 rules: their keys agree where both fix bits."""
    return all((x[0] ^ y[0]) & x[1] & y[1] == 0 for x in a[1] for y in b[1] if x[2] == y[2])


_FAMILY_OF = {"all": "both", "ip": "ipv4", "ipv6": "ipv6"}
"""A redirect's protocol, as the family of the arrivals it takes."""
_FAMILY_WORD = {"ipv4": "IPv4", "ipv6": "IPv6"}


@dataclass
class _Redirect:
    device: str
    connmark: bool


def _redirect(entry: FilterEntry) -> _Redirect | None:
    """The download redirect tcdsl writes (``protocol all u32 match u32 0 0 [action connmark]
    action mirred egress redirect dev IFB``), or one of one family (``protocol ip``, as many
    scripts write it), or None."""
    f = entry.filter
    if f.kind != "u32" or f.protocol not in _FAMILY_OF or any(m for _, m, _ in f.keys):
        return None
    actions = list(f.actions)
    connmark = bool(actions) and actions[0] == ("connmark",)
    if connmark:
        actions = actions[1:]
    if len(actions) != 1 or actions[0][:3] != ("mirred", "egress", "redirect"):
        return None
    return _Redirect(str(actions[0][3]), connmark)


_PRETTY_PROTOCOLS = ("ip", "ipv6")
"""The protocols whose u32 keys ``tc -p`` prints its own way, leaving some out (any other
protocol's it prints as without ``-p``)."""


def _unread(text: DeviceText, entries: Sequence[FilterEntry]) -> Problem | None:
    """E605 for the first u32 node whose keys the text does not show all of: keys as ``tc
    -p`` prints them, or none at all in a text that may be ``tc -p``'s. A node shown without
    keys has none (``ip6 dst ::/0``) in tc's text without ``-p``: the live kernel's as read
    here, or a file that shows the raw keys of another IPv4 or IPv6 node (``tc -p`` shows
    none)."""
    u32 = [e for e in entries if e.filter.kind == "u32"]
    raw = text.raw or any(e.filter.keys and e.filter.protocol in _PRETTY_PROTOCOLS for e in u32)
    # a node shown as tc -p shows keys first: it says what the text is
    u32.sort(key=lambda e: not e.filter.unread)
    for e in u32:
        f = e.filter
        what = f"filter pref {f.pref} ({f.protocol}, u32)"
        if f.unread:
            message = (
                f"{what} shows its keys as 'tc -p' prints them ('match IP src 10.0.0.0/8'), "
                "which leaves some out (every IPv6 key, any key of mask 0): the text cannot "
                f"say what the filters match; save it again without -p (tc filter show dev "
                f"{text.device} ...)"
            )
        elif f.keyless and not raw and f.protocol in _PRETTY_PROTOCOLS:
            message = (
                f"{what} shows no key: a node without keys shows none ('ip6 dst ::/0' makes "
                "one, for every packet), and so does the text of 'tc -p' for a node whose keys it "
                "does not print (every IPv6 key, any key of mask 0); this text shows no other "
                "IPv4 or IPv6 key to tell which it is: import the live state instead "
                f"(tcdsl import -i {text.device}, without --from)"
            )
        else:
            continue
        return Problem("E605", message, e.line)
    return None


def import_policy(
    main: DeviceText, read_other: Callable[[str], DeviceText | None] | None = None
) -> ImportResult:
    """The policy that builds what ``main`` shows; ``read_other`` gives the text of the IFB a
    download redirects to (None where it cannot be read)."""
    sources = {main.source: main.text}
    dev = _device(main)
    root = dev.root if dev.root is not None and dev.root[0].handle != "0:" else None
    errors: list[Diagnostic] = []
    if root is not None and root[0].kind not in ROOTS and root[0].kind != "mq":
        message = (
            f"the root qdisc of {main.device} is '{root[0].kind}', which the language has "
            "not: there is no tree to write"
        )
        errors.append(_located(Problem("E607", message, root[1]), main.source, sources))
    if root is None and dev.ingress is None:
        what = (
            f"its root qdisc is the kernel's default ({dev.root[0].kind})"
            if dev.root is not None
            else "the text shows no qdisc"
        )
        if main.text.lstrip().startswith(("[", "{")):  # (found by a tester)
            what += " (it looks like tc's JSON output, -j, which import does not read: save "
            what += "the text tc prints without -j)"
        message = f"{main.device} has no traffic-control configuration to import: {what}"
        line = dev.root[1] if dev.root is not None else 1
        errors.append(_located(Problem("E606", message, line), main.source, sources))
    unread = _unread(main, [e for found in dev.filters.values() for e in found])
    if unread is not None:
        errors.append(_located(unread, main.source, sources))
    if errors:
        return ImportResult(None, errors, sources)
    w = _Writer(main.source)
    w.qlen = main.qlen or DEFAULT_QLEN  # htb's direct queue as made: not said when it is that
    w.line(
        0,
        f"# Imported by tcdsl {__version__} ('tcdsl import') from the tc state of "
        f"{main.device} ({main.source}).",
    )
    w.line(
        0,
        "# Classes are named after their tc ids (c1_10 is 1:10); ids and handles are written, "
        "so renaming a class changes nothing in the kernel.",
    )
    problems = list(dev.problems)
    mq = upload = None
    if root is not None and root[0].kind == "mq":
        mq = _mq(dev, root[0], root[1], problems)
        problems += _clsact_ingress(dev)
    elif root is not None:
        upload = _build(dev, root[0], root[1], problems)
        _one_family(upload)
    ingress: FilterSet | None = None
    download: tuple[_Redirect, _Device, QdiscNode, list[Problem]] | None = None
    ingress_notes: list[Problem] = []
    if dev.ingress is not None and (mq is None or _clsact(dev) is None):
        ingress, download = _ingress(dev, read_other, ingress_notes, sources)
    names = _names(dev)
    tree = upload or (mq.queues[0][1] if mq is not None and mq.queues else None)
    family = _family(tree.family, tree.flower, tree.linear) if tree is not None else ""

    def write_root(depth: int, head: str) -> None:
        if mq is not None:
            _write_mq(w, depth, mq, names, head + family)
        elif upload is not None:
            _write_qdisc(w, depth, upload, names, True, head=head + family)

    if root is not None and download is None and ingress is None and not ingress_notes:
        for p in problems:
            w.comment(0, p)
        write_root(0, f"interface {_ifname(main.device)} ")
    else:
        w.line(0, f"interface {_ifname(main.device)} {{")
        for p in problems:
            w.comment(1, p)
        write_root(1, "upload ")
        if download is not None:
            redirect, ifb, node, ifb_problems = download
            w.source = ifb.text.source
            for p in ifb_problems:
                w.comment(1, p)
            head = f"download via {_ifname(redirect.device)} "
            head += "connmark " if redirect.connmark else ""
            head += _family(node.family, node.flower, node.linear)
            marked = f"from {_ifname(main.device)}"  # where a download's marks are set
            w.qlen = ifb.text.qlen or DEFAULT_QLEN
            _write_qdisc(w, 1, node, _names(ifb), True, head=head, marked=marked)
            w.qlen = main.qlen or DEFAULT_QLEN
            w.source = main.source
        for p in ingress_notes:
            w.comment(1, p)
        if ingress is not None and ingress.lines:
            family = _tree_family(ingress)
            w.line(1, f"ingress {_family(family, ingress.flower, ingress.linear)}{{")
            for fl in sorted(ingress.lines, key=lambda x: x.seq):
                w.line(2, _match_text(fl, family, False))
            w.line(1, "}")
        w.line(0, "}")
    text = "\n".join(w.lines) + "\n"
    uncompiled, policy = _uncompiled(text, main.device, sources)
    if mq is not None:
        for p in _steered(dev, mq, policy):
            w.written.append((p, main.source))
            # under the header, with the comments before the interface
            w.lines.insert(2, f"# tcdsl import: {p.code} at line {p.line}: {p.message}")
        text = "\n".join(w.lines) + "\n"
    diagnostics = [_located(p, source, sources) for p, source in w.written]
    diagnostics.sort(key=lambda d: (d.span.file != main.source, d.span.file, d.span.line, d.code))
    return ImportResult(text, diagnostics + uncompiled, sources)


def _uncompiled(
    text: str, device: str, sources: dict[str, str]
) -> tuple[list[Diagnostic], ir.Policy | None]:
    """E609 for each error the policy written would get from ``tcdsl check`` (what tc showed
    that import writes as the language cannot take it), at its line of the policy; and the
    policy, allocated, when it compiles."""
    from tcdsl.driver import analyse  # (the compiler, for a check of the text written)

    label = f"imported:{device}.tcp"
    result = analyse(label, loader=lambda _: text)
    errors = [d for d in result.diagnostics if d.is_error]
    if errors:
        sources[label] = text
    found = [
        Diagnostic.error(
            "E609",
            f"the policy written does not compile: {d.message} [{d.code}]; edit it (tc "
            "takes what the language does not), and please report it",
            d.span,
        )
        for d in errors
    ]
    return found, result.policy if not errors else None


def _located(problem: Problem, source: str, sources: dict[str, str]) -> Diagnostic:
    """A problem as a diagnostic at its line of ``source``'s text."""
    lines = sources.get(source, "").splitlines()
    width = len(lines[problem.line - 1]) if 0 < problem.line <= len(lines) else 0
    span = Span(source, problem.line, 1, problem.line, max(width, 1) + 1)
    if problem.code.startswith("E"):
        return Diagnostic.error(problem.code, problem.message, span)
    return Diagnostic.warning(problem.code, problem.message, span)


def _ingress(
    dev: _Device,
    read_other: Callable[[str], DeviceText | None] | None,
    notes: list[Problem],
    sources: dict[str, str],
) -> tuple[FilterSet | None, tuple[_Redirect, _Device, QdiscNode, list[Problem]] | None]:
    """The ingress qdisc's filters: police lines, or the redirect of a download (with the
    IFB's tree, where ``read_other`` can read it)."""
    assert dev.ingress is not None
    q, line = dev.ingress
    entries = dev.filters.get(q.handle, [])
    if q.kind != "ingress":
        notes.append(
            Problem("W610", f"the language has no '{q.kind}' qdisc ({q.handle}); left out", line)
        )
        return None, None
    redirects = [(e, r) for e in entries if (r := _redirect(e)) is not None]
    if not redirects:
        lines = filter_set(entries, set(), ingress=True)
        notes += [p for p, _ in lines.problems]
        return lines, None
    entry, redirect = redirects[0]
    taken = [e for e, r in redirects if r == redirect]
    families = {_FAMILY_OF[e.filter.protocol] for e in taken}
    if "both" not in families and families != {"ipv4", "ipv6"}:
        (family,) = families
        notes.append(
            Problem(
                "W620",
                f"ingress redirects the {_FAMILY_WORD[family]} arrivals only (protocol "
                f"{entry.filter.protocol}) to {redirect.device}; a download redirects every "
                "protocol, so the other family's arrivals go there too, where its tree sends "
                "what no line takes (its default class; an htb's direct queue, unshaped, "
                "where it has none)",
                entry.line,
            )
        )
    if entry.filter.pref != REDIRECT_PREF or entry.filter.flowid:
        shown = f" with flowid {entry.filter.flowid}" if entry.filter.flowid else ""
        notes.append(
            Problem(
                "W620",
                f"ingress redirects to {redirect.device} at pref {entry.filter.pref}{shown}: a "
                f"download's redirect is at pref {REDIRECT_PREF} with no class, so applying the "
                "policy makes it anew (the same packets go to the IFB)",
                entry.line,
            )
        )
    download = None
    other = read_other(redirect.device) if read_other is not None else None
    if other is not None:
        sources[other.source] = other.text
        ifb = _device(other)
        if ifb.root is not None and ifb.root[0].handle != "0:" and ifb.root[0].kind in ROOTS:
            ifb_problems = list(ifb.problems)
            node = _build(ifb, ifb.root[0], ifb.root[1], ifb_problems)
            _one_family(node)
            download = (redirect, ifb, node, ifb_problems)
    if download is None:
        by_mark = (  # (the IFB's tree imported alone says 'at postrouting': E256 in a download)
            f" (its 'classify by mark' then 'from {dev.text.device}', not 'at postrouting')"
            if redirect.connmark
            else ""
        )
        notes.append(
            Problem(
                "W618",
                f"ingress redirects to {redirect.device}, whose tree is not in the text read: "
                f"import {redirect.device} on its own and write it as 'download via "
                f"{redirect.device}'{by_mark}",
                entry.line,
            )
        )
    for e in entries:
        if e not in taken:
            notes.append(
                Problem(
                    "W613",
                    f"filter pref {e.filter.pref} on the ingress of an interface with a "
                    "download: the language puts no other filter there; left out",
                    e.line,
                )
            )
    return None, download


def _all_qdiscs(node: QdiscNode | None) -> list[QdiscNode]:
    if node is None:
        return []
    out = [node]
    if node.child is not None:
        out += _all_qdiscs(node.child)
    for cn in _classes(node.classes):
        out += _all_qdiscs(cn.leaf)
    return out


def _family(family: str, flower: bool = False, linear: bool = False) -> str:
    """The words of a tree's family (and classifier) after its name."""
    words = "" if family in ("both", "none") else f"family {family} "
    return words + ("classifier flower " if flower else "classifier u32 linear " if linear else "")


_BARE_IFNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _ifname(name: str) -> str:
    if _BARE_IFNAME.fullmatch(name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
