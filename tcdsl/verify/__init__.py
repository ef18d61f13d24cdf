"""Verify a policy on a real kernel: apply its script in a throwaway place, read the state back
and report every difference at the policy line it comes from (codes E401-E405, W406).

``readback`` parses what tc and iptables-save print; ``expect`` derives the state a policy
should produce; ``compare`` turns the two into diagnostics; ``runner`` runs the cases (host
network namespaces, or user-mode Linux); ``verifier`` sequences it all.
"""

from __future__ import annotations

from tcdsl.verify.verifier import (
    KERNELS,
    Checked,
    KernelChoice,
    Verification,
    VerifyError,
    verify,
    verify_many,
)

__all__ = [
    "KERNELS",
    "Checked",
    "KernelChoice",
    "Verification",
    "VerifyError",
    "verify",
    "verify_many",
]
