"""The simulator against hand-computed cases, the seed labs' intent, determinism and the CLI.

Throughputs are compared with what the kernel's algorithms give by hand; the seed scenarios
assert the policy's intent within 10% of the link rate (the accuracy goal of the simulator).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl import ir
from tcdsl.cli import cli
from tcdsl.driver import analyse
from tcdsl.teach.report import Run, plot, table
from tcdsl.teach.simulate import (
    MAX_PACKETS,
    RunTooLarge,
    SimulationError,
    check_size,
    simulate,
    xmit_ns,
)
from tcdsl.teach.traffic import parse_flow
from tests.conftest import ROOT

SEEDS = ROOT / "policies" / "seeds"
MBIT = 1_000_000
S = 1_000_000  # microseconds per second


def load(path: Path) -> ir.Policy:
    result = analyse(str(path))
    assert result.policy is not None, result.diagnostics
    return result.policy


def policy_text(tmp_path: Path, text: str, name: str = "p.tcp") -> ir.Policy:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load(path)


def run_flows(policy: ir.Policy, *specs: str, seconds: float = 10, link: int | None = None) -> Run:
    flows = [parse_flow(s, i) for i, s in enumerate(specs)]
    return simulate(policy, flows, int(seconds * S), link=link)


def mbit(
    run: Run, name: str, start: float = 0, stop: float | None = None, flow: bool = False
) -> float:
    series = run.flow(name) if flow else run.series(name)
    end = run.duration if stop is None else int(stop * S)
    return run.rate_between(series, int(start * S), end) / MBIT


def scaled_s001(tmp_path: Path) -> ir.Policy:
    """Seed 001's lab at 10mbit: 7mbit and 3mbit, ceilings at the link."""
    text = (SEEDS / "s001-htb-700-300.tcp").read_text(encoding="utf-8")
    text = text.replace("700mbit", "7mbit").replace("300mbit", "3mbit")
    return policy_text(tmp_path, text.replace("1gbit", "10mbit"), "s001-10mbit.tcp")


# ---- hand-computed cases ----------------------------------------------------------------------

HTB2 = """interface eth0 htb rate 10mbit default b {{
    class a rate 2mbit ceil {ceil_a} {extra_a} match dport 1
    class b rate 2mbit ceil {ceil_b} {extra_b}
}}
"""


def two_classes(
    tmp_path: Path, ceil_a: str = "2mbit", ceil_b: str = "2mbit", a: str = "", b: str = ""
) -> ir.Policy:
    return policy_text(tmp_path, HTB2.format(ceil_a=ceil_a, ceil_b=ceil_b, extra_a=a, extra_b=b))


def test_one_class_sends_at_its_rate(tmp_path: Path) -> None:
    run = run_flows(two_classes(tmp_path), "x: udp dport 1")
    assert mbit(run, "a", 1) == pytest.approx(2.0, abs=0.02)


def test_a_class_borrows_up_to_its_ceil(tmp_path: Path) -> None:
    run = run_flows(two_classes(tmp_path, ceil_a="6mbit"), "x: udp dport 1")
    assert mbit(run, "a", 1) == pytest.approx(6.0, abs=0.05)


def test_spare_bandwidth_goes_to_the_lower_prio_number_first(tmp_path: Path) -> None:
    policy = two_classes(tmp_path, "10mbit", "10mbit", a="prio 1", b="prio 0")
    run = run_flows(policy, "x: udp dport 1", "y: udp dport 2")
    # both get their 2mbit; b (prio 0) borrows the 6mbit left, up to its ceil
    assert mbit(run, "a", 1) == pytest.approx(2.0, abs=0.1)
    assert mbit(run, "b", 1) == pytest.approx(8.0, abs=0.1)


def test_equal_prio_shares_spare_bandwidth_by_quantum(tmp_path: Path) -> None:
    policy = two_classes(tmp_path, "10mbit", "10mbit", a="quantum 3000", b="quantum 1500")
    run = run_flows(policy, "x: udp dport 1", "y: udp dport 2")
    # a sends two 1514-byte packets per round, b one: the spare 6mbit splits 2:1
    assert mbit(run, "a", 1) == pytest.approx(6.0, abs=0.2)
    assert mbit(run, "b", 1) == pytest.approx(4.0, abs=0.2)


