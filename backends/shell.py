"""The default backend: a POSIX sh script of tc and iptables (or nft) commands; the tc
commands of each interface go to one ``tc -batch`` (or, with ``--per-command``, one tc each)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tcdsl import __version__, ir
from tcdsl.backend import (
    Backend,
    TextBlocks,
    comment,
    shjoin,
    shquote,
    template_env,
    text_blocks,
)
from tcdsl.commands import (
    LOCK_DIR,
    LOCK_DIR_VARIABLE,
    MARK_HOOKS,
    MARK_TOOL,
    NO_INTERFACE,
    NO_TOOL,
    NOT_IFB,
    SCRIPT_AT,
    SCRIPT_FAILED,
    SCRIPT_UNMARK,
    SLOT_TAKEN,
    SLOT_USES,
    STALE_INGRESS,
    TOO_FEW_IN_USE,
    TOO_FEW_QUEUES,
    TOO_MANY_QUEUES,
    TOO_MANY_WRITTEN,
    Command,
    batch_line,
    batchable,
    chain_teardown,
    ingress_slot,
    interface_commands,
    lock_name,
    mark_families,
    nft_table,
    nft_table_lines,
    owned_chains,
    stale_ingress_devices,
    teardown_commands,
    unspellable,
)
from tcdsl.diagnostics import Diagnostic


@dataclass(frozen=True, slots=True)
class HereDoc:
    """Lines fed to a command's stdin (``tc -batch -``, ``nft -f -``) by a here-document."""

    delimiter: str
    body: tuple[str, ...]
    """The lines, each ending in a newline, as a few long strings (see :func:`_text`)."""


def _heredoc(body: tuple[str, ...], delimiter: str) -> HereDoc:
    """A here-document of ``body``, its delimiter made longer until no line is it."""
    while any(t.startswith(f"{delimiter}\n") or f"\n{delimiter}\n" in t for t in body):
        delimiter += "_"
    return HereDoc(delimiter, body)


def _batch(commands: Iterable[Command]) -> HereDoc:
    """The tc commands for ``tc -batch -``, each after a comment naming the policy text it
    comes from: the script reads a failed command's from the line before it."""
    body = TextBlocks()
    for c in commands:
        if c.tool == "tc":
            body.append(f"# {comment(c.origin)}")
            body.append(batch_line(c))
    return _heredoc(body.text(), "TCDSL_BATCH")


@dataclass(frozen=True, slots=True)
class InterfaceView:
    """What the template needs of one interface."""

    name: str
    """The interface as the policy names it: it must exist; its lock serialises changes."""
    device: str
    """The device the tree is on (the IFB of a download), for the failure message."""
    heading: str
    owned: str
    """What the teardown removes, in words."""
    ifb: str | None
    """A download's IFB: created by the script, removed by its teardown (if it is an ifb)."""
    chain: str | None
    lock: str
    """The lock file's name (in the lock folder) that serialises changes to the interface."""
    undo: str
    """Shell that removes what the policy sets up on the interface (for the failure message)."""
    teardown: tuple[tuple[str, ...], ...]
    """The tc commands that remove the tree (a root or ingress qdisc; a download's redirect)."""
    unmark: tuple[str, ...]
    """The iptables chains to remove with every jump into them (the policy's own chain, and
    the default chain an earlier version of the policy may have left)."""
    unnft: tuple[str, ...]
    """With ``--marks nft`` and no marking: the command removing an earlier version's table."""
    setup: tuple[str, ...]
    """ip commands that create devices (a download's IFB), run first, as script text (see
    :func:`located`)."""
    run: tuple[str, ...]
    """Commands run one by one: the iptables ones, or (``--per-command``) all of them, as
    script text."""
    batch: HereDoc | None = None
    """The tc commands, for one ``tc -batch -`` (None with ``--per-command``)."""
    nft: HereDoc | None = None
    """With ``--marks nft``: the marking table, for ``nft -f -``."""
    batch_at: str = ""
    nft_at: str = ""
    """What a failure of ``tc -batch`` (``nft -f``) is reported at, before the line is known."""


def located(commands: Iterable[Command]) -> tuple[str, ...]:
    """Each command after the line that sets the script's location variable to where it
    comes from, each line ending in a newline (as :func:`_text`)."""
    return text_blocks(
        f"{SCRIPT_AT}={shquote(comment(c.origin))}\n{shjoin((c.tool, *c.args))}" for c in commands
    )


