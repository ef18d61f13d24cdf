"""Per-packet cost of classification: a packet matching the last of N address rules, linear
u32 chains against hashed u32 tables (docs/scale.md, "Classification order and hashed u32
filters").

Usage (as root; each case in a fresh network namespace)::

    python bench/hash_bench.py                 # 10 and 10,000 rules, the issue's figure
    python bench/hash_bench.py --threshold     # 8/16/32/64 rules, linear vs hashed

Each case: an htb on one end of a veth with one class per rule (``match dst 10.0.X.Y``, a
/8 last), applied with ``tc -batch``; a Python sender in the namespace writes PACKETS frames
to the address of the last /32 rule on an AF_PACKET socket (the qdisc, so u32, runs in the
``send`` system call) and reports its CPU time (user + system) per packet; the expected
class's counter must have moved by every packet. Best of ``--repeat`` runs, interleaved.
Cases: tcdsl's output (hashed above ``u32layout.HASH_MIN``), tcdsl forced linear
(``HASH_MIN = 0``), and a hand-written batch of the same two-level hash tables (the
baseline, raw tc). Goal: last of 10,000 hashed within 1.5x of last of 10.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from tcdsl import u32layout
from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy

DEV = "b0"
PACKETS = 100_000
SENDER = """
import socket, sys, time
frame = bytes.fromhex(sys.argv[2])
count = int(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
s.bind((sys.argv[1], 0))
send = s.send
t0 = time.process_time()
for _ in range(count):
    send(frame)
print((time.process_time() - t0) / count)
"""


def address(i: int) -> str:
    """The address of rule ``i``: 10.0.0.0 on, the third byte counting 256 rules."""
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def policy(n: int) -> str:
    """``n`` classes with one /32 each, then a /8 class, the default last."""
    lines = [f"interface {DEV} htb rate 100gbit default other {{"]
    lines += [f"    class c{i} rate 8kbit ceil 100gbit match dst {address(i)}" for i in range(n)]
    lines += ["    class wide rate 8kbit match dst 10.0.0.0/8", "    class other rate 8kbit", "}"]
    return "\n".join(lines) + "\n"


def tcdsl_batch(n: int, hash_min: int | None) -> tuple[str, str]:
    """tcdsl's batch for ``policy(n)`` (``hash_min`` None: its own threshold), and the class
    id of the last /32 rule."""
    saved = u32layout.HASH_MIN
    if hash_min is not None:
        u32layout.HASH_MIN = hash_min
    try:
        text = policy(n)
        result = compile_policy("hash.tcp", "tc-batch", loader=lambda _p: text)
    finally:
        u32layout.HASH_MIN = saved
    assert result.output is not None and result.policy is not None, render(
        result.diagnostics, result.sources
    )
    iface = result.policy.interfaces[0]
    last = [f for f in iface.filters if f.span.line == n + 1]
    return result.output, str(last[0].flowid)


def raw_batch(n: int) -> tuple[str, str]:
    """The same state written by hand: classes 1:(i+1), a table of 256 buckets on the last
    address byte, in each a table of 256 on the third, the /8 after the link."""
    out = [f"qdisc add dev {DEV} root handle 1: htb default {n + 2:x}"]
    out.append(f"class add dev {DEV} parent 1: classid 1:ffff htb rate 100gbit")
    for i in range(n + 2):
        rate = "htb rate 8kbit ceil 100gbit"
        out.append(f"class add dev {DEV} parent 1:ffff classid 1:{i + 1:x} {rate}")
    head = f"filter add dev {DEV} parent 1: protocol ip prio 1"
    out.append(f"{head} handle 1: u32 divisor 256")
    inner = sorted({i & 255 for i in range(n)})
    for low in inner:
        out.append(f"{head} handle {low + 2:x}: u32 divisor 256")
    nodes: dict[tuple[int, int], int] = {}
    for i in range(n):
        third, low = i >> 8 & 255, i & 255
        node = nodes[(low, third)] = nodes.get((low, third), 0) + 1
        out.append(
            f"{head} handle {low + 2:x}:{third:x}:{node:x} u32 ht {low + 2:x}:{third:x}: "
            f"match ip dst {address(i)}/32 flowid 1:{i + 1:x}"
        )
    for low in inner:
        out.append(
            f"{head} handle 1:{low:x}:1 u32 ht 1:{low:x}: link {low + 2:x}: "
            "hashkey mask 0x0000ff00 at 16 match u32 0 0 at 0"
        )
    out.append(f"{head} handle ::1 u32 link 1: hashkey mask 0x000000ff at 16 match u32 0 0 at 0")
    out.append(f"{head} handle ::2 u32 match ip dst 10.0.0.0/8 flowid 1:{n + 1:x}")
    return "\n".join(out) + "\n", f"1:{n:x}"


def run(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:6])}...: {done.stderr.strip()}")
    return done.stdout


def sent(ns: str, classid: str) -> int:
    out = run("tc", "-n", ns, "-s", "class", "show", "dev", DEV, "classid", classid)
    words = out.split()
    return int(words[words.index("Sent") + 3])


def measure(batch: str, classid: str, n: int, packets: int) -> float:
    """CPU seconds per packet sending to the last /32 rule with ``batch`` applied."""
    ns = f"tcdsl-hash-{os.getpid()}"
    run("ip", "netns", "add", ns)
    try:
        run("ip", "-n", ns, "link", "add", DEV, "type", "veth", "peer", "name", "b1")
        for dev in (DEV, "b1"):
            run("ip", "-n", ns, "link", "set", dev, "up")
        with tempfile.NamedTemporaryFile("w", suffix=".tc") as f:
            f.write(batch)
            f.flush()
            run("tc", "-n", ns, "-batch", f.name)
        dst = bytes(int(b) for b in address(n - 1).split("."))
        ip = bytes.fromhex("450000280000000040110000c0000201") + dst + bytes(20)
        frame = bytes.fromhex("020000000002020000000001") + b"\x08\x00" + ip
        before = sent(ns, classid)
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, DEV, frame.hex()]
        cost = float(run(*cmd, str(packets)))
        moved = sent(ns, classid) - before
        if moved != packets:
            raise SystemExit(f"class {classid} got {moved} of {packets} packets")
        return cost
    finally:
        run("ip", "netns", "del", ns)


def best(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """The least cost of each case over ``repeat`` interleaved rounds."""
    found: dict[str, float] = {}
    for _ in range(repeat):
        for name, case in cases.items():
            cost = case()
            found[name] = min(found.get(name, cost), cost)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threshold", action="store_true", help="8-64 rules instead")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--packets", type=int, default=PACKETS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (network namespaces)")
    packets = args.packets
    cases: dict[str, Callable[[], float]] = {}

    def case(name: str, n: int, make: Callable[[], tuple[str, str]]) -> None:
        batch, classid = make()
        cases[name] = lambda: measure(batch, classid, n, packets)

    if args.threshold:
        for n in (8, 16, 32, 64):
            case(f"{n} linear", n, lambda n=n: tcdsl_batch(n, 0))  # type: ignore[misc]
            case(f"{n} hashed", n, lambda n=n: tcdsl_batch(n, 4))  # type: ignore[misc]
    case("10 tcdsl", 10, lambda: tcdsl_batch(10, None))
    if not args.threshold:
        case("10000 tcdsl", 10000, lambda: tcdsl_batch(10000, None))
        case("10000 linear", 10000, lambda: tcdsl_batch(10000, 0))
        case("10000 raw tc", 10000, lambda: raw_batch(10000))
    found = best(cases, args.repeat)
    base = found["10 tcdsl"]
    print(f"per packet, last rule matching, best of {args.repeat} x {packets} packets:")
    for name, cost in found.items():
        print(f"  {name:>14}: {cost * 1e6:8.2f} us  {cost / base:6.2f}x the 10-rule case")
    if args.threshold:
        return
    ratio = found["10000 tcdsl"] / base
    print(f"goal: last of 10,000 within 1.5x of last of 10: {ratio:.2f}x", end=" ")
    print("(met)" if ratio <= 1.5 else "(NOT met)")


if __name__ == "__main__":
    main()
