"""The live operations end to end: plan, apply (with ``--confirm``), confirm, rollback, down.

Each works on a policy *name* (the state's folder: the policy file's stem unless given): the
policy live under that name is compiled again from the state's copy of its text, compared
with the kernel (drift) and with the new policy (the plan), and the plan run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from tcdsl import directions, ir
from tcdsl.allocate import LEAF_PIN, LINK_PIN, NESTED_PIN, PARENT_PIN, QUEUE_PIN, R2Q_PIN, Pins
from tcdsl.commands import default_chain, ingress_slot, nft_table_name, unjump_shell
from tcdsl.diagnostics import Diagnostic
from tcdsl.driver import Result, analyse
from tcdsl.forked import Beside
from tcdsl.frontend.builder import ifb_name_for
from tcdsl.frontend.source import Access, SourceError, decode_policy, normalise_newlines
from tcdsl.lock import interface_locks
from tcdsl.ops.apply import ApplyFailed, Runner, apply_policy, run_command
from tcdsl.ops.desired import (
    Tree,
    class_ids,
    trees_from_json,
    trees_json,
    trees_of,
    word_after,
)
from tcdsl.ops.live import (
    device_exists,
    device_qdiscs,
    drift,
    fingerprint,
    link_kind,
    live_qdisc,
    slot_filters,
    tx_queue_count,
)
from tcdsl.ops.plan import Change, Plan, in_ingress_slot, make_plan, remove_tree, restore_plan
from tcdsl.ops.state import (
    KEEP,
    Applied,
    MissingDevice,
    OpsError,
    Pending,
    StateWriteError,
    Store,
    UnfitDevice,
    state_dir,
    valid_name,
    write_json,
)
from tcdsl.tcmath import HTB_DEFAULT_R2Q
from tcdsl.verify.expect import INGRESS_PARENT, Requirement, expected_policy, requirements
from tcdsl.verify.readback import parse_action, parse_filters
from tcdsl.verify.runner import HostSupport, KernelUnavailable, host_support


class Unsupported(OpsError):
    """The kernel or tools here lack what the new policy needs; nothing was changed."""

    def __init__(self, lacking: list[Requirement]) -> None:
        words = ", ".join(r.what for r in lacking)
        super().__init__(f"this kernel or its tools lack {words}; nothing was changed")
        self.lacking = lacking


def check_support(had: Iterable[str], new: ir.Policy) -> None:
    """Refuse (:class:`Unsupported`) when this host lacks a kernel feature or tool ``new``
    needs that the live policy (whose features are ``had``: evidently there) did not:
    probed in a scratch namespace, as ``verify`` does."""
    had = set(had)
    fresh = [r for r in requirements(new) if r.feature not in had]
    if not fresh:
        return
    known = _probed()
    if known is not None and not known.lacks(fresh):
        return  # this kernel had them at the last probe since it booted
    try:
        host = dataclasses.replace(host_support(), veth=True)
    except KernelUnavailable:
        return  # no scratch namespace to probe in: the apply itself will tell
    _remember_probe(host)
    lacking = host.lacks(fresh)
    if lacking:
        raise Unsupported(lacking)


def _probe_file() -> Path:
    """Where the last probe of this kernel boot is kept: a module loaded since may add a
    feature (a probe that lacks one is made again), none goes away."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    key = boot.read_text(encoding="utf-8").strip() if boot.exists() else "unknown"
    return state_dir() / f".probe-{key}.json"


