"""Subscriber tables: ``subscribers from "FILE.csv"`` (tcdsl/frontend/tables.py).

The statement's parsing and expansion into classes and match lines (where filters,
multi-device circuits, both families, both directions, names), errors at the table's cells,
determinism, fmt, and classify on the example policy. The corpus cases are in
tests/diagnostics/ (E027-E034, E270-E272, W371, W372), the goldens of
policies/isp-subscribers.tcp in tests/golden/, the kernel test in
tests/test_classify_kernel.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tcdsl import ir
from tcdsl.cli import cli
from tcdsl.cliutil import summary
from tcdsl.diagnostics import Diagnostic, render
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.fmt import format_source
from tcdsl.frontend import tables
from tcdsl.frontend.tables import circuit_name
from tests.conftest import ROOT

HEADER = (
    "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,"
    "Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
)
ROWS = (
    '101,"Smith, J.",1,cpe-1,north,,100.64.0.1,2001:db8:1::/56,2,1,20,5,\n'
    '102,Jones,2,cpe-2,north,,"100.64.0.2, 100.64.0.3",,4,2,40,10,\n'
    "102,Jones,3,router-3,north,,100.64.0.9,2001:db8:2::/64,4,2,40,10,\n"
    "103,Brown,4,cpe-4,south,,100.64.1.4,,1.5,0.5,10.5,2.5,vip\n"
)


def policy(body: str, tree: str = "download") -> str:
    return (
        "interface eth0 {\n"
        f"    {tree} htb rate 1gbit burst 123k cburst 123k default other {{\n"
        f"{body}"
        "        class other rate 10mbit\n"
        "    }\n"
        "}\n"
    )


SITES = (
    "        class north rate 100mbit {\n"
    '            subscribers from "subs.csv" where parent_node == "north" { fq_codel }\n'
    "        }\n"
    "        class south rate 100mbit {\n"
    '            subscribers from "subs.csv" where parent_node == "south"\n'
    "        }\n"
)


def build(tmp_path: Path, text: str, table: str = HEADER + ROWS) -> Result:
    (tmp_path / "subs.csv").write_text(table, encoding="utf-8")
    path = tmp_path / "p.tcp"
    path.write_text(text, encoding="utf-8")
    return analyse(str(path))


def ok(result: Result) -> ir.Policy:
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return result.policy


def classes(policy: ir.Policy, tree: int = 0) -> dict[str, ir.Class]:
    root = policy.interfaces[tree].root
    return {c.name: c for q in ir.walk_qdiscs(root) for c in ir.classes_of(q)}


def addresses(cls: ir.Class) -> list[tuple[str, str]]:
    return [
        (cond.field, str(net))
        for m in cls.matches
        for cond in m.conds
        if isinstance(cond, ir.AddrCond)
        for net, _ in cond.networks
    ]


def errors(result: Result) -> list[tuple[str, str, int, int]]:
    return [(d.code, Path(d.span.file).name, d.span.line, d.span.column) for d in result.errors]


# ---- expansion -------------------------------------------------------------------------------


def test_circuits_become_classes_under_their_site(tmp_path: Path) -> None:
    found = classes(ok(build(tmp_path, policy(SITES))))
    north = found["north"]
    assert [c.name for c in north.children] == ["c101", "c102"]
    assert [c.name for c in found["south"].children] == ["c103"]
    c101 = north.children[0]
    assert c101.rate is not None and c101.ceil is not None
    assert (c101.rate.bits_per_second, c101.ceil.bits_per_second) == (2_000_000, 20_000_000)
    assert isinstance(c101.leaf, ir.FqCodel)
    assert found["c103"].leaf is None
    # decimal Mbps are exact
    rate = found["c103"].rate
    assert isinstance(rate, ir.Rate) and rate.bits_per_second == 1_500_000


def test_a_multi_device_circuit_is_one_class_with_a_match_per_device(tmp_path: Path) -> None:
    c102 = classes(ok(build(tmp_path, policy(SITES))))["c102"]
    assert len(c102.matches) == 2
    assert addresses(c102) == [
        ("dst", "100.64.0.2/32"),
        ("dst", "100.64.0.3/32"),
        ("dst", "100.64.0.9/32"),
        ("dst", "2001:db8:2::/64"),
    ]


def test_both_families_become_filters(tmp_path: Path) -> None:
    (tmp_path / "subs.csv").write_text(HEADER + ROWS, encoding="utf-8")
    (tmp_path / "p.tcp").write_text(policy(SITES), encoding="utf-8")
    result = compile_policy(str(tmp_path / "p.tcp"), "tc-batch")
    assert result.output is not None
    assert "protocol ip prio 1 u32 match ip dst 100.64.0.1 flowid" in result.output
    assert "protocol ipv6 prio 32769 u32 match ip6 dst 2001:db8:1::/56 flowid" in result.output


def test_upload_matches_sources_with_the_upload_columns(tmp_path: Path) -> None:
    found = classes(ok(build(tmp_path, policy(SITES, tree="upload"))))
    c101 = found["c101"]
    assert addresses(c101) == [("src", "100.64.0.1/32"), ("src", "2001:db8:1::/56")]
    assert c101.rate is not None and c101.ceil is not None
    assert (c101.rate.bits_per_second, c101.ceil.bits_per_second) == (1_000_000, 5_000_000)


def test_the_statement_may_say_its_direction(tmp_path: Path) -> None:
    text = (
        "interface eth1 htb rate 1gbit default other {\n"
        '    subscribers download from "subs.csv"\n'
        '    subscribers upload from "subs.csv" where circuit_id == "101"\n'
        "    class other rate 10mbit\n"
        "}\n"
    )
    result = build(tmp_path, text)
    # the same circuit twice in one tree: one subscriber, one class
    assert [d.code for d in result.errors] == ["E037"]
    text = text.replace('    subscribers upload from "subs.csv" where circuit_id == "101"\n', "")
    found = classes(ok(build(tmp_path, text)))
    assert addresses(found["c103"]) == [("dst", "100.64.1.4/32")]


def test_where_conditions(tmp_path: Path) -> None:
    def names(where: str) -> list[str]:
        body = f'        subscribers from "subs.csv" {where}\n'
        found = classes(ok(build(tmp_path, policy(body))))
        return [n for n in found if n.startswith("c")]

    assert names('where parent_node == "north", "south"') == ["c101", "c102", "c103"]
    assert names('where "Parent Node" != "north"') == ["c103"]
    # several conditions AND; a device's row is selected, then grouped by circuit
    assert names('where parent == "north" and "Device Name" == "router-3"') == ["c102"]
    # ... which splits circuit 102: its other device goes unshaped (found by a tester)
    where = 'where parent == "north" and "Device Name" == "router-3"'
    body = f'        subscribers from "subs.csv" {where}\n'
    split = [d for d in build(tmp_path, policy(body)).diagnostics if d.code == "W377"]
    assert len(split) == 1 and "circuit '102' is split" in split[0].message, split
    whole = build(tmp_path, policy('        subscribers from "subs.csv" where parent == "north"\n'))
    assert not [d for d in whole.diagnostics if d.code == "W377"], whole.diagnostics
    assert names('where comment == "vip"') == ["c103"]
    assert names("") == ["c101", "c102", "c103"]
    # the cells are read without blanks at their ends, and so are the values
    assert names('where parent_node == " south "') == ["c103"]
    assert names('where parent_node != " north"') == ["c103"]


def test_excels_separator_line_is_no_header(tmp_path: Path) -> None:
    """Excel may write 'sep=,' before the header: the header is the line after it."""
    result = build(
        tmp_path, policy('        subscribers from "subs.csv"\n'), "sep=,\n" + HEADER + ROWS
    )
    assert [n for n in classes(ok(result)) if n.startswith("c")] == ["c101", "c102", "c103"]
    semicolons = "sep=;\n" + HEADER.replace(",", ";")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), semicolons)
    assert "its first row holds no comma but ';'" in result.errors[0].message


@pytest.mark.parametrize(
    ("columns", "named", "family", "split"),
    [
        ("IPv4 Address,IPv6", "IPv4 Address", "IPv4", False),
        ("IPv4,IPv6 Prefix", "IPv6 Prefix", "IPv6", False),
        ("IPv4s,IPv6", "IPv4s", "IPv4", False),
        ("IP Address,IPv6", "IP Address", "IPv4", True),
        ("IPv4,Addresses", "Addresses", "IPv6", True),
    ],
)
def test_a_column_of_addresses_under_another_name_is_an_error_at_its_header(
    tmp_path: Path, columns: str, named: str, family: str, split: bool
) -> None:
    """Found by a review: LibreQoS reads ShapedDevices.csv's columns by position, tcdsl by
    name; a header 'IPv4 Address' left every IPv4 address unread, without a word, and their
    traffic went to the default class. It is E028 at that header cell."""
    header = HEADER.replace("IPv4,IPv6", columns)
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), header + ROWS)
    (error,) = result.errors
    assert error.code == "E028" and error.span.file.endswith("subs.csv"), error
    assert (error.span.line, error.span.column) == (1, header.index(named) + 1), error
    assert f"has no column {family} but a column '{named}'" in error.message, error
    assert f"name it '{family}'" in error.message, error
    assert ("split it into IPv4 and IPv6" in error.message) == split, error


def test_an_address_column_beside_the_familys_own_is_no_error(tmp_path: Path) -> None:
    """A column that names a family the table has already ('IPv4 Gateway', say) is not
    read, and needs no rename."""
    header = HEADER.replace(",Comment", ",IPv4 Gateway")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), header + ROWS)
    assert [n for n in classes(ok(result)) if n.startswith("c")] == ["c101", "c102", "c103"]


def test_a_value_no_row_has_is_named_with_the_closest_one(tmp_path: Path) -> None:
    body = '        subscribers from "subs.csv" where parent_node == "nort"\n'
    result = build(tmp_path, policy(body))
    assert [d.code for d in result.errors] == ["E034"]
    assert "meets this condition (did you mean 'north'?);" in result.errors[0].message


def test_template(tmp_path: Path) -> None:
    body = (
        '        subscribers from "subs.csv" prio 3 rate max / 2 ceil max * 1.05 burst 15k {\n'
        "            sfq perturb 10\n"
        "        }\n"
    )
    found = classes(ok(build(tmp_path, policy(body))))
    c101 = found["c101"]
    assert c101.rate is not None and c101.ceil is not None
    assert (c101.rate.bits_per_second, c101.ceil.bits_per_second) == (10_000_000, 21_000_000)
    assert c101.prio is not None and c101.prio.value == 3
    assert c101.burst is not None and c101.burst.bytes == 15 * 1024
    body = '        subscribers from "subs.csv" rate 1mbit ceil 50%\n'
    c103 = classes(ok(build(tmp_path, policy(body))))["c103"]
    assert isinstance(c103.rate, ir.Rate) and c103.rate.bits_per_second == 1_000_000
    assert isinstance(c103.ceil, ir.Rate) and c103.ceil.bits_per_second == 500_000_000


def test_the_number_may_come_first_in_a_product(tmp_path: Path) -> None:
    """``ceil 1.05 * max`` is ``ceil max * 1.05`` (it was E004 and E001, with no word of
    the other order); a product of two values with units is one E011 saying what to write."""
    body = '        subscribers from "subs.csv" rate 0.5 * max ceil 1.05 * max\n'
    c101 = classes(ok(build(tmp_path, policy(body))))["c101"]
    assert c101.rate is not None and c101.ceil is not None
    assert (c101.rate.bits_per_second, c101.ceil.bits_per_second) == (10_000_000, 21_000_000)
    body = '        subscribers from "subs.csv" ceil max * max\n'
    errors = build(tmp_path, policy(body)).errors
    assert [d.code for d in errors] == ["E011"]
    assert "a product needs a plain number on one side" in errors[0].message


def test_text_past_the_header_is_one_warning_at_its_first_cell(tmp_path: Path) -> None:
    """An unquoted comma in the last cell (or an extra column without a name) gave no word:
    the text past the header is not read. A row that ends in an empty cell is not warned."""
    body = '        subscribers from "subs.csv"\n'
    trailing = ROWS.replace(",vip\n", ",vip,\n")
    assert not [d for d in build(tmp_path, policy(body), HEADER + trailing).diagnostics]
    wide = ROWS.replace(",vip\n", ",vip, gate 4,2\n").replace("10,\n", "10,,x\n", 1)
    found = build(tmp_path, policy(body), HEADER + wide).diagnostics
    assert [(d.code, d.span.line, d.span.column) for d in found] == [("W373", 3, 63)], [
        d.message for d in found
    ]
    assert found[0].message.startswith("2 rows have text past the header's 13 columns")


def test_e036_below_an_mq_default_says_no_pref_helps(tmp_path: Path) -> None:
    """Found by a review: below a queue's default, lines steer after every queue's own
    whatever their pref, so E036's "give it a lower pref" could not be followed."""
    table = HEADER + (
        "1,a,1,d1,inner,,100.64.0.5,,1,1,10,10,\n2,b,2,d2,outer,,100.64.0.0/24,,1,1,10,10,\n"
    )
    text = (
        "interface eth0 mq {\n"
        "    queue 1 htb rate 1gbit default a {\n"
        "        class k rate 100mbit match dst 10.0.0.1\n"
        "        class a rate 500mbit {\n"
        "            htb rate 500mbit default z {\n"
        '                subscribers download from "subs.csv" where parent_node == "inner" pref 1\n'
        "                class z rate 100mbit\n"
        "            }\n"
        "        }\n"
        "    }\n"
        "    queue 2 htb rate 1gbit default w {\n"
        '        subscribers download from "subs.csv" where parent_node == "outer" pref 2\n'
        "        class w rate 50mbit\n"
        "    }\n"
        "}\n"
    )
    errors = build(tmp_path, text, table).errors
    assert [d.code for d in errors] == ["E036"], [d.message for d in errors]
    assert "whose lines steer only after every line above them, whatever their pref" in (
        errors[0].message
    )
    assert "lower pref" not in errors[0].message


