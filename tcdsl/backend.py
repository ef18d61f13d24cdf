"""What every backend shares: the ``Backend`` base, the template environment, shell quoting."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Literal

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic

if TYPE_CHECKING:  # jinja2 loads with the first template: check and most backends need none
    import jinja2


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Choices a user makes about the output, shared by the backends they apply to."""

    marks: Literal["iptables", "nft"] = "iptables"
    """How packets are marked for ``classify by mark``."""
    batch: bool = True
    """Shell backend: feed the tc commands to one ``tc -batch`` (13-59 times faster to apply);
    False: one tc process per command (``--per-command``), for readers."""


class Backend:
    """A target: ``unsupported`` reports what it cannot express, ``emit`` renders the policy.

    ``emit`` is pure: no I/O, no clock, no unordered iteration; the same policy gives the same
    text byte for byte. A backend whose output is several files (a tc batch plus an
    iptables-restore file) also overrides ``emit_files``.
    """

    name: str = ""
    extension: str = ""

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()

    def unsupported(self, policy: ir.Policy) -> Iterator[Diagnostic]:
        """Yield a diagnostic for everything in ``policy`` this backend cannot express."""
        return iter(())

    def emit(self, policy: ir.Policy, source_label: str) -> str:
        """Render ``policy``; ``source_label`` names the policy file in headers."""
        raise NotImplementedError

    def emit_files(self, policy: ir.Policy, source_label: str, stem: str) -> dict[str, str]:
        """Render every file of the output, by file name (``stem`` plus an extension); the
        main one, which ``emit`` returns, first."""
        return {f"{stem}.{self.extension}": self.emit(policy, source_label)}


_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def _quote(text: str) -> str:
    if _SAFE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"  # shlex.quote, without its second scan


def shquote(word: object) -> str:
    """Quote one word for POSIX sh; safe words stay bare so the script stays readable."""
    return _quote(str(word))


def shjoin(words: Iterable[object]) -> str:
    """Quote and join words into one command line."""
    return " ".join(map(_quote, map(str, words)))  # shquote on each, without a Python loop


def comment(text: object) -> str:
    """Make text safe to put after ``#`` on one line."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else "?" for ch in text)


TEXT_LINES = 4096
"""Lines per string of a long text: a big policy's output has hundreds of thousands of lines,
and a string for each would take more memory than the text itself (and a loop over them in a
template more time than the rest of the output)."""


def text_blocks(lines: Iterable[str]) -> tuple[str, ...]:
    """``lines``, each ending in a newline, as a few long strings (:data:`TEXT_LINES` lines
    each)."""
    rest = iter(lines)
    out: list[str] = []
    while block := list(islice(rest, TEXT_LINES)):
        block.append("")
        out.append("\n".join(block))
    return tuple(out)


class TextBlocks:
    """Lines gathered as they come into a few long strings (see :func:`text_blocks`), so that
    no string per line is kept for the whole output."""

    def __init__(self, lines: Iterable[str] = ()) -> None:
        self.blocks: list[str] = []
        self.lines: list[str] = list(lines)

    def append(self, line: str) -> None:
        """Add ``line`` (without its newline)."""
        self.lines.append(line)
        if len(self.lines) >= TEXT_LINES:
            self.blocks += text_blocks(self.lines)
            self.lines = []

    def text(self) -> tuple[str, ...]:
        """Every line so far, each ending in a newline, as a few long strings."""
        return (*self.blocks, *text_blocks(self.lines))


@functools.cache
def template_env() -> jinja2.Environment:
    """The environment for backend templates: strict, unescaped, with shell filters."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tcdsl.backends", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["shquote"] = shquote
    env.filters["shjoin"] = shjoin
    env.filters["comment"] = comment
    return env
