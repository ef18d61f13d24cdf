"""``tcdsl import``: a policy read back from the kernel builds the same kernel state.

Round trip, on real kernels: each example policy (and a batch of generated ones) is compiled
and applied in a fresh network namespace; what tc shows of it is imported into a policy; that
policy is compiled and applied in a second namespace; the two read-backs (qdiscs, classes with
their parameters, filters in order, as ``tests/test_equivalence.py`` compares them) must be
equal. Policies the host kernel cannot hold run in the user-mode Linux guest, all cases of a
batch in one boot.

Unit tests: a hand-written script's saved tc text (wondershaper style) imported from a file;
what the language cannot say gives the warnings and the comments; errors are located and exit 1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tcdsl.ops.importer import import_policy
from tcdsl.ops.tctext import DeviceText, with_parent
from tcdsl.verify import runner, verifier
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import KernelState
from tests.conftest import ROOT, policy_files
from tests.test_apply import host, make_netns, run
from tests.test_ops import Tcdsl

__all__ = ["host", "make_netns"]  # fixtures, imported so that pytest finds them here

HERE = Path(__file__).parent
DATA = HERE / "import_data"


# ==== round trips ==============================================================================


@dataclass
class Planned:
    """A policy to round-trip: its name, compiled result, devices to make and to read."""

    name: str
    result: Result
    create: list[str]
    read: list[str]


def _compile(path: Path) -> Result:
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        return compile_policy(path.name, "shell")
    finally:
        os.chdir(cwd)


def _plan(name: str, path: Path) -> Planned:
    result = _compile(path)
    assert result.policy is not None and result.output is not None, render(
        result.diagnostics, result.sources
    )
    create, read = verifier.devices(result.policy)
    return Planned(name, result, list(create), list(read))


def _case(p: Planned, script: str, label: str) -> runner.Case:
    policy = p.result.policy
    queues = verifier.tx_queues(policy) if policy is not None else {}  # an mq root's device
    case = runner.case_script(label, script, p.create, p.read, queues=queues)
    return runner.Case(f"{p.name} {label}", case)


def device_texts(found: dict[str, runner.Section], read: Sequence[str]) -> dict[str, DeviceText]:
    """What a case printed of each device, as ``tcdsl import`` reads it."""
    out = {}
    for n, dev in enumerate(read):
        text = found.get(f"qdisc {n}", runner.Section("", 1)).text
        text += found.get(f"class {n}", runner.Section("", 1)).text
        prefix = f"filter {n} "
        for name, section in found.items():
            if name.startswith(prefix):
                text += with_parent(name[len(prefix) :], section.text)
        out[dev] = DeviceText(dev, f"tc:{dev}", text, raw=True)  # tc without -p
    return out


def _applied(result: runner.CaseResult | None, p: Planned) -> dict[str, runner.Section]:
    assert result is not None, f"{p.name}: the guest stopped before this case"
    found = runner.sections(result.stdout)
    applied = found.get("apply-stderr")
    assert applied is not None and applied.status == 0, (
        f"{result.name} failed:\n{applied.text[-3000:] if applied else result.stdout[-3000:]}"
    )
    return found


def imported_text(p: Planned, texts: dict[str, DeviceText]) -> tuple[str, set[str]]:
    """The policy ``tcdsl import`` writes for every interface of ``p``'s policy, and the codes
    of its warnings."""
    assert p.result.policy is not None
    out = []
    codes: set[str] = set()
    # every device the case made (a download's IFB, made by the script, is imported with its
    # interface's download), but those with nothing to import: 'classify by mark from' ones
    for name in [n for n in p.create if n in texts]:
        got = import_policy(texts[name], texts.get)
        if got.policy is None and [d.code for d in got.diagnostics] == ["E606"]:
            continue
        assert got.policy is not None, render(got.diagnostics, got.sources)
        out.append(got.policy)
        codes |= {d.code for d in got.diagnostics}
    return "\n".join(out), codes


Run = Callable[[list[runner.Case]], Sequence[runner.CaseResult | None]]


def _describes(policy: Result, state: KernelState) -> list[str]:
    """How ``state`` differs from what ``policy`` creates, as ``tcdsl verify`` compares them
    (values through tc's rounding), iptables left out (import reads tc's state only)."""
    assert policy.policy is not None
    expected = expected_policy(policy.policy, policy.sources)
    expected = replace(
        expected, interfaces=tuple(replace(i, chains=()) for i in expected.interfaces)
    )
    return [f"{d.code} {d.message}" for d in compare_state(expected, state)]


ROUNDED = re.compile(r"^E402 .* (burst|cburst|mtu) is \S+ in the kernel, policy says ")
"""A burst tc prints from a time at the class's true rate, which it prints rounded down to
four digits (``1690Mbit`` for 1690999999bit): from the text, the imported class gets the rate
shown, so its burst, at a rate up to 0.1% lower, can show a microsecond's bytes less."""


ALIKE = frozenset({"W616"})
"""Warnings of an import that still builds the same tc state (fw filters: the firewall rules
behind them are not tc's)."""


def round_trip(planned: list[Planned], run: Run, tmp: Path, exact: bool = True) -> int:
    """Apply, import, compile, apply again, compare; returns the policies done.

    ``exact``: the two read-backs must be equal (``_same``). Otherwise each policy must
    describe the other's state as ``tcdsl verify`` compares them: generated policies have
    values (a 2 GB burst at 4 Gbit/s) that tc shows rounded, so that the kernel can hold
    another value than the one shown."""
    from tests.test_equivalence import _same

    first = run([_case(p, p.result.output or "", "original") for p in planned])
    identical = 0
    unsaid: list[str] = []
    imported: list[tuple[Planned, Planned, str]] = []
    failures: list[str] = []
    for n, (p, result) in enumerate(zip(planned, first, strict=True)):
        texts = device_texts(_applied(result, p), p.read)
        text, codes = imported_text(p, texts)
        if not exact and codes - ALIKE:
            # what the import says it cannot express: no comparison (but it must compile)
            unsaid.append(f"{p.name} ({', '.join(sorted(codes))})")
        path = tmp / f"imported-{n}.tcp"
        path.write_text(text, encoding="utf-8")
        again = _compile(path)
        if again.output is None:
            said = render(again.diagnostics, again.sources)
            failures.append(f"{p.name}: the imported policy does not compile:\n{text}\n{said}")
            continue
        if not exact and codes - ALIKE:
            continue
        imported.append((p, Planned(p.name, again, p.create, p.read), text))
    second = run([_case(q, q.result.output or "", "imported") for _, q, _ in imported])
    done = {p.name: r for p, r in zip(planned, first, strict=True)}
    for (p, q, text), result in zip(imported, second, strict=True):
        a = _without_flows(runner.read_state(_applied(done[p.name], p), p.read))
        b = _without_flows(runner.read_state(_applied(result, q), q.read))
        if exact:
            try:
                _same(a, b)
            except AssertionError as err:
                failures.append(
                    f"{p.name}: the imported policy builds another state ({err}):\n{text}\n"
                    f"---- original\n{_dump(a)}---- imported\n{_dump(b)}"
                )
            continue
        try:
            _same(a, b)
            identical += 1
            continue
        except AssertionError:
            pass
        differences = [
            d for d in _describes(q.result, a) + _describes(p.result, b) if not ROUNDED.search(d)
        ]
        if differences:
            failures.append(
                f"{p.name}: the policies do not describe each other's state:\n"
                + "\n".join(differences[:20])
                + f"\n---- imported\n{text}---- original\n{_dump(a)}---- imported\n{_dump(b)}"
            )
    assert not failures, f"{len(failures)} of {len(planned)} failed:\n" + "\n\n".join(failures)
    if not exact:
        print(
            f"{identical} of {len(imported)} read back identical, the others but for bursts; "
            f"not compared, as the import warns it cannot say everything: {', '.join(unsaid)}"
        )
    return len(planned)


FLOW_KINDS = ("sfq", "fq_codel", "cake")


def _without_flows(state: KernelState) -> KernelState:
    """``state`` without the filter sections of flow classes (sfq, fq_codel and cake show a
    class per active flow: one that comes and goes between two ``tc`` runs of the read-back
    leaves a section that ``_same`` cannot match to a class)."""
    for dev in state.devices.values():
        flows = {q.handle for q in dev.qdiscs if q.kind in FLOW_KINDS}
        keep, skipping = [], False
        for line in dev.text.splitlines(keepends=True):
            if line.startswith("== filters of "):
                parent = line[len("== filters of ") :].strip()
                skipping = parent.partition(":")[0] + ":" in flows and not parent.endswith(":")
            if not skipping:
                keep.append(line)
        dev.text = "".join(keep)
        dev.filters = {
            k: v
            for k, v in dev.filters.items()
            if k.endswith(":") or k[: k.index(":") + 1] not in flows
        }
    return state


def _dump(state: KernelState) -> str:
    return "".join(f"== {name}\n{dev.text}" for name, dev in state.devices.items())


def _support() -> runner.HostSupport | None:
    if os.geteuid() != 0:
        return None
    try:
        return runner.host_support()
    except runner.KernelUnavailable:
        return None


def _split(paths: list[tuple[str, Path]]) -> tuple[list[Planned], list[Planned]]:
    """Policies the host can hold, and those for the guest (cbq, which no kernel has, left
    out)."""
    support = _support()
    host, guest = [], []
    for name, path in paths:
        p = _plan(name, path)
        assert p.result.policy is not None
        expected = expected_policy(p.result.policy, p.result.sources)
        if expected.needs("sch_cbq") is not None:
            print(f"skipped {name}: cbq (no kernel here has it)")
            continue
        if support is not None and not support.lacks(expected.requirements):
            host.append(p)
        else:
            guest.append(p)
    return host, guest


def _examples() -> list[tuple[str, Path]]:
    """Every example policy, and those of tests/import_data (flower; the wondershaper script's
    imported policy)."""
    extra = sorted(DATA.glob("*.tcp"))
    return [(str(p), ROOT / p) for p in policy_files()] + [(str(p), p) for p in extra]


