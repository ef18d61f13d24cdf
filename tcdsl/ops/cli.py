"""The live operations' commands (``plan``, ``apply``, ``confirm``, ``rollback``, ``down``,
``status``, ``import``), added to the ``tcdsl`` command group by :func:`register`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import click

from tcdsl import ir
from tcdsl.cliutil import (
    EXIT_POLICY,
    FORMAT,
    access_options,
    dash_is_stdout,
    output_option,
    policy_or_exit,
    state_name,
    summary,
    unit_refusal,
    writing,
)
from tcdsl.commands import unspellable
from tcdsl.diagnostics import Diagnostic, Severity, Span, render, render_json
from tcdsl.driver import Result, analyse, collector_paused
from tcdsl.frontend.source import Access
from tcdsl.ops.apply import ApplyFailed, deferred_signals, late_signal
from tcdsl.ops.desired import Tree
from tcdsl.ops.lifecycle import (
    NotKept,
    OpsError,
    Prepared,
    Reading,
    Unsupported,
    applied_elsewhere,
    apply,
    compile_new,
    confirm,
    down,
    down_interface_steps,
    keep_record,
    marks_against_others,
    policy_name,
    preflight,
    prepare,
    rollback,
    start_reading,
)
from tcdsl.ops.plan import Plan
from tcdsl.ops.state import StateWriteError, Store, UnfitDevice, valid_name
from tcdsl.units import parse_seconds
from tcdsl.words import or_list

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHANGES = 0, 1, 2, 4
FAILED = "E601"
NO_DEVICE = "E602"
NO_STATE = "E603"
UNSUPPORTED = "E604"
NOT_KEPT = "W609"


def parse_duration(text: str) -> float:
    """Seconds from ``60s``, ``2m``, ``500ms``, ``1h`` or a bare number of seconds; more
    than none (found by a tester: ``--confirm 0s`` rolled back before anyone could
    confirm)."""
    try:
        seconds = parse_seconds(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"not a duration: {text!r} (say 60s, 2m, 500ms)", param_hint="'--confirm'"
        ) from None
    if seconds <= 0:
        raise click.BadParameter(
            f"{text!r} leaves no time to confirm (say 60s, 2m)", param_hint="'--confirm'"
        )
    if seconds > MAX_CONFIRM:
        # (found by a tester: 99999999999s was taken, and the timer could not sleep that long)
        raise click.BadParameter(
            f"{text!r} is more than a day: the window is for the minutes after a change "
            "(say 60s, 5m, at most 24h)",
            param_hint="'--confirm'",
        )
    return seconds


MAX_CONFIRM = 24 * 3600.0
"""The longest ``--confirm`` window, in seconds."""


def said_duration(text: str) -> str:
    """A duration as the user gave it, with its unit (``60`` is ``60s``)."""
    text = text.strip()
    return f"{text}s" if text[-1:].isdigit() else text


def _store(name: str) -> Store:
    store = Store(state_name(name, "--name"))
    try:
        store.pending()  # (its state read once here: a file where its folder should be is E603)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    failed = store.timer_failed()
    if failed is not None:
        pending = store.pending()
        stands = f"generation {pending.generation}" if pending else "the policy applied"
        why = failed.splitlines()[0]
        if store.timer_left_partial():
            # (found by a tester: it said the policy stood, and confirm took it)
            click.echo(
                f"tcdsl: warning: the --confirm timer of '{name}' could not roll back ({why}), "
                f"nor build {stands} again: the kernel holds part of each policy ('tcdsl "
                f"plan' shows what differs); apply the policy you want",
                err=True,
            )
        else:
            click.echo(
                f"tcdsl: warning: the --confirm timer of '{name}' could not roll back ({why}); "
                f"{stands} stands: keep it (tcdsl confirm {name}) or roll back (tcdsl "
                f"rollback {name})",
                err=True,
            )
    gone = store.timer_gone()
    if gone is not None:
        # (found by a tester: a killed timer rolled nothing back, and nothing said so)
        when = time.strftime("%H:%M:%S", time.localtime(gone.deadline))
        click.echo(
            f"tcdsl: warning: the --confirm timer of '{name}' is gone (killed?) and did not "
            f"roll back at its deadline ({when}); generation {gone.generation} stands: keep "
            f"it (tcdsl confirm {name}) or roll back (tcdsl rollback {name})",
            err=True,
        )
    return store


def _compiled(
    path: str,
    store: Store,
    reading: Reading | None = None,
    repack: bool = False,
    access: Access | None = None,
) -> tuple[Result, tuple[Tree, ...]]:
    try:
        result, trees = compile_new(store, path, reading, repack, access)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    # the warnings too, as 'check' shows them: a subscriber in the default class (W371), a
    # line that never matches (W312) are worth knowing before the kernel changes
    shown = [d for d in result.diagnostics if d.severity is not Severity.INFO]
    if result.policy is not None:
        # (found by a tester: an interface named 'x#y' failed half-way, tc -batch reading
        # its name as a comment; the policy's commands of 100 words or more would too)
        shown += unspellable(result.policy, batch=True, nft=False, live=True)
    sources = dict(result.sources)
    if result.policy is not None and not any(d.is_error for d in shown):
        # the marks of the policies live under other names, which 'check' cannot see
        found, theirs = marks_against_others(result.policy, store.name)
        shown += found
        sources = {**theirs, **sources}
    if shown:
        click.echo(render(shown, sources), nl=False, err=True)
    if result.policy is None or any(d.is_error for d in shown):
        click.echo("tcdsl: the policy has errors; nothing was changed", err=True)
        sys.exit(EXIT_FAILED)
    return result, trees


def _fail(
    code: str,
    message: str,
    span: Span | None = None,
    sources: dict[str, str] | None = None,
    status: int = EXIT_FAILED,
) -> NoReturn:
    where = span or Span("tcdsl", 1, 1, 1, 1)
    diagnostic = Diagnostic.error(code, message, where)
    if span is None:
        click.echo(f"tcdsl: error[{code}]: {message}", err=True)
    else:
        click.echo(render([diagnostic], sources or {}), nl=False, err=True)
    sys.exit(status)


def _failed(e: ApplyFailed, sources: dict[str, str]) -> NoReturn:
    f = e.failure
    then = (
        "the previous state was restored"
        if e.restored
        else "restoring the previous state failed too"
    )
    if e.astray:  # (found by a tester: it did not say which trees were back as they were)
        then += f" for {or_list(list(e.astray), 'and')}"
        then += f" ({or_list(list(e.back), 'and')} as before)" if e.back else ""
    if e.lost:
        # an old script's qdisc the apply replaced: no state says how to build it again
        then += f", but not the {', '.join(e.lost)}, which no tcdsl state kept: build it again"
    if not e.restored:
        then += (
            ": the kernel may hold part of each policy; 'tcdsl plan' shows what differs from "
            "the live one, and an apply of either builds it whole"
        )
    if e.signal is not None and e.untouched:
        _fail(FAILED, f"{f.message}; nothing was changed", status=128 + e.signal)
    if e.restored and not e.first:
        # (found by a tester: a swap's failure rebuilt the tree, every counter reset, and
        # the message did not say it)
        how = "in place, the trees and counters kept" if e.in_place else "built again"
        then = f"{then} ({how}{'' if e.in_place else ': their counters start over'})"
    if e.signal is not None:  # the shell's status for a command a signal ended
        _fail(FAILED, f"{f.message}; {then}", status=128 + e.signal)
    name = f.origin.what if f.origin is not None else "the change"
    span = f.origin.span if f.origin is not None else None
    _fail(FAILED, f"{f.command!r} failed for {name}: {f.message}; {then}", span, sources)


def _prepared(
    policy: str,
    name: str | None,
    store: Store | None = None,
    repack: bool = False,
    access: Access | None = None,
) -> Prepared:
    """POLICY compiled (with the live class ids; ``repack``: its spread mq trees packed
    afresh) and planned against the policy live under its name (``store``, when the caller
    holds its lock); exits with the diagnostic on errors."""
    store = store or _store(policy_name(policy, name))
    try:
        reading = start_reading(store)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    with reading:  # (a compile that fails stops the kernel's reading)
        with collector_paused():  # (the new policy's kernel objects, compared with the live ones)
            result, trees = _compiled(policy, store, reading, repack, access)
        try:
            with collector_paused():  # (the kernel objects of both policies, the plan)
                return prepare(store, result.policy, result, reading, trees)
        except OpsError as e:
            _fail(NO_STATE, str(e))


def _print(plan: Plan, summary: bool = False, fmt: str = "text") -> None:
    if fmt == "json":
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        click.echo(plan.render(summary_only=summary), nl=False)


SUMMARY = click.option(
    "--summary",
    is_flag=True,
    help="Print the drift and the count of the changes, not each change (a table's rows make "
    "plans of thousands of lines).",
)


REPACK = click.option(
    "--repack",
    is_flag=True,
    help="Pack the classes of a spread mq tree (mq queues N) over its queues afresh: by "
    "default each live class stays on its queue and only new ones are packed. A class that "
    "changes queue is made again (its counters start over).",
)

NAME = click.option(
    "--name",
    help="The name the state keeps the policy under (default: the policy file's name "
    "without .tcp).",
)


@click.command(
    "plan",
    epilog="Examples:\n\n\b\n  tcdsl plan office.tcp\n  tcdsl plan office.tcp || echo changed\n"
    "  tcdsl plan --summary isp.tcp\n  tcdsl plan --format json isp.tcp\n\n"
    "Exit 0: no changes; 4: changes (or drift) to apply; 1: errors.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@NAME
@SUMMARY
@output_option(
    "How to print the plan: as text, or as JSON (each change with its sign, kind, text "
    "and policy line, and the counts).",
    "text",
    "json",
)
@REPACK
@access_options
def plan_command(
    policy: str, name: str | None, summary: bool, fmt: str, repack: bool, access: Access
) -> None:
    """Show what applying POLICY would change in the kernel, by the policy's names and lines,
    and what was changed by hand since the last apply (drift)."""
    prepared = _prepared(policy, name, repack=repack, access=access)
    _preflight(prepared)
    _print(prepared.plan, summary, fmt)
    plan = prepared.plan
    sys.exit(EXIT_CHANGES if not plan.empty or plan.drift or plan.notes else EXIT_OK)


def _preflight(prepared: Prepared) -> None:
    """Exit with apply's error when apply would refuse the plan (E602, E604)."""
    result = prepared.result
    sources = result.sources if result else {}
    try:
        preflight(prepared)
    except Unsupported as e:
        first = e.lacking[0]
        _fail(UNSUPPORTED, str(e), first.span, sources)
    except UnfitDevice as e:
        _fail(NO_DEVICE, str(e), e.span if e.span and e.span.file in sources else None, sources)
    except OpsError as e:
        _fail(NO_DEVICE, str(e))


