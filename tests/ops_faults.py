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
from collections.abc import Sequence
from pathlib import Path

from tcdsl import ir
from tcdsl.ops.apply import run_command
from tcdsl.ops.lifecycle import apply, prepare, rollback
from tcdsl.ops.state import STATE_DIR_VARIABLE, Store
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tests.ops_edits import DEV, _policy, devices, down, edit, live, random_policy


class Killed(BaseException):
    """The apply process dies here."""


def killer(k: int):  # type: ignore[no-untyped-def]
    """A runner that runs ``k`` tc commands in all, then dies."""
    left = [k]

    def run(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["tc", "-batch"] and stdin is not None:
            lines = stdin.splitlines(keepends=True)
            if len(lines) > left[0]:
                if left[0]:
                    run_command(argv, "".join(lines[: left[0]]))
                raise Killed
            left[0] -= len(lines)
        elif argv[0] == "tc":
            if left[0] == 0:
                raise Killed
            left[0] -= 1
        return run_command(argv, stdin)

    return run


def _dies(*args: object) -> None:
    raise Killed


def _differs(policy: ir.Policy) -> list[str]:
    return [d.message for d in compare_state(expected_policy(policy), live(devices(policy)))]


def main(argv: list[str]) -> int:
    seed, pairs, state = int(argv[0]), int(argv[1]), Path(argv[2])
    os.environ[STATE_DIR_VARIABLE] = str(state)  # the kernel probe's cache too
    rng = random.Random(seed)
    serial = [0]
    problems: list[str] = []
    kills = 0
    for pair in range(pairs):
        a = random_policy(rng, serial)
        b = a
        for _ in range(3):
            b, _, _ = edit(rng, b, serial)
        k = 0
        while True:
            store = Store(f"f{pair}-{k}", state)
            path = state / f"f{pair}-{k}.tcp"
            for gone in (
                ["qdisc", "del", "dev", DEV, "root"],
                ["qdisc", "del", "dev", DEV, "ingress"],
            ):
                subprocess.run(["tc", *gone], capture_output=True, check=False)
            ra = _policy(path, a.text(), store)
            apply(prepare(store, ra.policy, ra), str(path), ra.sources)
            rb = _policy(path, b.text(), store)
            prepared = prepare(store, rb.policy, rb)
            total = sum(len(s.commands) for s in prepared.plan.steps if s.tool == "tc")
            if k > total:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