def test_burst_and_cburst_let_a_class_start_at_link_speed(tmp_path: Path) -> None:
    policy = policy_text(
        tmp_path,
        "interface eth0 htb rate 10mbit default a {\n"
        "    class a rate 1mbit ceil 1mbit burst 100k cburst 100k\n"
        "}\n",
    )
    flows = [parse_flow("x: udp", 0)]
    run = simulate(policy, flows, 2 * S, interval=100_000)
    first = run.series("a").bytes[0]
    # 100 ms at the rate (12500 bytes) plus the 102400-byte bucket, less a packet or two
    assert 102400 + 12500 - 2 * 1514 <= first <= 102400 + 12500 + 1514
    plain = simulate(two_classes(tmp_path), [parse_flow("x: udp dport 1", 0)], S, 100_000)
    # tc's default burst is one 1600-byte bucket: 100 ms at 2mbit, plus at most a packet
    assert plain.series("a").bytes[0] <= 25000 + 2 * 1514


def test_tbf_rate_and_burst(tmp_path: Path) -> None:
    policy = policy_text(tmp_path, "interface eth0 tbf rate 1mbit burst 10k latency 50ms\n")
    run = simulate(policy, [parse_flow("x: udp", 0)], 5 * S, 100_000, link=10 * MBIT)
    assert mbit(run, "tbf", 1) == pytest.approx(1.0, abs=0.02)
    first = run.series("tbf").bytes[0]
    assert 10240 + 12500 - 2 * 1514 <= first <= 10240 + 12500 + 1514


def test_prio_serves_the_first_band_and_starves_the_others(tmp_path: Path) -> None:
    policy = policy_text(
        tmp_path, "interface eth0 prio {\n    class high\n    class low\n    class bulk\n}\n"
    )
    # tos 0x10 (minimize delay): priority 6, band 0; tos 0: priority 0, band 1
    run = run_flows(policy, "hi: udp tos 0x10", "lo: udp", link=10 * MBIT, seconds=3)
    assert mbit(run, "high") == pytest.approx(10.0, abs=0.05)
    assert mbit(run, "low") == 0
    assert sum(run.series("low").drops) == 0


def test_ipv6_flows_classify_as_classify_says(tmp_path: Path) -> None:
    """IPv6 flows take the class ``classify`` gives them: the IPv6 filter of a line without
    addresses, the default for a hop-by-hop header in front of the port u32 reads."""
    run = run_flows(
        two_classes(tmp_path),
        "v6: ipv6 udp dport 1",
        "v4: udp dport 1",
        "hbh: ipv6 hbh udp dport 1",
        seconds=3,
    )
    assert mbit(run, "a", 1) == pytest.approx(2.0, abs=0.02)
    assert mbit(run, "b", 1) == pytest.approx(2.0, abs=0.02)
    assert mbit(run, "v6", 1, flow=True) + mbit(run, "v4", 1, flow=True) == pytest.approx(
        2.0, abs=0.02
    )
    assert mbit(run, "hbh", 1, flow=True) == pytest.approx(2.0, abs=0.02)


def test_ipv6_traffic_class_sets_no_priority(tmp_path: Path) -> None:
    """prio's priomap: an IPv6 packet has priority 0 (band 1) whatever its traffic class, so
    an IPv6 flow with TOS 0x10 does not starve the others as the IPv4 one does."""
    policy = policy_text(
        tmp_path, "interface eth0 prio {\n    class high\n    class low\n    class bulk\n}\n"
    )
    run = run_flows(policy, "hi: ipv6 udp tos 0x10", "lo: udp", link=10 * MBIT, seconds=3)
    assert mbit(run, "low") == pytest.approx(10.0, abs=0.05)
    assert mbit(run, "hi", 1, flow=True) == pytest.approx(5.0, abs=0.2)  # band 1, shared


