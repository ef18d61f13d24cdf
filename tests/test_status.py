"""``tcdsl status``: the kernel's counters parsed, joined with a policy by class name, rendered.

The parsers are checked on output captured from real ``tc`` (``tests/ops_data/``): the host's
htb under load (``host-htb-busy``: drops, backlog, borrowing, negative tokens) and the Debian
6.1 guest's htb with fq_codel, cake and sfq leaves, a cake root and an fq_codel root (the host
has none of those three). The kernel tests apply a policy in a network namespace, send UDP
packets the policy puts in known classes, and run ``tcdsl status`` in the namespace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as hs

from tcdsl import ir
from tcdsl.cli import cli
from tcdsl.driver import compile_policy
from tcdsl.frontend.tables import circuit_name
from tcdsl.ops import status as st
from tcdsl.ops.counters import (
    ClassCounters,
    CountersError,
    DeviceCounters,
    HtbStats,
    Stats,
    device_counters,
    parse_class_stats,
    parse_qdisc_json,
)

DATA = Path(__file__).parent / "ops_data"
TC = shutil.which("tc")


def capture(stem: str, at: float = 0.0, device: str = "d0") -> DeviceCounters:
    """A captured reading: ``<stem>.qdisc.json`` and ``<stem>.class.txt`` (empty if absent)."""
    classes = DATA / f"{stem}.class.txt"
    text = classes.read_text(encoding="utf-8") if classes.exists() else ""
    return device_counters(device, at, (DATA / f"{stem}.qdisc.json").read_text("utf-8"), text)


# ==== parsing what tc prints ===================================================================


def test_htb_class_counters_under_load() -> None:
    """The host's tc under load: drops, backlog, borrowing and tokens in debt."""
    classes, flows = parse_class_stats((DATA / "host-htb-busy.class.txt").read_text("utf-8"))
    assert flows == {}
    by_id = {c.classid: c for c in classes}
    assert set(by_id) == {"1:1", "1:10", "1:20"}
    busy = by_id["1:20"]
    assert busy == ClassCounters(
        kind="htb",
        classid="1:20",
        parent="1:1",
        leaf="20:",
        rate=1_000_000,
        ceil=5_000_000,
        stats=Stats(34120, 42, 2937, 31, 0, 32302, 31),
        htb=HtbStats(lended=18, borrowed=24, giants=0, tokens=-74152, ctokens=-25752),
    )
    assert by_id["1:1"].parent == "root" and by_id["1:10"].leaf is None


def test_qdisc_counters_and_htb_direct_packets() -> None:
    qdiscs = parse_qdisc_json((DATA / "host-htb-busy.qdisc.json").read_text("utf-8"))
    root, fifo = qdiscs
    assert (root.kind, root.handle, root.parent) == ("htb", "1:", "root")
    assert root.stats == Stats(36876, 60, 2937, 42, 0, 34386, 33)
    assert root.xstats == (("direct_packets_stat", 0),)
    assert (fifo.kind, fifo.parent, fifo.stats.drops) == ("pfifo", "1:20", 2937)


def test_fq_codel_cake_and_sfq_leaves() -> None:
    """Flow statistics as the guest's tc prints them; flow classes count as flows."""
    reading = capture("uml-htb-leaves")
    assert [c.classid for c in reading.classes] == ["1:1", "1:10", "1:20", "1:30"]
    fq_codel, cake, sfq = (reading.qdisc(h) for h in ("10:", "20:", "30:"))
    assert fq_codel is not None and cake is not None and sfq is not None
    assert dict(fq_codel.xstats) == {
        "maxpacket": 98,
        "drop_overlimit": 0,
        "new_flow_count": 1,
        "ecn_mark": 0,
        "new_flows_len": 1,
        "old_flows_len": 0,
    }
    assert fq_codel.flows == 1 and cake.flows == 1 and sfq.flows == 0
    assert dict(cake.xstats)["capacity_estimate"] == 375000
    assert len(cake.tins) == 3  # diffserv3
    best_effort = dict(cake.tins[1])
    assert best_effort["sent_packets"] == 4 and best_effort["sparse_flows"] == 1
    assert cake.stats.packets == 4 and sfq.stats.packets == 3


def test_classless_roots() -> None:
    cake = capture("uml-cake-root")
    assert cake.classes == () and len(cake.qdiscs) == 1
    (root,) = cake.qdiscs
    assert (root.kind, root.parent, root.flows, len(root.tins)) == ("cake", "root", 1, 4)
    fq_codel = capture("uml-fq_codel-root")
    assert fq_codel.qdiscs[0].stats.packets == 4 and fq_codel.qdiscs[0].flows == 0


def test_unreadable_qdisc_output() -> None:
    assert parse_qdisc_json("") == ()
    with pytest.raises(CountersError, match="not JSON"):
        parse_qdisc_json("qdisc htb 1: root")


def _sections(text: str) -> dict[str, str]:
    """The ``==NAME`` sections of capture-guest.sh's output, by NAME."""
    parts = re.split(r"^==(\S+)\n", text, flags=re.MULTILINE)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {name: body.strip("\n") + "\n" for name, body in pairs}