def _probed() -> HostSupport | None:
    """The probe kept for this boot; None where there is none, or it is not one (a cache:
    the kernel is probed again; found by a tester, a file of the wrong shape was a
    traceback)."""
    try:
        data = json.loads(_probe_file().read_text(encoding="utf-8"))
        return HostSupport(
            _text(data["release"]),
            _texts(data["qdiscs"]),
            _texts(data["filters"]),
            _flag(data["iptables"]),
            True,
            _texts(data["actions"]),
            _flag(data["ifb"]),
            ip6tables=_flag(data["ip6tables"]),
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _texts(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        raise ValueError(value)
    return frozenset(_text(v) for v in value)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(value)
    return value


def _remember_probe(host: HostSupport) -> None:
    data = {
        "release": host.release,
        "qdiscs": sorted(host.qdiscs),
        "filters": sorted(host.filters),
        "iptables": host.iptables,
        "actions": sorted(host.actions),
        "ifb": host.ifb,
        "ip6tables": host.ip6tables,
    }
    path = _probe_file()
    if not path.parent.is_dir():
        # A read-only command (plan, check --kernel) makes no state folder (found by a
        # tester: `plan` made /var/lib/tcdsl); the first apply does, and keeps the probe.
        return
    with contextlib.suppress(OSError):  # a cache: without it the next apply probes again
        write_json(path, data)


@dataclass(slots=True)
class Prepared:
    """A compiled new policy, the one live now (its record, what it built), and the plan
    between them."""

    store: Store
    new: ir.Policy | None
    result: Result | None
    applied: Applied | None
    live: Live
    plan: Plan
    new_trees: tuple[Tree, ...] = ()

    @property
    def old(self) -> ir.Policy | None:
        """The live policy compiled again (only where its IR is needed: a restore)."""
        return compile_applied(self.applied) if self.applied is not None else None


@dataclass(frozen=True, slots=True)
class Live:
    """What the live policy built, as its apply recorded it (or as compiling its text
    again gives it, for a record without), and the kernel features it uses."""

    trees: tuple[Tree, ...]
    features: frozenset[str]
    kernel: Mapping[str, str] | None
    """The kernel's digest (:func:`fingerprint`) right after it was applied."""

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices its trees are on."""
        return tuple(dict.fromkeys(d for t in self.trees for d in t.devices))

    @property
    def tables(self) -> tuple[str, ...]:
        """The iptables tools whose mangle table it changes."""
        tools = {c.tool for t in self.trees for o in t.objects if o.kind == "marking"
                 for c in o.commands}  # fmt: skip
        return tuple(tool for tool in ("iptables", "ip6tables") if tool in tools)

    def kernel_now(self) -> dict[str, str]:
        """The kernel's digest (:func:`fingerprint`) of its devices as they are now."""
        return fingerprint(self.devices, self.tables)


_NO_LIVE = Live((), frozenset(), None)


def live_of(store: Store, applied: Applied | None) -> Live:
    """What the policy of ``applied`` built: from its record, else compiled again."""
    if applied is None:
        return _NO_LIVE
    data = store.read_extra(applied.generation, "trees")
    trees = trees_from_json(data) if isinstance(data, dict) else None
    features = data.get("features", ()) if isinstance(data, dict) else None
    if trees is None or not isinstance(features, list | tuple):
        # none kept, or damaged (edited by hand): the slow path, as an older record's
        policy = compile_applied(applied)
        return Live(trees_of(policy), frozenset(r.feature for r in requirements(policy)), None)
    kernel = store.read_extra(applied.generation, "kernel")
    return Live(
        trees,
        frozenset(str(f) for f in features),
        {str(k): str(v) for k, v in kernel.items()} if isinstance(kernel, dict) else None,
    )


def remember(store: Store, generation: int, policy: ir.Policy, trees: Sequence[Tree]) -> None:
    """Record what ``policy`` (applied as ``generation``) built, and the kernel after it (read
    in a child process while this one writes the record)."""
    live = Live(tuple(trees), frozenset(), None)
    with Beside(live.kernel_now) as reading:
        data = trees_json(trees)
        data["features"] = sorted({r.feature for r in requirements(policy)})
        store.write_extra(generation, "trees", data)
        store.write_extra(generation, "kernel", reading.result())


def keep_record(prepared: Prepared) -> None:
    """With nothing to change: record what the live policy built and the kernel's digest,
    where its apply did not (an older tcdsl), or the kernel's digest again where the plan
    noted a change tcdsl does not compare, so that the next plan starts from them."""
    applied = prepared.applied
    if applied is not None and prepared.plan.notes and not prepared.plan.drift:
        with contextlib.suppress(OSError):
            remember_kernel(prepared.store, applied.generation, prepared.live)
        return
    if applied is None or prepared.new is None or prepared.live.kernel is not None:
        return
    if prepared.plan.drift or not prepared.plan.empty or prepared.result is None:
        return
    if dict(prepared.result.sources) != dict(applied.sources):
        return  # the same objects from other text: its lines would not be the record's
    with contextlib.suppress(OSError):  # a cache: without it the next plan compiles again
        remember(prepared.store, applied.generation, prepared.new, prepared.new_trees)


_Reads = dict[str, set[str]]
"""The trees a failed apply's checks found astray, by when they read the kernel ("undone":
after the undo in place, "restored": after the old policy was built again), for the next
step to take instead of reading the kernel again (about a second at 10,000 classes): each is
taken once, by the step that comes before any other change of the kernel."""


def _undo(prepared: Prepared, reads: _Reads) -> tuple[Plan, Callable[[], bool]] | None:
    """The in-place plan back from the new policy to the live one after a failed apply,
    and the check that the kernel is the live one again (None where it cannot be undone in
    place: a first apply, or a change of the iptables marking, which drift does not see)."""
    old = prepared.old
    if old is None:
        return None
    inverse = make_plan(prepared.new_trees, trees_of(old))
    # (a download's IFB, made or deleted with ip, is undone in place too: found by a tester,
    # a failed redirect rebuilt the upload tree beside it, and reset its counters)
    if any(step.tool not in ("tc", "ip") for step in inverse.steps):
        return None
    return inverse, _rebuilt(lambda: old, reads=reads, when="undone")


def _astray(
    old: ir.Policy | None, undone: bool, reads: _Reads | None = None, when: str = ""
) -> set[str] | None:
    """After a failed apply whose in-place undo did not bring the whole kernel back: the
    labels of the live policy's trees that are not as it builds them, read back (or as the
    check of ``when`` in ``reads`` read them, with nothing changed since), which alone
    are built again (found by a tester: a device gone during a change to two made the other,
    undone in place, be built again too, its counters lost and its traffic unshaped
    meanwhile). None (build every tree) where drift cannot tell: no undo in place was
    tried (``undone``: it is not where the iptables marking changed, which drift does not
    compare), or the kernel cannot be read."""
    if old is None or not undone:
        return None
    if reads is not None and when in reads:
        return reads.pop(when)
    try:
        return set(drift(old))
    except (OpsError, OSError, subprocess.SubprocessError):
        return None


def _rebuilt(
    policy: Callable[[], ir.Policy | None],
    new: ir.Policy | None = None,
    reads: _Reads | None = None,
    when: str = "",
) -> Callable[[], bool]:
    """The check, after a failed change, that the kernel is the policy ``policy`` gives (the
    live one, compiled only then) again, read back; where there is none (a first apply), that
    none of ``new``'s trees is left. What it finds astray goes in ``reads`` as ``when``'s."""

    def check() -> bool:
        old = policy()
        if old is None:
            return new is not None and _none_left(new)
        found = set(drift(old))
        if reads is not None:
            reads[when] = found
        return not found

    return check


def _none_left(new: ir.Policy) -> bool:
    """Whether no root or ingress qdisc of ``new`` is in the kernel, read back (a device it
    made, an IFB, gone too)."""
    for device in expected_policy(new).interfaces:
        tops = {(q.handle, q.parent) for q in device.qdiscs if q.parent in ("root", INGRESS_PARENT)}
        if tops and any((q.handle, q.parent) in tops for q in device_qdiscs(device.name)):
            return False
    return True


def _remember_restored(store: Store, generation: int, policy: ir.Policy | None) -> None:
    """After a failed change was undone: what the undo or restore built (``policy``, the live
    one compiled again from its saved text) and the kernel's digest, so that the next plan
    starts from what the kernel has. Those are mostly the record's objects; but a number the
    compiler chose anew (a nested qdisc's handle, a handle an older tcdsl gave) or the
    kernel chose (a u32 table id) may differ, and the record must say what is there."""
    if policy is None:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        remember(store, generation, policy, trees_of(policy))


def remember_kernel(store: Store, generation: int, live: Live) -> None:
    """Record the kernel's digest now, for the policy of ``generation`` (live now)."""
    store.write_extra(generation, "kernel", live.kernel_now())


def policy_name(path: str, name: str | None) -> str:
    """The state name of a policy: ``name`` (an empty one too, which the state refuses;
    found by a tester: ``--name ''`` took the file's), else the file's stem."""
    return name if name is not None else PurePath(path).stem


_COMPILED: dict[tuple[str, int, float], ir.Policy] = {}
"""Policies of state records compiled in this process (a plan compiles the live one for its
class ids and again for the comparison)."""


def compile_applied(applied: Applied) -> ir.Policy:
    """The policy of a state record, compiled again from its saved text."""
    key = (applied.path, applied.generation, applied.applied_at)
    if key not in _COMPILED:
        _COMPILED[key] = _compile_applied(applied)
    return _COMPILED[key]


def _compile_applied(applied: Applied) -> ir.Policy:
    # Its tables too are read from the record: the files may have changed since, or be gone
    # (a record of an older tcdsl may lack a table's text: that one is read from the disk).
    result = analyse(
        applied.path,
        loader=lambda p: applied.sources[p],
        pins=stored_pins(applied),
        tables=applied.sources.get,
        # its text is the record's, which apply read as it allowed (--include-path, links)
        access=Access(anywhere=True),
    )
    if result.policy is None:
        raise OpsError(f"the saved policy {applied.path} (generation {applied.generation}) "
                       "no longer compiles")  # fmt: skip
    return result.policy


def _handle(text: str) -> ir.Handle:
    major, _, minor = text.partition(":")
    return ir.Handle(int(major, 16), int(minor or "0", 16))


def stored_pins(applied: Applied | None) -> Pins:
    """The class ids a state record kept (those its policy was given), as pins."""
    if applied is None:
        return {}
    return {
        label: {name: _handle(text) for name, text in ids.items()}
        for label, ids in applied.classids.items()
    }


def pins_of(policy: ir.Policy | None) -> Pins:
    """The class ids of a live policy, by tree label and class name, its classes' leaf qdisc
    handles (``tcdsl.allocate.LEAF_PIN``), its htbs' r2q (``R2Q_PIN``) and its mq queues'
    numbers (``QUEUE_PIN``), for the next one."""
    if policy is None:
        return {}
    pins = class_ids(policy)
    for iface in policy.interfaces:
        ids = pins.setdefault(iface.label, {})
        if isinstance(iface.root, ir.Mq):
            for queue in iface.root.queues:
                if queue.qdisc.handle is not None:
                    ids[f"{queue.qdisc.handle}{QUEUE_PIN}"] = ir.Handle(queue.number, 0)
        for q in ir.walk_qdiscs(iface.root):
            r2q = q.chosen_r2q or HTB_DEFAULT_R2Q if isinstance(q, ir.Htb) else 0
            if isinstance(q, ir.Htb) and q.r2q is None and q.handle and 0 < r2q <= 0xFFFF:
                ids.setdefault(f"{q.handle}{R2Q_PIN}", ir.Handle(r2q, 0))
            for cls in ir.classes_of(q):
                if cls.leaf is not None and cls.leaf.handle is not None and cls.name:
                    ids.setdefault(f"{cls.name}{LEAF_PIN}", cls.leaf.handle)
                    depth, below = 2, getattr(cls.leaf, "child", None)
                    while isinstance(below, ir.Qdisc) and below.handle is not None:
                        ids.setdefault(f"{cls.name}{NESTED_PIN}{depth}", below.handle)
                        depth, below = depth + 1, getattr(below, "child", None)
                if cls.implicit and q.handle and cls.classid is not None:
                    ids.setdefault(f"{q.handle}{LINK_PIN}", cls.classid)
    return pins


MOVED_PIN = " moved"
"""After a class name in ``Pins``: the id (and leaf handle) of a class that moved to another
parent, kept from the classes the apply adds (no class name has a blank)."""


def compile_new(
    store: Store,
    path: str,
    reading: Reading | None = None,
    repack: bool = False,
    access: Access | None = None,
) -> tuple[Result, tuple[Tree, ...]]:
    """``path`` compiled with the class ids of the policy live under ``store``'s name. A class
    that moved to another parent (a subscriber to another site) is given a new id and leaf
    handle: htb cannot move a class, so the plan builds the new one beside the live one, moves
    its filters to it and deletes the old (its counters start again), rather than building
    the whole tree again. Its children move with it, so they are given new ids too (by
    ``PARENT_PIN``s: the live parents). ``reading``: the live record already read (else read
    now). With the result, the kernel objects of its policy (made to compare them;
    ``prepare`` plans them). ``repack``: the spread mq trees are packed afresh, rather than
    each live class kept on its queue (``QUEUE_PIN``); a class that changes queue is made
    again, as a moved one. ``access``: where its includes and tables may be read."""
    applied = store.live() if reading is None else reading.applied
    pins = {label: dict(ids) for label, ids in stored_pins(applied).items()}
    if applied is None:
        return _analysed(path, pins, False, access)
    live_trees = (live_of(store, applied) if reading is None else reading.live).trees
    live = {  # (tree, class name) -> (its live id, its live parent)
        (t.label, t.names[o.key[2]]): (o.key[2], o.parent)
        for t in live_trees
        for o in t.objects
        if o.kind == "class" and o.key[2] in t.names
    }
    for (label, name), (_, parent) in live.items():
        if parent is not None:
            pins.setdefault(label, {})[f"{name}{PARENT_PIN}"] = _handle(parent)
    for label, queues in live_queue_handles(live_trees).items():
        ids = pins.setdefault(label, {})
        for key, handle in queues.items():  # (a record of an older tcdsl has none)
            ids.setdefault(key, handle)
    result, trees = _analysed(path, pins, repack, access)
    moved: set[tuple[str, str]] = set()
    # allocate gives a moved class a new id (by PARENT_PIN); a class that kept its live id
    # under another parent all the same is caught here and compiled again
    while result.policy is not None:
        found = {
            (t.label, t.names[o.key[2]])
            for t in trees
            for o in t.objects
            if o.kind == "class" and o.key[2] in t.names
            and _kept_elsewhere(live.get((t.label, t.names[o.key[2]])), o.key[2], o.parent)
        } - moved  # fmt: skip
        if not found:
            break
        for label, name in found:
            ids = pins.get(label, {})
            for pin in [k for k in ids if k == name or k.startswith(f"{name}{LEAF_PIN}")]:
                ids[pin.replace(name, f"{name}{MOVED_PIN}", 1)] = ids.pop(pin)
        moved |= found
        result, trees = _analysed(path, pins, repack, access)
    return result, trees


def _analysed(
    path: str, pins: Pins, repack: bool, access: Access | None
) -> tuple[Result, tuple[Tree, ...]]:
    """``path`` analysed with ``pins``, and its kernel objects (made while the lints run)."""
    made: list[tuple[Tree, ...]] = []
    result = analyse(
        path,
        pins=pins,
        repack=repack,
        access=access,
        beside_lints=lambda policy: made.append(trees_of(policy)),
    )
    return result, made[0] if made else ()


def live_queue_handles(trees: Iterable[Tree]) -> dict[str, dict[str, ir.Handle]]:
    """The ``QUEUE_PIN`` pins of the mq trees among ``trees`` (what an apply built): each
    queue's qdisc's handle and its queue's number (the mq's class minor it hangs from)."""
    found: dict[str, dict[str, ir.Handle]] = {}
    for t in trees:
        roots = [o for o in t.objects if o.kind == "qdisc" and o.parent == "root"]
        if len(roots) != 1 or roots[0].qdisc_kind != "mq" or roots[0].handle is None:
            continue
        mq = roots[0].handle
        for o in t.objects:
            if o.kind == "qdisc" and o.parent and o.parent.startswith(mq) and o.handle:
                queue = int(o.parent[len(mq) :] or "0", 16)
                found.setdefault(t.label, {})[f"{o.handle}{QUEUE_PIN}"] = ir.Handle(queue, 0)
    return found


def _kept_elsewhere(was: tuple[str, str | None] | None, classid: str, parent: str | None) -> bool:
    """Whether a class has its live id (``was``: its live id and parent) under another parent."""
    return was is not None and was[0] == classid and was[1] != parent


def applied_elsewhere(applied: Applied, path: str) -> bool:
    """Whether ``applied`` was applied from another file than ``path`` (named from here)."""
    return os.path.realpath(applied.where(applied.path)) != os.path.realpath(path)


def applied_from(path: str, name: str | None = None) -> Applied | None:
    """The record of the policy live under ``path``'s name (or ``name``) when it was applied
    from ``path`` itself; None when none is, or it came from another file."""
    state_name = policy_name(path, name)
    if not valid_name(state_name):
        return None
    applied = Store(state_name).live()
    return None if applied is None or applied_elsewhere(applied, path) else applied


def live_as_another_name(path: str) -> str | None:
    """The one policy name other than ``path``'s own whose live policy was applied from
    ``path`` itself (``apply --name shop office.tcp``), or None (none, or several)."""
    own = policy_name(path, None)
    found = []
    for store in Store.every():
        if store.name == own:
            continue
        try:
            applied = store.current()
        except OpsError:
            continue
        if applied is not None and not applied_elsewhere(applied, path):
            found.append(store.name)
    return found[0] if len(found) == 1 else None


def live_pins(path: str, name: str | None = None) -> Pins:
    """The class ids of the policy live under ``path``'s name ({} when none is), so that a
    command reading the kernel by the policy's names (``status``) finds what apply made."""
    state_name = policy_name(path, name)
    return stored_pins(Store(state_name).live()) if valid_name(state_name) else {}


def applied_policy(path: str, name: str | None = None) -> tuple[Applied, ir.Policy] | None:
    """The policy live under ``path``'s name (or ``name``) as it was applied (from the
    record's text, its tables too), when it was applied from ``path`` itself; None when not,
    or when the record cannot be read or compiled again."""
    try:
        applied = applied_from(path, name)
        return None if applied is None else (applied, compile_applied(applied))
    except (OpsError, OSError, ValueError, KeyError):
        return None


def changed_since(applied: Applied) -> list[tuple[str, bool]]:
    """The files an applied policy read that differ now from the text it was applied with,
    each with whether it is gone (or unreadable)."""
    out = []
    for name, text in sorted(applied.sources.items()):
        try:  # read as the compiler reads it (a byte-order mark is no text)
            now: str | None = decode_policy(Path(applied.where(name)).read_bytes())
        except (OSError, SourceError):
            now = None
        if now is None or normalise_newlines(now) != normalise_newlines(text):
            out.append((name, now is None))
    return out


def since_words(changed: Sequence[tuple[str, bool]]) -> str:
    """``isp.tcp and subs.csv changed, old.csv is gone``: :func:`changed_since` in words."""

    def listed(names: list[str]) -> str:
        return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]

    edited = [name for name, gone in changed if not gone]
    gone = [name for name, gone in changed if gone]
    parts = [f"{listed(edited)} changed"] if edited else []
    parts += [f"{listed(gone)} {'is' if len(gone) == 1 else 'are'} gone"] if gone else []
    return ", ".join(parts)


def _devices(policy: ir.Policy) -> tuple[str, ...]:
    """The network interfaces a policy names (for a download, not the IFB), in order: its
    state record's devices, and the locks a change of it holds (the ones the generated
    scripts take, so a script and tcdsl never interleave)."""
    return tuple(dict.fromkeys(iface.interface for iface in policy.interfaces))


def _ifbs(policy: ir.Policy) -> tuple[str, ...]:
    """The IFBs a policy's downloads are shaped on (which it makes and owns), in order."""
    return tuple(dict.fromkeys(i.name for i in policy.interfaces if i.download is not None))


def _taken(
    ifbs: Iterable[str], applied: Applied | None, live: Iterable[Tree] = ()
) -> tuple[str, ...]:
    """Of ``ifbs``, the IFBs a policy shapes on that it did not make (:attr:`Applied.taken`):
    those the live policy of its name (``applied``, whose trees are ``live``) had taken, and
    those it starts to shape on that exist. (The live trees' devices count as the live
    policy's own IFBs too: found by a review, a record of a tcdsl before ``ifbs`` made its
    own IFB look taken, never deleted.)"""
    before, taken = (set(applied.ifbs), applied.taken) if applied is not None else (set(), ())
    before |= {d for t in live for d in t.devices}
    return tuple(i for i in ifbs if (i in taken if i in before else link_kind(i) == "ifb"))


def _claimed(policy: ir.Policy) -> tuple[str, ...]:
    """The devices a change to ``policy`` takes from other names: its interfaces and IFBs."""
    return (*_devices(policy), *_ifbs(policy))


def _owned(applied: Applied) -> tuple[str, ...]:
    """The devices an applied policy owns: its interfaces, and its downloads' IFBs."""
    return (*applied.devices, *applied.ifbs)


def _interfaces(*policies: ir.Policy | None) -> set[str]:
    """The locks a change between ``policies`` holds: the interfaces of each."""
    return {d for p in policies if p is not None for d in _devices(p)}


def missing_devices(policy: ir.Policy) -> list[str]:
    """The devices a policy shapes that do not exist (an IFB a download makes excepted)."""
    return [d for d in _devices(policy) if not device_exists(d)]


def short_of_queues(policy: ir.Policy) -> list[tuple[str, str]]:
    """What is wrong with each device (device, message) that has fewer TX queues than its mq
    tree uses (mq gives it a class per queue it has: a queue's tree beyond them has nowhere
    to go), fewer in use than it steers to (skbedit sends those packets to queue 0), or more
    in use than a spread tree shapes (what no steering filter sends there would leave
    unshaped)."""
    out: list[tuple[str, str]] = []
    for iface in policy.interfaces:
        used = ir.tx_queues_used(iface)
        have, in_use = tx_queue_count(iface.name) if used else (None, None)
        if have is not None and have < used:
            out.append(
                (
                    iface.name,
                    f"{iface.name} has {have} TX queue{'s' if have != 1 else ''}, fewer than the "
                    f"{used} its mq tree uses (mq needs at least 2): give it more (ethtool -L "
                    f"{iface.name} combined {used}; numtxqueues for a veth) or use fewer "
                    "queues",
                )
            )
        highest = ir.highest_queue(iface)
        if in_use is not None and in_use < highest:
            out.append(
                (
                    iface.name,
                    f"{iface.name} has {in_use} TX queue{'s' if in_use != 1 else ''} in use, fewer "
                    f"than the {highest} its mq tree shapes: no packet reaches the trees of the "
                    f"queues past them (those steered there leave by the first queue); use more "
                    f"(ethtool -L "
                    f"{iface.name} combined {highest}, or tx {highest} where the driver counts TX "
                    "queues apart, as a veth's does) or fewer in the tree",
                )
            )
        spread = ir.spread_queues(iface)
        if spread and in_use is not None and in_use > spread:
            out.append(
                (
                    iface.name,
                    f"{iface.name} has {in_use} TX queues in use, more than the {spread} its mq "
                    f"tree is spread over: what no line matches could leave by one of the others, "
                    f"unshaped; write 'mq queues {in_use}', or use {spread} (ethtool -L "
                    f"{iface.name} combined {spread})",
                )
            )
        elif not spread and highest and in_use is not None and in_use > highest:
            out.append(
                (
                    iface.name,
                    f"{iface.name} has {in_use} TX queues in use, more than the {highest} its mq "
                    f"tree writes: a packet the kernel puts on a later queue meets that queue's "
                    f"default qdisc, unshaped; use {highest} (ethtool -L {iface.name} combined "
                    f"{highest}, or tx {highest} where the driver counts TX queues apart), or "
                    f"write the queues up to {in_use}",
                )
            )
    return out


def not_ifbs(policy: ir.Policy) -> list[tuple[str, str]]:
    """What is wrong with each device (the downloading interface, message) whose download
    names a device that exists and is not an IFB: its arrivals would be redirected there
    (out of a veth or a NIC, not shaped), and taking the policy down would delete it."""
    out: list[tuple[str, str]] = []
    for iface in policy.interfaces:
        if iface.download is None:
            continue
        kind = link_kind(iface.name)
        if kind is not None and kind != "ifb":
            out.append(
                (
                    iface.download.interface,
                    f"{iface.name} exists and is not an ifb device ({kind or 'no kind'}): a "
                    f"download needs an ifb of its own; name another (download via NAME) or "
                    f"remove {iface.name}",
                )
            )
    return out


def slots_taken(
    policy: ir.Policy, owned: Iterable[Tree], name: str | None = None
) -> list[tuple[str, str]]:
    """What is wrong with each device (device, message) whose ingress slot (``ffff:``)
    holds the kind of qdisc that excludes the one the policy puts there (``clsact`` for an
    mq tree's steering, ``ingress`` for a download or ingress policing), unless a tree of
    ``owned`` (the live policy's, which the change removes) put it there. The way out names
    the policy applied under another name than ``name`` whose record made that qdisc, if
    one did (found by a tester: it named the policy that shaped the device, whose 'down'
    then took its upload away and left another tool's clsact)."""
    mine = {o.dev for tree in owned for o in tree.objects if in_ingress_slot(o)}
    out: list[tuple[str, str]] = []
    for device, kind in dict.fromkeys(filter(None, map(ingress_slot, policy.interfaces))):
        there = live_qdisc(device, "ingress")
        found = there.split()[0] if there else None
        if found in ("clsact", "ingress") and found != kind and device not in mine:
            owner = _slot_maker(device, found, name)
            way = (
                f"remove it first (tcdsl down {owner}, which applied it)"
                if owner
                else "if nothing else needs it, remove it first "
                f"(tc qdisc del dev {device} {found})"
            )
            out.append(
                (
                    device,
                    f"{device} has the {found} qdisc in its ingress slot (ffff:), which "
                    f"excludes the {kind} qdisc this policy puts there; {way}",
                )
            )
    return out


def _slot_maker(device: str, kind: str, besides: str | None) -> str | None:
    """The name (not ``besides``) whose live record made the ``kind`` qdisc in ``device``'s
    ingress slot, if one did."""
    for store, applied in _live_elsewhere(besides):
        if applied is None or device not in _owned(applied):
            continue
        with contextlib.suppress(OpsError, OSError, ValueError, KeyError):
            for tree in live_of(store, applied).trees:
                if any(
                    o.dev == device and in_ingress_slot(o) and o.qdisc_kind == kind
                    for o in tree.objects
                ):
                    return store.name
    return None


def shaped_by_others(devices: Iterable[str], name: str) -> dict[str, str]:
    """The ``devices`` that a policy applied under another name than ``name`` shapes, and
    that name."""
    owners = _owners(besides=name)
    return {device: owners[device] for device in devices if device in owners}


def _not_taken(devices: Iterable[str], name: str, policy: ir.Policy | None = None) -> None:
    """Refuse (UnfitDevice) a change under ``name`` of ``devices`` another name shapes (at
    the first tree of ``policy`` on the first such device, when given)."""
    _refuse(others_refusal(devices, name), policy)


def _refuse(short: Sequence[tuple[str, str]], policy: ir.Policy | None) -> None:
    """Raise UnfitDevice with every message of ``short`` (device, message), at the first
    tree of ``policy`` on the first device (where the policy names it), if any."""
    if short:
        said = "; ".join(message for _, message in short)
        spans = {i.interface: i.span for i in reversed(policy.interfaces)} if policy else {}
        raise UnfitDevice(f"{said}; nothing was changed", spans.get(short[0][0]))


def others_refusal(devices: Iterable[str], name: str) -> list[tuple[str, str]]:
    """What is wrong with each of ``devices`` (device, message) that a policy applied under
    another name than ``name`` shapes: a change under ``name`` would take its trees over."""
    out = []
    owners = shaped_by_others(devices, name)
    unfinished = {other: _unfinished(other) for other in set(owners.values())}
    for device, other in owners.items():
        if unfinished[other]:
            said = (
                f"{device} is shaped by an apply under the name '{other}' that did not finish "
                f"(or is under way): end it first (tcdsl rollback {other})"
            )
        else:
            said = (
                f"{device} is shaped by the policy applied as '{other}': apply this one under "
                f"that name (--name {other}) to change it, or take that one down first (tcdsl "
                f"down {other})"
            )
        out.append((device, said))
    return out


def _live_elsewhere(besides: str | None) -> Iterator[tuple[Store, Applied | None]]:
    """The names' stores other than ``besides``, each with its live record in this network
    namespace (None: none, one that cannot be read, or one of another namespace)."""
    for store in Store.every():
        if store.name == besides:
            continue
        try:
            applied = store.current()
        except (OpsError, OSError):
            applied = None
        yield store, applied if applied is not None and applied.here else None


def marks_against_others(policy: ir.Policy, name: str) -> tuple[list[Diagnostic], dict[str, str]]:
    """E273 and W374 between the trees of ``policy`` that classify by mark and those of the
    policies live under other names on this router (which ``check`` cannot see: it reads
    one policy), and the texts their notes point into (a record that cannot be read or
    compiled again is passed over)."""
    if not any(i.marking is not None for i in policy.interfaces):
        return [], {}
    others: list[tuple[str, ir.Policy]] = []
    sources: dict[str, str] = {}
    for store, applied in _live_elsewhere(name):
        if applied is None or not any("mark" in text for text in applied.sources.values()):
            continue  # (no 'classify by mark' in it: not worth compiling)
        try:
            other = compile_applied(applied)
        except (OpsError, OSError, ValueError, KeyError):
            continue
        if any(i.marking is not None for i in other.interfaces):
            others.append((store.name, other))
            for path, text in applied.sources.items():
                sources.setdefault(path, text)
    return list(directions.marks_apart_from(policy, others)), sources


def _owners(besides: str | None = None) -> dict[str, str]:
    """Each device a policy's live record owns in this network namespace, and that policy's
    name (the first by name; ``besides``'s own left out): every record read once."""
    found: dict[str, str] = {}
    for store, applied in _live_elsewhere(besides):
        if applied is not None:
            for device in _owned(applied):
                found.setdefault(device, store.name)
        try:  # an apply under way (or killed): the kernel may hold part of it
            under_way = store.applying()
        except (OpsError, OSError, ValueError, KeyError):
            continue
        if under_way is not None and under_way.here:
            for device in _owned(under_way):
                found.setdefault(device, store.name)
    return found


def _unfinished(name: str) -> bool:
    """Whether ``name`` has an apply that did not finish and no policy live (``down`` finds
    nothing to take down: ``rollback`` ends it)."""
    store = Store(name)
    try:
        return store.current() is None and store.applying() is not None
    except (OpsError, OSError, ValueError, KeyError):
        return False


@dataclass(slots=True)
class Reading:
    """The record of the policy live under a name, and the kernel's digest: read in a child
    process meanwhile when :func:`start_reading` starts it (``tcdsl.forked``: tc and the
    parsing of what it prints run on another core while this one compiles the new policy),
    else when asked. Leaving it as a block stops a reading not taken."""

    applied: Applied | None
    live: Live
    _reading: Beside[dict[str, str]] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self._reading = Beside(self.live.kernel_now, fork=False)

    def kernel_now(self) -> dict[str, str]:
        """The digest of the live policy's devices, as the kernel has them now (what the
        child could not read is read here, and raises here)."""
        return self._reading.result()

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *_: object) -> None:
        self._reading.__exit__(None, None, None)


