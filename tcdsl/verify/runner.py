"""Run a generated script in a throwaway network namespace and read the kernel's state back.

A *case* is one POSIX sh script, run by ``sh`` (dash) inside a fresh network namespace, either
on this host (``ip netns add`` + ``ip netns exec``, the namespace always deleted afterwards) or
in a user-mode Linux guest (``tcdsl.kernels.uml``, many cases per boot). The same text runs in
both places. It

1. puts a PATH shim first that names ``iptables-legacy`` ``iptables`` when there is no
   ``iptables`` (and the same for ``-save`` and ``-restore``, and for ``ip6tables``), and a
   ``flock`` that does
   nothing where there is none (the guest: its cases run one at a time);
2. creates a veth pair per interface the policy names (``classify by mark from`` ones too),
   peers named ``tv0p``, ``tv1p``, ..., all up, IPv6 off (no neighbour discovery traffic);
3. writes the generated script to a file from a here-document and runs it with ``sh -x``
   (the xtrace, with a prefix of its own, tells which command failed or warned);
4. optionally runs more shell before and after it (tests use that to make the kernel refuse a
   command, or to tamper with the state it left);
5. prints the read-back: per interface ``tc -d qdisc show``, ``tc -d class show`` and
   ``tc filter show ... parent P`` for every qdisc handle and class id present; and, if the
   policy uses iptables (ip6tables), ``iptables-save -t mangle`` (``ip6tables-save``) of the
   same variant (legacy or nft) as the ``iptables`` (``ip6tables``) the script ran.

Everything is printed on stdout between marker lines (``@@tcdsl@@ begin NAME`` ...
``@@tcdsl@@ end NAME STATUS``), parsed back by :func:`sections`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tcdsl.commands import SCRIPT_FAILED
from tcdsl.verify.compare import ApplyOutcome, CommandRun, Origin, Step
from tcdsl.verify.expect import Requirement
from tcdsl.verify.readback import (
    DeviceState,
    KernelState,
    parse_classes,
    parse_filters,
    parse_iptables_save,
    parse_qdiscs,
)

MARKER = "@@tcdsl@@"
TRACE = "+tcdsl+ "
"""The xtrace prefix (PS4) of the applied script: a line starting with it is a command."""

FAILURE_HANDLER = SCRIPT_FAILED
"""The generated script's exit trap, which names the policy line of a failed command."""

TIMEOUT = 120
"""Seconds one case may take on the host before it is stopped."""


