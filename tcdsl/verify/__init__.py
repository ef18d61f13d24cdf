"""Verify a policy on a real kernel: apply its script in a throwaway place, read the state back
and report every difference at the policy line it comes from (codes E401-E405, W406).

``readback`` parses what tc, iptables-save and ip6tables-save print; ``expect`` derives the
state a policy should produce; ``compare`` turns the two into diagnostics; ``runner`` runs the
cases (host network namespaces, or user-mode Linux); ``verifier`` sequences it all.

Both address families are checked: each filter has its family's ``protocol`` (``ip``, or
``ipv6`` at the pref + 0x8000), u32 ``ip6`` keys as tc packs them, flower filters (which only
user-mode Linux has here: ``auto`` sends such a policy there), fw filters per family, and the
marking chain in iptables and in ip6tables. Messages name the family (``IPv6 filter to 1:20
(pref 32769)``, ``IPv6 mark rule for 'web'``, ``ip6tables chain``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

KernelChoice = Literal["host", "uml", "auto"]
KERNELS: tuple[KernelChoice, ...] = ("auto", "host", "uml")

APPLIERS = frozenset({"shell", "tc-batch"})
"""Backends whose output the runner knows how to apply (``sh``; ``tc -batch`` and
``iptables-restore`` through a small script, :func:`verifier.batch_applier`)."""

if TYPE_CHECKING:
    from tcdsl.verify.verifier import Checked, Verification, VerifyError, verify, verify_many

_VERIFIER = ("Checked", "Verification", "VerifyError", "verify", "verify_many")


def __getattr__(name: str) -> Any:
    # The verifier (and the readback, expectations and runners it imports) loads on first use:
    # the CLI names the kernels and appliers in its options, and check or compile needs no more.
    if name in _VERIFIER:
        from tcdsl.verify import verifier

        return getattr(verifier, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "APPLIERS",
    "KERNELS",
    "Checked",
    "KernelChoice",
    "Verification",
    "VerifyError",
    "verify",
    "verify_many",
]
