"""Running a plan on the live kernel, safely: check first, change, and on a failure restore
the policy that was live (or, on a first apply, remove what was added) and name the command
that failed at its policy line.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tcdsl.commands import Command, batch_quote
from tcdsl.ops.plan import Plan, Step

Runner = Callable[[Sequence[str], str | None], subprocess.CompletedProcess[str]]
"""Runs a command (argv, stdin text) and returns how it went; tests wrap it to fail on cue."""


def run_command(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real runner."""
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=600
    )


_FAILED = re.compile(r"Command failed -:(\d+)")


@dataclass(frozen=True, slots=True)
class Failure:
    """A command that failed: the command, what the tool said, the policy's command it is
    (None: a cleanup no policy line asks for)."""

    command: str
    message: str
    origin: Command | None


class ApplyFailed(Exception):
    """A plan stopped at a failing command (the kernel has been restored)."""

    def __init__(self, failure: Failure, restored: bool) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.restored = restored


def run_step(step: Step, runner: Runner = run_command) -> Failure | None:
    """Run one step; the failure of a fatal one, else None."""
    if not step.commands:
        return None
    if step.tool == "tc":
        text = "".join(" ".join(batch_quote(w) for w in c) + "\n" for c in step.commands)
        done = runner(["tc", "-batch", "-"], text)
        if done.returncode == 0 or not step.fatal:
            return None
        found = _FAILED.search(done.stderr)
        n = int(found.group(1)) - 1 if found else len(step.commands) - 1
        n = min(max(n, 0), len(step.commands) - 1)
        return Failure("tc " + " ".join(step.commands[n]), done.stderr.strip(), step.origins[n])
    for command, origin in zip(step.commands, step.origins, strict=True):
        done = runner([step.tool, *command], step.stdin)
        if done.returncode != 0 and step.fatal:
            return Failure(f"{step.tool} " + " ".join(command), done.stderr.strip(), origin)
    return None


def run_plan(plan: Plan, runner: Runner = run_command) -> Failure | None:
    """Run every step in order; the first failure (the rest is not run)."""
    for step in plan.steps:
        failure = run_step(step, runner)
        if failure is not None:
            return failure
    return None


def apply_policy(plan: Plan, restore: Callable[[], Plan], runner: Runner = run_command) -> None:
    """Run ``plan``; on a failure, run the plan ``restore`` makes (the old policy built
    again) and raise :class:`ApplyFailed`."""
    failure = run_plan(plan, runner)
    if failure is None:
        return
    restored = run_plan(restore(), run_command if runner is run_command else runner) is None
    raise ApplyFailed(failure, restored)