@dataclass(frozen=True, slots=True)
class Case:
    """A script to run in a fresh network namespace (the shape ``tcdsl.kernels.uml`` takes)."""

    name: str
    script: str


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What a case did: its exit status and output."""

    name: str
    exit_code: int
    stdout: str
    stderr: str


class KernelUnavailable(Exception):
    """No kernel of the kind asked for can run cases here; the message says why."""


# ==== the case script ==========================================================================


def _q(word: str) -> str:
    return shlex.quote(word)


_PRELUDE = r"""# tcdsl verify case: @LABEL@
tcdsl_section() {
    printf '%s begin %s\n' '@MARKER@' "$1"
    cat "$2" 2>/dev/null
    printf '\n%s end %s %s\n' '@MARKER@' "$1" "$3"
}
# The classes of device $1 ($2: tc's -d): one listing, but where a netem has no child qdisc,
# at whose class the kernel's dump stops (netem_dump_class: ENOENT), the classes after it left
# out; there each other qdisc's, one by one
tcdsl_classes() {
    tc qdisc show dev "$1" >"$w/q" 2>/dev/null
    tcdsl_lone=$(awk '$1 == "qdisc" && $2 == "netem" { n[$3] = 1 }
        $1 == "qdisc" { for (i = 4; i < NF; i++) if ($i == "parent") p[$(i + 1)] = 1 }
        END { for (h in n) if (!((h "1") in p) && !(h in p)) printf " %s", h }' "$w/q")
    if [ -z "$tcdsl_lone" ]; then
        tc $2 class show dev "$1"
        return
    fi
    awk '$1 == "qdisc" && $3 != "0:" { print $3 }' "$w/q" | while read -r tcdsl_h; do
        case "$tcdsl_lone " in *" $tcdsl_h "*) continue ;; esac
        tc $2 class show dev "$1" parent "$tcdsl_h" 2>/dev/null
    done
}
tcdsl_parents() {
    { tc qdisc show dev "$1"; tcdsl_classes "$1"; } 2>/dev/null |
    while read -r tcdsl_what tcdsl_kind tcdsl_id tcdsl_rest; do
        case "$tcdsl_what $tcdsl_kind" in
        "qdisc clsact") printf 'ffff:fff3\n' ;;
        qdisc* | class*) [ "$tcdsl_id" = 0: ] || printf '%s\n' "$tcdsl_id" ;;
        esac
    done
}
# The parents of device $1 that have filters: one tc -j -batch asks every parent ("[]", a
# line, for none), since a tc process per parent took minutes on big trees; every parent
# when the answers are not a line each.
tcdsl_filtered() {
    tcdsl_parents "$1" >"$w/p"
    while read -r tcdsl_p; do
        printf 'filter show dev %s parent %s\n' "$1" "$tcdsl_p"
    done <"$w/p" >"$w/b"
    tc -j -force -batch "$w/b" >"$w/j" 2>/dev/null
    if [ $(($(wc -l <"$w/p"))) = $(($(wc -l <"$w/j"))) ]; then
        paste -d ' ' "$w/p" "$w/j" | while read -r tcdsl_p tcdsl_j; do
            [ "$tcdsl_j" = "[]" ] || printf '%s\n' "$tcdsl_p"
        done
    else
        cat "$w/p"
    fi
}
w=$(mktemp -d "${TMPDIR:-/tmp}/tcdsl-verify.XXXXXX") || exit 90
trap 'rm -rf "$w"' EXIT
mkdir "$w/bin"
for tcdsl_family in iptables ip6tables; do
    command -v "$tcdsl_family" >/dev/null 2>&1 && continue
    for tcdsl_tool in "$tcdsl_family" "$tcdsl_family-save" "$tcdsl_family-restore"; do
        tcdsl_legacy=$(command -v "$tcdsl_family-legacy${tcdsl_tool#"$tcdsl_family"}") &&
            ln -s "$tcdsl_legacy" "$w/bin/$tcdsl_tool"
    done
done
if ! command -v flock >/dev/null 2>&1; then
    # The user-mode Linux guest has no flock; it runs one case at a time, so none is needed.
    printf '#!/bin/sh\n:\n' >"$w/bin/flock" && chmod +x "$w/bin/flock"
