"""One match line, one policer: the filters a policed line becomes (values, port ranges, both
families) share one police action by an index allocated per tree, on every backend; the
kernel (user-mode Linux) meters them with one token bucket."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.allocate import POLICE_BLOCK, POLICE_INDEX_BASE, police_block
from tcdsl.commands import filter_police_words, interface_commands, teardown_commands
from tcdsl.driver import Result, analyse, compile_policy
from tcdsl.kernels import uml
from tcdsl.teach.simulate import simulate
from tcdsl.teach.traffic import parse_flow
from tcdsl.verify import runner
from tcdsl.verify.compare import actions_agree
from tcdsl.verify.expect import police_action
from tcdsl.verify.readback import parse_action

INGRESS = """\
interface eth0 {
    ingress {
        match all police rate 1mbit burst 10k drop
        match src 10.0.0.0/8 police rate 800kbit burst 10k drop
        match dport 80, 443 police rate 2mbit burst 20k mtu 9k continue
    }
}
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _compiled(tmp_path: Path, text: str, backend: str = "shell") -> Result:
    result = compile_policy(_write(tmp_path, text), backend)
    assert result.output is not None, [str(d) for d in result.diagnostics]
    return result


def _policed(result: Result, index: int = 0) -> list[ir.U32Filter | ir.FlowerFilter]:
    assert result.policy is not None
    return [
        f
        for f in result.policy.interfaces[index].filters
        if isinstance(f, ir.U32Filter | ir.FlowerFilter) and f.police is not None
    ]


def test_a_line_of_several_filters_shares_one_index(tmp_path: Path) -> None:
    """'match all': IPv4 and IPv6 filters, one index; a line of one filter (an IPv4 source)
    keeps a policer of its own; 'dport 80, 443': six filters (TCP and UDP guards on IPv6), one
    index."""
    filters = _policed(_compiled(tmp_path, INGRESS))
    block = police_block("eth0 ingress", set())
    got = [(f.span.line, f.family, f.police_index) for f in filters]
    assert got == [
        (3, "ipv4", block + 1),
        (3, "ipv6", block + 1),
        (4, "ipv4", None),
        (5, "ipv4", block + 2),
        (5, "ipv6", block + 2),
        (5, "ipv6", block + 2),
        (5, "ipv4", block + 2),
        (5, "ipv6", block + 2),
        (5, "ipv6", block + 2),
    ]


def test_the_tree_makes_the_action_and_every_filter_binds(tmp_path: Path) -> None:
    """Before the filters, 'tc actions replace' makes each shared action with its line's
    rate, burst and verdict; every filter of the line names the index only; a line of one
    filter keeps its own policer. The teardown deletes the shared actions after the tree."""
    result = _compiled(tmp_path, INGRESS)
    assert result.policy is not None
    block = police_block("eth0 ingress", set())
    words = [" ".join(filter_police_words(f)) for f in _policed(result)]
    assert words[:4] == [
        f"police index {block + 1}",
        f"police index {block + 1}",
        "police rate 800kbit burst 10k drop",
        f"police index {block + 2}",
    ]
    assert set(words[3:]) == {f"police index {block + 2}"}
    iface = result.policy.interfaces[0]
    tc = [" ".join(c.args) for c in interface_commands(iface)]
    made = [i for i, line in enumerate(tc) if line.startswith("actions")]
    assert [tc[i] for i in made] == [
        f"actions replace action police rate 1mbit burst 10k drop index {block + 1}",
        f"actions replace action police rate 2mbit burst 20k mtu 9k continue index {block + 2}",
    ]
    assert made[-1] < min(i for i, line in enumerate(tc) if line.startswith("filter"))
    assert teardown_commands(iface) == (
        ("tc", "qdisc", "del", "dev", "eth0", "ingress"),
        ("tc", "actions", "delete", "action", "police", "index", str(block + 1)),
        ("tc", "actions", "delete", "action", "police", "index", str(block + 2)),
    )


def test_flower_polices_with_an_action(tmp_path: Path) -> None:
    """flower takes a policer only as 'action police' (tc's f_flower.c has no 'police')."""
    text = INGRESS.replace("ingress {", "ingress classifier flower {")
    filters = _policed(_compiled(tmp_path, text))
    assert all(isinstance(f, ir.FlowerFilter) for f in filters)
    words = [" ".join(filter_police_words(f)) for f in filters[:3]]
    index = police_block("eth0 ingress", set()) + 1
    assert words == [
        f"action police index {index}",
        f"action police index {index}",
        "action police rate 800kbit burst 10k drop",
    ]


