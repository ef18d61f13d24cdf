"""tc -batch or netlink: an N-class tree built, one class changed and the tree read back, with
``tc`` processes and with pyroute2 (netlink from Python).

Usage (as root; fresh network namespaces; pyroute2 installed in this venv, else it skips)::

    python bench/netlink_bench.py 1000 10000
    python bench/netlink_bench.py --repeat 5 --build-repeat 3 1000

For each N, the policy of ``bench/compile_bench.py`` (an htb root, N leaf classes in groups,
u32 filters for IPv4 and IPv6) is compiled by the tc-batch backend; its commands
(:func:`apply_bench.hand_written`) are turned into pyroute2 calls (the same objects: the u32
keys as tc packs them, :func:`tcdsl.verify.expect.expected_keys`). Every figure is timed
inside the namespace by one Python process (the worker), best of the runs:

(a) a first build on a veth: ``tc -batch FILE`` vs ``IPRoute().tc("add"|"add-class"|
    "add-filter", ...)`` one call per command (pyroute2's import and the translation of the
    commands are shown apart); after each, the qdisc and class listings (``tc -d``) and the
    filters (their bytes matched, flowid, pref, protocol, handle) of the two trees are compared;
(b) one class's rate changed: a ``tc -batch -`` process fed one line, a ``tc class change``
    process, pyroute2's ``change-class`` in a process that has it imported, and in a fresh
    interpreter (import + IPRoute() + the call, as a CLI that imports it on demand pays);
(c) a read-back: ``tc -s class show`` + ``tc filter show`` (two processes, then tcdsl's parsers
    on the text), vs pyroute2's ``get_classes`` + ``get_filters`` (decoded messages); and
    tcdsl's own ``read_device`` (what plan/apply read today: qdiscs, classes, every parent's
    filters through one tc -batch, parsed) for reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from apply_bench import _compile, hand_written  # the sibling scripts (their folder is on sys.path)

from tcdsl.units import parse_rate
from tcdsl.verify.expect import expected_keys
from tcdsl.verify.readback import parse_classes, parse_filters

DEVICE = "eth0"
ETH_P = {"ip": 0x0800, "ipv6": 0x86DD, "all": 0x0003}
CHANGED = "77kbit"
"""The rate (b) sets on the changed class (the policy's leaves have 100kbit)."""

T = TypeVar("T")
Call = tuple[str, str, dict[str, Any]]
"""A pyroute2 ``IPRoute.tc`` call: (command, kind, keyword arguments but the device index)."""


# ==== commands -> pyroute2 calls ===============================================================


def handle(text: str) -> int:
    """``1:20`` -> 0x10020 (tc's handles are hex on both sides of the colon)."""
    major, _, minor = text.partition(":")
    return int(major or "0", 16) << 16 | int(minor or "0", 16)


def _after(words: Sequence[str], key: str) -> str | None:
    return words[words.index(key) + 1] if key in words else None


def _htb_class(words: Sequence[str]) -> dict[str, Any]:
    args: dict[str, Any] = {"parent": handle(words[words.index("parent") + 1])}
    for key in ("rate", "ceil"):
        if (value := _after(words, key)) is not None:
            args[key] = parse_rate(value) // 8  # pyroute2 takes bytes per second
    for key in ("prio", "quantum"):
        if (number := _after(words, key)) is not None:
            args[key] = int(number)
    return args


def to_call(line: str) -> Call:
    """The pyroute2 call that makes what one tc command of the bench policy makes; the words
    this policy does not use are refused (ValueError), not guessed."""
    words = line.split()
    if words[:2] == ["qdisc", "add"] and words[5:7] == ["handle", "1:"] and words[7] == "htb":
        if words[8:9] not in ([], ["default"]) or len(words) > 10:
            raise ValueError(f"not translated: {line}")
        default = int(words[9], 16) if len(words) > 9 else 0
        return ("add", "htb", {"handle": handle(words[6]), "default": default})
    if words[:2] in (["class", "add"], ["class", "change"]) and words[8] == "htb":
        command = "add-class" if words[1] == "add" else "change-class"
        extra = set(words[9::2]) - {"rate", "ceil", "prio", "quantum"}
        if extra:
            raise ValueError(f"not translated ({', '.join(sorted(extra))}): {line}")
        return (command, "htb", {"handle": handle(words[7]), **_htb_class(words)})
    if words[:2] == ["filter", "add"] and words[10] == "u32" and words[-2] == "flowid":
        groups: list[tuple[str, ...]] = []
        for word in words[11:-2]:
            if word == "match":
                groups.append(())
            else:
                groups[-1] += (word,)
        keys = [f"0x{v:08x}/0x{m:08x}+{o}" for v, m, o in expected_keys(tuple(groups))]
        args = {
            "parent": handle(words[5]),
            "protocol": ETH_P[words[7]],
            "prio": int(words[9]),
            "target": handle(words[-1]),
            "keys": keys,
        }
        return ("add-filter", "u32", args)
    raise ValueError(f"not translated: {line}")


# ==== the worker: timings inside the namespace =================================================


def _timed(run: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def _clock(run: Callable[[], object]) -> float:
    return _timed(run)[1]


def _tc(args: Sequence[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        ["tc", *args], input=stdin, capture_output=True, text=True, check=False,
        env={**os.environ, "LC_ALL": "C"},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout


_COLD = """
import json, sys, time
start = time.perf_counter()
from pyroute2 import IPRoute
imported = time.perf_counter()
with IPRoute() as ipr:
    index = ipr.link_lookup(ifname=sys.argv[1])[0]
    ipr.tc("change-class", "htb", index, **json.loads(sys.argv[2]))
print(json.dumps([imported - start, time.perf_counter() - start]))
"""
"""pyroute2's change in a fresh interpreter, timed from before its import (the interpreter's
own start is not counted: tcdsl's process pays it either way)."""


def worker_build_tc(path: str) -> dict[str, float]:
    """(a) with tc: one ``tc -batch`` process."""
    return {"seconds": _clock(lambda: _tc(["-batch", path]))}


def worker_build_nl(path: str) -> dict[str, float]:
    """(a) with pyroute2: import, open, one call per command."""
    calls: list[Call] = json.loads(Path(path).read_text(encoding="utf-8"))
    start = time.perf_counter()
    from pyroute2 import IPRoute  # here: its import is one of the figures

    imported = time.perf_counter()
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=DEVICE)[0]
        opened = time.perf_counter()
        for command, kind, args in calls:
            ipr.tc(command, kind, index, **args)
    done = time.perf_counter()
    return {"import": imported - start, "seconds": done - opened, "open": opened - imported}


def worker_change(spec_text: str, repeat: int) -> dict[str, Any]:
    """(b): one class's rate changed by each method, best of ``repeat``; before each run the
    class is set back to its old rate (untimed), and what tc shows after it is kept."""
    spec = json.loads(spec_text)
    back, line = spec["back"], spec["change"]  # tc commands: the old rate, the new one
    command, kind, args = to_call(line)
    from pyroute2 import IPRoute

    def fresh() -> list[float]:
        cold = subprocess.run(
            [sys.executable, "-c", _COLD, DEVICE, json.dumps(args)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return list(json.loads(cold.stdout))

    times: dict[str, list[float]] = {}
    shown: dict[str, str] = {}
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=DEVICE)[0]
        methods: dict[str, Callable[[], object]] = {
            "tc -batch - (one line)": lambda: _tc(["-batch", "-"], line + "\n"),
            "tc class change": lambda: _tc(line.split()),
            "pyroute2, imported": lambda: ipr.tc(command, kind, index, **args),
        }
        for _ in range(repeat):
            for name, run in methods.items():
                _tc(back.split())
                times.setdefault(name, []).append(_clock(run))
                shown[name] = _tc(
                    ["-d", "class", "show", "dev", DEVICE, "classid", spec["classid"]]
                )
            _tc(back.split())
            imported, total = fresh()
            times.setdefault("pyroute2 import", []).append(imported)
            times.setdefault("pyroute2, fresh: import+open+call", []).append(total)
            shown["pyroute2, fresh"] = _tc(
                ["-d", "class", "show", "dev", DEVICE, "classid", spec["classid"]]
            )
    return {"times": {k: min(v) for k, v in times.items()}, "shown": shown}


def worker_read(repeat: int) -> dict[str, Any]:
    """(c): the whole tree read back each way; best of ``repeat``, and what each one saw."""
    from pyroute2 import IPRoute

    from tcdsl.ops.live import read_device

    times: dict[str, list[float]] = {}
    counts: dict[str, tuple[int, int]] = {}
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=DEVICE)[0]
        for _ in range(repeat):
            classes, t_classes = _timed(lambda: _tc(["-s", "class", "show", "dev", DEVICE]))
            filters, t_filters = _timed(lambda: _tc(["filter", "show", "dev", DEVICE]))
            parsed, t_parse = _timed(
                lambda: (len(parse_classes(classes)), len(parse_filters(filters)))  # noqa: B023
            )
            got_classes, t_get_classes = _timed(lambda: list(ipr.get_classes(index)))
            got_filters, t_get_filters = _timed(
                lambda: list(ipr.get_filters(index, parent=0x10000))
            )
            _, t_read = _timed(lambda: read_device(DEVICE))
            counts["tc"] = parsed
            counts["pyroute2"] = (len(got_classes), sum(map(_u32_rule, got_filters)))
            for name, seconds in (
                ("tc -s class show", t_classes),
                ("tc filter show", t_filters),
                ("tcdsl parse of both", t_parse),
                ("pyroute2 get_classes", t_get_classes),
                ("pyroute2 get_filters", t_get_filters),
                ("tcdsl read_device (tc -d, parsed)", t_read),
            ):
                times.setdefault(name, []).append(seconds)
    return {"times": {k: min(v) for k, v in times.items()}, "counts": counts}


def _u32_rule(msg: Any) -> bool:
    """A u32 rule, not the per-pref head or hash table that a dump also lists."""
    options = msg.get_attr("TCA_OPTIONS")
    return options is not None and options.get_attr("TCA_U32_SEL") is not None


def worker(argv: Sequence[str]) -> None:
    """Run one measurement inside the namespace; print it as JSON."""
    mode, arg, repeat = argv[0], argv[1], int(argv[2])
    modes: dict[str, Callable[[], object]] = {
        "build-tc": lambda: worker_build_tc(arg),
        "build-nl": lambda: worker_build_nl(arg),
        "change": lambda: worker_change(arg, repeat),
        "read": lambda: worker_read(repeat),
    }
    print(json.dumps(modes[mode]()))


# ==== the orchestrator: namespaces, comparisons, the table =====================================


def _ns(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True)
    for args in (
        ["ip", "link", "add", DEVICE, "type", "veth", "peer", "name", "tv0p"],
        ["ip", "link", "set", DEVICE, "up"],
    ):
        subprocess.run(["ip", "netns", "exec", name, *args], check=True)
    return name


def _drop(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False)


def _work(ns: str, mode: str, arg: str, repeat: int = 1) -> dict[str, Any]:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, __file__, "--worker", mode, arg, str(repeat)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"netlink_bench: {mode} failed in {ns}:\n{done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _show(ns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, check=True,
        env={**os.environ, "LC_ALL": "C"},
    ).stdout  # fmt: skip


def matched_bytes(keys: Sequence[tuple[int, int, int]]) -> frozenset[tuple[int, int, int]]:
    """The bytes a filter's u32 keys compare: (offset, value, mask) of each byte whose mask is
    not 0, whatever 32-bit words tc or pyroute2 packed them into."""
    out = set()
    for value, mask, offset in keys:
        for i in range(4):
            shift = 24 - 8 * i
            if (mask >> shift) & 0xFF:
                out.add((offset + i, (value >> shift) & 0xFF, (mask >> shift) & 0xFF))
    return frozenset(out)


def kernel_state(ns: str) -> dict[str, Any]:
    """What the tree in ``ns`` is: the qdisc and class listings (``tc -d``, sorted lines), the
    filter listing, and each u32 rule's protocol, pref, node, flowid and matched bytes."""
    filters = _show(ns, "filter", "show", "dev", DEVICE)
    rules = Counter(
        (f.protocol, f.pref, f.node, f.flowid, matched_bytes(f.keys))
        for f in parse_filters(filters)
    )
    return {
        "qdiscs": sorted(_show(ns, "-d", "qdisc", "show", "dev", DEVICE).splitlines()),
        "classes": sorted(_show(ns, "-d", "class", "show", "dev", DEVICE).splitlines()),
        "filter text": filters,
        "rules": rules,
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> Iterator[str]:
    for key in ("qdiscs", "classes"):
        yield f"{key} {'same' if a[key] == b[key] else 'DIFFER'}"
    yield (
        f"{sum(b['rules'].values())}/{sum(a['rules'].values())} u32 rules, "
        f"{'same' if a['rules'] == b['rules'] else 'DIFFERENT'} matches"
    )
    yield f"filter text {'same' if a['filter text'] == b['filter text'] else 'differs'}"


def _key_sample(text: str) -> str:
    """The first rule's key lines of a filter listing (how tc or pyroute2 packed them)."""
    keys = [x.strip() for x in text.splitlines() if x.strip().startswith("match")]
    return ", ".join(keys[:2])


class Table:
    """Rows of (N, step, method, seconds, note), printed as they come."""

    def __init__(self) -> None:
        print(f"{'N':>6}  {'step':<12} {'method':<40} {'time':>11}  note")

    def row(self, n: int, step: str, method: str, seconds: float | None, note: str = "") -> None:
        """Print one row (seconds None: a note only)."""
        shown = "" if seconds is None else f"{seconds * 1000:8.1f} ms"
        print(f"{n:>6}  {step:<12} {method:<40} {shown:>11}  {note}".rstrip(), flush=True)


def bench(n: int, tmp: Path, repeat: int, build_repeat: int, table: Table) -> None:
    """Measure (a), (b) and (c) for ``n`` classes."""
    lines = hand_written(_compile(n, "tc-batch")).splitlines()
    calls: list[Call] = []
    prep = _clock(lambda: calls.extend(to_call(x) for x in lines))
    (tmp / "hand.batch").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    (tmp / "calls.json").write_text(json.dumps(calls), encoding="utf-8")
    kinds = Counter(x.split()[0] for x in lines)
    what = ", ".join(f"{v} {k}" for k, v in kinds.items())
    table.row(n, "", f"{len(lines)} commands: {what}", None)
    pid = os.getpid()
    ns_tc = ns_nl = ""
    try:
        best_tc: float | None = None
        best_nl: dict[str, float] = {}
        for run in range(build_repeat):  # interleaved, fresh namespaces, the last ones kept
            for name in (ns_tc, ns_nl):
                if name:
                    _drop(name)
            ns_tc, ns_nl = _ns(f"tcdsl-nlb-tc-{pid}-{run}"), _ns(f"tcdsl-nlb-nl-{pid}-{run}")
            seconds = _work(ns_tc, "build-tc", str(tmp / "hand.batch"))["seconds"]
            best_tc = seconds if best_tc is None else min(best_tc, seconds)
            got = _work(ns_nl, "build-nl", str(tmp / "calls.json"))
            best_nl = {k: min(v, best_nl.get(k, v)) for k, v in got.items()}
        assert best_tc is not None
        ratio = f"{best_nl['seconds'] / best_tc:.2f}x tc"
        table.row(n, "(a) build", "tc -batch FILE", best_tc)
        table.row(n, "(a) build", "pyroute2: one call per command", best_nl["seconds"], ratio)
        table.row(
            n, "(a) build", "  + pyroute2 import, IPRoute()", best_nl["import"] + best_nl["open"]
        )
        table.row(n, "(a) build", "  + commands -> calls (in tcdsl)", prep)
        a, b = kernel_state(ns_tc), kernel_state(ns_nl)
        table.row(n, "(a) state", "pyroute2's tree vs tc's", None, "; ".join(_same(a, b)))
        table.row(n, "(a) state", "u32 keys, tc", None, _key_sample(a["filter text"]))
        table.row(n, "(a) state", "u32 keys, pyroute2", None, _key_sample(b["filter text"]))

        leaf = next(
            x for x in lines if x.startswith("class add") and " ceil " in x and "prio" not in x
        )
        back = leaf.replace("class add", "class change", 1)
        rate = back.split()[back.split().index("rate") + 1]
        spec = {"back": back, "change": back.replace(f"rate {rate}", f"rate {CHANGED}", 1)}
        spec["classid"] = back.split()[back.split().index("classid") + 1]
        changed = _work(ns_tc, "change", json.dumps(spec), repeat)
        base = changed["times"]["tc class change"]
        for method, seconds in changed["times"].items():
            note = "" if method == "tc class change" else f"{seconds / base:.2f}x tc class change"
            table.row(n, "(b) change", method, seconds, note)
        texts = set(changed["shown"].values())
        agree = "the same" if len(texts) == 1 else "DIFFERENT"
        table.row(
            n, "(b) state", f"class {spec['classid']} after each method", None, f"{agree} (tc -d)"
        )

        read = _work(ns_tc, "read", "-", repeat)
        times = read["times"]
        for method, seconds in times.items():
            table.row(n, "(c) read", method, seconds)
        tc_total = times["tc -s class show"] + times["tc filter show"]
        nl_total = times["pyroute2 get_classes"] + times["pyroute2 get_filters"]
        parsed = tc_total + times["tcdsl parse of both"]
        table.row(n, "(c) read", "tc, two processes (text)", tc_total)
        table.row(n, "(c) read", "tc, two processes + tcdsl parse", parsed)
        table.row(
            n,
            "(c) read",
            "pyroute2, two dumps (decoded)",
            nl_total,
            f"{nl_total / parsed:.2f}x tc+parse",
        )
        counts = ", ".join(
            f"{k}: {c} classes, {f} u32 rules" for k, (c, f) in read["counts"].items()
        )
        table.row(n, "(c) state", "seen by each", None, counts)
    finally:
        for name in (ns_tc, ns_nl):
            if name:
                _drop(name)


def main() -> None:
    """Measure each N and print a table (or say why not)."""
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="+", type=int, metavar="N")
    parser.add_argument("--repeat", type=int, default=5, help="runs of (b) and (c) (best kept)")
    parser.add_argument("--build-repeat", type=int, default=3, help="runs of (a) (best kept)")
    args = parser.parse_args()
    if importlib.util.find_spec("pyroute2") is None:
        print(
            "netlink_bench: skipped: pyroute2 is not installed (it is not a tcdsl dependency; "
            "'.venv/bin/pip install pyroute2' to measure)"
        )
        return
    if os.geteuid() != 0:
        sys.exit("netlink_bench needs root (network namespaces)")
    import pyroute2  # here: only when it is installed

    print(
        f"pyroute2 {pyroute2.__version__}; best of {args.build_repeat} (a), {args.repeat} (b), (c)"
    )
    table = Table()
    with tempfile.TemporaryDirectory(prefix="tcdsl-netlink-bench-") as tmp:
        for n in args.sizes:
            bench(n, Path(tmp), args.repeat, args.build_repeat, table)


if __name__ == "__main__":
    main()
