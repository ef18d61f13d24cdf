"""The per-interface lock that generated scripts and tcdsl take before they change a kernel.

A generated script holds ``flock`` on ``/run/lock/tcdsl-IFACE.lock`` (or in
``$TCDSL_LOCK_DIR``) while it tears down and rebuilds IFACE, so two runs at once (cron and a
person) cannot interleave their commands. The live operations (``apply``, ``rollback``,
``down``) hold the same locks through :func:`interface_locks` while they change the kernel,
inside the lock of the policy name (``tcdsl.ops.state.Store.locked``), which they hold from
reading the state to writing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tcdsl.commands import LOCK_DIR, LOCK_DIR_VARIABLE, lock_name


def lock_folder() -> Path:
    """The folder of the lock files: ``$TCDSL_LOCK_DIR``, or ``/run/lock``."""
    return Path(os.environ.get(LOCK_DIR_VARIABLE) or LOCK_DIR)


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the ``flock`` of the file ``path`` (made, with its folder, if missing) until the
    block ends, waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def is_held(path: Path) -> bool:
    """Whether a process holds the ``flock`` of the file ``path`` now (False without the file)."""
    try:
        handle = path.open("r")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False


@contextlib.contextmanager
def interface_locks(interfaces: Iterable[str]) -> Iterator[None]:
    """Hold the lock of every interface in ``interfaces`` until the block ends (waiting for it).

    Locks are taken in sorted order, so two holders of several locks never wait for each
    other in a circle; a generated script holds one at a time.
    """
    folder = lock_folder()
    with contextlib.ExitStack() as stack:
        for name in sorted(set(interfaces)):
            stack.enter_context(held(folder / lock_name(name)))
        yield
