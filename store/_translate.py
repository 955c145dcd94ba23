"""SQLAlchemy errors in words: what failed, on which database (password masked), why, and the fix.

`Store` translates its own errors here (`translate`), and `database_error` does the same for another engine on a
database URL, e.g. Optuna's storage in `autotune.search`, so a lock, a damaged file or a full disk reads the same
whichever engine met it. Driver messages are cut to their first line and 300 characters.
"""

from __future__ import annotations

from sqlalchemy.engine import URL
from sqlalchemy.exc import DisconnectionError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError

from store._engine import SHM_REGION_BYTES, SQLITE_BUSY_TIMEOUT_MS, Access, free_bytes
from store._url import is_sqlite_memory, mask_password, normalize_db_url, parse_db_url, sqlite_file
from store.exceptions import (
    DatabaseCorruptError,
    DatabaseFullError,
    DatabaseLockedError,
    DatabaseUnavailableError,
    StoreError,
)

#: Where a store's database is chosen, named in the fixes.
DB_OPTION = "--db or PEAGLE_DB"

# Words in driver messages (psycopg, psycopg2, pymysql) that mean the connection itself failed.
_CONNECT_FAILURE_HINTS: tuple[str, ...] = (
    "connect",
    "could not translate host",
    "authentication",
    "password",
    "does not exist",
    "access denied",
    "timeout expired",
)
_FULL_HINTS = ("disk is full", "no space left", "disk full", "could not extend")
_READ_ONLY_FIXES = {
    "the URL asks for it with ?mode=ro": "drop ?mode=ro from the URL",
    "the URL marks it immutable=1": "drop ?immutable=1 from the URL",
    "it is on a read-only filesystem": "copy it to a writable disk",
    "its disk is full": "free space on that disk",
}


def database_error(exc: BaseException, url: str, *, option: str = "--storage") -> StoreError:
    """The `StoreError` for `exc`, an error an engine on `url` raised (SQLAlchemy's, or one chaining it as its
    ``__cause__``, like Optuna's ``StorageInternalError``). `option` is where the user chose `url`, for the fix.

    Example: ``raise StudyStorageError(str(database_error(exc, url))) from exc``.
    """
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, SQLAlchemyError):
        cause = cause.__cause__
    try:
        parsed = parse_db_url(normalize_db_url(url))
        file = sqlite_file(parsed)
    except StoreError as refused:
        return refused
    if cause is None:
        return StoreError(f"The database {mask_password(parsed)} failed: {_first_line(exc)}.")
    timeout_s = file.timeout_s if file is not None and file.timeout_s is not None else SQLITE_BUSY_TIMEOUT_MS / 1000
    access = Access(in_memory=is_sqlite_memory(parsed), read_only=None, lock_timeout_ms=round(timeout_s * 1000),
                    file=file)
    return translate(cause, parsed, access, option=option)


def read_only_message(parsed: URL, access: Access, what: str, *, option: str = DB_OPTION) -> str:
    """Why a write to a read-only database was refused, and how to store ("To store, drop ?mode=ro ...")."""
    fix = _READ_ONLY_FIXES.get(access.read_only or "", "make the file writable (chmod u+w)")
    return (
        f"{mask_password(parsed)} is open read-only ({access.read_only}), but {what}. To store, {fix}, or choose "
        f"another database with {option}."
    )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return " ".join(text.splitlines()[:1])[:300]


def translate(exc: SQLAlchemyError, parsed: URL, access: Access, *, option: str = DB_OPTION) -> StoreError:
    """The `StoreError` for a SQLAlchemy error met on the database `parsed` (reached as `access` says)."""
    masked = mask_password(parsed)
    detail = _first_line(exc)
    lowered = detail.lower()
    file = access.file
    if file is not None and "not a database" in lowered:
        return DatabaseUnavailableError(
            f"Cannot open {masked}: the file {file.path} is not a SQLite database ({detail}). "
            f"Choose another file with {option}."
        )
    if any(k in lowered for k in ("malformed", "corrupt")):
        where = file.path if file is not None else "it"
        recover = (
            f"or copy out what SQLite can still read (`sqlite3 {file.path} .recover | sqlite3 recovered.db`, then "
            "use recovered.db)"
            if file is not None
            else "or repair it with the database server's tools"
        )
        return DatabaseCorruptError(
            f"{masked} is damaged ({detail}): a page of {where} does not hold what SQLite expects. Nothing was "
            f"written. Restore it from a backup, {recover}, or start a new database with {option}."
        )
    if any(k in lowered for k in _FULL_HINTS):
        return DatabaseFullError(
            f"{masked}: the disk is full ({detail}). The write was rolled back, so nothing of it was stored and "
            f"what was stored before is intact. Free space on that disk, or move the database with {option}, and "
            "retry."
        )
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError):
        if "database is locked" in lowered or "database is busy" in lowered:
            longer = ", or wait longer with ?timeout=SECONDS in the URL" if file is not None else ""
            return DatabaseLockedError(
                f"{masked} is locked by another process writing to it: the database said \"{detail}\" after "
                f"peagle-tune waited {access.lock_timeout_ms / 1000:g} s for the lock. Wait for that process to "
                f"finish and retry, give this run its own database with {option}{longer}."
            )
        if "readonly" in lowered or "read-only" in lowered:
            if access.read_only is not None:
                return DatabaseUnavailableError(read_only_message(parsed, access, "this call writes to it",
                                                                  option=option))
            where = f"the file {file.path} and the folder {file.path.parent}" if file is not None else "the database"
            return DatabaseUnavailableError(
                f"Cannot write to {masked}: {detail}. Check that {where} are writable by this user, or choose "
                f"another database with {option}."
            )
        if file is not None and any(k in lowered for k in ("unable to open", "disk i/o")):
            if access.read_only is not None and not file.path.exists():
                return DatabaseUnavailableError(
                    f"Cannot open {masked}: the file {file.path} does not exist (it is opened read-only, because "
                    f"{access.read_only}, so it is not created). Check the path."
                )
            if file.path.parent.is_dir() and free_bytes(file.path.parent) < SHM_REGION_BYTES:
                return DatabaseFullError(
                    f"Cannot open {masked}: {detail}, because the disk holding {file.path.parent} is full. Free "
                    f"space on that disk, or choose a database on another disk with {option}."
                )
            return DatabaseUnavailableError(
                f"Cannot open the peagle-tune database {masked}: {detail}. Check that the folder "
                f"{file.path.parent} exists and is writable, or choose another file with {option}."
            )
        if file is None and not access.in_memory and any(k in lowered for k in _CONNECT_FAILURE_HINTS):
            return DatabaseUnavailableError(
                f"Cannot connect to the database {masked}: {detail}. Check that the database server is running and "
                "reachable and that the user, password, host and database name in the URL are right (set it with "
                f"{option})."
            )
        return DatabaseUnavailableError(
            f"The database {masked} failed: {detail}. If tables are missing, run `peagle-tune db upgrade --db "
            f"{masked}`; otherwise check that the database is reachable and retry."
        )
    if isinstance(exc, IntegrityError):
        return StoreError(f"The write to {masked} broke a database rule: {detail}.")
    return StoreError(f"Database error on {masked}: {detail}.")
