"""A subscriber table on the kernel: a small table policy applied in a network namespace, and
packets sent to each subscriber's addresses (IPv4 and IPv6, several devices of one circuit)
land in that subscriber's class, as ``classify`` says (``tests/test_classify_kernel.py``'s
sender and counters). Skipped where network namespaces cannot be used."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tcdsl.teach.traffic import parse_packet
from tcdsl.verify.runner import HostSupport
from tests.test_classify_kernel import _run_case, assert_agrees
from tests.test_lint_kernel import host, make_netns

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

TABLE = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
    '101,"Smith, J.",1,cpe-1,north,,100.64.0.1,2001:db8:1::/56,1,1,5,1,\n'
    '102,Jones,2,cpe-2,north,,"100.64.0.2, 100.64.0.8/29",,1,1,5,1,\n'
    "102,Jones,3,router-3,north,,100.64.0.3,2001:db8:2::/64,1,1,5,1,\n"
    "103,Brown,4,cpe-4,south,,100.64.1.4,2001:db8:3::/56,1,1,5,1,\n"
)
POLICY = """\
interface eth0 htb rate 100mbit default other {
    class north rate 10mbit ceil 100mbit {
        subscribers download from "subs.csv" where parent_node == "north" { pfifo limit 100 }
    }
    class south rate 10mbit ceil 100mbit {
        subscribers download from "subs.csv" where parent_node == "south" pref 2
    }
    class other rate 1mbit
}
"""
# (packet, the class the kernel must count it in: north 1:10, c101 1:20, c102 1:30, south 1:40,
# c103 1:50, other 1:60): eth0 faces the subscribers, so what it sends are their downloads,
# matched by destination.
SENDS = [
    ("udp dst 100.64.0.1 dport 5001", "1:20"),
    ("ipv6 udp dst 2001:db8:1:ff::9 dport 5001", "1:20"),
    ("udp dst 100.64.0.2 dport 5001", "1:30"),
    ("udp dst 100.64.0.13 dport 5001", "1:30"),  # inside 102's /29
    ("udp dst 100.64.0.3 dport 5001", "1:30"),  # 102's second device
    ("ipv6 udp dst 2001:db8:2::7 dport 5001", "1:30"),
    ("tcp dst 100.64.1.4 dport 443", "1:50"),
    ("ipv6 tcp dst 2001:db8:3:1::1 dport 443", "1:50"),
    ("udp dst 100.64.9.9 dport 5001", "1:60"),  # no subscriber: the default class
    ("udp src 100.64.0.1 dst 192.0.2.1 dport 5001", "1:60"),  # an upload: not matched here
]


def test_subscribers_traffic_lands_in_their_classes(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    (tmp_path / "subs.csv").write_text(TABLE, encoding="utf-8")
    packets = [parse_packet(spec) for spec, _ in SENDS]
    results = _run_case(POLICY, packets, host, make_netns, tmp_path)
    for (spec, counter), (packet, kernel, verdict) in zip(SENDS, results, strict=True):
        assert kernel == counter, f"{spec}: the kernel counted it in {kernel}, not {counter}"
        assert_agrees(kernel, verdict, POLICY, packet)
