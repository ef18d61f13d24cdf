"""The generated shell script: valid POSIX sh, lint-clean, safe with hostile names, idempotent.

Nothing here needs root: scripts run only against a fake ``tc`` (and ``iptables``) that record
their arguments.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tcdsl import ir
from tcdsl.backend import BackendOptions
from tcdsl.commands import default_chain, owned_chains, teardown_commands
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tests.conftest import ROOT, policy_files

APPLY_POLICIES = ROOT / "tests" / "apply_policies"
CASES = [*policy_files(), *sorted(p.relative_to(ROOT) for p in APPLY_POLICIES.glob("*.tcp"))]
IDS = [str(p) for p in CASES]


def _compile(policy: Path) -> Result:
    result = compile_policy(str(ROOT / policy))
    assert result.output is not None, render(result.diagnostics, result.sources)
    return result


def _compile_text(tmp_path: Path, text: str, per_command: bool = False) -> Result:
    path = tmp_path / "policy.tcp"
    path.write_text(text, encoding="utf-8")
    return compile_policy(str(path), options=BackendOptions(batch=not per_command))


def _commands(script: str) -> list[str]:
    """The script's command lines: no blank lines, no comments."""
    return [line for line in script.splitlines() if line.strip() and not line.startswith("#")]


# ==== every policy: syntax, lint, teardown first ===============================================


@pytest.mark.parametrize("policy", CASES, ids=IDS)
def test_sh_syntax(policy: Path, tmp_path: Path) -> None:
    script = tmp_path / "apply.sh"
    script.write_text(_compile(policy).output or "", encoding="utf-8")
    proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("policy", CASES, ids=IDS)
