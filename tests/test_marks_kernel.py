"""Marking as routers need it (``classify by mark`` hooks, mark masks, ``tcp-flags``,
``set dscp``, u32 lines beside the marks, removal of a previous version's chain), on kernels.

- The host (u32 and htb, no fw): ``tcp-flags`` u32 keys against packets written on a raw
  socket, compared with ``classify`` (``tests/test_classify_kernel.py``'s sender and counters);
  the script of a policy that no longer marks removes the default chain and every jump into it
  from a real mangle table, and nothing else.
- The user-mode Linux guest (fw, iptables legacy): a whole marking script, packets this host
  sends (ping, TCP SYNs from busybox's nc) counted per class and per rule, with another user
  of the low mark bits beside tcdsl's mask; then the next version of the policy (no marking)
  removes the chain.

Skipped, with the reason, where the kernel in question cannot run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tcdsl.commands import interface_commands
from tcdsl.driver import compile_policy
from tcdsl.kernels import uml
from tcdsl.teach.traffic import parse_packet
from tcdsl.verify import runner
from tcdsl.verify.runner import HostSupport
from tests.test_apply import _compile_text, apply_for_traffic, run
from tests.test_classify_kernel import _run_case, assert_agrees
from tests.test_lint_kernel import host, make_netns

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

FLAGS = (
    "interface eth0 htb rate 100mbit r2q 100 default bulk {\n"
    "    class first rate 1mbit match tcp-flags syn of syn, ack, rst, fin\n"
    "    class reset rate 1mbit match tcp-flags rst\n"
    "    class synack rate 1mbit match tcp-flags syn, ack dport 443\n"
    "    class bulk rate 1mbit\n"
    "}\n"
)


@pytest.mark.parametrize(
    ("spec", "counter"),
    [
        ("tcp flags syn dport 80", "1:10"),
        ("tcp flags syn,ece dport 80", "1:10"),  # ece is not examined
        ("tcp flags syn,ack dport 80", "1:40"),
        ("tcp flags syn,ack dport 443", "1:30"),
        ("tcp flags rst,ack", "1:20"),
        ("tcp flags fin,ack", "1:40"),
        ("udp dport 80", "1:40"),
        ("tcp flags syn dport 80 size 200", "1:10"),
    ],
)
def test_tcp_flags_u32_keys_agree_with_the_kernel(
    spec: str, counter: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """The u32 keys read the flags byte where the kernel has it (byte 33 of a packet with a
    20-byte IP header), and ``classify`` puts each packet where the kernel does."""
    packet = parse_packet(spec)
    ((_, kernel, verdict),) = _run_case(FLAGS, [packet], host, make_netns, tmp_path)
    assert kernel == counter
    assert_agrees(kernel, verdict, FLAGS, packet)


def _mangle(ns: str) -> str:
    return run(["ip", "netns", "exec", ns, "iptables-save", "-t", "mangle"]).stdout


def _rules(save: str) -> list[str]:
    return [line for line in save.splitlines() if line.startswith(("-A ", ":"))]


def test_a_policy_without_marking_removes_the_earlier_chain(
    host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """An earlier version marked (jumps into TCDSL-eth0 from PREROUTING and POSTROUTING); the
    script of the version without marking removes that chain and those jumps, and leaves the
    rest of the mangle table (another chain, its jump, another MARK rule) as it was."""
    result = _compile_text(tmp_path, V2)
    ns = make_netns()
    ipt = ["ip", "netns", "exec", ns, "iptables", "-t", "mangle"]
    for words in (
        ["-N", "TCDSL-eth0"],
        ["-A", "TCDSL-eth0", "-j", "MARK", "--set-mark", "10"],
        ["-A", "PREROUTING", "-i", "eth9", "-j", "TCDSL-eth0"],
        ["-A", "POSTROUTING", "-o", "eth0", "-j", "TCDSL-eth0"],
        ["-A", "PREROUTING", "-i", "eth8", "-j", "TCDSL-eth0"],
        ["-N", "TCDSL-eth0x"],
        ["-A", "PREROUTING", "-j", "TCDSL-eth0x"],
        ["-A", "OUTPUT", "-j", "MARK", "--set-xmark", "0x1/0xff"],
    ):
        run([*ipt, *words])
    apply_for_traffic(ns, result, tmp_path)
    rules = _rules(_mangle(ns))
    assert not [r for r in rules if "TCDSL-eth0 " in f"{r} " or r == ":TCDSL-eth0 - [0:0]"]
    assert ":TCDSL-eth0x - [0:0]" in rules
    assert "-A PREROUTING -j TCDSL-eth0x" in rules
    assert "-A OUTPUT -j MARK --set-xmark 0x1/0xff" in rules


# ==== the user-mode Linux guest: fw and iptables together ========================================

V1 = (
    "interface eth0 htb rate 10mbit default bulk {\n"
    "    classify by mark from local mask 0xff00 pref 10\n"
    "    class ping rate 1mbit match proto icmp pref 5\n"
    "    class syn rate 1mbit set dscp ef match tcp-flags syn of syn, ack\n"
    "    class bulk rate 1mbit set dscp cs1\n"
    "}\n"
)
"""Marks for the host's own traffic, in the bits 0xff00; pings by a u32 filter tried first."""

