"""An apply killed at every command, run INSIDE a network namespace that has a veth ``d0``
(``ip netns exec NS python -m tests.ops_faults SEED PAIRS STATE_DIR``).

For each of PAIRS random (A, B) pairs (``tests/ops_edits.py``'s policies, B a few edits of A),
and each k from 0 to the number of tc commands of the plan A -> B: A is applied, then B with a
runner that runs the first k commands (a ``tc -batch`` cut short inside when k falls there)
and then dies, as a kill would (the state is left as the killed process left it); for k equal
to the number, every command runs and the process dies before it writes the state. Then, as the
next command would: ``plan`` says the apply did not finish; for even k ``apply B`` must reach
B, for odd k ``rollback`` must reach A (the kernel equal to that policy as verify reads it, and
``plan`` with no changes).

Prints one JSON object: {"kills": N, "problems": [...]}.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tcdsl import ir
from tcdsl.ops.apply import ApplyFailed, run_command
from tcdsl.ops.lifecycle import apply, prepare, rollback
from tcdsl.ops.state import STATE_DIR_VARIABLE, Store
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tests.ops_edits import DEV, Pol, _policy, devices, down, edit, live, random_policy


class Killed(BaseException):
    """The apply process dies here."""


def killer(k: int):  # type: ignore[no-untyped-def]
    """A runner that runs ``k`` tc commands in all, then dies."""
    left = [k]

    def run(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        if argv[0] == "tc" and "-batch" in argv[:3] and stdin is not None:
            lines = stdin.splitlines(keepends=True)
            if len(lines) > left[0]:
                if left[0]:
                    run_command(argv, "".join(lines[: left[0]]))
                raise Killed
            left[0] -= len(lines)
        elif argv[0] == "tc" and "show" not in argv:  # (reading the kernel back is no change)
            if left[0] == 0:
                raise Killed
            left[0] -= 1
        return run_command(argv, stdin)

    return run


def failer(k: int):  # type: ignore[no-untyped-def]
    """A runner that runs ``k`` tc commands in all, then makes the next one fail (as the
    kernel refusing it would), once: the restore after it runs for real."""
    left = [k]

    def failed(argv: Sequence[str], line: int) -> subprocess.CompletedProcess[str]:
        left[0] = -1
        said = f"RTNETLINK answers: Invalid argument (injected)\nCommand failed -:{line}\n"
        return subprocess.CompletedProcess(list(argv), 1, "", said)

    def run(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        if left[0] < 0:
            return run_command(argv, stdin)
        if argv[0] == "tc" and "-batch" in argv[:3] and stdin is not None:
            lines = stdin.splitlines(keepends=True)
            if len(lines) > left[0]:
                at = left[0]
                if at:
                    run_command(argv, "".join(lines[:at]))
                if argv[1] == "-force" and lines[at + 1 :]:  # a forced batch goes on
                    run_command(argv, "".join(lines[at + 1 :]))
                return failed(argv, at + 1)
            left[0] -= len(lines)
        elif argv[0] == "tc" and "show" not in argv:  # (reading the kernel back is no change)
            if left[0] == 0:
                return failed(argv, 1)
            left[0] -= 1
        return run_command(argv, stdin)

    return run


def _dies(*args: object) -> None:
    raise Killed


def _differs(policy: ir.Policy) -> list[str]:
    return [d.message for d in compare_state(expected_policy(policy), live(devices(policy)))]


def _pairs(seed: int, pairs: int) -> Iterator[tuple[int, Pol, Pol]]:
    """``pairs`` random (A, B) policies, B three edits of A."""
    rng = random.Random(seed)
    serial = [0]
    for pair in range(pairs):
        a = random_policy(rng, serial)
        b = a
        for _ in range(3):
            b, _, _ = edit(rng, b, serial)
        yield pair, a, b


def _from_a_to_b(state: Path, name: str, a: Pol, b: Pol) -> tuple[Store, Path, Any, Any, Any]:
    """A applied under ``name`` on a device cleared first; B compiled and planned from it:
    (store, path, A's result, B's result, B prepared)."""
    store = Store(name, state)
    path = state / f"{name}.tcp"
    for gone in (["qdisc", "del", "dev", DEV, "root"], ["qdisc", "del", "dev", DEV, "ingress"]):
        subprocess.run(["tc", *gone], capture_output=True, check=False)
    ra = _policy(path, a.text(), store)
    apply(prepare(store, ra.policy, ra), str(path), ra.sources)
    rb = _policy(path, b.text(), store)
    return store, path, ra, rb, prepare(store, rb.policy, rb)


def main(argv: list[str]) -> int:
    seed, pairs, state = int(argv[0]), int(argv[1]), Path(argv[2])
    if argv[3:] == ["fail"]:
        return _failing(seed, pairs, state)
    os.environ[STATE_DIR_VARIABLE] = str(state)  # the kernel probe's cache too
    problems: list[str] = []
    kills = 0
    for pair, a, b in _pairs(seed, pairs):
        k = 0
        while True:
            store, path, ra, rb, prepared = _from_a_to_b(state, f"f{pair}-{k}", a, b)
            total = sum(len(s.commands) for s in prepared.plan.steps if s.tool == "tc")
            if k > total:
                down(store)  # the next pair's names may not take over this one's device
                break
            where = f"pair {pair}, killed after {k} of {total} commands:\n{a.text()}->\n{b.text()}"
            if k == total:  # every command ran; killed before the state says so
                store.record = _dies  # type: ignore[method-assign]
            try:
                apply(prepared, str(path), rb.sources, runner=killer(k))
            except Killed:
                kills += 1
            else:
                problems.append(f"{where}the apply was not killed")
            finally:
                vars(store).pop("record", None)
            again = prepare(store, rb.policy, rb).plan
            if not any("did not finish" in c.text for c in again.drift):
                problems.append(f"{where}plan does not say the apply did not finish")
            if k % 2 == 0:
                rb = _policy(path, b.text(), store)
                apply(prepare(store, rb.policy, rb), str(path), rb.sources)
                want, name = rb.policy, "B"
            else:
                rollback(store)
                ra = _policy(path, a.text(), store)
                want, name = ra.policy, "A"
            assert want is not None
            found = _differs(want)
            if found:
                problems.append(f"{where}after the recovery the kernel is not {name}: {found}")
            result = _policy(path, (b if name == "B" else a).text(), store)
            after = prepare(store, result.policy, result).plan
            if not after.empty or after.drift:
                problems.append(f"{where}plan after the recovery: {after.render()}")
            down(store)  # the next k starts on a device with nothing of this one's
            k += 1
    print(json.dumps({"kills": kills, "problems": problems}))
    return 0


def _failing(seed: int, pairs: int, state: Path) -> int:
    """The apply of B failing at each of its tc commands in turn: the kernel must be A again
    (restored), and the next plan of A must find nothing to change and nothing changed."""
    os.environ[STATE_DIR_VARIABLE] = str(state)
    problems: list[str] = []
    failures = in_place = 0
    for pair, a, b in _pairs(seed, pairs):
        j = 0
        while True:
            store, path, ra, rb, prepared = _from_a_to_b(state, f"e{pair}-{j}", a, b)
            # the tc commands in order; a cleanup step's may fail without stopping the apply
            fatal = [s.fatal for s in prepared.plan.steps if s.tool == "tc" for _ in s.commands]
            positions = [n for n, stops in enumerate(fatal) if stops]
            if j >= len(positions):
                down(store)  # the next pair's names may not take over this one's device
                break
            k = positions[j]
            where = (
                f"pair {pair}, command {k + 1} of {len(fatal)} failed:\n{a.text()}->\n{b.text()}"
            )
            try:
                apply(prepared, str(path), rb.sources, runner=failer(k))
            except ApplyFailed as e:
                failures += 1
                in_place += e.in_place
                if not e.restored:
                    problems.append(f"{where}not restored")
            else:
                problems.append(f"{where}the apply did not fail")
            assert ra.policy is not None
            found = _differs(ra.policy)
            if found:
                problems.append(f"{where}after the restore the kernel is not A: {found}")
            again = _policy(path, a.text(), store)
            after = prepare(store, again.policy, again).plan
            if not after.empty or after.drift or after.notes:
                problems.append(f"{where}plan after the restore: {after.render()}")
            down(store)
            j += 1
    print(json.dumps({"failures": failures, "in_place": in_place, "problems": problems}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