def start_reading(store: Store) -> Reading:
    """Read the live policy's record, and start reading the kernel's digest where the record
    has one to compare with."""
    applied = store.live()
    reading = Reading(applied, live_of(store, applied))
    if applied is not None and reading.live.kernel is not None:
        reading._reading = Beside(reading.live.kernel_now).__enter__()
    return reading


def prepare(
    store: Store,
    new: ir.Policy | None,
    result: Result | None = None,
    reading: Reading | None = None,
    new_trees: tuple[Tree, ...] | None = None,
    new_ifaces: Callable[[str], ir.Interface] | None = None,
) -> Prepared:
    """The plan from the policy live under ``store``'s name to ``new`` (None: remove it);
    ``reading``: the record and the kernel read while ``new`` compiled (else read now);
    ``new_trees``: ``new``'s kernel objects if already made (``compile_new`` makes them, a
    rollback reads them from a record: ``new_ifaces`` then gives a tree's IR by its label,
    where the plan needs it)."""
    if reading is None:
        applied = store.live()
        reading = Reading(applied, live_of(store, applied))
    applied, live = reading.applied, reading.live
    changed: dict[str, list[Diagnostic]] = {}
    repairs: dict[str, set[tuple[str, str, str]]] = {}
    unexplained: list[str] = []
    if applied is not None and (live.kernel is None or reading.kernel_now() != live.kernel):
        # the kernel is not as the apply left it (or nobody noted how it was): compare
        changed = drift(compile_applied(applied), dict(applied.sources), repairs)
        if not changed and live.kernel is not None:
            now = reading.kernel_now()
            unexplained = sorted(k for k, v in live.kernel.items() if now.get(k) != v)
    if new_trees is None:
        new_trees = trees_of(new)
    old_trees = live.trees
    killed = store.applying()
    if changed and new is not None and killed is not None:
        # A killed apply may have got far, or all the way, before the record: a tree the
        # kernel holds as the new policy says needs nothing (it was built again, counters
        # reset and the device unshaped a moment, when only its record was missing).
        done = {t.label for t in new_trees} & set(changed) - set(drift(new))
        if done:
            by_label = {n.label: n for n in new_trees}
            old_trees = tuple(by_label[t.label] if t.label in done else t for t in live.trees)
            changed = {label: found for label, found in changed.items() if label not in done}
    # (after a killed apply too: a tree it finished is the new policy's, counters and all;
    # found by a tester, a download it had built whole was built again)
    adopted = _adopted(new, new_trees, old_trees) if new is not None else ()
    old_trees = (*old_trees, *adopted)
    # a tree whose drift is values alone (a ceil, a leaf's limit set by hand) is changed in
    # place, those objects set again; one that a killed apply left (below) is built again
    # (each an object of the live trees: one that is not, whatever the reason, is no repair)
    live_keys = {o.key for t in old_trees for o in t.objects}
    repairs = {label: keys for label, keys in repairs.items() if keys <= live_keys}
    reset = set() if killed is not None else set().union(*repairs.values())
    rebuild = [label for label in changed if killed is not None or label not in repairs]
    kept = {t.label for t in new_trees}
    left: list[Change] = []
    old_trees = tuple(t if t.label in kept else _own_part(t, left) for t in old_trees)
    plan = make_plan(old_trees, new_trees, rebuild=rebuild, ifaces=new_ifaces, reset=reset)
    plan.notes += left
    for tree in reversed(adopted):
        text = (
            f"tree {tree.label}: taken over as the kernel holds it (no state, and it is as "
            "the policy builds it): nothing is built again, its counters stay"
        )
        plan.changes.insert(0, Change("~", text, tree.span))
    _foreign(live.trees, new_trees, plan, new_ifaces, applied)
    for label, found in sorted(changed.items()):
        for d in found:
            plan.drift.append(Change("!", f"drift in {label}: {d.message}", d.span))
    if unexplained and killed is None:  # (a killed apply's changes are said below)
        # what the policy leaves to tc (a class's burst, cburst or quantum) set by hand, or
        # what the policy does not own: shown, and the next apply takes it as it is
        plan.notes.append(
            Change(
                "!",
                f"{', '.join(unexplained)} changed since the last apply in what tcdsl does not "
                "compare: a value the policy leaves to tc (a class's burst, cburst or "
                "quantum), or something the policy does not own; apply leaves it as it is "
                "(a value written in the policy, tcdsl sets and checks)",
            )
        )
    if killed is not None:
        # trees only the unfinished apply made: remove whatever part of them it built
        keep = {t.label for t in [*new_trees, *live.trees]}
        for tree in trees_of(compile_applied(killed)):
            if tree.label not in keep:
                remove_tree(tree, plan)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(killed.applied_at))
        plan.drift.insert(
            0,
            Change("!", f"a change to {killed.path} (an apply or a rollback, started {when}) "
                   "did not finish: the kernel may hold part of it; what differs from the live "
                   "policy is built again"),
        )  # fmt: skip
    return Prepared(store, new, result, applied, live, plan, new_trees)