V2 = "interface eth0 htb rate 10mbit default bulk {\n    class bulk rate 1mbit\n}\n"
"""The next version: no marking."""

GUEST = """\
# No IPv6 chatter (router solicitations, MLD) to count: the script's ip6tables would load
# IPv6 (a module here) and eth0 would start talking while the counters run.
modprobe ipv6
echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6
ip link add name eth0 type veth peer name peer0
ip link set eth0 up
ip link set peer0 up
ip addr add 10.99.0.1/24 dev eth0
ip neigh add 10.99.0.2 lladdr 02:00:00:00:00:02 dev eth0
mkdir bin && printf '#!/bin/sh\\nexit 0\\n' > bin/flock && chmod +x bin/flock
PATH=$PWD/bin:$PATH
# An earlier version marked what arrived on eth9; another user of the mark owns the low byte.
iptables -t mangle -N TCDSL-eth0
iptables -t mangle -A PREROUTING -i eth9 -j TCDSL-eth0
iptables -t mangle -A OUTPUT -j MARK --set-xmark 0x1/0xff
cat > v1.sh <<'TCDSL_V1'
{v1}TCDSL_V1
cat > v2.sh <<'TCDSL_V2'
{v2}TCDSL_V2
sh v1.sh
echo '== v1'
iptables-save -t mangle
echo '== v1 ip6'
ip6tables-save -t mangle
ping -c 2 -W 1 10.99.0.2 >/dev/null 2>&1 || :
nc -w 1 10.99.0.2 22 </dev/null >/dev/null 2>&1 || :
nc -w 1 10.99.0.2 80 </dev/null >/dev/null 2>&1 || :
echo '== counters'
iptables-save -c -t mangle
tc -s class show dev eth0
sh v2.sh
echo '== v2'
iptables-save -t mangle
echo '== v2 ip6'
ip6tables-save -t mangle
"""


def _script(text: str, tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = compile_policy(str(path))
    assert result.output is not None, result.diagnostics
    return result.output


def _section(out: str, name: str) -> str:
    return out.split(f"== {name}\n", 1)[1].split("\n== ", 1)[0]


def _sent(classes: str) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"class htb (\S+) .*\n Sent \d+ bytes (\d+) pkt", classes)
    }


def test_marking_script_in_the_guest(tmp_path: Path) -> None:
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    v1, v2 = _script(V1, tmp_path, "v1.tcp"), _script(V2, tmp_path, "v2.tcp")
    (res,) = uml.run_cases([uml.Case("marks", GUEST.format(v1=v1, v2=v2))], timeout=300)
    assert res.exit_code == 0, res.stdout + res.stderr
    first = _rules(_section(res.stdout, "v1"))
    # The earlier version's jump (from eth9) is gone; the other user's rule stays.
    assert "-A PREROUTING -i eth9 -j TCDSL-eth0" not in first
    assert "-A OUTPUT -j MARK --set-xmark 0x1/0xff" in first
    assert "-A OUTPUT -o eth0 -j TCDSL-eth0" in first
    # ip6tables (legacy) has the same chain and jump, with the IPv6 rules.
    assert "-A OUTPUT -o eth0 -j TCDSL-eth0" in _rules(_section(res.stdout, "v1 ip6"))
    counted = _section(res.stdout, "counters")
    # Pings: a u32 filter (pref 5) before the fw filters (pref 10) takes them, though the
    # chain gave them the default's mark; the SYNs of both connections: mark 0x1400, class syn.
    # (a SYN nobody answers is sent again after 1 s, which nc's 1 s may outlast on a slow
    # machine: each connection's SYNs are at least one)
    sent = _sent(counted)
    assert sent["1:10"] == 2 and sent["1:30"] == 0 and sent["1:20"] >= 2, sent
    assert sent["1:1"] == sent["1:10"] + sent["1:20"], sent
    rule = r"^\[(\d+):\d+\] -A TCDSL-eth0 -m mark --mark (\S+) -j DSCP"
    dscp = {m.group(2): int(m.group(1)) for m in re.finditer(rule, counted, re.M)}
    assert dscp == {"0x1400/0xff00": sent["1:20"], "0x1e00/0xff00": 2}
    after = _rules(_section(res.stdout, "v2"))
    assert not [r for r in after if "TCDSL-eth0" in r]
    assert not [r for r in _rules(_section(res.stdout, "v2 ip6")) if "TCDSL-eth0" in r]
    assert "-A OUTPUT -j MARK --set-xmark 0x1/0xff" in after


