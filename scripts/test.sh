#!/usr/bin/env bash
# Run every check CI runs: ruff, mypy and the test suite (real vLLM on CPU included when installed).
# The tests that start no engine run in parallel (pytest-xdist, PEAGLE_TEST_WORKERS workers, default one per core);
# then the engine tests (marker `vllm`) run in one process, one at a time: each uses every core, and they share the
# engines they only read from (tests/_engines.py); the PostgreSQL tests (marker `postgres`) run there too, as they
# drop and create tables of one server database. The run ends with the number of engine launches.
#   scripts/test.sh --quick   the edit loop: in parallel, no engine, no PostgreSQL and nothing marked `slow`.
# Other arguments go to pytest. Sets the project up first if ./.venv is missing. PostgreSQL contract tests run when
# PEAGLE_TEST_POSTGRES_URL is set, or when a local PostgreSQL server can be started (scripts/pg-test-server.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == "--quick" ]]; then quick=1; shift; fi
[[ -x .venv/bin/peagle-tune ]] || bash scripts/setup.sh
if ((!quick)) && [[ -z "${PEAGLE_TEST_POSTGRES_URL:-}" ]] && url="$(bash scripts/pg-test-server.sh 2>/dev/null)"; then
  export PEAGLE_TEST_POSTGRES_URL="$url"
fi
.venv/bin/ruff check .
.venv/bin/mypy
parallel=(-n "${PEAGLE_TEST_WORKERS:-auto}")
if ! .venv/bin/python -c "import xdist" 2>/dev/null; then
  echo "pytest-xdist is not installed (bash scripts/setup.sh installs it): the tests run in one process" >&2
  parallel=()
fi
if ((quick)); then
  exec .venv/bin/pytest -q "${parallel[@]}" -m "not vllm and not postgres and not slow" "$@"
fi
# Exit status 5 is "no test selected" (e.g. a file given without engine tests): not a failure.
status=0
.venv/bin/pytest -q "${parallel[@]}" -m "not vllm and not postgres" "$@" || { rc=$?; ((rc == 5)) || status=$rc; }
# Without arguments, only the files that hold such tests are collected again.
serial_args=("$@")
((${#serial_args[@]})) || mapfile -t serial_args < <(grep -lE "pytest\.mark\.(vllm|postgres)" tests/test_*.py)
.venv/bin/pytest -q -m "vllm or postgres" "${serial_args[@]}" || { rc=$?; ((rc == 5)) || status=$rc; }
exit "$status"
