"""What tc and the kernel compute from the values a policy gives them, in one place.

The checks (values that wrap), ``verify``'s expectations (values as tc shows them), ``classify``,
``explain`` and ``simulate`` all need the same few formulas and tables of iproute2 6.1 and
Linux; each is written once here.
"""

from __future__ import annotations

import math

from tcdsl import ir

U32_MAX = 2**32 - 1
TICKS_PER_US = 15.625
"""iproute2's ``tick_in_usec`` on every kernel since 2.6.31: the psched tick is 64 ns
(/proc/net/psched: 1000 64 ...)."""

IP_TOS2PRIO: tuple[int, ...] = (0, 0, 0, 0, 2, 2, 2, 2, 6, 6, 6, 6, 4, 4, 4, 4)
"""net/ipv4/route.c ``ip_tos2prio[16]``, indexed by ``(tos & 0x1e) >> 1``: the priority Linux
gives a packet from its TOS byte (BESTEFFORT 0, BULK 2, INTERACTIVE 6, INTERACTIVE_BULK 4).
Since Linux 3.2 the odd entries, once ``TC_PRIO_FILLER``, are ``ECN_OR_COST(...)``: index 1
(TOS 0x02, minimize cost, also ECN's ECT(0) bit) is best effort."""
IPTOS_TOS_MASK = 0x1E
DEFAULT_PRIOMAP = ir.DEFAULT_PRIOMAP
"""Priority -> band: pfifo_fast's ``prio2band`` (net/sched/sch_generic.c), which is also the
priomap tc gives a prio qdisc unless told otherwise (iproute2 tc/q_prio.c)."""


def tos_priority(tos: int) -> int:
    """``rt_tos2priority``: the skb priority of a packet with this TOS byte."""
    return IP_TOS2PRIO[(tos & IPTOS_TOS_MASK) >> 1]


def tc_xmittime_ticks(rate_bytes: int, size: int) -> int:
    """iproute2's ``tc_calc_xmittime`` before its 32-bit result wraps: the 64-ns ticks to send
    ``size`` bytes at ``rate_bytes`` bytes/s (the time truncated to whole microseconds first,
    in double precision as tc does)."""
    return int(int(1_000_000 * (size / rate_bytes)) * TICKS_PER_US)


def mult_shift(rate_bytes: int) -> tuple[int, int]:
    """The kernel's reciprocal of a rate (``psched_ratecfg_precompute``): mult and shift."""
    factor, shift = 1_000_000_000, 0
    while True:
        mult = factor // rate_bytes
        if mult & (1 << 31) or factor & (1 << 63):
            return mult & U32_MAX, shift
        factor <<= 1
        shift += 1


def psched_l2t_ns(rate_bytes: int, length: int) -> int:
    """The kernel's ``psched_l2t_ns``: nanoseconds to send ``length`` bytes at the rate."""
    mult, shift = mult_shift(rate_bytes)
    return (length * mult) >> shift


HTB_QUANTUM = (1000, 200000)
"""sch_htb: a quantum computed from rate / r2q outside this range (bytes) is clamped into it,
with the warning "quantum of class is small/big"."""
HTB_DEFAULT_R2Q = 10


def htb_r2q(q: ir.Htb) -> int:
    """The htb's r2q: its own, the one allocation chose, or tc's default."""
    if q.r2q is not None:
        return q.r2q.value
    return q.chosen_r2q if q.chosen_r2q is not None else HTB_DEFAULT_R2Q