def _own_part(tree: Tree, said: list[Change]) -> Tree:
    """``tree``, to be removed, with a removal that leaves what its slots hold now that it did
    not make (found by a tester: ``down`` deleted the tbf another tool had put in place of
    the tree's htb, and an ingress qdisc holding another tool's filter): a root or ingress
    qdisc of another kind or handle stays whole; an ingress qdisc of the tree's that holds
    another's filters stays, only the tree's own filters removed. What stays is said in
    ``said``."""
    removal = list(tree.removal)
    for o in tree.objects:
        if o.kind != "qdisc" or o.parent not in ("root", "ingress"):
            continue
        dev, slot, kind = o.dev, o.parent, o.qdisc_kind or ""
        made = f"{kind} qdisc {o.handle or 'ffff:'}"
        now = live_qdisc(dev, slot)
        delete = ("tc", "qdisc", "del", "dev", dev, slot if slot == "root" else kind)
        if now is None or delete not in removal:
            continue
        where = f"the {slot} qdisc of {dev}"
        if now != made:
            removal.remove(delete)
            said.append(
                Change("!", f"{where} is a {now} now, which tree {tree.label} did not make (it "
                       f"made a {made}): left as it is", tree.span)
            )  # fmt: skip
            continue
        if slot == "root":
            continue
        own = {_slot_filter(c.args) for f in tree.objects if f.kind == "filters" and f.dev == dev
               for c in f.commands[:1]}  # fmt: skip
        foreign = sorted(slot_filters(dev, kind) - own, key=lambda f: f[1:])
        if not foreign:
            continue
        at = removal.index(delete)
        removal[at : at + 1] = [
            ("tc", "filter", "del", "dev", dev, "parent", parent, "protocol", proto, "prio", pref)
            for parent, proto, pref in sorted(own)
        ]
        prefs = ", ".join(dict.fromkeys(f"{proto} pref {pref}" for _, proto, pref in foreign))
        said.append(
            Change("!", f"{where} holds filters tree {tree.label} did not make ({prefs}): it is "
                   "left with them, the tree's own filters removed", tree.span)
        )  # fmt: skip
    return dataclasses.replace(tree, removal=tuple(removal))