def test_the_guest_prints_what_the_captures_hold() -> None:
    """Run capture-guest.sh in the Debian 6.1 guest again: what its tc prints today parses to
    the same kinds, flows, tins and packet counts as the captures."""
    from tcdsl.kernels import uml

    reason = uml.available()
    if reason is not None:
        pytest.skip(reason)
    script = (DATA / "capture-guest.sh").read_text(encoding="utf-8")
    (result,) = uml.run_cases([uml.Case("status-capture", script)])
    assert result.exit_code == 0, result.stderr
    fresh = _sections(result.stdout)
    assert set(fresh) == {p.name for p in DATA.glob("uml-*")}

    def summary(reading: DeviceCounters) -> object:
        qdiscs = [(q.kind, q.handle, q.parent, q.flows, len(q.tins), q.stats.packets)
                  for q in reading.qdiscs]  # fmt: skip
        classes = [(c.classid, c.leaf, c.stats.packets) for c in reading.classes]
        keys = [tuple(k for k, _ in q.xstats) for q in reading.qdiscs]
        return qdiscs, classes, keys

    for stem in ("uml-htb-leaves", "uml-cake-root", "uml-fq_codel-root"):
        classes = fresh.get(f"{stem}.class.txt", "")
        now = device_counters("d0", 0.0, fresh[f"{stem}.qdisc.json"], classes)
        assert summary(now) == summary(capture(stem)), stem


# ==== joining and rendering (captured readings) ================================================

LEAVES_POLICY = """\
interface d0 htb rate 10mbit default sorted {
    class fast rate 4mbit ceil 10mbit {
        match dst 10.7.0.2
        fq_codel
    }
    class shaped rate 3mbit ceil 10mbit {
        match dst 10.7.0.3
        cake bandwidth 3mbit
    }
    class sorted rate 1mbit ceil 2mbit {
        sfq perturb 10
    }
    class guest rate 1mbit
}
"""


def _policy(tmp_path: Path, text: str, name: str = "policy.tcp") -> ir.Policy:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path))
    assert result.policy is not None, result.diagnostics
    return result.policy


def _scaled(reading: DeviceCounters, at: float, factor: float) -> DeviceCounters:
    """``reading`` at time ``at`` with every byte counter times ``factor``."""

    def scale(stats: Stats) -> Stats:
        return dataclasses.replace(stats, bytes=int(stats.bytes * factor))

    return dataclasses.replace(
        reading,
        at=at,
        qdiscs=tuple(dataclasses.replace(q, stats=scale(q.stats)) for q in reading.qdiscs),
        classes=tuple(dataclasses.replace(c, stats=scale(c.stats)) for c in reading.classes),
    )


@pytest.fixture
def leaves_report(tmp_path: Path) -> st.Report:
    policy = _policy(tmp_path, LEAVES_POLICY)
    now = capture("uml-htb-leaves", at=12.0)
    first, previous = _scaled(now, 2.0, 0), _scaled(now, 10.0, 0.5)
    return st.build(policy, ["d0"], {"d0": first}, {"d0": previous}, {"d0": now}, "p.tcp")


def test_classes_by_name_with_rates(leaves_report: st.Report) -> None:
    (tree,) = leaves_report.trees
    rows = {row.name: row for row in tree.classes}
    assert list(rows) == [st.LINK, "fast", "shaped", "sorted", "guest"]
    fast = rows["fast"]
    assert (fast.classid, fast.parent, fast.depth, fast.line) == ("1:10", st.LINK, 1, 2)
    assert (fast.rate, fast.ceil, fast.state) == (4_000_000, 10_000_000, "ok")
    # 490 bytes in all, 245 of them in the last 2 s, all of them in 10 s
    assert (fast.rate_now, fast.rate_avg) == (980, 392)
    assert fast.leaf is not None and fast.leaf.kind == "fq_codel"
    assert rows["shaped"].leaf is not None and rows["shaped"].leaf.kind == "cake"
    guest = rows["guest"]
    assert guest.state == "not applied" and guest.counters is None and guest.rate_now is None
    assert (leaves_report.elapsed, leaves_report.interval) == (10.0, 2.0)


def test_json_is_deterministic_and_complete(leaves_report: st.Report) -> None:
    text = st.render_json(leaves_report)
    assert text == st.render_json(leaves_report) and text.count("\n") == 1
    data = json.loads(text)
    assert list(data) == sorted(data)
    (tree,) = data["trees"]
    assert (tree["device"], tree["kind"], tree["handle"], tree["state"]) == (
        "d0",
        "htb",
        "1:",
        "ok",
    )
    fast = next(c for c in tree["classes"] if c["name"] == "fast")
    assert fast["packets"] == 5 and fast["htb"]["lended"] == 5
    assert fast["leaf"]["xstats"]["new_flow_count"] == 1 and fast["leaf"]["flows"] == 1
    shaped = next(c for c in tree["classes"] if c["name"] == "shaped")
    assert shaped["leaf"]["tins"][1]["sent_bytes"] == 392
    guest = next(c for c in tree["classes"] if c["name"] == "guest")
    assert guest["state"] == "not applied" and guest["packets"] is None


