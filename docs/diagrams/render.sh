#!/bin/sh
# Render the class tree of every example policy to docs/diagrams/<name>.svg.
# Run from anywhere after `make dev`; needs graphviz (`apt-get install graphviz`).
# policies/seeds/x.tcp becomes seeds--x.svg, as in tests/golden.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tcdsl=${TCDSL:-.venv/bin/tcdsl}
command -v dot >/dev/null 2>&1 || { echo "render.sh: graphviz 'dot' is not installed" >&2; exit 1; }
find policies -name '*.tcp' | LC_ALL=C sort | while IFS= read -r policy; do
    name=$(printf '%s\n' "${policy#policies/}" | sed -e 's/\.tcp$//' -e 's#/#--#g')
    "$tcdsl" compile -b dot "$policy" | dot -Tsvg > "docs/diagrams/$name.svg"
    echo "docs/diagrams/$name.svg"
done
