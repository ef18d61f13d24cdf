"""Subscriber tables: ``subscribers from "FILE.csv" [where ...] [options] [{ leaf }]``.

A table is an ISP's list of shaped devices in the layout of LibreQoS's ``ShapedDevices.csv``
(``Circuit ID, Circuit Name, Device ID, Device Name, Parent Node, MAC, IPv4, IPv6, Download
Min Mbps, Upload Min Mbps, Download Max Mbps, Upload Max Mbps, Comment``): one row per device,
the rows of one circuit id one subscriber. Each selected circuit becomes an ordinary htb class
(its rate from the direction's Min column, its ceil from its Max column, the statement's options
and leaf qdisc), with one ``match`` per device on its addresses (destination on a download,
source on an upload), so everything after the frontend sees only classes and match lines.

- The file is read as a policy is (``tcdsl.frontend.source``: a regular file below the policy's
  tree, strict UTF-8) up to ``MAX_TABLE_BYTES``, once per run however many statements read it,
  and split into cells by the csv module; nothing of it goes through the policy's parser.
- Every generated node has the ``Span`` of its cell (``FILE:LINE:COL``), so diagnostics show
  the row with a caret under the cell. A file whose header lacks the table's columns is not
  shown at all (it may not be a table).
- A row with an error is left out (its error taints the statement that reads it).
- The tree's direction (upload, download) is known only once its interface is parsed: the
  frontend puts a placeholder class where the statement is (``Pending``) and ``expand``
  replaces it by the classes when the tree is built.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Literal

from tcdsl import ir
from tcdsl.addresses import ipv4_network, ipv6_network
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.frontend.source import (
    SourceError,
    decode_policy,
    normalise_newlines,
    read_policy_bytes,
    source_diagnostic,
)
from tcdsl.frontend.syntax import Param, QdiscSyntax, suggestion
from tcdsl.frontend.values import Bin, Expr, Lit, Ref
from tcdsl.lower import address_text
from tcdsl.units import Dimension

if TYPE_CHECKING:
    from tcdsl.frontend.builder import Builder
    from tcdsl.frontend.qdiscs import QdiscBuilder

MAX_TABLE_BYTES = 64 * 1024 * 1024
"""The largest table tcdsl reads (64 MiB; a 50,000-row ShapedDevices.csv takes about 7 MiB)."""

MAX_TABLE_ERRORS = 50
"""Errors reported per table; the rest are counted in one more."""

Direction = Literal["upload", "download"]

COLUMNS: dict[str, tuple[str, ...]] = {
    "circuit_id": ("circuitid",),
    "circuit_name": ("circuitname",),
    "device_id": ("deviceid",),
    "device_name": ("devicename",),
    "parent_node": ("parentnode", "parent"),
    "mac": ("mac",),
    "ipv4": ("ipv4",),
    "ipv6": ("ipv6",),
    "download_min": ("downloadmin", "downloadminmbps"),
    "upload_min": ("uploadmin", "uploadminmbps"),
    "download_max": ("downloadmax", "downloadmaxmbps"),
    "upload_max": ("uploadmax", "uploadmaxmbps"),
    "comment": ("comment",),
}
"""The columns tcdsl knows, by the name ``where`` uses, and the spellings of a header that
name them (lower case, letters and digits only: ``Download Min Mbps`` is ``downloadminmbps``),
as LibreQoS reads them."""

REQUIRED = ("circuit_id", "download_min", "upload_min", "download_max", "upload_max")
RATES = ("download_min", "download_max", "upload_min", "upload_max")
_MIN_MAX = (("download", "download_min", "download_max"), ("upload", "upload_min", "upload_max"))
MBPS = 1_000_000
MIN_RATE_BITS = 8
"""The least rate tc keeps: it holds rates in bytes a second."""
MAX_MBPS = 34_359_738
"""tc keeps rates as 32-bit bytes/s unless told otherwise: 34.36 gbit (34,359,738 Mbps is far
above; the checks say what tc takes)."""

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]+")
_COMPACT = re.compile(r"[^a-z0-9]+")


def compact(name: str) -> str:
    """A column's name as tables and ``where`` match it: lower case, letters and digits."""
    return _COMPACT.sub("", name.lower())


_ALIASES = {alias: key for key, aliases in COLUMNS.items() for alias in aliases}


# ---- the table -------------------------------------------------------------------------------


@dataclass(slots=True)
class Circuit:
    """One subscriber: the rows (devices) with one circuit id; the cells of its first row
    give its rates and parent node."""

    key: str
    name: str
    """Its class name: the circuit id made a name, unique in the table."""
    span: Span
    """The circuit id's cell in its first row."""
    rates: dict[str, Decimal | int]
    """Mbps by column name (``download_min``, ...)."""
    parent: str | None
    first: _Place
    """Where its first row's cells are, for the spans of its rates."""
    title: str | None = None
    """Its first row's Circuit Name (printable; None where empty or there is no column)."""


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a row's cells are: its file, first and last line, the cells and their starts."""

    path: str
    first: int
    last: int
    width: int
    cells: list[str]
    starts: tuple[int, ...]
    escaped: tuple[int, ...] = ()
    """The quoted cells whose text holds a '"' (two in the file, '""')."""

    def span(self, index: int, offset: int = 0, length: int | None = None) -> Span:
        """The span of cell ``index`` (from ``offset``, ``length`` characters of its text), or
        of the row's end for a cell the row lacks."""
        if self.first == self.last and index < len(self.starts):  # most spans: one line
            col = self.starts[index] + offset
            n = len(self.cells[index]) if length is None else length
            if index in self.escaped:  # (found by a tester: a column short per '""' before)
                cell = self.cells[index]
                col += cell.count('"', 0, offset)
                n += cell.count('"', offset, offset + n)
            return Span(self.path, self.first, col, self.first, col + (n or 1))
        if index >= len(self.starts):
            return Span(self.path, self.last, self.width, self.last, self.width + 1)
        dl, col = divmod(self.starts[index], LINE_STEP)
        n = max(1, len(self.cells[index]) if length is None else length)
        cell = self.cells[index]
        line_from = 0  # where the span's line starts in the cell's text
        if self.first != self.last:  # a record over several lines: a cell may be too
            if offset and "\n" in cell[:offset]:  # on a later line of the cell
                dl += cell.count("\n", 0, offset)
                line_from = cell.rfind("\n", 0, offset) + 1
                col, offset = 1, offset - line_from
            if length is None and "\n" in cell:  # the whole cell: its part on its first line
                n = max(1, cell.index("\n"))
        if index in self.escaped:
            at = line_from + offset
            col += cell.count('"', line_from, at)
            n += cell.count('"', at, at + n)
        col += offset
        return Span(self.path, self.first + dl, col, self.first + dl, col + n)


@dataclass(slots=True)
class Row:
    """One device: its cells, its circuit, and its addresses with their spans."""

    line: int
    cells: list[str]
    circuit: Circuit
    networks: tuple[tuple[ir.Network, Span], ...]
    span: Span
    """From its first address to its last (the row's start when it has none)."""
    order: int = 0
    """Its place among the table's good rows."""


@dataclass(slots=True)
class Table:
    """A table read from ``path``: its columns (by compact name) and its good rows."""

    path: str
    headers: list[str]
    columns: dict[str, int]
    commas: int = 0
    """The commas a line needs to reach every required column: a line inside a quoted cell
    with that many is most likely rows swallowed by a quote left open."""
    read: int = 0
    """The cells a row needs to reach every column tcdsl reads (:data:`COLUMNS`): a row with
    fewer is refused (E039)."""
    rows: list[Row] = field(default_factory=list)
    lengths: set[tuple[str, int]] = field(default_factory=set)
    """(family, prefix length) of its addresses: one length a family, no overlap."""
    indexes: dict[int, dict[str, list[Row]]] = field(default_factory=dict)
    """The rows by the value of a column, for the columns ``where ==`` has used."""
    errors: int = 0
    """How many errors its rows had."""

    def index(self, column: int) -> dict[str, list[Row]]:
        """The rows by their (stripped) value in ``column``, in table order."""
        found = self.indexes.get(column)
        if found is None:
            found = self.indexes[column] = {}
            for row in self.rows:
                value = row.cells[column].strip() if column < len(row.cells) else ""
                found.setdefault(value, []).append(row)
        return found


@dataclass(slots=True)
class _Reading:
    """The state of reading one table: the diagnostics it reports, capped."""

    path: str
    text: str
    note: Note
    diagnostics: list[Diagnostic]
    errors: int = 0
    warnings: int = 0
    shown: bool = False
    """Whether its lines may be shown though it is not read (its header is a table's)."""

    def error(self, code: str, message: str, span: Span, *notes: Note) -> None:
        self.errors += 1
        if self.errors <= MAX_TABLE_ERRORS:
            self.diagnostics.append(Diagnostic.error(code, message, span, *notes, self.note))

    def warning(self, code: str, message: str, span: Span) -> None:
        self.warnings += 1
        if self.warnings <= MAX_TABLE_ERRORS:
            self.diagnostics.append(Diagnostic.warning(code, message, span))


def table_key(path: str, tree: str | None) -> str:
    """The name of the table at ``path`` in its circuits' digests: its path from the policy's
    folder (``tree``), '/'-separated, which moving the folder keeps and which tells apart two
    tables of one file name in different folders (found by a tester: with the file name
    alone they had one digest, and which of two same-id circuits got ``_2`` depended on the
    statements' order). A table in the policy's own folder is its file name, as before."""
    rel = os.path.relpath(os.path.normpath(path), tree or ".")
    return rel.replace(os.sep, "/")


