"""The registry of backends; only the driver and the CLI look here."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from tcdsl.backend import Backend

_WHERE: dict[str, tuple[str, str]] = {
    "shell": ("shell", "ShellBackend"),
    "tcng": ("tcng", "TcngBackend"),
    "tc-batch": ("tc_batch", "TcBatchBackend"),
    "nft": ("nft", "NftBackend"),
    "json": ("json_ir", "JsonBackend"),
    "dot": ("dot", "DotBackend"),
    "mermaid": ("mermaid", "MermaidBackend"),
}


class _Registry(Mapping[str, type[Backend]]):
    """Backend classes by name, each module imported when its backend is first asked for
    (a compile to shell need not load the diagram backends)."""

    def __getitem__(self, name: str) -> type[Backend]:
        module, cls = _WHERE[name]
        found: type[Backend] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(_WHERE)

    def __len__(self) -> int:
        return len(_WHERE)


BACKENDS: Mapping[str, type[Backend]] = _Registry()
