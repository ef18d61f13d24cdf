"""The tc-batch and nft backends, and the shell script's --batch and --marks nft: unit tests
on the text, and runs of the real tools (tc's batch parser, nft's checker) where they exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.backend import BackendOptions
from tcdsl.cli import cli
from tcdsl.commands import batch_quote, batch_unquotable, nft_table, restore_quote, unspellable
from tcdsl.diagnostics import render
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.verify import runner, verifier
from tests.conftest import ROOT, flower_batch_in_guest

MARKS = "policies/seeds/s000-10.1-marks.tcp"
TOS_HTB = "policies/seeds/s004-tos-htb.tcp"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _compile(path: str, backend: str, **options: object) -> Result:
    result = compile_policy(path, backend, options=BackendOptions(**options))  # type: ignore[arg-type]
    assert result.output is not None, render(result.diagnostics, result.sources)
    return result


def _odd(tmp_path: Path, name: str, marks_from: str | None = "eth1") -> str:
    path = tmp_path / "odd.tcp"
    marking = f'    classify by mark from "{marks_from}"\n' if marks_from else ""
    path.write_text(
        f'interface "{name}" htb rate 10mbit default b {{\n'
        + marking
        + "    class a rate 5mbit match proto udp dport 53\n"
        "    class b rate 5mbit\n}\n",
        encoding="utf-8",
    )
    return str(path)


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("eth0", "eth0"),
        ("1:10", "1:10"),
        ("we ird", '"we ird"'),
        ('a"b', "'a\"b'"),
        ("a'b", '"a\'b"'),
    ],
)
def test_batch_quoting(word: str, quoted: str) -> None:
    assert batch_quote(word) == quoted


def test_batch_unquotable_words() -> None:
    assert batch_unquotable("eth0") is None
    assert "comment" in (batch_unquotable("a#b") or "")
    assert "both quote" in (batch_unquotable("a'\"b") or "")


def test_restore_quoting_and_nft_table_names() -> None:
    assert restore_quote("eth1") == "eth1"
    assert restore_quote('a"b') == '"a\\"b"'
    assert nft_table_of("eth0") == "tcdsl_eth0"
    assert nft_table_of("eth-0").startswith("tcdsl_eth_0_")
    assert nft_table_of("eth-0") != nft_table_of("eth_0")


def nft_table_of(name: str) -> str:
    result = compile_policy("policies/office.tcp", "shell")
    assert result.policy is not None
    iface = result.policy.interfaces[0]
    return nft_table(type(iface)(name, iface.span, iface.root))


def test_emit_files_and_the_map_point_at_the_right_lines() -> None:
    result = _compile(MARKS, "tc-batch")
    # (and the .ip6tables file while the seed marks IPv6 too: see test_ip6tables_restore_file)
    assert [f for f in result.files if not f.endswith(".ip6tables")] == [
        "s000-10.1-marks.batch",
        "s000-10.1-marks.iptables",
        "s000-10.1-marks.map",
    ]
    batch = result.files["s000-10.1-marks.batch"].splitlines()
    rows = [r.split("\t") for r in result.files["s000-10.1-marks.map"].splitlines()[1:]]
    commands = [n for n, line in enumerate(batch, start=1) if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == commands
    by_line = {int(r[0]): (r[1], r[2]) for r in rows}
    at = batch.index("class add dev eth0 parent 1:1 classid 1:10 htb rate 6mbit ceil 6mbit prio 0")
    assert by_line[at + 1] == (f"{MARKS}:29:11", "class app5001")
    nft = _compile(MARKS, "tc-batch", marks="nft")
    assert list(nft.files)[1] == "s000-10.1-marks.nft"
    plain = _compile("policies/office.tcp", "tc-batch")
    # (and office.ip6tables while office.tcp classifies IPv6: it removes a stale chain there)
    assert [f for f in plain.files if not f.endswith(".ip6tables")] == [
        "office.batch",
        "office.iptables",
        "office.map",
    ]


def test_a_batch_names_the_ingress_slots_it_leaves_to_an_earlier_version(tmp_path: Path) -> None:
    """The shell script looks at a device's ingress slot the policy leaves free and says what
    an earlier version left there (a download's redirect); a batch cannot look, so its header
    says, for each such device, that one would be left and how to remove it."""
    path = tmp_path / "p.tcp"
    path.write_text(
        "interface eth0 htb rate 10mbit default a { class a rate 1mbit }\n"
        "interface eth1 {\n"
        "    upload htb rate 10mbit default a { class a rate 1mbit }\n"
        "    download htb rate 10mbit default a { class a rate 1mbit }\n"
        "}\n",
        encoding="utf-8",
    )
    batch = _compile(str(path), "tc-batch").files["p.batch"].splitlines()
    notes = [line for line in batch if line.startswith(("# Left", "# version?"))]
    assert notes == [
        "# Left as it is: an ingress qdisc on eth0 (a download or ingress policing of an earlier",
        "# version?), which this policy does not set up; if nothing needs it: tc qdisc del dev "
        "eth0 ingress",
    ], batch[:12]


def test_restore_file_creates_or_flushes_the_chain() -> None:
    text = _compile(MARKS, "tc-batch").files["s000-10.1-marks.iptables"]
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body[:3] == ["*mangle", ":INSHAPER - [0:0]", "-I PREROUTING -i eth1 -j INSHAPER"]
    # An earlier version without 'chain INSHAPER' used the default chain: removed.
    assert body[-3:] == [":TCDSL-eth0 - [0:0]", "-X TCDSL-eth0", "COMMIT"]
    assert all("-m mark --mark 0 -j MARK" in line for line in body[3:-3])


def test_compile_to_a_directory_writes_every_file(tmp_path: Path) -> None:
    got = CliRunner().invoke(cli, ["compile", "-b", "tc-batch", "-o", f"{tmp_path}/", MARKS])
    assert got.exit_code == 0, got.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".ip6tables") == [
        "s000-10.1-marks.batch",
        "s000-10.1-marks.iptables",
        "s000-10.1-marks.map",
    ]
    one = CliRunner().invoke(cli, ["compile", "-b", "tc-batch", MARKS])
    assert one.exit_code == 0 and one.output == (tmp_path / "s000-10.1-marks.batch").read_text()


DUAL = """\
interface eth0 htb rate 10mbit default rest {
    classify by mark from eth1 mask 0xff
    class web rate 5mbit set dscp af41 { match proto tcp dport 443 }
    class ping rate 1mbit match proto icmpv6
    class rest rate 1mbit
}
"""


def test_ip6tables_restore_file(tmp_path: Path) -> None:
    """A tree that marks IPv6 gets an ip6tables-restore file: the same chain and jump, the
    IPv6 rules (ICMPv6 as ip6tables spells it), the DSCP rules, the default; the .iptables
    file keeps the IPv4 ones only."""
    path = tmp_path / "dual.tcp"
    path.write_text(DUAL, encoding="utf-8")
    result = _compile(str(path), "tc-batch")
    assert list(result.files) == ["dual.batch", "dual.iptables", "dual.ip6tables", "dual.map"]
    v6 = result.files["dual.ip6tables"]
    assert "#   ip6tables-restore --noflush FILE" in v6
    assert 'n=$(ip6tables -t mangle -L $c -n --line-numbers | awk \'$2 == "TCDSL-eth0"' in v6
    body = [line for line in v6.splitlines() if not line.startswith("#")]
    assert body == [
        "*mangle",
        ":TCDSL-eth0 - [0:0]",
        "-I PREROUTING -i eth1 -j TCDSL-eth0",
        "-A TCDSL-eth0 -p tcp --dport 443 -m mark --mark 0x0/0xff -j MARK --set-xmark 0xa/0xff",
        "-A TCDSL-eth0 -p icmpv6 -m mark --mark 0x0/0xff -j MARK --set-xmark 0x14/0xff",
        "-A TCDSL-eth0 -m mark --mark 0x0/0xff -j MARK --set-xmark 0x1e/0xff",
        "-A TCDSL-eth0 -m mark --mark 0xa/0xff -j DSCP --set-dscp 34",
        "COMMIT",
    ]
    v4 = [line for line in result.files["dual.iptables"].splitlines() if "TCDSL" in line]
    assert [line for line in v4 if "icmp" in line or "ip6tables" in line] == []
    assert len([line for line in v4 if "-j MARK" in line]) == 2
    assert "apply the .iptables and .ip6tables (or the .nft) files" in result.files["dual.batch"]
    ipv4 = tmp_path / "v4.tcp"
    ipv4.write_text(DUAL.replace("htb", "family ipv4 htb", 1).replace("icmpv6", "icmp"))
    assert "v4.ip6tables" not in _compile(str(ipv4), "tc-batch").files


def test_nft_marks_both_families_in_one_inet_table(tmp_path: Path) -> None:
    path = tmp_path / "dual.tcp"
    path.write_text(DUAL, encoding="utf-8")
    text = _compile(str(path), "nft").output or ""
    rules = [line.strip() for line in text.splitlines() if line.startswith("        iifname")]
    mark = "meta mark and 0xff == 0x0 meta mark set meta mark and 0xffffff00 or"
    assert rules == [
        f'iifname "eth1" meta nfproto ipv4 meta l4proto tcp th dport 443 {mark} 0xa',
        f'iifname "eth1" meta nfproto ipv6 meta l4proto tcp th dport 443 {mark} 0xa',
        f'iifname "eth1" meta nfproto ipv6 meta l4proto icmpv6 {mark} 0x14',
        f'iifname "eth1" meta nfproto ipv4 {mark} 0x1e',
        f'iifname "eth1" meta nfproto ipv6 {mark} 0x1e',
        'iifname "eth1" meta nfproto ipv4 meta mark and 0xff == 0xa ip dscp set 34',
        'iifname "eth1" meta nfproto ipv6 meta mark and 0xff == 0xa ip6 dscp set 34',
    ]


@pytest.mark.parametrize("family", ["", "family ipv6 "])
def test_restore_file_without_marking_removes_the_default_chain(
    family: str, tmp_path: Path
) -> None:
    """A policy that no longer marks removes the chain an earlier version left, in the table
    of each family it classifies (a tree of IPv4 only writes no .ip6tables file)."""
    path = tmp_path / "plain.tcp"
    path.write_text(f"interface eth0 {family}htb rate 1mbit default a {{ class a rate 1mbit }}\n")
    files = _compile(str(path), "tc-batch").files
    for name, tool in (("plain.iptables", "iptables"), ("plain.ip6tables", "ip6tables")):
        text = files[name]
        body = [line for line in text.splitlines() if not line.startswith("#")]
        assert body == ["*mangle", ":TCDSL-eth0 - [0:0]", "-X TCDSL-eth0", "COMMIT"]
        assert f'n=$({tool} -t mangle -L $c -n --line-numbers | awk \'$2 == "TCDSL-eth0"' in text
    path.write_text("interface eth0 family ipv4 htb rate 1mbit default a { class a rate 1mbit }\n")
    assert "plain.ip6tables" not in _compile(str(path), "tc-batch").files


def test_nft_backend_on_a_policy_without_marking_removes_stale_tables() -> None:
    text = _compile("policies/office.tcp", "nft").output or ""
    assert [x for x in text.splitlines() if not x.startswith("#")] == [
        "table inet tcdsl_eth0",
        "delete table inet tcdsl_eth0",
    ]


def test_unspellable_interface_names_are_diagnosed(tmp_path: Path) -> None:
    path = _odd(tmp_path, "we#ird")
    result = compile_policy(path, "tc-batch")
    assert result.output is None
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("E502", 1)]
    assert "comment" in result.diagnostics[0].message
    assert compile_policy(path, "shell", options=BackendOptions(batch=False)).output is not None
    # the script's default form feeds tc -batch, but runs the tc commands of an interface
    # whose name a batch line cannot hold one by one (found by a tester: check passed what
    # the default compile refused)
    batch = compile_policy(path, "shell")
    assert batch.output is not None and "tc -batch" not in batch.output.split("==== interface")[1]
    assert "tc qdisc add dev 'we#ird' root" in batch.output
    star = compile_policy(_odd(tmp_path, "eth0", "eth*"), "nft")
    assert [(d.code, d.span.line) for d in star.diagnostics] == [("E502", 2)]
    assert "'*' in an interface name as a wildcard" in star.diagnostics[0].message
    slash = compile_policy(_odd(tmp_path, "eth0", "a\\b"), "nft")
    assert [(d.code, d.span.line) for d in slash.diagnostics] == [("E502", 2)]
    assert "'\\' in an interface name as an escape" in slash.diagnostics[0].message


@pytest.mark.parametrize(("name", "marks_from"), [("wan+", "local"), ("eth0", '"wan+"')])
def test_an_interface_name_iptables_reads_as_a_wildcard_is_refused_for_iptables(
    tmp_path: Path, name: str, marks_from: str
) -> None:
    """Found by a tester: the marks of interface 'wan+' were '-o wan+' (or '-i wan+'), which
    iptables reads as every interface whose name starts with 'wan'; nft reads it as it is."""
    path = tmp_path / "plus.tcp"
    path.write_text(
        f'interface "{name}" htb rate 10mbit default b {{\n'
        f"    classify by mark from {marks_from}\n"
        "    class a rate 5mbit match proto udp dport 53\n    class b rate 5mbit\n}\n",
        encoding="utf-8",
    )
    for backend in ("shell", "tc-batch"):
        result = compile_policy(str(path), backend)
        assert result.output is None, backend
        assert [(d.code, d.span.line) for d in result.diagnostics] == [("E502", 2)]
        assert "'+' at the end of an interface name as a wildcard" in result.diagnostics[0].message
        assert "(--marks nft)" in result.diagnostics[0].message
        nft = compile_policy(str(path), backend, options=BackendOptions(marks="nft"))
        assert nft.output is not None and 'ifname "wan+"' in "".join(nft.files.values()), backend
    policy = analyse(str(path)).policy
    assert policy is not None
    (live,) = unspellable(policy, batch=True, nft=False, live=True)
    assert "(tcdsl apply marks with iptables)" in live.message
    # a '+' elsewhere in the name is a character like any other
    assert compile_policy(_odd(tmp_path, "eth0", "w+an"), "shell").output is not None


def test_shell_batch_and_nft_scripts_are_valid_sh() -> None:
    for path in (MARKS, "policies/office.tcp"):
        for options in ({"batch": False}, {"marks": "nft"}, {"batch": False, "marks": "nft"}, {}):
            script = _compile(path, "shell", **options).output or ""
            done = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
            assert done.returncode == 0, done.stderr
            batch = options.get("batch", True)
            assert ("tcdsl_batch=$(cat <<'TCDSL_BATCH'" in script) == batch
            # Without marks, iptables only removes an earlier version's chain (tcdsl_unmark).
            marks = "iptables -t mangle -N" in script
            assert marks == (path == MARKS and options.get("marks") != "nft")
            # An earlier version's marking of either kind goes (its chain, its nft table);
            # an nft marking's own input replaces its table.
            assert "tcdsl_unmark " in script
            if not (path == MARKS and options.get("marks") == "nft"):
                assert "nft delete table" in script


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (nftables)")
def test_nft_accepts_the_rulesets() -> None:
    marking = (MARKS, "policies/seeds/s000-10.2-marks-sharing.tcp", "policies/router-marks.tcp")
    for path in (*marking, "policies/office.tcp"):
        text = _compile(path, "nft").output or ""
        done = subprocess.run(["nft", "-c", "-f", "-"], input=text, text=True, capture_output=True)
        if done.returncode != 0 and "Operation not permitted" in done.stderr:
            pytest.skip("nft -c needs root here")
        assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (nftables)")
def test_nft_accepts_the_dual_stack_ruleset(tmp_path: Path) -> None:
    """IPv6 addresses, ICMPv6, a traffic class (read 16 bits in: nft 1.0.6 cannot say
    "@nh,4,8") and ip6 dscp in one inet table."""
    path = tmp_path / "dual.tcp"
    path.write_text(DUAL.replace("match proto icmpv6", "match proto icmpv6 tos 0xb8/0xfc"))
    text = _compile(str(path), "nft").output or ""
    assert "meta nfproto ipv6 meta l4proto icmpv6 @nh,0,16 & 0x0fc0 == 0x0b80" in text
    done = subprocess.run(["nft", "-c", "-f", "-"], input=text, text=True, capture_output=True)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("nft -c needs root here")
    assert done.returncode == 0, done.stderr


# ==== on the host kernel ========================================================================

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


def _host() -> runner.HostSupport:
    try:
        return runner.host_support()
    except runner.KernelUnavailable as exc:
        pytest.skip(str(exc))


@needs_root
def test_shell_batch_script_applies_like_the_plain_script() -> None:
    _host()
    plain, batch = _compile(TOS_HTB, "shell", batch=False), _compile(TOS_HTB, "shell")
    cases = [
        runner.Case(n, runner.case_script(n, r.output or "", ["eth0"], ["eth0"]))
        for n, r in (("plain", plain), ("batch", batch))
    ]
    cases.append(
        runner.Case(
            "twice", runner.case_script("twice", (batch.output or "") * 2, ["eth0"], ["eth0"])
        )
    )
    states = []
    for result in runner.run_on_host(cases):
        found = runner.sections(result.stdout)
        assert found["apply-stderr"].status == 0, result.stdout
        states.append(runner.read_state(found, ["eth0"]).devices["eth0"].text)
    assert states[0] == states[1] == states[2]


@needs_root
def test_tc_parses_quoted_interface_names(tmp_path: Path) -> None:
    _host()
    for name in ("it's", "a\\b"):
        result = _compile(_odd(tmp_path, name, None), "tc-batch")
        assert result.policy is not None
        applier, files = verifier.batch_applier(result.policy, result.files)
        case = runner.case_script(name, applier, [name], [name], files=files)
        (done,) = runner.run_on_host([runner.Case(name, case)])
        found = runner.sections(done.stdout)
        assert found["apply-stderr"].status == 0, done.stdout
        assert "htb 1: root" in found["qdisc 0"].text


@needs_root
def test_verify_tc_batch_reports_a_failure_at_the_policy_line() -> None:
    _host()
    v = verifier.verify(TOS_HTB, backend="tc-batch", kernel="host", before="ip link del eth0")
    # The batch's first line (the teardown) already needs the device: reported at the interface.
    assert [f"{d.span.line}:{d.span.column} {d.code}" for d in v.diagnostics] == ["16:11 E404"]
    assert v.diagnostics[0].message.startswith(
        'tc failed on teardown of interface eth0 (exit 1): Cannot find device "eth0"'
    )
    ok = verifier.verify(TOS_HTB, backend="tc-batch", kernel="host")
    assert ok.ok, render(ok.diagnostics, ok.sources)


U32_DUAL = """\
interface eth0 htb rate 10mbit default rest {
    class web rate 4mbit match proto tcp dport 443, 8000-8080
    class v6 rate 2mbit match src 2001:db8::/64 dscp ef
    class ack rate 1mbit match tcp-ack
    class rest rate 1mbit
}
"""

FLOWER_DUAL = U32_DUAL.replace("htb rate", "classifier flower htb rate").replace(
    "    class ack rate 1mbit match tcp-ack\n", ""
)


@needs_root
def test_dual_stack_batch_applies_like_the_plain_script(tmp_path: Path) -> None:
    """IPv6 u32 filters (protocol ipv6, prefs 0x8000 up) as tc -batch lines and as commands
    give the same kernel state on the host."""
    _host()
    path = tmp_path / "dual.tcp"
    path.write_text(U32_DUAL, encoding="utf-8")
    plain, batch = _compile(str(path), "shell", batch=False), _compile(str(path), "shell")
    cases = [
        runner.Case(n, runner.case_script(n, r.output or "", ["eth0"], ["eth0"]))
        for n, r in (("plain", plain), ("batch", batch))
    ]
    shown = []
    for result in runner.run_on_host(cases):
        found = runner.sections(result.stdout)
        assert found["apply-stderr"].status == 0, result.stdout
        shown.append("".join(v.text for k, v in found.items() if k.startswith("filter 0")))
    assert shown[0] == shown[1]
    assert "protocol ipv6 pref 32769 u32" in shown[0]
    assert "match 20010db8/ffffffff at 8" in shown[0]


def test_flower_filters_in_a_batch_on_the_guest_kernel(tmp_path: Path) -> None:
    """The host has no flower; the user-mode Linux guest does: a tc-batch file of flower
    filters for both families is taken as written (names for ip_proto, port ranges, the
    traffic class, IPv6 prefixes)."""
    path = tmp_path / "flower.tcp"
    path.write_text(FLOWER_DUAL, encoding="utf-8")
    batch = _compile(str(path), "tc-batch").files["flower.batch"]
    assert re.search(
        r"protocol ipv6 prio 327\d\d flower ip_proto tcp dst_port 8000-8080 classid 1:10", batch
    )
    stdout = flower_batch_in_guest(batch)
    shown = " ".join(stdout.split())
    for words in (
        "protocol ip pref 1 flower chain 0 handle 0x1 classid 1:10 eth_type ipv4 ip_proto tcp"
        " dst_port 443",
        "protocol ipv6 pref 32769 flower chain 0 handle 0x1 classid 1:10 eth_type ipv6"
        " ip_proto tcp dst_port 443",
        "eth_type ipv6 ip_proto tcp dst_port 8000-8080",
        "eth_type ipv6 ip_tos 184/0xfc src_ip 2001:db8::/64",
    ):
        assert words in shown, stdout


def test_nft_marking_script_needs_no_iptables(tmp_path: Path) -> None:
    """With --marks nft the inet table marks both families: no iptables, no ip6tables, and no
    check for them."""
    path = tmp_path / "dual.tcp"
    path.write_text(DUAL, encoding="utf-8")
    script = _compile(str(path), "shell", marks="nft").output or ""
    assert "tcdsl_needs" not in script and "iptables -t" not in script
    assert "meta nfproto ipv6 meta l4proto icmpv6" in script
    plain = _compile(str(path), "shell").output or ""
    assert "tcdsl_needs iptables 'to mark IPv4 packets'" in plain
    assert "tcdsl_needs ip6tables 'to mark IPv6 packets" in plain


@pytest.mark.parametrize("marks", ["iptables", "nft"])
def test_a_script_removes_an_earlier_versions_marking_of_either_kind(
    tmp_path: Path, marks: str
) -> None:
    """Found by a review: a script compiled with --marks nft left the iptables chain (and
    its jumps) of an earlier version compiled with --marks iptables, and the other way round:
    both marked every packet. Each script's teardown removes both kinds, where installed,
    and nothing else (another chain and another nft table stay)."""
    why = runner.host_unavailable()
    if why is not None or not (shutil.which("nft") and shutil.which("iptables")):
        pytest.skip(why or "needs nft and iptables")
    path = tmp_path / "plain.tcp"
    path.write_text("interface eth0 htb rate 10mbit default a {\n    class a rate 1mbit\n}\n")
    script = tmp_path / "apply.sh"
    script.write_text(_compile(str(path), "shell", marks=marks).output or "")
    setup = (
        "ip link add eth0 type veth peer name peer0 && "
        "nft add table inet tcdsl_eth0 && nft add table inet theirs && "
        "iptables -t mangle -N TCDSL-eth0 && iptables -t mangle -N mine && "
        "iptables -t mangle -A POSTROUTING -o eth0 -j TCDSL-eth0"
    )
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            f"{setup} && TCDSL_LOCK_DIR={tmp_path} sh {script} && echo ran && "
            "nft list tables && iptables-save -t mangle",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "ran" in done.stdout, done.stdout + done.stderr
    assert "tcdsl_eth0" not in done.stdout and "TCDSL-eth0" not in done.stdout, done.stdout
    assert "table inet theirs" in done.stdout and ":mine" in done.stdout, done.stdout


def test_an_interface_a_batch_line_cannot_name_runs_one_command_at_a_time(
    tmp_path: Path,
) -> None:
    """On the host: the default script of a policy shaping 'x#y' (a '#' starts a comment in a
    tc -batch line) and eth0 builds both trees, x#y's tc commands one by one, eth0's in its
    batch."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a network namespace")
    body = (
        "htb rate 10mbit default b {\n    class a rate 5mbit match dport 53\n"
        "    class b rate 5mbit\n}\n"
    )
    path = tmp_path / "two.tcp"
    path.write_text(f'interface "x#y" {body}interface eth0 {body}', encoding="utf-8")
    result = compile_policy(str(path), "shell")
    assert result.output is not None, result.diagnostics
    parts = result.output.split("==== interface")
    assert "tc -batch" not in parts[1] and "tc -batch" in parts[2]
    (tmp_path / "two.sh").write_text(result.output, encoding="utf-8")
    setup = "".join(
        f"ip link add '{n}' type veth peer name p{i} && ip link set '{n}' up && "
        for i, n in enumerate(("x#y", "eth0"))
    )
    run = f"{setup}TCDSL_LOCK_DIR={tmp_path} sh {tmp_path}/two.sh && tc class show dev 'x#y'"
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"{run} && tc class show dev eth0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("class htb 1:10") == 2, done.stdout


def test_a_download_of_an_interface_a_batch_line_cannot_name_runs_one_command_at_a_time(
    tmp_path: Path,
) -> None:
    """Found by a review: the fallback looked at the tree's own device only; a download's tree
    (named after its IFB) also names the interface ('x#y', its ingress qdisc and redirect), and
    its batch line was cut at the '#'. No tc -batch of the script names x#y."""
    path = tmp_path / "dl.tcp"
    path.write_text(
        'interface "x#y" {\n    download via ifb0 htb rate 10mbit default b {\n'
        "        class b rate 5mbit\n    }\n}\n",
        encoding="utf-8",
    )
    result = compile_policy(str(path), "shell")
    assert result.output is not None, result.diagnostics
    batches = re.findall(r"tcdsl_batch=\$\(cat .*?\n(.*?)\nTCDSL_BATCH", result.output, re.S)
    assert not any("x#y" in b for b in batches), batches
    assert "ingress" in result.output and "'x#y'" in result.output