def read_table(b: Builder, path: str, at: Span) -> Table | None:
    """The table at ``path`` (relative to the policy file already resolved), read once per
    run; None (after reporting why) when it cannot be used."""
    reader = b.reader
    real = os.path.realpath(path)
    if real in reader.tables:
        table = reader.tables[real]
        if table is None or table.errors:
            # Reported where a statement first read it; this one is left as empty (or
            # without the rows in error), so what later stages would say of it (W311, no
            # packet reaches its parent) is not said.
            how = "cannot be used" if table is None else "has errors"
            msg = f"table '{path}' {how} (reported where it is first read)"
            reader.follow_ons.append(Diagnostic.error("E027", msg, at))
        return table
    reader.tables[real] = None
    tree = reader.tree or "."
    if not reader.access.allows(path, tree):
        msg = f"cannot read table {reader.access.refusal(path, tree)}"
        b.error(Diagnostic.error("E023", msg, at))
        return None
    saved = reader.table_loader(path) if reader.table_loader is not None else None
    try:
        text = normalise_newlines(
            saved
            if saved is not None
            else decode_policy(read_policy_bytes(path, MAX_TABLE_BYTES, "table"), "table")
        )
    except SourceError as err:
        found = source_diagnostic(err, path, at)
        notes = tuple(Note("in the table read here", n.span) for n in found.notes)
        b.error(dataclasses.replace(found, notes=notes))
        return None
    except OSError as err:
        reason = (err.strerror or str(err)).lower()
        b.error(Diagnostic.error("E027", f"cannot read table '{path}': {reason}", at))
        return None
    reading = _Reading(path, text, Note("in the table read here", at), reader.diagnostics)
    table = _parse(reading, at)
    if table is not None or reading.shown:
        reader.sources[path] = text
    if table is not None:
        table.errors = reading.errors
        if reading.errors > MAX_TABLE_ERRORS:
            more = reading.errors - MAX_TABLE_ERRORS
            msg = (
                f"{more} more error(s) in table '{path}' are not shown (the first "
                f"{MAX_TABLE_ERRORS} are)"
            )
            said = Diagnostic.error("E038", msg, at)
            reader.diagnostics.append(dataclasses.replace(said, hidden=more))
        if reading.warnings > MAX_TABLE_ERRORS:
            more = reading.warnings - MAX_TABLE_ERRORS
            msg = f"{more} more device(s) of table '{path}' have no address"
            said = Diagnostic.warning("W372", msg, at)
            reader.diagnostics.append(dataclasses.replace(said, hidden=more))
    reader.tables[real] = table
    return table


def _records(text: str) -> Iterator[tuple[int, int, list[str]]]:
    """(first line, last line, cells) of each record of ``text``; a line starting with ``#``
    where a record would start is a comment, read as an empty record before any quote in it
    is looked at (as LibreQoS's reader does: a stray quote in a comment must not swallow the
    rows after it). Last, for a record the csv module refuses: (its first line, 0, [why])."""
    # A cell may be as long as the table (the csv module stops at 128 KiB by default).
    csv.field_size_limit(max(csv.field_size_limit(), MAX_TABLE_BYTES))
    if _QUOTED_COMMENT.search(text):
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        lines_state = _Lines(lines)
        state: _Lines | None = lines_state
        source: Iterable[str] = lines_state
    else:  # no comment holds a quote: the csv module reads the text itself, line breaks kept
        state = None
        source = io.StringIO(text)
    rows = csv.reader(source, strict=False)
    end = 0
    while True:
        try:
            cells = next(rows)
        except StopIteration:
            return
        except csv.Error as err:  # none is known with strict=False and the limit raised
            yield end + 1, 0, [str(err).lower()]
            return
        start, end = end + 1, rows.line_num
        if state is not None:
            state.at_start = True
        yield start, end, cells


def _comment(line: str) -> bool:
    """Whether a record starting on ``line`` is a comment: the line starts with '#' (a quoted
    cell that does, ``"#42 Main St"``, is none)."""
    return line.lstrip().startswith("#")


_QUOTED_COMMENT = re.compile(r'^[ \t]*#[^\n]*"', re.MULTILINE)


class _Lines:
    """The lines of a table for the csv module, a comment line (at a record's start) given as
    an empty line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = iter(lines)
        self.at_start = True

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        if self.at_start and _comment(line):
            return "\n"
        self.at_start = False
        # with its line break, which a quoted cell that goes on keeps (without, "a\nb" is "ab")
        return line + "\n"


_EXCEL_SEPARATOR = re.compile(r"[ \t]*sep=.[ \t]*", re.IGNORECASE)
"""``sep=,``: the first line Excel writes to name a CSV file's separator."""


def _parse(reading: _Reading, at: Span) -> Table | None:
    path = reading.path
    records = _records(reading.text)
    lines = reading.text.split("\n")
    header: list[str] | None = None
    header_line = 0
    for first, last, cells in records:
        if not last:  # the csv module refused the text before a header
            break
        if first == 1 and last == 1 and _EXCEL_SEPARATOR.fullmatch(lines[0]):
            continue  # Excel's line naming the separator, before the header
        if any(c.strip() for c in cells) and not _comment(lines[first - 1]):
            header = cells
            header_line = first if first == last else 0
            break
    if header is None:
        msg = f"table '{path}' has no header row; tcdsl reads ShapedDevices.csv's columns"
        reading.diagnostics.append(Diagnostic.error("E028", msg, at))
        return None
    columns: dict[str, int] = {}
    twice = False
    for i, name in enumerate(header):
        key = compact(name)
        column = _ALIASES.get(key, key)
        if column in COLUMNS and column in columns:
            # a second IPv4 (say) would be dropped without a word: its addresses never matched
            msg = (
                f"table '{path}' has two columns '{header[columns[column]].strip()}' and "
                f"'{name.strip()}' for {column}: tcdsl would read only the first; "
                + (
                    "merge them (a cell holds several addresses, separated by commas)"
                    if column in ("ipv4", "ipv6")
                    else "remove or rename one"
                )
            )
            _header_error(reading, at, header_line, header, msg, i, columns[column])
            twice = True  # every such pair said at once (found by a tester: the first only)
        columns.setdefault(column, i)
    if twice:
        return None
    for i, name in enumerate(header if all(k in columns for k in REQUIRED) else ()):
        # A header LibreQoS reads by position but tcdsl by name: its addresses would be
        # dropped without a word, and every packet of theirs go to the default class.
        key = compact(name)
        family = _address_family(key, columns) if _ALIASES.get(key, key) not in COLUMNS else None
        if family is not None:
            shown = "IPv4" if family == "ipv4" else "IPv6"
            msg = (
                f"table '{path}' has no column {shown} but a column '{name.strip()}', which "
                f"tcdsl does not read (it reads columns by their names, and its addresses "
                f"would match nothing): name it '{shown}'"
                + (", or split it into IPv4 and IPv6" if key in _IP_NAMES else "")
            )
            _header_error(reading, at, header_line, header, msg, i)
            return None
    missing = [k for k in REQUIRED if k not in columns]
    if "ipv4" not in columns and "ipv6" not in columns:
        missing.append("ipv4 or ipv6")
    if missing:
        # Its rows are not shown: a file without a table's header may hold anything.
        msg = (
            f"table '{path}' has no column {', '.join(missing)}; its header must name Circuit "
            "ID, IPv4 and/or IPv6, and Download/Upload Min/Max Mbps (as ShapedDevices.csv)"
        )
        if len(header) == 1:  # a spreadsheet's CSV in a locale whose decimal mark is ','
            other = next((name for c, name in _SEPARATORS if c in header[0]), None)
            if other is not None:
                msg += f"; its first row holds no comma but {other}: separate cells by commas"
        reading.diagnostics.append(Diagnostic.error("E028", msg, at))
        return None
    table = Table(
        path,
        header,
        columns,
        commas=max(columns[k] for k in REQUIRED),
        read=1 + max(i for k, i in columns.items() if k in COLUMNS),
    )
    circuits: dict[str, Circuit] = {}
    names: dict[str, int] = {}
    wide: list[Span] = []  # where the first cell past the header with text is, per such row
    final: tuple[int, int, list[str]] | None = None  # the last row read
    for first, last, cells in records:
        if not last:
            msg = f"table '{path}' cannot be read as CSV from here: {cells[0]}"
            reading.error("E028", msg, Span(path, first, 1, first, 2))
            break
        if not "".join(cells).strip() or _comment(lines[first - 1]):
            continue
        row = _row(reading, table, first, last, cells, lines, circuits, names)
        if row is not None:
            row.order = len(table.rows)
            table.rows.append(row)
            final = (first, last, cells)
            if len(cells) > len(header):
                past = next((i for i in range(len(header), len(cells)) if cells[i].strip()), None)
                if past is not None:
                    wide.append(
                        _place(path, first, last, lines, cells).span(past) if not wide else at
                    )
    if final is not None and _ends_file_unbroken(final[1], lines):
        _cut_short(reading, table, lines, *final)
    if wide:
        many = f"{len(wide)} rows have" if len(wide) > 1 else "a row has"
        reading.warning(
            "W373",
            f"{many} text past the header's {len(header)} columns (the first here), which is "
            "not read: a comma in a cell that is not quoted shifts the cells after it; quote "
            'such a cell ("Smith, J"), or name the extra column in the header',
            wide[0],
        )
    return table


_SHAPING = frozenset({"circuit_id", "parent_node", "ipv4", "ipv6", *RATES})
"""The columns whose cells decide how a subscriber is shaped."""


def _ends_file_unbroken(last: int, lines: list[str]) -> bool:
    """Whether a record ending on line ``last`` ends the file with no line break after it
    (``lines``: the text split at line breaks)."""
    return last == len(lines) and lines[-1] != ""


def _cut_short(
    reading: _Reading, table: Table, lines: list[str], first: int, last: int, cells: list[str]
) -> None:
    """W382 when the file ends in its last row without a line break and that row's last
    cell is one that shapes (found by a review: a table without a Comment column, cut while
    it was written, read '20' as '2' with every cell there, which E039 cannot see)."""
    index = len(cells) - 1
    column = next((k for k, i in table.columns.items() if i == index), None)
    if column not in _SHAPING or not cells[index].strip():
        return
    reading.warning(
        "W382",
        f"the table ends in this row without a line break, and its last cell "
        f"({table.headers[index].strip()}) decides how the subscriber is shaped: a table read "
        "while it was being written may have it cut ('20' read as '2'); end the file with a "
        "line break (and write the table whole before tcdsl reads it)",
        _place(table.path, first, last, lines, cells).span(index),
    )


