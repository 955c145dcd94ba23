#!/usr/bin/env bash
# Run every check CI runs: ruff, mypy and the test suite (real vLLM on CPU included when installed).
# The tests that start no engine run in parallel (pytest-xdist, PEAGLE_TEST_WORKERS workers, default one per core);
# then the engine tests (marker `vllm`) run in one process, one at a time: each uses every core, and they share the
# engines they only read from (tests/_engines.py). The run ends with the number of engine launches.
#   scripts/test.sh --quick   the edit loop: no engine and nothing marked `slow` (a few minutes less than all).
# Other arguments go to pytest. Sets the project up first if ./.venv is missing. PostgreSQL contract tests run when
# PEAGLE_TEST_POSTGRES_URL is set, or when a local PostgreSQL server can be started (scripts/pg-test-server.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ "${1:-}" == "--quick" ]]; then quick=1; shift; fi
[[ -x .venv/bin/peagle-tune ]] || bash scripts/setup.sh
if [[ -z "${PEAGLE_TEST_POSTGRES_URL:-}" ]] && url="$(bash scripts/pg-test-server.sh 2>/dev/null)"; then
  export PEAGLE_TEST_POSTGRES_URL="$url"
fi
.venv/bin/ruff check .
.venv/bin/mypy
parallel=(-n "${PEAGLE_TEST_WORKERS:-auto}" --dist loadgroup)
if ! .venv/bin/python -c "import xdist" 2>/dev/null; then
  echo "pytest-xdist is not installed (bash scripts/setup.sh installs it): the tests run in one process" >&2
  parallel=()
fi
if ((quick)); then
  exec .venv/bin/pytest -q "${parallel[@]}" -m "not vllm and not slow" "$@"
fi
# Exit status 5 is "no test selected" (e.g. a file given without engine tests): not a failure.
status=0
.venv/bin/pytest -q "${parallel[@]}" -m "not vllm" "$@" || { rc=$?; ((rc == 5)) || status=$rc; }
# Without arguments, only the files that hold engine tests are collected again.
engine_args=("$@")
((${#engine_args[@]})) || mapfile -t engine_args < <(grep -l "pytest.mark.vllm" tests/test_*.py)
.venv/bin/pytest -q -m vllm "${engine_args[@]}" || { rc=$?; ((rc == 5)) || status=$rc; }
exit "$status"
