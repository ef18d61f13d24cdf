"""The ``json`` backend: the checked, allocated IR as one JSON document.

The schema is docs/ir.schema.json (JSON Schema draft 2020-12).

Keys come in a fixed order per node kind, every optional field is present (``null`` when the
policy leaves it out), values are integers in base units (bits/s, bytes, microseconds) next to
their tc spelling, and every node the user wrote carries its source span. Lists follow the
IR's order (the order written, or kernel order for filters); nothing is taken from a set.
"""

from __future__ import annotations

import json
from fractions import Fraction
from json.encoder import encode_basestring
from typing import Any, assert_never

from tcdsl import ir
from tcdsl.allocate import default_minor
from tcdsl.backend import Backend
from tcdsl.commands import (
    FILTER_PROTOCOL,
    MARK_TOOL,
    cake_overhead_words,
    curve_words,
    filter_police_words,
    flower_words,
    police_words,
    qdisc_words,
    stab_words,
)
from tcdsl.diagnostics import Span
from tcdsl.lower import PROTO_NAMES, PROTO_NAMES_6, address_text, iptables_words, pack_words
from tcdsl.units import format_rate, format_size, format_time

FORMAT = "tcdsl-ir"
VERSION = 1

JSONValue = Any
"""A JSON-encodable value (dicts keep insertion order, which is the output's key order)."""

JSONObject = dict[str, JSONValue]


def span_json(span: Span) -> JSONObject:
    """A span as ``{file, line, column, end_line, end_column}`` (1-based, end exclusive)."""
    return {
        "file": span.file,
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
    }


def handle_json(handle: ir.Handle | None) -> JSONObject | None:
    """A handle as its numbers and as tc spells it (hex: ``1:10`` is minor 16)."""
    if handle is None:
        return None
    return {"major": handle.major, "minor": handle.minor, "tc": str(handle)}


def _percent(value: Fraction) -> JSONObject:
    return {
        "numerator": value.numerator,
        "denominator": value.denominator,
        "tc": f"{float(value):.12g}%",
    }


def value_json(value: object) -> JSONValue:
    """A quantity in base units, with its tc spelling and span; ``None`` stays ``null``."""
    match value:
        case None:
            return None
        case ir.Rate():
            return {
                "bits_per_second": value.bits_per_second,
                "tc": format_rate(value.bits_per_second),
                "span": span_json(value.span),
            }
        case ir.Size():
            return {
                "bytes": value.bytes,
                "tc": format_size(value.bytes),
                "span": span_json(value.span),
            }
        case ir.Time():
            return {
                "microseconds": value.microseconds,
                "tc": format_time(value.microseconds),
                "span": span_json(value.span),
            }
        case ir.Count():
            return {"value": value.value, "span": span_json(value.span)}
        case ir.Percent():
            return {"percent": _percent(value.value), "span": span_json(value.span)}
        case ir.Word():
            return {"word": value.value, "span": span_json(value.span)}
        case _:
            raise TypeError(f"not an IR value: {value!r}")


def overhead_json(o: ir.Overhead | None, tc: list[str]) -> JSONObject | None:
    """Link-layer overhead (bytes beyond the IP packet) and how tc is told it (``tc``)."""
    if o is None:
        return None
    return {
        "overhead": value_json(o.overhead),
        "linklayer": o.linklayer,
        "mpu": value_json(o.mpu),
        "preset": value_json(o.preset),
        "mtu": value_json(o.mtu),
        "tsize": value_json(o.tsize),
        "tc": " ".join(tc),
        "span": span_json(o.span),
    }


