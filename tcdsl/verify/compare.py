"""Compare the kernel's state with the policy's, and the script's run with its commands.

Every difference becomes a ``Diagnostic`` at the policy text it comes from:

- E401: an object the policy creates is missing in the kernel;
- E402: an object is there with another value (kind, parent, rate, keys, order, ...);
- E403: the kernel holds an object the policy does not create (a stray filter, a class);
- E404: the script failed, or ``tc`` could not parse a command; tc's words are quoted;
- E405: the kernel lacks a feature the policy needs;
- W406: a tool warned while applying a command (the kernel adjusted something).

The script is mapped back to the policy through the comment it puts before each command,
``# FILE:LINE:COL: WHAT``.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tcdsl.commands import NO_INTERFACE, SCRIPT_AT
from tcdsl.diagnostics import Diagnostic, Span
from tcdsl.units import format_rate, format_size
from tcdsl.verify.expect import (
    ExpectedChain,
    ExpectedClass,
    ExpectedFilter,
    ExpectedInterface,
    ExpectedPolicy,
    ExpectedQdisc,
    ExpectedRule,
    Want,
    approx_equal,
    describe_keys,
)
from tcdsl.verify.readback import (
    PROTOCOL_NUMBERS,
    Action,
    DeviceState,
    IptablesState,
    IptRule,
    KernelState,
    Shown,
    TcClass,
    TcFilter,
    TcQdisc,
    Value,
)

MISSING = "E401"
DIFFERS = "E402"
UNEXPECTED = "E403"
APPLY_FAILED = "E404"
NO_FEATURE = "E405"
TOOL_WARNED = "W406"

# ==== the script: which command comes from which policy text ===================================

_ORIGIN = re.compile(r"(?P<file>.+):(?P<line>\d+):(?P<column>\d+): (?P<what>.*)")
AT = f"{SCRIPT_AT}="
"""How a generated script notes the policy text of the command that follows (the script's exit
trap names it if the command fails)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """A command of the script and the policy text its comment names."""

    command: str
    """The command line, as written in the script."""
    words: str
    """Its words joined by single spaces, as a shell's xtrace shows the command."""
    span: Span
    what: str
    """The comment's words after the location (``class voip``, ``sfq qdisc of 1:10``)."""

    @property
    def tool(self) -> str:
        """The program the command runs (``tc``, ``iptables``)."""
        return self.words.split(" ", 1)[0]


_BLANKS = re.compile("[ \t\r\n]+")
"""What shlex splits at (str.split also splits at other Unicode spaces)."""


def shell_words(line: str) -> str:
    """The words of a shell command line, as the shell splits them (shlex), joined by single
    spaces; split at blanks when nothing is quoted (shlex took 6 s for 30,000 lines). A line
    shlex cannot split (an open quote): the line itself, stripped."""
    if not any(c in line for c in "'\"\\"):
        return " ".join(w for w in _BLANKS.split(line) if w)
    try:
        return " ".join(shlex.split(line))
    except ValueError:
        return line.strip()


_BATCH_START = re.compile(r"tcdsl_batch=\$\(cat <<'(?P<end>\w+)'$")
"""Where the shell script's batch form starts feeding one ``tc -batch`` (its heredoc)."""


def script_batches(script: str) -> list[list[str]]:
    """The lines of each ``tc -batch -`` heredoc of a script's batch form, in order (tc
    names a failed command by its line there: ``Command failed -:LINE``)."""
    out: list[list[str]] = []
    end: str | None = None
    for line in script.splitlines():
        if end is not None:
            if line == end:
                end = None
            else:
                out[-1].append(line)
        elif (m := _BATCH_START.search(line)) is not None:
            end = m["end"]
            out.append([])
    return out


def script_origins(script: str, spans: Iterable[Span] = ()) -> list[Origin]:
    """The commands of a generated script that follow a ``tcdsl_at='FILE:LINE:COL: WHAT'`` line,
    and in its batch form the lines of a ``tc -batch`` heredoc after a ``# FILE:LINE:COL:
    WHAT`` comment (as ``tc LINE``).

    ``spans`` are the policy's spans (``ExpectedPolicy.spans()``): a noted location is looked
    up there to get the full extent of the text for the caret; otherwise the span is one
    column wide.
    """
    known: dict[tuple[str, int, int], Span] = {}
    for s in spans:
        known.setdefault((s.file, s.line, s.column), s)
    out: list[Origin] = []
    pending: re.Match[str] | None = None
    end: str | None = None
    for line in script.splitlines():
        if end is not None:  # a batch's heredoc
            if line == end:
                end = pending = None
            elif line.startswith("# "):
                pending = _ORIGIN.fullmatch(line[2:])
            elif pending is not None and line.strip():
                out.append(_origin(f"tc {line}", pending, known))
                pending = None
            continue
        if (batch := _BATCH_START.search(line)) is not None:
            end, pending = batch["end"], None
            continue
        if line.startswith(AT):
            try:
                noted = shlex.split(line[len(AT) :])
            except ValueError:
                noted = []
            pending = _ORIGIN.fullmatch(noted[0]) if len(noted) == 1 else None
            continue
        if pending is None or not line.strip() or line.lstrip().startswith("#"):
            continue
        out.append(_origin(line, pending, known))
        pending = None
    return out