def test_text_shows_names_bars_and_flow_statistics(leaves_report: st.Report) -> None:
    text = st.render_text(leaves_report)
    assert text.isascii() and max(map(len, text.splitlines())) <= st.WIDTH
    lines = {line.split("|")[0].strip(): line for line in text.splitlines() if "|" in line}
    assert "[" in lines["fast"] and "fq_codel flows 1 new 1 old 0 ecn 0" in lines["fast"]
    assert "cake sparse 1 bulk 0 unresp 0 ecn 0" in lines["shaped"]
    assert "sfq flows 0" in lines["sorted"]
    assert "not applied" in lines["guest"]


def _status_tree(*rows: tuple[str, int, int | None]) -> st.TreeStatus:
    """A tree of classes given as (name, depth, rate now), in pre-order; ids 1:1, 1:2, ..."""
    classes = tuple(
        st.ClassStatus(name=name, classid=f"1:{i + 1:x}", parent=None, depth=depth, file=None,
                       line=None, rate=None, ceil=None, state="ok", counters=None,
                       rate_now=now, rate_avg=None, leaf=None)
        for i, (name, depth, now) in enumerate(rows)
    )  # fmt: skip
    return st.TreeStatus("d0", "d0", "htb", "1:", "ok", None, None, None, classes)


SITES = _status_tree(
    ("link", 0, 900), ("north", 1, 500), ("c1", 2, 100), ("c2", 2, 400),
    ("south", 1, 400), ("c3", 2, 390), ("x", 3, 390), ("unknown", 1, 0),
)  # fmt: skip


def _shown(report: st.Report) -> list[list[str]]:
    return [[row.name for row in tree.classes] for tree in report.trees]


def test_select_shows_the_matched_classes_below_and_above() -> None:
    report = st.Report("p.tcp", 2.0, 1.0, (SITES,))
    assert _shown(st.select(report, ["c3"])) == [["link", "south", "c3", "x"]]
    assert _shown(st.select(report, ["north"])) == [["link", "north", "c1", "c2"]]
    assert _shown(st.select(report, ["c[13]"])) == [["link", "north", "c1", "south", "c3", "x"]]
    assert _shown(st.select(report, ["1:8"])) == [["link", "unknown"]]  # by class id
    assert st.select(report, ["c3"]).trees[0].hidden == 4
    assert st.select(report) is report
    other = dataclasses.replace(SITES, label="d1", classes=SITES.classes[:2])
    both = st.Report("p.tcp", 2.0, 1.0, (SITES, other))
    assert _shown(st.select(both, ["c*"])) == [["link", "north", "c1", "c2", "south", "c3", "x"]]
    with pytest.raises(st.NoSuchClass, match="'c9'"):
        st.select(both, ["c*", "c9"])


def test_a_circuit_id_shows_its_circuits_class() -> None:
    """Found by a tester: support calls name a subscriber by the circuit id of its table
    ('1001', 'A-1'), whose class is 'c1001' or 'A_1_' and a digest: '--class' found only the
    class name. A pattern with wildcards stays a pattern of names."""
    a1 = circuit_name("A-1")
    assert a1.startswith("A_1_")
    # (a second table's circuit 1001, and its 201, carry a digest of their table and id)
    rows = (("c1001", 2, 1), (a1, 2, 1), ("c1001_cdd600d7f1", 2, 1), ("c201_0123456789", 2, 1))
    tree = _status_tree(("link", 0, 9), ("site", 1, 9), *rows, ("c10011", 2, 1))
    report = st.Report("p.tcp", 2.0, 1.0, (tree,))
    assert _shown(st.select(report, ["1001"])) == [["link", "site", "c1001", "c1001_cdd600d7f1"]]
    assert _shown(st.select(report, ["A-1"])) == [["link", "site", a1]]
    assert _shown(st.select(report, ["201"])) == [["link", "site", "c201_0123456789"]]
    with pytest.raises(st.NoSuchClass, match=re.escape("'100[1]'")):
        st.select(report, ["100[1]"])


