"""The state records of the live operations, without a kernel: a damaged record is refused
with a message (exit 1), never a traceback; a rollback past the generations kept is refused;
the name's lock is one holder at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tcdsl.ops import lifecycle
from tcdsl.ops.cli import parse_duration
from tcdsl.ops.lifecycle import OpsError, rollback
from tcdsl.ops.state import KEEP, DamagedRecord, Store
from tcdsl.verify.runner import HostSupport

POLICY = "interface d0 htb rate 10mbit default a {\n    class a rate 1mbit\n}\n"


def _store(tmp_path: Path, applies: int) -> tuple[Store, Path]:
    path = tmp_path / "p.tcp"
    path.write_text(POLICY, encoding="utf-8")
    store = Store("p", tmp_path / "state")
    for _ in range(applies):
        store.record(str(path), {str(path): POLICY}, ("d0",), {})
    return store, path


CLASS_IDS = {
    "not a handle": {"d0": {"a": "banana"}},
    "no id": {"d0": {"a": None}},
    "a list": {"d0": {"a": ["1:20"]}},
    "not hex": {"d0": {"a": "1:zz"}},
    "a number": {"d0": 5},
    "one id twice": {"d0": {"a": "1:20", "b": "1:20"}},
    "one leaf twice": {"d0": {"a": "1:20", "a leaf": "20:", "b": "1:30", "b leaf": "20:"}},
    "a leaf on its class's qdisc": {"d0": {"v": "1:20", "v leaf": "1:"}},
    "a leaf with a minor": {"d0": {"v": "1:20", "v leaf": "1:20"}},
    "a class without a minor": {"d0": {"v": "1:"}},
}
"""Class-id maps edited by hand: a later apply would crash on them, or keep a class on
another's id and rebuild the tree."""


DAMAGE = ["cut", "not json", "no field", "sources", "path elsewhere", "deep", "a folder"]
"""Found by testers: the last three were tracebacks (status compiled a policy not among the
record's sources; JSON nested past Python's stack; a folder where the record was)."""


@pytest.mark.parametrize("damage", [*DAMAGE, *CLASS_IDS])
@pytest.mark.parametrize("command", ["plan", "apply", "rollback", "down", "status"])
def test_a_damaged_record_is_refused_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, damage: str
) -> None:
    """Found by a helper's review: a record cut short crashed every command, down included,
    with a traceback (exit 3); so did a class id that is no handle, where two classes with
    one id were taken silently."""
    store, path = _store(tmp_path, 1)
    record = store.folder / "applied" / "1.json"
    text = record.read_text(encoding="utf-8")
    data = json.loads(text)
    if damage in CLASS_IDS:
        text = json.dumps({**data, "classids": CLASS_IDS[damage]})
    elif damage == "sources":
        text = json.dumps({**data, "sources": ["p.tcp"]})
    elif damage == "path elsewhere":
        text = json.dumps({**data, "path": "/etc/passwd"})
    elif damage == "deep":
        text = "[" * 100_000 + "]" * 100_000
    elif damage == "a folder":
        record.unlink()
        record.mkdir()
    else:
        text = {"cut": text[:40], "not json": "\x00garbage", "no field": "{}"}[damage]
    if not record.is_dir():
        record.write_text(text, encoding="utf-8")
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    args = {
        "plan": ["plan", str(path)],
        "apply": ["apply", "--yes", str(path)],
        "rollback": ["rollback", "p"],
        "down": ["down", "p"],
        "status": ["status", "--count", "1", str(path)],
    }[command]
    done = CliRunner().invoke(cli, args)
    assert not isinstance(done.exception, DamagedRecord | KeyError | ValueError), done.output
    assert done.exit_code == 1, done.output
    assert "is damaged" in done.output and str(record) in done.output, done.output


def test_a_rollback_past_the_kept_generations_is_refused(tmp_path: Path) -> None:
    """Seven applies keep the last five: rolling back from the oldest kept one went "back" to
    nothing, removing all shaping ("nothing was applied before")."""
    store, _ = _store(tmp_path, KEEP + 2)
    assert store.generations() == list(range(3, KEEP + 3))
    for g in range(KEEP + 2, 3, -1):
        store.forget(g)  # what each rollback drops
    with pytest.raises(OpsError, match="before generation 3 are no longer kept"):
        rollback(store)
    assert store.generations() == [3]


