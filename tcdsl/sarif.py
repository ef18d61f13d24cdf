"""SARIF 2.1.0 output, so that code-scanning tools show diagnostics inline.

One run; the rules are the codes that appear (``tcdsl.codes``), each result points at its
code's rule, and a diagnostic's notes are its related locations. File names become URIs
relative to the current directory (with ``uriBaseId`` ``%SRCROOT%``) when the file is below
it, else absolute ``file://`` URIs. The output is sorted and has no time stamps, so the same
diagnostics always give the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from tcdsl import __version__
from tcdsl.codes import CODES, CodeInfo
from tcdsl.diagnostics import Diagnostic, Severity, Span, sort_key

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HOME = "https://github.com/tcdsl/tcdsl"
"""The project's home page. A placeholder until tcdsl is published: change it here."""
DOCS = f"{HOME}/blob/main/docs/diagnostics.md"

_LEVEL = {
    Severity.ERROR: "error",
    Severity.WARNING: "warning",
    Severity.INFO: "note",
    Severity.NOTE: "note",
}
_SECTION = {
    "E0": "e0xx-syntax-and-values",
    "E1": "e1xx-names",
    "E2": "e2xx-semantics",
    "W3": "w3xx-warnings",
    "I3": "i3xx-advice",
    "E4": "e4xx-kernel-verification",
    "W4": "e4xx-kernel-verification",
    "E5": "e5xx-backend-limits",
}


def help_uri(code: str) -> str:
    """Where docs/diagnostics.md explains ``code`` (its section of the tables)."""
    section = _SECTION.get(code[:2])
    return f"{DOCS}#{section}" if section else DOCS


def _rule(code: str, severity: Severity) -> dict[str, object]:
    info = CODES.get(code) or CodeInfo(severity, f"tcdsl diagnostic {code}")
    return {
        "id": code,
        "shortDescription": {"text": info.title},
        "fullDescription": {
            "text": f"{info.title} ({info.severity.value}); see docs/diagnostics.md for what it "
            "catches and how to fix it."
        },
        "helpUri": help_uri(code),
        "defaultConfiguration": {"level": _LEVEL[info.severity]},
    }


def artifact(file: str, cwd: str | None = None) -> dict[str, str]:
    """A SARIF artifactLocation for a file name as diagnostics give it."""
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    full = os.path.abspath(file)
    try:
        relative = os.path.relpath(full, here)
    except ValueError:  # another drive on Windows
        relative = os.pardir
    if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
        return {"uri": quote(Path(relative).as_posix()), "uriBaseId": "%SRCROOT%"}
    return {"uri": Path(full).as_uri()}


def _location(span: Span, cwd: str | None, message: str | None = None) -> dict[str, object]:
    loc: dict[str, object] = {
        "physicalLocation": {
            "artifactLocation": artifact(span.file, cwd),
            "region": {
                "startLine": span.line,
                "startColumn": span.column,
                "endLine": span.end_line,
                "endColumn": span.end_column,
            },
        }
    }
    if message is not None:
        loc["message"] = {"text": message}
    return loc


def render_sarif(diagnostics: Iterable[Diagnostic], cwd: str | None = None) -> str:
    """Render diagnostics as a SARIF 2.1.0 log (pretty-printed JSON, one run)."""
    ordered = sorted(diagnostics, key=lambda d: (*sort_key(d), d.message))
    severities = {d.code: d.severity for d in ordered}
    codes = sorted(severities)
    index = {code: i for i, code in enumerate(codes)}
    results = []
    for d in ordered:
        result: dict[str, object] = {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": _LEVEL[d.severity],
            "message": {"text": d.message},
            "locations": [_location(d.span, cwd)],
        }
        if d.notes:
            related = []
            for i, note in enumerate(d.notes):
                loc = _location(note.span, cwd, note.message)
                related.append({"id": i, **loc})
            result["relatedLocations"] = related
        results.append(result)
    here = Path(os.path.abspath(cwd if cwd is not None else os.getcwd())).as_uri()
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "tcdsl",
                        "version": __version__,
                        "informationUri": HOME,
                        "rules": [_rule(code, severities[code]) for code in codes],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": here.rstrip("/") + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"