@click.command(
    "apply",
    epilog="Examples:\n\n\b\n  tcdsl apply --yes office.tcp\n"
    "  tcdsl apply --confirm 60s office.tcp && tcdsl confirm office\n\n"
    "With --confirm, the change is rolled back after the time unless 'tcdsl confirm' runs: "
    "for the interface you are logged in over.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@NAME
@click.option("--yes", "-y", is_flag=True, help="Apply without asking.")
@click.option("--confirm", "within", help="Roll back unless confirmed within this time (60s, 2m).")
@SUMMARY
@REPACK
@access_options
def apply_command(
    policy: str,
    name: str | None,
    yes: bool,
    within: str | None,
    summary: bool,
    repack: bool,
    access: Access,
) -> None:
    """Make the kernel equal to POLICY with the smallest safe change."""
    seconds = parse_duration(within) if within is not None else None
    store = _store(policy_name(policy, name))
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(store.locked())
        except OpsError as e:  # the state folder cannot be written: nothing changed
            _fail(NO_STATE, str(e))
        _apply(policy, store, yes, seconds, within, summary, repack, access)


def _apply(
    policy: str,
    store: Store,
    yes: bool,
    seconds: float | None,
    within: str | None,
    summary: bool,
    repack: bool = False,
    access: Access | None = None,
) -> None:
    prepared = _prepared(policy, None, store, repack, access)
    _preflight(prepared)
    result = prepared.result
    assert result is not None
    _print(prepared.plan, summary)
    waiting = store.pending()  # a --confirm apply whose rollback this one calls off
    # Another file, or other text, that changes nothing in the kernel is still what the admin
    # applies: recorded (found by a tester: status, classify and rollback went on naming the
    # file before it).
    live = prepared.applied
    new_text = live is not None and (
        applied_elsewhere(live, policy)
        or {os.path.realpath(live.where(k)): v for k, v in live.sources.items()}
        != {os.path.realpath(k): v for k, v in result.sources.items()}  # however spelt
    )
    if prepared.plan.empty and not prepared.plan.drift and seconds is None and not new_text:
        keep_record(prepared)
        if waiting is not None:  # the policy live is the one to keep: no rollback
            store.set_pending(None)
            _called_off(waiting.generation)
        return
    if not yes:
        if not sys.stdin.isatty():
            click.echo("tcdsl: not applied: give --yes to apply without a terminal", err=True)
            sys.exit(EXIT_USAGE)
        if not click.confirm("Apply these changes?", default=False):
            click.echo("tcdsl: nothing was changed", err=True)
            sys.exit(EXIT_FAILED)
    try:
        # SIGINT, SIGTERM and SIGHUP held from the first change to the record (the plan stops at
        # the end of a step and takes the change back; after its last step, it stands)
        with collector_paused(), deferred_signals() as caught:
            applied = apply(prepared, policy, result.sources, seconds)
    except ApplyFailed as e:
        _failed(e, result.sources)
    except Unsupported as e:
        first = e.lacking[0]
        _fail(UNSUPPORTED, str(e), first.span, result.sources)
    except NotKept as e:  # the change stands and is recorded
        click.echo(f"tcdsl: warning[{NOT_KEPT}]: {e}", err=True)
        applied = e.applied
    except StateWriteError as e:
        _fail(NO_STATE, str(e))
    except OpsError as e:
        _fail(NO_DEVICE, str(e))
    note = (
        f"; rolled back in {said_duration(within)} unless 'tcdsl confirm {store.name}'"
        if within
        else ""
    )
    click.echo(f"applied {policy} as {store.name} (generation {applied.generation}){note}")
    _late(caught)
    if waiting is not None and waiting.generation != applied.generation:
        _called_off(waiting.generation, rolled_back_to=bool(within))


def _late(caught: list[int]) -> None:
    """Say so when a signal came after the change was complete (it stands)."""
    said = late_signal(caught)
    if said is not None:
        click.echo(said, err=True)


def _called_off(generation: int, rolled_back_to: bool = False) -> None:
    # (found by a tester: an apply with --confirm of its own said it kept its policy, and its
    # timer then rolled back to the unconfirmed generation before it)
    then = (
        f"this apply's timer rolls back to generation {generation}, not before it"
        if rolled_back_to
        else "this apply keeps the policy it applies"
    )
    click.echo(
        f"tcdsl: generation {generation}, applied with --confirm, is no longer rolled back: {then}",
        err=True,
    )


@click.command("confirm", epilog="Example:\n\n\b\n  tcdsl confirm office")
@click.argument("name")
def confirm_command(name: str) -> None:
    """Keep the policy applied with --confirm under NAME (stop its rollback timer)."""
    store = _store(name)
    try:
        with store.locked():
            pending = confirm(store)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    click.echo(f"confirmed {name} (generation {pending.generation})")


@click.command("rollback", epilog="Example:\n\n\b\n  tcdsl rollback office")
@click.argument("name")
def rollback_command(name: str) -> None:
    """Go back to the policy applied under NAME before the live one (or remove it, if there
    was none)."""
    store = _store(name)
    try:
        with store.locked(), deferred_signals() as caught:
            back = rollback(store)
    except UnfitDevice as e:
        _fail(NO_DEVICE, str(e))
    except NotKept as e:  # the rollback stands and is recorded
        click.echo(f"tcdsl: warning[{NOT_KEPT}]: {e}", err=True)
        back = e.applied
    except OpsError as e:
        _fail(NO_STATE, str(e))
    except ApplyFailed as e:
        _failed(e, {})
    if back is None:
        click.echo(f"rolled back {name}: removed (nothing was applied before)")
    else:
        click.echo(f"rolled back {name} to generation {back.generation} ({back.path})")
    _late(caught)


@click.command(
    "down",
    epilog="Examples:\n\n\b\n  tcdsl down office\n"
    "  tcdsl down -i eth0 --yes   (whatever policy shaped eth0)",
)
@click.argument("name", required=False)
@click.option("-i", "--interface", help="Remove what tcdsl made on this device instead.")
@click.option("--yes", is_flag=True, help="With -i: remove without asking (no terminal: needed).")
def down_command(name: str | None, interface: str | None, yes: bool) -> None:
    """Remove everything the policy applied under NAME owns (qdiscs of both directions,
    IFBs' trees, shared policers, marking chains) and its state; or with -i, what tcdsl
    makes on that device (root and ingress qdiscs, its IFB, chain TCDSL-IFACE, nft table
    tcdsl_IFACE) whatever policy made it: listed first, and removed once confirmed (--yes
    without a terminal)."""
    if (name is None) == (interface is None):
        raise click.UsageError("give a policy NAME or -i IFACE")
    if interface is not None:
        try:
            steps = down_interface_steps(interface)
        except OpsError as e:
            _fail(NO_DEVICE, str(e))
        if all(s.kept for s in steps):
            click.echo("\n".join([f"nothing of tcdsl's on {interface}", *(s.line for s in steps)]))
            return
        if not yes:
            click.echo("\n".join(s.line for s in steps))
            if not sys.stdin.isatty():
                click.echo("tcdsl: nothing removed: give --yes to remove without a terminal",
                           err=True)  # fmt: skip
                sys.exit(EXIT_USAGE)
            if not click.confirm(f"Remove these from {interface}?", default=False):
                click.echo("tcdsl: nothing was changed", err=True)
                sys.exit(EXIT_FAILED)
        with deferred_signals() as caught:
            removed = [s.line for s in steps if s.run()]
        click.echo("\n".join(removed))
        _late(caught)
        return
    assert name is not None
    store = _store(Path(name).stem if name.endswith(".tcp") else name)
    try:
        with store.locked(), deferred_signals() as caught:
            plan = down(store)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    except ApplyFailed as e:
        _failed(e, {})
    _print(plan)
    _late(caught)


@click.command(
    "import",
    epilog="Examples:\n\n\b\n  tcdsl import -i eth0 > eth0.tcp\n"
    "  tcdsl import -i eth0 --from saved.txt -o eth0.tcp\n\n"
    "Save the text on the router with:\n\n\b\n"
    "  { tc -d qdisc show dev eth0; tc -d class show dev eth0;\n"
    "    tc filter show dev eth0; tc filter show dev eth0 parent ffff:; } > saved.txt\n\n"
    "What the language cannot say is a warning (W610-W619) at the line of tc's text and a "
    "comment in the policy. Exit 0 when a policy was written (warnings allowed), 1 when "
    "nothing could be imported.",
)
@click.option(
    "-i", "--interface", required=True, help="The interface whose configuration to import."
)
@click.option(
    "--from",
    "from_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Read the saved output of tc's qdisc, class and filter show for the interface "
    "instead of the live kernel ('-': standard input; docs/operations.md, 'import').",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    callback=dash_is_stdout,
    help="Write to this file instead of stdout ('-': stdout).",
)
@FORMAT
def import_command(interface: str, from_file: str | None, output: str | None, fmt: str) -> None:
    """Write a policy that builds the traffic-control state of INTERFACE (live, or saved with
    --from): qdiscs with their handles, classes by id, filters as match lines."""
    from tcdsl.ops.importer import ImportResult, import_policy
    from tcdsl.ops.tctext import DeviceText, ReadError, read_file, read_live

    def read_other(device: str) -> DeviceText | None:
        try:
            return read_live(device)
        except ReadError:
            return None

    if '"' in interface or "\n" in interface:
        raise click.BadParameter(
            f"{interface!r} holds a {'quote' if chr(34) in interface else 'line break'}, which "
            "a policy cannot write (its strings have no escapes): rename the device "
            "(ip link set dev NAME name NEW) and import it again",
            param_hint="'-i'",
        )
    try:
        if from_file is not None:
            result = import_policy(read_file(from_file, interface))
        else:
            result = import_policy(read_live(interface), read_other)
    except ReadError as err:
        where = from_file if from_file is not None else f"tc:{interface}"
        diagnostic = Diagnostic.error(err.code, err.message, Span(where, 1, 1, 1, 1))
        result = ImportResult(None, [diagnostic], {})
    if fmt == "json":
        click.echo(render_json(result.diagnostics), nl=False, err=True)
    elif result.diagnostics:
        click.echo(render(result.diagnostics, result.sources), nl=False, err=True)
    if result.policy is None:
        if fmt == "text":
            click.echo(f"tcdsl: {summary(result.diagnostics)}; nothing imported", err=True)
        sys.exit(EXIT_POLICY)
    if output is None:
        click.echo(result.policy, nl=False)
    else:
        with writing(output):
            Path(output).write_text(result.policy, encoding="utf-8")
    if any(d.is_error for d in result.diagnostics):  # written, to be edited (E609)
        sys.exit(EXIT_POLICY)


def _replace_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader such as node_exporter's textfile
    collector sees the old file or the new one, never a part)."""
    target = Path(path)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with writing(path):
        try:
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)


def _seconds(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A duration for status: a time with a unit (``500ms``, ``2s``) or bare seconds (``0.2``,
    as watch(1) takes them)."""
    from tcdsl.units import parse_seconds

    if value is None:
        return None
    try:
        seconds = parse_seconds(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} {unit_refusal(value)}", ctx, param) from None
    if seconds <= 0:
        raise click.BadParameter(f"{value!r} must be above 0", ctx, param)
    return seconds