def test_two_trees_get_two_blocks() -> None:
    """Blocks come from the tree's label; a tree whose block another tree of the policy has
    takes the next one."""
    taken: set[int] = set()
    a = police_block("eth0", taken)
    assert a == police_block("eth0", set())
    assert (a - POLICE_INDEX_BASE) % POLICE_BLOCK == 0
    assert police_block("eth0", taken) == a + POLICE_BLOCK
    assert police_block("eth0 ingress", set()) != a


def test_upload_and_ingress_policers_do_not_meet(tmp_path: Path) -> None:
    text = INGRESS.replace(
        "    ingress {",
        "    upload htb rate 10mbit default b {\n"
        "        class a rate 5mbit match dport 22, 23 police rate 1mbit burst 10k\n"
        "        class b rate 5mbit\n    }\n    ingress {",
    )
    result = _compiled(tmp_path, text)
    up = {f.police_index for f in _policed(result, 0)}
    down = {f.police_index for f in _policed(result, 1)} - {None}
    assert len(up) == 1 and len(down) == 2 and not up & down


def test_more_policed_lines_than_a_block_is_e261(tmp_path: Path) -> None:
    lines = "".join(
        f"        match dport {n}, {n + 1} police rate 1mbit burst 10k\n" for n in range(1, 4097)
    )
    text = f"interface eth0 {{\n    ingress family ipv4 {{\n{lines}    }}\n}}\n"
    result = compile_policy(_write(tmp_path, text), "shell")
    codes = [d.code for d in result.diagnostics if d.code.startswith("E")]
    assert codes == ["E261"], codes[:5]
    last = result.diagnostics[-1]
    assert "more than 4095" in last.message and last.span.line == 4098


def test_the_batch_makes_the_action_and_its_map_names_the_line(tmp_path: Path) -> None:
    result = compile_policy(_write(tmp_path, INGRESS), "tc-batch")
    assert result.output is not None
    lines = result.output.splitlines()
    n = next(i for i, line in enumerate(lines, 1) if line.startswith("actions"))
    index = police_block("eth0 ingress", set()) + 1
    assert lines[n - 1] == f"actions replace action police rate 1mbit burst 10k drop index {index}"
    assert n < next(i for i, line in enumerate(lines, 1) if line.startswith("filter"))
    rows = next(t for name, t in result.files.items() if name.endswith(".map")).splitlines()
    row = next(r.split("\t") for r in rows if r.startswith(f"{n}\t"))
    assert row[1].endswith("policy.tcp:3:19") and f"police index {index}" in row[2], row


def _mbit(run_json: dict[str, object], name: str) -> float:
    found = run_json["flow_series"]
    assert isinstance(found, list)
    return next(float(x["mean_bps"]) / 1e6 for x in found if x["name"] == name)


def test_simulate_meters_a_line_with_one_bucket(tmp_path: Path) -> None:
    """Two flows on one policed line (ports 80 and 443, IPv4 and IPv6) share its 3mbit; two
    flows on two lines get 3mbit each."""
    text = """\
interface eth0 htb rate 50mbit default bulk {
    class web rate 20mbit ceil 50mbit match dport 80, 443 police rate 3mbit burst 30k
    class ssh rate 10mbit ceil 50mbit match dport 22 police rate 3mbit burst 30k
    class dns rate 10mbit ceil 50mbit match dport 53 police rate 3mbit burst 30k
    class bulk rate 10mbit ceil 50mbit
}
"""
    result = analyse(_write(tmp_path, text))
    assert result.policy is not None
    flows = [
        parse_flow("a: tcp dport 80 rate 8mbit"),
        parse_flow("b: ipv6 tcp dport 443 rate 8mbit"),
        parse_flow("c: tcp dport 22 rate 8mbit"),
        parse_flow("d: ipv6 udp dport 53 rate 8mbit"),
    ]
    run = simulate(result.policy, flows, 4_000_000).to_json()
    assert _mbit(run, "a") + _mbit(run, "b") == pytest.approx(3.0, rel=0.1)
    assert _mbit(run, "c") == pytest.approx(3.0, rel=0.1)
    assert _mbit(run, "d") == pytest.approx(3.0, rel=0.1)


