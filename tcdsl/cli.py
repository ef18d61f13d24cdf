"""The command line: a thin click group over ``tcdsl.driver``."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import click

from tcdsl import __version__
from tcdsl.backend import BackendOptions
from tcdsl.backends import BACKENDS
from tcdsl.diagnostics import Diagnostic, render, render_json
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.verify import KERNELS, KernelChoice, Verification, VerifyError, verify_many
from tcdsl.verify.verifier import APPLIERS

EXIT_OK, EXIT_POLICY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


def _report(result: Result, fmt: str) -> None:
    if fmt == "json":
        click.echo(render_json(result.diagnostics), nl=False, err=True)
    elif result.diagnostics:
        click.echo(render(result.diagnostics, result.sources), nl=False, err=True)


def _summary(diagnostics: Sequence[Diagnostic]) -> str:
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    parts = []
    if errors:
        parts.append(f"{errors} error{'s' * (errors != 1)}")
    if warnings:
        parts.append(f"{warnings} warning{'s' * (warnings != 1)}")
    return ", ".join(parts)


FORMAT = click.option(
    "--diagnostics",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="How to print diagnostics on stderr.",
)
WERROR = click.option("--werror", is_flag=True, help="Treat warnings as errors (exit 1).")


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Examples:\n\n\b\n  tcdsl compile office.tcp > apply.sh\n  tcdsl check policies/*.tcp\n"
    "  sudo tcdsl verify office.tcp",
)
@click.version_option(__version__, "-V", "--version", prog_name="tcdsl")
def cli() -> None:
    """Compile traffic-control policies into tc commands, and check them."""


@cli.command(
    epilog="Examples:\n\n\b\n  tcdsl compile office.tcp > apply.sh\n"
    "  tcdsl compile -o apply.sh office.tcp && sudo sh apply.sh\n"
    "  tcdsl compile -o out/ office.tcp      (every file of the output, into out/)"
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
    "--batch", is_flag=True, help="Shell: feed the tc commands to one 'tc -batch' process."
)
@FORMAT
@WERROR
def compile(
    policy: str,
    backend: str,
    output: str | None,
    marks: str,
    batch: bool,
    fmt: str,
    werror: bool,
) -> None:
    """Compile POLICY and print the generated output."""
    options = BackendOptions(marks="nft" if marks == "nft" else "iptables", batch=batch)
    result = compile_policy(policy, backend, options=options)
    _report(result, fmt)
    if result.output is None or (werror and result.diagnostics):
        if fmt == "text":
            click.echo(f"tcdsl: {_summary(result.diagnostics)}; nothing generated", err=True)
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
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as err:
        click.echo(f"tcdsl: cannot write '{output}': {err.strerror or err}", err=True)
        sys.exit(EXIT_POLICY)


@cli.command(
    epilog="Examples:\n\n\b\n  tcdsl check office.tcp\n  tcdsl check --werror policies/*.tcp"
)
@click.argument("policies", nargs=-1, required=True, type=click.Path(dir_okay=False))
@FORMAT
@WERROR
def check(policies: tuple[str, ...], fmt: str, werror: bool) -> None:
    """Check POLICIES and print diagnostics; exit 1 if any has errors."""
    failed = False
    every: list[Diagnostic] = []
    for path in policies:
        result = analyse(path)
        every += result.diagnostics
        if fmt == "text":
            _report(result, fmt)
        failed |= bool(result.errors) or (werror and bool(result.diagnostics))
    if fmt == "json":
        click.echo(render_json(every), nl=False, err=True)
    elif every:
        click.echo(f"tcdsl: {_summary(every)}", err=True)
    sys.exit(EXIT_POLICY if failed else EXIT_OK)


def _verdict(v: Verification) -> str:
    if v.kernel is None:
        return f"tcdsl: {v.path}: not verified ({_summary(v.diagnostics) or 'no kernel'})"
    if v.ok:
        extra = f"; {_summary(v.diagnostics)}" if v.diagnostics else ""
        return f"tcdsl: {v.path}: the kernel agrees ({v.kernel}: {v.checked}){extra}"
    return f"tcdsl: {v.path}: {_summary(v.diagnostics)} ({v.kernel})"


@cli.command(
    "verify",
    epilog="Examples:\n\n\b\n  sudo tcdsl verify office.tcp\n"
    "  tcdsl verify --kernel uml policies/seeds/*.tcp\n"
    "  sudo tcdsl verify --kernel host --diagnostics json office.tcp\n\n"
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
def verify_command(policies: tuple[str, ...], backend: str, kernel: str, fmt: str) -> None:
    """Apply POLICIES to a real kernel in a throwaway network namespace, read the state back
    and report every difference at the policy line it comes from."""
    try:
        results = verify_many(list(policies), backend, cast(KernelChoice, kernel))
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


def main() -> None:
    """Run the CLI; an unexpected exception is an internal error (exit 3, with a traceback)."""
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
    except BaseException:
        traceback.print_exc()
        click.echo(
            "tcdsl: internal error (a bug in tcdsl, not in your policy); "
            "please report it with the traceback above",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)
