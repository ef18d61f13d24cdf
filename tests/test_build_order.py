"""The order of the commands that build a tree (tcdsl.commands.interface_commands, which the
script, the tc-batch file and the live apply's rebuild share) never leaves a packet unshaped or
in a wrong class while they run: at every prefix of the list

- the default class of an htb or hfsc exists before the first filter of that qdisc and before
  any class that is not its ancestor (htb sends packets direct, unshaped, while it is missing;
  hfsc drops them);
- a filter's target class is complete (its ancestors, itself, its leaf qdisc and everything
  below) and so is the class or qdisc it is attached to; a shared police action it binds exists;
- per attach point (device, parent, protocol) the filters made are a prefix of the final list,
  in the final order: the kernel's, pref by pref (u32 tries filters of one pref in the order
  they were made), whatever the order the lines are written in;
- a download's redirect comes after the whole IFB tree; marking (iptables) after the tc
  commands of its tree.

Over every example policy and generated ones (tests/strategies.py), and a check that the old
order (every class, then the leaf qdiscs, then the filters) breaks these rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from tcdsl import ir, u32layout
from tcdsl.allocate import default_minor
from tcdsl.commands import FILTER_PROTOCOL, Command, filter_command, interface_commands
from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy
from tests.conftest import ROOT, policy_files
from tests.strategies import random_policies

Obj = tuple[str, int, int]
"""A qdisc (device, major, 0) or a class (device, major, minor)."""


def _handle(dev: str, text: str) -> Obj:
    major, _, minor = text.partition(":")
    return (dev, int(major or "0", 16), int(minor or "0", 16))


def _after(args: Sequence[str], key: str) -> str | None:
    return args[args.index(key) + 1] if key in args else None


def _target(args: Sequence[str]) -> str | None:
    """A filter's class: ``flowid`` (u32, fw) or ``classid`` (flower)."""
    return _after(args, "flowid") or _after(args, "classid")