LAB = r"""
modprobe ipv6
mkdir -p bin && printf '#!/bin/sh\n:\n' >bin/flock && chmod +x bin/flock && PATH=$PWD/bin:$PATH
unshare -n sleep 60 &
peer=$!
sleep 0.3
ip link add eth0 type veth peer name p0
ip link set p0 netns "$peer"
ip addr add 10.9.0.1/24 dev eth0
ip -6 addr add fd09::1/64 dev eth0 nodad
ip link set eth0 up
in_peer() { nsenter -t "$peer" -n "$@"; }
# Not 'sh -c': the peer's shell would run busybox's ip, which has no 'nodad'.
in_peer /usr/bin/ip addr add 10.9.0.2/24 dev p0
in_peer /usr/bin/ip -6 addr add fd09::2/64 dev p0 nodad
in_peer /usr/bin/ip link set p0 up
sleep 0.5
nsenter -t "$peer" -n ping -c 1 -w 2 10.9.0.1 >/dev/null
nsenter -t "$peer" -n ping -6 -c 1 -w 2 fd09::1 >/dev/null
iptables -A INPUT -i eth0 -p icmp
ip6tables -A INPUT -i eth0 -p ipv6-icmp --icmpv6-type echo-request
APPLY
start=$(cut -d' ' -f1 /proc/uptime)
nsenter -t "$peer" -n ping -q -c 100000 -i 0.001 -s 1400 -w 3 10.9.0.1 | \
    awk '/transmitted/ {print "offered4", $1 * 1428}' >offered4 &
p4=$!
nsenter -t "$peer" -n ping -6 -q -c 100000 -i 0.001 -s 1400 -w 3 fd09::1 | \
    awk '/transmitted/ {print "offered6", $1 * 1448}' >offered6 &
p6=$!
wait "$p4" "$p6"
cat offered4 offered6
end=$(cut -d' ' -f1 /proc/uptime)
echo "seconds $start $end"
iptables -nvxL INPUT | awk 'NR == 3 {print "passed4", $2}'
ip6tables -nvxL INPUT | awk 'NR == 3 {print "passed6", $2}'
tc actions list action police | tr '\n\t' '  ' | sed 's/^/actions /'; echo
tc filter show dev eth0 ingress | sed 's/^/filter /'
AFTER
kill "$peer"
"""


def _uml() -> None:
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")


SHARED = "interface eth0 {\n  ingress { match all police rate 1mbit burst 10k drop }\n}\n"


def _rates(stdout: str) -> dict[str, float]:
    words = {line.split()[0]: line.split()[1:] for line in stdout.splitlines() if line.strip()}
    start, end = (float(w) for w in words["seconds"])
    seconds = end - start
    out = {k: int(words[k][0]) * 8 / seconds for k in ("offered4", "offered6")}
    passed = int(words["passed4"][0]) + int(words["passed6"][0])
    out["passed"] = (passed - 10 * 1024) * 8 / seconds
    return out


def _unshared(script: str) -> str:
    """The script as it was before lines shared a policer: each filter its own."""
    script = re.sub(r"police index \d+ flowid", "police rate 1mbit burst 10k drop flowid", script)
    return "\n".join(line for line in script.splitlines() if "tc actions " not in line) + "\n"


def _lab(script: str, after: str = "") -> str:
    apply = f"cat >apply.sh <<'EOF'\n{script}EOF\nsh ./apply.sh || exit 1"
    return LAB.replace("APPLY", apply).replace("AFTER", after)


def test_one_bucket_for_ipv4_and_ipv6_in_user_mode_linux(tmp_path: Path) -> None:
    """Measured: IPv4 and IPv6 pings sent into eth0 together, each at Mbit/s; 'match all
    police rate 1mbit' passes about 1mbit in all (its two filters share one action: 'ref 2
    bind 2', and one reference the action holds), where a policer per filter passed about
    2mbit; the action stays when the ingress qdisc goes, and the teardown's delete frees it."""
    _uml()
    script = _compiled(tmp_path, SHARED).output or ""
    index = police_block("eth0 ingress", set()) + 1
    after = (
        "tc qdisc del dev eth0 ingress\n"
        "sleep 0.5\n"
        "printf 'left %s\\n' \"$(tc actions list action police | tr '\\n\\t' '  ')\"\n"
        f"tc actions delete action police index {index}\n"
        "printf 'gone %s\\n' \"$(tc actions list action police | tr '\\n\\t' '  ')\"\n"
    )
    shared, unshared = uml.run_cases(
        [uml.Case("shared", _lab(script, after)), uml.Case("unshared", _lab(_unshared(script)))],
        timeout=180,
    )
    assert shared.exit_code == 0, shared.stderr
    assert unshared.exit_code == 0, unshared.stderr
    one, two = _rates(shared.stdout), _rates(unshared.stdout)
    print(
        f"offered {one['offered4'] / 1e6:.2f} + {one['offered6'] / 1e6:.2f} Mbit/s: one policer "
        f"passed {one['passed'] / 1e6:.3f} Mbit/s, a policer per filter "
        f"{two['passed'] / 1e6:.3f} (of {two['offered4'] / 1e6:.2f} + "
        f"{two['offered6'] / 1e6:.2f})"
    )
    assert min(one["offered4"], one["offered6"]) > 1.5e6, one
    # One bucket of 1mbit: never the 2 Mbit/s of two, nor nothing. Below the rate, the guest's
    # clock decides: on this host in December 2026 it passed 0.82-0.83 Mbit/s, run after run
    # (0.9-1.1 before, on the same code), where its senders' own rates still held.
    assert 0.6e6 < one["passed"] < 1.15e6, one
    # A policer per filter passes each family's Mbit/s: about 2 in all, less when the guest's
    # senders fall behind on a loaded host (1.63 measured once): clearly more than one passes.
    assert 1.3 * one["passed"] < two["passed"] < 2.3e6, (one, two)
    actions = next(line for line in shared.stdout.splitlines() if line.startswith("actions"))
    assert f"police {index:#x} rate 1Mbit" in actions and "ref 3 bind 2" in actions, actions
    assert "total acts 1" in actions, actions
    # verify reads each filter's policer back with the shared action's parameters, which
    # are the line's: its expectation (the line's policer on every filter) holds.
    police = _policed(_compiled(tmp_path, SHARED))[0].police
    assert police is not None
    read = [
        a
        for line in shared.stdout.splitlines()
        if line.startswith("filter ")
        and (a := parse_action(line.removeprefix("filter "))) is not None
    ]
    assert len(read) == 2 and all(actions_agree([police_action(police)], [a]) for a in read), read
    left = next(line for line in shared.stdout.splitlines() if line.startswith("left"))
    assert "ref 1 bind 0" in left, left
    gone = next(line for line in shared.stdout.splitlines() if line.startswith("gone"))
    assert "police" not in gone.removeprefix("gone"), gone