def test_sfq_splits_equally_among_greedy_flows(tmp_path: Path) -> None:
    policy = policy_text(tmp_path, "interface eth0 sfq\n")
    run = run_flows(policy, "a: udp sport 1", "b: udp sport 2", "c: udp sport 3", link=9 * MBIT)
    for name in "abc":
        assert mbit(run, name, 1, flow=True) == pytest.approx(3.0, abs=0.05)


def test_fifo_tail_drops_a_rate_flow_over_capacity(tmp_path: Path) -> None:
    policy = policy_text(tmp_path, "interface eth0 pfifo limit 10\n")
    run = run_flows(policy, "x: udp rate 20mbit", link=10 * MBIT, seconds=2)
    offered = 20 * MBIT * 2 // (1514 * 8)
    series = run.flow("x")
    assert mbit(run, "x", flow=True) == pytest.approx(10.0, abs=0.05)
    sent, drops = sum(series.packets), sum(series.drops)
    # Poisson arrivals: what was offered is within a few standard deviations of rate x time
    assert abs(sent + drops - offered) <= 3 * offered**0.5 + 10
    assert drops == pytest.approx(offered / 2, rel=0.1)


def test_htb_default_buffer_is_tc_default() -> None:
    # q_htb.c: rate / get_hz() + mtu with get_hz() = 1e9, i.e. 1600 bytes, in 64 ns ticks
    assert xmit_ns(1600, 1_250_000) == 1_280_000


def test_unclassified_traffic_goes_to_the_direct_queue(tmp_path: Path) -> None:
    run = run_flows(load(SEEDS / "s001-htb-700-300.tcp"), "x: udp src 10.9.9.9", seconds=0.1)
    assert [s.name for s in run.classes] == ["direct"]
    assert mbit(run, "direct") == pytest.approx(1000, rel=0.02)  # unshaped, at the link


def test_cbq_is_refused(tmp_path: Path) -> None:
    policy = load(SEEDS / "s002-cbq-conditioner.tcp")
    with pytest.raises(SimulationError, match="cbq"):
        run_flows(policy, "x: udp", seconds=1)


# ---- the seed scenarios: intent within 10% of the link ---------------------------------------


def within(measured: float, intended: float, link_mbit: float) -> bool:
    return abs(measured - intended) <= 0.10 * link_mbit


@pytest.mark.parametrize("scale", ["1gbit", "10mbit"])
def test_seed_001_htb_700_300(tmp_path: Path, scale: str) -> None:
    if scale == "1gbit":
        policy, link, seconds = load(SEEDS / "s001-htb-700-300.tcp"), 1000.0, 0.6
    else:
        policy, link, seconds = scaled_s001(tmp_path), 10.0, 30
    third = seconds / 3
    run = run_flows(
        policy,
        "h1: tcp src 10.0.0.1 dst 10.0.0.3",
        f"h2: tcp src 10.0.0.2 dst 10.0.0.4 start {third * 1000:g}ms stop {2 * third * 1000:g}ms",
        seconds=seconds,
    )
    assert run.link == link * MBIT
    assert within(mbit(run, "h1", 0, third), link, link)  # alone: the whole link
    assert within(mbit(run, "h1", third, 2 * third), 0.7 * link, link)
    assert within(mbit(run, "h2", third, 2 * third), 0.3 * link, link)
    assert within(mbit(run, "h1", 2 * third, seconds), link, link)
    # tighter than the goal: the model gives the rates themselves
    assert mbit(run, "h1", third, 2 * third) == pytest.approx(0.7 * link, rel=0.02)


def test_seed_000_8_1_user_limits() -> None:
    run = run_flows(
        load(SEEDS / "s000-8.1-user-limits.tcp"),
        "u5: tcp src 10.3.34.11",
        "u6: tcp src 10.3.34.33",
        "u7: tcp src 10.3.34.77",
    )
    for name, ceiling in (("u5", 6), ("u6", 3), ("others", 1)):
        assert within(mbit(run, name, 1), ceiling, 10)
        assert mbit(run, name, 1) == pytest.approx(ceiling, abs=0.05)


