"""The pieces of syntax the Transformer hands from rule to rule, and the names a match may use
(protocols, DSCP classes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tcdsl import ir
from tcdsl.diagnostics import Span
from tcdsl.frontend.values import Expr

# ---- syntax pieces handed from rule to rule ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    key: str
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class Flag:
    key: str
    span: Span


@dataclass(frozen=True, slots=True)
class DefaultOpt:
    name: ir.Name


@dataclass(frozen=True, slots=True)
class HandleOpt:
    keyword: str
    ref: ir.HandleRef | None
    span: Span


@dataclass(frozen=True, slots=True)
class PriomapOpt:
    values: tuple[ir.Count, ...]
    span: Span


Opt = Param | Flag | DefaultOpt | HandleOpt | PriomapOpt | ir.Match


@dataclass(frozen=True, slots=True)
class ClassSyntax:
    name: str
    span: Span
    opts: tuple[Opt, ...]
    body: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class QdiscSyntax:
    """A qdisc plus the ``classify`` statements found directly in its body."""

    qdisc: ir.Qdisc
    classify: tuple[ir.Marking, ...]


@dataclass(frozen=True, slots=True)
class Body:
    items: tuple[Any, ...]


PROTOCOLS: dict[str, int] = {
    "icmp": 1,
    "igmp": 2,
    "ipip": 4,
    "tcp": 6,
    "udp": 17,
    "ipv6": 41,
    "gre": 47,
    "esp": 50,
    "ah": 51,
    "icmpv6": 58,
    "ospf": 89,
    "pim": 103,
    "vrrp": 112,
    "sctp": 132,
}
DSCP_NAMES: dict[str, int] = {
    "be": 0,
    "cs0": 0,
    **{f"cs{i}": i * 8 for i in range(1, 8)},
    **{f"af{c}{d}": c * 8 + d * 2 for c in range(1, 5) for d in range(1, 4)},
    "ef": 46,
    "va": 44,
}