def cond_json(cond: ir.Cond) -> JSONObject:
    """One condition of a match line, as written (before lowering to keys)."""
    head: JSONObject
    match cond:
        case ir.AddrCond():
            head = {
                "kind": "addr",
                "field": cond.field,
                "values": [
                    {
                        "family": ir.family_of(net),
                        "network": str(net),
                        "address": int(net.network_address),
                        "prefix_length": net.prefixlen,
                        "tc": address_text(net),
                        "span": span_json(span),
                    }
                    for net, span in cond.networks
                ],
            }
        case ir.PortCond():
            head = {
                "kind": "port",
                "field": cond.field,
                "values": [
                    {"lo": p.lo, "hi": p.hi, "mask": p.mask, "span": span_json(p.span)}
                    for p in cond.ports
                ],
            }
        case ir.ProtoCond():
            head = {
                "kind": "proto",
                "values": [
                    {
                        "number": number,
                        "name": PROTO_NAMES.get(number, PROTO_NAMES_6.get(number)),
                        "span": span_json(span),
                    }
                    for number, span in cond.protocols
                ],
            }
        case ir.TosCond():
            head = {"kind": "tos", "value": cond.value, "mask": cond.mask, "dscp": cond.dscp}
        case ir.TcpAckCond():
            head = {"kind": "tcp-ack"}
        case ir.TcpFlagsCond():
            head = {"kind": "tcp-flags", "value": cond.value, "mask": cond.mask}
        case ir.RawCond():
            head = {
                "kind": "raw",
                "bits": cond.bits,
                "value": cond.value,
                "mask": cond.mask,
                "offset": cond.offset,
            }
        case ir.AllCond():
            head = {"kind": "all"}
        case _:
            assert_never(cond)
    return {**head, "span": span_json(cond.span)}


def police_json(police: ir.Police | None) -> JSONObject | None:
    """A match's policer: rate, burst, mtu, what happens to traffic above the rate, and the
    words tc takes in the filter."""
    if police is None:
        return None
    return {
        "rate": value_json(police.rate),
        "burst": value_json(police.burst),
        "mtu": value_json(police.mtu),
        "exceed": police.exceed,
        "tc": " ".join(police_words(police)),
        "span": span_json(police.span),
    }


def filter_police_json(f: ir.U32Filter | ir.FlowerFilter) -> JSONObject | None:
    """A filter's policer: as its line's, with the words tc takes in this filter, and (when the
    line's filters share one police action) the action's ``index``."""
    police = police_json(f.police)
    if police is None:
        return None
    police["tc"] = " ".join(filter_police_words(f))
    if f.police_index is not None:
        police["index"] = f.police_index
    return police


def match_json(match: ir.Match) -> JSONObject:
    """A ``match`` line: its conditions AND; the values of one condition OR."""
    return {
        "pref": value_json(match.pref),
        "family": list(match.family.families) if match.family is not None else None,
        "conds": [cond_json(c) for c in match.conds],
        "police": police_json(match.police),
        "span": span_json(match.span),
    }


_CLASS_VALUES = (
    "rate",
    "ceil",
    "burst",
    "cburst",
    "prio",
    "quantum",
    "allot",
    "avpkt",
    "weight",
    "maxburst",
    "minburst",
)


def curve_json(curve: ir.Curve | None) -> JSONValue:
    """An hfsc service curve: m1 for the first d, then m2 (umax/dmax as written, if so)."""
    if curve is None:
        return None
    return {
        "m1": value_json(curve.m1),
        "d": value_json(curve.d),
        "m2": value_json(curve.m2),
        "umax": value_json(curve.umax),
        "dmax": value_json(curve.dmax),
        "tc": " ".join(curve_words(curve)),
        "span": span_json(curve.span),
    }


def class_json(cls: ir.Class, parent: ir.Handle | None, default: ir.Handle | None) -> JSONObject:
    """A class with its allocated ids, options, matches, leaf qdisc and children."""
    out: JSONObject = {
        "name": cls.name,
        "implicit": cls.implicit,
        "classid": handle_json(cls.classid),
        "explicit_id": cls.explicit_id is not None,
        "parent": handle_json(parent),
        "default": cls.classid is not None and cls.classid == default,
    }
    if cls.title is not None:
        out["title"] = cls.title
    for key in _CLASS_VALUES:
        out[key] = value_json(getattr(cls, key))
    out["bounded"] = cls.bounded
    out["isolated"] = cls.isolated
    out["overbook"] = cls.overbook
    out["mark"] = value_json(cls.mark)
    if cls.rt is not None or cls.ls is not None or cls.ul is not None:  # hfsc classes only
        out["rt"], out["ls"], out["ul"] = (curve_json(c) for c in (cls.rt, cls.ls, cls.ul))
    out["set_dscp"] = value_json(cls.set_dscp)
    out["fwmark"] = cls.fwmark
    out["chosen_quantum"] = cls.chosen_quantum
    out["matches"] = [match_json(m) for m in cls.matches]
    out["leaf"] = None if cls.leaf is None else qdisc_json(cls.leaf)
    out["children"] = [class_json(c, cls.classid, default) for c in cls.children]
    out["span"] = span_json(cls.span)
    return out