def test_set_dscp_is_every_subscribers(tmp_path: Path) -> None:
    """docs/language.md lists 'set dscp' among the statement's options; it was refused as
    E007 ("belongs on a class, not on a subscriber's class")."""
    text = (
        "interface eth0 htb rate 1gbit default other {\n"
        "    classify by mark from eth1\n"
        '    subscribers download from "subs.csv" where parent_node == "north" set dscp af21\n'
        "    class other rate 1mbit\n"
        "}\n"
    )
    made = classes(ok(build(tmp_path, text)))
    assert [(c.set_dscp.value if c.set_dscp else None) for c in (made["c101"], made["c102"])] == [
        18,
        18,
    ]
    assert made["other"].set_dscp is None
    shell = compile_policy(str(tmp_path / "p.tcp"), "shell").output
    assert shell is not None and shell.count("-j DSCP --set-dscp 18") == 4  # ip6tables too


def test_a_mark_on_the_statement_is_an_error(tmp_path: Path) -> None:
    """A 'mark' would give every circuit the same mark: E270 at it, as for 'id' (it was E207
    'mark 5 is already used by class c101', with a note at the same place)."""
    text = (
        "interface eth0 htb rate 1gbit default other {\n"
        "    classify by mark from eth1\n"
        '    subscribers download from "subs.csv" where parent_node == "north" mark 5\n'
        "    class other rate 1mbit\n"
        "}\n"
    )
    result = build(tmp_path, text)
    assert errors(result) == [("E270", "p.tcp", 3, 71)]
    assert "'mark' would give them all one" in result.errors[0].message


def test_every_subscriber_has_a_leaf_of_its_own(tmp_path: Path) -> None:
    policy_ = ok(build(tmp_path, policy(SITES)))
    leaves = [c.leaf for c in classes(policy_).values() if c.leaf is not None]
    assert len(leaves) == 2
    assert len({id(q) for q in leaves}) == 2
    assert [q.handle for q in leaves] == [ir.Handle(0x20, 0), ir.Handle(0x30, 0)]


def test_spans_point_into_the_table(tmp_path: Path) -> None:
    found = classes(ok(build(tmp_path, policy(SITES))))
    c102 = found["c102"]
    assert (Path(c102.span.file).name, c102.span.line, c102.span.column) == ("subs.csv", 3, 1)
    assert c102.rate is not None
    assert (c102.rate.span.line, c102.rate.span.column) == (3, 52)  # Download Min Mbps
    first, second = c102.matches
    spans = [(s.line, s.column, s.end_column) for (_, s) in first.conds[0].networks]  # type: ignore[union-attr]
    assert spans == [(3, 27, 37), (3, 39, 49)]  # inside the quoted cell
    assert (second.span.line, second.span.column) == (4, 29)


def test_names_are_made_safe_and_unique(tmp_path: Path) -> None:
    table = HEADER + (
        '"$(touch pwned); rm -rf /",evil,1,d,north,,100.64.0.1,,1,1,10,5,\n'
        "a b,x,2,d,north,,100.64.0.2,,1,1,10,5,\n"
        "a_b,x,3,d,north,,100.64.0.3,,1,1,10,5,\n"
        "'quoted',x,4,d,north,,100.64.0.4,,1,1,10,5,\n"
        "Zürich-1,x,5,d,north,,100.64.0.5,,1,1,10,5,\n"
    )
    body = '        subscribers from "subs.csv"\n'
    result = build(tmp_path, policy(body), table)
    names = [n for n in classes(ok(result)) if n not in ("", "other")]
    assert names == [
        circuit_name("$(touch pwned); rm -rf /"),
        "a_b_" + hashlib.blake2s(b"a b", digest_size=5).hexdigest(),
        "a_b",
        circuit_name("'quoted'"),
        circuit_name("Zürich-1"),
    ]
    assert names[0].startswith("touch_pwned_rm_rf_") and names[3].startswith("quoted_")
    assert names[4].startswith("Z_rich_1_")
    (tmp_path / "p.tcp").write_text(policy(body), encoding="utf-8")
    script = compile_policy(str(tmp_path / "p.tcp"), "shell").output
    assert script is not None
    assert "$(touch" not in script
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)


def _tagged(name: str, table: str, circuit: str) -> str:
    """``name`` followed by the digest of its table's file name and circuit id."""
    tag = hashlib.blake2s(f"{table}\n{circuit}".encode(), digest_size=5).hexdigest()
    return f"{name}_{tag}"


def test_a_suffixed_name_depends_on_its_row_alone(tmp_path: Path) -> None:
    """Circuit 'north' meets the written class 'north': a digest of its table and id follows
    its name, whichever rows come, go or come first (found by a tester: with '_2', '_3', a
    circuit 'north_2' added took the name of circuit 'north', and its class and counters)."""
    rows = [
        "north,a,1,d,north,,100.64.0.1,,1,1,10,5,\n",
        "north_2,a,2,d,north,,100.64.0.2,,1,1,10,5,\n",
        "other,a,3,d,north,,100.64.0.3,,1,1,10,5,\n",
    ]
    body = '        class north rate 10mbit {\n            subscribers from "subs.csv"\n        }\n'
    want = {
        rows[0]: _tagged("north", "subs.csv", "north"),
        rows[1]: "north_2",
        rows[2]: _tagged("other", "subs.csv", "other"),  # a written class 'other' too
    }
    for order in (rows, rows[::-1], [rows[0], rows[2]], [rows[2], rows[0]]):
        made = ok(build(tmp_path, policy(body), HEADER + "".join(order)))
        by_cell = {c.span.line: c.name for c in classes(made).values() if c.from_table}
        # the header is line 1: row r is on line 2 + its place
        assert {r: by_cell[2 + order.index(r)] for r in order} == {r: want[r] for r in order}


def test_a_name_depends_on_its_circuit_id_alone(tmp_path: Path) -> None:
    """A subscriber keeps its class name (its class, its counters) whatever other rows come
    and go: ids that make the same name are told apart by a digest of the id, not by their
    order ('A-1' removed, 'A 1' took its name and its class before); a numeric id is 'c'
    and the number, and an id 'c1001' does not take numeric 1001's name."""
    rows = [
        _row("A-1", "100.64.0.1"),
        _row("A 1", "100.64.0.2"),
        _row("B", "100.64.0.3"),
        _row("1001", "100.64.0.4"),
        _row("c1001", "100.64.0.5"),
    ]
    body = '        subscribers from "subs.csv"\n'

    def names(chosen: list[str]) -> dict[str, str]:
        made = classes(ok(build(tmp_path, policy(body), HEADER + "".join(chosen))))
        return {addresses(c)[0][1]: n for n, c in made.items() if n not in ("", "other")}

    # an id that ends in '_' keeps it ('x' was the name of both 'x' and 'x_', the first row's
    # taking it); an id of the form of another's digested name gets a digest of its own
    digested = circuit_name("A-1")
    rows += [_row("x_", "100.64.0.6"), _row("x", "100.64.0.7"), _row(digested, "100.64.0.8")]
    every = names(rows)
    assert len(set(every.values())) == 8 and every["100.64.0.4/32"] == "c1001"
    assert every["100.64.0.6/32"] == "x_" and every["100.64.0.7/32"] == "x"
    assert every["100.64.0.1/32"] == digested != every["100.64.0.8/32"]
    assert every["100.64.0.3/32"] == "B"
    assert names(rows[1:]) == {k: v for k, v in every.items() if k != "100.64.0.1/32"}
    assert names(rows[::-1]) == every
    assert names(rows[5:][::-1]) == {
        k: every[k] for k in ("100.64.0.6/32", "100.64.0.7/32", "100.64.0.8/32")
    }
    assert names([rows[4]]) == {"100.64.0.5/32": every["100.64.0.5/32"]}
    assert every["100.64.0.5/32"].startswith("c1001_")
    cyrillic = [circuit_name("".join(chr(0x430 + (i >> k) % 32) for k in (0, 5, 10))) for i in
                range(20_000)]  # fmt: skip
    assert len(set(cyrillic)) == 20_000 and all(n.startswith("circuit_") for n in cyrillic)