def _guest(planned: list[Planned], tmp: Path, exact: bool = True) -> int:
    if not planned:
        return 0
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable for {len(planned)} policies: {why}")
    return round_trip(planned, runner.run_on_uml, tmp, exact)


def test_examples_round_trip(tmp_path: Path) -> None:
    host, guest = _split(_examples())
    done = 0
    if host:
        done += round_trip(host, runner.run_on_host, tmp_path)
        print(f"host: {', '.join(p.name for p in host)}")
    done += _guest(guest, tmp_path)
    print(f"user-mode Linux: {', '.join(p.name for p in guest)}")
    assert done == len(host) + len(guest)


GENERATED_HOST = 80
GENERATED_UML = 24
SEED = 12


def _generated(kernel: str, count: int, tmp: Path) -> list[tuple[str, Path]]:
    from tests.strategies import random_policies

    out = []
    for n, policy in enumerate(random_policies(kernel, count, SEED)):  # type: ignore[arg-type]
        path = tmp / f"generated-{kernel}-{n}.tcp"
        path.write_text(policy.text, encoding="utf-8")
        out.append((f"generated {kernel} {n}", path))
    return out


def test_generated_policies_round_trip(tmp_path: Path) -> None:
    """tests/strategies.py's policies (the ones the verify property tests draw, the same ones
    every run): 80 for the host kernel, 20 for the guest's."""
    support = _support()
    if support is None:
        pytest.skip("the host part needs root and network namespaces")
    host, _ = _split(_generated("host", GENERATED_HOST, tmp_path))
    done = round_trip(host, runner.run_on_host, tmp_path, exact=False)
    _, guest = _split(_generated("uml", GENERATED_UML, tmp_path))
    done += _guest(guest, tmp_path, exact=False)
    print(f"{done} generated policies round-trip")


