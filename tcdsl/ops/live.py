"""The live kernel's state, read here and now with tc (and iptables-save), parsed by verify's
read-back, and compared with what a policy builds (verify's comparison): what ``plan`` calls
drift.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterable, Sequence

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import (
    DeviceState,
    KernelState,
    parse_classes,
    parse_filters,
    parse_iptables_save,
    parse_qdiscs,
)

_C = {**os.environ, "LC_ALL": "C"}
"""tc's environment: its words in any locale."""


def _tc(*args: str) -> str:
    done = subprocess.run(
        ["tc", *args], capture_output=True, text=True, check=False, timeout=120, env=_C
    )
    return done.stdout if done.returncode == 0 else ""


def device_exists(name: str) -> bool:
    """Whether the network device exists (in this namespace)."""
    done = subprocess.run(
        ["ip", "link", "show", "dev", name], capture_output=True, text=True, check=False
    )
    return done.returncode == 0


def live_qdisc(device: str, where: str) -> str | None:
    """``htb qdisc 1:``: the device's root (``where`` root) or ingress qdisc when it is one
    somebody made (a handle of its own), else None (the kernel's default, or none)."""
    for q in parse_qdiscs(_tc("qdisc", "show", "dev", device, where)):
        if q.handle != "0:" and (q.parent == "root") == (where == "root"):
            return f"{q.kind} qdisc {q.handle}"
    return None


def read_device(name: str) -> DeviceState:
    """What tc shows for one device: qdiscs, classes, the filters of every parent."""
    qdiscs, classes = (
        _tc("-d", "qdisc", "show", "dev", name),
        _tc("-d", "class", "show", "dev", name),
    )
    device = DeviceState(name, parse_qdiscs(qdiscs), parse_classes(classes), text=qdiscs + classes)
    parents = [q.handle for q in device.qdiscs if q.handle != "0:"]
    parents += [c.classid for c in device.classes]
    texts = [device.text]  # joined once: adding to a string per parent is quadratic
    for parent, text in zip(parents, filter_listings(name, parents), strict=True):
        texts.append(f"== filters of {parent}\n{text}")
        filters = parse_filters(text)
        if filters:
            device.filters[parent] = filters
    device.text = "".join(texts)
    return device


def filter_listings(name: str, parents: Sequence[str]) -> list[str]:
    """``tc filter show dev NAME parent P`` for each of ``parents``, in order, listed by one
    ``tc -batch`` process (a process per parent took seconds on big trees)."""
    if not parents:
        return []
    # Between two listings, 'qdisc show' of the device: its lines (as many as it has qdiscs)
    # start with "qdisc", which no filter listing's do, so the output splits there.
    mark = f"qdisc show dev {name}"
    count = sum(1 for line in _tc(*mark.split()).splitlines() if line.startswith("qdisc "))
    script = "".join(f"filter show dev {name} parent {p}\n{mark}\n" for p in parents)
    done = subprocess.run(
        ["tc", "-batch", "-"], input=script, capture_output=True, text=True, check=False, env=_C
    )
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
    done = subprocess.run(
        [f"{tool}-save", "-t", "mangle"], capture_output=True, text=True, check=False
    )
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


def drift(policy: ir.Policy, sources: dict[str, str] | None = None) -> dict[str, list[Diagnostic]]:
    """Where the kernel differs from ``policy`` (applied earlier), by tree label: the
    differences of each device, given to every tree on that device."""
    # Without the sources, messages spell values canonically: quoting the policy's own words
    # costs a search of its text per value (11 s for 10,000 classes).
    expected = expected_policy(policy)
    marks = {f for i in policy.interfaces if i.marking is not None for f in i.families}
    state = read_state([e.name for e in expected.interfaces], "ipv4" in marks, "ipv6" in marks)
    out: dict[str, list[Diagnostic]] = {}
    for device in expected.interfaces:
        found = compare_state(dataclasses.replace(expected, interfaces=(device,)), state)
        if not found:
            continue
        for iface in policy.interfaces:
            if device.name in (iface.name, iface.download.interface if iface.download else None):
                out.setdefault(iface.label, []).extend(found)
    return out
