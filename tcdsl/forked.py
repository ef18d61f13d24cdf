"""Work done beside the main process, on another core: a forked child runs one function and
hands its result back, pickled through an anonymous memory file.

The driver uses it for stages that need only what is already built and run while another
goes on (the checks beside allocation, the backend beside the lints): on a large policy each
pair then takes as long as the longer one. The result is the function's, made by the same
code on a copy of the same objects; where the child cannot give it (it failed, was killed,
or the result does not pickle), the function runs again in the calling process, which then
also raises what it raises.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")

_UNSET = object()


class Beside(Generic[T]):
    """``work`` run in a forked child from ``__enter__`` (when ``fork``), its result taken by
    :meth:`result`; without ``fork`` (or where the process cannot fork safely), ``result``
    runs it there and then. Leaving the block stops a child whose result was not taken."""

    def __init__(self, work: Callable[[], T], fork: bool = True) -> None:
        self.work = work
        self.fork = (
            fork and hasattr(os, "fork") and threading.active_count() == 1 and room_for_a_copy()
        )
        self.pid = 0
        self.fd = -1
        self.value: object = _UNSET

    def __enter__(self) -> Beside[T]:
        if self.fork:
            try:
                self.fd = _memory_file()
                self.pid = os.fork()
            except OSError:  # no memory or no process left for a child: the work runs here
                self.__exit__(None, None, None)
                return self
            if self.pid == 0:  # the child: never returns
                _child(self.work, self.fd)
        return self

    def result(self) -> T:
        """The work's result: the child's, once it ends; else made here."""
        if self.value is _UNSET:
            self.value = self._taken() if self.pid else self.work()
        return self.value  # type: ignore[return-value]

    def _taken(self) -> T:
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        try:
            if os.waitstatus_to_exitcode(status) == 0:
                os.lseek(self.fd, 0, os.SEEK_SET)
                with os.fdopen(self.fd, "rb", closefd=False) as data:
                    return pickle.load(data)  # type: ignore[no-any-return]
        finally:
            os.close(self.fd)
            self.fd = -1
        return self.work()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


MEMINFO = "/proc/meminfo"


def room_for_a_copy() -> bool:
    """Whether the system has the memory for this process's pages once more (and half again
    for what both go on making): a child shares them, but the reference counts it writes copy
    most of those it reads. Without it (a small router compiling a large table) the work runs
    in this process instead; where /proc cannot tell, the fork itself decides."""
    try:
        with open(MEMINFO, encoding="ascii") as info:
            available = next(
                int(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable:")
            )
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, StopIteration, ValueError, IndexError):
        return True
    return available >= resident * 3 // 2


def _memory_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("tcdsl-beside", os.MFD_CLOEXEC)
    handle, path = tempfile.mkstemp(prefix="tcdsl-beside-")
    os.unlink(path)
    return handle


def _child(work: Callable[[], object], fd: int) -> None:
    code = 1
    try:
        data = memoryview(pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL))
        while data:
            data = data[os.write(fd, data) :]
        code = 0
    except BaseException:  # the parent makes the result itself, and raises what it raises
        pass
    finally:
        # Not sys.exit: no exit handlers, no flush of the buffers copied from the parent
        # (its unwritten output would be written twice).
        os._exit(code)
