"""The pipeline, in one place: parse -> resolve -> check -> target kernel -> allocate -> lint
-> backend support -> emit; then disabled warnings are dropped.

Each stage adds its diagnostics; the driver stops after the first stage that reports an error,
except after the frontend's: its IR leaves out what had errors, so the later stages still run and
report what they find outside the statements those errors touched (see ``recovery.Taint``).

On a large policy (``BESIDE_MIN_CLASSES``) two pairs of stages run at once, one of each pair
in a forked child (``tcdsl.forked``): the checks beside allocation, the lints beside the
backend support and emit. Allocation and emit then run before the stage that may stop the
compilation has finished; what they give, or raise, is used only when it does not.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Generic, TypeVar

from tcdsl import ir
from tcdsl.allocate import Pins, allocate, live_queues
from tcdsl.backend import Backend, BackendOptions
from tcdsl.backends import BACKENDS
from tcdsl.checks import run_checks
from tcdsl.diagnostics import Diagnostic, Span, sort_key
from tcdsl.forked import Beside
from tcdsl.frontend.reader import Reader
from tcdsl.frontend.source import Access
from tcdsl.kernel_target import KernelTarget, kernel_support
from tcdsl.lint import run_as_written, run_lints
from tcdsl.resolve import resolve
from tcdsl.suppress import suppress as suppress_disabled

T = TypeVar("T")
U = TypeVar("U")


@dataclass
class Result:
    """What a compilation produced: output (None on errors), diagnostics, and source texts."""

    output: str | None
    policy: ir.Policy | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Every file of the output by name, the main one (``output``) first."""

    @property
    def errors(self) -> list[Diagnostic]:
        """The diagnostics that are errors."""
        return [d for d in self.diagnostics if d.is_error]


RECURSION_LIMIT = 10_000
"""Nested blocks and expressions are walked recursively; a few thousand levels are fine."""


@contextmanager
def _compiling() -> Iterator[None]:
    limit = sys.getrecursionlimit()
    with collector_paused():
        sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
        try:
            yield
        finally:
            sys.setrecursionlimit(limit)
            ir.forget()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run a block with Python's cyclic garbage collector off, for work that makes many small
    objects and frees none in cycles (compiling, and what the live operations derive from a
    compiled policy): the collector would rescan them again and again (a third of the time
    on 10,000 classes)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                # The collector counted every object made meanwhile: enabled as it is, it
                # would scan them all at the next allocation (0.2 s for 10,000 classes).
                # Freezing and unfreezing moves them to the oldest generation, unscanned,
                # where a full collection still frees what becomes garbage.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _too_deep(path: str, reader: Reader) -> Result:
    result = Result(None, None, sources=reader.sources)
    msg = "this policy nests blocks or expressions too deeply for tcdsl to follow"
    result.diagnostics.append(Diagnostic.error("E020", msg, Span(path, 1, 1, 1, 2)))
    return result


def _suppressed(result: Result, disabled: Iterable[str]) -> Result:
    """Apply ``--disable`` and the sources' disable comments: the one place this happens."""
    before = {id(d) for d in result.diagnostics}
    found = suppress_disabled(
        result.diagnostics, result.sources, disabled, complete=not result.errors
    )
    kept = [d for d in found if id(d) in before]
    for d in sorted((d for d in found if id(d) not in before), key=sort_key):
        # Comment warnings go in their place; the order of the others stays as it was.
        at = next((i for i, old in enumerate(kept) if sort_key(old) > sort_key(d)), len(kept))
        kept.insert(at, d)
    result.diagnostics[:] = kept
    return result


def analyse(
    path: str,
    loader: Callable[[str], str] | None = None,
    target: KernelTarget | None = None,
    disabled: Iterable[str] = (),
    access: Access | None = None,
    pins: Pins | None = None,
    tables: Callable[[str], str | None] | None = None,
    repack: bool = False,
    beside_lints: Callable[[ir.Policy], None] | None = None,
) -> Result:
    """Parse, resolve, check and allocate ``path``; no backend is involved.

    ``target`` is the kernel the policy is for (None: any current kernel); the codes in
    ``disabled`` and those disabled by comments in the sources are left out of the result;
    ``access`` says where includes may read (default: below the policy's directory);
    ``pins`` keeps class ids a live policy has (see :data:`tcdsl.allocate.Pins`), and the
    queue of each class of a live spread mq tree unless ``repack``;
    ``tables`` gives subscriber tables' text (None for one: read from the disk);
    ``beside_lints`` is called with the allocated policy when the lints find no error: on a
    large policy while they run (in a process of their own), its result then not used, and
    what it raises not raised, if they find one.
    """
    reader = Reader(loader, access, tables, live_queues(pins) if pins and not repack else None)
    with _compiling():
        try:
            return _suppressed(_analyse(path, reader, target, pins, beside_lints), disabled)
        except RecursionError:
            return _too_deep(path, reader)


BESIDE_MIN_CLASSES = 1_000
"""From this many classes on, the checks run beside allocation and the backend beside the
lints, each pair in two processes (``tcdsl.forked``); below it a fork costs more than it saves."""


class _Stages:
    """The diagnostics of one compilation as its stages add them."""

    def __init__(self, reader: Reader) -> None:
        self.result = Result(None, None, reader.diagnostics, reader.sources)
        self.taint = reader.taint

    def done(self, found: Iterable[Diagnostic] = ()) -> bool:
        """Add ``found``; whether to stop (it has an error, or there were errors before that
        are not the frontend's)."""
        result = self.result
        # After frontend errors, later stages report only what those errors cannot have caused.
        found = list(found)
        result.diagnostics += [d for d in found if not self.taint.covers(d)]
        # One mistake can surface more than once (a bad constant at each use): keep the first.
        unique: dict[tuple[str, str, object], Diagnostic] = {}
        for d in result.diagnostics:
            unique.setdefault((d.code, d.message, d.span), d)
        result.diagnostics[:] = sorted(unique.values(), key=sort_key)
        return any(d.is_error for d in found) or (bool(result.errors) and not self.taint)


