"""The diagnostics corpus: every ``tests/diagnostics/*.tcp`` is a policy that fails (or warns).

Next to each case, ``<stem>.expected`` holds the exact stderr of
``tcdsl check tests/diagnostics/<case>`` run from the repository root, after a first line
``# exit N`` with the exit code. A case whose first line is ``# tcdsl-check-args: ARGS`` is
checked with those options too (``tcdsl check ARGS tests/diagnostics/<case>``).
``pytest --update-golden`` rewrites the .expected files from the
current compiler (review the diff: an .expected file is a promise about what users read).
Files in subfolders (``tests/diagnostics/include/``) are helpers that cases include.
"""

from __future__ import annotations

import functools
import re
import shlex
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner
from lark import Lark

from tcdsl.cli import EXIT_INTERNAL, cli
from tcdsl.codes import CODES, RETIRED
from tests.conftest import DIAGNOSTICS, ROOT

DOCS = ROOT / "docs" / "diagnostics.md"
GRAMMAR = ROOT / "grammar" / "tcdsl.lark"
CASES = sorted(p.name for p in DIAGNOSTICS.glob("*.tcp"))
CODE = re.compile(r"[EWI]\d{3}")
CODE_IN_MESSAGE = re.compile(r"\[([EWI]\d{3})\]$", re.MULTILINE)
EXIT_LINE = re.compile(r"# exit (\d+)\n")
CHECK_ARGS = re.compile(r"# tcdsl-check-args:(.*)")

