"""What ``apply`` remembers: per policy name, the policies it applied (their source text, so a
rollback compiles the same policy again) and which one is live.

The state lives in ``/var/lib/tcdsl`` (``TCDSL_STATE_DIR`` moves it: tests, namespaces), one
folder per policy name (the policy file's stem unless ``--name`` says otherwise)::

    <state>/<name>/applied/<generation>.json    the last KEEP applies, newest highest
    <state>/<name>/applied/<generation>.*.json  what each built, the kernel's digest after it
    <state>/<name>/pending.json                 an apply waiting for ``tcdsl confirm``
    <state>/<name>/applying.json                an apply under way (left by one that was killed)
    <state>/+locks/<name>                       ``flock``ed by whoever changes the name's state

Files are written whole and renamed into place, so a killed apply leaves the old file or the
new one, never half of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tcdsl.diagnostics import Span
from tcdsl.lock import held, is_held

STATE_DIR = "/var/lib/tcdsl"
STATE_DIR_VARIABLE = "TCDSL_STATE_DIR"
KEEP = 5
"""How many applied policies a name keeps (``rollback`` goes back through them)."""

T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}")
"""Not starting with '-' (found by a tester: '--name -x' was taken, and the name then read
as an option by every command but 'tcdsl down -- -x')."""


def state_dir() -> Path:
    """Where the state lives."""
    return Path(os.environ.get(STATE_DIR_VARIABLE) or STATE_DIR)


NAME_RULE = "at most 64 letters, digits, '_', '.', '-' (not '.' or '..'; not starting with '-')"
"""What :func:`valid_name` takes, in words."""


def valid_name(name: str) -> bool:
    """A policy name usable as a folder name and an argument (letters, digits, ``_ . -``; not
    ``.``/``..``, not starting with ``-``)."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


TIMER_FAILED = "timer-failed.txt"
"""In a name's state folder: why its ``--confirm`` timer could not roll back."""
TIMER_PARTIAL = "partial"
"""The last line of ``TIMER_FAILED`` when the rollback left the kernel with part of each policy."""
TIMER_ROLLED = "timer-rolled.txt"
"""In a name's state folder: what its ``--confirm`` timer rolled back, until the next apply or
confirm (a late ``tcdsl confirm`` says it)."""
TIMER_GRACE = 1.0
"""Seconds past a --confirm deadline before a timer that holds no lock is said to be gone."""


@dataclass(frozen=True, slots=True)
class Applied:
    """One applied policy: its generation number, the path it was compiled from, the text
    of every file it read (path -> text), the devices it owns, when, and the class ids it
    was given (tree label -> class name -> ``1:10``), which compiling it again needs: they
    were pinned from the policy before it."""

    generation: int
    path: str
    sources: Mapping[str, str]
    devices: tuple[str, ...]
    applied_at: float
    classids: Mapping[str, Mapping[str, str]]
    folder: str = ""
    """The working directory it was applied from, which its relative paths are relative to
    ("" in a record of an older tcdsl: the current one is taken)."""
    netns: str = ""
    """The network namespace it was applied in (:func:`this_netns`; "" in a record of an
    older tcdsl, or where it could not be read): its devices are that namespace's."""
    ifbs: tuple[str, ...] = ()
    """The IFBs its downloads are shaped on, which it owns (none in a record of an older
    tcdsl)."""
    taken: tuple[str, ...] = ()
    """Those of ``ifbs`` that existed before its name first shaped on them (another tool's,
    made by hand, or by a generated script): taking it down removes their trees, never the
    devices (found by a tester: another tool's IFB, still the target of its mirror, was
    deleted)."""

    @property
    def here(self) -> bool:
        """Whether it was applied in this network namespace, as far as the record says: a
        record of a namespace that no longer exists is taken as this one's (its trees went
        with it; found by a review: a namespace made again, at boot or by a container's
        restart, has another inode, and its name's record was refused for good there; and
        after a kernel upgrade the host's own may have another)."""
        return not self.netns or self.netns == this_netns() or not netns_exists(self.netns)

    def to_json(self) -> dict[str, object]:
        """The record as JSON."""
        data: dict[str, object] = {
            "generation": self.generation,
            "path": self.path,
            "sources": dict(sorted(self.sources.items())),
            "devices": list(self.devices),
            "applied_at": self.applied_at,
            "classids": {k: dict(sorted(v.items())) for k, v in sorted(self.classids.items())},
        }
        if self.folder:
            data["folder"] = self.folder
        if self.netns:
            data["netns"] = self.netns
        if self.ifbs:
            data["ifbs"] = list(self.ifbs)
        if self.taken:
            data["taken_ifbs"] = list(self.taken)
        return data

    def where(self, name: str) -> str:
        """The absolute path of a file it read, named as it was (``path``, a source)."""
        return os.path.abspath(os.path.join(self.folder or os.getcwd(), name))

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Applied:
        """A record read back."""
        sources, devices, ids = data["sources"], data["devices"], data["classids"]
        if not (isinstance(sources, dict) and isinstance(devices, list) and isinstance(ids, dict)):
            raise TypeError("sources, devices or classids is not what a record holds")
        if str(data["path"]) not in sources:  # (found by a tester: a traceback in status)
            raise KeyError(f"the policy's file {data['path']} is not among its sources")
        return cls(
            int(str(data["generation"])),
            str(data["path"]),
            {str(k): str(v) for k, v in sources.items()},
            tuple(str(d) for d in devices),
            float(str(data["applied_at"])),
            {str(k): _valid_ids(str(k), v) for k, v in ids.items()},
            str(data.get("folder", "")),
            str(data.get("netns", "")),
            tuple(str(d) for d in ifbs) if isinstance(ifbs := data.get("ifbs", []), list) else (),
            tuple(str(d) for d in t) if isinstance(t := data.get("taken_ifbs", []), list) else (),
        )


