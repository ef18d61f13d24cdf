"""Property: a valid generated policy, applied to a real kernel, reads back equal to its IR.

``tests/strategies.py`` writes valid policies; ``tcdsl verify`` compiles each, applies the
script in a throwaway network namespace and compares what the kernel holds with what the policy
says. It must report nothing at all: no difference (E401-E403), no failed command (E404), no
tool warning (W406; htb quantum warnings are avoided by giving such classes a quantum), and no
compiler warning either.

- Host kernel: one hypothesis example per policy (a namespace each, ~0.15 s), so that a
  disagreement is shrunk to a small policy. Needs root; skipped otherwise.
- User-mode Linux: a batch drawn up front (``random_policies``, seeded) and verified in one
  boot (~1.5 s to boot, ~1.2 s a policy there); a failure lists every policy that disagrees,
  with its diagnostics. Skipped where user-mode Linux cannot run.
- No kernel: the generated policies compile without a diagnostic.

Both kernel runs also check that the policies drawn use every feature in FEATURES.

CI runs 200 host and 100 user-mode Linux policies, the same ones every run. ``make fuzz``
draws new ones, many more: ``TCDSL_FUZZ_EXAMPLES`` host policies and a quarter of that (at
least 100, or ``TCDSL_FUZZ_UML_EXAMPLES``) in user-mode Linux; ``TCDSL_FUZZ_SEED`` (printed)
repeats the batch, ``--hypothesis-seed`` the host run.

Each kernel test prints its wall time (``pytest -s`` or ``-rP`` shows it).
"""

from __future__ import annotations

import os
import random
import re
import shlex
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcdsl.diagnostics import Diagnostic, Severity, render
from tcdsl.verify import verifier
from tcdsl.verify.verifier import Verification
from tests.strategies import Kernel, Policy, random_policies, verifiable_policies
from tests.test_properties import compile_text
from tests.test_verify import _host, _uml

LINT_ADVICE = frozenset(
    re.findall(r'"(W3\d\d)"', (Path(__file__).parent.parent / "tcdsl" / "lint.py").read_text())
)
"""The lints' warnings: advice on what a policy does (a fifo of limit 0 drops everything),
not a disagreement with the kernel. The generator draws such edge values on purpose."""


ADVICE = LINT_ADVICE | {"W309", "W323"}
"""With the checks' advice: a class capped by its leaf's rate (W309); and the reader's: a
size in bit units (W323), which the generator writes on purpose."""


def _advice(d: Diagnostic) -> bool:
    """Advice, not a disagreement with the kernel: the lints', W309, W330 for an address
    with host bits set (the kernel holds the network, as the policy says), and W301 for a
    ceil above what a class with no parent to borrow from sends (a root class's rate: the
    kernel holds the ceil, which is never reached; the generator's draws are kept as they
    were)."""
    return (
        d.code in ADVICE
        or (d.code == "W330" and "has host bits set" in d.message)
        or (d.code == "W301" and ("a root class" in d.message or "no parent to" in d.message))
    )


