"""Apply generated scripts to a real kernel, read the state back with tc, compare with the IR.

Each policy runs in a fresh network namespace holding one veth device per interface the policy
names. The script is applied twice (it must be idempotent); after each run ``tc`` is asked what
the kernel holds, the text is parsed by the small read-back parser below, and every qdisc,
class and filter is compared with the allocated IR (``Result.policy``). The expected values are
derived from the IR here, independently of ``tcdsl.commands``, so the test checks the whole
path: IR -> tc words -> tc's parser -> kernel -> tc's printer.

A few policies also get traffic: UDP packets sent out of the interface must be counted by the
class the policy puts them in.

Policies needing a qdisc, classifier or tool this host lacks are skipped, naming what is
missing. The whole module is skipped when not root; every test is skipped when ``ip netns``
does not work.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tests.conftest import ROOT, policy_files

if os.geteuid() != 0:
    pytest.skip("apply tests need root (network namespaces, tc)", allow_module_level=True)
for _tool in ("ip", "tc"):
    if shutil.which(_tool) is None:
        pytest.skip(f"apply tests need '{_tool}' (iproute2)", allow_module_level=True)

APPLY_POLICIES = ROOT / "tests" / "apply_policies"
"""Extra policies for this test only: features the host kernel supports, more coverage."""

TIMEOUT = 20


# ==== read-back parser (tc's text output -> values) ============================================
#
# tc prints rates in bits/s with a decimal unit chosen so the number is an integer, dividing
# (and truncating) by 1000 while the value is at least 1Mbit ("3333333bit" shows as 3333Kbit);
# sizes in bytes with binary Kb/Mb units rounded to the nearest unit when within 16 bytes
# (1 KiB for Mb); u32 keys as 32-bit value/mask words at a word-aligned offset, keys of one
# filter that fall in the same word merged into one.

_RATE = re.compile(r"(\d+)([KMGT]?)(i?)bit")
_SIZE = re.compile(r"(\d+(?:\.\d+)?(?:e\+\d+)?)([KMG]?)b(?:/\d+)?")
_KEY = re.compile(r"match ([0-9a-f]{8})/([0-9a-f]{8}) at (-?\d+)")
_COUNTERS = re.compile(r"\b(direct_packets_stat) \d+")
_FH = re.compile(r"([0-9a-f]*):([0-9a-f]*):([0-9a-f]*)")


def parse_rate(text: str) -> int:
    """``10Mbit`` -> 10000000; ``1500Kbit`` -> 1500000; ``800bit`` -> 800 (bits/s)."""
    m = _RATE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc rate: {text!r}")
    base = 1024 if m.group(3) else 1000
    scale = {"": 1, "K": base, "M": base**2, "G": base**3, "T": base**4}[m.group(2)]
    return int(m.group(1)) * scale


def parse_size(text: str) -> int:
    """``15Kb/1`` -> 15360; ``1539b`` -> 1539; ``1Mb`` -> 1048576 (bytes)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a tc size: {text!r}")
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)]
    return round(float(m.group(1)) * scale)


def tc_shown_rate(bits_per_second: int) -> int:
    """The rate tc prints for one it was given, in bits/s (tc keeps bytes/s; see above)."""
    rate = bits_per_second // 8 * 8
    scale = 1
    for _ in range(4):
        if rate < 1000 or (rate % 1000 and rate < 1000 * 1000):
            break
        rate //= 1000
        scale *= 1000
    return rate * scale


def tc_shown_size(size: int) -> int:
    """The size tc prints for one it was given, in bytes (iproute2's sprint_size)."""
    kilo, mega = 1024, 1024 * 1024
    if size >= mega and abs(mega * round(size / mega) - size) < 1024:
        return mega * round(size / mega)
    if size >= kilo and abs(kilo * round(size / kilo) - size) < 16:
        return kilo * round(size / kilo)
    return size


def _after(words: list[str], key: str) -> str | None:
    """The word after the first ``key`` in ``words``."""
    try:
        return words[words.index(key) + 1]
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class TcQdisc:
    """One line of ``tc -d qdisc show``."""

    kind: str
    handle: str
    parent: str
    """``root`` or a class id such as ``1:10``."""
    words: tuple[str, ...]

    def opt(self, key: str) -> str | None:
        return _after(list(self.words), key)