fi
PATH="$w/bin:$PATH"
export PATH
uname -r >"$w/o" 2>&1
tcdsl_section kernel "$w/o" $?
{ echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6; } 2>/dev/null
{ echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; } 2>/dev/null
ip link set lo up 2>/dev/null
""".replace("@MARKER@", MARKER)


def _heredoc(path: str, text: str) -> str:
    """Shell that writes ``text`` verbatim to ``path``."""
    delimiter = "TCDSL_END_OF_FILE"
    while delimiter in text:
        delimiter += "_"
    if not text.endswith("\n"):
        text += "\n"
    return f"cat >{path} <<'{delimiter}'\n{text}{delimiter}\n"


def peer_names(devices: Sequence[str]) -> list[str]:
    """A short veth peer name for each device (``tv0p``, ``tv1p``, ...), none of them taken."""
    free = (p for p in (f"tv{i}p" for i in itertools.count()) if p not in devices)
    return [next(free) for _ in devices]


def case_script(
    label: str,
    script: str,
    devices: Sequence[str],
    read: Sequence[str],
    *,
    iptables: bool = False,
    ip6tables: bool = False,
    before: str = "",
    after: str = "",
    commands: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
    queues: Mapping[str, int] | None = None,
) -> str:
    """The text of one case.

    ``script`` is the generated script, ``devices`` the interfaces to create, ``read`` those to
    read back (section names use their index in ``read``), ``iptables`` and ``ip6tables``
    whether to read their mangle table, ``before`` and ``after`` shell to run before and after
    the script (tests use them to make the kernel refuse a command, or to tamper with its
    state).

    With ``commands`` (lines of the script) the script is not run as a whole: each command
    runs on its own and its status and output are printed (section ``cmd N``), which is how a
    script for a kernel that cannot run it (cbq) is checked for tc's parse errors.

    ``files`` (name -> text) are written next to the script, which then runs in their
    directory: how the files of a ``tc -batch`` output are applied. ``queues`` gives the
    devices that need several TX queues (an mq root) their number.
    """
    queues = queues or {}
    out = [_PRELUDE.replace("@LABEL@", label.replace("\n", " "))]
    setup = []
    for dev, peer in zip(devices, peer_names(devices), strict=True):
        many = f" numtxqueues {queues[dev]}" if dev in queues else ""
        setup.append(f"ip link add {_q(dev)}{many} type veth peer name {_q(peer)}{many}")
        setup.append(f"ip link set {_q(dev)} up")
        setup.append(f"ip link set {_q(peer)} up")
    out.append(
        "(\n"
        + "".join(f"    {line} || exit 1\n" for line in setup or [":"])
        + ') >"$w/o" 2>&1\n'
        + 'rc=$?\ntcdsl_section setup "$w/o" "$rc"\n[ "$rc" = 0 ] || exit 1\n'
    )
    if commands:
        for n, command in enumerate(commands):
            out.append(_heredoc(f'"$w/c{n}"', command))
            out.append(f'sh "$w/c{n}" >"$w/o" 2>&1\ntcdsl_section "cmd {n}" "$w/o" $?\n')
        return "".join(out)
    if before:
        out.append(_heredoc('"$w/before.sh"', before))
        out.append('sh "$w/before.sh" >"$w/o" 2>&1\ntcdsl_section before "$w/o" $?\n')
    out.append(_heredoc('"$w/apply.sh"', script))
    for name, text in (files or {}).items():
        out.append(_heredoc(f'"$w"/{_q(name)}', text))
    run = f'PS4={_q(TRACE)} sh -x "$w/apply.sh"'
    if files:
        run = f'(cd "$w" && {run})'
    out.append(
        f'{run} >"$w/out" 2>"$w/err"\n'
        "rc=$?\n"
        'tcdsl_section apply-stdout "$w/out" "$rc"\n'
        'tcdsl_section apply-stderr "$w/err" "$rc"\n'
    )
    if after:
        out.append(_heredoc('"$w/after.sh"', after))
        out.append('sh "$w/after.sh" >"$w/o" 2>&1\ntcdsl_section after "$w/o" $?\n')
    for n, dev in enumerate(read):
        d = _q(dev)
        out.append(
            f'tc -d qdisc show dev {d} >"$w/o" 2>&1\ntcdsl_section "qdisc {n}" "$w/o" $?\n'
            f'tcdsl_classes {d} -d >"$w/o" 2>&1\ntcdsl_section "class {n}" "$w/o" $?\n'
            f"for p in $(tcdsl_filtered {d}); do\n"
            f'    tc filter show dev {d} parent "$p" >"$w/o" 2>&1\n'
            f'    tcdsl_section "filter {n} $p" "$w/o" $?\n'
            "done\n"
        )
    for tool in [t for t, wanted in (("iptables", iptables), ("ip6tables", ip6tables)) if wanted]:
        out.append(
            f'case "$({tool} -V 2>/dev/null)" in\n'
            f"*legacy*) save={tool}-legacy-save ;;\n"
            f"*nf_tables*) save={tool}-nft-save ;;\n"
            f"*) save={tool}-save ;;\n"
            "esac\n"
            f'command -v "$save" >/dev/null 2>&1 || save={tool}-save\n'
            '"$save" -t mangle >"$w/o" 2>&1\n'
            f'tcdsl_section {tool} "$w/o" $?\n'
        )
    return "".join(out)


# ==== reading a case's output ==================================================================


@dataclass(frozen=True, slots=True)
class Section:
    """The output of one step of a case, and its exit status."""

    text: str
    status: int


def sections(stdout: str) -> dict[str, Section]:
    """Split a case's stdout at its marker lines: section name -> text and status."""
    out: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []
    begin, end = f"{MARKER} begin ", f"{MARKER} end "
    for line in stdout.splitlines():
        if name is None:
            if line.startswith(begin):
                name, lines = line[len(begin) :], []
            continue
        if line.startswith(f"{end}{name} "):
            if lines and lines[-1] == "":
                lines.pop()  # the newline the marker line starts with
            status_text = line[len(end) + len(name) + 1 :].strip()
            status = int(status_text) if status_text.lstrip("-").isdigit() else -1
            out[name] = Section("".join(f"{x}\n" for x in lines), status)
            name = None
        else:
            lines.append(line)
    return out