# ==== the host: the marking rules themselves, iptables and nft ===================================

COUNT = """\
table inet tcdsl_count {
    chain post {
        type filter hook postrouting priority 300; policy accept;
        meta mark & 0x0000ff00 == 0x00001400 counter
        meta mark & 0x0000ff00 == 0x00001e00 counter
        meta mark & 0x000000ff == 0x00000001 counter
        ip dscp ef counter
        ip dscp cs1 counter
    }
}
"""
"""Counts, after the marking (mangle priority), what the packets leave with."""

COUNTED = ("mark syn", "mark bulk", "other bits", "dscp ef", "dscp cs1")


def _counts(ns: str) -> dict[str, int]:
    listed = run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "tcdsl_count"])
    numbers = [int(n) for n in re.findall(r"counter packets (\d+)", listed.stdout)]
    return dict(zip(COUNTED, numbers, strict=True))


@pytest.mark.parametrize("marks", ["iptables", "nft"])
def test_marking_rules_mark_and_rewrite_dscp_on_the_host(
    marks: str, host: HostSupport, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """V1's rules (OUTPUT, mask 0xff00, tcp-flags, set dscp) on the host's netfilter: each
    packet this host sends leaves with its class's mark in the bits 0xff00, the other user's
    bit 0x1 kept, and its class's DSCP. (The host has no fw: the tc side is the guest's test.)"""
    if run(["sh", "-c", "command -v nft"], check=False).returncode != 0:
        pytest.skip("needs nft (nftables) to count")
    ns = make_netns()
    apply_for_traffic(ns, _compile_text(tmp_path, V2), tmp_path)
    run(["ip", "-n", ns, "route", "add", "default", "via", "10.99.0.2", "dev", "eth0"])
    exec_ns = ["ip", "netns", "exec", ns]
    policy = tmp_path / "v1.tcp"
    policy.write_text(V1, encoding="utf-8")
    if marks == "nft":
        rules = compile_policy(str(policy), "nft").output
        assert rules is not None
        run([*exec_ns, "nft", "-f", str(_write(tmp_path / "v1.nft", rules))])
    else:
        result = compile_policy(str(policy))
        assert result.policy is not None
        for cmd in interface_commands(result.policy.interfaces[0]):
            if cmd.tool == "iptables":
                run([*exec_ns, "iptables", *cmd.args])
    run([*exec_ns, "nft", "-f", str(_write(tmp_path / "count.nft", COUNT))])
    # Another user of the mark: the low byte, set before tcdsl's rules see the packet.
    run([*exec_ns, "nft", "add", "table", "inet", "other"])
    run(
        [*exec_ns, "nft", "add", "chain", "inet", "other", "out",
         "{ type filter hook output priority -200 ; }"]
    )  # fmt: skip
    run([*exec_ns, "nft", "add", "rule", "inet", "other", "out", "meta", "mark", "set", "0x1"])
    sends = ["tcp flags syn dport 80", "tcp flags syn,ack dport 80", "udp dport 53"]
    _send_from_this_host(ns, [parse_packet(spec).ip_packet() for spec in sends])
    assert _counts(ns) == {
        "mark syn": 1,
        "mark bulk": 2,
        "other bits": 3,
        "dscp ef": 1,
        "dscp cs1": 2,
    }


LOCAL_SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for line in sys.stdin:
    data = bytes.fromhex(line.strip())
    s.sendto(data, (socket.inet_ntoa(data[16:20]), 0))
"""
"""Sends IPv4 packets as this host's own (a raw IP socket, so through OUTPUT and POSTROUTING;
the classify test's frames on a packet socket pass no netfilter hook)."""


def _send_from_this_host(ns: str, packets: list[bytes]) -> None:
    subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", LOCAL_SENDER],
        input="".join(p.hex() + "\n" for p in packets),
        text=True,
        check=True,
        timeout=30,
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ==== the host: both families' tables ============================================================

DUAL = (
    "interface eth0 htb rate 10mbit default bulk {\n"
    "    classify by mark from eth1 mask 0xff\n"
    "    class web rate 1mbit set dscp af41 match proto tcp dport 443\n"
    "    class lan rate 1mbit match src 2001:db8::/64, 10.1.0.0/16 proto udp\n"
    "    class ping rate 1mbit match proto icmp, icmpv6\n"
    "    class bulk rate 1mbit\n"
    "}\n"
)
"""Marks for both families: lines for both, an address of each, ICMP and ICMPv6."""

FOREIGN = (
    ["-N", "theirs"],
    ["-A", "theirs", "-p", "tcp", "--dport", "25", "-j", "MARK", "--set-mark", "9"],
    ["-A", "PREROUTING", "-i", "eth9", "-j", "theirs"],
    ["-A", "OUTPUT", "-j", "MARK", "--set-xmark", "0x100/0xff00"],
)
"""Someone else's mangle rules, in both tables: they must outlive tcdsl's teardown."""

MARK = "-m mark --mark 0x0/0xff -j MARK --set-xmark"
DUAL_SAVED = {
    "iptables": [
        "-A PREROUTING -i eth1 -j TCDSL-eth0",
        f"-A TCDSL-eth0 -p tcp -m tcp --dport 443 {MARK} 0xa/0xff",
        f"-A TCDSL-eth0 -s 10.1.0.0/16 -p udp {MARK} 0x14/0xff",
        f"-A TCDSL-eth0 -p icmp {MARK} 0x1e/0xff",
        f"-A TCDSL-eth0 {MARK} 0x28/0xff",
        "-A TCDSL-eth0 -m mark --mark 0xa/0xff -j DSCP --set-dscp 0x22",
    ],
    "ip6tables": [
        "-A PREROUTING -i eth1 -j TCDSL-eth0",
        f"-A TCDSL-eth0 -p tcp -m tcp --dport 443 {MARK} 0xa/0xff",
        f"-A TCDSL-eth0 -s 2001:db8::/64 -p udp {MARK} 0x14/0xff",
        f"-A TCDSL-eth0 -p ipv6-icmp {MARK} 0x1e/0xff",
        f"-A TCDSL-eth0 {MARK} 0x28/0xff",
        "-A TCDSL-eth0 -m mark --mark 0xa/0xff -j DSCP --set-dscp 0x22",
    ],
}
"""What iptables-save and ip6tables-save print for DUAL's chain (the kernel's spelling: the
jump appended, as the first one inserted; DSCP in hex; ICMPv6 as ip6tables names it)."""


def _saved(ns: str, tool: str) -> list[str]:
    save = run(["ip", "netns", "exec", ns, f"{tool}-save", "-t", "mangle"]).stdout
    return [line for line in save.splitlines() if line.startswith(("-A ", ":"))]


def _foreign(rules: list[str]) -> list[str]:
    return [r for r in rules if "TCDSL-eth0" not in r]


def test_dual_stack_marking_in_both_tables_and_its_teardown(
    make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """DUAL's marking commands make the same chain in iptables' and ip6tables' mangle tables,
    each with its own family's rules (read back from the kernel); the removal the script
    offers (tcdsl_undo), and the script of the next version without marking (tcdsl_unmark),
    remove both chains and their jumps, and nothing of anyone else's, in either table."""
    tools = ("iptables", "ip6tables")
    for tool in (*tools, "iptables-save", "ip6tables-save"):
        if run(["sh", "-c", f"command -v {tool}"], check=False).returncode != 0:
            pytest.skip(f"needs {tool}")
    ns = make_netns()
    exec_ns = ["ip", "netns", "exec", ns]
    for tool in tools:
        for words in FOREIGN:
            run([*exec_ns, tool, "-t", "mangle", *words])
    before = {tool: _saved(ns, tool) for tool in tools}
    result = _compile_text(tmp_path, DUAL)
    assert result.policy is not None and result.output is not None
    commands = list(interface_commands(result.policy.interfaces[0]))
    assert {c.tool for c in commands} >= set(tools)

    def mark() -> None:
        for cmd in commands:
            if cmd.tool in tools:
                run([*exec_ns, cmd.tool, *cmd.args])

    mark()
    for tool in tools:
        saved = _saved(ns, tool)
        assert [r for r in saved if "TCDSL-eth0" in r and r.startswith("-A")] == DUAL_SAVED[tool]
        assert ":TCDSL-eth0 - [0:0]" in saved
        assert _foreign(saved) == before[tool]
    # The script's failure message offers this removal: both tables, only what it made.
    undo = next(line for line in result.output.splitlines() if line.startswith("tcdsl_undo='"))
    assert "ip6tables -t mangle -X TCDSL-eth0" in undo
    run([*exec_ns, "sh", "-c", f'{undo}; eval "$tcdsl_undo" 2>/dev/null || true'])
    assert {tool: _saved(ns, tool) for tool in tools} == before
    # Marked again, then the next version (no marking) removes the chain from both tables.
    mark()
    apply_for_traffic(ns, _compile_text(tmp_path, V2), tmp_path)
    assert {tool: _saved(ns, tool) for tool in tools} == before


# ==== two trees' marks on one router: E273, in the guest =========================================

WAN0 = (
    "interface wan0 htb rate 10mbit default bulk {{\n"
    "    classify by mark from lan0{mask}\n"
    "    class pings rate 1mbit match proto icmp\n"
    "    class bulk rate 1mbit\n"
    "}}\n"
)
WAN1 = (
    "interface wan1 htb rate 10mbit default bulk {{\n"
    "    classify by mark from lan0{mask}\n"
    "    class web rate 1mbit match proto tcp dport 80\n"
    "    class pings rate 1mbit match proto icmp\n"
    "    class bulk rate 1mbit\n"
    "}}\n"
)
"""Two WAN uplinks of one router, both marking what arrives on its LAN: wan1's class 1:10
(web) has the mark of wan0's pings (0xa)."""

ROUTER = r"""
mkdir -p bin && printf '#!/bin/sh\n:\n' >bin/flock && chmod +x bin/flock && PATH=$PWD/bin:$PATH
echo 1 > /proc/sys/net/ipv4/ip_forward
peers=
for side in lan0 wan0 wan1; do
    unshare -n sleep 120 &
    peers="$peers $!"
    eval "ns_$side=$!"
done
sleep 0.3
n=0
for side in lan0 wan0 wan1; do
    eval "pid=\$ns_$side"
    ip link add "$side" type veth peer name p0
    ip link set p0 netns "$pid"
    ip addr add "10.$n.0.1/24" dev "$side"
    ip link set "$side" up
    nsenter -t "$pid" -n sh -c "ip addr add 10.$n.0.2/24 dev p0 && ip link set p0 up &&
        ip link set lo up && ip route add default via 10.$n.0.1"
    n=$((n + 1))
done
sleep 0.5
pings() {
    nsenter -t "$ns_lan0" -n ping -q -c 5 -i 0.1 10.2.0.2 >/dev/null
    echo "== $1"
    tc -s class show dev wan1 | awk '/^class/ {id = $3} /Sent/ {print "class", id, $4}'
}
SCRIPTS
kill $peers
"""


def _classes(out: str, section: str) -> dict[str, int]:
    return {
        words[1]: int(words[2])
        for line in _section(out, section).splitlines()
        if (words := line.split())[:1] == ["class"]
    }


def test_two_wans_marking_one_lan_need_marks_apart_in_the_guest(tmp_path: Path) -> None:
    """What E273 is about, on a kernel: wan0 and wan1 of one router both classify by mark
    what arrives on lan0. As two policies (E273 sees one policy at a time), wan0's chain,
    jumped to first, marks the pings to wan1's side with its pings mark (0xa), wan1's rules
    leave them marked, and wan1 classifies them as its web class (1:10), not pings (1:20):
    the pings' counters stay 0. As one policy, E273 refuses it without masks; with disjoint
    masks the pings reach wan1's pings class."""
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    one, two = WAN0.format(mask=""), WAN1.format(mask="")
    together = compile_policy(str(_write(tmp_path / "both.tcp", one + two)))
    assert [d.code for d in together.diagnostics if d.code.startswith("E")] == ["E273"]
    apart = one.replace("from lan0", "from lan0 mask 0xffff") + two.replace(
        "from lan0", "from lan0 mask 0xffff0000"
    )
    scripts = {
        "wan1": _script(two, tmp_path, "wan1.tcp"),
        "wan0": _script(one, tmp_path, "wan0.tcp"),  # applied last: its jump comes first
        "apart": _script(apart, tmp_path, "apart.tcp"),
    }
    steps = "".join(
        f"cat > {name}.sh <<'TCDSL_{name}'\n{text}TCDSL_{name}\n" for name, text in scripts.items()
    )
    steps += "sh wan1.sh && sh wan0.sh || exit 1\npings separate\n"
    steps += "sh apart.sh || exit 1\npings apart\n"
    (res,) = uml.run_cases([uml.Case("wans", ROUTER.replace("SCRIPTS", steps))], timeout=300)
    assert res.exit_code == 0, res.stdout + res.stderr
    separate, kept = _classes(res.stdout, "separate"), _classes(res.stdout, "apart")
    assert separate.get("1:10") == 5 and separate.get("1:20") == 0, res.stdout
    assert kept.get("1:20") == 5 and kept.get("1:10") == 0, res.stdout


MASKED_DOWNLOAD = """\
interface eth0 {
    download connmark htb rate 10mbit default bulk {
        classify by mark from eth0 mask 0xff00
        class ssh rate 2mbit ceil 10mbit match proto tcp sport 22
        class bulk rate 8mbit ceil 10mbit
    }
}
"""

OTHER_CT_BITS = """\
table inet other {
    chain pre {
        type filter hook prerouting priority -150; policy accept;
        iifname "eth0" udp dport 7777 ct mark set ct mark or 0x30000
    }
    chain late {
        type filter hook input priority 100; policy accept;
        udp dport 7777 ct mark and 0x3ff00 == 0x31400 counter
        udp dport 7777 counter
    }
}
"""
"""Another user of the connection mark's bits 0x30000, set before tcdsl's rules (once conntrack
has the packet's connection: priority -200), and counters (after them) of the packets whose
connection has both its bits and the bulk class's mark."""


@pytest.mark.parametrize("marks", ["iptables", "nft"])
def test_a_masked_downloads_connection_mark_keeps_the_other_bits_on_the_host(
    marks: str, make_netns: Callable[[], str], tmp_path: Path
) -> None:
    """Found by a tester: under ``mask 0xff00`` the nft rules saved the packet's mark onto
    its connection as 'ct mark set meta mark and 0xff00', clearing another user's bits of the
    connection mark (iptables' CONNMARK --save-mark --mask keeps them). Packets arriving on
    eth0 now leave both: the other user's 0x30000 and the class's mark in 0xff00."""
    if run(["sh", "-c", "command -v nft"], check=False).returncode != 0:
        pytest.skip("needs nft (nftables)")
    here, peer = make_netns(), make_netns()
    run(["ip", "-n", here, "link", "add", "eth0", "type", "veth", "peer", "name", "p0",
         "netns", peer])  # fmt: skip
    run(["ip", "-n", here, "addr", "add", "10.98.0.1/24", "dev", "eth0"])
    run(["ip", "-n", peer, "addr", "add", "10.98.0.2/24", "dev", "p0"])
    run(["ip", "-n", here, "link", "set", "eth0", "up"])
    run(["ip", "-n", peer, "link", "set", "p0", "up"])
    exec_ns = ["ip", "netns", "exec", here]
    policy = tmp_path / "dl.tcp"
    policy.write_text(MASKED_DOWNLOAD, encoding="utf-8")
    if marks == "nft":
        rules = compile_policy(str(policy), "nft").output
        assert rules is not None and "ct mark set meta mark and" not in rules, rules
        run([*exec_ns, "nft", "-f", str(_write(tmp_path / "dl.nft", rules))])
    else:
        result = compile_policy(str(policy))
        assert result.policy is not None
        for iface in result.policy.interfaces:
            for cmd in interface_commands(iface):
                if cmd.tool in ("iptables", "ip6tables"):
                    run([*exec_ns, cmd.tool, *cmd.args])
    run([*exec_ns, "nft", "-f", str(_write(tmp_path / "other.nft", OTHER_CT_BITS))])
    send = (
        "import socket; s = socket.socket(2, 2)\n"
        "for _ in range(3): s.sendto(b'x', ('10.98.0.1', 7777))"
    )
    run(["ip", "netns", "exec", peer, sys.executable, "-c", send])
    listed = run([*exec_ns, "nft", "list", "chain", "inet", "other", "late"]).stdout
    both, every = [int(n) for n in re.findall(r"counter packets (\d+)", listed)]
    assert (both, every) == (3, 3), listed
