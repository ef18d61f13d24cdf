"""The live kernel's state, read here and now with tc (and iptables-save), parsed by verify's
read-back, and compared with what a policy builds (verify's comparison): what ``plan`` calls
drift.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Collection, Iterable, Sequence

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic
from tcdsl.frontend.qdiscs import CHANGE_SETS_ALL, REPAIRABLE_CLASSES
from tcdsl.ops.state import OpsError
from tcdsl.verify.compare import compare_state, value_drift
from tcdsl.verify.expect import ExpectedPolicy, expected_policy
from tcdsl.verify.readback import (
    DeviceState,
    KernelState,
    TcQdisc,
    parse_classes,
    parse_filters,
    parse_iptables_save,
    parse_qdiscs,
)

_C = {**os.environ, "LC_ALL": "C"}
"""tc's environment: its words in any locale. The kernel is read by commands in a session of
their own, out of the terminal's Ctrl-C: a read cut short would leave a wrong digest."""


READ_ATTEMPTS = 3
"""How many times a reading killed by a signal is made before giving up."""


def _read(argv: list[str], script: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command that reads the kernel, in a session of its own; one killed by a signal
    (a service stop signals every process of its group, readers too) is run again: its
    text, cut short, would be taken for the kernel's state (and recorded as such)."""
    for _ in range(READ_ATTEMPTS):
        done = subprocess.run(
            argv, input=script, capture_output=True, text=True, check=False, timeout=120,
            env=_C, start_new_session=True,
        )  # fmt: skip
        if done.returncode >= 0:
            return done
    raise OpsError(
        f"reading the kernel with '{' '.join(argv[:4])} ...' was stopped by a signal "
        f"{READ_ATTEMPTS} times; what it read is not used"
    )


def _tc(*args: str) -> str:
    done = _read(["tc", *args])
    return done.stdout if done.returncode == 0 else ""


def device_exists(name: str) -> bool:
    """Whether the network device exists (in this namespace)."""
    return _read(["ip", "link", "show", "dev", name]).returncode == 0


def link_kind(name: str) -> str | None:
    """The kind of the network device (``ifb``, ``veth``; ``""`` for one without a kind, a
    physical NIC's), None when there is no such device (in this namespace)."""
    done = _read(["ip", "-d", "-j", "link", "show", "dev", name])
    return info_kind(done.stdout) if done.returncode == 0 else None


def info_kind(shown: str) -> str:
    """The device's kind in what ``ip -d -j link show dev NAME`` printed ("" for none)."""
    try:
        kind = json.loads(shown)[0].get("linkinfo", {}).get("info_kind", "")
    except (ValueError, LookupError, TypeError, AttributeError):
        return ""
    return kind if isinstance(kind, str) else ""


def _link(name: str) -> dict[str, object] | None:
    """What ``ip -d -j link show dev NAME`` says of the device, None when it cannot be read."""
    done = _read(["ip", "-d", "-j", "link", "show", "dev", name])
    try:
        link = json.loads(done.stdout)[0] if done.returncode == 0 else None
    except (ValueError, LookupError, TypeError):
        return None
    return link if isinstance(link, dict) else None


def tx_queue_len(name: str) -> int | None:
    """The device's ``txqueuelen`` (what htb takes as its direct queue's length when it is
    made without one), None when it cannot be read."""
    qlen = (_link(name) or {}).get("txqlen")
    return qlen if isinstance(qlen, int) else None


def tx_queue_count(name: str) -> tuple[int | None, int | None]:
    """How many TX queues the device has, as the kernel tells this namespace (``ip -d``'s
    ``num_tx_queues``), and how many of them are in use (``real_num_tx_queues``: the
    ``queues/tx-N`` of /sys, which shows the namespace it was mounted in, so read only when
    its device has this one's index and address); None for what cannot be read."""
    link = _link(name)
    if link is None:
        return None, None
    count = link.get("num_tx_queues")
    return (count if isinstance(count, int) else None), _in_use(name, link)


def _in_use(name: str, link: dict[str, object]) -> int | None:
    folder = f"/sys/class/net/{name}"
    try:
        with open(f"{folder}/ifindex") as index, open(f"{folder}/address") as address:
            same = (int(index.read()), address.read().strip()) == (
                link.get("ifindex"),
                link.get("address", ""),
            )
        return sum(q.startswith("tx-") for q in os.listdir(f"{folder}/queues")) if same else None
    except (OSError, ValueError):
        return None


def device_qdiscs(device: str) -> list[TcQdisc]:
    """The device's qdiscs, as tc lists them (none for a device that is not there)."""
    return parse_qdiscs(_tc("qdisc", "show", "dev", device))


def live_qdisc(device: str, where: str) -> str | None:
    """``htb qdisc 1:``: the device's root (``where`` root) or ingress qdisc when it is one
    somebody made (a handle of its own), else None (the kernel's default, or none)."""
    for q in parse_qdiscs(_tc("qdisc", "show", "dev", device, where)):
        if q.handle != "0:" and (q.parent == "root") == (where == "root"):
            return f"{q.kind} qdisc {q.handle}"
    return None


def slot_filters(device: str, kind: str) -> set[tuple[str, str, str]]:
    """(parent, protocol, pref) of every filter in ``device``'s ingress slot, held by a qdisc
    of ``kind`` (``ingress``: its ``ffff:``; ``clsact``: both of its hooks)."""
    hooks = ("ingress", "egress") if kind == "clsact" else ("parent ffff:",)
    parents = {"ingress": str(ir.CLSACT_INGRESS), "egress": str(ir.CLSACT_EGRESS)}
    found = set()
    for hook in hooks:
        for f in parse_filters(_tc("filter", "show", "dev", device, *hook.split())):
            found.add((parents.get(hook, "ffff:"), f.protocol, str(f.pref)))
    return found


def read_device(name: str) -> DeviceState:
    """What tc shows for one device: qdiscs, classes, the filters of every parent."""
    qdiscs, classes, listings = _listing(name)
    device = DeviceState(name, parse_qdiscs(qdiscs), parse_classes(classes))
    texts = [qdiscs, classes]  # joined once: adding to a string per parent is quadratic
    for parent, text in listings:
        texts.append(f"== filters of {parent}\n{text}")
        filters = parse_filters(text)
        if filters:
            device.filters[parent] = filters
    device.text = "".join(texts)
    return device


def childless_netems(qdiscs: Sequence[TcQdisc]) -> set[str]:
    """The handles of the netem qdiscs that hold no child qdisc (at 'parent N:1' or 'N:')."""
    held = {q.parent for q in qdiscs}
    return {
        q.handle
        for q in qdiscs
        if q.kind == "netem" and q.handle not in held and f"{q.handle}1" not in held
    }


def _listing(name: str) -> tuple[str, str, list[tuple[str, str]]]:
    """tc's text for a device: its qdiscs, its classes, and each parent's filters."""
    qdiscs, classes = (
        _tc("-d", "qdisc", "show", "dev", name),
        _tc("-d", "class", "show", "dev", name),
    )
    # (parsed only where there is a netem: read_device parses the listing again)
    lone = childless_netems(parse_qdiscs(qdiscs)) if "qdisc netem " in qdiscs else set()
    if lone:
        # the kernel's class dump stops at the class of a netem without a child qdisc
        # (netem_dump_class: ENOENT): the classes after it were left out (found by a tester)
        classes = "".join(
            _tc("-d", "class", "show", "dev", name, "parent", h)
            for _, h in _HANDLE.findall(qdiscs)
            if h != "0:" and h not in lone
        )
    parents = [filters_of(kind, h) for kind, h in _HANDLE.findall(qdiscs) if h != "0:"]
    parents += [h for _, h in _HANDLE.findall(classes)]
    likely = {filters_of(kind, h) for kind, h in _CLASSFUL.findall(qdiscs) if h != "0:"}
    listings = filter_listings(name, parents, likely)
    return qdiscs, classes, list(zip(parents, listings, strict=True))


def filters_of(kind: str, handle: str) -> str:
    """Where a qdisc's filters are listed: its handle, but a clsact's egress filters (an mq
    tree's steering) are under ``ffff:fff3``, not ``ffff:``."""
    return str(ir.CLSACT_EGRESS) if kind == "clsact" else handle


_CLASSFUL = re.compile(
    r"^qdisc (htb|hfsc|prio|cbq|drr|qfq|ets|mq|mqprio|multiq|clsact|ingress) (\S+)",
    re.MULTILINE,
)


def top_qdiscs(qdiscs: str) -> set[str]:
    """The handles of the classful qdiscs (and ingress, clsact) in tc's listing of qdiscs:
    where a tree's filters are (a leaf qdisc seldom has any)."""
    return {h for _, h in _CLASSFUL.findall(qdiscs)} - {"0:"}


_HANDLE = re.compile(r"^(?:qdisc|class) (\S+) (\S+)", re.MULTILINE)
"""A qdisc's kind and handle, a class's kind and id, in tc's listing."""
_COUNTS = re.compile(r"direct_packets_stat \d+ |\[\d+:\d+\]|^#.*\n", re.MULTILINE)
"""What changes in the listings without anybody changing the configuration: htb's count of
unclassified packets, iptables-save's counters and its dated comments."""


def fingerprint(devices: Iterable[str], tables: Iterable[str] = ()) -> dict[str, str]:
    """A digest of the configuration of each device (and each of the ``tables``,
    ``iptables``/``ip6tables``, whose mangle table is read): equal digests, equal states.
    Read after an apply and again before the next, they skip parsing and comparing the
    kernel's state when nobody changed it."""
    out: dict[str, str] = {}
    for name in devices:
        qdiscs, classes, listings = _listing(name)
        # a class's place in tc's listing is its place in a hash bucket, which depends on
        # the order the classes were made in; the filters' order is their meaning
        lines = sorted([*qdiscs.splitlines(keepends=True), *classes.splitlines(keepends=True)])
        texts = [*lines, *(f"== {p}\n{t}" for p, t in sorted(listings) if t)]
        out[name] = _digest("".join(texts))
    for tool in tables:
        out[tool] = _digest(_save(tool))
    return out


def _digest(text: str) -> str:
    return hashlib.sha256(_COUNTS.sub("", text).encode()).hexdigest()


def filter_listings(name: str, parents: Sequence[str], likely: Collection[str] = ()) -> list[str]:
    """``tc filter show dev NAME parent P`` for each of ``parents``, in order. ``likely``:
    the parents asked for their listing at once (the classful qdiscs, which hold a tree's
    filters); a JSON pass over the others (``tc -j -batch``: a line per parent, "[]" for
    none) finds the few that have filters too. Each listed parent is then a tc of its own,
    or with many of them, one ``tc -batch`` (a process per parent took seconds on big
    trees; the JSON of 20,000 filters took 0.6 s, and a separator in the batch dumps every
    qdisc of the device)."""
    if not parents:
        return []
    others = [p for p in parents if p not in likely]
    script = "".join(f"filter show dev {name} parent {p}\n" for p in others)
    found: set[str] = set()
    if others:
        done = _read(["tc", "-j", "-force", "-batch", "-"], script)
        lines = done.stdout.splitlines()
        if len(lines) == len(others):
            found = {p for p, line in zip(others, lines, strict=True) if line.strip() != "[]"}
        else:
            found = set(others)  # an answer not one line per command: ask every parent
    listed = [p for p in parents if p in found or p in likely]
    if len(listed) <= _ONE_BY_ONE:
        texts = {p: _tc("filter", "show", "dev", name, "parent", p) for p in listed}
    else:
        texts = dict(zip(listed, _separated(name, listed), strict=True))
    return [texts.get(p, "") for p in parents]


_ONE_BY_ONE = 64
"""Up to this many parents with filters (an mq tree's queues), each is listed by a tc of its
own."""


def _separated(name: str, parents: Sequence[str]) -> list[str]:
    """The text listings of ``parents``, split at a ``qdisc show`` of the device between two
    (its lines, as many as it has qdiscs, start with "qdisc", which no filter listing's do)."""
    if not parents:
        return []
    mark = f"qdisc show dev {name}"
    count = sum(1 for line in _tc(*mark.split()).splitlines() if line.startswith("qdisc "))
    script = "".join(f"filter show dev {name} parent {p}\n{mark}\n" for p in parents)
    done = _read(["tc", "-batch", "-"], script)
    listings: list[list[str]] = [[]]
    seen = 0
    for line in done.stdout.splitlines(keepends=True):
        if not line.startswith("qdisc "):
            listings[-1].append(line)
            continue
        seen += 1
        if seen == count:
            listings.append([])
            seen = 0
    listings += [[] for _ in range(len(parents) - len(listings))]  # tc stopped early
    return ["".join(lines) for lines in listings[: len(parents)]]


def _save(tool: str) -> str:
    try:
        done = _read([f"{tool}-save", "-t", "mangle"])
    except FileNotFoundError:  # not installed: no rules of it
        return ""
    return done.stdout if done.returncode == 0 else ""


def read_state(
    devices: Iterable[str], iptables: bool = False, ip6tables: bool = False
) -> KernelState:
    """The live state of ``devices`` (and the mangle tables, when asked)."""
    state = KernelState({d: read_device(d) for d in devices})
    if iptables:
        state.iptables = parse_iptables_save(_save("iptables"))
    if ip6tables:
        state.ip6tables = parse_iptables_save(_save("ip6tables"))
    return state


def drift(
    policy: ir.Policy,
    sources: dict[str, str] | None = None,
    repairs: dict[str, set[tuple[str, str, str]]] | None = None,
) -> dict[str, list[Diagnostic]]:
    """Where the kernel differs from ``policy`` (applied earlier), by tree label: the
    differences of each device, given to every tree on that device. ``repairs``, if given,
    gets the trees whose differences are all values of classes and of qdiscs that can change
    in place (:func:`value_drift`: set again in place), with those objects' keys."""
    unrepairable: set[str] = set()
    # Without the sources, messages spell values canonically: quoting the policy's own words
    # costs a search of its text per value (11 s for 10,000 classes).
    expected = expected_policy(policy)
    marks = {f for i in policy.interfaces if i.marking is not None for f in i.families}
    state = read_state([e.name for e in expected.interfaces], "ipv4" in marks, "ipv6" in marks)
    trees: dict[str, list[ir.Interface]] = {}
    for iface in policy.interfaces:
        for name in (iface.name, iface.download.interface if iface.download else None):
            if name is not None:
                trees.setdefault(name, []).append(iface)
    out: dict[str, list[Diagnostic]] = {}
    for device in expected.interfaces:
        sharing = trees.get(device.name, [])
        if len(sharing) == 1:
            # A tree holds one slot of its device, root or ingress (an mq tree that steers,
            # both): what another tool keeps in the other is no drift (found by testers: a
            # clsact with bpf filters, an ingress qdisc, each rebuilt the tree, and the
            # rebuild left them where they were). tcdsl's own redirect there, left when its
            # download went, is a failed teardown (E601), its download then restored.
            slots = {q.handle == "ffff:" for q in device.qdiscs}
            seen = state
            if slots == {True} or (slots == {False} and _slot_taken(state, device.name)):
                seen = _slot(state, device.name, slots == {True})
            alone = dataclasses.replace(expected, interfaces=(device,))
            found = compare_state(alone, seen)
            if found:
                out.setdefault(sharing[0].label, []).extend(found)
                _repairs(sharing[0].label, alone, seen, repairs, unrepairable)
            continue
        # Trees sharing a device (an upload and its interface's download redirect or ingress
        # policing): each is given what differs in the slot it holds, root or ingress.
        for iface in sharing:
            own = expected_policy(dataclasses.replace(policy, interfaces=(iface,)))
            for part in own.interfaces:
                if part.name != device.name:
                    continue
                ingress = bool(part.qdiscs) and all(q.handle == "ffff:" for q in part.qdiscs)
                alone, seen = (
                    dataclasses.replace(own, interfaces=(part,)),
                    _slot(state, part.name, ingress),
                )
                found = compare_state(alone, seen)
                if found:
                    out.setdefault(iface.label, []).extend(found)
                    _repairs(iface.label, alone, seen, repairs, unrepairable)
    return out


def _repairs(
    label: str,
    expected: ExpectedPolicy,
    seen: KernelState,
    repairs: dict[str, set[tuple[str, str, str]]] | None,
    unrepairable: set[str],
) -> None:
    """Add to ``repairs`` what tree ``label`` can have set again in place of its drift on one
    device (an upload beside its download's redirect too: found by a review), else mark it
    ``unrepairable``."""
    if repairs is None:
        return
    keys = value_drift(expected, seen, CHANGE_SETS_ALL, REPAIRABLE_CLASSES)
    if keys is None or label in unrepairable:
        unrepairable.add(label)
        repairs.pop(label, None)
    else:
        repairs.setdefault(label, set()).update(keys)


def _slot_taken(state: KernelState, name: str) -> bool:
    """Whether device ``name``'s ingress slot holds a qdisc (ingress or clsact)."""
    dev = state.devices.get(name)
    return dev is not None and any(q.handle == "ffff:" for q in dev.qdiscs)


def _slot(state: KernelState, name: str, ingress: bool) -> KernelState:
    """``state`` with device ``name`` cut to what is in its ingress slot (``ffff:``: the
    ingress or clsact qdisc and its filters), or to the rest."""
    dev = state.devices.get(name)
    if dev is None:
        return state
    part = DeviceState(
        name,
        [q for q in dev.qdiscs if (q.handle == "ffff:") == ingress],
        [] if ingress else dev.classes,
        {p: f for p, f in dev.filters.items() if p.startswith("ffff:") == ingress},
        dev.text,
    )
    return dataclasses.replace(state, devices={**state.devices, name: part})