def order_problems(iface: ir.Interface, commands: Sequence[Command]) -> list[str]:
    """Every rule of the module's doc that some prefix of ``commands`` breaks."""
    problems: list[str] = []
    parent_of: dict[Obj, Obj] = {}  # the final tree, from the commands themselves
    # in the order the kernel tries them: by pref, then as allocated (each protocol's own)
    final: dict[tuple[str, str, str], list[tuple[str, ...]]] = {}
    for f in sorted(iface.filters, key=lambda f: f.pref):
        key = (iface.name, str(f.parent), FILTER_PROTOCOL[f.family])
        final.setdefault(key, []).append(filter_command(iface, f).args)
    tc_devices: dict[str, int] = {}  # device -> index of its last tc command
    for i, c in enumerate(commands):
        if c.tool != "tc" or c.args[0] == "actions":
            continue
        dev = _after(c.args, "dev")
        assert dev is not None
        tc_devices[dev] = i
        if c.args[0] == "class":
            here = _handle(dev, _after(c.args, "classid") or "")
            parent_of[here] = _handle(dev, _after(c.args, "parent") or "")
        elif c.args[0] == "qdisc" and "parent" in c.args:  # below a class, a band, a tbf
            here = _handle(dev, (_after(c.args, "handle") or "").rstrip(":") + ":")
            parent_of[here] = _handle(dev, _after(c.args, "parent") or "")

    def ancestors(obj: Obj) -> list[Obj]:
        out = []
        while obj in parent_of:
            obj = parent_of[obj]
            out.append(obj)
        return out

    def below(obj: Obj) -> set[Obj]:
        return {o for o in parent_of if obj in ancestors(o)}

    kinds: dict[Obj, ir.Qdisc] = {}
    defaults: dict[Obj, Obj] = {}
    for q in ir.walk_qdiscs(iface.root):
        assert q.handle is not None
        qid = (iface.name, q.handle.major, 0)
        kinds[qid] = q
        minor = default_minor(q) if isinstance(q, ir.Htb | ir.Hfsc) else None
        if minor is not None:
            defaults[qid] = (iface.name, q.handle.major, minor)

    made: set[Obj] = set()
    actions: set[str] = set()
    tables: dict[tuple[str, str], str] = {}  # (parent, table id) -> "made" or "linked"
    filters: dict[tuple[str, str, str], int] = {}
    classful = ir.Htb | ir.Hfsc | ir.Cbq

    def exists(obj: Obj) -> bool:
        qdisc = (obj[0], obj[1], 0)
        if obj[2] and not isinstance(kinds.get(qdisc), classful):
            return qdisc in made  # a prio band, a tbf's or ingress's class: made with the qdisc
        return obj in made

    def complete(obj: Obj) -> bool:
        return exists(obj) and all(o in made for o in below(obj))

    for i, c in enumerate(commands):
        where = f"command {i + 1} ({c.what}: {' '.join(c.args)})"
        if c.tool in ("iptables", "ip6tables"):
            if i < tc_devices.get(iface.name, -1):
                problems.append(f"{where}: marks before the tc commands of its tree")
            continue
        if c.tool != "tc":
            continue
        if c.args[0] == "actions":
            actions.add(_after(c.args, "index") or "")
            continue
        dev = _after(c.args, "dev") or ""
        if dev != iface.name:  # a download's redirect, on the interface
            if i < tc_devices[iface.name]:
                problems.append(f"{where}: redirect before the IFB's tree is complete")
            continue
        if c.args[0] == "qdisc":
            if c.args[-1] == "clsact":  # an mq tree's steering: the ingress slot, ffff:
                here = (dev, ir.CLSACT_EGRESS.major, 0)
            elif "parent" in c.args:
                here = _handle(dev, (_after(c.args, "handle") or "").rstrip(":") + ":")
                if not exists(parent_of[here]):
                    problems.append(f"{where}: its parent does not exist")
            else:
                here = _handle(dev, (_after(c.args, "handle") or "").rstrip(":") + ":")
            made.add(here)
        elif c.args[0] == "class":
            here = _handle(dev, _after(c.args, "classid") or "")
            qdisc = (dev, here[1], 0)
            if not exists(parent_of[here]):
                problems.append(f"{where}: its parent does not exist")
            default = defaults.get(qdisc)
            early = default is not None and not exists(default) and here != default
            if early and here not in ancestors(default):
                problems.append(f"{where}: a class before the default class {default}")
            made.add(here)
        elif c.args[0] == "filter" and ("divisor" in c.args or "link" in c.args):
            problems += _table_problems(iface, c, where, tables, filters, final)
        elif c.args[0] == "filter":
            parent = str(ir.CLSACT_EGRESS) if "egress" in c.args else _after(c.args, "parent")
            attached = _handle(dev, parent or "")
            key = (dev, parent or "", _after(c.args, "protocol") or "")
            ht = _after(c.args, "ht")
            if ht is not None and tables.get((key[1], ht.split(":")[0])) != "made":
                problems.append(f"{where}: its table is not made, or already linked")
            n = filters.get(key, 0)
            if n >= len(final[key]) or final[key][n] != c.args:
                problems.append(f"{where}: not the next filter of {key} in the final order")
            filters[key] = n + 1
            if not exists(attached):
                problems.append(f"{where}: what it is attached to does not exist")
            target = _target(c.args)
            queue = _after(c.args, "queue_mapping")
            if queue is not None and iface.root.handle is not None:  # steered: the whole queue
                target = f"{iface.root.handle.major:x}:{int(queue) + 1:x}"
            if target is not None and not complete(_handle(dev, target)):
                problems.append(f"{where}: its class {target} is not complete")
            default = defaults.get((dev, attached[1], 0))
            if default is not None and not complete(default):
                problems.append(f"{where}: before the default class {default} is complete")
            index = _after(c.args, "index")
            if index is not None and index not in actions:
                problems.append(f"{where}: police action {index} does not exist yet")
    return problems


