"""Link-layer overhead (size tables and cake's own) and the cake qdisc, through the pipeline:
the preset table and the cost of a packet on the wire, the tc words, explain, simulate, and
verify's readback, on the host (size tables) and in user-mode Linux (cake)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl import ir, linklayer
from tcdsl.cli import cli
from tcdsl.commands import interface_commands
from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy
from tcdsl.verify import compare, readback, runner, verifier
from tcdsl.verify.expect import expected_policy


def _policy(tmp_path: Path, text: str) -> ir.Policy:
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path), "shell")
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return result.policy


def _root_words(policy: ir.Policy, index: int = 0) -> str:
    return " ".join(interface_commands(policy.interfaces[index])[0].args)


# ---- the cost of a packet ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "cells", "wire"),
    [("pppoe-vcmux", 32, 1696), ("pppoe-llc", 33, 1749), ("pppoa-vcmux", 32, 1696)],
)
def test_a_full_size_packet_in_atm_cells(preset: str, cells: int, wire: int) -> None:
    p = linklayer.preset(preset)
    assert p is not None and p.linklayer == "atm"
    assert linklayer.atm_cells(1500, p.overhead) == cells
    assert linklayer.wire_size(1500, p.overhead, "atm", p.mpu) == wire


def test_tc_spellings_of_the_llc_presets() -> None:
    assert linklayer.preset("pppoe-llcsnap") == linklayer.preset("pppoe-llc")
    assert linklayer.preset("pppoe-lcc") is None


def test_ptm_and_mpu() -> None:
    assert linklayer.wire_size(1500, 30, "ptm", 0) == 1530 + 24  # one byte per 64, rounded up
    assert linklayer.wire_size(20, 18, "ethernet", 64) == 64


@pytest.mark.parametrize("name", sorted(linklayer.PRESETS))
def test_a_preset_costs_the_same_as_a_size_table_and_in_cake(name: str) -> None:
    """The size table, which counts from the Ethernet frame, charges what cake charges from the
    IP packet (the table rounds to its 4-byte cells: exact for ATM, at most 3 bytes more)."""
    p = linklayer.PRESETS[name]
    if p.linklayer == "ptm":
        return  # a size table has no PTM (E232)
    table = linklayer.stab_for(p.overhead, p.linklayer, p.mpu, None, None)
    for ip_len in (20, 40, 41, 576, 1000, 1452, 1453, 1500):
        cake = linklayer.wire_size(ip_len, p.overhead, p.linklayer, p.mpu)
        stab = table.cost(ip_len + linklayer.ETHERNET_HEADER)
        if p.linklayer == "atm":
            assert stab == cake, (name, ip_len)
        else:
            assert cake <= stab <= cake + 3, (name, ip_len)


def test_size_table_beyond_its_mtu_extrapolates_like_the_kernel() -> None:
    table = linklayer.SizeTable(0, "atm", 0, 2047, 512)
    # slot 600 of 512: data[511] * 1 + data[88], as qdisc_calc_pkt_len does
    assert table.cost(2401) == table.cost(2048) + table.cost(356)


# ---- the words tc gets -----------------------------------------------------------------------


def test_stab_words_are_14_bytes_below_cakes(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        "interface eth0 htb rate 1mbit overhead pppoe-llc default a { class a rate 1mbit }\n"
        "interface eth1 cake bandwidth 1mbit overhead pppoe-llc\n"
        "interface eth2 tbf rate 1mbit burst 10k latency 50ms mtu 1600 linklayer adsl mpu 64 "
        "tsize 128\n",
    )
    assert _root_words(policy, 0) == (
        "qdisc add dev eth0 root handle 1: stab overhead 26 linklayer atm htb default 10"
    )
    assert _root_words(policy, 1) == (
        "qdisc add dev eth1 root handle 1: cake bandwidth 1mbit overhead 40 atm"
    )
    # the tbf keeps its own mtu; the size table takes the rest
    assert _root_words(policy, 2) == (
        "qdisc add dev eth2 root handle 1: stab overhead -14 linklayer atm mpu 64 tsize 128 "
        "tbf rate 1mbit burst 10k latency 50ms mtu 1600"
    )


def test_cake_words_and_named_rtt(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        "interface eth0 cake unlimited diffserv8 isolate dsthost nonat wash "
        "ack-filter-aggressive no-split-gso ingress rtt satellite memlimit 4m fwmark 0xf0 "
        "overhead docsis\n",
    )
    assert _root_words(policy) == (
        "qdisc add dev eth0 root handle 1: cake unlimited diffserv8 dsthost nonat wash "
        "ack-filter-aggressive no-split-gso ingress rtt 1s memlimit 4m fwmark 0xf0 "
        "overhead 18 noatm mpu 64"
    )


def test_a_constant_is_an_overhead_and_a_preset_wins_over_nothing(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "const OVH = 27\ninterface eth0 cake overhead OVH linklayer atm\n")
    root = policy.interfaces[0].root
    assert isinstance(root, ir.Cake) and root.overhead is not None
    assert (root.overhead.overhead.value, root.overhead.linklayer) == (27, "atm")


# ---- explain and simulate ----------------------------------------------------------------------


def test_explain_names_the_cells(tmp_path: Path) -> None:
    path = tmp_path / "p.tcp"
    path.write_text(
        "interface eth0 htb rate 1mbit overhead pppoe-vcmux default a { class a rate 1mbit }\n",
        encoding="utf-8",
    )
    got = CliRunner().invoke(cli, ["explain", str(path)])
    assert got.exit_code == 0, got.output
    text = " ".join(got.output.split())
    assert "a 1500-byte IP packet costs 32 cells (1696 bytes)" in text
    assert "tc's stab, overhead 18" in text


def _goodput(tmp_path: Path, policy: str, flow: str) -> float:
    path = tmp_path / "p.tcp"
    path.write_text(policy, encoding="utf-8")
    got = CliRunner().invoke(
        cli, ["simulate", str(path), "--flow", flow, "--duration", "4s", "--format", "json"]
    )
    assert got.exit_code == 0, got.output
    run = json.loads(got.stdout)
    return float(run["classes"][0]["mean_bps"]) / run["link_bps"]


def test_simulate_charges_atm_cells(tmp_path: Path) -> None:
    """A 1500-byte IP packet (1514 on the Ethernet) costs 33 cells, 1749 bytes, with pppoe-llc:
    a greedy flow gets 1514/1749 of the shaped rate in frames."""
    policy = "interface eth0 htb rate 1mbit overhead pppoe-llc default a { class a rate 1mbit }\n"
    assert _goodput(tmp_path, policy, "udp iplen 1500") == pytest.approx(1514 / 1749, rel=0.01)
    plain = "interface eth0 htb rate 1mbit default a { class a rate 1mbit }\n"
    assert _goodput(tmp_path, plain, "udp iplen 1500") == pytest.approx(1.0, rel=0.01)


def test_simulate_shapes_at_cakes_bandwidth_with_its_overhead(tmp_path: Path) -> None:
    policy = "interface eth0 cake bandwidth 4mbit overhead pppoe-ptm\n"
    # cake charges 1500 + 30 = 1530, plus 24 for PTM, per 1514-byte frame
    assert _goodput(tmp_path, policy, "udp iplen 1500") == pytest.approx(1514 / 1554, rel=0.01)


# ---- verify: readback and comparison ----------------------------------------------------------

STAB_TEXT = (
    "qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000\n"
    " linklayer atm overhead 26 mtu 2047 tsize 512 \n"
)


def test_the_stab_line_joins_its_qdisc() -> None:
    (q,) = readback.parse_qdiscs(STAB_TEXT)
    options = q.options
    assert options["stab"].value is True
    assert options["stab linklayer"].value == "atm"
    assert options["stab overhead"].value == 26
    assert (options["stab mtu"].value, options["stab tsize"].value) == (2047, 512)
    assert options["default"].value == 16


def test_cake_line() -> None:
    (q,) = readback.parse_qdiscs(
        "qdisc cake 1: root refcnt 2 bandwidth unlimited diffserv3 triple-isolate nonat nowash "
        "no-ack-filter split-gso rtt 100ms raw overhead 0 \n"
    )
    options = q.options
    assert options["bandwidth"].value == "unlimited"
    assert options["raw"].value is True
    assert options["isolate"].value == "triple-isolate"
    assert "atm" not in options


def _differences(tmp_path: Path, policy_text: str, qdisc_text: str) -> list[str]:
    policy = _policy(tmp_path, policy_text)
    expected = expected_policy(policy)
    state = readback.KernelState(
        {"eth0": readback.DeviceState("eth0", readback.parse_qdiscs(qdisc_text))}
    )
    return [d.message for d in compare.compare_state(expected, state) if d.code == "E402"]


def test_a_different_size_table_is_reported(tmp_path: Path) -> None:
    policy = "interface eth0 htb rate 1mbit overhead pppoe-vcmux default a { class a rate 1mbit }\n"
    got = _differences(tmp_path, policy, STAB_TEXT)
    assert got == [
        "htb qdisc of eth0 stab overhead is 26 in the kernel, policy says 18 (pppoe-vcmux (32) "
        "beyond the IP packet, less the Ethernet header)"
    ]
    plain = "interface eth0 htb rate 1mbit default a { class a rate 1mbit }\n"
    assert _differences(tmp_path, plain, STAB_TEXT) == [
        "htb qdisc of eth0 stab is on in the kernel, policy says none"
    ]


def test_a_different_cake_is_reported(tmp_path: Path) -> None:
    policy = "interface eth0 cake bandwidth 10mbit diffserv4 overhead 40 linklayer atm\n"
    got = _differences(
        tmp_path,
        policy,
        "qdisc cake 1: root refcnt 2 bandwidth 10Mbit diffserv3 triple-isolate nonat nowash "
        "no-ack-filter split-gso rtt 100ms noatm overhead 40 \n",
    )
    assert got == [
        "cake qdisc of eth0 diffserv is diffserv3 in the kernel, policy says diffserv4",
        "cake qdisc of eth0 atm is noatm in the kernel, policy says atm",
    ]


# ---- real kernels -----------------------------------------------------------------------------

HOST_STAB = (
    "interface eth0 htb rate 10mbit overhead pppoe-llc default a {\n"
    "    class a rate 5mbit { pfifo limit 50 }\n"
    "    class b rate 5mbit match proto udp\n"
    "}\n"
    "interface eth1 tbf rate 1mbit burst 10k latency 50ms mtu 1600 overhead ether-vlan "
    "tsize 1024\n"
    "interface eth2 htb rate 10mbit overhead 0 linklayer ethernet default a {\n"
    "    class a rate 1mbit\n"
    "}\n"
)


def _host() -> None:
    why = runner.host_unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        support = runner.host_support()
    except runner.KernelUnavailable as exc:
        pytest.skip(str(exc))
    for kind in ("htb", "tbf", "pfifo"):
        if kind not in support.qdiscs:
            pytest.skip(f"the host kernel has no {kind}")


def test_size_tables_verify_on_the_host(tmp_path: Path) -> None:
    _host()
    path = tmp_path / "stab.tcp"
    path.write_text(HOST_STAB, encoding="utf-8")
    v = verifier.verify(str(path), kernel="host")
    assert v.ok, render(v.diagnostics, v.sources) + v.output
    tamper = (
        "tc qdisc change dev eth1 root handle 1: stab overhead 30 linklayer ethernet mpu 84 "
        "tsize 1024 tbf rate 1mbit burst 10k latency 50ms mtu 1600\n"
    )
    v = verifier.verify(str(path), kernel="host", after=tamper)
    assert not v.ok
    assert [d.message for d in v.diagnostics if d.code == "E402"] == [
        "tbf qdisc of eth1 stab overhead is 30 in the kernel, policy says 28 (ether-vlan (42) "
        "beyond the IP packet, less the Ethernet header)"
    ]


UML_CAKE = (
    "interface eth0 cake bandwidth 20mbit overhead pppoe-ptm ingress ack-filter diffserv4 "
    "isolate dual-dsthost nat wash rtt metro memlimit 4m fwmark 0xff split-gso\n"
    "interface eth1 htb rate 10mbit overhead bridged-llc default bulk {\n"
    "    class bulk rate 5mbit { cake bandwidth 5mbit besteffort isolate flows no-split-gso }\n"
    "    class other rate 5mbit match proto udp {\n"
    "        cake unlimited egress no-ack-filter nonat nowash rtt 30ms overhead 18 mpu 64\n"
    "    }\n"
    "}\n"
    "interface eth2 cake\n"
)


def test_cake_verifies_in_user_mode_linux(tmp_path: Path) -> None:
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"UML cannot run here: {why}")
    paths = [str(tmp_path / "cake.tcp"), str(tmp_path / "changed.tcp")]
    for path in paths:
        Path(path).write_text(UML_CAKE, encoding="utf-8")
    tamper = "tc qdisc change dev eth2 root cake diffserv8 overhead 10\n"
    clean, changed = verifier.verify_many(paths, kernel="uml", after={paths[1]: tamper})
    assert clean.ok, render(clean.diagnostics, clean.sources) + clean.output
    assert clean.kernel is not None and clean.kernel.startswith("user-mode Linux")
    assert [d.message for d in changed.diagnostics if d.code == "E402"] == [
        "cake qdisc of eth2 diffserv is diffserv8 in the kernel, policy says diffserv3 "
        "(the default)",
        "cake qdisc of eth2 raw is off in the kernel, policy says no overhead (raw)",
    ]


def test_kernel_target_knows_cake_and_size_tables() -> None:
    got = CliRunner().invoke(cli, ["check", "--kernel", "4.18", "policies/home-cake.tcp"])
    assert got.exit_code == 1
    assert "the target kernel 4.18 has no cake qdisc (added in Linux 4.19)" in got.stderr
    got = CliRunner().invoke(cli, ["check", "--kernel", "2.6.26", "policies/adsl-atm.tcp"])
    assert "has no size tables (tc's stab, for link-layer overhead) (added in Linux 2.6.27)" in (
        got.stderr
    )
    assert (
        CliRunner().invoke(cli, ["check", "--kernel", "4.19", "policies/home-cake.tcp"]).exit_code
        == 0
    )


def test_explain_says_what_a_size_tables_cells_charge(tmp_path: Path) -> None:
    """Found by a tester: with 'overhead docsis' (mpu 64) tc's default size table counts in
    4-byte cells, and the kernel counted 1520 bytes for each 1500-byte IP packet where explain
    said 1518. explain now says both, the kernel's from the table as the kernel reads it; an
    ATM table, exact, is not said twice."""
    policy = tmp_path / "p.tcp"
    docsis = "interface eth0 htb rate 4800kbit overhead docsis default r {\nclass r rate 1mbit\n}\n"
    policy.write_text(docsis, encoding="utf-8")
    said = " ".join(CliRunner().invoke(cli, ["explain", str(policy)]).stdout.split())
    assert "a 1500-byte IP packet costs 1518 bytes" in said, said
    assert "counts in 4-byte cells" in said and "1500-byte IP packet 1520 bytes" in said, said
    policy.write_text(docsis.replace("docsis", "pppoe-llc"), encoding="utf-8")
    said = " ".join(CliRunner().invoke(cli, ["explain", str(policy)]).stdout.split())
    assert "a 1500-byte IP packet costs 33 cells" in said and "counts in" not in said, said