@dataclass(frozen=True)
class TcClass:
    """One line of ``tc -d class show``."""

    kind: str
    classid: str
    parent: str
    leaf: str | None
    words: tuple[str, ...]

    def opt(self, key: str) -> str | None:
        return _after(list(self.words), key)


Key = tuple[int, int, int]
"""A u32 key as the kernel holds it: (value, mask, offset), value and mask in host order."""


@dataclass(frozen=True)
class TcFilter:
    """One filter node of ``tc filter show``: a u32 rule (with keys) or an fw mapping."""

    kind: str
    protocol: str
    pref: int
    flowid: str
    keys: tuple[Key, ...] = ()
    mark: int | None = None
    node: int = field(default=0, compare=False)
    """The u32 node number (``fh 800::801`` -> 0x801): the order within one pref."""


def parse_qdiscs(text: str) -> list[TcQdisc]:
    """Parse ``tc -d qdisc show dev X``."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "qdisc":
            continue
        kind, handle = words[1], words[2]
        parent = "root" if words[3] == "root" else _after(words, "parent") or "?"
        out.append(TcQdisc(kind, handle, parent, tuple(words[3:])))
    return out


def parse_classes(text: str) -> list[TcClass]:
    """Parse ``tc -d class show dev X``."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "class":
            continue
        kind, classid = words[1], words[2]
        parent = "root" if words[3] == "root" else _after(words, "parent") or "?"
        out.append(TcClass(kind, classid, parent, _after(words, "leaf"), tuple(words[3:])))
    return out


def parse_filters(text: str) -> list[TcFilter]:
    """Parse ``tc filter show dev X parent P``: the rules only, not u32 hash tables."""
    blocks: list[tuple[list[str], list[Key]]] = []
    for line in text.splitlines():
        if line.startswith("filter "):
            blocks.append((line.split(), []))
        elif blocks and (m := _KEY.search(line)) is not None:
            blocks[-1][1].append((int(m.group(1), 16), int(m.group(2), 16), int(m.group(3))))
    out = []
    for words, keys in blocks:
        protocol = _after(words, "protocol") or "?"
        pref_text = _after(words, "pref")
        assert pref_text is not None, words
        kind = words[words.index("pref") + 2]
        if kind == "u32":
            fh = _after(words, "fh")
            m = _FH.fullmatch(fh or "")
            if m is None or not m.group(3) or int(m.group(3), 16) == 0:
                continue  # the filter head or a hash table, not a rule
            flowid = _after(words, "*flowid") or _after(words, "flowid") or "?"
            node = int(m.group(3), 16)
            out.append(TcFilter(kind, protocol, int(pref_text), flowid, tuple(keys), node=node))
        elif kind == "fw":
            handle = _after(words, "handle")
            if handle is None:
                continue
            flowid = _after(words, "classid") or _after(words, "flowid") or "?"
            out.append(TcFilter(kind, protocol, int(pref_text), flowid, mark=int(handle, 0)))
        else:
            raise AssertionError(f"unexpected filter kind {kind!r}: {' '.join(words)}")
    return out


# ==== expected state, from the allocated IR ====================================================


class UnpackableKey(Exception):
    """Keys tc cannot hold as the policy means them: the compiler should have refused them."""


def _pack(keys: list[list[int]], value: int, mask: int, offset: int) -> None:
    """Add one key the way tc's pack_key does: merge keys on the same word, refuse conflicts."""
    value &= mask
    for key in keys:
        if key[2] == offset:
            if (value ^ key[0]) & mask & key[1]:
                raise UnpackableKey(f"keys at offset {offset} contradict each other (tc refuses)")
            key[0] |= value
            key[1] |= mask
            return
    keys.append([value, mask, offset])


def _field(value: int, mask: int, width: int, offset: int) -> tuple[int, int, int]:
    """Place a ``width``-bit field starting at byte ``offset`` in its 32-bit word."""
    byte = offset % 4
    if byte * 8 + width > 32:
        raise UnpackableKey(f"a u{width} key at offset {offset} crosses a 32-bit word")
    shift = 32 - width - byte * 8
    return value << shift, mask << shift, offset - byte


IP_FIELDS = {"tos": (8, 1), "protocol": (8, 9), "sport": (16, 20), "dport": (16, 22)}
"""``ip FIELD VALUE MASK`` -> (width in bits, byte offset in the IPv4 header, no options)."""


