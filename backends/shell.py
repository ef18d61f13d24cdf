"""The default backend: a POSIX sh script of tc and iptables (or nft) commands."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tcdsl import __version__, ir
from tcdsl.backend import Backend, comment, template_env
from tcdsl.commands import Command, batch_line, interface_commands, nft_table_lines, unspellable
from tcdsl.diagnostics import Diagnostic


@dataclass(frozen=True, slots=True)
class Line:
    """One command of the script, with the policy location it comes from."""

    origin: str
    words: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HereDoc:
    """Lines fed to a command's stdin (``tc -batch -``, ``nft -f -``) by a here-document."""

    delimiter: str
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class InterfaceView:
    """What the template needs of one interface."""

    name: str
    chain: str | None
    mark_from: str | None
    lines: tuple[Line, ...]
    """Commands run one by one: all of them, or (with ``--batch``) the iptables ones."""
    batch: HereDoc | None = None
    """With ``--batch``: the tc commands, for one ``tc -batch -``."""
    nft: HereDoc | None = None
    """With ``--marks nft``: the marking table, for ``nft -f -``."""


def _origin(cmd: Command) -> str:
    s = cmd.span
    return f"{s.file}:{s.line}:{s.column}: {cmd.what}"


def _line(cmd: Command) -> Line:
    return Line(_origin(cmd), (cmd.tool, *cmd.args))


def _heredoc(lines: Sequence[str], delimiter: str) -> HereDoc:
    while delimiter in lines:
        delimiter += "_"
    return HereDoc(delimiter, tuple(lines))


def _view(iface: ir.Interface, batch: bool, nft: bool) -> InterfaceView:
    commands = list(interface_commands(iface))
    if nft:
        commands = [c for c in commands if c.tool != "iptables"]
    run = [_line(c) for c in commands if not batch or c.tool != "tc"]
    tc_batch: HereDoc | None = None
    if batch:
        lines: list[str] = []
        for c in commands:
            if c.tool == "tc":
                lines += [f"# {comment(_origin(c))}", batch_line(c)]
        tc_batch = _heredoc(lines, "TCDSL_BATCH")
    table: HereDoc | None = None
    if nft and iface.marking is not None:
        table = _heredoc(list(nft_table_lines(iface)), "TCDSL_NFT")
    return InterfaceView(
        iface.name,
        iface.marking.chain if iface.marking else None,
        iface.marking.from_interface if iface.marking else None,
        tuple(run),
        tc_batch,
        table,
    )


class ShellBackend(Backend):
    """Emit an idempotent ``set -eu`` shell script."""

    name = "shell"
    extension = "sh"

    def unsupported(self, policy: ir.Policy) -> Iterator[Diagnostic]:
        """With ``--batch`` or ``--marks nft``: E502 for what those inputs cannot spell."""
        return unspellable(policy, batch=self.options.batch, nft=self.options.marks == "nft")

    def emit(self, policy: ir.Policy, source_label: str) -> str:
        """The script."""
        nft = self.options.marks == "nft"
        views = [_view(iface, self.options.batch, nft) for iface in policy.interfaces]
        marking = any(v.chain for v in views)
        return (
            template_env()
            .get_template("shell.sh.j2")
            .render(
                version=__version__,
                source=source_label,
                interfaces=views,
                uses_iptables=marking and not nft,
                uses_nft=marking and nft,
            )
        )