@click.command(
    "status",
    epilog="Examples:\n\n\b\n"
    "  tcdsl status office.tcp\n"
    "  tcdsl status -i eth0 --watch 2s\n"
    "  tcdsl status isp.tcp --class 'c10*' --top 20 --watch 5s\n"
    "  tcdsl status --name isp --class c1001\n"
    "  tcdsl status office.tcp --format json --watch 1s --count 60 > samples.jsonl\n"
    "  tcdsl status office.tcp --format prometheus --watch 15s "
    "-o /var/lib/node_exporter/textfile/tcdsl.prom\n\n"
    "Each sample reads the kernel's counters twice, --interval apart, for the rate now; the "
    "average is over the whole session. docs/operations.md describes the columns, JSON keys "
    "and metrics. Exit 0 (also when Ctrl-C ends --watch), 1 when the policy has errors or a "
    "device does not exist (E602), 2 on usage errors.",
)
@click.argument("policy", required=False, type=click.Path(dir_okay=False))
@NAME
@click.option(
    "-i",
    "--interface",
    "interfaces",
    multiple=True,
    metavar="IFACE",
    help="The device to show (repeatable): without POLICY, its kernel tree with tc's ids; with "
    "POLICY, only the policy's trees on it.",
)
@click.option(
    "--class",
    "patterns",
    multiple=True,
    metavar="PATTERN",
    help="Show only the classes whose name or id matches PATTERN, a shell-style pattern "
    "('c1001', 'c10*', 'north'), whose circuit id in a subscriber table is PATTERN ('1001', "
    "'A-1'), or whose match lines take packets from or to PATTERN, an address ('100.64.0.8': "
    "a subscriber's classes), with the classes below and above them (repeatable).",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    metavar="N",
    help="Show only the N leaf classes of each tree busiest now (by the rate now, then the "
    "average, then bytes), with the classes above them.",
)
@click.option(
    "--watch",
    "every",
    is_flag=False,
    flag_value="1s",
    callback=_seconds,
    metavar="INTERVAL",
    help="Show a new sample every INTERVAL (1s when not given) until Ctrl-C or --count.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="Stop after this many samples  [default: 1 without --watch]",
)
@click.option(
    "--interval",
    callback=_seconds,
    metavar="INTERVAL",
    help="Time between a sample's two readings (500ms, 2s, or seconds: 0.5)  [default: the "
    "--watch interval, else 1s]",
)
@output_option(
    "A table with load bars, one JSON object per sample and line, or Prometheus text.",
    "text",
    "json",
    "prometheus",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    callback=dash_is_stdout,
    help="Write each sample to this file, replacing it atomically, instead of stdout.",
)
@access_options
def status_command(
    policy: str | None,
    name: str | None,
    interfaces: tuple[str, ...],
    patterns: tuple[str, ...],
    top: int | None,
    every: float | None,
    count: int | None,
    interval: float | None,
    fmt: str,
    output: str | None,
    access: Access,
) -> None:
    """Show the live traffic-control tree by POLICY's class names (with --name and no
    POLICY, of the policy applied under NAME; with -i and no POLICY, the kernel's tree by
    tc's ids): rate now and average against each class's rate
    and ceil, packets, bytes, drops, overlimits, backlog, htb's lending and tokens, and the
    flow statistics of sfq, fq_codel and cake leaves."""
    import shutil

    from tcdsl.ops import status as st
    from tcdsl.ops.counters import CountersError, NoSuchDevice

    checked: ir.Policy | None = None
    sources: dict[str, str] = {}
    devices = list(dict.fromkeys(interfaces))
    if policy is None and name is not None:
        # the policy live under that name, as applied (its file may be anywhere, or gone)
        from tcdsl.ops.lifecycle import compile_applied

        try:
            record = _store(name).live()
            if record is None:
                raise OpsError(f"no policy is applied under the name {name!r}")
            checked, sources, policy = compile_applied(record), dict(record.sources), record.path
        except OpsError as e:
            _fail(NO_STATE, str(e))
    elif policy is not None:
        from tcdsl.ops.lifecycle import (
            applied_policy,
            changed_since,
            live_as_another_name,
            live_pins,
            since_words,
        )

        if name is not None:
            _store(name)  # (a usable name)
        try:
            live = applied_policy(policy, name)
            if live is None and name is None and (other := live_as_another_name(policy)):
                # (found by a tester: the file live as 'shop' was shown with its own ids,
                # another class's counters under each name, and exit 0)
                live = applied_policy(policy, other)
                if live is not None:
                    click.echo(f"tcdsl: {policy} is live as '{other}'", err=True)
            pins = live_pins(policy, name) if live is None else {}
        except OpsError as e:
            _fail(NO_STATE, str(e))
        if live is not None:
            # what is live: the policy (and its tables) as applied, not as edited since
            applied, checked = live
            sources = dict(applied.sources)
            changed = changed_since(applied)
            if changed:
                click.echo(
                    f"tcdsl: showing {policy} as applied (generation {applied.generation}): "
                    f"{since_words(changed)} since (tcdsl plan {policy} shows how)",
                    err=True,
                )
        else:
            # the class ids 'tcdsl apply' gave the policy live under its name, if it is
            result = analyse(policy, access=access, pins=pins)
            checked = policy_or_exit(result, "shown")
            sources = result.sources
            if not pins:
                other_name_note(checked, policy_name(policy, name))
    elif not devices:
        raise click.UsageError("give a POLICY, --name NAME, or a device with -i IFACE")
    if checked is not None:
        names = {n for iface in checked.interfaces for n in (iface.name, iface.interface)}
        unknown = [name for name in devices if name not in names]
        if unknown:
            raise click.BadParameter(
                f"the policy has no tree on '{unknown[0]}'", param_hint="'--interface'"
            )
        devices = st.devices_of(checked, devices)
    seconds = interval or every or 1.0
    samples = count if count is not None else (None if every is not None else 1)
    tty = output is None and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if tty else st.WIDTH
    utf8 = tty and (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
    try:
        picks: st.Picks | None = None
        if checked is not None:
            try:
                named, picks = st.by_address(checked, patterns)
                patterns = tuple(named)
            except st.NoSuchClass as err:
                raise click.BadParameter(str(err), param_hint="'--class'") from None
        for n, readings in enumerate(st.watch(devices, seconds, samples)):
            report = st.build(checked, devices, *readings, source=policy)
            try:
                report = st.select(report, patterns, top, picks)
            except st.NoSuchClass as err:
                raise click.BadParameter(str(err), param_hint="'--class'") from None
            if fmt == "json":
                text = st.render_json(report)
            elif fmt == "prometheus":
                text = st.render_prometheus(report)
            else:
                text = st.render_text(report, width, utf8)
            if output is not None:
                _replace_file(output, text)
                continue
            if fmt == "text":
                if tty and every is not None:
                    click.clear()
                elif n:
                    click.echo()
            click.echo(_writable(text), nl=False)
    except NoSuchDevice as err:
        found = st.missing_device(checked, err)
        if found is not None:
            click.echo(render([found], sources), nl=False, err=True)
        else:
            click.echo(f"tcdsl: error: {err} [{st.MISSING_DEVICE}]", err=True)
        sys.exit(EXIT_POLICY)
    except CountersError as err:
        click.echo(f"tcdsl: cannot read the kernel's counters: {err}", err=True)
        sys.exit(EXIT_POLICY)
    except KeyboardInterrupt:
        sys.exit(EXIT_OK)


def _writable(text: str) -> str:
    """``text`` with what stdout's encoding cannot write as '?' (found by a tester: a
    subscriber's Circuit Name in 'Zürich' on a Latin-1 stdout ended in a traceback)."""
    encoding = sys.stdout.encoding or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, errors="replace").decode(encoding)
    except LookupError:
        pass
    return text


