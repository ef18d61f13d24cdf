"""The live operations' commands (``plan``, ``apply``, ``confirm``, ``rollback``, ``down``),
added to the ``tcdsl`` command group by :func:`register`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from tcdsl.diagnostics import Diagnostic, Span, render
from tcdsl.driver import Result
from tcdsl.ops.apply import ApplyFailed
from tcdsl.ops.lifecycle import (
    OpsError,
    Prepared,
    Unsupported,
    apply,
    compile_new,
    confirm,
    down,
    down_interface,
    policy_name,
    prepare,
    rollback,
)
from tcdsl.ops.plan import Plan
from tcdsl.ops.state import Store, valid_name
from tcdsl.units import parse_seconds

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHANGES = 0, 1, 2, 4
FAILED = "E601"
NO_DEVICE = "E602"
NO_STATE = "E603"
UNSUPPORTED = "E604"


def parse_duration(text: str) -> float:
    """Seconds from ``60s``, ``2m``, ``500ms``, ``1h`` or a bare number of seconds."""
    try:
        return parse_seconds(text.strip())
    except ValueError:
        raise click.BadParameter(f"not a duration: {text!r} (say 60s, 2m, 500ms)") from None


def _store(name: str) -> Store:
    if not valid_name(name):
        raise click.BadParameter(
            f"{name!r}: letters, digits, '_', '.', '-' only", param_hint="--name"
        )
    return Store(name)


def _compiled(path: str, store: Store) -> Result:
    try:
        result = compile_new(store, path)
    except OpsError as e:
        _fail(NO_STATE, str(e))
    shown = [d for d in result.diagnostics if d.is_error]
    if result.policy is None or shown:
        click.echo(render(shown, result.sources), nl=False, err=True)
        click.echo("tcdsl: the policy has errors; nothing was changed", err=True)
        sys.exit(EXIT_FAILED)
    return result


def _fail(
    code: str, message: str, span: Span | None = None, sources: dict[str, str] | None = None
) -> NoReturn:
    where = span or Span("tcdsl", 1, 1, 1, 1)
    diagnostic = Diagnostic.error(code, message, where)
    if span is None:
        click.echo(f"tcdsl: error[{code}]: {message}", err=True)
    else:
        click.echo(render([diagnostic], sources or {}), nl=False, err=True)
    sys.exit(EXIT_FAILED)


def _failed(e: ApplyFailed, sources: dict[str, str]) -> NoReturn:
    f = e.failure
    then = (
        "the previous state was restored"
        if e.restored
        else "restoring the previous state failed too"
    )
    name = f.origin.what if f.origin is not None else "the change"
    span = f.origin.span if f.origin is not None else None
    _fail(FAILED, f"{f.command!r} failed for {name}: {f.message}; {then}", span, sources)


def _prepared(policy: str, name: str | None) -> Prepared:
    """POLICY compiled (with the live class ids) and planned against the policy live under
    its name; exits with the diagnostic on errors."""
    store = _store(policy_name(policy, name))
    result = _compiled(policy, store)
    try:
        return prepare(store, result.policy, result)
    except OpsError as e:
        _fail(NO_STATE, str(e))


def _print(plan: Plan) -> None:
    click.echo(plan.render(), nl=False)


NAME = click.option(
    "--name",
    help="The name the state keeps the policy under (default: the policy file's name "
    "without .tcp).",
)


@click.command(
    "plan",
    epilog="Examples:\n\n\b\n  tcdsl plan office.tcp\n  tcdsl plan office.tcp || echo changed\n\n"
    "Exit 0: no changes; 4: changes (or drift) to apply; 1: errors.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@NAME
def plan_command(policy: str, name: str | None) -> None:
    """Show what applying POLICY would change in the kernel, by the policy's names and lines,
    and what was changed by hand since the last apply (drift)."""
    prepared = _prepared(policy, name)
    _print(prepared.plan)
    sys.exit(EXIT_CHANGES if not prepared.plan.empty or prepared.plan.drift else EXIT_OK)


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
def apply_command(policy: str, name: str | None, yes: bool, within: str | None) -> None:
    """Make the kernel equal to POLICY with the smallest safe change."""
    seconds = parse_duration(within) if within is not None else None
    prepared = _prepared(policy, name)
    store, result = prepared.store, prepared.result
    assert result is not None
    _print(prepared.plan)
    if prepared.plan.empty and not prepared.plan.drift and seconds is None:
        return
    if not yes:
        if not sys.stdin.isatty():
            click.echo("tcdsl: not applied: give --yes to apply without a terminal", err=True)
            sys.exit(EXIT_USAGE)
        if not click.confirm("Apply these changes?", default=False):
            click.echo("tcdsl: nothing was changed", err=True)
            sys.exit(EXIT_FAILED)
    try:
        applied = apply(prepared, policy, result.sources, seconds)
    except ApplyFailed as e:
        _failed(e, result.sources)
    except Unsupported as e:
        first = e.lacking[0]
        _fail(UNSUPPORTED, str(e), first.span, result.sources)
    except OpsError as e:
        _fail(NO_DEVICE, str(e))
    note = f"; rolled back in {within} unless 'tcdsl confirm {store.name}'" if within else ""
    click.echo(f"applied {policy} as {store.name} (generation {applied.generation}){note}")


@click.command("confirm", epilog="Example:\n\n\b\n  tcdsl confirm office")
@click.argument("name")
def confirm_command(name: str) -> None:
    """Keep the policy applied with --confirm under NAME (stop its rollback timer)."""
    try:
        pending = confirm(_store(name))
    except OpsError as e:
        _fail(NO_STATE, str(e))
    click.echo(f"confirmed {name} (generation {pending.generation})")


@click.command("rollback", epilog="Example:\n\n\b\n  tcdsl rollback office")
@click.argument("name")
def rollback_command(name: str) -> None:
    """Go back to the policy applied under NAME before the live one (or remove it, if there
    was none)."""
    try:
        back = rollback(_store(name))
    except OpsError as e:
        _fail(NO_STATE, str(e))
    except ApplyFailed as e:
        _failed(e, {})
    if back is None:
        click.echo(f"rolled back {name}: removed (nothing was applied before)")
    else:
        click.echo(f"rolled back {name} to generation {back.generation} ({back.path})")


@click.command(
    "down",
    epilog="Examples:\n\n\b\n  tcdsl down office\n"
    "  tcdsl down -i eth0      (whatever policy shaped eth0)",
)
@click.argument("name", required=False)
@click.option("-i", "--interface", help="Remove what tcdsl made on this device instead.")
def down_command(name: str | None, interface: str | None) -> None:
    """Remove everything the policy applied under NAME owns (qdiscs of both directions,
    IFBs' trees, shared policers, marking chains) and its state; or with -i, what tcdsl
    makes on that device (root and ingress qdiscs, its IFB, chain TCDSL-IFACE, nft table
    tcdsl_IFACE) whatever policy made it."""
    if (name is None) == (interface is None):
        raise click.UsageError("give a policy NAME or -i IFACE")
    if interface is not None:
        try:
            removed = down_interface(interface)
        except OpsError as e:
            _fail(NO_DEVICE, str(e))
        click.echo("\n".join(removed) if removed else f"nothing of tcdsl's on {interface}")
        return
    assert name is not None
    try:
        plan = down(_store(Path(name).stem if name.endswith(".tcp") else name))
    except OpsError as e:
        _fail(NO_STATE, str(e))
    except ApplyFailed as e:
        _failed(e, {})
    _print(plan)


def register(group: click.Group) -> None:
    """Add the commands to the ``tcdsl`` group."""
    for command in (plan_command, apply_command, confirm_command, rollback_command, down_command):
        group.add_command(command)