def test_shellcheck(policy: Path, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        print("shellcheck is not on PATH; skipping the lint of generated scripts")
        pytest.skip("shellcheck not installed")
    script = tmp_path / "apply.sh"
    script.write_text(_compile(policy).output or "", encoding="utf-8")
    proc = subprocess.run(
        ["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_passes_a_dollar_in_the_policys_file_name(tmp_path: Path) -> None:
    """Found by a tester: a '$' in a file name, single-quoted on purpose where the script
    says where a command came from, made shellcheck fail (SC2016, info) on a safe script."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    policy = tmp_path / "p'$(touch PWNED).tcp"
    policy.write_text("interface eth0 htb rate 1mbit default a { class a rate 1mbit }\n")
    result = compile_policy(str(policy))
    assert result.output is not None and "$(touch PWNED)" in result.output
    script = tmp_path / "apply.sh"
    script.write_text(result.output, encoding="utf-8")
    proc = subprocess.run(["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("policy", CASES, ids=IDS)
def test_teardown_before_add(policy: Path) -> None:
    """Re-running is safe: each interface's root qdisc (and iptables chain) is removed first,
    tolerating its absence, before anything is added on it."""
    result = _compile(policy)
    assert result.policy is not None and result.output is not None
    lines = [shlex.split(line) for line in _commands(result.output)]
    assert lines[0] == ["set", "-eu"], "the script must stop at the first failing command"
    for iface in result.policy.interfaces:
        at = []
        for teardown in map(list, teardown_commands(iface)):
            found = [i for i, words in enumerate(lines) if _holds(words, teardown)]
            assert len(found) == 1, f"no single '{' '.join(teardown)}' for {iface.label}"
            words = lines[found[0]]
            tolerant = words[-2:] == ["||", "true"] or words[:1] == ["!"]
            assert tolerant, f"the teardown must tolerate absence: {' '.join(words)}"
            at += found
        first = min(at)
        for i, words in enumerate(lines):
            if _builds(words, iface):
                assert i > first, f"{' '.join(words)} comes before the teardown of {iface.label}"
        # The chain (the policy's, or the default one an earlier version may have left) goes
        # with every jump into it (tcdsl_unmark), before anything is added; an ingress tree
        # marks nothing and leaves its interface's chain to the interface's egress tree.
        chains = owned_chains(result.policy)[iface.label]
        if iface.direction != "ingress":
            mine = iface.marking.chain if iface.marking is not None else default_chain(iface.name)
            assert mine in chains
        for chain in chains:
            removals = [i for i, words in enumerate(lines) if words == ["tcdsl_unmark", chain]]
            assert len(removals) == 1, f"chain {chain}: expected one tcdsl_unmark"
            assert removals[0] > first
            if iface.marking is not None and chain == iface.marking.chain:
                assert removals[0] < lines.index(["iptables", "-t", "mangle", "-N", chain])


def _holds(words: list[str], command: list[str]) -> bool:
    """``command`` is in the line ``words`` (a teardown may follow a guard: ``! test || cmd``)."""
    n = len(command)
    return any(words[i : i + n] == command for i in range(len(words) - n + 1))


def _builds(words: list[str], iface: ir.Interface) -> bool:
    """The line is a ``tc ... add`` on what the tree ``iface`` owns: its device's root, or
    the ingress qdisc (``ffff:``) of the interface it polices or redirects downloads from."""
    if words[:1] != ["tc"] or words[2] != "add" or words[3] != "dev":
        return False
    dev, ingress = words[4], "ffff:" in words
    if iface.download is not None:
        return dev == iface.name or (dev == iface.download.interface and ingress)
    return dev == iface.name and ingress == (iface.direction == "ingress")


# ==== hostile names =============================================================================

FAKE_TOOL = """#!/bin/sh
# Record this call: a header with the tool's name and argc, then each argument on its own line.
{ printf '@@ %s %s\\n' "${0##*/}" "$#"; for a in "$@"; do printf '%s\\n' "$a"; done; } \\
    >> "$FAKE_LOG"
# Nothing exists yet: deleting fails (the script's teardown loops run "until -D fails").
case " $* " in *" -D "*) exit 1 ;; esac
exit 0
"""
SENTINEL = """#!/bin/sh
echo "${0##*/}" >> "$PWNED"
"""


def run_with_fake_tools(
    script: str, tmp_path: Path, missing: tuple[str, ...] = (), status: int = 0
) -> list[tuple[str, list[str]]]:
    """Run ``script`` with ``sh -x`` against fake tc/ip/iptables/ip6tables (but the
    ``missing`` ones); check it exits with ``status``; return the recorded calls.

    Commands an injection would reach for (``reboot``, ``id``, ...) are sentinels that leave a
    trace; the test fails if any of them ran.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = [(t, FAKE_TOOL) for t in ("tc", "ip", "iptables", "ip6tables") if t not in missing]
    for name, text in real + [(s, SENTINEL) for s in ("reboot", "id", "whoami", "touch", "rm")]:
        tool = bin_dir / name
        tool.write_text(text, encoding="utf-8")
        tool.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    for name in ("eth0", "eth1", "a", "b"):  # something for an unquoted glob to expand to
        (work / name).touch()
    (tmp_path / "apply.sh").write_text(script, encoding="utf-8")
    log, pwned = tmp_path / "calls.log", tmp_path / "pwned"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_LOG": str(log),
        "PWNED": str(pwned),
        "TCDSL_LOCK_DIR": str(tmp_path / "locks"),
    }
    proc = subprocess.run(
        ["sh", "-x", str(tmp_path / "apply.sh")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=20,
    )
    (tmp_path / "said").write_text(proc.stderr, encoding="utf-8")
    assert proc.returncode == status, proc.stderr
    assert not pwned.exists(), f"the script ran {pwned.read_text()}; trace:\n{proc.stderr}"
    calls: list[tuple[str, list[str]]] = []
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    i = 0
    while i < len(lines):
        head = lines[i].split()
        assert head[0] == "@@", lines[i]
        argc = int(head[2])
        calls.append((head[1], lines[i + 1 : i + 1 + argc]))
        i += 1 + argc
    return calls


def _assert_one_word(script: str, calls: list[tuple[str, list[str]]], names: set[str]) -> None:
    """Every call names devices and chains with exactly the policy's words."""
    expected_calls = [line for line in _commands(script) if line.startswith(("tc ", "iptables "))]
    # The iptables teardown loop runs -D until it fails; the fake succeeds, so count by hand
    # (and the script's functions read with 'tc ... show', from no line of their own).
    assert len([c for c in calls if c[0] == "tc" and c[1][1:2] != ["show"]]) == sum(
        1 for line in expected_calls if line.startswith("tc ")
    )
    for tool, argv in calls:
        for flag in ("dev", "-i", "-j", "-N", "-A", "-F", "-X"):
            if flag in argv and tool in (("tc",) if flag == "dev" else ("iptables", "ip6tables")):
                word = argv[argv.index(flag) + 1]
                if flag == "-j" and word == "MARK":
                    continue
                assert word in names, f"{tool} got {word!r} after {flag}: {argv}"


UNUSUAL_NAMES = ["e-th.0@x", "$(id)", "it's", "`id`", "a\\b", "*", "eth0;reboot", "x&&rm", "-x"]


@pytest.mark.parametrize("name", UNUSUAL_NAMES)
def test_unusual_interface_name_is_one_word(name: str, tmp_path: Path) -> None:
    """Each command of the per-command form gets the name as one word; the default form's
    tc -batch input (a quoted here-document, which the shell leaves alone) runs nothing else."""
    text = (
        f'interface "{name}" htb rate 10mbit default rest {{\n'
        "    class web rate 5mbit match dport 80\n"
        "    class rest rate 1mbit { pfifo limit 10 }\n"
        "}\n"
    )
    batch = _compile_text(tmp_path, text)
    if batch.output is not None:
        (tmp_path / "batch").mkdir()
        calls = run_with_fake_tools(batch.output, tmp_path / "batch")
        tc = [argv for tool, argv in calls if tool == "tc"]
        # after the batch, only reads (what an earlier version left in the ingress slot)
        after = tc[tc.index(["-batch", "-"]) + 1 :]
        assert all(argv[1] == "show" and argv[2:4] == ["dev", name] for argv in after), after
    result = _compile_text(tmp_path, text, per_command=True)
    if result.output is None:
        assert {d.code for d in result.errors} == {"E009"}, render(
            result.diagnostics, result.sources
        )
        return
    calls = run_with_fake_tools(result.output, tmp_path)
    assert calls, "the script called no tc at all"
    # iptables removes the default chain an earlier version with marking may have left.
    _assert_one_word(result.output, calls, {name, default_chain(name)})
    assert all(argv[argv.index("dev") + 1] == name for tool, argv in calls if tool == "tc")


def test_unusual_names_with_marking_are_one_word(tmp_path: Path) -> None:
    """``classify by mark`` puts names into iptables commands too."""
    text = (
        'interface "o$(id)" htb rate 10mbit default rest {\n'
        '    classify by mark from "i;reboot"\n'
        "    class web rate 5mbit match proto tcp dport 80\n"
        "    class rest rate 1mbit\n"
        "}\n"
    )
    result = _compile_text(tmp_path, text, per_command=True)
    assert result.policy is not None and result.output is not None
    chain = result.policy.interfaces[0].marking.chain  # type: ignore[union-attr]
    assert chain is not None and re.fullmatch(r"TCDSL-[A-Za-z0-9_.-]+", chain), chain
    calls = run_with_fake_tools(result.output, tmp_path)
    _assert_one_word(result.output, calls, {"o$(id)", "i;reboot", chain})
    assert {tool for tool, _ in calls} >= {"iptables", "ip6tables"}
    # A chain name that needs quoting is refused: an iptables-restore file cannot hold it.
    refused = _compile_text(tmp_path, text.replace('"i;reboot"', '"i;reboot" chain "C`id`"'))
    assert [d.code for d in refused.errors] == ["E216"], render(
        refused.diagnostics, refused.sources
    )


def test_semicolon_interface_rejected_or_quoted(tmp_path: Path) -> None:
    result = _compile_text(tmp_path, 'interface "eth0;reboot" htb rate 1mbit\n')
    if result.output is None:
        assert "E009" in {d.code for d in result.errors}
        return
    commands = [line for line in _commands(result.output) if line.startswith(("tc ", "iptables "))]
    used = [line for line in commands if "eth0;reboot" in line]
    assert used, "the interface is not in the script"
    for line in used:
        assert line.count("eth0;reboot") == line.count("'eth0;reboot'"), line
        assert "eth0;reboot" in shlex.split(line), line


@pytest.mark.parametrize(
    "name", ["a b", "x/y", "a%d", "a:b", "tab\there", "abcdefghijklmnop", ".", "..", ""]
)
def test_invalid_interface_name_is_e009(name: str, tmp_path: Path) -> None:
    result = _compile_text(tmp_path, f'interface "{name}" htb rate 1mbit\n')
    assert result.output is None
    assert "E009" in {d.code for d in result.errors}, render(result.diagnostics, result.sources)


@pytest.mark.parametrize("name", ["a b", "x/y", "abcdefghijklmnop", "."])
def test_invalid_mark_source_interface_is_e009(name: str, tmp_path: Path) -> None:
    result = _compile_text(
        tmp_path,
        "interface eth0 htb rate 1mbit {\n"
        f'    classify by mark from "{name}"\n'
        "    class a rate 1mbit match proto tcp dport 80\n"
        "}\n",
    )
    assert result.output is None
    assert "E009" in {d.code for d in result.errors}, render(result.diagnostics, result.sources)


def test_fifteen_byte_name_is_accepted(tmp_path: Path) -> None:
    result = _compile_text(tmp_path, 'interface "abcdefghijklmno" htb rate 1mbit\n')
    assert result.output is not None, render(result.diagnostics, result.sources)


def test_command_substitution_class_name_is_a_diagnostic(tmp_path: Path) -> None:
    text = "interface eth0 htb rate 1mbit {\n    class $(id) rate 1mbit\n}\n"
    result = _compile_text(tmp_path, text)
    assert result.output is None and result.errors, "a class named $(id) must be rejected"
    assert all(d.span.line == 2 for d in result.errors), render(result.diagnostics, result.sources)
    # The command line reports it as a policy error (exit 1), never an internal one.
    cli = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tcdsl.cli import main; main()",
            "compile",
            str(tmp_path / "policy.tcp"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert cli.returncode == 1, cli.stderr
    assert "Traceback" not in cli.stderr and "internal error" not in cli.stderr, cli.stderr
    assert "$(id)" in cli.stderr and cli.stdout == ""


def test_quantum_is_written_as_plain_bytes(tmp_path: Path) -> None:
    """htb and fq_codel read quantum as a plain number; tc refuses "quantum 2k"."""
    path = tmp_path / "q.tcp"
    path.write_text(
        "interface eth0 htb rate 10mbit default a {\n"
        "    class a rate 1mbit quantum 2k { fq_codel quantum 2048 }\n"
        "}\n",
        encoding="utf-8",
    )
    for backend in ("shell", "tc-batch"):
        result = compile_policy(str(path), backend)
        assert result.output is not None
        assert "htb rate 1mbit quantum 2048" in result.output
        assert "fq_codel quantum 2048" in result.output
        assert "quantum 2k" not in result.output


# ==== chain names the policy may own ===========================================================


def _marking_policy(chain: str = "", interface: str = "eth0") -> str:
    named = f' chain "{chain}"' if chain else ""
    return (
        f'interface "{interface}" htb rate 10mbit default rest {{\n'
        f"    classify by mark from eth1{named}\n"
        "    class web rate 5mbit match proto tcp dport 80\n"
        "    class rest rate 1mbit\n"
        "}\n"
    )


@pytest.mark.parametrize(
    "name", ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING", "output", "Prerouting"]
)
def test_builtin_chain_in_any_spelling_is_e215(name: str, tmp_path: Path) -> None:
    """The teardown flushes the policy's chain: a built-in one would lose the system's rules."""
    result = _compile_text(tmp_path, _marking_policy(chain=name))
    assert result.output is None
    assert [(d.code, d.span.line, d.span.column) for d in result.errors] == [("E215", 2, 38)]


def test_teardown_names_only_the_policy_chain(tmp_path: Path) -> None:
    """The script's iptables teardown names the policy's chain, nothing else: tcdsl_unmark
    deletes only jumps whose target is exactly that chain (tests/test_marks_kernel.py runs it
    against a real mangle table)."""
    result = _compile_text(tmp_path, _marking_policy(chain="shaper.eth0"))
    assert result.output is not None
    lines = [shlex.split(line) for line in _commands(result.output)]
    # ... and the default chain an earlier version (without 'chain') may have left.
    assert [w for w in lines if w[:1] == ["tcdsl_unmark"]] == [
        ["tcdsl_unmark", "shaper.eth0"],
        ["tcdsl_unmark", "TCDSL-eth0"],
    ]
    assert "awk -v c=\"$1\" '$2 == c { print $1; exit }'" in result.output


def test_default_chain_is_derived_from_the_interface(tmp_path: Path) -> None:
    """Policies for different interfaces never share a default chain, and a default chain is
    always a name every backend can write as it is."""
    chains = []
    for name in ["eth0", "eth&0", "eth_0", "it's", "$(x)", "abcdefghijklmn&"]:
        result = _compile_text(tmp_path, _marking_policy(interface=name))
        assert result.policy is not None, render(result.diagnostics, result.sources)
        chain = result.policy.interfaces[0].marking.chain  # type: ignore[union-attr]
        assert chain is not None and re.fullmatch(r"TCDSL-[A-Za-z0-9_.-]{1,22}", chain), chain
        chains.append(chain)
    assert chains[0] == "TCDSL-eth0"
    assert len(set(chains)) == len(chains), chains


DUAL_MARKS = """\
interface eth0 htb rate 10mbit default rest {
    classify by mark from eth1
    class web rate 5mbit match proto tcp dport 443
    class v6 rate 1mbit match src 2001:db8::/64
    class rest rate 1mbit
}
"""


def test_ipv6_marking_runs_ip6tables_with_the_same_chain(tmp_path: Path) -> None:
    """A dual-stack tree marks with iptables and ip6tables: the same chain and jump in each,
    each table with its own family's rules."""
    result = _compile_text(tmp_path, DUAL_MARKS)
    assert result.output is not None, render(result.diagnostics, result.sources)
    calls = run_with_fake_tools(result.output, tmp_path)
    by_tool = {
        tool: [argv for t, argv in calls if t == tool and "-S" not in argv and "-L" not in argv]
        for tool in ("iptables", "ip6tables")
    }
    for tool in ("iptables", "ip6tables"):
        made = [argv for argv in by_tool[tool] if "-F" not in argv and "-X" not in argv]
        assert made[:2] == [
            ["-t", "mangle", "-N", "TCDSL-eth0"],
            ["-t", "mangle", "-I", "PREROUTING", "-i", "eth1", "-j", "TCDSL-eth0"],
        ], tool
    rules = {tool: [a for a in by_tool[tool] if "-A" in a] for tool in by_tool}
    assert [a for a in rules["iptables"] if "-s" in a] == []
    assert [a[a.index("-s") + 1] for a in rules["ip6tables"] if "-s" in a] == ["2001:db8::/64"]
    assert all(len(rules[t]) == n for t, n in (("iptables", 2), ("ip6tables", 3))), rules
    # tcdsl_unmark looked in both tables before building.
    assert {t for t, argv in calls if argv[:3] == ["-t", "mangle", "-S"]} == {
        "iptables",
        "ip6tables",
    }


def test_missing_ip6tables_refuses_before_changing_anything(tmp_path: Path) -> None:
    result = _compile_text(tmp_path, DUAL_MARKS)
    assert result.output is not None
    calls = run_with_fake_tools(result.output, tmp_path, missing=("ip6tables",), status=1)
    assert calls == [], "the script changed something before refusing"
    said = (tmp_path / "said").read_text(encoding="utf-8")
    assert "tcdsl: ip6tables is missing, and this policy needs it to mark IPv6 packets" in said
    assert "nothing was changed" in said


def test_ipv4_only_marking_needs_no_ip6tables(tmp_path: Path) -> None:
    """A tree restricted to IPv4 emits no ip6tables command and runs without ip6tables."""
    text = DUAL_MARKS.replace("interface eth0 htb", "interface eth0 family ipv4 htb")
    text = text.replace("    class v6 rate 1mbit match src 2001:db8::/64\n", "")
    result = _compile_text(tmp_path, text)
    assert result.output is not None, render(result.diagnostics, result.sources)
    assert "ip6tables -t" not in result.output and "tcdsl_needs ip6tables" not in result.output
    assert "protocol ipv6" not in result.output
    calls = run_with_fake_tools(result.output, tmp_path, missing=("ip6tables",))
    assert any(tool == "iptables" for tool, _ in calls)
    assert not any(tool == "ip6tables" for tool, _ in calls)