def test_a_table_is_read_once(tmp_path: Path) -> None:
    table = HEADER + ROWS.replace("100.64.0.9", "100.64.0.999")
    result = build(tmp_path, policy(SITES), table)
    assert errors(result) == [("E029", "subs.csv", 4, 29)]


# ---- errors at the cells ---------------------------------------------------------------------


def test_the_rows_are_freed_once_read() -> None:
    """The compile runs with the cyclic collector off: once the policy is read, nothing keeps
    the table's rows (80 MB at 50,000 rows) but reference counts, so none is left over."""
    import gc

    from tcdsl.frontend import tables
    from tcdsl.frontend.reader import Reader

    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        reader = Reader()
        interfaces = reader.read(str(ROOT / "policies" / "isp-subscribers.tcp"))
        made = [c for i in interfaces for q in ir.walk_qdiscs(i.root) for c in ir.classes_of(q)]
        assert len(made) > 192  # a class per circuit, in each direction
        left = [o for o in gc.get_objects() if isinstance(o, tables.Row | tables.Table)]
        assert left == [], f"{len(left)} rows or tables kept"
    finally:
        if enabled:
            gc.enable()


def test_errors_are_at_their_cells_and_the_rows_are_left_out(tmp_path: Path) -> None:
    table = HEADER + (
        "101,a,1,d,north,,100.64.0.1,2001:db8::/33x,1,1,10,5,\n"
        '102,"two\nlines",2,d,north,,100.64.0.2,,x,1,10,5,\n'
        "103,c,3,d,north,,100.64.0.3,,1,1,0.5,5,\n"
        "104,c,4,d,north,,100.64.0.4,,1,1,10,5,\n"
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [
        ("E029", "subs.csv", 2, 29),
        ("E030", "subs.csv", 4, 31),  # the row's second line
        ("E031", "subs.csv", 5, 34),
    ]
    text = render(result.diagnostics, result.sources)
    assert ' 4 | lines",2,d,north,,100.64.0.2,,x,1,10,5,\n' in text
    assert "note: in the table read here" in text


def test_errors_are_capped(tmp_path: Path) -> None:
    table = HEADER + "".join(f"{i},a,{i},d,north,,100.64.0.{i},,x,1,10,5,\n" for i in range(1, 61))
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    codes = [d.code for d in result.errors]
    assert codes.count("E030") == 50
    (more,) = [d for d in result.errors if d.code == "E038"]
    assert "10 more error(s)" in more.message and more.hidden == 10
    assert summary(result.diagnostics) == "60 errors (10 not shown)"


def test_a_file_that_is_not_a_table_is_not_shown(tmp_path: Path) -> None:
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), "PASSWORD=x,y\n")
    assert [d.code for d in result.errors] == ["E028"]
    assert "PASSWORD" not in render(result.diagnostics, result.sources)


def test_private_download_addresses_warn_once_per_table(tmp_path: Path) -> None:
    """W360 (a private destination, which NAT hides on ingress) once for a table's addresses,
    at the first, with their count: one per row flooded plan and apply; a comment line of the
    table disables it, as a disable comment does in a policy."""
    rows = "".join(f"{200 + i},n{i},{i},cpe,north,,10.9.0.{i},,1,1,10,10,\n" for i in range(1, 8))
    written = "        class lab rate 1mbit match dst 192.168.7.7\n"
    text = policy(SITES + written)
    found = {
        (Path(d.span.file).name, d.span.line): d.message
        for d in build(tmp_path, text, HEADER + rows).diagnostics
        if d.code == "W360"
    }
    assert sorted(found) == [("p.tcp", 9), ("subs.csv", 2)]
    assert "not to 10.9.0.1 and 6 more address(es) of" in found["subs.csv", 2]
    assert "not to 192.168.7.7;" in found["p.tcp", 9]
    quiet = build(tmp_path, text, "# tcdsl: disable-file=W360\n" + HEADER + rows)
    assert [d.span.file for d in quiet.diagnostics if d.code == "W360"] == [str(tmp_path / "p.tcp")]


def test_rate_or_ceil_twice_is_an_error(tmp_path: Path) -> None:
    """As on a class (E014 at the second, a note at the first), not the last one silently."""
    for twice, column in (("rate min rate max", 46), ("ceil max ceil 1mbit", 46)):
        body = f'        subscribers from "subs.csv" {twice}\n'
        found = [(d.code, d.span.line, d.span.column) for d in build(tmp_path, policy(body)).errors]
        assert found == [("E014", 3, column)], (twice, found)


def test_check_exits_1_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "subs.csv").write_text(HEADER + "1,a,1,d,n,,1.2.3,,1,1,1,1,\n", encoding="utf-8")
    (tmp_path / "p.tcp").write_text(
        policy('        subscribers from "subs.csv"\n'), encoding="utf-8"
    )
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "p.tcp")])
    assert result.exit_code == 1
    assert "subs.csv:2:12: error: '1.2.3' is not a valid IPv4" in result.stderr
    assert "Traceback" not in result.stderr


# ---- output --------------------------------------------------------------------------------


def test_compile_is_deterministic() -> None:
    path = str(ROOT / "policies" / "isp-subscribers.tcp")
    first = compile_policy(path, "shell").output
    second = compile_policy(path, "shell").output
    assert first is not None and first == second


def test_fmt_keeps_the_statement() -> None:
    text = (
        "interface eth0 {\n"
        "  download htb rate 1gbit default other {\n"
        '   subscribers download  from "subs.csv" where parent_node=="a","b" and comment!=""'
        " pref 3 prio 2 ceil max*1.05 { fq_codel }\n"
        "   class other rate 1mbit\n"
        "  }\n"
        "}\n"
    )
    assert format_source(text) == (
        "interface eth0 {\n"
        "    download htb rate 1gbit default other {\n"
        '        subscribers download from "subs.csv" where parent_node == "a", "b" and '
        'comment != "" \\\n'
        "                pref 3 prio 2 ceil max * 1.05 {\n"
        "            fq_codel\n"
        "        }\n"
        "        class other rate 1mbit\n"
        "    }\n"
        "}\n"
    )


def test_classify_knows_the_subscribers() -> None:
    result = CliRunner().invoke(
        cli,
        [
            "classify",
            str(ROOT / "policies" / "isp-subscribers.tcp"),
            "--direction",
            "download",
            "--packet",
            "tcp dst 100.65.0.3 dport 443",
            "--packet",
            "ipv6 tcp dst 2001:db8:1003::99 dport 443",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    verdicts = json.loads(result.stdout)
    assert [v["class"] for v in verdicts] == ["c1003", "c1003"]


def test_the_example_warns_nothing() -> None:
    result = analyse(str(ROOT / "policies" / "isp-subscribers.tcp"))
    shown: list[Diagnostic] = [d for d in result.diagnostics if d.severity.value != "info"]
    assert not shown, render(shown, result.sources)


@pytest.mark.parametrize("backend", ["shell", "tc-batch", "json", "nft", "dot", "mermaid"])
def test_every_backend_takes_a_table(tmp_path: Path, backend: str) -> None:
    (tmp_path / "subs.csv").write_text(HEADER + ROWS, encoding="utf-8")
    (tmp_path / "p.tcp").write_text(policy(SITES), encoding="utf-8")
    result = compile_policy(str(tmp_path / "p.tcp"), backend)
    assert result.output is not None, render(result.diagnostics, result.sources)


def test_the_example_verifies_in_user_mode_linux() -> None:
    """The example applied in user-mode Linux (the host may lack fq_codel and sfq) reads back
    as the policy says: every subscriber's class, leaf and filters."""
    from tcdsl.verify import runner, verifier

    why = runner.uml_unavailable()
    if why:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    (v,) = verifier.verify_many([str(ROOT / "policies" / "isp-subscribers.tcp")], kernel="uml")
    assert v.kernel is not None
    assert not [d for d in v.diagnostics if d.is_error], render(v.diagnostics, {})


def test_explain_tells_each_subscriber_with_its_direction_rates() -> None:
    result = CliRunner().invoke(cli, ["explain", str(ROOT / "policies" / "isp-subscribers.tcp")])
    assert result.exit_code == 0, result.output
    upload, heading, download = result.stdout.partition("Interface 'wan0', download")
    assert heading
    # circuit 1001: Download Min/Max 2/25 Mbps, Upload 0.5/5 Mbps
    assert "class 'c1001' (1:20)\n      Rate: guaranteed 500kbit; may borrow up to 5mbit" in upload
    assert "class 'c1001' (1:20)\n      Rate: guaranteed 2mbit; may borrow up to 25mbit" in download


def test_table_bench_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "table_bench.py"), "300", "--stages"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    row = next(line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["300"])
    wall, cpu, rss = (float(x) for x in row[2:5])
    assert wall > 0 and cpu > 0 and rss > 10
    assert "frontend (table read and expanded)" in done.stdout


def test_an_empty_table_makes_no_class(tmp_path: Path) -> None:
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), HEADER)
    assert [d.code for d in result.errors] == ["E034"]
    assert "the table is empty" in result.errors[0].message


def test_warnings_are_capped(tmp_path: Path) -> None:
    table = HEADER + "".join(f"{i},a,{i},d,north,,,,1,1,10,5,\n" for i in range(1, 61))
    table += "61,a,61,d,north,,100.64.0.1,,1,1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    w372 = [d for d in result.diagnostics if d.code == "W372"]
    assert len(w372) == 51
    assert sum(d.message.startswith("10 more device(s)") for d in w372) == 1


CELLS = st.sampled_from(
    [
        "",
        "101",
        "a b",
        '"x, y"',
        '"two\nlines"',
        '"say ""hi"""',
        "100.64.0.1",
        "100.64.0.1/33",
        "2001:db8::/56",
        "2001:db8::1, 100.64.0.2",
        "10",
        "2.5",
        "-1",
        "1e3",
        ".",
        "北",
        "#c",
        "\t",
    ]
)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    st.lists(st.lists(CELLS, min_size=0, max_size=15), max_size=6), st.sampled_from(["\n", "\r\n"])
)
def test_no_table_crashes_the_compiler(rows: list[list[str]], newline: str) -> None:
    """Whatever the rows, the compile reports diagnostics at real places of the table (or
    compiles), and never raises."""
    table = HEADER + "".join(",".join(row) + newline for row in rows)
    with tempfile.TemporaryDirectory() as tmp:
        result = build(Path(tmp), policy('        subscribers from "subs.csv"\n'), table)
        lines = table.replace("\r\n", "\n").split("\n")
        for d in result.diagnostics:
            if d.span.file.endswith("subs.csv"):
                assert 1 <= d.span.line <= len(lines), d
                assert 1 <= d.span.column <= len(lines[d.span.line - 1]) + 1, d


