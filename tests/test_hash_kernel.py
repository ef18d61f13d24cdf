"""Long prefs of u32 filters (``tcdsl.u32layout``) on the host kernel: the kernel tries them in
the policy's order, hashed or not, and puts each packet where ``tcdsl classify`` says.

- ``test_order_kept``: 5,000 lines at one pref (10,000 with ``TCDSL_BENCH=1``), an early /24
  overlapping the first /32 lines and a /8 as the last line, compiled hashed and linear
  (``u32layout.HASH_MIN = 0``: explicit node ids, cut into tables of divisor 1 past 4,095);
  packets to the first, the shadowed, the boundary (2,048/2,049, 4,095/4,096) and the last
  lines, the /8 and nothing.
- ``test_hashed_agrees``: random policies of hashable and non-hashable lines (v4 and v6,
  ports beside addresses), random packets: the moved counter == ``classify``, hashed and
  linear.

The namespace, sender and counters are ``tests/test_classify_kernel.py``'s.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from tcdsl import ir, u32layout
from tcdsl.teach.classify import classify
from tcdsl.teach.traffic import Packet, parse_packet
from tcdsl.verify import compare, readback
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.runner import HostSupport
from tests.test_apply import run
from tests.test_classify_kernel import (
    _leaves,
    _sender,
    assert_agrees,
    kernel_class,
)
from tests.test_lint_kernel import _applied, host, make_netns

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here


def _address(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def big_policy(n: int) -> str:
    """An early /24 over the first /32 lines, ``n`` /32 lines, a /8 last."""
    lines = ["interface eth0 htb rate 10gbit default other {  # tcdsl: disable=W312"]
    lines.append("    class first rate 1mbit { match dst 10.0.0.0/24 }")
    for i in range(n):  # a class per line: a line tried out of order shows
        lines.append(f"    class l{i} rate 8kbit {{ match dst {_address(i)} }}")
    lines.append("    class wide rate 1mbit { match dst 10.0.0.0/8 }")
    lines.append("    class other rate 1mbit")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _udp(dst: str) -> Packet:
    return parse_packet(f"ipv4 udp src 192.0.2.1 dst {dst} sport 1000 dport 2000")


def _order_case(
    n: int,
    hashed: bool,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not hashed:
        monkeypatch.setattr(u32layout, "HASH_MIN", 0)
    text = big_policy(n)
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert result.policy is not None
    tables = result.policy.interfaces[0].u32_tables
    divisors = {t.divisor for t in tables}
    assert divisors == ({256} if hashed else {1}), divisors
    leaves = _leaves(result.policy)
    wanted = [3, 255, 256, 2047, 2048, 2049, 4094, 4095, 4096, n - 1]
    sends = [_udp(_address(i)) for i in wanted if i < n]
    sends += [_udp("10.200.1.1"), _udp("11.0.0.1")]
    with _sender(ns) as sender:
        for packet in sends:
            verdict = classify(result.policy, packet)
            assert_agrees(kernel_class(ns, sender, packet, leaves), verdict, "", packet)
    names = [classify(result.policy, p).cls for p in sends]
    assert [c.name if c is not None else None for c in names][:2] == ["first", "first"]
    assert names[-2] is not None and names[-2].name == "wide"


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "linear"])
def test_order_kept(
    hashed: bool,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5,000 lines at one pref: the kernel's class is classify's, past 2,048 and 4,095."""
    _order_case(5000, hashed, host, make_netns, tmp_path, monkeypatch)