def apply_outcome(found: dict[str, Section]) -> ApplyOutcome | None:
    """How the script ran, from its sections; None if it never ran (the case stopped before)."""
    stdout, stderr = found.get("apply-stdout"), found.get("apply-stderr")
    if stdout is None or stderr is None:
        return None
    outcome = ApplyOutcome(stdout.status, stdout.text)
    for line in stderr.text.splitlines():
        if line.startswith(TRACE):
            command = line[len(TRACE) :]
            if command == FAILURE_HANDLER:
                break  # the script's exit trap: what follows is its message, not a command
            outcome.steps.append(Step(command))
        elif outcome.steps:
            outcome.steps[-1].stderr.append(line)
        else:
            outcome.preamble.append(line)
    return outcome


def read_state(found: dict[str, Section], read: Sequence[str]) -> KernelState:
    """The kernel state a case printed, for the devices ``read`` (in the order given)."""
    state = KernelState()
    for n, dev in enumerate(read):
        q = found.get(f"qdisc {n}", Section("", 1))
        c = found.get(f"class {n}", Section("", 1))
        device = DeviceState(dev, parse_qdiscs(q.text), parse_classes(c.text), text=q.text + c.text)
        prefix = f"filter {n} "
        for name, section in found.items():
            if name.startswith(prefix):
                parent = name[len(prefix) :]
                device.text += f"== filters of {parent}\n{section.text}"
                filters = parse_filters(section.text)
                if filters:
                    device.filters[parent] = filters
        state.devices[dev] = device
    if "iptables" in found:
        state.iptables = parse_iptables_save(found["iptables"].text)
    if "ip6tables" in found:
        state.ip6tables = parse_iptables_save(found["ip6tables"].text)
    return state


def command_runs(found: dict[str, Section], commands: Sequence[str]) -> list[CommandRun]:
    """The status and output of each command of a parse-check case."""
    runs = []
    for n, command in enumerate(commands):
        section = found.get(f"cmd {n}")
        if section is not None:
            runs.append(CommandRun(command, section.status, section.text))
    return runs


def commands_of(origins: Sequence[Origin]) -> list[str]:
    """The command lines a parse check runs: every command a policy comment names."""
    return [o.command for o in origins]


# ==== running on the host ======================================================================

_names = itertools.count()


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )


def host_unavailable() -> str | None:
    """Why cases cannot run on this host's kernel (not root, no ``ip``), or None."""
    if os.geteuid() != 0:
        return (
            "verifying on the host kernel needs root (network namespaces and tc); "
            "run as root, or use --kernel uml"
        )
    for tool in ("ip", "tc", "sh"):
        if shutil.which(tool) is None:
            return f"verifying on the host kernel needs '{tool}' (iproute2, a POSIX sh)"
    return None


def _run_case(args: list[str], timeout: float) -> tuple[int, str, str]:
    """Run a case in a session of its own; whatever ends the wait (a timeout, Ctrl-C) also
    kills every process the case started, so nothing keeps its namespace alive."""
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return 124, out, f"{err}timed out after {timeout:g} s\n"
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode, out, err


