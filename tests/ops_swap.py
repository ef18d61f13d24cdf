"""Subscribers probed after every single command of applies that change u32 hash tables, run
INSIDE a network namespace that has a veth ``d0`` (``ip netns exec NS python -m tests.ops_swap
STATE_DIR``).

A policy of subscribers, each with an IPv4 and an IPv6 address, goes through versions whose
tables change (``tcdsl.ops.u32swap``): subscribers added in one bucket's range (a second-level
table appears, in both families), rows reordered with a wider prefix among them, most of them
removed, the first version again. Each apply runs its ``tc -batch`` steps one command at a time,
and after every command one frame is sent to each probe address (subscribers in every
version, in the bucket that changes and outside it): the frame must be counted by the probe's
class, never by the default class or another. After each apply the kernel must be the policy
(as verify reads it) and the plan empty.

Prints one JSON object: {"applies": N, "commands": N, "probes": N, "swaps": N, "problems": [...]}.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tcdsl.ops.apply import run_command
from tcdsl.ops.desired import class_ids
from tcdsl.ops.lifecycle import apply, compile_new, prepare
from tcdsl.ops.state import STATE_DIR_VARIABLE, Store
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tests.ops_edits import live

DEV = "d0"
Sub = tuple[str, str, str]
"""A subscriber: (class name, IPv4 address, IPv6 address)."""

BASE: list[Sub] = [(f"s{i}", f"10.0.0.{i}", f"2001:db8::{i:x}") for i in range(1, 41)]
SAME_BUCKET: list[Sub] = [(f"t{j}", f"10.0.{j}.7", f"2001:db8:{j:x}::7") for j in range(1, 41)]
PROBES = ("s7", "s20", "s33")
"""In every version: s7 in the bucket that gets a second-level table, the others not."""


def lines(subs: Sequence[Sub]) -> str:
    return "".join(f"    class {n} rate 1mbit match dst {v4}, {v6}\n" for n, v4, v6 in subs)


def policy(body: str) -> str:
    head = f"interface {DEV} htb rate 1gbit default rest {{\n"
    return f"{head}{body}    class rest rate 1mbit\n}}\n"


def versions() -> list[str]:
    wide = "    class wide rate 1mbit match dst 10.0.0.0/24, 2001:db8::/64\n"
    reordered = SAME_BUCKET[20:] + BASE[::-1]
    return [
        policy(lines(BASE)),
        policy(lines(BASE + SAME_BUCKET)),
        policy(lines(reordered) + wide + lines(SAME_BUCKET[:20])),
        policy(lines(reordered + SAME_BUCKET[:20])),
        policy(lines([s for s in BASE if s[0] in PROBES])),
        policy(lines(BASE)),
    ]


def frame(address: str) -> tuple[bytes, int]:
    """An Ethernet frame of UDP to port 9 of ``address``, and its ethertype."""
    udp = (40000).to_bytes(2, "big") + (9).to_bytes(2, "big") + (12).to_bytes(2, "big") + bytes(6)
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        total = (20 + len(udp)).to_bytes(2, "big")
        header = bytes([0x45, 0, *total, 0, 0, 0, 0, 64, 17, 0, 0])
        packet = header + socket.inet_aton("10.200.0.1") + ip.packed + udp
        kind = 0x0800
    else:
        source = ipaddress.ip_address("2001:db8:ffff::1").packed
        packet = bytes([0x60, 0, 0, 0, 0, len(udp), 17, 64]) + source + ip.packed + udp
        kind = 0x86DD
    ether = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01" + kind.to_bytes(2, "big")
    return ether + packet, kind


_CLASS = re.compile(r"class htb (\S+) .*\n Sent \d+ bytes (\d+) pkt")


def counts() -> dict[str, int]:
    shown = subprocess.run(
        ["tc", "-s", "class", "show", "dev", DEV], capture_output=True, text=True, check=False
    ).stdout
    return {m.group(1): int(m.group(2)) for m in _CLASS.finditer(shown)}


class Prober:
    """Sends a frame to each probe address and checks which class counted it."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.probes = 0
        self.problems: list[str] = []

    def __call__(self, after: str) -> None:
        addresses = [(n, a) for n, v4, v6 in BASE if n in PROBES for a in (v4, v6)]
        for name, address in addresses:
            before = counts()
            data, kind = frame(address)
            self.socket.sendto(data, (DEV, kind))
            now = counts()
            grew = sorted(k for k in now if now[k] > before.get(k, 0) and k != "1:1")
            self.probes += 1
            if grew != [self.ids[name]]:
                said = f"{address} ({name}, {self.ids[name]}) went to {grew} after {after}"
                self.problems.append(said)


def one_by_one(prober: Prober, seen: list[int]):  # type: ignore[no-untyped-def]
    """A runner that runs a ``tc -batch`` (or ``tc -force -batch``) one command at a time,
    probing after each: a batch stops at its first failure, a forced one goes on (as tc's
    do), saying which commands failed."""

    def run(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        forced = list(argv[:3]) == ["tc", "-force", "-batch"]
        if (list(argv[:2]) != ["tc", "-batch"] and not forced) or stdin is None:
            return run_command(argv, stdin)
        said, code = "", 0
        for n, line in enumerate(stdin.splitlines(keepends=True), 1):
            done = run_command(argv, line)
            if done.returncode != 0:
                said += done.stderr.replace("Command failed -:1", f"Command failed -:{n}")
                code = done.returncode
                if not forced:
                    return subprocess.CompletedProcess(argv, code, done.stdout, said)
                continue
            seen[0] += 1
            prober(line.strip())
        return subprocess.CompletedProcess(argv, code, "", said)

    return run


def main(argv: list[str]) -> int:
    state = Path(argv[0])
    os.environ[STATE_DIR_VARIABLE] = str(state)  # the kernel probe's cache too
    store = Store("swap", state)
    path = state / "swap.tcp"
    seen = [0]
    prober: Prober | None = None
    problems: list[str] = []
    swaps = 0
    for n, text in enumerate(versions()):
        path.write_text(text, encoding="utf-8")
        result, trees = compile_new(store, str(path))
        assert result.policy is not None, result.diagnostics
        prepared = prepare(store, result.policy, result, new_trees=trees)
        rendered = prepared.plan.render()
        if n and "rebuild" in rendered:
            problems.append(f"version {n} rebuilds:\n{rendered}")
        swaps += any(s.settle for s in prepared.plan.steps)
        runner = run_command if prober is None else one_by_one(prober, seen)
        apply(prepared, str(path), result.sources, runner=runner)
        ids = {name: str(h) for name, h in class_ids(result.policy)[DEV].items()}
        if prober is None:
            prober = Prober(ids)
        assert all(prober.ids[p] == ids[p] for p in PROBES), "a probe's class kept its id"
        differs = compare_state(expected_policy(result.policy), live([DEV]))
        problems += [f"version {n}: {d.message}" for d in differs]
        result, trees = compile_new(store, str(path))
        again = prepare(store, result.policy, result, new_trees=trees)
        if not again.plan.empty:
            problems.append(f"version {n}: plan after apply:\n{again.plan.render()}")
    assert prober is not None
    problems += prober.problems
    done = {"applies": len(versions()), "commands": seen[0], "probes": prober.probes,
            "swaps": swaps, "problems": problems}  # fmt: skip
    print(json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
