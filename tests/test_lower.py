"""``range_to_masks``: port ranges as the fewest aligned value/mask blocks."""

from __future__ import annotations

import functools
import ipaddress
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl import lower
from tcdsl.lower import range_to_masks


def _blocks(pairs: list[tuple[int, int]], width: int) -> list[tuple[int, int]]:
    """(value, mask) pairs -> (first, last) ranges; checks each pair is a prefix block."""
    full = (1 << width) - 1
    out = []
    for value, mask in pairs:
        assert 0 <= mask <= full and 0 <= value <= full
        host = full ^ mask
        assert host & (host + 1) == 0, f"mask {mask:#x} is not a prefix mask"
        assert value & host == 0, f"value {value:#x} has bits outside mask {mask:#x}"
        out.append((value, value | host))
    return out


def _assert_exact_cover(lo: int, hi: int, pairs: list[tuple[int, int]], width: int) -> None:
    blocks = sorted(_blocks(pairs, width))
    assert blocks, "empty cover"
    assert blocks[0][0] == lo
    assert blocks[-1][1] == hi
    for (_, last), (first, _) in itertools.pairwise(blocks):
        assert first == last + 1, "blocks overlap or leave a gap"


def _canonical_count(lo: int, hi: int, width: int) -> int:
    """The minimal prefix cover by trie decomposition (an independent algorithm)."""

    def count(start: int, size: int) -> int:
        end = start + size - 1
        if end < lo or start > hi:
            return 0
        if lo <= start and end <= hi:
            return 1
        half = size // 2
        return count(start, half) + count(start + half, half)

    return count(0, 1 << width)


@functools.cache
def _minimal_counts(hi: int, width: int) -> tuple[int, ...]:
    """Brute force: for every lo <= hi, the fewest aligned blocks that tile lo..hi exactly."""
    best = [0] * (hi + 2)
    for x in range(hi, -1, -1):
        options = []
        size = 1
        while size <= 1 << width:
            if x % size == 0 and x + size - 1 <= hi:
                options.append(1 + best[x + size])
            size <<= 1
        best[x] = min(options)
    return tuple(best[: hi + 1])


def test_width_8_exhaustively_minimal_and_exact() -> None:
    width = 8
    for hi in range(1 << width):
        minimal = _minimal_counts(hi, width)
        for lo in range(hi + 1):
            pairs = range_to_masks(lo, hi, width)
            _assert_exact_cover(lo, hi, pairs, width)
            assert len(pairs) == minimal[lo], (lo, hi, pairs)


def test_trie_decomposition_agrees_with_brute_force() -> None:
    width = 6
    for hi in range(1 << width):
        minimal = _minimal_counts(hi, width)
        for lo in range(hi + 1):
            assert _canonical_count(lo, hi, width) == minimal[lo]


ports = st.integers(min_value=0, max_value=65535)


@st.composite
def port_ranges(draw: st.DrawFn) -> tuple[int, int]:
    a, b = draw(ports), draw(ports)
    if draw(st.booleans()):  # ranges near powers of two are where off-by-ones hide
        k = draw(st.integers(min_value=0, max_value=16))
        a = min(65535, max(0, (1 << k) + draw(st.integers(min_value=-2, max_value=2))))
    return min(a, b), max(a, b)


@settings(max_examples=500)
@given(port_ranges())
def test_16_bit_ranges(bounds: tuple[int, int]) -> None:
    lo, hi = bounds
    pairs = range_to_masks(lo, hi)
    _assert_exact_cover(lo, hi, pairs, 16)
    assert len(pairs) == _canonical_count(lo, hi, 16)
    assert len(pairs) <= 2 * 16 - 2 or (lo, hi) == (0, 65535)


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (80, 80, [(80, 0xFFFF)]),
        (0, 65535, [(0, 0x0000)]),
        (1024, 2047, [(1024, 0xFC00)]),
        (
            1024,
            65535,
            [
                (1024, 0xFC00),
                (2048, 0xF800),
                (4096, 0xF000),
                (8192, 0xE000),
                (16384, 0xC000),
                (32768, 0x8000),
            ],
        ),
        (6881, 6889, [(6881, 0xFFFF), (6882, 0xFFFE), (6884, 0xFFFC), (6888, 0xFFFE)]),
        (1, 65534, None),
    ],
)
def test_examples(lo: int, hi: int, expected: list[tuple[int, int]] | None) -> None:
    pairs = range_to_masks(lo, hi)
    _assert_exact_cover(lo, hi, pairs, 16)
    if expected is not None:
        assert pairs == expected
    else:
        assert len(pairs) == 30  # the worst case for 16 bits


def test_empty_range_gives_no_blocks() -> None:
    assert range_to_masks(5, 4) == []


@given(st.ip_addresses(v=4), st.integers(min_value=0, max_value=32))
def test_network_parse_matches_ipaddress(address: ipaddress.IPv4Address, length: int) -> None:
    net = ipaddress.IPv4Network(f"{address}/{length}", strict=False)
    want = (int(net.network_address), int(net.netmask))
    assert lower._network(str(net)) == want
    if length == 32:
        assert lower._network(str(net.network_address)) == want
