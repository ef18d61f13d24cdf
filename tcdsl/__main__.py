"""The console script and ``python -m tcdsl``: :func:`tcdsl.cli.entry`, with a Ctrl-C while
the CLI's modules load (a fifth of a second) ending as one during a run does: a line saying
so and exit status 130, not a traceback."""

from __future__ import annotations

import sys


def entry() -> None:
    """Load the CLI and run it (the console script ``tcdsl``)."""
    try:
        from tcdsl.cli import entry as run
    except KeyboardInterrupt:
        sys.stderr.write("tcdsl: interrupted\n")
        sys.stderr.flush()
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    entry()