def test_seed_000_8_2_borrowing() -> None:
    policy = load(SEEDS / "s000-8.2-borrowing.tcp")
    run = run_flows(policy, "u5: tcp src 10.3.34.11", "u6: tcp src 10.3.34.33", "u7: tcp")
    for name, ceiling in (("u5", 15), ("u6", 10), ("others", 5)):
        assert within(mbit(run, name, 1), ceiling, 40)
        assert mbit(run, name, 1) == pytest.approx(ceiling, abs=0.1)


@pytest.mark.parametrize("prio_b", ["1", "0"])
def test_seed_000_10_2_marks_sharing(tmp_path: Path, prio_b: str) -> None:
    text = (SEEDS / "s000-10.2-marks-sharing.tcp").read_text(encoding="utf-8")
    text = text.replace(
        "ceil 3mbit prio 1 match proto tcp dport 5002",
        f"ceil 3mbit prio {prio_b} match proto tcp dport 5002",
    )
    policy = policy_text(tmp_path, text)
    run = run_flows(
        policy,
        "a: tcp dport 5001",
        "b: tcp dport 5002 start 10s",
        "c: tcp dport 80 start 20s",
        seconds=30,
    )
    # alone, a class gets its ceil
    assert within(mbit(run, "app5001", 1, 10), 3, 5)
    assert mbit(run, "app5001", 1, 10) == pytest.approx(3, abs=0.05)
    a, b = mbit(run, "app5001", 11, 20), mbit(run, "app5002", 11, 20)
    # equal prio, equal quantum: the spare 1mbit in halves; else b's lower prio number takes
    # the spare 1mbit first, up to its ceil
    intended_a, intended_b = (2.5, 2.5) if prio_b == "1" else (2.0, 3.0)
    assert within(a, intended_a, 5) and within(b, intended_b, 5)
    assert a == pytest.approx(intended_a, abs=0.1) and b == pytest.approx(intended_b, abs=0.1)
    # all three: each its rate (2 + 2 + 1 = the 5mbit parent)
    for name, rate in (("app5001", 2), ("app5002", 2), ("others", 1)):
        assert mbit(run, name, 21, 30) == pytest.approx(rate, abs=0.1)


# ---- determinism, speed, output --------------------------------------------------------------


def test_same_input_same_json_and_png(tmp_path: Path) -> None:
    policy = scaled_s001(tmp_path)
    specs = ("h1: udp src 10.0.0.1", "h2: udp src 10.0.0.2 rate 4mbit start 2s stop 4s")
    one, two = (run_flows(policy, *specs, seconds=6) for _ in range(2))
    assert json.dumps(one.to_json()) == json.dumps(two.to_json())
    plot(one, tmp_path / "one.png")
    plot(two, tmp_path / "two.png")
    data = (tmp_path / "one.png").read_bytes()
    assert data.startswith(b"\x89PNG") and data == (tmp_path / "two.png").read_bytes()
    assert b"matplotlib" not in data.lower()


def test_thirty_seconds_at_10mbit_is_fast(tmp_path: Path) -> None:
    policy = load(SEEDS / "s000-8.1-user-limits.tcp")
    start = time.perf_counter()
    run = run_flows(policy, "a: tcp src 10.3.34.11", "b: tcp src 10.3.34.33", "c: tcp", seconds=30)
    elapsed = time.perf_counter() - start
    assert run.events > 30 * 10 * MBIT // (1514 * 8)  # a packet sent is an event
    assert elapsed < 5, f"{run.events} events took {elapsed:.1f} s"


def test_table_lists_classes_flows_and_periods(tmp_path: Path) -> None:
    run = run_flows(
        scaled_s001(tmp_path), "h1: udp src 10.0.0.1", "h2: udp src 10.0.0.2 start 5s", seconds=10
    )
    text = table(run)
    assert "A  0s-5s: h1" in text and "B  5s-10s: h1, h2" in text
    row = next(line for line in text.splitlines() if line.startswith("class h2"))
    assert re.search(r"3\.0\d \(30\.\d%\)", row)


