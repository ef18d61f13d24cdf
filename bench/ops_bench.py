"""Live-operations benchmark: ``tcdsl apply`` on N-class policies, against raw ``tc -batch``.

Usage (as root; a fresh network namespace per N)::

    python bench/ops_bench.py 1000 10000

For each N (the policy of ``bench/compile_bench.py``, its interface renamed to eth0 on a veth):
(a) the first ``tcdsl apply --yes`` (a process: compile, plan, apply, state), against (b) raw
``tc -batch`` of a hand-written batch of the same commands in another fresh namespace; then (c)
one class's rate changed: ``tcdsl apply --yes`` again end to end (compile with the live ids,
compile the live policy again, read the kernel back for drift, plan, one ``class change``),
with the counters of another class checked not to reset, and (d) ``tcdsl plan`` with no
change. Goals (issue 12): (c) < 1 s at N = 10,000; (a)/(b) <= 1.1.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from apply_bench import hand_written  # the sibling scripts (their folder is on sys.path)
from compile_bench import policy

from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy

TCDSL = str(Path(sys.executable).parent / "tcdsl")


def _ns(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True)
    for args in (
        ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "tv0p"],
        ["ip", "link", "set", "eth0", "up"],
    ):
        subprocess.run(["ip", "netns", "exec", name, *args], check=True)
    return name


def _timed(ns: str, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        ["ip", "netns", "exec", ns, *args], capture_output=True, text=True, env=env, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 4):
        sys.exit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return seconds, done.stdout


def _batch(text: str) -> str:
    result = compile_policy("bench.tcp", "tc-batch", loader=lambda _: text)
    if result.output is None:
        sys.exit(render(result.diagnostics, result.sources))
    return result.output


def _sent(ns: str, classid: str) -> int:
    shown = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", "eth0", "classid", classid],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = re.search(r"Sent (\d+) bytes", shown)
    return int(found.group(1)) if found else -1


def main() -> None:
    """Time each step for each N and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="+", type=int, metavar="N")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("ops_bench needs root (network namespaces)")
    print(
        f"{'N':>7} {'apply s':>9} {'raw tc s':>9} {'ratio':>7} {'one change s':>13} "
        f"{'plan s':>8} {'kept':>5}"
    )
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="tcdsl-ops-bench-") as tmp:
            env = dict(os.environ, TCDSL_STATE_DIR=f"{tmp}/state")
            text = policy(n)  # a pref every 2,000 lines (E262)
            path = Path(tmp) / "bench.tcp"
            path.write_text(text, encoding="utf-8")
            (Path(tmp) / "hand.batch").write_text(hand_written(_batch(text)))
            raw_ns = _ns(f"tcdsl-ob-raw-{os.getpid()}")
            ns = _ns(f"tcdsl-ob-{os.getpid()}")
            try:
                raw, _ = _timed(raw_ns, ["tc", "-batch", f"{tmp}/hand.batch"], env)
                first, _ = _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
                # traffic in the default class, so that its counters have something to lose
                subprocess.run(
                    ["ip", "netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "1",
                     "-I", "eth0", "10.255.255.1"], capture_output=True, check=False,
                )  # fmt: skip
                watched = "1:1"
                before = _sent(ns, watched)
                leaf = re.search(r"class (\w+) rate (\d+)kbit", text)
                assert leaf is not None
                changed = text.replace(leaf.group(0), f"class {leaf.group(1)} rate 77kbit", 1)
                path.write_text(changed, encoding="utf-8")
                one, said = _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
                if "~ class" not in said or "! " in said:
                    sys.exit(f"the change was not made in place:\n{said[-2000:]}")
                kept = _sent(ns, watched) >= before
                plan, _ = _timed(ns, [TCDSL, "plan", str(path)], env)
            finally:
                for name in (raw_ns, ns):
                    subprocess.run(["ip", "netns", "del", name], check=False)
        print(
            f"{n:>7} {first:>9.2f} {raw:>9.2f} {first / raw:>6.2f}x {one:>13.2f} {plan:>8.2f} "
            f"{'yes' if kept else 'NO':>5}",
            flush=True,
        )


if __name__ == "__main__":
    main()
