"""The default backend: a POSIX sh script of tc and iptables commands."""

from __future__ import annotations

from dataclasses import dataclass

from tcdsl import __version__, ir
from tcdsl.backend import Backend, template_env
from tcdsl.commands import Command, interface_commands


@dataclass(frozen=True, slots=True)
class Line:
    """One command of the script, with the policy location it comes from."""

    origin: str
    words: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class InterfaceView:
    """What the template needs of one interface."""

    name: str
    chain: str | None
    mark_from: str | None
    lines: tuple[Line, ...]


def _line(cmd: Command) -> Line:
    s = cmd.span
    return Line(f"{s.file}:{s.line}:{s.column}: {cmd.what}", (cmd.tool, *cmd.args))


class ShellBackend(Backend):
    """Emit an idempotent ``set -eu`` shell script."""

    name = "shell"
    extension = "sh"

    def emit(self, policy: ir.Policy, source_label: str) -> str:
        views = [
            InterfaceView(
                iface.name,
                iface.marking.chain if iface.marking else None,
                iface.marking.from_interface if iface.marking else None,
                tuple(_line(c) for c in interface_commands(iface)),
            )
            for iface in policy.interfaces
        ]
        uses_iptables = any(v.chain for v in views)
        return (
            template_env()
            .get_template("shell.sh.j2")
            .render(
                version=__version__,
                source=source_label,
                interfaces=views,
                uses_iptables=uses_iptables,
            )
        )
