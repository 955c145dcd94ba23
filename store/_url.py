"""Where the database lives: the default location, the `PEAGLE_DB` override, and URL display."""

from __future__ import annotations

import math
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

import platformdirs
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.exceptions import DatabaseUnavailableError

#: Environment variable that overrides the default database: a SQLAlchemy URL or a plain file path.
DB_ENV_VAR = "PEAGLE_DB"
#: File name of the default SQLite database inside the user data directory.
DEFAULT_DB_FILENAME = "peagle.db"
APP_NAME = "peagle-tune"
#: Longest wait for another writer's lock a URL may ask for (``?timeout=``), in seconds: one hour.
MAX_LOCK_TIMEOUT_S = 3600.0


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
    if ":" in text.split("/", 1)[0] and not Path(text).expanduser().exists():
        # "postgresql:/host/db", "sqlite:peagle.db", "::::": a mistyped URL, not a file name to create.
        raise DatabaseUnavailableError(
            f"Cannot parse the database URL {mask_password(text)!r:.120}: it has a ':' but no '://'. Use a SQLAlchemy "
            "URL such as sqlite:////abs/path/peagle.db or postgresql+psycopg://user:password@host:5432/dbname, or a "
            "file path (write ./NAME for a file whose name has a ':')."
        )
    return f"sqlite:///{_resolved(text)}"


def _resolved(text: str) -> Path:
    """`text` as an absolute path, links followed; a link loop is `DatabaseUnavailableError` naming it."""
    try:
        return Path(text).expanduser().resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError("Symlink loop from ...")
        raise DatabaseUnavailableError(
            f"The database path {text!r:.200} cannot be followed ({exc}): a symbolic link on it leads back to "
            f"itself. Give a database file with --db or {DB_ENV_VAR}."
        ) from None


_FILE_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket"}


def sqlite_path_problem(path: Path) -> str | None:
    """Why `path` cannot be a SQLite database file, naming the real cause, or None when it is (or can be made) one.

    Examples: "/data is a directory, not a database file: ..."; "The folder /data/new of the database
    /data/new/peagle.db does not exist: create it (mkdir -p /data/new) or ...".
    """
    option = f"--db (or {DB_ENV_VAR})"
    try:
        mode: int | None = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        return f"Cannot reach the database {path} ({exc.strerror or exc}): give another file with {option}."
    if mode is not None and stat.S_ISDIR(mode):
        return f"{path} is a directory, not a database file: give a file, e.g. --db {path / 'peagle.db'} (or " \
               f"{DB_ENV_VAR})."
    if mode is not None:
        kind = _FILE_KINDS.get(stat.S_IFMT(mode))
        return None if kind is None else f"{path} is {kind}, not a database file: give a regular file with {option}."
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{blocker} is a file, not a folder, so the database {path} cannot be created under it: give " \
               f"another path with {option}."
    folder = path.parent
    if not folder.exists():
        return (f"The folder {folder} of the database {path} does not exist: create it (mkdir -p "
                f"{shlex.quote(str(folder))}) or give another file with {option}.")
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"This user cannot create files in {folder}, so the database {path} cannot be created there: give a " \
               f"file in a writable folder with {option}."
    return None


def default_db_url() -> str:
    """The database peagle-tune uses when none is given.

    `PEAGLE_DB` if set (a URL, or a plain file path turned into ``sqlite:///<abs path>``); otherwise the SQLite file
    ``peagle.db`` in ``platformdirs.user_data_dir("peagle-tune")``, whose directory is created if missing.
    """
    override = os.environ.get(DB_ENV_VAR)
    if override is not None and override.strip():
        return normalize_db_url(override)
    data_dir = Path(platformdirs.user_data_dir(APP_NAME))
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailableError(
            f"Cannot create {data_dir}, the folder of the default database ({exc.strerror or exc}). Choose a "
            f"database with --db or {DB_ENV_VAR} (a file path or a SQLAlchemy URL)."
        ) from exc
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


#: Query parameters whose values are secrets (``?password=``, libpq's ``sslpassword``, ``?token=``): matched
#: case-insensitively anywhere in the key, and shown as ``***`` like the password of the user part.
_SECRET_QUERY_KEY = re.compile(r"([?&;][^=&;#]*(?:pass|pwd|secret|token|auth|credential|key)[^=&;#]*=)[^&;#]*",
                               re.IGNORECASE)


