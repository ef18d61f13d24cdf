"""iptables chain names: which a policy may own, and the one it gets by default."""

from __future__ import annotations

import re
import zlib

CHAIN_MAX = 28
"""iptables refuses a chain name of XT_EXTENSION_MAXNAMELEN (29) characters or more."""

CHAIN_CHARACTERS = "letters, digits, '_', '.' and '-'"
_CHAIN_SAFE = re.compile(r"[A-Za-z0-9_.-]+")

BUILTIN_CHAINS = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})
"""The built-in chains of iptables' and ip6tables' tables (filter, nat, mangle, raw, security)."""

IPTABLES_TARGETS = frozenset(
    {
        "ACCEPT",
        "DROP",
        "QUEUE",
        "RETURN",
        "standard",
        "AUDIT",
        "CHECKSUM",
        "CLASSIFY",
        "CLUSTERIP",
        "CONNMARK",
        "CONNSECMARK",
        "CT",
        "DNAT",
        "DNPT",
        "DSCP",
        "ECN",
        "HL",
        "HMARK",
        "IDLETIMER",
        "LED",
        "LOG",
        "MARK",
        "MASQUERADE",
        "NETMAP",
        "NFLOG",
        "NFQUEUE",
        "NOTRACK",
        "RATEEST",
        "REDIRECT",
        "REJECT",
        "SECMARK",
        "SET",
        "SNAT",
        "SNPT",
        "SYNPROXY",
        "TCPMSS",
        "TCPOPTSTRIP",
        "TEE",
        "TOS",
        "TPROXY",
        "TRACE",
        "TTL",
        "ULOG",
    }
)
"""Names iptables refuses for a chain ("chain name may not clash with target name"): the
verdicts and every target extension of iptables 1.8 (the upper-case ``libxt_``/``libipt_``
files; ``NAT`` is only a shared parser)."""


def chain_name_problem(name: str) -> tuple[str, str] | None:
    """Why ``name`` cannot be a policy's own iptables chain, as (code, message), or None.

    A policy owns the chain it names: its teardown flushes and deletes it. So a name must not
    be a built-in chain (in any spelling: the teardown of ``OUTPUT`` would flush the system's
    rules) or a target, and must be writable unquoted by every backend (an iptables-restore
    file does not unquote chain names).
    """
    if name.upper() in BUILTIN_CHAINS:
        return (
            "E215",
            f"'{name}' is a built-in iptables chain; tcdsl flushes and deletes the chain a "
            "policy names, so it must be a chain of the policy's own",
        )
    if name in IPTABLES_TARGETS:
        return "E215", f"'{name}' is an iptables target; iptables refuses it as a chain name"
    if not _CHAIN_SAFE.fullmatch(name):
        bad = next((ch for ch in name if not _CHAIN_SAFE.fullmatch(ch)), None)
        found = "is empty" if bad is None else f"contains {bad!r}"
        return "E216", f"chain name '{name}' {found}; a chain name takes {CHAIN_CHARACTERS}"
    if len(name) > CHAIN_MAX:
        return (
            "E216",
            f"chain name '{name}' is {len(name)} characters long; iptables allows at most "
            f"{CHAIN_MAX}",
        )
    if name.startswith("-"):
        return "E216", f"chain name '{name}' starts with '-', which iptables refuses"
    return None


def default_chain(interface: str) -> str:
    """The chain a ``classify by mark`` without ``chain NAME`` uses: ``TCDSL-<interface>``.

    Derived from the interface, so two policies for different interfaces never share it;
    characters a chain name does not take become ``_``, plus a checksum of the real name
    (so ``eth&0`` and ``eth_0`` stay apart), always within :data:`CHAIN_MAX`.
    """
    safe = "".join(ch if _CHAIN_SAFE.fullmatch(ch) else "_" for ch in interface)
    if safe == interface:
        return f"TCDSL-{interface}"
    return f"TCDSL-{safe[:12]}-{zlib.crc32(interface.encode()):08x}"