_IP_NAMES = frozenset({"ip", "ips", "ipaddress", "ipaddresses", "ipaddr", "addresses"})
"""Headers of a column of addresses of no family."""


def _address_family(name: str, columns: Mapping[str, int]) -> str | None:
    """The family whose column the header lacks and whose addresses a column of another name
    (compacted) seems to hold: the ``ipv4`` or ``ipv6`` its name has, or either family for
    one of no family (``IP Address``); None if it is not such a column."""
    if name in _IP_NAMES:
        return next((f for f in ("ipv4", "ipv6") if f not in columns), None)
    for family in ("ipv4", "ipv6"):
        if family in name and family not in columns:
            return family
    return None


def _header_error(
    reading: _Reading,
    at: Span,
    header_line: int,
    header: list[str],
    msg: str,
    index: int,
    first: int | None = None,
) -> None:
    """E028 at the header's cell ``index`` (with a note at the cell ``first``), or at the
    statement ``at`` when the header spans lines."""
    if not header_line:
        reading.diagnostics.append(Diagnostic.error("E028", msg, at))
        return
    raw = reading.text.split("\n", header_line)[header_line - 1]
    place = _Place(reading.path, header_line, header_line, len(raw) + 1, header,
                   *_cell_starts(raw, header))  # fmt: skip
    reading.shown = True
    notes = (Note("the first", place.span(first)),) if first is not None else ()
    reading.error("E028", msg, place.span(index), *notes)


def _place(path: str, first: int, last: int, lines: list[str], cells: list[str]) -> _Place:
    """Where the cells of the record on lines ``first`` to ``last`` are."""
    raw = lines[first - 1] if first == last else "\n".join(lines[first - 1 : last])
    return _Place(path, first, last, len(lines[last - 1]) + 1, cells, *_cell_starts(raw, cells))


_SEPARATORS = ((";", "';'"), ("\t", "tabs"), ("|", "'|'"))
"""Other cell separators a header may use, and how E028 names them."""

LINE_STEP = MAX_TABLE_BYTES + 1
"""A cell's start is ``line offset * LINE_STEP + column`` (one int a cell): no column of a
table (at most ``MAX_TABLE_BYTES``) reaches it."""


