"""A filter group whose u32 tables change, swapped make-before-break (tcdsl.ops.u32swap): the
steps' order and words; the kernel side is tests/test_ops.py's, frames probed after every
command (tests/ops_swap.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.driver import analyse
from tcdsl.ops import apply as apply_module
from tcdsl.ops.apply import SETTLE_WAITS, run_command, run_step
from tcdsl.ops.desired import Obj, class_ids, trees_of, word_after
from tcdsl.ops.plan import Step, _swap, make_plan
from tcdsl.ops.u32swap import Swaps, table_ids
from tests.test_apply import make_netns, run

__all__ = ["make_netns"]  # a fixture, imported so that pytest finds it here


def _compiled(
    folder: Path, lines: list[tuple[str, str]], old: ir.Policy | None = None, extra: str = ""
) -> ir.Policy:
    body = "".join(f"    class {name} rate 1mbit match dst {addr}\n" for name, addr in lines)
    body += extra
    path = folder / "p.tcp"
    path.write_text(
        f"interface d0 htb rate 1gbit default rest {{\n{body}    class rest rate 1mbit\n}}\n",
        encoding="utf-8",
    )
    result = analyse(str(path), pins=class_ids(old) if old is not None else None)
    assert result.policy is not None, result.diagnostics
    return result.policy


def _group(policy: ir.Policy) -> Obj:
    (group,) = [o for o in trees_of(policy)[0].objects if o.kind == "filters"]
    return group


BASE = [(f"s{i}", f"10.0.0.{i}") for i in range(1, 41)]
SAME_BUCKET = [(f"t{j}", f"10.0.{j}.7") for j in range(1, 41)]
"""40 more lines in BASE's bucket 7: it gets a table of its own."""


def test_a_change_of_the_tables_is_swapped_in_three_steps(tmp_path: Path) -> None:
    a = _compiled(tmp_path, BASE)
    b = _compiled(tmp_path, BASE + SAME_BUCKET, a)
    old, new = _group(a), _group(b)
    assert table_ids(old) == {1} and len(table_ids(new)) == 2  # a second level appeared
    plan = make_plan(trees_of(a), trees_of(b))
    assert "rebuild" not in plan.render()
    leftovers, build, settle, clear = plan.steps
    assert not build.settle and settle.settle and clear.settle
    copy = [c for c in build.commands if c[0] == "filter"]
    assert {word_after(c, "prio") for c in copy} == {"2"}  # next to pref 1, nothing between
    copied = {int(word_after(c, "handle").split(":")[0], 16) for c in copy if "divisor" in c}
    assert len(copied) == 2 and not copied & (table_ids(old) | table_ids(new))
    # first, whatever a swap cut short left (listed nowhere) at the ids the plan makes and
    # no live group holds goes: the copy's, and the new group's new ones
    assert leftovers.force and leftovers.settle and not leftovers.fatal
    fresh = copied | (table_ids(new) - table_ids(old))
    assert sorted(" ".join(c) for c in leftovers.commands) == sorted(
        f"filter del dev d0 parent 1: protocol ip prio 1 handle {t:x}: u32" for t in fresh
    )
    words = [" ".join(c) for c in settle.commands]
    gone = "filter del dev d0 parent 1: protocol ip prio"
    assert words[0] == f"{gone} 1"  # the old group goes whole, at once
    assert words[1] == f"{gone} 2 handle 1: u32"  # its table, through the copy
    assert settle.commands[2:-1] == tuple(c.args for c in new.commands)
    assert words[-1] == f"{gone} 2"
    top = {
        int((word_after(c, "link") or "").split(":")[0], 16)
        for c in copy
        if "link" in c and (word_after(c, "handle") or "").startswith("::")
    }
    assert len(top) == 1, "one table linked from the pref's root, one inside it"
    assert [" ".join(c) for c in clear.commands] == [
        f"{gone} 1 handle {t:x}: u32" for t in [*top, *(copied - top)]
    ], "the top table first: the inner one is let go of when the top one goes"


