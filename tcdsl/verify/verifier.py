"""Verify policies on a real kernel: compile, apply in a throwaway namespace, read back, compare.

:func:`verify_many` plans every policy first, then runs the host's cases one namespace at a
time and all user-mode Linux cases in a single boot, then compares. Which kernel runs a policy:

- ``host``: this machine's kernel (needs root); a feature it lacks is an E405 at the policy
  text that needs it;
- ``uml``: a Debian 6.1 kernel booted as user-mode Linux (``tcdsl.kernels.uml``);
- ``auto``: the host when it has everything the policy needs, else user-mode Linux.

No kernel has cbq any more (removed in Linux 6.3): a cbq policy gets an E405 at its cbq qdisc,
and its commands are run one by one to check that tc at least parses each of them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Literal

from tcdsl import ir
from tcdsl.backend import BackendOptions
from tcdsl.commands import owned_chains, unjump_shell
from tcdsl.diagnostics import Diagnostic, Severity, Span, sort_key
from tcdsl.driver import Result, compile_policy
from tcdsl.frontend.source import Access
from tcdsl.verify import APPLIERS, KernelChoice, compare, runner
from tcdsl.verify.compare import MISSING, NO_FEATURE, Origin
from tcdsl.verify.expect import ExpectedPolicy, Requirement, expected_policy

_BATCH_FAILED = re.compile(r"Command failed (?P<file>.*):(?P<line>\d+)$")
BATCH_FROM = 2000
"""From this many commands on, the shell script is verified in its batch form (the one it is
generated in unless ``--per-command``): the per-command form runs a tc process per command,
76 s for 10,000 classes. A failed command is then named by its line in the batch; what tc
warns on the way (W406), which has no line, at the batch's first line that makes something."""


class VerifyError(Exception):
    """Verification cannot run at all (no usable kernel, an unknown backend); says why."""


@dataclass
class Checked:
    """How many objects of each kind were compared."""

    qdiscs: int = 0
    classes: int = 0
    filters: int = 0
    rules: int = 0
    """iptables rules (the jump into the chain counts as one)."""
    rules6: int = 0
    """ip6tables rules."""

    def __str__(self) -> str:
        parts = [
            f"{n} {word}{'s' * (n != 1) if word != 'class' else 'es' * (n != 1)}"
            for n, word in (
                (self.qdiscs, "qdisc"),
                (self.classes, "class"),
                (self.filters, "filter"),
                (self.rules, "iptables rule"),
                (self.rules6, "ip6tables rule"),
            )
            if n
        ]
        return ", ".join(parts) or "nothing"


@dataclass
class Verification:
    """The verdict on one policy."""

    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    kernel: str | None = None
    """Which kernel the policy ran on (``host kernel 6.1.0``), None if it ran on none."""
    expected: ExpectedPolicy | None = None
    script: str | None = None
    checked: Checked = field(default_factory=Checked)
    output: str = ""
    """Everything the case printed (stdout, then stderr), for a look when something is odd."""

    @property
    def errors(self) -> list[Diagnostic]:
        """The diagnostics that are errors."""
        return [d for d in self.diagnostics if d.is_error]

    @property
    def ok(self) -> bool:
        """True when the policy ran and the kernel agrees with it (warnings allowed)."""
        return self.kernel is not None and not self.errors


@dataclass
class _Plan:
    verification: Verification
    expected: ExpectedPolicy | None = None
    policy: ir.Policy | None = None
    origins: list[Origin] = field(default_factory=list)
    where: Literal["host", "uml", ""] = ""
    commands: list[str] = field(default_factory=list)
    """Parse check only (cbq): the command lines to run one by one."""
    case: runner.Case | None = None
    batch: list[str] = field(default_factory=list)
    """tc-batch: the lines of the batch file, to name the one tc reports as failed."""
    batches: list[list[str]] = field(default_factory=list)
    """The shell script's batch form: the lines of each of its ``tc -batch`` heredocs."""