def run_on_host(cases: Sequence[Case], timeout: float = TIMEOUT) -> list[CaseResult]:
    """Run each case in a fresh network namespace of this host's kernel, one after another.

    The namespace (``tcdsl-verify-<pid>-<n>``) is deleted however the case ends, also on
    KeyboardInterrupt. Raises :class:`KernelUnavailable` if namespaces cannot be made.
    """
    why = host_unavailable()
    if why is not None:
        raise KernelUnavailable(why)
    results = []
    with tempfile.TemporaryDirectory(prefix="tcdsl-verify-") as tmp:
        for case in cases:
            ns = f"tcdsl-verify-{os.getpid()}-{next(_names)}"
            try:
                made = _run(["ip", "netns", "add", ns])
                if made.returncode != 0:
                    raise KernelUnavailable(
                        f"cannot create a network namespace: {made.stderr.strip() or 'ip failed'}"
                    )
                path = Path(tmp) / "case.sh"
                path.write_text(case.script, encoding="utf-8")
                status, out, err = _run_case(["ip", "netns", "exec", ns, "sh", str(path)], timeout)
                results.append(CaseResult(case.name, status, out, err))
            finally:
                _run(["ip", "netns", "del", ns])
    return results


@dataclass(frozen=True)
class HostSupport:
    """What this host's kernel and tools can do, probed once per process."""

    release: str
    qdiscs: frozenset[str]
    filters: frozenset[str]
    iptables: bool
    veth: bool = True
    actions: frozenset[str] = frozenset()
    ifb: bool = False
    notes: tuple[str, ...] = field(default=())
    ip6tables: bool = False

    def lacks(self, requirements: Sequence[Requirement]) -> list[Requirement]:
        """The requirements this host cannot meet."""
        out = []
        for req in requirements:
            kind, _, name = req.feature.partition("_")
            if req.feature == "iptables":
                ok = self.iptables
            elif req.feature == "ip6tables":
                ok = self.ip6tables
            elif kind == "sch":
                ok = name in self.qdiscs
            elif kind == "cls":
                ok = name in self.filters
            elif kind == "act":
                ok = name in self.actions
            elif req.feature == "ifb":
                ok = self.ifb
            else:
                ok = False
            if not ok or not self.veth:
                out.append(req)
        return out


_PROBE_QDISCS = (
    "htb",
    "tbf rate 1mbit burst 10k latency 50ms",
    "cbq bandwidth 10mbit avpkt 1000",
    "prio",
    "netem",
    "sfq",
    "fq_codel",
    "pfifo",
    "bfifo",
    "pfifo_fast",
    "hfsc",
    "cake",
    "codel",
    "fq",
    "fq_pie",
    "red limit 400000 avpkt 1000 bandwidth 10mbit",
)
_PROBE_FILTERS = {
    "u32": "u32 match u32 0 0 at 0 flowid 1:1",
    "fw": "handle 1 fw flowid 1:1",
    "flower": "flower classid 1:1",
}


_PROBE_ACTIONS = {
    "skbedit": "action skbedit queue_mapping 0",
    "police": "police rate 1mbit burst 10k drop flowid 1:1",
    "connmark": "action connmark",
    "mirred": "action mirred egress mirror dev tcdslprobe1",
}


