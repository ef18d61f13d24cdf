"""Subscriber-table benchmark: ``tcdsl compile`` of a policy whose classes come from a
LibreQoS-style ShapedDevices.csv of N subscribers, each with a leaf qdisc.

Usage::

    python bench/table_bench.py                 # 50,000 subscribers (issue 13's figure)
    python bench/table_bench.py 1000 10000 50000
    python bench/table_bench.py --profile 50000 # cProfile of tcdsl.cli.main, top functions
    python bench/table_bench.py --stages 50000  # seconds per stage, in process

Each N is compiled by a fresh ``tcdsl compile`` process (the console script, as a user runs
it), timed from outside: wall time, CPU time (user + system) and max RSS of the child
(``resource.getrusage(RUSAGE_CHILDREN)``, read in a fresh helper process per run so the figures
are that compile's alone). Issue 13's target: 50,000 subscribers in < 3 s and < 300 MB.

The table: sites of 1,000 circuits (a statement each, with a pref of its own: no longer needed
to keep the order past 2,048 u32 filters at one pref, which tcdsl now does itself, but kept so
that the figures compare with earlier ones); one circuit in ten has two devices; every device
has an IPv4 /32 and an IPv6 /56; rates from six plans.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import json
import os
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import process  # the sibling module (its folder is on sys.path)

TARGETS = {50_000: (3.0, 300.0)}  # subscribers: (seconds, MB), issue 13
SITE = 1000
PLANS = ((25, 5), (50, 10), (100, 20), (250, 25), (500, 50), (1000, 100))
"""(download, upload) Max Mbps; the Min is a tenth."""
HEADER = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment"
)
STREETS = ("Oak St.", "Main St.", "Elm Ave.", "Circle Dr.", "Marconi Street", "Newport Ave.")


def table(n: int, site: int = SITE, seed: int = 13, multi: int = 10) -> str:
    """A ShapedDevices.csv of ``n`` circuits in sites of ``site``; every ``multi``-th circuit
    has two devices."""
    rng = random.Random(seed)
    out = io.StringIO()
    out.write(HEADER + "\n")
    writer = csv.writer(out, lineterminator="\n")
    device = 0
    for i in range(n):
        down, up = PLANS[rng.randrange(len(PLANS))]
        name = f"{rng.randrange(1, 9999)} {STREETS[i % len(STREETS)]}, Springfield"
        for d in range(2 if i % multi == multi - 1 else 1):
            device += 1
            v4 = f"100.{64 + (device >> 16)}.{device >> 8 & 255}.{device & 255}"
            v6 = f"2001:db8:{device >> 8:x}:{(device & 255) << 8:x}::/56"
            mac = ":".join(
                f"{b:02x}"
                for b in (
                    2,
                    0,
                    device >> 24 & 255,
                    device >> 16 & 255,
                    device >> 8 & 255,
                    device & 255,
                )
            )
            writer.writerow(
                [
                    f"{100000 + i}",
                    name,
                    f"{device}",
                    f"cpe-{device}" if d == 0 else f"router-{device}",
                    f"site{i // site}",
                    mac,
                    v4,
                    v6,
                    f"{down / 10:g}",
                    f"{up / 10:g}",
                    f"{down}",
                    f"{up}",
                    "",
                ]
            )
    return out.getvalue()


def policy(n: int, csv_name: str, site: int = SITE, leaf: str = "fq_codel") -> str:
    """An ``upload`` tree with a class per site, each taking its site's rows."""
    sites = (n + site - 1) // site
    lines = [
        f"# {n} subscribers from {csv_name}, in {sites} sites",
        "interface wan0 {",
        f"    upload htb rate {sites * 10 + 1}gbit default unknown {{",
    ]
    for s in range(sites):
        lines += [
            f"        class site{s} rate 10gbit {{",
            f'            subscribers from "{csv_name}" where parent_node == "site{s}" '
            f"pref {s + 1} {{",
            f"                {leaf}",
            "            }",
            "        }",
        ]
    lines += ["        class unknown rate 10mbit", "    }", "}"]
    return "\n".join(lines) + "\n"


def write(n: int, folder: Path, leaf: str = "fq_codel") -> Path:
    """Write the table and the policy of ``n`` subscribers into ``folder``."""
    (folder / "subscribers.csv").write_text(table(n), encoding="utf-8")
    path = folder / "subscribers.tcp"
    path.write_text(policy(n, "subscribers.csv", leaf=leaf), encoding="utf-8")
    return path