def other_name_note(policy: ir.Policy, name: str, explicit: bool = False) -> None:
    """Say so when this file is not live as ``name`` but another name shapes its devices,
    or (``explicit``: the user gave ``--name``) in any case: the class ids shown are then
    this file's own, maybe not the kernel's."""
    from tcdsl.ops.lifecycle import shaped_by_others

    devices = dict.fromkeys(i.interface for i in policy.interfaces)
    said = False
    for device, other in shaped_by_others(devices, name).items():
        click.echo(
            f"tcdsl: note: nothing is applied as '{name}', and {device} is shaped by the "
            f"policy applied as '{other}': the class ids here are this file's own, not "
            f"necessarily the kernel's (give --name {other})",
            err=True,
        )
        said = True
    if explicit and not said:
        try:
            live = Store(name).live() if valid_name(name) else None
        except (OpsError, OSError):
            live = None
        what = (
            f"the policy applied as '{name}' is {live.path}, not this file"
            if live is not None
            else f"nothing is applied as '{name}'"
        )
        click.echo(
            f"tcdsl: note: {what}: the class ids here are this file's own, not necessarily "
            "the kernel's",
            err=True,
        )


def register(group: click.Group) -> None:
    """Add the commands to the ``tcdsl`` group."""
    for command in (
        plan_command,
        apply_command,
        confirm_command,
        rollback_command,
        down_command,
        status_command,
        import_command,
    ):
        group.add_command(command)
