"""The benchmarks run against the installed package, not the source tree: under a regular
(non-editable) install, ``tcdsl.backends`` exists only in the installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Without site processing (-S) the editable install's import hook is absent, as on a machine
# with a regular install; the dependencies come from this environment's site-packages.
PURELIB = sysconfig.get_paths()["purelib"]


def _env(installed: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(installed), PURELIB))}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tcdsl installed as a regular package (a wheel build) into a folder of its own."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"),
            *("--target", str(target), str(ROOT)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot build a regular install here: {done.stderr.strip()[-300:]}")
    return target


def test_compile_bench_runs_against_a_regular_install(installed: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "bench" / "compile_bench.py"), "20"],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "tcdsl compile benchmark" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.split()[:1] == ["20"])
    assert float(row.split()[1]) > 0


def test_compile_bench_times_tcdsl_as_a_process(installed: Path, tmp_path: Path) -> None:
    """--process N runs tcdsl check and compile on a file of N classes, each a process of its
    own, from bytecode it writes first (even with PYTHONDONTWRITEBYTECODE set)."""
    env = {**_env(installed), "PYTHONDONTWRITEBYTECODE": "1"}
    shutil.rmtree(installed / "tcdsl" / "__pycache__")  # pip wrote it
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "bench" / "compile_bench.py"), "--process", "30", "20"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("check", "compile"):
        head = f"tcdsl {command} of 30 classes, whole process: "
        line = next(x for x in done.stdout.splitlines() if x.startswith(head))
        assert float(line.removeprefix(head).split()[0]) > 0
    assert list(installed.glob("tcdsl/__pycache__/driver.*.pyc")), "bytecode was written"


def test_apply_bench_imports_against_a_regular_install(installed: Path, tmp_path: Path) -> None:
    """--help needs no root: it proves the imports (the sibling script and tcdsl) resolve."""
    code = (
        "import runpy, sys; sys.argv = ['apply_bench.py', '--help']; "
        f"sys.path.insert(0, {str(ROOT / 'bench')!r}); "
        f"runpy.run_path({str(ROOT / 'bench' / 'apply_bench.py')!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import tcdsl.backends; print(tcdsl.backends.__file__)"],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(installed)), "the regular install is the one imported"


def test_hash_bench_imports_against_a_regular_install(installed: Path, tmp_path: Path) -> None:
    """bench/hash_bench.py --help needs no root: its imports (tcdsl.u32layout among them)
    resolve in a regular install."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "bench" / "hash_bench.py"), "--help"],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--threshold" in done.stdout


def test_ops_bench_imports_against_a_regular_install(installed: Path, tmp_path: Path) -> None:
    """bench/ops_bench.py --help needs no root: its sibling scripts (apply_bench,
    compile_bench, mq_bench) and tcdsl resolve in a regular install."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "bench" / "ops_bench.py"), "--help"],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_mq_bench_table_gives_the_same_tree_as_its_policy(tmp_path: Path) -> None:
    """bench/mq_bench.py times the subscribers written as classes and taken from a table:
    both compile to the same classes, leaf qdiscs and filters (up to names and order)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import mq_bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from tcdsl.driver import compile_policy

    def commands(text: str, name: str) -> list[str]:
        path = tmp_path / f"{name}.tcp"
        path.write_text(text)
        result = compile_policy(str(path), "tc-batch")
        assert result.output is not None, [d.message for d in result.diagnostics]
        return sorted(line for line in result.output.splitlines() if line and line[0] != "#")

    (tmp_path / "s.csv").write_text(mq_bench.table(40))
    from_table = commands(mq_bench.table_policy("s.csv"), "table")
    assert sum(" pfifo limit 100" in line for line in from_table) == 40
    assert from_table == commands(mq_bench.policy(40, mq=True), "classes")


def test_mq_bench_floors_keep_what_the_kernel_must_build(tmp_path: Path) -> None:
    """bench/mq_bench.py's floors: the classes alone keep the mq, the queues' htbs and every
    class, no leaf and no filter; with their leaves, every leaf qdisc too; both in the
    batch's order."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import mq_bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from tcdsl.driver import compile_policy

    path = tmp_path / "mq.tcp"
    path.write_text(mq_bench.policy(40, mq=True))
    result = compile_policy(str(path), "tc-batch")
    assert result.output is not None
    batch = [line for line in result.output.splitlines() if line and line[0] != "#"]
    alone = mq_bench.classes_only(result.output).splitlines()
    leaves = mq_bench.classes_and_leaves(result.output).splitlines()
    pfifos = [line for line in batch if line.startswith("qdisc add") and " pfifo " in line]
    assert len(pfifos) == 40 and sum(" mq" in line for line in alone) == 1
    assert alone == [
        line
        for line in batch
        if line.startswith("class add") or (line.startswith("qdisc add") and line not in pfifos)
    ]
    assert leaves == [line for line in batch if line.startswith(("class add", "qdisc add"))]
    assert set(pfifos) <= set(leaves) and not any(" u32 " in line for line in leaves)
