"""On the host kernel: while the generated script builds a tree of a few hundred classes, a
sender keeps writing packets through it. The default class is made right after the root qdisc
and its link class, even when the policy writes it last (the order of tcdsl.commands;
tests/test_build_order.py checks it on paper), so packets go unshaped (htb's direct queue,
``direct_packets_stat``) only in the moment between the root qdisc and its default class: two
commands, which the kernel cannot do without (htb_classify sends a packet direct while the
default class is missing, and a class can only be made in a qdisc that already takes
packets). Every packet after that goes to the default class until its own filter is there.

The figures are counts, not times: the default class takes the packets of some 560 commands
(every one until voip's filter), the direct queue those of two, so however slow the machine
the direct queue gets a small fraction of what the default class gets. With the order before
issue 12 (every class in the policy's order, then the filters) every packet until the last
class went direct: 30 to 75 times the default class's count here, where now it is under a tenth.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy
from tcdsl.verify.runner import HostSupport
from tests.conftest import ROOT
from tests.test_apply import host, make_netns, run

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

CLASSES = 300
TRAFFIC = 280
"""The class the sender's packets (UDP to port 5001) belong to: late in the policy."""


def policy_text() -> str:
    """An htb of CLASSES classes, each with a filter, the traffic class late, and the default
    class written last."""
    lines = ["interface d0 family ipv4 htb rate 1gbit default rest {"]
    for n in range(1, CLASSES + 1):
        name, port = ("voip", 5001) if n == TRAFFIC else (f"c{n}", 10000 + n)
        lines.append(f"    class {name} rate 1mbit ceil 1gbit match dport {port}")
    lines += ["    class rest rate 1mbit ceil 1gbit", "}"]
    return "\n".join(lines) + "\n"


_SENT = re.compile(r"^(?:qdisc|class) htb (\S+) .*\n Sent \d+ bytes (\d+) pkt", re.M)


def _htb(ns: str) -> tuple[int, dict[str, int]]:
    """The htb's ``direct_packets_stat``, and the packets each class and the qdisc (by id)
    sent (tc 6.1 prints no JSON for htb classes)."""
    shown = [
        run(["ip", "netns", "exec", ns, "tc", "-s", "-d", what, "show", "dev", "d0"]).stdout
        for what in ("qdisc", "class")
    ]
    direct = re.search(r"direct_packets_stat (\d+)", shown[0])
    assert direct is not None, shown[0]
    return int(direct.group(1)), {m[1]: int(m[2]) for m in _SENT.finditer("".join(shown))}


def run_under_traffic(ns: str, script: Path, ids: dict[str, ir.Handle]) -> dict[str, int]:
    """Run ``script`` in ``ns`` while the sender writes packets on d0; retried (the script
    may run again) until packets provably went through while the tree was being built: the
    default class took some that the finished tree sends to 'voip'. The figures of that run."""
    sender = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.script_traffic", "d0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert sender.stdin is not None and sender.stdout is not None

    def count() -> int:
        assert sender.stdin is not None and sender.stdout is not None
        sender.stdin.write("\n")
        sender.stdin.flush()
        return int(sender.stdout.readline())

    env = dict(os.environ, TCDSL_LOCK_DIR=str(script.parent / "locks"))
    figures: dict[str, int] = {}
    try:
        for attempt in range(1, 6):
            while count() == 0:  # the sender is under way
                pass
            before = count()
            done = subprocess.run(
                ["ip", "netns", "exec", ns, "sh", str(script)],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            during = count() - before
            direct, sent = _htb(ns)
            figures = {
                "attempt": attempt,
                "sent": during,
                "direct": direct,
                "default": sent[str(ids["rest"])],
                "voip": sent[str(ids["voip"])],
                "htb": sent["1:"],
            }
            if during > 0 and figures["default"] > 0 and figures["voip"] > 0:
                break
    finally:
        sender.stdin.close()
        sender.wait(timeout=60)
    return figures


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
def test_no_packet_goes_unshaped_while_the_script_builds_the_tree(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    path = tmp_path / "big.tcp"
    path.write_text(policy_text(), encoding="utf-8")
    result = compile_policy(str(path))
    assert result.output is not None and result.policy is not None, render(
        result.diagnostics, result.sources
    )
    ids = {
        c.name: c.classid
        for c in ir.classes_of(result.policy.interfaces[0].root)
        if c.classid is not None
    }
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
    for dev in ("d0", "d1"):
        run(["ip", "-n", ns, "link", "set", dev, "up"])
    run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
    figures = run_under_traffic(ns, script, ids)
    print(f"while the script ran: {figures}")
    # Packets went through the tree while it was being built: to the default class before
    # voip's filter was there, to voip after it.
    assert figures["sent"] > 0 and figures["default"] > 0 and figures["voip"] > 0, figures
    assert figures["direct"] * 10 < figures["default"], figures
