"""The tutorial (docs/tutorial/) cannot go stale: every generated block of a chapter equals what
its command prints now, every included policy equals its file, every image a chapter links
exists (diagrams and predicted plots byte for byte as regenerated), every chapter has the
sections the tutorial promises, and render.sh passes bash -n and shellcheck.

Generated blocks sit between a marker and ``<!-- end -->`` (docs/tutorial/embed.py, which
render.sh runs and this test imports, so both read the chapters the same way). When a test here
fails because tcdsl's output changed on purpose, run ``docs/tutorial/render.sh`` and read the
diff.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial"
RENDER = TUTORIAL / "render.sh"
TCDSL = str(Path(sys.executable).with_name("tcdsl"))

CHAPTERS = [
    "01-htb-link-sharing.md",
    "02-sfq-fairness.md",
    "03-tbf.md",
    "04-prio.md",
    "05-pfifo-fast-tos.md",
    "06-marking.md",
]
SECTIONS = [
    "Concept",
    "Policy",
    "Explain",
    "Diagram",
    "Predicted plot",
    "Measured plot",
    "Exercises",
]


def load_embed() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tutorial_embed", TUTORIAL / "embed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


embed = load_embed()


def chapter_text(name: str) -> str:
    return (TUTORIAL / name).read_text(encoding="utf-8")


def all_blocks(kind: str) -> list[tuple[str, Any]]:
    return [
        (name, block)
        for name in CHAPTERS
        for block in embed.blocks(chapter_text(name))
        if block.kind == kind
    ]


def block_id(item: tuple[str, Any]) -> str:
    name, block = item
    return f"{name}:{block.start + 1}"


def sections(text: str) -> dict[str, str]:
    """Level-2 headings -> their text up to the next level-2 heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def plot_path(argv: list[str]) -> str | None:
    return argv[argv.index("--plot") + 1] if "--plot" in argv else None


def test_the_chapters_are_the_ones_the_index_lists() -> None:
    found = sorted(p.name for p in embed.chapters())
    assert found == CHAPTERS
    index = (TUTORIAL / "README.md").read_text(encoding="utf-8")
    for name in CHAPTERS:
        assert f"]({name})" in index, f"README.md does not link {name}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_every_section(name: str) -> None:
    text = chapter_text(name)
    found = sections(text)
    missing = [s for s in SECTIONS if s not in found]
    assert not missing, f"{name}: no section {missing} (it has {list(found)})"
    kinds = [b.kind for b in embed.blocks(text)]
    assert "include" in kinds and "diagram" in kinds
    assert any(b.arg.startswith("tcdsl explain ") for b in embed.blocks(text))
    assert "<!-- include:" in found["Policy"]
    assert "<!-- generated: tcdsl explain " in found["Explain"]
    assert "<!-- diagram:" in found["Diagram"]
    assert "<!-- generated: tcdsl simulate " in found["Predicted plot"]
    assert "](img/" in found["Predicted plot"]
    measured = found["Measured plot"]
    if not any(b.kind == "measured" for b in embed.blocks(text)):
        # No measurement here: the chapter says why, naming the kernel modules it needs.
        assert "Not measured on this host" in measured, f"{name}: no measurement and no reason"
        assert re.search(r"`(sch|cls)_\w+`", measured), f"{name}: which modules are missing?"
    assert re.search(r"seed 00\d", measured), f"{name}: quote the lab's own measurement"
    exercises = found["Exercises"]
    questions = re.findall(r"^\d+\. ", exercises.split("<details>")[0], flags=re.MULTILINE)
    assert 3 <= len(questions) <= 5, f"{name}: {len(questions)} exercises"
    assert "<details><summary>Answers</summary>" in exercises
    answers = re.findall(r"^\d+\. ", exercises.split("<details>")[1], flags=re.MULTILINE)
    assert len(answers) == len(questions), f"{name}: one answer per exercise"


