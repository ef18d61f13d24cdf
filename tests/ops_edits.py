"""Random policies and random edits applied in place, run INSIDE a network namespace that has a
veth ``d0`` (``ip netns exec NS python -m tests.ops_edits SEED CHAINS EDITS STATE_DIR``).

Per chain: a random policy A is applied (``tcdsl.ops``), then EDITS times a random edit B of
the live policy is planned and applied. After each apply: the kernel equals B as verify reads
it (what a fresh apply of B builds), ``plan B`` has no changes and no drift, and the byte
counters of classes the edit left alone did not go down (no reset: changed in place). Packets
are written into the classes before each edit so that the counters have something to lose.

Prints one JSON object: {"edits": N, "in_place": N, "rebuilds": N, "problems": [...]}.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from tcdsl.ops.lifecycle import apply, compile_new, down, prepare
from tcdsl.ops.state import STATE_DIR_VARIABLE, Store
from tcdsl.verify.compare import compare_state
from tcdsl.verify.expect import expected_policy
from tcdsl.verify.readback import KernelState

DEV = "d0"


@dataclass(frozen=True)
class Cls:
    name: str
    rate: int  # kbit
    ceil: int | None = None
    prio: int | None = None
    match: str | None = None
    leaf: str | None = None


@dataclass(frozen=True)
class Pol:
    """One htb tree: the upload (``interface d0 htb``), or with ``down`` also a download."""

    link: int  # kbit
    default: str
    classes: tuple[Cls, ...] = field(default_factory=tuple)
    down: Pol | None = None

    def body(self, indent: str) -> list[str]:
        lines = []
        for c in self.classes:
            words = [f"class {c.name} rate {c.rate}kbit"]
            if c.ceil is not None:
                words.append(f"ceil {c.ceil}kbit")
            if c.prio is not None:
                words.append(f"prio {c.prio}")
            if c.match is not None:
                words.append(f"match {c.match}")
            if c.leaf is None:
                lines.append(indent + " ".join(words))
            else:
                lines += [indent + " ".join(words) + " {", f"{indent}    {c.leaf}", indent + "}"]
        return lines

    def text(self) -> str:
        head = f"htb rate {self.link}kbit default {self.default} {{"
        if self.down is None:
            lines = [f"interface {DEV} {head}", *self.body("    "), "}"]
        else:
            d = self.down
            lines = [f"interface {DEV} {{", f"    upload {head}", *self.body("        "), "    }"]
            lines += [f"    download htb rate {d.link}kbit default {d.default} {{"]
            lines += [*d.body("        "), "    }", "}"]
        return "\n".join(lines) + "\n"


MATCHES = ("dport 22", "dport 80, 443", "src 10.1.0.0/16", "sport 53", "proto icmp", "dst 10.9.9.9")
LEAVES = (None, "pfifo limit 20", "pfifo limit 50", "bfifo limit 30k", "bfifo limit 60k")


def _cls(rng: random.Random, name: str) -> Cls:
    return Cls(
        name,
        rng.choice((100, 200, 500, 1000)),
        rng.choice((None, 2000, 5000)),
        rng.choice((None, 0, 1, 3)),
        rng.choice((None, *MATCHES)),
        rng.choice(LEAVES),
    )


def random_tree(rng: random.Random, serial: list[int]) -> Pol:
    classes = []
    for _ in range(rng.randint(2, 5)):
        serial[0] += 1
        classes.append(_cls(rng, f"c{serial[0]}"))
    return Pol(10000, classes[-1].name, tuple(classes))


def random_policy(rng: random.Random, serial: list[int]) -> Pol:
    up = random_tree(rng, serial)
    return replace(up, down=random_tree(rng, serial)) if rng.random() < 0.3 else up


def edit(rng: random.Random, pol: Pol, serial: list[int]) -> tuple[Pol, set[str], str]:
    """A random edit: the new policy, the classes it touches, what it did. A fifth of the
    edits add or remove the download tree; with one, half the others edit it."""
    if rng.random() < 0.2:
        if pol.down is None:
            down = random_tree(rng, serial)
            return replace(pol, down=down), {c.name for c in down.classes}, "add download"
        return replace(pol, down=None), {c.name for c in pol.down.classes}, "remove download"
    if pol.down is not None and rng.random() < 0.5:
        down, touched, kind = edit_tree(rng, pol.down, serial)
        return replace(pol, down=down), touched, f"download {kind}"
    up, touched, kind = edit_tree(rng, replace(pol, down=None), serial)
    return replace(up, down=pol.down), touched, kind


def edit_tree(rng: random.Random, pol: Pol, serial: list[int]) -> tuple[Pol, set[str], str]:
    """A random edit of one tree."""
    classes = list(pol.classes)
    i = rng.randrange(len(classes))
    c = classes[i]
    kind = rng.choice(("rate", "ceil", "prio", "match", "leaf", "add", "remove", "default"))
    if kind == "rate":
        classes[i] = replace(c, rate=rng.choice((150, 300, 700, 900)))
    elif kind == "ceil":
        classes[i] = replace(c, ceil=rng.choice((None, 3000, 8000)))
    elif kind == "prio":
        classes[i] = replace(c, prio=rng.choice((None, 2, 4)))
    elif kind == "match":
        classes[i] = replace(c, match=rng.choice((None, *MATCHES)))
    elif kind == "leaf":
        classes[i] = replace(c, leaf=rng.choice(LEAVES))
    elif kind == "add":
        serial[0] += 1
        classes.append(_cls(rng, f"c{serial[0]}"))
        return replace(pol, classes=tuple(classes)), {classes[-1].name}, kind
    elif kind == "remove" and len(classes) > 2 and c.name != pol.default:
        del classes[i]
        return replace(pol, classes=tuple(classes)), {c.name}, kind
    elif kind == "default":
        other = rng.choice([x.name for x in classes])
        return replace(pol, default=other), {x.name for x in classes}, kind
    return replace(pol, classes=tuple(classes)), {c.name}, kind


def _policy(path: Path, text: str, store: Store):  # type: ignore[no-untyped-def]
    path.write_text(text, encoding="utf-8")
    result, _ = compile_new(store, str(path))
    assert result.policy is not None, [str(d) for d in result.diagnostics]
    return result


def class_bytes(devices: list[str]) -> dict[tuple[str, str], int]:
    """(device, class id) -> bytes sent."""
    out = {}
    for dev in devices:
        shown = subprocess.run(
            ["tc", "-s", "class", "show", "dev", dev], capture_output=True, text=True, check=True
        ).stdout
        for m in re.finditer(r"class htb (\S+) .*\n Sent (\d+) bytes", shown):
            out[(dev, m.group(1))] = int(m.group(2))
    return out


def send_some() -> None:
    """A few IPv4 frames of every kind the matches name, so that the classes count bytes."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    frames = []
    for proto, sport, dport, dst in (
        (6, 1000, 22, "10.2.0.1"), (6, 1000, 80, "10.2.0.1"), (17, 53, 999, "10.2.0.1"),
        (1, 0, 0, "10.2.0.1"), (17, 5, 5, "10.9.9.9"), (6, 7, 7, "10.2.0.1"),
    ):  # fmt: skip
        src = socket.inet_aton("10.1.2.3" if dport != 7 else "10.3.0.1")
        body = (
            (sport.to_bytes(2, "big") + dport.to_bytes(2, "big") + bytes(16))
            if proto != 1
            else bytes(8)
        )
        total = 20 + len(body)
        header = bytes([0x45, 0, *total.to_bytes(2, "big"), 0, 0, 0, 0, 64, proto, 0, 0])
        ip = header + src + socket.inet_aton(dst) + body
        frames.append(b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip)
    for f in frames:
        s.sendto(f, (DEV, 0x0800))
    s.close()