def _origin(command: str, noted: re.Match[str], known: dict[tuple[str, int, int], Span]) -> Origin:
    """The origin of ``command`` at the place ``noted`` (the full span where known)."""
    file, row, col = noted["file"], int(noted["line"]), int(noted["column"])
    span = known.get((file, row, col), Span(file, row, col, row, col + 1))
    return Origin(command, shell_words(command), span, noted["what"])


@dataclass
class Step:
    """One command the script ran (as its xtrace showed it) and what it wrote on stderr."""

    command: str
    stderr: list[str] = field(default_factory=list)


@dataclass
class ApplyOutcome:
    """How the script ran: its exit status, its stdout, and its commands in order."""

    exit_code: int
    stdout: str = ""
    steps: list[Step] = field(default_factory=list)
    preamble: list[str] = field(default_factory=list)
    """stderr written before the first traced command (the shell's own complaints)."""

    @property
    def failed(self) -> bool:
        """True if the script did not finish successfully."""
        return self.exit_code != 0


def _locate(steps: Sequence[Step], origins: Sequence[Origin]) -> list[Origin | None]:
    """The origin of each step: the next origin (in script order) with the same words."""
    out: list[Origin | None] = []
    at = 0
    for step in steps:
        found = None
        for i in range(at, len(origins)):
            if origins[i].words == step.command:
                found, at = origins[i], i + 1
                break
        out.append(found)
    return out


def _quote(lines: Sequence[str], most: int = 3) -> str:
    """A tool's message on one line: its first lines, without the usage text that follows
    a parse error (``Usage: ...`` and the indented lines of its help)."""
    said: list[str] = []
    for line in lines:
        if line.startswith("Usage:"):
            break
        if line.strip() and not line.startswith((" ", "\t")):
            said.append(line.strip())
    return " / ".join(said[:most]) or "no message"


_UNKNOWN_KIND = (
    "Specified qdisc kind is unknown",
    "TC classifier not found",
    "Unknown filter",
)


def _missing_kind(command: str) -> str:
    """What a tc command adds that the kernel may lack: ``the sfq qdisc (sch_sfq)``."""
    words = command.split()
    if "qdisc" in words[1:2] and "handle" in words:
        i = words.index("handle") + 2
        if i < len(words):
            return f"the {words[i]} qdisc (sch_{words[i]})"
    if "filter" in words[1:2] and "prio" in words:
        i = words.index("prio") + 2
        if words[i : i + 1] == ["handle"]:
            i += 2
        if i < len(words):
            return f"the {words[i]} classifier (cls_{words[i]})"
    return "what this command needs"


HARMLESS_WARNINGS = frozenset({"Warning: act_api: Failed to setup tc actions for offload."})
"""What the kernel says that changes nothing here: a police action whose verdict above the rate
is ``reclassify`` (the default), made on its own (a tree's shared policer), cannot be offloaded
to a NIC; the action works in software as asked. (``skip_hw`` would silence it, but kernels
before 5.17 refuse that flag on an action.)"""


def apply_diagnostics(
    outcome: ApplyOutcome, origins: Sequence[Origin], fallback: Span
) -> list[Diagnostic]:
    """E404 (or E405) for the command that stopped the script, W406 for warnings on the way.

    ``fallback`` is where a failure is reported when no policy comment names the command
    (a teardown line, the shell itself).
    """
    out: list[Diagnostic] = []
    located = _locate(outcome.steps, origins)
    for i, (step, origin) in enumerate(zip(outcome.steps, located, strict=True)):
        last = i == len(outcome.steps) - 1
        if last and outcome.failed:
            continue
        heard = [line for line in step.stderr if line.strip() not in HARMLESS_WARNINGS]
        if origin is not None and heard:
            out.append(
                Diagnostic.warning(
                    TOOL_WARNED,
                    f"{origin.tool} warned on {origin.what}: {_quote(heard)}",
                    origin.span,
                )
            )
    if outcome.failed:
        missing = _missing_interface(outcome)
        if missing is not None:
            # The script's check before any change (every interface exists) stopped it.
            span = next(
                (o.span for o in origins if o.what.startswith(f"interface {missing}:")), fallback
            )
            out.append(
                Diagnostic.error(
                    APPLY_FAILED,
                    f"the script found no interface {missing} and changed nothing "
                    f"(exit {outcome.exit_code})",
                    span,
                )
            )
            return out
        if outcome.steps:
            step, origin = outcome.steps[-1], located[-1]
            said = _quote(step.stderr)
            span = origin.span if origin is not None else fallback
            what = origin.what if origin is not None else f"'{step.command}'"
            tool = step.command.split(" ", 1)[0]
        else:
            said, span, what, tool = _quote(outcome.preamble), fallback, "the script", "sh"
        if outcome.steps and any(k in said for k in _UNKNOWN_KIND):
            lacks = _missing_kind(outcome.steps[-1].command)
            out.append(
                Diagnostic.error(NO_FEATURE, f"the kernel lacks {lacks}; {tool} said: {said}", span)
            )
        else:
            out.append(
                Diagnostic.error(
                    APPLY_FAILED,
                    f"{tool} failed on {what} (exit {outcome.exit_code}): {said}",
                    span,
                )
            )
    return out