def test_the_name_lock_has_one_holder_at_a_time(tmp_path: Path) -> None:
    store = Store("p", tmp_path / "state")
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tcdsl.ops.state import Store\n"
        "with Store('p', Path(sys.argv[1])).locked():\n"
        "    print(time.monotonic(), flush=True)\n"
    )
    with store.locked():
        held = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "state")],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        time.sleep(1.0)
        released = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert float(out) >= released > held


def test_plan_shows_the_warnings_and_refuses_what_apply_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan and apply showed no warning (a subscriber left to the default class went
    unsaid); plan showed '+ tree' for what apply then refused (E602)."""
    path = tmp_path / "w.tcp"
    path.write_text(
        "interface tcdslnone0 htb rate 10mbit default a {\n"
        "    class a rate 1mbit\n    class lonely rate 1mbit\n}\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    for args in (["plan", str(path)], ["apply", "--yes", str(path)]):
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 1, done.output
        assert "[W311]" in done.output and "no such device: tcdslnone0" in done.output
        assert "+ tree" not in done.output, done.output


TREES_DAMAGE = {
    "objects null": {"objects": None},
    "objects of numbers": {"objects": [1]},
    "objects of lists": {"objects": [[1]]},
    "removal null": {"removal": None},
    "names null": {"names": None},
    "span a word": {"span": "x"},
    "label null": {"label": None},  # (found by a tester: '- tree None' in plan)
    "a name a number": {"names": {"a": 1}},
}


@pytest.mark.parametrize("damage", [*TREES_DAMAGE, "trees null", "features null"])
def test_a_damaged_trees_record_is_the_slow_path_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """Found by a review: valid JSON of the wrong shape in N.trees.json crashed plan, apply
    and down (exit 3). Like a file cut short, it is read as no record of the trees: the
    policy is compiled again."""
    from tcdsl.ops.desired import TREES_FORMAT
    from tcdsl.ops.lifecycle import live_of

    store, path = _store(tmp_path, 1)
    tree = {"label": "d0", "span": ["p.tcp", 1, 1, 1, 2], "objects": [], "names": {}}
    data: dict[str, object] = {"format": TREES_FORMAT, "features": [], "trees": [tree]}
    tree["removal"] = []
    if damage in TREES_DAMAGE:
        tree.update(TREES_DAMAGE[damage])
    else:
        data[damage.split()[0]] = None
    (store.folder / "applied" / "1.trees.json").write_text(json.dumps(data), encoding="utf-8")
    applied = store.current()
    assert applied is not None
    live = live_of(store, applied)
    assert [t.label for t in live.trees] == ["d0"] and live.trees[0].objects  # compiled again
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    for args in (["plan", str(path)], ["down", "p"]):
        done = CliRunner().invoke(cli, args)
        assert done.exit_code in (0, 1, 4), (done.output, done.exception)
        assert "Traceback" not in done.output and "internal error" not in done.output


def test_down_of_an_interface_gets_past_a_damaged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'down -i' is the way out of a damaged record (E603 says so): it must not stop at it."""
    from tcdsl.ops.lifecycle import down_interface

    store, _ = _store(tmp_path, 1)
    (store.folder / "applied" / "1.json").write_text("{", encoding="utf-8")
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    ran: list[list[str]] = []

    def runner(argv: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "")

    monkeypatch.setattr("tcdsl.ops.lifecycle.device_exists", lambda name: True)
    removed = down_interface("d0", runner)
    assert removed == ["- (the state of p cannot be read: left as it is)"], removed
    assert ran, "the device's qdiscs were looked at"


