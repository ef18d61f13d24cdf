"""Issue 13's mq figure: N subscriber classes (one /32 match and a pfifo each) applied on
``mq queues 16`` over a veth with 16 TX queues in a namespace, against raw ``tc -batch`` of
hand-written commands for the same state, and against the same classes on one htb.

    python bench/mq_bench.py [N] [ONE_HTB_N]

Prints: the compile time (of a ``.tcp`` file with a class per subscriber, and of a policy
taking the same subscribers from a LibreQoS-style table, as an ISP keeps them), the
generated batch's apply time, the raw batch's, the kernel's
floor (the same classes alone: no leaf qdisc, no filter), the same classes with their leaf
qdiscs (no filter: what any batch for the state costs the kernel), and the one-htb apply time at
ONE_HTB_N (one htb walks every class on each insert: run it smaller and read the trend).

The floor is the kernel's, and depends on the device: each new class binds a filter block,
and on a device without ``ndo_setup_tc`` (veth, ifb, dummy) that walks a list of every block
bound that way on the host (``flow_indr_dev_setup_offload``), so 50,000 classes cost a
quadratic 1.25 billion steps however they are spread over queues; a NIC whose driver has
``ndo_setup_tc`` does not. Blocks of other namespaces count too: the figure says how many
tc classes the host has elsewhere.

A host kernel without act_skbedit cannot take the steering filters' action: there they get a
class id instead (the same filters to insert), and the figure says so; the batch
without them is timed too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import process  # the sibling module (its folder is on sys.path)

QUEUES = 16
TCDSL = process.TCDSL
"""The console script beside this Python (the venv's)."""
PREF_EVERY = 2000


def address(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def policy(n: int, mq: bool) -> str:
    """N subscribers (rate 1mbit ceil 100mbit, a pfifo each) and a default class."""
    head = f"mq queues {QUEUES} " if mq else ""
    lines = [f"interface eth0 {head}htb rate 10gbit default unknown {{"]
    for i in range(1, n + 1):
        pref = f" pref {i // PREF_EVERY + 1}" if i >= PREF_EVERY else ""
        lines.append(f"    class s{i} rate 1mbit ceil 100mbit match dst {address(i)}{pref} {{")
        lines.append("        pfifo limit 100")
        lines.append("    }")
    lines.append("    class unknown rate 1mbit ceil 10gbit")
    lines.append("}")
    return "\n".join(lines) + "\n"


TABLE_HEADER = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment"
)


def table(n: int) -> str:
    """The same N subscribers as a ShapedDevices.csv: a device each, rate 1 and ceil 100 Mbps."""
    rows = [TABLE_HEADER]
    rows += [f"{i},s{i},{i},cpe{i},site,,{address(i)},,1,1,100,100," for i in range(1, n + 1)]
    return "\n".join(rows) + "\n"


def table_policy(csv_name: str) -> str:
    """The mq tree of ``policy`` with its classes from ``csv_name``."""
    return (
        f"interface eth0 mq queues {QUEUES} htb rate 10gbit default unknown {{\n"
        f'    subscribers download from "{csv_name}" {{\n'
        "        pfifo limit 100\n"
        "    }\n"
        "    class unknown rate 1mbit ceil 10gbit\n"
        "}\n"
    )


def raw_batch(n: int) -> str:
    """What a person would write for the same state: mq, 16 htbs, the classes round-robin."""
    out = ["qdisc add dev eth0 root handle 1: mq"]
    for q in range(1, QUEUES + 1):
        major = q + 1
        out.append(f"qdisc add dev eth0 parent 1:{q:x} handle {major:x}: htb default 2")
        out.append(f"class add dev eth0 parent {major:x}: classid {major:x}:1 htb rate 10gbit")
        out.append(
            f"class add dev eth0 parent {major:x}:1 classid {major:x}:2 htb rate 1mbit ceil 10gbit"
        )
    count = [0] * QUEUES
    for i in range(1, n + 1):
        q = (i - 1) % QUEUES
        major = q + 2
        minor = count[q] + 3
        pref = count[q] // PREF_EVERY + 1
        count[q] += 1
        cid = f"{major:x}:{minor:x}"
        out.append(
            f"class add dev eth0 parent {major:x}:1 classid {cid} htb rate 1mbit ceil 100mbit"
        )
        # an explicit handle: the kernel has only 32,768 automatic ones (0x8000: up), and
        # past them each add scans them all (qdisc_alloc_handle)
        out.append(f"qdisc add dev eth0 parent {cid} handle {0x100 + i:x}: pfifo limit 100")
        out.append(
            f"filter add dev eth0 parent {major:x}: protocol ip prio {pref} u32 "
            f"match ip dst {address(i)}/32 flowid {cid}"
        )
    return "\n".join(out) + "\n"


def steering_stand_in(batch: str) -> str:
    """``batch`` with each steering filter's skbedit action replaced by a class id (u32 on
    clsact takes one, and does nothing with it): the same filters to insert, for a kernel
    without act_skbedit."""
    return re.sub(
        r"action skbedit queue_mapping (\d+)",
        lambda m: f"flowid 1:{int(m.group(1)) + 1:x}",
        "".join(line + "\n" for line in batch.splitlines() if not line.startswith("#")),
    )


def without_steering(batch: str) -> str:
    return "".join(
        line + "\n"
        for line in batch.splitlines()
        if "clsact" not in line and " egress " not in line and not line.startswith("#")
    )


def applied(batch: str, work: Path, name: str) -> float:
    """Seconds for ``tc -batch`` of ``batch`` on a fresh veth with 16 TX queues."""
    path = work / f"{name}.batch"
    path.write_text(batch)
    script = (
        f"ip link add name eth0 numtxqueues {QUEUES} type veth peer name peer0 "
        f"numtxqueues {QUEUES} && ip link set dev eth0 up && "
        f"s=$(date +%s.%N) && tc -force -batch {path} >/dev/null && e=$(date +%s.%N) && "
        'echo "$s $e"'
    )
    done = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: tc -batch failed: {done.stderr[-500:]}")
    start, end = map(float, done.stdout.split())
    return end - start


def classes_only(batch: str) -> str:
    """The qdiscs and classes of ``batch`` that hold classes, without leaf qdiscs or filters:
    what the kernel must do in any case."""
    keep = []
    for line in batch.splitlines():
        if line.startswith("class add") or (line.startswith("qdisc add") and " pfifo" not in line):
            keep.append(line)
    return "".join(f"{line}\n" for line in keep)


def classes_and_leaves(batch: str) -> str:
    """``classes_only`` with each class's leaf qdisc: the state without its filters. A new
    leaf's handle is looked up first, which walks the whole bucket of the device's 16-bucket
    qdisc hash it falls in, so this floor grows faster than the leaves."""
    keep = [line for line in batch.splitlines() if line.startswith(("class add", "qdisc add"))]
    return "".join(f"{line}\n" for line in keep)


def classes_elsewhere() -> int:
    """How many tc classes the host's named namespaces and this one have (each one's block is
    on the list a new class walks on a device without ndo_setup_tc)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    spaces = [[]] + [["ip", "netns", "exec", line.split()[0]] for line in names.splitlines()]
    total = 0
    for prefix in spaces:
        links = subprocess.run([*prefix, "ip", "-o", "link"], capture_output=True, text=True)
        for line in links.stdout.splitlines():
            dev = line.split(": ")[1].split("@")[0]
            shown = subprocess.run(
                [*prefix, "tc", "class", "show", "dev", dev], capture_output=True, text=True
            )
            total += shown.stdout.count("class ")
    return total


def steering_possible() -> bool:
    probe = (
        "ip link add name t0 type veth peer name t1 && tc qdisc add dev t0 clsact && "
        "tc filter add dev t0 egress protocol ip prio 1 u32 match u32 0 0 "
        "action skbedit queue_mapping 0"
    )
    return subprocess.run(["unshare", "-n", "sh", "-c", probe], capture_output=True).returncode == 0


def compiled(text: str, work: Path, name: str) -> tuple[str, float]:
    path = work / f"{name}.tcp"
    path.write_text(text)
    out = work / f"{name}-out"
    start = time.perf_counter()
    done = subprocess.run(
        [TCDSL, "compile", "-b", "tc-batch", str(path), "-o", f"{out}/"],
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"compile failed: {done.stderr[-2000:]}")
    return (out / f"{name}.batch").read_text(), took


def main() -> None:
    process.cached()  # tcdsl is timed as a process
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    one_n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    steer = steering_possible()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        batch, compile_s = compiled(policy(n, mq=True), work, "mq")
        (work / "subscribers.csv").write_text(table(n))
        from_table, table_s = compiled(table_policy("subscribers.csv"), work, "table")
        table_lines = sum(1 for line in from_table.splitlines() if line and line[0] != "#")
        lines = sum(1 for line in batch.splitlines() if line and not line.startswith("#"))
        if not steer:
            batch = steering_stand_in(batch)
        elsewhere = classes_elsewhere()
        mq_s = applied(batch, work, "mq")
        bare_s = applied(without_steering(batch), work, "bare")
        floor_s = applied(classes_only(batch), work, "floor")
        leaves_s = applied(classes_and_leaves(batch), work, "leaves")
        raw_s = applied(raw_batch(n), work, "raw")
        one, _ = compiled(policy(one_n, mq=False), work, "one")
        one_s = applied(without_steering(one), work, "one")
    note = "" if steer else " (no act_skbedit here: the steering filters get a class id instead)"
    print(f"mq: {n} subscribers over {QUEUES} queues{note}")
    print(f"  tcdsl compile (whole process):      {compile_s:7.2f} s  ({lines} tc commands)")
    print(f"  the same from a table:              {table_s:7.2f} s  ({table_lines} tc commands)")
    print(f"  tc -batch of tcdsl's batch:         {mq_s:7.2f} s")
    print(f"  the same without steering filters:  {bare_s:7.2f} s")
    print(f"  tc -batch of hand-written commands: {raw_s:7.2f} s  (no steering, as the line above)")
    print(f"  kernel floor (the classes alone):   {floor_s:7.2f} s  (no leaf qdisc, no filter)")
    print(f"  the classes and their leaf qdiscs:  {leaves_s:7.2f} s  (no filter)")
    print(f"  compile + apply:                    {compile_s + mq_s:7.2f} s  (target < 30 s)")
    print(f"  the same from a table:              {table_s + mq_s:7.2f} s")
    print(f"one htb: {one_n} subscribers applied in {one_s:.2f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 cores, shared)")
    print(f"tc classes elsewhere on the host at the start: {elsewhere}")


if __name__ == "__main__":
    main()