# ==== unit tests: saved text, warnings, errors =================================================


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["import", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _check(text: str, tmp: Path) -> Result:
    path = tmp / "imported.tcp"
    path.write_text(text, encoding="utf-8")
    result = _compile(path)
    assert result.output is not None, render(result.diagnostics, result.sources)
    return result


def test_wondershaper_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-written script's saved text (wondershaper): the policy is the golden one, IPv4
    only as the script was, and it compiles to the script's tc objects."""
    monkeypatch.chdir(ROOT)
    code, out, err = _cli("-i", "eth0", "--from", "tests/import_data/wondershaper.txt")
    assert code == 0 and err == ""
    assert out == (DATA / "wondershaper.tcp").read_text(encoding="utf-8")
    assert "upload family ipv4 htb handle 1: r2q 10 default c1_20" in out
    assert "ingress family ipv4 {" in out
    assert "match tcp-ack pref 10" in out and "match u32 0x0/0x0 at 12 pref 50 police" in out
    result = _check(out, tmp_path)
    script = result.output or ""
    for words in (
        "classid 1:1 htb rate 800kbit burst 6k",
        "handle 10: sfq perturb 10",
        "protocol ip prio 14 u32 match ip dport 873 0xffff flowid 1:30",
        "protocol ip prio 15 u32 match ip sport 873 0xffff flowid 1:30",
    ):
        assert words in script
    assert "protocol ipv6" not in script
    # '-o -' is stdout (it wrote a file named '-' in the folder the command ran in)
    here = tmp_path / "here"
    here.mkdir()
    with contextlib.chdir(here):
        again = _cli("-i", "eth0", "--from", str(DATA / "wondershaper.txt"), "-o", "-")
    assert again[0] == 0 and again[2] == "" and not (here / "-").exists()
    assert again[1].split("\n", 1)[1] == out.split("\n", 1)[1]  # (line 1 names --from)


def test_import_writes_the_output_file(tmp_path: Path) -> None:
    out = tmp_path / "eth0.tcp"
    code, stdout, _ = _cli("-i", "eth0", "--from", str(DATA / "wondershaper.txt"), "-o", str(out))
    assert code == 0 and stdout == ""
    assert out.read_text(encoding="utf-8").endswith("}\n")


UNSUPPORTED = {
    "W610": ("sfb", 4),
    "W611": ("direct_qlen 50", 3),
    "W612": ("matchall", 23),
    "W613": ("hash table", 26),
    "W614": ("gact", 30),
    "W615": ("alternate between classes", 13),
    "W616": ("classify by mark at postrouting", 37),
    "W617": ("share one policer", 44),
    "W618": ("ifb0", 56),
}


def test_what_the_language_cannot_say_is_a_warning_and_a_comment(tmp_path: Path) -> None:
    path = DATA / "unsupported.txt"
    code, out, err = _cli("-i", "eth0", "--from", str(path))
    assert code == 0
    for code_, (words, line) in UNSUPPORTED.items():
        located = [x for x in err.splitlines() if x.startswith(f"{path}:{line}:1: warning: ")]
        assert any(words in x and x.endswith(f"[{code_}]") for x in located), (code_, err)
        assert any(
            x.strip().startswith(f"# tcdsl import: {code_} at line {line}: ") and words in x
            for x in out.splitlines()
        ), (code_, out)
    warnings = err.count(": warning: ")
    assert warnings == out.count("# tcdsl import: W61"), "each warning is one comment"
    result = _check(out, tmp_path)
    assert not [d for d in result.diagnostics if d.is_error]
    # what could be said is there
    assert "match family ipv4 dport 22 pref 1" in out and "class c1_20 id 1:20" in out
    assert "match dst 2001:db8::/32 pref 6" in out  # an IPv6 filter at pref 6 (W615)
    assert "mark 0x7" in out


@pytest.mark.parametrize(
    ("handle", "said"),
    [
        ("abc", "an fw filter without a mark"),
        ("/0xff00", "an fw filter without a mark"),
        ("0xa/0xff/0xf", "an fw filter without a mark"),
        ("-1", "an fw filter without a mark"),
        ("08", "an fw filter without a mark"),  # tc's strtoul: octal
        ("0xa/010", "an fw filter with mark 0xa and mask 0x8, which a policy cannot write"),
        ("0x0", "an fw filter with mark 0x0 and mask 0xffffffff, which a policy cannot write"),
        ("0xa/0x0", "an fw filter with mark 0xa and mask 0x0, which a policy cannot write"),
        ("0xa/0xf0", "an fw filter with mark 0xa and mask 0xf0, which a policy cannot write"),
        ("0x1ffffffff", "an fw filter with mark 0x1ffffffff and mask 0xffffffff"),
    ],
)
def test_an_fw_handle_a_policy_cannot_write_is_left_out(
    handle: str, said: str, tmp_path: Path
) -> None:
    """Found by a tester: a saved text with 'handle abc' (or '/0xff00', '0xa/0xff/0xf') on an
    fw filter was a traceback, and mark 0, mask 0, a mark outside its mask or above 32 bits
    were written into a policy that did not compile. Now each is W616 and left out, and the
    policy compiles; a mark under its mask ('0x100/0xff00') is kept."""
    text = (DATA / "unsupported.txt").read_text(encoding="utf-8")
    saved = tmp_path / "saved.txt"
    saved.write_text(text.replace("handle 0x7 classid", f"handle {handle} classid"), "utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    assert code == 0, err
    assert f"{saved}:37:1: warning: filter pref 5 (ip, fw) to 1:20: {said}" in err, err
    written = [x for x in out.splitlines() if not x.strip().startswith("#")]
    assert not [x for x in written if "mark" in x], out
    result = _check(out, tmp_path)
    assert not [d for d in result.diagnostics if d.is_error], out
    saved.write_text(text.replace("handle 0x7 classid", "handle 0x100/0xff00 classid"), "utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    assert code == 0 and "mark 0x100" in out and "mask 0xff00" in out, (err, out)
    saved.write_text(text.replace("handle 0x7 classid", "handle 010 classid"), "utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    assert code == 0 and "mark 0x8" in out, (err, out)


def test_a_download_by_mark_not_read_is_advised_from_its_interface(tmp_path: Path) -> None:
    """Found by a tester: W618 advised writing the IFB's tree as 'download via ifb0', whose
    import on its own says 'classify by mark at postrouting', which a download refuses (E256).
    With the redirect's connmark (a download by mark), the advice names 'from eth0'."""
    text = (DATA / "unsupported.txt").read_text(encoding="utf-8")
    redirect = "\taction order 1: mirred (Egress Redirect to device ifb0) stolen"
    assert redirect in text
    connmark = (
        "\taction order 1: connmark zone 0 pipe\n\t index 1 ref 1 bind 1\n\n"
        "\taction order 2: mirred (Egress Redirect to device ifb0) stolen"
    )
    saved = tmp_path / "saved.txt"
    saved.write_text(text.replace(redirect, connmark), "utf-8")
    code, _out, err = _cli("-i", "eth0", "--from", str(saved))
    said = " ".join(err.split())
    assert code == 0 and "write it as 'download via ifb0' (its 'classify by mark' then 'from " \
        "eth0', not 'at postrouting') [W618]" in said, err  # fmt: skip
    _, _, plain = _cli("-i", "eth0", "--from", str(DATA / "unsupported.txt"))
    assert "write it as 'download via ifb0' [W618]" in " ".join(plain.split()), plain


def test_an_mq_queue_in_use_left_to_the_kernel_is_written(
    make_netns: Callable[[], str], host: runner.HostSupport, tmp_path: Path
) -> None:
    """Found by a tester: an mq root whose queues 1-3 were set by hand and queue 4 (in use)
    left with the kernel's pfifo_fast was imported as queues 1-3, a policy that apply then
    refused on that very device (E602: more TX queues in use than the tree writes). The queues
    in use past the last one set by hand are written as the kernel's kind; a queue the kernel
    holds below it stays out (as the policy leaves it)."""
    if "mq" not in host.qdiscs:
        pytest.skip(f"the host lacks mq ({host.notes})")
    ns = make_netns()
    run(
        [
            "ip",
            "-n",
            ns,
            "link",
            "add",
            "mq0",
            "numtxqueues",
            "4",
            "type",
            "veth",
            "peer",
            "name",
            "p0",
        ]
    )
    run(["ip", "-n", ns, "link", "set", "mq0", "up"])
    tcdsl = Tcdsl(ns, tmp_path)
    tcdsl.tc_lines(
        "qdisc add dev mq0 root handle 1: mq",
        "qdisc add dev mq0 parent 1:1 handle 10: tbf rate 30mbit burst 32k latency 20ms",
        "qdisc add dev mq0 parent 1:3 handle 30: pfifo limit 100",
    )
    got = tcdsl("import", "-i", "mq0")
    assert got.code == 0, got
    assert "queue 4 pfifo_fast\n" in got.out and "queue 2" not in got.out, got
    path = tmp_path / "mq0.tcp"
    path.write_text(got.out)
    planned = tcdsl("plan", "--name", "mq0", str(path))
    assert planned.code != 1 and "[E602]" not in planned.err, planned  # (4: changes)


def test_a_download_redirecting_one_family_is_imported_with_a_warning(
    make_netns: Callable[[], str], host: runner.HostSupport, tmp_path: Path
) -> None:
    """Found by a review: a download whose ingress redirect says 'protocol ip' (as many
    scripts write it, where tcdsl writes 'protocol all') was not taken for a download: its
    whole IFB tree was left out behind a W614 for the 'mirred' action. It is a download now;
    one family's redirect warns (W620) that the language's redirects every protocol; an ip
    and an ipv6 redirect to the same IFB are that, without a word."""
    if not host.ifb or "mirred" not in host.actions:
        pytest.skip(f"the host lacks ifb or act_mirred ({host.notes})")
    ns = make_netns()
    run(["ip", "-n", ns, "link", "add", "r0", "type", "veth", "peer", "name", "r1"])
    run(["ip", "-n", ns, "link", "add", "ifb0", "type", "ifb"])
    tcdsl = Tcdsl(ns, tmp_path)
    tcdsl.tc_lines(
        "qdisc add dev ifb0 root handle 1: htb default 20",
        "class add dev ifb0 parent 1: classid 1:10 htb rate 5mbit",
        "class add dev ifb0 parent 1: classid 1:20 htb rate 5mbit",
        "filter add dev ifb0 parent 1: prio 1 protocol ip u32 match ip dport 53 0xffff flowid 1:10",
        "qdisc add dev r0 handle ffff: ingress",
        "filter add dev r0 parent ffff: prio 1 protocol ip u32 match u32 0 0 "
        "action mirred egress redirect dev ifb0",
    )
    got = tcdsl("import", "-i", "r0")
    said = " ".join(got.err.split())
    assert got.code == 0, got
    assert "ingress redirects the IPv4 arrivals only (protocol ip) to ifb0" in said, said
    # an htb without default sends them to its direct queue (found by a tester)
    assert "an htb's direct queue, unshaped, where it has none" in said, said
    assert "[W620]" in said and "[W614]" not in said, said
    # htb's direct queue as the kernel makes it on an IFB (its txqueuelen, 32): no W611
    assert "direct_qlen" not in said and "direct_qlen 32" in tcdsl.tc("qdisc", "show"), said
    assert "download via ifb0 family ipv4 htb handle 1:" in got.out, got
    assert "match dport 53" in got.out, got
    assert not [d for d in _check(got.out, tmp_path).diagnostics if d.is_error], got.out
    tcdsl.tc_lines(
        "filter add dev r0 parent ffff: prio 2 protocol ipv6 u32 match u32 0 0 "
        "action mirred egress redirect dev ifb0"
    )
    both = tcdsl("import", "-i", "r0")
    assert both.code == 0 and "download via ifb0" in both.out, both
    assert "[W620]" not in both.err and "[W613]" not in both.err, both


@pytest.mark.parametrize(
    ("old", "new"),
    [("mtu 2Kb action drop", "mtu action drop"), ("rate 8Mbit burst", "rate burst")],
    ids=["mtu", "rate"],
)
def test_a_policer_with_a_value_missing_is_a_warning(old: str, new: str, tmp_path: Path) -> None:
    """Found by a tester mutating saved text: a police line with a value left out was a
    traceback ('not a tc size'); now W614 at the filter, the rest imported."""
    text = (DATA / "wondershaper.txt").read_text(encoding="utf-8")
    assert old in text
    saved = tmp_path / "saved.txt"
    saved.write_text(text.replace(old, new), encoding="utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    said = " ".join(err.split())
    assert code == 0 and f"{saved}:36:1: warning: filter pref 50" in said, err
    assert "its policer's rate, burst or mtu is not a value tc prints; left out [W614]" in said
    written = [x for x in out.splitlines() if not x.strip().startswith("#")]
    assert any("class" in x for x in written), out
    assert not [x for x in written if "police" in x], out


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("leaf 10: prio 1 ", "leaf 10: prio x ", ":9:1: warning: class 1:10: 'prio x'"),
        ("quantum 10000", "quantum ten", ":9:1: warning: class 1:10: 'quantum ten'"),
        ("sfq 30: parent 1:30 limit 127p", "sfq 30: parent 1:30 limit lots",
         ":4:1: warning: sfq 30: 'limit lots'"),
    ],
    ids=["class-prio", "class-quantum", "qdisc-limit"],
)  # fmt: skip
def test_a_value_tc_would_not_print_is_a_warning(
    old: str, new: str, said: str, tmp_path: Path
) -> None:
    """Found by a tester: 'prio x' in a saved text was imported as no prio at all, without a
    word; each such value is W611 at its line now, the rest imported."""
    text = (DATA / "wondershaper.txt").read_text(encoding="utf-8")
    assert old in text
    saved = tmp_path / "saved.txt"
    saved.write_text(text.replace(old, new, 1), encoding="utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    assert code == 0 and f"{saved}{said}" in err, err
    assert "is no value tc prints there; left out [W611]" in err, err
    assert "class c1_10" in out, out


def test_saved_text_with_a_word_left_out_never_stops_import() -> None:
    """Every saved text here, with one word of one line left out (the middle one, and the
    last), imports or is refused with a diagnostic: never an exception."""
    runs = 0
    for path in sorted(DATA.glob("*.txt")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            words = line.split()
            for drop in {len(words) // 2, len(words) - 1} if words else set():
                cut = " ".join(w for i, w in enumerate(words) if i != drop)
                text = "\n".join([*lines[:n], cut, *lines[n + 1 :]]) + "\n"
                device = "r0" if "r0" in text else "eth0"
                import_policy(DeviceText(device, str(path), text))
                runs += 1
    assert runs > 200, runs


def test_a_device_name_a_policy_cannot_write_is_refused(tmp_path: Path) -> None:
    """Found by a tester: a device named q"x (Linux takes it) was imported as
    'interface "q\\"x"', which the lexer cannot read (E609 after the fact): a usage error
    now, saying what to do."""
    text = (DATA / "wondershaper.txt").read_text(encoding="utf-8").replace("eth0", 'q"x')
    saved = tmp_path / "saved.txt"
    saved.write_text(text, encoding="utf-8")
    code, out, err = _cli("-i", 'q"x', "--from", str(saved))
    assert code == 2 and out == "", (out, err)
    assert "holds a quote, which a policy cannot write" in " ".join(err.split()), err


SQM_SAVED = """\
qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000
qdisc ingress ffff: parent ffff:fff1 ----------------
class htb 1:1 root rate 20Mbit ceil 20Mbit burst 1600b cburst 1600b
class htb 1:10 parent 1:1 prio 0 rate 20Mbit ceil 20Mbit burst 1600b cburst 1600b
filter protocol all pref 10 u32 chain 0
filter protocol all pref 10 u32 chain 0 fh 800: ht divisor 1
filter protocol all pref 10 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 flowid 1:1 \
not_in_hw
  match 00000000/00000000 at 0
\taction order 1: mirred (Egress Redirect to device ifb4eth0) stolen
\tindex 1 ref 1 bind 1
"""
"""sqm-scripts' download redirect (``flowid 1:1``) saved as docs/operations.md says: ``tc
filter show dev eth0 parent ffff:`` leaves its parent out."""


def test_a_redirect_listed_without_its_parent_is_the_ingress_qdiscs() -> None:
    """Found by a tester: sqm-scripts' redirect names flowid 1:1, so it was taken for a filter
    of the egress htb 1: (W613 there; with a cake root, nothing said) and the download was
    lost without W618. A filter that redirects is the ingress qdisc's."""
    got = import_policy(DeviceText("eth0", "saved.txt", SQM_SAVED))
    assert got.policy is not None
    codes = [d.code for d in got.diagnostics]
    assert codes == ["W618", "W620"], render(got.diagnostics, got.sources)
    assert "write it as 'download via ifb4eth0'" in got.diagnostics[0].message
    assert "at pref 10 with flowid 1:1: a download's redirect is at pref 1 with no class, so " \
        "applying the policy makes it anew" in got.diagnostics[1].message  # fmt: skip


@pytest.mark.parametrize("parent", ["1:", "1:1"])
def test_a_tbf_child_added_under_the_tbf_itself_is_imported(parent: str) -> None:
    """Found by a tester: sqm-scripts' simplest_tbf.qos adds its fq_codel with 'parent 1:',
    which tc shows so; the child was looked for under 1:1 only, and left out unsaid."""
    text = (
        "qdisc tbf 1: root refcnt 3 rate 20Mbit burst 2500b lat 300ms\n"
        f"qdisc pfifo 110: parent {parent} limit 1001p\n"
    )
    got = import_policy(DeviceText("eth0", "saved.txt", text))
    assert got.policy is not None and not got.diagnostics, render(got.diagnostics, got.sources)
    assert (
        "tbf handle 1: rate 20mbit burst 2500 limit 751250 {\n    pfifo handle 110: limit 1001\n}"
        in got.policy
    )


def _fw_text(*filters: tuple[int, str, str]) -> DeviceText:
    """An hfsc 1: (default 1:30) with classes 1:10, 1:20, 1:30 and fw filters (pref, handle,
    class)."""
    text = (
        "qdisc hfsc 1: root refcnt 2 default 30\nclass hfsc 1: root\n"
        "class hfsc 1:1 parent 1: ls m2 10Mbit ul m2 10Mbit\n"
        + "".join(f"class hfsc 1:{m} parent 1:1 ls m2 3Mbit\n" for m in (10, 20, 30))
        + "".join(
            f"filter parent 1: protocol ip pref {pref} fw chain 0 handle {handle} classid {c}\n"
            for pref, handle, c in filters
        )
    )
    return DeviceText("eth0", "saved.txt", text)


def test_fw_filters_of_one_mask_at_prefs_of_their_own_are_one_classify_by_mark() -> None:
    """Found by a tester (sqm-scripts' simple.qos): fw filters of one mask, one per pref,
    never match one packet together, so nothing lies between them: all are written, where
    all but the first pref's were left out (W616)."""
    got = import_policy(
        _fw_text((1, "0x10/0xf0", "1:10"), (2, "0x20/0xf0", "1:20"), (3, "0x30/0xf0", "1:30"))
    )
    assert got.policy is not None
    assert [d.code for d in got.diagnostics] == ["W616"], render(got.diagnostics, got.sources)
    for classid, mark in (("1:10", "0x10"), ("1:20", "0x20"), ("1:30", "0x30")):
        assert f"id {classid} ls m2 3mbit mark {mark}" in got.policy, got.policy


def test_the_default_class_takes_no_mark_of_a_filter_left_out() -> None:
    """Found by a tester (OpenWrt's qos-scripts): with fw filters of another mask between
    (0x1/0xf at pref 3), 0x20/0xf0 at pref 4 is left out (W616), and the compiler gave the
    default class the first free mark, 0x20: packets the kept firewall rules mark for 1:20
    went to the default class. The default class takes its own filter's mark, or a mark no
    filter names."""
    filters = [(2, "0x10/0xf0", "1:10"), (3, "0x1/0xf", "1:10"), (4, "0x20/0xf0", "1:20")]
    got = import_policy(_fw_text(*filters))
    assert got.policy is not None and "id 1:30 ls m2 3mbit mark 0x30" in got.policy, got.policy
    got = import_policy(_fw_text(*filters, (5, "0x30/0xf0", "1:30")))
    assert got.policy is not None and "id 1:30 ls m2 3mbit mark 0x30" in got.policy, got.policy
    got = import_policy(_fw_text(*filters, (5, "0x30/0xf0", "1:20")))
    assert got.policy is not None and "id 1:30 ls m2 3mbit mark 0x40" in got.policy, got.policy


def test_an_fw_filter_left_out_says_why() -> None:
    """Found by a tester: sqm-scripts' 'protocol arp' fw filters got 'an fw filter without a
    mark, a class of this qdisc or ip/ipv6', which did not say which."""
    text = _fw_text((1, "0x10/0xf0", "1:10"), (2, "0x20/0xf0", "1:70")).text
    text += "filter parent 1: protocol arp pref 3 fw chain 0 handle 0x30/0xf0 classid 1:30\n"
    got = import_policy(DeviceText("eth0", "saved.txt", text))
    said = [d.message for d in got.diagnostics if d.code == "W616"]
    assert (
        "filter pref 2 (ip, fw) to 1:70: it sends to 1:70, no class of this qdisc; left out" in said
    )
    assert (
        "filter pref 3 (arp, fw) to 1:30: protocol 'arp': the language writes ip and ipv6 only; "
        "left out" in said
    ), said


def _v6_at(*prefs: tuple[int, str, str]) -> DeviceText:
    """An htb 1: with classes 1:10 and 1:20 (default) and IPv6 u32 filters (pref, class,
    the address's last word in hex: 2001:db8::N/128)."""
    text = (
        "qdisc htb 1: root refcnt 2 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000\n"
        "class htb 1:10 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b\n"
        "class htb 1:20 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b\n"
    )
    for n, (pref, classid, last) in enumerate(prefs):
        text += (
            f"filter parent 1: protocol ipv6 pref {pref} u32 chain 0 fh 80{n}::800 order 2048 "
            f"key ht 80{n} bkt 0 flowid {classid} not_in_hw\n"
            "  match 20010db8/ffffffff at 24\n  match 00000000/ffffffff at 28\n"
            f"  match 00000000/ffffffff at 32\n  match {last}/ffffffff at 36\n"
        )
    return DeviceText("eth0", "saved.txt", text)


def test_ipv6_filters_at_low_prefs_are_written_above_32768_in_their_order() -> None:
    """Found by a tester (sqm-scripts' simple.qos puts its IPv6 DSCP filters at prefs below
    32768): they were all left out (W613) and IPv6 went to the default class. Where they all
    come before the IPv6 filters above 32768, they are written 32768 higher (W615)."""
    got = import_policy(_v6_at((2, "1:10", "00000001"), (3, "1:20", "00000002")))
    assert got.policy is not None
    said = [(d.code, d.message) for d in got.diagnostics]
    assert [c for c, _ in said] == ["W615", "W615"], said
    assert "ipv6 filters at pref 2: tcdsl puts a line's IPv6 filters at its pref + 32768; " \
        "written as pref 2 (kernel pref 32770), in the same order" in said[0][1]  # fmt: skip
    assert "first apply builds the tree again" in said[0][1], said  # (a tester's: unsaid)
    assert "match dst 2001:db8::1 pref 2" in got.policy and "match dst 2001:db8::2 pref 3" in (
        got.policy
    ), got.policy
    # 32768 higher, pref 5 would come after pref 32770, which it comes before: left out
    got = import_policy(_v6_at((32770, "1:10", "00000001"), (5, "1:20", "00000002")))
    assert [d.code for d in got.diagnostics] == ["W613"], render(got.diagnostics, got.sources)


def test_filters_listed_without_their_parent_go_to_the_qdisc_of_their_flowid() -> None:
    """'tc filter show dev X parent 10:' names no parent: the flowid's major tells it."""
    code, out, err = _cli("-i", "lan0", "--from", str(DATA / "nested.txt"))
    assert code == 0 and err == ""
    inner = out[out.index("htb handle 10:") : out.index("prio handle 20:")]
    assert "class c10_10 id 10:10 rate 1mbit ceil 10mbit {\n" in inner
    assert "match proto udp dport 5060" in inner and "match dscp 46" in inner
    bands = out[out.index("prio handle 20:") :]
    assert "match proto udp sport 53" in bands and "match proto tcp sport 22" in bands
    assert "interface lan0 htb" in out  # the nested trees classify IPv6 too: no family


def test_a_line_that_is_not_tc_output_is_reported(tmp_path: Path) -> None:
    text = (DATA / "wondershaper.txt").read_text(encoding="utf-8") + "Error: something\n"
    path = tmp_path / "saved.txt"
    path.write_text(text, encoding="utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(path))
    line = len(text.splitlines())
    assert code == 0 and f"{path}:{line}:1: warning: " in err and "[W619]" in err
    assert f"# tcdsl import: W619 at line {line}: " in out


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        ("qdisc noqueue 0: root refcnt 2\n", "E606", "kernel's default (noqueue)"),
        ("", "E606", "shows no qdisc"),
        ("qdisc drr 1: root refcnt 2\nclass drr 1:1 root quantum 1514b\n", "E607", "'drr'"),
    ],
    ids=["default-root", "empty", "unknown-root"],
)
def test_nothing_to_import_is_a_located_error(
    text: str, code: str, words: str, tmp_path: Path
) -> None:
    path = tmp_path / "saved.txt"
    path.write_text(text, encoding="utf-8")
    status, out, err = _cli("-i", "eth0", "--from", str(path))
    assert status == 1 and out == ""
    assert err.startswith(f"{path}:1:1: error: ") and f"[{code}]" in err and words in err
    assert err.endswith("tcdsl: 1 error; nothing imported\n")


def test_unreadable_files_are_located_errors(tmp_path: Path) -> None:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"qdisc htb 1: root\xff\n")
    for path, words in (
        (tmp_path / "missing.txt", "No such file"),
        (binary, "not UTF-8"),
        (tmp_path, "Is a directory"),
    ):
        status, out, err = _cli("-i", "eth0", "--from", str(path))
        assert status in (1, 2) and out == "" and "Traceback" not in err
        if status == 1:
            assert f"{path}:1:1: error: " in err and "[E605]" in err and words in err


def test_a_missing_interface_is_a_located_error() -> None:
    status, out, err = _cli("-i", "tcdsl-none0")
    assert status == 1 and out == ""
    assert err.startswith("tc:tcdsl-none0:1:1: error: there is no network interface 'tcdsl-none0'")
    assert "[E602]" in err


def test_import_is_deterministic() -> None:
    text = DeviceText("eth0", "saved", (DATA / "unsupported.txt").read_text(encoding="utf-8"))
    first, second = import_policy(text), import_policy(text)
    assert first.policy == second.policy and first.diagnostics == second.diagnostics


def test_help_has_examples() -> None:
    result = CliRunner().invoke(cli, ["import", "--help"])
    assert result.exit_code == 0
    assert "tcdsl import -i eth0 --from saved.txt" in result.output
    assert "tc filter show dev eth0 parent ffff:" in result.output


HAND_SCRIPT = """\
tc qdisc add dev eth0 root handle 1: htb default 30
tc class add dev eth0 parent 1: classid 1:1 htb rate 10mbit burst 15k
tc class add dev eth0 parent 1:1 classid 1:10 htb rate 5mbit ceil 10mbit prio 0
tc class add dev eth0 parent 1:1 classid 1:20 htb rate 3mbit ceil 8mbit prio 1 quantum 3000
tc class add dev eth0 parent 1:1 classid 1:30 htb rate 2mbit ceil 10mbit prio 2
tc qdisc add dev eth0 parent 1:10 handle 10: pfifo limit 50
tc qdisc add dev eth0 parent 1:20 handle 20: tbf rate 3mbit burst 10k latency 50ms
tc qdisc add dev eth0 parent 1:30 handle 30: bfifo limit 30k
tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport 22 0xffff flowid 1:10
tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip src 192.168.1.0/24 \\
    match ip dport 80 0xffff flowid 1:20
tc filter add dev eth0 parent 1: protocol ip prio 3 u32 match ip tos 0x10 0xff flowid 1:10
tc filter add dev eth0 parent 1: protocol ipv6 prio 32770 u32 match ip6 dst 2001:db8::/32 \\
    flowid 1:20
"""
"""A hand-written script of what the host kernel has (htb, tbf, fifos, u32), IPv4 and IPv6."""


def test_live_import_of_a_hand_written_script(tmp_path: Path) -> None:
    """``tcdsl import -i eth0`` run in the namespace where a hand-written script shaped eth0:
    the policy it writes, compiled and applied in a fresh namespace, builds the same state."""
    if _support() is None:
        pytest.skip("needs root and network namespaces")
    from tests.test_equivalence import _same

    command = f"{shlex.quote(sys.executable)} -c 'from tcdsl.cli import main; main()'"
    live = Planned("hand-written", Result(output=HAND_SCRIPT, policy=None), ["eth0"], ["eth0"])
    case = runner.case_script(
        "hand", HAND_SCRIPT, live.create, live.read, after=f"{command} import -i eth0"
    )
    first = runner.run_on_host([runner.Case("hand", case)])[0]
    found = _applied(first, live)
    text = found["after"].text
    assert found["after"].status == 0 and text.startswith("# Imported by tcdsl"), text
    assert "interface eth0 htb" in text and "match dst 2001:db8::/32 pref 2" in text
    assert "match family ipv4 dport 22" in text  # an IPv4-only line in a dual-stack tree
    assert "match src 192.168.1.0/24 dport 80" in text and "quantum 3000" in text
    again = _check(text, tmp_path)
    second = runner.run_on_host(
        [
            runner.Case(
                "imported", runner.case_script("imported", again.output or "", ["eth0"], ["eth0"])
            )
        ]
    )[0]
    _same(
        runner.read_state(found, live.read),
        runner.read_state(_applied(second, live), live.read),
    )


MQ_HOST = (
    """\
interface eth0 mq overhead pppoe-llc {
    queue 1 htb rate 10mbit default a {
        class a rate 5mbit
        class b rate 5mbit ceil 10mbit {
            pfifo limit 30
        }
    }
    queue 3 tbf rate 5mbit burst 10kb latency 50ms
}
""",
    """\
interface eth0 mq queues 2 htb rate 20mbit default a {
    class a rate 10mbit {
        bfifo limit 30kb
    }
    class b rate 10mbit
}
""",
)
"""mq trees the host kernel holds: no match lines, so no steering (which needs act_skbedit)."""


def test_an_mq_tree_round_trips_on_the_host(tmp_path: Path) -> None:
    """An mq root (its queues' qdiscs, the size table they share, a spread tree's queues)
    imports as the written form, which builds the same kernel state."""
    if _support() is None:
        pytest.skip("needs root and network namespaces")
    planned = []
    for n, text in enumerate(MQ_HOST):
        path = tmp_path / f"mq{n}.tcp"
        path.write_text(text)
        planned.append(_plan(f"mq {n}", path))
    assert round_trip(planned, runner.run_on_host, tmp_path) == 2


def _steering_text(lines: str, clsact: str) -> DeviceText:
    """The saved text of an mq tree whose queue 1 sends 10.0.0.1 to class 12:10, with
    ``clsact`` (its qdisc line and egress filters, as the live read lists them) after it."""
    text = f"""\
qdisc mq 1: root
qdisc htb 12: parent 1:1 r2q 10 default 0x20 direct_packets_stat 0 ver 3.17 direct_qlen 1000
qdisc pfifo_fast 0: parent 1:2 bands 3 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1
{clsact}class mq 1:1 root leaf 12:
class mq 1:2 root
class htb 12:1 root rate 10Mbit ceil 10Mbit burst 1600b cburst 1600b
class htb 12:10 parent 12:1 prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
class htb 12:20 parent 12:1 prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
{lines}"""
    return DeviceText("eth0", "saved.txt", text)


LINE = """\
filter parent 12: protocol ip pref 1 u32 chain 0
filter parent 12: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1
filter parent 12: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 \
flowid 12:10 not_in_hw
  match 0a000001/ffffffff at 16
"""
STEER = """\
filter parent ffff:fff3 protocol ip pref 1 u32 chain 0
filter parent ffff:fff3 protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1
filter parent ffff:fff3 protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 \
bkt 0 not_in_hw
  match 0a00000{last}/ffffffff at 16
\taction order 1: skbedit  queue_mapping {queue} pipe
\t index 1 ref 1 bind 1
"""
CLSACT = "qdisc clsact ffff: parent ffff:fff1\n"
BPF = """\
filter parent ffff:fff3 protocol all pref 49152 bpf chain 0
filter parent ffff:fff3 protocol all pref 49152 bpf chain 0 handle 0x1 \
tc_classify_kern.o:[tc_classify] direct-action not_in_hw id 12 tag 0123456789abcdef jited
"""
"""A BPF program on the egress hook (xdp-cpumap-tc's, as LibreQoS loads it)."""


@pytest.mark.parametrize(
    ("clsact", "steer", "said"),
    [
        (CLSACT, STEER.format(last=1, queue=0), None),
        ("", "", "nothing here steers packets to eth0's TX queues (no clsact qdisc)"),
        (CLSACT, "", "the clsact qdisc's 0 egress filter(s) are not the 1 that steer"),
        (CLSACT, STEER.format(last=1, queue=1), "the clsact qdisc's 1 egress filter(s)"),
        (CLSACT, STEER.format(last=2, queue=0), "the clsact qdisc's 1 egress filter(s)"),
        (CLSACT, STEER.format(last=1, queue=0) + BPF, "(bpf among them, which the language"),
        (  # u32 goes on to its next rule after this one: not tcdsl's steering
            CLSACT,
            STEER.format(last=1, queue=0).replace(" pipe", " continue"),
            "the clsact qdisc's 1 egress filter(s) are not the 1",
        ),
        (  # htb takes skb->priority before its filters
            CLSACT,
            STEER.format(last=1, queue=0).replace(" pipe", " priority 12:20 pipe"),
            "the clsact qdisc's 1 egress filter(s) are not the 1",
        ),
    ],
    ids=[
        "tcdsl's",
        "no clsact",
        "none",
        "another queue",
        "other keys",
        "a program",
        "continue",
        "priority",
    ],
)
def test_an_mq_tree_s_steering_is_said_when_it_is_not_the_policy_s(
    clsact: str, steer: str, said: str | None, tmp_path: Path
) -> None:
    """The clsact egress filters that pick an mq tree's TX queue are not written (the policy
    makes them from the queues' lines): W622 when the kernel's are not those."""
    got = import_policy(_steering_text(LINE + steer, clsact))
    assert got.policy is not None, render(got.diagnostics, got.sources)
    found = [d for d in got.diagnostics if d.code == "W622"]
    assert [d.code for d in got.diagnostics if d.code != "W622"] == [], render(
        got.diagnostics, got.sources
    )
    assert "interface eth0 family ipv4 mq handle 1: {" in got.policy, got.policy
    assert "    queue 1 htb handle 12: r2q 10 default c12_20 {" in got.policy, got.policy
    assert "match dst 10.0.0.1" in got.policy
    if said is None:
        assert not found, render(found, got.sources)
    else:
        assert len(found) == 1 and said in found[0].message, render(found, got.sources)
        assert f"# tcdsl import: W622 at line {found[0].span.line}: " in got.policy
    assert _check(got.policy, tmp_path).output is not None


@pytest.mark.parametrize(
    ("clsact", "steer", "said"),
    [
        ("", "", None),
        (CLSACT, "", None),  # an empty clsact (an older tcdsl's) steers nothing
        (CLSACT, STEER.format(last=1, queue=0), "its queues' lines steer nothing"),
        (CLSACT, BPF, "the clsact qdisc's 1 egress filter(s) are not the policy's"),
    ],
    ids=["no clsact", "empty clsact", "steering", "a program"],
)
def test_queues_with_no_lines_leave_the_clsact_to_its_owner(
    clsact: str, steer: str, said: str | None, tmp_path: Path
) -> None:
    """An mq tree whose queues have no line steers nothing and puts no clsact qdisc: the
    device's clsact stays as it is, and its egress filters are said (W622) to stay outside
    the policy, not to be replaced."""
    got = import_policy(_steering_text(steer, clsact))
    assert got.policy is not None, render(got.diagnostics, got.sources)
    assert "match" not in got.policy, got.policy
    found = [d.message for d in got.diagnostics if d.code == "W622"]
    if said is None:
        assert found == []
    else:
        assert len(found) == 1 and said in found[0], found
        assert "leaves the clsact qdisc and its filters as they are" in found[0]
    compiled = _check(got.policy, tmp_path)
    assert compiled.output is not None and "clsact" not in compiled.output


def _two_queues(second: str, steering: Sequence[tuple[str, int]]) -> DeviceText:
    """Queue 1 sends 10.0.0.1 to 12:10, queue 2 ``second`` (``0a000002/ffffffff``) to 14:10,
    and the clsact's egress filters are ``steering``: (key, queue) in the kernel's order."""
    lines = ""
    for n, (key, queue) in enumerate(steering):
        lines += (
            f"filter parent ffff:fff3 protocol ip pref 1 u32 chain 0 fh 800::{0x800 + n:x} "
            f"order {0x800 + n} key ht 800 bkt 0 not_in_hw\n  match {key} at 16\n"
            f"\taction order 1: skbedit  queue_mapping {queue} pipe\n"
        )
    text = f"""\
qdisc mq 1: root
qdisc htb 12: parent 1:1 r2q 10 default 0x20 direct_packets_stat 0 ver 3.17 direct_qlen 1000
qdisc htb 14: parent 1:2 r2q 10 default 0x20 direct_packets_stat 0 ver 3.17 direct_qlen 1000
qdisc clsact ffff: parent ffff:fff1
class htb 12:10 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
class htb 12:20 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
class htb 14:10 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
class htb 14:20 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b
filter parent 12: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 \
flowid 12:10 not_in_hw
  match 0a000001/ffffffff at 16
filter parent 14: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 \
flowid 14:10 not_in_hw
  match {second} at 16
{lines}"""
    return DeviceText("eth0", "saved.txt", text)


@pytest.mark.parametrize(
    ("second", "steering", "warned"),
    [
        ("0a000002/ffffffff", [("0a000001/ffffffff", 0), ("0a000002/ffffffff", 1)], False),
        ("0a000002/ffffffff", [("0a000002/ffffffff", 1), ("0a000001/ffffffff", 0)], False),
        ("0a000000/ffffff00", [("0a000001/ffffffff", 0), ("0a000000/ffffff00", 1)], False),
        ("0a000000/ffffff00", [("0a000000/ffffff00", 1), ("0a000001/ffffffff", 0)], True),
    ],
    ids=["in order", "apart, in another order", "overlapping, in order", "overlapping, swapped"],
)
def test_steering_in_another_order_matters_only_where_its_rules_overlap(
    second: str, steering: Sequence[tuple[str, int]], warned: bool
) -> None:
    """A spread tree's steering lists its rules in the tree's order, the written form queue
    by queue: the same steering wherever no packet can match two rules now in another
    order (10.0.0.1 then 10.0.0.0/24 sends 10.0.0.1 to queue 1; swapped, to queue 2)."""
    got = import_policy(_two_queues(second, steering))
    assert got.policy is not None, render(got.diagnostics, got.sources)
    found = [d.message for d in got.diagnostics if d.code == "W622"]
    assert bool(found) == warned, render(got.diagnostics, got.sources)
    assert all("in another order: lines that one packet can match" in m for m in found), found


def test_steering_split_over_other_prefs_is_the_same_steering() -> None:
    """2,100 subscribers on two queues, steered in the tree's order (the queues alternate)
    over prefs 1 and 2 as the kernel holds a spread tree's; the written form lists them
    queue by queue and lays them out its own way: no packet can match two of them, so the
    steering is the same (W622 said otherwise when it compared pref by pref)."""
    n = 2100
    address = [0x0A000000 + i for i in range(n)]  # 10.0.0.0 + i, a /32 each
    text = [
        "qdisc mq 1: root",
        "qdisc htb 12: parent 1:1 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000",
        "qdisc htb 14: parent 1:2 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000",
        "qdisc clsact ffff: parent ffff:fff1",
    ]
    for major in ("12", "14"):
        text += [
            f"class htb {major}:{minor} root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b"
            for minor in ("10", "20")
        ]
    for i, a in enumerate(address):
        major = ("12", "14")[i % 2]
        node = 0x800 + i // 2
        text += [
            f"filter parent {major}: protocol ip pref 1 u32 chain 0 fh 800::{node:x} order "
            f"{node} key ht 800 bkt 0 flowid {major}:10 not_in_hw",
            f"  match {a:08x}/ffffffff at 16",
        ]
    for i, a in enumerate(address):
        pref, node = (1, 0x800 + i) if i < 2000 else (2, 0x800 + i - 2000)
        text += [
            f"filter parent ffff:fff3 protocol ip pref {pref} u32 chain 0 fh 800::{node:x} "
            f"order {node} key ht 800 bkt 0 not_in_hw",
            f"  match {a:08x}/ffffffff at 16",
            f"\taction order 1: skbedit  queue_mapping {i % 2} pipe",
        ]
    got = import_policy(DeviceText("eth0", "saved.txt", "\n".join(text) + "\n"))
    assert got.policy is not None and got.policy.count("match dst 10.0.") == n
    assert not got.diagnostics, render(got.diagnostics, got.sources)


def test_steering_rules_sharing_a_key_are_parted_by_the_one_that_differs() -> None:
    """3,000 rules of TCP to one /32 each, set to alternate queues, in opposite orders: the
    same steering. All have a key at the protocol's offset too; bucketed by that one they
    were one bucket, 9 million pairs, past the bound, and said not to be the same."""
    from tcdsl.ops.importer import _same_first_match

    tcp = (0x00060000, 0x00FF0000, 8)
    rules = [
        ("u32", (tcp, (0x0A000000 + n, 0xFFFFFFFF, 16)), None, (("skbedit", str(n % 2)),))
        for n in range(3000)
    ]
    assert _same_first_match(rules, rules[::-1])
    wide = ("u32", (tcp, (0x0A000000, 0xFFFFF000, 16)), None, (("skbedit", "1"),))
    assert not _same_first_match([wide, *rules], [*rules, wide])  # 10.0.0.0/20 first or last


def test_an_mq_tree_and_its_steering_round_trip_in_the_guest(tmp_path: Path) -> None:
    """In the 6.1 guest (act_skbedit): the example ISP tree on mq imports with no W622, and
    with one of its steering filters deleted, with it."""
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable: {why}")
    p = _plan("isp-mq", ROOT / "policies" / "isp-mq.tcp")
    assert p.result.policy is not None and p.result.output is not None
    queues = verifier.tx_queues(p.result.policy)
    tamper = "tc filter del dev isp0 egress protocol ipv6 pref 32769"
    cases = [
        runner.Case(label, runner.case_script(label, p.result.output, p.create, p.read,
                                              after=after, queues=queues))
        for label, after in (("kept", ""), ("tampered", tamper))
    ]  # fmt: skip
    kept, tampered = runner.run_on_uml(cases)
    for result, want in ((kept, []), (tampered, ["W622"])):
        text = device_texts(_applied(result, p), p.read)["isp0"]
        got = import_policy(text)
        assert got.policy is not None, render(got.diagnostics, got.sources)
        assert [d.code for d in got.diagnostics if d.code == "W622"] == want, render(
            got.diagnostics, got.sources
        )


def test_a_hashed_layout_round_trips(tmp_path: Path) -> None:
    """A pref tcdsl laid out in u32 hash tables imports as its lines (the links and tables
    left out, the buckets one after the other: the first match is the same), which compile
    to the same kernel state."""
    lines = [f"    class c{i} rate 1mbit match dst 10.0.{i % 3}.{i}" for i in range(40)]
    lines.append("    class wide rate 1mbit match dst 10.0.0.0/8")
    path = tmp_path / "hashed.tcp"
    path.write_text(
        "interface eth0 htb rate 1gbit default wide {\n" + "\n".join(lines) + "\n}\n",
        encoding="utf-8",
    )
    planned = _plan("hashed", path)
    assert planned.result.policy is not None and planned.result.policy.interfaces[0].u32_tables
    if runner.host_unavailable() is not None or _support() is None:
        pytest.skip("needs the host kernel")
    assert round_trip([planned], runner.run_on_host, tmp_path) == 1


def test_a_hashed_layout_imports_with_each_class_s_lines_together(tmp_path: Path) -> None:
    """Lines in different buckets of a hash table never match the same packet, so their order
    across buckets is free: the import groups them by class, without a W615 (which a walk of
    the buckets one after the other gave here, x y x, and whose regrouping put x's 10.0.0.2
    before y's narrower line) or a W613 for tcdsl's own tables."""
    lines = [
        "    class y rate 1mbit match dst 10.0.0.2 dport 80",
        "    class x rate 1mbit match dst 10.0.0.1, 10.0.0.2",
        *(f"    class f{i} rate 1mbit match dst 10.0.0.{100 + i}" for i in range(32)),
    ]
    path = tmp_path / "hashed.tcp"
    path.write_text(
        "interface eth0 family ipv4 htb rate 1gbit default other {\n"
        + "\n".join(lines)
        + "\n    class other rate 1mbit\n}\n",
        encoding="utf-8",
    )
    planned = _plan("hashed", path)
    assert planned.result.policy is not None and planned.result.policy.interfaces[0].u32_tables
    if runner.host_unavailable() is not None or _support() is None:
        pytest.skip("needs the host kernel")
    (result,) = runner.run_on_host([_case(planned, planned.result.output or "", "original")])
    text, codes = imported_text(planned, device_texts(_applied(result, planned), planned.read))
    assert not codes & {"W613", "W615"}, (codes, text)
    imported = tmp_path / "imported.tcp"
    imported.write_text(text, encoding="utf-8")
    for packet, want in (("udp dst 10.0.0.2 dport 80", "1:10"), ("udp dst 10.0.0.2", "1:20")):
        verdict = CliRunner().invoke(cli, ["classify", str(imported), "--packet", packet])
        assert verdict.exit_code == 0 and f"({want})" in verdict.stdout, verdict.output


def test_what_tc_holds_and_a_policy_cannot_is_said(tmp_path: Path) -> None:
    """Found by a review (tests/import_data/quirks.txt, saved from the host kernel): a u32
    filter in chain 7, which nothing reaches, was written as a live match line (UDP went to
    another class than before); a class's 'linklayer atm' and 'mpu', and a tbf's 'mpu', were
    dropped without a word; a class whose ceil is below its rate (tc takes it) was written
    into a policy that did not compile, exit 0. Now W613, W611 and E609 (the policy is still
    written, to be edited; exit 1)."""
    path = DATA / "quirks.txt"
    code, out, err = _cli("-i", "r0", "--from", str(path))
    said = " ".join(err.split())
    assert code == 1, err
    assert "filter pref 1 (ip, u32) to 1:10: it is in chain 7" in said and "[W613]" in said
    assert "match proto udp" not in out and "match proto tcp pref 2" in out, out
    assert "class 1:30: 'linklayer atm' left out [W611]" in said, said
    assert "class 1:30: 'mpu 64b' left out [W611]" in said, said
    assert "tbf 30: 'mpu 96b' has no word in the language; left out [W611]" in said, said
    assert "'mpu 0b'" not in said, said
    assert "imported:r0.tcp:" in err and "the policy written does not compile: ceil 10mbit" in said
    assert said.count("[E609]") == 1 and "class c1_40 id 1:40 rate 20mbit ceil 10mbit" in out
    fixed = path.read_text(encoding="utf-8").replace("ceil 10Mbit", "ceil 20Mbit")
    (tmp_path / "fixed.txt").write_text(fixed, encoding="utf-8")
    code, out, err = _cli("-i", "r0", "--from", str(tmp_path / "fixed.txt"))
    assert code == 0 and "[E609]" not in err, err


def test_keys_read_after_the_ip_header_are_left_out(tmp_path: Path) -> None:
    """Found by a review (tests/import_data/offsets.txt, saved from the host kernel): a u32
    node with 'offset ... eat' or 'offset plus 20' reads its keys from the transport header,
    and so does a table a link node with 'eat' jumps to; their keys were written as raw keys
    at the IP header ('match proto tcp u32 0x50/0xffff at 0': the first word of the IP
    header, not port 80), sending other packets to 1:10. Now W613, left out."""
    path = DATA / "offsets.txt"
    code, out, err = _cli("-i", "r0", "--from", str(path))
    said = " ".join(err.split())
    assert code == 0, err
    assert "pref 1 (ip, u32) to 1:10: its 'offset 0f00>>6 at 0 eat' (keys read after" in said
    assert "pref 2 (ip, u32) to 1:10: its 'offset plus 20' (keys read after" in said
    assert "pref 6 (ip, u32) to 1:10: a u32 hash table or link has no word" in said, said
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("match")]
    assert lines == ["match dport 53 pref 3"], out
    assert not [d for d in _check(out, tmp_path).diagnostics if d.is_error], out


def test_a_u32_mark_key_is_left_out_not_dropped(tmp_path: Path) -> None:
    """Found by a tester (tests/import_data/u32-mark.txt, as the Debian 6.1 kernel shows
    FireQOS's 'u32 match mark 7 0xff'): the mark key was not read, so the filter was written
    as 'match all' (every IPv4 packet to 1:10), and a mark with a port as 'match dport 22'.
    Now W613, left out, as for the other keys the language cannot write."""
    code, out, err = _cli("-i", "eth0", "--from", str(DATA / "u32-mark.txt"))
    said = " ".join(err.split())
    assert code == 0, err
    assert "pref 14 (ip, u32) to 1:10: its key 'mark 0x7 0xff' (the packet's firewall" in said
    assert "pref 15 (ip, u32) to 1:10: its key 'mark 0x5 0xff'" in said, said
    assert not [x for x in out.splitlines() if x.strip().startswith("match")], out
    assert not [d for d in _check(out, tmp_path).diagnostics if d.is_error], out


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("orphan-qdisc", "the pfifo qdisc 20: is below class 1:20, which is not in the text "
         "(saved in part?); left out"),
        ("orphan-class", "class 1:30: its parent, class 1:5, is not in the text (saved in "
         "part?); written at the top of the tree"),
    ],
)  # fmt: skip
def test_text_saved_in_part_is_said(name: str, said: str) -> None:
    """Found by a tester (a real sqm dump cut by 'head'): a qdisc below a class the text
    does not show was left out, and a class whose parent it does not show moved to the
    top of the tree, both without a word."""
    code, _, err = _cli("-i", "eth0", "--from", str(DATA / f"{name}.txt"))
    assert code == 0 and "[W611]" in err, err
    assert said in " ".join(err.split()), err


def test_tcs_json_output_is_named_as_such() -> None:
    """Found by a tester: 'tc -j' output (tests/import_data/json.txt) got E606 'the text
    shows no qdisc', which did not say why."""
    code, _, err = _cli("-i", "d0", "--from", str(DATA / "json.txt"))
    assert code == 1 and "[E606]" in err, err
    assert "it looks like tc's JSON output, -j, which import does not read" in " ".join(
        err.split()
    ), err


def test_filters_alternating_between_classes_keep_the_kernels_order(tmp_path: Path) -> None:
    """Found by a tester (tests/import_data/alternating.txt, saved from the host kernel):
    filters at pref 1 to 1:10, 1:20, 1:10 were written class by class, so UDP from
    10.9.0.1 (the third filter's) went to 1:10 where the kernel sent it to 1:20 (the
    second's), with a W615 saying it 'matters only where they overlap'. Each run of one
    class's filters gets a pref of its own, in order, and the prefs above go up (W615)."""
    path = DATA / "alternating.txt"
    code, out, err = _cli("-i", "a0", "--from", str(path))
    said = " ".join(err.split())
    assert code == 0, err
    assert "written at prefs 1-3, one per run of one class's lines, in the kernel's order " \
        "(the prefs above 1 are 2 higher)" in said, said  # fmt: skip
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("match")]
    assert lines == [
        "match dport 53",
        "match src 10.9.0.1 pref 3",
        "match src 10.9.0.3 pref 4",
        "match proto udp pref 2",
    ], out
    imported = tmp_path / "imported.tcp"
    imported.write_text(out, encoding="utf-8")
    for packet, want in (
        ("udp src 10.9.0.1 dport 80", "1:20"),
        ("udp src 10.9.0.1 dport 53", "1:10"),
        ("tcp src 10.9.0.1 dport 80", "1:10"),
        ("tcp src 10.9.0.3", "1:10"),
        ("udp src 10.9.0.3", "1:20"),
    ):
        verdict = CliRunner().invoke(cli, ["classify", str(imported), "--packet", packet])
        assert verdict.exit_code == 0 and f"({want})" in verdict.stdout, (packet, verdict.output)
    # a line of both families among them: it becomes a line per family, and the IPv4 one
    # takes its run's pref (it warned that no pref kept both orders before)
    text = path.read_text(encoding="utf-8")
    dual = text + (
        "filter parent 1: protocol ipv6 pref 32769 u32 chain 0 \n"
        "filter parent 1: protocol ipv6 pref 32769 u32 chain 0 fh 801: ht divisor 1 \n"
        "filter parent 1: protocol ipv6 pref 32769 u32 chain 0 fh 801::800 order 2048 key ht "
        "801 bkt 0 *flowid 1:20 not_in_hw \n  match 00001100/0000ff00 at 4\n"
    )
    saved = tmp_path / "dual.txt"
    saved.write_text(dual, encoding="utf-8")
    code, out, err = _cli("-i", "a0", "--from", str(saved))
    assert code == 0 and "cannot keep their order" not in " ".join(err.split()), err
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("match")]
    assert "match family ipv4 proto udp pref 2" in lines, out
    assert "match family ipv6 proto udp" in lines and "match src 10.9.0.1 pref 3" in lines, out


