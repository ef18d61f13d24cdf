"""A filter group in u32 hash tables changed node by node (tcdsl.ops.u32nodes): the steps,
replayed on a model of the buckets, keep every line in its bucket with its old or its new class
at each step and end in the new policy's nodes; what cannot be done so is refused (the tree is
then built again)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcdsl import ir
from tcdsl.commands import Command
from tcdsl.driver import analyse
from tcdsl.ops.desired import Obj, by_key, class_ids, trees_of, word_after
from tcdsl.ops.plan import has_u32_tables, make_plan
from tcdsl.ops.u32nodes import line_keys, node_changes

Line = tuple[str, str]
"""A subscriber: (class name, address)."""


def _text(lines: list[Line], extra: str = "") -> str:
    body = "".join(f"    class {name} rate 1mbit match dst {addr}\n" for name, addr in lines)
    return (
        f"interface d0 htb rate 1gbit default rest {{\n{body}{extra}    class rest rate 1mbit\n}}\n"
    )


def _compiled(folder: Path, text: str, old: ir.Policy | None = None) -> ir.Policy:
    path = folder / "p.tcp"
    path.write_text(text, encoding="utf-8")
    result = analyse(str(path), pins=class_ids(old) if old is not None else None)
    assert result.policy is not None, result.diagnostics
    return result.policy


def _groups(old: ir.Policy, new: ir.Policy) -> list[tuple[Obj, Obj]]:
    a = by_key(trees_of(old)[0].objects)
    b = by_key(trees_of(new)[0].objects)
    return [
        (a[k], b[k])
        for k in b
        if k in a and b[k].kind == "filters" and has_u32_tables(a[k]) and a[k].words != b[k].words
    ]


def _nodes(commands: tuple[Command, ...]) -> dict[str, tuple[object, str]]:
    """handle -> (keys, class) of a group's filters that are not tables or links."""
    out: dict[str, tuple[object, str]] = {}
    for c in commands:
        if "divisor" in c.args or "link" in c.args:
            continue
        handle = word_after(c.args, "handle")
        assert handle is not None
        out[handle] = (line_keys(c), word_after(c.args, "flowid") or "")
    return out


def _replay(old: Obj, new: Obj, steps: list[Command]) -> None:
    """Run ``steps`` on a model of the live nodes, checking after each one that every line of
    the old or the new group is where a packet finds it, with its old or its new class."""
    live = _nodes(old.commands)
    before = {keys: flow for keys, flow in live.values()}
    after = {keys: flow for keys, flow in _nodes(new.commands).values()}
    for step in steps:
        handle = word_after(step.args, "handle")
        assert handle is not None and int(handle.split(":")[2], 16) <= 0xFFF, step.args
        if step.args[1] == "add":
            assert handle not in live, f"{handle} is taken: {step.args}"
            live[handle] = (line_keys(step), word_after(step.args, "flowid") or "")
        else:
            assert step.args[1] == "del" and handle in live, step.args
            del live[handle]
        present: dict[object, set[str]] = {}
        for keys, flow in live.values():
            present.setdefault(keys, set()).add(flow)
        for keys in before.keys() & after.keys():
            assert keys in present, f"a line is missing after {step.args}"
        for keys, flows in present.items():
            assert flows <= {before.get(keys), after.get(keys)} - {None}, (keys, flows)
    assert live == _nodes(new.commands)


