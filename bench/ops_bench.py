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

Then, for issue 13, N subscribers (one ``/32`` each, as ``bench/mq_bench.py`` writes them, on
one htb: their lines go into u32 hash tables): (e) one subscriber added in the middle and
applied (node by node inside the tables, ``tcdsl/ops/u32nodes.py``), end to end, with another
subscriber's counters checked not to reset; (f) a customer with a /24 added in the middle
(it splits the hashed run: the pref's tables change, and the pref is swapped make-before-break,
``tcdsl/ops/u32swap.py``), end to end, counters checked the same way; (g) N subscribers from a
table (``bench/table_bench.py``'s, pfifo leaves, both families), one of them moved to another
site: ``tcdsl apply --yes`` end to end, the default class's counters checked not to reset; (h)
then ``tcdsl status`` of them all, and of that subscriber alone (``--class``).
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

import process  # the sibling module (its folder is on sys.path)
from apply_bench import hand_written  # the sibling scripts (their folder is on sys.path)
from compile_bench import policy
from mq_bench import address
from mq_bench import policy as subscribers
from table_bench import SITE
from table_bench import write as write_table

from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy

TCDSL = process.TCDSL


def _ns(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True)
    for args in (
        ["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "tv0p"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "link", "set", "tv0p", "up"],  # a carrier: a qdisc without one sees no packet
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


def _udp(ns: str, to: str, count: int = 3) -> None:
    """UDP packets out of eth0 to ``to``, a static neighbour (no ARP, no ping needed)."""
    subprocess.run(["ip", "-n", ns, "addr", "replace", "10.0.0.254/8", "dev", "eth0"], check=True)
    subprocess.run(
        ["ip", "-n", ns, "neigh", "replace", to, "lladdr", "02:00:00:00:00:02", "dev", "eth0"],
        check=True,
    )
    send = "import socket,sys\nfor _ in range(int(sys.argv[2])):\n"
    send += "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', (sys.argv[1], 9))"
    subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", send, to, str(count)], check=True
    )


def _subscriber_added(
    n: int, tmp: str, env: dict[str, str], wide: bool = False
) -> tuple[float, bool]:
    """(e): seconds for ``tcdsl apply`` of one subscriber added to N hashed ones, and whether
    another subscriber's counters were kept; (f) with ``wide``: a /24 customer instead."""
    text = subscribers(n, mq=False)
    path = Path(tmp) / "subscribers.tcp"
    path.write_text(text, encoding="utf-8")
    ns = _ns(f"tcdsl-os-{os.getpid()}")
    try:
        _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
        _udp(ns, address(7))
        shown = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", "eth0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        busy = re.search(r"class htb (\S+) .*\n Sent (\d+) bytes [1-9]", shown)
        assert busy is not None, "the subscriber's packets reached no class"
        before = _sent(ns, busy.group(1))
        middle = f"match dst {address(n // 2)}"
        added = "10.250.0.0/24" if wide else address(n + 1)
        new = f"class added rate 1mbit ceil 100mbit match dst {added} {{ pfifo }}\n"
        at = text.index("    class", text.index(middle))
        path.write_text(text[:at] + "    " + new + text[at:], encoding="utf-8")
        seconds, said = _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
        # a /24 splitting the hashed run changes the pref's tables: they are swapped through
        # a copy at a free pref beside it, or, with none free (the prefs of this policy follow
        # each other), deleted and built again in place, which plan says with a '!'
        rebuilt = wide and "deleted and built again with its hash tables" in said
        if "+ class added" not in said or ("! " in said and not rebuilt):
            sys.exit(f"the subscriber was not added in place:\n{said[-2000:]}")
        return seconds, _sent(ns, busy.group(1)) >= before > 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def _subscriber_moved(n: int, tmp: str, env: dict[str, str]) -> tuple[float, bool, float, float]:
    """(g): seconds for ``tcdsl apply`` of one table row moved to the next site, and whether
    the default class's counters were kept; (h): seconds for ``tcdsl status`` of the whole
    policy then, and of the moved subscriber alone (``--class``)."""
    path = write_table(n, Path(tmp), leaf="pfifo")
    path.write_text(path.read_text().replace("interface wan0", "interface eth0"))
    table = Path(tmp) / "subscribers.csv"
    rows = table.read_text(encoding="utf-8").split("\n")
    ns = _ns(f"tcdsl-om-{os.getpid()}")
    try:
        _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
        _udp(ns, "10.255.255.1")  # from no subscriber's address: the default class
        shown = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", "eth0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        busy = re.search(r"class htb (\S+) .*\n Sent (\d+) bytes [1-9]", shown)
        assert busy is not None, "the packets reached no class"
        before = _sent(ns, busy.group(1))
        circuits = [r.split(",", 1)[0] for r in rows]
        middle = next(i for i in range(n // 2, len(rows)) if circuits.count(circuits[i]) == 1)
        site = re.search(r",site(\d+),", rows[middle])
        assert site is not None
        to = (int(site.group(1)) + 1) % ((n + SITE - 1) // SITE)
        rows[middle] = rows[middle].replace(site.group(0), f",site{to},")
        table.write_text("\n".join(rows), encoding="utf-8")
        seconds, said = _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
        if " moves from " not in said or "! " in said:
            sys.exit(f"the subscriber was not moved in place:\n{said[-2000:]}")
        kept = _sent(ns, busy.group(1)) >= before > 0
        status = [TCDSL, "status", str(path), "--interval", "0.1"]
        whole, shown = _timed(ns, status, env)
        one, shown_one = _timed(ns, [*status, "--class", f"c{circuits[middle]}"], env)
        if shown.count("\n") < n or f"c{circuits[middle]} " not in shown_one:
            sys.exit(f"status did not show the subscribers:\n{shown_one[-2000:]}")
        return seconds, kept, whole, one
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> None:
    """Time each step for each N and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="+", type=int, metavar="N")
    args = parser.parse_args()
    process.cached()  # tcdsl is timed as a process
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
                _udp(ns, "10.255.255.1")
                watched = "1:1"
                before = _sent(ns, watched)
                leaf = re.search(r"class (\w+) rate (\d+)kbit", text)
                assert leaf is not None
                changed = text.replace(leaf.group(0), f"class {leaf.group(1)} rate 77kbit", 1)
                path.write_text(changed, encoding="utf-8")
                one, said = _timed(ns, [TCDSL, "apply", "--yes", str(path)], env)
                if "~ class" not in said or "! " in said:
                    sys.exit(f"the change was not made in place:\n{said[-2000:]}")
                kept = _sent(ns, watched) >= before > 0
                plan, _ = _timed(ns, [TCDSL, "plan", str(path)], env)
            finally:
                for name in (raw_ns, ns):
                    subprocess.run(["ip", "netns", "del", name], check=False)
        print(
            f"{n:>7} {first:>9.2f} {raw:>9.2f} {first / raw:>6.2f}x {one:>13.2f} {plan:>8.2f} "
            f"{'yes' if kept else 'NO':>5}",
            flush=True,
        )
    print(
        f"\n{'N':>7} {'one subscriber added s':>23} {'kept':>5} {'a /24 added s':>14} {'kept':>5}"
    )
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="tcdsl-ops-bench-") as tmp:
            env = dict(os.environ, TCDSL_STATE_DIR=f"{tmp}/state")
            added, kept = _subscriber_added(n, tmp, env)
        with tempfile.TemporaryDirectory(prefix="tcdsl-ops-bench-") as tmp:
            env = dict(os.environ, TCDSL_STATE_DIR=f"{tmp}/state")
            wide, wide_kept = _subscriber_added(n, tmp, env, wide=True)
        print(
            f"{n:>7} {added:>23.2f} {'yes' if kept else 'NO':>5} {wide:>14.2f} "
            f"{'yes' if wide_kept else 'NO':>5}",
            flush=True,
        )
    print(
        f"\n{'N':>7} {'one subscriber moved (table) s':>31} {'kept':>5} {'status s':>9} "
        f"{'status --class s':>17}"
    )
    for n in args.sizes:
        if n <= SITE:
            print(f"{n:>7} (a move needs two sites: N above {SITE:,})")
            continue
        with tempfile.TemporaryDirectory(prefix="tcdsl-ops-bench-") as tmp:
            env = dict(os.environ, TCDSL_STATE_DIR=f"{tmp}/state")
            moved, kept, whole, one = _subscriber_moved(n, tmp, env)
        print(
            f"{n:>7} {moved:>31.2f} {'yes' if kept else 'NO':>5} {whole:>9.2f} {one:>17.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