def test_a_filter_to_an_inner_class_goes_where_htb_sends_it(tmp_path: Path) -> None:
    """Found by a tester (tests/import_data/inner-class.txt, saved from the host kernel): a
    filter with flowid 1:1, an inner class, was written as a line of it, which does not
    compile (E609 advised moving it into a child: another class). htb sends such a packet
    on to the inner class's own filters and, with none, to the default class: the line is
    written there (W621); with no leaf default (the direct queue), left out (W621)."""
    path = DATA / "inner-class.txt"
    code, out, err = _cli("-i", "a0", "--from", str(path))
    said = " ".join(err.split())
    assert code == 0, err
    assert "a filter (pref 4) sends to 1:1, an inner class without filters of its own, and " \
        "htb then sends the packet to the default class 1:30: written there" in said  # fmt: skip
    imported = tmp_path / "imported.tcp"
    imported.write_text(out, encoding="utf-8")
    for packet, want in (("udp dst 10.9.0.2", "1:30"), ("udp dst 10.9.0.3", "1:10")):
        verdict = CliRunner().invoke(cli, ["classify", str(imported), "--packet", packet])
        assert verdict.exit_code == 0 and f"({want})" in verdict.stdout, (packet, verdict.output)
    text = path.read_text(encoding="utf-8")
    assert " default 0x30 " in text
    saved = tmp_path / "no-default.txt"
    saved.write_text(text.replace(" default 0x30 ", " default 0 "), encoding="utf-8")
    code, out, err = _cli("-i", "a0", "--from", str(saved))
    said = " ".join(err.split())
    assert code == 0 and "its direct queue (unshaped: no leaf is its default)" in said, err
    written = [x for x in out.splitlines() if not x.strip().startswith("#")]
    assert not [x for x in written if "10.9.0.2" in x] and "[W621]" in said, out


