"""IPv4 and IPv6 networks made from their numbers, for the frontend's hot paths.

A subscriber table gives two networks a device (110,000 for 50,000 subscribers), and
``IPv4Network((value, 32))`` costs about 4.7 us and 436 bytes there: its constructor parses
its argument again, and gives every host network a closure of its own as ``hosts``. The
networks made here are ``ipaddress``'s own classes, equal, hashed, printed and pickled as
those the constructor makes, with the attributes it sets (``network_address``, ``netmask``,
``_prefixlen``), in about 1 us and 220 bytes: only ``hosts()`` of a /31, /32, /127 or /128
differs (it lists no address, as for other networks its size; tcdsl never asks).

That is ``ipaddress``'s inside: :data:`LEAN` checks, once, that the networks made so agree
with the constructor's on a few values of each family, and where they do not (another
Python), these functions call the constructor.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any, cast

_new = object.__new__
_MASKS4 = [IPv4Network._make_netmask(bits) for bits in range(33)]  # type: ignore[attr-defined]
_MASKS6 = [IPv6Network._make_netmask(bits) for bits in range(129)]  # type: ignore[attr-defined]
_ALL4 = (1 << 32) - 1
_ALL6 = (1 << 128) - 1


def _lean4(value: int, bits: int) -> IPv4Network:
    address: Any = _new(IPv4Address)
    address._ip = value & (_ALL4 ^ (_ALL4 >> bits))
    net: Any = _new(IPv4Network)
    net.network_address = address
    net.netmask, net._prefixlen = _MASKS4[bits]
    return cast(IPv4Network, net)


def _lean6(value: int, bits: int) -> IPv6Network:
    address: Any = _new(IPv6Address)
    address._ip = value & (_ALL6 ^ (_ALL6 >> bits))
    address._scope_id = None
    net: Any = _new(IPv6Network)
    net.network_address = address
    net.netmask, net._prefixlen = _MASKS6[bits]
    return cast(IPv6Network, net)


def _agrees() -> bool:
    """Whether the lean networks are the constructor's, in everything tcdsl reads of them."""
    samples4 = [(0, 0), (0x0A000001, 8), (0x64400001, 32), (0xC0A80100, 24), (_ALL4, 31)]
    samples6 = [(0, 0), (0x20010DB8 << 96, 32), ((0x20010DB8 << 96) | 0x1234 << 64, 56), (1, 128)]
    pairs: list[tuple[IPv4Network | IPv6Network, IPv4Network | IPv6Network]] = [
        (_lean4(v, b), IPv4Network((v, b), strict=False)) for v, b in samples4
    ]
    pairs += [(_lean6(v, b), IPv6Network((v, b), strict=False)) for v, b in samples6]
    try:
        return all(
            lean == real
            and hash(lean) == hash(real)
            and str(lean) == str(real)
            and lean.prefixlen == real.prefixlen
            and lean.netmask == real.netmask
            and lean.hostmask == real.hostmask
            and lean.broadcast_address == real.broadcast_address
            and lean.num_addresses == real.num_addresses
            and lean.network_address == real.network_address
            and lean.network_address.packed == real.network_address.packed
            and lean.compressed == real.compressed
            and lean.exploded == real.exploded
            and lean.is_private == real.is_private
            and lean.subnet_of(real)  # type: ignore[arg-type]
            and real.overlaps(lean)
            and str(lean.network_address) == str(real.network_address)
            for lean, real in pairs
        )
    except Exception:  # another Python's inside: whatever it raised, use the constructor
        return False


LEAN = _agrees()
"""Whether this Python's ``ipaddress`` lets networks be made without the constructor."""


def ipv4_network(value: int, bits: int) -> IPv4Network:
    """``IPv4Network((value, bits), strict=False)``: host bits are cleared."""
    if LEAN:
        return _lean4(value, bits)
    return IPv4Network((value, bits), strict=False)


def ipv6_network(value: int, bits: int) -> IPv6Network:
    """``IPv6Network((value, bits), strict=False)``: host bits are cleared."""
    if LEAN:
        return _lean6(value, bits)
    return IPv6Network((value, bits), strict=False)
