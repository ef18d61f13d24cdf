"""Run flows through a policy on this host's kernel and measure per-class throughput.

``measure(policy, script, flows, duration)`` builds a three-namespace lab::

    tcdsl-m-<pid>-snd            tcdsl-m-<pid>-rtr                      tcdsl-m-<pid>-rcv
    +------------------+        +------------------------------+       +------------------+
    | raw-socket       | veth   | ingress       policy egress  | veth  | iptables raw     |
    | sender (Python)  |------->| (tcdsl-in, or  (the policy's |------>| counts per flow, |
    | one process,     |        |  the marking's  interface    |       | then drops       |
    | paced per flow   |        |  'from' name)   name, e.g.   |       |                  |
    +------------------+        |               eth0) + script |       +------------------+
                                +------------------------------+

The sender writes each flow's packet (``Packet.ip_packet()``: the same IP header (IPv6: and
extension headers) and transport header ``classify`` and ``simulate`` read, padded to the
flow's size) through a raw IP socket of its family, paced by a token bucket on the monotonic
clock. A rate-limited flow sends at its rate; a greedy flow offers ``GREEDY_FACTOR`` times the
most its class can ever send (its ceilings, else the link), capped at ``GREEDY_MAX``, so its
queue never runs dry and the router drops the excess, as the simulator's greedy flows. The
router forwards (static routes and neighbours: no ARP or neighbour discovery; IPv6 is off
unless a flow is IPv6, then on with addresses on the veth pairs, without duplicate address
detection) and runs the compiled shell script; its egress device's txqueuelen is ``QUEUE``
packets, the limit of the default pfifo of every leaf class, so a stopped greedy flow drains
quickly.

Every ``interval`` the router's ``tc -s class show`` and ``tc -s qdisc show`` and the
iptables (and ip6tables) counters of both ends are read; counter deltas become a
``report.Run`` with the classes named as in the policy and the flows' bytes as the receiver
counted them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from tcdsl import ir
from tcdsl.checks import effective_ceil, rate_of
from tcdsl.commands import IFB_TXQUEUELEN
from tcdsl.teach.classify import (
    UnknownInterface,
    Verdict,
    classify,
    direction_of,
    flow_keys,
    select_tree,
)
from tcdsl.teach.report import FlowInfo, Run, Series, finish_axes, new_figure, samples, save
from tcdsl.teach.simulate import link_rate
from tcdsl.teach.traffic import ETHERNET_HEADER, Flow, flows_problem
from tcdsl.units import format_rate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

QUEUE = 64
"""The router's egress txqueuelen: the default pfifo limit of leaf classes (and htb's direct
queue), as many packets as the simulator's greedy window."""
GREEDY_FACTOR = 1.2
"""A greedy flow offers this much more than its class can send."""
GREEDY_MAX = 60_000_000
"""The most a greedy flow offers, bits/s (about 5000 packets/s of 1514 bytes)."""
MAX_SIZE = 1514
"""The largest packet (the veth MTU of 1500 bytes plus the Ethernet header)."""
LEAD = 0.2
"""Seconds between the sender being ready and the start of the run."""
TIMEOUT = 30
INGRESS = "tcdsl-in"
OUTGOING = "tcdsl-out"
"""The router's egress when the policy shapes a download (on its arrival interface)."""


class MeasureError(Exception):
    """The flows cannot be measured here; the message says why."""


# ---- the sender (runs in the sender namespace) -------------------------------------------------

