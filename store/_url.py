"""Where the database lives: the default location, the `PEAGLE_DB` override, and URL display."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.exceptions import DatabaseUnavailableError

#: Environment variable that overrides the default database: a SQLAlchemy URL or a plain file path.
DB_ENV_VAR = "PEAGLE_DB"
#: File name of the default SQLite database inside the user data directory.
DEFAULT_DB_FILENAME = "peagle.db"
APP_NAME = "peagle-tune"


def normalize_db_url(url_or_path: str) -> str:
    """Turn a SQLAlchemy URL or a plain file path into a URL string.

    A string containing ``://`` is a URL and is returned unchanged; anything else is a SQLite file path, made
    absolute (``~`` expanded) and returned as ``sqlite:///<abs path>``.
    """
    text = url_or_path.strip()
    if not text:
        raise DatabaseUnavailableError(
            "The database URL is empty. Pass a SQLAlchemy URL (sqlite:////abs/path/peagle.db, "
            f"postgresql+psycopg://user:pass@host/db) or a file path, or unset {DB_ENV_VAR} to use the default."
        )
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    return f"sqlite:///{path}"


def default_db_url() -> str:
    """The database peagle-tune uses when none is given.

    `PEAGLE_DB` if set (a URL, or a plain file path turned into ``sqlite:///<abs path>``); otherwise the SQLite file
    ``peagle.db`` in ``platformdirs.user_data_dir("peagle-tune")``, whose directory is created if missing.
    """
    override = os.environ.get(DB_ENV_VAR)
    if override is not None and override.strip():
        return normalize_db_url(override)
    data_dir = Path(platformdirs.user_data_dir(APP_NAME))
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / DEFAULT_DB_FILENAME}"


def parse_db_url(url: str) -> URL:
    """Parse a URL string, raising `DatabaseUnavailableError` with the accepted forms when it is malformed."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise DatabaseUnavailableError(
            f"Cannot parse the database URL {mask_password(url)!r}: {exc}. Use a SQLAlchemy URL such as "
            "sqlite:////abs/path/peagle.db or postgresql+psycopg://user:password@host:5432/dbname, or a plain file "
            "path."
        ) from exc


def mask_password(url: str | URL) -> str:
    """The URL as text with its password replaced by ``***`` (for messages and logs)."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        # Unparseable: hide everything between "://" and "@", where a password would be.
        text = str(url)
        scheme, sep, rest = text.partition("://")
        if sep and "@" in rest:
            return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return text
    return parsed.render_as_string(hide_password=True)


def is_sqlite_memory(url: URL) -> bool:
    """True for SQLite databases that live in memory (``sqlite://``, ``:memory:``, ``mode=memory`` URIs)."""
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database or url.query.get("mode") == "memory"