_NO_INTERFACE = re.compile(re.escape(NO_INTERFACE).replace("%s", "(.+)"))


def _missing_interface(outcome: ApplyOutcome) -> str | None:
    """The interface the script's first check found missing, if that stopped it."""
    for step in outcome.steps:
        for line in step.stderr:
            found = _NO_INTERFACE.fullmatch(line)
            if found is not None:
                return found.group(1)
    return None


# ==== tc parse check (for what no kernel has: cbq) ==============================================

_KERNEL_SAID = ("RTNETLINK answers", "We have an error talking to the kernel")


def classify_failure(
    exit_code: int, stderr: str, tool: str = "tc"
) -> Literal["ok", "kernel", "parse"]:
    """Whether a failed command was refused by the kernel, or never got that far.

    tc exits with 2 exactly when the kernel refused a request it built (``RTNETLINK answers:
    ...``, or ``Error: `` and the kernel's words); a usage or parse error (``What is
    "..."?``, ``Illegal "..."``, ``Usage: ...``) exits with 1. iptables is the other way
    round: 2 is its "parameter problem", 1 anything else.
    """
    if exit_code == 0:
        return "ok"
    if tool.startswith("iptables"):
        return "parse" if exit_code == 2 else "kernel"
    if exit_code == 2 or any(p in stderr for p in _KERNEL_SAID):
        return "kernel"
    return "parse"


@dataclass(frozen=True, slots=True)
class CommandRun:
    """One command run on its own (the parse check): the script line, its status, its stderr."""

    command: str
    exit_code: int
    stderr: str


def parse_check_diagnostics(
    runs: Sequence[CommandRun], origins: Sequence[Origin]
) -> list[Diagnostic]:
    """E404 for each command tc (or iptables) could not parse; kernel refusals are fine."""
    by_line = {o.command: o for o in origins}
    out = []
    for run in runs:
        origin = by_line.get(run.command)
        if origin is None:
            continue
        if classify_failure(run.exit_code, run.stderr, origin.tool) != "parse":
            continue
        said = _quote(run.stderr.splitlines())
        out.append(
            Diagnostic.error(
                APPLY_FAILED,
                f"{origin.tool} cannot parse the command for {origin.what}: {said}",
                origin.span,
            )
        )
    return out


# ==== the kernel's state =======================================================================


def _value_diagnostics(
    label: str, wants: Sequence[Want], shown: dict[str, Shown]
) -> Iterator[Diagnostic]:
    value: Value
    for want in wants:
        got = shown.get(want.key)
        if got is None:
            if want.absent is None:
                yield Diagnostic.error(
                    DIFFERS,
                    f"{label} shows no {want.label} in the kernel, policy says {want.policy}",
                    want.span,
                )
                continue
            value, text = want.absent, _absent_text(want)
        else:
            value, text = got.value, got.text
            if isinstance(value, bool):
                text = "on" if value else "off"
        if not approx_equal(value, want):
            yield Diagnostic.error(
                DIFFERS,
                f"{label} {want.label} is {text} in the kernel, policy says {want.policy}",
                want.span,
            )


def _absent_text(want: Want) -> str:
    """How to name a value tc does not print (a flag that is off, a zero delay)."""
    if isinstance(want.absent, bool):
        return "on" if want.absent else "off"
    return "none"


def default_qdisc() -> str:
    """The kind of qdisc the kernel gives a TX queue of its own accord
    (``net.core.default_qdisc``; pfifo_fast where it cannot be read)."""
    try:
        with open("/proc/sys/net/core/default_qdisc", encoding="ascii") as f:
            return f.read().strip() or "pfifo_fast"
    except OSError:
        return "pfifo_fast"