def test_a_template_that_divides_by_zero(tmp_path: Path) -> None:
    result = build(tmp_path, policy('        subscribers from "subs.csv" ceil max / 0\n'))
    assert [(d.code, d.message) for d in result.errors] == [("E013", "division by zero")]


def test_subscribers_in_a_spread_mq_tree(tmp_path: Path) -> None:
    """'subscribers' under the sites of 'mq queues N htb ...': every circuit is a class in
    exactly one queue's htb (its site's), and classify sends its packets to that queue and
    class (the steering filter and the queue's htb both match its address)."""
    text = (
        "interface eth0 mq queues 2 htb rate 1gbit default other {\n"
        "    class north rate 300mbit {\n"
        '        subscribers download from "subs.csv" where parent_node == "north" { fq_codel }\n'
        "    }\n"
        "    class south rate 200mbit {\n"
        '        subscribers download from "subs.csv" where parent_node == "south"\n'
        "    }\n"
        "    class other rate 10mbit\n"
        "}\n"
    )
    policy = ok(build(tmp_path, text))
    root = policy.interfaces[0].root
    assert isinstance(root, ir.Mq)
    where = {
        c.name: queue.number
        for queue in root.queues
        for q in ir.walk_qdiscs(queue.qdisc)
        for c in ir.classes_of(q)
        if not c.implicit  # each queue's link class
    }
    assert "" not in where, where  # no placeholder left
    assert where["c101"] == where["c102"] == where["north"] != where["c103"] == where["south"]
    result = CliRunner().invoke(
        cli,
        [
            "classify",
            str(tmp_path / "p.tcp"),
            *("--packet", "tcp dst 100.64.0.9 dport 443"),
            *("--packet", "ipv6 tcp dst 2001:db8:1::7 dport 443"),
            *("--packet", "udp dst 100.64.1.4 dport 53"),
            *("--format", "json"),
        ],
    )
    assert result.exit_code == 0, result.output
    verdicts = json.loads(result.stdout)
    assert [v["class"] for v in verdicts] == ["c102", "c101", "c103"]


# ---- what real tables hold (LibreQoS's reader as the reference) --------------------------------


def _row(cid: str, ipv4: str, parent: str = "north", comment: str = "") -> str:
    return f"{cid},n{cid},{cid},d,{parent},,{ipv4},,1,1,10,5,{comment}\n"


def test_a_quote_in_a_comment_line_opens_nothing(tmp_path: Path) -> None:
    """'#' lines are dropped before quotes are read, as LibreQoS's reader does: a stray quote
    in one does not swallow the rows after it."""
    table = HEADER + '# TODO,"check this\n' + _row("1", "100.64.0.1") + _row("2", "100.64.0.2")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert [n for n in classes(ok(result)) if n.startswith("c")] == ["c1", "c2"]


def test_a_quote_left_open_over_rows_is_an_error(tmp_path: Path) -> None:
    table = (
        HEADER
        + _row("1", "100.64.0.1")
        + _row("2", "100.64.0.2", comment='"forgot to close')
        + _row("3", "100.64.0.3")
        + _row("4", "100.64.0.4")
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E035", "subs.csv", 3, 38)]
    assert "(line 4 first)" in result.errors[0].message
    # a quoted line break inside a row is a cell, not an error
    table = HEADER + '1,"two\nlines",1,d,north,,100.64.0.1,,1,1,10,5,"ok"\n'
    assert classes(ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)))


def test_a_closed_quote_holding_row_like_lines_is_a_cell(tmp_path: Path) -> None:
    """Found by a tester: a Comment quoting an old row over lines (closed, the record's cells
    lining up with the header, as the csv module and LibreQoS read it) was refused as a quote
    left open."""
    table = (
        HEADER
        + '1,a,1,d1,north,,100.64.0.1,,1,1,2,2,"old devices (id,name,ip,mac,...):\n'
        + "7,cpe-7,100.64.0.7,,,,,,,,,,\n"
        + '"\n'
        + _row("2", "100.64.0.2")
    )
    made = classes(ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)))
    assert {"c1", "c2"} <= set(made) and "c7" not in made
    # the same quote left open to the end of the file is still one
    table = HEADER + _row("1", "100.64.0.1", comment='"old devices:') + _row("7", "100.64.0.7")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E035", "subs.csv", 2, 38)], table
    # ... and one a later row's quoted Comment closes (found by a review: rows 2 and 3 went
    # without a word)
    table = (
        HEADER
        + _row("1", "100.64.0.1", comment='"note about 1')
        + _row("2", "100.64.0.2")
        + _row("3", "100.64.0.3", comment='"vip"')
        + _row("4", "100.64.0.4")
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E035", "subs.csv", 2, 38)], table


def test_a_quote_left_open_that_a_quote_as_text_closes_is_an_error(tmp_path: Path) -> None:
    """Found by a tester: a later row's Comment ending in an inch mark ('Dish 18"') closed a
    quote left open, the record's cells lined up with the header, and the rows between were
    read as its text without a word (an unquoted cell ending in a quote is a row of its own,
    not the end of a cell)."""
    for between in (1, 0):
        table = (
            HEADER
            + _row("1", "100.64.0.1", comment='"VIP customer')
            + "".join(_row(str(i), f"100.64.0.{i}") for i in range(2, 2 + between))
            + _row("3", "100.64.0.3", comment='Dish 18"')
            + _row("4", "100.64.0.4")
        )
        result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
        assert errors(result) == [("E035", "subs.csv", 2, 38)], table
        assert (
            f"line {3 + between} ends in the quote read as closing it" in result.errors[0].message
        )
    # the inch mark doubled is text, and the quote closed where it opened a cell
    table = (
        HEADER
        + _row("1", "100.64.0.1", comment='"VIP customer"')
        + _row("3", "100.64.0.3", comment='"Dish 18"""')
    )
    made = classes(ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)))
    assert {"c1", "c3"} <= set(made)


def test_a_quote_left_open_before_a_row_with_quoted_cells_is_an_error(tmp_path: Path) -> None:
    """The row after an open quote quotes its name (as LibreQoS writes a name holding a
    comma): it was read into the open cell, its address and rates given to the first circuit's
    class, with no word said."""
    opened = (
        ('1,n1,1,d,north,,100.64.0.1,,1,1,10,5,"VIP\n', 38),  # in the last cell
        ('1,"Bob,1,d,north,,100.64.0.1,,1,1,10,5,\n', 3),  # in the name
    )
    for first, column in opened:
        table = (
            HEADER
            + first
            + '2,"Smith, J.",2,cpe-2,north,,100.64.0.2,,4,2,40,10,\n'
            + _row("3", "100.64.0.3")
        )
        result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
        assert errors(result) == [("E035", "subs.csv", 2, column)], table
    # a name over two lines: its second line closes the quote inside a cell, no row
    table = HEADER + '1,"Bob\nSmith",1,d,north,,100.64.0.1,,1,1,10,5,\n' + _row("2", "100.64.0.2")
    assert "c1" in classes(
        ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table))
    )


@pytest.mark.parametrize(
    "swallowed",
    ['2,Dish 12" pole,2,d,north,,100.64.0.2,,1,1,10,5,\n',  # a quote inside an unquoted cell
     '2,"Dish 12"" pole",2,d,north,,100.64.0.2,,1,1,10,5,\n'],  # doubled in a quoted one
    ids=["bare", "doubled"],
)  # fmt: skip
def test_a_quote_left_open_before_a_row_holding_a_quote_is_an_error(
    tmp_path: Path, swallowed: str
) -> None:
    """The row after an open quote holds a quote of its own (an inch mark): the csv module
    reads it into the open cell, and circuit 2 was never made, with no word said."""
    table = HEADER + _row("1", "100.64.0.1", comment='"forgot to close') + swallowed
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E035", "subs.csv", 2, 38)], table


@pytest.mark.parametrize(
    "cell",
    ['"Bob\nSmith, J."', '"Bob\nSmith ""Jr"", J."', '"Bob\n""Smith"""', '"Bob\nSmith"  '],
)
def test_the_last_line_of_a_quoted_cell_is_no_row(tmp_path: Path, cell: str) -> None:
    """A name over two lines whose second line holds a row's commas: it closes the quote
    (followed by the next cell's comma), so it is the cell's end, not a row."""
    table = HEADER + f"1,{cell},1,d,north,,100.64.0.1,,1,1,10,5,,,,,,,,,,,,\n"
    table += _row("2", "100.64.0.2")
    policy_ = ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table))
    assert {"c1", "c2"} <= set(classes(policy_))


