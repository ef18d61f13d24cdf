"""The shortcuts taken for large policies give what the plain code gives."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tcdsl import driver, forked, ir, lower
from tcdsl.driver import analyse
from tcdsl.forked import Beside
from tcdsl.ops.desired import Tree, trees_of
from tests.conftest import DIAGNOSTICS, POLICIES, ROOT

EXAMPLES = sorted(POLICIES.glob("*.tcp"))


def _nodes(value: Any) -> Iterator[Any]:
    """Every IR dataclass instance in ``value``, depth first."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield value
        for f in dataclasses.fields(value):
            yield from _nodes(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from _nodes(item)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_ir_replace_is_dataclasses_replace(path: Any) -> None:
    policy = analyse(str(path)).policy
    assert policy is not None
    for node in _nodes(policy):
        assert ir.replace(node) == node
        first = dataclasses.fields(node)[0].name
        other = dataclasses.replace(node, **{first: None})
        assert ir.replace(node, **{first: None}) == other
        assert type(ir.replace(node, **{first: None})) is type(other)


def test_memoised_lowering_is_per_object() -> None:
    """Equal match lines parsed twice get their own conditions (the lints compare them by
    identity with the line's own), and a memoised result is the one computed before."""
    text = "interface eth0 htb rate 10mbit default a {\n  class a rate 1mbit match u8 1 at 9\n}\n"

    def line() -> ir.Match:
        policy = analyse("x.tcp", loader=lambda _: text).policy
        assert policy is not None
        root = policy.interfaces[0].root
        assert isinstance(root, ir.Htb)
        (cls,) = (c for c in ir.classes_of(root) if c.name == "a")
        return cls.matches[0]

    a, b = line(), line()
    assert a == b and a is not b
    alts_a = lower.filter_alternatives(a, ("ipv4",))
    alts_b = lower.filter_alternatives(b, ("ipv4",))
    assert alts_a == alts_b
    assert alts_a[0][1][0] is a.conds[0] and alts_b[0][1][0] is b.conds[0]
    assert lower.filter_alternatives(a, ("ipv4",)) is alts_a
    assert lower.u32_keys(alts_a[0][1], "ipv4") is lower.u32_keys(alts_a[0][1], "ipv4")


# ---- two stages at once on large policies (tcdsl.forked) --------------------------------------

CASES = sorted(DIAGNOSTICS.glob("*.tcp"))


def _compiled(path: str, backend: str) -> tuple[Any, ...]:
    result = driver.compile_policy(path, backend)
    return result.output, result.files, result.diagnostics, result.policy


@pytest.mark.parametrize(
    "path", EXAMPLES + CASES, ids=[p.name for p in EXAMPLES] + [f"diag-{p.name}" for p in CASES]
)
def test_forked_stages_give_what_one_process_gives(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every policy compiles to the same output, files, diagnostics (warnings, lint errors,
    check errors, errors of the backend) and policy with the checks beside allocation and the
    lints beside the backend, each in a process of its own, as in one process."""
    monkeypatch.chdir(ROOT)  # the cases name their includes from the repository's root
    forks = _count_forks(monkeypatch)
    for backend in ("shell", "tc-batch") if path.parent == POLICIES else ("shell",):
        monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 10**9)
        plain = _compiled(str(path.relative_to(ROOT)), backend)
        monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 0)
        before = len(forks)
        assert _compiled(str(path.relative_to(ROOT)), backend) == plain
        assert len(forks) > before or not plain[3], "a policy that compiles forks twice"
    beside = driver.analyse(str(path.relative_to(ROOT)))  # forks once, for the checks
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 10**9)
    alone = driver.analyse(str(path.relative_to(ROOT)))
    assert (beside.diagnostics, beside.policy) == (alone.diagnostics, alone.policy)


def _count_forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the children forked from now on (in this process)."""
    forks: list[int] = []
    real = os.fork

    def counted() -> int:
        pid = real()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(forked.os, "fork", counted)
    return forks


def test_a_large_policy_compiles_in_two_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """From BESIDE_MIN_CLASSES classes on, a compile forks twice (the checks, the lints);
    below it, never."""
    classes = "\n".join(f"  class c{i} rate 1kbit match dport {1000 + i}" for i in range(40))
    text = f"interface eth0 htb rate 100mbit default c0 {{\n{classes}\n}}\n"
    forks = _count_forks(monkeypatch)
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 42)  # 41: the link class and 40
    small = driver.compile_policy("x.tcp", loader=lambda _: text)
    assert small.output is not None and forks == []
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 41)
    large = driver.compile_policy("x.tcp", loader=lambda _: text)
    assert large.output == small.output and len(forks) == 2