def _compare_qdiscs(iface: ExpectedInterface, dev: DeviceState) -> Iterator[Diagnostic]:
    actual = {q.handle: q for q in dev.qdiscs}
    for exp in iface.qdiscs:
        got = actual.get(exp.handle)
        if got is None:
            yield Diagnostic.error(
                MISSING,
                f"{exp.label} is missing in the kernel (expected {exp.kind} {exp.handle} "
                f"under {exp.parent})",
                exp.span,
            )
            continue
        yield from _compare_qdisc(exp, got)
    yield from _unexpected_qdiscs(iface, dev)


def _unexpected_qdiscs(iface: ExpectedInterface, dev: DeviceState) -> Iterator[Diagnostic]:
    wanted = {q.handle for q in iface.qdiscs}
    # A queue of an mq tree that the policy does not name holds the kernel's default qdisc:
    # made by the kernel (handle 0:), or put back by an apply that took the queue out of
    # the policy (a handle of its own: a deleted one would leave the queue dropping all).
    mq = {q.handle for q in iface.qdiscs if q.kind == "mq"}
    defaults = {"pfifo_fast", default_qdisc()}
    for q in dev.qdiscs:
        if q.handle in wanted or q.handle == "0:":
            continue  # handle 0: is a default the kernel made (noqueue, a band's pfifo)
        if q.kind in defaults and f"{q.parent.partition(':')[0]}:" in mq:
            continue
        yield Diagnostic.error(
            UNEXPECTED,
            f"unexpected {q.kind} qdisc {q.handle} under {q.parent} in the kernel",
            iface.owner_span(q.parent if q.parent != "root" else q.handle),
        )


def _kind_and_parent(
    exp: ExpectedQdisc | ExpectedClass, got: TcQdisc | TcClass, noun: str
) -> Diagnostic | None:
    """The first of a wrong kind or a wrong parent, if any."""
    if got.kind != exp.kind:
        return Diagnostic.error(
            DIFFERS,
            f"{exp.label} is a {got.kind} {noun} in the kernel, policy says {exp.kind}",
            exp.span,
        )
    if got.parent != exp.parent and not (noun == "qdisc" and _one_class(got.parent, exp.parent)):
        return Diagnostic.error(
            DIFFERS,
            f"{exp.label} hangs off {got.parent} in the kernel, policy says {exp.parent}",
            exp.span,
        )
    return None


def _one_class(got: str, exp: str) -> bool:
    """Whether a qdisc's parent in the kernel, ``got``, names what the policy's, ``exp``,
    does: a tbf's or netem's child added at 'parent 1:' (as tcdsl and the seeds write it) or
    at 'parent 1:1' (tc-netem(8)'s example) is in that one class either way (only such a
    child has a qdisc, not a class, for parent)."""
    return exp.endswith(":") and got == f"{exp}1"


def _compare_qdisc(exp: ExpectedQdisc, got: TcQdisc) -> Iterator[Diagnostic]:
    mismatch = _kind_and_parent(exp, got, "qdisc")
    if mismatch is not None:
        yield mismatch
        if got.kind != exp.kind:
            return  # nothing else is comparable
    yield from _value_diagnostics(exp.label, exp.wants, dict(got.options))


# tc lists the classes of these kinds only because their qdisc has them (prio bands, the one
# class of tbf and netem, sfq and fq_codel flows): the script never creates one.
# Classes a qdisc shows of itself: bands, or flows while they hold packets (sfq, fq_codel and
# cake list each active flow as a class: IPv6's own chatter, neighbour discovery, makes some).
_IMPLIED_CLASS_KINDS = frozenset(
    {"prio", "pfifo_fast", "tbf", "netem", "sfq", "fq_codel", "mq", "red", "fq_pie", "cake"}
)


def _compare_classes(iface: ExpectedInterface, dev: DeviceState) -> Iterator[Diagnostic]:
    actual = {c.classid: c for c in dev.classes}
    wanted = {c.classid for c in iface.classes}
    present = {q.handle for q in dev.qdiscs}
    for exp in iface.classes:
        got = actual.get(exp.classid)
        if got is None:
            yield Diagnostic.error(
                MISSING,
                f"{exp.label} is missing in the kernel (expected {exp.kind} class "
                f"{exp.classid} under {exp.parent})",
                exp.span,
            )
            continue
        yield from _compare_class(exp, got, present)
    yield from _unexpected_classes(iface, dev, wanted)


def _unexpected_classes(
    iface: ExpectedInterface, dev: DeviceState, wanted: set[str]
) -> Iterator[Diagnostic]:
    for c in dev.classes:
        if c.classid in wanted or c.kind in _IMPLIED_CLASS_KINDS:
            continue
        if c.kind == "hfsc" and c.classid.endswith(":"):
            continue  # hfsc's own root class (1:), which every hfsc qdisc has
        yield Diagnostic.error(
            UNEXPECTED,
            f"unexpected {c.kind} class {c.classid} under {c.parent} in the kernel",
            iface.owner_span(c.parent if c.parent != "root" else c.classid.split(":")[0] + ":"),
        )