_QDISC_VALUES: dict[str, tuple[str, ...]] = {
    "htb": ("r2q",),
    "mq": ("shards",),
    "prio": ("bands",),
    "cbq": ("bandwidth", "avpkt"),
    "tbf": ("rate", "burst", "latency", "limit", "peakrate", "mtu"),
    "netem": ("delay", "jitter", "loss", "duplicate", "corrupt", "limit", "rate"),
    "sfq": ("perturb", "quantum", "limit", "depth", "divisor"),
    "fq_codel": ("limit", "flows", "target", "interval", "quantum", "memory_limit"),
    "pfifo": ("limit",),
    "bfifo": ("limit",),
    "pfifo_fast": (),
    "ingress": (),
    "hfsc": (),
    "cake": (
        "bandwidth",
        "unlimited",
        "diffserv",
        "isolate",
        "nat",
        "wash",
        "ack_filter",
        "split_gso",
        "mode",
        "rtt",
        "rtt_preset",
        "memlimit",
        "fwmark",
    ),
    "codel": ("limit", "target", "interval", "ce_threshold"),
    "fq": (
        "limit",
        "flow_limit",
        "quantum",
        "initial_quantum",
        "maxrate",
        "buckets",
        "refill_delay",
        "low_rate_threshold",
        "orphan_mask",
        "ce_threshold",
        "horizon",
    ),
    "fq_pie": (
        "limit",
        "flows",
        "target",
        "tupdate",
        "alpha",
        "beta",
        "quantum",
        "memory_limit",
        "ecn_prob",
    ),
    "red": ("limit", "min", "max", "avpkt", "burst", "bandwidth", "probability"),
}
_NETEM_MORE = (
    "delay_correlation",
    "loss_correlation",
    "reorder",
    "reorder_correlation",
    "gap",
    "slot",
    "slot_max",
    "packetoverhead",
    "cellsize",
)
"""netem's values beyond the first seven (appended: the first keep their place)."""


def qdisc_json(q: ir.Qdisc) -> JSONObject:
    """A qdisc, its options, and what hangs below it (classes, or one chained child)."""
    out: JSONObject = {
        "kind": q.kind,
        "handle": handle_json(q.handle),
        "explicit_handle": q.explicit_handle is not None,
        "tc": " ".join(qdisc_words(q)),
    }
    for key in _QDISC_VALUES[q.kind]:
        out[key] = value_json(getattr(q, key))
    match q:
        case ir.Htb() | ir.Hfsc():
            minor = default_minor(q)
            default = (
                None if minor is None or q.handle is None else ir.Handle(q.handle.major, minor)
            )
            out["default"] = None
            if q.default is not None:
                out["default"] = {
                    "name": q.default.name,
                    "classid": handle_json(default),
                    "span": span_json(q.default.span),
                }
            if isinstance(q, ir.Htb):
                out["chosen_r2q"] = q.chosen_r2q
            out["classes"] = [class_json(c, q.handle, default) for c in q.classes]
        case ir.Prio():
            out["priomap"] = None if q.priomap is None else [value_json(v) for v in q.priomap]
            out["classes"] = [class_json(c, q.handle, None) for c in q.classes]
        case ir.Cbq():
            out["overbook"] = q.overbook
            out["classes"] = [class_json(c, q.handle, None) for c in q.classes]
        case ir.Netem():
            for key in _NETEM_MORE:
                out[key] = value_json(getattr(q, key))
            out["distribution"] = None if q.distribution is None else q.distribution.name
            out["child"] = None if q.child is None else qdisc_json(q.child)
        case ir.Tbf():
            out["child"] = None if q.child is None else qdisc_json(q.child)
        case ir.Mq():
            major = q.handle.major if q.handle is not None else 0
            out["queues"] = [
                {
                    "number": queue.number,
                    "tx_queue": queue.number - 1,
                    "classid": handle_json(ir.Handle(major, queue.number)),
                    "span": span_json(queue.span),
                    "qdisc": qdisc_json(queue.qdisc),
                }
                for queue in q.queues
            ]
        case ir.FqCodel() | ir.Codel():
            out["ecn"] = q.ecn
        case ir.Ingress():
            out["matches"] = [match_json(m) for m in q.matches]
        case ir.Fq():
            out["pacing"] = q.pacing
            out["horizon_drop"] = q.horizon_drop
        case ir.FqPie():
            out["ecn"] = q.ecn
            out["bytemode"] = q.bytemode
        case ir.Red():
            out["ecn"] = q.ecn
            out["harddrop"] = q.harddrop
            out["adaptive"] = q.adaptive
        case ir.Sfq() | ir.Pfifo() | ir.Bfifo() | ir.PfifoFast():
            pass
        case ir.Cake():
            o = q.overhead
            out["overhead"] = overhead_json(o, cake_overhead_words(o) if o else [])
        case _:
            assert_never(q)
    out["span"] = span_json(q.span)
    return out


