"""``classifier flower``: the filters allocate and the backends write for it.

cls_flower tries the masks of one pref in the order they were first created, not its filters
in order, and refuses a second filter with the same keys at a pref; tc refuses a flower port
range that starts at 0 and a bare ``police`` (flower takes actions after ``action``). The
kernel side is in tests/test_verify.py (captured and live in user-mode Linux) and the
classify property test.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tcdsl import ir, lower
from tcdsl.driver import compile_policy
from tests.conftest import flower_batch_in_guest

ORDERED = """\
interface eth0 classifier flower htb rate 10mbit default other {
    class https rate 1mbit match proto tcp dport 443 police rate 1mbit burst 10k
    class tcp rate 1mbit match proto tcp
    class http rate 1mbit match proto tcp dport 80
    class low rate 1mbit match dport 0-1000
    class again rate 1mbit match proto udp dport 53 pref 5
    class twice rate 1mbit match proto udp dport 53 pref 5
    class other rate 1mbit
}
"""


def _compile(tmp_path: Path, text: str, backend: str = "shell") -> tuple[ir.Policy, str]:
    path = tmp_path / "flower.tcp"
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path), backend)
    assert result.policy is not None and result.output is not None, result.diagnostics
    return result.policy, result.output


def test_every_flower_filter_has_a_pref_of_its_own_in_the_policys_order(tmp_path: Path) -> None:
    policy, _ = _compile(tmp_path, ORDERED)
    (iface,) = policy.interfaces
    for family in ir.FAMILIES:
        mine = [f for f in iface.filters if f.family == family]
        assert all(isinstance(f, ir.FlowerFilter) for f in mine)
        prefs = [f.pref for f in mine]
        base = 0 if family == "ipv4" else 0x8000
        # distinct, counting up from 1 in the order the lines are written (pref 5 lines
        # after the default pref 1 ones, as the kernel would try them)
        assert sorted(prefs) == list(range(base + 1, base + len(prefs) + 1))
        by_pref = sorted(mine, key=lambda f: f.pref)
        flowids = [str(f.flowid) for f in by_pref]
        assert [k for k, _ in itertools.groupby(flowids)] == [
            "1:10",
            "1:20",
            "1:30",
            "1:40",
            "1:50",
            "1:60",
        ]


def test_flower_words_police_after_action_and_ports_from_zero(tmp_path: Path) -> None:
    _, script = _compile(tmp_path, ORDERED, "tc-batch")
    filters = [line for line in script.splitlines() if line.startswith("filter")]
    https = [f for f in filters if "dst_port 443" in f]
    # one policer for the line: made before the filters at an index, both bind to it
    assert len(https) == 2
    made = re.search(r"^actions replace action police rate 1mbit burst 10k drop index (\d+)$",
                     script, re.M)  # fmt: skip
    assert made is not None and script.index(made.group(0)) < script.index(https[0])
    for f in https:
        assert f" action police index {made.group(1)} classid" in f, f
    low = [f.split(" flower ", 1)[1] for f in filters if "classid 1:40" in f]
    # 0-1000 is not a block of the form 0/MASK: 0-511 as a mask, 512-1000 as a range
    assert (
        low
        == [
            "ip_proto tcp dst_port 0/0xfe00 classid 1:40",
            "ip_proto tcp dst_port 512-1000 classid 1:40",
            "ip_proto udp dst_port 0/0xfe00 classid 1:40",
            "ip_proto udp dst_port 512-1000 classid 1:40",
        ]
        * 2
    )
    assert not any(" 0-" in f for f in filters)


@pytest.mark.parametrize(
    ("lo", "hi", "parts"),
    [
        (0, 0, [(0, 0)]),
        (0, 1023, [(0, 1023)]),
        (0, 1000, [(0, 511), (512, 1000)]),
        (0, 65535, [(0, 65535)]),
        (0, 2, [(0, 1), (2, 2)]),
        (5, 9, [(5, 9)]),
    ],
)
def test_flower_splits_ranges_from_zero(lo: int, hi: int, parts: list[tuple[int, int]]) -> None:
    span = ir.Span("p.tcp", 1, 1, 1, 2)
    cond = ir.PortCond("dport", (ir.PortValue(lo, hi, None, span),), span)
    got = [c[0] for c in lower.flower_splits((cond,))]
    assert [(c.ports[0].lo, c.ports[0].hi) for c in got if isinstance(c, ir.PortCond)] == parts
    for c in got:
        assert isinstance(c, ir.PortCond)
        assert lower.flower_port(c.ports[0]) == (c.ports[0].lo, c.ports[0].hi)


def test_flower_policy_applies_in_user_mode_linux(tmp_path: Path) -> None:
    """Two lines with the same keys, a range from 0 and a policer: the guest's tc takes every
    filter of the batch (before, 'File exists', 'Illegal "dst_port"' and 'What is "police"?'),
    and shows each at its own pref."""
    _, batch = _compile(tmp_path, ORDERED, "tc-batch")
    stdout = flower_batch_in_guest(batch)
    heads = [line for line in stdout.splitlines() if " handle 0x" in line]
    assert heads and all(" handle 0x1 " in line for line in heads), stdout
    assert sum("classid 1:40" in line for line in heads) == 8


def test_flower_refuses_ports_of_other_protocols_and_drops_every_port(tmp_path: Path) -> None:
    """tc's flower reads ports under tcp, udp and sctp only (E259 for the others, not a
    script that stops at 'Illegal "dst_port"'); a port spec covering every port is no port
    key (the kernel would keep a mask of 0 as none, and verify would see a difference)."""
    path = tmp_path / "p.tcp"
    path.write_text(
        "interface eth0 classifier flower htb rate 10mbit default c {\n"
        "    class a rate 1mbit match proto 200 dport 5\n"
        "    class c rate 1mbit\n"
        "}\n",
        encoding="utf-8",
    )
    result = compile_policy(str(path))
    assert [(d.code, d.span.line, d.span.column) for d in result.diagnostics] == [("E259", 2, 36)]
    policy, _ = _compile(
        tmp_path, ORDERED.replace("match dport 0-1000", "match proto tcp sport 0-65535")
    )
    low = [f for f in policy.interfaces[0].filters if str(f.flowid) == "1:40"]
    assert len(low) == 2 and all(
        isinstance(f, ir.FlowerFilter) and f.sport is None and f.ip_proto == 6 for f in low
    )