def devices(policy) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted({i.name for i in policy.interfaces})


def live(devices: list[str]) -> KernelState:
    from tcdsl.ops.live import read_state

    return read_state(devices)


def main(argv: list[str]) -> int:
    seed, chains, edits, state = int(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    os.environ[STATE_DIR_VARIABLE] = str(state)  # the kernel probe's cache too
    rng = random.Random(seed)
    serial = [0]
    problems: list[str] = []
    counts = {"edits": 0, "in_place": 0, "rebuilds": 0, "renumbered": 0}
    for chain in range(chains):
        store = Store(f"p{chain}", state)
        pol = random_policy(rng, serial)
        path = state / f"p{chain}.tcp"
        result = _policy(path, pol.text(), store)
        apply(prepare(store, result.policy, result), str(path), result.sources)
        for _ in range(edits):
            new, touched, kind = edit(rng, pol, serial)
            send_some()
            old_policy = result.policy
            assert old_policy is not None
            ids = _classes(old_policy)
            before = class_bytes(devices(old_policy))
            result = _policy(path, new.text(), store)
            prepared = prepare(store, result.policy, result)
            rebuilt = {
                c.text.split(":")[0].removeprefix("tree ")
                for c in prepared.plan.changes
                if c.sign == "!" and c.text.startswith("tree ")
            }
            apply(prepared, str(path), result.sources)
            counts["edits"] += 1
            counts["rebuilds" if rebuilt else "in_place"] += 1
            assert result.policy is not None
            after = class_bytes(devices(result.policy))
            new_ids = _classes(result.policy)
            where = f"chain {chain} edit {kind}:\n{pol.text()}->\n{new.text()}"
            found = compare_state(expected_policy(result.policy), live(devices(result.policy)))
            if found:
                problems.append(f"{where}kernel differs from B: {[d.message for d in found]}")
            again = prepare(store, result.policy, result).plan
            if not again.empty or again.drift:
                problems.append(f"{where}plan after apply: {again.render()}")
            counts["renumbered"] += sum(
                1 for n, c in ids.items() if n in new_ids and new_ids[n] != c
            )
            for name, (tree, key) in ids.items():
                same = new_ids.get(name) == (tree, key) and name not in touched
                if same and tree not in rebuilt and after.get(key, 0) < before.get(key, 0):
                    was, now = before.get(key), after.get(key)
                    problems.append(f"{where}counters of {name} went down: {was} -> {now}")
            pol = new
        down(store)  # the next chain starts on a device with nothing of this one's
    print(json.dumps({**counts, "problems": problems}))
    return 0


def _classes(policy):  # type: ignore[no-untyped-def]
    """Class name -> (its tree's label, (device, class id))."""
    from tcdsl import ir

    return {
        c.name: (i.label, (i.name, str(c.classid)))
        for i in policy.interfaces
        for c in ir.classes_of(i.root)
        if c.name
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