def _child(path: str) -> None:
    """Run one compile as a child and print its figures (this process has no other child)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [process.TCDSL, "compile", path, "-o", os.devnull],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "rc": proc.returncode,
                "stderr": proc.stderr[-2000:],
                "wall_s": wall,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "max_rss_mb": usage.ru_maxrss / 1024,
            }
        )
    )


def measure(n: int, repeats: int = 3) -> dict[str, object]:
    """Compile ``n`` subscribers ``repeats`` times; the best wall time and its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write(n, Path(tmp))
        size = (Path(tmp) / "subscribers.csv").stat().st_size
        runs = []
        for _ in range(repeats):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            run = json.loads(proc.stdout)
            if run["rc"] != 0:
                sys.exit(f"compile of {n} subscribers failed ({run['rc']}):\n{run['stderr']}")
            runs.append(run)
    best = min(runs, key=lambda r: r["wall_s"])
    return {"n": n, "csv_bytes": size, **best, "all_wall_s": [r["wall_s"] for r in runs]}


def profile(n: int, top: int = 25) -> None:
    """cProfile ``tcdsl.cli.main`` (not ``entry``, which exits at once) on ``n`` subscribers."""
    from tcdsl.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        path = write(n, Path(tmp))
        sys.argv = ["tcdsl", "compile", str(path), "-o", os.devnull]
        prof = cProfile.Profile()
        prof.enable()
        try:
            main()
        except SystemExit as done:
            if done.code:
                sys.exit(f"compile of {n} subscribers failed ({done.code})")
        finally:
            prof.disable()
    stats = pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative")
    stats.print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def stages(n: int) -> dict[str, float]:
    """CPU seconds per stage of one in-process compile of ``n`` subscribers (the driver's
    stages, run one by one, the cyclic collector off as the driver has it)."""
    import gc

    from tcdsl.backends import BACKENDS

    from tcdsl import ir
    from tcdsl.allocate import allocate
    from tcdsl.checks import run_checks
    from tcdsl.frontend.reader import Reader
    from tcdsl.lint import run_lints
    from tcdsl.resolve import resolve

    with tempfile.TemporaryDirectory() as tmp:
        path = str(write(n, Path(tmp)))
        gc.disable()
        times: dict[str, float] = {}
        start = time.process_time()

        def lap(name: str) -> None:
            nonlocal start
            now = time.process_time()
            times[name] = now - start
            start = now

        reader = Reader()
        interfaces = reader.read(path)
        lap("frontend (table read and expanded)")
        policy, _ = resolve(ir.Policy(path, tuple(interfaces)))
        lap("resolve")
        list(run_checks(policy))
        lap("checks")
        policy, _ = allocate(policy)
        lap("allocate")
        list(run_lints(policy))
        lap("lints")
        BACKENDS["shell"](None).emit_files(policy, path, "subscribers")
        lap("emit (shell)")
        gc.enable()
    return times


def main() -> None:
    """Print the figures for each N asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[50_000])
    parser.add_argument("--profile", action="store_true", help="cProfile the largest size too")
    parser.add_argument("--stages", action="store_true", help="time each stage of the largest")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    process.cached()  # tcdsl is timed as a process
    if args.child:
        _child(args.child)
        return
    print(f"{'subscribers':>11} {'csv MB':>7} {'wall s':>7} {'cpu s':>6} {'RSS MB':>7}  target")
    for n in args.sizes:
        row = measure(n)
        target = TARGETS.get(n)
        verdict = ""
        if target is not None:
            ok = row["wall_s"] < target[0] and row["max_rss_mb"] < target[1]  # type: ignore[operator]
            verdict = f"< {target[0]:g} s, < {target[1]:g} MB: {'met' if ok else 'NOT met'}"
        print(
            f"{n:>11,} {row['csv_bytes'] / 2**20:>7.1f} {row['wall_s']:>7.2f} "  # type: ignore[operator]
            f"{row['cpu_s']:>6.2f} {row['max_rss_mb']:>7.0f}  {verdict}"
        )
    if args.stages:
        print(f"\nstages, {max(args.sizes):,} subscribers, in process (CPU seconds):")
        for name, seconds in stages(max(args.sizes)).items():
            print(f"  {name:<36} {seconds:6.2f} s")
    if args.profile:
        profile(max(args.sizes))


if __name__ == "__main__":
    main()
