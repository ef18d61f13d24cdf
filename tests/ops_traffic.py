"""Traffic through one class while the others are edited, added and removed, run INSIDE a
network namespace that has a veth ``d0`` (``ip netns exec NS python -m tests.ops_traffic
STATE_DIR SECONDS``).

A sender writes UDP frames to port 5001 (class ``voip``, ceil 2mbit) at about 8 Mbit/s; every
half second a new version of the policy is applied in place (other classes' rates, a class
added, one removed, their match lines changed: the filter group ``voip``'s filter is in is
swapped each time). Every 0.2 s the byte counters are read: voip's, and the sum of every
other leaf class's and of htb's direct queue (the sender's packets are all voip's and the
caller turns IPv6 off, so anything there is a voip packet classified wrong). Prints one JSON
object: the samples [(seconds, voip bytes or None, other bytes)], the applies made, and the
plan changes they made.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tcdsl.ops.lifecycle import apply, compile_new, prepare
from tcdsl.ops.state import STATE_DIR_VARIABLE, Store

DEV = "d0"
VOIP = "    class voip rate 1mbit ceil 2mbit match dport 5001 {\n        pfifo limit 30\n    }\n"


def version(n: int) -> str:
    """The n-th version of the policy: voip always the same, the rest changing."""
    lines = [f"interface {DEV} htb rate 20mbit default bulk {{\n", VOIP]
    lines.append(f"    class web rate {1 + n % 3}mbit ceil 10mbit match dport 80, {443 + n % 2}\n")
    if n % 2:
        lines.append(f"    class extra{n} rate 500kbit match src 10.{n}.0.0/16\n")
    if n % 3 != 2:
        lines.append("    class ssh rate 1mbit match dport 22\n")
    lines.append(f"    class bulk rate {1 + n % 2}mbit ceil 5mbit\n}}\n")
    return "".join(lines)


def frame() -> bytes:
    body = (40000).to_bytes(2, "big") + (5001).to_bytes(2, "big") + bytes(100)
    total = 20 + len(body)
    header = bytes([0x45, 0, *total.to_bytes(2, "big"), 0, 0, 0, 0, 64, 17, 0, 0])
    ip = header + socket.inet_aton("10.200.0.1") + socket.inet_aton("10.201.0.1") + body
    return b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00" + ip


def send(until: float) -> None:
    """About 8 Mbit/s of UDP to port 5001 until ``until``."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    data = frame()
    burst = 10
    gap = burst * len(data) * 8 / 8e6  # small frames, many of them: a short gap shows
    t = time.monotonic()
    while t < until:
        for _ in range(burst):
            try:
                s.sendto(data, (DEV, 0x0800))
            except OSError as e:  # ENOBUFS: the class's queue was full and dropped it
                if e.errno != errno.ENOBUFS:
                    raise
        t += gap
        pause = t - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    s.close()


def reading() -> tuple[int | None, int]:
    """(bytes voip sent, or None when the class is not there; bytes every other leaf class
    and the htb's direct queue sent), now."""
    shown = subprocess.run(
        ["tc", "-s", "class", "show", "dev", DEV], capture_output=True, text=True, check=False
    ).stdout
    sent = {m.group(1): int(m.group(2)) for m in _CLASS.finditer(shown)}
    qdisc = subprocess.run(
        ["tc", "-s", "qdisc", "show", "dev", DEV, "root"], capture_output=True, text=True,
        check=False,
    ).stdout  # fmt: skip
    direct = re.search(r"direct_packets_stat (\d+)", qdisc)
    others = sum(v for k, v in sent.items() if k not in ("1:10", "1:1"))
    return sent.get("1:10"), others + (int(direct.group(1)) if direct else 0)


_CLASS = re.compile(r"class htb (\S+) .*\n Sent (\d+) bytes")


def main(argv: list[str]) -> int:
    state, seconds = Path(argv[0]), float(argv[1])
    os.environ[STATE_DIR_VARIABLE] = str(state)  # the kernel probe's cache too
    store = Store("traffic", state)
    path = state / "traffic.tcp"
    path.write_text(version(0), encoding="utf-8")
    result, trees = compile_new(store, str(path))
    apply(prepare(store, result.policy, result, new_trees=trees), str(path), result.sources)
    start = time.monotonic()
    sender = threading.Thread(target=send, args=(start + seconds,))
    sender.start()
    samples: list[tuple[float, int | None, int]] = []
    changes: list[str] = []
    applies = 0
    next_apply = start + 0.5
    while time.monotonic() < start + seconds:
        now = time.monotonic()
        samples.append((now - start, *reading()))
        if now >= next_apply:
            applies += 1
            path.write_text(version(applies), encoding="utf-8")
            result, trees = compile_new(store, str(path))
            prepared = prepare(store, result.policy, result, new_trees=trees)
            changes += [c.render() for c in prepared.plan.changes]
            apply(prepared, str(path), result.sources)
            next_apply += 0.5
        time.sleep(0.2)
    sender.join()
    print(json.dumps({"samples": samples, "applies": applies, "changes": changes}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
