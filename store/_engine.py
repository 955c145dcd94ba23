"""Engine creation: SQLite pragmas (WAL, busy timeout, foreign keys), in-memory sharing, driver errors."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.pool import StaticPool

from store._url import is_sqlite_memory, mask_password, parse_db_url
from store.exceptions import DatabaseUnavailableError

#: How long a SQLite connection waits for another process's write lock before failing, in ms.
SQLITE_BUSY_TIMEOUT_MS = 30_000

_DRIVER_INSTALL_HINTS = {
    "postgresql": "pip install 'peagle-tune[postgres]'  (psycopg 3, for postgresql:// and postgresql+psycopg:// URLs)",
    "mysql": "pip install pymysql  (and use a mysql+pymysql:// URL)",
}


def create_store_engine(url: str) -> Engine:
    """A SQLAlchemy engine for `url`; SQLite gets WAL + busy_timeout (file DBs) and foreign keys (all).

    An in-memory SQLite URL (``sqlite://``) uses one shared connection (StaticPool), so every session sees the
    same database for the life of the engine.
    """
    parsed = parse_db_url(url)
    backend = parsed.get_backend_name()
    kwargs: dict[str, Any] = {}
    memory = is_sqlite_memory(parsed)
    if backend == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False}
        if memory:
            kwargs["poolclass"] = StaticPool
    else:
        # Fleets share a server; drop connections the server closed while we were idle.
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        hint = _DRIVER_INSTALL_HINTS.get(backend, f"install the DB-API driver for {parsed.drivername}")
        raise DatabaseUnavailableError(
            f"Cannot open {mask_password(parsed)}: the database driver for {parsed.drivername!r} is not available "
            f"({exc}). Install it: {hint}."
        ) from exc
    if backend == "sqlite":
        _install_sqlite_pragmas(engine, file_db=not memory)
    return engine


def _install_sqlite_pragmas(engine: Engine, *, file_db: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if file_db:
                cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
                # WAL lets Optuna workers and `peagle-tune show` read while a search writes.
                _enable_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent in the file), retrying while other processes hold it.

    SQLite answers "database is locked" at once, without its busy handler, when another connection holds the file
    during the switch (several workers opening a new database together), so retry for up to the busy timeout.
    """
    if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
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