# ---- the command line ------------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_cli_text_json_and_plot(tmp_path: Path) -> None:
    seed = str(SEEDS / "s000-8.1-user-limits.tcp")
    code, out, _ = invoke("simulate", seed, "--flow", "u5: tcp src 10.3.34.11", "--duration", "3s")
    assert code == 0 and "class u5" in out
    png = tmp_path / "out.png"
    code, out, _ = invoke(
        "simulate",
        seed,
        "--flow",
        "tcp src 10.3.34.11",
        "--duration",
        "2s",
        "--interval",
        "500ms",
        "--format",
        "json",
        "--plot",
        str(png),
    )
    assert code == 0
    data = json.loads(out)
    assert data["interval_us"] == 500_000 and data["flows"][0]["name"] == "flow1"
    assert data["classes"][0]["mean_bps"] == pytest.approx(6 * MBIT, rel=0.01)
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "args",
    [
        ["--flow", "udp rate"],
        ["--flow", "udp bogus 3"],
        ["--flow", "udp", "--duration", "0s"],
        ["--flow", "udp", "--duration", "ten"],
        ["--flow", "udp", "--link", "fast"],
        ["--flow", "udp", "--interface", "nope"],
        [],
    ],
)
def test_cli_usage_errors(args: list[str]) -> None:
    code, out, err = invoke("simulate", str(SEEDS / "s000-8.1-user-limits.tcp"), *args)
    assert code == 2 and out == "" and "Traceback" not in err


def test_a_negative_duration_is_said_to_be_below_zero() -> None:
    """Found by a tester: '--duration -1s' was 'not a value with a unit'."""
    code, _, err = invoke(
        "simulate", str(SEEDS / "s000-8.1-user-limits.tcp"), "--flow", "udp", "--duration", "-1s"
    )
    assert code == 2 and "'-1s' must be above 0" in err, err


def test_cli_policy_errors_and_unsupported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tcp"
    bad.write_text("interface eth0 htb rate 10mbit {\n class a ceil 1mbit\n}\n")
    code, out, err = invoke("simulate", str(bad), "--flow", "udp")
    assert code == 1 and out == "" and "nothing simulated" in err
    code, out, err = invoke("simulate", str(SEEDS / "s002-cbq-conditioner.tcp"), "--flow", "udp")
    assert code == 1 and "cbq" in err and "Traceback" not in err


def test_a_flow_whose_fragments_split_is_refused(tmp_path: Path) -> None:
    """A UDP flow of datagrams a 1500-byte MTU does not hold leaves in fragments, and only the
    first has the ports: where the later ones end elsewhere, the simulator (which moves whole
    packets) refuses the flow rather than count all its bytes in the first's class; where
    they end in the same class it runs."""
    policy = tmp_path / "voip.tcp"
    policy.write_text(
        "interface eth0 htb rate 10mbit default bulk {\n"
        "    class voip rate 2mbit match proto udp dport 5060\n"
        "    class other rate 1mbit match src 10.0.0.0/8\n"
        "    class bulk rate 1mbit\n}\n",
        encoding="utf-8",
    )
    code, out, err = invoke("simulate", str(policy), "--flow", "v: udp dport 5060 size 3000")
    assert code == 1 and out == "", (out, err)
    said = " ".join(err.split())
    assert (
        "flow v: a 2986-byte datagram is cut into fragments, which are not decided alike "
        "(the first: filter pref 1 matched (match udp dport 5060) -> class 'voip' (1:10); "
        "the later ones: filter pref 1 matched (match src 10.0.0.0/8) -> class 'other'"
    ) in said, said
    assert "give the flow a size of at most 1514, or two flows" in said, said
    code, out, err = invoke("simulate", str(policy), "--flow", "o: udp dport 9 size 3000",
                            "--duration", "2s")  # fmt: skip
    assert code == 0 and "flow o" in out, err


