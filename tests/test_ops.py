"""Live operations on the host kernel (network namespaces, the real tc): plan, apply in place,
drift, rollback, ``--confirm``, down, a failing command restoring the old state, and random
edits applied in place (``tests/ops_edits.py``)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.allocate import PARENT_PIN, Pins
from tcdsl.driver import analyse, compile_policy
from tcdsl.frontend.qdiscs import CHANGE_SETS_ALL, REPAIRABLE_CLASSES
from tcdsl.lock import is_held
from tcdsl.ops.desired import trees_from_json, trees_json, trees_of
from tcdsl.ops.lifecycle import pins_of
from tcdsl.ops.plan import Plan, make_plan
from tcdsl.ops.state import TIMER_GRACE, Store
from tcdsl.verify.compare import compare_state, value_drift
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import DeviceState, KernelState, parse_classes, parse_qdiscs
from tcdsl.verify.runner import HostSupport
from tests.test_apply import host, make_netns, run

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

ROOT = Path(__file__).resolve().parent.parent
TCDSL = [str(Path(sys.executable).parent / "tcdsl")]

A = """\
interface d0 htb rate 10mbit default bulk {
    class voip rate 2mbit match dport 5001
    class web rate 3mbit ceil 8mbit match dport 80, 443
    class bulk rate 1mbit {
        pfifo limit 20
    }
}
"""
B = A.replace("voip rate 2mbit", "voip rate 4mbit").replace("limit 20", "limit 30")
B = B.replace("    class bulk", "    class guest rate 1mbit match src 10.9.0.0/16\n    class bulk")


def _netns(make_netns: Callable[[], str]) -> str:
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
    run(["ip", "-n", ns, "link", "set", "d0", "up"])
    run(["ip", "-n", ns, "link", "set", "d1", "up"])
    return ns


def _send_to_bulk(ns: str) -> None:
    """UDP packets out of d0 to port 9, which no class matches (so: bulk, 1:30), to a static
    neighbour: no ARP, and no reliance on a ping binary the host may lack."""
    from tests.test_apply import SENDER

    run(["ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", "d0"])
    lladdr = "02:00:00:00:00:02"
    run(["ip", "-n", ns, "neigh", "add", "10.99.0.2", "lladdr", lladdr, "dev", "d0"])
    run(["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, "3", "9,0"])


class Tcdsl:
    """``tcdsl`` run inside a namespace, with its own state folder."""

    def __init__(self, ns: str, folder: Path) -> None:
        self.ns, self.folder = ns, folder
        self.env = dict(os.environ, TCDSL_STATE_DIR=str(folder / "state"))

    def write(self, name: str, text: str) -> str:
        path = self.folder / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    def __call__(self, *args: str, cwd: Path = ROOT) -> Ran:
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns, *TCDSL, *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
        return Ran(done.returncode, done.stdout, done.stderr)

    def tc(self, *args: str) -> str:
        return run(["ip", "netns", "exec", self.ns, "tc", *args]).stdout

    def tc_lines(self, *lines: str) -> None:
        """Run ``tc`` with the words of each line, in order."""
        for line in lines:
            self.tc(*line.split())


@dataclass(frozen=True)
class Ran:
    """How a tcdsl command went."""

    code: int
    out: str
    err: str

    def __repr__(self) -> str:
        return f"exit {self.code}\n{self.out}{self.err}"


@pytest.fixture
def tcdsl(make_netns: Callable[[], str], tmp_path: Path) -> Tcdsl:
    return Tcdsl(_netns(make_netns), tmp_path)


def test_plan_apply_in_place_drift_rollback_down(tcdsl: Tcdsl, host: HostSupport) -> None:
    a, b = tcdsl.write("office.tcp", A), tcdsl.write("b.tcp", B)
    first = tcdsl("plan", a)
    assert first.code == 4 and "+ tree d0" in first.out, first
    assert tcdsl("apply", a).code == 2  # no terminal, no --yes: refused
    assert "noqueue" in tcdsl.tc("qdisc", "show", "dev", "d0")
    # an old script's tree, which no state records: the plan says it replaces it
    tcdsl.tc("qdisc", "add", "dev", "d0", "root", "handle", "5:", "htb")
    adopted = tcdsl("plan", a)
    assert "! tree d0: replaces the htb qdisc 5: on d0 (no state)" in adopted.out, adopted
    done = tcdsl("apply", "--yes", a)
    assert done.code == 0 and "generation 1" in done.out, done
    assert tcdsl("plan", a).out == "no changes\n"
    changes = tcdsl("plan", "--name", "office", b)
    assert changes.code == 4, changes
    assert "~ class voip: rate 2mbit -> 4mbit" in changes.out, changes
    assert "+ class guest" in changes.out and "limit 20 -> 30" in changes.out, changes
    assert tcdsl("apply", "--yes", "--name", "office", b).code == 0
    classes = tcdsl.tc("class", "show", "dev", "d0")
    assert "class htb 1:10 parent 1:1 prio 0 rate 4Mbit" in classes, classes
    assert tcdsl("plan", "--name", "office", b).code == 0
    # by hand: drift, shown at the policy line, and mended by the next apply
    tcdsl.tc(
        "class", "change", "dev", "d0", "parent", "1:1", "classid", "1:20", "htb", "rate", "5mbit"
    )
    drift = tcdsl("plan", "--name", "office", b)
    assert drift.code == 4 and "! drift in d0: class 'web' rate is 5Mbit" in drift.out, drift
    back = tcdsl("rollback", "office")
    assert back.code == 0 and "generation 1" in back.out, back
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    assert tcdsl("plan", a).out == "no changes\n"
    gone = tcdsl("down", "office")
    assert gone.code == 0 and "- tree d0" in gone.out, gone
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert not (tcdsl.folder / "state" / "office").exists()
    assert tcdsl("rollback", "office").code == 1


def test_a_class_change_keeps_counters_and_siblings_ids(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A rate change is a 'class change' (the counters go on); a class inserted before
    others leaves their ids alone (the state pins them)."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    send = "from tests.ops_edits import send_some; send_some()"
    run(["ip", "netns", "exec", tcdsl.ns, sys.executable, "-c", send])
    before = tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:30")
    sent = int(before.split("Sent ")[1].split()[0])
    inserted = A.replace(
        "    class voip", "    class first rate 1mbit match dport 22\n    class voip"
    )
    edited = inserted.replace("bulk rate 1mbit", "bulk rate 2mbit")
    plan = tcdsl("apply", "--yes", tcdsl.write("p.tcp", edited))
    assert plan.code == 0 and "~ class bulk: rate 1mbit -> 2mbit" in plan.out, plan
    after = tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:30")
    assert "rate 2Mbit" in after and int(after.split("Sent ")[1].split()[0]) >= sent > 0, after
    assert "1:40" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:40")  # 'first'
    # status reads the kernel by the names of the ids apply gave, not by a fresh numbering
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", a)
    assert shown.code == 0, shown
    rows = {c["name"]: c["classid"] for i in json.loads(shown.out)["trees"] for c in i["classes"]}
    assert rows["first"] == "1:40" and rows["bulk"] == "1:30", rows


def test_a_tree_already_as_the_policy_builds_it_is_taken_over(tcdsl: Tcdsl) -> None:
    """Found by a review: applying under a name what a script built (or what import read)
    rebuilt the tree, counters reset and the device unshaped a moment, though the kernel
    was already as the policy says. It is taken over as it is; a tree that differs is still
    replaced ('!'), as the plan says."""
    a = tcdsl.write("p.tcp", A)
    script = tcdsl.folder / "p.sh"
    script.write_text(compile_policy(a).output or "", encoding="utf-8")
    env = {**os.environ, "TCDSL_LOCK_DIR": str(tcdsl.folder)}
    subprocess.run(["ip", "netns", "exec", tcdsl.ns, "sh", str(script)], check=True, env=env)
    b = tcdsl.write("b.tcp", B)
    differs = tcdsl("plan", "--name", "x", b)
    assert "! tree d0: replaces the htb qdisc 1: on d0 (no state)" in differs.out, differs
    send = "from tests.ops_edits import send_some; send_some()"
    run(["ip", "netns", "exec", tcdsl.ns, sys.executable, "-c", send])
    sent = _sent(tcdsl)["1:30"]
    shown = tcdsl("plan", "--name", "x", a)
    assert shown.code == 4 and "~ tree d0: taken over as the kernel holds it" in shown.out, shown
    assert "replaces" not in shown.out, shown
    assert tcdsl("apply", "--yes", "--name", "x", a).code == 0
    assert _sent(tcdsl)["1:30"] >= sent > 0  # not built again
    again = tcdsl("plan", "--name", "x", a)
    assert again.code == 0 and "no changes" in again.out, again


def _sent(tcdsl: Tcdsl) -> dict[str, int]:
    """Class id -> bytes sent, of every class on d0."""
    shown = tcdsl.tc("-s", "class", "show", "dev", "d0")
    return {m[1]: int(m[2]) for m in re.finditer(r"class htb (\S+) .*?\n Sent (\d+) bytes", shown)}


def _signals_acted_on() -> None:
    """In the child: the signals tcdsl holds while it changes the kernel acted on, whatever
    the test run ignores (a CI job starts with SIGINT ignored, one under nohup SIGHUP)."""
    import signal as signals

    for sig in (signals.SIGINT, signals.SIGTERM, signals.SIGHUP):
        signals.signal(sig, signals.SIG_DFL)


def _with_tc(tcdsl: Tcdsl, wrapper: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tcdsl ARGS`` in the namespace with ``wrapper`` as its tc (REAL: the real one), in a
    process group of its own (where the wrapper's signal goes) and with SIGINT, SIGTERM and
    SIGHUP acted on, as from a terminal, even where this test runs with them ignored; the
    wrapper must have sent."""
    tools = tcdsl.folder / "bin"
    tools.mkdir()
    real = shutil.which("tc")
    assert real is not None
    (tools / "tc").write_text(wrapper.replace("REAL", real))
    (tools / "tc").chmod(0o755)
    done = subprocess.run(
        ["ip", "netns", "exec", tcdsl.ns, *TCDSL, *args],
        capture_output=True,
        text=True,
        env=dict(tcdsl.env, PATH=f"{tools}:{os.environ['PATH']}"),
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
        start_new_session=True,
        preexec_fn=_signals_acted_on,
    )
    assert (tools / "tc.sent").exists(), done.stderr
    return done


SIGNALLING_TC = """\
#!/bin/sh
# tc, but the first tc -batch that changes something first sends SIGNAL to tcdsl (its parent)
if [ "$1" = -batch ]; then
    input=$(cat)
    case "$input" in
    *" show "*) ;;
    *) [ -e "$0.sent" ] || { : > "$0.sent"; kill -SIGNAL "$PPID"; } ;;
    esac
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
exec REAL "$@"
"""


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_signal_during_apply_takes_the_change_back_in_place(
    tcdsl: Tcdsl, host: HostSupport, sig: str
) -> None:
    """Ctrl-C (SIGINT), a service stop (SIGTERM) or a lost session (SIGHUP: found by a
    tester, it ended tcdsl mid-change, its --confirm timer never started) while apply
    changes the kernel: the step
    under way finishes, then the change is undone in place as after a failed command: the old
    policy's trees and counters are kept, no record says the new one, and the exit status is
    the shell's for the signal. (Before, SIGINT exited 130 at once, SIGTERM killed tcdsl, and
    the next apply rebuilt the whole tree, every counter reset.)"""
    import signal as signals

    b = tcdsl.write("p.tcp", B)
    assert tcdsl("apply", "--yes", b).code == 0
    send = "from tests.ops_edits import send_some; send_some()"
    run(["ip", "netns", "exec", tcdsl.ns, sys.executable, "-c", send])
    sent = _sent(tcdsl)
    assert sum(sent.values()) > 0, sent
    wrapper = SIGNALLING_TC.replace("SIGNAL", sig)
    done = _with_tc(tcdsl, wrapper, "apply", "--yes", tcdsl.write("p.tcp", A))
    number = getattr(signals, f"SIG{sig}")
    assert done.returncode == 128 + number, (done.returncode, done.stdout, done.stderr)
    assert f"SIG{sig} came while the kernel changed" in done.stderr, done.stderr
    assert "the trees and counters kept" in done.stderr and "Traceback" not in done.stderr
    after = _sent(tcdsl)  # B's classes, guest among them, none made again
    assert after.keys() == sent.keys() and all(after[c] >= n for c, n in sent.items()), after
    assert "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    again = tcdsl("plan", tcdsl.write("p.tcp", B))
    assert (
        again.code == 0
        and "no changes" in again.out
        and "did not finish" not in again.out + again.err
    ), again


def test_a_signal_that_stops_the_step_under_way_says_so(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a service stop signals tc too; the batch under way, killed, said
    nothing, and the message read ': the change stopped after the step under way' (an empty
    text first, the signal not named, the step said to have finished). The change is taken
    back as before, and the message names the signal and the cut-short step."""
    b = tcdsl.write("p.tcp", B)
    assert tcdsl("apply", "--yes", b).code == 0
    wrapper = SIGNALLING_TC.replace('kill -SIGNAL "$PPID";', 'kill -TERM "$PPID" $$;')
    done = _with_tc(tcdsl, wrapper, "apply", "--yes", tcdsl.write("p.tcp", A))
    said = " ".join(done.stderr.split())
    assert done.returncode == 143, (done.returncode, done.stdout, done.stderr)
    assert "SIGTERM came while the kernel changed, and cut the step under way short (tc was " \
        "stopped by SIGTERM); the previous state was restored" in said, said  # fmt: skip
    assert "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    assert tcdsl("plan", tcdsl.write("p.tcp", B)).out == "no changes\n"


LATE_TC = """\
#!/bin/sh
# tc, but the first tc run once the new generation's record exists (the kernel read that
# completes the record, after the apply's last step) sends SIGNAL to tcdsl's process group,
# as a terminal's Ctrl-C does (tcdsl and the child reading the kernel for it)
if [ -e RECORD ] && [ ! -e "$0.sent" ]; then
    : > "$0.sent"
    kill -SIGNAL "-$(cut -d' ' -f5 /proc/$PPID/stat)"
fi
exec REAL "$@"
"""


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_signal_after_the_last_change_keeps_the_change_and_its_record(
    tcdsl: Tcdsl, host: HostSupport, sig: str
) -> None:
    """Found by a review: a signal while apply read the kernel for its record, after its
    last change, ended tcdsl there (exit 130, or killed): the change stood without its
    --confirm timer. The change is complete: it is recorded, its timer runs, and tcdsl
    says the signal came late."""

    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    record = tcdsl.folder / "state" / "p" / "applied" / "2.json"
    wrapper = LATE_TC.replace("SIGNAL", sig).replace("RECORD", str(record))
    b = tcdsl.write("p.tcp", B)
    done = _with_tc(tcdsl, wrapper, "apply", "--yes", "--confirm", "60s", b)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "applied" in done.stdout and "(generation 2)" in done.stdout, done.stdout
    assert f"SIG{sig} came after the change was complete" in done.stderr, done.stderr
    confirmed = tcdsl("confirm", "p")
    assert confirmed.code == 0 and "generation 2" in confirmed.out, confirmed
    assert tcdsl("plan", b).code == 0


STOPPED_READER_TC = """\
#!/bin/sh
# tc, but the first 'class show' once the new generation's record exists (the reading the
# record's digest is made from, after the last change) is stopped by SIGTERM, as a service
# stop stops every process of its group: its listing is cut short
case "$*" in *"class show"*)
    if [ -e RECORD ] && [ ! -e "$0.sent" ]; then
        : > "$0.sent"
        kill -TERM $$
    fi ;;
esac
exec REAL "$@"
"""


def test_a_reading_stopped_by_a_signal_is_made_again(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a service stop signals the tc that reads the kernel for the
    record; its cut-short listing was hashed and recorded, and the next 'plan' said the
    kernel had changed since the apply (exit 4) where nothing had. A reading killed by a
    signal is made again."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    record = tcdsl.folder / "state" / "p" / "applied" / "2.json"
    wrapper = STOPPED_READER_TC.replace("RECORD", str(record))
    b = tcdsl.write("p.tcp", B)
    done = _with_tc(tcdsl, wrapper, "apply", "--yes", b)
    assert done.returncode == 0 and "(generation 2)" in done.stdout, done
    again = tcdsl("plan", b)
    assert again.code == 0 and again.out == "no changes\n", again


def test_what_the_kernel_lacks_is_refused_before_any_change(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """B's leaf sfq is not in this kernel: apply probes first and refuses at the policy line
    (E604); the kernel still holds A."""
    if "sfq" in host.qdiscs:
        pytest.skip("needs a qdisc the host lacks (sfq is here)")
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    bad = A.replace("voip rate 2mbit", "voip rate 5mbit").replace("pfifo limit 20", "sfq")
    refused = tcdsl("apply", "--yes", tcdsl.write("p.tcp", bad))
    assert refused.code == 1 and "[E604]" in refused.err and "p.tcp:5:9" in refused.err, refused
    assert "the sfq qdisc" in refused.err and "nothing was changed" in refused.err, refused
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    assert tcdsl("plan", tcdsl.write("p.tcp", A)).out == "no changes\n"


FAILING_TC = """#!/bin/sh
# tc, except that a batch with 'limit 30' in it stops there as the kernel would refuse it
if [ "$1" = -batch ]; then
    input=$(cat)
    n=$(printf '%s\\n' "$input" | grep -n 'limit 30' | head -n 1 | cut -d: -f1)
    if [ -n "$n" ]; then
        printf '%s\\n' "$input" | head -n $((n - 1)) | REAL -batch - || exit 1
        echo 'RTNETLINK answers: Invalid argument' >&2
        echo "Command failed -:$n" >&2
        exit 1
    fi
    printf '%s\\n' "$input" | REAL -batch -
    exit
fi
exec REAL "$@"
"""


REFUSING_TC = """#!/bin/sh
# tc, except that every 'dport 5001' line is refused, as a kernel without what it needs
# would: a batch stops there, a forced one runs its other lines
if [ "$1" = -batch ] || [ "$2" = -batch ]; then
    input=$(cat)
    n=$(printf '%s\\n' "$input" | grep -n 'dport 5001' | head -n 1 | cut -d: -f1)
    if [ -z "$n" ]; then
        printf '%s\\n' "$input" | REAL "$@"
        exit
    fi
    if [ "$1" = -force ]; then
        printf '%s\\n' "$input" | grep -v 'dport 5001' | REAL -force -batch -
    else
        printf '%s\\n' "$input" | head -n $((n - 1)) | REAL -batch - || exit 1
    fi
    echo 'RTNETLINK answers: Invalid argument' >&2
    echo "Command failed -:$n" >&2
    exit 1
fi
exec REAL "$@"
"""


def test_a_restore_that_fails_builds_what_it_can_of_the_old_tree(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: when the old tree's rebuild failed too, it stopped at its first
    failing command, and most of the old tree (classes and filters after it) was missing,
    every packet in the default class. Now each command of the restore is tried: only
    what the kernel refuses is missing; and the message says what to do."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    _tc_from_now_on(tcdsl, REFUSING_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", A.replace("default bulk", "default web")))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    said = " ".join(failed.err.split())
    assert "restoring the previous state failed too" in said, failed
    assert "'tcdsl plan' shows what differs" in said, failed
    classes = tcdsl.tc("class", "show", "dev", "d0")
    assert all(f"class htb 1:{n} " in classes for n in (10, 20, 30)), classes
    assert "pfifo" in tcdsl.tc("qdisc", "show", "dev", "d0")
    filters = tcdsl.tc("filter", "show", "dev", "d0")
    assert "00000050/0000ffff" in filters and "000001bb/0000ffff" in filters, filters


def _tc_failing_on_limit_30(tcdsl: Tcdsl) -> None:
    """From now on, ``tcdsl`` runs a tc that refuses a batch's 'limit 30' (FAILING_TC)."""
    _tc_from_now_on(tcdsl, FAILING_TC)


def _tc_from_now_on(tcdsl: Tcdsl, wrapper: str) -> Path:
    """From now on, ``tcdsl`` runs ``wrapper`` as its tc (REAL: the real one); its path."""
    real = shutil.which("tc")
    assert real is not None
    shim = tcdsl.folder / "bin"
    shim.mkdir()
    (shim / "tc").write_text(wrapper.replace("REAL", real), encoding="utf-8")
    (shim / "tc").chmod(0o755)
    tcdsl.env["PATH"] = f"{shim}:{tcdsl.env['PATH']}"
    return shim / "tc"


VANISHING_TC = """\
#!/bin/sh
# tc, but the first tc -batch that changes something first deletes the device e0; every
# changing batch is logged to $0.log
if [ "$1" = -batch ]; then
    input=$(cat)
    case "$input" in
    *" show "*) ;;
    *) printf '%s\\n' "$input" >> "$0.log"
       [ -e "$0.sent" ] || { : > "$0.sent"; ip link del e0; } ;;
    esac
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
# (the other commands after that batch: the kernel's reads)
[ -e "$0.sent" ] && printf '%s\\n' "$*" >> "$0.after"
exec REAL "$@"
"""