def test_a_filter_to_no_class_goes_where_htb_sends_it(tmp_path: Path) -> None:
    """Found by a tester: a filter whose flowid is no class of the htb (1:99) was left out,
    and the packets it matched went on to the later filters (on the kernel the imported
    policy made, and in classify); htb stops classifying there and sends them to its default
    class (net/sched/sch_htb.c, htb_classify: 'filter selected invalid classid'). The line
    is written there (W613); with no leaf default (the direct queue), left out (W613)."""
    text = (DATA / "inner-class.txt").read_text(encoding="utf-8")
    assert "*flowid 1:1 not_in_hw" in text
    saved = tmp_path / "missing.txt"
    saved.write_text(text.replace("*flowid 1:1 not_in_hw", "*flowid 1:99 not_in_hw"))
    code, out, err = _cli("-i", "a0", "--from", str(saved))
    said = " ".join(err.split())
    assert code == 0, err
    assert (
        "filter pref 4 to 1:99: it sends to no class of this qdisc, and htb then stops "
        "classifying and sends the packet to the default class 1:30: written there" in said
    ), said
    imported = tmp_path / "imported.tcp"
    imported.write_text(out, encoding="utf-8")
    for packet, want in (("udp dst 10.9.0.2", "1:30"), ("udp dst 10.9.0.3", "1:10")):
        verdict = CliRunner().invoke(cli, ["classify", str(imported), "--packet", packet])
        assert verdict.exit_code == 0 and f"({want})" in verdict.stdout, (packet, verdict.output)
    saved.write_text(saved.read_text().replace(" default 0x30 ", " default 0 "))
    code, out, err = _cli("-i", "a0", "--from", str(saved))
    said = " ".join(err.split())
    assert code == 0 and "its direct queue (unshaped: no leaf is its default)" in said, err
    written = [x for x in out.splitlines() if not x.strip().startswith("#")]
    assert not [x for x in written if "10.9.0.2" in x] and "[W613]" in said, out


