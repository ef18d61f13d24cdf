"""The command line: a thin click group over ``tcdsl.driver``."""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import io
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import click

from tcdsl import __version__, ir
from tcdsl.backend import BackendOptions
from tcdsl.backends import BACKENDS
from tcdsl.cliutil import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_POLICY,
    EXIT_USAGE,
    FORMAT,
    dash_is_stdout,
    state_name,
    unit_refusal,
)
from tcdsl.cliutil import access_options as _access_options
from tcdsl.cliutil import format_option as _format_option
from tcdsl.cliutil import output_option as _output_option
from tcdsl.cliutil import policy_or_exit as _policy_or_exit
from tcdsl.cliutil import summary as _summary
from tcdsl.cliutil import visible as _visible
from tcdsl.cliutil import write_text as _write_text
from tcdsl.cliutil import writing as _writing
from tcdsl.codes import RETIRED
from tcdsl.diagnostics import Diagnostic, Severity, Span, render, render_json
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.frontend.source import Access
from tcdsl.kernel_target import KernelTarget, load_target
from tcdsl.sarif import render_sarif
from tcdsl.suppress import disable_problem
from tcdsl.verify import APPLIERS, KERNELS, KernelChoice

if TYPE_CHECKING:  # the teaching tools, the verifier and the live operations load on use
    from tcdsl.allocate import Pins
    from tcdsl.ops.state import Applied
    from tcdsl.teach.report import Run
    from tcdsl.teach.traffic import Flow
    from tcdsl.verify import Verification


def _fails(diagnostics: Sequence[Diagnostic], werror: bool) -> bool:
    """Errors fail; warnings too with ``--werror``; infos never do."""
    return any(d.is_error or (werror and d.severity is Severity.WARNING) for d in diagnostics)


def _report(result: Result, fmt: str, info: bool = False) -> None:
    shown = _visible(result.diagnostics, info)
    if fmt == "json":
        click.echo(render_json(shown), nl=False, err=True)
    elif shown:
        click.echo(render(shown, result.sources), nl=False, err=True)


def _check_interface(
    policy: ir.Policy, interface: str | None, direction: str | None = None
) -> None:
    """A usage error (exit 2) when ``--interface`` (and ``--direction``) name no tree of
    ``policy``."""
    from tcdsl.teach.classify import UnknownInterface, select_tree

    if not policy.interfaces:
        return
    try:
        select_tree(policy, interface, direction)
    except UnknownInterface as err:
        raise click.BadParameter(str(err), param_hint=f"'{err.option}'") from None