def test_a_device_gone_during_a_change_leaves_the_others_undone_in_place(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: a change to two devices' trees, one device deleted half-way: the
    other, undone in place, was then built again too (its counters lost, unshaped while it
    was), and the message did not say which tree was back. Now only the trees not as the
    live policy builds them are built again, and the message names them."""
    run(["ip", "-n", tcdsl.ns, "link", "add", "e0", "type", "veth", "peer", "name", "e1"])
    two = A + A.replace("interface d0", "interface e0")
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", two)).code == 0
    changed = two.replace("voip rate 2mbit", "voip rate 4mbit")
    tc = _tc_from_now_on(tcdsl, VANISHING_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", changed))
    assert failed.code == 1, failed
    said = " ".join(failed.err.split())
    assert "restoring the previous state failed too for e0 (d0 as before)" in said, failed
    batches = Path(f"{tc}.log").read_text(encoding="utf-8")
    assert "dev d0 root" not in batches, batches  # d0 was not built again
    # The kernel is read once after the undo in place (what is astray: e0) and once after
    # e0's restore failed, for the message; the restore plan takes the first read (it read
    # the kernel again, about a second at 10,000 classes).
    reads = Path(f"{tc}.after").read_text(encoding="utf-8").splitlines()
    assert reads.count("-d qdisc show dev d0") == 2, reads
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")


def test_a_rollback_killed_half_way_leaves_its_note(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a rollback killed (kill -9) while it changed the kernel left no
    note, so the next plan took the half-made change for drift by hand. Now it leaves one, as
    apply does: plan says the change did not finish, and a rollback after it goes back to the
    live policy, whose record stands."""
    a, b = tcdsl.write("a.tcp", A), tcdsl.write("b.tcp", B)
    assert tcdsl("apply", "--yes", "--name", "p", a).code == 0
    assert tcdsl("apply", "--yes", "--name", "p", b).code == 0
    killed = _with_tc(tcdsl, SIGNALLING_TC.replace("SIGNAL", "KILL"), "rollback", "p")
    assert killed.returncode == -9 or killed.returncode == 137, killed
    planned = tcdsl("plan", "--name", "p", b)
    assert "did not finish" in planned.out and "a.tcp" in planned.out, planned
    back = tcdsl("rollback", "p")
    assert back.code == 0, back
    assert tcdsl("plan", "--name", "p", b).out == "no changes\n"
    assert "1:40" in tcdsl.tc("class", "show", "dev", "d0")  # B's guest class


def test_another_tools_clsact_filters_are_no_drift(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a bpf filter another tool put on d0's clsact (the ingress slot, which
    an htb tree does not hold) was drift, and every apply rebuilt the tree (its counters reset,
    the device unshaped a moment). It is a note now: plan says so (exit 4, no changes), apply
    keeps the tree and its counters, and the plan after it is clean."""
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "qdisc", "add", "dev", "d0", "clsact"])
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    _send_to_bulk(tcdsl.ns)
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "filter", "add", "dev", "d0", "egress",
         "pref", "7", "bpf", "bytecode", "1,6 0 0 4294967295,", "flowid", "1:99"])  # fmt: skip
    planned = tcdsl("plan", a)
    assert planned.code == 4 and "drift" not in planned.out, planned
    assert "something the policy does not own" in planned.out, planned
    assert planned.out.endswith("no changes\n"), planned
    assert tcdsl("apply", "--yes", a).code == 0
    sent = re.search(r"Sent (\d+) bytes", tcdsl.tc("-s", "class", "show", "dev", "d0",
                                                   "classid", "1:30"))  # fmt: skip
    assert sent is not None and int(sent.group(1)) > 0  # not built again
    assert "bpf" in tcdsl.tc("filter", "show", "dev", "d0", "egress")  # theirs, kept
    again = tcdsl("plan", a)
    assert again.code == 0 and again.out == "no changes\n", again


def test_another_tools_ingress_qdisc_is_no_drift(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a check of the clsact finding: an ingress qdisc another tool put on d0 (the
    slot an htb tree leaves free) was drift, and apply rebuilt the tree (its counters reset),
    leaving the ingress qdisc where it was; the plan after it said nothing. It is a note now,
    as a clsact there is: apply keeps the tree and its counters, and the ingress qdisc."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    _send_to_bulk(tcdsl.ns)
    tc = ["ip", "netns", "exec", tcdsl.ns, "tc"]
    run([*tc, "qdisc", "add", "dev", "d0", "ingress"])
    run([*tc, "filter", "add", "dev", "d0", "parent", "ffff:", "protocol", "all", "u32",
         "match", "u32", "0", "0", "flowid", "ffff:1"])  # fmt: skip
    planned = tcdsl("plan", a)
    assert planned.code == 4 and "drift" not in planned.out, planned
    assert "something the policy does not own" in planned.out, planned
    assert tcdsl("apply", "--yes", a).code == 0
    sent = re.search(r"Sent (\d+) bytes", tcdsl.tc("-s", "class", "show", "dev", "d0",
                                                   "classid", "1:30"))  # fmt: skip
    assert sent is not None and int(sent.group(1)) > 0  # not built again
    assert "u32" in tcdsl.tc("filter", "show", "dev", "d0", "ingress")  # theirs, kept
    assert tcdsl("plan", a).out == "no changes\n"


def test_a_class_size_accounting_set_by_hand_is_drift(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: 'overhead 100 linklayer atm' set by hand on a class (each packet then
    charged as ATM cells plus 100 bytes, the class well below its rate) was no drift: plan
    said it changed in what tcdsl does not compare, and apply left it. It is drift now, and
    apply puts the class back as the policy has it."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    change = "class change dev d0 parent 1:1 classid 1:10 htb rate 2mbit overhead 100 linklayer atm"
    run(["ip", "netns", "exec", tcdsl.ns, "tc", *change.split()])
    planned = tcdsl("plan", a)
    assert planned.code == 4 and "class 'voip' overhead is 100 in the kernel" in planned.out
    assert "class 'voip' linklayer is atm in the kernel" in planned.out, planned
    assert tcdsl("apply", "--yes", a).code == 0
    shown = tcdsl.tc("-d", "class", "show", "dev", "d0", "classid", "1:10")
    assert "linklayer ethernet" in shown and "overhead" not in shown, shown
    assert tcdsl("plan", a).out == "no changes\n"


def test_a_filter_made_again_by_hand_with_an_offset_is_drift(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """A node of tcdsl's deleted and added again by hand at its handle with the same key but
    'offset plus 4' (its key then read 4 bytes further: other packets) was no drift: plan
    compared keys, order and class ids only. It is drift now, and apply builds it again."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    node = "dev d0 parent 1: protocol ip pref 1 handle 800::800 u32"
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "filter", "del", *node.split()])
    again = f"{node} match ip dport 5001 0xffff offset plus 4 flowid 1:10"
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "filter", "add", *again.split()], check=True)
    assert "offset plus 4" in tcdsl.tc("filter", "show", "dev", "d0")
    planned = tcdsl("plan", a)
    assert planned.code == 4 and "reads its keys at 'offset plus 4' in the kernel" in planned.out
    assert tcdsl("apply", "--yes", a).code == 0
    assert "offset" not in tcdsl.tc("filter", "show", "dev", "d0")
    assert tcdsl("plan", a).out == "no changes\n"


def test_another_tools_clsact_in_the_way_of_a_download_is_not_blamed_on_the_policy(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: with another tool's clsact on d0, adding a download (which needs an
    ingress qdisc there) was refused saying 'remove it first (tcdsl down p, which applied
    it)': p had only shaped d0's upload, and its 'down' took that away and left the clsact.
    The way out names the qdisc's own delete now."""
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "qdisc", "add", "dev", "d0", "clsact"])
    upload = FULL.replace("    download htb rate 20mbit default rest {\n", "").replace(
        "        class fast rate 5mbit match sport 80\n        class rest rate 1mbit\n    }\n", ""
    )
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload)).code == 0
    refused = tcdsl("plan", tcdsl.write("p.tcp", FULL))
    assert refused.code == 1 and "[E602]" in refused.err, refused
    assert "tc qdisc del dev d0 clsact" in refused.err and "tcdsl down" not in refused.err


