#!/usr/bin/env bash
# Lint, format and type checks: ./scripts/lint.sh
# ruff (lint and format, configured in pyproject.toml) over the whole tree,
# mypy (with the zope.interface plugin) over the package, the test launchers
# (gorge_testing/) and the twistd plugins, and import-linter's layer contract
# ([tool.importlinter]). Any finding fails. Expects the [test] extra in the venv;
# ./scripts/test.sh installs it and runs this before the suite.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GORGE_VENV:-$ROOT/.venv}"
cd "$ROOT"

"$VENV/bin/ruff" check --no-cache .
"$VENV/bin/ruff" format --check --no-cache .
"$VENV/bin/mypy" --no-incremental
"$VENV/bin/lint-imports" --no-cache
