"""Engine creation: SQLite pragmas (WAL, busy timeout, foreign keys), read-only files, in-memory sharing, drivers.

SQLite files are always opened through a ``file:`` URI we build (SQLAlchemy's `creator`), so the URL's SQLite
options (``?mode=ro``, ``?immutable=1``) are honoured instead of being dropped with a warning, and a file this user
cannot write (permissions, a read-only filesystem, a full disk) is opened read-only: `show`, `export` and `report`
can read it.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.pool import StaticPool

from store._bad_rows import tolerant_json_loads
from store._url import MAX_LOCK_TIMEOUT_S, SqliteFile, is_sqlite_memory, mask_password, parse_db_url, sqlite_file
from store.exceptions import DatabaseUnavailableError

#: Bytes a reader of a WAL database writes: SQLite maps its ``-shm`` index in 32 KiB regions (``WALINDEX_PGSZ`` in
#: sqlite3.c) and writes each page of a new one, so with less free space than this opening fails ("disk I/O error").
SHM_REGION_BYTES = 32 * 1024

#: How long a SQLite connection waits for another process's write lock before failing, in ms (``?timeout=`` in the
#: URL or `Store(lock_timeout_s=...)` change it).
SQLITE_BUSY_TIMEOUT_MS = 30_000

_DRIVER_INSTALL_HINTS = {
    "postgresql": "pip install 'peagle-tune[postgres]'  (psycopg 3, for postgresql:// and postgresql+psycopg:// URLs)",
    "mysql": "pip install pymysql  (and use a mysql+pymysql:// URL)",
}


@dataclass(frozen=True)
class Access:
    """What an engine reaches: an in-memory database, a read-only file (and why), how long it waits for locks."""

    in_memory: bool
    read_only: str | None
    """Why the database is read-only ("the URL asks for it with ?mode=ro", ...), or None if it is writable."""
    lock_timeout_ms: int
    file: SqliteFile | None
    """The SQLite file, or None for in-memory SQLite and server databases."""


def create_store_engine(url: str, *, lock_timeout_s: float | None = None) -> Engine:
    """A SQLAlchemy engine for `url` (see `open_engine`)."""
    return open_engine(url, lock_timeout_s=lock_timeout_s)[0]


def open_engine(url: str, *, lock_timeout_s: float | None = None) -> tuple[Engine, Access]:
    """A SQLAlchemy engine for `url` and what it reaches.

    SQLite files get WAL (unless read-only), a busy timeout (`lock_timeout_s`, else the URL's ``?timeout=``, else
    `SQLITE_BUSY_TIMEOUT_MS`) and foreign keys. An in-memory SQLite URL (``sqlite://``) uses one shared connection
    (StaticPool), so every session sees the same database for the life of the engine.
    """
    parsed = parse_db_url(url)
    backend = parsed.get_backend_name()
    memory = is_sqlite_memory(parsed)
    file = sqlite_file(parsed)
    timeout_s = _lock_timeout_s(lock_timeout_s, file)
    read_only: str | None = None
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False}
        if memory:
            kwargs["poolclass"] = StaticPool
    else:
        # Fleets share a server; drop connections the server closed while we were idle.
        kwargs["pool_pre_ping"] = True
    if file is not None:
        read_only, extra = _read_only(file)
        uri = file.uri(**extra)
        kwargs = {"creator": lambda: sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=timeout_s)}
        # The query went into the URI; without it SQLAlchemy neither warns about nor re-reads the options.
        parsed = parsed.set(database=str(file.path), query={})
    # One row's unparseable JSON is that row's problem (reported and skipped by listings), not the whole query's.
    kwargs["json_deserializer"] = tolerant_json_loads
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        hint = _DRIVER_INSTALL_HINTS.get(backend, f"install the DB-API driver for {parsed.drivername}")
        raise DatabaseUnavailableError(
            f"Cannot open {mask_password(parsed)}: the database driver for {parsed.drivername!r} is not available "
            f"({exc}). Install it: {hint}."
        ) from exc
    timeout_ms = round(timeout_s * 1000)
    if backend == "sqlite":
        _install_sqlite_pragmas(engine, file_db=not memory, read_only=read_only is not None, timeout_ms=timeout_ms)
    return engine, Access(in_memory=memory, read_only=read_only, lock_timeout_ms=timeout_ms, file=file)


def _lock_timeout_s(given: float | None, file: SqliteFile | None) -> float:
    if given is None:
        given = file.timeout_s if file is not None and file.timeout_s is not None else SQLITE_BUSY_TIMEOUT_MS / 1000
    if isinstance(given, bool) or not isinstance(given, int | float) or not math.isfinite(given):
        raise DatabaseUnavailableError(f"lock_timeout_s must be a number of seconds, but got {given!r:.40}.")
    if not 0 <= given <= MAX_LOCK_TIMEOUT_S:
        raise DatabaseUnavailableError(f"lock_timeout_s must be from 0 to {MAX_LOCK_TIMEOUT_S:g} s, but got {given}.")
    return float(given)


def _read_only(file: SqliteFile) -> tuple[str | None, dict[str, str]]:
    """(why the file must be opened read-only or None, extra SQLite URI parameters to open it so).

    A file this user cannot write is opened with ``mode=ro``. On a read-only filesystem SQLite cannot create the
    ``-shm`` file a WAL database needs even to read, so it is opened ``immutable=1`` too: nothing can change it
    there. The same on a disk too full for that file (`SHM_REGION_BYTES`) when no other connection made one. (If a
    non-empty ``-wal`` file lies beside it, immutable would ignore the commits in it: ``mode=ro`` only.)
    """
    requested = file.read_only_requested
    if requested is not None:
        return requested, {}
    path = file.path
    if not path.exists():
        return None, {}
    wal = path.with_name(path.name + "-wal")
    ro = {"mode": "ro"} if wal.exists() and wal.stat().st_size > 0 else {"mode": "ro", "immutable": "1"}
    if os.access(path, os.W_OK):
        if free_bytes(path) < SHM_REGION_BYTES and not path.with_name(path.name + "-shm").exists():
            return "its disk is full", ro
        return None, {}
    if _on_read_only_filesystem(path):
        return "it is on a read-only filesystem", ro
    return "this user cannot write the file", {"mode": "ro"}


def free_bytes(path: Path) -> int:
    """Bytes this user may still write on the filesystem holding `path` (a large number when unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _on_read_only_filesystem(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _install_sqlite_pragmas(engine: Engine, *, file_db: bool, read_only: bool, timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if file_db:
                cursor.execute(f"PRAGMA busy_timeout={timeout_ms}")
                if not read_only:
                    # WAL lets Optuna workers and `peagle-tune show` read while a search writes.
                    _enable_wal(cursor, timeout_ms)
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()


def _enable_wal(cursor: Any, timeout_ms: int) -> None:
    """Switch the file to WAL (persistent in the file), retrying while other processes hold it.

    SQLite answers "database is locked" at once, without its busy handler, when another connection holds the file
    during the switch (several workers opening a new database together), so retry for up to the busy timeout.
    """
    if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + timeout_ms / 1000
    delay_s = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay_s > deadline:
                raise
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.5)
