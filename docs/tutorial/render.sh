#!/usr/bin/env bash
# Regenerate every generated part of the tutorial (docs/tutorial/): the policies, explain and
# classify outputs and simulation tables embedded in the chapters between their markers, the
# class-tree diagrams (img/*.svg), the predicted plots (img/*-predicted.png) and, when this
# host can (root, and `tcdsl measure` exists), the measured plots (img/*-measured.png).
#
# Run from the repository root:  docs/tutorial/render.sh
# It uses tcdsl from $TCDSL, else .venv/bin/tcdsl, else the tcdsl on PATH. Everything but the
# measurements is deterministic: running it twice changes nothing.
set -euo pipefail

cd "$(dirname "$0")/../.."

if [[ -n "${TCDSL:-}" ]]; then
    tcdsl="$TCDSL"
elif [[ -x .venv/bin/tcdsl ]]; then
    tcdsl="$PWD/.venv/bin/tcdsl"
else
    tcdsl="$(command -v tcdsl || true)"
fi
if [[ -z "$tcdsl" ]]; then
    echo "render.sh: tcdsl not found (make dev, or set TCDSL)" >&2
    exit 1
fi
# The Python that runs tcdsl runs the embedding helper too.
python="$(dirname "$tcdsl")/python"
if [[ ! -x "$python" ]]; then
    python="$(command -v python3)"
fi
if ! command -v dot >/dev/null; then
    echo "render.sh: graphviz's dot not found (apt-get install graphviz)" >&2
    exit 1
fi

measure=()
if ! "$tcdsl" measure --help >/dev/null 2>&1; then
    echo "render.sh: this tcdsl has no 'measure' command: measured plots left as they are" >&2
elif [[ "$(id -u)" -ne 0 ]]; then
    echo "render.sh: not root: measured plots left as they are (run as root to measure)" >&2
else
    measure=(--measure)
fi

mkdir -p docs/tutorial/img
"$python" docs/tutorial/embed.py --tcdsl "$tcdsl" "${measure[@]}"
echo "render.sh: done; review with: git diff --stat -- docs/tutorial" >&2