def _word_json(offset: int, value: int, mask: int) -> JSONObject:
    return {
        "offset": offset,
        "value": value,
        "mask": mask,
        "value_hex": f"0x{value:08x}",
        "mask_hex": f"0x{mask:08x}",
    }


def key_json(key: ir.U32Key) -> JSONObject:
    """A u32 key as tc's words and as the 32-bit words it tests (offsets from the IP header):
    ``packed`` lists them all (an IPv6 address takes up to four); ``offset``, ``value`` and
    ``mask`` give the word of a one-word key (null for an address of several words)."""
    packed = pack_words(key)
    single = _word_json(*packed[0]) if len(packed) == 1 else dict.fromkeys(_word_json(0, 0, 0))
    return {
        "words": list(key.words),
        "tc": " ".join(key.words),
        **single,
        "packed": [_word_json(*word) for word in packed],
    }


def _range_json(port: tuple[int, int] | None) -> JSONObject | None:
    return None if port is None else {"lo": port[0], "hi": port[1]}


def _masked_json(pair: tuple[int, int] | None) -> JSONObject | None:
    return None if pair is None else {"value": pair[0], "mask": pair[1]}


def filter_json(f: ir.Filter) -> JSONObject:
    """An allocated filter: u32 keys, flower fields, or the firewall mark of an fw filter;
    ``protocol`` ip or ipv6 by its ``family``."""
    kind = {ir.U32Filter: "u32", ir.FwFilter: "fw", ir.FlowerFilter: "flower"}[type(f)]
    head: JSONObject = {
        "kind": kind,
        "parent": handle_json(f.parent),
        "family": f.family,
        "protocol": FILTER_PROTOCOL[f.family],
        "pref": f.pref,
    }
    match f:
        case ir.U32Filter():
            head["keys"] = [key_json(k) for k in f.keys]
            head["police"] = filter_police_json(f)
            if f.place is not None:
                head["place"] = place_json(f.place)
        case ir.FlowerFilter():
            head["ip_proto"] = f.ip_proto
            head["src"] = address_text(f.src) if f.src is not None else None
            head["dst"] = address_text(f.dst) if f.dst is not None else None
            head["sport"] = _range_json(f.sport)
            head["dport"] = _range_json(f.dport)
            head["tos"] = _masked_json(f.tos)
            head["tcp_flags"] = _masked_json(f.tcp_flags)
            head["tc"] = " ".join(flower_words(f))
            head["police"] = filter_police_json(f)
        case ir.FwFilter():
            head["mark"] = f.mark
            head["mask"] = f.mask
        case _:
            assert_never(f)
    return {**head, "flowid": handle_json(f.flowid), "span": span_json(f.span)}


def place_json(place: ir.U32Place) -> JSONObject:
    """Where a u32 node sits."""
    return {
        "table": place.table,
        "bucket": place.bucket,
        "node": place.node,
        "handle": place.handle,
    }


def u32_table_json(t: ir.U32Table) -> JSONObject:
    """A u32 table and where its link sits."""
    hashkey: JSONObject | None = None
    if t.hashkey is not None:
        hashkey = {"mask": t.hashkey[0], "offset": t.hashkey[1], "byte": t.hashed_byte}
    return {
        "parent": handle_json(t.parent),
        "family": t.family,
        "protocol": FILTER_PROTOCOL[t.family],
        "pref": t.pref,
        "table": t.table,
        "divisor": t.divisor,
        "link": place_json(t.link),
        "hashkey": hashkey,
        "count": t.count,
        "span": span_json(t.span),
    }


