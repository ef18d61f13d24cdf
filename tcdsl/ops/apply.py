"""Running a plan on the live kernel, safely: check first, change, and on a failure restore
the policy that was live (or, on a first apply, remove what was added) and name the command
that failed at its policy line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

from tcdsl.commands import Command, batch_quote
from tcdsl.ops.live import info_kind
from tcdsl.ops.plan import Plan, Step
from tcdsl.ops.state import OpsError, Store
from tcdsl.verify.readback import parse_qdiscs

Runner = Callable[[Sequence[str], str | None], subprocess.CompletedProcess[str]]
"""Runs a command (argv, stdin text) and returns how it went; tests wrap it to fail on cue."""


def run_command(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real runner."""
    # A session of its own: the terminal's Ctrl-C reaches tcdsl, which lets the command
    # finish (a tc -batch cut short is a change half-made) before it takes the change back.
    # And files, not pipes, for what it reads and writes (found by a tester): a tcdsl killed
    # while it fed a pipe cut the batch short, and tc writing to a pipe nobody reads any
    # more is killed by SIGPIPE. A file is whole before the command starts, and outlives us.
    with _memory_file(stdin) as given, _memory_file() as out, _memory_file() as err:
        done = subprocess.run(
            list(argv), stdin=given, stdout=out, stderr=err, timeout=600, check=False,
            start_new_session=True,
        )  # fmt: skip
        return subprocess.CompletedProcess(done.args, done.returncode, _read(out), _read(err))


@contextlib.contextmanager
def _memory_file(text: str | None = "") -> Iterator[int | None]:
    """An anonymous file holding ``text`` (UTF-8), read from its start; None for None (the
    command reads what tcdsl's own stdin is)."""
    if text is None:
        yield None
        return
    fd = os.memfd_create("tcdsl", os.MFD_CLOEXEC)
    try:
        if text:
            os.write(fd, text.encode())  # memfd writes are whole (no short write but ENOSPC)
            os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _read(fd: int | None) -> str:
    assert fd is not None
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(fd, "rb", closefd=False) as f:
        return f.read().decode(errors="replace")


DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that, while the kernel changes, stop the change at the end of the step under
way and take it back (as a failed command does), instead of ending tcdsl there: Ctrl-C, a
service stop, and the hangup of a lost session (the one ``--confirm`` is for)."""


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Note :data:`DEFERRED` signals instead of acting on them (the list yields them as
    they come). A signal ignored on entry stays ignored (a job started with SIGINT ignored);
    outside the main thread, where Python takes no signal, nothing changes. Within another,
    the same list: an apply holds them from its first change to its record."""
    if _ACTIVE:  # within another: its list (a caller holding them over more than a plan)
        yield _ACTIVE[-1]
        return
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    _ACTIVE.append(caught)
    before: dict[signal.Signals, signal._HANDLER] = {}
    for sig in DEFERRED:
        handler = signal.getsignal(sig)
        if handler is signal.SIG_IGN:
            continue
        before[sig] = handler
        signal.signal(sig, lambda number, _frame: caught.append(number))
    try:
        yield caught
    finally:
        _ACTIVE.pop()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _name(caught: Sequence[int]) -> str:
    """``SIGINT``: the name of the first signal caught."""
    return signal.Signals(caught[0]).name


_ACTIVE: list[list[int]] = []
"""The list of the :func:`deferred_signals` in effect, if any."""


_FAILED = re.compile(r"Command failed -:(\d+)")


@dataclass(frozen=True, slots=True)
class Failure:
    """A command that failed: the command, what the tool said, the policy's command it is
    (None: a cleanup no policy line asks for)."""

    command: str
    message: str
    origin: Command | None