def _slot_filter(args: tuple[str, ...]) -> tuple[str, str, str]:
    """(parent, protocol, pref) of a ``filter add`` command, as :func:`slot_filters` gives
    them (its key's parent is a clsact's egress hook for a download's 'mirred egress')."""
    parent = str(ir.CLSACT_EGRESS) if args[4] == "egress" else word_after(args, "parent")
    return (parent or "", word_after(args, "protocol") or "", word_after(args, "prio") or "")


def _adopted(new: ir.Policy, new_trees: Sequence[Tree], old: Sequence[Tree]) -> tuple[Tree, ...]:
    """The new trees that no record has, on a device whose slot holds a tree somebody made
    (an old script's, or what ``tcdsl import`` read), where the kernel is already as the
    policy builds it (read back as drift is): taken over as they are, not built again."""
    known = {t.label for t in old}
    # (a slot with nothing there: built as a first apply builds it)
    there = [
        t
        for t in new_trees
        if t.label not in known
        and t.iface is not None
        and live_qdisc(t.iface.name, "ingress" if t.iface.direction == "ingress" else "root")
    ]
    if not there:
        return ()
    ifaces = tuple(t.iface for t in there if t.iface is not None)
    differs = drift(dataclasses.replace(new, interfaces=ifaces))  # one read of the kernel
    return tuple(t for t in there if t.label not in differs)


