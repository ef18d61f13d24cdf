"""``tcdsl explain``: an allocated policy in plain English, class by class.

For students, teachers and admins: per interface, what the root qdisc does; per class (in tree
order), what it is guaranteed, what it may borrow and from whom, its priority, which traffic
reaches it and its leaf queue; the order packets are classified in; what happens to traffic no
filter takes; and for prio and pfifo_fast, the kernel's TOS -> priority -> band table.

The text is built as a small document model (headings, paragraphs, labelled items, lists,
tables) and rendered as plain text (wrapped at 100 columns, classes indented by depth) or as
Markdown. ``explain`` is pure and deterministic: the same policy gives the same text.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from tcdsl import ir, linklayer
from tcdsl.allocate import IPV6_PREF_OFFSET, default_minor
from tcdsl.checks import children_overbook, leaf_cap, link_rate
from tcdsl.commands import DOWNLOAD_HOOKS, IFB_TXQUEUELEN, mark_text
from tcdsl.diagnostics import Diagnostic, Span
from tcdsl.directions import PRIVATE
from tcdsl.lint import filters_all_reachable
from tcdsl.tcmath import (
    DEFAULT_PRIOMAP,
    HTB_DEFAULT_R2Q,
    HTB_QUANTUM,
    htb_quantum,
    htb_r2q,
    red_thresholds,
    tbf_queue_limit,
    tos_priority,
)
from tcdsl.units import format_rate, format_size, format_time
from tcdsl.words import (
    FAMILY_NAMES,
    TOS_BITS,
    curve_phrases,
    dscp_name,
    match_phrase,
    match_text,
    or_list,
    police_phrase,
    shared_filters,
)

Format = Literal["text", "markdown"]

WIDTH = 100
"""Plain text is wrapped at this many columns."""

# ---- kernel tables -----------------------------------------------------------------------------

TC_PRIO_NAMES: dict[int, str] = {
    0: "best effort",
    1: "filler",
    2: "bulk",
    4: "interactive bulk",
    6: "interactive",
    7: "control",
}
"""include/uapi/linux/pkt_sched.h: the named Linux priorities (TC_PRIO_*)."""

TXQUEUELEN = "txqueuelen packets (the device's transmit queue length, 1000 on most Ethernet cards)"


TOS_SHORT: tuple[tuple[int, str], ...] = (
    (0x10, "low delay"),
    (0x08, "high throughput"),
    (0x04, "high reliability"),
    (0x02, "low cost"),
)
"""Short names of the TOS bits, for the table."""


def priority_words(priority: int) -> str:
    """A Linux priority by number and name (``6 (interactive)``)."""
    name = TC_PRIO_NAMES.get(priority)
    return f"{priority} ({name})" if name else str(priority)


def priomap_of(q: ir.Prio | ir.PfifoFast) -> tuple[int, ...]:
    """The priority -> band map of a prio qdisc (its own, or tc's default) or of pfifo_fast."""
    if isinstance(q, ir.Prio) and q.priomap is not None:
        return tuple(c.value for c in q.priomap)
    return DEFAULT_PRIOMAP


def tos_band(q: ir.Prio | ir.PfifoFast, tos: int) -> int:
    """The band (0 first) a packet with this TOS byte goes to when no filter takes it."""
    return priomap_of(q)[tos_priority(tos)]


# ---- the document model ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heading:
    """A title: level 1 the policy, 2 an interface, 3 a part of it, 4 a class (at ``depth``)."""

    level: int
    text: str
    depth: int = 0


@dataclass(frozen=True, slots=True)
class Para:
    """A paragraph."""

    text: str
    depth: int = 0


@dataclass(frozen=True, slots=True)
class Item:
    """A labelled fact of a class (``Rate: guaranteed 40mbit ...``), with optional sub-points."""

    label: str
    text: str
    depth: int = 0
    points: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Steps:
    """A numbered list."""

    items: tuple[str, ...]
    depth: int = 0


@dataclass(frozen=True, slots=True)
class Table:
    """A table with a header row."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    depth: int = 0


Block = Heading | Para | Item | Steps | Table


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def render_text(blocks: list[Block]) -> str:
    """Plain text: underlined titles, wrapped paragraphs, classes indented by depth."""
    out: list[str] = []
    previous: Block | None = None
    for block in blocks:
        tight = isinstance(block, Item) and isinstance(previous, Item | Heading)
        if previous is not None and not (tight and previous.depth <= block.depth):
            out.append("")
        ind = "  " * block.depth
        match block:
            case Heading(level=1 | 2):
                out += [block.text, ("=" if block.level == 1 else "-") * len(block.text)]
            case Heading():
                colon = block.level == 3 and not block.text.endswith(":")  # "under tbf 2:"
                out.append(ind + block.text + (":" if colon else ""))
            case Para():
                out += _wrap(block.text, ind, ind)
            case Item():
                out += _wrap(f"{block.label}: {block.text}", ind, ind + "  ")
                for point in block.points:
                    out += _wrap(point, ind + "  - ", ind + "    ")
            case Steps():
                for number, step in enumerate(block.items, start=1):
                    first = f"{ind}{number:>2}. "
                    out += _wrap(step, first, " " * len(first))
            case Table():
                rows = [block.header, *block.rows]
                widths = [max(len(row[i]) for row in rows) for i in range(len(block.header))]

                def line(cells: tuple[str, ...], widths: list[int] = widths, ind: str = ind) -> str:
                    pairs = zip(cells, widths, strict=True)
                    return ind + "  ".join(c.ljust(w) for c, w in pairs).rstrip()

                out.append(line(block.header))
                out.append(line(tuple("-" * w for w in widths)))
                out += [line(row) for row in block.rows]
        previous = block
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(blocks: list[Block]) -> str:
    """Markdown: ``#`` headings (classes one level deeper per tree level), bullets, tables."""
    out: list[str] = []
    previous: Block | None = None
    for block in blocks:
        tight = isinstance(block, Item) and isinstance(previous, Item)
        if previous is not None and not tight:
            out.append("")
        match block:
            case Heading():
                level = min(block.level + block.depth, 6)
                out.append("#" * level + " " + block.text)
            case Para():
                out.append(block.text)
            case Item():
                out.append(f"- **{block.label}:** {block.text}")
                out += [f"  - {point}" for point in block.points]
            case Steps():
                out += [f"{n}. {step}" for n, step in enumerate(block.items, start=1)]
            case Table():
                out.append("| " + " | ".join(_cell(c) for c in block.header) + " |")
                out.append("|" + "|".join("---" for _ in block.header) + "|")
                out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        previous = block
    return "\n".join(out) + "\n"


# ---- small words ---------------------------------------------------------------------------------


def _rate(value: ir.Rate | ir.Percent | None) -> int | None:
    return value.bits_per_second if isinstance(value, ir.Rate) else None


def _pct(value: Fraction) -> str:
    return f"{float(value):.6g}%"


def _ce_threshold(time: ir.Time | None) -> str:
    if time is None:
        return ""
    return (
        f" ce_threshold {format_time(time.microseconds)}: it marks ECN-capable packets that "
        "waited longer than that (for DCTCP-style senders)."
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _size(n: int) -> str:
    """A size as tc spells it, and in bytes when that is not the same (``15k (15360 bytes)``)."""
    spelled = format_size(n)
    return f"{n} bytes" if spelled.isdigit() else f"{spelled} ({n} bytes)"


_NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _handle(q: ir.Qdisc) -> str:
    return q.handle.qdisc if q.handle is not None else "?:"


@dataclass(frozen=True, slots=True)
class _Holder:
    """What holds a classful qdisc below the root: a class, or a tbf or netem it is chained to."""

    ref: str
    """``'site' (1:10)``, ``tbf 2:``."""
    chain: bool
    """True when ``ref`` is a tbf or netem, False when it is a class."""
    bound: ir.Bound | None
    """The most it can send (from ``ir.held_qdiscs``)."""

    @property
    def where(self) -> str:
        """``in 'site' (1:10)``, ``under tbf 2:``."""
        return f"{'under' if self.chain else 'in'} {self.ref}"


def _guaranteed(q: ir.ClassfulQdisc) -> int | None:
    """What the classes of an htb are guaranteed together: the link class's rate, or the sum of
    the root classes' rates (None for prio and cbq, which guarantee no rate as a whole)."""
    if not isinstance(q, ir.Htb):
        return None
    rates = [_rate(top.rate) for top in q.classes]
    return sum(r for r in rates if r is not None)


# ---- the explainer -------------------------------------------------------------------------------


def _class_index(
    iface: ir.Interface,
) -> tuple[dict[ir.Handle, ir.Class], dict[tuple[ir.Handle, object], ir.Match]]:
    """Every class of ``iface`` by class id, and its match lines by (class id, span)."""
    owners: dict[ir.Handle, ir.Class] = {}
    lines: dict[tuple[ir.Handle, object], ir.Match] = {}
    for each in ir.walk_qdiscs(iface.root):
        for cls in ir.classes_of(each):
            if cls.classid is not None:
                owners[cls.classid] = cls
                for m in cls.matches:
                    lines[(cls.classid, m.span)] = m
    return owners, lines


_UNSEEN = {
    "prerouting": "Packets that never pass that chain (this host's own traffic, for one) "
    "carry no mark and go where unmatched traffic goes.",
    "output": "Forwarded packets never pass that chain: they carry no mark and go where "
    "unmatched traffic goes.",
    "postrouting": "Every packet leaving by the interface passes that chain.",
}


_UNSEEN_DOWNLOAD = (
    "The first packets of a connection reach the IFB before the firewall has marked the "
    "connection: they carry no mark and go where unmatched traffic goes."
)


class _Explainer:
    """Builds the blocks of one policy; ``fmt`` only decides how names and code are quoted."""

    def __init__(self, fmt: Format, dead: dict[Span, Diagnostic] | None = None) -> None:
        self.fmt = fmt
        self.dead = dead or {}
        """The match lines that never match (W312, W313), by span: said so where listed."""
        self.blocks: list[Block] = []
        self.arriving: set[str] = set()
        """Interfaces whose arrivals the policy shapes or polices."""
        self.tree: tuple[ir.Family, ...] = ir.FAMILIES
        """The families of the tree being explained: what its filters see."""
        self.classifier: ir.Classifier = "u32"
        self.any_protocol = False
        """Whether the tree's port conditions take packets of any protocol (u32 on IPv4)."""
        self.filters: tuple[ir.Filter, ...] = ()
        """The filters of the tree being explained."""
        self.filtered: tuple[ir.Family, ...] = ir.FAMILIES
        """The families the tree has filters for (a dual-stack tree whose lines all name IPv4
        addresses has none for IPv6): what its filters see."""

    # the families a tree's filters see, and what they do not
    def seen(self) -> str:
        """``IPv4``, ``IPv6`` or ``IPv4 and IPv6``: the packets the filters look at."""
        return " and ".join(FAMILY_NAMES[f] for f in self.filtered)

    def unseen(self) -> tuple[str, str]:
        """What the filters never see: (``not IPv4``, ``ARP, IPv6``); with both families,
        (``neither IPv4 nor IPv6``, ``ARP``)."""
        if len(self.filtered) == 2:
            return "neither IPv4 nor IPv6", "ARP"
        other = "IPv6" if self.filtered == ("ipv4",) else "IPv4"
        return f"not {self.seen()}", f"ARP, {other}"

    # quoting
    def name(self, text: str) -> str:
        """A class or interface name."""
        return self.code(text) if self.fmt == "markdown" else f"'{text}'"

    def code(self, text: str) -> str:
        """Policy or tc text, as written."""
        if self.fmt == "text":
            return text
        fence = "``" if "`" in text else "`"
        pad = " " if fence == "``" else ""
        return f"{fence}{pad}{text}{pad}{fence}"

    def cls_ref(self, cls: ir.Class) -> str:
        """``'web' (1:30)``, or ``the link class 1:1``."""
        if cls.implicit:
            return f"the link class {cls.classid}"
        return f"{self.name(cls.name)} ({cls.classid})"

    def add(self, block: Block) -> None:
        self.blocks.append(block)

    # ---- the whole policy
    def policy(self, policy: ir.Policy) -> list[Block]:
        self.add(Heading(1, f"What {policy.source} does"))
        n = len(dict.fromkeys(i.interface for i in policy.interfaces))
        count = (
            f"{_NUMBERS[n]} interface{'s' * (n != 1)}" if n < len(_NUMBERS) else f"{n} interfaces"
        )
        self.arriving = {i.interface for i in policy.interfaces if i.direction != "egress"}
        if not self.arriving:
            intro = (
                "Traffic control acts on egress: on the packets each interface sends, not on "
                "those it receives."
            )
        else:
            intro = (
                "Queues act on egress, on the packets a device sends: uploads are shaped "
                "where the interface sends them."
            )
            if any(i.download is not None for i in policy.interfaces):
                intro += (
                    " Downloads arrive too late to be queued on the interface they arrive on, "
                    "so a download is redirected as it arrives to an IFB device and shaped as "
                    "the IFB sends it on."
                )
            if any(isinstance(i.root, ir.Ingress) for i in policy.interfaces):
                intro += (
                    " Ingress policers act on arriving packets directly: they cannot queue or "
                    "delay, only let packets through or drop them."
                )
        self.add(Para(f"This policy sets up traffic control on {count}. {intro}"))
        for iface in policy.interfaces:
            self.interface(iface)
        return self.blocks

    def interface(self, iface: ir.Interface) -> None:
        dev = self.name(iface.interface)
        self.tree, self.classifier = iface.families, iface.classifier
        self.any_protocol = (
            iface.classifier == "u32" and "ipv4" in iface.families and iface.marking is None
        )
        self.filters = iface.filters
        present = {f.family for f in iface.filters}
        self.filtered = tuple(f for f in ir.FAMILIES if f in present) or iface.families
        if iface.download is not None:
            title = f"Interface {dev}, download (via {self.name(iface.name)})"
        elif isinstance(iface.root, ir.Ingress):
            self.add(Heading(2, f"Interface {dev}, ingress policers"))
            self.ingress(iface, iface.root)
            return
        else:
            title = f"Interface {dev}{', upload' if iface.interface in self.arriving else ''}"
        self.add(Heading(2, title))
        root = iface.root
        if iface.download is not None:
            self.add(Para(self.download_sentence(iface, iface.download)))
        self.add(Para(self.root_sentence(iface)))
        if iface.stab is not None:
            where = "each TX queue's qdisc" if isinstance(root, ir.Mq) else "the root qdisc"
            self.add(Para(self.link_layer(iface.stab, stab=True, where=where)))
        match root:
            case ir.Htb() | ir.Cbq() | ir.Prio() | ir.Hfsc():
                self.add(Heading(3, "Classes, in tree order"))
                self.classes(root, iface, None)
                self.classification(root, iface, None)
                self.unmatched(root, None)
                if isinstance(root, ir.Prio):
                    self.tos_table(root)
            case ir.PfifoFast():
                self.tos_table(root)
            case ir.Tbf() | ir.Netem():
                if root.child is not None:
                    self.add(Heading(3, "Its child qdisc"))
                    self.add(Para(self.queue(root.child)))
            case ir.Mq():
                self.mq_queues(root, iface)
            case _:
                pass
        for q, holder in self.nested(root):
            self.inner_qdisc(q, holder, iface)
        self.notes(iface)

    def mq_queues(self, root: ir.Mq, iface: ir.Interface) -> None:
        """Each TX queue of an mq root: its qdisc, and for a classful one its classes."""
        for queue in root.queues:
            q = queue.qdisc
            assert root.handle is not None
            classid = ir.Handle(root.handle.major, queue.number)
            self.add(
                Heading(
                    3, f"Queue {queue.number}: TX queue {queue.number - 1} (mq class {classid})"
                )
            )
            if not isinstance(q, ir.Htb | ir.Cbq | ir.Prio | ir.Hfsc):
                self.add(Para(f"Its qdisc is {self.queue(q)}"))
            else:
                self.add(Para(f"Its qdisc is {q.kind} {_handle(q)}, with these classes:"))
                self.classes(q, iface, None)
                self.classification(q, iface, None)
                self.unmatched(q, None)
            for inner, holder in self.nested(q):
                self.inner_qdisc(inner, holder, iface)

    # ---- the directions: downloads through an IFB, ingress policers
    def download_sentence(self, iface: ir.Interface, download: ir.Download) -> str:
        """Where a download's packets come from, and what classification sees of them."""
        dev, ifb = self.name(download.interface), self.name(iface.name)
        given = "" if download.ifb_span is not None else ", named by tcdsl,"
        text = (
            f"Downloads arriving on {dev} are redirected (every protocol, IPv6 included) to "
            f"the IFB device {ifb}{given} and shaped there by the tree below, as {ifb} sends "
            f"them on. tcdsl creates {ifb} (with a queue length of {IFB_TXQUEUELEN} packets), "
            f"the ingress qdisc on {dev} and its redirect filter, and removes all three when "
            "the policy is torn down or applied again. The redirect happens as packets arrive, "
            "before the firewall (iptables and nft, PREROUTING included) and before NAT is "
            "undone: behind NAT, a download's destination is still the router's public "
            "address, not the address of the LAN host it is for, so match downloads by their "
            "source (the remote side), ports or DSCP, or by connection mark."
        )
        if download.connmark:
            text += (
                " The redirect first restores the connection's firewall mark (tc's connmark "
                "action): the mark the firewall saved on the connection (CONNMARK "
                "--save-mark) when it marked the connection's earlier packets. A "
                "connection's first packets arrive before the firewall has marked it, carry "
                "no mark, and go where unmatched traffic goes (the default class)."
            )
        return text

    def ingress(self, iface: ir.Interface, q: ir.Ingress) -> None:
        """An ingress qdisc: its policers, in the order the kernel tries them."""
        dev = self.name(iface.name)
        self.add(
            Para(
                f"The ingress qdisc (handle {_handle(q)}) on {dev} sees packets as they "
                "arrive, before the firewall and routing. It has no queue and no classes: it "
                "cannot delay or shape, only police. Each match line meters the packets it "
                "matches against its rate; a policer lets a burst pass at once, then holds "
                "traffic to its rate on average, and what exceeds it gets the policer's "
                "verdict. Senders of TCP traffic slow down when their packets are dropped, so "
                "a policer a little below the line's rate keeps the queue in front of the "
                "slow link short."
            )
        )
        on = _one_per_line(iface, ir.INGRESS_HANDLE)
        if on:
            self.add(Heading(3, "Policers, in the order tried"))
            show_pref = any(_user_pref(f) != _user_pref(on[0]) for f in on)
            by_span = {m.span: m for m in q.matches}
            self.add(
                Para(
                    f"{self.classifier} filters on {_handle(q)} look at each arriving "
                    f"{self.seen()} packet in this order; the first that matches meters it"
                    + (" (lower pref first, then the order written):" if show_pref else ":")
                )
            )
            steps: list[str] = []
            seen: set[object] = set()
            for f in on:
                if f.span in seen:
                    continue
                seen.add(f.span)
                found = by_span.get(f.span)
                what = self.phrase(found) if found is not None else "?"
                prefix = f"pref {_user_pref(f)}: " if show_pref else ""
                if f.police is None:  # the builder refuses such a line (E252)
                    steps.append(f"{prefix}{what}: let in")
                    continue
                shared = shared_filters(iface.filters, f.span)
                police = police_phrase(f.police, None, shared)
                steps.append(f"{prefix}{what}: {police}; below, let in")
            self.add(Steps(tuple(steps)))
        not_seen, such = self.unseen()
        self.add(
            Para(
                f"Packets no line matches, and everything that is {not_seen} ({such}: the "
                f"filters look at {self.seen()} headers only), are let in unmetered."
            )
        )

    # ---- classful qdiscs inside classes or under tbf and netem
    def nested(self, root: ir.Qdisc) -> Iterator[tuple[ir.ClassfulQdisc, _Holder]]:
        """The classful qdiscs below ``root``, pre-order, with what holds each."""
        for q, by, bound in ir.held_qdiscs(root):
            if isinstance(q, ir.Htb | ir.Prio | ir.Cbq | ir.Hfsc):
                if isinstance(by, ir.Class):
                    yield q, _Holder(self.cls_ref(by), False, bound)
                else:
                    yield q, _Holder(f"{by.kind} {_handle(by)}", True, bound)

    def why(self, bound: ir.Bound) -> str:
        """What sets a bound: ``what 'site' (1:10) can have``, ``the rate of tbf 2:``."""
        if isinstance(bound.by, ir.Class):
            return f"what {self.cls_ref(bound.by)} can have"
        return f"the rate of {bound.by.kind} {_handle(bound.by)}"

    def inner_qdisc(self, q: ir.ClassfulQdisc, holder: _Holder, iface: ir.Interface) -> None:
        """A classful qdisc below the root: its own classes, filters and unmatched traffic."""
        me = f"{q.kind} {_handle(q)}"
        self.add(Heading(3, f"{me} {holder.where}"))
        if holder.chain:
            text = (
                f"The packets that {holder.ref} sends wait in {me}, its child qdisc, until "
                f"{holder.ref} takes them."
            )
        else:
            text = f"The packets sent to {holder.ref} wait in {me}, the qdisc of that class."
        match q:
            case ir.Htb():
                own = " and its own default class" if q.default is not None else ""
                text += (
                    f" It sorts them again among its own classes, with its own filters{own}: "
                    "each class is guaranteed its rate and may borrow up to its ceil, as in any "
                    "htb."
                )
            case ir.Prio():
                bands = q.bands.value if q.bands is not None else 3
                text += (
                    f" It sorts them again into its {bands} bands, served in strict order: a "
                    "packet of band 1 leaves only when band 0 is empty, and so on. Its match "
                    "lines choose a band; packets none of them takes get a band from their "
                    "priority (the table below)."
                )
            case ir.Cbq():
                text += " It sorts them again among its own classes, with its own filters."
            case ir.Hfsc():
                text += (
                    " It sorts them again among its own classes, with its own filters, and "
                    "serves them by their service curves, as in any hfsc."
                )
        if holder.bound is not None:
            cap = holder.bound.bits_per_second
            text += f" It can send no more than {format_rate(cap)}, {self.why(holder.bound)}."
            total = _guaranteed(q)
            if total is not None and total > cap:
                text += (
                    f" Its classes are guaranteed {format_rate(total)} together, more than that: "
                    "when all of them are busy, they cannot all get their rate."
                )
        self.add(Para(text))
        self.add(Heading(3, f"{me}, classes in tree order"))
        self.classes(q, iface, holder)
        self.classification(q, iface, holder)
        self.unmatched(q, holder)
        if isinstance(q, ir.Prio):
            self.tos_table(q, f" ({me})")

    # ---- root qdiscs
    def root_sentence(self, iface: ir.Interface) -> str:
        root, dev = iface.root, self.name(iface.name)
        h = _handle(root)
        match root:
            case ir.Htb():
                text = (
                    f"The root qdisc is htb (hierarchical token bucket, handle {h}). It shapes "
                    f"what {dev} sends by class: each class is guaranteed its rate, may borrow "
                    "bandwidth that other classes leave unused up to its ceil, and when several "
                    "classes want to borrow, those with the lowest prio number are served first."
                )
                if root.r2q is not None:
                    text += (
                        f" r2q {root.r2q.value}: a class without a quantum gets rate / "
                        f"{root.r2q.value} as its quantum (in bytes; the default r2q is "
                        f"{HTB_DEFAULT_R2Q})."
                    )
                elif root.chosen_r2q is not None:
                    text += (
                        f" r2q {root.chosen_r2q}, chosen by tcdsl: a class without a quantum gets "
                        f"rate / {root.chosen_r2q} as its quantum (in bytes), and tc's default r2q "
                        f"{HTB_DEFAULT_R2Q} would put a leaf class's quantum outside the kernel's "
                        f"{HTB_QUANTUM[0]}..{HTB_QUANTUM[1]}."
                    )
                return text
            case ir.Prio():
                bands = root.bands.value if root.bands is not None else 3
                return (
                    f"The root qdisc is prio (handle {h}): {bands} bands, one class each, served "
                    "in strict order: a packet of band 1 leaves only when band 0 is empty, and so "
                    "on. prio does not shape: a busy band 0 can take the whole link and starve "
                    "the bands after it. Match lines choose a band; packets no filter takes get "
                    "a band from the priority Linux gave them, which comes from their TOS byte "
                    "(the table below)."
                )
            case ir.Hfsc():
                return (
                    f"The root qdisc is hfsc (hierarchical fair service curve, handle {h}). It "
                    f"shapes what {dev} sends by class, each class by up to three service "
                    "curves: rt (real-time) guarantees a leaf class its rate, and a lower delay "
                    "for the first part of a backlog where the curve starts steeper; ls "
                    "(link-sharing) shares the bandwidth left over between sibling classes in "
                    "proportion to their ls rates; ul (upper limit) caps what a class gets by "
                    "link-sharing. A real-time guarantee is served even above ul."
                )
            case ir.Cbq():
                bandwidth = format_rate(root.bandwidth.bits_per_second) if root.bandwidth else "?"
                avpkt = f" (average packet {format_size(root.avpkt.bytes)})" if root.avpkt else ""
                return (
                    f"The root qdisc is cbq (class-based queueing, handle {h}) for a link of "
                    f"{bandwidth}{avpkt}. Note: Linux removed cbq in version 6.3; current "
                    "kernels refuse it, and tc 6.1 still builds it only on older kernels."
                )
            case ir.Tbf():
                rate = format_rate(root.rate.bits_per_second) if root.rate else "?"
                return (
                    f"The root qdisc shapes the whole interface: everything {dev} sends, of "
                    f"any kind, leaves at no more than {rate}. " + self.tbf(root, child=False)
                )
            case ir.Netem():
                return (
                    f"The root qdisc emulates a wide-area network on everything {dev} sends. "
                    + self.netem(root, child=False)
                )
            case ir.PfifoFast():
                return (
                    f"The root qdisc is pfifo_fast, the classic Linux default: three bands, "
                    "each a first-in, first-out queue, served in strict order (band 0 first, "
                    "band 2 only when the others are empty). It does not shape, and it takes no "
                    "filters: a packet's band comes from the priority Linux gave it, which "
                    "comes from its TOS byte (the table below). Each band holds up to "
                    f"{TXQUEUELEN}."
                )
            case ir.Mq():
                spread = (
                    f" The policy's one htb tree is spread over {root.shards.value} queues: its "
                    "top-level classes are packed by rate, largest first onto the least-loaded "
                    "queue, and each queue's htb has the whole link's rate and the default class."
                    if root.shards is not None
                    else ""
                )
                if root.shards is None:
                    # (found by a tester: on a device of 4 queues, a tree writing 2 left
                    # packets on the other two unshaped, and nothing said so)
                    last = ir.highest_queue(iface)
                    spread = (
                        f" Only the TX queues written here, up to queue {last}, are the "
                        f"policy's: a packet the kernel puts on a later TX queue of {dev} meets "
                        "that queue's default qdisc, unshaped, so tcdsl apply and the script "
                        f"refuse {dev} with more than {last} TX queues in use (ethtool -L {dev} "
                        f"tx {last}, or combined)."
                    )
                text = (
                    f"The root qdisc is mq (handle {h}): one qdisc per TX queue of {dev}, each "
                    "with its own lock, so several CPUs shape at once; the queues do not share "
                    f"bandwidth with each other.{spread}"
                )
                if not ir.mq_steers(iface):
                    return text + (
                        " No match line picks a TX queue: the kernel picks it (XPS, or a hash "
                        "of the flow), and the policy puts no clsact qdisc on the device."
                    )
                return text + (
                    " A clsact qdisc's egress filters, one per "
                    "filter of a queue's qdisc (below a tbf or netem, its child's; the lines "
                    "below a written queue's default class after every queue's own) and in the "
                    "policy's order, set each matching packet's TX queue (skbedit "
                    "queue_mapping); a packet none matches stays on the queue the kernel picks "
                    "(XPS, or a hash of its flow)."
                )
            case _:
                return f"The root qdisc is {self.queue(root)}"

    # ---- leaf queues
    def queue(self, q: ir.Qdisc | None) -> str:
        """What a leaf (or chained) qdisc does with the packets that wait in it."""
        if q is None:
            return (
                f"the kernel's default, a pfifo (first in, first out) of up to {TXQUEUELEN}; "
                "the policy names no qdisc, so none is created for it."
            )
        h = _handle(q)
        match q:
            case ir.Pfifo():
                limit = _plural(q.limit.value, "packet") if q.limit else TXQUEUELEN
                return (
                    f"pfifo (handle {h}): one first-in, first-out queue of up to {limit}; when it "
                    "is full, arriving packets are dropped (tail drop)."
                )
            case ir.Bfifo():
                size = _size(q.limit.bytes) if q.limit else "txqueuelen x MTU bytes"
                return (
                    f"bfifo (handle {h}): one first-in, first-out queue of up to {size}; when it "
                    "is full, arriving packets are dropped (tail drop)."
                )
            case ir.Sfq():
                return self.sfq(q)
            case ir.FqCodel():
                return self.fq_codel(q)
            case ir.Tbf():
                return self.tbf(q)
            case ir.Netem():
                return self.netem(q)
            case ir.Htb() | ir.Prio() | ir.Cbq() | ir.Hfsc():
                return (
                    f"{q.kind} {h}, a classful qdisc of its own: its classes, filters and "
                    f"unmatched traffic are explained below, under {q.kind} {h}."
                )
            case ir.PfifoFast():
                return f"pfifo_fast {h}: three bands by TOS, as the kernel's default qdisc."
            case ir.Ingress():  # only ever a root, explained by ingress()
                return f"the ingress qdisc {h}: policers, and no queue."
            case ir.Mq():  # only ever a root, explained by root_sentence()
                return f"mq {h}: one qdisc per TX queue."
            case ir.Cake():
                return self.cake(q)
            case ir.Codel():
                return self.codel(q)
            case ir.Fq():
                return self.fq(q)
            case ir.FqPie():
                return self.fq_pie(q)
            case ir.Red():
                return self.red(q)

    def link_layer(self, o: ir.Overhead, stab: bool, where: str = "the root qdisc") -> str:
        """What a packet costs on the wire, and how the kernel is told (by a size table on
        ``where``, for ``stab``)."""
        name = ""
        if o.preset is not None:
            found = linklayer.preset(o.preset.value)
            name = f" ({o.preset.value}: {found.what})" if found else f" ({o.preset.value})"
        n = o.overhead.value
        text = f"Link-layer overhead{name}: every packet is charged as its IP size "
        text += f"plus {_plural(n, 'byte')}" if n >= 0 else f"minus {_plural(-n, 'byte')}"
        mpu = o.mpu.value if o.mpu is not None else 0
        if mpu:
            text += f", at least {_plural(mpu, 'byte')}"
        big = linklayer.wire_size(1500, n, o.linklayer, mpu)
        ack = linklayer.wire_size(40, n, o.linklayer, mpu)
        if o.linklayer == "atm":
            text += (
                ", carried in 53-byte ATM cells of 48 bytes each: a 1500-byte IP packet costs "
                f"{_plural(big // linklayer.ATM_CELL, 'cell')} ({big} bytes), a 40-byte ACK "
                f"{_plural(ack // linklayer.ATM_CELL, 'cell')} ({ack} bytes)."
            )
        elif o.linklayer == "ptm":
            text += (
                ", plus one byte in 64 for PTM's 64b/65b coding: a 1500-byte IP packet costs "
                f"{big} bytes, a 40-byte ACK {ack}."
            )
        else:
            text += f": a 1500-byte IP packet costs {big} bytes, a 40-byte ACK {ack}."
        if stab:
            text += (
                " Rates below are rates on the wire. The kernel is told this by a size table on "
                f"{where} (tc's stab, overhead {linklayer.stab_overhead(n)}: it counts "
                f"from the frame, which holds the {linklayer.ETHERNET_HEADER}-byte Ethernet "
                "header, as on an Ethernet device or an IFB fed from one)."
            )
            text += _table_rounding(o, big, ack)
        return text

    def cake(self, q: ir.Cake) -> str:
        h = _handle(q)
        if q.bandwidth is not None:
            shaper = f"shapes to {format_rate(q.bandwidth.bits_per_second)}"
        else:
            shaper = "does not shape (unlimited): it only queues, for a bottleneck elsewhere"
        diffserv = q.diffserv.value if q.diffserv else "diffserv3"
        tins = {
            "besteffort": "one tin (no priorities)",
            "precedence": "eight tins by IP precedence",
            "diffserv8": "eight tins by DSCP",
            "diffserv4": "four tins by DSCP (bulk, best effort, video, voice)",
            "diffserv3": "three tins by DSCP (bulk, best effort, voice)",
        }[diffserv]
        isolate = q.isolate.value if q.isolate else "triple-isolate"
        fairness = {
            "flowblind": "no flow isolation: one queue per tin",
            "srchost": "fairness between source addresses",
            "dsthost": "fairness between destination addresses",
            "hosts": "fairness between address pairs",
            "flows": "fairness between flows",
            "dual-srchost": "fairness between source addresses first, then their flows",
            "dual-dsthost": "fairness between destination addresses first, then their flows",
            "triple-isolate": "fairness between flows, and between hosts on either side",
        }[isolate]
        rtt = q.rtt.microseconds if q.rtt else 100_000
        text = (
            f"cake (Common Applications Kept Enhanced, handle {h}): it {shaper}; sorts packets "
            f"into {tins} ({diffserv}); keeps {fairness} ({isolate}); and its AQM (COBALT) "
            f"keeps queues short for a round-trip time of {format_time(rtt)}"
            f"{f' ({q.rtt_preset.value})' if q.rtt_preset else ''}."
        )
        extras = []
        if q.nat is not None and q.nat.value == "nat":
            extras.append(
                "nat: it looks up addresses behind NAT in conntrack, so hosts are told apart"
            )
        if q.wash is not None and q.wash.value == "wash":
            extras.append("wash: it clears the DSCP of packets after sorting them")
        if q.ack_filter is not None and q.ack_filter.value != "no-ack-filter":
            extras.append(f"{q.ack_filter.value}: it drops TCP ACKs that later ACKs make redundant")
        if q.mode is not None and q.mode.value == "ingress":
            extras.append(
                "ingress: it counts packets it drops as sent, as it shapes a download (on an "
                "IFB) whose packets have already crossed the bottleneck"
            )
        if q.memlimit is not None:
            extras.append(f"memlimit {_size(q.memlimit.bytes)} of queue memory")
        if q.fwmark is not None:
            extras.append(
                f"fwmark {q.fwmark.value:#x}: the firewall mark under this mask picks the tin"
            )
        if q.split_gso is not None:
            extras.append(f"{q.split_gso.value}")
        if extras:
            text += " Also " + "; ".join(extras) + "."
        if q.overhead is not None:
            text += " " + self.link_layer(q.overhead, stab=False)
            text += " cake counts it itself, from the IP packet (it strips the MAC header)."
        return text

    def codel(self, q: ir.Codel) -> str:
        target = format_time(q.target.microseconds) if q.target else "5ms"
        interval = format_time(q.interval.microseconds) if q.interval else "100ms"
        limit = q.limit.value if q.limit else 1000
        action = "drops packets" if not q.ecn else "marks packets (ECN, when the flow supports it)"
        text = (
            f"codel (controlled delay, handle {_handle(q)}): one first-in, first-out queue of up "
            f"to {_plural(limit, 'packet')} that keeps itself short: once packets have waited "
            f"more than {target} (target) for {interval} (interval), it {action}, more often "
            "the longer the delay lasts, until the delay falls again. It does not shape and it "
            "does not separate flows."
        )
        return text + _ce_threshold(q.ce_threshold)

    def fq(self, q: ir.Fq) -> str:
        limit = q.limit.value if q.limit else 10000
        flow_limit = q.flow_limit.value if q.flow_limit else 100
        quantum = f"{q.quantum.bytes} bytes" if q.quantum else "two full-size packets"
        text = (
            f"fq (fair queueing, handle {_handle(q)}): one queue per flow (per socket for "
            f"local traffic), taking turns sending {quantum} each; it holds up to "
            f"{_plural(limit, 'packet')}, at most {flow_limit} per flow. "
        )
        if q.pacing is False:
            text += "nopacing: it does not pace flows; packets leave as soon as their turn comes."
        else:
            text += (
                "It paces each flow at the rate its sender asks for (TCP's pacing rate)"
                + (
                    f", and at most {format_rate(q.maxrate.bits_per_second)} (maxrate)"
                    if q.maxrate
                    else ""
                )
                + "."
            )
        if q.horizon is not None:
            what = "drops" if q.horizon_drop is not False else "sends at the horizon"
            text += (
                f" A packet timestamped to leave more than {format_time(q.horizon.microseconds)} "
                f"ahead (horizon) it {what}."
            )
        return text + _ce_threshold(q.ce_threshold)

    def fq_pie(self, q: ir.FqPie) -> str:
        flows = q.flows.value if q.flows else 1024
        target = format_time(q.target.microseconds) if q.target else "15ms"
        limit = q.limit.value if q.limit else 10240
        action = "marks them (ECN)" if q.ecn else "drops them"
        return (
            f"fq_pie (fair queueing with PIE, handle {_handle(q)}): flows are hashed into "
            f"{flows} queues that take turns, and PIE keeps each queue's delay near {target} "
            f"(target) by picking packets at random with a probability it adjusts, and "
            f"{action}. It holds up to {_plural(limit, 'packet')}. (Debian 12's 6.1 kernel "
            "has no fq_pie; it needs a kernel that builds CONFIG_NET_SCH_FQ_PIE.)"
        )

    def red(self, q: ir.Red) -> str:
        qmin, qmax, burst = red_thresholds(q)
        limit = _size(q.limit.bytes) if q.limit else "?"
        probability = _pct(q.probability.value) if q.probability else "2%"
        action = "marks (ECN)" if q.ecn else "drops"
        text = (
            f"red (random early detection, handle {_handle(q)}): a first-in, first-out queue "
            f"of up to {limit} (limit) that {action} packets at random before it is full: "
            f"while the average queue lies between {_size(qmin)} (min) and {_size(qmax)} "
            f"(max), the chance grows up to {probability} (probability); above max it "
            f"{action} every packet. The average follows bursts of about {burst} packets "
            "(burst)."
        )
        if q.ecn and q.harddrop:
            text += " harddrop: above max it drops even packets it could mark."
        if q.adaptive:
            text += " adaptive: it tunes the probability to keep the average between min and max."
        return text

    def sfq(self, q: ir.Sfq) -> str:
        divisor = q.divisor.value if q.divisor else 1024
        quantum = f"{q.quantum.bytes} bytes" if q.quantum else "one full-size packet (the MTU)"
        limit = q.limit.value if q.limit else 127
        text = (
            f"sfq (stochastic fairness queueing, handle {_handle(q)}): packets are hashed by "
            f"flow (addresses, protocol and ports) into {divisor} queues, which take turns "
            f"sending {quantum} each, so one busy flow cannot crowd out the others. It holds up "
            f"to {_plural(limit, 'packet')}"
        )
        text += f", at most {q.depth.value} per flow. " if q.depth else ". "
        perturb = q.perturb.value if q.perturb else 0
        if perturb:
            text += (
                f"perturb {perturb}: every {perturb} s it changes the hash, so flows that "
                "happen to share a queue do not share it for long (each change may reorder "
                "a few queued packets)."
            )
        else:
            text += (
                "No perturb: the hash, chosen when the qdisc is created, never changes, so two "
                "flows that share a queue keep sharing it (tc-sfq(8) suggests perturb 60)."
            )
        return text

    def fq_codel(self, q: ir.FqCodel) -> str:
        flows = q.flows.value if q.flows else 1024
        quantum = f"{q.quantum.bytes} bytes" if q.quantum else "one full-size packet"
        target = format_time(q.target.microseconds) if q.target else "5ms"
        interval = format_time(q.interval.microseconds) if q.interval else "100ms"
        limit = q.limit.value if q.limit else 10240
        memory = _size(q.memory_limit.bytes) if q.memory_limit else "32m (33554432 bytes)"
        ecn = q.ecn is not False
        action = "drops packets (or, as ECN is on, marks them when the flow supports ECN)"
        if not ecn:
            action = "drops packets (ECN is off: noecn)"
        return (
            f"fq_codel (fair queueing with CoDel, handle {_handle(q)}): flows are hashed "
            f"into {flows} queues that take turns sending {quantum} each, and CoDel keeps each "
            f"queue short: once packets have waited more than {target} (target) for "
            f"{interval} (interval), it {action} until the delay falls again. It holds up to "
            f"{_plural(limit, 'packet')} and {memory} of memory."
        )

    def tbf(self, q: ir.Tbf, child: bool = True) -> str:
        rate = format_rate(q.rate.bits_per_second) if q.rate else "?"
        burst = _size(q.burst.bytes) if q.burst else "?"
        text = (
            f"tbf (token bucket filter, handle {_handle(q)}): tokens arrive at {rate}; a "
            f"packet leaves only with tokens for its size, and the bucket holds up to {burst}, "
            "so after a quiet spell that much may leave at once, at full speed."
        )
        if q.peakrate is not None:
            mtu = f" (packets up to {_size(q.mtu.bytes)})" if q.mtu else ""
            text += f" Never faster than {format_rate(q.peakrate.bits_per_second)}{mtu}."
        if q.child is not None:
            held = " Waiting packets are held by its child qdisc, under its own limits"
            return text + (f"{held}: " + self.queue(q.child) if child else f"{held}.")
        limit = tbf_queue_limit(q)
        if q.latency is not None and limit is not None:
            # (found by a tester: this said a packet that would wait longer than latency is
            # dropped; tc makes latency a byte limit once, and a packet may wait longer)
            wait = ""
            if q.rate is not None and q.rate.bits_per_second:
                ms = limit * 8 * 1000 // q.rate.bits_per_second
                wait = f": a packet may wait up to about {ms}ms, the full queue at the rate"
            text += (
                f" Packets wait for tokens in a queue of up to {_size(limit)}, what "
                f"{format_time(q.latency.microseconds)} (latency) at its rate holds, with the "
                f"bucket; when it is full, arriving packets are dropped{wait}."
            )
        elif limit is not None:
            text += (
                f" Packets wait for tokens in a queue of up to {_size(limit)} "
                "(limit); when it is full, arriving packets are dropped."
            )
        return text

    def netem(self, q: ir.Netem, child: bool = True) -> str:
        effects: list[str] = []
        if q.delay is not None:
            delay = f"delays every packet by {format_time(q.delay.microseconds)}"
            if q.jitter is not None:
                delay += f", give or take up to {format_time(q.jitter.microseconds)} at random"
                if q.distribution is not None:
                    delay += f" ({q.distribution.name} distribution)"
            effects.append(delay)
        for value, word in (
            (q.loss, "drops"),
            (q.duplicate, "duplicates"),
            (q.corrupt, "corrupts"),
        ):
            if value is not None:
                effects.append(f"{word} {_pct(value.value)} of the packets at random")
        if q.reorder is not None:
            gap = q.gap.value if q.gap else 1
            which = (
                f"{_pct(q.reorder.value)} of the packets"
                if gap == 1
                else f"every {gap}th packet, with a chance of {_pct(q.reorder.value)},"
            )
            effects.append(f"sends {which} at once, ahead of the delayed ones (reordering)")
        if q.rate is not None:
            effects.append(f"sends at most {format_rate(q.rate.bits_per_second)}")
        if q.slot is not None:
            most = format_time((q.slot_max or q.slot).microseconds)
            effects.append(
                f"sends in bursts (slots) {format_time(q.slot.microseconds)} to {most} apart, "
                "as Wi-Fi and cellular links do"
            )
        what = (
            or_list(effects) if len(effects) < 2 else f"{', '.join(effects[:-1])} and {effects[-1]}"
        )
        what = what or "changes nothing"
        limit = q.limit.value if q.limit is not None else 1000
        text = (
            f"netem (network emulator, handle {_handle(q)}) {what}. It holds up to "
            f"{_plural(limit, 'packet')} (delayed packets included); beyond that it drops."
        )
        if q.child is not None:
            text += " Packets then go to its child qdisc" + (
                ": " + self.queue(q.child) if child else "."
            )
        return text

    # ---- classes
    def classes(self, q: ir.ClassfulQdisc, iface: ir.Interface, holder: _Holder | None) -> None:
        parents = ir.parent_map(q)
        default = default_minor(q) if isinstance(q, ir.Htb | ir.Hfsc) else None
        for top in q.classes:
            self.klass(q, top, parents, default, iface, holder, 0)

    def klass(
        self,
        q: ir.ClassfulQdisc,
        cls: ir.Class,
        parents: dict[int, ir.Class | None],
        default: int | None,
        iface: ir.Interface,
        holder: _Holder | None,
        depth: int,
    ) -> None:
        assert cls.classid is not None
        if cls.implicit:
            title = f"link class {cls.classid}"
        elif isinstance(q, ir.Prio):
            title = f"band {cls.classid.minor - 1}: class {self.name(cls.name)} ({cls.classid})"
        else:
            title = f"class {self.name(cls.name)} ({cls.classid})"
        self.add(Heading(4, title, depth))
        inner = depth + 1
        is_default = default is not None and cls.classid.minor == default and not cls.implicit
        match q:
            case ir.Htb():
                self.htb_items(q, cls, parents, holder, inner)
            case ir.Cbq():
                self.cbq_items(cls, inner)
            case ir.Prio():
                self.prio_items(q, cls, inner)
            case ir.Hfsc():
                self.hfsc_items(cls, inner)
        if not cls.children:
            self.traffic(q, cls, iface, is_default, holder is not None, inner)
            self.add(Item("Queue", self.queue(cls.leaf), inner))
        for child in cls.children:
            self.klass(q, child, parents, default, iface, holder, inner)

    def hfsc_items(self, cls: ir.Class, depth: int) -> None:
        phrases = curve_phrases(cls)
        if phrases:
            text = ", ".join(phrases[:-1]) + (", " if len(phrases) > 1 else "") + phrases[-1]
            self.add(Item("Curves", text[0].upper() + text[1:] + ".", depth))
        if cls.rt is not None and cls.children:
            self.add(
                Item(
                    "Note",
                    "its rt curve is never used: the kernel serves real-time curves of leaf "
                    "classes only.",
                    depth,
                )
            )

    def _ancestors(self, cls: ir.Class, parents: dict[int, ir.Class | None]) -> list[ir.Class]:
        chain: list[ir.Class] = []
        parent = parents.get(id(cls))
        while parent is not None:
            chain.append(parent)
            parent = parents.get(id(parent))
        return chain

    def htb_items(
        self,
        q: ir.Htb,
        cls: ir.Class,
        parents: dict[int, ir.Class | None],
        holder: _Holder | None,
        depth: int,
    ) -> None:
        rate = _rate(cls.rate)
        if rate is None:
            return
        ceil = _rate(cls.ceil) or rate
        ancestors = self._ancestors(cls, parents)
        r, c = format_rate(rate), format_rate(ceil)
        most = ceil
        if cls.implicit:
            most = rate
            text = f"{r}: the most the classes below send together; they borrow from it."
            if ceil > rate:
                text += f" Its ceil {c} has no effect: it has no parent to borrow from."
        elif not ancestors:
            most = rate
            owner, line = ("the htb", "the interface line")
            if holder is not None:
                owner, line = (f"htb {_handle(q)}", "its qdisc line")
            text = (
                f"guaranteed {r}. It is a root class of {owner} ({line} gives no rate, so "
                "there is no link class above it): it has no parent to borrow from and never "
                f"sends more than {r}"
            )
            text += f", although its ceil is {c}." if ceil > rate else "."
        elif ceil == rate:
            text = f"guaranteed {r} and limited to it: ceil = rate, so it never borrows."
        else:
            lenders = self.cls_ref(ancestors[0])
            if len(ancestors) > 1:
                lenders += ", and through it from " + " and ".join(
                    self.cls_ref(a) for a in ancestors[1:]
                )
            text = (
                f"guaranteed {r}; may borrow up to {c} ({format_rate(ceil - rate)} more) from "
                f"{lenders}, when {'it has' if len(ancestors) == 1 else 'they have'} bandwidth "
                "to spare."
            )
        outer = holder.bound if holder is not None else None
        parent = parents.get(id(cls))
        bound = ir.class_bound(q, parent, parents, outer) if parent is not None else outer
        if bound is not None and bound.bits_per_second < most:
            text += (
                f" It can never get more than {format_rate(bound.bits_per_second)}, "
                f"{self.why(bound)}."
            )
        cap = leaf_cap(cls.leaf) if not cls.children else None
        if cap is not None and cap[0].bits_per_second < min(
            most, bound.bits_per_second if bound else most
        ):
            kind = {"tbf": "tbf", "cake": "cake"}.get(cap[1], f"{cap[1]} (its link class)")
            text += (
                f" Its leaf {kind} sends at most {format_rate(cap[0].bits_per_second)}, so the "
                "class never sends more (W309)."
            )
        if cls.children and not cls.implicit:
            text += " The classes below share it."
        self.add(Item("Rate", text, depth))
        above = parents.get(id(cls))
        sole = above is not None and above.implicit and len(above.children) == 1
        over = children_overbook(cls, link_rate(q), sole)
        if over is not None:
            said = (
                "on purpose: the policy says 'overbook'"
                if cls.overbook
                else "without saying so (W350)"
            )
            # (without shares, the figure's own words say what htb does)
            how = (
                " htb keeps each child's rate even past this class's, so they all get their "
                "rates while the link has room."
                if over.shares is not None
                else ""
            )
            self.add(
                Item(
                    "Over-booked",
                    f"{said}. The classes below are guaranteed {format_rate(over.total)} in "
                    f"all, {over}.{how}",
                    depth,
                )
            )
        for key, what in (
            ("burst", "how much it may send at once, at full speed, above its rate"),
            ("cburst", "how much it may send at once, at full speed, above its ceil"),
        ):
            size = getattr(cls, key)
            if size is not None:
                self.add(Item(key.capitalize(), f"{_size(size.bytes)}: {what}.", depth))
        if cls.implicit:
            return
        if cls.children:
            if cls.prio is not None:
                self.add(
                    Item(
                        "Priority",
                        f"{cls.prio.value}, which does not matter here: htb uses the "
                        "priority of leaf classes only.",
                        depth,
                    )
                )
            return
        prio = cls.prio.value if cls.prio is not None else 0
        given = "" if cls.prio is not None else " (the default)"
        self.add(
            Item(
                "Priority",
                f"{prio}{given}. Lower numbers go first: they are offered spare bandwidth "
                "first when classes borrow, and their packets wait less. Guaranteed rates hold "
                "whatever the priority.",
                depth,
            )
        )
        if cls.quantum is not None:
            self.add(
                Item(
                    "Quantum",
                    f"{cls.quantum.bytes} bytes: classes of the same priority take turns "
                    "sending this much each, so they share spare bandwidth in proportion to "
                    "their quanta.",
                    depth,
                )
            )
        elif cls.chosen_quantum is not None:
            computed = htb_quantum(rate, htb_r2q(q))[0]
            self.add(
                Item(
                    "Quantum",
                    f"{cls.chosen_quantum} bytes, chosen by tcdsl: rate / r2q would be "
                    f"{computed}, outside the kernel's {HTB_QUANTUM[0]}..{HTB_QUANTUM[1]}, and "
                    "no single r2q suits every leaf class of this htb (their rates are more than "
                    f"{HTB_QUANTUM[1] // HTB_QUANTUM[0]} times apart). Classes of the same "
                    "priority take turns borrowing this much each.",
                    depth,
                )
            )
        elif ceil > rate and ancestors:
            r2q = htb_r2q(q)
            computed, used = htb_quantum(rate, r2q)
            share = (
                ", so they share spare bandwidth in proportion to their rates"
                if used == computed
                else ""
            )
            clamp = ""
            if used != computed:
                word = "raises" if used > computed else "lowers"
                limit = "minimum" if used > computed else "maximum"
                clamp = f", which the kernel {word} to {used}, its {limit}"
            self.add(
                Item(
                    "Quantum",
                    f"{computed} bytes (rate / r2q = {rate // 8} bytes/s / {r2q}){clamp}. "
                    f"Classes of the same priority take turns borrowing this much each{share}.",
                    depth,
                )
            )

    def cbq_items(self, cls: ir.Class, depth: int) -> None:
        rate = _rate(cls.rate)
        if rate is not None:
            text = f"{format_rate(rate)}; "
            text += (
                "bounded: it never borrows beyond it"
                if cls.bounded
                else "not bounded: it may borrow unused bandwidth from its parent"
            )
            if cls.isolated:
                text += "; isolated: it lends its own unused bandwidth to no other class"
            self.add(Item("Rate", text + ".", depth))
        if cls.prio is not None:
            self.add(
                Item(
                    "Priority",
                    f"{cls.prio.value} (1 is the highest, 8 the lowest): when classes borrow, "
                    "the lowest number is served first.",
                    depth,
                )
            )
        extras = [
            f"{key} {format_size(getattr(cls, key).bytes)}"
            for key in ("allot", "avpkt")
            if getattr(cls, key) is not None
        ]
        if cls.weight is not None:
            extras.append(f"weight {format_rate(cls.weight.bits_per_second)}")
        if extras:
            self.add(Item("Parameters", ", ".join(extras) + ".", depth))

    def prio_items(self, q: ir.Prio, cls: ir.Class, depth: int) -> None:
        assert cls.classid is not None
        band = cls.classid.minor - 1
        if band == 0:
            order = "served first: its packets leave before any packet of a later band."
        elif band == 1:
            order = "served only when band 0 is empty."
        else:
            order = f"served only when bands 0-{band - 1} are empty."
        self.add(Item("Order", order, depth))
        tos = [f"0x{t:02x}" for t in range(0, 0x20, 2) if tos_band(q, t) == band]
        text = (
            "packets no filter takes, with TOS " + or_list(tos) + " (see the table)."
            if tos
            else "no TOS value maps to this band, so only its match lines send packets here."
        )
        self.add(Item("By TOS", text, depth))

    # ---- traffic
    def traffic(
        self,
        q: ir.ClassfulQdisc,
        cls: ir.Class,
        iface: ir.Interface,
        is_default: bool,
        nested: bool,
        depth: int,
    ) -> None:
        marking = iface.marking
        lines = tuple(
            f"{self.code(match_text(m))}: {self.phrase(m)}{self.policed(m, cls)}{self.never(m)}"
            for m in cls.matches
        )
        if marking is not None and cls.fwmark is not None and cls.matches:
            self.add(
                Item(
                    "Traffic",
                    f"packets the firewall marks {mark_text(marking, cls.fwmark)} (chain "
                    f"{self.name(marking.chain or '?')}, for "
                    f"{self._source(marking, iface)}): an fw filter sends mark "
                    f"{mark_text(marking, cls.fwmark)} here. The mark is set on packets matching "
                    + ("any of these lines:" if len(lines) > 1 else "this line:"),
                    depth,
                    lines,
                )
            )
        elif cls.matches:
            self.add(
                Item(
                    "Traffic",
                    "packets matching "
                    + ("any of these lines:" if len(lines) > 1 else "this line:"),
                    depth,
                    lines,
                )
            )
        elif marking is not None and cls.fwmark is not None and not is_default:
            self.add(
                Item(
                    "Traffic",
                    f"packets carrying mark {mark_text(marking, cls.fwmark)}, which nothing in "
                    "this policy sets: "
                    "only another firewall rule can send packets here.",
                    depth,
                )
            )
        if is_default:
            me = f"{q.kind} {_handle(q)}"
            not_seen, such = self.unseen()
            text = (
                f"this is the default class of {me}: packets that reach {me} and that none of "
                f"its filters matches come here, including those that are {not_seen} ({such})."
                if nested
                else f"this is the {q.kind}'s default class: packets no filter matches come here, "
                f"including everything that is {not_seen} ({such})."
            )
            if marking is not None and cls.fwmark is not None and not nested:
                text += (
                    " The firewall gives still-unmarked packets mark "
                    f"{mark_text(marking, cls.fwmark)}."
                )
            self.add(Item("Default", text, depth))
        elif not cls.matches and isinstance(q, ir.Htb | ir.Cbq | ir.Hfsc) and cls.fwmark is None:
            self.add(
                Item(
                    "Traffic",
                    "none: it has no match line and it is not the default class, so no packet "
                    "reaches it.",
                    depth,
                )
            )
        if marking is not None and cls.set_dscp is not None and cls.fwmark is not None:
            self.add(
                Item(
                    "DSCP",
                    f"the firewall rewrites the DSCP of this class's packets to "
                    f"{dscp_name(cls.set_dscp.value)} (after marking them), so the next hops "
                    "see it.",
                    depth,
                )
            )

    def _source(self, marking: ir.Marking, iface: ir.Interface) -> str:
        """The packets the marking rules see, with interface names quoted as names."""
        if iface.download is not None:
            where = (
                "any interface"
                if marking.from_interface is None
                else self.name(marking.from_interface)
            )
            return (
                f"packets that arrived on {where}, once routed (forwarded or for this host, "
                "after NAT is undone),"
            )
        match marking.hook:
            case "output":
                return f"packets this host sends out of {self.name(iface.name)}"
            case "postrouting":
                return f"packets leaving by {self.name(iface.name)} (forwarded or this host's own)"
            case _:
                if marking.from_interface is None:
                    return "packets arriving on any interface"
                return f"packets arriving on {self.name(marking.from_interface)}"

    def never(self, m: ir.Match) -> str:
        """`` (it never matches: ...)`` for a line an earlier one hides, else ""."""
        found = self.dead.get(m.span)
        if found is None:
            return ""
        why = found.message.split(": ", 1)[-1].split(", so this line")[0].replace(" already", "")
        return f" (it never matches: {why}; {found.code})"

    def policed(self, m: ir.Match, cls: ir.Class) -> str:
        """What a match line's policer does, after the line's phrase (empty without one)."""
        if m.police is None:
            return ""
        shared = shared_filters(self.filters, m.span)
        return f"; {police_phrase(m.police, self.cls_ref(cls), shared)}"

    # ---- classification order
    def classification(
        self, q: ir.ClassfulQdisc, iface: ir.Interface, holder: _Holder | None
    ) -> None:
        """The filters of ``q`` in the order the kernel tries them (or, at the root, the marking
        rules of the whole interface)."""
        marking = iface.marking
        title = "How packets reach the classes"
        if holder is not None:
            title = f"{q.kind} {_handle(q)}, how packets reach its classes"
        if marking is not None and holder is not None:
            if any(isinstance(f, ir.FwFilter) and f.parent == q.handle for f in iface.filters):
                self.add(Heading(3, title))
                self.add(
                    Para(
                        f"By firewall mark: fw filters on {_handle(q)} send each mark the rules "
                        "above set to its class."
                    )
                )
            return
        owners, lines = _class_index(iface)
        if marking is not None:
            self.add(Heading(3, title))
            through = ""
            hooks = marking.hook.upper()
            if iface.download is not None:
                hooks = " and ".join(DOWNLOAD_HOOKS)
                through = (
                    " A download's packets get those marks through their connection: the "
                    "mark saved on the connection is restored by the redirect on "
                    f"{self.name(iface.download.interface)} (connmark), so a packet carries "
                    "the mark the rules gave its connection's earlier packets."
                )
            self.add(
                Para(
                    f"By firewall mark. P{self._source(marking, iface)[1:]} pass "
                    f"the {self.firewalls()} {self.name(marking.chain or '?')} "
                    "(mangle table, "
                    f"{hooks}), whose rules mark them; each rule marks only "
                    "packets that are still unmarked"
                    + (
                        f" (in the mark bits {marking.mask.value:#x}; the others are left alone)"
                        if marking.mask is not None
                        else ""
                    )
                    + ", so the first that matches wins. On "
                    f"{self.name(iface.name)}, fw filters send each mark to its class.{through} "
                    + (_UNSEEN[marking.hook] if iface.download is None else _UNSEEN_DOWNLOAD)
                    + " The rules, in order:"
                )
            )
            by_mark = {c.fwmark: c for c in owners.values() if c.fwmark is not None}
            by_span = {span: m for (_, span), m in reversed(lines.items())}
            steps: list[str] = []
            seen: set[object] = set()
            for rule in marking.rules:
                target = by_mark.get(rule.mark)
                where = f" -> {self.cls_ref(target)}" if target is not None else ""
                key = (rule.span, rule.mark)
                if key in seen:
                    continue
                seen.add(key)
                if rule.unmarked:
                    unmarked = mark_text(marking, rule.mark)
                    steps.append(f"every packet still unmarked: mark {unmarked}{where}")
                    continue
                line = by_span.get(rule.span)
                what = self.phrase(line) if line is not None else "?"
                steps.append(f"{what}: mark {mark_text(marking, rule.mark)}{where}")
            self.add(Steps(tuple(steps)))
            for mark, dscp in dict.fromkeys((d.mark, d.dscp) for d in marking.dscp_rules):
                target = by_mark.get(mark)
                self.add(
                    Para(
                        f"Then the chain rewrites the DSCP of packets carrying mark "
                        f"{mark_text(marking, mark)}"
                        + (f" ({self.cls_ref(target)})" if target is not None else "")
                        + f" to {dscp_name(dscp)}."
                    )
                )
            u32 = _one_per_line(iface, q.handle) if q.handle is not None else []
            if u32:
                fw_pref = marking.pref.value if marking.pref is not None else 1
                self.add(
                    Para(
                        f"Match lines with a pref of their own stay u32 filters on {_handle(q)}, "
                        f"tried by pref with the fw filters (pref {fw_pref}): a lower pref "
                        "before the marks, a higher one only for packets whose mark no fw "
                        "filter takes:"
                    )
                )
                self.add(Steps(self._u32_steps(u32, True, owners, lines)))
            return
        if q.handle is None:  # allocate gives every qdisc one
            return
        on = _one_per_line(iface, q.handle)
        if not on:
            return
        self.add(Heading(3, title))
        show_pref = any(_user_pref(f) != _user_pref(on[0]) for f in on)
        self.add(
            Para(
                f"{self.classifier} filters on {_handle(q)} look at each {self.seen()} packet in "
                "this order; the first that matches decides its class"
                + (" (lower pref first, then the order written)" if show_pref else "")
                + self.pref_note(iface)
                + ":"
            )
        )
        self.add(Steps(self._u32_steps(on, show_pref, owners, lines)))
        hashed = hashed_text(iface, q.handle)
        if hashed:
            self.add(Para(hashed))

    def firewalls(self) -> str:
        """The marking rules' chains: ``iptables chain``, ``ip6tables chain`` or both."""
        if len(self.tree) == 2:
            return "iptables and ip6tables chains"
        return "iptables chain" if self.tree == ("ipv4",) else "ip6tables chain"

    def phrase(self, line: ir.Match) -> str:
        """A match line of the tree in words (``words.match_phrase``)."""
        return match_phrase(line, self.tree, self.any_protocol)

    def pref_note(self, iface: ir.Interface) -> str:
        """Why IPv6 filters have other prefs, when a tree has filters of both families."""
        if {f.family for f in iface.filters} != set(ir.FAMILIES):
            return ""
        return (
            f" (each line is a filter of each family; the IPv6 ones have the line's pref + "
            f"{IPV6_PREF_OFFSET}, since the kernel takes one protocol per pref, and an IPv4 "
            "packet meets only IPv4 filters, an IPv6 packet only IPv6 ones)"
        )

    def _u32_steps(
        self,
        on: list[ir.U32Filter | ir.FlowerFilter],
        show_pref: bool,
        owners: dict[ir.Handle, ir.Class],
        lines: dict[tuple[ir.Handle, object], ir.Match],
    ) -> tuple[str, ...]:
        """One step per match line's filters, in the order tried (``on``)."""
        steps = []
        last: tuple[object, ir.Handle] | None = None
        for f in on:
            if last == (f.span, f.flowid):
                continue
            last = (f.span, f.flowid)
            found = lines.get((f.flowid, f.span))
            what = self.phrase(found) if found is not None else "?"
            target = owners.get(f.flowid)
            ref = self.cls_ref(target) if target is not None else str(f.flowid)
            prefix = f"pref {_user_pref(f)}: " if show_pref else ""
            police = ""
            if f.police is not None:
                police = f"; {police_phrase(f.police, ref, shared_filters(on, f.span))}"
            steps.append(f"{prefix}{what} -> {ref}{police}")
        return tuple(steps)

    # ---- unmatched traffic
    def unmatched(self, root: ir.ClassfulQdisc, holder: _Holder | None) -> None:
        me = f"{root.kind} {_handle(root)}"
        self.add(Heading(3, "Unmatched traffic" if holder is None else f"{me}, unmatched traffic"))
        # Below the root, only the packets the holder passes on reach the qdisc.
        which = " no filter matches"
        if holder is not None:
            which = f" that reach {me} and that none of its filters matches"
        not_seen, such = self.unseen()
        such_and = or_list(such.split(", "), "and")
        headers = f"the filters look at {self.seen()} headers only"
        match root:
            case ir.Htb():
                minor = default_minor(root)
                target = next(
                    (
                        c
                        for c in ir.classes_of(root)
                        if c.classid is not None and c.classid.minor == minor and not c.implicit
                    ),
                    None,
                )
                if target is not None and holder is None:
                    text = (
                        f"Packets no filter matches go to {self.cls_ref(target)}, the htb's "
                        f"default class. So does everything that is {not_seen}, such as "
                        f"{such_and}: {headers}."
                    )
                elif target is not None:
                    text = (
                        f"Packets that reach {me} and that none of its filters matches go to "
                        f"{self.cls_ref(target)}, its default class. So does every packet that "
                        f"reaches it and is {not_seen}, such as {such_and}: {headers}."
                    )
                elif holder is None:
                    text = (
                        "There is no default class: packets no filter matches, and everything "
                        f"that is {not_seen} ({such}; {headers}), "
                        "leave through htb's direct queue: unshaped, at the full speed of the "
                        "link and ahead of every class. Add 'default CLASS' to the interface "
                        "line to shape them."
                    )
                else:
                    most = ""
                    if holder.bound is not None:
                        most = f" (never faster than {format_rate(holder.bound.bits_per_second)})"
                    text = (
                        f"{me} has no default class: packets that reach it and match none of its "
                        f"filters, and everything that is {not_seen} ({such}; {headers}), leave "
                        "through its direct queue, unshaped by its "
                        f"classes and ahead of them{most}. Add 'default CLASS' to its qdisc line "
                        "to shape them."
                    )
            case ir.Prio():
                band = priomap_of(root)[0]
                text = (
                    f"Packets{which} go to the band their priority selects "
                    "(the table below). Packets whose priority was not set from a TOS byte, "
                    f"such as ARP and IPv6, have priority 0 and go to band {band}."
                )
            case ir.Cbq():
                text = (
                    f"Packets{which}, and everything that is {not_seen}, go to "
                    f"cbq's own root class {_handle(root)}, outside every class of this policy."
                )
            case ir.Hfsc():
                minor = default_minor(root)
                target = next(
                    (c for c in ir.classes_of(root) if c.classid and c.classid.minor == minor),
                    None,
                )
                if target is not None:
                    text = (
                        f"Packets{which} go to {self.cls_ref(target)}, the default class of "
                        f"{me}. So does everything that is {not_seen}, such as {such_and}: "
                        f"{headers}."
                    )
                else:
                    text = (
                        f"{me} has no default class: packets{which}, and everything that is "
                        f"{not_seen} ({such_and} included: {headers}), are DROPPED. Add "
                        "'default CLASS' to its qdisc line."
                    )
        self.add(Para(text))

    # ---- TOS -> priority -> band
    def tos_table(self, q: ir.Prio | ir.PfifoFast, which: str = "") -> None:
        self.add(Heading(3, "TOS byte -> Linux priority -> band" + which))
        priomap = priomap_of(q)
        if isinstance(q, ir.Prio) and q.priomap is not None:
            origin = "the priomap this policy gives"
        elif isinstance(q, ir.Prio):
            origin = "tc's default priomap (the same as pfifo_fast's)"
        else:
            origin = "pfifo_fast's fixed priomap"
        self.add(
            Para(
                "Linux gives a packet a priority from its TOS byte when it forwards it, and "
                "when a local program sets the TOS with IP_TOS (the kernel's ip_tos2prio table, "
                "indexed by the four TOS bits 0x1e; the precedence bits 0xe0 and the lowest "
                "bit 0x01 do not count)"
                + (
                    "; an IPv6 packet's traffic class gives it none, so IPv6 packets have "
                    f"priority 0 (band {priomap[0]})"
                    if "ipv6" in self.tree
                    else ""
                )
                + f". The band then comes from {origin}, "
                + self.code("priomap " + " ".join(str(b) for b in priomap))
                + ", read as band = priomap[priority]. Band 0 leaves first."
            )
        )
        bands: dict[int, str] = {}
        if isinstance(q, ir.Prio):
            for cls in q.classes:
                if cls.classid is not None:
                    bands[cls.classid.minor - 1] = self.name(cls.name)
        header: tuple[str, ...] = ("TOS", "bits set", "priority", "band")
        rows: list[tuple[str, ...]] = []
        for tos in range(0, 0x20, 2):
            priority = tos_priority(tos)
            band = priomap[priority]
            row: tuple[str, ...] = (
                f"0x{tos:02x}",
                ", ".join(short for bit, short in TOS_SHORT if tos & bit) or "normal",
                priority_words(priority),
                str(band),
            )
            if isinstance(q, ir.Prio):
                row += (bands.get(band, "(none: a pfifo)"),)
            rows.append(row)
        if isinstance(q, ir.Prio):
            header += ("class",)
        self.add(Table(header, tuple(rows)))
        named = ", ".join(
            f"0x{bit:02x} {name} ({short})"
            for (bit, name), (_, short) in zip(TOS_BITS, TOS_SHORT, strict=True)
        )
        self.add(
            Para(
                f"The TOS bits: {named}. The 0x02 bit is also ECN's ECT(0) mark, which is why "
                "current kernels give minimize-cost packets best effort (older kernels gave "
                "them filler, band 2)."
            )
        )
        if isinstance(q, ir.PfifoFast):
            self.add(
                Para(
                    "The bands only matter while packets wait. On a link that is not congested "
                    "at this interface, every band is empty most of the time and packets leave "
                    "in the order they came, whatever their TOS."
                )
            )

    # ---- notes
    def notes(self, iface: ir.Interface) -> None:
        conds = [
            c
            for q in ir.walk_qdiscs(iface.root)
            for cls in ir.classes_of(q)
            for m in cls.matches
            for c in m.conds
        ]
        notes: list[str] = []
        with_ports = any(
            isinstance(c, ir.PortCond)
            and not any(isinstance(o, ir.ProtoCond) for o in _line_of(iface, c))
            for c in conds
        )
        u32_ipv4 = iface.classifier == "u32" and "ipv4" in iface.families
        if with_ports and iface.marking is None and u32_ipv4:
            notes.append(
                ("On IPv4, port" if "ipv6" in iface.families else "Port")
                + " conditions read the bytes where TCP and UDP keep their ports, assuming an "
                "IPv4 header without options (the usual 20 bytes); without 'proto', they do not "
                "check that the packet is TCP or UDP."
            )
        transport = any(
            isinstance(c, ir.PortCond | ir.ProtoCond | ir.TcpAckCond | ir.TcpFlagsCond)
            for c in conds
        )
        if transport and iface.marking is None and "ipv6" in iface.families:
            if iface.classifier == "u32":
                notes.append(
                    "On IPv6, u32 reads the next header and the ports right after the 40-byte "
                    "fixed header, so the IPv6 filters of lines naming a protocol, ports or TCP "
                    "flags check that the next header is that protocol (TCP or UDP for a port "
                    "alone): an IPv6 packet with an extension header in front (hop-by-hop "
                    "options, a routing header, a fragment) matches none of them and goes where "
                    "unmatched traffic goes. 'classifier flower' reads past those headers."
                )
            else:
                notes.append(
                    "flower's flow dissector finds the protocol and the ports past IPv4 options "
                    "and past IPv6's hop-by-hop, routing and destination-options headers, but "
                    "not past AH; and it reads no ports or TCP flags in a fragment, so fragments "
                    "match only lines without ports and TCP flags."
                )
        if any(isinstance(c, ir.TosCond) and c.dscp is None and c.mask & 0x03 for c in conds):
            notes.append(
                "A 'tos' match compares the whole byte (unless a mask says otherwise), ECN bits "
                "included: an ECN-capable packet (0x01 or 0x02 set) does not match 'tos 0x10'."
            )
        private = sorted(
            {
                net
                for c in conds
                if isinstance(c, ir.AddrCond) and c.field == "src"
                for net, _ in c.networks
                if net.version == 4 and any(net.subnet_of(block) for block in PRIVATE)
            }
        )
        if private and iface.marking is None:
            spelled = [str(n.network_address) if n.prefixlen == 32 else str(n) for n in private]
            notes.append(
                f"'src' matches private addresses ({or_list(spelled).replace(' or ', ' and ')}): "
                f"if {self.name(iface.name)} is a WAN interface behind source NAT (SNAT, "
                "masquerade), its packets leave with the router's public address as their "
                "source and these lines match nothing. Classify them by mark from the LAN "
                "interface instead, where the firewall still sees the private address."
            )
        if notes:
            self.add(Heading(3, "Good to know"))
            for note in notes:
                self.add(Para(note))


def _user_pref(f: ir.Filter) -> int:
    """The pref the policy gives a filter's line (an IPv6 filter's kernel pref, less
    ``IPV6_PREF_OFFSET``)."""
    return f.pref - IPV6_PREF_OFFSET if f.family == "ipv6" else f.pref


def _one_per_line(iface: ir.Interface, parent: ir.Handle) -> list[ir.U32Filter | ir.FlowerFilter]:
    """The u32 or flower filters on ``parent``, one per match line and class, in the order a
    packet of any family meets its lines: by the line's pref, then in the order added."""
    added = {id(f): i for i, f in enumerate(iface.filters)}
    on = [
        f
        for f in iface.filters
        if isinstance(f, ir.U32Filter | ir.FlowerFilter) and f.parent == parent
    ]
    ordered = sorted(on, key=lambda f: (_user_pref(f), added[id(f)]))
    seen: set[tuple[object, ir.Handle]] = set()
    lines = []
    for f in ordered:
        if (f.span, f.flowid) not in seen:
            seen.add((f.span, f.flowid))
            lines.append(f)
    return lines


def _line_of(iface: ir.Interface, cond: ir.Cond) -> Iterator[ir.Cond]:
    """The conditions of the match line that holds ``cond``."""
    for q in ir.walk_qdiscs(iface.root):
        for cls in ir.classes_of(q):
            for m in cls.matches:
                if any(c is cond for c in m.conds):
                    yield from m.conds
                    return


def explain(policy: ir.Policy, fmt: Format = "text") -> str:
    """Explain an allocated policy (from ``tcdsl.driver.analyse``) in plain English.

    ``fmt`` is ``"text"`` (wrapped at 100 columns, classes indented by tree depth) or
    ``"markdown"`` (for handouts). Pure and deterministic.
    """
    dead = {
        d.span: d
        for d in filters_all_reachable(policy)
        if d.code == "W313" or d.message.startswith("this match line never matches")
    }
    blocks = _Explainer(fmt, dead).policy(policy)
    return render_markdown(blocks) if fmt == "markdown" else render_text(blocks)


BYTE_NAMES: dict[ir.Family, dict[int, str]] = {
    "ipv4": {
        **{12 + i: f"byte {i + 1} of the source address" for i in range(4)},
        **{16 + i: f"byte {i + 1} of the destination address" for i in range(4)},
        9: "the protocol",
        1: "the TOS byte",
    },
    "ipv6": {
        **{8 + i: f"byte {i + 1} of the source address" for i in range(16)},
        **{24 + i: f"byte {i + 1} of the destination address" for i in range(16)},
        6: "the next header",
    },
}


def hashed_text(iface: ir.Interface, parent: ir.Handle | None) -> str:
    """What the hashed u32 tables under ``parent`` do, in words ("" when there are none)."""
    tables = [t for t in iface.u32_tables if t.parent == parent and t.link.table is None]
    parts = []
    for t in tables:
        family = "IPv6" if t.family == "ipv6" else "IPv4"
        byte = t.hashed_byte
        if byte is None:
            parts.append(
                f"{t.count} {family} filters from line {t.span.line} on are kept in order in "
                f"u32 table {t.table:x}: (u32 keeps at most 2,048 in order by itself)"
            )
            continue
        name = BYTE_NAMES[t.family].get(byte, f"byte {byte} of the header")
        inner = [u for u in iface.u32_tables if u.parent == parent and u.link.table == t.table]
        deeper = ""
        if any(u.hashed_byte is not None for u in inner):
            deeper = ", long buckets hashed again on another byte"
        parts.append(
            f"the {t.count} {family} filters from line {t.span.line} on are hashed on {name} "
            f"(u32 table {t.table:x}:, {t.divisor} buckets{deeper}): u32 tries only the "
            "lines of the packet's bucket, in this order, so the first that matches is the same"
        )
    if not parts:
        return ""
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _table_rounding(o: ir.Overhead, big: int, ack: int) -> str:
    """What a size table charges where its cells round a length up (tc's default table of 512
    slots for 2047 bytes counts in 4-byte cells: found by a tester, the kernel counted 1520
    bytes where the text said 1518), in a sentence; "" where it charges the exact sizes."""
    table = o.size_table()
    if not table.has_table:
        return ""
    header = linklayer.ETHERNET_HEADER
    charged = table.cost(1500 + header), table.cost(40 + header)
    if charged == (big, ack):
        return ""
    cell = table.cell_bytes
    return (
        f" Its table counts in {cell}-byte cells ({table.tsize} of them for lengths up to "
        f"{table.mtu} bytes), so the kernel charges a 1500-byte IP packet {charged[0]} bytes "
        f"and a 40-byte ACK {charged[1]}."
    )
