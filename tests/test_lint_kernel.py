"""The lints' claims about traffic hold on the real kernel.

When ``tcdsl check`` says a match line never sees a packet (W312-W314), packets it would match
must land in the class of the earlier line that takes them, and the shadowed class must count
none; when it says nothing, the narrow line must get its packets. When it says an htb without
``default`` sends unmatched packets to the direct queue (W310), they must go there; when it says
a fifo of limit 0 drops everything (W319), it must. Each policy is applied in a fresh network
namespace and UDP packets are sent out of its interface (``tests/test_apply.py``'s tools).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tcdsl import ir, linklayer
from tcdsl.driver import Result
from tcdsl.verify.runner import HostSupport
from tests.test_apply import (
    COUNT,
    SENDER,
    _compile_text,
    apply_for_traffic,
    class_packets,
    host,
    make_netns,
    missing,
    run,
)

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here


def _codes(result: Result) -> set[str]:
    return {d.code for d in result.diagnostics}


def _classid(result: Result, name: str) -> str:
    assert result.policy is not None
    for q in ir.walk_qdiscs(result.policy.interfaces[0].root):
        for cls in ir.classes_of(q):
            if cls.name == name:
                return str(cls.classid)
    raise AssertionError(f"no class {name}")


def _send(result: Result, ns: str, port: int) -> dict[str, int]:
    dev = result.policy.interfaces[0].name if result.policy else "eth0"
    before = class_packets(ns, dev)
    run(["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, str(COUNT), f"{port},0"])
    after = class_packets(ns, dev)
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
    }


def _applied(
    text: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> tuple[Result, str]:
    result = _compile_text(tmp_path, text)
    assert result.output is not None and result.policy is not None, result.diagnostics
    lacks = missing(host, result)
    if lacks:
        pytest.skip(lacks)
    ns = make_netns()
    apply_for_traffic(ns, result, tmp_path)
    return result, ns


def _policy(body: str, default: str = "bulk") -> str:
    head = f"interface eth0 htb rate 10mbit default {default} {{\n"
    return f"{head}{body}    class bulk rate 1mbit\n}}\n"


# (policy, the code the lint must report or None, [(udp port, class that must get it)])
SHADOWING = [
    pytest.param(
        _policy(
            "    class web rate 2mbit match dport 80\n    class proxy rate 2mbit match dport 80\n"
        ),
        "W313",
        [(80, "web")],
        id="same-match-two-classes",
    ),
    pytest.param(
        _policy(
            "    class sip rate 2mbit match proto udp dport 5060 pref 2\n"
            "    class udp rate 2mbit match proto udp pref 1\n"
        ),
        "W312",
        [(5060, "udp")],
        id="shadowed-by-pref",
    ),
    pytest.param(
        _policy(
            "    class sip rate 2mbit match proto udp dport 5060\n"
            "    class udp rate 2mbit match proto udp\n"
        ),
        None,
        [(5060, "sip"), (5061, "udp")],
        id="narrow-first-is-fine",
    ),
    pytest.param(
        _policy(
            "    class web rate 2mbit match dport 80, 443\n"
            "    class tls rate 2mbit match dport 443, 8443\n"
        ),
        "W312",
        [(443, "web"), (8443, "tls")],
        id="one-value-shadowed",
    ),
    pytest.param(
        _policy(
            "    class ports rate 2mbit match dport 1024-2047\n"
            "    class one rate 2mbit match dport 1500\n"
        ),
        "W312",
        [(1500, "ports")],
        id="port-in-earlier-range",
    ),
    pytest.param(
        _policy(
            "    class any rate 2mbit match all\n    class web rate 2mbit match dport 80\n",
            default="any",
        ),
        "W314",
        [(80, "any")],
        id="catch-all-first",
    ),
    pytest.param(
        _policy(
            "    class wide rate 2mbit match proto udp, tcp\n"
            "    class dns rate 2mbit match proto udp dport 53\n"
        ),
        "W312",
        [(53, "wide")],
        id="protocol-list",
    ),
]


@pytest.mark.parametrize(("text", "code", "sends"), SHADOWING)
def test_shadowed_matches_get_no_packet(
    text: str,
    code: str | None,
    sends: list[tuple[int, str]],
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
) -> None:
    result, ns = _applied(text, host, make_netns, tmp_path)
    shadow_codes = _codes(result) & {"W312", "W313", "W314"}
    assert shadow_codes == ({code} if code else set()), result.diagnostics
    for port, name in sends:
        moved = _send(result, ns, port)
        assert moved.get(_classid(result, name), 0) == COUNT, (port, name, moved)


def test_no_default_means_the_direct_queue(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    text = "interface eth0 htb rate 10mbit {\n    class web rate 2mbit match dport 80\n}\n"
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert "W310" in _codes(result)
    moved = _send(result, ns, 9)
    assert moved.get("direct", 0) == COUNT, moved


def test_fifo_limit_zero_drops_everything(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    text = (
        "interface eth0 htb rate 10mbit default bulk {\n"
        "    class bulk rate 10mbit {\n        pfifo limit 0\n    }\n}\n"
    )
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert "W319" in _codes(result)
    moved = _send(result, ns, 9)
    assert moved.get(_classid(result, "bulk"), 0) == 0, moved
    stats = run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "eth0"]).stdout
    found = re.search(r"qdisc pfifo [^\n]*\n\s*Sent 0 bytes 0 pkt \(dropped (\d+)", stats)
    assert found is not None and int(found.group(1)) >= COUNT, stats


def _burst_of(ns: str, classid: str) -> tuple[int, int]:
    """The burst and cburst, in bytes, that the kernel holds for a class (``tc -d``)."""
    shown = run(["tc", "-n", ns, "-d", "class", "show", "dev", "eth0", "classid", classid])
    found = re.search(r" burst (\d+)b/\d+ .* cburst (\d+)b", shown.stdout)
    assert found is not None, shown.stdout
    return int(found.group(1)), int(found.group(2))


def test_a_default_burst_from_1gbit_is_kept_as_less_than_a_frame(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """W315's claim for a burst left to tc: from 1gbit the kernel keeps tc's default as less
    than one full-size frame (below, a frame or more); the sizes the warning gives are kept
    (the throughput these make is measured in ``bench/burst_bench.py``)."""
    text = (
        "interface eth0 htb rate 10gbit burst 1221k cburst 1221k default slow {\n"
        "    class slow rate 800mbit\n"
        "    class fast rate 1gbit match dport 80\n"
        "    class faster rate 8gbit match dport 81\n"
        "    class given rate 1gbit ceil 2gbit burst 123k cburst 245k match dport 82\n}\n"
    )
    result, ns = _applied(text, host, make_netns, tmp_path)
    warned = {d.message.split(" has no")[0] for d in result.diagnostics if d.code == "W315"}
    assert warned == {"class 'fast'", "class 'faster'"}, result.diagnostics
    assert min(_burst_of(ns, _classid(result, "slow"))) >= linklayer.FRAME
    for name in ("fast", "faster"):
        assert max(_burst_of(ns, _classid(result, name))) < linklayer.FRAME, name
    burst, cburst = _burst_of(ns, _classid(result, "given"))
    assert abs(burst - 123 * 1024) < 2000 and abs(cburst - 245 * 1024) < 4000


def _prefs_policy(prefs: int) -> str:
    """An IPv4 policy whose match lines take ``prefs`` u32 prefs under the root."""
    lines = "".join(
        f"        match dst 10.0.{i // 256}.{i % 256} pref {i}\n" for i in range(1, prefs + 1)
    )
    return (
        "interface eth0 family ipv4 htb rate 10mbit default bulk {\n"
        f"    class a rate 1mbit {{\n{lines}    }}\n"
        "    class bulk rate 1mbit\n}\n"
    )


def test_the_u32_prefs_a_parent_holds(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """E263's limit is the kernel's: tcdsl's 2,047 u32 prefs under one parent apply, and of
    2,048 written by hand the kernel refuses the last (each pref makes a root table, ids
    0x801 to 0xfff), which tcdsl reports before anything runs."""
    from tcdsl.lint import U32_PREFS

    result, _ = _applied(_prefs_policy(U32_PREFS), host, make_netns, tmp_path)
    assert "E263" not in _codes(result)
    over = _compile_text(tmp_path, _prefs_policy(U32_PREFS + 1))
    assert [d.code for d in over.errors] == ["E263"] and over.output is None
    assert over.errors[0].span.line == 2 + U32_PREFS + 1
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0"])
    batch = tmp_path / "over.batch"
    commands = ["qdisc add dev eth0 root handle 1: htb default 1"] + [
        f"filter add dev eth0 parent 1: protocol ip prio {i} u32 match ip dst 10.0.0.1 flowid 1:1"
        for i in range(1, U32_PREFS + 2)
    ]
    batch.write_text("\n".join(commands) + "\n", encoding="utf-8")
    refused = run(["tc", "-n", ns, "-batch", str(batch)], check=False)
    assert refused.returncode != 0
    assert f"Command failed {batch}:{U32_PREFS + 2}" in refused.stderr, refused.stderr


BIG_SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for size in (int(x) for x in sys.argv[1:]):
    s.sendto(bytes(size), ("10.99.0.2", 9))
"""


@pytest.mark.parametrize(("mtu", "warned"), [(1000, True), (1514, False)])
def test_a_tbf_with_a_peakrate_drops_what_its_mtu_cannot_hold(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path, mtu: int, warned: bool
) -> None:
    """W317's claim for a peakrate's mtu: below a full-size frame, the kernel drops every
    packet bigger than it (the packets are sent well within both rates)."""
    text = f"interface eth0 tbf rate 10mbit burst 32k peakrate 20mbit mtu {mtu} limit 64k\n"
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert ("W317" in _codes(result)) == warned, result.diagnostics
    # UDP payloads making frames of 942 and 1442 bytes (14 + 20 + 8 + payload)
    run(["ip", "netns", "exec", ns, sys.executable, "-c", BIG_SENDER, "900", "1400"])
    stats = run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "eth0"]).stdout
    found = re.search(r"qdisc tbf .*\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+)", stats)
    assert found is not None, stats
    sent, dropped = int(found.group(2)), int(found.group(3))
    assert (sent, dropped) == ((1, 1) if warned else (2, 0)), stats