def test_a_quoted_cell_starting_with_a_hash_is_no_comment(tmp_path: Path) -> None:
    """Only a line that starts with '#' is a comment: a row whose first cell is quoted and
    starts with '#' ("#42 Main St", its name, in the first column) is a subscriber."""
    table = (
        "Circuit Name,Circuit ID,Parent Node,IPv4,Download Min Mbps,Upload Min Mbps,"
        "Download Max Mbps,Upload Max Mbps\n"
        '"#42 Main St",1001,north,100.64.0.1,1,1,10,10\n'
        "# a comment, with the commas, of a row,,,,\n"
        "Plain,1002,north,100.64.0.2,1,1,10,10\n"
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert [n for n in classes(ok(result)) if n.startswith("c")] == ["c1001", "c1002"]


class _Scanned(str):
    """A str that counts the characters its count and rfind calls scan."""

    scanned = 0

    def count(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        _Scanned.scanned += len(self[start:end])
        return super().count(sub, start, end)

    def rfind(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        _Scanned.scanned += len(self[start:end])
        return super().rfind(sub, start, end)


def test_the_cells_of_a_record_over_lines_are_found_in_linear_work() -> None:
    """A record of many cells with a quoted line break: each cell's line and column is found
    scanning the record about once (it was once per cell: minutes for a wide record of a
    table `check` reads from an untrusted source)."""
    cells = ["1", "a\nb", *(["x"] * 5000)]
    raw = '1,"a\nb",' + ",".join(["x"] * 5000)
    _Scanned.scanned = 0
    starts, _ = tables._cell_starts(_Scanned(raw), cells)
    assert _Scanned.scanned <= 4 * len(raw), _Scanned.scanned
    assert starts[:3] == (1, 4, tables.LINE_STEP + 4)
    assert starts[-1] == tables.LINE_STEP + 4 + 2 * 4999


def test_an_error_after_a_doubled_quote_in_a_cell_is_shown_where_it_is(tmp_path: Path) -> None:
    """Each '"' of a quoted cell's text is two in the file: the carets count them (found by a
    tester: an address after '""x""' was shown two columns early, and the first one short)."""
    table = (
        HEADER
        + '1,a,1,d,north,,"100.64.0.1 ""x"", 100.64.0.299",,1,1,10,5,\n'
        + '2,a,2,d,north,,"100.64.0.5,\n""100.64.0.2""",,1,1,10,5,\n'
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    shown = [(d.span.line, d.span.column, d.span.end_column - d.span.column) for d in result.errors]
    assert shown == [(2, 17, len('100.64.0.1 ""x""')), (2, 35, 12), (4, 1, len('""100.64.0.2""'))]


def test_a_cell_longer_than_the_csv_modules_default_limit(tmp_path: Path) -> None:
    table = HEADER + _row("1", "100.64.0.1", comment='"' + "x" * 200_000 + '"')
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert "c1" in classes(ok(result))


def test_a_prefix_with_host_bits_is_an_error(tmp_path: Path) -> None:
    """LibreQoS refuses '100.64.0.5/24'; widened to the /24 it would take others' traffic."""
    table = HEADER + _row("1", "100.64.0.5/24") + _row("2", '"100.64.0.9, 10.0.0.0/255.0.0.0"')
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 2, 17)]
    assert "host bits set: write the network, 100.64.0.0/24, or one host, 100.64.0.5/32" in (
        result.errors[0].message
    )
    six = HEADER + "1,a,1,d,north,,,2001:db8::1/64,1,1,10,5,\n"
    assert errors(build(tmp_path, policy('        subscribers from "subs.csv"\n'), six)) == [
        ("E029", "subs.csv", 2, 17)
    ]


@pytest.mark.parametrize("cell", ["fe80::1%eth0", "fe80::%1/64", "2001:db8::1%25"])
def test_an_ipv6_address_with_a_zone_is_an_error(tmp_path: Path, cell: str) -> None:
    """ipaddress takes a zone ('%eth0', Python 3.9+) that no filter can match; the lowering
    refused it with a traceback. LibreQoS's parser refuses it too."""
    table = HEADER + f"1,a,1,d,north,,100.64.0.1,{cell},1,1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 2, 27)]
    assert "zone" in result.errors[0].message


@pytest.mark.parametrize(
    ("cell", "meant"),
    [("::ffff:100.64.0.1", "100.64.0.1"), ("::FFFF:6440:0/120", "100.64.0.0/24")],
)
def test_an_ipv4_mapped_ipv6_address_is_an_error(tmp_path: Path, cell: str, meant: str) -> None:
    """No IPv6 packet carries ::ffff:a.b.c.d (a socket sends IPv4 to it): the filter would
    never match, and the subscriber's traffic would go unshaped by its class."""
    table = HEADER + f"1,a,1,d,north,,,{cell},1,1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 2, 17)]
    assert (
        "IPv4-mapped IPv6 address, which no IPv6 packet carries (a socket sends IPv4 to "
        f"it): write {meant} in the IPv4 column" in result.errors[0].message
    )
    near = HEADER + "1,a,1,d,north,,,::fffe:100.64.0.1,1,1,10,5,\n"  # not mapped: fine
    assert "c1" in classes(
        ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), near))
    )


def test_a_bad_address_is_quoted_as_written(tmp_path: Path) -> None:
    """Blanks are dropped inside an address, but the error quotes the cell's text: two
    addresses separated by a blank were shown as one run of digits ('100.64.0.1100.64.0.2')."""
    table = HEADER + _row("1", "100.64.0.1 100.64.0.2")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 2, 17)]
    assert result.errors[0].message.startswith("'100.64.0.1 100.64.0.2' is not a valid IPv4")


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_table_separated_by_another_character_says_so(tmp_path: Path, separator: str) -> None:
    """A spreadsheet saved as CSV in a locale whose decimal mark is a comma separates cells by
    ';': the header is one cell, and E028 says which separator it seems to use."""
    table = (HEADER + _row("1", "100.64.0.1")).replace(",", separator)
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert [d.code for d in result.errors] == ["E028"]
    name = "';'" if separator == ";" else "tabs"
    message = result.errors[0].message
    assert message.endswith(f"; its first row holds no comma but {name}: separate cells by commas")
    assert "Circuit Name" not in render(result.diagnostics, result.sources)  # not shown


def test_blanks_inside_an_address_and_rates_as_floats(tmp_path: Path) -> None:
    """As LibreQoS reads them: blanks dropped from an address, a rate as Python's float."""
    table = HEADER + "1,a,1,d,north,,100.64.0.1 /32,,1e1,0.5,1E2,2.5e0,\n"
    cls = classes(ok(build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)))["c1"]
    assert addresses(cls) == [("dst", "100.64.0.1/32")]
    assert cls.rate.bits_per_second == 10_000_000  # type: ignore[union-attr]
    assert cls.ceil is not None and cls.ceil.bits_per_second == 100_000_000  # type: ignore[union-attr]


@pytest.mark.parametrize("cell", ["\u0663", "\uff12", "2\u0660", "\u0661.5"])
def test_a_rate_is_written_in_ascii_digits(tmp_path: Path, cell: str) -> None:
    """'٣' (Arabic-Indic three) or a fullwidth '２' is not a number of Mbps: the regex's \\d
    took any Unicode digit, and Decimal read them (as the fast path for whole numbers,
    which asks for ASCII, did not)."""
    table = HEADER + f"1,a,1,d,north,,100.64.0.1,,{cell},1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E030", "subs.csv", 2, 28)]


def test_a_rate_above_the_limit_says_so(tmp_path: Path) -> None:
    table = HEADER + "1,a,1,d,north,,100.64.0.1,,1,1,99999999,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E030", "subs.csv", 2, 32)]
    assert "'99999999' Mbps is more than tcdsl takes (34,359,738 Mbps)" in result.errors[0].message


def test_a_table_ending_without_a_line_break_in_a_cell_that_shapes_is_warned(
    tmp_path: Path,
) -> None:
    """Without a Comment column, a table cut while it was written can have every cell and
    its last one cut ('20' read as '2'), which E039 cannot see: W382 there, not where the
    file ends with a line break, nor where its last cell is a Comment."""
    header = "Circuit ID,IPv4,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps\n"
    table = header + "1,100.64.0.1,1,1,10,20\n2,100.64.0.2,1,1,10,2"
    body = '        subscribers from "subs.csv"\n'
    result = build(tmp_path, policy(body), table)
    warned = [(d.code, d.span.line, d.span.column) for d in result.diagnostics if d.code[0] != "I"]
    assert warned == [("W382", 3, 21)]
    ok(build(tmp_path, policy(body), table + "\n"))
    ok(build(tmp_path, policy(body), HEADER + "1,a,1,d,north,,100.64.0.1,,10,2,100,20,x"))


def test_a_row_of_another_width_than_the_header_is_noted(tmp_path: Path) -> None:
    """An unquoted comma shifts the cells after it: the first error notes the width."""
    table = HEADER + "1,Smith, J,1,d,north,,100.64.0.1,,10,1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert sorted(d.code for d in result.errors) == ["E029", "E030"]
    noted = [
        d.code
        for d in result.errors
        if "this row has 14 cells and the header 13" in [n.message for n in d.notes]
    ]
    assert noted == ["E030"]  # the row's first error (the rates are read before the addresses)


def test_a_row_with_fewer_cells_than_the_header_is_an_error(tmp_path: Path) -> None:
    """A table read while its writer was at it ends in a row cut short, whose last cell may
    be cut too ('20' read as '2'): the row is refused (E039, as LibreQoS refuses it), at its
    end, and the message says when the file ends in it without a line break."""
    whole = (
        HEADER
        + "1,a,1,d,north,,100.64.0.1,,10,2,100,20,\n2,b,2,d,north,,100.64.0.2,,10,2,100,20,\n"
    )
    body = '        subscribers from "subs.csv"\n'
    ok(build(tmp_path, policy(body), whole))
    result = build(tmp_path, policy(body), whole[:-3])
    assert errors(result) == [("E039", "subs.csv", 3, 38)]
    assert "this row has 12 cells and the header 13: the file ends in this row" in (
        result.errors[0].message
    )
    # a short row in the middle: the other wording
    short = (
        HEADER + "1,a,1,d,north,,100.64.0.1,,10,2,100\n2,b,2,d,north,,100.64.0.2,,10,2,100,20,\n"
    )
    result = build(tmp_path, policy(body), short)
    assert errors(result) == [("E039", "subs.csv", 2, 36)]
    assert "11 cells and the header 13: is a cell missing" in result.errors[0].message
    # a column past those tcdsl reads: a row without its cell is read, unless it ends the
    # file without a line break
    region = HEADER.rstrip("\n") + ",Region\n" + "1,a,1,d,north,,100.64.0.1,,10,2,100,20,\n"
    ok(build(tmp_path, policy(body), region))
    result = build(tmp_path, policy(body), region.rstrip("\n"))
    assert errors(result) == [("E039", "subs.csv", 2, 40)]


def test_an_address_inside_an_earlier_circuits_prefix_is_an_error(tmp_path: Path) -> None:
    """First match (tcdsl) and longest prefix (LibreQoS) must agree on a table."""
    body = '        subscribers from "subs.csv"\n'
    table = HEADER + _row("1", "100.64.0.0/24") + _row("2", "100.64.0.5")
    result = build(tmp_path, policy(body), table)
    assert errors(result) == [("E036", "subs.csv", 3, 17)]
    (note,) = result.errors[0].notes
    assert (note.span.line, note.span.column) == (2, 17)
    # the more specific first: both agree, and classify says the /32's circuit
    table = HEADER + _row("2", "100.64.0.5") + _row("1", "100.64.0.0/24")
    ok(build(tmp_path, policy(body), table))
    verdict = CliRunner().invoke(
        cli, ["classify", str(tmp_path / "p.tcp"), "--packet", "udp dst 100.64.0.5 dport 53"]
    )
    assert verdict.exit_code == 0 and "c2" in verdict.stdout, verdict.output
    # a circuit's lines come where its first row is: its later device is tried early
    table = (
        HEADER
        + _row("1", "100.64.1.1")
        + _row("2", "100.64.0.5")
        + "1,n1,9,d,north,,100.64.0.0/24,,1,1,10,5,\n"
    )
    assert errors(build(tmp_path, policy(body), table)) == [("E036", "subs.csv", 3, 17)]
    # IPv6 too, across two statements (the lower pref is tried first)
    two = (
        "        class north rate 100mbit {\n"
        '            subscribers from "subs.csv" where parent_node == "north" pref 2\n'
        "        }\n"
        "        class south rate 100mbit {\n"
        '            subscribers from "subs.csv" where parent_node == "south" pref 1\n'
        "        }\n"
    )
    table = (
        HEADER
        + "1,a,1,d,north,,,2001:db8:1::/64,1,1,10,5,\n"
        + "2,b,2,d,south,,,2001:db8::/32,1,1,10,5,\n"
    )
    assert errors(build(tmp_path, policy(two), table)) == [("E036", "subs.csv", 2, 17)]


