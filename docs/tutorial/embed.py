"""Refresh the generated blocks of the tutorial's chapters (run by render.sh; read by
tests/test_tutorial.py, so both parse the chapters the same way).

Everything a chapter shows that a command produces sits between a marker line and
``<!-- end -->``; the marker says what fills the block:

- ``<!-- include: PATH -->``: the file PATH, verbatim, in a fenced block.
- ``<!-- generated: tcdsl ARGS -->``: what ``tcdsl ARGS`` prints, in a fenced block. With
  ``simulate ... --plot FILE`` the command also writes the plot (deterministic).
- ``<!-- diagram: PATH -->``: ``tcdsl compile -b dot PATH | dot -Tsvg`` written to
  ``docs/tutorial/img/<stem of PATH>.svg``, and a link to it.
- ``<!-- measured: tcdsl measure ARGS -->``: what ``tcdsl measure ARGS`` prints, and its plot;
  refreshed only with ``--measure`` (root, and a kernel with the policy's qdiscs). A chapter
  whose policy the host kernel cannot hold has no such marker; it says why instead.

Usage: python docs/tutorial/embed.py [--measure] [--tcdsl PATH] [CHAPTER.md...]
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial"
IMG = TUTORIAL / "img"
MARKER = re.compile(r"^<!-- (include|generated|diagram|measured): (.+?) -->$")
END = "<!-- end -->"


@dataclass
class Block:
    kind: str
    arg: str
    start: int  # index of the marker line
    end: int  # index of the END line
    body: str  # the lines between, joined with newlines (each line ending in one)


def chapters() -> list[Path]:
    return sorted(TUTORIAL.glob("[0-9][0-9]-*.md"))


def blocks(text: str) -> list[Block]:
    lines = text.splitlines(keepends=True)
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].rstrip("\n"))
        if m:
            j = i + 1
            while j < len(lines) and lines[j].rstrip("\n") != END:
                if MARKER.match(lines[j].rstrip("\n")):
                    raise ValueError(f"line {j + 1}: a marker inside the block of line {i + 1}")
                j += 1
            if j == len(lines):
                raise ValueError(f"line {i + 1}: no {END} after the marker")
            found.append(Block(m.group(1), m.group(2), i, j, "".join(lines[i + 1 : j])))
            i = j
        i += 1
    return found


def fenced(text: str, lang: str = "text") -> str:
    if not text.endswith("\n"):
        text += "\n"
    return f"```{lang}\n{text}```\n"


def tcdsl_argv(arg: str, tcdsl: str) -> list[str]:
    argv = shlex.split(arg)
    if not argv or argv[0] != "tcdsl":
        raise ValueError(f"not a tcdsl command: {arg}")
    return [tcdsl, *argv[1:]]


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def svg_path(policy: str) -> Path:
    return IMG / (Path(policy).stem + ".svg")


def svg(policy: str, tcdsl: str) -> bytes:
    dot = run([tcdsl, "compile", "-b", "dot", policy])
    done = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True, check=True)
    return done.stdout


def diagram_body(policy: str) -> str:
    rel = svg_path(policy).relative_to(TUTORIAL)
    return f"![The class tree of {policy}]({rel.as_posix()})\n"


def fill(block: Block, tcdsl: str, measure: bool) -> str:
    """The block's new body (and, as a side effect, the files it links)."""
    if block.kind == "include":
        return fenced((ROOT / block.arg).read_text(encoding="utf-8"))
    if block.kind == "generated":
        return fenced(run(tcdsl_argv(block.arg, tcdsl)))
    if block.kind == "diagram":
        svg_path(block.arg).write_bytes(svg(block.arg, tcdsl))
        return diagram_body(block.arg)
    if block.kind == "measured":
        if not measure:
            return block.body
        return fenced(run(tcdsl_argv(block.arg, tcdsl)))
    raise ValueError(block.kind)


def render(path: Path, tcdsl: str, measure: bool) -> bool:
    IMG.mkdir(exist_ok=True)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for block in reversed(blocks(text)):
        print(f"{path.relative_to(ROOT)}: {block.kind}: {block.arg}", file=sys.stderr)
        body = fill(block, tcdsl, measure)
        lines[block.start + 1 : block.end] = [body] if body else []
    new = "".join(lines)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="also run the measured blocks")
    parser.add_argument("--tcdsl", default="tcdsl", help="the tcdsl program")
    parser.add_argument("chapters", nargs="*", type=Path)
    args = parser.parse_args()
    for path in args.chapters or chapters():
        if render(path.resolve(), args.tcdsl, args.measure):
            print(f"updated {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