def test_an_address_shows_the_classes_whose_own_lines_take_it() -> None:
    """Found by a tester: '--class ADDRESS' became the names of the classes whose lines take
    it, so a class of the same name in another tree (another table's circuit of the same id)
    was shown too, and a site whose line takes a whole /10 showed every subscriber below it.
    Now the classes are picked in their own tree, alone, with the classes above them."""
    text = (
        "interface veth0 {\n"
        "    upload htb rate 100mbit default other {\n"
        "        class site rate 50mbit match dst 10.0.0.0/8 {\n"
        "            htb rate 50mbit default b {\n"
        "                class a rate 10mbit match dst 10.0.0.1\n"
        "                class b rate 10mbit match dst 10.0.0.2\n"
        "            }\n"
        "        }\n"
        "        class other rate 1mbit ceil 100mbit\n"
        "    }\n"
        "    download htb rate 100mbit default other {\n"
        "        class a rate 10mbit match dst 10.9.9.9\n"
        "        class other rate 1mbit ceil 100mbit\n"
        "    }\n"
        "}\n"
    )
    result = compile_policy("p.tcp", "json", loader=lambda _path: text)
    assert result.policy is not None
    upload, download = (i.label for i in result.policy.interfaces)
    named, picks = st.by_address(result.policy, ["10.0.0.1", "other"])
    assert named == ["other"]
    assert picks == {upload: frozenset({"site", "a"})}
    tree = _status_tree(("link", 0, 0), ("site", 1, 0), ("a", 2, 0), ("b", 2, 0), ("other", 1, 0))
    up = dataclasses.replace(tree, label=upload)
    down = dataclasses.replace(
        _status_tree(("link", 0, 0), ("a", 1, 0), ("other", 1, 0)), label=download
    )
    report = st.Report("p.tcp", 2.0, 1.0, (up, down))
    _, only = st.by_address(result.policy, ["10.0.0.1"])
    assert _shown(st.select(report, (), None, only)) == [["link", "site", "a"]]
    assert _shown(st.select(report, ["other"], None, only)) == [
        ["link", "site", "a", "other"],
        ["link", "other"],
    ]
    with pytest.raises(st.NoSuchClass, match="no class's match line takes"):
        st.by_address(result.policy, ["192.0.2.1"])


def test_select_top_keeps_the_busiest_leaves_of_each_tree() -> None:
    report = st.Report("p.tcp", 2.0, 1.0, (SITES,))
    # c3 (390) is no leaf: x below it is
    assert _shown(st.select(report, top=2)) == [["link", "north", "c2", "south", "c3", "x"]]
    assert _shown(st.select(report, ["north"], top=1)) == [["link", "north", "c2"]]
    tied = _status_tree(("link", 0, 0), ("a", 1, None), ("b", 1, 0), ("c", 1, 0))
    # no rate measured is below 0; ties keep the tree's order
    assert _shown(st.select(st.Report(None, 1.0, 1.0, (tied,)), top=1)) == [["link", "b"]]


def test_selected_report_says_how_many_classes_it_leaves_out(leaves_report: st.Report) -> None:
    chosen = st.select(leaves_report, ["fast"])
    assert _shown(chosen) == [[st.LINK, "fast"]]
    assert "(2 of 5 classes shown)" in st.render_text(chosen).splitlines()[1]
    assert "classes shown" not in st.render_text(leaves_report)
    (tree,) = json.loads(st.render_json(chosen))["trees"]
    assert tree["hidden"] == 3 and [c["name"] for c in tree["classes"]] == [st.LINK, "fast"]
    assert json.loads(st.render_json(leaves_report))["trees"][0]["hidden"] == 0


_CELL = hs.text(alphabet=[chr(c) for c in range(32, 127)], max_size=8)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    title=_CELL,
    rows=hs.lists(hs.lists(_CELL, min_size=len(st.COLUMNS), max_size=len(st.COLUMNS)), max_size=5),
    width=hs.integers(min_value=20, max_value=260),
    unicode=hs.booleans(),
)
def test_tables_drawn_directly_are_what_rich_draws(
    title: str, rows: list[list[str]], width: int, unicode: bool
) -> None:
    """Large tables skip rich (90 us a cell): where they fit, they must come out the same."""
    plain = st._plain_table(title, rows, width, unicode)
    if plain is not None:
        assert plain == st._rich_table(title, rows, width, unicode)


def test_tables_that_fit_are_drawn_directly(leaves_report: st.Report) -> None:
    (tree,) = leaves_report.trees
    rows = [st._cells(row, "p.tcp") for row in tree.classes]
    for unicode in (False, True):
        plain = st._plain_table(st._tree_title(tree), rows, st.WIDTH, unicode)
        assert plain is not None and plain in st.render_text(leaves_report, unicode=unicode)
    # too narrow: rich folds the cells
    assert st._plain_table(st._tree_title(tree), rows, 80, False) is None
    assert max(map(len, st.render_text(leaves_report, 80).splitlines())) <= 80


def test_bar_marks_the_rate_and_fills_to_the_rate_now() -> None:
    row = st.ClassStatus(
        "a", "1:10", None, 0, None, None, 2_000_000, 8_000_000, "ok", None, 4_000_000, None, None
    )
    assert st.bar(row, 8) == "[####....]"  # the rate's mark (at 2/8) is under the fill
    slow = dataclasses.replace(row, rate_now=0)
    assert st.bar(slow, 8) == "[..|.....]"
    over = dataclasses.replace(row, rate_now=9_000_000)
    assert st.bar(over, 8) == "[########]"
    assert st.bar(dataclasses.replace(row, rate=None, ceil=None), 8) == ""


def test_measured_values_in_three_digits() -> None:
    counts = [0, 9999, 10_000, 12_345, 999_999, 3_740_000, 12_345_678_901, -74_152]
    assert [st.approx_count(n) for n in counts] == [
        "0", "9999", "10k", "12.3k", "1M", "3.74M", "12.3G", "-74.2k",
    ]  # fmt: skip
    rates = [0, 980, 1000, 1_360_000, 999_999, 2_500_000_000_000]
    assert [st.approx_rate(r) for r in rates] == [
        "0bit", "980bit", "1kbit", "1.36mbit", "1mbit", "2500gbit",
    ]  # fmt: skip
    assert st.approx_rate(None) == st.approx_count(None) == "-"


