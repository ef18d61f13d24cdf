"""Golden tests: every policy x every backend -> tests/golden/<backend>/<name>.<ext>."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tcdsl.backends import BACKENDS

from tcdsl.diagnostics import Severity, render
from tcdsl.driver import compile_policy
from tests.conftest import GOLDEN, ROOT, golden_name, policy_files

CASES = [(b, p) for b in sorted(BACKENDS) for p in policy_files()]


def _compile_files(backend: str, policy: Path) -> dict[str, str]:
    """Every output file by name; a rejected policy gives one file with its diagnostics."""
    cwd = os.getcwd()
    os.chdir(ROOT)  # golden output names the policy by its repository path
    try:
        result = compile_policy(policy.as_posix(), backend, stem=golden_name(policy))
    finally:
        os.chdir(cwd)
    if result.output is None:
        name = f"{golden_name(policy)}.{BACKENDS[backend].extension}"
        return {name: "# rejected\n" + render(result.diagnostics, result.sources)}
    return result.files


def _compile(backend: str, policy: Path) -> str:
    return next(iter(_compile_files(backend, policy).values()))


@pytest.mark.parametrize(("backend", "policy"), CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_golden(backend: str, policy: Path, update_golden: bool) -> None:
    for name, actual in _compile_files(backend, policy).items():
        golden = GOLDEN / backend / name
        if update_golden:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(actual, encoding="utf-8")
            continue
        assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
        assert actual == golden.read_text(encoding="utf-8"), (
            f"{golden} differs; run --update-golden and review"
        )


def test_no_orphan_golden_files() -> None:
    expected = {
        GOLDEN / b / name for b in BACKENDS for p in policy_files() for name in _compile_files(b, p)
    }
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