def htb_r2q_range(rates_bytes: list[int]) -> tuple[int, int] | None:
    """The r2q values (lowest, highest) that put the quantum of every class of these rates
    (bytes/s) inside the kernel's range; None if no r2q does."""
    lo, hi = HTB_QUANTUM
    lowest, highest = max(-(-max(rates_bytes) // hi), 1), min(min(rates_bytes) // lo, U32_MAX)
    return (lowest, highest) if lowest <= highest else None


def htb_r2q_fits(leaf_bytes: list[int], all_bytes: list[int]) -> tuple[int, int] | None:
    """The r2q range to choose from for an htb: the one that suits its leaf classes (the only
    ones that use their quantum), narrowed to one that suits every class where there is
    one; None if no r2q suits the leaves (rates more than 200 times apart)."""
    fits = htb_r2q_range(leaf_bytes) if leaf_bytes else None
    if fits is None:
        return None
    return htb_r2q_range(all_bytes) or fits


def htb_class_quantum(cls: ir.Class, r2q: int) -> int | None:
    """The quantum (bytes) sch_htb keeps for an htb class under an htb of this r2q: its
    ``quantum``, the one allocation chose, or rate / r2q clamped; None without a rate."""
    if cls.quantum is not None:
        return cls.quantum.bytes
    if cls.chosen_quantum is not None:
        return cls.chosen_quantum
    if not isinstance(cls.rate, ir.Rate):
        return None
    return htb_quantum(cls.rate.bits_per_second, r2q)[1]


def htb_quantum(rate_bits: int, r2q: int) -> tuple[int, int]:
    """The quantum (bytes) sch_htb computes for a class of this rate without a ``quantum``, and
    the one it keeps after clamping."""
    computed = rate_bits // 8 // r2q
    lo, hi = HTB_QUANTUM
    return computed, min(max(computed, lo), hi)


def red_thresholds(q: ir.Red) -> tuple[int, int, int]:
    """A red's min, max (bytes) and burst (packets) as tc completes them (q_red.c): max is
    3 min, or limit / 4 without min; min is max / 3; burst is (2 min + max) / (3 avpkt)."""
    limit = q.limit.bytes if q.limit is not None else 0
    avpkt = q.avpkt.bytes if q.avpkt is not None else 0
    qmin = q.min.bytes if q.min is not None else 0
    qmax = q.max.bytes if q.max is not None else 0
    if not qmax:
        qmax = qmin * 3 if qmin else limit // 4
    if not qmin:
        qmin = qmax // 3
    burst = q.burst.value if q.burst is not None and q.burst.value else 0
    if not burst and avpkt:
        burst = (2 * qmin + qmax) // (3 * avpkt)
    return qmin, qmax, burst


def red_wlog(qmin: int, burst: int, avpkt: int) -> int | None:
    """tc_red_eval_ewma: the averaging constant's log (tc's ``ewma``), or None where tc refuses
    the values (a burst below min / avpkt)."""
    a = burst + 1 - qmin / avpkt
    if a < 1.0:
        return None
    w = 0.5
    for wlog in range(1, 32):
        if a <= (1 - (1 - w) ** burst) / w:
            return wlog
        w /= 2
    return None


def red_plog(qmin: int, qmax: int, probability: float) -> int | None:
    """tc_red_eval_P: the log of max probability / (max - min), or None where tc refuses it."""
    span = qmax - qmin
    if span == 0:
        return 0
    if span < 0:
        return None
    prob = probability / span
    for i in range(32):
        if prob > 1.0:
            return i
        prob *= 2
    return None


RED_DEFAULT_BANDWIDTH = 10_000_000
"""The bandwidth (bits/s) tc gives a red without one (q_red.c)."""


def red_scell_log(wlog: int, avpkt: int, bits_per_second: int) -> int | None:
    """tc_red_eval_idle_damping's cell log (tc's ``Scell_log``), or None where tc refuses it
    (the idle time red must cover needs a cell of 2^32 ticks or more)."""
    xmit = tc_xmittime_ticks(bits_per_second // 8, avpkt) if bits_per_second >= 8 else 0
    if xmit == 0:
        return 0
    lw = -math.log(1.0 - 1.0 / (1 << wlog)) / xmit
    maxtime = 31 / lw
    for clog in range(32):
        if maxtime / (1 << clog) < 512:
            return clog
    return None


TBF_PEAK_MTU = 1600
"""The mtu tc gives a tbf's peak bucket where none is written (tc/q_tbf.c)."""


def tbf_queue_limit(q: ir.Tbf) -> int | None:
    """The bytes a leaf tbf's queue holds: its ``limit``, or what tc makes of ``latency``
    (rate x latency + burst; with a peakrate, at most peakrate x latency + mtu, as
    tc/q_tbf.c computes it); None where neither is written."""
    if q.limit is not None:
        return q.limit.bytes
    if q.latency is None or q.rate is None or q.burst is None:
        return None
    limit = q.rate.bits_per_second // 8 * q.latency.microseconds // 1_000_000 + q.burst.bytes
    if q.peakrate is not None:
        mtu = q.mtu.bytes if q.mtu else TBF_PEAK_MTU
        peak = q.peakrate.bits_per_second // 8 * q.latency.microseconds // 1_000_000 + mtu
        limit = min(limit, peak)
    return limit


def fq_buckets_kept(buckets: int) -> int:
    """The buckets an fq gets for ``buckets`` written: tc sends ``ilog2(buckets)``, which
    tc/q_fq.c rounds up (3 is 4)."""
    return 1 << (buckets - 1).bit_length()