SENDER = r"""
import json, socket, sys, time
cfg = json.loads(sys.argv[1])
socks = {}
for family in sorted({f["family"] for f in cfg["flows"]}):
    af = socket.AF_INET if family == "ipv4" else socket.AF_INET6
    # IPPROTO_RAW: the packet is sent as written, IP header included (IPv6 too).
    socks[family] = socket.socket(af, socket.SOCK_RAW, socket.IPPROTO_RAW)
    socks[family].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
print("ready", flush=True)
t0 = float(sys.stdin.readline())
end, burst = t0 + cfg["duration"], cfg["burst"]
flows = []
for f in cfg["flows"]:
    data = bytes.fromhex(f["packet"])
    sock = socks[f["family"]]
    flows.append([data, (f["dst"], 0), f["gap"], t0 + f["start"], t0 + f["stop"], 0, sock])
while True:
    now = time.monotonic()
    if now >= end:
        break
    wake = end
    for f in flows:
        data, addr, gap, start, stop, sent, sock = f
        if now < start:
            wake = min(wake, start)
            continue
        if now >= stop:
            continue
        due = int((now - start) / gap) + 1
        sent = max(sent, due - burst)
        while sent < due:
            try:
                sock.sendto(data, addr)
            except OSError:
                pass
            sent += 1
        f[5] = sent
        wake = min(wake, start + sent * gap, stop)
    time.sleep(max(wake - time.monotonic(), 0.0))
print(json.dumps([f[5] for f in flows]))
"""
"""Sends each flow's packet through a raw IP socket of its family: a token bucket per flow
(``burst``
packets deep) on the monotonic clock, which all namespaces share. It says ``ready`` once
started, then reads the start time of the run (monotonic seconds) from its stdin."""


# ---- running commands --------------------------------------------------------------------------


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MeasureError(f"{' '.join(args)}: {err}") from None
    if check and proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        raise MeasureError(f"{' '.join(args)} failed: {why}")
    return proc


def unavailable() -> str | None:
    """Why this host cannot measure (not root, no ip/tc/iptables), or None."""
    if os.geteuid() != 0:
        return (
            "measuring needs root (network namespaces, tc, iptables); it runs on this "
            "host's kernel only"
        )
    for tool in ("ip", "tc", "iptables", "iptables-save"):
        if shutil.which(tool) is None:
            return f"measuring needs '{tool}'"
    return None


def _ipv6_unavailable() -> str | None:
    """Why this host cannot measure IPv6 flows (no ip6tables), or None."""
    for tool in ("ip6tables", "ip6tables-save"):
        if shutil.which(tool) is None:
            return f"measuring IPv6 flows needs '{tool}'"
    return None


def missing_features(policy: ir.Policy) -> list[str]:
    """What the policy needs that this host's kernel lacks, in words with the policy line
    (``the sfq qdisc (lab.tcp:17)``); raises MeasureError when the host cannot be probed."""
    from tcdsl.verify.expect import expected_policy
    from tcdsl.verify.runner import KernelUnavailable, host_support

    try:
        host = host_support()
    except KernelUnavailable as err:
        raise MeasureError(str(err)) from None
    lacks = host.lacks(expected_policy(policy).requirements)
    return [f"{r.what} ({r.span.file}:{r.span.line})" for r in lacks]


# ---- the flows ---------------------------------------------------------------------------------


@dataclass
class _Target:
    """A series of the run (a class, htb's direct queue, a classless qdisc) and where its
    counters are in tc's output."""

    name: str
    kind: str
    """``class``, ``qdisc`` or ``direct``."""
    key: str
    """The classid or qdisc handle as tc prints it."""
    leaves: tuple[str, ...] = ()
    """For ``direct``: the classids of the htb's leaf classes."""


@dataclass
class _FlowPlan:
    flow: Flow
    verdict: Verdict
    target: _Target
    rate: int
    """Bits/s the sender sends at."""
    stop: int
    """Microseconds."""


def _bound(verdict: Verdict, link: int) -> int:
    """The most the class a flow ends in can send: the lowest ceiling on its way down."""
    best = link
    for step in verdict.steps:
        q = step.qdisc
        if isinstance(q, ir.Tbf) and (r := rate_of(q.rate)) is not None:
            peak = q.peakrate.bits_per_second if q.peakrate else 0
            best = min(best, max(r.bits_per_second, peak))
        if step.cls is not None and (c := effective_ceil(step.cls)) is not None:
            best = min(best, c.bits_per_second)
    return best


def _target(iface: ir.Interface, verdict: Verdict) -> _Target:
    cls = verdict.cls
    if cls is not None:
        if cls.classid is None:
            raise MeasureError(f"class {cls.name or 'link'} has no class id")
        return _Target(cls.name or "link", "class", str(cls.classid))
    last = verdict.steps[-1].qdisc
    handle = str(last.handle) if last.handle is not None else "1:"
    if verdict.direct and isinstance(last, ir.Htb):
        leaves = tuple(
            str(c.classid) for c in ir.classes_of(last) if not c.children and c.classid is not None
        )
        return _Target("direct", "direct", handle, leaves)
    return _Target(last.kind, "qdisc", handle)