def test_a_duplicate_address_under_an_earlier_prefix_is_a_duplicate_not_e036(
    tmp_path: Path,
) -> None:
    """Found by a review: circuit 1 holds 100.64.0.0/24 and 100.64.0.5, circuit 2 the same
    100.64.0.5: E036 said LibreQoS gives it to 2 (the longest prefix), but both hold it; it is
    the duplicate the warnings name (without the /24, W313), not an error."""
    body = '        subscribers from "subs.csv"\n'
    table = HEADER + '1,n1,1,d,north,,"100.64.0.0/24,100.64.0.5",,1,1,10,5,\n'
    table += _row("2", "100.64.0.5")
    result = build(tmp_path, policy(body), table)
    assert errors(result) == [] and result.policy is not None
    found = {(d.code, d.span.line) for d in result.diagnostics}
    assert ("W312", 3) in found, render(result.diagnostics, result.sources)
    # a /32 of another circuit under the /24 is still E036
    table = HEADER + _row("1", "100.64.0.0/24") + _row("3", "100.64.0.7") + _row("2", "100.64.0.5")
    assert errors(build(tmp_path, policy(body), table)) == [
        ("E036", "subs.csv", 3, 17),
        ("E036", "subs.csv", 4, 17),
    ]


def test_a_table_in_error_read_by_two_trees_gets_no_warning_in_either(tmp_path: Path) -> None:
    """Found by a review: rows in error are left out, and the tree that reads the table
    second then warned that no packet reaches its site (W311): the first did not."""
    site = (
        '        class north rate 100mbit {\n            subscribers from "subs.csv"\n        }\n'
    )
    text = (
        "interface eth0 {\n"
        + "".join(
            f"    {tree} htb rate 1gbit burst 123k cburst 123k default other {{\n{site}"
            "        class other rate 10mbit\n    }\n"
            for tree in ("upload", "download")
        )
        + "}\n"
    )
    result = build(tmp_path, text, HEADER + _row("1", "100.64.0.300"))
    assert [(d.code, Path(d.span.file).name) for d in result.diagnostics] == [
        ("E029", "subs.csv")
    ], render(result.diagnostics, result.sources)


def test_a_template_factor_of_zero_is_one_error_at_the_factor(tmp_path: Path) -> None:
    """Found by a review: 'ceil max * 0' gave two errors per subscriber at its Max cell
    (E202, E208), none at the statement."""
    body = '        subscribers from "subs.csv" ceil max * 0\n'
    result = build(
        tmp_path, policy(body), HEADER + _row("1", "100.64.0.1") + _row("2", "100.64.0.2")
    )
    assert errors(result) == [("E208", "p.tcp", 3, 48)], render(result.diagnostics, result.sources)


def test_a_cell_past_a_million_columns_in_a_record_of_two_lines_is_placed_right(
    tmp_path: Path,
) -> None:
    """Found by a review: a cell's line and column were packed in one number with a step of
    a million columns, so a long first line spilled into the line count (s.csv:7:200014
    in a file of 3 lines)."""
    wide = "x" * 1_200_000
    table = HEADER + f'1001,{wide},1,d,n,,999.64.0.1,,10,2,100,20,"a\nb"\n'
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 2, 1_200_000 + 14)]


def test_small_findings_of_a_review(tmp_path: Path) -> None:
    """An empty file name ('.' was "a directory"); a byte order mark opening a row (two
    exports joined) made another circuit than its id; E033 listed every column of a header
    of thousands."""
    empty = build(tmp_path, policy('        subscribers from ""\n'))
    assert errors(empty) == [("E024", "p.tcp", 3, 26)]
    assert "an empty file name" in empty.errors[0].message
    included = build(tmp_path, 'include ""\ninterface eth0 pfifo\n')
    assert errors(included) == [("E024", "p.tcp", 1, 9)]
    row = _row("1", "100.64.0.1")
    joined = (
        HEADER + row + "\ufeff" + row.replace("100.64.0.1", "100.64.0.2").replace(",1,1,", ",9,1,")
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), joined)
    assert [d.code for d in result.errors] == ["E032"], render(result.diagnostics, result.sources)
    wide = HEADER.rstrip("\n") + "".join(f",x{i}" for i in range(2000)) + "\n" + row
    result = build(
        tmp_path, policy('        subscribers from "subs.csv" where nothing == "a"\n'), wide
    )
    (e033,) = result.errors
    assert e033.code == "E033" and e033.message.endswith(" and 1983 more"), e033.message


def test_past_fifty_addresses_inside_a_prefix_one_error_says_how_many_more(
    tmp_path: Path,
) -> None:
    """The summary of the E036s not shown sits at the first of them (it sat at the table's
    first circuit, a row with nothing wrong)."""
    rows = [_row("100", "100.64.0.0/24")]
    rows += [_row(str(100 + i), f"100.64.0.{i}") for i in range(1, 60)]
    body = policy('        subscribers from "subs.csv"\n')
    result = build(tmp_path, body, HEADER + "".join(rows))
    column = errors(result)[0][3]
    assert errors(result) == [("E036", "subs.csv", line, column) for line in range(3, 54)]
    assert result.errors[-1].message.startswith("9 more subscriber address(es) inside")


def test_one_id_in_two_tables_is_named_with_its_table(tmp_path: Path) -> None:
    """Found by a tester: with circuit 1001 in two tables (two classes), a /32 of one inside
    the /24 of the other said 'of circuit '1001' lies inside ... of circuit '1001'', and to
    give the statement that takes '1001' a lower pref than the one that takes '1001'."""
    (tmp_path / "wide.csv").write_text(HEADER + _row("1001", "100.64.0.0/24"), encoding="utf-8")
    body = (
        '        subscribers from "wide.csv" pref 1\n        subscribers from "subs.csv" pref 2\n'
    )
    result = build(tmp_path, policy(body), HEADER + _row("1001", "100.64.0.5"))
    (found,) = [d for d in result.errors if d.code == "E036"]
    assert "of circuit '1001' of " in found.message, found.message
    assert "subs.csv" in found.message and "wide.csv" in found.message, found.message


def test_a_where_cut_short_by_a_syntax_error_selects_nothing_to_report(tmp_path: Path) -> None:
    """Found by a tester: a quote in a 'where' value (E001) also said no row meets the half
    of the condition that was read (E034): two errors for one mistake. A statement without a
    syntax error still says it (the same value, written as one word)."""
    broken = policy('        subscribers from "subs.csv" where parent_node == "no\\"rth"\n')
    assert [d.code for d in build(tmp_path, broken).errors] == ["E001"]
    whole = policy('        subscribers from "subs.csv" where parent_node == "no_rth"\n')
    assert [d.code for d in build(tmp_path, whole).errors] == ["E034"]


def test_every_column_given_twice_is_said_at_once(tmp_path: Path) -> None:
    """Found by a tester: with two columns each given twice, E028 said only the first pair."""
    header = HEADER.replace("Parent Node", "Parent Node,parent_node").replace(
        "Upload Max Mbps", "Upload Max Mbps,Upload Max Mbps"
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), header)
    said = [d.message for d in result.errors]
    assert [d.code for d in result.errors] == ["E028", "E028"], said
    assert "parent_node" in said[0] and "upload_max" in said[1], said


def test_a_row_added_to_one_table_renames_no_circuit_of_another(tmp_path: Path) -> None:
    """Found by a tester: with two tables in a tree, a circuit id added to the first took the
    name c1001 from the second table's circuit 1001 (renamed with a digest): apply made that
    untouched subscriber's class again, its counters from 0, and the plan said 'c1001 moves'.
    Every table's circuits but the first's carry their table's digest now, ids shared or
    not, so their names depend on their own rows alone."""
    body = (
        "        class a rate 100mbit {\n"
        '            subscribers from "subs.csv"\n'
        "        }\n"
        "        class b rate 100mbit {\n"
        '            subscribers from "more.csv"\n'
        "        }\n"
    )
    more = HEADER + _row("1001", "100.64.1.1") + _row("1003", "100.64.1.3")

    def names(first: str) -> list[str]:
        (tmp_path / "more.csv").write_text(more, encoding="utf-8")
        made = classes(ok(build(tmp_path, policy(body), HEADER + first)))
        return [n for n in made if n not in ("", "a", "b", "other")]

    before = names(_row("1002", "100.64.0.2"))
    after = names(_row("1002", "100.64.0.2") + _row("1001", "100.64.0.1"))
    second = [_tagged("c1001", "more.csv", "1001"), _tagged("c1003", "more.csv", "1003")]
    assert before == ["c1002", *second]
    assert after == ["c1002", "c1001", *second]


TWO_TABLES = (
    "        class north rate 100mbit {\n"
    '            subscribers from "subs.csv"\n'
    '            subscribers from "more.csv"\n'
    "        }\n"
)
"""A site taking the circuits of two tables (``more.csv`` written by the test)."""


def test_circuit_names_do_not_collide_with_the_trees_other_classes(tmp_path: Path) -> None:
    """A circuit id that is a written class's name, or another table's circuit's, gets a
    digest of its table and id."""
    (tmp_path / "more.csv").write_text(HEADER + _row("1", "100.64.1.1"), encoding="utf-8")
    body = TWO_TABLES
    table = (
        HEADER + _row("other", "100.64.0.1") + _row("north", "100.64.0.2") + _row("1", "100.64.0.3")
    )
    made = classes(ok(build(tmp_path, policy(body), table)))
    assert [n for n in made if n not in ("", "north", "other")] == [
        _tagged("other", "subs.csv", "other"),
        _tagged("north", "subs.csv", "north"),
        "c1",
        _tagged("c1", "more.csv", "1"),
    ]
    assert addresses(made[_tagged("c1", "more.csv", "1")]) == [("dst", "100.64.1.1/32")]


def test_tables_of_one_file_name_in_two_folders_name_their_circuits_apart(
    tmp_path: Path,
) -> None:
    """Two tables named alike in different folders digest their circuits with their paths
    from the policy's folder: each circuit's name is its own whatever the statements' order
    (with the file name alone both had one digest, and which got ``_2`` followed the order)."""
    for folder, address in (("a", "100.64.1.1"), ("b", "100.64.2.1")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "more.csv").write_text(HEADER + _row("7", address), encoding="utf-8")
    lines = [
        '            subscribers from "a/more.csv"\n',
        '            subscribers from "b/more.csv"\n',
    ]
    named = []
    for order in (lines, lines[::-1]):
        body = (
            "        class north rate 100mbit {\n"
            '            subscribers from "subs.csv"\n' + "".join(order) + "        }\n"
        )
        made = classes(ok(build(tmp_path, policy(body), HEADER + _row("1", "100.64.0.1"))))
        named.append({n: addresses(c) for n, c in made.items() if n.startswith("c7")})
    assert (
        named[0]
        == named[1]
        == {
            _tagged("c7", "a/more.csv", "7"): [("dst", "100.64.1.1/32")],
            _tagged("c7", "b/more.csv", "7"): [("dst", "100.64.2.1/32")],
        }
    )


