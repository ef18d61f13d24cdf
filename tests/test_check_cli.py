"""``tcdsl check`` over files and directories: formats (text, JSON, SARIF), --info, --werror,
--disable and disable comments, and --kernel targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from tcdsl import __version__
from tcdsl.cli import cli
from tcdsl.codes import CODES
from tcdsl.diagnostics import Severity
from tcdsl.kernel_target import load_target, parse_version
from tcdsl.suppress import comments
from tests.conftest import ROOT
from tests.test_diagnostics import documented_codes

CBQ_SEED = ROOT / "policies" / "seeds" / "s002-cbq-conditioner.tcp"
# Each policy reports exactly the diagnostics its name says (and nothing else).
W302_ONLY = "interface eth0 htb rate 10mbit default web {\n    class web rate 1mbps\n}\n"
E202 = "interface eth0 htb rate 10mbit default web {\n    class web rate 5mbit ceil 2mbit\n}\n"
CBQ = (
    "interface eth0 cbq bandwidth 10mbit avpkt 1000 {\n"
    "    class web rate 1mbit allot 1514 bounded {\n"
    "        match dport 80\n"
    "    }\n"
    "}\n"
)
FQ_CODEL = "interface eth0 htb rate 10mbit default web {\n    class web rate 10mbit {\n"
FQ_CODEL += "        fq_codel\n    }\n}\n"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty temporary directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def codes_of(result: Result) -> list[str]:
    """The codes of a --format json run, in order."""
    return [d["code"] for d in json.loads(result.stderr)]


# ---- the code registry ---------------------------------------------------------------------


def test_registry_is_the_documented_codes() -> None:
    """Every documented code has an entry in tcdsl/codes.py and every entry is documented."""
    missing = sorted(documented_codes() - CODES.keys())
    extra = sorted(CODES.keys() - documented_codes())
    assert not missing, f"codes in docs/diagnostics.md but not in tcdsl/codes.py: {missing}"
    assert not extra, f"codes in tcdsl/codes.py not in docs/diagnostics.md: {extra}"


def test_registry_severities_follow_the_code_letter() -> None:
    letter = {Severity.ERROR: "E", Severity.WARNING: "W", Severity.INFO: "I"}
    for code, info in CODES.items():
        assert code[0] == letter[info.severity], code
        assert info.title and "\n" not in info.title and not info.title.endswith("."), code


# ---- files and directories -----------------------------------------------------------------


def test_directories_are_walked_sorted_skipping_hidden(here: Path) -> None:
    for name in ("b.tcp", "a/z.tcp", "a/sub/y.tcp", "a/.hidden/x.tcp", "a/.dot.tcp", "c.txt"):
        write(here / "tree" / name, W302_ONLY)
    result = run("check", "--format", "json", "tree", "tree/a/../b.tcp")
    assert result.exit_code == 0
    files = [d["span"]["file"] for d in json.loads(result.stderr)]
    # b.tcp named again another way is checked once (found by a tester: twice)
    assert files == ["tree/a/sub/y.tcp", "tree/a/z.tcp", "tree/b.tcp"]


def test_a_directory_without_policies_is_a_usage_error(here: Path) -> None:
    write(here / "empty" / ".hidden" / "x.tcp", W302_ONLY)
    result = run("check", "empty")
    assert result.exit_code == 2
    assert "no .tcp files under the directory 'empty'" in result.stderr


def test_a_missing_file_is_e006(here: Path) -> None:
    result = run("check", "nope.tcp")
    assert result.exit_code == 1
    assert "[E006]" in result.stderr


def test_repository_policies_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = run("check", "--format", "json", "policies")
    files = {d["span"]["file"] for d in json.loads(result.stderr)}
    assert all(f.startswith("policies/") for f in files)
    assert result.exit_code in (0, 1)


# ---- formats -------------------------------------------------------------------------------


def test_text_output_is_exact(here: Path) -> None:
    write(here / "w.tcp", W302_ONLY)
    result = run("check", "w.tcp")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == (
        "w.tcp:2:20: warning: tc reads bps/kbps/mbps/gbps as BYTES per second; this is 8mbit "
        "(write 'bit' units to mean bits) [W302]\n"
        " 2 |     class web rate 1mbps\n"
        "   |                    ^~~~~\n"
        "tcdsl: 1 warning\n"
    )


@pytest.mark.parametrize("option", ["--format", "--diagnostics"])
def test_json_output_and_its_old_option_name(here: Path, option: str) -> None:
    write(here / "e.tcp", E202)
    result = run("check", option, "json", "e.tcp")
    assert result.exit_code == 1
    (item,) = json.loads(result.stderr)
    assert item["code"] == "E202" and item["severity"] == "error"
    assert item["notes"][0]["message"] == "rate given here"


def test_compile_takes_format_too(here: Path) -> None:
    write(here / "e.tcp", E202)
    result = run("compile", "--format", "json", "e.tcp")
    assert result.exit_code == 1
    assert [d["code"] for d in json.loads(result.stderr)] == ["E202"]


# A hand-written subset of the SARIF 2.1.0 schema: the properties tcdsl writes, with their types
# and required members as the OASIS schema gives them. (No package on PyPI ships the official
# schema, and tests run without internet.)
_MESSAGE = {
    "type": "object",
    "required": ["text"],
    "properties": {"text": {"type": "string"}},
}
_LOCATION = {
    "type": "object",
    "required": ["physicalLocation"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "integer", "minimum": -1},
        "message": _MESSAGE,
        "physicalLocation": {
            "type": "object",
            "required": ["artifactLocation", "region"],
            "additionalProperties": False,
            "properties": {
                "artifactLocation": {
                    "type": "object",
                    "required": ["uri"],
                    "additionalProperties": False,
                    "properties": {
                        "uri": {"type": "string", "format": "uri-reference"},
                        "uriBaseId": {"type": "string"},
                    },
                },
                "region": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["startLine", "startColumn", "endLine", "endColumn"],
                    "properties": {
                        k: {"type": "integer", "minimum": 1}
                        for k in ("startLine", "startColumn", "endLine", "endColumn")
                    },
                },
            },
        },
    },
}
_LEVEL = {"enum": ["none", "note", "warning", "error"]}
SARIF_SUBSET: dict[str, Any] = {
    "type": "object",
    "required": ["version", "runs"],
    "additionalProperties": False,
    "properties": {
        "$schema": {"const": "https://json.schemastore.org/sarif-2.1.0.json"},
        "version": {"const": "2.1.0"},
        "runs": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1,
            "items": {
                "type": "object",
                "required": ["tool"],
                "additionalProperties": False,
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {
                            "driver": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"const": "tcdsl"},
                                    "version": {"type": "string"},
                                    "informationUri": {"type": "string", "format": "uri"},
                                    "rules": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["id"],
                                            "additionalProperties": False,
                                            "properties": {
                                                "id": {"type": "string"},
                                                "shortDescription": _MESSAGE,
                                                "fullDescription": _MESSAGE,
                                                "helpUri": {"type": "string", "format": "uri"},
                                                "defaultConfiguration": {
                                                    "type": "object",
                                                    "additionalProperties": False,
                                                    "properties": {"level": _LEVEL},
                                                },
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    },
                    "originalUriBaseIds": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"uri": {"type": "string"}},
                        },
                    },
                    "columnKind": {"enum": ["utf16CodeUnits", "unicodeCodePoints"]},
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["message"],
                            "additionalProperties": False,
                            "properties": {
                                "ruleId": {"type": "string"},
                                "ruleIndex": {"type": "integer", "minimum": -1},
                                "level": _LEVEL,
                                "message": _MESSAGE,
                                "locations": {"type": "array", "items": _LOCATION},
                                "relatedLocations": {"type": "array", "items": _LOCATION},
                            },
                        },
                    },
                },
            },
        },
    },
}


def sarif_of(result: Result) -> dict[str, Any]:
    log: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(log, SARIF_SUBSET, format_checker=jsonschema.FormatChecker())
    run0 = log["runs"][0]
    rules = run0["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted({r["ruleId"] for r in run0["results"]})
    for r in run0["results"]:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
    return log


def test_sarif(here: Path) -> None:
    write(here / "pol" / "e.tcp", E202)
    write(here / "pol" / "w.tcp", W302_ONLY)
    result = run("check", "--format", "sarif", "pol")
    assert result.exit_code == 1
    assert result.stderr == ""
    log = sarif_of(result)
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    driver = log["runs"][0]["tool"]["driver"]
    assert driver["version"] == __version__
    assert [(r["id"], r["defaultConfiguration"]["level"]) for r in driver["rules"]] == [
        ("E202", "error"),
        ("W302", "warning"),
    ]
    assert driver["rules"][0]["helpUri"].endswith("docs/diagnostics.md#e2xx-semantics")
    assert driver["rules"][0]["shortDescription"]["text"] == CODES["E202"].title
    error, warning = log["runs"][0]["results"]
    assert (error["ruleId"], error["ruleIndex"], error["level"]) == ("E202", 0, "error")
    assert (warning["ruleId"], warning["ruleIndex"], warning["level"]) == ("W302", 1, "warning")
    assert error["message"]["text"] == "ceil 2mbit is below rate 5mbit"
    (loc,) = error["locations"]
    assert loc["physicalLocation"] == {
        "artifactLocation": {"uri": "pol/e.tcp", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 2, "startColumn": 31, "endLine": 2, "endColumn": 36},
    }
    (note,) = error["relatedLocations"]
    assert note["message"]["text"] == "rate given here"
    assert note["physicalLocation"]["region"]["startColumn"] == 20
    assert "relatedLocations" not in warning


def test_sarif_uris_relative_to_the_current_directory(here: Path) -> None:
    write(here / "sub dir" / "w.tcp", W302_ONLY)
    result = run("check", "--format", "sarif", str(here / "sub dir" / "w.tcp"))
    (r,) = sarif_of(result)["runs"][0]["results"]
    artifact = r["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": "sub%20dir/w.tcp", "uriBaseId": "%SRCROOT%"}


def test_sarif_uri_outside_the_current_directory(here: Path, tmp_path_factory: Any) -> None:
    elsewhere = write(tmp_path_factory.mktemp("elsewhere") / "w.tcp", W302_ONLY)
    result = run("check", "--format", "sarif", str(elsewhere))
    (r,) = sarif_of(result)["runs"][0]["results"]
    artifact = r["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": elsewhere.as_uri()}


def test_sarif_is_deterministic_and_can_go_to_a_file(here: Path) -> None:
    write(here / "w.tcp", W302_ONLY)
    write(here / "e.tcp", E202)
    first = run("check", "--format", "sarif", "w.tcp", "e.tcp")
    second = run("check", "--format", "sarif", "-o", "out.sarif", "e.tcp", "w.tcp")
    assert second.stdout == second.stderr == ""
    assert first.stdout == (here / "out.sarif").read_text(encoding="utf-8")
    assert first.exit_code == second.exit_code == 1


def test_sarif_of_a_clean_policy_has_no_results(here: Path) -> None:
    write(here / "ok.tcp", W302_ONLY.replace("1mbps", "1mbit"))
    result = run("check", "--format", "sarif", "ok.tcp")
    assert result.exit_code == 0
    log = sarif_of(result)
    assert log["runs"][0]["results"] == [] and log["runs"][0]["tool"]["driver"]["rules"] == []


# ---- infos, --werror, --disable ------------------------------------------------------------

UNUSED_DISABLE = "interface eth0 htb rate 10mbit default web {  # tcdsl: disable=W302\n"
UNUSED_DISABLE += "    class web rate 1mbit\n}\n"


def test_infos_only_with_info(here: Path) -> None:
    write(here / "i.tcp", UNUSED_DISABLE)
    assert run("check", "i.tcp").stderr == ""
    shown = run("check", "--info", "i.tcp")
    assert shown.exit_code == 0
    assert "info: this comment disables W302, but no W302 is reported here" in shown.stderr
    assert shown.stderr.endswith("tcdsl: 1 info\n")
    assert codes_of(run("check", "--format", "json", "i.tcp")) == []
    assert codes_of(run("check", "--format", "json", "--info", "i.tcp")) == ["I308"]
    (r,) = sarif_of(run("check", "--format", "sarif", "i.tcp"))["runs"][0]["results"]
    assert (r["ruleId"], r["level"]) == ("I308", "note")


def test_werror_counts_warnings_not_infos(here: Path) -> None:
    write(here / "w.tcp", W302_ONLY)
    write(here / "i.tcp", UNUSED_DISABLE)
    assert run("check", "w.tcp").exit_code == 0
    assert run("check", "--werror", "w.tcp").exit_code == 1
    assert run("check", "--werror", "--info", "i.tcp").exit_code == 0
    assert run("compile", "--werror", "i.tcp").exit_code == 0
    assert run("compile", "--werror", "w.tcp").exit_code == 1


def test_disable_drops_warnings(here: Path) -> None:
    write(here / "w.tcp", W302_ONLY)
    result = run("check", "--werror", "--disable", "W304,W302", "--disable", "w305", "w.tcp")
    assert result.exit_code == 0
    assert result.stderr == ""
    compiled = run("compile", "--werror", "--disable", "W302", "w.tcp")
    assert compiled.exit_code == 0 and compiled.stdout


def test_disable_refuses_errors_and_unknown_codes(here: Path) -> None:
    write(here / "e.tcp", E202)
    for command in ("check", "compile"):
        refused = run(command, "--disable", "E202", "e.tcp")
        assert refused.exit_code == 2
        assert (
            "E202 is an error; errors cannot be disabled because tc would refuse or misbuild "
            "the policy" in refused.stderr
        )
        unknown = run(command, "--disable", "W399", "e.tcp")
        assert unknown.exit_code == 2
        assert "unknown code 'W399'" in unknown.stderr


@pytest.mark.parametrize(
    "text",
    [
        "interface eth0 htb rate 10mbit default web {\n"
        "    class web rate 1mbps  # tcdsl: disable=W302 -- bytes on purpose\n}\n",
        "interface eth0 htb rate 10mbit default web {\n"
        "    # tcdsl: disable-next-line=W304, W302\n    class web rate 1mbps\n}\n",
        "# tcdsl: disable-file=W302\n"
        "interface eth0 htb rate 10mbit default web {\n    class web rate 1mbps\n}\n",
        # any case, as --disable takes it (found by a tester: 'w302' was an unknown code)
        "interface eth0 htb rate 10mbit default web {\n"
        "    class web rate 1mbps  # tcdsl: disable=w302\n}\n",
    ],
    ids=["same-line", "next-line", "file", "lower-case"],
)
def test_disable_comments(here: Path, text: str) -> None:
    write(here / "d.tcp", text)
    result = run("check", "--werror", "--format", "json", "d.tcp")
    assert codes_of(result) == []
    assert result.exit_code == 0


def test_disable_comment_on_another_line_does_not_apply(here: Path) -> None:
    text = "interface eth0 htb rate 10mbit default web {  # tcdsl: disable=W302\n"
    text += "    class web rate 1mbps\n}\n"
    write(here / "d.tcp", text)
    assert codes_of(run("check", "--format", "json", "--info", "d.tcp")) == ["I308", "W302"]


def test_a_hash_in_a_string_is_not_a_comment(here: Path) -> None:
    text = "interface eth0 htb rate 10mbit default web {\n"
    text += '    classify by mark from eth1 chain "#tcdsl:disable-file=W302"\n'
    text += "    class web rate 1mbps mark 5\n}\n"
    write(here / "s.tcp", text)
    # The whole string is the chain name (which E216 refuses), not a disable comment: the
    # byte-unit rate of the next line still warns (later stages report after frontend errors).
    items = json.loads(run("check", "--format", "json", "s.tcp").stderr)
    assert [d["code"] for d in items] == ["E216", "W302"]
    assert "'#tcdsl:disable-file=W302' contains '#'" in items[0]["message"]
    assert [c.text for c in comments('a "# no" b # yes "x"\n"#" # z\n"open # x')] == [
        '# yes "x"',
        "# z",
    ]


def test_bad_disable_comments_warn(here: Path) -> None:
    text = "interface eth0 htb rate 10mbit default web {  # tcdsl: disable=E202,W399\n"
    text += "    class web rate 1mbit\n}\n"
    write(here / "b.tcp", text)
    result = run("check", "--format", "json", "b.tcp")
    items = json.loads(result.stderr)
    assert [(d["code"], d["message"], d["span"]["column"]) for d in items] == [
        ("W307", "E202 is an error and cannot be disabled", 64),
        ("W307", "unknown code 'W399' in a disable comment", 69),
    ]
    assert run("check", "--disable", "W307", "--werror", "b.tcp").exit_code == 0


def test_verify_and_compile_honour_comments(here: Path) -> None:
    text = "interface eth0 htb rate 10mbit default web {\n"
    text += "    class web rate 1mbps  # tcdsl: disable=W302\n}\n"
    write(here / "d.tcp", text)
    result = run("compile", "--werror", "d.tcp")
    assert result.exit_code == 0 and result.stderr == ""


# ---- kernel targets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "code"),
    [
        ("6.1", 0),
        ("6.2", 0),
        ("6.1.81", 0),
        ("6.1.0-18-amd64", 0),
        ("6.3", 1),
        ("6.8", 1),
        ("6.1.82", 1),
        ("6.1.100", 1),
    ],
)
def test_cbq_seed_per_kernel_version(kernel: str, code: int) -> None:
    result = run("check", "--kernel", kernel, str(CBQ_SEED))
    assert result.exit_code == code, result.stderr
    if code:
        assert f"error: the target kernel {kernel} has no cbq qdisc (removed in Linux 6.3" in (
            result.stderr
        )
        assert "use htb: a bounded cbq class is an htb class with ceil = rate [E213]" in (
            result.stderr
        )
        assert ":34:31: error:" in result.stderr  # at the qdisc keyword
    else:
        assert result.stderr == ""


def test_compile_with_a_kernel_without_cbq_generates_nothing() -> None:
    result = run("compile", "--kernel", "6.8", str(CBQ_SEED))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "[E213]" in result.stderr
    assert run("compile", "--kernel", "6.1", str(CBQ_SEED)).exit_code == 0


CONFIG = """\
# Linux/x86 6.1.0 Kernel Configuration
CONFIG_NET_SCHED=y
CONFIG_NET_CLS=y
CONFIG_NET_SCH_CBQ=m
CONFIG_NET_SCH_HTB=m
CONFIG_NET_SCH_SFQ=m
CONFIG_NET_SCH_FQ_CODEL=y
CONFIG_NET_CLS_U32=m
# CONFIG_NET_CLS_FW is not set
"""


def test_kernel_config_file(here: Path) -> None:
    write(here / "config-with", CONFIG)
    write(here / "config-without", CONFIG.replace("CONFIG_NET_SCH_CBQ=m", ""))
    assert run("check", "--kernel", "config-with", str(CBQ_SEED)).exit_code == 0
    result = run("check", "--kernel", "config-without", str(CBQ_SEED))
    assert result.exit_code == 1
    assert (
        "the target kernel config-without has no cbq qdisc (CONFIG_NET_SCH_CBQ not set)"
        in result.stderr
    )
    marks = "interface eth0 family ipv4 htb rate 10mbit default web {\n"  # IPv4 options only
    marks += "    classify by mark from eth1\n    class web rate 1mbit {\n"
    marks += "        match proto tcp dport 80\n    }\n}\n"
    write(here / "marks.tcp", marks)
    missing = codes_of(run("check", "--format", "json", "--kernel", "config-with", "marks.tcp"))
    assert missing == ["E213", "E213"]  # the fw classifier, and firewall marking
    nft = CONFIG.replace("# CONFIG_NET_CLS_FW is not set", "CONFIG_NET_CLS_FW=m")
    write(here / "config-nft", nft + "CONFIG_NF_TABLES=m\nCONFIG_NF_TABLES_INET=y\n")
    assert run("check", "--kernel", "config-nft", "marks.tcp").exit_code == 0
    # set dscp needs the DSCP target (or nftables); a line that keeps its pref needs u32.
    xt = nft.replace("CONFIG_NET_CLS_U32=m\n", "")
    xt += "CONFIG_IP_NF_IPTABLES=m\nCONFIG_IP_NF_MANGLE=m\nCONFIG_NETFILTER_XT_MARK=m\n"
    write(here / "config-xt", xt)
    dscp = marks.replace("class web rate 1mbit {", "class web rate 1mbit set dscp ef {")
    dscp = dscp.replace("dport 80\n", "dport 80\n        match tcp-ack pref 5\n")
    write(here / "dscp.tcp", dscp)
    result = run("check", "--kernel", "config-xt", "dscp.tcp")
    assert "no DSCP rewriting (iptables' DSCP target, or nftables)" in result.stderr
    assert "no u32 classifier (CONFIG_NET_CLS_U32 not set)" in result.stderr
    write(here / "config-dscp", xt + "CONFIG_NETFILTER_XT_TARGET_DSCP=m\nCONFIG_NET_CLS_U32=m\n")
    assert run("check", "--kernel", "config-dscp", "dscp.tcp").exit_code == 0


def test_fq_codel_needs_3_5(here: Path) -> None:
    write(here / "f.tcp", FQ_CODEL)
    old = run("check", "--kernel", "3.4", "f.tcp")
    assert old.exit_code == 1
    assert "the target kernel 3.4 has no fq_codel qdisc (added in Linux 3.5)" in old.stderr
    assert run("check", "--kernel", "3.5", "f.tcp").exit_code == 0


@pytest.mark.parametrize("kernel", ["banana", "2.4.20", "no-such-config"])
def test_bad_kernel_is_a_usage_error(here: Path, kernel: str) -> None:
    write(here / "f.tcp", FQ_CODEL)
    write(here / "notconfig", "hello\n")
    assert run("check", "--kernel", kernel, "f.tcp").exit_code == 2
    assert run("check", "--kernel", "notconfig", "f.tcp").exit_code == 2


def test_cbq_without_a_target_warns(here: Path) -> None:
    write(here / "c.tcp", CBQ)
    result = run("check", "c.tcp")
    assert result.exit_code == 0
    assert "warning: cbq was removed from Linux in 6.3 (and from Debian's 6.1 kernels in " in (
        result.stderr
    )
    assert "[W306]" in result.stderr
    assert run("check", "--werror", "c.tcp").exit_code == 1
    # the seed disables W306 with a comment: it is cbq on purpose
    assert run("check", "--werror", str(CBQ_SEED)).exit_code == 0


def test_versions() -> None:
    assert parse_version("6.1") == (6, 1, 0)
    assert parse_version("6.1.82") == (6, 1, 82)
    assert parse_version("6.1.0-18-amd64") == (6, 1, 0)
    assert parse_version("six") is None
    assert load_target("6.8").version == (6, 8, 0)
    with pytest.raises(ValueError, match="neither a kernel version"):
        load_target("/no/such/config")


def test_byte_units_warn_once_per_file(here: Path) -> None:
    # The HTB user guide writes kbps throughout: one W302 per file, the other uses as notes.
    write(here / "rates.tcp", "const A = 30kbps\nconst B = 70kbps\nconst LINK = 100kbps\n")
    write(
        here / "main.tcp",
        'include "rates.tcp"\n'
        "interface eth0 htb rate LINK default b {\n"
        "    class a rate A ceil 100kbps match dport 80\n"
        "    class b rate B ceil LINK\n"
        "}\n",
    )
    result = run("check", "--format", "json", "main.tcp")
    assert result.exit_code == 0
    found = [d for d in json.loads(result.stderr) if d["code"] == "W302"]
    assert [(d["span"]["file"], d["span"]["line"], len(d["notes"])) for d in found] == [
        ("main.tcp", 3, 0),
        ("rates.tcp", 1, 2),
    ]
    assert "this file uses byte units 3 times" in found[1]["message"]


def test_an_include_shared_by_checked_policies_is_reported_once(here: Path) -> None:
    """Twenty policies in one directory include the same broken file: its errors once, and
    every policy still fails."""
    write(here / "inc" / "bad.inc", "const X = 1mbit\nconst Y = 2mbit ciel\n")
    for i in range(20):
        write(here / "inc" / f"p{i}.tcp", 'include "bad.inc"\ninterface eth0 pfifo limit 10\n')
    result = run("check", "inc")
    assert result.exit_code == 1
    assert result.stderr.count("error:") == 1 and "tcdsl: 1 error" in result.stderr


OVER = "interface eth0 htb rate 10mbit default a {\n    class a rate 20mbit\n}\n"
"""A policy with one warning (W350): its class is guaranteed more than the link."""


def test_check_and_compile_read_a_policy_from_standard_input() -> None:
    """Found by a tester: 'check -' said there was no file '-' (fmt reads stdin); now check
    and compile read it, named <stdin> in their diagnostics."""
    checked = CliRunner().invoke(cli, ["check", "-"], input=OVER)
    assert checked.exit_code == 0, checked.output
    assert "<stdin>:2:11: warning: children of the interface's link class" in checked.output
    compiled = CliRunner().invoke(cli, ["compile", "-"], input=OVER.replace("20mbit", "2mbit"))
    assert compiled.exit_code == 0 and "htb rate 2mbit" in compiled.output, compiled.output
    bad = CliRunner().invoke(cli, ["check", "-"], input="interface eth0 htb rate 10 {\n")
    assert bad.exit_code == 1 and "<stdin>:1:" in bad.output, bad.output


def test_the_teaching_commands_and_import_read_standard_input_too() -> None:
    """Found by a tester: '-' was standard input for check, compile and fmt, and a file
    named '-' for explain, classify, simulate and 'import --from' (E006, E605)."""
    policy = OVER.replace("20mbit", "2mbit")
    explained = CliRunner().invoke(cli, ["explain", "-"], input=policy)
    assert explained.exit_code == 0 and "What <stdin> does" in explained.output, explained.output
    said = CliRunner().invoke(cli, ["classify", "-", "--packet", "tcp dport 22"], input=policy)
    assert said.exit_code == 0 and "-> class 'a' (1:" in said.output, said.output
    flows = ["simulate", "-", "--flow", "tcp dport 80 rate 5mbit", "--duration", "1s"]
    simulated = CliRunner().invoke(cli, flows, input=policy)
    assert simulated.exit_code == 0 and "E006" not in simulated.output, simulated.output
    saved = (Path(__file__).parent / "import_data" / "inner-class.txt").read_text()
    imported = CliRunner().invoke(cli, ["import", "-i", "a0", "--from", "-"], input=saved)
    assert imported.exit_code == 0 and "from the tc state of a0 (<stdin>)" in imported.stdout


def test_a_file_named_twice_is_checked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: 'check x.tcp ./x.tcp' (or a file and its directory) reported each
    finding twice, and counted it twice."""
    (tmp_path / "many").mkdir()
    (tmp_path / "many" / "x.tcp").write_text(OVER, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    got = run("check", "many/x.tcp", "./many/x.tcp", "many")
    assert got.exit_code == 0, got.output
    assert got.output.count("[W350]") == 1 and "tcdsl: 1 warning" in got.output, got.output