def _cell_starts(raw: str, cells: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where each of ``cells`` starts in ``raw`` (its record's lines), as ``LINE_STEP`` says:
    a quoted cell takes its quotes and doubled quotes more than its text; and the quoted
    cells whose text holds a '"' (:attr:`_Place.escaped`)."""
    if '"' not in raw and cells:  # most rows: the cells and the commas between them
        return tuple(accumulate([len(cell) + 1 for cell in cells[:-1]], initial=1)), ()
    escaped: list[int] = []
    if "\n" not in raw:
        starts, at = [], 0
        for i, cell in enumerate(cells):
            if raw.startswith('"', at):  # "text", with each " inside doubled
                starts.append(at + 2)
                at += len(cell) + cell.count('"') + 3
                if '"' in cell:
                    escaped.append(i)
            else:
                starts.append(at + 1)
                at += len(cell) + 1
        return tuple(starts), tuple(escaped)
    starts = []
    at = 0
    before = line_start = counted = 0  # line breaks in raw[:counted]; where its last line starts
    for i, cell in enumerate(cells):
        if raw.startswith('"', at):
            begin = at + 1
            at = begin + len(cell) + cell.count('"') + 1
            if '"' in cell:
                escaped.append(i)
        else:
            begin = at
            at += len(cell)
        breaks = raw.count("\n", counted, begin)  # from the last cell on: linear in the record
        if breaks:
            before += breaks
            line_start = raw.rfind("\n", counted, begin) + 1
        counted = begin
        starts.append(before * LINE_STEP + begin - line_start + 1)
        at = raw.find(",", at)
        if at < 0:
            break
        at += 1
    return tuple(starts), tuple(escaped)


def _row(
    reading: _Reading,
    table: Table,
    first: int,
    last: int,
    cells: list[str],
    lines: list[str],
    circuits: dict[str, Circuit],
    names: dict[str, int],
) -> Row | None:
    path = reading.path
    place = _place(path, first, last, lines, cells)
    span = place.span
    columns = table.columns
    n_cells = len(cells)
    # A record whose cells line up with the header and that ends with its last cell, quoted
    # over lines as written, is what the csv module (and LibreQoS) read: row-like lines in
    # that quote are its text (found by a tester: a Comment quoting old rows was refused).
    # Not a quote left open that a later row's quoted cell happens to close (found by a
    # review: rows 2 and 3 went, without a word).
    closed = False
    if first != last and n_cells == len(table.headers) and "\n" in cells[-1]:
        quoted = '"' + cells[-1].replace('"', '""') + '"'
        closed = "\n".join(lines[first - 1 : last]).rstrip(" \t").endswith(quoted)
    # Nor one closed by a quote that ends a row of its own, as text (found by a tester:
    # 'Dish 18"' at the end of a later row's Comment closed a quote left open, and the rows
    # between went, without a word).
    stray = first != last and _ends_in_a_quote_as_text(lines[last - 1], table.commas)
    if first != last and (not closed or stray):
        # A quote left open reads the rows after it as one cell's text: a line inside the
        # record without a quote, with the commas of a row, is most likely one of them.
        inside = [n for n in range(first, last) if _row_like(lines[n], table.commas)]
        inside += [last - 1] if stray else []
        if inside:
            opening = lines[first - 1].rfind('"') + 1
            hint = (
                f"; line {last} ends in the quote read as closing it: a quote meant as text "
                'is written doubled (18"")'
                if stray
                else ""
            )
            reading.error(
                "E035",
                f"a quoted cell runs on from here over {last - first} line(s), "
                f"{len(inside)} of which look like rows of the table (line {inside[0] + 1} "
                f"first): is its closing quote missing? (they are not read as rows){hint}",
                Span(path, first, max(opening, 1), first, max(opening, 1) + 1),
            )
            return None
    # A row cut short: most often a table read while its writer was still at it (a CRM
    # export, a cron job), whose last cell may be cut too ('20' read as '2'); LibreQoS refuses
    # a row short of its 13 columns as well (found by a tester: it was shaped with the cut
    # value). A row that only lacks columns past those tcdsl reads is cut if the file ends in it.
    cut = n_cells < len(table.headers) and _ends_file_unbroken(last, lines)
    if n_cells < table.read or cut:
        why = (
            "the file ends in this row without a line break: was it read while being written?"
            if cut
            else "is a cell missing, or the row cut short?"
        )
        reading.error(
            "E039",
            f"this row has {n_cells} cells and the header {len(table.headers)}: {why} "
            "(a row needs every column, empty or not, as LibreQoS reads it)",
            span(n_cells),
        )
        return None
    # A row whose cells do not line up with the header: say so with its first error.
    width: tuple[Note, ...] | None = None if n_cells != len(table.headers) else ()
    ok = True
    key_index = columns["circuit_id"]
    # (a byte order mark inside the file: two exports joined; it is no part of the id)
    key = cells[key_index].strip().lstrip("\ufeff") if key_index < n_cells else ""
    if not key:
        reading.error(
            "E028",
            "this row has no circuit id",
            span(key_index),
            *_width(width, place, n_cells, table),
        )
        return None
    rates: dict[str, Decimal | int] = {}
    for name in RATES:
        index = columns[name]
        text = cells[index] if index < n_cells else ""
        value = _mbps(text)
        if value is None or value > MAX_MBPS:
            shown = f"'{text.strip()}'" if text.strip() else "an empty cell"
            why = (
                f"expected a number of Mbps (such as 25 or 2.5), found {shown}"
                if value is None
                else f"{shown} Mbps is more than tcdsl takes ({MAX_MBPS:,} Mbps)"
            )
            reading.error(
                "E030",
                f"{table.headers[index]}: {why}",
                span(index),
                *_width(width, place, n_cells, table),
            )
            width = ()
            ok = False
        else:
            rates[name] = value
    for direction, min_name, max_name in _MIN_MAX:
        low, high = rates.get(min_name), rates.get(max_name)
        if low is not None and high is not None and low > high:
            reading.error(
                "E031",
                f"{direction} min {low} Mbps is above its max {high} Mbps; a class's rate "
                "cannot be above its ceil",
                span(columns[max_name]),
                Note("the min is here", span(columns[min_name])),
                *_width(width, place, n_cells, table),
            )
            width = ()
            ok = False
    parent_index = columns.get("parent_node", n_cells)
    parent = cells[parent_index].strip() if parent_index < n_cells else None
    networks: list[tuple[ir.Network, Span]] = []
    lengths = table.lengths
    for family in ("ipv4", "ipv6"):
        index = columns.get(family, n_cells)
        if index >= n_cells or not cells[index]:
            continue
        text = cells[index]
        if "," not in text and text.strip() == text:  # one address, the common case
            net = _network(text, family)
            if not isinstance(net, str):
                networks.append((net, span(index)))
                lengths.add((family, net.prefixlen))
                continue
        offset = 0
        for piece in text.split(","):
            where = offset + len(piece) - len(piece.lstrip())
            offset += len(piece) + 1
            # blanks inside an address are dropped, as LibreQoS does ('100.64.0.1 /32')
            address = "".join(piece.split())
            if not address:
                continue
            at = span(index, where, len(piece.strip()))
            net = _network(address, family)
            if isinstance(net, str):
                what = "IPv4" if family == "ipv4" else "IPv6"
                other = "ipv6" if family == "ipv4" else "ipv4"
                why = net or (
                    f"is an {'IPv6' if family == 'ipv4' else 'IPv4'} address, in the "
                    f"{table.headers[index]} column: put it in the "
                    f"{'IPv6' if family == 'ipv4' else 'IPv4'} one"
                    if not isinstance(_network(address, other), str)
                    else f"is not a valid {what} address or network ({table.headers[index]} "
                    f"holds {what} addresses and prefixes, separated by commas)"
                )
                shown = piece.strip()  # as written: '100.64.0.1 100.64.0.2', not '...1100...'
                reading.error("E029", f"'{shown}' {why}", at, *_width(width, place, n_cells, table))
                width = ()
                ok = False
                continue
            networks.append((net, at))
            lengths.add((family, net.prefixlen))
    if not ok:
        return None
    circuit = circuits.get(key)
    if circuit is None:
        name = _unique_name(circuit_name(key), names)
        title_index = columns.get("circuit_name", n_cells)
        title = printable(cells[title_index]) if title_index < n_cells else None
        circuit = Circuit(key, name, span(key_index), rates, parent, place, title)
        circuits[key] = circuit
    elif not _agree(reading, table, circuit, place, rates, parent):
        return None
    if not networks:
        reading.warning(
            "W372",
            f"device of circuit '{key}' has no IPv4 or IPv6 address: no traffic is matched for it",
            span(key_index),
        )
        row_span = span(key_index)
    else:
        row_span = _addresses_span(networks)
    return Row(first, cells, circuit, tuple(networks), row_span)


def printable(text: str) -> str | None:
    """A cell as text to show on a terminal: blanks at the ends dropped, each control
    character (an escape sequence's ESC among them) as '?'; None for an empty cell."""
    text = text.strip()
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "?" for c in text)
    return text or None


def _addresses_span(
    networks: Sequence[tuple[ir.Network, Span]],
) -> Span:
    """From a row's first address to its last, when they are on one line; else the first."""
    head, tail = networks[0][1], networks[-1][1]
    if head.line != tail.line:
        return head
    return Span(head.file, head.line, head.column, head.line, tail.end_column)


def _width(
    width: tuple[Note, ...] | None, place: _Place, n_cells: int, table: Table
) -> tuple[Note, ...]:
    """The note that a row has another number of cells than the header (``width`` None),
    for its first error; ``width`` itself otherwise."""
    if width is not None:
        return width
    return (
        Note(f"this row has {n_cells} cells and the header {len(table.headers)}", place.span(0)),
    )


def _row_like(line: str, commas: int) -> bool:
    """Whether a line inside a quoted cell reads as a row of its own: the commas of a row,
    and not the end of a quoted cell. The last line of a cell that does run over lines closes
    it with a quote followed by the comma before the next cell (``Smith, J",1,...``) or by
    the line's end; a row's quotes open cells (``2,"Smith, J",...``), are doubled in them, or
    stand inside an unquoted cell (``2,Dish 12" pole,...``)."""
    if line.count(",") < commas:
        return False
    at = line.find('"')
    while at >= 0 and line.startswith('""', at):
        at = line.find('"', at + 2)
    if at < 0:
        return True
    after = line[at + 1 :].lstrip(" \t")
    return not (after == "" or after.startswith(","))


def _ends_in_a_quote_as_text(line: str, commas: int) -> bool:
    """Whether the line that closes a quoted cell reads as a row of its own whose last cell,
    unquoted, ends in a quote as text (``4,100.64.0.4,...,Dish 18"``): the commas of a row, and
    no other quote but doubled ones."""
    body = line.rstrip(" \t")
    if not body.endswith('"') or body.count(",") < commas:
        return False
    return '"' not in body[:-1].replace('""', "")


def _agree(
    reading: _Reading,
    table: Table,
    circuit: Circuit,
    place: _Place,
    rates: dict[str, Decimal | int],
    parent: str | None,
) -> bool:
    """Whether another row of ``circuit`` gives the same rates and parent (E032 if not)."""
    ok = True
    for name, value in rates.items():
        first = circuit.rates[name]
        if value != first:
            what = name.replace("_", " ")
            index = table.columns[name]
            reading.error(
                "E032",
                f"circuit '{circuit.key}' has {what} {first} Mbps in its first row and {value} "
                "here; the rows of a circuit are one subscriber, with one set of rates",
                place.span(index),
                Note("the first row's is here", circuit.first.span(index)),
            )
            ok = False
    if parent is not None and circuit.parent is not None and parent != circuit.parent:
        index = table.columns["parent_node"]
        reading.error(
            "E032",
            f"circuit '{circuit.key}' has parent node '{circuit.parent}' in its first row "
            f"and '{parent}' here; a circuit hangs from one node",
            place.span(index),
            Note("the first row's is here", circuit.first.span(index)),
        )
        ok = False
    return ok


_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?", re.ASCII)


def _mbps(text: str) -> Decimal | int | None:
    """A number of Mbps (a whole number, or a decimal kept exact; ``1e3`` as Python's
    ``float``, which LibreQoS reads them with, takes it), or None."""
    if text.isdigit() and text.isascii() and len(text) <= 30:
        return int(text)
    text = text.strip()
    if not text or len(text) > 30 or not _NUMBER.fullmatch(text):
        return None
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() else value


def _network(text: str, family: str) -> ir.Network | str:
    """``text`` as an IPv4 or IPv6 network, or why not: a message for one with host bits
    set, which LibreQoS refuses as well ('' for one that does not parse). The socket module
    parses the common forms at twice ``ipaddress``'s speed."""
    address, slash, length = text.partition("/")
    if not slash or (length.isdigit() and length.isascii() and len(length) <= 3):
        bits = int(length) if slash else None
        try:
            if family == "ipv4":
                packed = socket.inet_pton(socket.AF_INET, address)
                # inet_pton takes leading zeros (010.0.0.1), which ipaddress refuses.
                if socket.inet_ntop(socket.AF_INET, packed) == address and (bits or 0) <= 32:
                    whole = int.from_bytes(packed, "big")
                    if bits is not None and whole & ((1 << (32 - bits)) - 1):
                        return _host_bits(ipaddress.IPv4Network((whole, bits), False), address)
                    return ipv4_network(whole, 32 if bits is None else bits)
            elif "%" not in address:
                packed = socket.inet_pton(socket.AF_INET6, address)
                if (bits or 0) <= 128:
                    whole = int.from_bytes(packed, "big")
                    if bits is not None and whole & ((1 << (128 - bits)) - 1):
                        return _host_bits(ipaddress.IPv6Network((whole, bits), False), address)
                    six = ipv6_network(whole, 128 if bits is None else bits)
                    return _mapped(six) if whole >> 32 == 0xFFFF else six
        except OSError:
            pass
    try:
        net: ir.Network
        if family == "ipv4":
            net = ipaddress.IPv4Network(text, strict=False)
        else:
            net = ipaddress.IPv6Network(text, strict=False)
    except ValueError:
        return ""
    if "%" in address:  # ipaddress takes a zone (fe80::1%eth0), which no filter matches
        zone = address[address.index("%") :]
        return f"has a zone ('{zone}'), which a filter cannot match: write the address without it"
    if slash and ipaddress.ip_address(address) != net.network_address:
        return _host_bits(net, address)
    return _mapped(net) if isinstance(net, ipaddress.IPv6Network) else net


def _mapped(net: ipaddress.IPv6Network) -> ipaddress.IPv6Network | str:
    """``net``, or why not when it is IPv4-mapped (``::ffff:100.64.0.1``): no IPv6 packet
    carries such an address (a socket sends IPv4 to it), so its filter would never match."""
    v4 = ir.mapped_ipv4(net)
    if v4 is None:
        return net
    return (
        f"is an IPv4-mapped IPv6 address, which no IPv6 packet carries (a socket sends IPv4 "
        f"to it): write {address_text(v4)} in the IPv4 column"
    )


def _host_bits(net: ir.Network, address: str) -> str:
    return (
        f"has host bits set: write the network, {net}, or one host, "
        f"{address}/{net.max_prefixlen} (LibreQoS refuses it too)"
    )


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_C_NUMBER = re.compile(r"c[0-9]+", re.ASCII)
_DIGESTED = re.compile(r".*_[0-9a-f]{10}", re.ASCII)
"""The form of a name :func:`circuit_name` makes with a digest (a literal id of that form
gets one too, so that it never takes another id's name)."""


def circuit_name(key: str) -> str:
    """The class name of the circuit id ``key``, which depends on the id alone (so that a
    subscriber keeps its class, and its counters, whatever other rows come and go): an id
    that is a name already as it is (``north_7``); ``c`` and a numeric id (``c1001``); else the
    id made a name (letters, digits and ``_``, starting with a letter) and a digest of the id,
    which tells apart ids that make the same name (``a-b``, ``a b``: ``a_b_3f09c1d2e5``,
    ``a_b_8a6e0b4c17``). An id of the form ``c1001`` or ``a_b_3f09c1d2e5`` is one of the
    last kind: those are other ids' names."""
    if key.isascii() and key.isdigit():
        return "c" + key
    if _WORD.fullmatch(key) and not _C_NUMBER.fullmatch(key) and not _DIGESTED.fullmatch(key):
        return key
    base = _NOT_NAME.sub("_", key).strip("_") or "circuit"
    if not base[0].isalpha() or not base.isascii():
        base = "c" + base if base[0].isdigit() else "c_" + base
    return f"{base}_{hashlib.blake2s(key.encode(), digest_size=5).hexdigest()}"


def _unique_name(base: str, names: dict[str, int]) -> str:
    """A class name from ``base`` (a :func:`circuit_name`: letters, digits and ``_``, so no
    generated word ever needs quoting, starting with a letter), unique among ``names``: the
    base itself, or ``base_N`` with the smallest N from 2 that is free (a written class's
    name, or a digest's collision). ``names`` maps each name taken to the N to try first
    when it is a base again (every smaller one is taken), in linear time however many."""
    n = names.get(base)
    if n is None:
        names[base] = 2
        return base
    while f"{base}_{n}" in names:
        n += 1
    name = f"{base}_{n}"
    names[base] = n + 1
    names[name] = 2
    return name


# ---- the statement ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Where:
    """``where COND and ...``: (column, its span, ``==``, values) each."""

    conditions: list[tuple[str, Span, bool, list[str]]]
    span: Span


@dataclass(frozen=True, slots=True)
class Condition:
    """``COLUMN == "a", "b"`` (or ``!=``) in a ``where``."""

    column: int
    equal: bool
    values: frozenset[str]


@dataclass(frozen=True, slots=True)
class SubscribersSyntax:
    """``subscribers [upload|download] from "FILE" [where ...] [options] [{ leaf }]``, with its
    table read and its rows selected (None: an error was reported)."""

    span: Span
    direction: Direction | None
    table: Table | None
    rows: tuple[Row, ...]
    where_column: int | None
    """The column of the first ``where`` condition (the one W371 names)."""
    opts: tuple[Any, ...]
    body: tuple[Any, ...]
    pref: ir.Count | None = None
    """The pref of every match line the statement makes."""


RateSpec = tuple[Literal["min", "max"], Fraction] | ir.Rate | ir.Percent


@dataclass(frozen=True, slots=True)
class Pending:
    """A statement's template, to expand when its tree's direction is known."""

    syntax: SubscribersSyntax
    rate: RateSpec
    ceil: RateSpec
    fields: dict[str, Any]
    leaf: ir.Qdisc | None


SHOWN_COLUMNS = 30
"""How many of a table's columns E033 lists (an export may have hundreds)."""


def select(
    b: Builder, table: Table, conditions: list[tuple[str, Span, bool, list[str]]], at: Span
) -> tuple[tuple[Row, ...], int | None, bool]:
    """The rows of ``table`` that meet every condition (column, its span, ``==``, values);
    the first condition's column; False after reporting an unknown column or no row."""
    parsed: list[Condition] = []
    ok = True
    for column, span, equal, values in conditions:
        key = compact(column)
        index = table.columns.get(_ALIASES.get(key, key))
        if index is None:
            names = where_names(table)
            shown = ", ".join(names[:SHOWN_COLUMNS])
            if len(names) > SHOWN_COLUMNS:
                shown += f" and {len(names) - SHOWN_COLUMNS} more"
            b.error(
                Diagnostic.error(
                    "E033",
                    f"table '{table.path}' has no column '{column}'{suggestion(column, names)}; "
                    f"'where' takes {shown}",
                    span,
                )
            )
            ok = False
            continue
        # compared with the cells as they are read: without blanks at their ends
        parsed.append(Condition(index, equal, frozenset(v.strip() for v in values)))
    if not ok:
        return (), None, False
    first_column = parsed[0].column if parsed else None
    candidates: list[Row] = table.rows
    chosen = next((c for c in parsed if c.equal), None)
    if chosen is not None:
        # Each site's statement takes its rows from an index, not from a walk of the table.
        by_value = table.index(chosen.column)
        found = [r for value in sorted(chosen.values) for r in by_value.get(value, ())]
        if len(chosen.values) > 1:
            found.sort(key=lambda r: r.order)
        candidates = found
        parsed.remove(chosen)
    rows = tuple(r for r in candidates if all(_meets(r, c) for c in parsed))
    if not rows and not table.errors:  # (rows with errors are left out, and reported)
        what = "meets this condition" if conditions else "is left: the table is empty"
        hint = ""
        if chosen is not None and not candidates:  # a value no row has: a misspelling?
            present = table.index(chosen.column)
            if len(present) <= MAX_SUGGESTED:
                hint = suggestion(min(chosen.values), present)
        b.error(
            Diagnostic.error(
                "E034",
                f"no row of table '{table.path}' {what}{hint}; the statement would make no class",
                at,
            )
        )
        return (), None, False
    return rows, first_column, True


MAX_SUGGESTED = 1_000
"""E034 suggests a value of the column when it has at most this many (a parent node's, not a
circuit id's)."""


def where_names(table: Table) -> list[str]:
    """The names ``where`` takes for ``table``'s columns: tcdsl's for the columns it knows
    (``parent_node``), the compacted header for the others."""
    known = {index: key for key, index in table.columns.items() if key in COLUMNS}
    return [known.get(i, compact(h)) for i, h in enumerate(table.headers)]


def _meets(row: Row, cond: Condition) -> bool:
    value = row.cells[cond.column].strip() if cond.column < len(row.cells) else ""
    return (value in cond.values) == cond.equal


def _copied_alike(b: Builder, leaf: ir.Qdisc) -> bool:
    """E270 (and True) for what the leaf of a subscribers statement names: it is made again
    for each subscriber, so a handle or a class written in it would be the same in every
    copy (and reported as used twice at itself)."""
    for q in ir.walk_qdiscs(leaf):
        if q.explicit_handle is not None:
            msg = (
                "the leaf qdisc of a subscribers statement is made for each subscriber and "
                "numbered by tcdsl; a 'handle' would give them all one"
            )
            b.error(Diagnostic.error("E270", msg, q.explicit_handle.span))
            return True
        for cls in ir.classes_of(q):
            msg = (
                f"the leaf qdisc of a subscribers statement is made for each subscriber: its "
                f"class '{cls.name}' would be made again, under the same name, in every one; "
                "leave classes out of the leaf (each subscriber is a class already)"
            )
            b.error(Diagnostic.error("E270", msg, cls.head))
            return True
    return False


def template(
    b: Builder,
    syn: SubscribersSyntax,
    common: dict[str, Any],
    rate: Param | None,
    ceil: Param | None,
    leaf: QdiscSyntax | None,
) -> Pending:
    """The template of a statement: its rate and ceil (the Min and Max columns unless given),
    the class options every subscriber shares, its leaf qdisc."""
    return Pending(
        syn,
        _rate_spec(b, rate, "min"),
        _rate_spec(b, ceil, "max"),
        common,
        leaf.qdisc if leaf is not None else None,
    )


def _rate_spec(b: Builder, param: Param | None, default: Literal["min", "max"]) -> RateSpec:
    """``rate``/``ceil`` of a template: ``min`` or ``max`` (the direction's column), either
    times or divided by a number, or a value every subscriber gets."""
    if param is None:
        return default, Fraction(1)
    value: Expr = param.value
    factor = Fraction(1)
    if (
        isinstance(value, Bin)
        and value.op in ("*", "/")
        and isinstance(value.right, Lit)
        and isinstance(value.left, Ref)
        and value.left.name in ("min", "max")
    ):
        number = Fraction(value.right.number)
        if value.op == "/" and not number:
            b.error(Diagnostic.error("E013", "division by zero", value.right.span))
            return default, Fraction(1)
        if not number:  # one error here, not two for every subscriber
            msg = (
                f"{param.key} {value.left.name} * 0 is 0bit for every subscriber; a rate "
                "must be above 0"
            )
            b.error(Diagnostic.error("E208", msg, value.right.span))
            return default, Fraction(1)
        factor = number if value.op == "*" else 1 / number
        value = value.left
    if isinstance(value, Ref) and value.name in ("min", "max"):
        return value.name, factor  # type: ignore[return-value]
    if _mentions_column(value):
        b.error(
            Diagnostic.error(
                "E270",
                f"{param.key} takes min or max (the table's Min or Max Mbps of the direction), "
                "either times or divided by a number, or a rate every subscriber gets",
                param.value.span,
            )
        )
        return default, Fraction(1)
    from tcdsl.frontend.qdiscs import QdiscBuilder

    fixed = QdiscBuilder(b, "htb", param.span, (), None)._value(param, Dimension.RATE, True)
    if fixed is None:
        return default, Fraction(1)
    return fixed  # type: ignore[no-any-return]


def _mentions_column(expr: Expr) -> bool:
    if isinstance(expr, Ref):
        return expr.name in ("min", "max")
    if isinstance(expr, Bin):
        return _mentions_column(expr.left) or _mentions_column(expr.right)
    return False


@dataclass(slots=True)
class LeftOut:
    """What a tree of one family leaves out of a statement's rows (``family ipv4`` on a
    dual-stack table): the other family's addresses, and the devices with none of its own."""

    addresses: int = 0
    devices: int = 0
    first: Span | None = None


def expand(
    pending: Pending,
    direction: Direction,
    name: Callable[[Circuit], str | None],
    family: ir.FamilySpec | None = None,
    left_out: LeftOut | None = None,
) -> list[tuple[Circuit, ir.Class]]:
    """The classes of a statement for a tree of ``direction``, with their circuits; ``name``
    gives a circuit's class name in the tree (None: leave the circuit out). A tree of one
    ``family`` matches its addresses alone; what it leaves out is counted in ``left_out``."""
    syn = pending.syntax
    assert syn.table is not None
    columns = syn.table.columns
    field_: Literal["src", "dst"] = "dst" if direction == "download" else "src"
    by_circuit: dict[int, list[Row]] = {}
    circuits: list[Circuit] = []
    for row in syn.rows:
        rows = by_circuit.get(id(row.circuit))
        if rows is None:
            by_circuit[id(row.circuit)] = rows = []
            circuits.append(row.circuit)
        rows.append(row)
    leaf = pending.leaf
    rate = _rate(pending.rate, direction, columns)
    ceil = _rate(pending.ceil, direction, columns)
    pref = syn.pref
    fields = pending.fields
    classes = []
    only = family.families[0] if family is not None and len(family.families) == 1 else None
    for circuit in circuits:
        class_name = name(circuit)
        if class_name is None:
            continue
        rows = by_circuit[id(circuit)]
        if only is not None:
            rows = [_of_family(row, only, left_out) for row in rows]
        matches = tuple(
            ir.Match((ir.AddrCond(field_, row.networks, row.span),), row.span, pref)
            for row in rows
            if row.networks
        )
        made = ir.Class(
            class_name,
            circuit.span,
            rate=rate(circuit),
            ceil=ceil(circuit),
            matches=matches,
            leaf=ir.replace(leaf) if leaf is not None else None,
            from_table=True,
            title=circuit.title,
            **fields,
        )
        classes.append((circuit, made))
    return classes


def _of_family(row: Row, family: ir.Family, left_out: LeftOut | None) -> Row:
    """``row`` with the addresses of ``family`` alone, counting what goes in ``left_out``."""
    kept = tuple(n for n in row.networks if ir.family_of(n[0]) == family)
    if len(kept) == len(row.networks):
        return row
    if left_out is not None:
        left_out.addresses += len(row.networks) - len(kept)
        left_out.devices += not kept
        if left_out.first is None:
            left_out.first = next(span for n, span in row.networks if ir.family_of(n) != family)
    if not kept:
        return dataclasses.replace(row, networks=())
    return dataclasses.replace(row, networks=kept, span=_addresses_span(kept))


def _rate(
    spec: RateSpec, direction: Direction, columns: dict[str, int]
) -> Callable[[Circuit], ir.Rate | ir.Percent]:
    """What a circuit's rate (or ceil) is in the classes of ``direction``."""
    if isinstance(spec, ir.Rate | ir.Percent):
        return lambda circuit: spec
    column, factor = spec
    name = f"{direction}_{column}"
    index = columns[name]
    one = factor == 1

    def rate(circuit: Circuit) -> ir.Rate:
        value = circuit.rates[name]
        bits = int(value * MBPS) if one else int(Fraction(value) * MBPS * factor)
        return ir.Rate(bits, circuit.first.span(index))

    return rate


def expand_tree(
    b: Builder,
    qdisc: ir.Qdisc,
    direction: Direction | None,
    device: str,
    marking: ir.Marking | None = None,
    family: ir.FamilySpec | None = None,
    label: str = "",
) -> ir.Qdisc:
    """``qdisc`` with the placeholders of its statements replaced by their classes (a
    statement's own ``upload``/``download`` wins over the tree's ``direction``; None: the
    egress of ``device``, which says neither, E272); warns (W371) about the rows of a table
    the tree reads that none of its statements takes. ``marking``: the tree's ``classify by
    mark``, whose fw filters' pref is that of the lines without one. ``family``: the tree's,
    whose addresses alone its classes match (W363 once for what that leaves out). ``label``:
    the tree's (``Builder.spread_root``)."""
    expander = _Expander(b, direction, device, _class_names(b, qdisc), family)
    result = b.spread_root(expander.walk(qdisc), label)
    for syn, left in expander.left_out:
        b.reader.diagnostics.append(_other_family(syn, left, family))
    for syn, earlier, count, circuit in expander.conflicts.values():
        b.error(_taken_twice(syn, earlier, count, circuit))
    for table, rows, statements in expander.taken.values():
        split = _split_circuits(b, table, rows, statements)
        _unshaped(b, table, rows | split, statements)
    # addresses can only hold one another where a family has two prefix lengths
    lengths = set().union(*(table.lengths for table, _, _ in expander.taken.values()))
    if expander.made and len(lengths) > len({version for version, _ in lengths}):
        _longest_prefix_first(b, result, expander.made, expander.circuits, marking)
    return result


def _other_family(
    syn: SubscribersSyntax, left: LeftOut, family: ir.FamilySpec | None
) -> Diagnostic:
    """W363 for the addresses of a statement's rows that its tree's family leaves out."""
    assert family is not None and left.first is not None
    (only,) = family.families
    other = "IPv6" if only == "ipv4" else "IPv4"
    none = (
        f"; {left.devices} device(s) have no {'IPv4' if only == 'ipv4' else 'IPv6'} address "
        "and are not matched"
        if left.devices
        else ""
    )
    return Diagnostic.warning(
        "W363",
        f"{left.addresses} {other} address(es) of the table are left out: this tree classifies "
        f"{'IPv4' if only == 'ipv4' else 'IPv6'} only{none}",
        syn.span,
        Note(f"the first {other} address", left.first),
        Note("the tree's family", family.span),
    )


def _taken_twice(
    syn: SubscribersSyntax, earlier: SubscribersSyntax, count: int, circuit: Circuit
) -> Diagnostic:
    what = (
        f"circuit '{circuit.key}' is"
        if count == 1
        else f"{count} circuits (first '{circuit.key}') are"
    )
    mine = [r for r in syn.rows if r.circuit is circuit]
    theirs = [r for r in earlier.rows if r.circuit is circuit]
    if mine and theirs and not {id(r) for r in mine} & {id(r) for r in theirs}:
        # Exclusive conditions on a column the circuit's rows (devices) differ in: the
        # advice to make them exclusive would not help.
        return Diagnostic.error(
            "E037",
            f"{what} split between two subscribers statements of this tree (the first took "
            f"its row at line {theirs[0].line}, this one its row at line {mine[0].line}); a "
            "subscriber is one class: make the 'where' conditions take all of a circuit's "
            "rows or none (on a column its rows share, such as the parent node)",
            syn.span,
            Note("the circuit's row this statement takes is here", mine[0].span),
            Note("the statement that took it first is here", earlier.span),
        )
    return Diagnostic.error(
        "E037",
        f"{what} taken by two subscribers statements of this tree; a subscriber is one "
        "class: make the statements' 'where' conditions exclusive",
        syn.span,
        Note("the circuit's row is here", circuit.span),
        Note("the statement that took it first is here", earlier.span),
    )


def _tree_classes(b: Builder, qdisc: ir.Qdisc) -> Iterator[ir.Class]:
    """The classes of the tree of ``qdisc`` (and of a tree an mq of it spreads once
    expanded), the statements' stand-ins among them."""
    trees = [qdisc]
    trees += [b.unspread[id(q)][1] for q in ir.walk_qdiscs(qdisc) if id(q) in b.unspread]
    return (c for t in trees for q in ir.walk_qdiscs(t) for c in ir.classes_of(q))


def _class_names(b: Builder, qdisc: ir.Qdisc) -> dict[str, Span]:
    """The names of the classes written in the tree of ``qdisc``, with where each is."""
    return {c.name: c.span for c in _tree_classes(b, qdisc) if c.name}


class _Expander:
    """The walk of ``expand_tree``: methods rather than closures calling each other, which
    would make a reference cycle (only the collector, off while compiling, frees one) holding
    the tables' rows and the tree as built."""

    def __init__(
        self,
        b: Builder,
        direction: Direction | None,
        device: str,
        written: dict[str, Span],
        family: ir.FamilySpec | None = None,
    ) -> None:
        self.b, self.direction, self.device, self.family = b, direction, device, family
        self.written = written
        """The classes written in the tree, by name."""
        self.too_small = 0
        """The rates below what tc keeps of the statement expanded now (E030, capped)."""
        self.left_out: list[tuple[SubscribersSyntax, LeftOut]] = []
        """What each statement's rows lose to the tree's family."""
        self.taken: dict[str, tuple[Table, set[int], list[SubscribersSyntax]]] = {}
        self.names = set(written)
        """The class names of the tree: the written ones, then each subscriber's."""
        self.made: dict[int, Circuit] = {}
        """The subscribers' classes (by id) and their circuits."""
        self.circuits: dict[int, SubscribersSyntax] = {}
        """The statement that took each circuit (by id)."""
        self.syntax: SubscribersSyntax | None = None
        self.first_table: str | None = None
        """The table of the tree's first statement (by path): its circuits' names are their
        ids' alone; other tables' carry a digest of the table's file name."""
        self.conflicts: dict[
            tuple[int, int], tuple[SubscribersSyntax, SubscribersSyntax, int, Circuit]
        ] = {}
        """(statement, the earlier one that took its circuits) -> (how many, the first)."""

    def name(self, circuit: Circuit) -> str | None:
        """The class name of ``circuit`` in this tree: its own, or, when a written class or
        another table's circuit has that, its own followed by a digest of its table and id;
        None (E037) when an earlier statement of the tree took the circuit already."""
        syn = self.syntax
        assert syn is not None
        earlier = self.circuits.get(id(circuit))
        if earlier is not None:
            key = (id(syn), id(earlier))
            _, _, count, first = self.conflicts.get(key, (syn, earlier, 0, circuit))
            self.conflicts[key] = (syn, earlier, count + 1, first)
            return None
        self.circuits[id(circuit)] = syn
        name = circuit.name
        # The circuits of every table but the tree's first are named with their table, whether
        # or not an id is in two (found by a tester: a row added to one table took the name,
        # and so the class and counters, of another table's circuit of the same id).
        other = syn.table is not None and syn.table.path != self.first_table
        if name in self.names or other:
            if name in self.written and not other:
                # (a table's circuits but the first's are digested whatever the written
                # classes: no rename to warn of, found by a review)
                self._renamed(circuit, syn)
            # A suffix made of the row alone (found by a tester: with '_2', '_3'... a circuit
            # whose id is 'north_2', added, took the name, class and counters of the one
            # that had it). No circuit id makes a name of the digested form itself.
            table = table_key(syn.table.path, self.b.reader.tree) if syn.table is not None else ""
            tag = hashlib.blake2s(f"{table}\n{circuit.key}".encode(), digest_size=5)
            name = base = f"{circuit.name}_{tag.hexdigest()}"
            n = 1
            while name in self.names:  # (a digest's collision)
                n += 1
                name = f"{base}_{n}"
        self.names.add(name)
        return name

    def _renamed(self, circuit: Circuit, syn: SubscribersSyntax) -> None:
        """W378: a written class has the name a circuit would have (found by a tester: the
        subscriber was renamed without a word, and ``status --class c1001`` showed the
        written class; the next apply made its class again, its counters from 0)."""
        table = table_key(syn.table.path, self.b.reader.tree) if syn.table else "its table"
        self.b.error(
            Diagnostic.warning(
                "W378",
                f"class '{circuit.name}' has the name of circuit {circuit.key!r} of {table}, "
                "whose class is named with a digest instead (status --class "
                f"{circuit.name} shows this class, not it): rename this class to leave the "
                "subscriber its name",
                self.written[circuit.name],
                Note("the circuit's row", circuit.span),
            )
        )

    def classes(self, items: tuple[ir.Class, ...]) -> tuple[ir.Class, ...]:
        b = self.b
        out: list[ir.Class] = []
        changed = False
        for cls in items:
            found = b.pending.pop(id(cls), None)
            if found is not None:
                pending = found[1]
                syn = pending.syntax
                changed = True
                way = syn.direction or self.direction
                if way is None:
                    b.error(
                        Diagnostic.error(
                            "E272",
                            f"this tree is the egress of '{self.device}', which may face the "
                            "subscribers or the Internet: write 'subscribers download from' "
                            "(subscribers' downloads: by destination, the Download columns) or "
                            "'subscribers upload from' (by source, the Upload columns), or put "
                            "the tree in an upload or download block",
                            syn.span,
                        )
                    )
                    continue
                self.syntax = syn
                if self.first_table is None and syn.table is not None:
                    self.first_table = syn.table.path  # (in the policy's order)
                left = LeftOut()
                self.too_small = 0
                for circuit, made in expand(pending, way, self.name, self.family, left):
                    made = self.rates_kept(pending, way, circuit, made)
                    self.made[id(made)] = circuit
                    out.append(made)
                if self.too_small > MAX_TABLE_ERRORS:  # capped as a table's own errors are
                    more = self.too_small - MAX_TABLE_ERRORS
                    msg = (
                        f"{more} more rate(s) of this statement below what tc keeps are not "
                        f"shown (the first {MAX_TABLE_ERRORS} are)"
                    )
                    said = Diagnostic.error("E038", msg, syn.span)
                    b.error(dataclasses.replace(said, hidden=more))
                if left.addresses:
                    self.left_out.append((syn, left))
                if syn.table is not None:
                    entry = self.taken.setdefault(syn.table.path, (syn.table, set(), []))
                    entry[1].update(id(r) for r in syn.rows)
                    entry[2].append(syn)
                continue
            new = self.klass(cls)
            changed = changed or new is not cls
            out.append(new)
        return tuple(out) if changed else items

    def rates_kept(
        self, pending: Pending, way: Direction, circuit: Circuit, made: ir.Class
    ) -> ir.Class:
        """``made``, after E030 for a rate or ceil its table's cell makes below what tc keeps
        (8 bit/s, a byte a second), said by its column, with the statement that reads it (a
        minimum of 0, as exports of best-effort plans have, was E208 at a cell of Mbps in
        bits); the class then gets that least rate (the compile stops at the error)."""
        syn = pending.syntax
        assert syn.table is not None
        kept: dict[str, ir.Rate] = {}
        for word, spec, value in (
            ("rate", pending.rate, made.rate),
            ("ceil", pending.ceil, made.ceil),
        ):
            if not isinstance(spec, tuple) or not isinstance(value, ir.Rate):
                continue
            if value.bits_per_second >= MIN_RATE_BITS:
                continue
            kept[word] = ir.Rate(MIN_RATE_BITS, value.span)
            self.too_small += 1
            if self.too_small > MAX_TABLE_ERRORS:
                continue
            name = f"{way}_{spec[0]}"
            header = syn.table.headers[syn.table.columns[name]]
            self.b.error(
                Diagnostic.error(
                    "E030",
                    f"{header}: {circuit.rates[name]} Mbps makes a {word} of "
                    f"{value.bits_per_second} bit/s, below the {MIN_RATE_BITS} (one byte a "
                    f"second) tc keeps; give the circuit a {word} here, or write one on the "
                    f"statement for every circuit it takes ('{word} 1mbit')",
                    value.span,
                    Note("the subscribers statement that reads it is here", syn.span),
                )
            )
        return ir.replace(made, **kept) if kept else made

    def klass(self, cls: ir.Class) -> ir.Class:
        children = self.classes(cls.children)
        leaf = self.walk(cls.leaf) if cls.leaf is not None else None
        if children is cls.children and leaf is cls.leaf:
            return cls
        return ir.replace(cls, children=children, leaf=leaf)

    def queue(self, queue: ir.MqQueue) -> ir.MqQueue:
        """``queue`` with its statements expanded (one among a spread tree's top-level
        classes is expanded before the spread, so that each circuit is packed on its own:
        ``walk``)."""
        qdisc = self.walk(queue.qdisc)
        return queue if qdisc is queue.qdisc else ir.replace(queue, qdisc=qdisc)

    def walk(self, q: ir.Qdisc) -> ir.Qdisc:
        if isinstance(q, ir.Mq):  # a spread tree: each queue's htb holds some of the sites
            unspread = self.b.unspread.get(id(q))
            if unspread is not None:  # spread later (Builder._tree), its statements expanded:
                # their circuits are top-level classes, spread like written ones
                self.b.unspread[id(q)] = (q, self.walk(unspread[1]))
                return q
            queues = tuple(self.queue(queue) for queue in q.queues)
            same = all(a is b for a, b in zip(queues, q.queues, strict=True))
            return q if same else ir.replace(q, queues=queues)
        own = getattr(q, "classes", None)
        if own is not None:
            new = self.classes(own)
            return q if new is own else ir.replace(q, classes=new)
        child = getattr(q, "child", None)
        if child is not None:
            new_child = self.walk(child)
            return q if new_child is child else ir.replace(q, child=new_child)
        return q


def _longest_prefix_first(
    b: Builder,
    tree: ir.Qdisc,
    made: dict[int, Circuit],
    statements: dict[int, SubscribersSyntax],
    marking: ir.Marking | None = None,
) -> None:
    """E036 for a subscriber's address inside the prefix of another subscriber tried before it.

    tcdsl tries the lines of a qdisc in order (their pref, then the tree's order) and the
    first that matches wins; LibreQoS looks addresses up by longest prefix. The two agree
    unless a more specific address comes after a prefix holding it: then the same table
    would shape differently, so that is an error (put the more specific circuit first).
    ``statements``: the statement that took each circuit (by id); ``marking``: the tree's
    ``classify by mark``, whose fw filters' pref is that of the lines without one."""
    fw_pref = marking.fw_pref if marking is not None else ir.DEFAULT_PREF
    found = 0
    unshown: Span | None = None  # the first address past MAX_TABLE_ERRORS
    for lines in _subscriber_lines(tree, made, fw_pref):
        for version in (4, 6):
            family = [line for line in lines if line[1].version == version]
            lengths = sorted({line[1].prefixlen for line in family})
            if len(lengths) < 2:
                continue
            # (length, network) -> the first line with it: (its place, network, cell,
            # circuit, level: below how many defaults or prio bands of an mq queue it is)
            first: dict[tuple[int, int], tuple[int, ir.Network, Span, Circuit, int]] = {}
            for place, (tried, net, at, circuit) in enumerate(family):
                whole, bits = int(net.network_address), net.max_prefixlen
                key = (net.prefixlen, whole >> (bits - net.prefixlen))
                hits = [
                    hit
                    for length in lengths[: lengths.index(net.prefixlen)]
                    if (hit := first.get((length, whole >> (bits - length)))) is not None
                ]
                # the same network on an earlier line is a duplicate, W313's (both are
                # longest prefixes: LibreQoS would not give it to this one either)
                if hits and key not in first:
                    # the line a packet of this address meets first
                    _, wide, wide_at, other, level = min(hits, key=lambda hit: hit[0])
                    if other is not circuit:
                        found += 1
                        if found <= MAX_TABLE_ERRORS:
                            b.error(
                                _shadowed(
                                    net,
                                    at,
                                    circuit,
                                    wide,
                                    wide_at,
                                    other,
                                    statements,
                                    marking,
                                    tried[0] > level,
                                )
                            )
                        elif unshown is None:
                            unshown = at
                first.setdefault(key, (place, net, at, circuit, tried[0]))
    if unshown is not None:
        more = found - MAX_TABLE_ERRORS
        msg = (
            f"{more} more subscriber address(es) inside an earlier subscriber's prefix, "
            "this one first, are not shown"
        )
        b.error(Diagnostic.error("E036", msg, unshown))


_Line = tuple[tuple[int, ...], ir.Network, Span, Circuit]


def _subscriber_lines(
    tree: ir.Qdisc, made: dict[int, Circuit], fw_pref: int
) -> Iterator[list[_Line]]:
    """The addresses of the subscribers' lines of each group of lines tried in turn (a
    qdisc's, or all the queues' of an mq, whose steering filters try them in one list), in
    that order, each with its circuit."""
    groups: list[list[tuple[ir.Class, tuple[int, ...]]]] = []
    steered: set[int] = set()
    if isinstance(tree, ir.Mq):
        order = ir.mq_line_order(tree, banded=False)
        queues = [q for _, _, q in ir.steered_qdiscs(tree, banded=False)]
        steered = {id(q) for q in queues}
        groups.append([(c, order[id(c)]) for q in queues for c in ir.classes_of(q)])
    # the other qdiscs: lists of their own, as without mq
    for q in ir.walk_qdiscs(tree):
        if id(q) not in steered:
            groups.append([(c, (0, i)) for i, c in enumerate(ir.classes_of(q))])
    for group in groups:
        lines: list[_Line] = []
        for cls, place in group:
            circuit = made.get(id(cls))
            if circuit is None:
                continue
            for m in cls.matches:
                pref = m.pref.value if m.pref is not None else fw_pref
                for cond in m.conds:
                    if isinstance(cond, ir.AddrCond):
                        lines += [
                            ((place[0], pref, *place[1:]), n, at, circuit)
                            for n, at in cond.networks
                        ]
        if lines:
            lines.sort(key=lambda line: line[0])
            yield lines


def _shadowed(
    net: ir.Network,
    at: Span,
    circuit: Circuit,
    wide: ir.Network,
    wide_at: Span,
    other: Circuit,
    statements: dict[int, SubscribersSyntax],
    marking: ir.Marking | None,
    deeper: bool = False,
) -> Diagnostic:
    """E036; ``deeper``: the first statement steers at a deeper level of an mq tree (below a
    queue's default or a prio's band), after every line above it whatever its pref."""
    mine, theirs = statements.get(id(circuit)), statements.get(id(other))
    # one id in two tables (two classes): each named with its table (found by a tester)
    me, them = (
        (f"'{circuit.key}' of {circuit.span.file}", f"'{other.key}' of {other.span.file}")
        if circuit.key == other.key
        else (f"'{circuit.key}'", f"'{other.key}'")
    )
    notes = [Note(f"{wide} of circuit {them} is here", wide_at)]
    if mine is not None and theirs is not None and mine is not theirs:
        # the order is the statements' (their prefs, then the tree's), not the table's
        tried = f"the statement that takes {me} is tried after the one that takes {them}: "
        if deeper:
            fix = (
                f"{tried}it is below a queue's default class (or a prio's band) of the mq "
                "tree, whose lines steer only after every line above them, whatever their "
                f"pref; move it into its queue's own qdisc, or split {wide}"
            )
        elif marking is None and mine.pref is not None and mine.pref.value <= 1:
            # (found by a tester: told to lower a pref 1, which a statement without a pref
            # has too)
            fix = (
                f"{tried}the one that takes {me} is at pref 1 already, the lowest, as a "
                f"statement without a pref is: give the one that takes {them} a higher pref "
                f"(such as pref 2), or split {wide}"
            )
        elif (
            marking is None
            and mine.pref is None
            and theirs.pref is not None
            and (theirs.pref.value <= 1)
        ):
            fix = (
                f"{tried}the one that takes {them} is at pref 1, the lowest: give it a higher "
                f"pref (such as pref 2) and the one that takes {me} pref 1, or split {wide}"
            )
        elif marking is None:
            fix = (
                f"{tried}give the statement that takes {me} a lower pref than "
                f"the one that takes {them} (such as pref 1 and pref 2), or split "
                f"{wide}"
            )
        else:  # a pref would make its lines u32 filters, which the marks' fw filters may hide
            fix = (
                f"{tried}put it above the one that takes {them} in the tree, without "
                "a pref (with 'classify by mark', lines without one are marking rules, tried "
                "in the tree's order; a pref makes them u32 filters, tried before the marks "
                f"only below pref {marking.fw_pref}), or split {wide}"
            )
        notes.append(Note(f"the statement that takes {me} is here", mine.span))
    else:
        fix = f"list circuit {me} before {them}, or split {wide}"
    return Diagnostic.error(
        "E036",
        f"{net} of circuit {me} lies inside {wide} of circuit {them}, which "
        f"is tried first: its packets would go to {them} (tcdsl takes the first line "
        f"that matches), where LibreQoS gives them to {me} (the longest prefix); " + fix,
        at,
        *notes,
    )


def _split_circuits(
    b: Builder, table: Table, rows: set[int], statements: list[SubscribersSyntax]
) -> set[int]:
    """W377 for each circuit of ``table`` whose rows (devices) the tree's statements take
    only some of (a ``where`` on a column that differs between its rows): the others would
    go where unclassified traffic goes. (Found by a tester: only W371 said so, of rows, not
    of a subscriber cut in two; LibreQoS shapes a circuit as one.) The rows left out, which
    W371 then leaves to this warning."""
    taken = {id(row.circuit): row for row in table.rows if id(row) in rows}
    left: dict[int, list[Row]] = {}
    for row in table.rows:
        if id(row) not in rows and id(row.circuit) in taken:
            left.setdefault(id(row.circuit), []).append(row)
    for n, (circuit, out) in enumerate(left.items()):
        if n == MAX_TABLE_ERRORS:
            more = len(left) - n
            b.error(
                Diagnostic.warning(
                    "W377",
                    f"{more} more circuits of table '{table.path}' are split the same way",
                    statements[0].span,
                )
            )
            break
        first, row = out[0], taken[circuit]
        devices = f"{len(out)} of its rows" if len(out) > 1 else "its row"
        b.error(
            Diagnostic.warning(
                "W377",
                f"circuit '{row.circuit.key}' is split: this tree's subscribers statements "
                f"take its row at line {row.line} but not {devices} here, whose traffic would "
                "go where unclassified traffic goes, where LibreQoS shapes a circuit's devices "
                "as one: make the 'where' conditions take all of a circuit's rows or none (on a "
                "column its rows share, such as the parent node)",
                first.span,
                Note("the row taken is here", row.span),
                Note("the tree's statement is here", statements[0].span),
            )
        )
    return {id(row) for out in left.values() for row in out}


def _unshaped(
    b: Builder, table: Table, rows: set[int], statements: list[SubscribersSyntax]
) -> None:
    """W371 for the rows of ``table`` no statement of a tree takes, one per value of the first
    ``where`` column (the parent node, most often) at its first row."""
    column = next((s.where_column for s in statements if s.where_column is not None), None)
    groups: dict[str, list[Row]] = {}
    for row in table.rows:
        if id(row) not in rows:
            value = (
                row.cells[column].strip() if column is not None and column < len(row.cells) else ""
            )
            groups.setdefault(value, []).append(row)
    lines = b.reader.sources[table.path].split("\n") if groups else []
    shown = list(groups.items())[:MAX_TABLE_ERRORS]
    name = table.headers[column].strip() if column is not None else "a column"
    for value, left in shown:
        first = left[0]
        if column is not None:
            what = f"{len(left)} row(s) with {name} '{value}'"
            at = _cell_span(table, lines, first, column)
        else:
            what = f"{len(left)} row(s)"
            at = first.circuit.span
        b.error(
            Diagnostic.warning(
                "W371",
                f"{what} of table '{table.path}' are taken by no subscribers statement of "
                "this tree: their traffic goes where it would without them, to the line "
                "of another row or statement whose prefix holds their addresses, else where "
                "unclassified traffic goes (ask 'tcdsl classify' of an address)",
                at,
                Note("the tree's statement is here", statements[0].span),
            )
        )
    if len(groups) > len(shown):
        more = sum(len(left) for _, left in list(groups.items())[len(shown) :])
        msg = (
            f"{more} more row(s) of table '{table.path}', with {len(groups) - len(shown)} "
            f"more values of {name}, "
            "are taken by no subscribers statement of this tree"
        )
        b.error(Diagnostic.warning("W371", msg, statements[0].span))


def _cell_span(table: Table, lines: list[str], row: Row, column: int) -> Span:
    """The span of a row's cell."""
    last = row.line
    parts = [lines[row.line - 1]]
    odd = parts[0].count('"') % 2
    while odd and last < len(lines):  # a quoted line break
        last += 1
        parts.append(lines[last - 1])
        odd ^= parts[-1].count('"') % 2
    raw = "\n".join(parts)
    width = len(lines[last - 1]) + 1
    return _Place(table.path, row.line, last, width, row.cells, *_cell_starts(raw, row.cells)).span(
        column
    )


def placeholder(qb: QdiscBuilder, syn: SubscribersSyntax) -> ir.Class | None:
    """The class that stands for ``syn`` in its parent until its tree is built (None after
    reporting a statement that cannot be one)."""
    from tcdsl.frontend.qdiscs import CLASS_FLAGS, SET_DSCP, _class_params, nested_stab

    b = qb.b
    if qb.kind != "htb":
        b.error(
            Diagnostic.error(
                "E271",
                f"subscribers need an htb (a class for each circuit, with a rate and a ceil); "
                f"this is {'an' if qb.kind == 'hfsc' else 'a'} {qb.kind}",
                syn.span,
            )
        )
        return None
    rate = ceil = None
    rest = []
    for opt in syn.opts:
        if isinstance(opt, ir.Match):
            b.error(
                Diagnostic.error(
                    "E270",
                    "a subscribers statement takes its matches from the table (each device's "
                    "addresses); write other matches on classes of their own",
                    opt.span,
                )
            )
        elif isinstance(opt, Param) and opt.key == "mark":
            b.error(
                Diagnostic.error(
                    "E270",
                    "the classes of a subscribers statement are marked by tcdsl (under "
                    "'classify by mark'); a 'mark' would give them all one",
                    opt.span,
                )
            )
        elif isinstance(opt, Param) and opt.key in ("rate", "ceil"):
            first: Param | None = rate if opt.key == "rate" else ceil
            if first is not None:  # as for a class: the first stands, the second is an error
                b.error(
                    Diagnostic.error(
                        "E014",
                        f"'{opt.key}' is given twice",
                        opt.span,
                        Note("first given here", first.span),
                    )
                )
            elif opt.key == "rate":
                rate = opt
            else:
                ceil = opt
        else:
            rest.append(opt)
    params = {k: d for k, d in _class_params("htb").items() if k not in ("rate", "ceil", "mark")}
    values, handle, _ = qb._values(
        rest, params, CLASS_FLAGS["htb"], "a subscriber's class", handle_kw="id"
    )
    if handle is not None:
        b.error(
            Diagnostic.error(
                "E270",
                "the classes of a subscribers statement are numbered by tcdsl; an 'id' would "
                "give them all one",
                handle.span,
            )
        )
    leaves: list[QdiscSyntax] = []
    for item in syn.body:
        if isinstance(item, QdiscSyntax):
            leaves.append(item)
            nested_stab(b, item)
        else:
            at = getattr(item, "span", syn.span)
            b.error(
                Diagnostic.error(
                    "E270",
                    "the block of a subscribers statement holds one leaf qdisc (each "
                    "subscriber's), nothing else",
                    at,
                )
            )
    if len(leaves) > 1:
        b.error(
            Diagnostic.error(
                "E018",
                "a subscribers statement has more than one leaf qdisc",
                leaves[1].qdisc.span,
            )
        )
    if leaves and _copied_alike(b, leaves[0].qdisc):
        leaves = []  # its copies would each be reported again
    if syn.table is None:
        return None
    flags = {k: values.pop(k, False) for k in ("bounded", "isolated", "overbook")}
    values["set_dscp"] = values.pop(SET_DSCP, None)
    common = {k: v for k, v in values.items() if v is not None}
    common.update({k: v for k, v in flags.items() if v})
    pending = template(b, syn, common, rate, ceil, leaves[0] if leaves else None)
    stand_in = ir.Class("", syn.span)
    b.pending[id(stand_in)] = (stand_in, pending)
    return stand_in