def test_filters_added_without_a_pref_in_a_dual_stack_tree_are_renumbered(
    tmp_path: Path,
) -> None:
    """Found by a review (tests/import_data/auto-prefs.txt, saved from the host kernel):
    filters added without 'prio' take tc's prefs from 49152 down; with an IPv6 filter in the
    tree the IPv4 lines were written at those prefs, which a dual-stack tree refuses (E260).
    They are written just above the tree's other IPv4 prefs, in their order (W615)."""
    path = DATA / "auto-prefs.txt"
    code, out, err = _cli("-i", "r0", "--from", str(path))
    assert code == 0, err
    said = " ".join(err.split())
    assert said.count("[W615]") == 2 and "ip filters at pref 49152" in said, said
    written = [x.strip() for x in out.splitlines() if x.strip().startswith("match family ipv4")]
    order = sorted(written, key=lambda x: int(x.rsplit(" ", 1)[1]))
    # the kernel's order of the IPv4 filters: pref 5 (443), 49150 (80), 49152 (22)
    assert [x.split()[4] for x in order] == ["443", "80", "22"], out
    assert not [d for d in _check(out, tmp_path).diagnostics if d.is_error], out


def test_a_class_filter_listed_with_its_qdiscs_is_left_out(tmp_path: Path) -> None:
    """Found by a review (tests/import_data/class-filter.txt, saved from the host kernel): a
    filter on leaf class 1:10 at the pref of a filter of the qdisc is listed with the
    qdisc's (u32 keeps their tables in one list), and was imported as a line of the qdisc:
    UDP went to 1:10, where htb never consults a leaf's filters. Which table is whose the
    text does not say: both are left out (W613), the other prefs kept."""
    path = DATA / "class-filter.txt"
    code, out, err = _cli("-i", "r0", "--from", str(path))
    said = " ".join(err.split())
    assert code == 0, err
    found = re.findall(r"pref 5 lists the u32 tables 8\w\w:, 8\w\w: of more than one", said)
    assert len(found) == 2, said
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("match")]
    assert not [x for x in lines if "443" in x or "proto udp" in x], out
    assert any("dport 22" in x for x in lines), out  # other prefs are kept
    assert not [d for d in _check(out, tmp_path).diagnostics if d.is_error], out


