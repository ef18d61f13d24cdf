"""The json backend: every policy's document validates against docs/ir.schema.json."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tcdsl.driver import compile_policy
from tests.conftest import ROOT, policy_files

SCHEMA_PATH = ROOT / "docs" / "ir.schema.json"
POLICIES = policy_files()


def _document(policy: Path) -> dict[str, Any]:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = compile_policy(policy.as_posix(), "json")
    finally:
        os.chdir(cwd)
    assert result.output is not None
    doc: dict[str, Any] = json.loads(result.output)
    return doc


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v)


def test_schema_is_draft_2020_12() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("policy", POLICIES, ids=[p.as_posix() for p in POLICIES])
def test_every_policy_validates(policy: Path, validator: jsonschema.Draft202012Validator) -> None:
    doc = _document(policy)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "\n".join(errors[:10])
    assert (doc["format"], doc["version"], doc["source"]) == ("tcdsl-ir", 1, policy.as_posix())


@pytest.mark.parametrize("policy", POLICIES, ids=[p.as_posix() for p in POLICIES])
def test_every_node_has_a_span(policy: Path) -> None:
    for obj in _objects(_document(policy)):
        if "kind" in obj or "name" in obj:
            span = obj["span"]
            assert list(span) == ["file", "line", "column", "end_line", "end_column"]
            assert (span["line"], span["column"]) <= (span["end_line"], span["end_column"])


_SPAN = {"file": "f", "line": 1, "column": 1, "end_line": 1, "end_column": 2}


def _root(doc: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = doc["interfaces"][0]["root"]
    return root


def _web(doc: dict[str, Any]) -> dict[str, Any]:
    """Class 'web' of office.tcp (the third child of the link class)."""
    web: dict[str, Any] = _root(doc)["classes"][0]["children"][2]
    return web


def _first_addr(doc: dict[str, Any]) -> dict[str, Any]:
    """The first address value of office.tcp (an IPv4 one)."""
    for obj in _objects(doc):
        if obj.get("kind") == "addr":
            value: dict[str, Any] = obj["values"][0]
            assert value["family"] == "ipv4"
            return value
    raise AssertionError("office.tcp has no address")


_POLICE = {
    "rate": {"bits_per_second": 1000, "tc": "1kbit", "span": _SPAN},
    "burst": {"bytes": 2000, "tc": "2000b", "span": _SPAN},
    "mtu": None,
    "exceed": "drop",
    "tc": "police rate 1kbit burst 2000b drop",
    "span": _SPAN,
}

BROKEN: dict[str, Callable[[dict[str, Any]], object]] = {
    "no format": lambda d: d.pop("format"),
    "another version": lambda d: d.update(version=2),
    "a rate as text": lambda d: _web(d)["rate"].update(bits_per_second="40mbit"),
    "an unknown qdisc kind": lambda d: _root(d).update(kind="hfsc"),
    "an unknown field": lambda d: _web(d).update(colour="red"),
    "a span without its line": lambda d: _web(d)["span"].pop("line"),
    "a u32 key off a word boundary": lambda d: d["interfaces"][0]["filters"][0]["keys"][0].update(
        offset=21
    ),
    "fq_codel options on an sfq": lambda d: _web(d)["leaf"].update(kind="sfq"),
    "an unknown direction": lambda d: d["interfaces"][0].update(direction="sideways"),
    "an IPv4 filter said as protocol ipv6": lambda d: d["interfaces"][0]["filters"][0].update(
        protocol="ipv6"
    ),
    "an IPv4 prefix longer than 32": lambda d: _first_addr(d).update(prefix_length=64),
    "an unknown family": lambda d: d["interfaces"][0].update(families=["ipx"]),
    "a police verdict tc lacks": lambda d: _web(d)["matches"][0].update(
        police={**_POLICE, "exceed": "shape"}
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_schema_rejects_a_broken_document(
    what: str, validator: jsonschema.Draft202012Validator
) -> None:
    doc = _document(Path("policies/office.tcp"))
    assert validator.is_valid(doc) and _web(doc)["name"] == "web"
    BROKEN[what](doc)
    assert not validator.is_valid(doc), f"the schema accepts a document with {what}"


def test_values_are_in_base_units_with_tc_spelling() -> None:
    doc = _document(Path("policies/office.tcp"))
    web = doc["interfaces"][0]["root"]["classes"][0]["children"][2]
    assert web["classid"] == {"major": 1, "minor": 0x30, "tc": "1:30"}
    assert (web["rate"]["bits_per_second"], web["rate"]["tc"]) == (40_000_000, "40mbit")
    assert web["ceil"]["bits_per_second"] == 90_000_000
    assert web["leaf"]["kind"] == "fq_codel"
    filters = [f for f in doc["interfaces"][0]["filters"] if f["flowid"]["tc"] == "1:30"]
    v4 = [f for f in filters if f["family"] == "ipv4"]
    assert [f["keys"][0]["words"] for f in v4] == [
        ["ip", "dport", "80", "0xffff"],
        ["ip", "dport", "443", "0xffff"],
    ]
    key = v4[0]["keys"][0]
    assert (key["offset"], key["value"], key["mask"]) == (20, 80, 0xFFFF)
    assert (key["value_hex"], key["mask_hex"]) == ("0x00000050", "0x0000ffff")
    assert key["packed"] == [
        {k: key[k] for k in ("offset", "value", "mask", "value_hex", "mask_hex")}
    ]
    # The same ports for IPv6, TCP then UDP (u32 reads ports 40 bytes in, after the next header).
    v6 = [f for f in filters if f["family"] == "ipv6"]
    assert {(f["protocol"], f["pref"]) for f in v6} == {("ipv6", v4[0]["pref"] + 0x8000)}
    assert [[k["tc"] for k in f["keys"]] for f in v6][:2] == [
        ["ip6 protocol 6 0xff", "ip6 dport 80 0xffff"],
        ["ip6 protocol 17 0xff", "ip6 dport 80 0xffff"],
    ]


def test_marking_and_fw_filters() -> None:
    doc = _document(Path("policies/seeds/s000-10.1-marks.tcp"))
    iface = doc["interfaces"][0]
    v4 = [f for f in iface["filters"] if f["family"] == "ipv4"]
    assert [(f["kind"], f["mark"], f["flowid"]["tc"]) for f in v4] == [
        ("fw", 10, "1:10"),
        ("fw", 20, "1:20"),
        ("fw", 30, "1:30"),
    ]
    marking = iface["marking"]
    assert marking["chain"] == "INSHAPER"
    rules = [r for r in marking["rules"] if r["family"] == "ipv4"]
    assert [(r["mark"], r["unmarked"], r["tool"]) for r in rules] == [
        (10, False, "iptables"),
        (20, False, "iptables"),
        (30, True, "iptables"),
    ]
    assert rules[0]["iptables"] == ["-p", "tcp", "--dport", "5001"]


DUAL = """\
interface eth0 htb rate 10mbit default rest {
    classify by mark from eth1
    class web rate 5mbit match src 2001:db8::/64 proto tcp dport 443
    class ping rate 1mbit set dscp ef { match proto icmpv6 }
    class rest rate 4mbit
}
interface eth1 classifier flower htb rate 10mbit default rest {
    class web rate 5mbit match dst 2001:db8:1::/48 proto tcp dport 1000-2000
    class rest rate 5mbit
}
"""


def _source_document(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path), "json")
    assert result.output is not None, [d.message for d in result.diagnostics]
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def test_ipv6_marking_flower_and_addresses(
    tmp_path: Path, validator: jsonschema.Draft202012Validator
) -> None:
    doc = _source_document(tmp_path, DUAL)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "\n".join(errors[:10])
    marks, flower = doc["interfaces"]
    assert (marks["families"], marks["classifier"]) == (["ipv4", "ipv6"], "u32")
    assert [(f["kind"], f["family"], f["protocol"]) for f in marks["filters"]][:2] == [
        ("fw", "ipv4", "ip"),
        ("fw", "ipv6", "ipv6"),
    ]
    rules = marks["marking"]["rules"]
    assert [(r["family"], r["tool"], r["iptables"]) for r in rules if not r["unmarked"]] == [
        ("ipv6", "ip6tables", ["-p", "tcp", "-s", "2001:db8::/64", "--dport", "443"]),
        ("ipv6", "ip6tables", ["-p", "icmpv6"]),
    ]
    assert [r["family"] for r in rules if r["unmarked"]] == ["ipv4", "ipv6"]
    assert [d["family"] for d in marks["marking"]["dscp_rules"]] == ["ipv4", "ipv6"]
    addr = rules[0]["conds"][0]["values"][0]
    assert (addr["family"], addr["prefix_length"], addr["tc"]) == ("ipv6", 64, "2001:db8::/64")
    assert addr["address"] == 0x20010DB8 << 96
    (f,) = [f for f in flower["filters"] if f["flowid"]["tc"] == "1:10"]
    assert (f["kind"], f["family"], f["protocol"], f["pref"]) == ("flower", "ipv6", "ipv6", 0x8001)
    assert (f["ip_proto"], f["dst"], f["dport"]) == (6, "2001:db8:1::/48", {"lo": 1000, "hi": 2000})
    assert f["tc"] == "ip_proto tcp dst_ip 2001:db8:1::/48 dst_port 1000-2000"


def test_ipv6_address_keys_pack_into_words(tmp_path: Path) -> None:
    text = "interface eth0 htb rate 1mbit default b {\n"
    text += "    class a rate 1kbit match dst 2001:db8:1:2:3:4:5:6/100\n    class b rate 1kbit\n}\n"
    doc = _source_document(tmp_path, text)
    (f,) = [f for f in doc["interfaces"][0]["filters"] if f["flowid"]["tc"] == "1:10"]
    (key,) = f["keys"]
    assert key["offset"] is None and key["value"] is None
    assert [(w["offset"], w["value_hex"], w["mask_hex"]) for w in key["packed"]] == [
        (24, "0x20010db8", "0xffffffff"),
        (28, "0x00010002", "0xffffffff"),
        (32, "0x00030004", "0xffffffff"),
        (36, "0x00000000", "0xf0000000"),
    ]


def test_output_is_deterministic() -> None:
    for policy in POLICIES:
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            outputs = {compile_policy(policy.as_posix(), "json").output for _ in range(2)}
        finally:
            os.chdir(cwd)
        assert len(outputs) == 1


def test_directions_download_and_ingress_policers() -> None:
    doc = _document(Path("policies/home-ifb.tcp"))
    upload, download = doc["interfaces"]
    assert (upload["name"], upload["interface"], upload["direction"], upload["download"]) == (
        "eth0",
        "eth0",
        "egress",
        None,
    )
    assert (download["name"], download["interface"], download["direction"]) == (
        "ifb4eth0",
        "eth0",
        "download",
    )
    assert {k: v for k, v in download["download"].items() if k != "span"} == {
        "interface": "eth0",
        "ifb": "ifb4eth0",
        "ifb_given": False,
        "connmark": False,
    }
    doc = _document(Path("policies/ingress-policer.tcp"))
    ingress = doc["interfaces"][1]
    assert (ingress["name"], ingress["direction"], ingress["root"]["kind"]) == (
        "eth0",
        "ingress",
        "ingress",
    )
    assert ingress["root"]["handle"]["tc"] == "ffff:"
    police = ingress["root"]["matches"][0]["police"]
    assert (police["rate"]["bits_per_second"], police["burst"]["bytes"]) == (800_000, 10_240)
    assert (police["exceed"], police["mtu"]) == ("drop", None)
    # 'match all': an IPv4 and an IPv6 filter sharing one police action.
    four, six = ingress["filters"]
    index = four["police"]["index"]
    assert four["police"]["tc"] == six["police"]["tc"] == f"police index {index}"
    assert six["police"]["index"] == index and "binds" not in six["police"]
    assert four["parent"]["tc"] == "ffff:"


def test_hashed_u32_tables_validate(validator: jsonschema.Draft202012Validator) -> None:
    """A pref hashed into u32 tables: its filters' places and the tables are in the document."""
    lines = [f"    class c{i} rate 1kbit match dst 10.0.0.{i}" for i in range(40)]
    text = "interface eth0 htb rate 100mbit default c0 {\n" + "\n".join(lines) + "\n}\n"
    result = compile_policy("hashed.tcp", "json", loader=lambda _p: text)
    assert result.output is not None
    doc = json.loads(result.output)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "\n".join(errors[:10])
    (iface,) = doc["interfaces"]
    (table,) = iface["u32_tables"]
    assert (table["divisor"], table["hashkey"]["byte"], table["count"]) == (256, 19, 40)
    assert iface["filters"][7]["place"] == {"table": 1, "bucket": 7, "node": 1, "handle": "1:7:1"}
