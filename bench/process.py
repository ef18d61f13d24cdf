"""tcdsl as the benchmarks run it in a process of its own: the command, from byte-compiled
modules.

Users run tcdsl from byte-compiled modules: ``pip install`` writes them, and Python writes
them on the first run of an editable install. A shell with ``PYTHONDONTWRITEBYTECODE`` set
(as some CI and container images have) would otherwise compile every module from source in
every process a benchmark times: about 0.2 s more for each ``tcdsl`` run. The variable stops
Python writing bytecode, not reading it, so writing it once (``cached``) is enough.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

import tcdsl

_SCRIPT = Path(sys.executable).with_name("tcdsl")
TCDSL = str(_SCRIPT) if _SCRIPT.exists() else "tcdsl"
"""The ``tcdsl`` command of the environment that runs the benchmark (else the one on PATH)."""


def cached() -> None:
    """Write the bytecode of tcdsl's modules where it is missing or stale."""
    compileall.compile_dir(str(Path(tcdsl.__file__).parent), quiet=1)
