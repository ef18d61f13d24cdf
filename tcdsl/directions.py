"""Checks of the download and ingress sides of an interface and of policers: what the kernel
would refuse, and what would silently do nothing (marks a download never sees, a policer no
packet fits, addresses NAT hides)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from ipaddress import IPv4Network

from tcdsl import ir, linklayer
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.units import format_size

POLICE_DEFAULT_MTU = 255 << 3
"""The mtu of a policer given none: tc builds its rate table for 2047 bytes (cell_log 3), and
the kernel takes 255 cells of it (act_police: ``255 << cell_log``)."""

PRIVATE = tuple(IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
"""RFC 1918's private networks."""


SMALLEST_MTU = 1280
"""The smallest MTU of a link that carries IPv6: a policer's mtu below it drops (or
passes on) packets every link carries."""


def policers_fit(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E253: a policer whose burst is below the largest packet it lets through (no such
    packet ever conforms: tc-police(8) asks for a burst of at least the MTU); W376: an mtu
    that holds a full frame but not as the size table charges it; E252: a
    policer where classification is by firewall mark (the fw filter is the class's, not the
    match line's)."""
    for iface in policy.interfaces:
        # A policer meters a packet by the length the root's size table charges for it (an
        # ingress qdisc's policers see the packet as it is, without its Ethernet header).
        egress = linklayer.charged_frame(iface.stab)
        for q in ir.walk_qdiscs(iface.root):
            ingress = isinstance(q, ir.Ingress)
            frame = egress if not ingress else linklayer.FRAME - linklayer.ETHERNET_HEADER
            packet = (
                f"a full-size packet ({frame} bytes: on ingress a policer meters it without "
                "its Ethernet header)"
                if ingress
                else linklayer.frame_words(frame)
            )
            for _, m in ir.matches_of(q):
                p = m.police
                if p is None:
                    continue
                if iface.marking is not None and not isinstance(q, ir.Ingress):
                    yield Diagnostic.error(
                        "E252",
                        "'police' needs u32 classification: with 'classify by mark', one fw "
                        "filter per class classifies, and a match line becomes a firewall "
                        "rule that cannot police; drop 'classify by mark' or the policer",
                        p.span,
                        Note("classification by mark is chosen here", iface.marking.span),
                    )
                    continue
                # without an mtu, tc gives the policer one that a frame the size table charges
                # more can pass: then no burst helps (W376 below)
                implicit = p.mtu is None and frame > POLICE_DEFAULT_MTU
                largest = p.mtu.bytes if p.mtu is not None else frame
                if p.burst.bytes < largest and not implicit:
                    what = f"its mtu of {format_size(largest)}" if p.mtu is not None else packet
                    yield Diagnostic.error(
                        "E253",
                        f"police burst {format_size(p.burst.bytes)} is smaller than {what}: "
                        "such packets would never conform and always get the verdict for "
                        f"traffic above the rate ({p.exceed}); give a burst of at least "
                        f"{largest} bytes",
                        p.burst.span,
                    )
                if implicit:
                    yield Diagnostic.warning(
                        "W376",
                        f"a policer without an mtu gets tc's, {POLICE_DEFAULT_MTU} bytes (255 "
                        "cells of its rate table), below a full-size Ethernet frame as the "
                        f"interface's size table charges it ({frame} bytes, the length the "
                        "policer compares with its mtu): every full-size packet gets the "
                        f"verdict for traffic above the rate ({p.exceed}); give an mtu of at "
                        f"least {frame} bytes, and a burst of at least as much",
                        p.span,
                    )
                elif p.mtu is not None and p.mtu.bytes < SMALLEST_MTU:
                    # (below any link's packets: a link of a smaller MTU than Ethernet's, a
                    # WireGuard or PPPoE one, may set its own on purpose; found by a review)
                    # (found by a tester: 'mtu 64', meant as 'mpu 64', was silent)
                    yield Diagnostic.warning(
                        "W376",
                        f"police mtu {format_size(p.mtu.bytes)} is smaller than {packet}: every "
                        f"bigger packet gets the verdict for traffic above the rate ({p.exceed}); "
                        f"give an mtu of at least {frame} bytes, or leave it out",
                        p.mtu.span,
                    )
                elif p.mtu is not None and linklayer.FRAME <= p.mtu.bytes < frame:
                    yield Diagnostic.warning(
                        "W376",
                        f"police mtu {format_size(p.mtu.bytes)} holds a full-size Ethernet "
                        "frame as it is, not as the interface's size table charges it "
                        f"({frame} bytes, the length the policer compares with its mtu): "
                        "every full-size packet gets the verdict for traffic above the rate "
                        f"({p.exceed}); give an mtu of at least {frame} bytes",
                        p.mtu.span,
                    )


def download_marks_need_connmark(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E255: a download that classifies by firewall mark without ``connmark``: arriving
    packets are redirected to the IFB on ingress, before netfilter has marked them."""
    for iface in policy.interfaces:
        d = iface.download
        if d is None or d.connmark:
            continue
        marks = (
            c.mark.span for q in ir.walk_qdiscs(iface.root) for c in ir.classes_of(q) if c.mark
        )
        span = iface.marking.span if iface.marking is not None else next(marks, None)
        if span is not None:
            yield Diagnostic.error(
                "E255",
                f"the download of '{d.interface}' is classified on ingress, before iptables or "
                "nft see the packets, so a mark set in the firewall is not there yet; write "
                f"'download connmark' to restore each connection's mark on the redirect",
                span,
                Note("the download is here", d.span),
            )


def download_marks_where_they_arrive(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E256: a download's marking rules run on the packets that arrived on its interface (in
    FORWARD and INPUT, after NAT is undone); ``from local``, ``at postrouting`` or another
    interface would mark other packets, which the download never sees, and ``from any``
    marks the LAN's packets too, whose connections then keep the default's mark."""
    for iface in policy.interfaces:
        d, m = iface.download, iface.marking
        if d is None or m is None:
            continue
        if m.hook == "output":
            why = "'from local' marks the packets this host sends, which the download never sees"
        elif m.hook == "postrouting":
            why = (
                f"'at postrouting' marks the packets leaving by {d.interface} (its upload), "
                "which the download never sees"
            )
        elif m.from_interface is ANY:
            why = (
                "'from any' marks the packets arriving on every interface, the LAN's too: a "
                "connection opened from there takes the mark of its first packet (the "
                "default's, unless a download line matches that packet), which connmark "
                "restores on every reply before the rules see it, so the replies are not "
                "classified by the download's lines"
            )
        elif m.from_interface != d.interface:
            why = (
                f"'from {m.from_interface}' marks packets arriving on {m.from_interface}, "
                f"not the download's, which arrive on {d.interface}"
            )
        else:
            continue
        yield Diagnostic.error(
            "E256",
            f"{why}; a download marks what arrives on its interface: write 'classify by mark "
            f"from {d.interface}'",
            m.span,
            Note("the download is here", d.span),
        )


ANY = None
"""In the arrivals a tree's marking rules see: every interface (``from any``; an interface
named ``any``, written ``from "any"``, is a string)."""


def _sees(iface: ir.Interface) -> frozenset[str | None]:
    """The interfaces whose arriving packets ``iface``'s marking rules mark before routing
    sends them on (PREROUTING, or a download's FORWARD and INPUT); none for rules on the
    way out (``from local``, ``at postrouting``: only packets leaving the tree's own
    interface)."""
    m = iface.marking
    if m is None or m.hook != "prerouting":
        return frozenset()
    return frozenset((m.from_interface,))


def _carries(iface: ir.Interface) -> frozenset[str | None]:
    """The interfaces whose arriving packets leave the router with ``iface``'s marks: those
    its rules mark, and a download's own (its redirect restores the connection's mark)."""
    own = frozenset((iface.download.interface,) if iface.download is not None else ())
    return _sees(iface) | own


def _arrivals(where: frozenset[str | None]) -> str:
    return "any interface" if ANY in where else " and ".join(sorted(filter(None, where)))


def _reach(a: ir.Interface, b: ir.Interface, rare: bool = False) -> str | None:
    """How the marks ``a``'s rules set reach the packets ``b``'s fw filters classify (in
    words), or None when they cannot; ``rare``: only by packets few routers forward, which
    the rest leaves out: those that leave by the interface they arrived on (NAT loopback),
    and connections forwarded from one download's interface to another's (WAN to WAN)."""
    carried, seen_a, seen_b = _carries(a), _sees(a), _sees(b)
    if rare:
        # an upload and its own download: only a packet the WAN sends back to the WAN
        own = a.download is not None and a.interface == b.interface
        if b.download is None and carried == {b.interface} and not own:
            return (
                f"packets arriving on {b.interface} that leave by {b.interface} again (NAT "
                f"loopback: a port forward reached from that side) carry the marks of "
                f"'{a.label}', which the fw filters of '{b.label}' read"
            )
        if a.download is not None and b.download is not None and carried - {b.interface}:
            return (
                f"'{a.label}' saves its marks on the connections of packets arriving on "
                f"{_arrivals(carried)}, and a connection forwarded between there and "
                f"{b.interface} (from one WAN to the other) has them restored by the download "
                f"redirect of '{b.interface}'"
            )
        return None
    if b.download is None:
        if carried - {b.interface}:
            return (
                f"packets arriving on {_arrivals(carried)} can leave by {b.interface} with "
                f"the marks of '{a.label}', which the fw filters of '{b.label}' read"
            )
        return None
    # the arrivals both rules mark ('from any' takes the other's)
    shared = seen_b if ANY in seen_a else seen_a if ANY in seen_b else seen_a & seen_b
    if shared:
        return (
            f"the rules of both mark packets arriving on {_arrivals(shared)}: the first to "
            "mark one leaves it marked for the other (a rule marks only unmarked packets), "
            f"and the download of '{b.interface}' saves that mark on the connection and "
            "classifies by it"
        )
    return None


def _sees_them(a: ir.Interface, b: ir.Interface) -> bool:
    """Whether ``b``'s rules see packets that carry ``a``'s marks (:func:`_reach` holds)."""
    m = b.marking
    assert m is not None
    if b.download is not None:
        return True  # its rules mark what arrives on its interface: the packets reached
    if m.hook == "output":
        return False  # only the host's own packets, which no other tree marks first
    if m.hook == "postrouting":
        return True  # every packet leaving by its interface
    carried = _carries(a)
    return ANY in carried or m.from_interface is ANY or m.from_interface in carried


def _classes_by_mark(iface: ir.Interface) -> dict[int, str]:
    """Each mark of ``iface``'s classes and the class (its fw filter's)."""
    return {
        c.fwmark: c.label
        for q in ir.walk_qdiscs(iface.root)
        for c in ir.classes_of(q)
        if c.fwmark is not None
    }


def marks_kept_apart(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E273: two trees classifying by mark, where the marks one tree's rules set reach the
    packets the other classifies and the other would misread them: its rules mark only
    packets whose mark bits are clear, so one its rules see keeps the first tree's mark
    (two WAN interfaces both marking 'from lan0'); and one they do not see goes to the
    class whose mark equals it. Disjoint masks keep them apart. W374 where they meet only
    in packets few routers forward. (Allocated: the marks.)"""
    marking = _marking(policy)
    yield from _kept_apart([(a, b) for n, b in enumerate(marking) for a in marking[:n]])


def marks_apart_from(
    policy: ir.Policy, others: Iterable[tuple[str, ir.Policy]]
) -> Iterator[Diagnostic]:
    """E273 and W374 between the trees of ``policy`` and those of ``others``, (name,
    policy) pairs applied on the same router under other names, at ``policy``'s trees."""
    ours = _marking(policy)
    for name, other in others:
        theirs = _marking(other)
        yield from _kept_apart([(a, b) for b in ours for a in theirs], f" (applied as '{name}')")


def _marking(policy: ir.Policy) -> list[ir.Interface]:
    return [i for i in policy.interfaces if i.marking is not None and not isinstance(i.root, ir.Mq)]


def _kept_apart(
    pairs: list[tuple[ir.Interface, ir.Interface]], whose: str = ""
) -> Iterator[Diagnostic]:
    """E273 or W374 for each pair (a, b) whose marks meet, at b's ``classify by mark`` with a
    note at a's (``whose``: which policy a is of, when it is another)."""
    marks = {id(i): _classes_by_mark(i) for pair in pairs for i in pair}
    for a, b in pairs:
        ma, mb = a.marking, b.marking
        assert ma is not None and mb is not None
        note = Note(f"the marks of '{a.label}'{whose} are chosen here", ma.span)
        apart = _apart(a, b)
        found = _misread(a, b, marks) or _misread(b, a, marks)
        if found is not None:
            yield Diagnostic.error(
                "E273",
                f"{found}: those packets are classified by the other tree's marks; {apart}",
                mb.span,
                note,
            )
            continue
        found = _misread(a, b, marks, True) or _misread(b, a, marks, True)
        if found is not None:
            yield Diagnostic.warning(
                "W374",
                f"{found}: those packets are classified by the other tree's marks (the "
                f"rest of the traffic is not); {apart}",
                mb.span,
                note,
            )


_BLOCKS = (0xFFFF0000, 0x0000FFFF, 0xFF000000, 0x00FF0000, 0x0000FF00, 0x000000FF)
"""Mark bits to suggest to a tree, widest first."""


def _apart(a: ir.Interface, b: ir.Interface) -> str:
    """The advice to give ``a`` and ``b`` mark bits of their own, from the masks they have."""
    ma, mb = a.marking, b.marking
    assert ma is not None and mb is not None
    if ma.mask is None and mb.mask is None:
        return (
            "give each tree mark bits of its own ('mask 0xffff' on one, 'mask 0xffff0000' on "
            "the other; with more trees, a byte each: 0xff, 0xff00, 0xff0000, 0xff000000)"
        )
    kept, other, taken = (a, b, ma.mask_value) if ma.mask is not None else (b, a, mb.mask_value)
    free = next((m for m in _BLOCKS if not m & taken), None)
    if free is None:
        return (
            f"give each tree mark bits of its own: the mask {taken:#x} of '{kept.label}' "
            f"leaves no byte for '{other.label}'; narrow it (a byte or two: 0xff00, 0xffff)"
        )
    return (
        f"give each tree mark bits of its own: 'mask {free:#x}' on '{other.label}', outside "
        f"the mask {taken:#x} of '{kept.label}'"
    )


def _misread(
    a: ir.Interface, b: ir.Interface, marks: dict[int, dict[int, str]], rare: bool = False
) -> str | None:
    """How ``b`` misreads the marks of ``a`` (in words), or None if it cannot (``rare``:
    through the packets few routers forward alone, see :func:`_reach`)."""
    ma, mb = a.marking, b.marking
    assert ma is not None and mb is not None
    if not set(a.families) & set(b.families):
        return None
    why = _reach(a, b, rare)
    if why is None:
        return None
    theirs, ours = marks[id(a)], marks[id(b)]
    read = mb.mask_value
    if _sees_them(a, b):
        shared = next((v for v in sorted(theirs) if v & read), None)
        if shared is None:
            return None
        return (
            f"{why}; the rules of '{b.label}' mark only packets whose bits {read:#x} are "
            f"clear, and '{a.label}' sets some of them (mark {shared:#x}, {theirs[shared]})"
        )
    clash = next((v for v in sorted(theirs) if v & read in ours), None)
    if clash is None:
        return None
    return (
        f"{why}; mark {clash:#x} ({theirs[clash]} of '{a.label}') reads as "
        f"{clash & read:#x} there, the mark of {ours[clash & read]}"
    )


def download_nat(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W360: a download u32 match on a private (RFC 1918) destination: on ingress a NAT
    router's downloads are still addressed to its public address. A subscriber table's
    addresses get one warning per tree and table, at the first, with their count; so do a
    tree's lines when they have more than :data:`NAT_SHOWN` (found by a tester: 3,920 of
    them, one a line, buried every other diagnostic)."""
    for iface in policy.interfaces:
        if iface.download is None:
            continue
        # by mark, a line with a pref of its own stays a u32 filter (found by a review)
        marked = iface.marking is not None
        # a table's path (or "" for the tree's lines) -> its private addresses
        found: dict[str, list[tuple[object, Span]]] = {}
        for q in ir.walk_qdiscs(iface.root):
            for cls, m in ir.matches_of(q):
                if marked and m.pref is None:
                    continue
                for where, span in _private_destinations(m):
                    table = span.file if cls is not None and cls.from_table else ""
                    found.setdefault(table, []).append((where, span))
        for table, addresses in found.items():
            if not table and len(addresses) <= NAT_SHOWN:
                for where, span in addresses:
                    yield _nat_warning(str(where), span, marked)
                continue
            (first, span), more = addresses[0], len(addresses) - 1
            of = table or "this download's lines"
            what = f"{first} and {more} more address(es) of {of}" if more else str(first)
            yield _nat_warning(what, span, marked)


NAT_SHOWN = 3
"""The private destinations of a download's own lines that W360 names one by one; more are
one warning, at the first."""


def _private_destinations(m: ir.Match) -> Iterator[tuple[object, Span]]:
    """The private IPv4 destinations of a match line (a /32 as its address), with spans."""
    for cond in m.conds:
        if not isinstance(cond, ir.AddrCond) or cond.field != "dst":
            continue
        for net, span in cond.networks:
            if net.version == 4 and any(net.subnet_of(p) for p in PRIVATE):
                yield (net.network_address if net.prefixlen == 32 else net), span


def _nat_warning(where: str, span: Span, marked: bool = False) -> Diagnostic:
    advice = (
        "leave out the line's pref, which makes it a u32 filter of its own, so that the "
        "marks (set after NAT) decide"
        if marked
        else "classify by mark with 'download connmark' (the marks are set after NAT)"
    )
    return Diagnostic.warning(
        "W360",
        f"downloads are classified on ingress, before NAT is undone: behind a NAT router they "
        f"are addressed to its public address, not to {where}; if this is a NAT router, {advice}",
        span,
    )


CHECKS = (
    policers_fit,
    download_marks_need_connmark,
    download_marks_where_they_arrive,
    download_nat,
)
