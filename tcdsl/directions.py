"""Checks of the download and ingress sides of an interface and of policers: what the kernel
would refuse, and what would silently do nothing (marks a download never sees, a policer no
packet fits, addresses NAT hides)."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv4Network

from tcdsl import ir
from tcdsl.diagnostics import Diagnostic, Note, Span
from tcdsl.units import format_size

FRAME = 1514
"""The largest packet a policer meets on an Ethernet device without GSO: 1500 bytes of IP and
the 14-byte Ethernet header (the kernel counts it on egress)."""

PRIVATE = tuple(IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
"""RFC 1918's private networks."""


def policers_fit(policy: ir.Policy) -> Iterator[Diagnostic]:
    """E253: a policer whose burst is below the largest packet it lets through (no such
    packet ever conforms: tc-police(8) asks for a burst of at least the MTU); E252: a
    policer where classification is by firewall mark (the fw filter is the class's, not the
    match line's)."""
    for iface in policy.interfaces:
        for q in ir.walk_qdiscs(iface.root):
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
                largest = p.mtu.bytes if p.mtu is not None else FRAME
                if p.burst.bytes < largest:
                    what = (
                        f"its mtu of {format_size(largest)}"
                        if p.mtu is not None
                        else f"a full-size Ethernet packet ({FRAME} bytes)"
                    )
                    yield Diagnostic.error(
                        "E253",
                        f"police burst {format_size(p.burst.bytes)} is smaller than {what}: "
                        "such packets would never conform and always get the verdict for "
                        f"traffic above the rate ({p.exceed}); give a burst of at least "
                        f"{largest} bytes",
                        p.burst.span,
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
    interface would mark other packets, which the download never sees."""
    for iface in policy.interfaces:
        d, m = iface.download, iface.marking
        if d is None or m is None:
            continue
        if m.hook != "prerouting":
            where = "from local" if m.hook == "output" else "at postrouting"
            why = f"'{where}' marks packets this host sends, which the download never sees"
        elif m.from_interface not in (None, d.interface):
            why = (
                f"'from {m.from_interface}' marks packets arriving on {m.from_interface}, "
                f"not the download's, which arrive on {d.interface}"
            )
        else:
            continue
        yield Diagnostic.error(
            "E256",
            f"{why}; a download marks what arrives on its interface: write 'classify by mark "
            f"from {d.interface}' (or 'from any')",
            m.span,
            Note("the download is here", d.span),
        )


def download_nat(policy: ir.Policy) -> Iterator[Diagnostic]:
    """W360: a download u32 match on a private (RFC 1918) destination: on ingress a NAT
    router's downloads are still addressed to its public address. A subscriber table's
    addresses get one warning per tree and table, at the first, with their count."""
    for iface in policy.interfaces:
        if iface.download is None or iface.marking is not None:
            continue
        tables: dict[str, list[tuple[object, Span]]] = {}  # table -> its private addresses
        for q in ir.walk_qdiscs(iface.root):
            for cls, m in ir.matches_of(q):
                for where, span in _private_destinations(m):
                    if cls is not None and cls.from_table:
                        tables.setdefault(span.file, []).append((where, span))
                    else:
                        yield _nat_warning(str(where), span)
        for table, found in tables.items():
            (first, span), more = found[0], len(found) - 1
            what = f"{first} and {more} more address(es) of {table}" if more else str(first)
            yield _nat_warning(what, span)


def _private_destinations(m: ir.Match) -> Iterator[tuple[object, Span]]:
    """The private IPv4 destinations of a match line (a /32 as its address), with spans."""
    for cond in m.conds:
        if not isinstance(cond, ir.AddrCond) or cond.field != "dst":
            continue
        for net, span in cond.networks:
            if net.version == 4 and any(net.subnet_of(p) for p in PRIVATE):
                yield (net.network_address if net.prefixlen == 32 else net), span


def _nat_warning(where: str, span: Span) -> Diagnostic:
    return Diagnostic.warning(
        "W360",
        f"downloads are classified on ingress, before NAT is undone: behind a NAT router they "
        f"are addressed to its public address, not to {where}; classify by mark with 'download "
        "connmark' (the marks are set after NAT) if this is a NAT router",
        span,
    )


CHECKS = (
    policers_fit,
    download_marks_need_connmark,
    download_marks_where_they_arrive,
    download_nat,
)