def _view(iface: ir.Interface, batch: bool, nft: bool, owned: tuple[str, ...]) -> InterfaceView:
    commands: Sequence[Command] = interface_commands(iface)
    if nft:
        commands = [c for c in commands if c.tool not in MARK_TOOL.values()]
    if batch and not batchable(iface.name, commands):
        # (found by a tester: 'interface "x#y"' passed check and the default compile refused
        # it, E502): this interface's tc commands run one by one
        batch = False
    setup = located(c for c in commands if c.tool == "ip")
    run = located(c for c in commands if c.tool != "ip" and (not batch or c.tool != "tc"))
    tc_batch = _batch(commands) if batch else None
    table: HereDoc | None = None
    if nft and iface.marking is not None:
        table = _heredoc(text_blocks(nft_table_lines(iface)), "TCDSL_NFT")
    chain: tuple[tuple[str, ...], ...] = ()
    if iface.marking is not None and not nft:
        chain = chain_teardown(iface)
    tc_teardown = teardown_commands(iface)
    removal = [*tc_teardown, *chain]
    if iface.marking is not None and nft:
        removal.append(("nft", "delete", "table", "inet", nft_table(iface)))
    undo = "; ".join(shjoin(w) for w in removal)
    # An earlier version's marking of the other kind (iptables chains, or the nft table)
    # goes too: compiled with the other --marks, it would go on marking beside this one.
    unmark = owned
    unnft: tuple[str, ...] = ()
    if not (nft and iface.marking is not None) and iface.direction != "ingress":
        unnft = ("nft", "delete", "table", "inet", nft_table(iface))
    return InterfaceView(
        iface.interface,
        iface.name,
        iface.label,
        {"egress": "root qdisc", "ingress": "ingress qdisc", "download": "redirect and ifb"}[
            iface.direction
        ],
        iface.name if iface.download is not None else None,
        iface.marking.chain if iface.marking else None,
        lock_name(iface.interface),
        undo,
        tuple(c for c in tc_teardown if c[0] == "tc"),
        unmark,
        unnft,
        setup,
        run,
        tc_batch,
        table,
        f"interface {iface.name}: tc -batch",
        f"interface {iface.name}: nft table",
    )


_NEEDED_FOR: dict[ir.Family, str] = {
    "ipv4": "to mark IPv4 packets",
    "ipv6": 'to mark IPv6 packets (a tree with "family ipv4" marks none)',
}


class ShellBackend(Backend):
    """Emit an idempotent ``set -eu`` shell script."""

    name = "shell"
    extension = "sh"

    def unsupported(self, policy: ir.Policy) -> Iterator[Diagnostic]:
        """E502 for what nft rules cannot spell, with ``--marks nft`` (what ``tc -batch``
        lines cannot spell runs one tc command at a time)."""
        return unspellable(policy, batch=False, nft=self.options.marks == "nft")

    def emit(self, policy: ir.Policy, source_label: str) -> str:
        """The script."""
        nft = self.options.marks == "nft"
        owned = owned_chains(policy)
        views = [
            _view(iface, self.options.batch, nft, owned[iface.label]) for iface in policy.interfaces
        ]
        marking = any(v.chain for v in views)
        families = {f for i in policy.interfaces for f in mark_families(i)} if not nft else set()
        needs = [(MARK_TOOL[f], _NEEDED_FOR[f]) for f in ir.FAMILIES if f in families]
        queues = [
            (
                i.name,
                n,
                ir.highest_queue(i),
                ir.most_queues_in_use(i),
                "spread" if ir.spread_queues(i) else "written",
            )
            for i in policy.interfaces
            if (n := ir.tx_queues_used(i))
        ]
        other = {"clsact": "ingress", "ingress": "clsact"}
        taken = dict.fromkeys(ingress_slot(i) for i in policy.interfaces)
        slots = [
            (slot[0], slot[1], other[slot[1]], SLOT_USES[slot[1]])
            for slot in taken
            if slot is not None
        ]
        return (
            template_env()
            .get_template("shell.sh.j2")
            .render(
                version=__version__,
                source=source_label,
                at=SCRIPT_AT,
                failed=SCRIPT_FAILED,
                no_interface=NO_INTERFACE,
                too_few_queues=TOO_FEW_QUEUES,
                too_many_queues=TOO_MANY_QUEUES,
                too_many_written=TOO_MANY_WRITTEN,
                too_few_in_use=TOO_FEW_IN_USE,
                queues=queues,
                no_tool=NO_TOOL,
                needs=needs,
                mark_tools=tuple(MARK_TOOL.values()),
                not_ifb=NOT_IFB,
                slots=slots,
                slot_taken=SLOT_TAKEN,
                stale=stale_ingress_devices(policy),
                stale_ingress=STALE_INGRESS,
                lock_dir=LOCK_DIR,
                lock_dir_variable=LOCK_DIR_VARIABLE,
                lock_setting=f"${{{LOCK_DIR_VARIABLE}:-{LOCK_DIR}}}",
                interfaces=views,
                batched=self.options.batch,
                interface_names=list(dict.fromkeys(v.name for v in views)),
                ifbs=[v.ifb for v in views if v.ifb is not None],
                uses_unmark=any(v.unmark for v in views),
                unmark=SCRIPT_UNMARK,
                hooks=MARK_HOOKS,
                uses_nft=marking and nft,
            )
        )