def elsewhere(name: str, netns: str) -> str:
    """Why the policy applied under ``name`` in network namespace ``netns`` is not this
    namespace's to change or read."""
    known = netns_name(netns)
    there = f"network namespace '{known}' ({netns})" if known else f"network namespace {netns}"
    run = f"ip netns exec {known} tcdsl ..." if known else "ip netns exec NAMESPACE tcdsl ..."
    return (
        f"the policy '{name}' was applied in {there}, not in this one ({this_netns() or '?'}), "
        f"and its devices are that namespace's: run tcdsl there ({run}), or apply a policy "
        "here under another name (--name; a state folder per namespace, TCDSL_STATE_DIR, "
        "keeps them apart); nothing was changed"
    )


@functools.cache
def netns_exists(netns: str) -> bool:
    """Whether a network namespace ``netns`` (``net:[INODE]``) exists now: one a process is
    in, or one ``ip netns`` names (True where that cannot be told: /proc unreadable)."""
    if netns_name(netns) is not None:
        return True
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/net") == netns:
                return True
    return False


def netns_name(netns: str) -> str | None:
    """The name ``ip netns`` gives the network namespace ``netns`` (``net:[INODE]``), if it
    has one."""
    inode = netns.removeprefix("net:[").removesuffix("]")
    if not inode.isdigit():
        return None
    try:
        names = sorted(os.listdir("/run/netns"))
    except OSError:
        return None
    for name in names:
        with contextlib.suppress(OSError):
            if os.stat(os.path.join("/run/netns", name)).st_ino == int(inode):
                return name
    return None


