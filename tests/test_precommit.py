"""The pre-commit hooks of .pre-commit-hooks.yaml.

Each hook's `entry` is run the way pre-commit runs it: split like a shell would, with the file
names appended, from the environment tcdsl is installed in. A last test runs the real
`pre-commit try-repo` on a snapshot of this work tree; pre-commit then builds a virtualenv and
pip-installs tcdsl into it, which needs the package index (it is skipped, saying why, when
pre-commit is missing or the install cannot reach the index).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / ".pre-commit-hooks.yaml"
GOOD = ROOT / "policies" / "office.tcp"
BAD_CASE = ROOT / "tests" / "diagnostics" / "E007-unknown-parameter.tcp"
BAD_MESSAGE = "'latency' is not a parameter of an htb class"


def _hooks() -> dict[str, dict[str, Any]]:
    hooks = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert isinstance(hooks, list)
    return {hook["id"]: hook for hook in hooks}


HOOKS = _hooks()


def _tcdsl() -> list[str]:
    """How to start the `tcdsl` console script (setup.cfg: tcdsl = tcdsl.__main__:entry) of the
    environment these tests run in."""
    script = Path(sys.executable).parent / "tcdsl"
    if script.exists():
        return [str(script)]
    found = shutil.which("tcdsl")
    if found:
        return [found]
    return [sys.executable, "-m", "tcdsl"]


def run_entry(hook_id: str, files: list[Path]) -> subprocess.CompletedProcess[str]:
    """Run a hook's entry as pre-commit does: shlex-split, file names appended."""
    argv = shlex.split(HOOKS[hook_id]["entry"])
    assert argv[0] == "tcdsl", "the hooks run the package's console script"
    return subprocess.run(
        [*_tcdsl(), *argv[1:], *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _fmt_missing() -> str | None:
    done = subprocess.run(
        [*_tcdsl(), "fmt", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        return f"`tcdsl fmt --help` exits {done.returncode}: the fmt command is not there yet"
    return None


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """A copy of a diagnostics case with an error (E007)."""
    path = tmp_path / "bad.tcp"
    shutil.copyfile(BAD_CASE, path)
    return path


def test_manifest_declares_the_hooks() -> None:
    assert set(HOOKS) == {"tcdsl-check", "tcdsl-fmt"}
    assert HOOKS["tcdsl-check"]["entry"] == "tcdsl check"
    assert HOOKS["tcdsl-fmt"]["entry"] == "tcdsl fmt --check"
    for hook in HOOKS.values():
        assert {"id", "name", "entry", "language", "files"} <= set(hook)
        assert hook["language"] == "python"
        assert hook["pass_filenames"] is True
        # pre-commit matches `files` with re.search on paths relative to the repository root.
        files = re.compile(hook["files"])
        assert files.search("policies/office.tcp") and files.search("a.tcp")
        assert not files.search("a.tcpx") and not files.search("tcp.py")


def test_check_hook_passes_a_good_policy() -> None:
    done = run_entry("tcdsl-check", [GOOD])
    assert done.returncode == 0, done.stderr


def test_check_hook_fails_a_bad_policy(bad: Path) -> None:
    done = run_entry("tcdsl-check", [GOOD, bad])
    assert done.returncode == 1
    assert BAD_MESSAGE in done.stderr and "[E007]" in done.stderr
    assert str(bad) in done.stderr
    assert not re.search(re.escape(str(GOOD)) + r":\d+:\d+: error", done.stderr)


def test_fmt_hook(tmp_path: Path) -> None:
    reason = _fmt_missing()
    if reason:
        pytest.skip(reason)
    formatted = tmp_path / "formatted.tcp"
    shutil.copyfile(GOOD, formatted)
    subprocess.run([*_tcdsl(), "fmt", str(formatted)], check=True, capture_output=True)
    layout = formatted.read_text(encoding="utf-8")
    done = run_entry("tcdsl-fmt", [formatted])
    assert done.returncode == 0, done.stdout + done.stderr
    # A file `tcdsl fmt` would change fails the hook, and --check leaves it as it is.
    messy = tmp_path / "messy.tcp"
    assert "\n    class " in layout
    messy.write_text(layout.replace("\n    class ", "\n    class   ", 1), encoding="utf-8")
    done = run_entry("tcdsl-fmt", [formatted, messy])
    assert done.returncode == 1
    assert "messy.tcp" in done.stdout + done.stderr
    assert "formatted.tcp" not in done.stdout + done.stderr
    assert messy.read_text(encoding="utf-8") == layout.replace("\n    class ", "\n    class   ", 1)
    # So does a file that does not parse.
    broken = tmp_path / "broken.tcp"
    broken.write_text("interface eth0 htb {\n  class a rate\n}\n", encoding="utf-8")
    assert run_entry("tcdsl-fmt", [formatted, broken]).returncode == 1


# ---- the real pre-commit ---------------------------------------------------------------------

NETWORK_TROUBLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Network is unreachable|No matching distribution found|ProxyError|"
    r"Read timed out|Could not fetch URL|ConnectTimeout"
)


def _git(*args: str, cwd: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _snapshot(dest: Path) -> Path:
    """This work tree's files as they are on disk (tracked, and untracked ones git does not
    ignore), committed in a repository of their own. `pre-commit try-repo` on a local path
    takes HEAD plus the uncommitted changes to tracked files, but no untracked file (a new
    module, or the hook manifest before it is committed); the snapshot makes it take the
    files the other tests test."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = {n for n in listed.split("\0") if n} | {MANIFEST.name}
    for name in sorted(names):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    _git("init", "-q", cwd=dest)
    _git("add", "-A", cwd=dest)
    _git("commit", "-q", "-m", "snapshot", cwd=dest)
    return dest


PRE_COMMIT = [sys.executable, "-m", "pre_commit"]
USER_FILES = ["good.tcp", "bad.tcp", "notes.txt"]


def test_pre_commit_try_repo(tmp_path: Path) -> None:
    """`pre-commit try-repo REPO tcdsl-check --files GOOD BAD`, as a user would try the hook.

    It takes 15-30 s here, most of it pip installing tcdsl into pre-commit's virtualenv."""
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        pytest.skip("pre-commit is not installed (pip install pre-commit)")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git work tree of tcdsl")
    repo = _snapshot(tmp_path / "tcdsl")
    user = tmp_path / "user"
    user.mkdir()
    _git("init", "-q", cwd=user)
    shutil.copyfile(GOOD, user / "good.tcp")
    shutil.copyfile(BAD_CASE, user / "bad.tcp")
    (user / "notes.txt").write_text("not a policy\n", encoding="utf-8")
    _git("add", "-A", cwd=user)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "PRE_COMMIT_COLOR": "never"}
    start = time.monotonic()
    done = subprocess.run(
        [*PRE_COMMIT, "try-repo", str(repo), "tcdsl-check", "--files", *USER_FILES],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    elapsed = time.monotonic() - start
    output = done.stdout + done.stderr
    log = tmp_path / "cache" / "pre-commit.log"
    if done.returncode == 3 and log.exists():
        output += log.read_text(encoding="utf-8", errors="replace")
    if done.returncode == 3 and NETWORK_TROUBLE.search(output):
        pytest.skip(
            f"pre-commit could not pip-install tcdsl (package index unreachable?):\n"
            f"{output[-1500:]}"
        )
    print(f"pre-commit try-repo took {elapsed:.1f} s")
    assert done.returncode == 1, output
    assert re.search(r"tcdsl check\.+Failed", output), output
    assert BAD_MESSAGE in output and "bad.tcp:2:26" in output, output
    assert not re.search(r"good\.tcp:\d+:\d+: error", output), output
