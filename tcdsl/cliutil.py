"""What the command-line modules share: exit codes, the diagnostics' format option, include
access, and the ways a command reports a policy with errors or a file it cannot write."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import click

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Severity, render
from tcdsl.driver import Result
from tcdsl.frontend.source import Access

EXIT_OK, EXIT_POLICY, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


def state_name(name: str, hint: str | None = None) -> str:
    """``name`` if the state can keep a policy under it; else a usage error (``hint``: the
    option to name, where click does not: outside an option's callback)."""
    from tcdsl.ops.state import NAME_RULE, valid_name

    if not valid_name(name):
        raise click.BadParameter(f"{name!r}: {NAME_RULE}", param_hint=hint)
    return name


def unit_refusal(value: str) -> str:
    """Why ``value`` is no time or rate with a unit, in words after it (found by a tester:
    '-1s' was said to have no unit)."""
    return "must be above 0" if value.strip().startswith("-") else "is not a value with a unit"


def visible(diagnostics: Sequence[Diagnostic], info: bool) -> list[Diagnostic]:
    """The diagnostics to show: infos only with ``--info``."""
    return [d for d in diagnostics if info or d.severity is not Severity.INFO]


def summary(diagnostics: Sequence[Diagnostic]) -> str:
    """``3 errors, 1 warning``: what was found, counting those a cap left unshown (a
    diagnostic saying so stands for them: ``80 errors (30 not shown)``)."""
    said = []
    for severity, word in (
        (Severity.ERROR, "error"),
        (Severity.WARNING, "warning"),
        (Severity.INFO, "info"),
    ):
        found = [d for d in diagnostics if d.severity is severity]
        hidden = sum(d.hidden for d in found)
        n = sum(1 for d in found if not d.hidden) + hidden
        if n:
            said.append(
                f"{n} {word}{'s' * (n != 1)}" + (f" ({hidden} not shown)" if hidden else "")
            )
    return ", ".join(said)


def policy_or_exit(result: Result, what: str) -> ir.Policy:
    """The checked policy of ``result``; if it has errors, print them as ``check`` does, say
    that nothing was ``what`` (simulated, measured, ...) and exit 1."""
    if result.policy is None:
        shown = visible(result.diagnostics, False)
        click.echo(render(shown, result.sources), nl=False, err=True)
        click.echo(f"tcdsl: {summary(shown)}; nothing {what}", err=True)
        sys.exit(EXIT_POLICY)
    return result.policy


def dash_is_stdout(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An ``-o``/``--output`` option's value: ``-`` is stdout, as for most tools (it wrote a
    file named ``-``)."""
    return None if value == "-" else value


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an OSError while writing ``path`` into a message and exit 1."""
    try:
        yield
    except OSError as err:
        click.echo(f"tcdsl: cannot write '{path}': {err.strerror or err}", err=True)
        sys.exit(EXIT_POLICY)


WRITE_CHUNK = 1 << 20
"""Characters encoded and written at a time by :func:`write_text`."""


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in UTF-8 as ``Path.write_text`` does, a piece at a time:
    encoding a 50,000-subscriber script at once makes a second copy of it (50 MB) at the
    compile's peak of memory."""
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, len(text), WRITE_CHUNK):
            out.write(text[start : start + WRITE_CHUNK])


def format_option(*choices: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    where = "SARIF on stdout, the others on stderr" if "sarif" in choices else "on stderr"
    return click.option(
        "--format",
        "--diagnostics",
        "fmt",
        type=click.Choice(choices),
        default="text",
        show_default=True,
        help=f"How to print diagnostics ({where}); --diagnostics is the old name.",
    )


def output_option(help: str, *choices: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--format`` (the command gets ``fmt``): how to print a command's output, one of
    ``choices`` (the first is the default)."""
    return click.option(
        "--format", "fmt", type=click.Choice(choices), default=choices[0], show_default=True,
        help=help,
    )  # fmt: skip


def access_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add --include-path and --allow-include-anywhere; the command gets ``access``."""

    @functools.wraps(command)
    def wrapper(
        *args: object, include_paths: tuple[str, ...], anywhere: bool, **kw: object
    ) -> None:
        command(*args, access=Access(include_paths, anywhere), **kw)

    wrapper = click.option(
        "--allow-include-anywhere",
        "anywhere",
        is_flag=True,
        help="Let includes (and symlinks in a checked directory) read any regular file; do "
        "not use on policies you do not trust.",
    )(wrapper)
    return click.option(
        "--include-path",
        "include_paths",
        multiple=True,
        metavar="DIR",
        type=click.Path(file_okay=False),
        help="Also let includes read files below DIR (repeatable). By default a policy's "
        "includes stay below its own directory (or the directory being checked).",
    )(wrapper)


FORMAT = format_option("text", "json")
