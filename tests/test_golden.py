"""Golden tests: every policy x every backend -> tests/golden/<backend>/<name>.<ext>, and a few
policies in the shell script's per-command form -> tests/golden/shell-per-command/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tcdsl.backends import BACKENDS

from tcdsl.backend import BackendOptions
from tcdsl.diagnostics import Severity, render
from tcdsl.driver import compile_policy
from tests.conftest import GOLDEN, ROOT, golden_name, policy_files

VARIANTS: dict[str, tuple[str, BackendOptions, tuple[Path, ...]]] = {
    "shell-per-command": (
        "shell",
        BackendOptions(batch=False),
        tuple(Path("policies", n) for n in ("office.tcp", "home-ifb.tcp", "router-marks.tcp")),
    ),
}
"""Golden folders of a backend's other forms: folder -> (backend, options, policies)."""

OUTPUTS: dict[str, tuple[str, BackendOptions | None, tuple[Path, ...]]] = {
    **{b: (b, None, tuple(policy_files())) for b in sorted(BACKENDS)},
    **VARIANTS,
}
CASES = [(o, p) for o, (_, _, policies) in OUTPUTS.items() for p in policies]


def _compile_files(output: str, policy: Path) -> dict[str, str]:
    """Every output file by name; a rejected policy gives one file with its diagnostics."""
    backend, options, _ = OUTPUTS[output]
    cwd = os.getcwd()
    os.chdir(ROOT)  # golden output names the policy by its repository path
    try:
        result = compile_policy(
            policy.as_posix(), backend, options=options, stem=golden_name(policy)
        )
    finally:
        os.chdir(cwd)
    if result.output is None:
        name = f"{golden_name(policy)}.{BACKENDS[backend].extension}"
        return {name: "# rejected\n" + render(result.diagnostics, result.sources)}
    return result.files


def _compile(backend: str, policy: Path) -> str:
    return next(iter(_compile_files(backend, policy).values()))


@pytest.mark.parametrize(("output", "policy"), CASES, ids=[f"{o}-{p}" for o, p in CASES])
def test_golden(output: str, policy: Path, update_golden: bool) -> None:
    for name, actual in _compile_files(output, policy).items():
        golden = GOLDEN / output / name
        if update_golden:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(actual, encoding="utf-8")
            continue
        assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
        assert actual == golden.read_text(encoding="utf-8"), (
            f"{golden} differs; run --update-golden and review"
        )


def test_no_orphan_golden_files() -> None:
    expected = {GOLDEN / o / name for o, p in CASES for name in _compile_files(o, p)}
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    orphans = sorted(str(p.relative_to(ROOT)) for p in present - expected)
    assert not orphans, f"golden files without a policy: {orphans}"


def test_every_policy_compiles_cleanly() -> None:
    """Example policies are documentation: they compile without errors or warnings (advice,
    the info severity, is allowed: the office example borrows, as it should)."""
    for policy in policy_files():
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            result = compile_policy(policy.as_posix())
        finally:
            os.chdir(cwd)
        problems = [d for d in result.diagnostics if d.severity is not Severity.INFO]
        assert result.output is not None and not problems, render(problems, result.sources)


def test_compile_is_deterministic() -> None:
    for policy in policy_files():
        assert _compile("shell", policy) == _compile("shell", policy)
