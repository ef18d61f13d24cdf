"""The kernel a policy is meant for: which qdiscs and classifiers it has.

``--kernel 6.8`` (a version) or ``--kernel /boot/config-6.1.0-18-amd64`` (a kernel
configuration) names the target; ``kernel_support(policy, target)`` reports E213 for each
construct the target lacks and, without a target, W306 for cbq (which no current kernel has).

Versions: every feature the language expresses is older than Linux 2.6.12 (the start of the
kernel's git history), except fq_codel and codel (3.5), netem's ``rate`` (3.3), fq (3.12),
fq_pie (5.6; Debian 12's 6.1 kernels do not build it), the ifb device that downloads are shaped
on (2.6.19), the connmark action (4.0) and the flower classifier (``classifier flower``: 4.2;
its port ranges 5.0; its TOS and TCP flags keys are in by 4.13). cbq was removed in 6.3;
the removal was also backported to the 6.1 stable kernels in 6.1.82 (Debian 12's kernels
followed). A configuration file decides by its ``CONFIG_`` lines instead: ``=y`` or ``=m`` is
present, ``is not set`` or no line at all is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Span

Version = tuple[int, int, int]

OLDEST: Version = (2, 6, 12)
"""The oldest kernel tcdsl knows about; older versions are refused."""

CBQ_MIGRATION = "use htb: a bounded cbq class is an htb class with ceil = rate"


@dataclass(frozen=True, slots=True)
class Feature:
    """Something a policy can need from the kernel."""

    name: str
    """As messages name it: ``cbq qdisc``."""
    configs: tuple[str, ...]
    """Every kernel option it needs."""
    since: Version = OLDEST
    removed: Version | None = None
    removed_in: Mapping[tuple[int, int], int] | None = None
    """Stable series that dropped it too: (major, minor) -> first patch level without it."""
    hint: str = ""
    alternatives: tuple[tuple[str, ...], ...] = ()
    """Other sets of options that do as well as ``configs`` (in a configuration file)."""


_SCHED = "CONFIG_NET_SCHED"
_CLS = "CONFIG_NET_CLS"

FEATURES: Mapping[str, Feature] = {
    "htb": Feature("htb qdisc", (_SCHED, "CONFIG_NET_SCH_HTB")),
    "prio": Feature("prio qdisc", (_SCHED, "CONFIG_NET_SCH_PRIO"), hint="use htb classes"),
    "tbf": Feature("tbf qdisc", (_SCHED, "CONFIG_NET_SCH_TBF"), hint="use an htb class"),
    "netem": Feature("netem qdisc", (_SCHED, "CONFIG_NET_SCH_NETEM")),
    "netem-rate": Feature(
        "rate for netem",
        (_SCHED, "CONFIG_NET_SCH_NETEM"),
        since=(3, 3, 0),
        hint="put a tbf under the netem for the rate",
    ),
    "cbq": Feature(
        "cbq qdisc",
        (_SCHED, "CONFIG_NET_SCH_CBQ"),
        removed=(6, 3, 0),
        removed_in={(6, 1): 82},
        hint=CBQ_MIGRATION,
    ),
    "pfifo_fast": Feature("pfifo_fast qdisc", (_SCHED,)),
    "pfifo": Feature("pfifo qdisc", (_SCHED, "CONFIG_NET_SCH_FIFO")),
    "bfifo": Feature("bfifo qdisc", (_SCHED, "CONFIG_NET_SCH_FIFO")),
    "sfq": Feature("sfq qdisc", (_SCHED, "CONFIG_NET_SCH_SFQ"), hint="use pfifo"),
    "fq_codel": Feature(
        "fq_codel qdisc",
        (_SCHED, "CONFIG_NET_SCH_FQ_CODEL"),
        since=(3, 5, 0),
        hint="use sfq, the fair queue older kernels have",
    ),
    "ingress": Feature("ingress qdisc", (_SCHED, "CONFIG_NET_SCH_INGRESS")),
    "mq": Feature(
        "mq qdisc with queue steering (a clsact qdisc whose filters' skbedit queue_mapping picks "
        "the TX queue, kept since 5.18)",
        (_SCHED, "CONFIG_NET_SCH_INGRESS", "CONFIG_NET_CLS_ACT", "CONFIG_NET_ACT_SKBEDIT"),
        since=(5, 18, 0),
    ),
    "ifb": Feature(
        "ifb device (downloads are shaped on one)",
        ("CONFIG_IFB", "CONFIG_NET_SCH_INGRESS", "CONFIG_NET_CLS_ACT", "CONFIG_NET_ACT_MIRRED"),
        since=(2, 6, 19),
    ),
    "connmark": Feature(
        "connmark action", ("CONFIG_NET_CLS_ACT", "CONFIG_NET_ACT_CONNMARK"), since=(4, 0, 0)
    ),
    "police": Feature("police action", ("CONFIG_NET_CLS_ACT", "CONFIG_NET_ACT_POLICE")),
    "hfsc": Feature("hfsc qdisc", (_SCHED, "CONFIG_NET_SCH_HFSC"), hint="use htb"),
    "cake": Feature(
        "cake qdisc",
        (_SCHED, "CONFIG_NET_SCH_CAKE"),
        since=(4, 19, 0),
        hint="use htb with fq_codel leaves, and a size table for the overhead",
    ),
    "stab": Feature(
        "size tables (tc's stab, for link-layer overhead)", (_SCHED,), since=(2, 6, 27)
    ),
    "codel": Feature(
        "codel qdisc", (_SCHED, "CONFIG_NET_SCH_CODEL"), since=(3, 5, 0), hint="use red or pfifo"
    ),
    "fq": Feature(
        "fq qdisc", (_SCHED, "CONFIG_NET_SCH_FQ"), since=(3, 12, 0), hint="use sfq or fq_codel"
    ),
    "fq_pie": Feature(
        "fq_pie qdisc",
        (_SCHED, "CONFIG_NET_SCH_FQ_PIE"),
        since=(5, 6, 0),
        hint="use fq_codel, the fair AQM queue older kernels have",
    ),
    "red": Feature("red qdisc", (_SCHED, "CONFIG_NET_SCH_RED")),
    "u32": Feature("u32 classifier", (_CLS, "CONFIG_NET_CLS_U32")),
    "flower": Feature(
        "flower classifier",
        (_CLS, "CONFIG_NET_CLS_FLOWER"),
        since=(4, 2, 0),
        hint="use 'classifier u32'",
    ),
    "flower-keys": Feature(
        "TOS and TCP flags keys in flower",
        (_CLS, "CONFIG_NET_CLS_FLOWER"),
        since=(4, 13, 0),
        hint="use 'classifier u32'",
    ),
    "flower-ranges": Feature(
        "port ranges in flower",
        (_CLS, "CONFIG_NET_CLS_FLOWER"),
        since=(5, 0, 0),
        hint="use 'classifier u32', or single ports",
    ),
    "fw": Feature("fw classifier", (_CLS, "CONFIG_NET_CLS_FW"), hint="use u32 matches"),
    "iptables-mark": Feature(
        "firewall marking (iptables' mangle table and MARK target, or nftables)",
        ("CONFIG_IP_NF_IPTABLES", "CONFIG_IP_NF_MANGLE", "CONFIG_NETFILTER_XT_MARK"),
        hint="use u32 matches (drop 'classify by mark')",
        alternatives=(("CONFIG_NF_TABLES", "CONFIG_NF_TABLES_INET"),),
    ),
    "iptables-dscp": Feature(
        "DSCP rewriting (iptables' DSCP target, or nftables)",
        ("CONFIG_IP_NF_IPTABLES", "CONFIG_IP_NF_MANGLE", "CONFIG_NETFILTER_XT_TARGET_DSCP"),
        hint="drop 'set dscp'",
        alternatives=(("CONFIG_NF_TABLES", "CONFIG_NF_TABLES_INET"),),
    ),
    "ip6tables-mark": Feature(
        "IPv6 firewall marking (ip6tables' mangle table and MARK target, or nftables)",
        ("CONFIG_IP6_NF_IPTABLES", "CONFIG_IP6_NF_MANGLE", "CONFIG_NETFILTER_XT_MARK"),
        hint="mark IPv4 only ('family ipv4'), or use u32 matches",
        alternatives=(("CONFIG_NF_TABLES", "CONFIG_NF_TABLES_INET"),),
    ),
    "ip6tables-dscp": Feature(
        "IPv6 DSCP rewriting (ip6tables' DSCP target, or nftables)",
        ("CONFIG_IP6_NF_IPTABLES", "CONFIG_IP6_NF_MANGLE", "CONFIG_NETFILTER_XT_TARGET_DSCP"),
        hint="mark IPv4 only ('family ipv4'), or drop 'set dscp'",
        alternatives=(("CONFIG_NF_TABLES", "CONFIG_NF_TABLES_INET"),),
    ),
}
"""What each construct needs, by feature key (qdisc kinds are their own keys)."""


_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?(?:[-+~_][\w.+~-]*)?")


def parse_version(text: str) -> Version | None:
    """``6.1`` -> (6, 1, 0); ``6.1.82``, ``6.1.0-18-amd64`` -> (6, 1, 82), (6, 1, 0)."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True, slots=True)
