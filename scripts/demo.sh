#!/usr/bin/env bash
# Run `gorge demo`: the four services on SQLite in one process, with a webhook
# receiver and an SMTP sink, until every seeded item reached its final state.
#
#   ./scripts/demo.sh             # the demo, exit 0 when everything settled
#   ./scripts/demo.sh --serve     # then keep the services running (Ctrl-C stops)
#
# On a fresh Debian machine (as root) the first run installs what is missing
# through `scripts/install-deps.sh --demo`: a Python venv with gorge installed,
# nothing else (the demo runs on SQLite and starts no database server).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GORGE_VENV:-$ROOT/.venv}"

ready() {
    [ -x "$VENV/bin/gorge" ] && (cd / && "$VENV/bin/python" -c 'import gorge.demo') >/dev/null 2>&1
}

if ! ready; then
    if [ -x "$ROOT/scripts/install-deps.sh" ] || [ -f "$ROOT/scripts/install-deps.sh" ]; then
        bash "$ROOT/scripts/install-deps.sh" --demo
    else
        echo "demo: $VENV is not set up and scripts/install-deps.sh is missing" >&2
        exit 1
    fi
fi

exec "$VENV/bin/gorge" demo "$@"
