"""The text ``tcdsl import`` reads: what ``tc`` shows of one device, from the kernel or a file.

The format is the concatenated output of ``tc [-d] qdisc show dev X``, ``tc [-d] class show dev
X`` and ``tc filter show dev X [parent P]`` (any order; ``-d`` shows more: htb quanta, size
tables). Each line's first word tells what it is (``qdisc``, ``class``, ``filter``); indented
lines belong to the line above (a filter's keys and actions, a size table); ``#`` lines and
blank lines are skipped. A filter line names its parent with ``parent P`` as ``tc filter show
dev X`` prints it; ``tc filter show dev X parent P`` leaves it out, and the filter is then taken
to be on the qdisc whose major number its flowid has (``ffff:`` for the ingress qdisc's).

The objects are parsed by :mod:`tcdsl.verify.readback`, the one parser of tc's text; this
module only splits the text into located chunks and reads it from a live kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from tcdsl.ir import CLSACT_INGRESS
from tcdsl.ops.live import (
    device_exists,
    filter_listings,
    filters_of,
    top_qdiscs,
    tx_queue_count,
    tx_queue_len,
)
from tcdsl.verify.readback import (
    TcClass,
    TcFilter,
    TcQdisc,
    parse_classes,
    parse_filters,
    parse_qdiscs,
)

TC_TIMEOUT = 60
"""Seconds one ``tc ... show`` may take."""


@dataclass(frozen=True, slots=True)
class DeviceText:
    """What tc shows of one device, and the name diagnostics give its text."""

    device: str
    source: str
    """``FILE`` or ``tc:DEVICE`` (the live kernel), as diagnostics name it."""
    text: str
    qlen: int | None = None
    """The device's txqueuelen, read with the live state (None from a file): the length
    htb gives its direct queue when made without one."""
    tx_in_use: int | None = None
    """The device's TX queues in use, read with the live state (None from a file)."""
    raw: bool = False
    """The text is tc's as read here, without ``-p``: a u32 node shown without keys has none
    (in a file, it may be ``tc -p``'s, which leaves some keys out)."""


@dataclass(frozen=True, slots=True)
class FilterEntry:
    """A filter of the text, where it was, and what its lines say beyond the readback's."""

    filter: TcFilter
    line: int
    parent: str | None
    """The parent its line names, or None (tc leaves it out when asked for one parent)."""
    head: tuple[str, ...]
    """The words of its first line."""


@dataclass
class DeviceObjects:
    """The qdiscs, classes and filters of one device's text, each with its line number."""

    qdiscs: list[tuple[TcQdisc, int]] = field(default_factory=list)
    classes: list[tuple[TcClass, int]] = field(default_factory=list)
    filters: list[FilterEntry] = field(default_factory=list)
    hash_tables: list[tuple[str, int]] = field(default_factory=list)
    """u32 hash tables made by hand (a divisor above 1): the line, and its number."""
    unknown: list[tuple[str, int]] = field(default_factory=list)
    """Lines that are none of the above."""


def _after(words: list[str] | tuple[str, ...], key: str) -> str | None:
    for i, word in enumerate(words[:-1]):
        if word == key:
            return words[i + 1]
    return None


def chunks(text: str) -> Iterator[tuple[int, list[str]]]:
    """Each unindented line with the indented lines below it, and its line number."""
    current: tuple[int, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[:1].isspace():
            if current is not None:
                current[1].append(line)
            continue
        if current is not None:
            yield current
        current = (number, [line])
    if current is not None:
        yield current


def objects(text: str) -> DeviceObjects:
    """Split ``text`` into located qdiscs, classes and filters (parsed by the readback)."""
    out = DeviceObjects()
    for number, lines in chunks(text):
        words = lines[0].split()
        block = "\n".join(lines)
        match words[0]:
            case "qdisc":
                out.qdiscs += [(q, number) for q in parse_qdiscs(block)]
            case "class":
                out.classes += [(c, number) for c in parse_classes(block)]
            case "filter":
                divisor = _after(words, "divisor")
                if divisor is not None and divisor.isdigit() and int(divisor) > 1:
                    out.hash_tables.append((lines[0].strip(), number))
                parent = _after(words, "parent")
                out.filters += [
                    FilterEntry(f, number, parent, tuple(words)) for f in parse_filters(block)
                ]
            case _:
                out.unknown.append((lines[0].strip(), number))
    return out


def with_parent(parent: str, text: str) -> str:
    """``tc filter show dev X parent P``'s text with ``parent P`` written into each filter
    line, as ``tc filter show dev X`` prints it."""
    out = []
    for line in text.splitlines():
        if line.startswith("filter ") and " parent " not in line:
            line = f"filter parent {parent} {line[len('filter ') :]}"
        out.append(line)
    return "".join(f"{line}\n" for line in out)


class ReadError(Exception):
    """The configuration could not be read; ``code`` is the diagnostic's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _tc(*args: str) -> str:
    """Run ``tc ARGS`` and return its output; ReadError when it fails."""
    tc = shutil.which("tc")
    if tc is None:
        raise ReadError("E608", "there is no 'tc' here (iproute2) to read the live state with")
    try:
        done = subprocess.run(
            [tc, *args],
            capture_output=True,
            text=True,
            timeout=TC_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ReadError("E608", f"'tc {' '.join(args)}' failed: {err}") from None
    if done.returncode != 0:
        message = done.stderr.strip() or f"exit {done.returncode}"
        raise ReadError("E608", f"'tc {' '.join(args)}' failed: {message}")
    return done.stdout


def read_live(device: str) -> DeviceText:
    """What the kernel holds for ``device``: its qdiscs and classes (``tc -d``), and the
    filters of every qdisc and class, each line naming its parent. ReadError (E602) when
    there is no such device."""
    if not device_exists(device):
        raise ReadError("E602", f"there is no network interface '{device}' here")
    qdiscs = _tc("-d", "qdisc", "show", "dev", device)
    classes = _tc("-d", "class", "show", "dev", device)
    parents: list[str] = []
    for q in parse_qdiscs(qdiscs):
        if q.handle != "0:":
            parents.append(filters_of(q.kind, q.handle))
            if q.kind == "clsact":  # its ingress hook's too (an mq tree's has none)
                parents.append(str(CLSACT_INGRESS))
    parents += [c.classid for c in parse_classes(classes)]
    unique = list(dict.fromkeys(parents))
    filters = "".join(
        with_parent(p, text)
        for p, text in zip(unique, filter_listings(device, unique, top_qdiscs(qdiscs)), strict=True)
    )
    text = qdiscs + classes + filters
    in_use = tx_queue_count(device)[1]
    return DeviceText(device, f"tc:{device}", text, tx_queue_len(device), in_use, raw=True)


def read_file(path: str, device: str) -> DeviceText:
    """The saved text of ``device`` in ``path`` (``-``: standard input, as for compile; found
    by a tester: it was a file named '-'); ReadError (E605) when it cannot be read."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(64 * 1024 * 1024 + 1)
            path = "<stdin>"
        else:
            with open(path, "rb") as f:
                data = f.read(64 * 1024 * 1024 + 1)
    except OSError as err:
        raise ReadError("E605", f"cannot read '{path}': {err.strerror or err}") from None
    if len(data) > 64 * 1024 * 1024:
        raise ReadError("E605", f"cannot read '{path}': more than 64 MiB of tc text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        message = f"cannot read '{path}': not UTF-8 text (byte {err.start})"
        raise ReadError("E605", message) from None
    if "\0" in text:
        raise ReadError("E605", f"cannot read '{path}': it holds a NUL byte (not tc's text)")
    return DeviceText(device, path, text)
