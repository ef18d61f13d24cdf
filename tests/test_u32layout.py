"""``tcdsl.u32layout``: small prefs untouched; long ones numbered in order, cut into tables of
divisor 1 past 4,095 nodes; hashed runs keep every filter in the bucket its keys fix, in
order. The kernel's side is tests/test_hash_kernel.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl import ir, u32layout
from tcdsl.diagnostics import Span

PARENT = ir.Handle(1, 0)


def _filter(i: int, words: tuple[str, ...], family: ir.Family = "ipv4") -> ir.U32Filter:
    span = Span("p.tcp", i + 1, 1, i + 1, 2)
    return ir.U32Filter(PARENT, 1, (ir.U32Key(words),), ir.Handle(1, i + 1), span, family=family)


def _dst(i: int, address: str) -> ir.U32Filter:
    return _filter(i, ("ip", "dst", address))


def _flat(filters: tuple[ir.Filter, ...], tables: tuple[ir.U32Table, ...]) -> list[int]:
    """The filters' indexes in the order u32 would try them if every link led everywhere:
    root nodes by id, a link's table bucket by bucket."""
    index = {id(f): i for i, f in enumerate(filters)}
    nodes: dict[tuple[int | None, int], list[tuple[int, object]]] = {}
    for f in filters:
        assert isinstance(f, ir.U32Filter) and f.place is not None
        nodes.setdefault((f.place.table, f.place.bucket), []).append((f.place.node, f))
    for t in tables:
        nodes.setdefault((t.link.table, t.link.bucket), []).append((t.link.node, t))

    def walk(table: int | None, bucket: int) -> list[int]:
        out: list[int] = []
        for _, n in sorted(nodes.get((table, bucket), []), key=lambda p: p[0]):
            if isinstance(n, ir.U32Table):
                for b in range(n.divisor):
                    out += walk(n.table, b)
            else:
                out.append(index[id(n)])
        return out

    return walk(None, 0)


def test_a_short_pref_is_left_as_it_is() -> None:
    filters = tuple(_dst(i, f"10.0.0.{i}") for i in range(u32layout.HASH_MIN - 1))
    assert u32layout.layout(filters) == (filters, ())


def test_a_long_pref_is_numbered_in_order_and_cut_into_sub_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(u32layout, "NODES", 7)
    monkeypatch.setattr(u32layout, "ORDER_KEPT", 10)
    filters = tuple(_filter(i, ("ip", "dport", str(i), "0xffff")) for i in range(60))
    placed, tables = u32layout.layout(filters, hash_min=0)
    assert {t.divisor for t in tables} == {1} and len(tables) > 7  # two levels of sub-lists
    assert _flat(placed, tables) == list(range(60))
    assert len({(f.place.table, f.place.node) for f in placed}) == 60  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 255), st.sampled_from([32, 32, 32, 24, 8])),
        min_size=1,
        max_size=300,
    )
)
def test_hashed_buckets_hold_what_their_keys_fix(lines: list[tuple[int, int, int]]) -> None:
    """Every filter in a hashed bucket fixes the hashed byte to the bucket's value; the
    buckets keep the policy's order; every filter is placed once."""
    filters = tuple(_dst(i, f"10.{a}.0.{b}/{n}") for i, (a, b, n) in enumerate(lines))
    placed, tables = u32layout.layout(filters, hash_min=4)
    by_id = {t.table: t for t in tables}
    seen = []
    for i, f in enumerate(placed):
        assert isinstance(f, ir.U32Filter)
        if f.place is None:
            assert not tables
            continue
        seen.append((f.place.table, f.place.bucket, f.place.node))
        fixed = u32layout.fixed_bytes(f)
        table = f.place.table
        bucket = f.place.bucket
        while table is not None:
            t = by_id[table]
            if t.hashed_byte is not None:
                assert fixed[t.hashed_byte] == bucket, (i, t)
            table, bucket = t.link.table, t.link.bucket
    assert len(set(seen)) == len(seen)
    if tables:
        order = _flat(placed, tables)
        assert sorted(order) == list(range(len(lines)))
        for t in tables:  # within each bucket, the policy's order
            for b in range(t.divisor):
                inside = [
                    i
                    for i, f in enumerate(placed)
                    if isinstance(f, ir.U32Filter)
                    and f.place is not None
                    and (f.place.table, f.place.bucket) == (t.table, b)
                ]
                assert inside == sorted(inside)