def test_help_has_examples() -> None:
    result = CliRunner().invoke(cli, ["status", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.stdout
    assert "tcdsl status -i eth0 --watch 2s" in result.stdout
    assert "--format prometheus" in result.stdout


# ==== Prometheus ===============================================================================

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (-?[0-9]+(?:\.[0-9]+)?)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Samples:
    """Parse the text exposition format strictly: every family has one ``# HELP`` then one
    ``# TYPE`` before its samples, which are contiguous; counters end in ``_total``; label
    values are quoted and escaped."""
    assert text.endswith("\n")
    helped: set[str] = set()
    typed: dict[str, str] = {}
    current = ""
    out: Samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helped, f"second HELP for {name}"
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name in helped and name not in typed, line
            assert kind in ("counter", "gauge")
            assert kind == "gauge" or name.endswith("_total"), line
            typed[name], current = kind, name
        else:
            m = _SAMPLE.fullmatch(line)
            assert m is not None, f"not a sample: {line!r}"
            name, labels_text, value = m.groups()
            assert name == current, f"{name} outside its family (after {current})"
            pairs = list(_LABEL.finditer(labels_text or ""))
            assert ",".join(p.group(0) for p in pairs) == (labels_text or ""), line
            labels = frozenset(
                (p.group(1), re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], p.group(2)))
                for p in pairs
            )
            assert (name, labels) not in out, f"duplicate sample {line}"
            out[(name, labels)] = float(value)
    return out


def sample(samples: Samples, metric: str, **labels: str) -> float:
    """The one value of ``metric`` whose labels include ``labels``."""
    found = [v for (name, ls), v in samples.items() if name == metric and set(labels.items()) <= ls]
    assert len(found) == 1, f"{metric} {labels}: {found}"
    return found[0]


def test_prometheus_format(leaves_report: st.Report) -> None:
    samples = parse_prometheus(st.render_prometheus(leaves_report))
    common = {"interface": "d0", "policy": "p.tcp"}
    assert sample(samples, "tcdsl_class_packets_total", **common, **{"class": "fast"}) == 5
    assert sample(samples, "tcdsl_class_bytes_total", classid="1:20") == 392
    assert sample(samples, "tcdsl_class_rate_bits_per_second", **{"class": "fast"}) == 4e6
    assert sample(samples, "tcdsl_class_throughput_bits_per_second", classid="1:10") == 980
    assert sample(samples, "tcdsl_class_applied", **{"class": "guest"}) == 0
    assert sample(samples, "tcdsl_class_applied", **{"class": "fast"}) == 1
    assert not [
        k for k in samples if k[0] == "tcdsl_class_packets_total" and ("class", "guest") in k[1]
    ]
    assert sample(samples, "tcdsl_leaf_flows", kind="fq_codel") == 1
    assert sample(samples, "tcdsl_leaf_stat", kind="fq_codel", stat="new_flow_count") == 1
    assert sample(samples, "tcdsl_leaf_tin_stat", tin="1", stat="sent_packets") == 4


def test_prometheus_escapes_label_values() -> None:
    odd = 'we"ird\\name\nx'
    reading = capture("host-htb-busy", at=1.0)
    report = st.build(None, ["d0"], {"d0": reading}, {"d0": reading}, {"d0": reading}, odd)
    text = st.render_prometheus(report)
    assert 'policy="we\\"ird\\\\name\\nx"' in text
    samples = parse_prometheus(text)
    assert sample(samples, "tcdsl_class_drops_total", classid="1:20", policy=odd) == 2937


def test_devices_of_a_policy(tmp_path: Path) -> None:
    """A download's tree is on its IFB; -i takes the interface or the device."""
    policy = _policy(
        tmp_path, (Path(__file__).parent.parent / "policies" / "home-ifb.tcp").read_text()
    )
    assert st.devices_of(policy) == ["eth0", "ifb4eth0"]
    assert st.devices_of(policy, ["eth0"]) == ["eth0", "ifb4eth0"]
    assert st.devices_of(policy, ["ifb4eth0"]) == ["ifb4eth0"]


# ==== the kernel's tree, without a policy ======================================================


def test_kernel_tree_by_tc_ids() -> None:
    first = capture("host-htb-busy", at=0.0)
    report = st.build(None, ["d0"], {"d0": first}, {"d0": first}, {"d0": first})
    (tree,) = report.trees
    assert [(r.name, r.depth, r.parent) for r in tree.classes] == [
        ("1:1", 0, None),
        ("1:10", 1, "1:1"),
        ("1:20", 1, "1:1"),
    ]
    assert tree.classes[2].rate == 1_000_000 and tree.classes[2].rate_now is None


# ==== the command, without a kernel to change ==================================================

needs_tc = pytest.mark.skipif(TC is None, reason="needs tc (iproute2)")
NO_DEVICE = "tcdslnodev0"