@pytest.mark.parametrize("item", all_blocks("include"), ids=block_id)
def test_included_policy_equals_its_file(item: tuple[str, Any]) -> None:
    _, block = item
    path = ROOT / block.arg
    assert path.is_file(), f"{block.arg} does not exist"
    assert block.body == embed.fenced(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_policy_path_named_exists(name: str) -> None:
    for path in re.findall(r"policies/[\w./-]+\.tcp", chapter_text(name)):
        assert (ROOT / path).is_file(), f"{name} names {path}, which does not exist"


@pytest.mark.parametrize("item", all_blocks("generated"), ids=block_id)
def test_generated_block_is_what_the_command_prints_now(
    item: tuple[str, Any], tmp_path: Path
) -> None:
    name, block = item
    argv = embed.tcdsl_argv(block.arg, TCDSL)
    plot = plot_path(argv)
    if plot is not None:
        argv[argv.index("--plot") + 1] = str(tmp_path / "plot.png")
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert block.body == embed.fenced(out.stdout), (
        f"{name}: the output of `{block.arg}` changed; run docs/tutorial/render.sh"
    )
    if plot is not None:
        committed = ROOT / plot
        assert committed.is_file(), f"{plot} is missing; run docs/tutorial/render.sh"
        assert committed.read_bytes() == (tmp_path / "plot.png").read_bytes(), (
            f"{plot} is not what the simulation draws now; run docs/tutorial/render.sh"
        )
        rel = committed.relative_to(TUTORIAL).as_posix()
        assert f"]({rel})" in chapter_text(name), f"{name} does not show {rel}"


@pytest.mark.parametrize("item", all_blocks("diagram"), ids=block_id)
def test_diagram_is_current(item: tuple[str, Any]) -> None:
    _, block = item
    policy = block.arg
    assert block.body == embed.diagram_body(policy)
    svg = embed.svg_path(policy)
    assert svg.is_file(), f"{svg} is missing; run docs/tutorial/render.sh"
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    fresh = embed.svg(policy, TCDSL)
    version = re.compile(rb"Generated by graphviz version ([^\n]*)")
    ours, theirs = version.search(fresh), version.search(svg.read_bytes())
    if ours and theirs and ours.group(1) != theirs.group(1):
        pytest.skip(f"{svg.name} was drawn by another graphviz version; layouts differ")
    assert svg.read_bytes() == fresh, f"{svg} is stale; run docs/tutorial/render.sh"


@pytest.mark.parametrize("item", all_blocks("measured"), ids=block_id)
def test_measured_block_has_a_table_and_a_plot(item: tuple[str, Any]) -> None:
    name, block = item
    argv = shlex.split(block.arg)
    assert argv[:2] == ["tcdsl", "measure"] and "--simulate" in argv
    assert block.body.startswith("```text\n") and "measured" in block.body
    plot = plot_path(argv)
    assert plot is not None, f"{name}: a measured block writes a plot"
    assert (ROOT / plot).is_file(), f"{plot} is missing; run docs/tutorial/render.sh as root"
    rel = (ROOT / plot).relative_to(TUTORIAL).as_posix()
    assert f"]({rel})" in chapter_text(name), f"{name} does not show {rel}"


@pytest.mark.parametrize("name", [*CHAPTERS, "README.md"])
def test_every_linked_image_exists(name: str) -> None:
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", chapter_text(name))
    for link in links:
        assert (TUTORIAL / link).is_file(), f"{name} links {link}, which does not exist"


def test_generated_files_are_all_linked() -> None:
    """No orphan images: each file in img/ is shown by some chapter."""
    text = "".join(chapter_text(name) for name in CHAPTERS)
    for path in sorted((TUTORIAL / "img").iterdir()):
        assert f"](img/{path.name})" in text, f"img/{path.name} is shown by no chapter"


def test_render_script_passes_bash_n_and_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(RENDER)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    out = subprocess.run(["shellcheck", str(RENDER)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


def test_render_script_uses_strict_mode() -> None:
    text = RENDER.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