ADDRESSES = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=34, max_size=70, unique=True
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(old=ADDRESSES, v6=st.booleans(), data=st.data())
def test_node_steps_keep_every_line(
    tmp_path: Path, old: list[tuple[int, int]], v6: bool, data: st.DataObject
) -> None:
    """Random subscribers (IPv4 or IPv6, hashed on the last byte, a few per bucket), then
    random additions, removals, moves and class changes: where the group changes node by
    node, every step keeps each line present with its old or new class, and the end is the
    new policy's nodes."""

    def address(x: int, y: int) -> str:
        return f"2001:db8::{x:x}:{y:x}" if v6 else f"10.0.{x}.{y}"

    lines = [(f"s{i}", address(a, b)) for i, (a, b) in enumerate(old)]
    a = _compiled(tmp_path, _text(lines))
    edited = list(lines)
    for k in range(data.draw(st.integers(1, 6))):
        what = data.draw(st.sampled_from(["add", "remove", "move", "reclass"]))
        at = data.draw(st.integers(0, len(edited) - 1))
        taken = {addr for _, addr in edited}
        free = [address(x, y) for x in range(4, 6) for y in range(41)]
        free = [f for f in free if f not in taken]
        if what == "add":
            edited.insert(at, (f"n{k}", data.draw(st.sampled_from(free))))
        elif what == "remove" and len(edited) > 33:
            del edited[at]
        elif what == "move":
            edited[at] = (edited[at][0], data.draw(st.sampled_from(free)))
        elif what == "reclass":
            j = data.draw(st.integers(0, len(edited) - 1))
            edited[at], edited[j] = (edited[at][0], edited[j][1]), (edited[j][0], edited[at][1])
    if edited == lines:
        return
    b = _compiled(tmp_path, _text(edited), a)
    groups = _groups(a, b)
    assert groups  # the edits change the hashed group
    for o, n in groups:
        steps = node_changes(o, n)
        if _tables(o) == _tables(n):
            assert steps is not None  # disjoint lines, the same tables: node by node
        if steps is not None:
            _replay(o, n, steps)


def _tables(group: Obj) -> list[tuple[str, ...]]:
    return [c.args for c in group.commands if "divisor" in c.args or "link" in c.args]


def test_a_subscriber_added_removed_and_moved_changes_nodes_only(tmp_path: Path) -> None:
    """The ISP's daily edits inside one hashed run: no rebuild, and the plan's steps are
    filter adds and deletes by handle (classes aside)."""
    lines = [(f"s{i}", f"10.0.{i % 3}.{i}") for i in range(40)]
    a = _compiled(tmp_path, _text(lines))
    edited = [*lines[:10], ("n1", "10.0.1.200"), *lines[10:]]
    edited = [x for x in edited if x[0] != "s7"]
    edited = [(name, "10.0.0.99" if name == "s9" else addr) for name, addr in edited]
    b = _compiled(tmp_path, _text(edited), a)
    plan = make_plan(trees_of(a), trees_of(b))
    assert "rebuild" not in plan.render(), plan.render()
    assert "+ class n1" in plan.render() and "- class s7" in plan.render()
    ((o, n),) = _groups(a, b)
    steps = node_changes(o, n)
    assert steps is not None
    _replay(o, n, steps)
    tc = [args for step in plan.steps for args in step.commands]
    filters = [args for args in tc if args[0] == "filter"]
    assert filters and all("divisor" not in args and "link" not in args for args in filters)
    assert not any(args[:2] == ("qdisc", "del") for args in tc)


def test_what_cannot_change_node_by_node_is_swapped(tmp_path: Path) -> None:
    """Refused, so the group is swapped (tcdsl.ops.u32swap), not the tree built again: lines
    of one bucket that overlap (order decides), and a change of the tables (a line that
    splits the hashed run)."""
    lines = [(f"s{i}", f"10.0.0.{i}") for i in range(40)]
    a = _compiled(tmp_path, _text(lines))
    overlapping = _text(lines, "    class web rate 1mbit match dst 10.0.1.5 dport 80\n")
    overlapping = overlapping.replace("dst 10.0.1.5 dport 80", "dst 10.0.0.5 dport 80")
    # the new line fixes the hashed byte (5): it joins s5's bucket, which it overlaps
    b = _compiled(tmp_path, overlapping, a)
    ((o, n),) = _groups(a, b)
    assert node_changes(o, n) is None
    plan = make_plan(trees_of(a), trees_of(b))
    assert "rebuild" not in plan.render() and any(step.settle for step in plan.steps)
    split = [*lines[:20], ("wide", "10.0.0.0/24"), *lines[20:]]
    c = _compiled(tmp_path, _text(split), a)
    ((o, n),) = _groups(a, c)
    assert node_changes(o, n) is None
