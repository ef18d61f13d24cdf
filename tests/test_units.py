"""Units: round trips between tc spellings and base units, and agreement with iproute2 6.1."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl.units import (
    BYTE_RATE_UNITS,
    RATE_UNITS,
    SIZE_UNITS,
    TIME_UNITS,
    Dimension,
    dimensions_of,
    format_rate,
    format_size,
    format_time,
    parse_rate,
    parse_size,
    parse_time,
    scale,
)

# ---- iproute2 6.1, tc/tc_util.c and lib/utils.c, transcribed ------------------------------------

# lib/utils.c: ``static const struct rate_suffix suffixes[]`` (get_rate/get_rate64 use
# strcasecmp), in bits per second.
IPROUTE2_RATE: dict[str, int] = {
    "bit": 1,
    "Kibit": 1024,
    "kbit": 1000,
    "mibit": 1024**2,
    "mbit": 10**6,
    "gibit": 1024**3,
    "gbit": 10**9,
    "tibit": 1024**4,
    "tbit": 10**12,
    "Bps": 8,
    "KiBps": 8 * 1024,
    "KBps": 8000,
    "MiBps": 8 * 1024**2,
    "MBps": 8 * 10**6,
    "GiBps": 8 * 1024**3,
    "GBps": 8 * 10**9,
    "TiBps": 8 * 1024**4,
    "TBps": 8 * 10**12,
}
# tc/tc_util.c get_size (strcasecmp), in bytes; ``1024/8`` is integer division there: 128.
IPROUTE2_SIZE: dict[str, Fraction] = {
    "b": Fraction(1),
    "k": Fraction(1024),
    "kb": Fraction(1024),
    "m": Fraction(1024**2),
    "mb": Fraction(1024**2),
    "g": Fraction(1024**3),
    "gb": Fraction(1024**3),
    "kbit": Fraction(1024 // 8),
    "mbit": Fraction(1024 * 1024 // 8),
    "gbit": Fraction(1024 * 1024 * 1024 // 8),
}
# tc/tc_util.c get_time (strcasecmp), in microseconds (TIME_UNITS_PER_SEC = 1000000).
IPROUTE2_TIME: dict[str, int] = {
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

RATE_OUT = {"tbit": 10**12, "gbit": 10**9, "mbit": 10**6, "kbit": 1000, "bit": 1}
SIZE_OUT = {"g": 1024**3, "m": 1024**2, "k": 1024, "": 1}
TIME_OUT = {"s": 10**6, "ms": 1000, "us": 1}

naturals = st.integers(min_value=0, max_value=10**16)
positive = st.integers(min_value=1, max_value=10**16)


def _split(text: str) -> tuple[int, str]:
    digits = len(text) - len(text.lstrip("0123456789"))
    return int(text[:digits]), text[digits:]


def _random_case(draw: st.DrawFn, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(ch.upper() if flip else ch.lower() for ch, flip in zip(word, flips, strict=True))


@st.composite
def cased(draw: st.DrawFn, words: list[str]) -> str:
    return _random_case(draw, draw(st.sampled_from(words)))


# ---- tables --------------------------------------------------------------------------------------


def test_rate_table_is_iproute2s() -> None:
    assert {k.lower(): Fraction(v) for k, v in IPROUTE2_RATE.items()} == RATE_UNITS


def test_size_table_is_iproute2s() -> None:
    assert IPROUTE2_SIZE == SIZE_UNITS


def test_time_table_is_iproute2s() -> None:
    assert {k: Fraction(v) for k, v in IPROUTE2_TIME.items()} == TIME_UNITS


def test_byte_rate_units_are_the_bps_family() -> None:
    assert {u for u in RATE_UNITS if RATE_UNITS[u] % 8 == 0 and "bps" in u} == BYTE_RATE_UNITS
    assert "kbit" not in BYTE_RATE_UNITS


@pytest.mark.parametrize(
    ("text", "parse", "expected"),
    [
        ("1kbps", parse_rate, 8000),
        ("1kbit", parse_rate, 1000),
        ("1kibit", parse_rate, 1024),
        ("1mbps", parse_rate, 8_000_000),
        ("1bps", parse_rate, 8),
        ("1k", parse_size, 1024),
        ("1kb", parse_size, 1024),
        ("1kbit", parse_size, 128),
        ("15k", parse_size, 15360),
        ("1mbit", parse_size, 131072),
        ("1b", parse_size, 1),
        ("1ms", parse_time, 1000),
        ("50ms", parse_time, 50_000),
        ("2s", parse_time, 2_000_000),
        ("7usecs", parse_time, 7),
        ("1.5mbit", parse_rate, 1_500_000),
        ("0.5k", parse_size, 512),
        ("1.5us", parse_time, 1),  # truncates, as tc does
    ],
)
def test_examples(text: str, parse: Callable[[str], int], expected: int) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("value", "fmt", "expected"),
    [
        (6_000_000, format_rate, "6mbit"),
        (1_500_000, format_rate, "1500kbit"),
        (0, format_rate, "0bit"),
        (1, format_rate, "1bit"),
        (10**12, format_rate, "1tbit"),
        (1024, format_rate, "1024bit"),  # decimal units only: no kibit
        (15360, format_size, "15k"),
        (1540, format_size, "1540"),
        (1024**3, format_size, "1g"),
        (50_000, format_time, "50ms"),
        (0, format_time, "0us"),
        (1_000_000, format_time, "1s"),
        (1_500_000, format_time, "1500ms"),
    ],
)
def test_format_examples(value: int, fmt: Callable[[int], str], expected: str) -> None:
    assert fmt(value) == expected


@pytest.mark.parametrize("bad", ["", "mbit", "10", "10 mbit", "10xbit", "-1mbit", "1e3bit"])
def test_parse_rate_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_kbit_is_both_a_rate_and_a_size() -> None:
    assert set(dimensions_of("KBIT")) == {Dimension.RATE, Dimension.SIZE}
    assert scale("kbit", Dimension.RATE) == 1000
    assert scale("kbit", Dimension.SIZE) == 128
    assert scale("ms", Dimension.RATE) is None
    assert dimensions_of("furlong") == ()


# ---- round trips ---------------------------------------------------------------------------------


@given(naturals)
def test_rate_round_trip(bits: int) -> None:
    assert parse_rate(format_rate(bits)) == bits


@given(naturals)
def test_time_round_trip(us: int) -> None:
    assert parse_time(format_time(us)) == us


@given(positive.map(lambda n: n * 1024))
def test_size_round_trip_with_suffix(size: int) -> None:
    assert parse_size(format_size(size)) == size


@given(naturals)
def test_size_round_trip(size: int) -> None:
    assert parse_size(format_size(size)) == size


def _assert_largest_exact(value: int, text: str, table: dict[str, int]) -> None:
    number, suffix = _split(text)
    assert suffix in table, text
    assert number * table[suffix] == value
    if value:
        bigger = [u for u, f in table.items() if f > table[suffix]]
        assert all(value % table[u] for u in bigger), f"{text}: a larger unit is exact"


@given(naturals)
def test_format_rate_picks_largest_exact_unit(bits: int) -> None:
    _assert_largest_exact(bits, format_rate(bits), RATE_OUT)


@given(naturals)
def test_format_size_picks_largest_exact_unit(size: int) -> None:
    _assert_largest_exact(size, format_size(size), SIZE_OUT)


@given(naturals)
def test_format_time_picks_largest_exact_unit(us: int) -> None:
    _assert_largest_exact(us, format_time(us), TIME_OUT)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(RATE_OUT)))
def test_format_rate_of_a_unit_multiple(n: int, unit: str) -> None:
    # n units is exact in `unit`, so the chosen unit is at least that large
    text = format_rate(n * RATE_OUT[unit])
    assert parse_rate(text) == n * RATE_OUT[unit]
    if n:
        assert RATE_OUT[_split(text)[1]] >= RATE_OUT[unit]


# ---- case-insensitivity --------------------------------------------------------------------------


TABLES: tuple[tuple[dict[str, Fraction], Callable[[str], int], Dimension], ...] = (
    (RATE_UNITS, parse_rate, Dimension.RATE),
    (SIZE_UNITS, parse_size, Dimension.SIZE),
    (TIME_UNITS, parse_time, Dimension.TIME),
)


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=10**6), st.data())
def test_parsing_is_case_insensitive(n: int, data: st.DataObject) -> None:
    for table, parse, dim in TABLES:
        unit = data.draw(st.sampled_from(sorted(table)))
        spelled = data.draw(cased([unit]))
        assert parse(f"{n}{spelled}") == parse(f"{n}{unit}") == int(n * table[unit])
        assert scale(spelled, dim) == table[unit]
        assert dim in dimensions_of(spelled)


@pytest.mark.parametrize("spelled", ["10MBIT", "10Mbit", "10mBiT", "10KiBps", "10kibps", "10TBps"])
def test_iproute2_spellings(spelled: str) -> None:
    unit = spelled.lstrip("0123456789")
    expected = next(v for k, v in IPROUTE2_RATE.items() if k.lower() == unit.lower())
    assert parse_rate(spelled) == 10 * expected
