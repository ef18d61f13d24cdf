"""Apply-time benchmark: the tc-batch output against a hand-written batch and the shell script.

Usage (as root; each run uses a fresh network namespace)::

    python bench/apply_bench.py 1000 10000
    python bench/apply_bench.py --no-shell-above 2000 1000 10000   # skip slow shell runs

For each N, the policy of ``bench/compile_bench.py`` (N leaf classes with a filter each, in
groups under parent classes) is compiled to a tc batch and to a shell script, then applied to a
veth device in a fresh namespace: (a) the generated batch, with ``tc -batch``; (b) a
hand-written batch of the same commands, as a person would write it (no comments, no
teardown); (c) the shell script's ``--per-command`` form, one tc process per command (the
default script feeds the batch to one ``tc -batch``, as (a) does). Reported: wall seconds (best of
``--repeat``, interleaved, for (a) and (b); the shell script runs once), and the ratios a/b and c/a.
Goals: a/b <= 1.1; c/a >= 40 at N = 1,000.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compile_bench import policy  # the sibling script (its folder is on sys.path)

from tcdsl.backend import BackendOptions
from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy

PATH = "bench.tcp"


def _compile(n: int, backend: str) -> str:
    text = policy(n)
    options = BackendOptions(batch=False)  # the shell script's per-command form
    result = compile_policy(PATH, backend, options=options, loader=lambda _: text)
    if result.output is None:
        sys.exit(render(result.diagnostics, result.sources))
    return result.output


def _run(ns: str, args: list[str]) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *args], check=True, capture_output=True)


def _timed(args: list[str]) -> float:
    """Seconds to run ``args`` in a fresh namespace holding eth0 (a veth)."""
    ns = f"tcdsl-bench-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        _run(ns, ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "tv0p"])
        _run(ns, ["ip", "link", "set", "eth0", "up"])
        start = time.perf_counter()
        done = subprocess.run(["ip", "netns", "exec", ns, *args], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"{' '.join(args)} failed: {done.stderr.strip()[-500:]}")
        return seconds
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def hand_written(batch: str) -> str:
    """The batch as a person would write it: the commands only (no comments, no teardown)."""
    lines = [x for x in batch.splitlines() if x and not x.startswith("#")]
    return "".join(f"{x}\n" for x in lines if not x.startswith(("qdisc replace", "qdisc del")))


def main() -> None:
    """Time the three ways to apply for each N and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="+", type=int, metavar="N")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each batch (best kept)")
    parser.add_argument("--no-shell-above", type=int, default=None, metavar="N")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("apply_bench needs root (network namespaces)")
    print(
        f"{'N':>7} {'commands':>9} {'batch s':>9} {'hand s':>9} {'shell s':>9} "
        f"{'batch/hand':>11} {'shell/batch':>12}"
    )
    with tempfile.TemporaryDirectory(prefix="tcdsl-bench-") as tmp:
        for n in args.sizes:
            batch, script = _compile(n, "tc-batch"), _compile(n, "shell")
            files = {"gen.batch": batch, "hand.batch": hand_written(batch), "apply.sh": script}
            for name, text in files.items():
                (Path(tmp) / name).write_text(text, encoding="utf-8")
            # Interleaved, best of each: other load on the machine hits both alike.
            gen = hand = float("inf")
            for _ in range(args.repeat):
                gen = min(gen, _timed(["tc", "-batch", f"{tmp}/gen.batch"]))
                hand = min(hand, _timed(["tc", "-batch", f"{tmp}/hand.batch"]))
            commands = len(files["hand.batch"].splitlines())
            if args.no_shell_above is not None and n > args.no_shell_above:
                shell_text, ratio = "-", "-"
            else:
                shell = _timed(["sh", f"{tmp}/apply.sh"])
                shell_text, ratio = f"{shell:.2f}", f"{shell / gen:.1f}x"
            print(
                f"{n:>7} {commands:>9} {gen:>9.3f} {hand:>9.3f} {shell_text:>9} "
                f"{gen / hand:>10.2f}x {ratio:>12}",
                flush=True,
            )


if __name__ == "__main__":
    main()