@pytest.mark.skipif(not os.environ.get("TCDSL_BENCH"), reason="10,000 lines: TCDSL_BENCH=1")
@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "linear"])
def test_order_kept_10000(
    hashed: bool,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 lines at one pref (two levels of hashing; linear: three tables of divisor 1)."""
    _order_case(10000, hashed, host, make_netns, tmp_path, monkeypatch)


def test_order_kept_past_2048_lines_without_a_table(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """2,049 port lines at one pref of an IPv4 tree: nothing to hash, so no table; the filters
    are numbered all the same (tc's own numbering loses the order past 2,048), and the kernel
    puts the last lines' packets where classify does."""
    n = u32layout.ORDER_KEPT + 1
    lines = ["interface eth0 family ipv4 htb rate 10gbit default other {"]
    lines += [f"    class p{i} rate 8kbit {{ match sport {1000 + i} }}" for i in range(n)]
    lines += ["    class other rate 1mbit", "}"]
    result, ns = _applied("\n".join(lines) + "\n", host, make_netns, tmp_path)
    assert result.policy is not None
    iface = result.policy.interfaces[0]
    assert iface.u32_tables == ()
    places = [f.place for f in iface.filters if isinstance(f, ir.U32Filter)]
    assert len(places) == n and all(p is not None and p.table is None for p in places)
    leaves = _leaves(result.policy)
    ports = [1000, 1000 + n - 3, 1000 + n - 2, 1000 + n - 1, 1000 + n]
    sends = [
        parse_packet(f"ipv4 udp src 192.0.2.1 dst 10.0.0.1 sport {port} dport 2000")
        for port in ports
    ]
    names = []
    with _sender(ns) as sender:
        for packet in sends:
            verdict = classify(result.policy, packet)
            assert_agrees(kernel_class(ns, sender, packet, leaves), verdict, "", packet)
            names.append(verdict.cls.name if verdict.cls is not None else None)
    assert names == ["p0", f"p{n - 3}", f"p{n - 2}", f"p{n - 1}", "other"]


# ---- random policies --------------------------------------------------------------------------

V4 = ipaddress.IPv4Network("10.7.0.0/22")
V6 = ipaddress.IPv6Network("2001:db8:7::/118")


@st.composite
def hash_policies(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A policy of 1..N match lines, mostly single addresses (hashable) of one small v4 and v6
    range, some prefixes, ports and protocols (not), and the packet specs to send."""
    count = draw(st.integers(1, 120))
    lines: list[str] = []
    targets: list[str] = []
    for i in range(count):
        kind = draw(st.sampled_from(["v4", "v4", "v4", "v6", "v6", "v4net", "v6net", "port"]))
        field = draw(st.sampled_from(["dst", "dst", "dst", "src"]))
        if kind in ("v4", "v4net"):
            host_ = V4[draw(st.integers(0, V4.num_addresses - 1))]
            plen = 32 if kind == "v4" else draw(st.integers(22, 31))
            net = ipaddress.IPv4Network(f"{host_}/{plen}", strict=False)
            targets.append(f"ipv4 udp {field} {host_}")
        elif kind in ("v6", "v6net"):
            host6 = V6[draw(st.integers(0, V6.num_addresses - 1))]
            plen = 128 if kind == "v6" else draw(st.integers(118, 127))
            net6 = ipaddress.IPv6Network(f"{host6}/{plen}", strict=False)
            targets.append(f"ipv6 udp {field} {host6}")
            net = net6  # type: ignore[assignment]
        else:
            port = draw(st.integers(1000, 1010))
            lines.append(f"    class l{i} rate 1mbit {{ match proto udp dport {port} }}")
            targets.append(f"ipv4 udp dport {port}")
            continue
        extra = " dport 53" if draw(st.integers(0, 9)) == 0 else ""
        lines.append(f"    class l{i} rate 1mbit {{ match {field} {net}{extra} }}")
    head = "interface eth0 htb rate 1gbit default other {  # tcdsl: disable=W312,W313,W314"
    text = "\n".join([head, *lines, "    class other rate 1mbit", "}"]) + "\n"
    return text, targets


def _complete(spec: str, data: st.DataObject) -> Packet:
    draw = data.draw
    family = spec.split()[0]
    words = spec.split()
    pool = [str(V4[draw(st.integers(0, 1023))])] if family == "ipv4" else []
    pool += [str(V6[draw(st.integers(0, 1023))])] if family == "ipv6" else []
    for field in ("src", "dst"):
        if field not in words:
            words += [field, pool[0]]
    if "sport" not in words:
        words += ["sport", "1000"]
    if "dport" not in words:
        words += ["dport", str(draw(st.sampled_from([53, 1000, 1005, 2000])))]
    return parse_packet(" ".join(words))


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a shrink re-applies for minutes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hash_policies(), data=st.data())
def test_hashed_agrees(
    case: tuple[str, list[str]],
    data: st.DataObject,
    host: HostSupport,
    make_netns: Callable[[], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Random policies hashed (``HASH_MIN`` 4) and linear: the kernel's counter is classify's,
    and both forms classify every packet alike."""
    text, targets = case
    specs = [data.draw(st.sampled_from(targets)) for _ in range(12)]
    sends = [_complete(s, data) for s in specs]
    verdicts: dict[int, list[str]] = {}
    for hash_min in (4, 0):
        saved = u32layout.HASH_MIN
        u32layout.HASH_MIN = hash_min
        try:
            result, ns = _applied(text, host, make_netns, tmp_path_factory.mktemp("hash"))
        finally:
            u32layout.HASH_MIN = saved
        assert result.policy is not None
        iface = result.policy.interfaces[0]
        if hash_min == 0:
            assert not any(t.divisor > 1 for t in iface.u32_tables)
        else:
            event(f"hash tables: {sum(t.divisor > 1 for t in iface.u32_tables)}")
        leaves = _leaves(result.policy)
        got: list[str] = []
        with _sender(ns) as sender:
            for packet in sends:
                verdict = classify(result.policy, packet)
                assert_agrees(kernel_class(ns, sender, packet, leaves), verdict, text, packet)
                got.append(_name(verdict.cls))
        verdicts[hash_min] = got
    assert verdicts[4] == verdicts[0]


def _name(cls: ir.Class | None) -> str:
    return cls.name if cls is not None else "-"


# ---- verify's readback --------------------------------------------------------------------------


def _read(ns: str) -> readback.KernelState:
    def tc(*words: str) -> str:
        return run(["tc", "-n", ns, *words, "show", "dev", "eth0"]).stdout

    filters = readback.parse_filters(
        run(["tc", "-n", ns, "filter", "show", "dev", "eth0", "parent", "1:"]).stdout
    )
    dev = readback.DeviceState(
        "eth0",
        readback.parse_qdiscs(tc("qdisc")),
        readback.parse_classes(tc("class")),
        {"1:": filters},
    )
    return readback.KernelState({"eth0": dev})


def test_verify_reads_hashed_tables_back(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """The hashed state read back agrees with the policy, links and hash keys included; a
    filter moved to another bucket is reported at its line."""
    lines = [f"    class c{i} rate 1mbit match dst 10.0.0.{i}" for i in range(40)]
    text = "interface eth0 htb rate 1gbit default c0 {\n" + "\n".join(lines) + "\n}\n"
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert result.policy is not None and result.policy.interfaces[0].u32_tables
    expected = expected_policy(result.policy, result.sources)
    assert compare.compare_state(expected, _read(ns)) == []
    head = ["tc", "-n", ns, "filter"]
    where = ["dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1"]
    run([*head, "del", *where, "handle", "1:7:1", "u32"])
    match = ["match", "ip", "dst", "10.0.0.7/32", "flowid", "1:80"]
    run([*head, "add", *where, "handle", "1:8:2", "u32", "ht", "1:8:", *match])
    problems = compare.compare_state(expected, _read(ns))
    assert {d.span.line for d in problems} == {9, 1}, problems  # its line; the stray: the tree
    assert any("1:8:2" in d.message or "missing" in d.message for d in problems), problems


def test_a_link_changed_by_hand_is_reported_by_what_it_links(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """A hash link pointed at another table by hand: the drift names the node, the table it
    links and its hash key, in the kernel and in the policy (a helper's review found it said
    "flowid is  in the kernel, policy says  ")."""
    lines = [f"    class c{i} rate 1mbit match dst 10.0.{i}.7" for i in range(40)]
    lines += [f"    class d{i} rate 1mbit match dst 10.0.0.{i + 100}" for i in range(40)]
    text = "interface eth0 htb rate 1gbit default c0 {\n" + "\n".join(lines) + "\n}\n"
    result, ns = _applied(text, host, make_netns, tmp_path)
    assert result.policy is not None and len(result.policy.interfaces[0].u32_tables) >= 2
    expected = expected_policy(result.policy, result.sources)
    shown = run(["tc", "-n", ns, "filter", "show", "dev", "eth0", "parent", "1:"]).stdout
    link = next(line for line in shown.splitlines() if " link " in line and "fh 800::" in line)
    handle = link.split(" fh ")[1].split()[0]
    to = link.split(" link ")[1].split()[0]
    other = next(f"{t.table:x}:" for t in result.policy.interfaces[0].u32_tables
                 if f"{t.table:x}:" != to)  # fmt: skip
    where = ["dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "handle", handle]
    hashkey = ["hashkey", "mask", "0x0000ff00", "at", "16", "match", "u32", "0", "0", "at", "0"]
    run(["tc", "-n", ns, "filter", "replace", *where, "u32", "link", other, *hashkey])
    problems = [d.message for d in compare.compare_state(expected, _read(ns))]
    node = "::" + handle.split("::")[1]  # as verify names it: in the pref's root table
    said = [m for m in problems if f"is node {node}, link {other}" in m]
    assert said and f"policy says node {node}, link {to}" in said[0], problems
    assert not any("flowid is  in the kernel" in m for m in problems), problems