def _table_problems(
    iface: ir.Interface,
    c: Command,
    where: str,
    tables: dict[tuple[str, str], str],
    added: dict[tuple[str, str, str], int],
    final: dict[tuple[str, str, str], list[tuple[str, ...]]],
) -> list[str]:
    """A u32 table is made before its filters and linked once all of them (its sub-tables'
    too, linked) are in: no packet enters a half-filled table."""
    parent = str(ir.CLSACT_EGRESS) if "egress" in c.args else _after(c.args, "parent") or ""
    if "divisor" in c.args:
        table = (_after(c.args, "handle") or "").split(":")[0]
        if (parent, table) in tables:
            return [f"{where}: the table is made twice"]
        tables[(parent, table)] = "made"
        return []
    table = (_after(c.args, "link") or "").split(":")[0]
    if tables.get((parent, table)) != "made":
        return [f"{where}: links a table not made, or linked already"]
    tables[(parent, table)] = "linked"
    by_id = {(str(t.parent), f"{t.table:x}"): t for t in iface.u32_tables}
    problems = []
    for t in iface.u32_tables:  # the tables inside it are linked
        up = t.link.table
        inner = str(t.parent) == parent and up is not None and f"{up:x}" == table
        if inner and tables.get((parent, f"{t.table:x}")) != "linked":
            problems.append(f"{where}: table {t.table:x}: inside it is not linked yet")
    for f in iface.filters:  # and every filter inside it is in
        t = by_id.get((str(f.parent), table))
        place = f.place if isinstance(f, ir.U32Filter) else None
        if t is None or place is None or not _inside(place, t, by_id):
            continue
        key = (iface.name, parent, FILTER_PROTOCOL[f.family])
        if final[key].index(filter_command(iface, f).args) >= added.get(key, 0):
            problems.append(f"{where}: linked before its filter at {f.span.line}")
    return problems


def _inside(place: ir.U32Place, t: ir.U32Table, by_id: dict[tuple[str, str], ir.U32Table]) -> bool:
    table = place.table
    while table is not None:
        if table == t.table:
            return True
        table = by_id[(str(t.parent), f"{table:x}")].link.table
    return False


def _interfaces(text: str, name: str = "generated.tcp") -> tuple[ir.Interface, ...]:
    result = compile_policy(name, "tc-batch", loader=lambda _path: text)
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return result.policy.interfaces


def _example(path: Path) -> tuple[ir.Interface, ...]:
    result = compile_policy(str(ROOT / path), "tc-batch")
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return result.policy.interfaces


@pytest.mark.parametrize("path", policy_files(), ids=str)
def test_example_policies_build_in_a_safe_order(path: Path) -> None:
    for iface in _example(path):
        assert order_problems(iface, list(interface_commands(iface))) == []


@pytest.mark.parametrize("kernel", ["host", "uml"])
def test_generated_policies_build_in_a_safe_order(kernel: str) -> None:
    checked = 0
    for policy in random_policies(kernel, 150, seed=12):  # type: ignore[arg-type]
        for iface in _interfaces(policy.text):
            commands = list(interface_commands(iface))
            assert order_problems(iface, commands) == [], policy.text
            checked += sum(c.args[0] == "filter" for c in commands if c.tool == "tc")
    assert checked > 200  # the generator wrote filters to check


def test_filters_are_made_pref_by_pref_whatever_the_written_order() -> None:
    """A line of pref 2 written before lines of pref 1 (hashed, past 32 addresses): made
    first, it took the packets of the pref-1 lines not made yet while the script ran (found by
    a helper flooding the last subscriber during the build: 1,891 packets in 'wide')."""
    lines = "".join(f"    class s{i} rate 8kbit match dst 10.0.0.{i}\n" for i in range(1, 60))
    text = (
        "interface eth0 htb rate 1gbit default other {\n"
        "    class wide rate 1mbit match dst 10.0.0.0/8 pref 2\n"
        f"{lines}    class other rate 1mbit\n}}\n"
    )
    (iface,) = _interfaces(text)
    commands = list(interface_commands(iface))
    assert order_problems(iface, commands) == []
    made = [c.args for c in commands if c.args[:2] == ("filter", "add")]
    prefs = [int(_after(args, "prio") or "0") for args in made]
    assert prefs == sorted(prefs) and prefs[-1] == 2, prefs
    assert iface.u32_tables, "the pref-1 lines are hashed"


NESTED = """\
interface eth0 htb rate 100mbit default rest {
    class a rate 50mbit {
        htb default x {
            class y rate 10mbit match dport 22
            class x rate 10mbit
        }
    }
    class web rate 10mbit match dport 80
    class rest rate 1mbit
}
"""


