#!/usr/bin/env bash
# The test command: ./scripts/test.sh [pytest arguments]
# Installs what is missing (see install-deps.sh), runs the lint, format and
# type checks (scripts/lint.sh; any finding fails the run), then runs the
# suite with pytest. Given pytest arguments (a subset of the suite), it skips
# the checks unless GORGE_LINT=1. MariaDB and Redis are started by the test fixtures themselves, on
# random loopback ports, and stopped at the end. With GORGE_PHORGE_ROOT set to
# a Phorge checkout (arcanist/ beside it), the real-Phorge tests in
# tests/phorge run too, and PHP is installed first if it is missing; without
# it they are skipped. Exits with pytest's status;
# "no tests collected" (5) counts as a failure like any other non-zero status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GORGE_VENV:-$ROOT/.venv}"

bash "$ROOT/scripts/install-deps.sh" --test

cd "$ROOT"
if [ "$#" -eq 0 ] || [ "${GORGE_LINT:-}" = 1 ]; then
    GORGE_VENV="$VENV" bash "$ROOT/scripts/lint.sh"
fi
status=0
"$VENV/bin/python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
exit "$status"
