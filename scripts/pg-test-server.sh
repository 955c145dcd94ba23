#!/usr/bin/env bash
# Start (or reuse) a throwaway PostgreSQL server on 127.0.0.1:54329 for the store/search tests and print its URL.
# Uses Debian's postgresql binaries; exits non-zero (printing nothing) when they are not installed.
set -euo pipefail
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[[ -n "$BIN" && -x "$BIN/initdb" ]] || exit 1
DATA="${PEAGLE_PG_DATA:-/tmp/peagle-pg}"
PORT=54329
URL="postgresql://peagle@127.0.0.1:${PORT}/peagle"
RUN_AS=()
if [[ "$(id -u)" == "0" ]]; then RUN_AS=(runuser -u postgres --); fi
if ! "${RUN_AS[@]}" "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  if [[ ! -f "$DATA/PG_VERSION" ]]; then
    mkdir -p "$DATA"; [[ "$(id -u)" == "0" ]] && chown postgres:postgres "$DATA"
    "${RUN_AS[@]}" "$BIN/initdb" -D "$DATA" -U peagle --auth=trust >/dev/null
  fi
  "${RUN_AS[@]}" "$BIN/pg_ctl" -D "$DATA" -o "-p $PORT -k /tmp -c listen_addresses=127.0.0.1" -l "$DATA/log" -w start >/dev/null
  "${RUN_AS[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U peagle peagle 2>/dev/null || true
fi
echo "$URL"