def plan_flows(
    policy: ir.Policy, iface: ir.Interface, flows: Sequence[Flow], duration: int, link: int
) -> list[_FlowPlan]:
    """Classify each flow and choose the rate its sender sends at; raises MeasureError."""
    problem = flows_problem(flows)
    if problem is not None:
        raise MeasureError(problem)
    plans = []
    for f in flows:
        if f.packet.size > MAX_SIZE:
            raise MeasureError(
                f"flow {f.name}: packets of {f.packet.size} bytes do not fit the veth MTU "
                f"(at most {MAX_SIZE} bytes with the Ethernet header)"
            )
        dst = ip_address(f.packet.address_text(f.packet.dst))
        if dst.is_multicast or dst.is_loopback or dst.is_unspecified or dst.is_reserved:
            raise MeasureError(f"flow {f.name}: cannot route packets to {dst}")
        if dst.is_link_local:
            raise MeasureError(f"flow {f.name}: the router does not forward to {dst}")
        if f.packet.family == "ipv6" and (why := _ipv6_unavailable()) is not None:
            raise MeasureError(why)
        verdict = classify(policy, f.packet, iface.name, direction_of(iface))
        if f.rate is None:
            rate = min(int(_bound(verdict, link) * GREEDY_FACTOR), GREEDY_MAX)
        else:
            rate = f.rate
        stop = duration if f.stop is None else min(f.stop, duration)
        plans.append(_FlowPlan(f, verdict, _target(iface, verdict), rate, stop))
    return plans


# ---- reading the counters ----------------------------------------------------------------------

_HEAD = re.compile(r"^(class|qdisc) (\S+) (\S+)")
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+)")
_BACKLOG = re.compile(r"backlog (\d+)([KM]?)b (\d+)p")
_DIRECT = re.compile(r"direct_packets_stat (\d+)")
_IPT = re.compile(r"^\[(\d+):(\d+)\] -A PREROUTING .*--comment \"?tcdsl-f(\d+)\b")


@dataclass
class Counters:
    """tc's counters of one class or qdisc."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    backlog: int = 0
    """Bytes queued."""
    direct: int = 0
    """htb's direct_packets_stat."""


def parse_tc_stats(text: str) -> dict[tuple[str, str], Counters]:
    """``tc -s class show`` or ``tc -s qdisc show`` output, by (class|qdisc, id)."""
    out: dict[tuple[str, str], Counters] = {}
    current: Counters | None = None
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head:
            current = out.setdefault((head.group(1), head.group(3)), Counters())
            if d := _DIRECT.search(line):
                current.direct = int(d.group(1))
            continue
        if current is None:
            continue
        if m := _SENT.search(line):
            current.bytes, current.packets, current.drops = (int(g) for g in m.groups())
        if m := _BACKLOG.search(line):
            scale = {"": 1, "K": 1024, "M": 1024 * 1024}[m.group(2)]
            current.backlog = int(m.group(1)) * scale
    return out


