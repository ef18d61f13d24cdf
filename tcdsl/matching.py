"""The order in which the kernel tries filters, and the header bits a u32 filter tests: what
the lints, ``verify`` and ``tcdsl.teach.classify`` share, so they agree with the kernel and with
each other."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from tcdsl import ir, lower
from tcdsl.allocate import DEFAULT_PREF

T = TypeVar("T")


Bits = tuple[tuple[int, int, int], ...]
"""A filter as the header bits it tests: sorted (offset, value, mask) words, masks non-zero."""


def filter_bits(keys: tuple[ir.U32Key, ...]) -> Bits | None:
    """The words a u32 filter with ``keys`` tests (() tests nothing: it matches every packet),
    or None when two keys contradict each other (allocate leaves such filters out)."""
    if len(keys) == 1:  # the common case, on large policies
        if keys[0].words[0] != "ip6":
            offset, value, mask = lower.pack(keys[0])
            return ((offset, value & mask, mask),) if mask else ()
        # the words of one key are at different offsets: nothing to merge
        return tuple(sorted((o, v & m, m) for o, v, m in lower.pack_words(keys[0]) if m))
    words = kernel_words(keys)
    return None if words is None else tuple(sorted(w for w in words if w[2]))


Words = tuple[tuple[int, int, int], ...]
"""A u32 filter's keys as the kernel holds them: (offset, value, mask) in tc's order."""


def kernel_words(keys: tuple[ir.U32Key, ...]) -> Words | None:
    """The keys of a u32 filter as tc packs them for the kernel, in order: a word for each
    offset, where its first key put it, later keys at that offset merged in (masks of 0
    kept: the kernel still reads the word); None when two keys contradict each other."""
    words: dict[int, tuple[int, int]] = {}
    for key in keys:
        for offset, value, mask in lower.pack_words(key):
            v, m = words.get(offset, (0, 0))
            if (v ^ value) & m & mask:
                return None
            words[offset] = (v | (value & mask), m | mask)
    return tuple((o, v, m) for o, (v, m) in words.items())


def words_verdict(words: Words, packet: bytes) -> bool | None:
    """Whether u32 finds ``words`` in ``packet`` (its bytes from the IP header to its end):
    True, False, or None when a word lies past the packet's end before one fails, on which
    u32 gives up its whole pref (``u32_classify``: ``if (!data) goto out``), not just the
    filter, and the kernel goes on at the next pref."""
    for offset, value, mask in words:
        if offset + 4 > len(packet):
            return None
        if int.from_bytes(packet[offset : offset + 4], "big") & mask != value:
            return False
    return True


def bits_match(bits: Bits, packet: bytes) -> bool:
    """True if ``packet`` (its bytes from the IP header on) has every word of ``bits``; a
    word past its end fails the match alone (an iptables rule's; a u32 filter gives up its
    pref: :func:`words_verdict`)."""
    return bool(words_verdict(bits, packet))


def match_pref(match: ir.Match) -> int:
    """The pref of the filters a match line becomes."""
    return match.pref.value if match.pref is not None else DEFAULT_PREF


def kernel_order(items: Iterable[T], pref: Callable[[T], int]) -> list[T]:
    """``items`` (in the order they are added to the kernel) in the order the kernel tries
    them: by pref ascending, then in the order added within one pref (a stable sort)."""
    return sorted(items, key=pref)


def filters_at(iface: ir.Interface, parent: ir.Handle) -> list[ir.Filter]:
    """The filters attached to ``parent`` (a qdisc or class), in the order tried."""
    return _filters_by_parent(iface).get(parent, [])


@ir.per_node
def _filters_by_parent(iface: ir.Interface) -> dict[ir.Handle, list[ir.Filter]]:
    """Each parent's filters in the order tried, sorted once per interface (classify asks for
    them packet by packet: a table of 5,000 subscribers was sorted again for each)."""
    by_parent: dict[ir.Handle, list[ir.Filter]] = {}
    for f in iface.filters:
        by_parent.setdefault(f.parent, []).append(f)
    return {parent: kernel_order(found, lambda f: f.pref) for parent, found in by_parent.items()}