def _features_of(expected: ExpectedPolicy) -> list[Requirement]:
    return [r for r in expected.requirements if r.feature != "sch_cbq"]


def devices(policy: ir.Policy) -> tuple[list[str], list[str]]:
    """The interfaces to create (policy ones, then ``classify ... from`` ones) and to read."""
    create = list(dict.fromkeys(i.interface for i in policy.interfaces))
    # A download's IFB is created by the script itself.
    read = list(dict.fromkeys([*create, *(i.name for i in policy.interfaces)]))
    for iface in policy.interfaces:
        named = iface.marking.from_interface if iface.marking is not None else None
        if named is not None and named not in create:
            create.append(named)
    return create, read


def tx_queues(policy: ir.Policy) -> dict[str, int]:
    """The TX queues each device needs (an mq root: its highest queue number)."""
    return {i.name: n for i in policy.interfaces if (n := ir.tx_queues_used(i))}


def _plan(
    path: str,
    backend: str,
    before: str,
    after: str,
    batch_from: int = BATCH_FROM,
    access: Access | None = None,
) -> _Plan:
    # The shell script's per-command form: a failing command is then named by its own line
    # (the batch form runs the same commands in the same order through one tc -batch).
    result = compile_policy(path, backend, options=BackendOptions(batch=False), access=access)
    # Advice (infos) is for 'check --info'; verify reports what the kernel does.
    found = [d for d in result.diagnostics if d.severity is not Severity.INFO]
    v = Verification(path, found, dict(result.sources), script=result.output)
    plan = _Plan(v)
    if result.output is None or result.policy is None:
        return plan
    expected = expected_policy(result.policy, result.sources)
    v.expected, plan.expected, plan.policy = expected, expected, result.policy
    files: dict[str, str] = {}
    applier = result.output
    if backend == "tc-batch":
        applier, files = batch_applier(result.policy, result.files)
        plan.batch = result.output.splitlines()
        plan.origins = _map_origins(result.files, plan.batch, expected.spans())
    else:
        # each command follows a tcdsl_at= line: counted, not located twice
        if result.output.count(compare.AT) >= batch_from:
            applier = v.script = _batch_form(result, path)
            plan.batches = compare.script_batches(applier)
        plan.origins = compare.script_origins(applier, expected.spans())
    v.checked = Checked(
        sum(len(i.qdiscs) for i in expected.interfaces),
        sum(len(i.classes) for i in expected.interfaces),
        sum(len(i.filters) for i in expected.interfaces),
        sum(len(c.rules) + 1 for i in expected.interfaces for c in i.chains if c.family == "ipv4"),
        sum(len(c.rules) + 1 for i in expected.interfaces for c in i.chains if c.family == "ipv6"),
    )
    create, read = devices(result.policy)
    cbq = expected.needs("sch_cbq")
    if cbq is not None:
        v.diagnostics.append(
            Diagnostic.error(
                NO_FEATURE,
                "no kernel available has cbq (removed in Linux 6.3); only checking that tc "
                "parses every command",
                cbq.span,
            )
        )
        plan.commands = runner.commands_of(plan.origins)
        script = runner.case_script(path, applier, create, read, commands=plan.commands)
    else:
        script = runner.case_script(
            path,
            applier,
            create,
            read,
            iptables=expected.needs("iptables") is not None,
            ip6tables=expected.needs("ip6tables") is not None,
            before=before,
            after=after,
            files=files,
            queues=tx_queues(result.policy),
        )
    plan.case = runner.Case(path, script)
    return plan