def probe_script() -> str:
    """A case that reports which qdiscs, classifiers and iptables features work."""
    lines = [_PRELUDE.replace("@LABEL@", "probe")]
    lines.append(
        "if ip link add tcdslprobe0 type veth peer name tcdslprobe1 >/dev/null 2>&1 &&\n"
        "    ip link set tcdslprobe0 up; then echo veth; fi\n"
    )
    for spec in _PROBE_QDISCS:
        kind = spec.split()[0]
        lines.append(
            f"if tc qdisc add dev tcdslprobe0 root handle 1: {spec} >/dev/null 2>&1; then\n"
            f"    echo 'qdisc {kind}'\n"
            "    tc qdisc del dev tcdslprobe0 root\n"
            "fi\n"
        )
    lines.append("tc qdisc add dev tcdslprobe0 root handle 1: htb >/dev/null 2>&1\n")
    for n, (kind, spec) in enumerate(_PROBE_FILTERS.items(), start=1):
        lines.append(
            f"tc filter add dev tcdslprobe0 parent 1: protocol ip prio {n} {spec} "
            f">/dev/null 2>&1 && echo 'filter {kind}'\n"
        )
    lines.append(
        "ip link add tcdslprobe2 type ifb >/dev/null 2>&1 && echo ifb\n"
        "tc qdisc add dev tcdslprobe0 handle ffff: ingress >/dev/null 2>&1 &&\n"
        "    echo 'qdisc ingress'\n"
        "tc qdisc add dev tcdslprobe1 clsact >/dev/null 2>&1 && echo 'qdisc clsact'\n"
        "ip link add tcdslprobe3 numtxqueues 2 type veth peer name tcdslprobe4 >/dev/null 2>&1 &&\n"
        "    tc qdisc add dev tcdslprobe3 root handle 1: mq >/dev/null 2>&1 && echo 'qdisc mq'\n"
    )
    for n, (kind, spec) in enumerate(_PROBE_ACTIONS.items(), start=10):
        lines.append(
            f"tc filter add dev tcdslprobe0 parent 1: protocol ip prio {n} u32 match u32 0 0 "
            f"{spec} >/dev/null 2>&1 && echo 'action {kind}'\n"
        )
    for tool in ("iptables", "ip6tables"):
        lines.append(
            f"{tool} -t mangle -N TCDSL-PROBE >/dev/null 2>&1 &&\n"
            f"    {tool} -t mangle -A TCDSL-PROBE -m mark --mark 0 -j MARK --set-mark 1 "
            f">/dev/null 2>&1 && echo {tool}\n"
        )
    return "".join(lines)


@functools.cache
def host_support() -> HostSupport:
    """Probe this host's kernel once (in a scratch namespace); raises KernelUnavailable."""
    result = run_on_host([Case("probe", probe_script())], timeout=60)[0]
    found = sections(result.stdout)
    release = found["kernel"].text.strip() if "kernel" in found else "?"
    words = [line.split() for line in result.stdout.splitlines()]
    return HostSupport(
        release,
        frozenset(w[1] for w in words if len(w) == 2 and w[0] == "qdisc"),
        frozenset(w[1] for w in words if len(w) == 2 and w[0] == "filter"),
        ["iptables"] in words,
        ["veth"] in words,
        frozenset(w[1] for w in words if len(w) == 2 and w[0] == "action"),
        ["ifb"] in words,
        ip6tables=["ip6tables"] in words,
    )


# ==== running on user-mode Linux ===============================================================


def uml_unavailable() -> str | None:
    """Why no user-mode Linux guest can run cases here, or None (boots it once to see)."""
    try:
        from tcdsl.kernels import uml
    except ImportError as exc:
        return f"user-mode Linux support (tcdsl.kernels.uml) is not installed: {exc}"
    why = uml.available()
    return None if why is None else str(why)


def run_on_uml(cases: Sequence[Case]) -> list[CaseResult | None]:
    """Run the cases in one user-mode Linux boot; None for a case the guest did not finish.

    Raises :class:`KernelUnavailable` if UML cannot run here.
    """
    why = uml_unavailable()
    if why is not None:
        raise KernelUnavailable(why)
    from tcdsl.kernels import uml

    jobs = [uml.Case(c.name, c.script) for c in cases]
    # A guest process costs about 0.1 s (more on a busy host), and a case runs about a
    # command per line of its script: a big tree (a subscriber table) takes minutes.
    lines = sum(c.script.count("\n") for c in cases)
    try:
        done = list(uml.run_cases(jobs, timeout=max(120.0, 10.0 * len(jobs) + 0.2 * lines)))
    except uml.UmlUnavailable as exc:
        raise KernelUnavailable(str(exc)) from exc
    except uml.UmlError as exc:
        done = list(exc.results)
    results: list[CaseResult | None] = [
        CaseResult(str(r.name), int(r.exit_code), str(r.stdout), str(r.stderr)) for r in done
    ]
    return results + [None] * (len(cases) - len(results))