def expected_keys(words: tuple[tuple[str, ...], ...]) -> tuple[Key, ...]:
    """The kernel keys for a filter's ``match`` words, as the policy means them."""
    keys: list[list[int]] = []
    for w in words:
        if w[0] == "ip" and w[1] in ("src", "dst"):
            net = IPv4Network(w[2])
            offset = 12 if w[1] == "src" else 16
            _pack(keys, int(net.network_address), int(net.netmask), offset)
            continue
        if w[0] == "ip":
            width, offset = IP_FIELDS[w[1]]
            value, mask = int(w[2], 0), int(w[3], 0)
        else:
            assert w[0] in ("u8", "u16", "u32") and w[3] == "at", w
            width, value, mask, offset = int(w[0][1:]), int(w[1], 0), int(w[2], 0), int(w[4])
        _pack(keys, *_field(value, mask, width, offset))
    return tuple((k[0], k[1], k[2]) for k in keys)


@dataclass
class Expected:
    """What one interface should look like in the kernel."""

    qdiscs: dict[str, tuple[str, str]] = field(default_factory=dict)
    """handle -> (kind, parent)."""
    classes: dict[str, dict[str, object]] = field(default_factory=dict)
    """class id -> the values tc shows for it."""
    qdisc_opts: dict[str, dict[str, object]] = field(default_factory=dict)
    """handle -> the option values tc shows for it."""
    filters: dict[str, list[TcFilter]] = field(default_factory=dict)
    """parent -> filters in kernel order."""


def _rate(value: object) -> int:
    assert isinstance(value, ir.Rate), f"unresolved rate {value!r}"
    return value.bits_per_second


def _expect_class(q: ir.Htb | ir.Cbq | ir.Prio, cls: ir.Class, parent: str, exp: Expected) -> None:
    assert cls.classid is not None
    values: dict[str, object] = {"kind": q.kind, "parent": parent}
    if isinstance(q, ir.Htb):
        values["rate"] = tc_shown_rate(_rate(cls.rate))
        values["ceil"] = tc_shown_rate(_rate(cls.ceil if cls.ceil is not None else cls.rate))
        if not cls.children:  # tc shows prio and quantum of leaf classes only (level 0)
            values["prio"] = cls.prio.value if cls.prio is not None else 0
            if cls.quantum is not None:
                values["quantum"] = cls.quantum.bytes
        if cls.burst is not None:
            values["burst"] = cls.burst.bytes
        if cls.cburst is not None:
            values["cburst"] = cls.cburst.bytes
    leaf = cls.leaf
    values["leaf"] = leaf.handle.qdisc if leaf is not None and leaf.handle is not None else None
    exp.classes[str(cls.classid)] = values
    if leaf is not None:
        _expect_qdisc(leaf, str(cls.classid), exp)
    for child in cls.children:
        _expect_class(q, child, str(cls.classid), exp)


def _expect_qdisc(q: ir.Qdisc, parent: str, exp: Expected) -> None:
    assert q.handle is not None
    handle = q.handle.qdisc
    exp.qdiscs[handle] = (q.kind, parent)
    opts: dict[str, object] = {}
    match q:
        case ir.Htb():
            default = 0
            if q.default is not None:
                name = q.default.name
                found = [
                    c for t in q.classes for c in t.walk() if c.name == name and not c.implicit
                ]
                assert found and found[0].classid is not None
                default = found[0].classid.minor
            opts["default"] = default
            if q.r2q is not None:
                opts["r2q"] = q.r2q.value
        case ir.Tbf():
            assert q.rate is not None
            opts["rate"] = tc_shown_rate(q.rate.bits_per_second)
            if q.peakrate is not None:
                opts["peakrate"] = tc_shown_rate(q.peakrate.bits_per_second)
            if q.burst is not None:
                opts["burst"] = q.burst.bytes
        case ir.Pfifo() if q.limit is not None:
            opts["limit"] = f"{q.limit.value}p"
        case ir.Bfifo() if q.limit is not None:
            opts["limit"] = tc_shown_size(q.limit.bytes)
        case ir.PfifoFast():
            opts["bands"] = 3
        case _:
            pass  # sfq, netem, fq_codel, prio, cbq: structure only (not on the test host)
    exp.qdisc_opts[handle] = opts
    if isinstance(q, ir.Htb | ir.Cbq | ir.Prio):
        for top in q.classes:
            _expect_class(q, top, "root", exp)
    elif isinstance(q, ir.Tbf | ir.Netem) and q.child is not None:
        _expect_qdisc(q.child, f"{q.handle.major:x}:1", exp)