class ApplyFailed(Exception):
    """A plan stopped at a failing command, or at a signal (the kernel has been restored)."""

    def __init__(
        self,
        failure: Failure,
        restored: bool,
        in_place: bool = False,
        signal: int | None = None,
        untouched: bool = False,
    ) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.restored = restored
        self.signal = signal
        """The signal (SIGINT, SIGTERM, SIGHUP) that stopped the plan, if one did."""
        self.untouched = untouched
        """The plan stopped before its first change (a signal came while it was made)."""
        self.in_place = in_place
        """Restored by undoing the change in place (the trees and counters kept), not by
        building the old policy again."""
        self.lost: tuple[str, ...] = ()
        """What the change replaced that no state kept (an old script's root qdisc): gone,
        whatever the restore did."""
        self.first = False
        """A first apply: restored is removed again (nothing was built before it)."""
        self.astray: tuple[str, ...] = ()
        """Not restored: the previous policy's trees that are not as it builds them, where
        the kernel could be read (its other trees are)."""
        self.back: tuple[str, ...] = ()
        """Not restored: the previous policy's trees that are as it builds them."""


SETTLE_WAITS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0)
"""Seconds between the tries of a settling step's command the kernel says is in use (a u32
table whose last link went: it is let go of after an RCU grace period, milliseconds); each
command the step gets to has them all."""


def run_step(step: Step, runner: Runner = run_command) -> Failure | None:
    """Run one step; the failure of a fatal one, else None."""
    if not step.commands:
        return None
    if step.tool == "tc" and (step.force or not step.fatal):
        # Every command tried, whichever fail. A forced step's failures are let be (an
        # undo's: it does what it can); a teardown's, but for a qdisc still there after its
        # delete (found by a tester: a download's redirect whose delete failed was left, its
        # IFB deleted by the next step, and every packet the device received dropped).
        left = _forced(step, runner)
        if step.fatal or left is None:
            return None
        return _left_behind(step, left, runner)
    if step.tool == "tc":
        commands = step.commands
        waits = iter(SETTLE_WAITS if step.settle else ())
        start = 0
        while True:
            done = runner(["tc", "-batch", "-"], _batch_text(commands[start:]))
            if done.returncode == 0:
                return None
            found = _FAILED.search(done.stderr)
            n = start + int(found.group(1)) - 1 if found else len(commands) - 1
            n = min(max(n, start), len(commands) - 1)
            if n > start:  # further on: the waits start again for this command
                waits = iter(SETTLE_WAITS if step.settle else ())
            wait = next(waits, None) if "in-use" in done.stderr else None
            if wait is None:
                return Failure("tc " + " ".join(commands[n]), _said(done), step.origins[n])
            time.sleep(wait)
            start = n  # the commands before it were made
    taken: frozenset[str] | None = None
    for command, origin in zip(step.commands, step.origins, strict=True):
        # a download's IFB: deleted only while it is one (the kernel ignores 'type ifb' on a
        # delete, and a device of that name made since may be a veth or a NIC)
        if step.tool == "ip" and command[:3] == ("link", "del", "dev"):
            if not _is_ifb(command[3], runner):
                continue
            taken = Store.taken_ifbs() if taken is None else taken  # read once, if at all
            if command[3] in taken:
                # an IFB the policy found and did not make: its tree goes, the device stays
                runner(["tc", "qdisc", "del", "dev", command[3], "root"], None)
                continue
        done = runner([step.tool, *command], step.stdin)
        if done.returncode != 0 and step.fatal:
            return Failure(f"{step.tool} " + " ".join(command), _said(done), origin)
    return None