def test_nested_trees_and_defaults_build_in_a_safe_order() -> None:
    (iface,) = _interfaces(NESTED)
    commands = list(interface_commands(iface))
    assert order_problems(iface, commands) == []
    what = [c.what for c in commands]
    # the default class, the class a filter names with its filter, then the others: the
    # inner htb's default class before its filter's class
    assert what.index("class rest") < what.index("class web") < what.index("filter to 1:20")
    assert what.index("filter to 1:20") < what.index("class a") < what.index("class x")
    assert what.index("class x") < what.index("class y") < what.index("filter to 10:10")


def _ranked(commands: list[Command], ranks: dict[str, int]) -> list[Command]:
    """``commands`` sorted by kind (the root qdisc and actions first), classes and qdiscs in
    the order the policy writes them (pre-order), filters in their order."""

    def rank(c: Command) -> tuple[int, int, int]:
        if c.tool != "tc" or c.args[0] == "actions" or "root" in c.args:
            return (0, 0, 0)
        if c.args[0] == "filter":
            return (ranks["filter"], 0, 0)
        return (ranks[c.args[0]], c.span.line, c.span.column)

    return sorted(commands, key=rank)


def test_the_checker_finds_unsafe_orders() -> None:
    """The checker is not vacuous: the order before issue 12 (every class, then the leaf
    qdiscs, then the filters) makes classes before the default class; filters first send
    packets to classes not there yet; a filter out of its place changes u32's order."""
    (iface,) = _example(Path("policies/office.tcp"))
    commands = list(interface_commands(iface))
    old = order_problems(iface, _ranked(commands, {"class": 1, "qdisc": 2, "filter": 3}))
    assert any("a class before the default class" in p for p in old), old
    early = order_problems(iface, _ranked(commands, {"filter": 1, "class": 2, "qdisc": 3}))
    assert any("its class 1:10 is not complete" in p for p in early), early
    assert any("before the default class" in p for p in early), early
    a = next(  # two filters in a row at one attach point (the ipv6 pair to 1:20)
        i
        for i, (c, d) in enumerate(itertools.pairwise(commands))
        if c.args[0] == d.args[0] == "filter" and c.args[:8] == d.args[:8]
    )
    swapped = [*commands[:a], commands[a + 1], commands[a], *commands[a + 2 :]]
    moved = order_problems(iface, swapped)
    assert any("not the next filter" in p for p in moved), moved


def test_u32_tables_build_in_a_safe_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hash tables two deep and sub-lists of divisor 1 (``u32layout`` made small): each table
    before its filters, each link after them and after the links inside it."""
    monkeypatch.setattr(u32layout, "HASH_MIN", 4)
    monkeypatch.setattr(u32layout, "NODES", 5)
    lines = [
        f"    class c{x}_{y} rate 1kbit match dst 10.0.{x}.{y}" for x in range(8) for y in range(8)
    ]
    lines += [f"    class p{i} rate 1kbit match dport {1000 + i}" for i in range(12)]
    text = "interface eth0 htb rate 100mbit default p0 {\n" + "\n".join(lines) + "\n}\n"
    (iface,) = _interfaces(text)
    divisors = sorted(t.divisor for t in iface.u32_tables)
    assert divisors.count(256) >= 9 and 1 in divisors, divisors  # 10.0.X. then 10.0.x.Y
    assert {t.link.table for t in iface.u32_tables if t.divisor == 256} > {None}
    assert order_problems(iface, list(interface_commands(iface))) == []


def test_steering_before_its_queue_is_complete_is_caught() -> None:
    """An mq tree's clsact and steering filters come last: moved right after the mq root, the
    first steering filter would send packets to a queue whose tree does not exist yet."""
    (iface,) = _example(Path("policies/isp-mq.tcp"))
    commands = list(interface_commands(iface))
    assert order_problems(iface, commands) == []
    steering = [c for c in commands if "clsact" in c.args or "egress" in c.args]
    rest = [c for c in commands if c not in steering]
    early = [rest[0], *steering, *rest[1:]]
    assert any("is not complete" in p for p in order_problems(iface, early))
