"""Untrusted policies (a CI job checking a pull request): includes stay in the policy's tree,
only regular files of bounded size are read, nothing blocks, no file that is not a policy is
echoed, work stays linear, and fmt reads exactly what the compiler reads.

One-file reproducers are in the diagnostics corpus (E020, E022-E026 cases); these need files
that cannot be committed (FIFOs, symlinks, sparse files) or measure work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tcdsl import diagnostics
from tcdsl.backend import shquote
from tcdsl.cli import cli
from tcdsl.diagnostics import Diagnostic, Span, render
from tcdsl.driver import analyse
from tcdsl.fmt import FormatError, format_source
from tcdsl.frontend import values
from tcdsl.frontend.source import MAX_POLICY_BYTES
from tcdsl.units import Dimension
from tests.test_fmt import meaning

SECRET = "hunter2-do-not-print"
PFIFO = "interface eth0 pfifo limit 10\n"


def tcdsl(*args: str) -> tuple[int, str]:
    """Run the CLI in-process: (exit code, stdout + stderr)."""
    result = CliRunner().invoke(cli, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    return result.exit_code, result.stdout + result.stderr


def tcdsl_process(*args: str, cwd: Path) -> tuple[int, str]:
    """Run tcdsl as a process with a timeout, for what could block (a regression must fail,
    not hang the test run)."""
    done = subprocess.run(
        [sys.executable, "-c", "from tcdsl.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/secret.tcp (outside) and tmp/policy/ (the policy's tree)."""
    (tmp_path / "secret.tcp").write_text(f"{SECRET}\n", encoding="utf-8")
    (tmp_path / "policy").mkdir()
    return tmp_path / "policy"


# ---- include confinement -----------------------------------------------------------------------