def test_a_download_a_killed_apply_finished_is_taken_over(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: an apply adding a download, killed (kill -9) once its last batch
    was under way, had built the download whole; the next apply built it again (counters
    reset, downloads unshaped a moment), where docs/operations.md says a tree the kernel holds
    as the new policy says is left as it is. It is taken over now."""
    upload = FULL.replace("    download htb rate 20mbit default rest {\n", "").replace(
        "        class fast rate 5mbit match sport 80\n        class rest rate 1mbit\n    }\n", ""
    )
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload)).code == 0
    full = tcdsl.write("p.tcp", FULL)
    killed = _with_tc(tcdsl, SIGNALLING_TC.replace("SIGNAL", "KILL"), "apply", "--yes", full)
    assert killed.returncode in (-9, 137), killed
    planned = tcdsl("plan", full)
    assert "did not finish" in planned.out and "taken over" in planned.out, planned
    assert "rebuild" not in planned.out and "replaces" not in planned.out, planned
    assert "does not own" not in planned.out, planned
    assert tcdsl("apply", "--yes", full).code == 0
    assert tcdsl("plan", full).out == "no changes\n"


LEAF = """\
interface d0 htb rate 100mbit default rest {
    class grp rate 20mbit ceil 50mbit match dport 2000-2999 {
        LEAF
    }
    class rest rate 10mbit
}
"""
INNER = """\
interface d0 htb rate 100mbit default rest {
    class grp rate 20mbit ceil 50mbit {
        class g1 rate 10mbit ceil 50mbit match dport 2000-2499
        class g2 rate 10mbit ceil 50mbit match dport 2500-2999 {
            pfifo limit 10
        }
    }
    class rest rate 10mbit
}
"""


@pytest.mark.parametrize(
    "leaf",
    [
        "pfifo limit 10",
        "htb default b {\n class a rate 5mbit match dport 2001\n class b rate 5mbit\n}",
    ],
    ids=["fifo", "classful"],
)
def test_a_class_that_loses_its_children_gets_its_leaf_qdisc_in_place(
    tcdsl: Tcdsl, host: HostSupport, leaf: str
) -> None:
    """Found by a tester: a class whose children go and that gets a leaf qdisc of its own had
    the qdisc added before its children were deleted, which the kernel refuses (EINVAL): the
    apply, its rollback and a --confirm timer's rollback failed every time. The leaf (and what
    is below it) now comes after the deletions, in place; the other way, a classful leaf
    qdisc goes first with what is below it (its classes' deletions failed after it went).
    Rollback goes back each way."""
    leafy = LEAF.replace("LEAF", leaf)
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", leafy)).code == 0
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", INNER)).code == 0
    back = tcdsl("apply", "--yes", tcdsl.write("p.tcp", leafy))
    assert back.code == 0 and "- class g1" in back.out and "(rebuild)" not in back.out, back
    assert tcdsl("plan", tcdsl.write("p.tcp", leafy)).out == "no changes\n"
    shown = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert ("pfifo" if "pfifo" in leaf else "htb") in shown.split("parent 1:10")[0].splitlines()[-1]
    assert tcdsl("rollback", "p").code == 0
    assert tcdsl("plan", tcdsl.write("p.tcp", INNER)).out == "no changes\n"
    assert tcdsl("rollback", "p").code == 0
    assert tcdsl("plan", tcdsl.write("p.tcp", leafy)).out == "no changes\n"


def test_status_of_a_file_live_under_another_name_shows_its_live_ids(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: 'status FILE' of a file applied with '--name shop' numbered its
    classes afresh (a class inserted before others took their ids), so each name showed
    another class's counters, exit 0, with only a note on stderr. The file's one live name
    gives the ids now."""
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", "--name", "shop", p).code == 0
    inserted = A.replace(
        "    class voip", "    class first rate 1mbit match dport 22\n    class voip"
    )
    assert tcdsl("apply", "--yes", "--name", "shop", tcdsl.write("p.tcp", inserted)).code == 0
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", p)
    assert shown.code == 0 and "is live as 'shop'" in shown.err, shown
    rows = {c["name"]: c["classid"] for i in json.loads(shown.out)["trees"] for c in i["classes"]}
    assert rows["first"] == "1:40" and rows["bulk"] == "1:30", rows


def test_a_classful_leaf_moved_below_a_new_child_is_not_lost(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a review: a classful leaf qdisc (htb 5: with classes) moved below a new child
    class of its class was deleted first, and its classes, the same in the new tree, were
    never made again: the apply said it was done, plan said no changes. Its old place is not
    deleted first now: the apply is refused by the kernel and restored, or done whole."""
    leafy = LEAF.replace(
        "LEAF",
        "htb handle 5: default b {\n class a rate 5mbit match dport 2001\n class b rate 5mbit\n}",
    )
    moved = leafy.replace(
        "class grp rate 20mbit ceil 50mbit match dport 2000-2999 {",
        "class grp rate 20mbit ceil 50mbit {\n"
        " class sub rate 10mbit ceil 50mbit match dport 2000-2999 {",
    ).replace("    class rest", "    }\n    class rest")
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", leafy)).code == 0
    done = tcdsl("apply", "--yes", tcdsl.write("p.tcp", moved))
    if done.code == 0:
        assert "5:10" in tcdsl.tc("class", "show", "dev", "d0"), done
        assert tcdsl("plan", tcdsl.write("p.tcp", moved)).out == "no changes\n"
    else:
        assert "[E601]" in done.err and "restored" in done.err, done
        assert tcdsl("plan", tcdsl.write("p.tcp", leafy)).out == "no changes\n"
    assert "5:10" in tcdsl.tc("class", "show", "dev", "d0")


def test_a_failing_command_restores_the_old_policy(tcdsl: Tcdsl, host: HostSupport) -> None:
    """The kernel refuses a command half-way through B (a tc that fails on B's 'limit 30'):
    apply undoes what it did, in place (the tree and the counters kept), and says which
    command failed, with tc's words, at its policy line (E601)."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    _send_to_bulk(tcdsl.ns)
    sent = re.search(
        r"Sent (\d+) bytes", tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:30")
    )
    assert sent is not None and int(sent.group(1)) > 0
    _tc_failing_on_limit_30(tcdsl)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", B))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "p.tcp:6:9" in failed.err and "Invalid argument" in failed.err, failed
    assert "previous state was restored (in place, the trees and counters kept)" in failed.err
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    assert "1:40" not in tcdsl.tc("class", "show", "dev", "d0")  # B's guest is not there
    assert tcdsl("plan", tcdsl.write("p.tcp", A)).out == "no changes\n"
    kept = re.search(
        r"Sent (\d+) bytes", tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:30")
    )
    assert kept is not None and int(kept.group(1)) >= int(sent.group(1))  # not built again


UNDO_FAILING_TC = FAILING_TC.replace("limit 30", "10.9.0.0").replace(
    'if [ "$1" = -batch ]; then',
    """if [ "$1" = -force ]; then  # an undo: refused, every command of it
    cat >/dev/null
    echo 'RTNETLINK answers: Invalid argument' >&2
    echo 'Command failed -:1' >&2
    exit 1
fi
if [ "$1" = -batch ]; then""",
)


def test_a_failure_restored_by_building_again_says_so(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a failed change whose undo in place did not go through was taken
    back by building the old policy again (every counter reset, the device unshaped a
    moment), and the message said only that the previous state was restored."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    _tc_from_now_on(tcdsl, UNDO_FAILING_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", B))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "previous state was restored (built again: their counters start over)" in failed.err
    assert tcdsl("plan", tcdsl.write("p.tcp", A)).out == "no changes\n"


def test_a_failed_rebuild_undone_by_building_again_says_the_counters_start_over(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: a change that builds the tree again (the htb's default) failed
    half-way; its undo built the old tree again (every counter reset) and the message said
    "in place, the trees and counters kept"."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    _tc_failing_on_limit_30(tcdsl)
    rebuilt = B.replace("default bulk", "default web")
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", rebuilt))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "restored (built again: their counters start over)" in failed.err, failed
    assert tcdsl("plan", tcdsl.write("p.tcp", A)).out == "no changes\n"


def _spoil_record(tcdsl: Tcdsl, generation: int) -> None:
    """Make the saved text of policy p's ``generation`` one that no longer compiles."""
    record = tcdsl.folder / "state" / "p" / "applied" / f"{generation}.json"
    data = json.loads(record.read_text(encoding="utf-8"))
    data["sources"] = {k: v.replace("htb rate 10mbit", "htb rate 10 mbits") for k, v in
                       data["sources"].items()}  # fmt: skip
    record.write_text(json.dumps(data), encoding="utf-8")


def test_plan_after_a_restored_failure_sees_no_change(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A failed apply builds the live policy again: the kernel then numbers its filters
    afresh (here unlike the in-place apply that made it), and the next plan must not take
    that for a change by hand (it said so and exited 4 on every plan until the next apply)."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    live = A.replace("match dport 80, 443", "match dport 80, 8080")
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", live)).code == 0  # filters in place
    _tc_failing_on_limit_30(tcdsl)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", live.replace("limit 20", "limit 30")))
    assert failed.code == 1 and "previous state was restored" in failed.err, failed
    planned = tcdsl("plan", tcdsl.write("p.tcp", live))
    assert planned.code == 0 and "no changes" in planned.out, planned
    assert "changed since" not in planned.out + planned.err, planned


def test_plan_after_a_restored_rollback_sees_no_change(tcdsl: Tcdsl, host: HostSupport) -> None:
    """The same after a rollback that failed and built the live policy again."""
    assert (
        tcdsl("apply", "--yes", tcdsl.write("p.tcp", A.replace("limit 20", "limit 30"))).code == 0
    )
    live = A.replace("match dport 80, 443", "match dport 80, 8080")
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", live)).code == 0
    _tc_failing_on_limit_30(tcdsl)
    failed = tcdsl("rollback", "p")
    assert failed.code == 1 and "previous state was restored" in failed.err, failed
    planned = tcdsl("plan", tcdsl.write("p.tcp", live))
    assert planned.code == 0 and "no changes" in planned.out, planned


def test_classify_says_when_the_live_files_changed(tcdsl: Tcdsl, host: HostSupport) -> None:
    """classify answers for the files as they are; where that is not what the kernel runs
    (edited since it was applied), it says so on stderr."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    asked = ("classify", a, "--packet", "udp dport 443")
    same = tcdsl(*asked)
    assert same.code == 0 and "'web'" in same.out and same.err == "", same
    tcdsl.write("p.tcp", A.replace("match dport 80, 443", "match dport 80"))
    edited = tcdsl(*asked)
    assert edited.code == 0 and "'bulk'" in edited.out, edited
    assert "p.tcp changed since" in edited.err and "not what the kernel does" in edited.err


def test_classify_of_another_file_under_a_name_answers_with_its_live_ids(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: 'classify --name NAME' of an edited copy (another file) answered
    with a fresh compile's class ids, where apply keeps the live ones: a class after an added
    one had another id than the kernel's. It answers with the ids apply would keep."""
    assert tcdsl("apply", "--yes", "--name", "n", tcdsl.write("p.tcp", A)).code == 0
    copy = tcdsl.write(
        "copy.tcp", A.replace("    class web", "    class new rate 1mbit\n    class web")
    )
    asked = ("classify", copy, "--name", "n", "--packet", "udp dport 443")
    live = tcdsl(*asked)
    fresh = tcdsl("classify", copy, "--packet", "udp dport 443")
    assert live.code == 0 and fresh.code == 0, (live, fresh)
    assert "'web' (1:20)" in live.out and "'web' (1:30)" in fresh.out, (live.out, fresh.out)
    applied = tcdsl("apply", "--yes", "--name", "n", copy)
    assert applied.code == 0 and "~ class web" not in applied.out, applied
    assert "1:20" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:20")


def test_another_file_that_changes_nothing_is_recorded(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: applying under a name another file whose policy the kernel already
    holds said 'no changes' and kept the record of the file before, which status, classify
    and rollback went on naming. It is recorded as a generation of its own (the kernel left
    as it is); the same file again records nothing."""
    assert tcdsl("apply", "--yes", "--name", "n", tcdsl.write("p.tcp", A)).code == 0
    copy = tcdsl.write("copy.tcp", "# the same policy, another file\n" + A)
    applied = tcdsl("apply", "--yes", "--name", "n", copy)
    assert applied.code == 0 and "no changes" in applied.out, applied
    assert f"applied {copy} as n (generation 2)" in applied.out, applied
    again = tcdsl("apply", "--yes", "--name", "n", copy)
    assert again.code == 0 and "generation" not in again.out, again
    # the same file named another way (found by a review: a generation each time)
    spelt = tcdsl("apply", "--yes", "--name", "n", "copy.tcp", cwd=tcdsl.folder)
    assert spelt.code == 0 and "generation" not in spelt.out, spelt
    classified = tcdsl("classify", copy, "--name", "n", "--packet", "udp dport 443")
    assert classified.code == 0 and classified.err == "", classified


def test_a_failed_first_apply_says_what_it_could_not_restore(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """A first apply replaces an old script's root qdisc (no state) and fails: what it built
    is removed, and the message says the old qdisc is gone rather than that all was restored."""
    tcdsl.tc("qdisc", "add", "dev", "d0", "root", "handle", "9:", "tbf", "rate", "1mbit",
             "burst", "10k", "latency", "50ms")  # fmt: skip
    _tc_failing_on_limit_30(tcdsl)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", A.replace("limit 20", "limit 30")))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "but not the tbf qdisc 9: on d0, which no tcdsl state kept" in failed.err, failed
    assert "tbf" not in tcdsl.tc("qdisc", "show", "dev", "d0")


def test_down_does_not_compile_the_live_policy_again(tcdsl: Tcdsl, host: HostSupport) -> None:
    """'down' removes what the record says the policy built, even when its saved text no
    longer compiles."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    _spoil_record(tcdsl, 1)
    done = tcdsl("down", "p")
    assert done.code == 0, done
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert not (tcdsl.folder / "state" / "p" / "applied").exists()


def test_apply_does_not_compile_the_live_policy_again(tcdsl: Tcdsl, host: HostSupport) -> None:
    """The live policy is compiled again only to restore it: an apply that goes well reads
    what it built (and the interfaces it holds) from its record, so a record whose text no
    longer compiles (a newer tcdsl refusing it) does not stop it; a failing one says that it
    could not restore, at the failing command's line, with no traceback."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    _spoil_record(tcdsl, 1)
    done = tcdsl("apply", "--yes", tcdsl.write("p.tcp", B.replace("limit 30", "limit 25")))
    assert done.code == 0 and "generation 2" in done.out, done
    assert "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    _spoil_record(tcdsl, 2)
    _tc_failing_on_limit_30(tcdsl)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", B))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "restoring the previous state failed too" in failed.err, failed
    assert "Traceback" not in failed.err, failed


def test_rollback_reads_both_policies_from_their_records(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A rollback whose change is made in place takes what either policy built from its
    record: neither saved text is compiled again (so neither need still compile); a tree it
    builds anew is compiled from the saved text of the policy it goes back to."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", B)).code == 0
    _spoil_record(tcdsl, 1)
    _spoil_record(tcdsl, 2)
    back = tcdsl("rollback", "p")
    assert back.code == 0 and "generation 1" in back.out, back
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    assert "limit 20" in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "1:40" not in tcdsl.tc("class", "show", "dev", "d0")  # guest is gone
    # generation 1 shaped d1 too; generation 2 does not: going back builds d1's tree again
    assert tcdsl("down", "p").code == 0
    two = A + A.replace("interface d0", "interface d1")
    assert tcdsl("apply", "--yes", tcdsl.write("q.tcp", two)).code == 0
    assert tcdsl("apply", "--yes", tcdsl.write("q.tcp", A)).code == 0
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d1")
    assert tcdsl("rollback", "q").code == 0
    assert "rate 2Mbit" in tcdsl.tc("class", "show", "dev", "d1", "classid", "1:10")
    assert tcdsl("plan", tcdsl.write("q.tcp", two)).code == 0  # no changes: as recorded


def test_rollback_with_a_device_gone_is_e602_and_changes_nothing(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """As plan and apply say: no such device, nothing was changed (not a failed restore);
    both generations stay."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", B)).code == 0
    run(["ip", "-n", tcdsl.ns, "link", "del", "d0"])
    back = tcdsl("rollback", "p")
    assert back.code == 1, back
    assert "[E602]" in back.err and "no such device: d0; nothing was changed" in back.err, back
    assert "restoring" not in back.err and "Traceback" not in back.err, back
    run(["ip", "-n", tcdsl.ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
    again = tcdsl("apply", "--yes", tcdsl.write("p.tcp", B))
    assert again.code == 0 and "generation 3" in again.out, again
    back = tcdsl("rollback", "p")
    assert back.code == 0 and "generation 2" in back.out, back


def test_plan_text_shows_five_drift_lines_per_tree_and_counts_the_rest() -> None:
    from tcdsl.ops.plan import Change

    plan = Plan()
    plan.drift = [Change("!", f"drift in d0: unexpected pfifo qdisc {n}:") for n in range(8)]
    plan.drift.append(Change("!", "drift in d1: class 'web' rate is 5Mbit"))
    lines = plan.render().splitlines()
    assert lines[:5] == [f"! drift in d0: unexpected pfifo qdisc {n}:" for n in range(5)]
    assert lines[5:7] == [
        "! drift in d1: class 'web' rate is 5Mbit",
        "! drift in d0: 3 more (plan --format json lists them all)",
    ]
    drift = plan.to_json()["drift"]
    assert isinstance(drift, list) and len(drift) == 9


def test_plan_json_lists_every_drift(tcdsl: Tcdsl, host: HostSupport) -> None:
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", p).code == 0
    for classid in ("1:10", "1:20"):
        tcdsl.tc("class", "change", "dev", "d0", "classid", classid, "htb", "rate", "7mbit")
        tcdsl.tc("qdisc", "add", "dev", "d0", "parent", classid, "pfifo", "limit", "7")
    tcdsl.tc("qdisc", "change", "dev", "d0", "parent", "1:30", "pfifo", "limit", "7")
    tcdsl.tc("class", "change", "dev", "d0", "classid", "1:30", "htb", "rate", "7mbit")
    shown = tcdsl("plan", "--format", "json", p)
    drift = json.loads(shown.out)["drift"]
    assert len(drift) > 5, drift
    text = tcdsl("plan", p).out
    assert f"! drift in d0: {len(drift) - 5} more (plan --format json lists them all)" in text


def test_a_record_that_cannot_be_written_after_the_change_says_the_kernel_changed(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """The state's generations made read-only (as a full or read-only file system does)
    after the first apply: the second changes the kernel, then cannot record it. E603 says
    the kernel holds the new policy and what to do, exit 1 (it was a traceback, exit 3); once
    the folder is writable, the next apply finds the kernel as the policy says."""
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", p).code == 0
    applied = tcdsl.folder / "state" / "p" / "applied"
    assert applied.is_dir()
    tcdsl.write("p.tcp", B)
    steps = (
        f"mount --bind {applied} {applied} && mount -o remount,bind,ro {applied} && "
        f"ip netns exec {tcdsl.ns} {TCDSL[0]} apply --yes {p}; echo rc=$?"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", steps], capture_output=True, text=True, env=tcdsl.env
    )
    said = done.stdout + done.stderr
    assert "rc=1" in said and "[E603]" in said and "Traceback" not in said, said
    assert f"the kernel holds {p} now, but the state folder" in said, said
    assert "then run 'tcdsl apply" in said, said
    assert "1:40" in tcdsl.tc("class", "show", "dev", "d0")  # B's guest class is there
    assert not list(applied.glob(".*")), "no temporary file is left"
    again = tcdsl("apply", "--yes", p)
    assert again.code == 0 and "generation 2" in again.out, again
    assert "+ class" not in again.out and "~ class" not in again.out, again


def test_an_apply_recorded_without_its_cache_warns_and_stands(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Only what an apply built and the kernel's digest (a cache) cannot be written: the
    change stands, is recorded, exit 0 with W609 (it was E603 "could not record it", exit
    1); the next apply finds nothing to change and keeps them."""
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", p).code == 0
    applied = tcdsl.folder / "state" / "p" / "applied"
    blocker = applied / "2.trees.json"
    (blocker / "in-the-way").mkdir(parents=True)  # where the cache goes: no file fits
    tcdsl.write("p.tcp", B)
    done = tcdsl("apply", "--yes", p)
    assert done.code == 0, done
    assert "[W609]" in done.err and "recorded" in done.err and "could not keep" in done.err
    assert "applied" in done.out and "generation 2" in done.out, done
    assert "1:40" in tcdsl.tc("class", "show", "dev", "d0")  # B's guest class is there
    assert (applied / "2.json").is_file() and not (applied / "2.kernel.json").exists()
    (blocker / "in-the-way").rmdir()
    blocker.rmdir()
    again = tcdsl("apply", "--yes", p)
    assert again.code == 0 and again.err == "", again
    assert "+ class" not in again.out and "~ class" not in again.out, again
    assert (applied / "2.trees.json").is_file() and (applied / "2.kernel.json").is_file()


def test_status_claims_a_tbfs_own_class(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a review: the class the kernel makes in a tbf to hold its child (X:1) was
    shown as '(not in policy)'."""
    text = (
        "interface d0 tbf rate 10mbit burst 64k limit 256k {\n"
        "    htb rate 10mbit default a {\n        class a rate 5mbit\n    }\n}\n"
    )
    p = tcdsl.write("t.tcp", text)
    assert tcdsl("apply", "--yes", p).code == 0
    assert "class tbf" in tcdsl.tc("class", "show", "dev", "d0")
    shown = tcdsl("status", "--count", "1", "--interval", "0.1", p)
    assert shown.code == 0 and "a " in shown.out, shown
    assert "not in policy" not in shown.out, shown


def test_status_by_name_shows_the_policy_as_applied(tcdsl: Tcdsl, host: HostSupport) -> None:
    """'status --name NAME' without a file: the policy live under NAME, from its record (its
    file moved away), chosen by class name."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    Path(a).unlink()
    args = ("status", "--name", "p", "--format", "json", "--interval", "0.1")
    shown = tcdsl(*args, "--class", "voip")
    assert shown.code == 0 and shown.err == "", shown
    (tree,) = json.loads(shown.out)["trees"]
    assert [c["name"] for c in tree["classes"]] == ["(link)", "voip"]
    assert tree["classes"][1]["classid"] == "1:10" and tree["classes"][1]["state"] == "ok"
    missing = tcdsl(*args[:2], "nobody", *args[3:])
    assert missing.code == 1 and "no policy is applied under the name 'nobody'" in missing.err
    assert tcdsl("status").code == 2


def test_status_finds_a_subscriber_by_address(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: support calls name a customer's address, and '--class' took only
    class names (a table's are made from circuit ids). An address shows the classes whose
    lines take packets from or to it; one no line takes is a usage error saying so."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", B)).code == 0
    args = ("status", "--name", "p", "--format", "json", "--interval", "0.1", "--class")
    shown = tcdsl(*args, "10.9.1.1")
    assert shown.code == 0 and shown.err == "", shown
    (tree,) = json.loads(shown.out)["trees"]
    assert [c["name"] for c in tree["classes"]] == ["(link)", "guest"]
    missing = tcdsl(*args, "10.8.0.1")
    assert missing.code == 2, missing
    assert "no class's match line takes packets from or to 10.8.0.1" in missing.err, missing


def test_status_shows_and_finds_a_subscriber_by_its_circuit_name(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: an ISP's status named subscribers by circuit id alone, where its
    table has each one's Circuit Name. The name is each class's title: shown after the class
    name (cut to 32 characters, an escape sequence's ESC as '?'), whole in JSON and
    Prometheus, and '--class' matches it."""
    tcdsl.write(
        "subs.csv",
        "Circuit ID,Circuit Name,Parent Node,IPv4,Download Min Mbps,Upload Min Mbps,"
        "Download Max Mbps,Upload Max Mbps\n"
        '1001,"5235 Campfire Street, Ringgold, GA 30736, USA",n,10.9.0.1,1,1,2,2\n'
        "1002,\x1b[31mMallory,n,10.9.0.2,1,1,2,2\n"
        "1003,,n,10.9.0.3,1,1,2,2\n"
        "1004,Zürich Straße 5,n,10.9.0.4,1,1,2,2\n",
    )
    p = tcdsl.write(
        "isp.tcp",
        "interface d0 htb rate 100mbit default rest {\n"
        '    class n rate 10mbit {\n        subscribers upload from "subs.csv"\n    }\n'
        "    class rest rate 1mbit\n}\n",
    )
    assert tcdsl("apply", "--yes", p).code == 0
    args = ("status", "--name", "isp", "--interval", "0.1")
    shown = tcdsl(*args, "--format", "json")
    assert shown.code == 0, shown
    (tree,) = json.loads(shown.out)["trees"]
    titles = {c["name"]: c["title"] for c in tree["classes"]}
    assert titles["c1001"] == "5235 Campfire Street, Ringgold, GA 30736, USA"
    assert titles["c1002"] == "?[31mMallory" and titles["c1003"] is None
    assert titles["n"] is None
    text = tcdsl(*args, "--class", "*campfire*")  # a title in any case
    assert text.code == 0 and "\x1b" not in text.out, text
    assert "c1001 5235 Campfire Street, Ringgol... |" in text.out, text.out
    assert "c1002" not in text.out and "(3 of 7 classes shown)" in text.out, text
    metrics = tcdsl(*args, "--format", "prometheus", "--class", "c1002")
    assert 'class="c1002",classid="' in metrics.out, metrics
    assert 'title="?[31mMallory"' in metrics.out and "\x1b" not in metrics.out, metrics
    # found by a tester: a title its encoding cannot write was a traceback (exit 3)
    latin = dict(tcdsl.env, PYTHONIOENCODING="ascii")
    done = subprocess.run(
        ["ip", "netns", "exec", tcdsl.ns, *TCDSL, *args, "--class", "c1004"],
        capture_output=True, env=latin, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and b"c1004 Z?rich Stra?e 5 " in done.stdout, done


def test_confirm_or_roll_back(tcdsl: Tcdsl, host: HostSupport) -> None:
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    b = tcdsl.write("p.tcp", B)
    for wrong in ("0s", "0", "-5s", "5x"):  # (found by a tester: 0s rolled back at once)
        refused = tcdsl("apply", "--yes", "--confirm", wrong, b)
        assert refused.code == 2 and "Invalid value for '--confirm'" in refused.err, refused
    kept = tcdsl("apply", "--yes", "--confirm", "1", b)  # a number alone: seconds, said so
    assert kept.code == 0 and "rolled back in 1s unless 'tcdsl confirm p'" in kept.out, kept
    assert tcdsl("confirm", "p").code == 0
    time.sleep(2)
    assert "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    c = tcdsl.write("p.tcp", B.replace("voip rate 4mbit", "voip rate 6mbit"))
    assert tcdsl("apply", "--yes", "--confirm", "1s", c).code == 0
    assert "rate 6Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    for _ in range(50):
        time.sleep(0.2)
        if "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10"):
            break
    assert "rate 4Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:10")
    late = tcdsl("confirm", "p")  # nothing waits any more, and it says why (found by a tester)
    said = " ".join(late.err.split())
    assert late.code == 1 and "the --confirm timer rolled " in said, late
    assert f"{c} (generation 3) back at " in said and f"{b} (generation 2) is live" in said, late
    assert f"apply {c} again to keep it" in said, late
    # a plain apply over one waiting for confirmation says that it calls the rollback off,
    # with changes or without
    five = B.replace("voip rate 4mbit", "voip rate 5mbit")
    for first, then in ((five, five), (five, B)):
        assert tcdsl("apply", "--yes", "--confirm", "1h", tcdsl.write("p.tcp", first)).code == 0
        over = tcdsl("apply", "--yes", tcdsl.write("p.tcp", then))
        assert over.code == 0 and "is no longer rolled back" in over.err, over
        assert ("no changes" in over.out) == (first == then), over
        assert tcdsl("confirm", "p").code == 1


def test_a_second_confirm_says_where_its_timer_rolls_back_to(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: an apply with --confirm over one still waiting said the first was
    kept ('this apply keeps the policy it applies'); its own timer then rolled back to that
    first, never confirmed, generation. It says so now."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    b = tcdsl.write("p.tcp", B)
    assert tcdsl("apply", "--yes", "--confirm", "1h", b).code == 0
    c = tcdsl.write("p.tcp", B.replace("voip rate 4mbit", "voip rate 5mbit"))
    again = tcdsl("apply", "--yes", "--confirm", "1h", c)
    assert again.code == 0, again
    assert "this apply's timer rolls back to generation 2, not before it" in again.err, again
    assert tcdsl("confirm", "p").code == 0


def test_a_timer_that_cannot_roll_back_says_so_to_the_next_command(tcdsl: Tcdsl) -> None:
    """Found by a review: the --confirm timer runs detached; when its rollback was refused
    (here: the earlier generation's e0 was taken by another name meanwhile), nothing said so
    and the change silently stayed. Now the next command under the name warns, until the
    wait ends (confirm)."""
    run(["ip", "-n", tcdsl.ns, "link", "add", "e0", "type", "veth", "peer", "name", "e1"])
    one = tcdsl.write("one.tcp", A + A.replace("interface d0", "interface e0"))
    assert tcdsl("apply", "--yes", one).code == 0
    tcdsl.write("one.tcp", A)
    assert tcdsl("apply", "--yes", "--confirm", "2s", one).code == 0
    two = tcdsl.write("two.tcp", B.replace("interface d0", "interface e0"))
    assert tcdsl("apply", "--yes", two).code == 0
    failed = tcdsl.folder / "state" / "one" / "timer-failed.txt"
    for _ in range(100):
        time.sleep(0.1)
        if failed.exists():
            break
    said = tcdsl("plan", one)
    assert "the --confirm timer of 'one' could not roll back" in said.err, said
    assert "e0 is shaped by the policy applied as 'two'" in said.err, said
    assert "generation 2 stands" in said.err and said.code == 0, said
    assert "1:40" in tcdsl.tc("class", "show", "dev", "e0")  # two's tree stays
    assert tcdsl("confirm", "one").code == 0
    assert not failed.exists() and tcdsl("plan", one).err == ""


HALF_BATCH_TC = """#!/bin/sh
# tc, except that once "$0.fail" exists, a batch runs its first half and then fails
if [ -e "$0.fail" ] && { [ "$1" = -batch ] || [ "$2" = -batch ]; }; then
    input=$(cat)
    half=$(( $(printf '%s\\n' "$input" | wc -l) / 2 ))
    printf '%s\\n' "$input" | head -n "$half" | REAL "$@" >/dev/null 2>&1
    echo 'RTNETLINK answers: Injected failure' >&2
    echo "Command failed -:$((half + 1))" >&2
    exit 1
fi
if [ "$1" = -batch ] || [ "$2" = -batch ]; then
    exec REAL "$@"
fi
exec REAL "$@"
"""


def test_a_timer_whose_rollback_left_part_of_each_policy_says_so(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: a --confirm timer whose rollback failed, and failed again to build
    the newer policy back, left the kernel with neither (d0's classes half gone); the next
    commands said the newer generation 'stands', and confirm kept it. Now they say the kernel
    holds part of each, and confirm refuses."""
    shim = _tc_from_now_on(tcdsl, HALF_BATCH_TC)
    a, b = tcdsl.write("a.tcp", A), tcdsl.write("b.tcp", B)
    assert tcdsl("apply", "--yes", "--name", "p", a).code == 0
    assert tcdsl("apply", "--yes", "--confirm", "2s", "--name", "p", b).code == 0
    shim.with_name("tc.fail").touch()
    failed = tcdsl.folder / "state" / "p" / "timer-failed.txt"
    for _ in range(150):
        time.sleep(0.1)
        if failed.exists():
            break
    shim.with_name("tc.fail").unlink()
    said = tcdsl("plan", "--name", "p", b)
    assert "could not roll back" in said.err and "part of each policy" in said.err, said
    assert "stands" not in said.err, said
    kept = tcdsl("confirm", "p")
    assert kept.code != 0 and "cannot be kept" in kept.err, kept
    assert tcdsl("apply", "--yes", "--name", "p", b).code == 0  # the way out
    assert tcdsl("plan", "--name", "p", b).out == "no changes\n"


def test_a_killed_timer_is_said_to_be_gone(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: the --confirm timer runs detached; killed (by hand, the OOM killer,
    a logind cleanup of the session --confirm is for), it rolled nothing back, and nothing
    said so: plan said no changes. Once its deadline has passed, every command under the
    name says the timer is gone and the change stands, until confirm or rollback."""
    a, b = tcdsl.write("a.tcp", A), tcdsl.write("b.tcp", B)
    assert tcdsl("apply", "--yes", "--name", "p", a).code == 0
    assert tcdsl("apply", "--yes", "--confirm", "3s", "--name", "p", b).code == 0
    lock = tcdsl.folder / "state" / "p" / "timer-2.lock"
    for _ in range(100):  # the timer holds its lock once it has started
        if lock.exists() and is_held(lock):
            break
        time.sleep(0.05)
    waiting = tcdsl("plan", "--name", "p", b)
    assert waiting.err == "" and waiting.out == "no changes\n", waiting  # it lives
    run(["pkill", "-9", "-f", "tcdsl.ops.timer p 2 "])
    time.sleep(3 + TIMER_GRACE + 0.5)
    said = tcdsl("plan", "--name", "p", b)
    assert "the --confirm timer of 'p' is gone" in said.err, said
    assert "generation 2 stands" in said.err, said
    assert "1:40" in tcdsl.tc("class", "show", "dev", "d0")  # b's guest class: not rolled back
    assert tcdsl("confirm", "p").code == 0
    assert tcdsl("plan", "--name", "p", b).err == ""
    assert not lock.exists()


def test_plan_starts_from_the_record_of_the_apply(tcdsl: Tcdsl, host: HostSupport) -> None:
    """An apply records what it built and the kernel's digest; the next plan uses them and
    compiles the live policy only when the kernel changed since (drift)."""
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", p).code == 0
    applied = tcdsl.folder / "state" / "p" / "applied"
    record = applied / "1.json"
    saved = record.read_text(encoding="utf-8")
    assert (applied / "1.trees.json").is_file() and (applied / "1.kernel.json").is_file()
    # the saved text no longer compiles: only a plan that compiles it would notice
    broken = json.loads(saved)
    broken["sources"] = {k: "interface {\n" for k in broken["sources"]}
    record.write_text(json.dumps(broken), encoding="utf-8")
    assert tcdsl("plan", p).code == 0
    changed = tcdsl("plan", tcdsl.write("p.tcp", B))
    assert changed.code == 4 and "~ class voip: rate 2mbit -> 4mbit" in changed.out, changed
    # traffic changes counters, not the digest
    _send_to_bulk(tcdsl.ns)
    assert "Sent 0 bytes" not in tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:30")
    assert tcdsl("plan", tcdsl.write("p.tcp", A)).code == 0
    # a change by hand: the digest differs and the live policy is compiled (here it cannot be)
    tcdsl.tc("class", "change", "dev", "d0", "classid", "1:20", "htb", "rate", "5mbit")
    refused = tcdsl("plan", p)
    assert refused.code == 1 and "no longer compiles" in refused.err, refused
    record.write_text(saved, encoding="utf-8")
    assert "! drift in d0: class 'web' rate is 5Mbit" in tcdsl("plan", p).out
    assert tcdsl("apply", "--yes", p).code == 0
    # a state an older tcdsl wrote (no record): an apply with nothing to change writes one
    for extra in applied.glob("*.*.json"):
        extra.unlink()
    assert tcdsl("apply", "--yes", p).code == 0
    kept = sorted(f.name for f in applied.iterdir())
    assert kept == ["1.json", "2.json", "2.kernel.json", "2.trees.json"], kept


def test_plan_and_apply_in_brief_and_plan_as_json(tcdsl: Tcdsl, host: HostSupport) -> None:
    """``--summary`` prints the drift and the count, not each change; ``plan --format json``
    gives each change with its sign, kind, text and policy line, and the counts."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    b = tcdsl.write("p.tcp", B)
    brief = tcdsl("plan", "--summary", b)
    assert brief.code == 4, brief
    assert brief.out == "plan: 2 to add (1 class, 1 filter), 2 to change (1 class, 1 qdisc)\n"
    planned = tcdsl("plan", "--format", "json", b)
    assert planned.code == 4, planned
    got = json.loads(planned.out)
    assert got["counts"] == {
        "add": {"class": 1, "filter": 1},
        "change": {"class": 1, "qdisc": 1},
        "remove": {},
        "replace": {},
    }
    assert {"sign": "~", "kind": "class", "text": "class voip: rate 2mbit -> 4mbit"}.items() <= (
        got["changes"][1].items()
    ), got
    assert got["changes"][1]["file"] == b and got["changes"][1]["line"] == 2, got
    assert not got["empty"] and got["drift"] == [], got
    tcdsl.tc("class", "change", "dev", "d0", "classid", "1:20", "htb", "rate", "5mbit")
    drifted = tcdsl("apply", "--yes", "--summary", b)
    assert drifted.code == 0 and drifted.out.startswith("! drift in d0: class 'web'"), drifted
    # the drift is a class's value: set again in place, beside the policy's changes
    counts = "plan: 2 to add (1 class, 1 filter), 3 to change (2 classes, 1 qdisc)"
    assert f"\n{counts}\napplied " in drifted.out, drifted
    assert "+ class guest" not in drifted.out, drifted
    same = tcdsl("plan", "--format", "json", b)
    assert same.code == 0 and json.loads(same.out)["empty"], same


def test_a_missing_device_changes_nothing(tcdsl: Tcdsl, host: HostSupport) -> None:
    missing = tcdsl("apply", "--yes", tcdsl.write("p.tcp", A.replace("d0", "d9")))
    assert missing.code == 1 and "[E602]" in missing.err and "d9" in missing.err, missing
    assert "noqueue" in tcdsl.tc("qdisc", "show", "dev", "d0")


def test_plan_words(tmp_path: Path) -> None:
    """Without a kernel: what the plan says for changes in place and for a rebuild."""
    old = _policy(tmp_path, "a.tcp", A)
    # without the live ids, 'guest' before 'bulk' would take bulk's id and move the default
    unpinned = _plan(old, _policy(tmp_path, "b.tcp", B)).render()
    assert unpinned.startswith("! tree d0: htb root cannot change in place (default 30 -> 40)")
    new = _policy(tmp_path, "b.tcp", B, pins_of(old))
    text = _plan(old, new).render()
    assert "~ class voip: rate 2mbit -> 4mbit" in text and "+ class guest" in text, text
    assert "+ filter guest (match ip src 10.9.0.0/16)" in text, text
    assert "! " not in text, text
    moved = _plan(old, _policy(tmp_path, "d.tcp", A.replace("80, 443", "80, 8080"))).render()
    assert "- filter web (match ip dport 443 0xffff)  (was " in moved, moved  # the old text's
    assert "+ filter web (match ip dport 8080 0xffff)" in moved, moved
    rebuilt = _policy(tmp_path, "c.tcp", A.replace("default bulk", "default web"))
    text = _plan(old, rebuilt).render()
    assert text.startswith("! tree d0: htb root cannot change in place (default 30 -> 20)"), text
    assert _plan(old, old).render() == "no changes\n"
    # what an apply records of the old policy plans as the old policy compiled again does
    recorded = trees_from_json(json.loads(json.dumps(trees_json(trees_of(old)))))
    assert recorded is not None
    assert make_plan(recorded, trees_of(new)).render() == _plan(old, new).render()
    assert trees_from_json({"format": 0, "trees": []}) is None


def test_a_plan_counts_its_changes_and_names_each_trees_classes(tmp_path: Path) -> None:
    """The last line counts the changes by sign and kind; a leaf qdisc is named by its class;
    a filter by the class of its own tree (d0's 1:10 and d1's 1:10 are other classes)."""
    old = _policy(tmp_path, "a.tcp", A)
    text = _plan(old, _policy(tmp_path, "b.tcp", B, pins_of(old))).render()
    assert "~ qdisc pfifo of class bulk: limit 20 -> 30" in text, text
    assert text.endswith(
        "\nplan: 2 to add (1 class, 1 filter), 2 to change (1 class, 1 qdisc)\n"
    ), text
    gone = _policy(
        tmp_path,
        "c.tcp",
        A.replace("    class web rate 3mbit ceil 8mbit match dport 80, 443\n", ""),
        pins_of(old),
    )
    assert _plan(old, gone).render().endswith("\nplan: 7 to remove (1 class, 6 filters)\n")
    rebuilt = _policy(tmp_path, "d.tcp", A.replace("default bulk", "default web"))
    assert _plan(old, rebuilt).render().endswith("\nplan: 1 to replace (1 tree)\n")
    two = A + A.replace("d0", "d1").replace("voip", "phone").replace("web", "www")
    old = _policy(tmp_path, "e.tcp", two)
    new = _policy(tmp_path, "f.tcp", two.replace("5001\n    class web", "5002\n    class web"))
    text = _plan(old, new).render()
    assert "+ filter voip (match ip dport 5002 0xffff)" in text, text
    assert "phone" not in text, text


def test_a_new_class_takes_no_live_leafs_handle(tmp_path: Path) -> None:
    """Past 999 classes, class ids and leaf handles come from pools; a class added early in
    the policy must not take a handle a live leaf qdisc has (the plan would add a qdisc under
    a handle the kernel has: 'Cannot move an existing qdisc'), nor a removed class's id."""
    lines = [f"    class s{i} rate 1mbit match dst 10.0.{i >> 8}.{i & 255} {{ pfifo }}\n"
             for i in range(1010)]  # fmt: skip
    text = "interface d0 htb rate 10gbit default rest {\n%s    class rest rate 1mbit\n}\n"
    old = _policy(tmp_path, "p.tcp", text % "".join(lines))
    edited = [*lines[:5], "    class added rate 1mbit match dst 10.9.0.1 { pfifo }\n", *lines[6:]]
    new = _policy(tmp_path, "p.tcp", text % "".join(edited), pins_of(old))
    plan = _plan(old, new).render()
    assert "!" not in plan, plan
    assert plan.count("+ ") == 3 and plan.count("- ") == 2, plan  # its leaf goes with s5
    before, after = trees_of(old)[0], trees_of(new)[0]
    kept = {o.key: o.handle for o in before.objects if o.kind == "qdisc"}
    now = {o.key: o.handle for o in after.objects if o.kind == "qdisc"}
    assert all(now[k] == h for k, h in kept.items() if k in now)
    assert set(now.values()).isdisjoint(h for k, h in kept.items() if k not in now)


def test_a_rate_change_keeps_the_live_r2q(tmp_path: Path) -> None:
    """A live htb cannot change its r2q (tc has no 'qdisc change' for htb): a new rate that
    would have chosen another r2q keeps the live one, the class out of its range given the
    quantum the kernel clamps it to, and the change stays in place."""
    lines = "".join(f"    class c{i} rate {100 + i}kbit\n" for i in range(30))
    text = "interface d0 htb rate 100mbit default c0 {\n%s}\n"
    old = _policy(tmp_path, "p.tcp", text % lines)
    edited = lines.replace("class c5 rate 105kbit", "class c5 rate 60kbit")
    fresh = _policy(tmp_path, "p.tcp", text % edited)
    root = fresh.interfaces[0].root
    assert isinstance(root, ir.Htb) and root.chosen_r2q not in (None, 10)  # chosen afresh
    new = _policy(tmp_path, "p.tcp", text % edited, pins_of(old))
    plan = _plan(old, new).render()
    assert "!" not in plan and "~ class c5: rate 105kbit -> 60kbit quantum 1000" in plan, plan


def _parent_pins(old: ir.Policy) -> Pins:
    """The pins compile_new gives a policy live as ``old``: its ids, and each class's parent."""
    pins = {label: dict(ids) for label, ids in pins_of(old).items()}
    for tree in trees_of(old):
        for o in tree.objects:
            if o.kind == "class" and o.key[2] in tree.names and o.parent:
                major, _, minor = o.parent.partition(":")
                parent = ir.Handle(int(major, 16), int(minor or "0", 16))
                pins[tree.label][f"{tree.names[o.key[2]]}{PARENT_PIN}"] = parent
    return pins


def test_a_class_pinned_under_another_parent_is_allocated_as_new(tmp_path: Path) -> None:
    """Pins with the live parents (compile_new gives them): a class now under another parent
    gets a new id and leaf handle at once (htb cannot move it), and so do its children;
    the old ids stay reserved; the classes that did not move keep theirs."""
    x = "        class x rate 1mbit {\n            class y rate 1mbit { pfifo }\n        }\n"
    text = (
        "interface d0 htb rate 100mbit default z {\n"
        "    class a rate 10mbit {\n%s    }\n"
        "    class b rate 10mbit {\n        class w rate 1mbit { pfifo }\n%s    }\n"
        "    class z rate 1mbit\n}\n"
    )
    old = _policy(tmp_path, "p.tcp", text % (x, ""))
    pins = _parent_pins(old)
    moved = text % ("        class v rate 1mbit\n", x)
    new = _policy(tmp_path, "p.tcp", moved, pins)

    def ids(policy: ir.Policy) -> dict[str, tuple[ir.Handle | None, ir.Handle | None]]:
        return {
            c.name: (c.classid, c.leaf.handle if c.leaf else None)
            for q in ir.walk_qdiscs(policy.interfaces[0].root)
            for c in ir.classes_of(q)
        }

    before, after = ids(old), ids(new)
    for name in ("a", "b", "w", "z"):
        assert after[name] == before[name], name
    taken = {h for pair in before.values() for h in pair}
    for name in ("v", "x", "y"):
        assert after[name][0] not in taken, (name, after, before)
    assert after["y"][1] not in taken
    plan = _plan(old, new).render()
    assert "rebuild" not in plan and "+ class v" in plan, plan
    # a move is one line, not the class removed and added; its child moves with it
    assert "~ class x moves from a to b: made again as" in plan, plan
    assert "~ class y moves with x: made again as" in plan, plan
    # y has a leaf qdisc, x (a parent) none: only y's line says so
    lines = {line.split()[2]: line for line in plan.splitlines() if " moves " in line}
    assert "with its leaf" in lines["y"] and "with its leaf" not in lines["x"], plan
    assert (
        "+ class x" not in plan
        and "- class x" not in plan
        and "class y" not in plan.replace("~ class y moves with x", "")
    ), plan


def test_a_class_moved_to_the_top_names_the_link_class(tmp_path: Path) -> None:
    """A class moved from under 'a' to the top of the tree: its plan line named its new
    parent by id alone ('moves from a to 1:1'); the link class has no name of its own."""
    text = (
        "interface d0 htb rate 100mbit default z {\n    class a rate 10mbit {\n%s    }\n"
        "%s    class z rate 1mbit\n}\n"
    )
    x = "        class x rate 1mbit { pfifo }\n"
    old = _policy(tmp_path, "p.tcp", text % (x, ""))
    pins = _parent_pins(old)
    moved = text % ("        class v rate 1mbit\n", x.removeprefix("    "))
    plan = _plan(old, _policy(tmp_path, "p.tcp", moved, pins)).render()
    assert "~ class x moves from a to the link class 1:1: made again as" in plan, plan


def test_the_link_class_keeps_its_id(tmp_path: Path) -> None:
    """The link class of 'interface d0 htb rate ...' has no name, but apply pins its id too:
    after an explicit top class 'class link id 1:1' gave way to it (it could not take the
    live 1:1, which the removed class had), the next compile keeps the id it got instead of
    going back to 1:1 and rebuilding."""
    body = "    class web rate 10mbit match dport 80\n    class z rate 1mbit\n"
    explicit = (
        f"interface d0 htb default z {{\n    class link id 1:1 rate 100mbit {{\n{body}    }}\n}}\n"
    )
    implicit = f"interface d0 htb rate 100mbit default z {{\n{body}}}\n"
    first = _policy(tmp_path, "p.tcp", explicit)
    second = _policy(tmp_path, "p.tcp", implicit, pins_of(first))
    third = _policy(tmp_path, "p.tcp", implicit, pins_of(second))
    link = next(ir.classes_of(second.interfaces[0].root))
    assert link.implicit and link.classid != ir.Handle(1, 1), link.classid
    assert _plan(second, third).render() == "no changes\n", _plan(second, third).render()


def _plan(old: ir.Policy, new: ir.Policy) -> Plan:
    return make_plan(trees_of(old), trees_of(new))


def _policy(folder: Path, name: str, text: str, pins: Pins | None = None) -> ir.Policy:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    result = analyse(str(path), pins=pins)
    assert result.policy is not None
    return result.policy


def test_random_edits_apply_in_place(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """200 random edits (25 random policies, 8 edits each; seeded): after each apply the
    kernel is what the edited policy builds, plan says 'no changes', untouched classes kept
    their counters and ids."""
    ns = _netns(make_netns)
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.ops_edits", "7", "25", "8"]
    done = subprocess.run(
        [*args, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print({k: v for k, v in found.items() if k != "problems"})
    assert found["problems"] == [], "\n\n".join(found["problems"][:3])
    assert found["edits"] == 200 and found["renumbered"] == 0
    assert found["in_place"] > 3 * found["rebuilds"] > 0


def test_an_apply_killed_at_every_command_recovers(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """Random (A, B) pairs; the apply of B killed after each of its tc commands in turn (and
    once after all of them, before the state is written): 'plan' says the apply did not
    finish, and the next 'apply B' reaches B or 'rollback' reaches A, never a mix."""
    ns = _netns(make_netns)
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.ops_faults", "1", "8"]
    done = subprocess.run(
        [*args, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print({"kills": found["kills"]})
    assert found["problems"] == [], "\n\n".join(found["problems"][:3])
    assert found["kills"] >= 60


def test_an_apply_failing_at_every_command_is_undone(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """Random (A, B) pairs; the apply of B failing at each of its tc commands in turn (the
    kernel refusing it): the kernel is A again, undone in place where it can be (the trees and
    their counters kept), else built again, and the next plan of A finds nothing to do."""
    ns = _netns(make_netns)
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.ops_faults", "2", "6"]
    done = subprocess.run(
        [*args, str(tmp_path), "fail"], capture_output=True, text=True, cwd=ROOT, timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print({k: v for k, v in found.items() if k != "problems"})
    assert found["problems"] == [], "\n\n".join(found["problems"][:3])
    assert found["failures"] >= 100 and found["in_place"] >= 20


def test_a_class_keeps_its_shaping_while_others_change(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """About 8 Mbit/s of UDP into 'voip' (ceil 2mbit) for 6 s while a new version of the
    policy is applied every half second (other classes' rates, classes added and removed,
    their match lines: voip's filter group swapped each time). Sampled every 0.2 s: the class
    is always there, sends at its ceiling (never above it, never unshaped), and no packet of
    the flow lands in another class or htb's direct queue."""
    ns = _netns(make_netns)
    run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.ops_traffic"]
    done = subprocess.run(
        [*args, str(tmp_path), "6"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    samples = found["samples"]
    assert found["applies"] >= 10 and any("filter web (" in c for c in found["changes"])
    assert all(voip is not None for _, voip, _ in samples), samples
    assert max(other for _, _, other in samples) == 0, samples
    rates = [
        (b[1] - a[1]) * 8 / (b[0] - a[0]) / 1e6 for a, b in zip(samples, samples[5:], strict=False)
    ]
    print(f"voip Mbit/s per second of the run: {[round(r, 2) for r in rates[::5]]}")
    assert all(1.8 <= r <= 2.2 for r in rates[3:]), rates


FULL = """\
interface d0 {
    upload htb rate 10mbit default bulk {
        class voip rate 2mbit match dport 5001
        class bulk rate 1mbit
    }
    download htb rate 20mbit default rest {
        class fast rate 5mbit match sport 80
        class rest rate 1mbit
    }
}
"""
"""Both directions: a root qdisc on d0, an IFB with its tree, the redirect on d0's ingress."""


KEPT_INGRESS_TC = """#!/bin/sh
# tc, except that the first batch deleting d0's ingress qdisc fails there (the kernel keeps
# it): a batch stops there, a forced one runs its other commands
line='qdisc del dev d0 ingress'
if [ "$1" = -batch ] || [ "$2" = -batch ]; then
    input=$(cat)
    n=$(printf '%s\\n' "$input" | grep -n -x "$line" | head -n 1 | cut -d: -f1)
    if [ -n "$n" ] && [ ! -e "$0.sent" ]; then
        : > "$0.sent"
        if [ "$1" = -force ]; then
            printf '%s\\n' "$input" | grep -v -x "$line" | REAL -force -batch -
        else
            printf '%s\\n' "$input" | head -n $((n - 1)) | REAL -batch -
        fi
        echo 'RTNETLINK answers: Device or resource busy' >&2
        echo "Command failed -:$n" >&2
        exit 1
    fi
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
exec REAL "$@"
"""


def test_a_teardown_that_leaves_the_redirect_fails_and_restores(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: the download's removal ran its redirect's delete and its IFB's in
    steps whose failures were ignored; with the redirect's delete failed, the IFB went, every
    packet d0 received was redirected to no device (dropped), and apply said it applied.
    Now a teardown's qdisc that is still there is a failed command (E601): the download is
    restored, redirect and IFB, and the record stays the policy with it."""
    full = tcdsl.write("p.tcp", FULL)
    assert tcdsl("apply", "--yes", full).code == 0
    upload = FULL.replace("    download htb rate 20mbit default rest {\n", "").replace(
        "        class fast rate 5mbit match sport 80\n        class rest rate 1mbit\n    }\n", ""
    )
    assert "download" not in upload
    shim = _tc_from_now_on(tcdsl, KEPT_INGRESS_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload))
    assert shim.with_name("tc.sent").exists()
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "qdisc del dev d0 ingress" in failed.err and "busy" in failed.err, failed
    assert "ifb4d0" in run(["ip", "-n", tcdsl.ns, "link", "show", "ifb4d0"]).stdout
    assert "mirred" in tcdsl.tc("filter", "show", "dev", "d0", "ingress")
    assert "1:10" in tcdsl.tc("class", "show", "dev", "ifb4d0")
    assert tcdsl("plan", tcdsl.write("p.tcp", FULL)).out == "no changes\n"
    # and without the fault, the same change goes through
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload)).code == 0
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0")


NO_FILTERS_TC = """#!/bin/sh
# tc, except that a batch adding filters runs without them and then fails (once)
if [ "$1" = -batch ] || [ "$2" = -batch ]; then
    input=$(cat)
    if printf '%s\\n' "$input" | grep -q '^filter add' && [ ! -e "$0.sent" ]; then
        : > "$0.sent"
        printf '%s\\n' "$input" | grep -v '^filter' | REAL "$@"
        echo 'RTNETLINK answers: Injected failure' >&2
        echo 'Command failed -:5' >&2
        exit 1
    fi
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
exec REAL "$@"
"""


def test_a_failed_first_apply_taken_back_says_so(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: a first apply that failed, and whose trees were all removed again
    (nothing left on d0, its IFB gone), said that restoring the previous state failed too
    (the check compared the kernel with a live policy there is none of). It is read back now:
    none of the policy's qdiscs is left, so it says the previous state was restored."""
    _tc_from_now_on(tcdsl, NO_FILTERS_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", FULL))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "failed too" not in failed.err and "restored" in failed.err, failed
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "ifb4d0" not in run(["ip", "-n", tcdsl.ns, "link", "show"]).stdout
    assert "+ tree d0" in tcdsl("plan", tcdsl.write("p.tcp", FULL)).out


def test_a_failed_download_is_undone_beside_an_upload_left_as_it_was(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: a download added beside a live upload, its redirect refused, was
    taken back by building the whole old policy again: the upload tree, which the change never
    touched, was torn down (its counters reset, the device unshaped a moment). The download
    is undone in place now, its IFB deleted, and the upload left as it was."""
    upload = FULL.replace("    download htb rate 20mbit default rest {\n", "").replace(
        "        class fast rate 5mbit match sport 80\n        class rest rate 1mbit\n    }\n", ""
    )
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload)).code == 0
    _send_to_bulk(tcdsl.ns)
    before = tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:20")
    sent = re.search(r"Sent (\d+) bytes", before)
    assert sent is not None and int(sent.group(1)) > 0, before
    shim = _tc_from_now_on(tcdsl, KEPT_INGRESS_TC.replace("qdisc del dev d0 ingress", "XX")
                           .replace('grep -n -x "$line"', "grep -n mirred"))  # fmt: skip
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", FULL))
    assert shim.with_name("tc.sent").exists()
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "restored" in failed.err, failed
    after = tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", "1:20")
    kept = re.search(r"Sent (\d+) bytes", after)
    assert kept is not None and int(kept.group(1)) >= int(sent.group(1)), after  # not rebuilt
    assert run(["ip", "-n", tcdsl.ns, "link", "show", "ifb4d0"], check=False).returncode != 0
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert tcdsl("plan", tcdsl.write("p.tcp", upload)).out == "no changes\n"


def test_down_of_a_device_removes_the_ifb_of_another_name_its_download_had(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: 'down -i d0' removed the state of a policy whose download was shaped
    on an IFB of its own name ('download via shared0'), and left that IFB and its tree, which
    no record then had. The IFB goes with the state that made it."""
    policy = tcdsl.write("p.tcp", FULL.replace("    download htb", "    download via shared0 htb"))
    assert tcdsl("apply", "--yes", policy).code == 0
    assert "htb" in tcdsl.tc("qdisc", "show", "dev", "shared0")
    gone = tcdsl("down", "-i", "d0", "--yes")
    assert gone.code == 0 and "shared0" in gone.out, gone
    assert run(["ip", "-n", tcdsl.ns, "link", "show", "shared0"], check=False).returncode != 0
    assert tcdsl("status", "--name", "p").code == 1  # no state left either


UNDO_FAULTS_TC = """#!/bin/sh
# tc, except that the first batch with a mirred redirect fails there, and the first forced
# batch deleting d0's ingress qdisc fails at it (the kernel keeps it), its other commands run
if [ "$1" = -batch ] && [ ! -e "$0.sent" ]; then
    input=$(cat)
    n=$(printf '%s\\n' "$input" | grep -n mirred | head -n 1 | cut -d: -f1)
    if [ -n "$n" ]; then
        : > "$0.sent"
        printf '%s\\n' "$input" | head -n $((n - 1)) | REAL -batch -
        echo 'RTNETLINK answers: Invalid argument' >&2
        echo "Command failed -:$n" >&2
        exit 1
    fi
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
line='qdisc del dev d0 ingress'
if [ "$1" = -force ] && [ ! -e "$0.kept" ]; then
    input=$(cat)
    n=$(printf '%s\\n' "$input" | grep -n -x "$line" | head -n 1 | cut -d: -f1)
    if [ -n "$n" ]; then
        : > "$0.kept"
        printf '%s\\n' "$input" | grep -v -x "$line" | REAL -force -batch -
        echo 'RTNETLINK answers: Device or resource busy' >&2
        echo "Command failed -:$n" >&2
        exit 1
    fi
    printf '%s\\n' "$input" | REAL "$@"
    exit
fi
exec REAL "$@"
"""


def test_an_undo_whose_teardown_leaves_the_redirect_is_no_undo(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a review: the in-place undo of a failed download ran its teardown forced,
    whose failures were let be; with the redirect's delete failed, the IFB went, every packet
    d0 received was dropped, and the undo said it restored in place (drift does not look at
    the slot an upload-only policy leaves free). The undo stops at the qdisc left, and the
    old policy is built again: nothing of the download is left."""
    upload = FULL.replace("    download htb rate 20mbit default rest {\n", "").replace(
        "        class fast rate 5mbit match sport 80\n        class rest rate 1mbit\n    }\n", ""
    )
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", upload)).code == 0
    shim = _tc_from_now_on(tcdsl, UNDO_FAULTS_TC)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", FULL))
    assert shim.with_name("tc.sent").exists() and shim.with_name("tc.kept").exists()
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "restored" in failed.err and "in place" not in failed.err, failed
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert run(["ip", "-n", tcdsl.ns, "link", "show", "ifb4d0"], check=False).returncode != 0
    assert tcdsl("plan", tcdsl.write("p.tcp", upload)).out == "no changes\n"


def test_down_removes_every_part_by_name_or_by_interface(tcdsl: Tcdsl, host: HostSupport) -> None:
    """What apply made for both directions (qdiscs, the IFB and its tree, the redirect),
    removed by 'down NAME', then again by 'down -i' (whatever made it), which also removes
    an earlier script's marking chains TCDSL-d0 and (a download's, found by a review)
    TCDSL-ifb4d0 and their jumps in both tables (the host has no fw classifier to apply a
    marking policy); the state goes; other chains stay."""
    if not (host.ifb and host.iptables and host.ip6tables and "mirred" in host.actions):
        pytest.skip("needs ifb, mirred, iptables and ip6tables")
    policy = tcdsl.write("full.tcp", FULL)
    ns = ["ip", "netns", "exec", tcdsl.ns]
    run([*ns, "iptables", "-t", "mangle", "-N", "theirs"])
    for way in ("name", "interface"):
        done = tcdsl("apply", "--yes", policy)
        assert done.code == 0, done
        assert "ifb4d0" in run([*ns, "ip", "link", "show"]).stdout
        if way == "interface":  # a marking upload's chain, and a marking download's
            for tool in ("iptables", "ip6tables"):
                for chain, hook, way_in in (("TCDSL-d0", "POSTROUTING", "-o"),
                                            ("TCDSL-ifb4d0", "PREROUTING", "-i")):  # fmt: skip
                    run([*ns, tool, "-t", "mangle", "-N", chain])
                    run([*ns, tool, "-t", "mangle", "-A", chain, "-j", "MARK", "--set-mark", "1"])
                    run([*ns, tool, "-t", "mangle", "-I", hook, way_in, "d0", "-j", chain])
        gone = tcdsl("down", "full") if way == "name" else tcdsl("down", "-i", "d0", "--yes")
        assert gone.code == 0, gone
        assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0"), way
        assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0"), way
        assert "ifb4d0" not in run([*ns, "ip", "link", "show"]).stdout, way
        for tool in ("iptables", "ip6tables"):
            saved = run([*ns, f"{tool}-save", "-t", "mangle"]).stdout
            assert "TCDSL-d0" not in saved and "TCDSL-ifb4d0" not in saved, way
        assert ":theirs" in run([*ns, "iptables-save", "-t", "mangle"]).stdout
        assert not (tcdsl.folder / "state" / "full").exists(), way
    nothing = tcdsl("down", "-i", "d0")
    assert nothing.code == 0 and "nothing of tcdsl's on d0" in nothing.out, nothing
    assert tcdsl("down", "-i", "d9").code == 1


def test_down_by_name_leaves_what_another_tool_put_in_the_trees_slots(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """After the apply, another tool replaced the upload's htb with its tbf and added a
    filter of its own to the ingress qdisc that holds the download's redirect (found by a
    tester: 'down NAME' deleted both). down leaves the tbf, and the ingress qdisc with the
    other filter, removes the redirect and the IFB, and says what it left."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    policy = tcdsl.write("full.tcp", FULL)
    assert tcdsl("apply", "--yes", policy).code == 0
    tcdsl.tc_lines(
        "qdisc replace dev d0 root handle 7: tbf rate 5mbit burst 10k latency 30ms",
        "filter add dev d0 parent ffff: protocol ip prio 7 u32 match ip src 10.9.9.9/32 "
        "action mirred egress redirect dev d0",
    )
    gone = tcdsl("down", "full")
    assert gone.code == 0, gone
    assert "root qdisc of d0 is a tbf qdisc 7: now" in gone.out, gone
    assert "ingress qdisc of d0 holds filters" in gone.out and "(ip pref 7)" in gone.out, gone
    qdiscs = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "qdisc tbf 7:" in qdiscs and "qdisc ingress ffff:" in qdiscs, qdiscs
    left = tcdsl.tc("filter", "show", "dev", "d0", "parent", "ffff:")
    assert "pref 7" in left and "ifb4d0" not in left and "pref 1 " not in left, left
    assert "ifb4d0" not in run(["ip", "netns", "exec", tcdsl.ns, "ip", "link", "show"]).stdout
    # applied again, the policy takes its slots (the plan names what is there); with nothing
    # of another's in them, the tree goes whole, the ingress qdisc too
    assert tcdsl("apply", "--yes", policy).code == 0
    assert "pref 7" not in tcdsl.tc("filter", "show", "dev", "d0", "parent", "ffff:")
    assert tcdsl("down", "full").code == 0
    qdiscs = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "tbf" not in qdiscs and "htb" not in qdiscs and "ingress" not in qdiscs, qdiscs


def test_down_of_an_interface_lists_first_and_keeps_a_foreign_clsact(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester: 'down -i d0' with no record and no terminal deleted a tbf root and
    a clsact qdisc holding somebody's mirror filter (where BPF programs live too), without
    asking. It lists what it would remove; without a terminal it needs --yes (exit 2,
    nothing changed); a clsact holding a filter or action tcdsl does not make is left, and
    said so."""
    if "mirred" not in host.actions:
        pytest.skip(f"the host lacks act_mirred ({host.notes})")
    tcdsl.tc_lines(
        "qdisc add dev d0 root handle 7: tbf rate 1mbit burst 10k latency 50ms",
        "qdisc add dev d0 clsact",
        "filter add dev d0 egress protocol all prio 1 u32 match u32 0 0 action mirred egress "
        "mirror dev lo",
    )
    asked = tcdsl("down", "-i", "d0")
    assert asked.code == 2 and "give --yes to remove without a terminal" in asked.err, asked
    assert "- root qdisc of d0" in asked.out, asked
    said = " ".join(asked.out.split())
    assert "the clsact qdisc of d0 holds a 'mirred (Egress Mirror to' action on its egress hook, " \
        "which tcdsl does not make: left as it is" in said, asked  # fmt: skip
    shown = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "tbf 7:" in shown and "clsact" in shown, shown
    done = tcdsl("down", "-i", "d0", "--yes")
    assert done.code == 0 and "- root qdisc of d0" in done.out, done
    shown = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "tbf" not in shown and "clsact" in shown, shown
    assert "mirror" in tcdsl.tc("filter", "show", "dev", "d0", "egress").lower()


@pytest.mark.parametrize(
    ("hook", "filter_words", "said", "action"),
    [
        ("egress", "u32 match ip dst 10.0.0.99/32 classid 1:10", "a u32 filter without an "
         "action on its egress hook", None),
        ("ingress", "u32 match ip dst 10.0.0.99/32 classid 1:10", "a u32 filter on its ingress "
         "hook", None),
        ("ingress", "u32 match u32 0 0 action mirred egress redirect dev ifbq", "a u32 filter "
         "on its ingress hook", "mirred"),
        ("egress", "u32 match u32 0 0 action mirred egress redirect dev ifbq", "a 'mirred "
         "(Egress Redirect to' action on its egress hook", "mirred"),
    ],
)  # fmt: skip
def test_down_of_an_interface_keeps_a_clsact_whose_filters_tcdsl_does_not_make(
    tcdsl: Tcdsl, host: HostSupport, hook: str, filter_words: str, said: str, action: str | None
) -> None:
    """Found by a tester: 'down -i' took any u32 filter without an action, and any redirect
    (to another tool's IFB too), for tcdsl's, and removed another tool's clsact with them.
    tcdsl's clsact holds only an mq tree's steering: egress filters with skbedit."""
    if action is not None and action not in host.actions:
        pytest.skip(f"the host lacks act_{action} ({host.notes})")
    run(["ip", "-n", tcdsl.ns, "link", "add", "ifbq", "type", "ifb"])
    tcdsl.tc_lines(
        "qdisc add dev d0 clsact", f"filter add dev d0 {hook} protocol ip prio 5 {filter_words}"
    )
    done = tcdsl("down", "-i", "d0", "--yes")
    assert done.code == 0, done
    assert f"the clsact qdisc of d0 holds {said}, which tcdsl does not make" in " ".join(
        done.out.split()
    ), done
    assert "clsact" in tcdsl.tc("qdisc", "show", "dev", "d0")
    kept = tcdsl.tc("filter", "show", "dev", "d0", hook)
    assert ("mirred" if action else "0a000063/ffffffff") in kept, kept


def test_down_of_an_interface_keeps_an_empty_clsact(tcdsl: Tcdsl) -> None:
    """Found by a review: a clsact without filters, on a device tcdsl never shaped, was
    removed; tcdsl's holds an mq tree's steering."""
    tcdsl.tc_lines("qdisc add dev d0 clsact")
    done = tcdsl("down", "-i", "d0", "--yes")
    assert done.code == 0, done
    said = " ".join(done.out.split())
    assert "the clsact qdisc of d0 holds no filter that steers to a TX queue" in said, done
    assert "clsact" in tcdsl.tc("qdisc", "show", "dev", "d0")


def test_a_download_via_a_device_that_is_no_ifb_is_refused(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a tester: 'download via vx0' with a veth vx0 was applied (the script refuses
    it): d0's arrivals were redirected out of the veth, all lost, and 'down' deleted the veth
    and its peer. Now plan and apply refuse it (E602 at the policy line), nothing changed."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    run(["ip", "-n", tcdsl.ns, "link", "add", "vx0", "type", "veth", "peer", "name", "vx1"])
    policy = tcdsl.write("p.tcp", FULL.replace("    download htb", "    download via vx0 htb"))
    for command in (("plan",), ("apply", "--yes")):
        refused = tcdsl(*command, policy)
        assert refused.code == 1 and "[E602]" in refused.err, refused
        said = " ".join(refused.err.split())
        assert "vx0 exists and is not an ifb device (veth)" in said, said
        assert said.startswith(f"{policy}:1:11: error:"), said
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert not (tcdsl.folder / "state" / "p" / "applied").exists()
    # shaped by another policy: the same refusal, at its line, without telling to apply
    # this policy under that name (found by a tester)
    vx = "interface vx0 htb rate 10mbit default a {\n    class a rate 1mbit\n}\n"
    assert tcdsl("apply", "--yes", "--name", "other", tcdsl.write("vx.tcp", vx)).code == 0
    refused = tcdsl("apply", "--yes", policy)
    said = " ".join(refused.err.split())
    assert refused.code == 1 and said.startswith(f"{policy}:1:11: error:"), refused
    assert "vx0 exists and is not an ifb device (veth)" in said and "--name" not in said, said


def test_an_ifb_another_name_shapes_on_is_not_taken_over(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Found by a review: the other-name check looked at the interfaces alone, so 'two'
    could shape d1's downloads on the IFB 'one' shapes d0's on (its tree replaced: d0's
    downloads then shaped by two's classes), and 'down two' deleted it under d0's redirect.
    Now E602 names 'one', nothing changed."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    one = tcdsl.write("one.tcp", FULL.replace("    download htb", "    download via ifb0 htb"))
    assert tcdsl("apply", "--yes", one).code == 0
    before = tcdsl.tc("class", "show", "dev", "ifb0")
    second = FULL.replace("    download htb", "    download via ifb0 htb")
    two = tcdsl.write("two.tcp", second.replace("interface d0", "interface d1"))
    for command in (("plan",), ("apply", "--yes")):
        refused = tcdsl(*command, two)
        said = " ".join(refused.err.split())
        assert refused.code == 1 and "[E602]" in said, refused
        assert "ifb0 is shaped by the policy applied as 'one'" in said, said
    assert tcdsl.tc("class", "show", "dev", "ifb0") == before
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d1")
    record = json.loads((tcdsl.folder / "state" / "one" / "applied" / "1.json").read_text())
    assert record["ifbs"] == ["ifb0"]


def test_down_deletes_a_downloads_device_only_while_it_is_an_ifb(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """The IFB a download was shaped on, gone and a veth of its name made since: neither
    'down NAME' nor 'down -i' deletes that veth (the kernel ignores 'type ifb' on a delete)."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    policy = tcdsl.write("full.tcp", FULL)
    ns = ["ip", "-n", tcdsl.ns]
    for way in ("name", "interface"):
        assert tcdsl("apply", "--yes", policy).code == 0
        run([*ns, "link", "del", "ifb4d0"])
        run([*ns, "link", "add", "ifb4d0", "type", "veth", "peer", "name", "keep1"])
        run([*ns, "link", "set", "ifb4d0", "alias", "my ifb link"])  # ' ifb ' in ip -d -o
        gone = tcdsl("down", "full") if way == "name" else tcdsl("down", "-i", "d0", "--yes")
        assert gone.code == 0, gone
        links = run([*ns, "link", "show"]).stdout
        assert "ifb4d0" in links and "keep1" in links, (way, links)
        assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0"), way
        run([*ns, "link", "del", "ifb4d0"])


@pytest.mark.parametrize("way", ["down", "rollback", "down -i", "apply"])
def test_an_ifb_another_tool_made_is_shaped_on_but_never_deleted(
    tcdsl: Tcdsl, host: HostSupport, way: str
) -> None:
    """Found by a tester: 'download via ifbz' on an IFB another tool had made (its mirror on
    d1 still sent there) took the device over without a word, and 'down' or 'rollback'
    deleted it. The plan says so; the record keeps that tcdsl did not make it; taking the
    policy down (by name, by interface, by a rollback, or an apply without the download)
    removes its tree and leaves the device, also in later generations."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    ns = ["ip", "-n", tcdsl.ns]
    run([*ns, "link", "add", "ifbz", "type", "ifb"])
    run([*ns, "link", "set", "ifbz", "up"])
    tcdsl.tc("qdisc", "add", "dev", "ifbz", "root", "handle", "9:", "pfifo", "limit", "7")
    upload = FULL.split("    download")[0] + "}\n"
    first = tcdsl.write("up.tcp", upload)
    assert tcdsl("apply", "--yes", first).code == 0
    policy = tcdsl.write("up.tcp", FULL.replace("    download htb", "    download via ifbz htb"))
    shown = tcdsl("plan", policy)
    said = " ".join(shown.out.split())
    assert "ifbz exists and tcdsl did not make it: taking the policy down removes its tree, " \
        "not the device" in said, shown  # fmt: skip
    assert tcdsl("apply", "--yes", policy).code == 0
    assert "htb" in tcdsl.tc("qdisc", "show", "dev", "ifbz")
    again = tcdsl.write("up.tcp", FULL.replace("    download htb", "    download via ifbz htb")
                        .replace("rate 5mbit", "rate 6mbit"))  # fmt: skip
    assert tcdsl("apply", "--yes", again).code == 0  # a later generation keeps it taken
    if way == "down":
        done = tcdsl("down", "up")
    elif way == "rollback":
        done = tcdsl("rollback", "up")
        assert done.code == 0, done
        done = tcdsl("rollback", "up")  # back to the upload alone
    elif way == "down -i":
        done = tcdsl("down", "-i", "d0", "--yes")
        assert "the tree of ifbz" in done.out and "not the device" in done.out, done
    else:
        done = tcdsl("apply", "--yes", tcdsl.write("up.tcp", upload))
    assert done.code == 0, done
    assert run([*ns, "link", "show", "ifbz"], check=False).returncode == 0, way
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "ifbz"), way
    assert "ingress" not in tcdsl.tc("qdisc", "show", "dev", "d0"), way


def test_a_rollback_works_out_which_ifbs_tcdsl_did_not_make(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a review: generation 1 made ifbz, generation 2 (no download) deleted it,
    another tool made an ifbz since; a rollback to generation 1 kept that record's word
    that tcdsl had made it, and 'down' then deleted the other tool's device. A rollback
    works it out as an apply does. And an IFB tcdsl made, shaped on from another interface
    later, is not said to be another's."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    ns = ["ip", "-n", tcdsl.ns]
    via = FULL.replace("    download htb", "    download via ifbz htb")
    upload = FULL.split("    download")[0] + "}\n"
    assert tcdsl("apply", "--yes", tcdsl.write("up.tcp", via)).code == 0
    elsewhere = upload + "interface d1 {\n    download" + via.split("\n    download")[1]
    moved = tcdsl("plan", tcdsl.write("up.tcp", elsewhere))
    assert "+ tree d1 download (via ifbz)" in moved.out and "did not make" not in moved.out, moved
    assert tcdsl("apply", "--yes", tcdsl.write("up.tcp", upload)).code == 0
    assert run([*ns, "link", "show", "ifbz"], check=False).returncode != 0  # tcdsl's: gone
    run([*ns, "link", "add", "ifbz", "type", "ifb"])  # another tool's now
    back = tcdsl("rollback", "up")
    assert back.code == 0, back
    assert "htb" in tcdsl.tc("qdisc", "show", "dev", "ifbz")
    done = tcdsl("down", "up")
    assert done.code == 0, done
    assert run([*ns, "link", "show", "ifbz"], check=False).returncode == 0
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "ifbz")


def test_a_downloads_hand_made_ingress_qdisc_is_named_in_the_plan(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """An old script's ingress qdisc and filter on d0, which a download's redirect replaces:
    the plan says so ('(no state)'), as it does for a root qdisc; it was replaced silently.
    The filters that go with it are named (found by a tester: a monitoring mirror went
    without a word)."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    tcdsl.tc("qdisc", "add", "dev", "d0", "handle", "ffff:", "ingress")
    tcdsl.tc("filter", "add", "dev", "d0", "parent", "ffff:", "protocol", "ip", "u32",
             "match", "u32", "0", "0", "flowid", "ffff:1")  # fmt: skip
    policy = tcdsl.write("full.tcp", FULL)
    tcdsl.tc("filter", "add", "dev", "d0", "parent", "ffff:", "protocol", "ipv6", "pref", "5",
             "u32", "match", "u32", "0", "0", "flowid", "ffff:1")  # fmt: skip
    shown = tcdsl("plan", policy)
    assert shown.code == 4, shown
    said = (
        "tree d0 download (via ifb4d0): replaces the ingress qdisc ffff: on d0, and with it the "
        "filters it holds (ipv6 pref 5, ip pref 49152) (no state)"
    )
    assert said in shown.out, shown
    assert tcdsl("apply", "--yes", policy).code == 0
    shown = tcdsl("plan", policy)
    assert shown.code == 0 and "no changes" in shown.out, shown  # (nothing left to name)


def test_drift_in_one_direction_rebuilds_only_that_directions_tree(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a review: a hand change to the upload's class was also reported as drift of
    the download (whose redirect is on the same device) and both trees were built again;
    and a filter added by hand to d0's ingress is the download's drift, not the upload's.
    (A class's value is set again in place since, and neither tree is built again.)"""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    policy = tcdsl.write("full.tcp", FULL)
    assert tcdsl("apply", "--yes", policy).code == 0
    tcdsl.tc("class", "change", "dev", "d0", "parent", "1:1", "classid", "1:10", "htb",
             "rate", "3mbit")  # fmt: skip
    shown = tcdsl("plan", policy)
    assert "! drift in d0: class 'voip' rate is 3Mbit" in shown.out, shown
    assert "~ class voip: set again as the policy says" in shown.out, shown
    assert "(rebuild)" not in shown.out and "drift in d0 download" not in shown.out, shown
    assert tcdsl("apply", "--yes", policy).code == 0
    tcdsl.tc("filter", "add", "dev", "d0", "parent", "ffff:", "protocol", "ip", "pref", "9",
             "u32", "match", "ip", "src", "10.9.9.9", "action", "mirred", "egress", "mirror",
             "dev", "d1")  # fmt: skip
    shown = tcdsl("plan", policy)
    assert "! drift in d0 download (via ifb4d0): unexpected u32 filter" in shown.out, shown
    assert "! tree d0 download (via ifb4d0): drift (rebuild)" in shown.out, shown
    assert "! drift in d0:" not in shown.out and "! tree d0:" not in shown.out, shown


def test_r2q_10_written_or_not_is_the_same_tree(tcdsl: Tcdsl) -> None:
    """Found by a review: 'r2q 10' written (as import writes it) where the policy before
    left it to tcdsl (which chose 10, the kernel's default, and did not write it) rebuilt
    the whole tree, counters reset, for the same kernel state."""
    low = "interface d0 htb rate 10mbit default bulk {\n    class bulk rate 1mbit\n}\n"
    written = tcdsl.write("w.tcp", low.replace("default", "r2q 10 default"))
    assert tcdsl("apply", "--yes", "--name", "x", tcdsl.write("a.tcp", low)).code == 0
    for policy in (written, tcdsl.folder / "a.tcp"):
        shown = tcdsl("plan", "--name", "x", str(policy))
        assert shown.code == 0 and "no changes" in shown.out, shown
        assert tcdsl("apply", "--yes", "--name", "x", str(policy)).code == 0


def test_down_of_the_interface_keeps_the_state_of_another_namespaces_device(
    tcdsl: Tcdsl, make_netns: Callable[[], str]
) -> None:
    """Namespaces sharing a state folder each have a d0: 'down -i d0' in one forgets the
    policy applied on its own d0, not the one applied on the other's (found by a review)."""
    policy = tcdsl.write("a.tcp", A)
    assert tcdsl("apply", "--yes", policy).code == 0
    other = Tcdsl(_netns(make_netns), tcdsl.folder)  # the same state folder
    gone = other("down", "-i", "d0")
    assert gone.code == 0, gone
    assert "the state of a is of a d0 in another network namespace: left as it is" in gone.out
    assert (tcdsl.folder / "state" / "a").exists()
    assert "htb" in tcdsl.tc("qdisc", "show", "dev", "d0")
    record = json.loads((tcdsl.folder / "state" / "a" / "applied" / "1.json").read_text())
    assert record["netns"].startswith("net:[")
    gone = tcdsl("down", "-i", "d0", "--yes")
    assert gone.code == 0 and "- the state of a" in gone.out, gone
    assert not (tcdsl.folder / "state" / "a").exists()


def test_a_name_applied_in_another_namespace_is_not_changed_or_read_from_this_one(
    tcdsl: Tcdsl, make_netns: Callable[[], str]
) -> None:
    """Namespaces sharing a state folder each have a d0: down, rollback, plan, apply and
    status under a name applied in the other namespace refuse (E603, naming it) and change
    nothing there or here (found by a tester: 'down' in the other namespace deleted that
    namespace's own htb on its d0 and forgot the policy still live where it was applied;
    'rollback' built the older generation there; 'apply' moved the record)."""
    policy = tcdsl.write("a.tcp", A)
    assert tcdsl("apply", "--yes", policy).code == 0
    assert tcdsl("apply", "--yes", tcdsl.write("a.tcp", A.replace("1mbit", "2mbit", 1))).code == 0
    other = Tcdsl(_netns(make_netns), tcdsl.folder)  # the same state folder
    other.tc_lines("qdisc add dev d0 root handle 5: htb default 10")
    theirs = other.tc("qdisc", "show", "dev", "d0").split(" direct_packets_stat")[0]
    ours = tcdsl.tc("class", "show", "dev", "d0")
    for args in (
        ("down", "a"),
        ("rollback", "a"),
        ("plan", policy),
        ("apply", "--yes", policy),
        ("status", "--name", "a"),
        ("status", policy),
    ):
        refused = other(*args)
        assert refused.code == 1, (args, refused)
        assert f"the policy 'a' was applied in network namespace '{tcdsl.ns}'" in refused.err, (
            args,
            refused,
        )
        assert "[E603]" in refused.err and "Traceback" not in refused.err, refused
    assert other.tc("qdisc", "show", "dev", "d0").split(" direct_packets_stat")[0] == theirs
    assert "qdisc htb 5: root" in theirs
    assert tcdsl.tc("class", "show", "dev", "d0") == ours
    assert sorted(p.name for p in (tcdsl.folder / "state" / "a" / "applied").glob("?.json")) == [
        "1.json",
        "2.json",
    ]
    shown = tcdsl("plan", policy)
    assert shown.code == 0 and "no changes" in shown.out, shown


def test_a_name_applied_in_a_namespace_that_is_gone_is_this_ones(
    tcdsl: Tcdsl, make_netns: Callable[[], str]
) -> None:
    """A namespace made again (at boot, by a container's restart) has another inode: the
    record of a namespace that no longer exists is taken as this one's, so its name can be
    applied and taken down again (found by a review: it was refused for good)."""
    policy = tcdsl.write("a.tcp", A)
    assert tcdsl("apply", "--yes", policy).code == 0
    run(["ip", "netns", "del", tcdsl.ns])
    again = Tcdsl(_netns(make_netns), tcdsl.folder)  # the same state folder
    shown = again("plan", policy)
    assert shown.code == 4 and "E603" not in shown.err, shown  # (the tree is missing here)
    assert again("apply", "--yes", policy).code == 0
    assert "htb" in again.tc("qdisc", "show", "dev", "d0")
    gone = again("down", "a")
    assert gone.code == 0, gone
    assert not (tcdsl.folder / "state" / "a").exists()


def test_a_table_outside_the_policys_folder_is_applied_and_read_back(tcdsl: Tcdsl) -> None:
    """A table beside the policy's folder, allowed by --include-path (apply and plan took no
    such option): applied, then 'status --name' and 'rollback' compile the record, which
    the default access refused ('the saved policy no longer compiles')."""
    (tcdsl.folder / "data").mkdir()
    (tcdsl.folder / "pol").mkdir()
    table = tcdsl.folder / "data" / "s.csv"
    header = "Circuit ID,IPv4,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps"
    table.write_text(f"{header}\n1001,10.9.0.1,1,1,10,10\n", encoding="utf-8")
    policy = tcdsl.write(
        "pol/p.tcp",
        "interface d0 htb rate 1gbit default u {\n"
        '    class n rate 100mbit {\n        subscribers download from "../data/s.csv"\n    }\n'
        "    class u rate 1mbit\n}\n",
    )
    allow = ("--include-path", str(tcdsl.folder / "data"))
    refused = tcdsl("apply", "--yes", policy)
    assert refused.code == 1 and "[E023]" in refused.err, refused
    assert tcdsl("apply", "--yes", *allow, policy).code == 0
    table.write_text(f"{header}\n1001,10.9.0.1,1,1,10,10\n1002,10.9.0.2,1,1,10,10\n")
    assert tcdsl("plan", *allow, policy).code == 4
    assert tcdsl("apply", "--yes", *allow, policy).code == 0
    shown = tcdsl("status", "--name", "p", "--format", "json", "--interval", "0.1", cwd=Path("/"))
    assert shown.code == 0, shown
    (tree,) = json.loads(shown.out)["trees"]
    assert {"c1001", "c1002"} <= {c["name"] for c in tree["classes"]}, tree
    back = tcdsl("rollback", "p")
    assert back.code == 0 and "generation 1" in back.out, back
    shown = tcdsl.tc("class", "show", "dev", "d0")  # n, c1001 and u: c1002 has gone
    assert len(re.findall(r"class htb 1:\S+ parent 1:", shown)) == 3, shown


def test_a_device_refusal_points_at_the_policy_line(tcdsl: Tcdsl) -> None:
    """E602 for a device is shown at the line that names it, with a caret, as every
    diagnostic about the policy (it was 'tcdsl: error[E602]: ...' alone)."""
    policy = tcdsl.write("p.tcp", A.replace("interface d0", "interface d9"))
    for command in (("plan",), ("apply", "--yes")):
        refused = tcdsl(*command, policy)
        assert refused.code == 1, refused
        assert refused.err.startswith(f"{policy}:1:11: error: no such device: d9"), refused
        assert "[E602]" in refused.err and "^~" in refused.err, refused


def test_a_device_another_name_shapes_is_not_taken_over(tcdsl: Tcdsl) -> None:
    """Found by a review: applying under a new name replaced the tree another name had
    applied ('(no state)'), and 'down' of the first name then removed the second's tree.
    Now E602 names the policy that shapes the device, nothing changed; under its name the
    change goes on."""
    one = tcdsl.write("one.tcp", A)
    assert tcdsl("apply", "--yes", one).code == 0
    before = tcdsl.tc("class", "show", "dev", "d0")
    two = tcdsl.write("two.tcp", B)
    for command in ("plan", "apply"):
        refused = tcdsl(command, *(["--yes"] if command == "apply" else []), two)
        assert refused.code == 1 and "[E602]" in refused.err, refused
        said = " ".join(refused.err.split())
        assert "d0 is shaped by the policy applied as 'one'" in said, said
        assert "(--name one)" in said and "(tcdsl down one)" in said, said
    assert tcdsl.tc("class", "show", "dev", "d0") == before
    assert not (tcdsl.folder / "state" / "two" / "applied").exists()
    done = tcdsl("apply", "--yes", "--name", "one", two)
    assert done.code == 0 and "1:40" in tcdsl.tc("class", "show", "dev", "d0"), done


def test_applies_under_two_names_at_once_do_not_both_take_the_device(
    tcdsl: Tcdsl, tmp_path: Path
) -> None:
    """Found by a review: the check of the other names ran before the interface locks, so
    two applies under two names at once both found d0 free and the second replaced the
    first's tree (both exit 0). Now it is made again under the locks, which are held to the
    record: of two applies waiting for d0's lock, one applies and the other is E602."""
    from tcdsl.commands import lock_name
    from tcdsl.lock import held

    locks = tmp_path / "locks"
    locks.mkdir()
    env = dict(tcdsl.env, TCDSL_LOCK_DIR=str(locks))
    paths = [tcdsl.write("one.tcp", A), tcdsl.write("two.tcp", B)]
    with held(locks / lock_name("d0")):
        runs = [
            subprocess.Popen(
                ["ip", "netns", "exec", tcdsl.ns, *TCDSL, "apply", "--yes", path],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for path in paths
        ]
        time.sleep(3)  # both past their plan, waiting for d0
        assert [r.poll() for r in runs] == [None, None], [r.communicate() for r in runs]
    outputs = [r.communicate(timeout=120) for r in runs]
    codes = sorted(r.returncode for r in runs)
    assert codes == [0, 1], outputs
    refused = next(err for r, (_, err) in zip(runs, outputs, strict=True) if r.returncode)
    assert "[E602]" in refused and "is shaped by the policy applied as" in refused, refused
    winner = "one" if runs[0].returncode == 0 else "two"
    assert ("1:40" in tcdsl.tc("class", "show", "dev", "d0")) == (winner == "two")
    assert [p.name for p in (tcdsl.folder / "state").iterdir() if p.is_dir()
            and (p / "applied").exists()] == [winner]  # fmt: skip


def test_an_unfinished_apply_under_another_name_holds_its_devices(tcdsl: Tcdsl) -> None:
    """A killed apply under another name (its applying.json left) may have built part of its
    tree: an apply under a new name on that device is E602 until that name is rolled back."""
    one = tcdsl.write("one.tcp", A)
    start = (  # as 'apply' leaves it when killed during the change, in the namespace
        "import sys; from pathlib import Path; from tcdsl.ops.state import Store; "
        "Store('one', Path(sys.argv[1])).start(sys.argv[2], {sys.argv[2]: sys.argv[3]}, "
        "('d0',), {})"
    )
    state = tcdsl.env["TCDSL_STATE_DIR"]
    run(["ip", "netns", "exec", tcdsl.ns, sys.executable, "-c", start, state, one, A])
    two = tcdsl.write("two.tcp", B)
    refused = tcdsl("apply", "--yes", two)
    said = " ".join(refused.err.split())
    assert refused.code == 1 and "d0 is shaped by an apply under the name 'one' that did not" \
        in said and "(tcdsl rollback one)" in said, refused  # fmt: skip
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert tcdsl("rollback", "one").code == 0  # nothing was live: the unfinished apply goes
    assert tcdsl("apply", "--yes", two).code == 0


def test_rollback_to_a_device_another_name_took_is_refused(tcdsl: Tcdsl) -> None:
    """Found by a review: rollback checked the other names only when the earlier policy had
    an mq tree or an ingress slot. 'one' shaped d0 and e0, then d0 alone; 'two' took e0; a
    rollback of 'one' would have replaced two's tree on e0. Now E602 names 'two', nothing
    changed."""
    run(["ip", "-n", tcdsl.ns, "link", "add", "e0", "type", "veth", "peer", "name", "e1"])
    both = A + A.replace("interface d0", "interface e0")
    one = tcdsl.write("one.tcp", both)
    assert tcdsl("apply", "--yes", one).code == 0
    tcdsl.write("one.tcp", A)
    assert tcdsl("apply", "--yes", one).code == 0
    two = tcdsl.write("two.tcp", B.replace("interface d0", "interface e0"))
    assert tcdsl("apply", "--yes", two).code == 0
    before = tcdsl.tc("class", "show", "dev", "e0")
    refused = tcdsl("rollback", "one")
    said = " ".join(refused.err.split())
    assert refused.code == 1 and "[E602]" in said, refused
    assert "e0 is shaped by the policy applied as 'two'" in said, said
    assert tcdsl.tc("class", "show", "dev", "e0") == before
    assert (tcdsl.folder / "state" / "one" / "applied" / "2.json").is_file()


def test_a_rollback_recorded_without_its_cache_warns_and_stands(tcdsl: Tcdsl) -> None:
    """Only the kernel's digest after a rollback (a cache) cannot be written: the rollback
    stands and is recorded, exit 0 with W609 (it was E603, exit 1)."""
    p = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", p).code == 0
    tcdsl.write("p.tcp", B)
    assert tcdsl("apply", "--yes", p).code == 0
    applied = tcdsl.folder / "state" / "p" / "applied"
    (applied / "1.kernel.json").unlink(missing_ok=True)
    (applied / "1.kernel.json" / "in-the-way").mkdir(parents=True)  # no file fits there
    back = tcdsl("rollback", "p")
    assert back.code == 0, back
    assert "[W609]" in back.err and "generation 1 as live again" in " ".join(back.err.split())
    assert "rolled back p to generation 1" in back.out, back
    assert "1:40" not in tcdsl.tc("class", "show", "dev", "d0")
    assert not (applied / "2.json").exists()


def test_the_kernel_read_lists_a_clsacts_egress_filters(make_netns: Callable[[], str]) -> None:
    """Found by a review: the filters on a clsact's egress (an mq tree's steering, under
    ffff:fff3) were never read: a deleted one was no drift, and any other drift listed them
    all as missing (the whole tree rebuilt)."""
    ns = _netns(make_netns)
    tc = ["ip", "netns", "exec", ns, "tc"]
    run([*tc, "qdisc", "add", "dev", "d0", "clsact"])
    steer = "protocol ip pref 1 u32 match ip dst 10.0.0.1/32 classid 1:2"
    run([*tc, "filter", "add", "dev", "d0", "egress", *steer.split()])
    program = (
        "import json; from tcdsl.ops.live import fingerprint, read_device\n"
        "d = read_device('d0')\n"
        "print(json.dumps([sorted(d.filters), fingerprint(['d0'])['d0']]))\n"
    )
    read = [*tc[:-1], sys.executable, "-c", program]
    parents, before = json.loads(run(read).stdout)
    assert parents == ["ffff:fff3"]
    run([*tc, "filter", "del", "dev", "d0", "egress"])
    parents, after = json.loads(run(read).stdout)
    assert parents == [] and after != before


MARKED = """\
interface d0 htb rate 10mbit default bulk {
    classify by mark from local
    class voip rate 2mbit match proto udp dport 5001
    class bulk rate 1mbit
}
"""


def test_a_teardown_reads_back_every_qdisc_it_deletes_when_tc_fails() -> None:
    """Found by a review: only the commands tc named ('Command failed -:N') were read back, so
    a tc stopped without a word (a signal, the OOM killer) let a teardown pass with its
    qdiscs still there. Every qdisc the step deletes is read back as 'tc qdisc show' prints
    it (tc's own output, as the kernel gives it: a root of handle 0: is the kernel's)."""
    from tcdsl.ops.apply import run_step
    from tcdsl.ops.plan import Step

    shown = {
        "d0": "qdisc noqueue 0: root refcnt 2\nqdisc ingress ffff: parent ffff:fff1 ----\n",
        "d1": "qdisc htb 1: root refcnt 2 r2q 10\nqdisc clsact ffff: parent ffff:fff1\n",
        "d2": "qdisc mq 0: root \nqdisc pfifo_fast 0: parent :1 bands 3\n",
    }

    def runner(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        if list(argv[:3]) == ["tc", "qdisc", "show"]:
            device = argv[-1]
            if device not in shown:
                return subprocess.CompletedProcess(argv, 1, "", f'Cannot find device "{device}"\n')
            return subprocess.CompletedProcess(argv, 0, shown[device], "")
        return subprocess.CompletedProcess(argv, -15, "", "")  # stopped, saying nothing

    def teardown(*commands: str) -> Step:
        words = tuple(tuple(c.split()) for c in commands)
        return Step("tc", words, tuple(None for _ in words), fatal=False)

    left = run_step(teardown("qdisc del dev d0 root", "qdisc del dev d0 ingress"), runner)
    assert left is not None and left.command == "tc qdisc del dev d0 ingress", left
    assert "tc said nothing of it" in left.message
    left = run_step(teardown("qdisc del dev d1 ingress", "qdisc del dev d1 root"), runner)
    assert left is not None and left.command == "tc qdisc del dev d1 root", left
    assert run_step(teardown("qdisc del dev d1 clsact"), runner) is not None
    assert run_step(teardown("qdisc del dev d2 root", "qdisc del dev d2 ingress"), runner) is None
    assert run_step(teardown("qdisc del dev gone0 root", "filter del dev d0"), runner) is None


def test_a_batch_is_whole_even_when_tcdsl_is_killed_while_it_runs(tmp_path: Path) -> None:
    """Found by a tester: batches were fed to 'tc -batch -' through a pipe, so a kill -9 of
    tcdsl while it fed one cut the batch short (327 of 3,000 classes made). The command reads
    a file written whole before it starts, and writes to files: it outlives tcdsl, and
    reads all of it."""
    out = tmp_path / "read"
    text = "".join(f"class add dev d0 parent 1:1 classid 1:{n:x} htb rate 1mbit\n"
                   for n in range(1, 60_000))  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from tcdsl.ops.apply import run_command; "
         f"run_command(['sh', '-c', 'sleep 0.5; cat > {out}; echo done >&2'], sys.stdin.read())"],
        stdin=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert child.stdin is not None
    child.stdin.write(text)
    child.stdin.close()
    time.sleep(0.3)  # the command has started, and is sleeping
    child.kill()
    child.wait(timeout=10)
    for _ in range(100):
        if out.exists() and out.stat().st_size == len(text):
            break
        time.sleep(0.05)
    assert out.read_text(encoding="utf-8") == text


MARKING_STEP = """
import sys
from tcdsl.driver import analyse
from tcdsl.commands import interface_commands
from tcdsl.ops.apply import run_step
from tcdsl.ops.desired import trees_from_json, trees_json, trees_of
from tcdsl.ops.plan import Plan, make_plan
from tcdsl.ops.desired import trees_of
import subprocess
a, b = (analyse(p).policy for p in sys.argv[1:3])
for c in interface_commands(a.interfaces[0]):
    if c.tool in ("iptables", "ip6tables"):
        subprocess.run([c.tool, *c.args], check=True)
plan = make_plan(trees_of(a), trees_of(b))
print("\\n".join(c.render() for c in plan.changes))
for step in plan.steps:
    if step.tool.endswith("-restore"):
        print("restore", step.tool, run_step(step))
"""


def test_a_changed_mark_rule_replaces_the_chain_in_one_commit(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """A mark rule changes (its jumps do not): no rebuild of the tree; each table's chain is
    replaced by one 'iptables-restore --noflush' (run here on the host's netfilter: the host
    has no fw classifier for the tc side), the jumps and other chains left as they were."""
    if not (host.iptables and host.ip6tables):
        pytest.skip("needs iptables and ip6tables")
    ns = _netns(make_netns)
    a, b = tmp_path / "a.tcp", tmp_path / "b.tcp"
    a.write_text(MARKED, encoding="utf-8")
    b.write_text(MARKED.replace("dport 5001", "dport 5002"), encoding="utf-8")
    run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-N", "theirs"])
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", MARKING_STEP, str(a), str(b)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "! " not in done.stdout and "~ marking of d0: " in done.stdout, done.stdout
    restored = [line for line in done.stdout.splitlines() if line.startswith("restore ")]
    assert restored == ["restore iptables-restore None", "restore ip6tables-restore None"]
    assert done.stdout.count("~ marking of d0") == 1, done.stdout
    for tool in ("iptables", "ip6tables"):
        saved = run(["ip", "netns", "exec", ns, f"{tool}-save", "-t", "mangle"]).stdout
        assert "--dport 5002" in saved and "--dport 5001" not in saved, saved
        assert saved.count("-j TCDSL-d0") == 1, saved
    assert ":theirs" in run(["ip", "netns", "exec", ns, "iptables-save", "-t", "mangle"]).stdout


HASHED = (
    "interface d0 htb rate 1gbit default rest {\n"
    + "".join(f"    class c{i} rate 1mbit match dst 10.0.0.{i}\n" for i in range(40))
    + "    class wide rate 1mbit match dst 10.0.0.0/8\n    class rest rate 1mbit\n}\n"
)


def _udp_to(ns: str, address: str, count: int) -> None:
    """``count`` UDP packets out of d0 to ``address`` (a static neighbour: no ARP)."""
    run(["ip", "-n", ns, "neigh", "replace", address, "lladdr", "02:00:00:00:00:02", "dev", "d0"])
    send = f"import socket\nfor _ in range({count}):\n"
    send += f"    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{address}', 9))"
    run(["ip", "netns", "exec", ns, sys.executable, "-c", send])


def _packets(tcdsl: Tcdsl, classid: str) -> int:
    shown = tcdsl.tc("-s", "class", "show", "dev", "d0", "classid", classid)
    return int(shown.split(" pkt")[0].rsplit(" ", 1)[1])


def test_a_hashed_pref_changes_in_place_and_goes(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A pref laid out in u32 hash tables (tcdsl.u32layout): applied; subscribers added,
    removed, moved inside the tables node by node (no rebuild: the other classes keep their
    counters, and packets reach the new lines); a change of the tables themselves built
    again (u32 keeps a deleted pref's tables a while, under ids the new one needs); its lines
    all removed, and the tree taken down."""
    run(["ip", "-n", tcdsl.ns, "addr", "add", "10.0.0.254/8", "dev", "d0"])
    a = tcdsl.write("hashed.tcp", HASHED)
    assert tcdsl("apply", "--yes", a).code == 0
    assert "divisor 256" in tcdsl.tc("filter", "show", "dev", "d0")
    _udp_to(tcdsl.ns, "10.0.0.3", 5)
    kept = _packets(tcdsl, "1:40")  # c3
    assert kept == 5
    edited = HASHED.replace("dst 10.0.0.5\n", "dst 10.0.1.5\n")
    edited = edited.replace("    class c7 rate 1mbit match dst 10.0.0.7\n", "")
    edited = edited.replace(
        "    class c20", "    class n1 rate 1mbit match dst 10.0.2.20\n    class c20"
    )
    b = tcdsl.write("hashed.tcp", edited)
    planned = tcdsl("plan", b)
    assert "rebuild" not in planned.out and "+ class n1" in planned.out, planned
    assert "- class c7" in planned.out and "+ filter c5 (match ip dst 10.0.1.5)" in planned.out
    changed = tcdsl("apply", "--yes", b)
    assert changed.code == 0, changed
    assert tcdsl("plan", b).out == "no changes\n"
    assert "the kernel agrees" in tcdsl("verify", b).err
    shown = tcdsl.tc("filter", "show", "dev", "d0")
    assert shown.count("divisor 256") == 1 and "0a000105/ffffffff" in shown, shown
    assert "0a000005/ffffffff" not in shown and "0a000007/ffffffff" not in shown, shown
    assert _packets(tcdsl, "1:40") == kept  # not built again
    _udp_to(tcdsl.ns, "10.0.1.5", 3)
    _udp_to(tcdsl.ns, "10.0.2.20", 2)
    assert _packets(tcdsl, "1:60") == 3  # c5
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", b)
    ids = {c["name"]: c["classid"] for i in json.loads(shown.out)["trees"] for c in i["classes"]}
    assert _packets(tcdsl, ids["n1"]) == 2
    split = edited.replace(
        "    class c30", "    class wide24 rate 1mbit match dst 10.0.0.0/24\n    class c30"
    )
    c = tcdsl.write("hashed.tcp", split)
    planned = tcdsl("plan", c)
    assert "rebuild" not in planned.out and "+ filter wide24" in planned.out, planned
    for text in (split, edited, split):  # the tables change: swapped, ids used again
        path = tcdsl.write("hashed.tcp", text)
        assert tcdsl("apply", "--yes", path).code == 0
        assert tcdsl("plan", path).out == "no changes\n"
    assert tcdsl("plan", c).out == "no changes\n"
    assert "the kernel agrees" in tcdsl("verify", c).err
    assert _packets(tcdsl, "1:40") == kept  # not built again
    _udp_to(tcdsl.ns, "10.0.0.3", 4)
    assert _packets(tcdsl, "1:40") == kept + 4
    few = "interface d0 htb rate 1gbit default rest {\n    class rest rate 1mbit\n}\n"
    d = tcdsl.write("hashed.tcp", few)
    planned = tcdsl("plan", d)
    assert "rebuild" not in planned.out and "- class c3" in planned.out, planned
    assert tcdsl("apply", "--yes", d).code == 0
    assert "u32" not in tcdsl.tc("filter", "show", "dev", "d0")
    # the tables went with their group: the same ids are made again
    back = tcdsl("apply", "--yes", a)
    assert back.code == 0, back
    assert "the kernel agrees" in tcdsl("verify", a).err
    assert tcdsl("down", "hashed").code == 0


def test_hashed_tables_without_a_free_pref_change_in_place(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Tables that change in a pref with no free pref next to it (ssh at pref 2): the pref is
    deleted and built again, not the tree (the other classes keep their counters), its
    tables deleted through ssh's pref, so that the same ids are made again later."""
    run(["ip", "-n", tcdsl.ns, "addr", "add", "10.0.0.254/8", "dev", "d0"])
    ssh = "    class ssh rate 1mbit match dport 22 pref 2\n    class rest"
    grown = HASHED.replace("    class wide", "".join(
        f"    class t{j} rate 1mbit match dst 10.0.{j}.7\n" for j in range(1, 41)
    ) + "    class wide")  # fmt: skip
    texts = [t.replace("    class rest", ssh) for t in (HASHED, grown, HASHED, grown)]
    assert tcdsl("apply", "--yes", tcdsl.write("hashed.tcp", texts[0])).code == 0
    _udp_to(tcdsl.ns, "10.0.0.3", 5)
    for text in texts[1:]:
        path = tcdsl.write("hashed.tcp", text)
        planned = tcdsl("plan", path)
        assert "rebuild" not in planned.out and "filter t1 (" in planned.out, planned
        done = tcdsl("apply", "--yes", path)
        assert done.code == 0, done
        assert tcdsl("plan", path).out == "no changes\n"
        assert "the kernel agrees" in tcdsl("verify", path).err
    assert _packets(tcdsl, "1:40") == 5  # c3's: not built again
    _udp_to(tcdsl.ns, "10.0.0.3", 2)
    assert _packets(tcdsl, "1:40") == 7


def test_hashed_tables_are_swapped_with_every_subscriber_classified(
    make_netns: Callable[[], str], tmp_path: Path, host: HostSupport
) -> None:
    """Applies that change u32 hash tables themselves (subscribers added in one bucket's
    range, both families; rows reordered around a wider prefix; most removed; back), run one
    tc command at a time with frames to unchanged subscribers after each: every frame counted
    by its subscriber's class (tests/ops_swap.py), no rebuild, the kernel the policy after
    each apply, and the tables of old groups and copies gone (their ids are made again)."""
    ns = _netns(make_netns)
    quiet = Path("/proc/sys/net/ipv6/conf")
    if quiet.exists():  # d0's own IPv6 packets (router solicitations) would be counted too
        run(["ip", "netns", "exec", ns, "sh", "-c", f"echo 1 > {quiet}/d0/disable_ipv6"])
    args = ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.ops_swap", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print({k: v for k, v in found.items() if k != "problems"})
    assert found["problems"] == [], "\n".join(found["problems"][:10])
    assert found["swaps"] >= 4 and found["probes"] > 5000


def test_a_leaf_that_gets_children_applies_in_place(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A leaf class with its own qdisc that becomes a parent: htb destroys the leaf qdisc
    when the first child is added, so the plan removes it first (deleting it after failed,
    and the apply rolled back); the tree is not built again."""
    old = (
        "interface d0 htb rate 100mbit default z {\n"
        "    class a rate 10mbit match dst 10.0.0.7 { pfifo limit 4 }\n"
        "    class z rate 1mbit\n}\n"
    )
    p = tcdsl.write("leaf.tcp", old)
    assert tcdsl("apply", "--yes", p).code == 0
    new = old.replace(
        "    class a rate 10mbit match dst 10.0.0.7 { pfifo limit 4 }\n",
        "    class a rate 10mbit {\n"
        "        class a2 rate 1mbit match dst 10.0.0.7 { pfifo limit 4 }\n"
        "    }\n",
    )
    p = tcdsl.write("leaf.tcp", new)
    planned = tcdsl("plan", p)
    assert "rebuild" not in planned.out and "+ class a2" in planned.out, planned
    applied = tcdsl("apply", "--yes", p)
    assert applied.code == 0, applied
    assert tcdsl("plan", p).out == "no changes\n"
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", p)
    ids = {c["name"]: c["classid"] for t in json.loads(shown.out)["trees"] for c in t["classes"]}
    qdiscs = tcdsl.tc("qdisc", "show", "dev", "d0")
    assert f"parent {ids['a2']} limit 4p" in qdiscs and qdiscs.count("pfifo") == 1, qdiscs


SUBSCRIBERS = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
    "101,Smith,1,cpe-1,north,,10.99.1.1,,1,1,5,1,\n"
    "102,Jones,2,cpe-2,north,,10.99.1.2,,2,1,10,1,\n"
)
TABLE_POLICY = """\
interface d0 htb rate 100mbit default other {
    subscribers download from "subs.csv" { pfifo }
    class other rate 1mbit
}
"""


def test_a_saved_policy_compiles_with_its_saved_table(tmp_path: Path) -> None:
    """A state record's policy is compiled again from the record's text, its subscriber
    tables too: not from the file as it is now (edited since, or gone)."""
    from tcdsl.ops.lifecycle import compile_applied
    from tcdsl.ops.state import Store

    (tmp_path / "subs.csv").write_text(SUBSCRIBERS, encoding="utf-8")
    path = tmp_path / "p.tcp"
    path.write_text(TABLE_POLICY, encoding="utf-8")
    result = analyse(str(path))
    assert result.policy is not None, result.diagnostics
    store = Store("p", tmp_path / "state")
    applied = store.record(str(path), result.sources, ("d0",), {})
    assert str(tmp_path / "subs.csv") in applied.sources

    def names() -> list[str]:
        policy = compile_applied(dataclasses.replace(applied, applied_at=time.time()))
        return [c.name for c in ir.classes_of(policy.interfaces[0].root) if c.name]

    assert names() == ["c101", "c102", "other"]
    added = SUBSCRIBERS + "103,Brown,3,cpe-3,north,,10.99.1.3,,1,1,5,1,\n"
    (tmp_path / "subs.csv").write_text(added, encoding="utf-8")
    assert names() == ["c101", "c102", "other"]  # not the edited file's c103
    (tmp_path / "subs.csv").unlink()
    assert names() == ["c101", "c102", "other"]


def test_changed_since_reads_files_as_the_compiler_does(tmp_path: Path) -> None:
    """What status reports as changed since the apply: a table saved with a byte-order mark
    (as Excel writes it) or CR LF line ends is not changed; an edited or removed one is."""
    from tcdsl.ops.lifecycle import changed_since
    from tcdsl.ops.state import Store

    table = tmp_path / "subs.csv"
    table.write_bytes(b"\xef\xbb\xbf" + SUBSCRIBERS.replace("\n", "\r\n").encode())
    path = tmp_path / "p.tcp"
    path.write_text(TABLE_POLICY, encoding="utf-8")
    result = analyse(str(path))
    assert result.policy is not None, result.diagnostics
    applied = Store("p", tmp_path / "state").record(str(path), result.sources, ("d0",), {})
    assert changed_since(applied) == []
    table.write_text(SUBSCRIBERS.replace("10.99.1.2", "10.99.1.9"), encoding="utf-8")
    assert changed_since(applied) == [(str(table), False)]
    table.unlink()
    assert changed_since(applied) == [(str(table), True)]


def test_rollback_restores_the_previous_table(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A table edited and applied, then rolled back: the kernel is the first table's again
    (the rollback compiles the saved table, not the file as it is now, which may have changed
    again or be gone), and the next plan of the first table is empty."""
    table = tcdsl.folder / "subs.csv"
    table.write_text(SUBSCRIBERS, encoding="utf-8")
    p = tcdsl.write("p.tcp", TABLE_POLICY)
    assert tcdsl("apply", "--yes", p).code == 0
    first = tcdsl.tc("class", "show", "dev", "d0")
    added = SUBSCRIBERS + "103,Brown,3,cpe-3,north,,10.99.1.3,,1,1,5,1,\n"
    table.write_text(added.replace(",2,1,10,1,", ",4,1,20,1,"), encoding="utf-8")
    applied = tcdsl("apply", "--yes", p)
    assert applied.code == 0 and "+ class c103" in applied.out, applied
    table.unlink()  # moved away after the apply
    back = tcdsl("rollback", "p")
    assert back.code == 0, back
    assert tcdsl.tc("class", "show", "dev", "d0") == first
    assert "10.99.1.3" not in tcdsl.tc("filter", "show", "dev", "d0")
    table.write_text(SUBSCRIBERS, encoding="utf-8")
    assert tcdsl("plan", p).code == 0
    # and with the file edited (not applied) instead of gone
    table.write_text(added, encoding="utf-8")
    assert tcdsl("apply", "--yes", p).code == 0
    table.write_text(added.replace("10.99.1.2", "10.99.1.9"), encoding="utf-8")
    assert tcdsl("rollback", "p").code == 0
    assert tcdsl.tc("class", "show", "dev", "d0") == first
    assert "0a630109" not in tcdsl.tc("filter", "show", "dev", "d0")


def test_status_shows_the_policy_as_applied(tcdsl: Tcdsl, host: HostSupport) -> None:
    """status names what is live: the policy and its table as applied, not the table as
    edited since (not applied) or gone; it says on stderr which files changed."""
    table = tcdsl.folder / "subs.csv"
    table.write_text(SUBSCRIBERS, encoding="utf-8")
    p = tcdsl.write("p.tcp", TABLE_POLICY)
    assert tcdsl("apply", "--yes", p).code == 0

    def names() -> tuple[list[str], str]:
        shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", p)
        assert shown.code == 0, shown
        trees = json.loads(shown.out)["trees"]
        return sorted(
            c["name"] for t in trees for c in t["classes"] if c["name"] != "(link)"
        ), shown.err

    assert names() == (["c101", "c102", "other"], "")
    table.write_text(SUBSCRIBERS + "103,Brown,3,cpe-3,north,,10.99.1.3,,1,1,5,1,\n", "utf-8")
    found, err = names()
    assert found == ["c101", "c102", "other"] and f"{table} changed since" in err, err
    table.unlink()
    found, err = names()
    assert found == ["c101", "c102", "other"] and f"{table} is gone since" in err, err
    assert "generation 1" in err and f"{p} changed" not in err, err


def test_status_finds_a_policy_applied_under_another_name(tcdsl: Tcdsl, host: HostSupport) -> None:
    """apply --name keeps the state under that name: status --name reads it, so a class
    added before the others is shown with the id apply gave it, not a fresh numbering."""
    text = "interface d0 htb rate 100mbit default ssh {\n%s    class ssh rate 10mbit\n}\n"
    web = "    class web rate 10mbit match dport 80\n"
    p = tcdsl.write("n.tcp", text % web)
    assert tcdsl("apply", "--yes", "--name", "site1", p).code == 0
    p = tcdsl.write("n.tcp", text % ("    class voip rate 1mbit match dport 5060\n" + web))
    assert tcdsl("apply", "--yes", "--name", "site1", p).code == 0
    shown = tcdsl("status", "--name", "site1", "--format", "json", "--count", "1",
                  "--interval", "0.1", p)  # fmt: skip
    assert shown.code == 0, shown
    ids = {c["name"]: c["classid"] for t in json.loads(shown.out)["trees"] for c in t["classes"]}
    web_shown = tcdsl.tc("class", "show", "dev", "d0", "classid", ids["web"])
    assert "rate 10Mbit" in web_shown, (ids, web_shown)
    voip = tcdsl.tc("class", "show", "dev", "d0", "classid", ids["voip"])
    assert "rate 1Mbit" in voip, (ids, voip)


def test_status_knows_the_applied_file_from_any_directory(tcdsl: Tcdsl, host: HostSupport) -> None:
    """The record names files as apply was given them (relative to where it ran): status
    run elsewhere still knows the applied file by its own path, and does not take another
    file of the same relative name for it."""
    table = tcdsl.folder / "subs.csv"
    table.write_text(SUBSCRIBERS, encoding="utf-8")
    p = tcdsl.write("p.tcp", TABLE_POLICY)
    assert tcdsl("apply", "--yes", "p.tcp", cwd=tcdsl.folder).code == 0
    table.rename(tcdsl.folder / "subs.bak")
    args = ("status", "--format", "json", "--count", "1", "--interval", "0.1")
    shown = tcdsl(*args, p)  # from the repository's root, by its absolute path
    assert shown.code == 0 and "subs.csv is gone since" in shown.err, shown
    other = tcdsl.folder / "other"
    other.mkdir()
    (other / "p.tcp").write_text(
        "interface d0 htb rate 100mbit default other {\n    class other rate 1mbit\n}\n",
        encoding="utf-8",
    )
    shown = tcdsl(*args, "p.tcp", cwd=other)  # the same relative name, another file
    assert shown.code == 0 and shown.err == "", shown
    names = [c["name"] for t in json.loads(shown.out)["trees"] for c in t["classes"]]
    assert "c101" not in names and "other" in names, names


def test_classify_gives_the_ids_apply_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A class added before others in a live policy takes a free id and leaves theirs (the
    state keeps them): ``classify`` names the ids the kernel counts under, as ``status``."""
    from click.testing import CliRunner

    from tcdsl.cli import cli
    from tcdsl.ops.state import Store

    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "p.tcp"
    path.write_text(A, encoding="utf-8")
    result = analyse(str(path))
    assert result.policy is not None
    ids = {"voip": "1:10", "web": "1:20", "bulk": "1:30"}
    Store("p").record(str(path), result.sources, ("d0",), {"d0": ids})
    added = A.replace("    class web", "    class ssh rate 1mbit match dport 22\n    class web")
    path.write_text(added, encoding="utf-8")
    shown = CliRunner().invoke(
        cli, ["classify", str(path), "--packet", "tcp dport 80", "--packet", "tcp dport 22"]
    )
    assert shown.exit_code == 0, shown.output
    assert "-> class 'web' (1:20)" in shown.output, shown.output
    assert "-> class 'ssh' (1:20)" not in shown.output and "-> class 'ssh' (1:" in shown.output
    # a damaged record: the answer for the file alone, not a traceback
    Store("p").record(str(path), result.sources, ("d0",), {"d0": {**ids, "voip": "1:zz"}})
    shown = CliRunner().invoke(cli, ["classify", str(path), "--packet", "udp dport 5001"])
    assert shown.exit_code == 0 and "-> class 'voip' (1:10)" in shown.output, shown.output


SITES = """\
interface d0 htb rate 100mbit default other {
    class north rate 10mbit ceil 100mbit {
        subscribers download from "subs.csv" where parent_node == "north" { pfifo }
    }
    class south rate 10mbit ceil 100mbit {
        subscribers download from "subs.csv" where parent_node == "south" pref 2 { pfifo }
    }
    class other rate 1mbit
}
"""


def test_a_subscriber_moved_to_another_site_moves_in_place(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A circuit moved to another parent node: htb cannot move a class, so the subscriber
    gets a new class under its new site (a new id), its filters move to it and the old class
    goes; the tree is not built again (the other subscribers keep their counters)."""
    table = tcdsl.folder / "subs.csv"
    rows = SUBSCRIBERS + "103,Brown,3,cpe-3,south,,10.99.1.3,,1,1,5,1,\n"
    table.write_text(rows, encoding="utf-8")
    p = tcdsl.write("p.tcp", SITES)
    assert tcdsl("apply", "--yes", p).code == 0
    run(["ip", "-n", tcdsl.ns, "addr", "add", "10.99.0.1/16", "dev", "d0"])
    _udp_to(tcdsl.ns, "10.99.1.1", 3)
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", p)
    ids = {c["name"]: c["classid"] for i in json.loads(shown.out)["trees"] for c in i["classes"]}
    assert _packets(tcdsl, ids["c101"]) == 3
    table.write_text(rows.replace(",cpe-2,north,", ",cpe-2,south,"), encoding="utf-8")
    planned = tcdsl("plan", p)
    assert "rebuild" not in planned.out, planned
    # one line for the move, not the class added and removed (its leaf neither)
    moving = "~ class c102 moves from north to south: made again as 1:"
    assert moving in planned.out and f"(was {ids['c102']})" in planned.out, planned
    assert "+ class c102" not in planned.out and "- class c102" not in planned.out, planned
    assert "qdisc" not in planned.out, planned
    moved = tcdsl("apply", "--yes", p)
    assert moved.code == 0, moved
    assert tcdsl("plan", p).out == "no changes\n"
    assert _packets(tcdsl, ids["c101"]) == 3  # not built again
    shown = tcdsl("status", "--format", "json", "--count", "1", "--interval", "0.1", p)
    now = {c["name"]: c["classid"] for i in json.loads(shown.out)["trees"] for c in i["classes"]}
    assert now["c101"] == ids["c101"] and now["c102"] != ids["c102"], now
    assert f"parent {ids['south']}" in tcdsl.tc(
        "class", "show", "dev", "d0", "classid", now["c102"]
    )
    assert ids["c102"] + " " not in tcdsl.tc("class", "show", "dev", "d0") + " "
    _udp_to(tcdsl.ns, "10.99.1.2", 2)
    assert _packets(tcdsl, now["c102"]) == 2
    assert tcdsl("rollback", "p").code == 0
    back = tcdsl.tc("class", "show", "dev", "d0", "classid", ids["c102"])
    assert f"parent {ids['north']}" in back, back


def test_a_subscriber_moved_among_hashed_ones_plans_its_own_lines_only(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """A circuit moved to another site among enough to go into u32 tables: the plan names the
    move and that circuit's filters, not every later circuit of its old site (found by a
    tester: 122 lines '~ filter c1003 ...: its action' for one moved circuit, compared by
    their place in the commands, which the move shifted by one)."""
    head = SUBSCRIBERS.splitlines(keepends=True)[0]
    rows = "".join(
        f"{100 + i},N{i},{i},cpe-{i},{'north' if i < 40 else 'south'},,10.99.1.{i},,1,1,5,1,\n"
        for i in range(1, 46)
    )
    table = tcdsl.folder / "subs.csv"
    table.write_text(head + rows, encoding="utf-8")
    # both sites' lines at one pref: one group, whose commands the move shifts
    p = tcdsl.write("p.tcp", SITES.replace(" pref 2", ""))
    assert tcdsl("apply", "--yes", p).code == 0
    assert "ht divisor 256" in tcdsl.tc("filter", "show", "dev", "d0")  # the tables it is about
    table.write_text(head + rows.replace(",cpe-3,north,", ",cpe-3,south,"), encoding="utf-8")
    planned = tcdsl("plan", p)
    assert "~ class c103 moves from north to south" in planned.out, planned
    assert "c104" not in planned.out and "c120" not in planned.out, planned
    acting = [line.strip() for line in planned.out.splitlines() if "its action" in line]
    assert acting == [f"~ filter c103 (match ip dst 10.99.1.3): its action  ({table}:4)"], planned
    assert tcdsl("apply", "--yes", p).code == 0
    assert tcdsl("plan", p).out == "no changes\n"


def _many(n: int) -> str:
    body = "".join(
        f"    class s{i} rate 1mbit match dst 10.7.{i // 200}.{i % 200 + 1}\n" for i in range(n)
    )
    return f"interface d0 htb rate 1gbit default other {{\n{body}    class other rate 1mbit\n}}\n"


def test_applies_of_one_name_wait_for_each_other(tcdsl: Tcdsl, host: HostSupport) -> None:
    """An apply holds its name's lock from reading the state to writing the record: one that
    comes meanwhile waits, then plans against what the first made (found by a helper's
    review: two applies at once both exited 0, the kernel a mix of both policies, the record
    one of them, and plan said "no changes")."""
    first = tcdsl.write("one.tcp", _many(3))
    store = Store("one", Path(tcdsl.env["TCDSL_STATE_DIR"]))

    def start(path: str) -> subprocess.Popen[str]:
        argv = ["ip", "netns", "exec", tcdsl.ns, *TCDSL, "apply", "--yes", path]
        return subprocess.Popen(
            argv, env=tcdsl.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    with store.locked():
        waiting = start(first)
        time.sleep(1.5)
        assert waiting.poll() is None, "the apply ran while the name's lock was held"
        assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert waiting.wait(timeout=120) == 0, waiting.communicate()
    other = tcdsl.folder / "other"
    other.mkdir()
    big = tcdsl.write("one.tcp", _many(300))
    small = str(other / "one.tcp")
    Path(small).write_text(_many(20), encoding="utf-8")
    runs = [start(big), start(small)]
    assert [r.wait(timeout=300) for r in runs] == [0, 0], [r.communicate() for r in runs]
    plans = {path: tcdsl("plan", path) for path in (big, small)}
    live = [path for path, ran in plans.items() if ran.out == "no changes\n"]
    assert len(live) == 1, plans
    classes = tcdsl.tc("class", "show", "dev", "d0").count("class htb")
    assert classes == (302 if live[0] == big else 22), classes
    assert "the kernel agrees" in tcdsl("verify", live[0]).err


def test_an_apply_killed_before_its_record_is_finished_without_a_rebuild(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """An apply killed after its last kernel change, before it wrote its record: the kernel
    is the new policy already, so the next apply changes nothing there and keeps the
    counters (found by a helper's review: it built the whole tree again, every counter reset
    and the device unshaped meanwhile)."""
    run(["ip", "-n", tcdsl.ns, "addr", "add", "10.7.0.254/16", "dev", "d0"])
    old = tcdsl.write("k.tcp", _many(20))
    assert tcdsl("apply", "--yes", old).code == 0
    new = tcdsl.write("k.tcp", _many(25))
    assert tcdsl("apply", "--yes", new).code == 0
    store = Store("k", Path(tcdsl.env["TCDSL_STATE_DIR"]))
    done = store.current()
    assert done is not None and done.generation == 2
    # as if killed between the kernel's last change and the record: generation 2 unwritten
    store.forget(2)
    store.start(done.path, done.sources, done.devices, done.classids)
    # (written by this process, in the host's namespace: the apply's was the test's)
    under_way = store.folder / "applying.json"
    record = json.loads(under_way.read_text(encoding="utf-8"))
    record["netns"] = done.netns
    under_way.write_text(json.dumps(record), encoding="utf-8")
    _udp_to(tcdsl.ns, "10.7.0.3", 4)
    sent = _packets(tcdsl, "1:1")  # the link class: every packet, since the first apply
    assert sent >= 4
    planned = tcdsl("plan", new)
    assert "did not finish" in planned.out and "rebuild" not in planned.out, planned
    assert "+ class" not in planned.out and "drift in" not in planned.out, planned
    assert tcdsl("apply", "--yes", new).code == 0
    assert _packets(tcdsl, "1:1") >= sent, "the tree was built again"
    assert tcdsl("plan", new).out == "no changes\n"


def test_a_value_left_to_tc_changed_by_hand_is_noted_once(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A class's burst set by hand, which the policy leaves to tc: not drift tcdsl can
    compare, but the kernel's digest differs from the last apply's, so plan says so (exit
    4; it said "no changes"), and apply takes it as it is without a new generation."""
    p = tcdsl.write("b.tcp", _many(3))
    assert tcdsl("apply", "--yes", p).code == 0
    shown = tcdsl.tc("class", "show", "dev", "d0")
    line = next(x for x in shown.splitlines() if "parent 1:1 " in x)
    classid = line.split()[2]
    words = ["class", "change", "dev", "d0", "parent", "1:1", "classid", classid, "htb"]
    run(["ip", "netns", "exec", tcdsl.ns, "tc", *words, "rate", "1mbit", "burst", "20k"])
    planned = tcdsl("plan", p)
    assert planned.code == 4 and "in what tcdsl does not compare" in planned.out, planned
    assert "no changes" in planned.out and "drift in" not in planned.out, planned
    assert tcdsl("apply", "--yes", p).code == 0
    store = Store("b", Path(tcdsl.env["TCDSL_STATE_DIR"]))
    assert store.generations() == [1]
    assert tcdsl("plan", p).out == "no changes\n"


def test_what_changed_since_an_apply_in_words() -> None:
    from tcdsl.ops.lifecycle import since_words

    assert since_words([("p.tcp", False)]) == "p.tcp changed"
    changed = [("p.tcp", False), ("a.csv", False), ("b.csv", True), ("c.csv", True)]
    assert since_words(changed) == "p.tcp and a.csv changed, b.csv and c.csv are gone"
    assert since_words([("b.csv", True)]) == "b.csv is gone"


@pytest.mark.parametrize("classes", [3, 70])
def test_filter_listings_are_what_tc_lists_parent_by_parent(
    make_netns: Callable[[], str], tmp_path: Path, classes: int
) -> None:
    """The kernel read behind drift and the digest: filters on the root (listed at once), on
    classes (found by the JSON pass), few (a tc each) or many (one batch, separated)."""
    from tcdsl.ops import live

    ns = _netns(make_netns)
    batch = ["qdisc add dev d0 root handle 1: htb"]
    for n in range(1, classes + 1):
        batch.append(f"class add dev d0 parent 1: classid 1:{n:x} htb rate 1mbit")
        batch.append(f"filter add dev d0 parent 1:{n:x} protocol ip prio 1 u32 match ip dport "
                     f"{n} 0xffff flowid 1:{n:x}")  # fmt: skip
        batch.append(f"filter add dev d0 parent 1: protocol ip prio 2 u32 match ip sport {n} "
                     f"0xffff flowid 1:{n:x}")  # fmt: skip
    batch.append("qdisc add dev d0 parent 1:1 handle 2: htb")  # classful, no filters
    (tmp_path / "b").write_text("\n".join(batch) + "\n")
    run(["ip", "netns", "exec", ns, "tc", "-batch", str(tmp_path / "b")])
    parents = ["1:", "2:", *(f"1:{n:x}" for n in range(1, classes + 1))]

    def one(p: str) -> str:
        return run(
            ["ip", "netns", "exec", ns, "tc", "filter", "show", "dev", "d0", "parent", p]
        ).stdout

    code = (
        "import json, sys; from tcdsl.ops import live; "
        f"print(json.dumps(live.filter_listings('d0', {parents!r}, {{'1:', '2:'}})))"
    )
    got = json.loads(run(["ip", "netns", "exec", ns, sys.executable, "-c", code]).stdout)
    assert got == [one(p) for p in parents]
    assert got[1] == "" and all("*flowid" in text for text in [got[0], *got[2:]])
    assert (classes + 1 > live._ONE_BY_ONE) == (classes == 70)  # both ways of listing


NESTED = """\
interface d0 htb rate 1gbit default a {
    class a rate 100mbit {
        pfifo limit 10
    }
CLASSES}
"""
B_CLASS = "    class b rate 50mbit {\n        pfifo limit 10\n    }\n"
X_CLASS = "    class x rate 10mbit {\n        pfifo limit 10 handle 41:\n    }\n"
Z_CLASS = (
    "    class z rate 10mbit {\n        tbf rate 5mbit burst 10kb latency 50ms {\n"
    "            pfifo limit LIMIT\n        }\n    }\n"
)
W_CLASS = "    class w rate 20mbit {\n        pfifo limit 10 handle 20:\n    }\n"


def _g2(tcdsl: Tcdsl) -> str:
    """Generation 2 of policy p: z's tbf (40:) has its pfifo as 2:, as 41: was still x's."""
    tcdsl("apply", "--yes", tcdsl.write("p.tcp", NESTED.replace("CLASSES", B_CLASS + X_CLASS)))
    g2 = NESTED.replace("CLASSES", B_CLASS + Z_CLASS.replace("LIMIT", "10"))
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", g2)).code == 0
    assert "pfifo 2: parent 40:" in tcdsl.tc("qdisc", "show", "dev", "d0")
    return g2


def test_a_nested_qdisc_keeps_its_handle(tcdsl: Tcdsl, host: HostSupport) -> None:
    """Compiled again with the record's pins, z's tbf's pfifo keeps 2: (a pin of its own):
    a change elsewhere does not replace it (and reset its queue) as 2: -> 41:."""
    g2 = _g2(tcdsl)
    planned = tcdsl("plan", tcdsl.write("p.tcp", g2.replace("rate 50mbit", "rate 40mbit")))
    assert planned.out.endswith("plan: 1 to change (1 class)\n"), planned


def test_a_restore_records_what_it_built(tcdsl: Tcdsl, host: HostSupport) -> None:
    """A record of an older tcdsl has no pin for z's tbf's pfifo: compiled again from its
    text, it is 41:, and a failed apply (w's leaf takes 20:, still b's: E601) builds that
    back. The record must then say 41:, or the next change to the pfifo targets a qdisc
    that is not there (it did, and failed, after a plan that saw 'no changes')."""
    g2 = _g2(tcdsl)
    record = tcdsl.folder / "state" / "p" / "applied" / "2.json"
    data = json.loads(record.read_text(encoding="utf-8"))
    data["classids"] = {t: {k: v for k, v in ids.items() if " leaf " not in k}
                        for t, ids in data["classids"].items()}  # fmt: skip
    record.write_text(json.dumps(data), encoding="utf-8")
    g3 = NESTED.replace("CLASSES", Z_CLASS.replace("LIMIT", "10") + W_CLASS)
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", g3))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "previous state was restored" in failed.err, failed
    assert tcdsl("plan", tcdsl.write("p.tcp", g2)).out == "no changes\n"
    g4 = NESTED.replace("CLASSES", B_CLASS + Z_CLASS.replace("LIMIT", "20"))
    changed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", g4))
    assert changed.code == 0, changed
    assert re.search(r"pfifo \w+: parent 40:\S* limit 20p", tcdsl.tc("qdisc", "show", "dev", "d0"))


def test_a_restore_that_leaves_the_kernel_otherwise_says_so(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """A tc that also skips every 'rate 2mbit' command and says nothing (as a kernel could
    ignore an attribute; its -force batches lose -force): the undo and then the full restore
    run without an error, but voip is not back at 2mbit. Read back, that is not the previous
    state: apply must not say it was restored (it did whenever the restore's commands all
    succeeded)."""
    assert tcdsl("apply", "--yes", tcdsl.write("p.tcp", A)).code == 0
    _tc_failing_on_limit_30(tcdsl)
    shim = tcdsl.folder / "bin" / "tc"
    shim.write_text(
        shim.read_text(encoding="utf-8")
        .replace('if [ "$1" = -batch ]', 'if [ "$1" = -batch ] || [ "$2" = -batch ]')
        .replace("    input=$(cat)", "    input=$(grep -v 'rate 2mbit')")
        .replace('exec REAL "$@"', 'case "$*" in *"rate 2mbit"*) exit 0;; esac\nexec REAL "$@"'),
        encoding="utf-8",
    )
    guest = "    class guest rate 1mbit match src 10.9.0.0/16 {\n        pfifo limit 30\n    }\n"
    later = A.replace("voip rate 2mbit", "voip rate 4mbit").replace(
        "    class bulk", guest + "    class bulk"
    )  # voip changed, then the guest's leaf fails
    failed = tcdsl("apply", "--yes", tcdsl.write("p.tcp", later))
    assert failed.code == 1 and "[E601]" in failed.err, failed
    assert "restoring the previous state failed too" in failed.err, failed
    assert "rate 2Mbit" not in tcdsl.tc("class", "show", "dev", "d0")


MARKING = """\
interface {wan} htb rate 10mbit default bulk {{
    classify by mark from lan0{mask}
    class web rate 5mbit match proto tcp dport 80
    class bulk rate 1mbit
}}
"""


def test_marks_of_a_policy_applied_under_another_name_are_kept_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: E273 looked at one policy, so two WANs marking what arrives on
    lan0, applied under two names, were both taken, and the second's packets classified by
    the first's marks. plan and apply now read the policies live under other names: E273
    at this policy's 'classify by mark', a note at the other's (its saved text), nothing
    changed; with disjoint masks the plan goes on."""
    from click.testing import CliRunner

    from tcdsl.cli import cli
    from tcdsl.ops.state import Store

    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    one = tmp_path / "one.tcp"
    one.write_text(MARKING.format(wan="wan0", mask=""), encoding="utf-8")
    result = analyse(str(one))
    assert result.policy is not None, result.diagnostics
    Store("one").record(str(one), result.sources, ("wan0",), {})
    one.write_text("# edited since: the record's text is what counts\n", encoding="utf-8")
    two = tmp_path / "two.tcp"
    two.write_text(MARKING.format(wan="wan1", mask=""), encoding="utf-8")
    for command in (["plan"], ["apply", "--yes"]):
        refused = CliRunner().invoke(cli, [*command, str(two)])
        said = " ".join(refused.stderr.split())
        assert refused.exit_code == 1 and "[E273]" in said, refused.stderr
        assert f"{two}:2:5: error: packets arriving on lan0 can leave by wan1" in said, said
        assert f"{one}:2:5: note: the marks of 'wan0' (applied as 'one') are chosen" in said
        assert "classify by mark from lan0" in said and "nothing was changed" in said
    assert not (tmp_path / "state" / "two").exists()
    # the advice for this one alone is not enough: the other's rules see every bit
    two.write_text(MARKING.format(wan="wan1", mask=" mask 0xffff0000"), encoding="utf-8")
    planned = CliRunner().invoke(cli, ["plan", str(two)])
    said = " ".join(planned.stderr.split())
    assert "'mask 0xffff' on 'wan0', outside the mask 0xffff0000 of 'wan1' [E273]" in said, said
    one.write_text(MARKING.format(wan="wan0", mask=" mask 0xffff"), encoding="utf-8")
    result = analyse(str(one))
    assert result.policy is not None, result.diagnostics
    Store("one").record(str(one), result.sources, ("wan0",), {})
    planned = CliRunner().invoke(cli, ["plan", str(two)])
    assert "E273" not in planned.stderr and "W374" not in planned.stderr, planned.stderr


def test_a_probe_is_kept_in_the_state_folder_but_makes_none(
    host: HostSupport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel probe of a plan is kept where a state folder is, and makes none where there
    is not (found by a tester: `tcdsl plan` made /var/lib/tcdsl)."""
    from tcdsl.ops.lifecycle import check_support

    path = tmp_path / "p.tcp"
    path.write_text("interface eth0 htb rate 10mbit burst 15k cburst 15k\n", encoding="utf-8")
    result = analyse(str(path))
    assert result.policy is not None
    folder = tmp_path / "state"
    monkeypatch.setenv("TCDSL_STATE_DIR", str(folder))
    check_support((), result.policy)
    assert not folder.exists()
    folder.mkdir()
    check_support((), result.policy)
    assert [p.name.startswith(".probe-") for p in folder.iterdir()] == [True]


_ROWS_HEADER = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
)
_SITES = """interface eth0 htb rate 1gbit burst 123k cburst 123k default unknown {
    class a rate 400mbit ceil 1gbit cburst 123k {
        subscribers download from "s.csv" where parent_node == "A" { pfifo }
    }
    class b rate 400mbit ceil 1gbit cburst 123k {
        subscribers download from "s.csv" where parent_node == "B" { pfifo }
    }
    class unknown rate 10mbit { pfifo }
}
"""


def _sites_plan(tmp_path: Path, edit: Callable[[list[str]], None]) -> Plan:
    """The plan from 80 hashed subscribers on two sites to the table as ``edit`` leaves it."""
    rows = [
        f"{1000 + c},n{c},{c},cpe-{c},{'A' if c % 2 else 'B'},,100.64.0.{c + 1},,1,1,10,10,\n"
        for c in range(1, 81)
    ]
    policies = []
    for name in ("old", "new"):
        if name == "new":
            edit(rows)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "s.csv").write_text(_ROWS_HEADER + "".join(rows), encoding="utf-8")
        pins = pins_of(policies[0]) if policies else None
        policies.append(_policy(folder, "p.tcp", _SITES, pins))
    return _plan(*policies)


def test_a_prefix_splitting_a_hashed_run_moves_no_line(tmp_path: Path) -> None:
    """A /24 inserted into a run of hashed /32s makes the lines before it plain nodes and the
    pref's tables are made again: no line is tried in another order, and the group is one
    change (found by a tester: '1 line(s) tried in another order', and 2 groups counted)."""

    def insert(rows: list[str]) -> None:
        rows.insert(39, "2000,Biz,900,biz,A,,100.64.5.0/24,,50,50,100,100,\n")

    plan = _sites_plan(tmp_path, insert)
    changed = [c.text for c in plan.changes if c.sign == "~"]
    assert len(changed) == 1 and "its hash tables are made again" in changed[0], changed
    assert plan.summary().endswith("1 to change (1 filter group)")


def test_rows_swapped_and_a_prefix_added_count_the_group_once(tmp_path: Path) -> None:
    """Rows swapped (their lines tried in another order) and the tables made again (a /24
    in the run): two lines of the plan, one filter group changed."""

    def edit(rows: list[str]) -> None:
        rows[10], rows[12] = rows[12], rows[10]
        rows.insert(39, "2000,Biz,900,biz,A,,100.64.5.0/24,,50,50,100,100,\n")

    plan = _sites_plan(tmp_path, edit)
    changed = [c.text for c in plan.changes if c.sign == "~"]
    assert [t.split(": ")[-1] for t in changed] == [
        "2 line(s) tried in another order",
        "its hash tables are made again, a copy at pref 2 meanwhile",
    ], changed
    assert plan.summary().endswith("1 to change (1 filter group)")


def test_a_written_line_moved_across_a_hashed_table_is_one_line_moved(tmp_path: Path) -> None:
    """A class's line of the policy moved from after a table's hashed rows to before them
    (it takes one of their addresses): one line tried in another order, no filter said to
    change its action, one group (found by a review: sorted by file name, the policy's line
    always came first, and the plan said 'its action' of four filters)."""
    rows = "".join(
        f"{1000 + c},n{c},{c},cpe-{c},A,,100.64.0.{c + 1},,1,1,10,10,\n" for c in range(1, 60)
    )
    sub = (
        "    class a rate 400mbit ceil 1gbit cburst 123k {\n"
        '        subscribers download from "s.csv" { pfifo }\n'
        "    }\n"
    )
    vip = "    class vip rate 10mbit match dst 100.64.0.5\n"
    head = "interface eth0 htb rate 1gbit burst 123k cburst 123k default unknown {\n"
    tail = "    class unknown rate 10mbit { pfifo }\n}\n"
    texts = {"after": head + sub + vip + tail, "before": head + vip + sub + tail}
    for first, then in (("after", "before"), ("before", "after")):
        policies = []
        for name in (first, then):
            folder = tmp_path / f"{first}-{name}"
            folder.mkdir()
            (folder / "s.csv").write_text(_ROWS_HEADER + rows, encoding="utf-8")
            pins = pins_of(policies[0]) if policies else None
            policies.append(_policy(folder, "p.tcp", texts[name], pins))
        plan = _plan(*policies)
        changed = [c.text.split(": ")[-1] for c in plan.changes]
        assert changed == [
            "1 line(s) tried in another order",
            "its hash tables are made again, a copy at pref 2 meanwhile",
        ], changed
        assert plan.summary() == "plan: 1 to change (1 filter group)"


def test_a_changed_group_with_no_free_pref_beside_it_is_said_to_be_built_again(
    tmp_path: Path,
) -> None:
    """Found by a tester: a changed group at pref 1 with pref 2 taken was deleted before it
    was added again (for that moment its packets met pref 2's filters and the default), while
    the plan said only which filters changed. The plan says so now; with a free pref beside
    it (pref 2 not taken), the copy keeps it tried in its place and nothing more is said."""
    body = (
        "    class a rate 10mbit match dport 1001\n"
        "    class b rate 10mbit match dport 1002\n"
        "    class d rate 10mbit match dport 1004 pref 2\n"
        "    class c rate 10mbit\n"
    )
    text = f"interface d0 htb rate 100mbit default c {{\n{body}}}\n"
    edited = text.replace("dport 1001", "dport 1005")
    for pref2, said in ((True, True), (False, False)):
        before = text if pref2 else text.replace(" pref 2", "")
        after = edited if pref2 else edited.replace(" pref 2", "")
        old = _policy(tmp_path, "p.tcp", before)
        new = _policy(tmp_path, "p.tcp", after, pins_of(old))
        shown = _plan(old, new).render()
        assert ("no pref free beside it for a copy" in shown) is said, shown
        assert "+ filter a (match ip dport 1005 0xffff)" in shown, shown


def test_an_interface_tc_batch_cannot_name_is_refused_before_any_change(tcdsl: Tcdsl) -> None:
    """Found by a tester: apply of an interface named 'x#y' (a name the kernel takes) failed
    half-way, tc -batch reading '#y' on as a comment ('Unterminated quoted string'). plan and
    apply drive tc through tc -batch, so they refuse it at the name, E502, nothing changed,
    and say what to do instead."""
    run(["ip", "-n", tcdsl.ns, "link", "add", "x#y", "type", "veth", "peer", "name", "xy1"])
    policy = tcdsl.write(
        "p.tcp",
        'interface "x#y" htb rate 10mbit default b {\n'
        "    class a rate 5mbit match dport 22\n    class b rate 5mbit\n}\n",
    )
    for command in (("plan",), ("apply", "--yes")):
        refused = tcdsl(*command, policy)
        said = " ".join(refused.err.split())
        assert refused.code == 1 and said.startswith(f"{policy}:1:11: error:"), refused
        assert "'x#y' cannot be written as a tc -batch word" in said, said
        assert "'tcdsl compile'" in said and "[E502]" in said, said
    assert "htb" not in tcdsl.tc("qdisc", "show", "dev", "x#y")
    assert not (tcdsl.folder / "state" / "p" / "applied").exists()


def test_a_class_value_changed_by_hand_is_set_again_in_place(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a tester (an ISP raising one subscriber's ceil by hand): the next apply built
    the whole tree again, every class's counters reset and the device unshaped a moment.
    Drift of classes' values alone (and of qdiscs tc changes in place) is set again in place,
    a 'tc class change' each, the other classes' counters kept; other drift (a filter) still
    builds the tree again."""
    a = tcdsl.write("p.tcp", A)
    assert tcdsl("apply", "--yes", a).code == 0
    send = "from tests.ops_edits import send_some; send_some()"
    run(["ip", "netns", "exec", tcdsl.ns, sys.executable, "-c", send])
    sent = _sent(tcdsl)["1:30"]
    hand = "class change dev d0 parent 1:1 classid 1:20 htb rate 3mbit ceil 9mbit"
    run(["ip", "netns", "exec", tcdsl.ns, "tc", *hand.split()])
    planned = tcdsl("plan", a)
    assert planned.code == 4 and "! drift in d0: class 'web' ceil is 9Mbit" in planned.out
    assert "~ class web: set again as the policy says (changed in the kernel)" in planned.out
    assert "(rebuild)" not in planned.out and "1 to change (1 class)" in planned.out, planned
    assert tcdsl("apply", "--yes", a).code == 0
    assert "ceil 8Mbit" in tcdsl.tc("class", "show", "dev", "d0", "classid", "1:20")
    assert _sent(tcdsl)["1:30"] >= sent > 0  # not built again
    assert tcdsl("plan", a).out == "no changes\n"
    # a leaf qdisc's value (one tc changes in place): the same
    limit = "qdisc change dev d0 parent 1:30 handle 30: pfifo limit 77"
    run(["ip", "netns", "exec", tcdsl.ns, "tc", *limit.split()])
    planned = tcdsl("plan", a)
    assert "~ qdisc pfifo of class bulk: set again as the policy says" in planned.out, planned
    assert "(rebuild)" not in planned.out, planned
    assert tcdsl("apply", "--yes", a).code == 0
    assert "limit 20p" in tcdsl.tc("qdisc", "show", "dev", "d0")
    assert _sent(tcdsl)["1:30"] >= sent > 0
    # a filter deleted by hand besides: the tree is built again, as before
    run(["ip", "netns", "exec", tcdsl.ns, "tc", *hand.split()])
    run(["ip", "netns", "exec", tcdsl.ns, "tc", "filter", "del", "dev", "d0", "parent", "1:",
         "prio", "1"])  # fmt: skip
    planned = tcdsl("plan", a)
    assert "! tree d0: drift (rebuild)" in planned.out and "set again" not in planned.out, planned


def test_lines_swapped_across_hash_buckets_are_no_change(tmp_path: Path) -> None:
    """Found by a tester: two subscribers' rows swapped in a hashed table, their addresses in
    different buckets (where no packet meets both), made plan say '1 line(s) tried in another
    order' and '1 to change (1 filter group)', and apply changed nothing. The plan says no
    change; a swap within one bucket still is one."""
    lines = [f"    class c{i} rate 1mbit match dst 10.0.{i // 8}.{i}\n" for i in range(40)]
    text = "interface d0 htb rate 100mbit default z {\n%s    class z rate 1mbit\n}\n"
    old = _policy(tmp_path, "p.tcp", text % "".join(lines))
    assert any(t.u32_tables for t in old.interfaces)  # hashed on the last byte
    swapped = [*lines[:3], lines[4], lines[3], *lines[5:]]  # .3 and .4: buckets 3 and 4
    new = _policy(tmp_path, "p.tcp", text % "".join(swapped), pins_of(old))
    assert _plan(old, new).render() == "no changes\n", _plan(old, new).render()
    same_bucket = [*lines[:38], "    class x rate 1mbit match dst 10.1.0.3\n"]
    same_bucket.append("    class y rate 1mbit match dst 10.2.0.3\n")  # x's bucket, 3
    old = _policy(tmp_path, "p.tcp", text % "".join(same_bucket))
    swapped = [*same_bucket[:38], same_bucket[39], same_bucket[38]]
    new = _policy(tmp_path, "p.tcp", text % "".join(swapped), pins_of(old))
    assert "tried in another order" in _plan(old, new).render()


def test_a_plan_of_several_trees_names_each_changes_tree(tmp_path: Path) -> None:
    """Found by a tester: with a class of one name in each direction (a subscriber's), two
    '~ class c1' lines at one policy line could not be told apart, nor in the JSON. Where a
    plan changes several trees in place, each line names its tree, and the JSON always."""
    text = (
        "interface d0 {\n"
        "    upload htb rate 10mbit default c1 {\n        class c1 rate %s\n    }\n"
        "    download htb rate 10mbit default c1 {\n        class c1 rate %s\n    }\n"
        "}\n"
    )
    old = _policy(tmp_path, "p.tcp", text % ("1mbit", "2mbit"))
    both = _plan(old, _policy(tmp_path, "p.tcp", text % ("3mbit", "4mbit"), pins_of(old)))
    lines = both.render().splitlines()
    assert "~ class c1: rate 1mbit -> 3mbit  (p.tcp:3; d0)" in [
        x.replace(str(tmp_path) + "/", "") for x in lines
    ], lines
    assert any(x.endswith("; d0 download (via ifb4d0))") and "2mbit -> 4mbit" in x for x in lines)
    trees = [c["tree"] for c in both.to_json()["changes"]]  # type: ignore[index]
    assert trees == ["d0", "d0 download (via ifb4d0)"], trees
    one = _plan(old, _policy(tmp_path, "p.tcp", text % ("3mbit", "2mbit"), pins_of(old)))
    assert one.render().splitlines()[0].endswith("p.tcp:3)"), one.render()  # one tree: as before


VALUE_DRIFT_QDISCS = (
    "qdisc htb 1: root refcnt 2 r2q 10 default 0x20 direct_packets_stat 0 ver 3.17 direct_qlen "
    "1000\nqdisc sfq 10: parent 1:10 limit 127p quantum 1514b depth 127 flows 128 divisor 1024 "
    "perturb {perturb}sec\n"
)
VALUE_DRIFT_CLASSES = "".join(
    f"class htb {line} linklayer ethernet burst 1600b/1 mpu 0b cburst 1600b/1 mpu 0b level 0\n"
    for line in (
        "1:1 root rate 10Mbit ceil 10Mbit",
        "1:10 parent 1:1 leaf 10: prio 0 quantum 1250 rate 1Mbit ceil 1Mbit",
        "1:20 parent 1:1 prio 0 quantum 1250 rate 1Mbit ceil {ceil}Mbit",
    )
)


@pytest.mark.parametrize(
    ("perturb", "ceil", "repairs"),
    [
        (10, 2, set()),
        (10, 3, {("class", "d0", "1:20")}),
        (5, 2, None),  # sfq's change keeps a perturb it is not given: the tree is rebuilt
        (5, 3, None),
    ],
)
def test_value_drift_is_repaired_only_where_a_change_sets_every_value(
    tmp_path: Path, perturb: int, ceil: int, repairs: set[tuple[str, str, str]] | None
) -> None:
    """Found by a review: drift set again by 'tc ... change' of the policy's command stays
    where the command leaves a value out and the kind keeps it (sfq's perturb, cake's rtt,
    an hfsc curve), and the digest then hid it for good. Only htb classes and the qdiscs
    whose change sets every value (tbf, pfifo, bfifo) are repaired in place."""
    text = "interface d0 htb rate 10mbit default b {\n    class a rate 1mbit { sfq perturb 10 }\n"
    policy = _policy(tmp_path, "p.tcp", text + "    class b rate 1mbit ceil 2mbit\n}\n")
    device = DeviceState(
        "d0",
        parse_qdiscs(VALUE_DRIFT_QDISCS.format(perturb=perturb)),
        parse_classes(VALUE_DRIFT_CLASSES.format(ceil=ceil)),
    )
    state = KernelState({"d0": device})
    expected = expected_policy(policy)
    assert bool(compare_state(expected, state)) == ((perturb, ceil) != (10, 2))
    assert value_drift(expected, state, CHANGE_SETS_ALL, REPAIRABLE_CLASSES) == repairs


def test_value_drift_beside_a_download_is_set_again_in_place(
    tcdsl: Tcdsl, host: HostSupport
) -> None:
    """Found by a review: an upload's device also holds its download's redirect, and drift
    there went the way of a shared device, built again whatever it was. A class's value
    changed by hand in either direction is set again in place."""
    if not (host.ifb and "mirred" in host.actions):
        pytest.skip("needs ifb and mirred")
    policy = tcdsl.write("p.tcp", FULL)
    assert tcdsl("apply", "--yes", policy).code == 0
    for hand in (
        "class change dev d0 parent 1:1 classid 1:10 htb rate 2mbit ceil 3mbit",
        "class change dev ifb4d0 parent 1:1 classid 1:10 htb rate 5mbit ceil 6mbit",
    ):
        run(["ip", "netns", "exec", tcdsl.ns, "tc", *hand.split()])
    planned = tcdsl("plan", policy)
    assert planned.out.count("set again as the policy says") == 2, planned
    assert "(rebuild)" not in planned.out and "; d0 download (via ifb4d0))" in planned.out
    assert tcdsl("apply", "--yes", policy).code == 0
    assert tcdsl("plan", policy).out == "no changes\n"