def test_the_doc_example_is_the_command_output(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    command = re.search(r"```console\n\$ (tcdsl simulate .*?)\n(.*?)```", doc, re.S)
    assert command is not None
    words = re.findall(r"'[^']*'|\S+", command.group(1).replace("\\\n", " "))
    args = [w.strip("'") for w in words[1:]]
    monkeypatch.chdir(ROOT)
    code, out, _ = invoke(*args)
    assert code == 0
    assert out == command.group(2)


def test_packets_bigger_than_a_tbf_burst_are_dropped_and_the_run_ends(tmp_path: Path) -> None:
    """sch_tbf drops a packet larger than its bucket; a greedy sender of such packets backs off
    for a packet time instead of offering them again at the same instant (which never ended)."""
    path = tmp_path / "tbf.tcp"
    path.write_text("interface eth0 tbf rate 220kbit latency 50ms burst 1000\n", encoding="utf-8")
    policy = analyse(str(path)).policy
    assert policy is not None
    start = time.monotonic()
    run = simulate(policy, [parse_flow("bulk: tcp dport 5001", 0)], 5 * S)
    assert time.monotonic() - start < 30
    (flow,) = run.flow_series
    assert sum(flow.bytes) == 0
    # one refused packet per packet time at the link: 5 s * 220kbit / (1514 * 8) ~ 90
    assert 80 <= sum(flow.drops) <= 100


def test_a_full_fifo_shares_in_proportion_to_what_each_flow_offers(tmp_path: Path) -> None:
    """Measured on the host kernel: 30 and 6 mbit into a 10 mbit tbf came out 8.2 and 1.7.
    Strictly periodic senders gave 10 and 0 (they fell into step with the link)."""
    policy = policy_text(tmp_path, "interface eth0 tbf rate 10mbit latency 50ms burst 20k\n")
    run = run_flows(policy, "a: udp dport 1 rate 30mbit", "b: udp dport 2 rate 6mbit", seconds=5)
    assert mbit(run, "a", flow=True) == pytest.approx(10 * 30 / 36, abs=0.5)
    assert mbit(run, "b", flow=True) == pytest.approx(10 * 6 / 36, abs=0.5)


# ---- runs too large to model: refused at once, never run ---------------------------------------

OFFICE = str(ROOT / "policies" / "office.tcp")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # 82 million packets: ran for minutes
        (["--flow", "h1: udp rate 1tbit", "--duration", "1s"], ["flow 'h1'", "5,000,000"]),
        (["--flow", "h1: udp rate 99999999999999999999999999tbit"], ["at most 1tbit"]),
        (["--flow", "h1: udp rate 9" + "0" * 120 + "bit"], ["at most 1tbit"]),
        (["--flow", "g: udp", "--duration", "1000s"], ["flow 'g' is greedy on a 100mbit link"]),
        (["--flow", "g: udp", "--link", "2tbit"], ["'--link'", "at most 1tbit"]),
        (["--flow", "g: udp", "--duration", "99999999999999999999s"], ["--duration"]),
        (["--flow", "g: udp rate 1mbit", "--interval", "1us"], ["'--interval'", "samples"]),
        # (found by a tester: ran, and showed the flow as "40s-2s")
        (["--flow", "a: udp start 40s", "--duration", "2s"], ["flow 'a' starts at 40s"]),
        (
            [
                *("--flow", "a: udp rate 1gbit", "--flow", "b: udp rate 1gbit"),
                *("--flow", "c: udp", "--duration", "30s"),
            ],
            ["the flows together", "shorten --duration"],
        ),
    ],
)
@pytest.mark.parametrize("command", [["simulate"], ["measure", "--simulate"]])
def test_a_run_too_large_is_a_usage_error_at_once(
    command: list[str], args: list[str], expected: list[str]
) -> None:
    """Each of these ran without bound (time or memory grew with rate x duration); now exit 2
    names the flow or option and what to change. A subprocess with a timeout, so that a
    regression fails instead of hanging the suite."""
    if command[0] == "measure" and "--link" in args:
        pytest.skip("measure has no --link")
    code = "import sys; from tcdsl.cli import cli; sys.argv[0] = 'tcdsl'; cli()"
    proc = subprocess.run(
        [sys.executable, "-c", code, command[0], OFFICE, *command[1:], *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    for words in expected:
        assert words in proc.stderr


def test_the_packet_limit_is_what_flows_offer_and_the_link_sends() -> None:
    """At the limit a run is allowed; a packet over it is refused (without running)."""
    second = 1_000_000
    size = 1250  # 10,000 bits: a rate of N * 10kbit offers N packets a second
    at_limit = f"x: udp size {size} rate {MAX_PACKETS * 10}kbit"
    check_size([parse_flow(at_limit)], second, second, 1000)  # a slow link: offered packets only
    over = f"x: udp size {size} rate {MAX_PACKETS * 10 + 10}kbit"
    with pytest.raises(RunTooLarge, match="about 5,000,001 packets"):
        check_size([parse_flow(over)], second, second, 1000)
    # a greedy flow counts what the link can send while it runs: half the run here
    greedy = parse_flow(f"g: udp size {size} stop 1s")
    link = MAX_PACKETS * 10_000
    check_size([greedy], 2 * second, second, link)
    with pytest.raises(RunTooLarge, match="greedy"):
        check_size([greedy], 2 * second, second, link + 10_000)
    # rate-limited flows below the link: what they offer, and what of it the link sends
    half = parse_flow(f"h: udp size {size} rate {MAX_PACKETS * 5}kbit")
    check_size([half], second, second, 10**12)
    with pytest.raises(RunTooLarge, match="the flows together"):
        check_size([half, parse_flow(f"i: udp size {size} rate 10kbit")], second, second, 10**12)


def test_two_flows_of_one_name_are_a_usage_error() -> None:
    """Found by a tester: two flows called alike exited 1 with a bare message, where every
    other bad --flow is a usage error (exit 2, naming the option), as simulate.md says."""
    seed = str(SEEDS / "s000-8.1-user-limits.tcp")
    code, _, err = invoke("simulate", seed, "--flow", "h1: tcp", "--flow", "h1: udp")
    assert code == 2, err
    assert "Invalid value for '--flow': two flows are called 'h1'" in err, err


def test_a_flow_rate_in_bytes_is_warned() -> None:
    """Found by a tester: 'rate 10mbps' on a flow was 80 Mbit/s without a word (a policy
    gets W302 for it). It is taken as tc reads it, and said."""
    seed = str(SEEDS / "s000-8.1-user-limits.tcp")
    flow = "u5: tcp src 10.3.34.11 rate 10mbps"
    code, _, err = invoke("simulate", seed, "--flow", flow, "--duration", "1s")
    assert code == 0, err
    assert "'rate 10mbps' is bytes a second, as tc reads it: 80mbit" in err, err
    assert "write 10mbit" in err
    code, _, err = invoke("simulate", seed, "--flow", flow.replace("mbps", "mbit"))
    assert code == 0 and "warning" not in err, err


def test_an_ingress_policer_meters_packets_without_their_ethernet_header(tmp_path: Path) -> None:
    """At ingress the kernel has pulled the Ethernet header off (skb->len, which act_police
    meters, is the IP packet): 800kbit of 86-byte IP packets is about 930kbit of 100-byte
    frames (found by a tester: simulate policed the frames, 800kbit, 14% low). On egress
    the policer meters the frame."""
    police = "match all police rate 800kbit burst 10k drop"
    ingress = policy_text(
        tmp_path, f"interface eth0 {{\n    ingress {{\n        {police}\n    }}\n}}\n"
    )
    flows = [parse_flow("a: udp size 100 rate 2mbit", 0)]
    run = simulate(ingress, flows, 10 * S, direction="ingress")
    assert 0.91 < mbit(run, "a", 5, 10, flow=True) / (0.8 * 100 / 86) < 1.01
    egress = policy_text(
        tmp_path,
        "interface eth0 htb rate 10mbit burst 15k cburst 15k default a {\n"
        f"    class a rate 10mbit {police}\n}}\n",
        "e.tcp",
    )
    run = simulate(egress, flows, 10 * S)
    assert 0.95 < mbit(run, "a", 5, 10, flow=True) / 0.8 < 1.01