def test_the_shadowing_lint_runs_beside_allocation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a large policy the lints of the lines as written (the shadowing analysis, the
    costliest) run in the checks' child, beside allocation, and say what one process says;
    where the checks find an error they do not run."""
    from tcdsl import lint

    ran = tmp_path / "ran"

    def recorded(policy: ir.Policy) -> list[Any]:
        with ran.open("a") as out:
            out.write(f"{os.getpid()}\n")
        return lint.run_as_written(policy)

    monkeypatch.setattr(driver, "run_as_written", recorded)
    lines = "\n".join(f"  class c{i} rate 1kbit match dport {1000 + i}" for i in range(40))
    late = "  class late rate 1kbit match dport 1001\n"  # behind c1's line: W313
    text = f"interface eth0 htb rate 100mbit default c0 {{\n{lines}\n{late}}}\n"
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 0)
    beside = driver.analyse("x.tcp", loader=lambda _: text)
    assert [p for p in ran.read_text().split()] and str(os.getpid()) not in ran.read_text()
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 10**9)
    alone = driver.analyse("x.tcp", loader=lambda _: text)
    assert "W313" in [d.code for d in beside.diagnostics]
    assert [(d.code, d.message, d.span) for d in beside.diagnostics] == [
        (d.code, d.message, d.span) for d in alone.diagnostics
    ]
    ran.unlink()
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 0)
    failing = driver.analyse("x.tcp", loader=lambda _: text.replace("rate 100mbit", "rate 0bit"))
    assert failing.errors and not ran.exists()


def test_what_allocation_raises_beside_failing_checks_is_not_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beside the checks, allocation runs on a policy they may reject, as one process never
    does: what it raises then gives way to their errors; when they pass, it is raised."""
    bad = "interface eth0 htb rate 10mbit default a {\n  class a rate 20mbit ceil 5mbit\n}\n"
    good = "interface eth0 htb rate 10mbit default a {\n  class a rate 2mbit\n}\n"

    def broken(*_: object) -> None:
        raise RuntimeError("allocation broke")

    monkeypatch.setattr(driver, "allocate", broken)
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 0)
    result = driver.compile_policy("x.tcp", loader=lambda _: bad)
    assert [d.code for d in result.errors] == ["E202"]
    with pytest.raises(RuntimeError, match="allocation broke"):
        driver.compile_policy("x.tcp", loader=lambda _: good)


def test_beside_gives_the_childs_result() -> None:
    with Beside(os.getpid) as beside:
        assert beside.pid
        assert beside.result() not in (os.getpid(), 0)
    with Beside(os.getpid, fork=False) as inline:
        assert inline.pid == 0 and inline.result() == os.getpid()


def test_beside_makes_the_result_itself_when_the_child_cannot() -> None:
    """A result that does not pickle, and work that raises in the child, are made (and
    raised) in the calling process."""
    with Beside(lambda: (os.getpid(), lambda: 1)) as unpicklable:
        assert unpicklable.result()[0] == os.getpid()
    calls: list[int] = []

    def fails_once_per_process() -> int:
        calls.append(os.getpid())
        raise ValueError(f"failed in {os.getpid()}")

    with (
        Beside(fails_once_per_process) as failing,
        pytest.raises(ValueError, match=f"failed in {os.getpid()}"),
    ):
        failing.result()
    assert calls == [os.getpid()]  # the child's call was in its own copy of the list


def test_leaving_beside_early_stops_the_child() -> None:
    with pytest.raises(KeyError), Beside(lambda: time.sleep(60)) as sleeping:
        pid = sleeping.pid
        raise KeyError("the caller failed")
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_the_child_writes_nothing_of_the_parents_output() -> None:
    """Output the parent buffered before the fork is written once (the child leaves by
    os._exit, without flushing its copy of the buffers)."""
    script = (
        "import sys\n"
        "from tcdsl.forked import Beside\n"
        "sys.stdout.write('buffered;')\n"
        "with Beside(lambda: 2) as b:\n"
        "    print(b.result())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "buffered;2\n", "")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_work_beside_the_lints_sees_the_policy_one_process_gives(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``analyse(beside_lints=)`` (the live operations make the kernel objects so) is given
    the policy analyse returns, the lints in a child or not."""
    made: dict[int, list[tuple[Tree, ...]]] = {0: [], 10**9: []}
    results = {}
    for least in made:
        monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", least)
        results[least] = analyse(
            str(path), beside_lints=lambda p, m=made[least]: m.append(trees_of(p))
        )
    assert results[0].policy == results[10**9].policy and results[0].policy is not None
    assert made[0] == made[10**9] == [trees_of(results[0].policy)]


def test_work_beside_failing_lints_counts_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lint errors (here E263: more u32 prefs under one parent than the kernel takes) leave
    no policy; what the work beside them raised is not raised."""
    lines = "\n".join(
        f"  class c{i} rate 1kbit match dport {i + 1} pref {i + 1}" for i in range(2100)
    )
    text = f"interface eth0 htb rate 100mbit default c0 {{\n{lines}\n}}\n"
    calls: list[int] = []

    def fails(_: ir.Policy) -> None:
        calls.append(1)
        raise RuntimeError("beside the lints")

    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 0)
    result = analyse("x.tcp", loader=lambda _: text, beside_lints=fails)
    assert result.policy is None and "E263" in [d.code for d in result.errors]
    assert calls == [1]  # it ran, beside them
    monkeypatch.setattr(driver, "BESIDE_MIN_CLASSES", 10**9)
    assert analyse("x.tcp", loader=lambda _: text, beside_lints=fails).policy is None
    assert calls == [1]  # after them: not called


def test_beside_works_in_this_process_when_it_cannot_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", refused)
    with Beside(os.getpid) as beside:
        assert beside.pid == 0 and beside.fd == -1
        assert beside.result() == os.getpid()


def test_beside_works_in_this_process_without_the_memory_for_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child copies most of the pages it reads: with less memory available than this
    process holds (and half again), the work runs here (a small router and a large table)."""
    meminfo = tmp_path / "meminfo"
    monkeypatch.setattr(forked, "MEMINFO", str(meminfo))
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    for available, forks in ((resident // 1024, False), (2 * resident // 1024, True)):
        meminfo.write_text(f"MemTotal: {4 * resident // 1024} kB\nMemAvailable: {available} kB\n")
        with Beside(os.getpid) as beside:
            assert bool(beside.pid) == forks
            assert (beside.result() == os.getpid()) != forks