def value_drift(
    expected: ExpectedPolicy,
    state: KernelState,
    qdisc_kinds: Collection[str] = (),
    class_kinds: Collection[str] = (),
) -> set[tuple[str, str, str]] | None:
    """What differs from what the policy creates in its values alone, when nothing else
    does: classes of ``class_kinds`` (a ceil changed by hand) as ``("class", device, class
    id)``, and qdiscs of ``qdisc_kinds`` as ``("qdisc", device, parent)``, the kinds whose
    ``tc ... change`` sets every value compared, each to be set again in place; None when
    anything else differs (a filter, a qdisc or class missing, moved, of another kind or
    leaf, one the policy does not make, a value of another kind)."""
    found: set[tuple[str, str, str]] = set()
    for iface in expected.interfaces:
        dev = state.devices.get(iface.name, DeviceState(iface.name))
        if any(_compare_filters(iface, dev)) or any(_unexpected_qdiscs(iface, dev)):
            return None
        qdiscs = {q.handle: q for q in dev.qdiscs}
        for want in iface.qdiscs:
            got_q = qdiscs.get(want.handle)
            if got_q is None:
                return None
            alone = _values_alone(want, got_q, list(_compare_qdisc(want, got_q)), qdisc_kinds)
            if alone is None:
                return None
            if alone:
                found.add(("qdisc", iface.name, want.parent))
        if any(
            d
            for c in iface.chains
            for d in _compare_chain(c, state.table(c.family) or IptablesState())
        ):
            return None
        actual = {c.classid: c for c in dev.classes}
        if any(_unexpected_classes(iface, dev, {c.classid for c in iface.classes})):
            return None
        present = {q.handle for q in dev.qdiscs}
        for exp in iface.classes:
            got = actual.get(exp.classid)
            if got is None:
                return None
            alone = _values_alone(exp, got, list(_compare_class(exp, got, present)), class_kinds)
            if alone is None:
                return None
            if alone:
                found.add(("class", iface.name, exp.classid))
    return found


def _values_alone(
    exp: ExpectedQdisc | ExpectedClass,
    got: TcQdisc | TcClass,
    said: list[Diagnostic],
    kinds: Collection[str],
) -> bool | None:
    """Whether ``said`` (what differs of ``exp``) is something, all of it values of a kind in
    ``kinds``; None when it is anything else (a kind, a parent, a leaf, a value of another
    kind)."""
    if not said:
        return False
    if exp.kind not in kinds or said != list(
        _value_diagnostics(exp.label, exp.wants, dict(got.options))
    ):
        return None
    return True


def _compare_class(exp: ExpectedClass, got: TcClass, present: set[str]) -> Iterator[Diagnostic]:
    """``present``: the qdisc handles the device holds. A leaf qdisc missing altogether is
    reported once, as missing (E401, or counted in the E404 of a script that stopped before
    it), not again as the class's leaf being the kernel's default."""
    mismatch = _kind_and_parent(exp, got, "class")
    if mismatch is not None:
        yield mismatch
        if got.kind != exp.kind:
            return  # nothing else is comparable
    if got.leaf != exp.leaf and not (got.leaf is None and exp.leaf not in present):
        shown = f"qdisc {got.leaf}" if got.leaf else "the kernel's default qdisc"
        want = f"qdisc {exp.leaf}" if exp.leaf else "none (the kernel's default)"
        yield Diagnostic.error(
            DIFFERS, f"{exp.label} leaf is {shown} in the kernel, policy says {want}", exp.span
        )
    yield from _value_diagnostics(exp.label, exp.wants, dict(got.options))


def _describe(f: TcFilter) -> str:
    if f.kind == "u32":
        return f"{describe_keys(f.keys)}, flowid {f.flowid}"
    if f.flower is not None:
        return f"{f.flower.describe()}, classid {f.flowid}"
    if f.kind == "fw":
        return f"mark {f.mark:#x}, classid {f.flowid}" if f.mark is not None else f.flowid
    return f.words[0] if f.words else f.kind


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _layout(f: ExpectedFilter | TcFilter, laid_out: bool) -> tuple[object, ...]:
    return (f.place, f.link, f.hashkey) if laid_out else ()


