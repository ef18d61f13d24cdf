"""The registry of backends; only the driver and the CLI look here."""

from __future__ import annotations

from tcdsl.backends.dot import DotBackend
from tcdsl.backends.json_ir import JsonBackend
from tcdsl.backends.mermaid import MermaidBackend
from tcdsl.backends.nft import NftBackend
from tcdsl.backends.shell import ShellBackend
from tcdsl.backends.tc_batch import TcBatchBackend
from tcdsl.backends.tcng import TcngBackend

from tcdsl.backend import Backend

BACKENDS: dict[str, type[Backend]] = {
    "shell": ShellBackend,
    "tcng": TcngBackend,
    "tc-batch": TcBatchBackend,
    "nft": NftBackend,
    "json": JsonBackend,
    "dot": DotBackend,
    "mermaid": MermaidBackend,
}