def _large(policy: ir.Policy) -> bool:
    count = 0
    for iface in policy.interfaces:
        for qdisc in ir.walk_qdiscs(iface.root):
            count += sum(1 for _ in ir.classes_of(qdisc))
    return count >= BESIDE_MIN_CLASSES


Checked = tuple[list[Diagnostic], list[Diagnostic], list[Diagnostic] | None]
"""The checks' diagnostics, the kernel target's, and the lints of the lines as written
(``tcdsl.lint.AS_WRITTEN``) when they ran beside allocation (None: they run with the rest)."""


def _allocated(
    path: str, reader: Reader, target: KernelTarget | None, pins: Pins | None
) -> tuple[_Stages, ir.Policy | None, bool, list[Diagnostic] | None]:
    """Parse, resolve, check and allocate: the stages, the allocated policy (None when a stage
    stopped the compilation), whether the policy is large (see ``BESIDE_MIN_CLASSES``), and
    the lints run beside allocation (None: none were)."""
    interfaces = reader.read(path)
    stages = _Stages(reader)
    if stages.done():
        return stages, None, False, None
    # The frontend drops what it cannot build (a bad value, a bad statement), so the IR is
    # well-formed even after errors: later stages go on while each finds none of its own.
    policy = ir.Policy(path, tuple(interfaces))
    policy, found = resolve(policy)
    if stages.done(found):
        return stages, None, False, None
    large = _large(policy)
    resolved = policy

    def checked() -> Checked:
        checks, kernel = list(run_checks(resolved)), list(kernel_support(resolved, target))
        # On a large policy the lints of the lines as written (the shadowing analysis) go
        # beside allocation too, where the checks let them (lints read checked policies).
        clean = large and not any(d.is_error for d in (*checks, *kernel))
        return checks, kernel, run_as_written(resolved) if clean else None

    (checks, kernel, early), allocated = _both(checked, lambda: allocate(resolved, pins), large)
    if stages.done(checks) or stages.done(kernel):
        return stages, None, large, None
    policy, found = allocated()
    if stages.done(found):
        return stages, None, large, None
    return stages, policy, large, early


def _both(first: Callable[[], T], then: Callable[[], U], fork: bool) -> tuple[T, Callable[[], U]]:
    """``first``'s result, and a call that gives ``then``'s, to be made only when that result
    lets the compilation go on. With ``fork``, ``first`` runs in a child while ``then`` runs
    here, on a policy ``first`` may yet reject (what it raises is kept, and raised by the
    call); without, ``then`` runs at the call, after ``first``."""
    with Beside(first, fork=fork) as beside:
        early = _Attempt(then) if beside.pid else None
        found = beside.result()
    return found, (early.get if early is not None else then)


class _Attempt(Generic[T]):
    """A call's result, or what it raised, kept to be given (or raised) later."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.error: Exception | None = None
        try:
            self.value = call()
        except Exception as error:
            self.error = error

    def get(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value


def _analyse(
    path: str,
    reader: Reader,
    target: KernelTarget | None = None,
    pins: Pins | None = None,
    beside_lints: Callable[[ir.Policy], None] | None = None,
) -> Result:
    stages, policy, large, early = _allocated(path, reader, target, pins)
    if policy is None:
        return stages.result
    allocated = policy

    def work() -> None:
        if beside_lints is not None:
            beside_lints(allocated)

    lints, then = _both(
        lambda: [*(early or ()), *run_lints(allocated, as_written=early is None)],
        work,
        large and beside_lints is not None,
    )
    if stages.done(lints) or stages.result.errors:
        return stages.result
    then()
    stages.result.policy = policy
    return stages.result


def compile_policy(
    path: str,
    backend: str = "shell",
    loader: Callable[[str], str] | None = None,
    options: BackendOptions | None = None,
    stem: str | None = None,
    target: KernelTarget | None = None,
    disabled: Iterable[str] = (),
    access: Access | None = None,
) -> Result:
    """Compile ``path`` with the named backend; ``result.output`` is None if there were errors.

    ``stem`` names the output files (default: the policy's file name without extension);
    ``target``, ``disabled`` and ``access`` are as for ``analyse``.
    """
    reader = Reader(loader, access)
    with _compiling():
        try:
            emitter: Backend = BACKENDS[backend](options)
            name = stem if stem is not None else PurePath(path).stem
            made: list[tuple[list[Diagnostic], dict[str, str]]] = []

            def emitted(policy: ir.Policy) -> None:
                # What the checks and lints remembered (the match lines lowered to u32 keys,
                # a third of the memory on 50,000 subscribers) is not what a backend asks for.
                ir.forget()
                # Classes made from one template (a subscribers statement) share its leaf's
                # span.
                unsupported = {(d.code, d.message, d.span): d for d in emitter.unsupported(policy)}
                found = sorted(unsupported.values(), key=sort_key)
                made.append((found, {} if any(d.is_error for d in found) else
                             emitter.emit_files(policy, path, name)))  # fmt: skip

            result = _analyse(path, reader, target, None, emitted)
            if result.policy is None:
                return _suppressed(result, disabled)
            ((unsupported, files),) = made
            result.diagnostics += unsupported
            if result.errors:
                return _suppressed(result, disabled)
            result.files = files
            result.output = next(iter(result.files.values()))
        except RecursionError:
            return _too_deep(path, reader)
        return _suppressed(result, disabled)
