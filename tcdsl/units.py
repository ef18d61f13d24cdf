"""Units exactly as tc reads them: rates in bits/s, sizes in bytes, times in microseconds.

The tables mirror iproute2's ``get_rate``, ``get_size`` and ``get_time``; suffixes are
case-insensitive there and here. The surprising ones: ``bps``/``kbps``/``mbps`` are BYTES per
second, and a size suffix ``k``/``kb``/``m`` is binary (1024), while rate suffixes are decimal.
"""

from __future__ import annotations

import functools
from enum import Enum
from fractions import Fraction


class Dimension(Enum):
    """What a value measures."""

    RATE = "rate"
    SIZE = "size"
    TIME = "time"
    COUNT = "count"

    @property
    def example(self) -> str:
        """An example value, for messages."""
        return {"rate": "10mbit", "size": "15k", "time": "50ms", "count": "10"}[self.value]


_K = 1024
RATE_UNITS: dict[str, int] = {
    "bit": 1,
    "kibit": _K,
    "kbit": 1000,
    "mibit": _K**2,
    "mbit": 10**6,
    "gibit": _K**3,
    "gbit": 10**9,
    "tibit": _K**4,
    "tbit": 10**12,
    "bps": 8,
    "kibps": 8 * _K,
    "kbps": 8000,
    "mibps": 8 * _K**2,
    "mbps": 8 * 10**6,
    "gibps": 8 * _K**3,
    "gbps": 8 * 10**9,
    "tibps": 8 * _K**4,
    "tbps": 8 * 10**12,
}
"""Rate suffixes (lower case) -> bits per second."""

BYTE_RATE_UNITS = frozenset(u for u in RATE_UNITS if u.endswith("bps"))
"""Rate suffixes that tc reads as bytes per second."""

SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "k": _K,
    "kb": _K,
    "m": _K**2,
    "mb": _K**2,
    "g": _K**3,
    "gb": _K**3,
    "kbit": _K // 8,
    "mbit": _K**2 // 8,
    "gbit": _K**3 // 8,
}
"""Size suffixes (lower case) -> bytes."""

TIME_UNITS: dict[str, int] = {
    "s": 10**6,
    "sec": 10**6,
    "secs": 10**6,
    "ms": 1000,
    "msec": 1000,
    "msecs": 1000,
    "us": 1,
    "usec": 1,
    "usecs": 1,
}
"""Time suffixes (lower case) -> microseconds."""

UNITS: dict[Dimension, dict[str, int]] = {
    Dimension.RATE: RATE_UNITS,
    Dimension.SIZE: SIZE_UNITS,
    Dimension.TIME: TIME_UNITS,
}


def dimensions_of(unit: str) -> tuple[Dimension, ...]:
    """Return the dimensions a unit suffix can measure (``kbit`` is both a rate and a size)."""
    u = unit.lower()
    return tuple(dim for dim, table in UNITS.items() if u in table)


def scale(unit: str, dimension: Dimension) -> int | None:
    """Return the multiplier of ``unit`` to the base unit of ``dimension``, or None."""
    return UNITS.get(dimension, {}).get(unit.lower())


@functools.lru_cache(maxsize=4096)
def _largest(value: int, table: tuple[tuple[str, int], ...]) -> str:
    for suffix, factor in table:
        if value != 0 and value % factor == 0:
            return f"{value // factor}{suffix}"
    return f"{value}{table[-1][0]}"


_RATE_OUT = (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 1000), ("bit", 1))
_SIZE_OUT = (("g", _K**3), ("m", _K**2), ("k", _K), ("", 1))
_TIME_OUT = (("s", 10**6), ("ms", 1000), ("us", 1))


def format_rate(bits_per_second: int) -> str:
    """Spell a rate the way tc reads it, exactly (``6000000`` -> ``6mbit``)."""
    return _largest(bits_per_second, _RATE_OUT)


def format_size(size_bytes: int) -> str:
    """Spell a size the way tc reads it, exactly (``15360`` -> ``15k``; ``1540`` stays bare)."""
    return _largest(size_bytes, _SIZE_OUT)


def format_time(microseconds: int) -> str:
    """Spell a time the way tc reads it, exactly (``50000`` -> ``50ms``)."""
    return _largest(microseconds, _TIME_OUT)


def _parse(text: str, table: dict[str, int]) -> int:
    i = 0
    while i < len(text) and text[i] in "0123456789.":  # ASCII only: isdigit() takes "٣"
        i += 1
    number, unit = text[:i], text[i:]
    factor = table.get(unit.lower())
    if not number or factor is None:
        raise ValueError(f"not a quantity: {text!r}")
    return int(Fraction(number) * factor)


def parse_rate(text: str) -> int:
    """Parse a rate with a unit (as tc does, truncating) into bits per second."""
    return _parse(text, RATE_UNITS)


def parse_size(text: str) -> int:
    """Parse a size into bytes; a bare number is bytes, as in tc."""
    return _parse(text, {**SIZE_UNITS, "": 1})


def parse_time(text: str) -> int:
    """Parse a time with a unit into microseconds."""
    return _parse(text, TIME_UNITS)


def parse_seconds(text: str) -> float:
    """A duration for the command line, in seconds: bare seconds (``0.2``, as watch(1) takes
    them), minutes or hours (``2m``, ``1h``), or a time as tc writes it (``500ms``, ``60s``)."""
    return float(_parse(text, {"": 1_000_000, "m": 60_000_000, "h": 3_600_000_000,
                               **TIME_UNITS})) / 1e6  # fmt: skip
