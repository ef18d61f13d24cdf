"""The pipeline, in one place: parse -> resolve -> check -> allocate -> backend support -> emit.

Each stage adds its diagnostics; the driver stops after the first stage that reports an error.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tcdsl import ir
from tcdsl.allocate import allocate
from tcdsl.backend import Backend
from tcdsl.backends import BACKENDS
from tcdsl.checks import run_checks
from tcdsl.diagnostics import Diagnostic, sort_key
from tcdsl.frontend import Reader
from tcdsl.resolve import resolve


@dataclass
class Result:
    """What a compilation produced: output (None on errors), diagnostics, and source texts."""

    output: str | None
    policy: ir.Policy | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def errors(self) -> list[Diagnostic]:
        """The diagnostics that are errors."""
        return [d for d in self.diagnostics if d.is_error]


@contextmanager
def _without_gc() -> Iterator[None]:
    # Compiling allocates many small objects and frees none in cycles; the cyclic collector
    # would rescan them again and again (a third of the time on 10,000 classes).
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def analyse(path: str, loader: Callable[[str], str] | None = None) -> Result:
    """Parse, resolve, check and allocate ``path``; no backend is involved."""
    with _without_gc():
        return _analyse(path, loader)


def _analyse(path: str, loader: Callable[[str], str] | None) -> Result:
    reader = Reader(loader)
    interfaces = reader.read(path)
    result = Result(None, None, reader.diagnostics, reader.sources)

    def done() -> bool:
        # One mistake can surface more than once (a bad constant at each use): keep the first.
        unique: dict[tuple[str, str, object], Diagnostic] = {}
        for d in result.diagnostics:
            unique.setdefault((d.code, d.message, d.span), d)
        result.diagnostics[:] = sorted(unique.values(), key=sort_key)
        return bool(result.errors)

    if done():
        return result
    policy = ir.Policy(path, tuple(interfaces))
    policy, found = resolve(policy)
    result.diagnostics += found
    if done():
        return result
    result.diagnostics += run_checks(policy)
    if done():
        return result
    policy, found = allocate(policy)
    result.diagnostics += found
    if done():
        return result
    result.policy = policy
    return result


def compile_policy(
    path: str, backend: str = "shell", loader: Callable[[str], str] | None = None
) -> Result:
    """Compile ``path`` with the named backend; ``result.output`` is None if there were errors."""
    with _without_gc():
        result = _analyse(path, loader)
        if result.policy is None:
            return result
        target: Backend = BACKENDS[backend]()
        result.diagnostics += sorted(target.unsupported(result.policy), key=sort_key)
        if result.errors:
            return result
        result.output = target.emit(result.policy, path)
        return result
