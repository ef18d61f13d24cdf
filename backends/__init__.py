"""The registry of backends; only the driver and the CLI look here."""

from __future__ import annotations

from tcdsl.backends.shell import ShellBackend

from tcdsl.backend import Backend

BACKENDS: dict[str, type[Backend]] = {
    "shell": ShellBackend,
}