def parse_iptables_counters(text: str) -> dict[int, tuple[int, int]]:
    """``iptables-save -c -t raw`` output: the (packets, bytes) of each flow's rule."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        if m := _IPT.match(line):
            out[int(m.group(3))] = (int(m.group(1)), int(m.group(2)))
    return out


@dataclass
class _Sample:
    at: float
    tc: dict[tuple[str, str], Counters]
    offered: dict[int, tuple[int, int]]
    received: dict[int, tuple[int, int]]


# ---- the lab -----------------------------------------------------------------------------------


@dataclass
class Lab:
    """The three namespaces, deleted on exit however the block ends (Ctrl-C too)."""

    prefix: str = field(default_factory=lambda: f"tcdsl-m-{os.getpid()}")
    made: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def snd(self) -> str:
        return f"{self.prefix}-snd"

    @property
    def rtr(self) -> str:
        return f"{self.prefix}-rtr"

    @property
    def rcv(self) -> str:
        return f"{self.prefix}-rcv"

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes started here, then delete the namespaces."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        for ns in reversed(self.made):
            subprocess.run(
                ["ip", "netns", "del", ns], capture_output=True, check=False, timeout=TIMEOUT
            )
        self.made.clear()

    def add(self, ns: str, ipv6: bool = False) -> None:
        """Create ``ns`` (no reverse-path filter; IPv6 off, or with ``ipv6`` on without
        duplicate address detection, router advertisements or autoconfiguration); raises
        MeasureError."""
        made = _run(["ip", "netns", "add", ns], check=False)
        if made.returncode != 0:
            why = made.stderr.strip() or "ip failed"
            raise MeasureError(f"cannot create a network namespace: {why}")
        self.made.append(ns)
        sysctls = [
            f"net.ipv6.conf.all.disable_ipv6={0 if ipv6 else 1}",
            f"net.ipv6.conf.default.disable_ipv6={0 if ipv6 else 1}",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ]
        if ipv6:
            sysctls += [
                f"net.ipv6.conf.{which}.{key}=0"
                for which in ("all", "default")
                for key in ("accept_dad", "accept_ra", "autoconf")
            ]
        _run(["ip", "netns", "exec", ns, "sysctl", "-qw", *sysctls])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def ip(self, ns: str, *args: str) -> None:
        """``ip -n ns ARGS``; raises MeasureError."""
        _run(["ip", "-n", ns, *args])

    def start(self, ns: str, args: Sequence[str]) -> subprocess.Popen[str]:
        """Start ``args`` in ``ns`` in a session of its own (killed by ``close``), with pipes
        for stdin, stdout and stderr."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc


_MAC = {"snd": "02:74:63:00:00:01", "rtr-in": "02:74:63:00:00:02"}
_MAC |= {"rtr-out": "02:74:63:00:00:03", "rcv": "02:74:63:00:00:04"}


LAB_V6 = {
    "snd": "fd74:6364:1::1/64",
    "rtr-in": "fd74:6364:1::2/64",
    "rtr-out": "fd74:6364:2::1/64",
    "rcv": "fd74:6364:2::2/64",
}
"""The lab's own IPv6 addresses (unique local), when a flow is IPv6."""