def mask_password(url: str | URL) -> str:
    """The URL as text with its password replaced by ``***``, in the user part and in the query (``?password=``,
    ``?sslpassword=``, ``?token=``, ...), for messages and logs."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        # Unparseable: hide everything between "://" and "@", where a password would be.
        text = str(url)
        scheme, sep, rest = text.partition("://")
        if sep and "@" in rest:
            text = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return _SECRET_QUERY_KEY.sub(r"\1***", text)
    # SQLAlchemy hides only the user part's password; a password given as a query parameter is masked here.
    return _SECRET_QUERY_KEY.sub(r"\1***", parsed.render_as_string(hide_password=True))


def is_sqlite_memory(url: URL) -> bool:
    """True for SQLite databases that live in memory (``sqlite://``, ``:memory:``, ``mode=memory`` URIs)."""
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database or url.query.get("mode") == "memory"


#: Query keys of a ``sqlite:///`` URL that SQLite itself reads (https://sqlite.org/uri.html); we always open SQLite
#: files through a URI, so they work without SQLAlchemy's ``uri=true``.
SQLITE_URI_PARAMS = frozenset({"mode", "immutable", "cache", "nolock", "vfs", "psow"})
#: Further query keys we accept: ``uri`` (ignored: always on) and ``timeout`` (seconds to wait for a lock).
SQLITE_URL_KEYS = SQLITE_URI_PARAMS | {"uri", "timeout"}
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SqliteFile:
    """A SQLite database file named by a URL: its absolute path and the options its query string gives."""

    path: Path
    params: dict[str, str] = field(default_factory=dict)
    """SQLite URI parameters from the query (``mode``, ``immutable``, ...), in the order given."""
    timeout_s: float | None = None
    """``?timeout=`` in seconds: how long to wait for another writer's lock (None: the store's default)."""

    @property
    def read_only_requested(self) -> str | None:
        """Why the URL asks for read-only access (``?mode=ro``, ``?immutable=1``), or None."""
        if self.params.get("mode") == "ro":
            return "the URL asks for it with ?mode=ro"
        if self.params.get("immutable", "").lower() in _TRUE:
            return "the URL marks it immutable=1"
        return None

    def uri(self, **extra: str) -> str:
        """The ``file:`` URI SQLite opens: the path percent-encoded, then the URL's parameters and `extra`."""
        params = {**self.params, **extra}
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())
        return f"file:{quote(str(self.path))}" + (f"?{query}" if query else "")


def sqlite_file(url: URL) -> SqliteFile | None:
    """The SQLite file `url` names (None for other databases and in-memory SQLite).

    Accepts both ``sqlite:////abs/peagle.db?mode=ro`` and SQLAlchemy's ``sqlite:///file:/abs/peagle.db?mode=ro&uri=true``
    spelling. An unknown query key raises `DatabaseUnavailableError` rather than being ignored (SQLAlchemy ignores
    ``?mode=ro`` without ``uri=true``, so a read-only request would silently open the file for writing).
    """
    if url.get_backend_name() != "sqlite" or is_sqlite_memory(url):
        return None
    unknown = sorted(set(url.query) - SQLITE_URL_KEYS)
    if unknown:
        raise DatabaseUnavailableError(
            f"The SQLite URL {mask_password(url)} has unknown option(s) {unknown!r:.80}; SQLite URLs take "
            "mode=ro|rw|rwc, immutable=1, cache=shared|private, nolock=1, vfs=NAME, psow=0|1 and timeout=SECONDS."
        )
    params = {k: _single(url, k) for k in url.query if k in SQLITE_URI_PARAMS}
    mode = params.get("mode")
    if mode is not None and mode not in ("ro", "rw", "rwc"):
        hint = " (in-memory databases keep nothing: use a file)" if mode == "memory" else ""
        raise DatabaseUnavailableError(
            f"The SQLite URL {mask_password(url)} has mode={mode!r:.40}; use mode=ro (read only), rw or rwc{hint}."
        )
    timeout_s = None
    if "timeout" in url.query:
        text = _single(url, "timeout")
        try:
            timeout_s = float(text)
        except ValueError:
            timeout_s = math.nan
        if not (math.isfinite(timeout_s) and 0 <= timeout_s <= MAX_LOCK_TIMEOUT_S):
            raise DatabaseUnavailableError(
                f"The SQLite URL {mask_password(url)} has timeout={text!r:.40}; give the seconds to wait for a lock, "
                f"from 0 to {MAX_LOCK_TIMEOUT_S:g}."
            )
    database = url.database or ""
    if database.startswith("file:"):
        database = unquote(database.removeprefix("file:").split("?", 1)[0])
    return SqliteFile(_resolved(database), params, timeout_s)


def _single(url: URL, key: str) -> str:
    value = url.query[key]
    if isinstance(value, tuple):
        raise DatabaseUnavailableError(f"The database URL {mask_password(url)} gives {key!r} more than once.")
    return str(value)
