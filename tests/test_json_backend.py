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
    assert [f["keys"][0]["words"] for f in filters] == [
        ["ip", "dport", "80", "0xffff"],
        ["ip", "dport", "443", "0xffff"],
    ]
    key = filters[0]["keys"][0]
    assert (key["offset"], key["value"], key["mask"]) == (20, 80, 0xFFFF)
    assert (key["value_hex"], key["mask_hex"]) == ("0x00000050", "0x0000ffff")


def test_marking_and_fw_filters() -> None:
    doc = _document(Path("policies/seeds/s000-10.1-marks.tcp"))
    iface = doc["interfaces"][0]
    assert [(f["kind"], f["mark"], f["flowid"]["tc"]) for f in iface["filters"]] == [
        ("fw", 10, "1:10"),
        ("fw", 20, "1:20"),
        ("fw", 30, "1:30"),
    ]
    marking = iface["marking"]
    assert marking["chain"] == "INSHAPER"
    assert [(r["mark"], r["unmarked"]) for r in marking["rules"]] == [
        (10, False),
        (20, False),
        (30, True),
    ]
    assert marking["rules"][0]["iptables"] == ["-p", "tcp", "--dport", "5001"]


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
    (f,) = ingress["filters"]
    assert f["police"]["tc"] == "police rate 800kbit burst 10k drop"
    assert f["parent"]["tc"] == "ffff:"
