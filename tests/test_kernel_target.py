"""``--kernel`` targets and what dual stack needs of them (``tcdsl.kernel_target``): the flower
classifier and its newer keys by version, IPv6 marking (ip6tables, or nftables) by
configuration. The rest of ``--kernel`` is tested in ``tests/test_check_cli.py``."""

from __future__ import annotations

import pytest

from tcdsl.diagnostics import Diagnostic
from tcdsl.driver import compile_policy
from tcdsl.kernel_target import KernelTarget, kernel_support, load_target, parse_config
from tcdsl.resolve import resolve

FLOWER = """\
interface eth0 classifier flower htb rate 10mbit default other {
    class web rate 1mbit match proto tcp dport 80
    class ef rate 1mbit match dscp ef
    class range rate 1mbit match proto udp dport 5000-5100
    class other rate 1mbit
}
"""

MARKS = """\
interface eth0 FAMILY htb rate 10mbit default web {
    classify by mark from eth1
    class web rate 1mbit set dscp ef match proto tcp dport 80
}
"""

CONFIG = """\
CONFIG_NET_SCHED=y
CONFIG_NET_CLS=y
CONFIG_NET_SCH_HTB=m
CONFIG_NET_CLS_U32=m
CONFIG_NET_CLS_FW=m
CONFIG_IP_NF_IPTABLES=m
CONFIG_IP_NF_MANGLE=m
CONFIG_NETFILTER_XT_MARK=m
CONFIG_NETFILTER_XT_TARGET_DSCP=m
"""
"""A kernel that marks IPv4 only (no ip6tables, no nftables) and has no flower."""


def _lacks(text: str, target: KernelTarget) -> list[str]:
    """What ``target`` lacks for the policy ``text``: each E213 as ``LINE:COL: message``."""
    result = compile_policy("<text>", loader=lambda _: text)
    assert result.policy is not None, result.diagnostics
    policy, _ = resolve(result.policy)
    found: list[Diagnostic] = list(kernel_support(policy, target))
    assert {d.code for d in found} <= {"E213"}
    return [f"{d.span.line}:{d.span.column}: {d.message}" for d in found]


@pytest.mark.parametrize(
    ("version", "lacks"),
    [
        ("4.1", ["flower classifier", "TOS and TCP flags keys", "port ranges"]),
        ("4.12", ["TOS and TCP flags keys", "port ranges"]),
        ("4.19", ["port ranges"]),
        ("5.0", []),
    ],
)
def test_flower_and_its_keys_by_version(version: str, lacks: list[str]) -> None:
    found = _lacks(FLOWER, load_target(version))
    assert [next(w for w in lacks if w in line) for line in found] == lacks
    if "flower classifier" in lacks:
        # at the words that ask for flower, with the way out
        assert found[0] == (
            f"1:16: the target kernel {version} has no flower classifier (added in Linux 4.2); "
            "use 'classifier u32'"
        )
    if "port ranges" in lacks:
        assert found[-1].startswith(f"4:44: the target kernel {version} has no port ranges")


def test_flower_by_configuration() -> None:
    target = KernelTarget("config", config=parse_config(CONFIG))
    assert _lacks(FLOWER, target) == [
        "1:16: the target kernel config has no flower classifier (CONFIG_NET_CLS_FLOWER not set); "
        "use 'classifier u32'",
        "3:36: the target kernel config has no TOS and TCP flags keys in flower "
        "(CONFIG_NET_CLS_FLOWER not set); use 'classifier u32'",
        "4:44: the target kernel config has no port ranges in flower (CONFIG_NET_CLS_FLOWER "
        "not set); use 'classifier u32', or single ports",
    ]
    flower = KernelTarget("config", config=parse_config(CONFIG + "CONFIG_NET_CLS_FLOWER=m\n"))
    assert _lacks(FLOWER, flower) == []
    # u32 (the default classifier) needs nothing new for IPv6
    assert _lacks(FLOWER.replace(" classifier flower", ""), target) == []


def test_ipv6_marking_needs_ip6tables_or_nftables() -> None:
    target = KernelTarget("config", config=parse_config(CONFIG))
    assert _lacks(MARKS.replace("FAMILY", "family ipv4"), target) == []
    assert _lacks(MARKS.replace("FAMILY ", ""), target) == [
        "2:5: the target kernel config has no IPv6 firewall marking (ip6tables' mangle table "
        "and MARK target, or nftables) (CONFIG_IP6_NF_IPTABLES, CONFIG_IP6_NF_MANGLE not set); "
        "mark IPv4 only ('family ipv4'), or use u32 matches",
        "3:35: the target kernel config has no IPv6 DSCP rewriting (ip6tables' DSCP target, or "
        "nftables) (CONFIG_IP6_NF_IPTABLES, CONFIG_IP6_NF_MANGLE not set); mark IPv4 only "
        "('family ipv4'), or drop 'set dscp'",
    ]
    v6 = CONFIG + "CONFIG_IP6_NF_IPTABLES=m\nCONFIG_IP6_NF_MANGLE=m\n"
    assert _lacks(MARKS.replace("FAMILY ", ""), KernelTarget("v6", config=parse_config(v6))) == []
    nft = CONFIG + "CONFIG_NF_TABLES=m\nCONFIG_NF_TABLES_INET=y\n"
    assert (
        _lacks(
            MARKS.replace("FAMILY", "family ipv6"), KernelTarget("nft", config=parse_config(nft))
        )
        == []
    )
