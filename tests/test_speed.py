"""The shortcuts taken for large policies give what the plain code gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from tcdsl import ir, lower
from tcdsl.driver import analyse
from tests.conftest import POLICIES

EXAMPLES = sorted(POLICIES.glob("*.tcp"))


def _nodes(value: Any) -> Iterator[Any]:
    """Every IR dataclass instance in ``value``, depth first."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield value
        for f in dataclasses.fields(value):
            yield from _nodes(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from _nodes(item)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_ir_replace_is_dataclasses_replace(path: Any) -> None:
    policy = analyse(str(path)).policy
    assert policy is not None
    for node in _nodes(policy):
        assert ir.replace(node) == node
        first = dataclasses.fields(node)[0].name
        other = dataclasses.replace(node, **{first: None})
        assert ir.replace(node, **{first: None}) == other
        assert type(ir.replace(node, **{first: None})) is type(other)


def test_memoised_lowering_is_per_object() -> None:
    """Equal match lines parsed twice get their own conditions (the lints compare them by
    identity with the line's own), and a memoised result is the one computed before."""
    text = "interface eth0 htb rate 10mbit default a {\n  class a rate 1mbit match u8 1 at 9\n}\n"

    def line() -> ir.Match:
        policy = analyse("x.tcp", loader=lambda _: text).policy
        assert policy is not None
        root = policy.interfaces[0].root
        assert isinstance(root, ir.Htb)
        (cls,) = (c for c in ir.classes_of(root) if c.name == "a")
        return cls.matches[0]

    a, b = line(), line()
    assert a == b and a is not b
    alts_a = lower.filter_alternatives(a, ("ipv4",))
    alts_b = lower.filter_alternatives(b, ("ipv4",))
    assert alts_a == alts_b
    assert alts_a[0][1][0] is a.conds[0] and alts_b[0][1][0] is b.conds[0]
    assert lower.filter_alternatives(a, ("ipv4",)) is alts_a
    assert lower.u32_keys(alts_a[0][1], "ipv4") is lower.u32_keys(alts_a[0][1], "ipv4")