def _disabled_codes(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> frozenset[str]:
    codes = {c.strip().upper() for value in values for c in value.split(",") if c.strip()}
    for code in sorted(codes):
        problem = disable_problem(code)
        if problem is not None and (problem.startswith("unknown") or code in RETIRED):
            raise click.BadParameter(f"{problem} (docs/diagnostics.md lists them)", ctx, param)
        if problem is not None:
            raise click.BadParameter(
                f"{code} is an error; errors cannot be disabled because tc would refuse or "
                "misbuild the policy",
                ctx,
                param,
            )
    return frozenset(codes)


def _kernel_target(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> KernelTarget | None:
    if value is None:
        return None
    try:
        return load_target(value)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx, param) from err


CHECK_FORMAT = _format_option("text", "json", "sarif")
WERROR = click.option(
    "--werror", is_flag=True, help="Treat warnings as errors (exit 1); infos never fail."
)
INFO = click.option(
    "--info", is_flag=True, help="Also show infos (I codes: advice that never fails a check)."
)
DISABLE = click.option(
    "--disable",
    multiple=True,
    metavar="CODE[,CODE...]",
    callback=_disabled_codes,
    help="Leave out these warnings and infos (repeatable); errors cannot be disabled.",
)
KERNEL = click.option(
    "--kernel",
    "kernel",
    metavar="VERSION|CONFIG",
    callback=_kernel_target,
    help="The kernel the policy is for: a version (6.1, 6.1.82) or a kernel .config file; "
    "qdiscs and classifiers it lacks are errors (E213).",
)


class _Group(click.Group):
    """The ``tcdsl`` group; the live operations' commands (``tcdsl.ops.cli``) join it the
    first time a command it does not have yet is asked for, or all are listed."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            _live_operations(self)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _live_operations(self)
        return super().list_commands(ctx)


@functools.cache
def _live_operations(group: click.Group) -> None:
    from tcdsl.ops.cli import register

    register(group)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Examples:\n\n\b\n  tcdsl compile office.tcp > apply.sh\n  tcdsl check policies/*.tcp\n"
    "  tcdsl verify office.tcp",
)
@click.version_option(__version__, "-V", "--version", prog_name="tcdsl")
def cli() -> None:
    """Compile traffic-control policies into tc commands, and check them."""


@cli.command(
    epilog="Examples:\n\n\b\n  tcdsl compile office.tcp > apply.sh\n"
    "  tcdsl compile -o apply.sh office.tcp && sh apply.sh   (as root)\n"
    "  tcdsl compile -o out/ office.tcp      (every file of the output, into out/)\n"
    "  tcdsl compile --per-command office.tcp   (one tc per line, to read)"
)
@click.argument("policy", type=click.Path(dir_okay=False))
@click.option(
    "-b",
    "--backend",
    type=click.Choice(sorted(BACKENDS)),
    default="shell",
    show_default=True,
    help="What to generate.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    callback=dash_is_stdout,
    help="Write to this file instead of stdout; a directory (or a path ending in '/') gets "
    "every file of the output.",
)
@click.option(
    "--marks",
    type=click.Choice(["iptables", "nft"]),
    default="iptables",
    show_default=True,
    help="How 'classify by mark' marks packets.",
)
@click.option(
    "--batch/--per-command",
    default=True,
    show_default=True,
    help="Shell: feed the tc commands to one 'tc -batch' process (fast), or run one tc per "
    "command (slow: for reading).",
)
@FORMAT
@WERROR
@INFO
@DISABLE
@KERNEL
@_access_options
def compile(
    policy: str,
    backend: str,
    output: str | None,
    marks: str,
    batch: bool,
    fmt: str,
    werror: bool,
    info: bool,
    disable: frozenset[str],
    kernel: KernelTarget | None,
    access: Access,
) -> None:
    """Compile POLICY ('-': standard input) and print the generated output."""
    options = BackendOptions(marks="nft" if marks == "nft" else "iptables", batch=batch)
    source, loader = _stdin_or(policy)
    result = compile_policy(
        source,
        backend,
        loader,
        options=options,
        stem="stdin" if loader else None,
        target=kernel,
        disabled=disable,
        access=access,
    )
    _report(result, fmt, info)
    if result.output is None or _fails(result.diagnostics, werror):
        if fmt == "text":
            shown = _visible(result.diagnostics, info)
            click.echo(f"tcdsl: {_summary(shown)}; nothing generated", err=True)
        sys.exit(EXIT_POLICY)
    if output is None:
        click.echo(result.output, nl=False)
        return
    target = Path(output)
    if output.endswith("/") or target.is_dir():
        files = {target / name: text for name, text in result.files.items()}
    elif len(result.files) > 1:
        names = ", ".join(result.files)
        click.echo(
            f"tcdsl: this output is {len(result.files)} files ({names}); "
            f"give a directory: -o {output}/",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    else:
        files = {target: result.output}
    with _writing(output):
        if len(files) > 1 or output.endswith("/"):
            # the directory named (-o out/), not the folders above it
            target.mkdir(exist_ok=True)
        for path, text in files.items():
            # (found by a tester: '-o /nonexist/x.sh' made /nonexist)
            _write_text(path, text)


STDIN = "<stdin>"
"""What a policy read from standard input ('-') is called in diagnostics."""


def _stdin_or(path: str) -> tuple[str, Callable[[str], str] | None]:
    """``path`` and no loader; for ``-``, :data:`STDIN` and a loader that gives standard
    input's text for it (read once, when the reader asks) and reads includes from the disk
    (found by a tester: 'check -' looked for a file named '-', while fmt read stdin)."""
    if path != "-":
        return path, None
    from tcdsl.frontend.source import read_policy, read_stream

    @functools.cache
    def text() -> str:
        return read_stream(sys.stdin.buffer)

    return STDIN, lambda name: text() if name == STDIN else read_policy(name)


def policy_files(paths: Sequence[str]) -> list[tuple[str, str | None]]:
    """The policy files named by PATH arguments, each with the directory it was found in: a
    directory stands for every ``*.tcp`` below it (sorted, hidden directories and files
    skipped); other paths are taken as given (with their own directory, which a symlink may
    not leave; None for ``-``, standard input).

    A directory without policies is a usage error (a mistyped path, most likely).
    """
    files: list[tuple[str, str | None]] = []
    for path in paths:
        if not os.path.isdir(path):
            files.append((path, None if path == "-" else os.path.dirname(path) or "."))
            continue
        found: list[str] = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [
                os.path.normpath(os.path.join(root, name))
                for name in names
                if name.endswith(".tcp") and not name.startswith(".")
            ]
        if not found:
            raise click.UsageError(f"no .tcp files under the directory '{path}'")
        files += [(f, path) for f in sorted(found, key=lambda f: Path(f).parts)]
    return files


def _once(files: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """``files`` without a file named again another way (``x.tcp ./x.tcp``, or found again
    in a directory named too; found by a tester: each of its findings was reported twice)."""
    seen: set[str] = set()
    out = []
    for path, tree in files:
        key = path if path == "-" else os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            out.append((path, tree))
    return out


def _outside(path: str, tree: str | None, access: Access) -> Result | None:
    """A file found below ``tree`` that leads outside it (a symlink): an E023 result."""
    if tree is None or access.allows(path, tree):
        return None
    message = f"not reading {Access.refusal(path, tree)}"
    return Result(None, None, [Diagnostic.error("E023", message, Span(path, 1, 1, 1, 1))])


@cli.command(
    epilog="Examples:\n\n\b\n  tcdsl check office.tcp\n  tcdsl check --werror policies/*.tcp\n"
    "  tcdsl check policies/      (every .tcp file below policies/)\n"
    "  tcdsl check --format sarif -o tcdsl.sarif policies/\n"
    "  tcdsl check --kernel 6.1 --disable W306 old.tcp\n\n"
    "Exit 0 when no policy has errors (warnings allowed unless --werror), 1 otherwise, 2 on "
    "usage errors. --kernel here names the target kernel; verify's --kernel picks where to run.",
)
@click.argument("policies", nargs=-1, required=True, type=click.Path())
@CHECK_FORMAT
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    callback=dash_is_stdout,
    help="Write the diagnostics (in the chosen format) to this file instead.",
)
@WERROR
@INFO
@DISABLE
@KERNEL
@_access_options
def check(
    policies: tuple[str, ...],
    fmt: str,
    output: str | None,
    werror: bool,
    info: bool,
    disable: frozenset[str],
    kernel: KernelTarget | None,
    access: Access,
) -> None:
    """Check POLICIES (files, directories of *.tcp files, or '-' for standard input) and
    print diagnostics; exit 1 if any has errors."""
    failed = False
    every: list[Diagnostic] = []
    text: list[str] = []
    seen: set[tuple[str, str, Span]] = set()
    for given, tree in _once(policy_files(policies)):
        path, loader = _stdin_or(given)
        result = _outside(path, tree, access) or analyse(
            path,
            loader,
            target=kernel,
            disabled=disable,
            access=access if tree is None else Access((*access.roots, tree), access.anywhere),
        )
        failed |= _fails(result.diagnostics, werror)
        shown = result.diagnostics if fmt == "sarif" else _visible(result.diagnostics, info)
        # A file that several checked policies include is reported once, not once for each.
        shown = [d for d in shown if (d.code, d.message, d.span) not in seen]
        seen.update((d.code, d.message, d.span) for d in shown)
        every += shown
        if fmt == "text" and shown:
            text.append(render(shown, result.sources))
    if fmt == "json":
        text = [render_json(every)]
    elif fmt == "sarif":
        text = [render_sarif(every)]
    elif every:
        text.append(f"tcdsl: {_summary(every)}\n")
    if output is not None:
        try:
            Path(output).write_text("".join(text), encoding="utf-8")
        except OSError as err:
            raise click.UsageError(f"cannot write '{output}': {err.strerror or err}") from err
    else:
        for part in text:
            click.echo(part, nl=False, err=fmt != "sarif")
    sys.exit(EXIT_POLICY if failed else EXIT_OK)


def verify_many(
    policies: list[str], backend: str, kernel: KernelChoice, access: Access | None = None
) -> list[Verification]:
    """:func:`tcdsl.verify.verify_many`, loaded on use."""
    from tcdsl.verify import verify_many as run

    return run(policies, backend, kernel, access=access)


def _verdict(v: Verification) -> str:
    if v.kernel is None:
        return f"tcdsl: {v.path}: not verified ({_summary(v.diagnostics) or 'no kernel'})"
    if v.ok:
        extra = f"; {_summary(v.diagnostics)}" if v.diagnostics else ""
        return f"tcdsl: {v.path}: the kernel agrees ({v.kernel}: {v.checked}){extra}"
    return f"tcdsl: {v.path}: {_summary(v.diagnostics)} ({v.kernel})"


@cli.command(
    "verify",
    epilog="Examples:\n\n\b\n  tcdsl verify office.tcp\n"
    "  tcdsl verify --kernel uml policies/seeds/*.tcp\n"
    "  tcdsl verify --kernel host --diagnostics json office.tcp\n\n"
    "Kernels: 'host' is this machine's (needs root); 'uml' a Debian 6.1 kernel run as a "
    "user-mode Linux process (no root needed); 'auto' the host when it has every qdisc and "
    "classifier the policy needs, else uml. Exit 0 only when kernel and policy agree.",
)
@click.argument("policies", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "-b",
    "--backend",
    type=click.Choice(sorted(APPLIERS)),
    default="shell",
    show_default=True,
    help="Whose output to apply.",
)
@click.option(
    "--kernel",
    type=click.Choice(KERNELS),
    default="auto",
    show_default=True,
    help="Which kernel to apply the policy to.",
)
@FORMAT
@_access_options
def verify_command(
    policies: tuple[str, ...], backend: str, kernel: str, fmt: str, access: Access
) -> None:
    """Apply POLICIES to a real kernel in a throwaway network namespace, read the state back
    and report every difference at the policy line it comes from."""
    from tcdsl.verify import VerifyError

    try:
        results = verify_many(list(policies), backend, cast(KernelChoice, kernel), access=access)
    except VerifyError as e:
        click.echo(f"tcdsl: cannot verify: {e}", err=True)
        sys.exit(EXIT_POLICY)
    except KeyboardInterrupt:
        click.echo("tcdsl: interrupted; the namespaces it made are removed", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if fmt == "json":
        click.echo(render_json(d for v in results for d in v.diagnostics), nl=False, err=True)
    else:
        for v in results:
            if v.diagnostics:
                click.echo(render(v.diagnostics, v.sources), nl=False, err=True)
            click.echo(_verdict(v), err=True)
    sys.exit(EXIT_OK if all(v.ok for v in results) else EXIT_POLICY)


@cli.command(
    epilog="Examples:\n\n\b\n  tcdsl fmt office.tcp\n  tcdsl fmt --check policies/\n"
    "  tcdsl fmt --diff office.tcp\n  tcdsl fmt < office.tcp\n\n"
    "Exit 0 when every file was formatted (or, with --check or --diff, already was), 1 when a "
    "file would change or does not parse, 2 on usage errors.",
)
@click.argument("files", nargs=-1, type=click.Path(exists=True, allow_dash=True))
@click.option("--check", is_flag=True, help="Write nothing; list the files that would change.")
@click.option("--diff", "show_diff", is_flag=True, help="Write nothing; print a unified diff.")
def fmt(files: tuple[str, ...], check: bool, show_diff: bool) -> None:
    """Rewrite FILES (or the *.tcp under directories) in the canonical layout, in place.

    Comments are kept; nothing is reordered. With no FILES, or '-', read standard input and
    print the formatted text on standard output.
    """
    import difflib

    from tcdsl.fmt import FormatError, format_source
    from tcdsl.frontend.source import (
        SourceError,
        normalise_newlines,
        read_policy,
        read_stream,
        source_diagnostic,
    )

    failed = changed = False
    said: list[Diagnostic] = []  # for the summary line, as check and compile print one
    for path, tree in policy_files(files or ("-",)):
        stdin = path == "-"
        name = "<stdin>" if stdin else path
        refused = _outside(path, tree, Access())
        if refused is not None:
            click.echo(render(refused.diagnostics, {}), nl=False, err=True)
            said += refused.diagnostics
            failed = True
            continue
        try:
            text = read_stream(sys.stdin.buffer) if stdin else read_policy(path)
            formatted = format_source(text, name)
        except SourceError as err:
            click.echo(render([source_diagnostic(err, name)], {}), nl=False, err=True)
            said.append(source_diagnostic(err, name))
            failed = True
            continue
        except OSError as err:
            click.echo(f"tcdsl: cannot read '{path}': {err.strerror or err}", err=True)
            failed = True
            continue
        except FormatError as err:
            sources = {err.diagnostic.span.file: normalise_newlines(text)}
            click.echo(render(err.diagnostics, sources), nl=False, err=True)
            said += err.diagnostics
            failed = True
            continue
        if stdin and not (check or show_diff):
            click.echo(formatted, nl=False)
            continue
        if formatted == text:
            continue
        changed = True
        if show_diff:
            lines = difflib.unified_diff(
                text.splitlines(keepends=True),
                formatted.splitlines(keepends=True),
                name,
                f"{name} (formatted)",
            )
            click.echo("".join(lines), nl=False)
        if check:
            click.echo(f"would reformat {path}", err=True)
        elif not show_diff:
            try:
                Path(path).write_bytes(formatted.encode("utf-8"))
            except OSError as err:
                click.echo(f"tcdsl: cannot write '{path}': {err.strerror or err}", err=True)
                failed = True
                continue
            click.echo(f"reformatted {path}", err=True)
    if said:
        click.echo(f"tcdsl: {_summary(said)}", err=True)
    sys.exit(EXIT_POLICY if failed or (changed and (check or show_diff)) else EXIT_OK)


def _packet_specs(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[object]:
    from tcdsl.teach.traffic import SpecError, parse_packet

    packets: list[object] = []
    for value in values:
        try:
            packets.append(parse_packet(value))
        except SpecError as err:
            raise click.BadParameter(f"{value!r}: {err}", ctx, param) from None
    return packets


# Options classify, simulate and measure share.
DIRECTION = click.option(
    "--direction",
    type=click.Choice(["upload", "download", "ingress"]),
    help="Which of the interface's trees: upload (what it sends), download (what it receives, "
    "shaped on its ifb) or ingress (its policers). Default: upload, else its only tree.",
)


def _applied_here(policy: str, name: str | None = None) -> tuple[Applied | None, Pins]:
    """The record of ``policy`` if it is the file live under its name (or ``name``), and the
    class ids of the policy live under that name, which apply keeps whichever file it
    applies there (None and {} when there is none, or the record cannot be read). (Found by
    a tester: an edited copy was answered with a fresh compile's ids.)"""
    from tcdsl.ops.lifecycle import OpsError, applied_from, live_pins, stored_pins

    try:
        applied = applied_from(policy, name)
        return applied, stored_pins(applied) if applied is not None else live_pins(policy, name)
    except (OSError, ValueError, KeyError, AssertionError, OpsError):  # a damaged record
        return None, {}


def _changed_note(policy: str, applied: Applied) -> str | None:
    """A note when ``policy``, live as ``applied``, (or a table it reads) changed since it
    was applied: an answer is then not what the kernel does."""
    from tcdsl.ops.lifecycle import OpsError, changed_since, since_words

    try:
        changed = changed_since(applied)
    except (OSError, ValueError, KeyError, AssertionError, OpsError):
        return None
    if not changed:
        return None
    return (
        f"tcdsl: note: {since_words(changed)} since {policy} was applied (generation "
        f"{applied.generation}): this is what the files say now, not what the kernel does "
        f"(tcdsl plan {policy} shows the difference)"
    )


@cli.command(
    "classify",
    epilog="Examples:\n\n\b\n"
    '  tcdsl classify office.tcp --packet "tcp src 10.3.34.11 dport 5001 tos 0x10"\n'
    '  tcdsl classify office.tcp --packet icmp --packet "udp dport 53" --format json\n'
    '  tcdsl classify router.tcp --interface eth1 --packet "tcp dport 443"\n'
    '  tcdsl classify office.tcp --packet "ipv6 tcp src 2001:db8::1 dport 443"\n'
    '  tcdsl classify office.tcp --packet "ipv6 hbh udp dport 5001"\n\n'
    "Packet words: a family (ipv4, ipv6; an address implies its own; default ipv4), a protocol "
    "(tcp, udp, icmp, icmpv6, proto N), src A, dst A, sport N, dport N, tos V (IPv6: the "
    "traffic class), dscp X, size B, iplen B, ack, flags F,...; IPv6 extension headers in "
    "order, before the protocol's: hbh (hop-by-hop), rthdr (routing), dstopt (destination "
    "options), auth (AH), frag (a first fragment), laterfrag (a later fragment; frag and "
    "laterfrag on IPv4 too). Exit 0, 1 when the policy has errors, 2 on usage errors.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@click.option(
    "--packet",
    "packets",
    multiple=True,
    required=True,
    metavar="SPEC",
    callback=_packet_specs,
    help="A packet, in words (repeatable).",
)
@click.option(
    "--interface",
    metavar="NAME",
    help="The interface it leaves by, or arrives on (default: the first).",
)
@DIRECTION
@_output_option("How to print the verdicts.", "text", "json")
@click.option(
    "--name",
    callback=lambda _ctx, _param, value: None if value is None else state_name(value),
    help="The name the policy was applied under, whose class ids (and queues, for a spread "
    "mq tree) to answer with (default: the policy file's name without .tcp).",
)
@_access_options
def classify_command(
    policy: str,
    packets: list[object],
    interface: str | None,
    direction: str | None,
    fmt: str,
    name: str | None,
    access: Access,
) -> None:
    """Say which class each packet ends in on POLICY, and why: the filters, default or
    priomap that decide, in the kernel's order, with their policy lines. No kernel needed."""
    import json

    from tcdsl.teach.classify import UnknownInterface, classify, render_text, to_json
    from tcdsl.teach.traffic import Packet

    # a class added before others has the free id apply chose, not the one compiling the
    # policy alone would give it
    source, loader = _stdin_or(policy)
    applied, pins = _applied_here(policy, name) if loader is None else (None, {})
    checked = _policy_or_exit(analyse(source, loader, pins=pins, access=access), "classified")
    if applied is None:
        from tcdsl.ops.cli import other_name_note

        other_name_note(checked, name or Path(policy).stem, explicit=name is not None)
    note = _changed_note(policy, applied) if applied is not None else None
    if note is not None:
        click.echo(note, err=True)
    if not checked.interfaces:  # as simulate says it (its --interface was not wrong)
        click.echo("tcdsl: the policy has no interface: no packet reaches a tree", err=True)
        sys.exit(EXIT_POLICY)
    verdicts = []
    for packet in packets:
        assert isinstance(packet, Packet)
        try:
            verdicts.append((classify(checked, packet, interface, direction), packet))
        except UnknownInterface as err:
            raise click.BadParameter(str(err), param_hint=f"'{err.option}'") from None
    if fmt == "json":
        click.echo(json.dumps([to_json(v, p) for v, p in verdicts], indent=2))
    else:
        click.echo("".join(render_text(v, p) for v, p in verdicts), nl=False)


@cli.command(
    "explain",
    epilog="Examples:\n\n\b\n  tcdsl explain office.tcp\n"
    "  tcdsl explain --format markdown -o office.md office.tcp\n\n"
    "Exit 0, 1 when the policy has errors (printed as 'tcdsl check' prints them), 2 on usage "
    "errors.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@_output_option(
    "Plain text (wrapped at 100 columns) or Markdown (for handouts).",
    "text",
    "markdown",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    callback=dash_is_stdout,
    help="Write to this file instead of stdout ('-': stdout).",
)
@_access_options
def explain_command(policy: str, fmt: str, output: str | None, access: Access) -> None:
    """Explain POLICY in plain English, class by class: guarantees, borrowing, priorities,
    which traffic reaches each class, its queue, and what happens to unmatched traffic."""
    from tcdsl.teach.explain import explain

    result = analyse(*_stdin_or(policy), access=access)
    shown = _visible(result.diagnostics, False)
    if shown:
        click.echo(render(shown, result.sources), nl=False, err=True)
    if result.policy is None:
        click.echo(f"tcdsl: {_summary(shown)}; nothing explained", err=True)
        sys.exit(EXIT_POLICY)
    text = explain(result.policy, "markdown" if fmt == "markdown" else "text")
    if output is None:
        click.echo(text, nl=False)
        return
    with _writing(output):
        Path(output).write_text(text, encoding="utf-8")


def _flow_specs(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[object]:
    from tcdsl.teach.traffic import SpecError, bytes_rate, flows_problem, parse_flow

    flows = []
    for i, value in enumerate(values):
        try:
            flows.append(parse_flow(value, i))
        except SpecError as err:
            raise click.BadParameter(f"{value!r}: {err}", ctx, param) from None
        said = bytes_rate(value)  # found by a tester: silently 8 times the rate meant
        if said is not None:
            click.echo(f"tcdsl: warning: {said}", err=True)
    problem = flows_problem(flows)  # two of one name: a usage error too (found by a tester)
    if problem is not None:
        raise click.BadParameter(problem, ctx, param)
    return list(flows)


def _unit_option(kind: str) -> Callable[..., int | None]:
    """A click callback reading a time (microseconds) or a rate (bits/s) as tc does."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
        from tcdsl.units import parse_rate, parse_time

        if value is None:
            return None
        try:
            number = (parse_time if kind == "time" else parse_rate)(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} {unit_refusal(value)}", ctx, param) from None
        if number <= 0:
            raise click.BadParameter(f"{value!r} must be above 0", ctx, param)
        if kind == "rate":
            from tcdsl.teach.traffic import MAX_RATE
            from tcdsl.units import format_rate

            if number > MAX_RATE:
                raise click.BadParameter(f"must be at most {format_rate(MAX_RATE)}", ctx, param)
        return number

    return convert


def _simulate(
    policy: ir.Policy,
    flows: list[Flow],
    duration: int,
    interval: int | None,
    link: int | None,
    interface: str | None,
    direction: str | None = None,
) -> Run:
    """``simulate``, with a run too large to model as a usage error (exit 2) on the option to
    change; other ``SimulationError``s are for the caller."""
    from tcdsl.teach.simulate import RunTooLarge, simulate

    try:
        return simulate(policy, flows, duration, interval, link, interface, direction)
    except RunTooLarge as err:
        raise click.BadParameter(str(err), param_hint=f"'{err.option}'") from None


# Options simulate and measure share (the same flows, sampled the same way).
FLOWS = click.option(
    "--flow",
    "flows",
    multiple=True,
    required=True,
    callback=_flow_specs,
    metavar="SPEC",
    help="A flow (repeatable): packet words, then rate, start and stop.",
)
INTERVAL = click.option(
    "--interval",
    callback=_unit_option("time"),
    help="Sampling interval  [default: 1s, or a thirtieth of a shorter run]",
)


@cli.command(
    "simulate",
    epilog="Examples:\n\n\b\n"
    "  tcdsl simulate lab.tcp --flow 'h1: udp src 10.0.0.1' --flow 'h2: udp src 10.0.0.2'\n"
    "  tcdsl simulate lab.tcp --flow 'v: udp dport 5004 rate 2mbit start 5s stop 20s' "
    "--plot out.png\n\n"
    "Flow words: [NAME:] a packet (tcp, udp, src A, dst A, sport N, dport N, tos V, dscp X, "
    "size B) then rate R (none: greedy), start T, stop T. docs/simulate.md describes the "
    "model. Exit 0, 1 when the policy has errors or cannot be simulated, 2 on usage errors.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@FLOWS
@click.option(
    "--duration",
    default="30s",
    show_default=True,
    callback=_unit_option("time"),
    help="How long to simulate.",
)
@INTERVAL
@click.option(
    "--link",
    callback=_unit_option("rate"),
    help="The link rate  [default: the htb link class's ceil, a tbf's rate, else 1gbit]",
)
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG plot here.")
@_output_option("The table as text, or the whole run as JSON.", "text", "json")
@click.option("--interface", help="The interface to simulate  [default: the policy's first]")
@DIRECTION
@_access_options
def simulate_command(
    policy: str,
    flows: list[object],
    duration: int,
    interval: int | None,
    link: int | None,
    plot: str | None,
    fmt: str,
    interface: str | None,
    direction: str | None,
    access: Access,
) -> None:
    """Simulate FLOWS through POLICY's qdiscs (a model of the kernel's htb, hfsc, prio, tbf, sfq
    and fifos) and print per-class and per-flow throughput and queueing delay."""
    import json

    from tcdsl.teach import report
    from tcdsl.teach.simulate import SimulationError
    from tcdsl.teach.traffic import Flow

    checked = _policy_or_exit(analyse(*_stdin_or(policy), access=access), "simulated")
    _check_interface(checked, interface, direction)
    specs = [f for f in flows if isinstance(f, Flow)]
    try:
        run = _simulate(checked, specs, duration, interval, link, interface, direction)
    except SimulationError as err:
        click.echo(f"tcdsl: {err}", err=True)
        sys.exit(EXIT_POLICY)
    if plot is not None:
        with _writing(plot):
            report.plot(run, plot)
    if fmt == "json":
        click.echo(json.dumps(run.to_json(), indent=2))
    else:
        click.echo(report.table(run), nl=False)


@cli.command(
    "measure",
    epilog="Examples:\n\n\b\n"
    "  tcdsl measure lab.tcp --flow 'h1: tcp src 10.0.0.1' --flow 'h2: tcp src 10.0.0.2 "
    "start 2s' --duration 6s\n"
    "  tcdsl measure lab.tcp --flow 'v: udp dport 5004 rate 2mbit' --simulate --plot out.png\n\n"
    "Runs on this host's kernel only (root; network namespaces sender -> router -> receiver, "
    "the policy on the router's egress). docs/measure.md describes the setup. Exit 0, 1 when "
    "the policy has errors or cannot be measured here, 2 on usage errors, 130 on Ctrl-C.",
)
@click.argument("policy", type=click.Path(dir_okay=False))
@FLOWS
@click.option(
    "--duration",
    default="10s",
    show_default=True,
    callback=_unit_option("time"),
    help="How long to measure.",
)
@INTERVAL
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG plot here.")
@click.option(
    "--simulate",
    "also_simulate",
    is_flag=True,
    help="Also simulate the same flows; show both side by side (plot: simulated dashed).",
)
@_output_option("The table as text, or the whole run (and the simulation) as JSON.", "text", "json")
@click.option("--interface", help="The interface to measure  [default: the policy's first]")
@DIRECTION
@_access_options
def measure_command(
    policy: str,
    flows: list[object],
    duration: int,
    interval: int | None,
    plot: str | None,
    also_simulate: bool,
    fmt: str,
    interface: str | None,
    direction: str | None,
    access: Access,
) -> None:
    """Send FLOWS through POLICY applied on this host's kernel (sender, router and receiver
    namespaces) and print per-class and per-flow throughput from the kernel's counters."""
    import json

    from tcdsl.teach import report
    from tcdsl.teach.measure import MeasureError, compare_table, measure, plot_both
    from tcdsl.teach.simulate import SimulationError
    from tcdsl.teach.traffic import Flow

    result = compile_policy(policy, access=access)
    checked = _policy_or_exit(result, "measured")
    assert result.output is not None  # the shell backend writes every policy that checks
    _check_interface(checked, interface, direction)
    specs = [f for f in flows if isinstance(f, Flow)]
    simulated = None
    try:
        if also_simulate:
            simulated = _simulate(checked, specs, duration, interval, None, interface, direction)
        run = measure(
            checked, result.output, specs, duration, interval, interface, direction=direction
        )
    except (MeasureError, SimulationError) as err:
        click.echo(f"tcdsl: {err}", err=True)
        sys.exit(EXIT_POLICY)
    except KeyboardInterrupt:
        click.echo("tcdsl: interrupted; the namespaces are removed", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if plot is not None:
        with _writing(plot):
            if simulated is None:
                report.plot(run, plot)
            else:
                plot_both(run, simulated, plot)
    if fmt == "json":
        data = run.to_json()
        if simulated is not None:
            data = {"measured": data, "simulated": simulated.to_json()}
        click.echo(json.dumps(data, indent=2))
    elif simulated is None:
        click.echo(report.table(run), nl=False)
    else:
        click.echo(compare_table(run, simulated), nl=False)


def main() -> None:
    """Run the CLI; an unexpected exception is an internal error (exit 3, with a traceback)."""
    if sys.stdout is None:  # started with its stdout closed ('>&-'): Python gives no stream
        sys.stdout = _ClosedOutput()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):
            click.echo("tcdsl: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        click.echo("Aborted!", err=True)
        sys.exit(EXIT_POLICY)
    except SystemExit:
        raise
    except OSError as e:
        if not _writing_output(e):
            _internal_error()
        # (found by a tester: '> /dev/full' gave a traceback and exit 3)
        if e.errno != errno.EPIPE:  # a reader that went away (| head) wants no message
            with contextlib.suppress(OSError):  # (stderr itself may be what failed)
                click.echo(f"tcdsl: cannot write the output: {e.strerror or e}", err=True)
        _quiet_streams()
        sys.exit(EXIT_POLICY)
    except BaseException:
        _internal_error()


class _ClosedOutput(io.TextIOBase):
    """stdout for a process started without one: writing to it fails as writing to a closed
    descriptor does, so that what would go there is not lost without a word (found by a
    tester: 'compile > &-' exited 0 having written nothing)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _writing_output(error: OSError) -> bool:
    """Whether ``error`` came from writing stdout or stderr (all tcdsl writes there goes
    through ``click.echo``): a full disk, a closed pipe, not a bug."""
    return any(
        frame.f_code.co_name == "echo" and frame.f_globals.get("__name__") == "click.utils"
        for frame, _ in traceback.walk_tb(error.__traceback__)
    )


def _quiet_streams() -> None:
    """stdout and stderr pointed at /dev/null: what is left in their buffers, which cannot be
    written, is not tried again (and failed again) at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(null, stream.fileno())
    os.close(null)


def _internal_error() -> NoReturn:
    traceback.print_exc()
    click.echo(
        "tcdsl: internal error (a bug in tcdsl, not in your policy); "
        "please report it with the traceback above",
        err=True,
    )
    sys.exit(EXIT_INTERNAL)


def entry() -> None:
    """The console script: :func:`main`, then leave without freeing what the run built.

    Freeing a 10,000-class policy object by object, and the modules at interpreter shutdown,
    takes a quarter of a second that nobody waits for: once the exit handlers have run and
    stdout and stderr are flushed, the process ends with ``os._exit`` and ``main``'s exit code.
    Anything unusual (a non-numeric exit, a thread still running, a failing flush) takes
    Python's own way out instead.
    """
    try:
        main()
        code: str | int | None = None
    except SystemExit as exit_:
        code = exit_.code
    if isinstance(code, str) or threading.active_count() > 1:
        sys.exit(code)
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        sys.exit(code)
    os._exit(code or 0)