class KernelTarget:
    """A target kernel: a version, or the options of a kernel configuration file."""

    label: str
    """As messages name it: ``6.8`` or ``config-6.1.0-18-amd64``."""
    version: Version | None = None
    config: Mapping[str, str] | None = None
    """Option -> value (``y``, ``m``, a string) for every option the file sets."""

    def missing(self, feature: Feature) -> str | None:
        """Why this kernel lacks ``feature`` (for a message), or None if it has it."""
        if self.config is not None:
            config = self.config
            for options in feature.alternatives:
                if all(config.get(c, "n") in ("y", "m") for c in options):
                    return None
            absent = [c for c in feature.configs if config.get(c, "n") not in ("y", "m")]
            return f"{', '.join(absent)} not set" if absent else None
        assert self.version is not None
        v = self.version
        if v < feature.since:
            return f"added in Linux {_dotted(feature.since)}"
        if feature.removed is not None and v >= feature.removed:
            return f"removed in Linux {_dotted(feature.removed)}"
        series = (feature.removed_in or {}).get(v[:2])
        if series is not None and v[2] >= series:
            gone = _dotted(feature.removed or v)
            return f"removed in Linux {gone}, and in {v[0]}.{v[1]}.{series}"
        return None


def _dotted(v: Version) -> str:
    return f"{v[0]}.{v[1]}" if v[2] == 0 else f"{v[0]}.{v[1]}.{v[2]}"