def expected_state(iface: ir.Interface) -> Expected:
    """Everything ``iface`` should create, as tc shows it."""
    exp = Expected()
    _expect_qdisc(iface.root, "root", exp)
    for f in iface.filters:
        match f:
            case ir.U32Filter():
                keys = expected_keys(tuple(k.words for k in f.keys))
                item = TcFilter("u32", "ip", f.pref, str(f.flowid), keys)
            case ir.FwFilter():
                item = TcFilter("fw", "ip", f.pref, str(f.flowid), mark=f.mark)
        exp.filters.setdefault(str(f.parent), []).append(item)
    for parent, items in exp.filters.items():
        # u32 nodes of one pref keep the order they were added in; fw filters list by mark.
        exp.filters[parent] = sorted(items, key=lambda f: (f.pref, f.mark or 0))
    return exp


# ==== host support, namespaces, running things =================================================


def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the assertion shows its output."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    if check:
        assert proc.returncode == 0, (
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


_PROBE_ARGS: dict[str, list[str]] = {
    "htb": [],
    "tbf": ["rate", "1mbit", "burst", "10k", "latency", "50ms"],
    "cbq": ["bandwidth", "10mbit", "avpkt", "1000"],
    "prio": [],
    "netem": [],
    "sfq": [],
    "fq_codel": [],
    "pfifo": [],
    "bfifo": [],
    "pfifo_fast": [],
}
_PROBE_FILTERS: dict[str, list[str]] = {
    "u32": ["u32", "match", "u32", "0", "0", "at", "0", "flowid", "1:1"],
    "fw": ["handle", "1", "fw", "flowid", "1:1"],
}
_names = itertools.count()


def _netns_name() -> str:
    return f"tcdsl-test-{os.getpid()}-{next(_names)}"


@dataclass(frozen=True)
class Host:
    """What this host's kernel and tools can do, probed once per session."""

    qdiscs: frozenset[str]
    filters: frozenset[str]
    iptables: bool

    def missing(self, policy: ir.Policy) -> str | None:
        """Why ``policy`` cannot be applied here, or None."""
        kinds = {q.kind for i in policy.interfaces for q in ir.walk_qdiscs(i.root)}
        filters = {f.__class__ for i in policy.interfaces for f in i.filters}
        classifiers = {"u32" if f is ir.U32Filter else "fw" for f in filters}
        lacks = [f"sch_{k}" for k in sorted(kinds - self.qdiscs)]
        lacks += [f"cls_{k}" for k in sorted(classifiers - self.filters)]
        reasons = [f"host kernel lacks {', '.join(lacks)}"] if lacks else []
        if any(i.marking for i in policy.interfaces) and not self.iptables:
            reasons.append("iptables (mangle table) does not work in a netns here")
        return "; ".join(reasons) or None


@pytest.fixture(scope="session")
def host() -> Iterator[Host]:
    ns = _netns_name()
    made = run(["ip", "netns", "add", ns], check=False)
    if made.returncode != 0:
        pytest.skip(f"ip netns does not work here: {made.stderr.strip()}")
    try:
        dev = ["dev", "probe0"]
        run(["ip", "-n", ns, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"])
        run(["ip", "-n", ns, "link", "set", "probe0", "up"])
        qdiscs = set()
        for kind, args in _PROBE_ARGS.items():
            add = ["tc", "-n", ns, "qdisc", "add", *dev, "root", "handle", "1:", kind, *args]
            if run(add, check=False).returncode == 0:
                qdiscs.add(kind)
                run(["tc", "-n", ns, "qdisc", "del", *dev, "root"])
        filters = set()
        if "htb" in qdiscs:
            run(["tc", "-n", ns, "qdisc", "add", *dev, "root", "handle", "1:", "htb"])
            for kind, args in _PROBE_FILTERS.items():
                head = ["tc", "-n", ns, "filter", "add", *dev, "parent", "1:", "protocol", "ip"]
                if run([*head, "prio", "1", *args], check=False).returncode == 0:
                    filters.add(kind)
                run(["tc", "-n", ns, "filter", "del", *dev, "parent", "1:"], check=False)
        iptables = False
        if shutil.which("iptables") is not None:
            listing = ["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"]
            iptables = run(listing, check=False).returncode == 0
        yield Host(frozenset(qdiscs), frozenset(filters), iptables)
    finally:
        run(["ip", "netns", "del", ns], check=False)


@pytest.fixture
def make_netns() -> Iterator[Callable[[], str]]:
    """A factory of fresh network namespaces, all deleted when the test ends, however it ends."""
    made: list[str] = []

    def make() -> str:
        name = _netns_name()
        run(["ip", "netns", "add", name])
        made.append(name)
        return name

    try:
        yield make
    finally:
        for name in made:
            run(["ip", "netns", "del", name], check=False)
        listed = run(["ip", "netns", "list"], check=False).stdout
        assert not any(name in listed.split() for name in made), f"namespaces left: {listed}"


def create_links(ns: str, policy: ir.Policy) -> list[str]:
    """One veth per interface the policy names (``classify ... from`` ones too), all up."""
    names: list[str] = []
    for iface in policy.interfaces:
        for name in (iface.name, iface.marking.from_interface if iface.marking else None):
            if name is not None and name not in names:
                names.append(name)
    peers = (p for p in (f"tcdslp{i}" for i in itertools.count()) if p not in names)
    for name in names:
        peer = next(peers)
        run(["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer])
        run(["ip", "-n", ns, "link", "set", name, "up"])
        run(["ip", "-n", ns, "link", "set", peer, "up"])
    return names


def apply_script(ns: str, script: Path) -> None:
    proc = run(["ip", "netns", "exec", ns, "sh", str(script)], check=False)
    assert proc.returncode == 0, f"the script failed ({proc.returncode}):\n{proc.stderr}"


@dataclass
class DevState:
    """What tc shows for one device: the raw text (for idempotence) and its parse."""

    text: str
    qdiscs: list[TcQdisc]
    classes: list[TcClass]
    filters: dict[str, list[TcFilter]]


def read_device(ns: str, dev: str) -> DevState:
    def tc(*args: str) -> str:
        return run(["tc", "-n", ns, *args]).stdout

    qtext = tc("-d", "qdisc", "show", "dev", dev)
    ctext = tc("-d", "class", "show", "dev", dev)
    qdiscs, classes = parse_qdiscs(qtext), parse_classes(ctext)
    # Filters hang off qdiscs, and (for classful qdiscs) may hang off classes too.
    parents = [q.handle for q in qdiscs if q.kind != "noqueue"]
    parents += [c.classid for c in classes if c.kind in ("htb", "cbq", "prio")]
    texts = [qtext, ctext]
    filters: dict[str, list[TcFilter]] = {}
    for parent in parents:
        ftext = tc("filter", "show", "dev", dev, "parent", parent)
        texts.append(f"== filters of {parent}\n{ftext}")
        found = parse_filters(ftext)
        if found:
            filters[parent] = sorted(found, key=lambda f: (f.pref, f.node, f.mark or 0))
    # A packet the kernel sends on its own (IPv6 neighbour discovery) between two commands of
    # the script may take htb's direct queue; that counter is not state the script sets.
    text = _COUNTERS.sub(r"\1 N", "".join(texts))
    return DevState(text, qdiscs, classes, filters)


def read_iptables(ns: str) -> str:
    return run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"]).stdout


# ==== comparing ================================================================================


def _approx_size(shown: str | None, expected: int) -> bool:
    """tc shows bursts after a round trip through scheduler ticks: a byte or so may move."""
    return shown is not None and abs(parse_size(shown) - expected) <= expected // 100 + 16


def check_device(dev: str, state: DevState, iface: ir.Interface) -> None:
    exp = expected_state(iface)
    where = f"interface {dev}"

    actual_q = {q.handle: (q.kind, q.parent) for q in state.qdiscs}
    assert actual_q == exp.qdiscs, f"{where}: qdiscs differ\n{state.text}"
    for q in state.qdiscs:
        for key, want in exp.qdisc_opts[q.handle].items():
            shown = q.opt(key)
            assert shown is not None, f"{where}: qdisc {q.handle} shows no {key}: {q.words}"
            if key in ("rate", "peakrate"):
                got: object = parse_rate(shown)
            elif key == "limit" and q.kind == "bfifo":
                got = parse_size(shown)
            elif key == "burst":
                assert isinstance(want, int)
                assert _approx_size(shown, want), f"{where}: qdisc {q.handle} burst {shown}"
                continue
            elif key in ("default", "r2q", "bands"):
                got = int(shown, 0)
            else:
                got = shown
            assert got == want, f"{where}: qdisc {q.handle} {key} is {shown}, expected {want}"

    owned = {"htb", "cbq"}  # classes the script creates (prio bands and tbf's class are implied)
    actual_c = {c.classid: c for c in state.classes if c.kind in owned}
    want_c = {k: v for k, v in exp.classes.items() if v["kind"] in owned}
    assert sorted(actual_c) == sorted(want_c), f"{where}: classes differ\n{state.text}"
    for classid, want in want_c.items():
        c = actual_c[classid]
        assert c.parent == want["parent"], f"{where}: class {classid} parent {c.parent}"
        assert c.leaf == want["leaf"], f"{where}: class {classid} leaf {c.leaf}"
        for key in ("rate", "ceil"):
            if key not in want:
                continue
            shown = c.opt(key)
            assert shown is not None and parse_rate(shown) == want[key], (
                f"{where}: class {classid} {key} is {shown}, expected {want[key]} bit/s"
            )
        for key in ("prio", "quantum"):
            if key in want:
                assert c.opt(key) == str(want[key]), f"{where}: class {classid} {key}"
        for key in ("burst", "cburst"):
            if key in want:
                value = want[key]
                assert isinstance(value, int)
                assert _approx_size(c.opt(key), value), f"{where}: class {classid} {key}"

    assert state.filters == exp.filters, f"{where}: filters differ\n{state.text}"


# ==== the tests ================================================================================


def _cases() -> list[Path]:
    extra = sorted(p.relative_to(ROOT) for p in APPLY_POLICIES.glob("*.tcp"))
    return [*policy_files(), *extra]


def _compile(path: Path) -> Result:
    result = compile_policy(str(ROOT / path))
    assert result.output is not None and result.policy is not None, render(
        result.diagnostics, result.sources
    )
    return result


def apply_and_check(ns: str, result: Result, tmp_path: Path) -> None:
    """Apply ``result`` twice in ``ns``; check the state after each run against the IR."""
    assert result.policy is not None and result.output is not None
    policy = result.policy
    create_links(ns, policy)
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    marking = any(i.marking for i in policy.interfaces)
    snapshots = []
    for _ in range(2):
        apply_script(ns, script)
        states = {i.name: read_device(ns, i.name) for i in policy.interfaces}
        for iface in policy.interfaces:
            check_device(iface.name, states[iface.name], iface)
        snapshot = {name: s.text for name, s in states.items()}
        if marking:
            rules = read_iptables(ns)
            snapshot["iptables"] = rules
            for iface in policy.interfaces:
                m = iface.marking
                if m is None:
                    continue
                jump = f"-A PREROUTING -i {m.from_interface} -j {m.chain}"
                assert rules.splitlines().count(jump) == 1, rules
                ours = [r for r in rules.splitlines() if r.startswith(f"-A {m.chain} ")]
                assert len(ours) == len(m.rules), rules
        snapshots.append(snapshot)
    assert snapshots[0] == snapshots[1], "the second run left a different state"


@pytest.mark.parametrize("policy", _cases(), ids=[str(p) for p in _cases()])
def test_apply(policy: Path, host: Host, make_netns: Callable[[], str], tmp_path: Path) -> None:
    result = _compile(policy)
    assert result.policy is not None
    missing = host.missing(result.policy)
    if missing:
        pytest.skip(f"{missing} (needed by {policy})")
    apply_and_check(make_netns(), result, tmp_path)


# Policies tc cannot apply as written, or applies with another meaning (unaligned raw keys,
# contradicting conditions, peakrate without mtu): the compiler must reject them, or make
# them apply with their meaning.
def _htb(body: str) -> str:
    return f"interface eth0 htb rate 10mbit {{\n    {body}\n}}\n"


def _compile_text(tmp_path: Path, text: str) -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return compile_policy(str(path))


BUGS = [
    pytest.param(
        _htb("class a rate 1mbit match u32 0x12345678/0xffffffff at 2"),
        id="u32-unaligned",
    ),
    pytest.param(
        _htb("class a rate 1mbit match u16 0x1234/0xffff at 1"),
        id="u16-odd-offset",
    ),
    pytest.param(
        _htb("class a rate 1mbit match u16 0x1234/0xffff at 3"),
        id="u16-crosses-word",
    ),
    pytest.param(
        _htb("class a rate 1mbit match src 10.0.0.1 src 10.0.0.2"),
        id="contradictory-src",
    ),
    pytest.param(
        _htb("class a rate 1mbit match proto udp tcp-ack"),
        id="contradictory-proto",
    ),
    pytest.param(
        "interface eth0 tbf rate 1mbit burst 10k latency 50ms peakrate 2mbit\n",
        id="tbf-peakrate-without-mtu",
    ),
]


@pytest.mark.parametrize("text", BUGS)
def test_accepted_policy_applies_as_meant(
    text: str, host: Host, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Whatever the compiler accepts, tc must apply, with the keys the policy means."""
    result = _compile_text(tmp_path, text)
    if result.output is None:
        assert result.errors, "rejected without an error"
        return
    assert result.policy is not None
    missing = host.missing(result.policy)
    if missing:
        pytest.skip(missing)
    apply_and_check(make_netns(), result, tmp_path)


# ==== traffic: packets end up in the class the policy says =====================================

SENDER = """
import socket, sys
for spec in sys.argv[2:]:
    port, tos = (int(x) for x in spec.split(","))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    for _ in range(int(sys.argv[1])):
        s.sendto(b"tcdsl", ("10.99.0.2", port))
"""
COUNT = 5


def class_packets(ns: str, dev: str) -> dict[str, int]:
    """Packets sent per class (``tc -s class show``) and by htb directly (key ``direct``)."""
    out: dict[str, int] = {}
    current = None
    for line in run(["tc", "-n", ns, "-s", "class", "show", "dev", dev]).stdout.splitlines():
        words = line.split()
        if words[:1] == ["class"]:
            current = words[2]
        elif words[:1] == ["Sent"] and current is not None:
            out[current] = int(words[3])
    qdiscs = run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev]).stdout
    out["direct"] = sum(int(n) for n in re.findall(r"direct_packets_stat (\d+)", qdiscs))
    return out


TRAFFIC = [
    pytest.param(
        "policies/seeds/s000-6.1-htb-limit.tcp", [(9, 0, "default")], id="seed-6.1-default"
    ),
    pytest.param(
        "policies/seeds/s004-tos-htb.tcp",
        [(9, 0x14, "1:10"), (9, 0x08, "1:30"), (9, 0, "default")],
        id="seed-tos",
    ),
    pytest.param(
        "tests/apply_policies/nested-htb.tcp",
        [
            (80, 0, "1:30"),
            (443, 0, "1:30"),
            (1500, 0, "1:5"),
            (2001, 0, "default"),
            (9, 0xB8, "1:40"),  # DSCP EF
            (9, 0x10, "1:40"),
        ],
        id="nested-htb",
    ),
    pytest.param(
        "interface eth0 htb rate 10mbit default staff {\n"
        "    class staff rate 5mbit { class a rate 1mbit }\n"
        "    class web rate 1mbit match dport 80\n"
        "}\n",
        [(9, 0, "default")],
        id="default-is-inner-class",
    ),
]


@pytest.mark.parametrize(("source", "sends"), TRAFFIC)
def test_traffic_reaches_its_class(
    source: str,
    sends: list[tuple[int, int, str]],
    host: Host,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    """UDP packets by destination port and TOS land in the class the policy says; unclassified
    ones in the default class, never in htb's unshaped direct queue."""
    if source.endswith(".tcp"):
        result = _compile(Path(source))
    else:
        result = _compile_text(tmp_path, source)
        if result.output is None:
            assert result.errors, "rejected without an error"
            return
    assert result.policy is not None and result.output is not None
    missing = host.missing(result.policy)
    if missing:
        pytest.skip(missing)
    iface = result.policy.interfaces[0]
    root = iface.root
    assert isinstance(root, ir.Htb)
    default = next(
        (c for t in root.classes for c in t.walk() if root.default and c.name == root.default.name),
        None,
    )
    ns = make_netns()
    sysctl = "net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
    run(["ip", "netns", "exec", ns, "sysctl", "-qw", *sysctl.split()])  # no IPv6 chatter
    create_links(ns, result.policy)
    dev = iface.name
    run(["ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", dev])
    run(["ip", "-n", ns, "neigh", "add", "10.99.0.2", "lladdr", "02:00:00:00:00:02", "dev", dev])
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    apply_script(ns, script)
    for port, tos, target in sends:
        is_default = target == "default"
        if is_default:
            assert default is not None and default.classid is not None
            target = str(default.classid)
        before = class_packets(ns, dev)
        sender = [sys.executable, "-c", SENDER, str(COUNT), f"{port},{tos}"]
        run(["ip", "netns", "exec", ns, *sender])
        after = class_packets(ns, dev)
        moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        moved = {k: v for k, v in moved.items() if v}
        where = f"UDP to port {port} with TOS {tos:#04x}"
        assert moved.get("direct", 0) == 0, f"{where} took htb's direct queue: {moved}"
        # Exactly COUNT packets; the default class may also carry the kernel's own (ARP, ...).
        got = moved.get(target, 0)
        assert got == COUNT or (is_default and got > COUNT), (
            f"{where} should reach {target}: {moved}"
        )


# ==== the parser itself (no kernel needed beyond the module's skip) ============================


def test_parse_rate_and_size() -> None:
    assert parse_rate("10Mbit") == 10_000_000
    assert parse_rate("1500Kbit") == 1_500_000
    assert parse_rate("800Kbit") == 800_000
    assert parse_rate("1Gbit") == 10**9
    assert parse_rate("999bit") == 999
    assert parse_size("15Kb/1") == 15 * 1024
    assert parse_size("1539b/1") == 1539
    assert parse_size("2560Kb") == 2560 * 1024
    assert parse_size("1Mb") == 1024 * 1024
    assert tc_shown_rate(10_800_000) == 10_800_000
    assert tc_shown_rate(3_333_333) == 3_333_000  # 416666 bytes/s, printed 3333Kbit
    assert tc_shown_rate(999_999) == 999_992  # bytes/s granularity below 1Mbit
    assert tc_shown_size(15 * 1024) == 15 * 1024
    assert tc_shown_size(3000) == 3000
    assert tc_shown_size(1030) == 1024


def test_expected_keys_merge_like_tc() -> None:
    words = (
        ("ip", "protocol", "6", "0xff"),
        ("u8", "0x05", "0x0f", "at", "0"),
        ("u16", "0x0000", "0xffc0", "at", "2"),
        ("u8", "0x10", "0xff", "at", "33"),
        ("ip", "tos", "0x14", "0xff"),
        ("ip", "dport", "5001", "0xffff"),
        ("ip", "sport", "3072", "0xfc00"),
        ("ip", "src", "10.0.0.0/8"),
        ("ip", "dst", "0.0.0.0/0"),
    )
    assert expected_keys(words) == (
        (0x00060000, 0x00FF0000, 8),
        (0x05140000, 0x0FFFFFC0, 0),
        (0x00100000, 0x00FF0000, 32),
        (0x0C001389, 0xFC00FFFF, 20),
        (0x0A000000, 0xFF000000, 12),
        (0, 0, 16),
    )
    with pytest.raises(UnpackableKey):
        expected_keys((("ip", "src", "10.0.0.1"), ("ip", "src", "10.0.0.2")))


def test_parse_filters() -> None:
    text = (
        "filter parent 1: protocol ip pref 1 u32 chain 0 \n"
        "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 \n"
        "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 "
        "bkt 0 *flowid 1:10 not_in_hw \n"
        "  match 00001389/0000ffff at 20\n"
        "filter parent 1: protocol ip pref 2 fw chain 0 handle 0xa classid 1:10 \n"
    )
    assert parse_filters(text) == [
        TcFilter("u32", "ip", 1, "1:10", ((0x1389, 0xFFFF, 20),), node=0x800),
        TcFilter("fw", "ip", 2, "1:10", mark=10),
    ]