def _foreign(
    old: Sequence[Tree],
    new: Sequence[Tree],
    plan: Plan,
    ifaces: Callable[[str], ir.Interface] | None = None,
    applied: Applied | None = None,
) -> None:
    """A new tree on a device that already has a tree no applied policy records (an old
    script's): its plan line says that it replaces it; a download's on an IFB it did not
    make (``applied``: the live record), that the device stays when the policy goes."""
    known = {t.label for t in old}
    # the slots the live trees hold (an mq tree's clsact, where a download's ingress goes)
    held = {(o.dev, "ingress" if in_ingress_slot(o) else "root") for t in old for o in t.objects}
    for tree in new:
        if tree.label in known:
            continue
        iface = tree.iface or (ifaces(tree.label) if ifaces is not None else None)
        if iface is None:
            continue
        # the root slot, and the ingress slot where the tree puts a qdisc (a download's
        # redirect, ingress policing, an mq tree's clsact: its filters go with it)
        ingress = ingress_slot(iface)
        slots = [(ingress[0], "ingress")] if ingress is not None else []
        slots += [(iface.name, "root")] if iface.direction != "ingress" else []
        slots = [slot for slot in slots if slot not in held]
        found = [
            f"{shown} on {dev}{_going_with(dev, shown) if where == 'ingress' else ''}"
            for dev, where in slots
            if (shown := live_qdisc(dev, where))
        ]
        # a download's IFB that exists: another tool's, or made by hand or by a script
        taken = iface.download is not None and bool(_taken((iface.name,), applied, old))
        if not found and not taken:
            continue
        for n, change in enumerate(plan.changes):
            if change.sign == "+" and change.text == f"tree {iface.label}":
                text = f"tree {iface.label}"
                if found:
                    text += f": replaces the {' and the '.join(found)} (no state)"
                    plan.replaced.extend(found)
                if taken:
                    text += (
                        f"{'; ' if found else ': '}{iface.name} exists and tcdsl did not make "
                        "it: taking the policy down removes its tree, not the device"
                    )
                plan.changes[n] = Change("!" if found else "+", text, change.span)


def _going_with(dev: str, shown: str) -> str:
    """The filters of ``dev``'s ingress slot, held by its qdisc (``shown``: ``ingress qdisc
    ffff:``), that go with it when a tree replaces it, in words ("" for none): no applied
    policy made them (found by a tester: a monitoring mirror went without a word)."""
    kind = shown.split()[0]
    if kind not in ("ingress", "clsact"):
        return ""
    hooks = {str(ir.CLSACT_INGRESS): "ingress ", str(ir.CLSACT_EGRESS): "egress "}
    found = sorted(slot_filters(dev, kind), key=lambda f: (f[0], int(f[2] or 0), f[1]))
    if not found:
        return ""
    prefs = ", ".join(
        f"{hooks.get(parent, '')}{proto} pref {pref}" for parent, proto, pref in found
    )
    # (by pref: a pref's filters are one group, however many)
    return f", and with it the filters it holds ({prefs})"


def _nothing() -> ir.Policy:
    return ir.Policy("", ())


def preflight(prepared: Prepared) -> None:
    """What ``apply`` checks before it changes anything, and ``plan`` too (so that it does
    not show a change that apply would refuse): the devices exist, have the TX queues an mq
    tree uses, and the kernel and tools have what the change needs (OpsError, Unsupported)."""
    new = prepared.new
    if new is None:
        return
    _fits(new, prepared.live.trees, prepared.store.name)
    if not prepared.plan.empty or prepared.plan.drift:
        check_support(prepared.live.features, new)


def _fits(policy: ir.Policy, owned: Iterable[Tree], name: str) -> None:
    """Refuse (OpsError) a policy whose devices are missing, shaped by a policy applied
    under another name than ``name``, have fewer TX queues than its mq trees use, or an
    ingress slot another qdisc holds (``owned``: the trees being replaced)."""
    # (at the first tree on the device: where the policy names it)
    spans = {i.interface: i.span for i in reversed(policy.interfaces)}
    missing = missing_devices(policy)
    if missing:
        raise MissingDevice(
            f"no such device: {', '.join(missing)}; nothing was changed", spans[missing[0]]
        )
    # a download's device that is no IFB is that, whoever shapes it (found by a tester: the
    # message began by telling to apply this policy under the other's name)
    wrong = not_ifbs(policy)
    no_ifb = {i.name for i in policy.interfaces if i.download is not None} if wrong else set()
    short = [s for s in others_refusal(_claimed(policy), name) if s[0] not in no_ifb]
    short += wrong + short_of_queues(policy) + slots_taken(policy, owned, name)
    _refuse(short, policy)


def apply(
    prepared: Prepared,
    path: str,
    sources: dict[str, str],
    confirm: float | None = None,
    runner: Runner = run_command,
) -> Applied:
    """Run a prepared plan; remember the new policy; with ``confirm`` (seconds), start the
    timer that rolls back unless ``tcdsl confirm`` comes first."""
    new = prepared.new
    assert new is not None
    preflight(prepared)
    store = prepared.store
    ids = {t: {n: str(h) for n, h in v.items()} for t, v in pins_of(new).items()}
    # the live policy's interfaces are its record's devices: it is compiled again only to
    # be restored (a failure), not for its locks
    held = _interfaces(new) | set(prepared.applied.devices if prepared.applied else ())
    # the locks are held from the check of the other names to the record: an apply under
    # another name waiting for them then finds this one's record (or its unfinished apply)
    with interface_locks(held):
        _not_taken(_claimed(new), store.name, new)
        try:
            taken = _taken(_ifbs(new), prepared.applied, prepared.live.trees)
            store.start(path, sources, _devices(new), ids, _ifbs(new), taken)
        except OSError as e:
            raise StateWriteError(
                f"cannot write the state folder {store.folder} ({e.strerror or e}); nothing "
                "was changed"
            ) from e
        reads: _Reads = {}
        undo = functools.cache(functools.partial(_undo, prepared, reads))  # made once, if at all
        try:
            apply_policy(
                prepared.plan,
                lambda: restore_plan(
                    prepared.old,
                    new,
                    _astray(prepared.old, undo() is not None, reads, "undone"),
                ),
                runner,
                undo,
                _rebuilt(lambda: prepared.old, new, reads, "restored"),
            )
        except ApplyFailed as failed:
            store.finish()  # the old policy was built again (or never left)
            if failed.restored and prepared.applied is not None and not failed.untouched:
                _remember_restored(store, prepared.applied.generation, prepared.old)
            # what the plan replaced that no state kept: its teardown ran, no record
            # rebuilds it
            failed.lost = tuple(prepared.plan.replaced)
            failed.first = prepared.applied is None
            if not failed.restored:
                # (the live policy compiled again: its saved text may no longer compile)
                with contextlib.suppress(OpsError):
                    old = prepared.old
                    astray = _astray(old, True, reads, "restored")
                    if old is not None and astray is not None:
                        labels = [i.label for i in old.interfaces]
                        failed.astray = tuple(t for t in labels if t in astray)
                        failed.back = tuple(t for t in labels if t not in astray)
            raise
        previous = prepared.applied.generation if prepared.applied is not None else None
        timer = " (and no timer rolls it back)" if confirm is not None else ""
        with _recording(
            store,
            f"the kernel holds {path} now{timer}",
            f"run 'tcdsl apply {path}' again: it finds the kernel as the policy says and "
            "records it",
        ):
            applied = store.record(path, sources, _devices(new), ids, _ifbs(new), taken)
            if confirm is not None:
                store.set_pending(Pending(applied.generation, previous, time.time() + confirm))
            else:
                store.set_pending(None)
    if confirm is not None:
        _start_timer(store, applied.generation, confirm)
    try:
        remember(store, applied.generation, new, prepared.new_trees)
    except OSError as e:
        raise NotKept(
            f"the state folder {store.folder} recorded {path} as applied, but could not keep "
            f"what it built and the kernel's digest after it ({e.strerror or e}): the next "
            "plan or apply compiles the policy again to compare, and keeps them",
            applied,
        ) from e
    return applied


