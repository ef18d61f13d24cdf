"""Boundaries of the checks for values tc or the kernel does not keep as written.

Each rule is tested on both sides, the largest value accepted and the smallest one reported, so
that a bound off by one fails. The values were found by the property tests on real kernels
(tests/strategies.py, the KNOWN BUG block); the bounds are computed as tc 6.1 and Linux 6.1 do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tcdsl.driver import analyse

HTB = "interface eth0 htb rate 10gbit {{\n    class a {}\n}}\n"
LEAF = "interface eth0 htb rate 10gbit {{\n    class a rate 1gbit {{ {} }}\n}}\n"
ROOT = "interface eth0 {}\n"

# rule: (template, largest accepted, smallest reported, code, the option reported at)
BOUNDS: dict[str, tuple[str, str, str, str, str]] = {
    # tc_calc_xmittime: at 1e6 bytes/s, 274877906us fits 32 bits of 64-ns ticks, 274877907us not
    "htb burst 8mbit": (
        HTB,
        "rate 8mbit burst 274877906",
        "rate 8mbit burst 274877907",
        "E208",
        "burst",
    ),
    "htb burst 8bit": (HTB, "rate 8bit burst 274", "rate 8bit burst 275", "E208", "burst"),
    "htb cburst": (
        HTB,
        "rate 8bit ceil 16bit cburst 549",
        "rate 8bit ceil 16bit cburst 550",
        "E208",
        "cburst",
    ),
    "htb quantum": (
        HTB,
        "rate 1mbit quantum 2147483647",
        "rate 1mbit quantum 2147483648",
        "E205",
        "quantum",
    ),
    "fq_codel quantum high": (
        LEAF,
        "fq_codel quantum 1048576",
        "fq_codel quantum 1048577",
        "E205",
        "quantum",
    ),
    "fq_codel quantum low": (
        LEAF,
        "fq_codel quantum 256",
        "fq_codel quantum 255",
        "W330",
        "quantum",
    ),
    "fq_codel memory_limit": (
        LEAF,
        "fq_codel memory_limit 2147483648",
        "fq_codel memory_limit 2147483649",
        "W330",
        "memory_limit",
    ),
    "fq_codel memory_limit not given": (
        LEAF,
        "fq_codel memory_limit 4294967294",
        "fq_codel memory_limit 4294967295",
        "E208",
        "memory_limit",
    ),
    "fq_codel limit": (LEAF, "fq_codel limit 1", "fq_codel limit 0", "E208", "limit"),
    "fq_codel target": (LEAF, "fq_codel target 1us", "fq_codel target 0us", "E208", "target"),
    "fq_codel interval": (
        LEAF,
        "fq_codel interval 1us",
        "fq_codel interval 0us",
        "E208",
        "interval",
    ),
    "sfq limit": (LEAF, "sfq limit 2", "sfq limit 1", "E205", "limit"),
    "sfq perturb": (LEAF, "sfq perturb 2147483", "sfq perturb 2147484", "E205", "perturb"),
    "sfq quantum": (LEAF, "sfq quantum 2147483647", "sfq quantum 2147483648", "E205", "quantum"),
    # get_ticks: 274877906us * 15.625 < 2^32 <= 274877907us * 15.625
    "netem delay": (LEAF, "netem delay 274877906us", "netem delay 274877907us", "E205", "delay"),
    "netem jitter refused": (
        LEAF,
        "netem delay 1s jitter 274877906us",
        "netem delay 1s jitter 274877907us",
        "E205",
        "jitter",
    ),
    # int(us * 15.625) * 64 ns <= INT_MAX
    "netem jitter lowered": (
        LEAF,
        "netem delay 1s jitter 2147483us",
        "netem delay 1s jitter 2147484us",
        "W330",
        "jitter",
    ),
    "tbf latency 0": (
        ROOT,
        "tbf rate 1mbit burst 10k latency 1us",
        "tbf rate 1mbit burst 10k latency 0us",
        "E208",
        "latency",
    ),
    "tbf limit 0": (
        ROOT,
        "tbf rate 1mbit burst 10k limit 1",
        "tbf rate 1mbit burst 10k limit 0",
        "E208",
        "limit",
    ),
    # at 1e6 bytes/s tc's limit is exactly latency (us) + burst
    "tbf latency limit": (
        ROOT,
        "tbf rate 8mbit burst 1000 latency 4294966295us",
        "tbf rate 8mbit burst 1000 latency 4294966296us",
        "E208",
        "latency",
    ),
    # with a peak rate tc takes the smaller limit: here the peak's, latency + mtu
    "tbf latency limit peakrate": (
        ROOT,
        "tbf rate 16mbit burst 1000 latency 4294966295us peakrate 8mbit mtu 1000",
        "tbf rate 16mbit burst 1000 latency 4294966296us peakrate 8mbit mtu 1000",
        "E208",
        "latency",
    ),
    # the kernel reports psched_l2t_ns(rate, size) >> 6 in 32 bits
    "tbf burst": (
        ROOT,
        "tbf rate 8mbit burst 274877906 limit 1",
        "tbf rate 8mbit burst 274877907 limit 1",
        "W330",
        "burst",
    ),
    "tbf mtu": (
        ROOT,
        "tbf rate 8mbit burst 1000 limit 1 peakrate 8bit mtu 274",
        "tbf rate 8mbit burst 1000 limit 1 peakrate 8bit mtu 275",
        "W330",
        "mtu",
    ),
}


def reported(tmp_path: Path, text: str, code: str, option: str) -> bool:
    """Whether ``code`` is reported at the value of the last ``option`` in the policy."""
    path = tmp_path / "policy.tcp"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if f" {option} " in t)
    row = text.splitlines()[line - 1]
    column = row.rindex(f" {option} ") + len(option) + 3
    return any(
        d.code == code and d.span.line == line and d.span.column == column
        for d in analyse(str(path)).diagnostics
    )


@pytest.mark.parametrize("rule", BOUNDS)
def test_bound(tmp_path: Path, rule: str) -> None:
    template, accepted, refused, code, option = BOUNDS[rule]
    assert not reported(tmp_path, template.format(accepted), code, option), accepted
    assert reported(tmp_path, template.format(refused), code, option), refused


def test_prio_bands_2_needs_a_priomap(tmp_path: Path) -> None:
    bare = "interface eth0 prio bands {} {{\n    class a\n}}\n"
    assert reported(tmp_path, bare.format(2), "E205", "bands")
    assert not reported(tmp_path, bare.format(3), "E205", "bands")
    mapped = bare.format("2 priomap" + " 1" * 16)
    assert not reported(tmp_path, mapped, "E205", "bands")


@pytest.mark.parametrize(
    ("first", "second", "refused"),
    [
        ("delay 1ms", "duplicate 1%", True),
        ("duplicate 1%", "delay 1ms", True),
        ("duplicate 0%", "delay 1ms", False),
        ("delay 1ms", "loss 1%", False),
    ],
)
def test_duplicating_netem_with_another(
    tmp_path: Path, first: str, second: str, refused: bool
) -> None:
    text = (
        f"interface eth0 prio {{\n    class a {{ netem {first} }}\n"
        f"    class b {{ netem {second} }}\n}}\n"
    )
    path = tmp_path / "policy.tcp"
    path.write_text(text)
    found = [d for d in analyse(str(path)).diagnostics if d.code == "E208"]
    assert bool(found) is refused
    if refused:
        assert found[0].span.line == 3
        assert found[0].notes[0].span.line == 2