def test_a_circuit_taken_by_two_statements_is_an_error(tmp_path: Path) -> None:
    body = (
        '        subscribers from "subs.csv" where parent_node == "north"\n'
        '        subscribers from "subs.csv" where circuit_id == "102"\n'
    )
    result = build(tmp_path, policy(body))
    assert [(d.code, d.span.line) for d in result.errors] == [("E037", 4)]
    assert [(Path(n.span.file).name, n.span.line) for n in result.errors[0].notes] == [
        ("subs.csv", 3),
        ("p.tcp", 3),
    ]


def test_steering_follows_the_tree_not_the_tables_rows(tmp_path: Path) -> None:
    """In an mq tree the steering filters are tried in the tree's order, as each queue's htb
    tries its own: a table's rows are in another file, so their lines' places there say
    nothing about it. Here the south site's row comes first in the table but the north site
    first in the tree, and its address lies in south's prefix."""
    text = (
        "interface eth0 mq queues 2 htb rate 1gbit default other {\n"
        "    class north rate 300mbit {\n"
        '        subscribers download from "subs.csv" where parent_node == "north"\n'
        "    }\n"
        "    class south rate 200mbit {\n"
        '        subscribers download from "subs.csv" where parent_node == "south"\n'
        "    }\n"
        "    class other rate 10mbit\n"
        "}\n"
    )
    table = HEADER + _row("2", "100.64.0.0/24", parent="south") + _row("1", "100.64.0.5")
    ok(build(tmp_path, text, table))
    verdict = CliRunner().invoke(
        cli,
        [
            "classify",
            str(tmp_path / "p.tcp"),
            *("--packet", "udp dst 100.64.0.5 dport 53"),
            *("--packet", "udp dst 100.64.0.6 dport 53"),
            *("--format", "json"),
        ],
    )
    assert verdict.exit_code == 0, verdict.output
    assert [v["class"] for v in json.loads(verdict.stdout)] == ["c1", "c2"]


def test_an_error_on_a_later_line_of_a_quoted_cell_is_shown_there(tmp_path: Path) -> None:
    table = HEADER + '1,a,1,d,north,,"100.64.0.1,\n 100.64.0.993",,1,1,10,5,\n'
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E029", "subs.csv", 3, 2)]
    assert (result.errors[0].span.end_column - result.errors[0].span.column) == len("100.64.0.993")


def test_a_top_level_statement_of_a_spread_tree_spreads_its_circuits(tmp_path: Path) -> None:
    """Each circuit of a statement among the top-level classes of 'mq queues N' is a
    top-level class, packed by its rate like a written one: the statement is not one unit
    (it was: every circuit on one queue, so one CPU, and W368 counted it as one class)."""
    text = (
        "interface eth0 mq queues 4 htb rate 1gbit default other {\n"
        '    subscribers download from "subs.csv" { pfifo }\n'
        "    class other rate 10mbit\n"
        "}\n"
    )
    table = HEADER + "".join(_row(str(n), f"100.64.0.{n}") for n in range(1, 9))
    result = build(tmp_path, text, table)
    root = ok(result).interfaces[0].root
    assert isinstance(root, ir.Mq)
    per_queue = [
        sorted(c.name for c in ir.queue_tops(queue.qdisc) if c.name.startswith("c"))
        for queue in root.queues
    ]
    # largest first onto the least-loaded queue: 'other' (10mbit), then the 1mbit circuits
    assert per_queue == [[], ["c1", "c4", "c7"], ["c2", "c5", "c8"], ["c3", "c6"]]
    assert not [d for d in result.diagnostics if d.code == "W368"]
    assert _classified(tmp_path, (1, 4, 8, 9)) == ["c1", "c4", "c8", "other"]
    # the default may be a circuit, as in a tree without mq (it was E102 'classes: none')
    text = text.replace("default other", "default c1").replace("    class other rate 10mbit\n", "")
    root = ok(build(tmp_path, text, table)).interfaces[0].root
    assert isinstance(root, ir.Mq)
    assert [q.qdisc.default.name for q in root.queues] == ["c1", "c1@2", "c1@3", "c1@4"]  # type: ignore[union-attr]


def _classified(tmp_path: Path, hosts: tuple[int, ...]) -> list[str]:
    """The classes ``tcdsl classify`` gives UDP packets to 100.64.0.N of the policy p.tcp."""
    packets = (arg for n in hosts for arg in ("--packet", f"udp dst 100.64.0.{n} dport 5"))
    verdict = CliRunner().invoke(
        cli, ["classify", str(tmp_path / "p.tcp"), *packets, "--format", "json"]
    )
    assert verdict.exit_code == 0, verdict.output
    return [v["class"] for v in json.loads(verdict.stdout)]


def test_a_top_level_statement_of_a_spread_tree_keeps_its_place(tmp_path: Path) -> None:
    """The steering tries the subscribers of a statement written among the top-level classes
    where the statement is: before the class written after it, whose /24 holds them."""
    text = (
        "interface eth0 mq queues 2 htb rate 1gbit default other {\n"
        "    class a rate 400mbit match dst 10.9.9.9\n"
        '    subscribers download from "subs.csv"\n'
        "    class b rate 500mbit match dst 100.64.0.0/24\n"
        "    class other rate 10mbit\n"
        "}\n"
    )
    table = HEADER + _row("1", "100.64.0.1") + _row("2", "100.64.0.2") + _row("3", "100.64.0.3")
    result = build(tmp_path, text, table)
    ok(result)
    assert not [d for d in result.diagnostics if d.code == "W312"]
    assert _classified(tmp_path, (1, 2, 3, 4)) == ["c1", "c2", "c3", "b"]


def test_the_longest_prefix_check_knows_marks_nested_qdiscs_and_the_first_line(
    tmp_path: Path,
) -> None:
    # classify by mark: lines without a pref are fw filters at the marking's pref (10), so
    # south's 'pref 2' /32 is tried before north's /24: longest prefix first, no error
    by_mark = (
        "interface eth0 htb rate 1gbit default other {\n"
        "    classify by mark from eth1 pref 10\n"
        '    subscribers download from "subs.csv" where parent_node == "north"\n'
        '    subscribers download from "subs.csv" where parent_node == "south" pref 2\n'
        "    class other rate 1mbit\n"
        "}\n"
    )
    table = HEADER + _row("1", "100.64.0.0/24") + _row("2", "100.64.0.5", parent="south")
    ok(build(tmp_path, by_mark, table))
    swapped = HEADER + _row("1", "100.64.0.5") + _row("2", "100.64.0.0/24", parent="south")
    assert errors(build(tmp_path, by_mark, swapped)) == [("E036", "subs.csv", 2, 17)]
    # a table in an htb below a queue of an mq tree: its own list, as without mq
    nested = (
        "interface eth0 mq queues 2 htb rate 1gbit default other {\n"
        "    class site rate 500mbit match dst 100.64.0.0/16 {\n"
        "        htb rate 500mbit default rest {\n"
        '            subscribers download from "subs.csv"\n'
        "            class rest rate 1mbit\n"
        "        }\n"
        "    }\n"
        "    class other rate 1mbit\n"
        "}\n"
    )
    table = HEADER + _row("1", "100.64.0.0/24") + _row("2", "100.64.0.5")
    assert errors(build(tmp_path, nested, table)) == [("E036", "subs.csv", 3, 17)]
    # the error names the line a packet meets first, not the widest prefix
    table = (
        HEADER + _row("1", "100.64.1.0/24") + _row("2", "100.64.0.0/16") + _row("3", "100.64.1.5")
    )
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    assert errors(result) == [("E036", "subs.csv", 4, 17)]
    assert "would go to '1'" in result.errors[0].message


def test_an_address_inside_a_prefix_of_an_earlier_statement(tmp_path: Path) -> None:
    """When the two circuits are taken by two statements, the order is the statements', not
    the table's: E036 says to give the later statement a lower pref (it said 'list circuit 2
    before 1', which it already was), and points at that statement."""
    text = (
        "interface eth0 htb rate 1gbit default other {\n"
        '    subscribers download from "subs.csv" where parent_node == "north"\n'
        '    subscribers download from "subs.csv" where parent_node == "south"\n'
        "    class other rate 1mbit\n"
        "}\n"
    )
    table = HEADER + _row("2", "100.64.0.5", parent="south") + _row("1", "100.64.0.0/24")
    result = build(tmp_path, text, table)
    assert errors(result) == [("E036", "subs.csv", 2, 17)]
    message = result.errors[0].message
    assert "list circuit" not in message
    assert "give the statement that takes '2' a lower pref than the one that takes '1'" in message
    assert [(n.span.file.endswith("p.tcp"), n.span.line) for n in result.errors[0].notes] == [
        (False, 3),
        (True, 3),
    ]
    # with those prefs, both agree
    prefs = text.replace('"south"\n', '"south" pref 1\n').replace('"north"\n', '"north" pref 2\n')
    ok(build(tmp_path, prefs, table))
    # with marks, a pref makes the lines u32 filters, which the fw filters' catch-all may
    # hide (W355): the advice is the tree's order
    marked = text.replace("{\n", "{\n    classify by mark from any\n", 1)
    result = build(tmp_path, marked, table)
    assert errors(result) == [("E036", "subs.csv", 2, 17)]
    assert "lower pref" not in result.errors[0].message
    assert "put it above the one that takes '1' in the tree, without a pref" in (
        result.errors[0].message
    )


def test_subscribers_after_the_marks_of_every_arriving_packet_warn_once(tmp_path: Path) -> None:
    """Under 'classify by mark from any', the default's mark takes every forwarded packet
    before the fw filters' pref ends: a statement's lines at a higher pref would see only the
    host's own packets, so W355 says so, once for the statement (not once a row)."""
    text = (
        "interface eth0 htb rate 1gbit default other {\n"
        "    classify by mark from any\n"
        '    subscribers download from "subs.csv" where parent_node == "north" pref 3\n'
        '    subscribers download from "subs.csv" where parent_node == "south"\n'
        "    class other rate 1mbit\n"
        "}\n"
    )
    table = HEADER + _row("1", "100.64.0.1") + _row("2", "100.64.0.2") + _row("3", "100.64.0.3")
    table += _row("4", "100.64.0.4", parent="south")
    result = build(tmp_path, text, table)
    found = [d for d in result.diagnostics if d.code == "W355"]
    assert [(d.span.file.endswith("p.tcp"), d.span.line) for d in found] == [(True, 3)]
    assert "only what this host sends itself" in found[0].message
    # marking what arrives on one interface leaves the others' packets to those lines
    result = build(tmp_path, text.replace("from any", "from eth1"), table)
    assert not [d for d in result.diagnostics if d.code == "W355"]