def test_the_plan_of_a_swap_reads_as_the_lines_that_change(tmp_path: Path) -> None:
    """Tables numbered again by a swap are no change to read: the plan names the lines added
    (without table ids or buckets), the table and link made, and the swap itself; the lines
    kept are not listed."""
    a = _compiled(tmp_path, BASE)
    b = _compiled(tmp_path, BASE + SAME_BUCKET[:34], a)
    assert table_ids(_group(a)) != table_ids(_group(b))
    text = make_plan(trees_of(a), trees_of(b)).render()
    lines = [line.split("  (")[0] for line in text.splitlines()]
    added = [f"+ filter {n} (match ip dst {addr})" for n, addr in SAME_BUCKET[:34]]
    assert [line for line in lines if line.startswith(("+ filter", "- filter"))] == added
    assert lines.count("+ hash table (divisor 256)") == 1
    assert [line for line in lines[:-1] if "hash link" in line] == [
        "+ hash link (hashkey mask 0x0000ff00 at 16)"
    ]
    swap = "~ filters of d0 1: protocol ip pref 1: its hash tables are made again"
    assert lines.count(f"{swap}, a copy at pref 2 meanwhile") == 1
    assert not any("ht " in line or "10.0.0." in line for line in lines), text
    assert len(lines) == 34 + 34 + 3 + 1  # the classes, their lines, table, link, swap, sum
    assert lines[-1] == (
        "plan: 70 to add (34 classes, 34 filters, 1 hash link, 1 hash table), "
        "1 to change (1 filter group)"
    )


def test_lines_only_reordered_read_as_one_line(tmp_path: Path) -> None:
    """Rows of a table reordered, nothing else: one line saying how many lines are tried in
    another order (a helper's 200-subscriber reorder gave a plan of 744 lines, each filter
    removed and added with the same keys); a line added among them is listed."""
    small = [(f"s{i}", f"10.0.0.{i}") for i in range(1, 6)]
    a = _compiled(tmp_path, small)
    b = _compiled(tmp_path, [*small[::-1], ("z", "10.0.0.99")], a)
    lines = [
        line.split("  (")[0] for line in make_plan(trees_of(a), trees_of(b)).render().splitlines()
    ]
    assert lines == [
        "+ class z",
        "+ filter z (match ip dst 10.0.0.99)",
        "~ filters of d0 1: protocol ip pref 1: 4 line(s) tried in another order",
        "plan: 2 to add (1 class, 1 filter), 1 to change (1 filter group)",
    ]


def test_a_group_with_tables_that_goes_takes_them_with_it(tmp_path: Path) -> None:
    a = _compiled(tmp_path, BASE)
    b = _compiled(tmp_path, [], a)
    plan = make_plan(trees_of(a), trees_of(b))
    assert "rebuild" not in plan.render() and "- filter s7 (" in plan.render()
    settle = next(s for s in plan.steps if s.settle)
    # no other u32 pref stays: the qdisc's table pool goes with its last one
    assert [" ".join(c) for c in settle.commands] == [
        "filter del dev d0 parent 1: protocol ip prio 1"
    ]


def test_without_a_free_pref_the_group_is_deleted_and_built_again(tmp_path: Path) -> None:
    """No tree rebuild: the old pref goes (its tables through another u32 pref of the qdisc
    that stays), then the new one is built; without a copy, so no table ids are needed."""
    a = _compiled(tmp_path, BASE)
    b = _compiled(tmp_path, BASE + SAME_BUCKET, a)
    old, new = _group(a), _group(b)
    assert _swap(old, new, {0, 2}, set(), Swaps()) is None  # prefs 0 (none) and 2 taken
    assert _swap(old, new, set(), set(range(1, 0x7FF)), Swaps()) is None  # one id, two tables
    swaps = Swaps()
    assert _swap(old, new, set(), set(range(1, 0x7FE)), swaps) == 2  # two ids left
    assert swaps.copies == [("filters", "d0", "1:", "ip", "2")]
    ssh = "    class ssh rate 1mbit match dport 22 pref 2\n"  # next to the tables' pref 1
    c = _compiled(tmp_path, BASE + SAME_BUCKET, extra=ssh)
    d = _compiled(tmp_path, BASE, c, extra=ssh)
    assert {_prefs(c), _prefs(d)} == {("1", "2", "32770")}  # ssh for IPv6 too
    plan = make_plan(trees_of(c), trees_of(d))
    assert "rebuild" not in plan.render()
    assert "! filters of d0 1: protocol ip pref 1: deleted and built again" in plan.render()
    (settle,) = [s for s in plan.steps if s.settle]
    words = [" ".join(c) for c in settle.commands]
    gone = "filter del dev d0 parent 1: protocol ip prio"
    assert words[:3] == [f"{gone} 1", f"{gone} 2 handle 1: u32", f"{gone} 2 handle 2: u32"]
    (tables,) = [o for o in trees_of(d)[0].objects if o.kind == "filters" and o.key[4] == "1"]
    assert settle.commands[3:] == tuple(c.args for c in tables.commands)