@pytest.mark.parametrize("command", ["apply", "rollback", "confirm", "down"])
def test_a_state_folder_that_cannot_hold_the_lock_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The lock file cannot be made (here a file stands where its folder goes; a read-only
    or full file system does the same): E603 says so and that nothing changed, exit 1, where
    a traceback said 'internal error' (exit 3)."""
    path = tmp_path / "p.tcp"
    path.write_text("interface eth0 htb rate 10mbit default a {\n    class a rate 1mbit\n}\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "+locks").write_text("not a folder\n", encoding="utf-8")
    monkeypatch.setenv("TCDSL_STATE_DIR", str(state))
    args = {
        "apply": ["apply", "--yes", str(path)],
        "rollback": ["rollback", "p"],
        "confirm": ["confirm", "p"],
        "down": ["down", "p"],
    }[command]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 1, (done.output, done.exception)
    assert "error[E603]: cannot take the lock of 'p'" in done.output, done.output
    assert "nothing was changed" in done.output and "Traceback" not in done.output


@pytest.mark.parametrize("where", ["root", "name"])
@pytest.mark.parametrize("command", ["plan", "apply", "status", "rollback", "down", "confirm"])
def test_a_file_where_the_state_folder_should_be_is_e603(
    tmp_path: Path, where: str, command: str
) -> None:
    """Found by a tester: TCDSL_STATE_DIR (or a name's folder in it) being a file made every
    live command die with a NotADirectoryError traceback (exit 3); it is E603, exit 1, before
    anything is read from the kernel or changed."""
    policy = tmp_path / "st.tcp"
    policy.write_text("interface d9 htb rate 10mbit default a {\n    class a rate 1mbit\n}\n")
    state = tmp_path / "state"
    if where == "root":
        state.write_text("")
    else:
        state.mkdir()
        (state / "st").write_text("")
    args = {
        "plan": ["plan", str(policy)],
        "apply": ["apply", "--yes", str(policy)],
        "status": ["status", "--name", "st"],
        "rollback": ["rollback", "st"],
        "down": ["down", "st", "--yes"],
        "confirm": ["confirm", "st"],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "tcdsl", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, TCDSL_STATE_DIR=str(state)),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "[E603]" in done.stderr and "is a file where tcdsl keeps its state" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["", "-x"])
@pytest.mark.parametrize("command", ["plan", "apply", "status"])
def test_an_empty_name_is_refused_not_taken_for_the_files(
    command: str, name: str, tmp_path: Path
) -> None:
    """Found by testers: 'apply --name ""' used the policy file's name instead; '--name -x'
    was taken, and every later command read the name as an option."""
    policy = tmp_path / "p.tcp"
    policy.write_text("interface eth0 htb rate 1mbit default a {\n    class a rate 1mbit\n}\n")
    args = {"plan": [str(policy)], "apply": ["--yes", str(policy)]}.get(command, [])
    got = CliRunner().invoke(
        cli, [command, f"--name={name}", *args], env={"TCDSL_STATE_DIR": str(tmp_path / "state")}
    )
    assert got.exit_code == 2 and f"Invalid value for --name: '{name}'" in got.output, got.output


@pytest.mark.parametrize(
    "text",
    ["[]", '{"qdiscs": 5}', '{"release": "6.1"}', '{"release": 6, "qdiscs": []}', "[" * 100_000],
)
def test_a_kernel_probe_kept_in_the_wrong_shape_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """The probe of the kernel kept for this boot is a cache: one of the wrong shape (found
    by a tester: a traceback in plan and apply) is no probe, and one of the right shape is
    read back as it was kept."""
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    lifecycle._probe_file().write_text(text, encoding="utf-8")
    assert lifecycle._probed() is None
    host = HostSupport("6.1.0", frozenset({"htb"}), frozenset({"u32"}), True, True,
                       frozenset({"mirred"}), False, ip6tables=False)  # fmt: skip
    lifecycle._remember_probe(host)
    assert lifecycle._probed() == host


WINDOWS = [
    ("0s", "leaves no time"),
    ("-5s", "not a duration"),
    ("1d", "not a duration"),
    ("99999999999s", "more than a day"),
    ("25h", "more than a day"),
]


@pytest.mark.parametrize(("window", "said"), WINDOWS)
def test_a_confirm_window_of_no_time_or_past_a_day_is_refused(
    window: str, said: str, tmp_path: Path
) -> None:
    """Before anything is read or changed: a window of no time rolled back before anyone
    could confirm; one of 99999999999s was taken, and its timer could not sleep so long."""
    policy = tmp_path / "p.tcp"
    policy.write_text(POLICY, encoding="utf-8")
    got = CliRunner().invoke(
        cli,
        ["apply", "--yes", f"--confirm={window}", str(policy)],
        env={"TCDSL_STATE_DIR": str(tmp_path / "state")},
    )
    assert got.exit_code == 2 and said in got.output, got.output
    assert not (tmp_path / "state").exists()


def test_a_confirm_window_of_a_day_is_taken() -> None:
    assert parse_duration("24h") == 86400.0 and parse_duration("90") == 90.0
