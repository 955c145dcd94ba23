#!/usr/bin/env bash
# Run every check CI runs: ruff, mypy and the test suite (real vLLM on CPU included when installed).
# Sets the project up first if ./.venv is missing. PostgreSQL contract tests run when
# PEAGLE_TEST_POSTGRES_URL is set, or when a local PostgreSQL server can be started (scripts/pg-test-server.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/peagle-tune ]] || bash scripts/setup.sh
if [[ -z "${PEAGLE_TEST_POSTGRES_URL:-}" ]] && url="$(bash scripts/pg-test-server.sh 2>/dev/null)"; then
  export PEAGLE_TEST_POSTGRES_URL="$url"
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest -q "$@"