def test_the_copy_takes_a_pref_free_on_its_own_qdisc(tmp_path: Path) -> None:
    """Prefs are a qdisc's own: pref 2 taken by an inner htb's filter leaves pref 2 of the
    root free for the copy (it was counted taken, and the group deleted and built again)."""
    inner = (
        "    class hq rate 1mbit match dst 10.9.0.0/16 {\n"
        "        htb rate 1mbit default office {\n"
        "            class ssh rate 1mbit match dport 22 pref 2\n"
        "            class office rate 1mbit\n"
        "        }\n"
        "    }\n"
    )
    a = _compiled(tmp_path, BASE, extra=inner)
    b = _compiled(tmp_path, BASE + SAME_BUCKET, a, extra=inner)
    groups = [o.key for o in trees_of(a)[0].objects if o.kind == "filters"]
    assert any(k[4] == "2" and k[2] != "1:" for k in groups), groups
    text = make_plan(trees_of(a), trees_of(b)).render()
    assert "its hash tables are made again, a copy at pref 2 meanwhile" in text, text
    assert "deleted and built again" not in text


def _prefs(policy: ir.Policy) -> tuple[str, ...]:
    return tuple(sorted(o.key[4] for o in trees_of(policy)[0].objects if o.kind == "filters"))


def test_a_settling_step_tries_each_command_again_while_it_is_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each command the kernel says is in use is tried again from where the batch stopped,
    with the waits starting again for each command it gets to; another error, or one in use
    past the waits, fails at that command."""
    monkeypatch.setattr(apply_module.time, "sleep", lambda seconds: None)
    commands = tuple(("filter", "del", "dev", "d0", "handle", f"{i}:", "u32") for i in range(12))
    step = Step("tc", commands, tuple(None for _ in commands), settle=True)
    tried: list[str] = []

    def busy_once(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        assert stdin is not None
        lines = stdin.splitlines()
        for n, line in enumerate(lines, 1):
            if line not in tried:  # in use on its first try
                tried.append(line)
                said = f"Error: cls_u32: Can not delete in-use filter.\nCommand failed -:{n}\n"
                return subprocess.CompletedProcess(argv, 1, "", said)
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert run_step(step, busy_once) is None
    assert len(tried) == 12

    def busy_always(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        said = "Error: cls_u32: Can not delete in-use filter.\nCommand failed -:1\n"
        calls.append(1)
        return subprocess.CompletedProcess(argv, 1, "", said)

    calls: list[int] = []
    failed = run_step(step, busy_always)
    assert failed is not None and failed.command.endswith("handle 0: u32")
    assert len(calls) == len(SETTLE_WAITS) + 1

    def gone(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        said = "Error: Filter with specified priority/protocol not found.\nCommand failed -:3\n"
        return subprocess.CompletedProcess(argv, 1, "", said)

    failed = run_step(step, gone)
    assert failed is not None and failed.command.endswith("handle 2: u32")


def test_a_forced_settling_step_tries_again_what_failed_after_a_table_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a tester: undoing a failed swap (forced: every command tried) deletes a table
    and adds one of the same id further on; with the table still in use, the add failed as
    already there, and only the delete was tried again: the undo never matched the old
    policy, which was built again (every counter reset). What failed from the first command
    in use on is tried again, in its order; what failed before it is let be."""
    monkeypatch.setattr(apply_module.time, "sleep", lambda seconds: None)
    commands = (
        ("filter", "del", "dev", "d0", "parent", "1:", "handle", "9:", "u32"),  # not there
        ("filter", "del", "dev", "d0", "parent", "1:", "handle", "10:", "u32"),
        ("filter", "add", "dev", "d0", "parent", "1:", "handle", "10:", "u32", "divisor", "256"),
    )
    step = Step("tc", commands, tuple(None for _ in commands), settle=True, force=True)
    tables = {"10:"}
    tries: list[str] = []

    def kernel(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        assert stdin is not None and argv[:3] == ["tc", "-force", "-batch"], argv
        said = ""
        for n, line in enumerate(stdin.splitlines(), 1):
            handle = line.split()[7]
            tries.append(f"{line.split()[1]} {handle}")
            if " del " in line and handle not in tables:
                said += "Error: Filter with specified priority/protocol not found.\n"
                said += f"Command failed -:{n}\n"
            elif " del " in line and tries.count(f"del {handle}") == 1:
                said += f"Error: cls_u32: Can not delete in-use filter.\nCommand failed -:{n}\n"
            elif " del " in line:
                tables.discard(handle)
            elif handle in tables:
                said += f"Error: Filter already exists.\nCommand failed -:{n}\n"
            else:
                tables.add(handle)
        return subprocess.CompletedProcess(argv, 1 if said else 0, "", said)

    assert run_step(step, kernel) is None
    assert tries == ["del 9:", "del 10:", "add 10:", "del 10:", "add 10:"], tries
    assert tables == {"10:"}


def _in(ns: str) -> Callable[[Sequence[str], str | None], subprocess.CompletedProcess[str]]:
    """A runner of commands inside the namespace ``ns``."""

    def runner(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        return run_command(["ip", "netns", "exec", ns, *argv], stdin)

    return runner


def _veth(make_netns: Callable[[], str]) -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
    run(["ip", "-n", ns, "link", "set", "d0", "up"])
    return ns


def test_undoing_tries_a_table_in_use_again(make_netns: Callable[[], str]) -> None:
    """Found by a tester: the undo of a failed swap runs its steps forced (every command
    tried), and did not try again a table the kernel still held in use (its link deleted a
    moment before): the table stayed in the qdisc's pool, listed nowhere, and every later
    apply of the change failed on its id. Forced, a settling step still tries it again."""
    ns = _veth(make_netns)
    tc = ["ip", "netns", "exec", ns, "tc"]
    run([*tc, "qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb"])
    where = ["dev", "d0", "parent", "1:", "protocol", "ip", "prio", "1"]
    run([*tc, "filter", "add", *where, "handle", "1:", "u32", "divisor", "256"])
    link = ["link", "1:", "hashkey", "mask", "0x000000ff", "at", "16", "match", "u32", "0", "0"]
    run([*tc, "filter", "add", *where, "u32", *link])
    run([*tc, "filter", "add", *where, "u32", "match", "u32", "0", "0", "flowid", "1:1"])
    commands = (
        ("filter", "del", *where, "handle", "1:", "u32"),  # in use: linked still
        ("filter", "del", *where, "handle", "800::800", "u32"),  # the link
        ("filter", "del", *where, "handle", "7:", "u32"),  # no such table: let fail
    )
    step = Step("tc", commands, (None, None, None), settle=True, force=True)
    assert run_step(step, _in(ns)) is None
    got = run([*tc, "filter", "get", *where, "handle", "1:", "u32"], check=False)
    assert got.returncode != 0 and "not found" in got.stderr, got.stdout


def test_a_table_a_cut_short_swap_left_does_not_stop_the_next(
    make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Tables of no pref in the qdisc's pool (a swap cut short by a kill leaves them; no
    listing shows them) at the ids a swap's copy takes: they go first, and the swap is made
    in place, where every apply stopped at 'Filter already exists'."""
    from tests.test_ops import Tcdsl

    ns = _veth(make_netns)
    t = Tcdsl(ns, tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _compiled(tmp_path / "a", BASE)
    assert t("apply", "--yes", "--name", "s", str(tmp_path / "a" / "p.tcp")).code == 0
    pool = ["dev", "d0", "parent", "1:", "protocol", "ip"]
    for table in range(2, 0x21):  # tables left in the pool: made at a pref, the pref deleted
        t.tc("filter", "add", *pool, "prio", "9", "handle", f"{table:x}:", "u32", "divisor", "1")
    # one linking to the next, as a copy's levels do (found by a review: the second, let go
    # of only after the first, was not tried again)
    t.tc("filter", "add", *pool, "prio", "9", "u32", "ht", "3:", "link", "4:", "match", "u32",
         "0", "0")  # fmt: skip
    t.tc("filter", "del", *pool, "prio", "9")
    hidden = run(["ip", "netns", "exec", ns, "tc", "filter", "get", *pool, "prio", "1",
                  "handle", "5:", "u32"], check=False)  # fmt: skip
    assert hidden.returncode == 0 and "fh 5: ht divisor 1" in hidden.stdout
    assert "fh 5: " not in t.tc("filter", "show", "dev", "d0")  # listed nowhere
    _compiled(tmp_path / "b", BASE + SAME_BUCKET)
    applied = t("apply", "--yes", "--name", "s", str(tmp_path / "b" / "p.tcp"))
    assert applied.code == 0 and "! " not in applied.out, applied.out + applied.err
    plan = t("plan", "--name", "s", str(tmp_path / "b" / "p.tcp"))
    assert plan.code == 0 and "no changes" in plan.out, plan.out + plan.err


def test_a_link_into_a_sub_list_says_what_it_is(tmp_path: Path) -> None:
    """Found by a tester: the link into a bucket's next sub-list (past the 4,095 nodes u32
    keeps in order) read '+ hash link ()'."""
    ports = [(f"p{i}", "") for i in range(4200)]
    body = "".join(
        f"    class {n} rate 1kbit match dport {1000 + i}\n" for i, (n, _) in enumerate(ports)
    )
    path = tmp_path / "p.tcp"
    path.write_text(
        f"interface d0 htb rate 1gbit default rest {{\n{body}    class rest rate 1mbit\n}}\n",
        encoding="utf-8",
    )
    result = analyse(str(path))
    assert result.policy is not None, result.diagnostics
    shown = make_plan([], trees_of(result.policy)).render()
    assert "hash link ()" not in shown
    new = trees_of(result.policy)[0]
    lines = make_plan([replace(new, objects=())], [new]).render()
    assert "+ hash link (to the next sub-list of a long bucket)" in lines, lines[-2000:]