def build(lab: Lab, policy: ir.Policy, iface: ir.Interface, dsts: Sequence[str], queue: int) -> str:
    """Create the namespaces and links, routes and neighbours; returns the ingress name.
    ``dsts``: the flows' destinations (IPv4 or IPv6; an IPv6 one turns IPv6 on).

    For a download, the flows arrive on the policy's interface (the script redirects them to
    its IFB) and leave by ``tcdsl-out``."""
    names = {i.interface for i in policy.interfaces}
    marking = iface.marking.from_interface if iface.marking else None
    ingress = marking if marking and marking != iface.name else INGRESS
    egress = iface.name
    if iface.download is not None:
        ingress, egress = iface.download.interface, OUTGOING
    ipv6 = any(":" in d for d in dsts)
    for ns in (lab.snd, lab.rtr, lab.rcv):
        lab.add(ns, ipv6)
    rtr = lab.rtr
    lab.ip(rtr, "link", "add", ingress, "type", "veth", "peer", "name", "snd0", "netns", lab.snd)
    lab.ip(rtr, "link", "add", egress, "type", "veth", "peer", "name", "rcv0", "netns", lab.rcv)
    lab.ip(lab.snd, "link", "set", "snd0", "address", _MAC["snd"])
    lab.ip(rtr, "link", "set", ingress, "address", _MAC["rtr-in"])
    lab.ip(rtr, "link", "set", egress, "address", _MAC["rtr-out"], "txqueuelen", str(queue))
    lab.ip(lab.rcv, "link", "set", "rcv0", "address", _MAC["rcv"])
    others = sorted((names | ({marking} if marking else set())) - {egress, ingress})
    for i, name in enumerate(others):  # the policy's other interfaces: the script needs them
        lab.ip(rtr, "link", "add", name, "type", "veth", "peer", "name", f"tcdslx{i}")
        lab.ip(rtr, "link", "set", f"tcdslx{i}", "up")
        lab.ip(rtr, "link", "set", name, "up")
    for ns, dev in ((lab.snd, "snd0"), (rtr, ingress), (rtr, egress), (lab.rcv, "rcv0")):
        lab.ip(ns, "link", "set", dev, "up")
    _run(["ip", "netns", "exec", rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    lab.ip(lab.snd, "route", "add", "default", "dev", "snd0")
    lab.ip(rtr, "route", "add", "default", "dev", ingress)
    if ipv6:
        _run(["ip", "netns", "exec", rtr, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
        for ns, dev, key in (
            (lab.snd, "snd0", "snd"),
            (rtr, ingress, "rtr-in"),
            (rtr, egress, "rtr-out"),
            (lab.rcv, "rcv0", "rcv"),
        ):
            lab.ip(ns, "-6", "addr", "add", LAB_V6[key], "dev", dev, "nodad")
        lab.ip(lab.snd, "-6", "route", "add", "default", "dev", "snd0")
        lab.ip(rtr, "-6", "route", "add", "default", "dev", ingress)
    for dst in dsts:
        host = "/128" if ":" in dst else "/32"
        lab.ip(lab.snd, "neigh", "replace", dst, "lladdr", _MAC["rtr-in"], "dev", "snd0")
        lab.ip(rtr, "route", "replace", f"{dst}{host}", "dev", egress)
        lab.ip(rtr, "neigh", "replace", dst, "lladdr", _MAC["rcv"], "dev", egress)
    return ingress


def _match(flow: Flow) -> list[str]:
    p = flow.packet
    host = "/32" if p.family == "ipv4" else "/128"
    words = ["-s", p.address_text(p.src) + host, "-d", p.address_text(p.dst) + host]
    # The protocol and ports as iptables finds them: past IPv6 extension headers up to AH,
    # no ports in a later fragment.
    keys = flow_keys(p, netfilter=True)
    words += ["-p", str(keys.ip_proto)]
    if keys.ip_proto in (6, 17) and not p.later_fragment:
        words += ["--sport", str(p.sport), "--dport", str(p.dport)]
    return words


def _count_rules(lab: Lab, plans: Sequence[_FlowPlan]) -> None:
    """A counting rule per flow in the raw table of the router (offered) and the receiver
    (received, then dropped: there is no socket to take the packets)."""
    for i, plan in enumerate(plans):
        comment = ["-m", "comment", "--comment", f"tcdsl-f{i}"]
        tool = "iptables" if plan.flow.packet.family == "ipv4" else "ip6tables"
        for ns, target in ((lab.rtr, []), (lab.rcv, ["-j", "DROP"])):
            rule = [tool, "-t", "raw", "-A", "PREROUTING", *_match(plan.flow)]
            _run(["ip", "netns", "exec", ns, *rule, *comment, *target])


def _sample(lab: Lab, dev: str, ipv6: bool = False) -> _Sample:
    """Read every counter at once (four commands run side by side; six with ``ipv6``, the
    ip6tables counters too)."""
    saves = ["iptables-save", "ip6tables-save"] if ipv6 else ["iptables-save"]
    cmds = [
        ["tc", "-n", lab.rtr, "-s", "class", "show", "dev", dev],
        ["tc", "-n", lab.rtr, "-s", "qdisc", "show", "dev", dev],
        *(
            ["ip", "netns", "exec", ns, save, "-c", "-t", "raw"]
            for ns in (lab.rtr, lab.rcv)
            for save in saves
        ),
    ]
    at = time.monotonic()
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds
    ]
    outs = []
    for cmd, proc in zip(cmds, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except BaseException:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
            raise
        if proc.returncode != 0:
            raise MeasureError(f"{' '.join(cmd)} failed: {err.strip()}")
        outs.append(out)
    stats = parse_tc_stats(outs[0])
    stats.update(parse_tc_stats(outs[1]))
    counted = [parse_iptables_counters(out) for out in outs[2:]]
    half = len(counted) // 2
    offered = {k: v for c in counted[:half] for k, v in c.items()}
    received = {k: v for c in counted[half:] for k, v in c.items()}
    return _Sample(at, stats, offered, received)


# ---- from samples to a run ---------------------------------------------------------------------


def _counters(sample: _Sample, target: _Target) -> Counters:
    if target.kind != "direct":
        return sample.tc.get((target.kind, target.key), Counters())
    root = sample.tc.get(("qdisc", target.key), Counters())
    leaves = [sample.tc.get(("class", k), Counters()) for k in target.leaves]
    sent = root.bytes - sum(c.bytes for c in leaves)
    return Counters(max(sent, 0), root.direct, 0, 0, root.direct)


def _split(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (whole numbers that add up to it)."""
    if total <= 0 or not weights:
        return [0] * len(weights)
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    shares = [total * w // sum(weights) for w in weights]
    shares[max(range(len(weights)), key=lambda i: weights[i])] += total - sum(shares)
    return shares


def to_run(
    policy: ir.Policy,
    iface: ir.Interface,
    plans: Sequence[_FlowPlan],
    samples: Sequence[_Sample],
    duration: int,
    interval: int,
    link: int,
    notes: Sequence[str] = (),
) -> Run:
    """Counter deltas between consecutive samples as a ``Run``.

    A class's queueing delay in an interval is its mean backlog (bytes, at the two samples)
    over its throughput in the interval (Little's law), charged to each packet it sent.
    """
    targets: dict[str, _Target] = {}
    for p in plans:
        targets.setdefault(p.target.name, p.target)
    order = [c.name or "link" for q in ir.walk_qdiscs(iface.root) for c in ir.classes_of(q)]
    names = [n for n in order if n in targets] + [n for n in targets if n not in order]
    spans = list(pairwise(samples))
    us = [round((b.at - a.at) * 1e6) for a, b in spans]
    classes: dict[str, tuple[list[int], list[int], list[int], list[int]]] = {}
    per_packet: dict[str, list[float]] = {}
    for name in names:
        t = targets[name]
        nb: list[int] = []
        np_: list[int] = []
        nd: list[int] = []
        nq: list[int] = []
        each: list[float] = []
        for (s0, s1), span in zip(spans, us, strict=True):
            c0, c1 = _counters(s0, t), _counters(s1, t)
            sent, packets = c1.bytes - c0.bytes, c1.packets - c0.packets
            backlog = (c0.backlog + c1.backlog) / 2
            delay = backlog * span / sent if sent > 0 else 0.0
            nb.append(sent)
            np_.append(packets)
            nd.append(c1.drops - c0.drops)
            nq.append(round(delay * packets))
            each.append(delay)
        classes[name] = (nb, np_, nd, nq)
        per_packet[name] = each
    fb: list[list[int]] = [[] for _ in plans]
    fp: list[list[int]] = [[] for _ in plans]
    fd: list[list[int]] = [[] for _ in plans]
    fq: list[list[int]] = [[] for _ in plans]
    for k, (s0, s1) in enumerate(spans):
        for i, plan in enumerate(plans):
            r0, r1 = s0.received.get(i, (0, 0)), s1.received.get(i, (0, 0))
            packets = r1[0] - r0[0]
            fb[i].append(r1[1] - r0[1] + ETHERNET_HEADER * packets)
            fp[i].append(packets)
            fq[i].append(round(per_packet[plan.target.name][k] * packets))
        for name in names:  # a class's drops, split over its flows by what they offered
            mine = [i for i, p in enumerate(plans) if p.target.name == name]
            offered = [s1.offered.get(i, (0, 0))[0] - s0.offered.get(i, (0, 0))[0] for i in mine]
            for i, share in zip(mine, _split(classes[name][2][k], offered), strict=True):
                fd[i].append(share)
    flows = tuple(
        FlowInfo(
            p.flow.name,
            p.flow.packet.describe(),
            p.target.name,
            p.flow.rate,
            p.flow.start,
            p.stop,
        )
        for p in plans
    )
    return Run(
        source=policy.source,
        interface=iface.label,
        link=link,
        duration=duration,
        interval=interval,
        flows=flows,
        classes=tuple(
            Series(
                n,
                tuple(classes[n][0]),
                tuple(classes[n][1]),
                tuple(classes[n][2]),
                tuple(classes[n][3]),
            )
            for n in names
        ),
        flow_series=tuple(
            Series(p.flow.name, tuple(fb[i]), tuple(fp[i]), tuple(fd[i]), tuple(fq[i]))
            for i, p in enumerate(plans)
        ),
        notes=tuple(notes),
    )


# ---- the measurement ---------------------------------------------------------------------------


def _interface(policy: ir.Policy, name: str | None, direction: str | None) -> ir.Interface:
    if not policy.interfaces:
        raise MeasureError("the policy has no interface")
    try:
        iface = select_tree(policy, name, direction)
    except UnknownInterface as err:
        raise MeasureError(str(err)) from None
    if isinstance(iface.root, ir.Ingress):
        raise MeasureError(
            "measure runs flows through a shaping tree; an ingress tree has only policers "
            "(tcdsl simulate models them)"
        )
    return iface


def measure(
    policy: ir.Policy,
    script: str,
    flows: Sequence[Flow],
    duration: int,
    interval: int | None = None,
    interface: str | None = None,
    queue: int = QUEUE,
    lab: Lab | None = None,
    direction: str | None = None,
) -> Run:
    """Send ``flows`` through ``policy`` (its compiled shell ``script``) on this host's kernel
    for ``duration`` microseconds, sampling every ``interval`` microseconds (default: 1 s, or
    a thirtieth of a shorter run). ``interface`` (default: the first) is the router's egress,
    or with ``direction`` ``download`` the interface the flows arrive on.

    The namespaces are deleted before this returns, also on an error or KeyboardInterrupt.
    Raises ``MeasureError`` when the host cannot measure (not root, a missing qdisc) or the
    flows cannot be sent (too big, duplicate names).
    """
    why = unavailable()
    if why is not None:
        raise MeasureError(why)
    if duration <= 0:
        raise MeasureError("the duration must be above 0")
    interval = interval or min(1_000_000, max(duration // 30, 1))
    iface = _interface(policy, interface, direction)
    link = link_rate(iface)
    plans = plan_flows(policy, iface, flows, duration, link)
    lacks = missing_features(policy)
    if lacks:
        raise MeasureError(
            f"this host's kernel lacks {', '.join(lacks)}; measure runs on the host kernel "
            "only (use a copy of the policy without it)"
        )
    greedy = ", ".join(f"{p.flow.name} {format_rate(p.rate)}" for p in plans if p.flow.rate is None)
    # A download's leaves take the txqueuelen the script gives its IFB.
    held = IFB_TXQUEUELEN if iface.download is not None else queue
    notes = [
        "measured on this host's kernel" + (f"; greedy flows offered {greedy}" if greedy else ""),
        f"queueing delay from tc's backlog / throughput; leaf pfifos hold {held} packets",
    ]
    edges = [*range(0, duration, interval), duration]
    dsts = sorted({p.flow.packet.address_text(p.flow.packet.dst) for p in plans})
    ipv6 = any(p.flow.packet.family == "ipv6" for p in plans)
    with contextlib.ExitStack() as stack:
        if lab is None:
            lab = stack.enter_context(Lab())
        else:
            stack.callback(lab.close)
        build(lab, policy, iface, dsts, queue)
        with _script_file(script) as path:
            _run(["ip", "netns", "exec", lab.rtr, "sh", str(path)])
        _count_rules(lab, plans)
        config = {
            "duration": duration / 1e6,
            "burst": 8,
            "flows": [
                {
                    "packet": p.flow.packet.ip_packet().hex(),
                    "family": p.flow.packet.family,
                    "dst": p.flow.packet.address_text(p.flow.packet.dst),
                    "gap": p.flow.packet.size * 8 / p.rate,
                    "start": p.flow.start / 1e6,
                    "stop": p.stop / 1e6,
                }
                for p in plans
            ],
        }
        sender = lab.start(lab.snd, [sys.executable, "-c", SENDER, json.dumps(config)])
        t0 = _go(sender)
        samples = []
        for edge in edges:
            _sleep_until(t0 + edge / 1e6)
            if sender.poll() is not None and sender.returncode != 0:
                err = sender.stderr.read() if sender.stderr else ""
                raise MeasureError(f"the sender failed: {err.strip()[-500:]}")
            samples.append(_sample(lab, iface.name, ipv6))
    return to_run(policy, iface, plans, samples, duration, interval, link, notes)


def _go(sender: subprocess.Popen[str]) -> float:
    """Wait for the sender to be ready, then give it the start of the run (``LEAD`` seconds
    from now), which it returns."""
    assert sender.stdin is not None and sender.stdout is not None
    line = sender.stdout.readline()
    if line.strip() != "ready":
        err = sender.stderr.read() if sender.stderr else ""
        raise MeasureError(f"the sender failed: {(line + err).strip()[-500:]}")
    t0 = time.monotonic() + LEAD
    sender.stdin.write(f"{t0!r}\n")
    sender.stdin.flush()
    return t0


def _sleep_until(at: float) -> None:
    left = at - time.monotonic()
    if left > 0:
        time.sleep(left)


@contextlib.contextmanager
def _script_file(script: str) -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tcdsl-measure-") as tmp:
        path = Path(tmp) / "apply.sh"
        path.write_text(script, encoding="utf-8")
        yield path


# ---- measured and simulated side by side -------------------------------------------------------


def compare_table(measured: Run, simulated: Run) -> str:
    """One table of both runs: per class and per flow, simulated / measured mean throughput
    (Mbit/s) over the run and each period, the largest difference in % of the link, the mean
    queueing delays (ms) and the drops."""
    from tcdsl.teach.report import table

    head = table(measured).split("\nmean throughput")[0]
    periods = measured.periods()
    letters = [chr(ord("A") + i) if i < 26 else f"P{i + 1}" for i in range(len(periods))]
    spans = [(0, measured.duration), *((p.start, p.stop) for p in periods)]
    lines = [
        head,
        "simulated / measured: mean throughput in Mbit/s, queueing delay in ms, drops;",
        "diff: the largest |measured - simulated| over the run and periods, % of the link",
    ]
    rows = [["", "run", *letters, "diff", "delay", "drops"]]

    def find(run: Run, kind: str, name: str) -> Series | None:
        group = run.classes if kind == "class" else run.flow_series
        return next((s for s in group if s.name == name), None)

    for kind, group in (("class", measured.classes), ("flow", measured.flow_series)):
        for m in group:
            s = find(simulated, kind, m.name)
            cells = [f"{kind} {m.name}"]
            worst = 0.0
            for a, b in spans:
                mr = measured.rate_between(m, a, b)
                sr = simulated.rate_between(s, a, b) if s is not None else 0.0
                worst = max(worst, abs(mr - sr))
                cells.append(f"{sr / 1e6:.2f} / {mr / 1e6:.2f}")
            cells.append(f"{100 * worst / measured.link:.1f}%")
            sd = simulated.mean_delay(s) if s is not None else None
            md = measured.mean_delay(m)
            cells.append(f"{_ms(sd)} / {_ms(md)}")
            cells.append(f"{sum(s.drops) if s is not None else '-'} / {sum(m.drops)}")
            rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        first = r[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
    lines.extend(f"note: {n}" for n in measured.notes)
    lines.extend(f"note (simulation): {n}" for n in simulated.notes)
    return "\n".join(lines) + "\n"


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def figure_both(measured: Run, simulated: Run) -> Figure:
    """Per-class and per-flow throughput over time: measured solid, simulated dashed in the
    same colour."""
    fig = new_figure()
    groups: list[tuple[str, Callable[[Run], tuple[Series, ...]]]] = [
        ("classes", lambda r: r.classes),
        ("flows", lambda r: r.flow_series),
    ]
    for i, (title, pick) in enumerate(groups, start=1):
        ax = fig.add_subplot(2, 1, i)
        peak = 0.0
        for j, m in enumerate(pick(measured)):
            colour = f"C{j % 10}"
            times, rates = samples(measured, m)
            peak = max([peak, *rates])
            ax.plot(times, [r / 1e6 for r in rates], color=colour, marker=".")
            s = next((x for x in pick(simulated) if x.name == m.name), None)
            if s is not None:
                stimes, srates = samples(simulated, s)
                peak = max([peak, *srates])
                ax.plot(stimes, [r / 1e6 for r in srates], color=colour, ls="--")
            ax.plot([], [], color=colour, label=m.name)
        ax.plot([], [], color="grey", label="measured")
        ax.plot([], [], color="grey", ls="--", label="simulated")
        finish_axes(ax, title, measured, peak)
    fig.axes[-1].set_xlabel("time (s)")
    return fig


def plot_both(measured: Run, simulated: Run, path: str | Path) -> None:
    """Write ``figure_both`` as a PNG to ``path`` (the same runs give the same bytes)."""
    save(figure_both(measured, simulated), path)