PRETTY_HEAD = """\
qdisc htb 1: root r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000
class htb 1:10 root prio 0 rate 10Mbit ceil 10Mbit burst 1600b cburst 1600b
class htb 1:20 root prio 0 rate 10Mbit ceil 10Mbit burst 1600b cburst 1600b
"""
NODE = "filter parent 1: protocol {p} pref {n} u32 chain 0 fh {t}::800 order 2048 key ht {t} "
NODE += "bkt 0 *flowid 1:10 not_in_hw"


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ("\n  match IP src 10.1.0.0/16\n  match IP dsfield 0x10", 4),
        (" match dport 22", 4),  # tc -p puts the first port on the node's own line
        ("", 4),  # an IPv6 address, or 'match u32 0 0': tc -p shows nothing
        ("\n  match 0a010000/ffff0000 at 12", None),  # as tc shows it without -p
    ],
    ids=["IP src", "on the line", "nothing", "hex"],
)
def test_keys_saved_with_tc_p_are_refused_at_their_line(keys: str, line: int | None) -> None:
    """Found by a review: 'tc -p filter show' prints u32 keys its own way ('match IP src
    10.1.0.0/16'), and IPv6 keys and keys of mask 0 not at all. Each such filter was imported
    as a catch-all ('match family ipv4'): the policy written sent every packet to its class.
    The text is refused (E605) at the filter's line; without -p it imports."""
    text = PRETTY_HEAD + NODE.format(p="ip", n=4, t="803") + keys + "\n"
    got = import_policy(DeviceText("eth0", "saved.txt", text))
    if line is None:
        assert got.policy is not None and "match src 10.1.0.0/16 pref 4" in got.policy, got
        return
    assert got.policy is None
    (found,) = got.diagnostics
    assert (found.code, found.span.line) == ("E605", line), render(got.diagnostics, got.sources)
    if keys:
        assert "save it again without -p" in found.message
    else:  # it may be a node without keys: only the live state can tell
        assert "import the live state instead (tcdsl import -i eth0" in found.message


