"""Shared test fixtures: the repository layout, the --update-golden switch and the guest's
packet sender."""

from __future__ import annotations

import shutil
import subprocess
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


def flower_batch_in_guest(batch: str) -> str:
    """Apply ``batch`` (a tc-batch file for ``eth0``) in the user-mode Linux guest, whose kernel
    has flower (the host's has not), and return ``tc filter show dev eth0 parent 1:``; skip
    with the reason when the guest cannot run."""
    from tcdsl.kernels import uml
    from tcdsl.verify import runner

    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    guest = (
        "ip link add name eth0 type veth peer name peer0\n"
        "cat > flower.batch <<'TCDSL_BATCH'\n" + batch + "TCDSL_BATCH\n"
        "tc -batch flower.batch\n"
        "tc filter show dev eth0 parent 1:\n"
    )
    (res,) = uml.run_cases([uml.Case("flower", guest)], timeout=300)
    assert res.exit_code == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture(scope="session")
def guest_sender(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """tests/packet_sender.c, compiled for the guest (no C library: a static program of a few
    kilobytes)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the guest's packet sender")
    out = tmp_path_factory.mktemp("sender") / "sender"
    source = Path(__file__).parent / "packet_sender.c"
    flags = "-static -nostdlib -no-pie -Os -ffreestanding -fno-builtin -fno-stack-protector"
    flags += " -fno-asynchronous-unwind-tables -Wl,--build-id=none -s"
    proc = subprocess.run(
        [cc, *flags.split(), "-o", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"the guest's packet sender does not compile here: {proc.stderr[-500:]}")
    return out.read_bytes()