class NotKept(StateWriteError):
    """The change stands and is recorded, but what it built and the kernel's digest after
    it were not kept (a full disk): a cache, which the next plan makes again."""

    def __init__(self, message: str, applied: Applied) -> None:
        super().__init__(message)
        self.applied = applied


@contextlib.contextmanager
def _recording(store: Store, changed: str, then: str) -> Iterator[None]:
    """The state written after the kernel changed (``changed`` says how): an OSError there (a
    full disk, a folder made read-only) is a StateWriteError that says so, and ``then``."""
    try:
        yield
    except OSError as e:
        raise StateWriteError(
            f"{changed}, but the state folder {store.folder} could not record it "
            f"({e.strerror or e}): free space or make it writable, then {then}"
        ) from e


def _start_timer(store: Store, generation: int, seconds: float) -> None:
    """A detached process that rolls back after ``seconds`` unless confirmed."""
    env = dict(os.environ, TCDSL_STATE_DIR=str(store.folder.parent))
    subprocess.Popen(
        [sys.executable, "-m", "tcdsl.ops.timer", store.name, str(generation), str(seconds)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def confirm(store: Store) -> Pending:
    """Keep the applied policy: stop the rollback timer."""
    pending = store.pending()
    if pending is None:
        rolled = store.timer_rolled()  # (found by a tester: a late confirm did not say it)
        said = f": {rolled}" if rolled else ""
        raise OpsError(f"nothing waits for confirmation under the name {store.name!r}{said}")
    if store.timer_left_partial():
        raise OpsError(
            f"generation {pending.generation} of {store.name!r} cannot be kept: the --confirm "
            "timer's rollback failed half-way, and the kernel holds part of each policy; "
            "nothing was changed (apply the policy you want)"
        )
    store.set_pending(None)
    return pending


def rollback(store: Store, runner: Runner = run_command) -> Applied | None:
    """Go back to the policy applied before the live one (None: there was none, and the
    live one is removed). The live one's record is dropped. After an apply that did not
    finish (killed), go back to the live one instead: the kernel may hold part of the other."""
    applied = store.live()
    interrupted = store.applying() is not None
    if applied is None and not interrupted:
        raise OpsError(f"no policy is applied under the name {store.name!r}")
    if interrupted:
        return _rollback_interrupted(store, applied, runner)
    assert applied is not None
    earlier = [g for g in store.generations() if g < applied.generation]
    if not earlier and applied.generation > 1:
        # generation 1 went first: the ones before this are no longer kept, and going
        # "back" to nothing would remove a policy that had one before it
        raise OpsError(
            f"the policies applied under {store.name!r} before generation "
            f"{applied.generation} are no longer kept (the last {KEEP} are); nothing was "
            f"changed (apply the policy you want, or 'tcdsl down {store.name}' to remove it)"
        )
    back = store.load(earlier[-1]) if earlier else None
    devices = dict.fromkeys([*applied.devices, *(back.devices if back else ())])
    missing = [d for d in devices if not device_exists(d)]
    if missing:
        raise MissingDevice(f"no such device: {', '.join(missing)}; nothing was changed")
    # a device the earlier policy shaped that another name has taken since (the records say)
    _not_taken(_owned(back) if back else (), store.name)
    # Both policies' kernel objects are their records' (as apply and down take the live
    # one's): each is compiled again only to restore the live one after a failure, or where
    # its record has no objects (an older tcdsl's).
    target = live_of(store, back)

    def target_iface(label: str) -> ir.Interface:
        assert back is not None  # (no trees to ask about otherwise)
        return next(i for i in compile_applied(back).interfaces if i.label == label)

    prepared = prepare(store, None, new_trees=target.trees, new_ifaces=target_iface)
    if back is not None and any(
        o.kind == "qdisc" and (o.qdisc_kind == "mq" or in_ingress_slot(o))
        for t in target.trees
        for o in t.objects
    ):  # the devices' queues or ingress slot may have changed since it was applied
        _fits(compile_applied(back), prepared.live.trees, store.name)

    def restore() -> Plan:
        old = compile_applied(applied)
        return restore_plan(old, compile_applied(back) if back is not None else _nothing())

    went = f"generation {back.generation}" if back is not None else "nothing"
    try:
        # the locks are held to the record, as apply holds them (an apply under another
        # name waiting for them then finds the devices this one took back)
        with interface_locks(set(applied.devices) | set(back.devices if back else ())):
            _not_taken(_owned(back) if back else (), store.name)  # again, under the locks
            if back is not None:
                # the IFBs it shapes on that it did not make, as an apply works them out (found
                # by a review: the older record's, kept, said tcdsl had made an IFB another
                # tool made since, which 'down' then deleted)
                live = prepared.live.trees
                back = dataclasses.replace(back, taken=_taken(back.ifbs, applied, live))
                # (found by a tester: a rollback killed half-way left no note, and the next
                # plan took what it had made for drift by hand)
                try:
                    store.start_again(back)
                except OSError as e:
                    raise StateWriteError(
                        f"cannot write the state folder {store.folder} ({e.strerror or e}); "
                        "nothing was changed"
                    ) from e
            rebuilt = _rebuilt(lambda: compile_applied(applied))
            apply_policy(prepared.plan, restore, runner, rebuilt=rebuilt)
            with _recording(
                store,
                f"the kernel holds what {store.name!r} held before ({went}) now",
                "apply the policy you want again",
            ):
                store.set_pending(None)
                store.finish()
                if back is None:
                    store.remove()
                    return None
                store.rewrite(back)
                store.forget(applied.generation)
    except ApplyFailed as failed:
        store.finish()  # the live policy was built again (or never left)
        if failed.restored and not failed.untouched:
            _remember_restored(store, applied.generation, compile_applied(applied))
        raise
    with _keeping(store, back):
        if store.read_extra(back.generation, "trees") is None:
            remember(store, back.generation, compile_applied(back), target.trees)
        else:
            remember_kernel(store, back.generation, target)
    return back


@contextlib.contextmanager
def _keeping(store: Store, back: Applied) -> Iterator[None]:
    """The cache written after a rollback to ``back`` (recorded as live again): an OSError
    there is NotKept, the rollback standing."""
    try:
        yield
    except OSError as e:
        raise NotKept(
            f"the state folder {store.folder} recorded generation {back.generation} as live "
            f"again, but could not keep the kernel's digest after it ({e.strerror or e}): "
            "the next plan or apply reads the kernel again to compare, and keeps it",
            back,
        ) from e


def _rollback_interrupted(store: Store, applied: Applied | None, runner: Runner) -> Applied | None:
    """``rollback`` after an apply that did not finish: back to the live policy (None: there
    was none, and every tree the unfinished apply may have made is removed)."""
    target = compile_applied(applied) if applied is not None else None
    prepared = prepare(store, target)
    old = prepared.old
    if applied is None:
        # a first apply was killed: remove every tree it may have made
        killed = store.applying()
        assert killed is not None
        old = compile_applied(killed)
        prepared.plan = make_plan(trees_of(old), (), rebuild=())
    empty = dataclasses.replace(old or _nothing(), interfaces=())
    went = f"generation {applied.generation}" if applied is not None else "nothing"
    with interface_locks(_interfaces(old, target)):
        restore = functools.partial(restore_plan, old, target or empty)
        apply_policy(prepared.plan, restore, runner, rebuilt=_rebuilt(lambda: old))
        with _recording(
            store,
            f"the kernel holds what {store.name!r} held before the unfinished apply ({went}) now",
            "apply the policy you want again",
        ):
            store.set_pending(None)
            store.finish()
            if target is None or applied is None:
                store.remove()
                return None
    with _keeping(store, applied):
        if store.read_extra(applied.generation, "trees") is None:
            remember(store, applied.generation, target, trees_of(target))
        else:
            remember_kernel(store, applied.generation, live_of(store, applied))
    return applied


def down(store: Store, runner: Runner = run_command) -> Plan:
    """Remove everything the policy live under the name owns, and its state."""
    prepared = prepare(store, None)
    if prepared.applied is None:
        raise OpsError(f"no policy is applied under the name {store.name!r}")
    # as for apply: the live policy is compiled again only to restore it after a failure
    with interface_locks(prepared.applied.devices):
        apply_policy(
            prepared.plan,
            lambda: restore_plan(prepared.old, _nothing()),
            runner,
            rebuilt=_rebuilt(lambda: prepared.old),
        )
    with _recording(
        store,
        f"the kernel no longer holds {store.name!r}",
        f"run 'tcdsl down {store.name}' again",
    ):
        store.remove()
    return prepared.plan


def _quiet(runner: Runner, argv: list[str]) -> bool:
    """Whether a command succeeds (a tool that is not installed does not)."""
    try:
        return runner(argv, None).returncode == 0
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class DownStep:
    """One removal ``tcdsl down -i`` makes: what it says, and the call that makes it (whether
    it was made)."""

    line: str
    run: Callable[[], bool]
    kept: bool = False
    """A line saying what is left as it is (``run`` changes nothing)."""


def down_interface_steps(device: str, runner: Runner = run_command) -> list[DownStep]:
    """What ``tcdsl down -i`` removes from ``device`` whatever policy made it, read from the
    kernel and the state folder, nothing changed yet: its root and ingress qdiscs (or an mq
    tree's clsact, unless it holds what tcdsl does not make: :func:`_foreign_clsact`), the IFB
    a download of it is shaped on (``ifb4DEV``), the marking chains ``TCDSL-DEV`` and
    ``TCDSL-ifb4DEV`` (a download's; and every jump into them) in iptables and ip6tables,
    the nft tables ``tcdsl_DEV`` and ``tcdsl_ifb4DEV``; and the state of policies that shaped
    only it. Lines in parentheses say what is left as it is."""
    if not device_exists(device):
        raise OpsError(f"no such device: {device}; nothing was changed")
    steps: list[DownStep] = []

    def step(line: str, *commands: list[str]) -> None:
        def run() -> bool:
            for command in commands[:-1]:
                _quiet(runner, command)
            return _quiet(runner, commands[-1])

        steps.append(DownStep(line, run))

    def kept(line: str) -> None:
        steps.append(DownStep(line, lambda: True, kept=True))

    shown = runner(["tc", "qdisc", "show", "dev", device], None).stdout
    # the ingress slot holds an ingress qdisc (a download's, policers') or an mq tree's clsact
    for where, word in (
        ("root", " root "),
        ("ingress", "qdisc ingress "),
        ("clsact", "qdisc clsact "),
    ):
        if word not in shown or (where == "root" and "qdisc noqueue" in shown):
            continue
        foreign = None
        if where == "clsact":
            mq = re.search(r"^qdisc mq \S+ root ", shown, re.MULTILINE) is not None
            foreign = _foreign_clsact(device, runner, mq)
        if foreign is not None:
            kept(
                f"- (the clsact qdisc of {device} {foreign}: left as it is; remove it with: "
                f"tc qdisc del dev {device} clsact)"
            )
            continue
        step(f"- {where} qdisc of {device}", ["tc", "qdisc", "del", "dev", device, where])
    ifb = ifb_name_for(device)
    taken = Store.taken_ifbs()

    def ifb_step(ifb: str, line: str) -> None:
        if ifb in taken:  # a policy's record says it found the device: its tree goes
            step(f"- the tree of {line} (not the device: tcdsl did not make it)",
                 ["tc", "qdisc", "del", "dev", ifb, "root"])  # fmt: skip
        else:
            step(f"- {line} and its tree", ["ip", "link", "del", ifb])

    if link_kind(ifb) == "ifb":
        ifb_step(ifb, f"{ifb} (the IFB of {device}'s downloads)")
    # the marking of the upload (named after the device) and of a download (after its IFB)
    for name in (device, ifb):
        chain = default_chain(name)
        for tool in ("iptables", "ip6tables"):
            if not _quiet(runner, [tool, "-t", "mangle", "-S", chain]):
                continue
            step(
                f"- {tool} chain {chain} and its jumps",
                ["sh", "-c", unjump_shell(chain, tool)],
                [tool, "-t", "mangle", "-F", chain],
                [tool, "-t", "mangle", "-X", chain],
            )
        table = nft_table_name(name)
        if _quiet(runner, ["nft", "list", "table", "inet", table]):
            step(f"- nft table inet {table}", ["nft", "delete", "table", "inet", table])
    owners: dict[str, str] | None = None  # read once, if a record has an IFB of another name
    for store in Store.every():
        try:
            applied = store.current()
        except OpsError:  # a damaged record: this is the way out of it, so not a failure
            kept(f"- (the state of {store.name} cannot be read: left as it is)")
            continue
        if applied is None or not set(applied.devices) <= {device}:
            continue
        if not applied.here:
            kept(
                f"- (the state of {store.name} is of a {device} in another network "
                "namespace: left as it is)"
            )
            continue
        for other in applied.ifbs:
            # a download shaped on an IFB of another name ('download via NAME'): the record
            # says the policy made it (found by a tester: it was left, and no record had it),
            # unless another name's record has it now
            if other == ifb or link_kind(other) != "ifb":
                continue
            owners = _owners() if owners is None else owners
            if owners.get(other, store.name) == store.name:
                ifb_step(
                    other, f"{other} (the IFB {store.name}'s download of {device} is shaped on)"
                )
        steps.append(DownStep(f"- the state of {store.name}", _removed(store)))
    return steps


def _removed(store: Store) -> Callable[[], bool]:
    def remove() -> bool:
        store.remove()
        return True

    return remove


def _foreign_clsact(device: str, runner: Runner, mq: bool) -> str | None:
    """Why the clsact qdisc of ``device`` is not tcdsl's, in words (``holds ...``), or None.
    tcdsl makes a clsact only for an mq tree that steers (E268 keeps a download and policers
    off it): on its egress hook, u32 or flower filters whose actions are skbedit's (and u32's
    links to its hash tables), one at least, or none where the root is an mq (``mq``: an
    older tcdsl made a clsact for every mq tree). (Found by a tester: any u32 filter without
    an action, and any redirect, were taken for tcdsl's, and another tool's clsact removed
    with them; by a review: an empty one on a device without an mq root too.)"""
    steers = False
    for hook in ("ingress", "egress"):
        text = runner(["tc", "filter", "show", "dev", device, hook], None).stdout
        for f in parse_filters(text):
            where = f"on its {hook} hook, which tcdsl does not make"
            if hook == "ingress" or f.kind not in ("u32", "flower"):
                return f"holds a {f.kind} filter {where}"
            if f.link:
                continue
            for line in f.words[1:]:
                action = parse_action(line)
                if action is not None and action[0] != "skbedit":
                    shown = line.split(":", 1)[1] if ":" in line else str(action[0])
                    return f"holds a '{' '.join(shown.split()[:4])}' action {where}"
            if not f.actions:
                return f"holds a {f.kind} filter without an action {where}"
            steers = True
    if steers or mq:
        return None
    return "holds no filter that steers to a TX queue, which tcdsl's has"


def down_interface(device: str, runner: Runner = run_command) -> list[str]:
    """Make the removals of :func:`down_interface_steps`: what was removed (and left), one
    line each."""
    return [s.line for s in down_interface_steps(device, runner) if s.run()]


__all__ = [
    "ApplyFailed",
    "DownStep",
    "NotKept",
    "OpsError",
    "Prepared",
    "apply",
    "confirm",
    "down",
    "down_interface",
    "down_interface_steps",
    "keep_record",
    "policy_name",
    "preflight",
    "prepare",
    "rollback",
]