def batch_applier(policy: ir.Policy, files: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A script that applies a tc-batch output the way its comments say, and its files."""
    names = {name.rsplit(".", 1)[-1]: name for name in files}
    lines = ["set -eu"]
    if "ip" in names:
        # As the batch's header says: an IFB that exists makes 'link add' fail harmlessly.
        lines.append(f"ip -force -batch {shlex.quote(names['ip'])} || true")
    lines.append(f"tc -batch {shlex.quote(names['batch'])}")
    for tool in ("iptables", "ip6tables"):
        if tool not in names:
            continue
        for chains in owned_chains(policy).values():
            # unjump_shell writes iptables commands: the same ones in the other table
            lines += [unjump_shell(chain).replace("iptables", tool) for chain in chains]
        lines.append(f"{tool}-restore --noflush {shlex.quote(names[tool])}")
    if "nft" in names:
        lines.append(f"nft -f {shlex.quote(names['nft'])}")
    return "".join(f"{line}\n" for line in lines), dict(files)


def _map_origins(
    files: Mapping[str, str], batch: Sequence[str], spans: Iterable[Span]
) -> list[Origin]:
    """The origin of every batch line the ``.map`` file names (as ``tc LINE``)."""
    known: dict[tuple[str, int, int], Span] = {}
    for s in spans:
        known.setdefault((s.file, s.line, s.column), s)
    text = next((t for name, t in files.items() if name.endswith(".map")), "")
    out = []
    for row in text.splitlines():
        if row.startswith("#"):
            continue
        number, where, what = row.split("\t", 2)
        file, line, column = where.rsplit(":", 2)
        key = (file, int(line), int(column))
        span = known.get(key, Span(file, key[1], key[2], key[1], key[2] + 1))
        command = f"tc {batch[int(number) - 1]}"
        out.append(Origin(command, compare.shell_words(command), span, what))
    return out


def _batch_form(result: Result, path: str) -> str:
    """The shell script of ``result`` in its batch form."""
    from tcdsl.backends import BACKENDS

    assert result.policy is not None
    emitter = BACKENDS["shell"](BackendOptions(batch=True))
    return next(iter(emitter.emit_files(result.policy, path, PurePath(path).stem).values()))


def _name_shell_batch_steps(outcome: compare.ApplyOutcome, batches: Sequence[list[str]]) -> None:
    """Name each ``tc -batch -`` step of the script's batch form by a line of its heredoc,
    with what tc said (which the script catches in ``tcdsl_said``, whose trace shows it):
    the failed line (``Command failed -:LINE``), the steps after it dropped; else, when tc
    warned, the batch's first line (the warnings have no line of their own)."""
    batch = -1
    for i, step in enumerate(outcome.steps):
        if step.command != "tc -batch -":
            continue
        batch += 1
        told: list[str] = []
        for later in outcome.steps[i + 1 :]:
            if later.command == "tc -batch -":
                break
            if later.command.startswith(_SAID):
                told = _traced_value([later.command[len(_SAID) :], *later.stderr])
                break
        found = [m for x in told if (m := _BATCH_FAILED.search(x)) and m["file"] == "-"]
        said = [x for x in told if x.strip() and _BATCH_FAILED.search(x) is None]
        lines = batches[batch] if batch < len(batches) else []
        line = int(found[-1]["line"]) if found else 0
        if 0 < line <= len(lines):
            step.command, step.stderr = compare.shell_words(f"tc {lines[line - 1]}"), said
            del outcome.steps[i + 1 :]
            return
        first = _first_made(lines)
        if said and first is not None:
            step.command, step.stderr = compare.shell_words(f"tc {first}"), said


_SAID = "tcdsl_said="
"""The assignment that catches what the script's ``tc -batch -`` says."""


def _traced_value(lines: list[str]) -> list[str]:
    """A multi-line value as a shell's xtrace shows an assignment: as it is (dash), or in
    single quotes (bash)."""
    if lines and lines[0].startswith("'") and lines[-1].endswith("'"):
        lines = [lines[0][1:], *lines[1:]]
        lines[-1] = lines[-1][:-1]
    return lines


def _name_batch_failure(outcome: compare.ApplyOutcome, batch: Sequence[str]) -> None:
    """Replace a failed ``tc -batch FILE`` step by the batch line tc names, as ``tc LINE``.

    tc reports the line as ``Command failed FILE:LINE``; the step then matches that line's
    origin, so the failure is reported at the policy text. Warnings have no line number: a
    batch that only warned is named by its first line, where they are reported.
    """
    for step in outcome.steps:
        if not step.command.startswith("tc -batch "):
            continue
        for said in step.stderr:
            m = _BATCH_FAILED.search(said)
            if m is not None and 0 < int(m["line"]) <= len(batch):
                step.command = compare.shell_words(f"tc {batch[int(m['line']) - 1]}")
                step.stderr = [x for x in step.stderr if x is not said]
                return
        first = _first_made(batch)
        if any(x.strip() for x in step.stderr) and first is not None:
            step.command = compare.shell_words(f"tc {first}")


def _first_made(batch: Sequence[str]) -> str | None:
    """The first line of a batch that makes something (not its teardown): where what tc
    warned of, without a line, is reported."""
    lines = [x for x in batch if x.strip() and not x.startswith("#")]
    return next((x for x in lines if x.split()[1:2] == ["add"]), next(iter(lines), None))


def _choose(plans: Sequence[_Plan], kernel: KernelChoice) -> None:
    """Decide where each plan runs; a plan with nowhere to run gets E405 diagnostics."""
    host_why: str | None = None
    support: runner.HostSupport | None = None
    if kernel in ("host", "auto"):
        host_why = runner.host_unavailable()
        if host_why is None:
            try:
                support = runner.host_support()
            except runner.KernelUnavailable as exc:
                host_why = str(exc)
        if kernel == "host" and support is None:
            raise VerifyError(host_why or "the host kernel cannot be used")
    uml_why: str | None = None
    uml_checked = False

    def uml_reason() -> str | None:
        nonlocal uml_why, uml_checked
        if not uml_checked:
            uml_why, uml_checked = runner.uml_unavailable(), True
        return uml_why

    for plan in plans:
        if plan.case is None or plan.expected is None:
            continue
        lacks = support.lacks(_features_of(plan.expected)) if support is not None else []
        if kernel == "host":
            assert support is not None
            if lacks and not plan.commands:
                _lacking(plan, lacks, f"the host kernel ({support.release}) lacks", "uml")
            else:
                plan.where = "host"
        elif kernel == "uml":
            why = uml_reason()
            if why is not None:
                raise VerifyError(f"user-mode Linux is unavailable: {why}")
            plan.where = "uml"
        elif support is not None and (not lacks or plan.commands):
            plan.where = "host"
        elif uml_reason() is None:
            plan.where = "uml"
        elif support is not None:
            _lacking(
                plan,
                lacks,
                f"the host kernel ({support.release}) lacks",
                f"user-mode Linux is unavailable: {uml_why}",
            )
        else:
            raise VerifyError(
                f"no kernel to verify on: {host_why}; user-mode Linux is unavailable: {uml_why}"
            )


def _lacking(plan: _Plan, lacks: Sequence[Requirement], who: str, instead: str) -> None:
    hint = "; verify with --kernel uml" if instead == "uml" else f" and {instead}"
    for req in lacks:
        plan.verification.diagnostics.append(
            Diagnostic.error(NO_FEATURE, f"{who} {req.what} ({req.feature}){hint}", req.span)
        )


def _first_span(expected: ExpectedPolicy) -> Span:
    iface = expected.interfaces[0]
    return iface.qdiscs[0].span if iface.qdiscs else iface.span


def _judge(plan: _Plan, result: runner.CaseResult | None, where: str) -> None:
    """Turn a case's output into the plan's diagnostics."""
    v, expected = plan.verification, plan.expected
    assert expected is not None and plan.policy is not None and v.script is not None
    if result is None:
        v.diagnostics.append(
            Diagnostic.error(
                NO_FEATURE,
                "the user-mode Linux guest stopped before this policy was verified",
                _first_span(expected),
            )
        )
        return
    v.output = result.stdout + result.stderr
    found = runner.sections(result.stdout)
    release = found["kernel"].text.strip() if "kernel" in found else "?"
    setup = found.get("setup")
    if setup is None or setup.status != 0:
        why = setup.text.strip() if setup is not None else result.stderr.strip()
        v.diagnostics.append(
            Diagnostic.error(
                NO_FEATURE,
                f"cannot create the policy's interfaces as veth devices: {why or 'no output'}",
                expected.interfaces[0].span,
            )
        )
        return
    v.kernel = f"{where} {release}"
    if plan.commands:
        v.kernel += ", tc parse check only"
        runs = runner.command_runs(found, plan.commands)
        v.diagnostics += compare.parse_check_diagnostics(runs, plan.origins)
        return
    outcome = runner.apply_outcome(found)
    if outcome is None:
        v.diagnostics.append(
            Diagnostic.error(
                compare.APPLY_FAILED,
                f"the script did not run (exit {result.exit_code}): "
                f"{result.stderr.strip() or 'no output'}",
                _first_span(expected),
            )
        )
        return
    if plan.batch:
        _name_batch_failure(outcome, plan.batch)
    if plan.batches:
        _name_shell_batch_steps(outcome, plan.batches)
    applied = compare.apply_diagnostics(outcome, plan.origins, _first_span(expected))
    state = runner.read_state(found, devices(plan.policy)[1])
    differences = compare.compare_state(expected, state)
    if outcome.failed:
        # What the script never got to create is missing, of course: one count, not a list.
        missing = [d for d in differences if d.code == MISSING]
        differences = [d for d in differences if d.code != MISSING]
        if missing:
            note = (
                f"; the script stopped there, so {len(missing)} "
                f"object{'s' * (len(missing) != 1)} of the policy are not checked"
            )
            applied = [replace(d, message=d.message + note) if d.is_error else d for d in applied]
    v.diagnostics += applied + differences


def verify_many(
    paths: Sequence[str],
    backend: str = "shell",
    kernel: KernelChoice = "auto",
    after: Mapping[str, str] | None = None,
    before: Mapping[str, str] | None = None,
    batch_from: int = BATCH_FROM,
    access: Access | None = None,
) -> list[Verification]:
    """Verify each policy in ``paths``; one user-mode Linux boot serves all that need one.

    ``after`` maps a path to shell run after its script, before the read-back (tests tamper
    with the kernel's state this way); ``before`` to shell run before the script. A shell
    script of ``batch_from`` commands or more is applied in its batch form. Raises
    :class:`VerifyError` when verification cannot run at all (``--kernel host`` without root
    or namespaces; no kernel whatsoever); a policy that cannot run on the chosen kernel gets
    E405 diagnostics instead. ``access``: where the policies' includes and tables may be read.
    """
    if backend not in APPLIERS:
        raise VerifyError(f"verify cannot apply the output of backend '{backend}' yet")
    plans = [
        _plan(
            path,
            backend,
            (before or {}).get(path, ""),
            (after or {}).get(path, ""),
            batch_from,
            access,
        )
        for path in paths
    ]
    _choose(plans, kernel)
    host = [p for p in plans if p.where == "host"]
    guest = [p for p in plans if p.where == "uml"]
    if host:
        cases = [p.case for p in host if p.case is not None]
        try:
            results = runner.run_on_host(cases)
        except runner.KernelUnavailable as exc:
            raise VerifyError(str(exc)) from exc
        for plan, result in zip(host, results, strict=True):
            _judge(plan, result, "host kernel")
    if guest:
        cases = [p.case for p in guest if p.case is not None]
        try:
            results_or_none = runner.run_on_uml(cases)
        except runner.KernelUnavailable as exc:
            raise VerifyError(f"user-mode Linux is unavailable: {exc}") from exc
        for plan, maybe in zip(guest, results_or_none, strict=True):
            _judge(plan, maybe, "user-mode Linux")
    for plan in plans:
        plan.verification.diagnostics.sort(key=sort_key)
    return [p.verification for p in plans]


def verify(
    path: str,
    backend: str = "shell",
    kernel: KernelChoice = "auto",
    after: str = "",
    before: str = "",
) -> Verification:
    """Verify one policy (see :func:`verify_many`)."""
    return verify_many([path], backend, kernel, {path: after}, before={path: before})[0]