def _spell_layout(f: ExpectedFilter | TcFilter) -> str:
    """Where a u32 node is and what it links to: ``node 800::1, link 2:, hashkey mask
    0x0000ff00 at 16``."""
    parts = [f"node {f.place}" if f.place else "a node tc numbered"]
    if f.link:
        parts.append(f"link {f.link}")
    if f.hashkey:
        parts.append(f"hashkey mask {f.hashkey[0]:#010x} at {f.hashkey[1]}")
    return ", ".join(parts)


def _spell_match(f: ExpectedFilter | TcFilter) -> str:
    """What a u32 or flower filter matches, as tc shows it."""
    if f.flower is not None:
        return f.flower.describe()
    return describe_keys(f.keys)


def _place_key(place: str) -> tuple[int, int, int]:
    """Order u32 nodes by table (the root first), bucket and node id."""
    table, bucket, node = (int(part or "0", 16) for part in place.split(":"))
    return (table if place[:1] != ":" else -1, bucket, node)


def _compare_ordered(
    iface: ExpectedInterface, parent: str, pref: int, exp: list[ExpectedFilter], got: list[TcFilter]
) -> Iterator[Diagnostic]:
    """One pref of u32 (or flower) filters under one parent, in the order tc lists them (the
    order u32 tries them in; flower lists them by handle, the order they were added). A pref
    tcdsl laid out in u32 tables (``tcdsl.u32layout``) is compared node by node, by handle:
    the handles are the order, links and hash keys included."""
    laid_out = any(e.place for e in exp)
    if laid_out:
        exp = sorted(exp, key=lambda e: _place_key(e.place))
        got = sorted(got, key=lambda g: _place_key(g.place or "::0"))
    a = [(e.kind, e.keys, e.flower, e.flowid, *_layout(e, laid_out)) for e in exp]
    b = [(g.kind, g.keys, g.flower, g.flowid, *_layout(g, laid_out)) for g in got]
    matched: list[tuple[int, int]] = []
    missing: list[int] = []
    extra: list[int] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            matched += zip(range(i1, i2), range(j1, j2), strict=True)
        elif op == "delete":
            missing += range(i1, i2)
        elif op == "insert":
            extra += range(j1, j2)
        else:
            pairs = min(i2 - i1, j2 - j1)
            for k in range(pairs):
                e, g = exp[i1 + k], got[j1 + k]
                same = (g.kind, g.keys, g.flower) == (e.kind, e.keys, e.flower)
                if same and g.flowid == e.flowid:  # its place, link or hash key then
                    yield Diagnostic.error(
                        DIFFERS,
                        f"{e.label} is {_spell_layout(g)} in the kernel, policy says "
                        f"{_spell_layout(e)}",
                        e.span,
                    )
                elif same:
                    yield Diagnostic.error(
                        DIFFERS,
                        f"{e.label} {'classid' if e.kind == 'flower' else 'flowid'} is "
                        f"{g.flowid} in the kernel, policy says {e.flowid}",
                        e.span,
                    )
                elif g.flowid != e.flowid or b[j1 + k] in a or a[i1 + k] in b:
                    missing.append(i1 + k)  # a move, or another filter in its place
                    extra.append(j1 + k)
                else:
                    yield _match_differs(e, g)
            missing += range(i1 + pairs, i2)
            extra += range(j1 + pairs, j2)
    # A filter both missing and extra was moved: report its place, once.
    for i in list(missing):
        j = next((j for j in extra if b[j] == a[i]), None)
        if j is None:
            continue
        missing.remove(i)
        extra.remove(j)
        yield Diagnostic.error(
            DIFFERS,
            f"{exp[i].label} for {exp[i].words} comes {_ordinal(j + 1)} of the pref {pref} "
            f"filters under "
            f"{parent} in the kernel, policy puts it {_ordinal(i + 1)} (the first match wins)",
            exp[i].span,
        )
    for i in missing:
        e = exp[i]
        yield Diagnostic.error(
            MISSING,
            f"{e.label} is missing in the kernel (match {e.words} under {parent})",
            e.span,
        )
    for j in extra:
        yield _unexpected_filter(iface, parent, got[j])
    for i, j in matched:
        if got[j].protocol != exp[i].protocol:
            yield Diagnostic.error(
                DIFFERS,
                f"{exp[i].label} protocol is {got[j].protocol} in the kernel, policy says "
                f"{exp[i].protocol}",
                exp[i].span,
            )
        if not actions_agree(exp[i].actions, got[j].actions):
            yield Diagnostic.error(
                DIFFERS,
                f"{exp[i].label} actions are {_spell_actions(got[j].actions)} in the kernel, "
                f"policy says {_spell_actions(exp[i].actions)}",
                exp[i].span,
            )
        # Keys tcdsl never writes, so the pairing above does not compare them: a node that
        # also tests the firewall mark, or reads its keys past the IP header, takes other
        # packets than the policy's line.
        marked = got[j].u32_mark
        if marked is not None:
            value, mask = marked
            yield Diagnostic.error(
                DIFFERS,
                f"{exp[i].label} also matches mark 0x{value:x}/0x{mask:x} in the kernel, "
                f"policy says {exp[i].words} alone",
                exp[i].span,
            )
        if got[j].offset:
            yield Diagnostic.error(
                DIFFERS,
                f"{exp[i].label} reads its keys at '{got[j].offset}' in the kernel, policy "
                "says from the IP header",
                exp[i].span,
            )