def test_an_include_outside_the_tree_is_refused_without_reading_it(tree: Path) -> None:
    (tree / "main.tcp").write_text('include "../secret.tcp"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl("check", str(tree / "main.tcp"))
    assert code == 1
    assert "[E023]" in out and "main.tcp:1:9" in out
    assert SECRET not in out


def test_a_symlink_inside_the_tree_to_outside_is_refused(tree: Path) -> None:
    (tree / "link.tcp").symlink_to(tree.parent / "secret.tcp")
    (tree / "main.tcp").write_text('include "link.tcp"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl("check", str(tree / "main.tcp"))
    assert code == 1 and "[E023]" in out and "a link to" in out
    assert SECRET not in out


def test_a_named_symlink_that_leaves_its_directory_is_refused(tree: Path) -> None:
    """A pull request can add ``x.tcp -> /etc/shadow``; a pre-commit hook names it."""
    (tree / "x.tcp").symlink_to(tree.parent / "secret.tcp")
    (tree / "ok.tcp").write_text(PFIFO, encoding="utf-8")
    (tree / "alias.tcp").symlink_to(tree / "ok.tcp")
    for command in ("check", "compile", "explain", "fmt"):
        code, out = tcdsl_process(command, "x.tcp", cwd=tree)
        assert code == 1 and "not reading 'x.tcp' (a link to" in out and "[E023]" in out
        assert SECRET not in out, command
        assert tcdsl_process(command, "alias.tcp", cwd=tree)[0] == 0, command
    code, out = tcdsl_process("check", "--allow-include-anywhere", "x.tcp", cwd=tree)
    assert code == 1 and "[E001]" in out  # read as asked, and it is no policy


def test_a_byte_order_mark_is_not_text(tree: Path) -> None:
    """Notepad starts UTF-8 files with U+FEFF; it was 'unexpected \\ufeffinterface'."""
    (tree / "bom.tcp").write_bytes(b"\xef\xbb\xbf" + PFIFO.encode())
    assert tcdsl_process("check", "bom.tcp", cwd=tree) == (0, "")
    code, out = tcdsl_process("compile", "bom.tcp", cwd=tree)
    assert code == 0 and "pfifo limit 10" in out
    assert tcdsl_process("fmt", "--check", "bom.tcp", cwd=tree) == (0, "")


def test_include_path_and_allow_anywhere_allow_more(tree: Path) -> None:
    shared = tree.parent / "shared"
    shared.mkdir()
    (shared / "common.tcp").write_text("const LIMIT = 10\n", encoding="utf-8")
    (tree / "main.tcp").write_text(
        'include "../shared/common.tcp"\ninterface eth0 pfifo limit LIMIT\n', encoding="utf-8"
    )
    main = str(tree / "main.tcp")
    assert tcdsl("check", main)[0] == 1
    assert tcdsl("check", "--include-path", str(shared), main) == (0, "")
    assert tcdsl("check", "--allow-include-anywhere", main) == (0, "")
    assert tcdsl("compile", "--include-path", str(shared), main)[0] == 0
    assert tcdsl("explain", "--allow-include-anywhere", main)[0] == 0


def test_every_command_that_reads_a_policy_takes_the_access_options(tree: Path) -> None:
    """Found by a review: a table outside the policy's folder (LibreQoS's own
    ShapedDevices.csv) compiled with --include-path, but classify, plan, apply, verify,
    simulate and measure refused the option, while E023 advised it."""
    data = tree.parent / "data"
    data.mkdir()
    (data / "s.csv").write_text(
        "Circuit ID,IPv4,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps\n"
        "1001,100.64.0.1,1,1,10,10\n",
        encoding="utf-8",
    )
    (tree / "p.tcp").write_text(
        "interface eth0 htb rate 1gbit default u {\n"
        '    class n rate 100mbit {\n        subscribers download from "../data/s.csv"\n    }\n'
        "    class u rate 1mbit\n}\n",
        encoding="utf-8",
    )
    main = str(tree / "p.tcp")
    ctx = click.Context(cli)  # (the live operations' commands are added on first listing)
    for command in (cli.get_command(ctx, name) for name in cli.list_commands(ctx)):
        assert command is not None
        if any(p.name == "policy" or p.name == "policies" for p in command.params):
            names = {o for p in command.params for o in getattr(p, "opts", ())}
            assert {"--include-path", "--allow-include-anywhere"} <= names, command.name
    code, out = tcdsl("classify", main, "--packet", "udp dst 100.64.0.1")
    assert code == 1 and "[E023]" in out and "--include-path" in out
    for how in (("--include-path", str(data)), ("--allow-include-anywhere",)):
        code, out = tcdsl("classify", *how, main, "--packet", "udp dst 100.64.0.1")
        assert code == 0 and "-> class 'c1001'" in out, out
    code, out = tcdsl("simulate", "--include-path", str(data), main, "--flow", "udp dst 100.64.0.1")
    assert code == 0 and "c1001" in out, out


def test_a_directory_walk_refuses_symlinks_that_leave_it(tree: Path) -> None:
    (tree / "good.tcp").write_text(PFIFO, encoding="utf-8")
    (tree / "evil.tcp").symlink_to(tree.parent / "secret.tcp")
    code, out = tcdsl("check", str(tree))
    assert code == 1 and "evil.tcp:1:1: error: not reading" in out and "[E023]" in out
    assert SECRET not in out
    code, out = tcdsl("fmt", "--check", str(tree))
    assert code == 1 and "[E023]" in out and SECRET not in out
    assert tcdsl("check", "--allow-include-anywhere", str(tree))[0] == 1  # E001 on the secret


def test_a_directory_walk_lets_files_include_across_the_walked_tree(tree: Path) -> None:
    (tree / "common.tcp").write_text("const LIMIT = 10\n", encoding="utf-8")
    (tree / "site").mkdir()
    (tree / "site" / "a.tcp").write_text(
        'include "../common.tcp"\ninterface eth0 pfifo limit LIMIT\n', encoding="utf-8"
    )
    assert tcdsl("check", str(tree)) == (0, "")


# ---- only regular files, bounded, never blocking -----------------------------------------------


def test_a_fifo_is_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "pipe.tcp")
    (tree / "main.tcp").write_text('include "pipe.tcp"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl_process("check", "main.tcp", cwd=tree)
    assert code == 1 and "main.tcp:1:9" in out and "is a FIFO" in out and "[E024]" in out
    code, out = tcdsl_process("check", "pipe.tcp", cwd=tree)
    assert code == 1 and "[E024]" in out
    code, out = tcdsl_process("fmt", "--check", "pipe.tcp", cwd=tree)
    assert code == 1 and "[E024]" in out


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/stdin", "/dev/null"])
def test_devices_are_refused(tree: Path, device: str) -> None:
    (tree / "main.tcp").write_text(f'include "{device}"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl_process("check", "main.tcp", cwd=tree)
    assert code == 1 and "[E023]" in out  # outside the tree first
    code, out = tcdsl_process("check", "--allow-include-anywhere", "main.tcp", cwd=tree)
    assert code == 1 and "main.tcp:1:9" in out and "[E024]" in out


def test_a_proc_file_is_read_bounded_and_never_shown(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCDSL_TEST_TOKEN", SECRET)
    (tree / "main.tcp").write_text('include "/proc/self/environ"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl_process("check", "--allow-include-anywhere", "main.tcp", cwd=tree)
    assert code == 1 and "[E022]" in out and "NUL" in out
    assert SECRET not in out and "TCDSL_TEST_TOKEN" not in out


@pytest.mark.parametrize(
    "content",
    [f"API_TOKEN={SECRET}\n", f"# comment\n\nexport KEY={SECRET}\nmore\n", f"{SECRET} x y\n"],
)
def test_an_included_file_that_is_not_a_policy_is_never_shown(tree: Path, content: str) -> None:
    """Text that fails at its first statement is not a policy: one error at the include, and
    none of its lines (in the tree, or anywhere with --allow-include-anywhere)."""
    (tree / ".env").write_text(content, encoding="utf-8")
    (tree / "main.tcp").write_text('include ".env"\n' + PFIFO, encoding="utf-8")
    for args in (("check",), ("check", "--allow-include-anywhere"), ("compile",), ("explain",)):
        code, out = tcdsl_process(*args, "main.tcp", cwd=tree)
        assert code == 1 and "main.tcp:1:9: error: '.env' is not a tcdsl policy" in out
        assert SECRET not in out and "KEY" not in out, out
    # A policy with a mistake further down still shows it, as any policy does.
    (tree / "common.tcp").write_text("const A = 1mbit\nconst B = = 2mbit\n", encoding="utf-8")
    (tree / "main.tcp").write_text('include "common.tcp"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl_process("check", "main.tcp", cwd=tree)
    assert code == 1 and "common.tcp:2:" in out and "const B = = 2mbit" in out


def test_huge_sparse_files_are_refused_before_reading(tree: Path) -> None:
    with open(tree / "huge.tcp", "wb") as f:
        f.truncate(64 * 1024**3)  # 64 GiB, sparse: reading it would take minutes and all RAM
    (tree / "main.tcp").write_text('include "huge.tcp"\n' + PFIFO, encoding="utf-8")
    code, out = tcdsl("check", str(tree / "main.tcp"))
    assert code == 1 and "main.tcp:1:9" in out and "[E025]" in out
    assert f"at most {MAX_POLICY_BYTES} bytes" in out
    code, out = tcdsl("check", str(tree / "huge.tcp"))
    assert code == 1 and "huge.tcp:1:1" in out and "[E025]" in out


def test_a_file_over_the_limit_is_refused(tree: Path) -> None:
    (tree / "big.tcp").write_bytes(b"#" * (MAX_POLICY_BYTES + 1))
    code, out = tcdsl("fmt", "--check", str(tree / "big.tcp"))
    assert code == 1 and "[E025]" in out
    code, out = tcdsl("check", str(tree / "big.tcp"))
    assert code == 1 and "[E025]" in out


# ---- linear work -------------------------------------------------------------------------------


def test_each_constant_is_evaluated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``const Ck = Ck-1 + Ck-1``: 2^59 evaluations of C0 without memoisation."""
    calls = 0
    literal = values._literal

    def counting(lit: values.Lit, dim: Dimension) -> object:
        nonlocal calls
        calls += 1
        assert calls < 1000, "constants are evaluated again at every use"
        return literal(lit, dim)

    monkeypatch.setattr(values, "_literal", counting)
    lines = ["const C0 = 1bit", *(f"const C{k} = C{k - 1} + C{k - 1}" for k in range(1, 60))]
    text = "\n".join([*lines, "interface eth0 tbf rate C59 burst 10k latency 50ms", ""])
    result = analyse("chain.tcp", loader=lambda _: text)
    assert calls < 10
    assert [d.code for d in result.errors] == ["E208"]  # 2^59 bit/s is too much for tc


def test_a_file_included_twice_is_read_once(tmp_path: Path) -> None:
    """17 files that each include the next twice: 2^16 parses if a file is read each time."""
    for i in range(17):
        body = f'include "d{i + 1}.tcp"\ninclude "d{i + 1}.tcp"\n' if i < 16 else PFIFO
        (tmp_path / f"d{i}.tcp").write_text(f"const C{i} = 1\n{body}", encoding="utf-8")
    read: list[str] = []

    def loader(path: str) -> str:
        read.append(path)
        return Path(path).read_text(encoding="utf-8")

    result = analyse(str(tmp_path / "d0.tcp"), loader=loader)
    assert result.diagnostics == []
    assert sorted(read) == sorted(str(tmp_path / f"d{i}.tcp") for i in range(17))
    assert result.policy is not None and len(result.policy.interfaces) == 1


class _CountingSources(Mapping[str, str]):
    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.lookups = 0

    def __getitem__(self, key: str) -> str:
        self.lookups += 1
        return self.sources[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


def test_rendering_splits_each_source_once() -> None:
    """20,000 warnings took 11 s as text when each excerpt split the whole source again."""
    text = "".join(f"line {i}\n" for i in range(2000))
    sources = _CountingSources({"p.tcp": text})
    many = [Diagnostic.warning("W311", "x", Span("p.tcp", i, 1, i, 5)) for i in range(1, 2001)]
    out = render(many, sources)
    assert sources.lookups == 1
    assert " 1999 | line 1998\n" in out


def test_rendering_escapes_each_line_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of diagnostics on one long line: the line is escaped and measured once (it
    was once per diagnostic, quadratic: 4,000 repeated match lines on one line took 7.7 s)."""
    line = "class b rate 1mbit" + " match dport 80" * 3000 + " \x1b"
    calls: list[str] = []
    real = diagnostics._display

    def counting(text: str) -> tuple[str, list[int]]:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(diagnostics, "_display", counting)
    many = [
        Diagnostic.warning("W312", "x", Span("p.tcp", 1, col, 1, col + 14))
        for col in range(20, 20 + 15 * 3000, 15)
    ]
    out = render(many, {"p.tcp": line})
    assert len(calls) == 1
    assert out.count("^~~~~~~~~~~~~~\n") == 3000
    assert max(len(row) for row in out.splitlines()) < 200


# ---- diagnostics show the right line, escaped, cut ---------------------------------------------


@pytest.mark.parametrize("separator", ["\f", "\x85", "\u2028", "\u2029", "\v"])
def test_excerpts_count_lines_as_the_lexer_does(separator: str) -> None:
    text = f"# a{separator}b\ninterface eth0 tbf rate 1mbit burst 10k latency 50\n"
    result = analyse("p.tcp", loader=lambda _: text)
    out = render(result.diagnostics, result.sources)
    assert "p.tcp:2:49" in out
    assert " 2 | interface eth0 tbf rate 1mbit burst 10k latency 50\n" in out


def test_control_characters_are_escaped_and_the_caret_follows() -> None:
    text = "interface eth0 htb rate 1mbit\x07\x1b]0;title\x07 {\n}\n"
    result = analyse("p.tcp", loader=lambda _: text)
    out = render(result.diagnostics, result.sources)
    assert "\x1b" not in out and "\x07" not in out
    line = next(x for x in out.splitlines() if x.startswith(" 1 | "))
    caret = out.splitlines()[out.splitlines().index(line) + 1]
    assert line[caret.index("^") :].startswith("\\x07\\x1b]0;title")


@pytest.mark.parametrize(
    ("wide", "columns"),
    [("東京都港区", 10), ("🚀🚀", 4), ("e\u0301e\u0301", 2), ("กัก", 2)],
)
def test_the_caret_counts_terminal_columns(wide: str, columns: int) -> None:
    """Found by a tester: after a CJK name (two columns a character) or emoji in a table's
    row, the caret stood under the name, not the address; a combining accent takes none."""
    text = f'include "{wide}.tcp" bogus\n'
    out = render(analyse("p.tcp", loader=lambda _: text).diagnostics, {"p.tcp": text})
    lines = out.splitlines()
    unexpected = lines.index(next(x for x in lines if "unexpected 'bogus'" in x))
    caret = lines[unexpected + 2]
    # ' 1 | include "' and the name, then '.tcp" ': the caret under 'bogus'
    assert caret.index("^") == len(' 1 | include "') + columns + len('.tcp" '), out


def test_long_lines_are_cut_around_the_caret() -> None:
    text = "interface eth0 tbf burst 10k latency 50ms rate 1" + "0" * 400 + "bit\n"
    out = render(analyse("p.tcp", loader=lambda _: text).diagnostics, {"p.tcp": text})
    for line in out.splitlines():
        assert not line.startswith(" ") or len(line) < 120, line
    excerpt, caret = out.splitlines()[1:3]
    assert excerpt[caret.index("^") :].startswith("1000") and excerpt.endswith("...")


# ---- numbers -----------------------------------------------------------------------------------

HEX_MATCH = """\
interface eth0 htb rate 2mbit default a {{
    class a rate 1mbit
    class b rate 1mbit prio {prio} {{
        match sport {port} dport {lo}-{hi} proto {proto} dscp {dscp} u16 {u16} at {at} pref {pref}
    }}
}}
"""


def test_hex_numbers_wherever_whole_numbers_go() -> None:
    hex_ = HEX_MATCH.format(
        prio="0x1", port="0x1234", lo="0x400", hi="0x7ff", proto="0x11", dscp="0x2e",
        u16="0x10/0xff", at="0x2", pref="0x10",
    )  # fmt: skip
    dec = HEX_MATCH.format(
        prio="1", port="4660", lo="1024", hi="2047", proto="17", dscp="46", u16="16/0xff",
        at="2", pref="16",
    )  # fmt: skip
    assert meaning(hex_) == meaning(dec)
    # Only I321: the line's raw offsets make it IPv4's, so IPv6 goes to the default class.
    assert [d[1] for d in meaning(hex_)[1]] == ["I321"]
    assert "sport 0x1234" in format_source(hex_)


@pytest.mark.parametrize("digits", ["\u0661\u0660", "\uff11\uff10", "\u0967\u0966", "1\u00b2"])
def test_only_ascii_digits_make_numbers(digits: str) -> None:
    text = f"interface eth0 pfifo limit {digits}\n"
    result = analyse("p.tcp", loader=lambda _: text)
    assert [d.code for d in result.errors] in (["E001"], ["E002"])


@pytest.mark.parametrize(
    "policy",
    [
        "interface eth0 tbf rate 1mbit burst {n}k latency 50ms",
        "interface eth0 tbf rate 1mbit burst 10k latency {n}ms",
        "interface eth0 prio bands 3 priomap {n} 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
        "interface eth0 htb rate 1mbit default a {{\n class a rate 1mbit\n match sport {n}\n}}",
        "interface eth0 htb rate 1mbit default a {{\n class a rate 1mbit\n match pref {n} all\n}}",
        "interface eth0 htb rate 1mbit default a {{\n class a rate {n}.5%\n}}",
    ],
)
def test_numbers_of_thousands_of_digits_are_located_errors(policy: str, tmp_path: Path) -> None:
    (tmp_path / "p.tcp").write_text(policy.format(n="7" * 5000) + "\n", encoding="utf-8")
    code, out = tcdsl("check", str(tmp_path / "p.tcp"))
    assert code == 1 and "[E026]" in out and "has 500" in out


# ---- fmt reads what the compiler reads ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "interface \\\neth0 htb rate 1mbit default a {\n    class a rate 1mbit\n}\n",
        "# comment\rinterface eth0 pfifo limit 10\n",
        "interface eth0 htb rate 1mbit default a {\r    class a rate 1mbit\r}\r",
        "interface eth0 htb rate 1mbit default a {\r\n    class a rate 1mbit\r\n}\r\n",
        "interface " + "e" * 89 + " pfifo\n",
    ],
    ids=["continued-ifname", "cr-in-comment", "cr-only", "crlf", "long-ifname"],
)
def test_fmt_reads_what_the_compiler_reads(text: str) -> None:
    formatted = format_source(text)
    assert meaning(formatted) == meaning(text)
    assert "\r" not in formatted


def test_fmt_check_flags_a_lone_cr_the_compiler_reads_as_a_line_break(tmp_path: Path) -> None:
    path = tmp_path / "p.tcp"
    path.write_bytes(b"# comment\rinterface eth0 pfifo limit 10\n")
    code, out = tcdsl("fmt", "--check", str(path))
    assert code == 1 and "would reformat" in out
    assert meaning("# comment\rinterface eth0 pfifo limit 10\n")[0] is not None


def test_fmt_invalid_utf8_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "p.tcp"
    path.write_bytes(b"interface eth0 pfifo\n# caf\xe9\n")
    for command in ("fmt", "check"):
        code, out = tcdsl(command, str(path))
        assert code == 1 and f"{path}:2:6: error:" in out and "[E022]" in out


def test_fmt_and_check_answer_e020_at_the_same_brace_in_linear_time(tmp_path: Path) -> None:
    depth = 16_000  # fmt built 4-space indents for each level: 7.6 GB
    path = tmp_path / "deep.tcp"
    path.write_text(
        "interface eth0 htb rate 1mbit {\n"
        + "".join(f"class c{i} rate 1mbit {{\n" for i in range(depth))
        + "}\n" * (depth + 1),
        encoding="utf-8",
    )
    check = tcdsl("check", str(path))
    fmt = tcdsl("fmt", "--check", str(path))
    assert check[0] == fmt[0] == 1
    assert f"{path}:101:22: error: blocks and parentheses nest more than 100" in check[1]
    assert check[1] == fmt[1]  # the count too, as fmt ends with it now
    with pytest.raises(FormatError) as err:
        format_source("const A = " + "(" * 101 + "1" + ")" * 101 + "\n")
    assert err.value.diagnostic.code == "E020"


# ---- fuzz: includes and numbers ----------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(0, 10**120).map(str),
    st.integers(0, 2**80).map(hex),
    st.text("0123456789", min_size=1, max_size=4400),
    st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 10**40), st.integers(0, 10**40)),
    st.text("\u0660\u0661\uff10\uff19\u00b20123456789xXabcdef.", min_size=1, max_size=12),
)
TEMPLATES = [
    "interface eth0 tbf rate {0}mbit burst {1}k latency {2}ms",
    "interface eth0 tbf rate 1mbit burst 10k latency {0}us peakrate {1}kbit mtu {2}",
    "const A = {0}kbit\nconst B = A * {1} + A / {2}\ninterface eth0 htb rate B",
    "interface eth0 htb rate {0}kbit r2q {1} default a {{\n class a rate {2}% ceil {0}bit\n}}",
    "interface eth0 netem delay {0}ms jitter {1}ms loss {2}% limit {0}",
    "interface eth0 sfq perturb {0} quantum {1} limit {2}",
    "interface eth0 prio bands {0} priomap {1} 1 {2} 1 1 1 1 1 1 1 1 1 1 1 1 1",
    "interface eth0 htb rate 1mbit default a {{\n class a rate 1mbit\n"
    " match sport {0} dport {1}-{2} proto {0} dscp {1} u32 {2}/{0} at {1} pref {2}\n}}",
]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(TEMPLATES), st.lists(NUMBERS, min_size=3, max_size=3))
def test_fuzz_numbers(template: str, numbers: list[str]) -> None:
    """No number makes check, compile, fmt or explain fail with an internal error."""
    from tcdsl.driver import compile_policy
    from tcdsl.teach.explain import explain

    text = template.format(*numbers) + "\n"
    result = compile_policy("p.tcp", "tc-batch", loader=lambda _: text)
    render(result.diagnostics, result.sources)
    if result.policy is not None:
        explain(result.policy, "text")
    try:
        assert meaning(format_source(text)) == meaning(text)
    except FormatError:
        assert result.errors