# Codes documented in docs/diagnostics.md that no case can reach cheaply, and why.
_VERIFY = "reported by 'tcdsl verify' against a kernel, never by 'check' (tests/test_verify.py)"
UNCOVERED = {
    "E021": "reported by 'tcdsl fmt', not by check (tests/test_fmt.py)",
    "E025": "needs a file over 8 MiB; tests/test_untrusted.py makes a sparse one",
    "E210": "needs more than 65534 qdiscs or classes on one interface",
    "E261": "needs 4096 policed lines of several filters; tests/test_police.py makes them",
    "E262": "needs 2049 filters at one pref and no u32 table id left; tests/test_lint.py",
    "E263": "needs 2048 u32 prefs under one parent or 32769 flower filters; tests/test_lint.py "
    "and tests/test_lint_kernel.py (where the kernel refuses the 2048th)",
    **dict.fromkeys(("E401", "E402", "E403", "E404", "E405", "W406"), _VERIFY),
    **dict.fromkeys(
        ("E601", "E602", "E603", "E604", "W609"),
        "live operations: tests/test_ops.py, test_status.py, test_import.py",
    ),
    "E501": "backend limits: check runs no backend; golden files and tests/test_tcng.py cover it",
    "E502": "backend limits: check runs no backend; tests/test_batch.py covers it",
    **dict.fromkeys(
        (
            "E605",
            "E606",
            "E607",
            "E608",
            "E609",
            *(f"W61{n}" for n in range(10)),
            "W620",
            "W621",
            "W622",
        ),
        "reported by 'tcdsl import' on tc's text, not by check (tests/test_import.py)",
    ),
}


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cases name files relative to the repository root, as a user in a checkout would."""
    monkeypatch.chdir(ROOT)


@functools.cache
def run_check(case: str) -> tuple[int, str]:
    """``tcdsl check tests/diagnostics/<case>``: (exit code, stderr), computed once per case.

    An exception escaping the CLI is reported as ``tcdsl`` itself reports it: exit 3 and a
    traceback on stderr (which no case may show).
    """
    first = (DIAGNOSTICS / case).read_text(encoding="utf-8").partition("\n")[0]
    options = CHECK_ARGS.fullmatch(first)
    args = shlex.split(options.group(1)) if options else []
    result = CliRunner().invoke(cli, ["check", *args, f"tests/diagnostics/{case}"])
    stderr, code = result.stderr, result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        stderr += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        code = EXIT_INTERNAL
    return code, stderr


def expected_path(case: str) -> Path:
    return DIAGNOSTICS / f"{Path(case).stem}.expected"


def read_expected(case: str) -> tuple[int, str]:
    """The expected (exit code, stderr) of a case."""
    path = expected_path(case)
    assert path.exists(), f"no {path.relative_to(ROOT)}; run pytest --update-golden and review"
    text = path.read_text(encoding="utf-8")
    first = EXIT_LINE.match(text)
    assert first, f"{path.relative_to(ROOT)} must start with a line '# exit N'"
    return int(first.group(1)), text[first.end() :]


def _code_rows() -> list[tuple[str, str]]:
    """The (code, severity column) of each table row of docs/diagnostics.md."""
    text = DOCS.read_text(encoding="utf-8")
    return re.findall(r"^\|\s*`?([EWI]\d{3})`?\s*\|\s*(\w+)", text, re.M)


def documented_codes() -> set[str]:
    """The codes in the tables of docs/diagnostics.md (rows that start with ``| CODE |``),
    without the retired ones."""
    return {code for code, severity in _code_rows() if severity != "retired"}


def retired_codes() -> set[str]:
    """The codes of the "Retired codes" table: no longer reported, never reused."""
    return {code for code, severity in _code_rows() if severity == "retired"}


def test_retired_codes_are_documented_as_retired() -> None:
    assert retired_codes() == set(RETIRED)
    assert not retired_codes() & set(CODES)


def test_corpus_exists() -> None:
    assert CASES, f"no cases in {DIAGNOSTICS}"
    for case in CASES:
        assert re.fullmatch(r"[EWI]\d{3}-[a-z0-9-]+\.tcp", case), f"bad case name {case}"


@pytest.mark.parametrize("case", CASES)
def test_diagnostics(case: str, update_golden: bool) -> None:
    code, stderr = run_check(case)
    if update_golden:
        expected_path(case).write_text(f"# exit {code}\n{stderr}", encoding="utf-8")
        return
    want_code, want_stderr = read_expected(case)
    assert stderr == want_stderr
    assert code == want_code


@pytest.mark.parametrize("case", CASES)
def test_case_shows_its_code(case: str) -> None:
    """A case is named for a code it demonstrates, and its expected output reports it."""
    _, stderr = read_expected(case)
    assert case[:4] in CODE_IN_MESSAGE.findall(stderr)


def test_no_orphan_expected_files() -> None:
    stems = {Path(c).stem for c in CASES}
    orphans = sorted(p.name for p in DIAGNOSTICS.glob("*.expected") if p.stem not in stems)
    assert not orphans, f".expected files without a case: {orphans}"


def test_every_documented_code_has_a_case() -> None:
    covered = {case[:4] for case in CASES}
    missing = sorted(documented_codes() - covered - UNCOVERED.keys())
    assert not missing, f"codes in docs/diagnostics.md without a case: {missing}"
    assert not UNCOVERED.keys() & covered, "a code in UNCOVERED now has a case; drop it there"


def test_every_reported_code_is_documented() -> None:
    reported: set[str] = set()
    for case in CASES:
        reported |= set(CODE_IN_MESSAGE.findall(read_expected(case)[1]))
    undocumented = sorted(reported - documented_codes())
    assert not undocumented, f"codes reported but not in docs/diagnostics.md: {undocumented}"


def test_every_code_in_the_source_is_documented() -> None:
    in_source: set[str] = set()
    for path in (ROOT / "tcdsl").glob("*.py"):
        in_source |= set(re.findall(r'"([EWI]\d{3})"', path.read_text(encoding="utf-8")))
    undocumented = sorted(in_source - documented_codes() - retired_codes())
    assert not undocumented, f"codes in tcdsl/*.py but not in docs/diagnostics.md: {undocumented}"


@functools.cache
def _raw_terminal_words() -> set[str]:
    """How Lark's own terminal names would look if they leaked into a message: ``'lpar'``.

    A name that is also a word of the language (``CLASS`` for ``class``, ``HANDLE`` for
    ``handle``) is not a leak.
    """
    grammar = GRAMMAR.read_text(encoding="utf-8")
    keywords = set(re.findall(r'"([^"\s]+)"', grammar))
    for group in re.findall(r"/\(([\w|]+)\)\(\?!", grammar):  # keyword sets: /(a|b)(?![\w-])/
        keywords |= set(group.split("|"))
    parser = Lark(grammar, parser="lalr", lexer="contextual")
    names = {term.name.lower() for term in parser.terminals} | {"$end", "_nl"}
    return {f"'{name}'" for name in names - keywords}


@pytest.mark.parametrize("case", CASES)
def test_no_internals_reach_the_user(case: str) -> None:
    code, stderr = run_check(case)
    assert "Traceback" not in stderr
    assert "Token(" not in stderr
    assert code != EXIT_INTERNAL
    leaked = sorted(w for w in _raw_terminal_words() if w in stderr)
    assert not leaked, f"grammar terminal names in a message: {leaked}"


# Cases that show several mistakes reported at once, on purpose.
MULTI_CODE_CASES = {
    "E001-hex-number-with-unit.tcp",
    "E001-no-cascade.tcp",
    "E001-one-error-per-stage.tcp",
    "E004-many-errors-at-once.tcp",
    "E205-several-check-errors.tcp",
    "E038-table-errors-capped.tcp",  # the errors it counts beyond the 50 shown
    "E018-comment-line-in-a-continuation.tcp",  # the line's qdisc (E018) and its word (E001)
    "E001-unclosed-block-before-the-next-interface.tcp",  # the next interface's own E207
    "E103-condition-word-in-a-list.tcp",  # the value after the word (E001)
    "E036-table-statement-at-pref-one.tcp",  # the hidden line's own W312
}


@pytest.mark.parametrize("case", CASES)
def test_case_reports_its_code_and_nothing_else(case: str) -> None:
    """The broken corpus is precise: a case reports its own code and no other (a lint that
    starts firing on unrelated cases is noise a user would see too)."""
    reported = set(CODE_IN_MESSAGE.findall(read_expected(case)[1]))
    if case in MULTI_CODE_CASES:
        assert len(reported) > 1
    else:
        assert reported == {case[:4]}


def test_each_code_is_documented_once() -> None:
    rows = re.findall(r"^\|\s*`?([EWI]\d{3})`?\s*\|", DOCS.read_text(encoding="utf-8"), re.M)
    assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)