def test_two_statements_splitting_a_circuits_devices_say_so(tmp_path: Path) -> None:
    """Conditions that are exclusive on a column the circuit's devices differ in take one
    circuit twice, a device each: E037 says the circuit is split, not that the conditions
    overlap (which they do not)."""
    body = (
        '        subscribers from "subs.csv" where "Device Name" == "cpe-2"\n'
        '        subscribers from "subs.csv" where "Device Name" == "router-3"\n'
    )
    result = build(tmp_path, policy(body))
    assert [(d.code, d.span.line) for d in result.errors] == [("E037", 4)]
    message = result.errors[0].message
    assert message.startswith(
        "circuit '102' is split between two subscribers statements of this tree (the first "
        "took its row at line 3, this one its row at line 4)"
    ), message
    assert "exclusive" not in message and "such as the parent node" in message
    assert [(Path(n.span.file).name, n.span.line) for n in result.errors[0].notes] == [
        ("subs.csv", 4),
        ("p.tcp", 3),
    ]


def test_two_statements_sharing_many_circuits_is_one_error(tmp_path: Path) -> None:
    body = (
        '        subscribers from "subs.csv"\n'
        '        subscribers from "subs.csv" where parent_node != "south"\n'
    )
    result = build(tmp_path, policy(body))
    assert [(d.code, d.span.line) for d in result.errors] == [("E037", 4)]
    assert "2 circuits (first '101') are taken by two subscribers statements" in (
        result.errors[0].message
    )


def test_a_table_that_cannot_be_read_is_one_error_and_no_follow_ons(tmp_path: Path) -> None:
    """Two statements read a table that is gone: E027 once, at the first; the second's
    parent class, left without subscribers, is not said to be unreachable (W311)."""
    path = tmp_path / "p.tcp"
    path.write_text(policy(SITES), encoding="utf-8")
    result = analyse(str(path))
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("E027", 4)], render(
        result.diagnostics, result.sources
    )


def test_a_line_break_in_a_cell_cannot_forge_a_diagnostic(tmp_path: Path) -> None:
    """A quoted cell may hold a line break, and messages quote cells: the message's later
    lines are indented, so none reads as a diagnostic of its own (a CI problem matcher's
    ``^file:line:col: error:``)."""
    forged = "subs.csv:1:1: error: forged [E999]"
    table = HEADER + f'"x\n{forged}",a,1,d,north,,,,2,1,20,5,\n' + _row("2", "100.64.0.2")
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    shown = render(result.diagnostics, result.sources)
    assert "W372" in [d.code for d in result.diagnostics]
    assert f"    {forged}" in shown
    assert not any(line.startswith("subs.csv:1:1") for line in shown.splitlines()), shown


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_a_tree_of_one_family_takes_that_familys_addresses(tmp_path: Path, family: str) -> None:
    """A shaper of one family from a dual-stack table: each class matches its addresses of
    that family, a device with none is left unmatched, and one W363 says so (it was a W363
    for each row and E258 for a device of the other family alone)."""
    table = (
        HEADER
        + "1,a,1,d,north,,100.64.0.1,2001:db8:1::/56,1,1,10,5,\n"
        + "2,b,2,d,north,,,2001:db8:2::/56,1,1,10,5,\n"
        + "3,c,3,d,north,,100.64.0.3,,1,1,10,5,\n"
    )
    text = policy('        subscribers from "subs.csv"\n').replace(
        "interface eth0 {", f"interface eth0 family {family} {{"
    )
    result = build(tmp_path, text, table)
    found = classes(ok(result))
    if family == "ipv4":
        want = {"c1": [("dst", "100.64.0.1/32")], "c2": [], "c3": [("dst", "100.64.0.3/32")]}
        told = "2 IPv6 address(es) of the table are left out: this tree classifies IPv4 only; "
        told += "1 device(s) have no IPv4 address"
    else:
        want = {"c1": [("dst", "2001:db8:1::/56")], "c2": [("dst", "2001:db8:2::/56")], "c3": []}
        told = "2 IPv4 address(es) of the table are left out: this tree classifies IPv6 only; "
        told += "1 device(s) have no IPv6 address"
    assert {n: addresses(found[n]) for n in want} == want
    (w363,) = [d for d in result.diagnostics if d.code == "W363"]
    assert told in w363.message


def test_two_columns_for_one_non_address_field_are_not_told_to_merge(tmp_path: Path) -> None:
    header = HEADER.replace("Parent Node,", "Parent,Parent Node,")
    table = header + "1,a,1,d,x,north,,100.64.0.1,,1,1,10,5,\n"
    result = build(tmp_path, policy('        subscribers from "subs.csv"\n'), table)
    (error,) = result.errors
    assert error.code == "E028" and "'Parent' and 'Parent Node' for parent_node" in error.message
    assert error.message.endswith("remove or rename one"), error.message


def test_rows_taken_by_no_statement_are_told_of_at_most_fifty_times(tmp_path: Path) -> None:
    """W371 is one warning per value of the first where column, up to 50, then one for the
    rest (a where on circuit ids took 1 of 300 rows: 299 warnings)."""
    table = HEADER + "".join(_row(str(i), f"100.64.1.{i % 250}") for i in range(1, 121))
    body = '        subscribers from "subs.csv" where circuit_id == "1"\n'
    result = build(tmp_path, policy(body), table)
    w371 = [d for d in result.diagnostics if d.code == "W371"]
    assert len(w371) == 51
    (rest,) = [d for d in w371 if d.message.startswith("69 more row(s) of table")]
    assert "with 69 more values of Circuit ID" in rest.message


def test_overbooking_by_a_tables_rows_is_said_at_the_site_class(tmp_path: Path) -> None:
    """Found by a tester: W350 pointed at the table's last row (which had nothing wrong with
    it), and the upload's and the download's read the same. It points at the class the
    subscribers statement fills, and names the tree when the policy has several."""
    body = '        class north rate 3mbit {\n            subscribers from "subs.csv"\n        }\n'
    text = (
        "interface eth0 {\n"
        + policy(body, "upload").split("\n", 1)[1].rsplit("}\n", 1)[0]
        + policy(body, "download").split("\n", 1)[1]
    )
    result = build(tmp_path, text)
    found = [d for d in result.diagnostics if d.code == "W350"]
    assert [(Path(d.span.file).name, d.span.line, d.span.column) for d in found] == [
        ("p.tcp", 3, 15),
        ("p.tcp", 9, 15),
    ], render(result.diagnostics, result.sources)
    assert "class 'north' (eth0) are" in found[0].message
    assert "class 'north' (eth0 download (via ifb4eth0)) are" in found[1].message


def test_a_rate_of_zero_mbps_is_said_by_its_column(tmp_path: Path) -> None:
    """Found by a tester: a minimum of 0 Mbps (exports of best-effort plans have them) was
    'rate must be above 0bit' (E208), naming neither the column nor the statement. It is
    E030 by the column, once, with the statement; a rate on the statement is the way out."""
    table = HEADER + "101,a,1,d,north,,100.64.0.1,,0,1,0.000001,5,\n"
    body = '        class north rate 100mbit {\n            subscribers from "subs.csv"\n'
    result = build(tmp_path, policy(body + "        }\n"), table)
    found = [(d.code, d.span.line, d.span.column, d.message) for d in result.errors]
    assert [f[:3] for f in found] == [("E030", 2, 30), ("E030", 2, 34)], found
    assert found[0][3].startswith("Download Min Mbps: 0 Mbps makes a rate of 0 bit/s")
    assert found[1][3].startswith("Download Max Mbps: 0.000001 Mbps makes a ceil of 1 bit/s")
    assert result.errors[0].notes[0].span.line == 4  # the statement
    body = body.replace('"\n', '" rate 1mbit ceil 10mbit\n', 1)
    fixed = build(tmp_path, policy(body + "        }\n"), table)
    assert not fixed.errors, render(fixed.diagnostics, fixed.sources)


def test_a_utf16_table_is_said_to_be_utf16(tmp_path: Path) -> None:
    """Found by a tester: Excel's 'Unicode text' (UTF-16) was 'not UTF-8 text (byte 0xff)'.
    It is named, with the way out."""
    (tmp_path / "subs.csv").write_bytes((HEADER + ROWS).encode("utf-16"))
    path = tmp_path / "p.tcp"
    body = '        class north rate 100mbit {\n            subscribers from "subs.csv"\n'
    path.write_text(policy(body + "        }\n"), encoding="utf-8")
    result = analyse(str(path))
    (found,) = result.errors
    assert found.code == "E022" and Path(found.span.file).name == "subs.csv"
    assert "this file is UTF-16 text" in found.message and "'CSV UTF-8'" in found.message
    # a policy in UTF-16 is told to be saved as UTF-8, with no word of Excel (found by a tester)
    path.write_bytes(policy(body + "        }\n").encode("utf-16"))
    (found,) = analyse(str(path)).errors
    assert found.code == "E022" and "policy files as UTF-8" in found.message
    assert "Excel" not in found.message, found.message


def test_rates_of_zero_past_fifty_are_counted(tmp_path: Path) -> None:
    """Found by a review: E030 for a 0 Mbps cell had no cap (300 rows of best-effort plans,
    300 errors). The first 50 are shown, the rest counted (E038), as a table's own are."""
    table = HEADER + "".join(f"{i},a,{i},d,north,,100.64.1.{i},,0,1,10,5,\n" for i in range(1, 61))
    body = '        class north rate 100mbit {\n            subscribers from "subs.csv"\n'
    result = build(tmp_path, policy(body + "        }\n"), table)
    codes = [d.code for d in result.errors]
    assert codes.count("E030") == 50 and codes.count("E038") == 1, codes
    (more,) = [d for d in result.errors if d.code == "E038"]
    assert more.hidden == 10 and "10 more rate(s) of this statement" in more.message
    assert summary(result.diagnostics).startswith("60 errors (10 not shown)")


def test_w378_only_where_the_written_class_renames_a_circuit(tmp_path: Path) -> None:
    """W378 once, where a written class takes the name the tree's first table's circuit
    would have; a later table's circuits are digested whatever the written classes, so its
    circuit of that id gets none (found by a review: a W378 per table)."""
    (tmp_path / "more.csv").write_text(HEADER + _row("1", "100.64.1.1"), encoding="utf-8")
    body = TWO_TABLES + "        class c1 rate 1mbit match dport 5001\n"
    for first, expected in (("2", []), ("1", [("W378", "p.tcp", 7)])):
        result = build(tmp_path, policy(body), HEADER + _row(first, "100.64.0.1"))
        found = [(d.code, Path(d.span.file).name, d.span.line) for d in result.diagnostics]
        assert [f for f in found if f[0] == "W378"] == expected
