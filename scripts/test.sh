#!/usr/bin/env bash
# The test command: ./scripts/test.sh [pytest arguments]
# Installs what is missing (see install-deps.sh), runs the lint, format and
# type checks (scripts/lint.sh; any finding fails the run), then runs the
# suite with pytest. Given pytest arguments (a subset of the suite), it skips
# the checks unless GORGE_LINT=1. MariaDB and Redis are started by the test
# fixtures themselves, on random loopback ports, and stopped at the end.
#
# The real-Phorge tests (tests/phorge) run on GORGE_PHORGE_ROOT (a Phorge
# checkout with arcanist/ beside it) when it is set, else on the pinned
# checkout in the per-user cache; when the cache has none, this script makes
# it with scripts/phorge-checkout.sh (GORGE_PHORGE_FETCH=0 turns that off).
# With a checkout, PHP is installed first if it is missing; without one the
# run says so in one line and those tests are skipped. Exits with pytest's status;
# "no tests collected" (5) counts as a failure like any other non-zero status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GORGE_VENV:-$ROOT/.venv}"

if [ -z "${GORGE_PHORGE_ROOT:-}" ] && ! bash "$ROOT/scripts/phorge-checkout.sh" --print-path >/dev/null; then
    if [ "${GORGE_PHORGE_FETCH:-1}" = 0 ] ||
        ! timeout 600 bash "$ROOT/scripts/phorge-checkout.sh" --quiet >/dev/null 2>&1; then
        echo "test.sh: no Phorge checkout, the real-Phorge tests will be skipped;" \
            "make one with scripts/phorge-checkout.sh --phorge GIT --arcanist GIT" >&2
    fi
fi

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
