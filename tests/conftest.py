"""Shared test fixtures: the repository layout and the --update-golden switch."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "policies"
GOLDEN = ROOT / "tests" / "golden"
DIAGNOSTICS = ROOT / "tests" / "diagnostics"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="Rewrite golden files from the current compiler output (review with git diff).",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def policy_files() -> list[Path]:
    """Every example policy, relative to the repository root, sorted."""
    return sorted(p.relative_to(ROOT) for p in POLICIES.rglob("*.tcp"))


def golden_name(policy: Path) -> str:
    """``policies/seeds/x.tcp`` -> ``seeds--x`` (golden files live in one flat folder)."""
    return "--".join(policy.relative_to("policies").with_suffix("").parts)