def test_a_node_without_keys_is_a_catch_all_where_the_text_is_not_tc_ps() -> None:
    """Found by a tester: 'ip6 dst ::/0' makes a u32 node without keys, which tc -p's text of
    an IPv6 node looks like: it was refused (E605) even as read live, where tcdsl runs tc
    without -p, or in a file that shows another node's keys in hex (tc -p shows none of an
    IPv4 or IPv6 node). Then it is a line for every packet of its family."""
    keyless = NODE.format(p="ipv6", n=5, t="801")
    hex_keys = NODE.format(p="ip", n=4, t="800") + "\n  match 0a010000/ffff0000 at 12"
    for text, raw in ((f"{PRETTY_HEAD}{keyless}\n", True),
                      (f"{PRETTY_HEAD}{hex_keys}\n{keyless}\n", False)):  # fmt: skip
        got = import_policy(DeviceText("eth0", "saved.txt", text, raw=raw))
        assert got.policy is not None, render(got.diagnostics, got.sources)
        lines = [x.strip() for x in got.policy.splitlines() if x.strip().startswith("match")]
        assert lines[-1] == "match dst ::/0 pref 5", got.policy  # it compiles to such a node
        assert ("family ipv6 htb" in got.policy) is raw, got.policy  # the tree's families
    # found by a review: a keyless node listed before a node in tc -p's own words was
    # reported as the one that could not be told apart, where the other tells it
    pretty = NODE.format(p="ip", n=4, t="800") + "\n  match IP src 10.1.0.0/16"
    got = import_policy(DeviceText("eth0", "saved.txt", f"{PRETTY_HEAD}{keyless}\n{pretty}\n"))
    (found,) = got.diagnostics
    assert "save it again without -p" in found.message and found.span.line == 5, found


def test_a_line_of_both_families_is_parted_where_their_orders_differ(tmp_path: Path) -> None:
    """Found by a tester: IPv4 'dport 80' then 'tos 0x10', IPv6 the same two the other way
    round, in two classes. The port filters became one line of both families, and no order of
    the classes kept both families' orders: the IPv4 'tos' line went first (W615), and an IPv4
    packet to port 80 with that TOS went to the other class. Now that line is a line per
    family, and the IPv4 'tos' line gets a pref of its own: both orders are the kernel's."""
    text = (DATA / "families-apart.txt").read_text(encoding="utf-8")
    got = import_policy(DeviceText("eth0", "saved.txt", text))
    assert got.policy is not None, render(got.diagnostics, got.sources)
    assert "in another order" not in " ".join(d.message for d in got.diagnostics)

    def order(batch: str, protocol: str) -> list[str]:
        """The flowids of one protocol's filters in the order the kernel tries them."""
        found = re.findall(rf"protocol {protocol} prio (\d+) .* flowid (\S+)", batch)
        return [flowid for _, flowid in sorted(found, key=lambda f: int(f[0]))]

    written = order(text.replace("pref", "prio").replace("*flowid", "flowid"), "ip")
    path = tmp_path / "imported.tcp"
    path.write_text(got.policy, encoding="utf-8")
    compiled = compile_policy(str(path), "tc-batch")
    assert compiled.output is not None, render(compiled.diagnostics, compiled.sources)
    for protocol, kernel in (("ip", ["1:10", "1:20"]), ("ipv6", ["1:20", "1:10", "1:10"])):
        assert order(text.replace("pref", "prio").replace("*flowid", "flowid"), protocol) == kernel
        assert order(compiled.output, protocol) == kernel, (protocol, got.policy)
    assert written == ["1:10", "1:20"]


def test_a_protocol_all_catch_all_is_written_as_match_all(tmp_path: Path) -> None:
    """Found by a tester: sqm-scripts' catch-all ('protocol all ... u32 match ip protocol 0
    0x00', a filter every packet meets) was left out, and the ICMP filter behind it then took
    the ICMP the kernel sends to 1:12. It is 'match all' at its pref now, said (W613), and
    classify answers as the kernel does."""
    path = DATA / "protocol-all-catch-all.txt"
    code, out, err = _cli("-i", "eth0", "--from", str(path))
    assert code == 0, err
    assert "[W613]" in err and "written as 'match all'" in err and "ARP" in err, err
    lines = [x.strip() for x in out.splitlines()]
    assert lines.index("match all pref 999") < lines.index("match proto icmp pref 1000"), out
    assert "interface eth0 family ipv4" not in out, "the catch-all is both families'"
    imported = tmp_path / "imported.tcp"
    imported.write_text(out, encoding="utf-8")
    for packet in ("icmp", "icmpv6", "udp dport 53"):
        said = CliRunner().invoke(cli, ["classify", str(imported), "--packet", packet])
        assert "(1:12)" in said.stdout.splitlines()[0], (packet, said.stdout)


def test_a_long_run_of_lines_in_one_list_is_imported_as_classifier_u32_linear(
    tmp_path: Path,
) -> None:
    """Found by a tester: 40 '/32' lines at one pref (a subscriber each) were imported as lines
    the compiler lays out in hash tables, so the policy did not build the state it came from
    and its first apply built the tree again (every counter reset). The tree is 'classifier
    u32 linear' now, and the policy compiles to one list at each pref, in the kernel's order."""
    code, out, err = _cli("-i", "eth0", "--from", str(DATA / "linear-run-of-40.txt"))
    assert code == 0, err
    assert "interface eth0 family ipv4 classifier u32 linear htb" in out, out
    result = _check(out, tmp_path)
    assert result.output is not None and "divisor" not in result.output
    assert result.output.count("match ip dst 100.70.0.") == 40
    hashed = _check(out.replace(" classifier u32 linear", ""), tmp_path)
    assert hashed.output is not None and "divisor 256" in hashed.output
    # a short run, or one in tcdsl's own tables, needs no word
    code, out, err = _cli("-i", "eth0", "--from", str(DATA / "wondershaper.txt"))
    assert code == 0 and "linear" not in out, out


def test_a_protocol_all_catch_all_at_a_pref_ipv6_cannot_have_is_left_out(
    tmp_path: Path,
) -> None:
    """Found by a review: at pref 49152 (tc's first pref without 'prio'), 'match all' would
    need its IPv6 filter at 49152 + 32768, past the last pref: the import wrote a policy that
    did not compile. Such a catch-all is left out, said, as before."""
    saved = tmp_path / "saved.txt"
    text = (DATA / "protocol-all-catch-all.txt").read_text(encoding="utf-8")
    saved.write_text(text.replace("pref 999", "pref 49152"), encoding="utf-8")
    code, out, err = _cli("-i", "eth0", "--from", str(saved))
    assert code == 0 and "match all" not in out, out
    assert "protocol 'all': the language writes ip and ipv6 only" in err, err
    _check(out, tmp_path)