def _problems(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The diagnostics that are not advice."""
    return [d for d in diagnostics if not _advice(d) and d.severity is not Severity.INFO]


def _env_int(name: str) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else 0


FUZZ = _env_int("TCDSL_FUZZ_EXAMPLES")
HOST_EXAMPLES = FUZZ or 200
UML_EXAMPLES = _env_int("TCDSL_FUZZ_UML_EXAMPLES") or max(100, FUZZ // 4)
DERANDOMIZE = not FUZZ
"""CI draws the same policies every run; fuzzing draws new ones."""
SEED = _env_int("TCDSL_FUZZ_SEED") or (random.randrange(1, 2**32) if FUZZ else 0)
"""The seed of the user-mode Linux batch."""
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
HOST_NEEDS = ("htb", "tbf", "pfifo", "bfifo", "pfifo_fast")


def _report(policy: str, v: Verification) -> str:
    """A failing policy, readable: its text, the diagnostics, what the case printed."""
    where = v.kernel or "no kernel"
    said = render(v.diagnostics, v.sources) if v.diagnostics else "(no diagnostics)"
    out = f"---- {v.path} ({where})\n{policy}---- verify says:\n{said}"
    if v.kernel is None or any(d.code in ("E404", "W406") for d in v.diagnostics):
        out += f"\n---- the case printed:\n{v.output[-4000:]}"
    return out


def _timed(what: str, start: float, count: int) -> None:
    took = time.monotonic() - start
    print(f"\n{what}: {count} policies in {took:.1f} s ({took / max(count, 1) * 1000:.0f} ms each)")


def _draw(kernel: Kernel, count: int) -> list[Policy]:
    """``count`` different policies for a batch: the same ones every run in CI, new ones when
    fuzzing (the seed is printed)."""
    policies = random_policies(kernel, count, SEED)
    assert len(policies) == count, f"the generator made only {len(policies)} different policies"
    if FUZZ:
        print(f"\n{kernel} batch: TCDSL_FUZZ_SEED={SEED}")
    return policies


# ==== the generator itself (no kernel) ========================================================

ROOT = r"^(?:interface \S+|    (?:upload|download(?: via \S+)?(?: connmark)?))"
"""The start of a root qdisc's line: an interface's, or one of its directions'."""

FEATURES: dict[Kernel, dict[str, str]] = {
    "host": {
        "htb root": ROOT + r" htb",
        "tbf root": ROOT + r" tbf",
        "fifo root": ROOT + r" (pfifo|bfifo|pfifo_fast)",
        "link class": ROOT + r" htb.* rate ",
        "nested class": r"^ {8}class ",
        "three levels": r"^ {12}class ",
        "percentage": r"class .*(rate|ceil) [\d.]+%",
        "ceil": r"class .* ceil ",
        "burst": r" c?burst ",
        "quantum": r" quantum ",
        "r2q": r" r2q ",
        "prio": r"class .* prio [0-7]",
        "class id": r" id [0-9a-f]+:[0-9a-f]+ ",
        "qdisc handle": r" handle [0-9a-f]+: ",
        "default": r" default ",
        "constant": r"^const ",
        "src/dst": r"match .*(src|dst) \d",
        "port list": r"match .*port \S+, ",
        "port range": r"match .*port \d+-\d+",
        "port mask": r"match .*port \d+/0x",
        "proto": r"match .*proto ",
        "tos": r"match .*tos ",
        "dscp": r"match .*dscp ",
        "tcp-ack": r"match .*tcp-ack",
        "raw u8": r"match .*u8 ",
        "raw u16": r"match .*u16 ",
        "raw u32": r"match .*u32 ",
        "all": r"match all",
        "pref": r"match .* pref \d+",
        "pfifo leaf": r"^ +pfifo",
        "bfifo leaf": r"^ +bfifo",
        "tbf leaf": r"^ +tbf",
        "tbf peakrate": r"tbf .*peakrate",
        "child of tbf": r"^ +tbf .*\{$",
        "two interfaces": r"(?s)^interface .*^interface ",
        "upload": r"^    upload ",
        "download": r"^    download ",
        "download via": r"^    download via ",
        "size table": ROOT + r" (htb|tbf).* overhead ",
        "overhead preset": ROOT + r".* overhead [a-z]",
        "linklayer": ROOT + r".* linklayer ",
        "table tsize": ROOT + r".* tsize ",
        # dual stack (issue 11): u32 filters of both families, and of one
        "IPv6 address": r"(?:match .*(?:src|dst) |^const \S+ = )[0-9a-fA-F.]*:",
        "family on a tree": ROOT + r" family (?:ipv4|ipv6|both)",
        "family on a match line": r"match .*family (?:ipv4|ipv6|both)",
    },
    "uml": {
        "prio root": ROOT + r" prio",
        "bands": ROOT + r" prio.* bands ",
        "priomap": ROOT + r" prio.* priomap ",
        "netem root": ROOT + r" netem",
        "sfq leaf": r"^ +sfq",
        "fq_codel leaf": r"^ +fq_codel",
        "codel leaf": r"^ +codel",
        "fq leaf": r"^ +fq( |$)",
        "red leaf": r"^ +red ",
        "netem leaf": r"^ +netem",
        "netem duplicate": r"netem .*duplicate ",
        "netem reorder": r"netem .*reorder ",
        "netem distribution": r"netem .*distribution ",
        "netem slot": r"netem .*slot ",
        "classify by mark": r"classify by mark from eth1",
        "chain": r"classify by mark from eth1 chain ",
        "mark": r"class .* mark \d+",
        "ports with marks": r"(?s)classify by mark.*match proto (tcp|udp).*port",
        "ingress policers": r"(?s)^    ingress \{\n +match .* police ",
        "police on a class": r"class .*match .* police ",
        "police mtu": r" police .* mtu ",
        "police continue": r" police .* continue$",
        "connmark": r"^    download.* connmark ",
        "hfsc root": ROOT + r" hfsc",
        "hfsc rt": r"class .* rt m",
        "hfsc sc": r"class .* sc ",
        "hfsc ul": r"class .* ul ",
        "hfsc m1 d m2": r" m1 \S+ d \S+ m2 ",
        "hfsc umax": r" umax \S+ dmax ",
        "hfsc nested": r"(?s)hfsc.*\n {8}class ",
        "cake root": ROOT + r" cake",
        "cake leaf": r"^ +(class .*\{ )?cake",
        "cake overhead": r"cake .*overhead ",
        "cake rtt": r"cake .*rtt ",
        # dual stack (issue 11): flower filters of both families (the host has no flower)
        "classifier flower": r" classifier flower",
        "flower port": r"(?s)classifier flower.*\n +(?:class .*)?match .*port \d",
    },
}


def _covers(kernel: Kernel, texts: Iterable[str]) -> None:
    """Guard the generator: the policies drawn for ``kernel`` use each of its FEATURES (in a
    run of CI's size or larger; a short fuzz run may miss some)."""
    texts = list(texts)
    if len(texts) < {"host": 200, "uml": 100}[kernel]:
        return
    missing = [
        name
        for name, pattern in FEATURES[kernel].items()
        if not any(re.search(pattern, t, re.M) for t in texts)
    ]
    assert not missing, f"none of the {len(texts)} {kernel} policies has: {', '.join(missing)}"


@pytest.mark.parametrize("kernel", ["host", "uml"])
def test_generated_policies_compile_without_a_diagnostic(kernel: Kernel) -> None:
    """Where no kernel can run them, the policies are at least valid and warning-free."""
    for policy in _draw(kernel, 40):
        result = compile_text(policy.text)
        assert not _problems(result.diagnostics), (
            f"{policy.text}\n{render(result.diagnostics, result.sources)}"
        )


# ==== the host kernel: one namespace per example ==============================================


def test_generated_policies_agree_with_the_host_kernel() -> None:
    support = _host()
    lacks = [q for q in HOST_NEEDS if q not in support.qdiscs]
    lacks += [f for f in ("u32",) if f not in support.filters]
    if lacks:
        pytest.skip(f"the host kernel ({support.release}) lacks {', '.join(lacks)}")

    seen: set[str] = set()
    failing: list[str] = []

    # Different draws often write the same policy (a choice that changes nothing), and a
    # policy verified once is not verified again: twice the examples make sure of
    # HOST_EXAMPLES different policies.
    @settings(
        max_examples=2 * HOST_EXAMPLES,
        derandomize=DERANDOMIZE,
        database=None,
        deadline=None,
        suppress_health_check=SLOW,
    )
    @given(verifiable_policies("host"))
    def agrees(policy: Policy) -> None:
        if not failing and (policy.text in seen or len(seen) >= HOST_EXAMPLES):
            return
        seen.add(policy.text)
        with tempfile.TemporaryDirectory(prefix="tcdsl-property-") as tmp:
            path = Path(tmp) / "policy.tcp"
            path.write_text(policy.text, encoding="utf-8")
            v = verifier.verify(str(path), kernel="host")
        if v.kernel is None or _problems(v.diagnostics):
            seen.clear()  # from now on hypothesis shrinks: verify whatever it asks for
            failing.append(policy.text)
        assert v.kernel is not None and not _problems(v.diagnostics), _report(policy.text, v)
        assert v.checked.qdiscs >= 1

    start = time.monotonic()
    agrees()
    _timed("host kernel, a namespace per policy", start, len(seen))
    assert len(seen) == HOST_EXAMPLES, f"only {len(seen)} different policies were drawn"
    _covers("host", seen)


# ==== user-mode Linux: every policy in one boot ===============================================


def test_generated_policies_agree_with_user_mode_linux(tmp_path: Path) -> None:
    _uml()
    start = time.monotonic()
    policies = _draw("uml", UML_EXAMPLES)
    paths = []
    for n, policy in enumerate(policies):
        path = tmp_path / f"p{n:04d}.tcp"
        path.write_text(policy.text, encoding="utf-8")
        paths.append(str(path))
    results = verifier.verify_many(paths, kernel="uml")
    _timed("user-mode Linux, one boot", start, len(paths))
    failed = [
        _report(p.text, v)
        for p, v in zip(policies, results, strict=True)
        if v.kernel is None or _problems(v.diagnostics)
    ]
    assert not failed, (
        f"{len(failed)} of {len(paths)} generated policies disagree with the kernel:\n\n"
        + "\n\n".join(failed)
    )
    assert all(v.kernel and v.kernel.startswith("user-mode Linux") for v in results)
    _covers("uml", (p.text for p in policies))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=" \t\r\n\x0b\xa0#'\"\\$ab1:", max_size=30))
def test_shell_words_split_as_shlex(line: str) -> None:
    """A command's words for matching a step to its policy line: shlex's, also on the quick
    path for lines with nothing quoted (blanks are only space, tab and line ends)."""
    from tcdsl.verify.compare import shell_words

    try:
        expected = " ".join(shlex.split(line))
    except ValueError:
        expected = line.strip()
    assert shell_words(line) == expected