def marking_json(marking: ir.Marking | None) -> JSONObject | None:
    """``classify by mark``: the iptables chain and its rules, first match wins."""
    if marking is None:
        return None
    return {
        "from_interface": marking.from_interface,
        "hook": marking.hook,
        "mask": marking.mask.value if marking.mask is not None else None,
        "chain": marking.chain,
        "explicit_chain": marking.explicit_chain is not None,
        "rules": [
            {
                "mark": rule.mark,
                "unmarked": rule.unmarked,
                "family": rule.family,
                "tool": MARK_TOOL[rule.family],
                "conds": [cond_json(c) for c in rule.conds],
                "iptables": list(iptables_words(rule.conds, rule.family)),
                "span": span_json(rule.span),
            }
            for rule in marking.rules
        ],
        "dscp_rules": [
            {"mark": d.mark, "dscp": d.dscp, "family": d.family, "span": span_json(d.span)}
            for d in marking.dscp_rules
        ],
        "span": span_json(marking.span),
    }


def download_json(download: ir.Download | None, ifb: str) -> JSONObject | None:
    """How a download tree gets its packets: the interface whose arrivals are redirected
    (every protocol) to the IFB ``ifb``, and whether the redirect restores connection marks."""
    if download is None:
        return None
    return {
        "interface": download.interface,
        "ifb": ifb,
        "ifb_given": download.ifb_span is not None,
        "connmark": download.connmark,
        "span": span_json(download.span),
    }


def interface_json(iface: ir.Interface) -> JSONObject:
    """A tree on one device: an interface's egress (``upload``), the IFB that shapes its
    downloads, or its ingress qdisc; its root qdisc, its filters, its marking."""
    out: JSONObject = {
        "name": iface.name,
        "interface": iface.interface,
        "direction": iface.direction,
        "families": list(iface.families),
        "classifier": iface.classifier,
        "download": download_json(iface.download, iface.name),
        "root": qdisc_json(iface.root),
        "filters": [filter_json(f) for f in iface.filters],
        "marking": marking_json(iface.marking),
        "stab": overhead_json(iface.stab, stab_words(iface.stab) if iface.stab else []),
        "span": span_json(iface.span),
    }
    if iface.u32_linear:
        out["u32_linear"] = True
    if iface.u32_tables:
        out["u32_tables"] = [u32_table_json(t) for t in iface.u32_tables]
    return out


def policy_json(policy: ir.Policy) -> JSONObject:
    """The whole document."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": policy.source,
        "interfaces": [interface_json(i) for i in policy.interfaces],
    }


def _scalar(value: JSONValue) -> bool:
    return not isinstance(value, dict | list)


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
"""``json.dumps(value, ensure_ascii=False)``, with one encoder for every value."""
_ENCODE_FLAT = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode
"""The same, for an object or array written on one line."""


def dumps(value: JSONValue, indent: str = "") -> str:
    """Write JSON with two-space indents; objects and arrays of scalars only (spans, handles,
    key words) stay on one line, so a node reads as one line per field."""
    out: list[str] = []
    _dump(value, indent, out)
    return "".join(out)


def _dump(value: JSONValue, indent: str, out: list[str]) -> None:
    """:func:`dumps` into ``out``, piece by piece: the text is joined once, not once per level
    of nesting (a big policy's document is tens of megabytes)."""
    if isinstance(value, str):  # what _ENCODE does with a string, without its dispatch
        out.append(encode_basestring(value))
        return
    if _scalar(value):
        out.append(_ENCODE(value))
        return
    children = value.values() if isinstance(value, dict) else value
    if all(_scalar(v) for v in children):  # an empty object or array too
        out.append(_ENCODE_FLAT(value))
        return
    inner = indent + "  "
    if isinstance(value, dict):
        out.append("{")
        for n, (k, v) in enumerate(value.items()):
            out.append(f"{',' if n else ''}\n{inner}{_ENCODE(k)}: ")
            _dump(v, inner, out)
        out.append(f"\n{indent}}}")
    else:
        out.append("[")
        for n, v in enumerate(value):
            out.append(f"{',' if n else ''}\n{inner}")
            _dump(v, inner, out)
        out.append(f"\n{indent}]")


class JsonBackend(Backend):
    """Emit the allocated IR as JSON, for tools (see docs/ir.schema.json)."""

    name = "json"
    extension = "json"

    def emit(self, policy: ir.Policy, source_label: str) -> str:
        doc = policy_json(policy)
        doc["source"] = source_label
        return dumps(doc) + "\n"
