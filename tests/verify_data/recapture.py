"""Capture a policy's kernel state again, for the tests that compare captures with policies.

Usage (as root, from the repository root)::

    python tests/verify_data/recapture.py tests/verify_data/dual-stack-flower.tcp uml
    python tests/verify_data/recapture.py tests/verify_data/dual-stack-u32.tcp host

writes ``tests/verify_data/<name>.<kernel>.out`` (for a policy anywhere): what ``tcdsl
verify`` reads from the kernel after applying the policy's shell script there. Run it when
the compiler's output for the policy changes on purpose, and review the diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tcdsl.verify import runner, verifier


def main() -> int:
    path, kernel = sys.argv[1], sys.argv[2]
    plan = verifier._plan(path, "shell", "", "")
    if plan.case is None:
        print(f"{path} does not compile", file=sys.stderr)
        return 1
    run = runner.run_on_uml if kernel == "uml" else runner.run_on_host
    (result,) = run([plan.case])
    if result is None:
        print("the kernel ran nothing", file=sys.stderr)
        return 1
    out = Path(__file__).parent / f"{Path(path).stem}.{kernel}.out"
    out.write_text(result.stdout, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