def _match_differs(e: ExpectedFilter, g: TcFilter) -> Diagnostic:
    if e.kind == "flower" and g.flower is not None:
        said = f"{e.label} matches {g.flower.describe()} in the kernel, policy says {e.words}"
    elif e.kind == g.kind == "u32":
        said = (
            f"{e.label} keys are {describe_keys(g.keys)} in the kernel, policy says {e.words} "
            f"({describe_keys(e.keys)})"
        )
    else:
        said = (
            f"{e.label} is a {g.kind} filter in the kernel ({_describe(g)}), policy says {e.kind}"
        )
    return Diagnostic.error(DIFFERS, said, e.span)


def actions_agree(want: Sequence[Action], got: Sequence[Action]) -> bool:
    """Whether a filter's actions read back agree with the policy's: the same actions in the
    same order; a policer's rate, burst and mtu within tc's display rounding."""
    if len(want) != len(got):
        return False
    for w, g in zip(want, got, strict=True):
        if w[0] != g[0] or len(w) != len(g):
            return False
        if w[0] != "police":
            if w != g:
                return False
            continue
        # tc prints rates to 3-4 digits and sizes in whole Kb.
        for a, b, grain in zip(w[1:4], g[1:4], (1000, 1024, 1024), strict=True):
            assert isinstance(a, int) and isinstance(b, int)
            if abs(a - b) > max(a // 100, grain):
                return False
        if w[4] != g[4]:
            return False
    return True


def _spell_actions(actions: Sequence[Action]) -> str:
    if not actions:
        return "none"
    spelled = []
    for a in actions:
        if a[0] == "police":
            rate, burst, mtu = (int(v) for v in a[1:4])
            spelled.append(
                f"police rate {format_rate(rate)} burst {format_size(burst)} "
                f"mtu {format_size(mtu)} {a[4]}"
            )
        else:
            spelled.append(" ".join(str(w) for w in a))
    return ", ".join(spelled)


def _unexpected_filter(iface: ExpectedInterface, parent: str, f: TcFilter) -> Diagnostic:
    return Diagnostic.error(
        UNEXPECTED,
        f"unexpected {f.kind} filter under {parent} in the kernel: pref {f.pref}, {_describe(f)}",
        iface.owner_span(parent),
    )


def _compare_fw(
    iface: ExpectedInterface, parent: str, exp: list[ExpectedFilter], got: list[TcFilter]
) -> Iterator[Diagnostic]:
    actual = {(g.pref, g.mark): g for g in got}
    for e in exp:
        g = actual.pop((e.pref, e.mark), None)
        if g is None:
            yield Diagnostic.error(
                MISSING, f"{e.label} is missing in the kernel (under {parent})", e.span
            )
        elif g.flowid != e.flowid:
            yield Diagnostic.error(
                DIFFERS,
                f"{e.label} classid is {g.flowid} in the kernel, policy says {e.flowid}",
                e.span,
            )
        elif g.protocol != e.protocol:
            yield Diagnostic.error(
                DIFFERS,
                f"{e.label} protocol is {g.protocol} in the kernel, policy says {e.protocol}",
                e.span,
            )
        elif g.mask != e.mask:
            shown = f"{g.mask:#x}" if g.mask is not None else "0xffffffff"
            want = f"{e.mask:#x}" if e.mask is not None else "0xffffffff"
            yield Diagnostic.error(
                DIFFERS, f"{e.label} mask is {shown} in the kernel, policy says {want}", e.span
            )
    for g in actual.values():
        yield _unexpected_filter(iface, parent, g)


ORDERED_KINDS = ("u32", "flower")
"""Classifiers whose filters of one pref are compared as a sequence (match and class)."""


def _compare_filters(iface: ExpectedInterface, dev: DeviceState) -> Iterator[Diagnostic]:
    for e in iface.filters:
        if e.unpackable is not None:
            yield Diagnostic.error(
                DIFFERS,
                f"{e.label} cannot be held by u32 as the policy means it ({e.unpackable}); "
                "a compiler bug, please report it",
                e.span,
            )
    parents = list(dict.fromkeys([*(e.parent for e in iface.filters), *dev.filters]))
    for parent in parents:
        exp = [e for e in iface.filters if e.parent == parent and e.unpackable is None]
        got = dev.filters.get(parent, [])
        for g in got:
            if g.kind not in ORDERED_KINDS and g.kind != "fw":
                yield _unexpected_filter(iface, parent, g)
        prefs = sorted({e.pref for e in exp} | {g.pref for g in got if g.kind in ORDERED_KINDS})
        for pref in prefs:
            yield from _compare_ordered(
                iface,
                parent,
                pref,
                [e for e in exp if e.kind in ORDERED_KINDS and e.pref == pref],
                [g for g in got if g.kind in ORDERED_KINDS and g.pref == pref],
            )
        yield from _compare_fw(
            iface, parent, [e for e in exp if e.kind == "fw"], [g for g in got if g.kind == "fw"]
        )


# ==== iptables =================================================================================

_PROTOCOL_NAMES = {v: k for k, v in reversed(PROTOCOL_NUMBERS.items())}


def _spell_field(name: str, value: object) -> str:
    if value is None:
        return "any" if name in ("src", "dst", "protocol") else "none"
    if name == "protocol" and isinstance(value, int):
        return _PROTOCOL_NAMES.get(value, str(value))
    if name in ("sport", "dport") and isinstance(value, tuple):
        lo, hi = value
        return str(lo) if lo == hi else f"{lo}:{hi}"
    if name in ("mark match", "set-mark", "save-mark") and isinstance(value, tuple):
        return f"{value[0]:#x}/{value[1]:#x}"
    if name == "tos" and isinstance(value, tuple):
        return f"{value[0]:#04x}/{value[1]:#04x}"
    if name in ("dscp", "set-dscp") and isinstance(value, int):
        return f"{value:#04x}"
    if name == "other words" and isinstance(value, tuple):
        return " ".join(value) or "none"
    return str(value)


def _spell_rule(rule: IptRule) -> str:
    parts = [f"-A {rule.chain}"]
    for name, value in rule.fields().items():
        if value not in (None, ()):
            parts.append(f"{name} {_spell_field(name, value)}")
    return ", ".join(parts)


def _rule_diffs(exp: ExpectedRule, got: IptRule) -> Iterator[Diagnostic]:
    want = exp.rule.fields()
    for name, value in got.fields().items():
        if value != want[name]:
            yield Diagnostic.error(
                DIFFERS,
                f"{exp.label} {name} is {_spell_field(name, value)} in the kernel, policy says "
                f"{_spell_field(name, want[name])}",
                exp.span,
            )


def _compare_chain(chain: ExpectedChain, state: IptablesState) -> Iterator[Diagnostic]:
    """The chain, its rules and the jumps into it, in its family's table (iptables' or
    ip6tables' mangle table)."""
    table = "mangle table" if chain.family == "ipv4" else "ip6tables mangle table"
    where = "chain" if chain.family == "ipv4" else "ip6tables chain"
    for jump in chain.jumps:
        jumps = [r for r in state.chains.get(jump.rule.chain, []) if r == jump.rule]
        if not jumps:
            yield Diagnostic.error(
                MISSING, f"{jump.label} is missing in the kernel's {table}", jump.span
            )
        elif len(jumps) > 1:
            yield Diagnostic.error(
                UNEXPECTED,
                f"{jump.label} appears {len(jumps)} times in the kernel's {table}, "
                "policy says once",
                jump.span,
            )
    got = state.chains.get(chain.name)
    if got is None:
        yield Diagnostic.error(
            MISSING, f"{chain.tool} chain {chain.name} is missing in the mangle table", chain.span
        )
        return
    a, b = [r.rule for r in chain.rules], got
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        pairs = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(pairs):
            yield from _rule_diffs(chain.rules[i1 + k], b[j1 + k])
        for i in range(i1 + pairs, i2):
            e = chain.rules[i]
            yield Diagnostic.error(
                MISSING,
                f"{e.label} is missing in the kernel's {where} {chain.name} "
                f"({_spell_rule(e.rule)})",
                e.span,
            )
        for j in range(j1 + pairs, j2):
            yield Diagnostic.error(
                UNEXPECTED,
                f"unexpected rule in the kernel's {where} {chain.name}: {b[j].text}",
                chain.span,
            )


# ==== everything ===============================================================================


def compare_state(expected: ExpectedPolicy, state: KernelState) -> list[Diagnostic]:
    """Every difference between what the policy creates and what the kernel holds."""
    out: list[Diagnostic] = []
    for iface in expected.interfaces:
        dev = state.devices.get(iface.name, DeviceState(iface.name))
        out += _compare_qdiscs(iface, dev)
        out += _compare_classes(iface, dev)
        out += _compare_filters(iface, dev)
        for chain in iface.chains:
            out += _compare_chain(chain, state.table(chain.family) or IptablesState())
    return out