def this_netns() -> str:
    """The network namespace this process is in, as the kernel names it (``net:[4026531840]``),
    or "" where it cannot be read. Namespaces sharing a state folder share policy names, and
    each has devices of its own by the same names (eth0)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


_ID = re.compile(r"[0-9a-f]{1,4}:[0-9a-f]{0,4}")


def _valid_ids(tree: str, ids: object) -> dict[str, str]:
    """One tree's class ids as recorded (class name -> ``1:10``, and the pins after a blank:
    ``voip leaf`` -> ``10:``), or ValueError for what tcdsl never writes: a value that is no
    handle, or two classes (or two leaf qdiscs) with one id, which a later apply would keep
    and so rebuild the tree."""
    if not isinstance(ids, dict):
        raise TypeError(f"the class ids of {tree!r} are not a map")
    out: dict[str, str] = {}
    owner: dict[tuple[str, str], str] = {}
    for name, value in ids.items():
        if not isinstance(value, str) or not _ID.fullmatch(value):
            raise ValueError(f"the class id of {name!r} in {tree!r} is {value!r}, not a handle")
        base, _, pin = name.partition(" ")
        what = pin.split(" ")[0]
        major, minor = value.split(":")
        if (what in ("", "link") and not minor) or (what in _MAJOR_ONLY and minor):
            raise ValueError(f"{name!r} in {tree!r} is {value!r}, not what tcdsl records there")
        if what == "leaf" and ids.get(base, ":").split(":")[0] == major:
            raise ValueError(f"{name!r} in {tree!r} is {value!r}, the qdisc of class {base!r}")
        if what in ("", "link", "leaf"):
            kind = "qdisc" if what == "leaf" else "class"
            other = owner.setdefault((kind, value), name)
            if other != name:
                raise ValueError(f"{name!r} and {other!r} in {tree!r} have one {kind} id {value}")
        out[str(name)] = value
    return out


_MAJOR_ONLY = ("leaf", "r2q", "queue")
"""The pins recorded as a handle's major alone (a qdisc's handle, or a number as one)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """An apply waiting for ``confirm``: the generation applied, the one to go back to (None:
    remove the policy), and the deadline (seconds since the epoch)."""

    generation: int
    previous: int | None
    deadline: float


def write_json(path: Path, data: object, indent: int | None = 1) -> None:
    """Write ``data`` as JSON whole: to a file beside ``path``, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=indent, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # (a full disk may have taken part of it)
        raise


class OpsError(Exception):
    """An operation refused before changing anything (the message says why)."""


class UnfitDevice(OpsError):
    """A device the operation changes cannot take the policy (E602): too few TX queues for
    its mq tree, its ingress slot held by another qdisc; ``span``: where the policy names
    it, when known."""

    def __init__(self, message: str, span: Span | None = None) -> None:
        super().__init__(message)
        self.span = span


class MissingDevice(UnfitDevice):
    """A device the operation changes does not exist (E602)."""


class StateWriteError(OpsError):
    """The state folder could not be written (E603): before any change, or after the kernel
    changed (the message says which)."""


class DamagedRecord(OpsError):
    """A state file that cannot be read (cut short, edited by hand)."""


def _load(path: Path, convert: Callable[[Any], T]) -> T:
    """A state file's JSON made into what it holds, or DamagedRecord saying what to do
    about it (FileNotFoundError when there is none)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except NotADirectoryError:  # (found by a tester: a traceback)
        above = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise StateWriteError(
            f"{above} is a file where tcdsl keeps its state in a folder ({path}); nothing "
            "was changed: move it away, or point TCDSL_STATE_DIR at a folder"
        ) from None
    except (IsADirectoryError, PermissionError) as e:  # (found by a tester: a traceback)
        raise _damaged(path, e.strerror or repr(e)) from None
    try:
        return convert(json.loads(text))
    # RecursionError: JSON nested deeper than Python's stack (found by a tester)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise _damaged(path, repr(e)) from None


def _damaged(path: Path, why: str) -> DamagedRecord:
    return DamagedRecord(
        f"the state file {path} is damaged ({why}): move it away, or remove what tcdsl "
        "made on the interfaces with 'tcdsl down -i IFACE --yes'"
    )


def _pending(data: Any) -> Pending:
    previous = data["previous"]
    return Pending(int(data["generation"]), None if previous is None else int(previous),
                   float(data["deadline"]))  # fmt: skip


