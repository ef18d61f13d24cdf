"""The ``--confirm`` timer: ``python -m tcdsl.ops.timer NAME GENERATION SECONDS``, started
detached by ``apply``; after SECONDS, if generation GENERATION of NAME still waits for
``tcdsl confirm``, it rolls back."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import time

from tcdsl.ops.apply import ApplyFailed
from tcdsl.ops.lifecycle import rollback
from tcdsl.ops.state import Store


def main(argv: list[str]) -> int:
    """Wait, then roll back unless confirmed; 0 when nothing was left to do."""
    name, generation, seconds = argv[0], int(argv[1]), float(argv[2])
    store = Store(name)
    deadline = time.time() + seconds
    lock = store.timer_lock(generation)
    with contextlib.suppress(OSError):
        alive = lock.open("a")  # held until this process ends: other commands see it lives
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        return _wait(store, generation, deadline)
    finally:
        lock.unlink(missing_ok=True)


def _wait(store: Store, generation: int, deadline: float) -> int:
    while True:
        pending = store.pending()
        if pending is None or pending.generation != generation:
            return 0  # confirmed, or a later apply took over
        left = deadline - time.time()
        if left <= 0:
            break
        time.sleep(min(left, 0.5))
    with store.locked():  # an apply or confirm may have come meanwhile: look again
        pending = store.pending()
        if pending is None or pending.generation != generation:
            return 0
        try:
            rolled = store.current()
            back = rollback(store)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            if back is not None:
                live = f"{back.where(back.path)} (generation {back.generation}) is live"
            else:
                live = f"no policy is applied under {store.name!r}"
            what = f"generation {generation}"
            if rolled is not None:  # (its path as given may be relative to another folder)
                what = f"{rolled.where(rolled.path)} ({what})"
                live += f"; apply {rolled.where(rolled.path)} again to keep it"
            with contextlib.suppress(OSError):
                store.set_timer_rolled(
                    f"the --confirm timer rolled {what} back at {when}, unconfirmed; {live}"
                )
        except Exception as error:  # detached: kept for the next command under the name
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            # a rollback whose failure was not taken back left part of each policy
            partial = isinstance(error, ApplyFailed) and not error.restored
            with contextlib.suppress(OSError):
                store.set_timer_failed(f"{when}: {error}", partial)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
