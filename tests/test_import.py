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

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tcdsl.cli import cli
from tcdsl.diagnostics import render
from tcdsl.driver import Result, compile_policy
from tcdsl.ops.importer import import_policy
from tcdsl.ops.tctext import DeviceText, with_parent
from tcdsl.verify import runner, verifier
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import KernelState
from tests.conftest import ROOT, policy_files

HERE = Path(__file__).parent


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
    return runner.Case(f"{p.name} {label}", runner.case_script(label, script, p.create, p.read))


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
        out[dev] = DeviceText(dev, f"tc:{dev}", text)
    return out


def _applied(result: runner.CaseResult | None, p: Planned) -> dict[str, runner.Section]:
    assert result is not None, f"{p.name}: the guest stopped before this case"
    found = runner.sections(result.stdout)
    applied = found.get("apply-stderr")
    assert applied is not None and applied.status == 0, (
        f"{result.name} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}"
    )
    return found


def imported_text(p: Planned, texts: dict[str, DeviceText]) -> str:
    """The policy ``tcdsl import`` writes for every interface of ``p``'s policy."""
    assert p.result.policy is not None
    out = []
    # a download's IFB is an interface of the IR, made by the script: imported with its
    # interface's download
    for name in dict.fromkeys(i.name for i in p.result.policy.interfaces if i.name in p.create):
        got = import_policy(texts[name], texts.get)
        assert got.policy is not None, render(got.diagnostics, got.sources)
        out.append(got.policy)
    return "\n".join(out)


Run = Callable[[list[runner.Case]], Sequence[runner.CaseResult | None]]


def round_trip(planned: list[Planned], run: Run, tmp: Path) -> int:
    """Apply, import, compile, apply again, compare (``_same``); returns the policies done."""
    from tests.test_equivalence import _same

    first = run([_case(p, p.result.output or "", "original") for p in planned])
    imported: list[tuple[Planned, Planned, str]] = []
    for n, (p, result) in enumerate(zip(planned, first, strict=True)):
        texts = device_texts(_applied(result, p), p.read)
        text = imported_text(p, texts)
        path = tmp / f"imported-{n}.tcp"
        path.write_text(text, encoding="utf-8")
        again = _compile(path)
        assert again.output is not None, (
            f"{p.name}: the imported policy does not compile:\n{text}\n"
            + render(again.diagnostics, again.sources)
        )
        imported.append((p, Planned(p.name, again, p.create, p.read), text))
    second = run([_case(q, q.result.output or "", "imported") for _, q, _ in imported])
    for (p, q, text), result, before in zip(imported, second, first, strict=True):
        a = runner.read_state(_applied(before, p), p.read)
        b = runner.read_state(_applied(result, q), q.read)
        try:
            _same(a, b)
        except AssertionError as err:
            raise AssertionError(
                f"{p.name}: the imported policy builds another state:\n{text}\n"
                f"---- original\n{_dump(a)}---- imported\n{_dump(b)}"
            ) from err
    return len(planned)


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
    return [(str(p), ROOT / p) for p in policy_files()]


def _guest(planned: list[Planned], tmp: Path) -> int:
    if not planned:
        return 0
    why = runner.uml_unavailable()
    if why is not None:
        pytest.skip(f"user-mode Linux is unavailable for {len(planned)} policies: {why}")
    return round_trip(planned, runner.run_on_uml, tmp)


def test_examples_round_trip(tmp_path: Path) -> None:
    host, guest = _split(_examples())
    done = 0
    if host:
        done += round_trip(host, runner.run_on_host, tmp_path)
        print(f"host: {', '.join(p.name for p in host)}")
    done += _guest(guest, tmp_path)
    print(f"user-mode Linux: {', '.join(p.name for p in guest)}")
    assert done == len(host) + len(guest)
