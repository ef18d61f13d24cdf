"""Policy text from files: the one place that reads and decodes a policy, for the compiler,
``tcdsl fmt`` and ``tcdsl check``, so that they all read the same text.

- Only regular files (after symlinks) are read, at most ``MAX_POLICY_BYTES``; a device, FIFO
  or socket is refused before it is opened, and the file is opened without blocking.
- The text is strict UTF-8 without NUL bytes; anything else is refused with the place of the
  first bad byte and without showing the content (it may not be a policy at all).
- CR LF and a lone CR are line breaks, as LF (``normalise_newlines``); nothing else is.
- ``Access`` says where ``include`` (and a directory walk) may read: inside the main policy's
  directory tree, unless the user allows more.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import BinaryIO

from tcdsl.diagnostics import Diagnostic, Note, Span

MAX_POLICY_BYTES = 8 * 1024 * 1024
"""The largest policy file tcdsl reads (8 MiB: a 10,000-class policy takes about 600 KiB)."""


class SourceError(Exception):
    """A file that cannot be a policy: ``code`` and ``message`` for a diagnostic, and the
    ``(line, column)`` of the problem inside the file when it has one."""

    def __init__(self, code: str, message: str, position: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.position = position


def source_diagnostic(err: SourceError, path: str, include_span: Span | None = None) -> Diagnostic:
    """The diagnostic for a file that is not policy text, at the bad byte when there is one
    (its content is never shown: such a file is not among the sources), else at
    ``include_span`` or the file's start."""
    if err.position is None:
        return Diagnostic.error(err.code, err.message, include_span or Span(path, 1, 1, 1, 1))
    line, column = err.position
    notes = (Note("included here", include_span),) if include_span else ()
    return Diagnostic.error(
        err.code, err.message, Span(path, line, column, line, column + 1), *notes
    )


@dataclass(frozen=True, slots=True)
class Access:
    """Where a policy's includes may read: below the main policy's directory, below ``roots``,
    or (``anywhere``) any regular file."""

    roots: tuple[str, ...] = ()
    anywhere: bool = False

    def allows(self, path: str, tree: str) -> bool:
        """Whether ``path`` (after symlinks) lies below the directory ``tree`` or a root."""
        if self.anywhere:
            return True
        real = os.path.realpath(path)
        return any(_below(real, os.path.realpath(root)) for root in (tree, *self.roots))

    @staticmethod
    def refusal(path: str, tree: str) -> str:
        """Why ``path`` may not be read, for a message that starts with the path."""
        real = os.path.realpath(path)
        where = f"'{path}'" if real == os.path.abspath(path) else f"'{path}' (a link to '{real}')"
        return (
            f"{where}: it lies outside '{tree}', and policies read only files below their "
            "own directory (allow more with --include-path DIR or --allow-include-anywhere)"
        )


def _below(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def normalise_newlines(text: str) -> str:
    """``text`` with CR LF and lone CR turned into LF: the only line breaks of the language."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def decode_policy(data: bytes, kind: str = "policy") -> str:
    """Decode a policy's bytes (or a ``kind`` of file read as policies are, a "table"):
    strict UTF-8, no NUL (newlines are left as they are, for ``normalise_newlines``).

    Raises ``SourceError`` (E022) at the line and column of the first bad byte.
    """
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        # Excel's "Unicode text", Windows' "Unicode": a UTF-16 byte-order mark
        raise SourceError(
            "E022",
            f"this file is UTF-16 text (it starts with UTF-16's byte-order mark); tcdsl reads "
            f"{kind} files as UTF-8: save it again as UTF-8"
            + (" (in Excel, 'CSV UTF-8')" if kind == "table" else ""),
            (1, 1),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _position(data[: err.start].decode("utf-8"))
        raise SourceError(
            "E022",
            f"this file is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}, "
            f"column {column}); tcdsl reads {kind} files as UTF-8",
            (line, column),
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line, column = _position(text[:nul])
        raise SourceError(
            "E022",
            f"this file holds a NUL byte (at line {line}, column {column}): it is not {kind} text",
            (line, column),
        )
    # Some editors (Notepad) start UTF-8 files with a byte-order mark: it is no text.
    return text.removeprefix("\ufeff")


def _position(before: str) -> tuple[int, int]:
    """The 1-based (line, column) just after ``before``, counting lines as the lexer does."""
    before = normalise_newlines(before)
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _not_regular(path: str, mode: int, kind: str = "policy") -> SourceError:
    return SourceError("E024", f"'{path}' is {_kind(mode)}; a {kind} must be a regular file")


def _too_large(path: str, size: int | None, limit: int, kind: str = "policy") -> SourceError:
    what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return SourceError(
        "E025", f"'{path}' is {what}; tcdsl reads {kind} files of at most {limit} bytes"
    )


def read_policy_bytes(path: str, limit: int = MAX_POLICY_BYTES, kind: str = "policy") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``kind``: what the
    file is to the messages, "policy" or "table").

    Raises ``SourceError`` for a file that is not regular or too large, ``OSError`` when the
    file cannot be read. Never blocks on a FIFO or a device, never reads more than ``limit + 1``
    bytes (``/proc`` files claim a size of 0).
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, kind)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced between stat and open
            raise _not_regular(path, info.st_mode, kind)
        if info.st_size > limit:
            raise _too_large(path, info.st_size, limit, kind)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise _too_large(path, None, limit, kind)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_stream(stream: BinaryIO, limit: int = MAX_POLICY_BYTES) -> str:
    """The policy text of ``stream`` (standard input), read as ``read_policy`` reads a file."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise _too_large("<stdin>", None, limit)
    return decode_policy(data)


def read_policy(path: str) -> str:
    """The text of the policy file ``path`` (``read_policy_bytes``, then ``decode_policy``);
    raises ``SourceError`` or ``OSError``."""
    return decode_policy(read_policy_bytes(path))
