"""``tcdsl measure`` on this host's kernel: the lab is always removed, a rate-limited flow is
measured at its rate, and the seed scenarios agree with their intent and with the simulator.

Every test needs root and network namespaces (skipped, with the reason, otherwise). The host
kernel lacks sfq and fw, so the seed scenarios run copies of the policies with the sfq leaves
removed (the kernel's default pfifo instead) and, for section 10.2, u32 filters instead of
iptables marks + fw; both copies keep the classes, rates and ceilings the test is about.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tcdsl.driver import Result, compile_policy
from tcdsl.teach.measure import Lab, MeasureError, compare_table, measure, unavailable
from tcdsl.teach.report import Run
from tcdsl.teach.simulate import simulate
from tcdsl.teach.traffic import parse_flow
from tests.conftest import ROOT

why = unavailable()
if why is not None:
    pytest.skip(why, allow_module_level=True)
_probe = subprocess.run(["ip", "netns", "add", "tcdsl-m-probe"], capture_output=True, text=True)
if _probe.returncode != 0:
    pytest.skip(f"no network namespaces: {_probe.stderr.strip()}", allow_module_level=True)
subprocess.run(["ip", "netns", "del", "tcdsl-m-probe"], capture_output=True, check=False)

SEEDS = ROOT / "policies" / "seeds"
S = 1_000_000
MBIT = 1_000_000
TOLERANCE = 0.10
"""Of the link rate: the accuracy goal."""


def namespaces(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def compiled(tmp_path: Path, text: str, name: str = "policy.tcp") -> Result:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path))
    assert result.policy is not None and result.output is not None, result.diagnostics
    return result


def without_sfq(text: str) -> str:
    """The policy with its sfq leaves removed: the host kernel lacks sfq."""
    return re.sub(r" \{\n\s*sfq[^\n]*\n\s*\}", "", text)


# ---- the lab -----------------------------------------------------------------------------------

HTB = """interface eth0 htb rate 10mbit default b {
    class a rate 9mbit ceil 10mbit match dport 5001
    class b rate 1mbit
}
"""


def test_namespaces_are_removed_after_a_failure(tmp_path: Path) -> None:
    result = compiled(tmp_path, HTB)
    assert result.policy is not None
    lab = Lab(prefix="tcdsl-m-fail")
    flows = [parse_flow("x: udp dport 5001 rate 1mbit")]
    with pytest.raises(MeasureError, match="failed"):
        measure(result.policy, "set -eu\nexit 3\n", flows, S, lab=lab)
    assert namespaces("tcdsl-m-fail") == []


def test_one_rate_limited_flow_is_measured_at_its_rate(tmp_path: Path) -> None:
    result = compiled(tmp_path, HTB)
    assert result.policy is not None and result.output is not None
    lab = Lab(prefix="tcdsl-m-rate")
    flows = [parse_flow("x: udp src 10.1.0.1 dst 10.2.0.1 dport 5001 rate 2mbit")]
    run = measure(result.policy, result.output, flows, 3 * S, S // 2, lab=lab)
    assert namespaces("tcdsl-m-rate") == []
    print(compare_table(run, simulate(result.policy, flows, 3 * S, S // 2)))
    for series in (run.series("a"), run.flow("x")):
        assert run.rate_between(series, 0, 3 * S) / MBIT == pytest.approx(2.0, rel=0.10)
    assert sum(run.series("a").drops) == 0


OVERBOOKED = """interface eth0 tbf rate 10mbit burst 32k limit 256k {
    htb rate 10mbit default b {
        class a prio 0 rate 6mbit ceil 10mbit match dport 5001
        class b prio 1 rate 6mbit ceil 10mbit
    }
}
"""


def test_over_booking_shares_are_the_kernels_by_prio(tmp_path: Path) -> None:
    """Found by a tester: W350 said each of two classes of 6mbit on a full 10mbit link gets
    about 83% of its rate, where the kernel serves the lower prio number first (6 and 4): the
    warning's figures now come by prio, and the kernel gives them."""
    result = compiled(tmp_path, OVERBOOKED)
    assert result.policy is not None and result.output is not None
    (w350,) = [d for d in result.diagnostics if d.code == "W350"]
    assert "prio 0 all of their rates, prio 1 about 67% of their rates" in w350.message
    flows = [
        parse_flow("x: udp src 10.1.0.1 dst 10.2.0.1 dport 5001 rate 10mbit"),
        parse_flow("y: udp src 10.1.0.1 dst 10.2.0.1 dport 5002 rate 10mbit"),
    ]
    run = measure(result.policy, result.output, flows, 3 * S, S // 2, lab=Lab(prefix="tcdsl-m-ob"))
    assert namespaces("tcdsl-m-ob") == []
    got = {name: run.rate_between(run.series(name), S, 3 * S) / MBIT for name in ("a", "b")}
    assert got["a"] == pytest.approx(6.0, abs=10 * TOLERANCE), got
    assert got["b"] == pytest.approx(6.0 * 0.67, abs=10 * TOLERANCE), got


HTB6 = """interface eth0 htb rate 10mbit default b {
    class a rate 2mbit ceil 4mbit match dport 5001
    class b rate 1mbit ceil 10mbit
}
"""


def test_an_ipv6_flow_is_held_at_its_class_ceiling(tmp_path: Path) -> None:
    """A greedy IPv6 flow (raw IPv6 socket, addresses on the veth pairs) is classified by the
    policy's IPv6 filter and held at its class's ceiling (4mbit) within 10%. An IPv6 flow
    with a hop-by-hop header in front of UDP misses that u32 filter, as ``classify`` says,
    and goes to the default class; so does TCP behind AH, which the receiver counts as
    ip6tables sees it (protocol 51: it does not look past AH)."""
    result = compiled(tmp_path, HTB6)
    assert result.policy is not None and result.output is not None
    lab = Lab(prefix="tcdsl-m-v6")
    flows = [
        parse_flow("v6: ipv6 udp src 2001:db8:1::1 dst 2001:db8:2::1 dport 5001"),
        parse_flow("hbh: ipv6 hbh udp dst 2001:db8:2::7 dport 5001 rate 3mbit"),
        parse_flow("ah: ipv6 auth tcp dst 2001:db8:2::8 dport 5001 rate 1mbit"),
    ]
    run = measure(result.policy, result.output, flows, 4 * S, S // 2, lab=lab)
    assert namespaces("tcdsl-m-v6") == []
    print(compare_table(run, simulate(result.policy, flows, 4 * S, S // 2)))
    for series in (run.series("a"), run.flow("v6")):
        assert run.rate_between(series, S, 4 * S) / MBIT == pytest.approx(4.0, rel=TOLERANCE)
    assert sum(run.series("a").drops) > 0  # greedy: held at the ceiling, not below it
    for series, mbit in ((run.series("b"), 4.0), (run.flow("hbh"), 3.0), (run.flow("ah"), 1.0)):
        assert run.rate_between(series, S, 4 * S) / MBIT == pytest.approx(mbit, rel=TOLERANCE)


# ---- the seed scenarios ------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """What the policy means: ``cls`` sends ``mbit`` between ``start`` and ``stop`` (s)."""

    cls: str
    start: float
    stop: float
    mbit: float


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: str
    """The policy text (a host-ready copy of a seed)."""
    flows: tuple[str, ...]
    seconds: float
    intents: tuple[Intent, ...]
    interval: float = 0.5


def _seed(name: str) -> str:
    return (SEEDS / name).read_text(encoding="utf-8")


def _s001() -> str:
    text = _seed("s001-htb-700-300.tcp")
    return text.replace("700mbit", "7mbit").replace("300mbit", "3mbit").replace("1gbit", "10mbit")


def _s102() -> str:
    """Section 10.2 classified by u32 (the host lacks fw): the marks' matches as filters."""
    text = without_sfq(_seed("s000-10.2-marks-sharing.tcp"))
    return text.replace("    classify by mark from eth1 chain INSHAPER\n", "")


SCENARIOS = [
    Scenario(
        "s001 lab at 10mbit",
        _s001(),
        ("h1: tcp src 10.0.0.1 dst 10.0.0.3", "h2: tcp src 10.0.0.2 dst 10.0.0.4 start 2s stop 4s"),
        6,
        (
            Intent("h1", 0.5, 2, 10),  # alone: the whole link
            Intent("h1", 2.5, 4, 7),
            Intent("h2", 2.5, 4, 3),
            Intent("h1", 4.5, 6, 10),
        ),
    ),
    Scenario(
        "s000 8.1 (no sfq)",
        without_sfq(_seed("s000-8.1-user-limits.tcp")),
        ("u5: tcp src 10.3.34.11", "u6: tcp src 10.3.34.33", "u7: tcp src 10.3.34.77"),
        4,
        (Intent("u5", 0.5, 4, 6), Intent("u6", 0.5, 4, 3), Intent("others", 0.5, 4, 1)),
    ),
    Scenario(
        "s000 8.2 (no sfq)",
        without_sfq(_seed("s000-8.2-borrowing.tcp")),
        ("u5: tcp src 10.3.34.11", "u6: tcp src 10.3.34.33", "u7: tcp src 10.3.34.77"),
        4,
        (Intent("u5", 0.5, 4, 15), Intent("u6", 0.5, 4, 10), Intent("others", 0.5, 4, 5)),
    ),
    Scenario(
        "s000 10.2 (u32, no sfq)",
        _s102(),
        ("a: tcp dport 5001", "b: tcp dport 5002 start 2s", "c: tcp dport 80 start 4s"),
        6,
        (
            Intent("app5001", 0.5, 2, 3),  # alone: its ceil
            Intent("app5001", 2.5, 4, 2.5),  # equal prio and quantum: the spare 1mbit halved
            Intent("app5002", 2.5, 4, 2.5),
            Intent("app5001", 4.5, 6, 2),  # all three: their rates
            Intent("app5002", 4.5, 6, 2),
            Intent("others", 4.5, 6, 1),
        ),
    ),
]


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    measured: Run
    simulated: Run


def rows(outcome: Outcome, intents: tuple[Intent, ...] | None = None) -> list[tuple[object, ...]]:
    """(scenario, class, span, intended, simulated, measured) in Mbit/s."""
    m, s = outcome.measured, outcome.simulated
    out: list[tuple[object, ...]] = []
    for i in intents if intents is not None else outcome.scenario.intents:
        a, b = int(i.start * S), int(i.stop * S)
        meas = m.rate_between(m.series(i.cls), a, b) / MBIT
        sim = s.rate_between(s.series(i.cls), a, b) / MBIT
        out.append((outcome.scenario.name, i.cls, f"{i.start:g}-{i.stop:g}s", i.mbit, sim, meas))
    return out


def problems(outcome: Outcome, intents: tuple[Intent, ...] | None = None) -> list[str]:
    """Classes whose measured throughput is off the intent or the simulation by more than
    TOLERANCE of the link."""
    link = outcome.measured.link / MBIT
    found = []
    for name, cls, span, want, sim, meas in rows(outcome, intents):
        assert isinstance(want, float | int) and isinstance(sim, float)
        assert isinstance(meas, float)
        if abs(meas - want) > TOLERANCE * link:
            found.append(f"{name}: {cls} {span} measured {meas:.2f}, intended {want:g}")
        if abs(meas - sim) > TOLERANCE * link:
            found.append(f"{name}: {cls} {span} measured {meas:.2f}, simulated {sim:.2f}")
    return found


def print_rows(outcome: Outcome) -> None:
    print(
        f"\n{'scenario':<26}{'class':<9}{'span':<10}{'intended':>9}{'simulated':>10}{'measured':>9}"
    )
    for name, cls, span, want, sim, meas in rows(outcome):
        print(f"{name:<26}{cls!s:<9}{span!s:<10}{want:>9g}{sim:>10.2f}{meas:>9.2f}")


_outcomes: dict[str, Outcome] = {}


def run_scenario(tmp_path: Path, scenario: Scenario) -> Outcome:
    if scenario.name in _outcomes:
        return _outcomes[scenario.name]
    result = compiled(tmp_path, scenario.policy, "seed.tcp")
    assert result.policy is not None and result.output is not None
    flows = [parse_flow(f, i) for i, f in enumerate(scenario.flows)]
    duration, interval = int(scenario.seconds * S), int(scenario.interval * S)
    measured = measure(result.policy, result.output, flows, duration, interval)
    simulated = simulate(result.policy, flows, duration, interval)
    _outcomes[scenario.name] = outcome = Outcome(scenario, measured, simulated)
    return outcome


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_seed_scenario_measured_as_intended_and_simulated(
    tmp_path: Path, scenario: Scenario
) -> None:
    outcome = run_scenario(tmp_path, scenario)
    print(compare_table(outcome.measured, outcome.simulated))
    print_rows(outcome)
    assert not problems(outcome)


def test_a_wrong_intent_fails(tmp_path: Path) -> None:
    """The check can fail: the s001 lab with h1 meant to get 5mbit next to h2, not 7."""
    outcome = run_scenario(tmp_path, SCENARIOS[0])
    wrong = (Intent("h1", 2.5, 4, 5),)
    assert problems(outcome, wrong) == [
        f"s001 lab at 10mbit: h1 2.5-4s measured {rows(outcome, wrong)[0][5]:.2f}, intended 5"
    ]


# ---- the command -------------------------------------------------------------------------------


def test_cli_refuses_a_qdisc_the_host_lacks() -> None:
    from click.testing import CliRunner

    from tcdsl.cli import cli

    seed = str(SEEDS / "s000-8.1-user-limits.tcp")
    res = CliRunner().invoke(cli, ["measure", seed, "--flow", "u5: tcp src 10.3.34.11"])
    assert res.exit_code == 1, res.output
    assert "lacks the sfq qdisc" in res.output and "Traceback" not in res.output


def test_cli_json_with_the_simulation(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from tcdsl.cli import cli

    path = tmp_path / "p.tcp"
    path.write_text(HTB, encoding="utf-8")
    args = ["measure", str(path), "--flow", "x: udp dport 5001 rate 3mbit", "--duration", "2s"]
    res = CliRunner().invoke(cli, [*args, "--simulate", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data) == {"measured", "simulated"}
    for run in data.values():
        assert run["classes"][0]["name"] == "a"
        assert run["classes"][0]["mean_bps"] == pytest.approx(3 * MBIT, rel=0.1)