class Store:
    """The state of one policy name."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        if not valid_name(name):
            raise ValueError(f"not a usable policy name: {name!r}")
        self.name = name
        self.folder = (root or state_dir()) / name

    def _applied(self) -> Path:
        return self.folder / "applied"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the name's lock until the block ends (waiting for it): one apply, rollback,
        confirm or down of a name at a time, each reading the state and the kernel after the
        one before has finished with them (two applies at once left the kernel a mix of both
        policies, and the record one of them). In a folder no policy name can be (``+``)."""
        path = self.folder.parent / "+locks" / self.name
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(held(path))
            except OSError as e:  # a read-only or full file system, a file where a folder is
                raise OpsError(
                    f"cannot take the lock of '{self.name}' ({path}): {e.strerror or e}; "
                    "nothing was changed (tcdsl keeps its state and locks in "
                    f"{self.folder.parent}, which must be writable: TCDSL_STATE_DIR moves it)"
                ) from e
            yield

    def generations(self) -> list[int]:
        """The generations kept, oldest first."""
        folder = self._applied()
        if not folder.is_dir():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def load(self, generation: int) -> Applied:
        """One applied policy."""
        return _load(self._applied() / f"{generation}.json", Applied.from_json)

    def current(self) -> Applied | None:
        """The policy live now (the newest kept), or None."""
        kept = self.generations()
        return self.load(kept[-1]) if kept else None

    def live(self) -> Applied | None:
        """:meth:`current`, for an operation on this network namespace's devices under the
        name: OpsError where it, or a change of it under way, was applied in another
        namespace (found by a tester: 'down' run in another namespace deleted that one's
        qdiscs on a device of the same name, and forgot the policy still live where it was
        applied)."""
        applied = self.current()
        for record in (applied, self.applying()):
            if record is not None and not record.here:
                raise OpsError(elsewhere(self.name, record.netns))
        return applied

    def record(
        self,
        path: str,
        sources: Mapping[str, str],
        devices: tuple[str, ...],
        classids: Mapping[str, Mapping[str, str]],
        ifbs: tuple[str, ...] = (),
        taken: tuple[str, ...] = (),
    ) -> Applied:
        """Remember a policy as applied (the newest), dropping all but the last KEEP."""
        kept = self.generations()
        number = (kept[-1] + 1) if kept else 1
        applied = Applied(
            number, path, sources, devices, time.time(), classids, os.getcwd(), this_netns(),
            ifbs, taken,
        )  # fmt: skip
        write_json(self._applied() / f"{applied.generation}.json", applied.to_json())
        for old in kept[: max(0, len(kept) + 1 - KEEP)]:
            self.forget(old)
        self.finish()
        return applied

    def write_extra(self, generation: int, kind: str, data: object) -> None:
        """Keep more about a generation (``trees``: what it built; ``kernel``: the kernel's
        digest after it), dropped with it."""
        write_json(self._applied() / f"{generation}.{kind}.json", data, indent=None)

    def read_extra(self, generation: int, kind: str) -> Any:
        """What :meth:`write_extra` kept, or None (none kept, or unreadable)."""
        try:
            text = (self._applied() / f"{generation}.{kind}.json").read_text(encoding="utf-8")
            return json.loads(text)
        except (OSError, ValueError, RecursionError):
            return None

    def start(self, path: str, sources: Mapping[str, str], devices: tuple[str, ...],
              classids: Mapping[str, Mapping[str, str]],
              ifbs: tuple[str, ...] = (), taken: tuple[str, ...] = ()) -> None:  # fmt: skip
        """Note an apply under way (until :meth:`record` or :meth:`finish`): a later command
        that finds it knows the kernel may hold part of it."""
        applied = Applied(
            0,
            path,
            sources,
            devices,
            time.time(),
            classids,
            os.getcwd(),
            this_netns(),
            ifbs,
            taken,
        )
        write_json(self.folder / "applying.json", applied.to_json())

    def rewrite(self, applied: Applied) -> None:
        """Write a kept generation's record again, as ``applied`` now says it."""
        write_json(self._applied() / f"{applied.generation}.json", applied.to_json())

    def start_again(self, applied: Applied) -> None:
        """Note a change back to ``applied`` under way (a rollback), as :meth:`start` does:
        its record as it is (its folder and namespace kept), as generation 0."""
        again = dataclasses.replace(applied, generation=0, applied_at=time.time())
        write_json(self.folder / "applying.json", again.to_json())

    def applying(self) -> Applied | None:
        """The apply a killed command left under way, if any (generation 0)."""
        try:
            return _load(self.folder / "applying.json", Applied.from_json)
        except FileNotFoundError:
            return None

    def finish(self) -> None:
        """No apply is under way any more."""
        (self.folder / "applying.json").unlink(missing_ok=True)

    def forget(self, generation: int) -> None:
        """Drop one generation (a rollback drops the one it leaves) and what it kept."""
        (self._applied() / f"{generation}.json").unlink(missing_ok=True)
        for extra in self._applied().glob(f"{generation}.*.json"):
            extra.unlink(missing_ok=True)

    def pending(self) -> Pending | None:
        """The apply waiting for ``confirm``, if any."""
        try:
            return _load(self.folder / "pending.json", _pending)
        except FileNotFoundError:
            return None

    def timer_failed(self) -> str | None:
        """Why the ``--confirm`` timer could not roll back (it ran detached, with no one to
        tell), until the wait ends (:meth:`set_pending`); None if it did not fail."""
        try:
            return (self.folder / TIMER_FAILED).read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def set_timer_failed(self, why: str, partial: bool = False) -> None:
        """Keep why the ``--confirm`` timer could not roll back; ``partial``: nor could it
        build the policy it rolled back from again (the kernel holds part of each)."""
        text = why + "\n" + (f"{TIMER_PARTIAL}\n" if partial else "")
        (self.folder / TIMER_FAILED).write_text(text, encoding="utf-8")

    def timer_rolled(self) -> str | None:
        """What the ``--confirm`` timer rolled back, in words (:meth:`set_timer_rolled`),
        until the next wait (:meth:`set_pending`); None if it did not."""
        try:
            return (self.folder / TIMER_ROLLED).read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def set_timer_rolled(self, what: str) -> None:
        """Keep what the ``--confirm`` timer rolled back (it ran detached, with no one to
        tell)."""
        (self.folder / TIMER_ROLLED).write_text(what + "\n", encoding="utf-8")

    def timer_left_partial(self) -> bool:
        """Whether the ``--confirm`` timer's failed rollback left the kernel holding neither
        policy whole (see :meth:`set_timer_failed`)."""
        why = self.timer_failed()
        return why is not None and why.endswith(f"\n{TIMER_PARTIAL}")

    def timer_lock(self, generation: int) -> Path:
        """The file whose lock the ``--confirm`` timer of ``generation`` holds while it lives
        (the kernel lets go of it when the timer dies, however it dies)."""
        return self.folder / f"timer-{generation}.lock"

    def timer_gone(self) -> Pending | None:
        """The wait whose deadline passed (a second ago or more) with no timer left to roll
        it back (killed: by hand, the OOM killer, a logind session cleanup), and no failure
        of its kept; else None."""
        pending = self.pending()
        if pending is None or time.time() < pending.deadline + TIMER_GRACE:
            return None
        if self.timer_failed() is not None or is_held(self.timer_lock(pending.generation)):
            return None
        return pending

    def set_pending(self, pending: Pending | None) -> None:
        """Start (or with None, end) waiting for ``confirm``; a timer's failure is then
        forgotten."""
        (self.folder / TIMER_FAILED).unlink(missing_ok=True)
        (self.folder / TIMER_ROLLED).unlink(missing_ok=True)
        for lock in self.folder.glob("timer-*.lock"):  # a killed timer's
            if not is_held(lock):
                lock.unlink(missing_ok=True)
        path = self.folder / "pending.json"
        if pending is None:
            path.unlink(missing_ok=True)
            return
        write_json(path, {"generation": pending.generation, "previous": pending.previous,
                      "deadline": pending.deadline})  # fmt: skip

    @classmethod
    def every(cls, root: Path | None = None) -> Iterator[Store]:
        """The state of every policy name there is, by name."""
        root = root or state_dir()
        try:
            folders = sorted(root.iterdir()) if root.is_dir() else []
        except OSError:  # not ours to read (a user's classify): no state to speak of
            folders = []
        for folder in folders:
            if valid_name(folder.name) and folder.is_dir():
                yield cls(folder.name, root)

    @classmethod
    def taken_ifbs(cls) -> frozenset[str]:
        """The IFBs some policy shapes on that it did not make (:attr:`Applied.taken`), by
        the live record of each name or its change under way, in this network namespace
        (another's devices of that name are others); a damaged record has none."""
        found: set[str] = set()
        for store in cls.every():
            for read in (store.current, store.applying):
                with contextlib.suppress(OpsError):
                    if (applied := read()) is not None and applied.here:
                        found.update(applied.taken)
        return frozenset(found)

    def remove(self) -> None:
        """Forget the name entirely (``down``)."""
        for path in sorted(self.folder.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        if self.folder.exists():
            self.folder.rmdir()