def _forced(step: Step, runner: Runner) -> dict[tuple[str, ...], str] | None:
    """Every command of ``step`` tried (``tc -force -batch``), whichever fail; in a settling
    step, those the kernel says are in use tried again, in their order, after each of the
    waits. (Found by a tester: undoing a failed swap of u32 tables without the tries left
    the tables deleted too soon in the qdisc's pool, where no listing shows them, and every
    later apply of the change failed on their ids.) None when every command was made in the
    end; else what tc said of each command that failed (none named: tc said nothing of it)."""
    pending = list(step.commands)
    waits = iter(SETTLE_WAITS if step.settle else ())
    failed: dict[tuple[str, ...], str] = {}
    while pending:
        done = runner(["tc", "-force", "-batch", "-"], _batch_text(pending))
        if done.returncode == 0:
            break
        said = failures(done.stderr)
        failed.update((pending[n], words) for n, words in said.items() if n < len(pending))
        busy = [n for n, words in said.items() if "in-use" in words and n < len(pending)]
        wait = next(waits, None) if busy and step.settle else None
        if wait is None:
            return failed
        time.sleep(wait)
        # What failed from the first command in use on is tried again, in its order: a table
        # still in use makes the add of its id further on fail ('already exists'), and the
        # class its filters point at fail to go (found by a tester: the undo of a swap then
        # never matched the old policy, which was built again, every counter reset).
        pending = [pending[n] for n in sorted(said) if min(busy) <= n < len(pending)]
        for command in pending:
            failed.pop(command, None)  # tried again (a command may be there twice)
    return failed or None


def _left_behind(step: Step, failed: dict[tuple[str, ...], str], runner: Runner) -> Failure | None:
    """After a teardown that did not all go through: the first qdisc it deletes that is still
    there, as a failure. Every one is read back (tc may have failed without naming which, or
    been stopped before it got to it); anything else it deletes is taken as gone."""
    for command in step.commands:
        if not _gone(command, runner):
            said = failed.get(command) or "tc said nothing of it"
            return Failure("tc " + " ".join(command), f"still there after its delete: {said}", None)
    return None


def _gone(command: tuple[str, ...], runner: Runner) -> bool:
    """Whether what a teardown's tc command deletes is gone (a qdisc deleted as ``qdisc del
    dev D root|ingress|clsact``: read back; anything else: taken as gone)."""
    if command[:3] != ("qdisc", "del", "dev") or len(command) != 5:
        return True
    device, slot = command[3], command[4]
    shown = runner(["tc", "qdisc", "show", "dev", device], None)
    if shown.returncode != 0:
        return "Cannot find device" in shown.stderr
    if slot == "root":  # (handle 0: is the kernel's own)
        return not any(q.parent == "root" and q.handle != "0:" for q in parse_qdiscs(shown.stdout))
    return not any(q.kind == slot for q in parse_qdiscs(shown.stdout))


def _batch_text(commands: Sequence[tuple[str, ...]]) -> str:
    """``tc -batch`` input of ``commands`` (words without ``tc``), quoted for its parser."""
    return "".join(" ".join(batch_quote(w) for w in c) + "\n" for c in commands)


def failures(said: str) -> dict[int, str]:
    """The commands (0-based, in the batch) that ``tc -force -batch`` said failed, with what
    it said of each: a failure's words come before its ``Command failed -:N`` (``in-use``
    among them where the kernel holds the object in use)."""
    found: dict[int, str] = {}
    start = 0
    for m in _FAILED.finditer(said):
        found[int(m.group(1)) - 1] = said[start : m.start()].strip()
        start = m.end()
    return found


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """Why a command failed: what it said, or the signal that stopped it, or its status."""
    if done.stderr.strip():
        return done.stderr.strip()
    if done.returncode < 0:
        return f"{done.args[0]} was stopped by {signal.Signals(-done.returncode).name}"
    return f"{done.args[0]} exited with status {done.returncode}, saying nothing"


def _is_ifb(device: str, runner: Runner) -> bool:
    shown = runner(["ip", "-d", "-j", "link", "show", "dev", device], None)
    return shown.returncode == 0 and info_kind(shown.stdout) == "ifb"


