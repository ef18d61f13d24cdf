"""Lints: advice over the allocated policy, where filter order, prefs and marks are final.

The checks (``tcdsl.checks``) find what tc or the kernel would refuse; the lints find what the
kernel accepts but that silently does something else than the policy seems to say: filters that
never see a packet, classes nothing reaches, quanta and bursts the kernel adjusts. Every lint is
a function from an allocated policy to diagnostics; ``LINTS`` lists them in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic

Lint = Callable[[ir.Policy], Iterator[Diagnostic]]

LINTS: tuple[Lint, ...] = ()


def run_lints(policy: ir.Policy) -> list[Diagnostic]:
    """Run every lint over an allocated policy and return all diagnostics."""
    return [d for lint in LINTS for d in lint(policy)]
