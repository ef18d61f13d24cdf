"""Golden tests: every policy x every backend -> tests/golden/<backend>/<name>.<ext>."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tcdsl.backends import BACKENDS

from tcdsl.diagnostics import render
from tcdsl.driver import compile_policy
from tests.conftest import GOLDEN, ROOT, golden_name, policy_files

CASES = [(b, p) for b in sorted(BACKENDS) for p in policy_files()]


def _compile(backend: str, policy: Path) -> str:
    cwd = os.getcwd()
    os.chdir(ROOT)  # golden output names the policy by its repository path
    try:
        result = compile_policy(policy.as_posix(), backend)
    finally:
        os.chdir(cwd)
    if result.output is None:
        return "# rejected\n" + render(result.diagnostics, result.sources)
    return result.output


@pytest.mark.parametrize(("backend", "policy"), CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_golden(backend: str, policy: Path, update_golden: bool) -> None:
    ext = BACKENDS[backend].extension
    golden = GOLDEN / backend / f"{golden_name(policy)}.{ext}"
    actual = _compile(backend, policy)
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual, encoding="utf-8")
        return
    assert golden.exists(), f"no golden file {golden}; run pytest --update-golden"
    assert actual == golden.read_text(encoding="utf-8"), (
        f"{golden} differs; run --update-golden and review"
    )


def test_no_orphan_golden_files() -> None:
    expected = {
        (GOLDEN / b / f"{golden_name(p)}.{BACKENDS[b].extension}")
        for b in BACKENDS
        for p in policy_files()
    }
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    orphans = sorted(str(p.relative_to(ROOT)) for p in present - expected)
    assert not orphans, f"golden files without a policy: {orphans}"


def test_every_policy_compiles_cleanly() -> None:
    """Example policies are documentation: they compile without errors or warnings."""
    for policy in policy_files():
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            result = compile_policy(policy.as_posix())
        finally:
            os.chdir(cwd)
        assert result.output is not None and not result.diagnostics, render(
            result.diagnostics, result.sources
        )


def test_compile_is_deterministic() -> None:
    for policy in policy_files():
        assert _compile("shell", policy) == _compile("shell", policy)