def parse_config(text: str) -> dict[str, str]:
    """The options a kernel ``.config`` sets: ``CONFIG_X=y`` -> {"CONFIG_X": "y"}."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(CONFIG_\w+)=(.*?)\s*", line)
        if m:
            found[m.group(1)] = m.group(2).strip('"')
    return found


def load_target(spec: str) -> KernelTarget:
    """A target from ``--kernel``: a version such as 6.1 or 6.1.82, or a config file's path.

    Raises ValueError with a message for the user when it is neither.
    """
    version = parse_version(spec)
    if version is not None:
        if version < OLDEST:
            raise ValueError(f"tcdsl knows kernels from {_dotted(OLDEST)} on, not {spec}")
        return KernelTarget(spec.strip(), version=version)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"'{spec}' is neither a kernel version (such as 6.1 or 6.1.82) nor a kernel "
            "configuration file"
        )
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ValueError(f"cannot read '{spec}': {err.strerror or err}") from err
    config = parse_config(text)
    if not config:
        raise ValueError(f"'{spec}' has no CONFIG_ lines; is it a kernel configuration file?")
    return KernelTarget(path.name, config=config)


def _needs(policy: ir.Policy) -> Iterator[tuple[str, Span]]:
    """Each feature the policy needs, at the construct that needs it (in source order)."""
    for iface in policy.interfaces:
        if iface.stab is not None:
            yield "stab", iface.stab.span
        matched: Span | None = None
        if iface.download is not None:
            yield "ifb", iface.download.span
            if iface.download.connmark:
                yield "connmark", iface.download.span
        for q in ir.walk_qdiscs(iface.root):
            yield q.kind, q.span
            if isinstance(q, ir.Netem) and q.rate is not None:
                yield "netem-rate", q.rate.span
            for _, m in ir.matches_of(q):
                matched = matched or m.span
                if m.police is not None:
                    yield "police", m.police.span
        classifier = "flower" if iface.classifier == "flower" else "u32"
        if iface.marking is not None:
            yield "fw", iface.marking.span
            tables = {"ipv4": "iptables", "ipv6": "ip6tables"}
            for family in iface.families:
                yield f"{tables[family]}-mark", iface.marking.span
            classes = [c for q in ir.walk_qdiscs(iface.root) for c in ir.classes_of(q)]
            for cls in classes:
                if cls.set_dscp is not None:
                    for family in iface.families:
                        yield f"{tables[family]}-dscp", cls.set_dscp.span
            own = [m for c in classes for m in c.matches]
            pref = next((m.span for m in own if m.pref is not None), None)
            if pref is not None:  # a match line that keeps its pref stays a filter of its own
                yield classifier, pref
        elif matched is not None:
            # flower at the words that ask for it, u32 at the first match line
            yield classifier, iface.classifier_span or matched
        yield from _flower_keys(iface)


def _flower_keys(iface: ir.Interface) -> Iterator[tuple[str, Span]]:
    """The newer flower keys a ``classifier flower`` tree's match lines use (the TOS byte,
    TCP flags; port ranges), at the condition that uses them."""
    if iface.classifier != "flower":
        return
    for q in ir.walk_qdiscs(iface.root):
        for _, m in ir.matches_of(q):
            for cond in m.conds:
                match cond:
                    case ir.TosCond() | ir.TcpFlagsCond():
                        yield "flower-keys", cond.span
                    case ir.PortCond() if any(p.lo != p.hi for p in cond.ports):
                        yield "flower-ranges", cond.span
                    case _:
                        pass


def kernel_support(policy: ir.Policy, target: KernelTarget | None) -> Iterator[Diagnostic]:
    """E213 for each construct the target kernel lacks; without a target, W306 for cbq."""
    seen: set[tuple[str, Span]] = set()
    for key, span in _needs(policy):
        if (key, span) in seen:
            continue
        seen.add((key, span))
        feature = FEATURES[key]
        if target is None:
            if key == "cbq":
                yield Diagnostic.warning(
                    "W306",
                    "cbq was removed from Linux in 6.3 (and from Debian's 6.1 kernels in "
                    f"6.1.82); {CBQ_MIGRATION}",
                    span,
                )
            continue
        why = target.missing(feature)
        if why is None:
            continue
        hint = f"; {feature.hint}" if feature.hint else ""
        yield Diagnostic.error(
            "E213", f"the target kernel {target.label} has no {feature.name} ({why}){hint}", span
        )
