"""The networks tcdsl.addresses makes without ipaddress's constructor are the constructor's."""

from __future__ import annotations

import copy
import pickle
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl import addresses
from tcdsl.frontend.tables import _network

V4 = st.tuples(st.integers(0, (1 << 32) - 1), st.integers(0, 32))
V6 = st.tuples(st.integers(0, (1 << 128) - 1), st.integers(0, 128))


def _same(lean: IPv4Network | IPv6Network, real: IPv4Network | IPv6Network) -> None:
    assert type(lean) is type(real)
    assert lean == real and hash(lean) == hash(real)
    assert not lean != real  # noqa: SIM202 (__ne__ is a method of its own)
    assert (str(lean), repr(lean), lean.with_prefixlen) == (
        str(real),
        repr(real),
        real.with_prefixlen,
    )
    assert (lean.compressed, lean.exploded) == (real.compressed, real.exploded)
    assert (lean.prefixlen, lean.netmask, lean.hostmask) == (
        real.prefixlen,
        real.netmask,
        real.hostmask,
    )
    assert (lean.network_address, lean.broadcast_address, lean.num_addresses) == (
        real.network_address,
        real.broadcast_address,
        real.num_addresses,
    )
    assert lean.network_address.packed == real.network_address.packed
    assert int(lean.network_address) == int(real.network_address)
    assert (lean.is_private, lean.is_global, lean.is_multicast) == (
        real.is_private,
        real.is_global,
        real.is_multicast,
    )
    assert lean.subnet_of(real) and lean.supernet_of(real) and lean.overlaps(real)  # type: ignore[arg-type]
    assert real.network_address in lean and lean.broadcast_address in real
    assert pickle.loads(pickle.dumps(lean)) == real and copy.deepcopy(lean) == real
    assert {lean: 1}[real] == 1


def test_this_python_makes_them_lean() -> None:
    """On the Python tcdsl is tested with the lean way is taken (else this file would test the
    constructor against itself)."""
    assert addresses.LEAN


@settings(max_examples=200)
@given(V4)
def test_ipv4_networks_are_the_constructors(case: tuple[int, int]) -> None:
    value, bits = case
    _same(addresses.ipv4_network(value, bits), IPv4Network((value, bits), strict=False))


@settings(max_examples=200)
@given(V6)
def test_ipv6_networks_are_the_constructors(case: tuple[int, int]) -> None:
    value, bits = case
    _same(addresses.ipv6_network(value, bits), IPv6Network((value, bits), strict=False))


@settings(max_examples=100)
@given(V4, V4, V6, V6)
def test_they_compare_with_others_as_the_constructors_do(
    a: tuple[int, int], b: tuple[int, int], c: tuple[int, int], d: tuple[int, int]
) -> None:
    for make, real, x, y in (
        (addresses.ipv4_network, IPv4Network, a, b),
        (addresses.ipv6_network, IPv6Network, c, d),
    ):
        lean_x, lean_y = make(*x), make(*y)
        real_x, real_y = real(x, strict=False), real(y, strict=False)
        assert (lean_x < lean_y) == (real_x < real_y)
        assert lean_x.overlaps(lean_y) == real_x.overlaps(real_y)
        assert lean_x.subnet_of(lean_y) == real_x.subnet_of(real_y)
        assert (real_y.network_address in lean_x) == (real_y.network_address in real_x)


def test_another_pythons_inside_falls_back_to_the_constructor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(addresses, "LEAN", False)
    made = addresses.ipv4_network(0x0A010203, 8)
    assert made == IPv4Network("10.0.0.0/8") and list(made.hosts())[:1] == [IPv4Address("10.0.0.1")]
    assert addresses.ipv6_network(1, 128).hosts() == [IPv6Address("::1")]


def test_a_tables_addresses_are_read_as_before() -> None:
    """The table's reader gives the same networks, and the same refusals, as ipaddress."""
    assert _network("100.64.0.1", "ipv4") == IPv4Network("100.64.0.1/32")
    assert _network("100.64.0.0/10", "ipv4") == IPv4Network("100.64.0.0/10")
    assert _network("2001:db8:1::/56", "ipv6") == IPv6Network("2001:db8:1::/56")
    assert "host bits set" in str(_network("100.64.0.1/10", "ipv4"))
    assert "host bits set" in str(_network("2001:db8::1/56", "ipv6"))
    assert "IPv4-mapped" in str(_network("::ffff:100.64.0.1", "ipv6"))