def run_plan(
    plan: Plan, runner: Runner = run_command, caught: Sequence[int] = ()
) -> Failure | None:
    """Run every step in order; the first failure (the rest is not run). A signal in
    ``caught`` (:func:`deferred_signals`) by the end of a step stops the plan there too."""
    for step in plan.steps:
        if caught:
            break
        failure = run_step(step, runner)
        if failure is not None and caught:  # the signal stopped the step's command too
            name = _name(caught)
            message = f"{name} came while the kernel changed, and cut the step under way short"
            return Failure(failure.command, f"{message} ({failure.message})", failure.origin)
        if failure is not None:
            return failure
    if caught:
        name = _name(caught)
        message = (
            f"{name} came while the kernel changed: the change stopped after the step under way"
        )
        return Failure(name, message, None)
    return None


def late_signal(caught: Sequence[int]) -> str | None:
    """What to say when a signal in ``caught`` came only after the change was complete (it
    stands, and so does its record)."""
    if not caught:
        return None
    return f"tcdsl: {_name(caught)} came after the change was complete: it is kept, and recorded"


Undo = Callable[[], tuple[Plan, Callable[[], bool]] | None]
"""Makes the plan that takes the kernel back in place after a failed one (None: none can),
and the check that the kernel is the old policy again after it."""


def apply_policy(
    plan: Plan,
    restore: Callable[[], Plan],
    runner: Runner = run_command,
    undo: Undo | None = None,
    rebuilt: Callable[[], bool] | None = None,
) -> None:
    """Run ``plan``; on a failure, take the kernel back and raise :class:`ApplyFailed`: in
    place with the plan ``undo`` makes, every command of it tried (the trees, their counters
    and their classification kept), where the kernel is then the old policy again; else with
    the plan ``restore`` makes (the old policy built again), restored only if every command
    of it ran and ``rebuilt`` (the kernel is the old policy: read back) says so. Both plans
    are made only then, as they compile the old policy. SIGINT, SIGTERM and SIGHUP stop the plan at
    the end of the step under way, and the change is taken back the same way."""
    with deferred_signals() as caught:
        if caught:
            name = _name(caught)
            early = Failure(name, f"{name} came before the kernel changed", None)
            raise ApplyFailed(early, True, signal=caught[0], untouched=True)
        failure = run_plan(plan, runner, caught)
        if failure is not None:
            _take_back(failure, restore, runner, undo, rebuilt, caught[0] if caught else None)


def _tried_whole(step: Step) -> Step:
    """``step`` with every command tried, whichever fail."""
    return replace(step, force=True) if step.tool == "tc" else replace(step, fatal=False)


def _take_back(
    failure: Failure,
    restore: Callable[[], Plan],
    runner: Runner,
    undo: Undo | None,
    rebuilt: Callable[[], bool] | None,
    stopped_by: int | None,
) -> NoReturn:
    """The kernel taken back after ``failure`` (see :func:`apply_policy`): raise ApplyFailed."""
    again = run_command if runner is run_command else runner
    try:
        made = undo() if undo is not None else None
        if made is not None:
            inverse, settled = made
            undone = run_plan(
                replace(inverse, steps=[replace(s, force=True) for s in inverse.steps]),
                again,
            )
            # (a teardown of it that left a qdisc stops it there: not undone, whatever the
            # policy's slots then show; found by a review)
            if undone is None and settled():
                # an undo that builds a tree (or a subtree) again resets its counters (found
                # by a tester: the message said they were kept)
                kept = not inverse.builds_again
                raise ApplyFailed(failure, True, in_place=kept, signal=stopped_by)
        back = restore()
    except OpsError:  # the live policy's saved text no longer compiles: nothing to build
        raise ApplyFailed(failure, False, signal=stopped_by) from None
    restored = run_plan(back, again) is None
    if rebuilt is not None:
        if not restored:
            # once more, every command tried, whichever fail (found by a tester: the rebuild
            # stopped at its first failure, and most of the old tree was left missing)
            run_plan(replace(back, steps=[_tried_whole(s) for s in back.steps]), again)
        try:  # whether the old policy is whole again, read back
            restored = rebuilt()
        except (OpsError, OSError, subprocess.SubprocessError):
            restored = False  # not known to be restored: not said to be
    raise ApplyFailed(failure, restored, signal=stopped_by)
