"""Marking as routers need it, without a kernel: where the jump sits (``from IFACE``, ``from
any``, ``from local``, ``at postrouting``), mark masks, ``tcp-flags``, ``set dscp``, u32 lines
beside the marks, and the words every backend writes for them (tests/test_marks_kernel.py runs
them on kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.allocate import deposit
from tcdsl.commands import interface_commands, nft_table_lines
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tcdsl.teach.classify import classify
from tcdsl.teach.explain import explain
from tcdsl.teach.traffic import SpecError, parse_packet
from tcdsl.verify.readback import parse_rule


def _compile(tmp_path: Path, text: str, backend: str = "shell") -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return compile_policy(str(path), backend)


def _policy(source: str, extra: str = "", web: str = "match proto tcp dport 80") -> str:
    return (
        "interface eth0 htb rate 10mbit default bulk {\n"
        f"    classify by mark {source}\n"
        f"    class web rate 5mbit {web}\n"
        f"{extra}"
        "    class bulk rate 1mbit\n"
        "}\n"
    )


def _iptables(result: Result, tool: str = "iptables") -> list[list[str]]:
    assert result.policy is not None, render(result.diagnostics, result.sources)
    return [
        list(c.args[2:]) for c in interface_commands(result.policy.interfaces[0]) if c.tool == tool
    ]


@pytest.mark.parametrize(
    ("source", "jump", "nft"),
    [
        ("from eth1", ["-I", "PREROUTING", "-i", "eth1"], ("prerouting", 'iifname "eth1" ')),
        ("from any", ["-I", "PREROUTING"], ("prerouting", "")),
        ('from "any"', ["-I", "PREROUTING", "-i", "any"], ("prerouting", 'iifname "any" ')),
        ("from local", ["-I", "OUTPUT", "-o", "eth0"], ("output", 'oifname "eth0" ')),
        ("at postrouting", ["-I", "POSTROUTING", "-o", "eth0"], ("postrouting", 'oifname "eth0" ')),
    ],
)
def test_where_the_rules_see_the_packets(
    source: str, jump: list[str], nft: tuple[str, str], tmp_path: Path
) -> None:
    """``from any`` is every input interface (no ``-i any``, which would match only a device
    named "any"); ``from local`` and ``at postrouting`` select the shaped interface as output."""
    result = _compile(tmp_path, _policy(source))
    assert _iptables(result)[1] == [*jump, "-j", "TCDSL-eth0"]
    assert result.policy is not None
    lines = list(nft_table_lines(result.policy.interfaces[0]))
    hook, where = nft
    assert f"    chain {hook} {{" in lines
    assert f"        type filter hook {hook} priority mangle; policy accept;" in lines
    rules = [line.strip() for line in lines if "meta mark set" in line]
    families = [r.removeprefix(f"{where}meta nfproto ").split()[0] for r in rules]
    assert families == ["ipv4", "ipv6", "ipv4", "ipv6"], rules
    # ip6tables jumps from the same place into a chain of the same name.
    assert _iptables(result, "ip6tables")[1] == [*jump, "-j", "TCDSL-eth0"]


def test_mark_mask_keeps_marks_and_rules_within_its_bits(tmp_path: Path) -> None:
    result = _compile(tmp_path, _policy("from eth1 mask 0xff00"))
    assert result.policy is not None
    iface = result.policy.interfaces[0]
    # One fw filter per family and mark: protocol ip at the pref, ipv6 at the pref + 0x8000.
    assert [
        (f.family, f.pref, f.mark, f.mask) for f in iface.filters if isinstance(f, ir.FwFilter)
    ] == [
        ("ipv4", 1, 0x0A00, 0xFF00),
        ("ipv6", 0x8001, 0x0A00, 0xFF00),
        ("ipv4", 1, 0x1400, 0xFF00),
        ("ipv6", 0x8001, 0x1400, 0xFF00),
    ]
    for tool in ("iptables", "ip6tables"):
        rules = _iptables(result, tool)[2:]
        assert rules[0][-8:] == [
            "-m", "mark", "--mark", "0x0/0xff00", "-j", "MARK", "--set-xmark", "0xa00/0xff00",
        ]  # fmt: skip
    out = result.output or ""
    assert "protocol ip prio 1 handle 0xa00/0xff00 fw flowid 1:10" in out
    assert "protocol ipv6 prio 32769 handle 0xa00/0xff00 fw flowid 1:10" in out
    nft = "\n".join(nft_table_lines(iface))
    assert "meta mark and 0xff00 == 0x0 meta mark set meta mark and 0xffff00ff or 0xa00" in nft


def test_deposit_counts_marks_in_the_mask_bits() -> None:
    assert [deposit(k, 0xFF00) for k in (1, 2, 20)] == [0x100, 0x200, 0x1400]
    assert [deposit(k, 0b1010) for k in (1, 2, 3)] == [0b0010, 0b1000, 0b1010]
    assert deposit(5, 0xFFFFFFFF) == 5


def test_mark_mask_errors(tmp_path: Path) -> None:
    narrow = _compile(tmp_path, _policy("from eth1 mask 0x1", "    class x rate 1mbit match all\n"))
    assert [d.code for d in narrow.errors] == ["E246"]
    outside = _compile(tmp_path, _policy("from eth1 mask 0xf0", web="mark 0x10f match all"))
    assert [d.code for d in outside.errors] == ["E246"]
    inside = _compile(tmp_path, _policy("from eth1 mask 0xf0", web="mark 0x30 match all"))
    assert inside.policy is not None and not inside.errors
    assert "handle 0x30/0xf0 fw" in (inside.output or "")
    too_wide = _compile(tmp_path, _policy("from eth1 mask 0x100000000"))
    assert [d.code for d in too_wide.errors] == ["E245"]


def test_tcp_flags_in_every_form(tmp_path: Path) -> None:
    web = "match tcp-flags syn of syn, ack, rst, fin dport 22"
    marked = _compile(tmp_path, _policy("from eth1", web=web))
    assert _iptables(marked)[2][:6] == [
        "-A",
        "TCDSL-eth0",
        "-p",
        "tcp",
        "--tcp-flags",
        "FIN,SYN,RST,ACK",
    ]
    assert _iptables(marked)[2][6:9] == ["SYN", "--dport", "22"]
    assert marked.policy is not None
    nft = "\n".join(nft_table_lines(marked.policy.interfaces[0]))
    assert "meta l4proto tcp tcp flags & (fin|syn|rst|ack) == syn th dport 22" in nft
    u32 = _compile(
        tmp_path, _policy("from eth1", web=web).replace("    classify by mark from eth1\n", "")
    )
    assert "match u8 0x02 0x17 at 33" in (u32.output or "")
    assert "match u16 0x0000 0x1fff at 6" in (u32.output or "")  # first fragments only
    saved = "-A X -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -j DSCP --set-dscp 0x2e"
    rule = parse_rule(saved.split())
    assert rule.tcp_flags == (0x02, 0x17) and rule.set_dscp == 46 and rule.other == ()


def test_set_dscp_rewrites_after_marking(tmp_path: Path) -> None:
    extra = "    class voip rate 1mbit set dscp ef match proto udp dport 5060\n"
    result = _compile(tmp_path, _policy("at postrouting mask 0xff", extra))
    rules = _iptables(result)
    assert rules[-1] == [
        "-A", "TCDSL-eth0", "-m", "mark", "--mark", "0x14/0xff", "-j", "DSCP", "--set-dscp", "46",
    ]  # fmt: skip
    assert all("MARK" in r for r in rules[2:-1])  # the rewrite comes after every marking rule
    assert result.policy is not None
    nft = "\n".join(nft_table_lines(result.policy.interfaces[0]))
    assert 'oifname "eth0" meta nfproto ipv4 meta mark and 0xff == 0x14 ip dscp set 46' in nft
    wash = _compile(
        tmp_path,
        _policy("from any").replace("class bulk rate 1mbit", "class bulk rate 1mbit set dscp 0"),
    )
    assert _iptables(wash)[-1][-4:] == ["-j", "DSCP", "--set-dscp", "0"]


def test_u32_lines_beside_the_marks_follow_the_kernels_pref_order(tmp_path: Path) -> None:
    extra = (
        "    class ack rate 1mbit match tcp-ack pref 5\n"
        "    class late rate 1mbit match proto icmp pref 20\n"
    )
    result = _compile(tmp_path, _policy("from eth1 pref 10", extra))
    assert result.policy is not None and not result.errors
    iface = result.policy.interfaces[0]
    kinds = sorted((f.pref, type(f).__name__) for f in iface.filters)
    # IPv6 filters keep the same order 0x8000 higher; ICMP exists in IPv4 only.
    assert kinds == [
        (5, "U32Filter"),
        (10, "FwFilter"),
        (10, "FwFilter"),
        (20, "U32Filter"),
        (0x8005, "U32Filter"),
        (0x800A, "FwFilter"),
        (0x800A, "FwFilter"),
    ]
    ack = classify(result.policy, parse_packet("ack dport 80"))
    assert ack.cls is not None and ack.cls.name == "ack"  # pref 5 before the marks
    web = classify(result.policy, parse_packet("tcp dport 80"))
    assert web.cls is not None and web.cls.name == "web"
    # Every packet gets a mark (the default's for the rest), so pref 20 is reached only by
    # packets the marking chain never saw; classify assumes the packet passed it.
    icmp = classify(result.policy, parse_packet("icmp"))
    assert icmp.cls is not None and icmp.cls.name == "bulk"
    text = explain(result.policy)
    assert "Match lines with a pref of their own stay u32 filters" in text
    same = _compile(
        tmp_path, _policy("from eth1", "    class ack rate 1mbit match tcp-ack pref 1\n")
    )
    assert [d.code for d in same.errors] == ["E249"]


def test_explain_names_the_hook(tmp_path: Path) -> None:
    for source, words in [
        ("from any", "Packets arriving on any interface pass"),
        ("from local", "Packets this host sends out of 'eth0' pass"),
        ("at postrouting", "(mangle table, POSTROUTING)"),
    ]:
        result = _compile(tmp_path, _policy(source))
        assert result.policy is not None
        text = " ".join(explain(result.policy).split())
        assert words in text, text


def test_packet_flags() -> None:
    assert parse_packet("flags syn,ack").header()[33] == 0x12
    assert parse_packet("tcp").header()[33] == 0x18
    with pytest.raises(SpecError, match="unknown TCP flag 'push'"):
        parse_packet("flags push")
    with pytest.raises(SpecError, match="TCP flags"):
        parse_packet("udp flags syn")


def test_lint_sees_tcp_flags_as_the_kernel_does(tmp_path: Path) -> None:
    """``tcp-flags syn`` takes every packet ``tcp-flags syn of syn, ack`` would: a later line
    with the narrower flags never matches (W312); the other order is fine."""
    broad, narrow = "match tcp-flags syn", "match tcp-flags syn of syn, ack"
    head = "interface eth0 htb rate 10mbit default bulk {\n"
    tail = "    class bulk rate 1mbit\n}\n"
    first = _compile(
        tmp_path, f"{head}    class a rate 1mbit {broad}\n    class b rate 1mbit {narrow}\n{tail}"
    )
    assert [d.code for d in first.diagnostics] == ["W312"]
    second = _compile(
        tmp_path, f"{head}    class a rate 1mbit {narrow}\n    class b rate 1mbit {broad}\n{tail}"
    )
    assert second.diagnostics == []


def test_verify_compares_the_hook_and_the_mask(tmp_path: Path) -> None:
    """verify's expectations name the hook of the jump and the fw mask: a jump in the wrong
    built-in chain is missing, a rule or fw filter without the mask differs."""
    from tcdsl.commands import restore_lines
    from tcdsl.verify import compare
    from tcdsl.verify.expect import expected_policy
    from tcdsl.verify.readback import TcFilter, parse_iptables_save

    v4 = _policy("from local mask 0xff00").replace("htb", "family ipv4 htb", 1)
    result = _compile(tmp_path, v4)
    assert result.policy is not None
    iface = result.policy.interfaces[0]
    expected = expected_policy(result.policy).interfaces[0]
    assert expected.chain is not None
    lines = [line.replace("-I ", "-A ", 1) for _, line in restore_lines(iface)]  # as saved
    good = "*mangle\n" + "\n".join(lines) + "\nCOMMIT\n"
    assert list(compare._compare_chain(expected.chain, parse_iptables_save(good))) == []
    moved = good.replace("-A OUTPUT -o eth0", "-A PREROUTING -i eth0")
    problems = [
        d.message for d in compare._compare_chain(expected.chain, parse_iptables_save(moved))
    ]
    assert problems == [
        "jump from OUTPUT out of eth0 to chain TCDSL-eth0 is missing in the kernel's mangle table"
    ]
    unmasked = good.replace("--set-xmark 0xa00/0xff00", "--set-xmark 0xa00/0xffffffff")
    problems = [
        d.message for d in compare._compare_chain(expected.chain, parse_iptables_save(unmasked))
    ]
    assert problems == [
        "mark rule for 'web' set-mark is 0xa00/0xffffffff in the kernel, policy says 0xa00/0xff00"
    ]
    fw = [f for f in expected.filters if f.kind == "fw"]
    got = [TcFilter("fw", "ip", f.pref, f.flowid, mark=f.mark, mask=None) for f in fw]
    problems = [d.message for d in compare._compare_fw(expected, "1:", fw, got)]
    assert problems[0].endswith("mask is 0xffffffff in the kernel, policy says 0xff00")


def test_download_marking_runs_in_both_tables(tmp_path: Path) -> None:
    """A download's marking: ip6tables jumps from FORWARD and INPUT for packets arriving on
    the interface and saves the mark onto the connection, as iptables does."""
    text = (
        "interface eth0 {\n"
        "    download connmark htb rate 20mbit default bulk {\n"
        "        classify by mark from eth0\n"
        "        class web rate 10mbit match proto tcp sport 443\n"
        "        class bulk rate 10mbit\n"
        "    }\n"
        "}\n"
    )
    result = _compile(tmp_path, text)
    for tool in ("iptables", "ip6tables"):
        rules = _iptables(result, tool)
        assert rules[1:3] == [
            ["-I", "FORWARD", "-i", "eth0", "-j", "TCDSL-ifb4eth0"],
            ["-I", "INPUT", "-i", "eth0", "-j", "TCDSL-ifb4eth0"],
        ], tool
        assert rules[-1] == ["-A", "TCDSL-ifb4eth0", "-j", "CONNMARK", "--save-mark"], tool
    assert result.policy is not None
    nft = "\n".join(nft_table_lines(result.policy.interfaces[0]))
    assert 'iifname "eth0" meta nfproto ipv6 meta l4proto tcp th sport 443 meta mark 0' in nft


def _tree(name: str, source: str, mask: str = "", direction: str = "") -> str:
    """A tree of ``name`` classifying by mark ``source`` (``direction``: ``download
    connmark`` for a download in an interface block)."""
    head = f"interface {name} {{\n    {direction} htb" if direction else f"interface {name} htb"
    close = "}\n}\n" if direction else "}\n"
    return (
        f"{head} rate 10mbit default bulk {{\n"
        f"    classify by mark {source}{mask}\n"
        "    class web rate 5mbit match proto tcp dport 80\n"
        f"    class bulk rate 1mbit\n{close}"
    )


@pytest.mark.parametrize(
    ("trees", "reaches"),
    [
        # two WAN uploads marking what arrives on the LAN: both chains see every LAN packet
        (
            [("wan0", "from lan0"), ("wan1", "from lan0")],
            "packets arriving on lan0 can leave by wan1 with the marks of 'wan0'",
        ),
        (
            [("wan0", "from any"), ("lan0", "from wan0")],
            "packets arriving on any interface can leave by lan0 with the marks of 'wan0'",
        ),
        # an upload marking all arrivals, and its own download saving marks on connections
        (
            [("wan0", "from any"), ("wan0", "from wan0", "download connmark")],
            "the rules of both mark packets arriving on wan0",
        ),
        # two WANs' downloads meet only in a connection from one WAN to the other: W374
        (
            [
                ("wan0", "from wan0", "download connmark"),
                ("wan1", "from wan1", "download connmark"),
            ],
            None,
        ),
        # a download's marks on packets forwarded out of another shaped interface
        (
            [("wan0", "from wan0", "download connmark"), ("lan1", "at postrouting")],
            "packets arriving on wan0 can leave by lan1 with the marks of 'wan0 download",
        ),
        # a router's two sides: what each marks leaves by the other, where it is read
        ([("wan0", "from lan0"), ("lan0", "from wan0")], None),
        ([("wan0", "from lan0"), ("wan0", "from wan0", "download connmark")], None),
        ([("wan0", "at postrouting"), ("wan1", "at postrouting")], None),
        ([("wan0", "from local"), ("wan1", "at postrouting")], None),
        # what a tree marks in PREROUTING leaves by one that marks only the host's own
        # packets: read there as the class of the same mark
        (
            [("wan0", "from local"), ("wan1", "from lan0")],
            "packets arriving on lan0 can leave by wan0 with the marks of 'wan1', which the "
            "fw filters of 'wan0' read; mark 0xa (class 'web' of 'wan1') reads as 0xa there, "
            "the mark of class 'web'",
        ),
        # ... unless no mark of one is a mark of the other (policies/router-marks.tcp)
        ([("wan0", "from lan0", " mask 0xff00"), ("wan1", "from local")], None),
        # rules that see the other's marked packets leave them be, whatever their values
        (
            [("wan0", "from lan0", " mask 0xff00"), ("wan1", "at postrouting")],
            "the rules of 'wan1' mark only packets whose bits 0xffffffff are clear, and "
            "'wan0' sets some of them (mark 0xa00, class 'web')",
        ),
        ([("wan0", "from lan0", " mask 0xffff"), ("wan1", "from lan0", " mask 0xffff0000")], None),
    ],
)
def test_marks_of_two_trees_that_reach_each_other_keep_apart(
    trees: list[tuple[str, ...]], reaches: str | None, tmp_path: Path
) -> None:
    """E273 (found by a tester: two WAN interfaces both 'classify by mark from lan0' were
    compiled; the first chain marked every LAN packet, the second's rules mark only unmarked
    packets, so what left by wan1 was classified by wan0's marks, and 'classify' said
    otherwise): one tree's marks reach the packets another classifies, whose rules see them
    and leave them marked, or whose fw filters read one as a mark of theirs; at the second's
    'classify by mark' with a note at the first's. Trees whose rules mark only what the
    other never reads pass, and so do disjoint masks."""
    texts = [
        _tree(t[0], t[1], direction=t[2]) if len(t) > 2 and "download" in t[2] else _tree(*t)
        for t in trees
    ]
    merged = _merge(texts)
    result = _compile(tmp_path, merged)
    found = [d for d in result.diagnostics if d.code == "E273"]
    if reaches is None:
        assert not found and result.policy is not None, render(result.diagnostics, result.sources)
        return
    assert len(found) == 1, render(result.diagnostics, result.sources)
    said = " ".join(found[0].message.split())
    assert reaches in said and "give each tree mark bits of its own" in said, said
    assert found[0].span.line > 1 and found[0].notes[0].span.line < found[0].span.line


def test_marks_that_meet_only_in_nat_loopback_are_a_warning(tmp_path: Path) -> None:
    """A router's two sides, each marking what arrives on the other: only packets that leave
    by the interface they came in on (NAT loopback: a port forward reached from the LAN)
    carry wan0's marks to lan0's fw filters, where wan0's web mark is lan0's web class: W374
    (found by a review: E273's model said they never meet); disjoint masks silence it."""
    both = _tree("wan0", "from lan0") + _tree("lan0", "from wan0")
    result = _compile(tmp_path, both)
    assert result.policy is not None, render(result.diagnostics, result.sources)
    (found,) = [d for d in result.diagnostics if d.code == "W374"]
    said = " ".join(found.message.split())
    assert "packets arriving on lan0 that leave by lan0 again (NAT loopback" in said, said
    assert "mark 0xa (class 'web' of 'wan0') reads as 0xa there, the mark of class 'web'" in said
    masked = _tree("wan0", "from lan0", " mask 0xff") + _tree("lan0", "from wan0", " mask 0xff00")
    quiet = _compile(tmp_path, masked)
    assert not [d for d in quiet.diagnostics if d.code in ("W374", "E273")]


def test_two_wans_downloads_meet_only_in_transit_a_warning(tmp_path: Path) -> None:
    """Found by a tester: two WANs' downloads by mark were an error (E273), though their marks
    meet only in a connection forwarded from one WAN to the other, which a router rarely
    carries: W374 now, and the advice keeps the masks a tree has."""
    both = _tree("wan0", "from wan0", direction="download connmark") + _tree(
        "wan1", "from wan1", direction="download connmark"
    )
    result = _compile(tmp_path, both)
    assert result.policy is not None, render(result.diagnostics, result.sources)
    (found,) = [d for d in result.diagnostics if d.code == "W374"]
    said = " ".join(found.message.split())
    assert "a connection forwarded between there and wan1 (from one WAN to the other)" in said
    assert "('mask 0xffff' on one, 'mask 0xffff0000' on the other;" in said, said
    masked = _tree("wan0", "from wan0", " mask 0xff00", "download connmark") + _tree(
        "wan1", "from wan1", "", "download connmark"
    )
    (found,) = [d for d in _compile(tmp_path, masked).diagnostics if d.code == "W374"]
    said = " ".join(found.message.split())
    assert "'mask 0xffff0000' on 'wan1 download" in said and "outside the mask 0xff00 of" in said


@pytest.mark.parametrize("upload", ["from lan0", "from local", "at postrouting"])
def test_an_upload_and_its_own_download_need_no_marks_apart(upload: str, tmp_path: Path) -> None:
    """Found by a tester: an upload by mark and its own interface's download by mark got
    W374 (the download's marks 'on packets leaving by wan0 again'), which language.md says
    do not meet: only a packet the WAN sends back to the WAN would, no NAT loopback."""
    merged = _merge(
        [_tree("wan0", upload), _tree("wan0", "from wan0", direction="download connmark")]
    )
    result = _compile(tmp_path, merged)
    assert result.policy is not None, render(result.diagnostics, result.sources)
    assert not [d for d in result.diagnostics if d.code in ("W374", "E273")], render(
        result.diagnostics, result.sources
    )


def _merge(texts: list[str]) -> str:
    """Trees of one interface in one block (an upload and a download of wan0)."""
    first, second = texts
    if first.split()[1] != second.split()[1] or "{\n    download" not in second:
        return first + second
    upload = first.replace("htb", "{\n    upload htb", 1).rstrip() + "\n"
    return upload + second.split("{\n", 1)[1]


def test_marks_of_trees_of_other_families_keep_apart(tmp_path: Path) -> None:
    """An IPv4-only and an IPv6-only tree marking the same arrivals never see one packet."""
    v4 = _tree("wan0", "from lan0").replace("htb rate", "family ipv4 htb rate")
    v6 = _tree("wan1", "from lan0").replace("htb rate", "family ipv6 htb rate")
    result = _compile(tmp_path, v4 + v6)
    assert result.policy is not None, render(result.diagnostics, result.sources)
    both = _compile(tmp_path, v4 + _tree("wan1", "from lan0"))
    assert [d.code for d in both.diagnostics if d.code.startswith("E")] == ["E273"]


def test_the_fw_filters_a_kernel_must_have_are_asked_for_by_the_marking_line(
    tmp_path: Path,
) -> None:
    """Found by a tester: E604 for a kernel without fw filters pointed at a class, not at
    'classify by mark', the line that makes them."""
    from tcdsl.verify.expect import requirements

    result = _compile(tmp_path, _policy("from eth1"))
    assert result.policy is not None
    fw = next(r for r in requirements(result.policy) if r.feature == "cls_fw")
    assert (fw.span.line, fw.span.column) == (2, 5), fw.span