INCLUDES = st.lists(
    st.lists(
        st.one_of(
            st.integers(0, 5).map(lambda i: f"f{i}.tcp"),
            st.sampled_from(
                [
                    "../secret.tcp",
                    "/proc/self/environ",
                    "sub",
                    "link.tcp",
                    "missing.tcp",
                    "sub/../f0.tcp",
                    "latin1.tcp",
                ]
            ),
        ),
        max_size=4,
    ),
    min_size=6,
    max_size=6,
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(INCLUDES, st.booleans())
def test_fuzz_includes(tree: Path, graph: list[list[str]], anywhere: bool) -> None:
    """Any include graph (cycles, repeats, files outside, /proc, directories, links, non-UTF-8)
    ends with located diagnostics, and shows nothing from outside the tree unless allowed.
    (FIFOs and devices are tested in a subprocess, where a regression cannot hang the run.)"""
    if not (tree / "sub").exists():
        (tree / "sub").mkdir()
        (tree / "link.tcp").symlink_to(tree.parent / "secret.tcp")
        (tree / "latin1.tcp").write_bytes(b"# \xe9\n")
    for i, includes in enumerate(graph):
        lines = [f'include "{name}"' for name in includes]
        (tree / f"f{i}.tcp").write_text("\n".join([*lines, f"const C{i} = 1", ""]), "utf-8")
    with open(tree / "f0.tcp", "a", encoding="utf-8") as f:
        f.write(PFIFO)
    args = ["--allow-include-anywhere"] if anywhere else []
    code, out = tcdsl("check", *args, str(tree / "f0.tcp"))
    assert code in (0, 1)
    assert anywhere or SECRET not in out
    assert "Traceback" not in out
    for line in out.splitlines():
        assert line.startswith((" ", "tcdsl:", "/")), line


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_a_quoted_word_is_read_back_by_sh_as_itself(word: str) -> None:
    """shquote (every user string in a script goes through it): sh reads back the same word."""
    if "\0" in word:
        return  # no shell word can hold a NUL
    quoted = shquote(word)
    done = subprocess.run(
        ["sh", "-c", f"printf '%s' {quoted}"], capture_output=True, check=True, timeout=10
    )
    assert done.stdout == word.encode("utf-8", "surrogateescape")