@needs_tc
def test_missing_device_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "gone.tcp"
    path.write_text(f"interface {NO_DEVICE} htb rate 10mbit {{\n    class a rate 1mbit\n}}\n")
    result = CliRunner().invoke(cli, ["status", str(path), "--interval", "0.01"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"{path}:1:11: error: device '{NO_DEVICE}' does not exist")
    assert "[E602]" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


@needs_tc
def test_missing_device_without_a_policy() -> None:
    result = CliRunner().invoke(cli, ["status", "-i", NO_DEVICE, "--interval", "0.01"])
    assert result.exit_code == 1
    assert result.stderr == f"tcdsl: error: device '{NO_DEVICE}' does not exist [E602]\n"


@needs_tc
def test_watch_redraws_on_a_terminal() -> None:
    """On a terminal (a pseudo-terminal made here) each sample clears the screen first and the
    table has box lines; without one (every other test) it is plain ASCII."""
    import pty

    ours, theirs = pty.openpty()
    main = [sys.executable, "-c", "from tcdsl.cli import main; main()"]
    env = {**os.environ, "COLUMNS": "120", "PYTHONIOENCODING": "utf-8"}
    args = ["status", "-i", "lo", "--watch", "0.05", "--count", "2"]
    with subprocess.Popen([*main, *args], stdout=theirs, stderr=subprocess.PIPE, env=env) as proc:
        os.close(theirs)
        chunks = []
        while True:
            try:
                chunk = os.read(ours, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(ours)
        assert proc.wait(timeout=60) == 0
    out = b"".join(chunks).decode("utf-8")
    assert out.count("\x1b[2J") == 2 and out.count("lo: noqueue") == 2
    assert "\u2500" in out  # a box line


def test_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a state folder of its own: the host's may hold a policy 'p', of any namespace)
    monkeypatch.setenv("TCDSL_STATE_DIR", str(tmp_path / "state"))
    assert CliRunner().invoke(cli, ["status"]).exit_code == 2
    path = tmp_path / "p.tcp"
    path.write_text("interface eth0 htb rate 10mbit {\n    class a rate 1mbit\n}\n")
    other = CliRunner().invoke(cli, ["status", str(path), "-i", "eth1"])
    assert other.exit_code == 2 and "no tree on 'eth1'" in other.stderr
    for bad in ("0", "-1", "fast"):
        assert CliRunner().invoke(cli, ["status", "-i", "lo", "--interval", bad]).exit_code == 2
    assert CliRunner().invoke(cli, ["status", "-i", "lo", "--top", "0"]).exit_code == 2


def test_ctrl_c_during_watch_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (KeyboardInterrupt, raised here without a signal) ends --watch with exit 0."""

    def interrupted(*args: object, **kwargs: object) -> Iterator[object]:
        raise KeyboardInterrupt
        yield  # a generator, as watch is

    monkeypatch.setattr(st, "watch", interrupted)
    result = CliRunner().invoke(cli, ["status", "-i", "lo", "--watch", "1s"])
    assert result.exit_code == 0 and result.output == ""


def test_watch_takes_one_more_reading_than_samples() -> None:
    readings: list[int] = []
    slept: list[float] = []

    def read(devices: Sequence[str]) -> dict[str, DeviceCounters]:
        readings.append(len(readings))
        return {"d0": capture("host-htb-busy", at=float(len(readings)))}

    got = list(st.watch(["d0"], 0.5, 3, read=read, sleep=slept.append))
    assert len(got) == 3 and len(readings) == 4 and slept == [0.5] * 3
    first, previous, now = got[2]
    assert (first["d0"].at, previous["d0"].at, now["d0"].at) == (1.0, 3.0, 4.0)


# ==== on the host's kernel =====================================================================

kernel = pytest.mark.skipif(
    os.geteuid() != 0 or TC is None or shutil.which("ip") is None,
    reason="needs root, ip and tc (network namespaces)",
)

POLICY = """\
interface eth0 htb rate 10mbit default bulk {
    class voip prio 0 rate 3mbit ceil 10mbit match dport 5004
    class web rate 2mbit ceil 8mbit {
        match dport 80
        pfifo limit 30
    }
    class bulk rate 1mbit ceil 5mbit
}
"""
SENT = {"voip": (5004, 7), "web": (80, 4), "bulk": (9, 3)}
"""Class -> (UDP port, packets sent)."""


def _send(ns: str, port: int, count: int) -> None:
    from tests.test_apply import SENDER, run

    run(["ip", "netns", "exec", ns, sys.executable, "-c", SENDER, str(count), f"{port},0"])


@contextmanager
def _shaped_namespace(tmp: Path) -> Iterator[tuple[str, Path]]:
    """A namespace whose eth0 has POLICY applied and the packets of SENT sent through it:
    (namespace, policy path); deleted afterwards."""
    from tests.test_apply import _netns_name, apply_for_traffic, run

    path = tmp / "policy.tcp"
    path.write_text(POLICY, encoding="utf-8")
    result = compile_policy(str(path))
    assert result.policy is not None
    ns = _netns_name()
    run(["ip", "netns", "add", ns])
    try:
        apply_for_traffic(ns, result, tmp)
        for port, count in SENT.values():
            _send(ns, port, count)
        yield ns, path
    finally:
        run(["ip", "netns", "del", ns], check=False)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One shaped namespace for the tests that only read it."""
    with _shaped_namespace(tmp_path_factory.mktemp("status")) as found:
        yield found


def tcdsl_in(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the tcdsl command line in network namespace ``ns`` (not a terminal)."""
    main = [sys.executable, "-c", "from tcdsl.cli import main; main()"]
    env = {**os.environ, "COLUMNS": "80", "LANG": "C", "LC_ALL": "C"}
    return subprocess.run(
        ["ip", "netns", "exec", ns, *main, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def _classes(data: dict[str, object]) -> dict[str, dict[str, object]]:
    trees = data["trees"]
    assert isinstance(trees, list)
    return {c["name"]: c for t in trees for c in t["classes"]}


@kernel
def test_packets_by_class_name(shaped: tuple[str, Path]) -> None:
    ns, path = shaped
    out = _ok(tcdsl_in(ns, "status", str(path), "--format", "json", "--count", "1",
                       "--interval", "0.2"))  # fmt: skip
    (line,) = out.splitlines()
    classes = _classes(json.loads(line))
    assert classes["voip"]["packets"] == 7 and classes["web"]["packets"] == 4
    assert isinstance(classes["bulk"]["packets"], int) and classes["bulk"]["packets"] >= 3
    assert classes["web"]["leaf"]["kind"] == "pfifo"  # type: ignore[index]
    assert classes["voip"]["htb"]["lended"] == 7  # type: ignore[index]
    assert classes["voip"]["bytes"] == 7 * (14 + 20 + 8 + 5)  # Ethernet, IP, UDP, "tcdsl"
    assert {c["state"] for c in classes.values()} == {"ok"}


@kernel
def test_classes_chosen_by_name_and_by_load(shaped: tuple[str, Path]) -> None:
    ns, path = shaped
    args = ("status", str(path), "--format", "json", "--interval", "0.1")
    (line,) = _ok(tcdsl_in(ns, *args, "--class", "web")).splitlines()
    data = json.loads(line)
    assert list(_classes(data)) == [st.LINK, "web"] and data["trees"][0]["hidden"] == 2
    # no packets between the readings: the bytes decide (voip 7 packets, web 4)
    busiest = tcdsl_in(ns, *args, "--class", "w*", "--class", "voip", "--top", "1")
    (line,) = _ok(busiest).splitlines()
    assert list(_classes(json.loads(line))) == [st.LINK, "voip"]
    unknown = tcdsl_in(ns, *args, "--class", "vo1p")
    assert unknown.returncode == 2 and "no class shown here is named 'vo1p'" in unknown.stderr
    assert unknown.stdout == "" and "Traceback" not in unknown.stderr


@kernel
def test_rate_now_measures_what_passed_between_the_readings(tmp_path: Path) -> None:
    """Packets sent between the two readings of a sample give its rate now."""
    with _shaped_namespace(tmp_path) as (ns, path):
        _rate_now(ns, path)


def _rate_now(ns: str, path: Path) -> None:
    policy = compile_policy(str(path)).policy
    assert policy is not None

    def read(devices: Sequence[str]) -> dict[str, DeviceCounters]:
        return st.read_all(devices, ns)

    def sleep(seconds: float) -> None:
        _send(ns, 5004, 10)

    ((first, previous, now),) = st.watch(["eth0"], 0.1, 1, read=read, sleep=sleep)
    report = st.build(policy, ["eth0"], first, previous, now)
    rows = {r.name: r for r in report.trees[0].classes}
    seconds = now["eth0"].at - previous["eth0"].at
    expected = 10 * 47 * 8 / seconds
    assert rows["voip"].rate_now == pytest.approx(expected, rel=0.01)
    assert rows["web"].rate_now == 0 and rows["voip"].rate_avg == rows["voip"].rate_now


@kernel
def test_prometheus_output(shaped: tuple[str, Path], tmp_path: Path) -> None:
    ns, path = shaped
    out = _ok(tcdsl_in(ns, "status", str(path), "--format", "prometheus", "--interval", "0.1"))
    samples = parse_prometheus(out)
    for name, (_, count) in SENT.items():
        labels = {"class": name, "interface": "eth0", "policy": str(path)}
        got = sample(samples, "tcdsl_class_packets_total", **labels)
        assert got == count or (name == "bulk" and got > count)
    assert sample(samples, "tcdsl_class_ceil_bits_per_second", **{"class": "web"}) == 8e6
    target = tmp_path / "tcdsl.prom"
    _ok(tcdsl_in(ns, "status", str(path), "--format", "prometheus", "--watch", "0.1",
                 "--count", "2", "-o", str(target)))  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tcdsl.prom"]
    assert sample(parse_prometheus(target.read_text()), "tcdsl_class_packets_total",
                  **{"class": "voip"}) >= 7  # fmt: skip


@kernel
def test_text_table(shaped: tuple[str, Path]) -> None:
    ns, path = shaped
    out = _ok(tcdsl_in(ns, "status", str(path), "--interval", "0.1"))
    assert out.isascii()
    rows = {line.split("|")[0].strip(): line for line in out.splitlines() if "|" in line}
    for name in ("voip", "web", "bulk", st.LINK):
        assert re.search(r"\[[#|.]{10}\]", rows[name]), rows[name]
    assert "3mbit/10mbit" in rows["voip"] and "pfifo" in rows["web"]
    assert out.startswith(f"tcdsl status: {path}, over 0.1s")


@kernel
def test_json_watch_prints_a_line_per_sample(shaped: tuple[str, Path]) -> None:
    ns, _ = shaped
    out = _ok(tcdsl_in(ns, "status", "-i", "eth0", "--format", "json", "--watch", "0.1",
                       "--count", "3"))  # fmt: skip
    samples = [json.loads(line) for line in out.splitlines()]
    assert len(samples) == 3
    elapsed = [s["elapsed"] for s in samples]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0


@kernel
def test_kernel_tree_without_a_policy(shaped: tuple[str, Path]) -> None:
    ns, _ = shaped
    out = _ok(tcdsl_in(ns, "status", "-i", "eth0", "--format", "json", "--interval", "0.1"))
    classes = _classes(json.loads(out))
    assert sorted(classes) == ["1:1", "1:10", "1:20", "1:30"]
    assert classes["1:10"]["packets"] == 7 and classes["1:10"]["rate"] == 3_000_000
    text = _ok(tcdsl_in(ns, "status", "-i", "eth0", "--interval", "0.1"))
    assert "1:10" in text and "voip" not in text


@kernel
def test_not_applied_and_not_in_policy(shaped: tuple[str, Path], tmp_path: Path) -> None:
    """A class the policy has and the kernel lacks, and the reverse, are reported as such."""
    from tests.test_apply import run

    ns, _ = shaped
    more = tmp_path / "more.tcp"
    more.write_text(
        POLICY.removesuffix("}\n") + "    class guest rate 1mbit\n}\n", encoding="utf-8"
    )
    run(["tc", "-n", ns, "class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:99",
         "htb", "rate", "1mbit"])  # fmt: skip
    try:
        out = _ok(tcdsl_in(ns, "status", str(more), "--format", "json", "--interval", "0.1"))
        text = _ok(tcdsl_in(ns, "status", str(more), "--interval", "0.1"))
    finally:
        run(["tc", "-n", ns, "class", "del", "dev", "eth0", "classid", "1:99"])
    classes = _classes(json.loads(out))
    assert classes["guest"]["state"] == "not applied" and classes["guest"]["packets"] is None
    assert classes["1:99"]["state"] == "not in policy" and classes["1:99"]["packets"] == 0
    assert classes["voip"]["state"] == "ok" and classes["voip"]["packets"] == 7
    assert re.search(r"guest .*not applied", text) and "1:99 (not in policy)" in text


@kernel
def test_missing_interface_in_the_namespace(shaped: tuple[str, Path], tmp_path: Path) -> None:
    ns, _ = shaped
    other = tmp_path / "eth7.tcp"
    other.write_text(POLICY.replace("eth0", "eth7"), encoding="utf-8")
    proc = tcdsl_in(ns, "status", str(other), "--interval", "0.1")
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"{other}:1:11: error: device 'eth7' does not exist here" in proc.stderr
    assert proc.stderr.splitlines()[0].endswith("[E602]")


@kernel
def test_missing_ifb_of_a_download(shaped: tuple[str, Path], tmp_path: Path) -> None:
    """A download's IFB that is not there (the policy's script makes it): E602 at the download."""
    ns, _ = shaped
    both = tmp_path / "both.tcp"
    both.write_text(
        "interface eth0 {\n"
        "    upload htb rate 10mbit {\n        class a rate 1mbit\n    }\n"
        "    download htb rate 20mbit {\n        class b rate 1mbit\n    }\n"
        "}\n",
        encoding="utf-8",
    )
    proc = tcdsl_in(ns, "status", str(both), "--interval", "0.1")
    assert proc.returncode == 1 and proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"{both}:5:5: error: the IFB 'ifb4eth0' that shapes the download")
    assert first.endswith("apply the policy first (its script creates the IFB) [E602]")


def test_the_line_of_a_class_from_a_table_names_its_file() -> None:
    """A subscriber's class is declared at its table's row: the text table's line column
    says ``subs.csv:12`` (a bare 12 read as a line of the policy)."""
    from tcdsl.ops.status import ClassStatus, _cells

    def row(file: str) -> ClassStatus:
        return ClassStatus(
            name="c1001", classid="1:10", parent=None, depth=0, file=file, line=12,
            rate=1_000_000, ceil=None, state="ok", counters=None, rate_now=None,
            rate_avg=None, leaf=None,
        )  # fmt: skip

    assert _cells(row("/srv/isp/subs.csv"), "/srv/isp/isp.tcp")[2] == "subs.csv:12"
    assert _cells(row("/srv/isp/isp.tcp"), "/srv/isp/isp.tcp")[2] == "12"