def test_re_applying_at_once_takes_the_action_over_in_user_mode_linux(tmp_path: Path) -> None:
    """The batch applied twice in a row (its second run's teardown leaves the first run's
    action, bound to filters the kernel frees later), then the script twice, over an action
    made by hand at the line's index with another rate: every run succeeds, and the end state
    is one action with the line's rate, bound by the tree's two filters."""
    _uml()
    path = _write(tmp_path, SHARED)
    script = compile_policy(path, "shell").output or ""
    batch = compile_policy(path, "tc-batch").output or ""
    index = police_block("eth0 ingress", set()) + 1
    case = (
        "mkdir -p bin && printf '#!/bin/sh\\n:\\n' >bin/flock && chmod +x bin/flock\n"
        "PATH=$PWD/bin:$PATH\n"
        "ip link add eth0 type veth peer name p0\n"
        f"tc actions add action police rate 5mbit burst 20k index {index}\n"
        f"cat >apply.sh <<'EOF'\n{script}EOF\n"
        f"cat >policy.batch <<'EOF'\n{batch}EOF\n"
        'tc -batch policy.batch && tc -batch policy.batch; echo "batch $?"\n'
        'sh ./apply.sh && sh ./apply.sh; echo "script $?"\n'
        "tc actions list action police | tr '\\n\\t' '  ' | sed 's/^/actions /'; echo\n"
        "tc filter show dev eth0 ingress | sed 's/^/filter /'\n"
    )
    (done,) = uml.run_cases([uml.Case("again", case)], timeout=120)
    assert done.exit_code == 0, done.stderr
    out = done.stdout
    assert re.search(r"^batch 0$", out, re.M) and re.search(r"^script 0$", out, re.M), (
        out + done.stderr
    )
    actions = next(line for line in out.splitlines() if line.startswith("actions"))
    assert f"police {index:#x} rate 1Mbit burst 10Kb" in actions, actions
    assert "ref 3 bind 2" in actions and "total acts 1" in actions, actions
    assert len([t for t in out.splitlines() if t.startswith("filter") and "*flowid" in t]) == 2


def test_flower_filters_share_a_policer_in_user_mode_linux(tmp_path: Path) -> None:
    """Under 'classifier flower' the line's filters bind one action ('action police index N')."""
    _uml()
    text = SHARED.replace("ingress {", "ingress classifier flower {")
    script = _compiled(tmp_path, text).output or ""
    index = police_block("eth0 ingress", set()) + 1
    case = (
        "modprobe ipv6\n"
        "mkdir -p bin && printf '#!/bin/sh\\n:\\n' >bin/flock && chmod +x bin/flock\n"
        "PATH=$PWD/bin:$PATH\n"
        "ip link add eth0 type veth peer name p0\n"
        f"cat >apply.sh <<'EOF'\n{script}EOF\n"
        "sh ./apply.sh || exit 1\n"
        "tc actions list action police | tr '\\n\\t' '  '; echo\n"
        "tc filter show dev eth0 ingress\n"
    )
    (done,) = uml.run_cases([uml.Case("flower", case)], timeout=120)
    assert done.exit_code == 0, done.stderr
    assert f"police {index:#x} rate 1Mbit" in done.stdout, done.stdout
    assert "ref 3 bind 2" in done.stdout and "total acts 1" in done.stdout, done.stdout
    assert done.stdout.count("flower chain 0 handle") == 2, done.stdout
