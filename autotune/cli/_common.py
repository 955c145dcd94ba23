"""Shared pieces of the CLI: error translation, the --db option, opening the store, writing output files."""

from __future__ import annotations

import errno
import functools
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from autotune.errors import NotFoundError, PeagleError, UsageError

F = TypeVar("F", bound=Callable[..., Any])



class _Console(Console):
    """A rich console whose broken pipe (``peagle-tune show | head``) is a `BrokenPipeError` for the command group to
    end quietly (rich's own handling exits with status 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


console: Console = _Console()
err_console: Console = _Console(stderr=True)

#: Columns `--wide` output is drawn at (at least; a wider terminal gets its own width).
WIDE_COLUMNS = 160


def wide_console(stderr: bool = False) -> Console:
    """A console for ``--wide`` tables: at least `WIDE_COLUMNS` wide, in a terminal or piped."""
    base = err_console if stderr else console
    return _Console(stderr=stderr, width=max(base.width, WIDE_COLUMNS))


class UsageFailure(click.ClickException):
    """A usage error (bad model name, K out of range, ...): one line, exit code 2."""

    exit_code = 2


class NotFoundFailure(click.ClickException):
    """Nothing stored matches (no recommendation, study or profile by that id or name): one line, exit code 3."""

    exit_code = 3


#: Environment variable that shows tracebacks like ``--debug`` (for commands run without the group, e.g. in tests).
DEBUG_ENV = "PEAGLE_DEBUG"
#: Longest error line printed; longer messages keep their start and their end (the fix), cut in the middle.
MAX_MESSAGE_CHARS = 1000


def debug_enabled() -> bool:
    """Whether ``peagle-tune --debug`` (or ``PEAGLE_DEBUG=1``) asked for tracebacks instead of one-line errors."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().params.get("debug"):
        return True
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def one_line(message: str) -> str:
    """`message` on one line (whitespace collapsed), cut in the middle beyond `MAX_MESSAGE_CHARS`."""
    text = " ".join(message.split())
    if len(text) > MAX_MESSAGE_CHARS:
        head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 3
        text = f"{text[:head]} [... {len(text) - head - tail:,} characters cut ...] {text[-tail:]}"
    return text


def _os_message(exc: OSError) -> str:
    target = f" {exc.filename}" if exc.filename is not None else ""
    other = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    return f"Cannot use{target}{other}: {exc.strerror or exc}."


def errors(fn: F) -> F:
    """Translate every error into one click error line (exit 2 for usage errors, 1 otherwise), never a traceback.

    Library errors carry their own message; an OSError names the path; anything else is a bug, reported with its
    type and a request to rerun with ``--debug``, which shows the traceback instead (as does ``PEAGLE_DEBUG=1``).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from policies import PolicyError, PolicyFileError
        from store import NotFoundError as StoreNotFoundError
        from store import StoreError

        try:
            return fn(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit, BrokenPipeError):
            raise  # a reader that stopped reading (`| head`) ends the command quietly: see `quiet_broken_pipe`
        except Exception as exc:
            if debug_enabled():
                raise
            if isinstance(exc, NotFoundError | StoreNotFoundError):
                raise NotFoundFailure(one_line(str(exc))) from exc
            if isinstance(exc, UsageError | PolicyFileError):
                raise UsageFailure(one_line(str(exc))) from exc
            if isinstance(exc, PeagleError | StoreError | PolicyError):
                raise click.ClickException(one_line(str(exc))) from exc
            if isinstance(exc, OSError):
                raise click.ClickException(one_line(_os_message(exc))) from exc
            if isinstance(exc, MemoryError):
                raise click.ClickException("Out of memory. Rerun with --debug to see where.") from exc
            raise click.ClickException(
                one_line(f"Unexpected {type(exc).__name__}: {exc}. This is a bug in peagle-tune: rerun with "
                         "--debug for the traceback and report it.")
            ) from exc

    return wrapper  # type: ignore[return-value]


def quiet_broken_pipe() -> None:
    """After stdout's reader went away (``peagle-tune show | head``): send what is left to /dev/null, so neither this
    command nor the interpreter's final flush reports the broken pipe. The caller exits with status 0: the reader
    got what it wanted."""
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (e.g. under click's test runner)
            continue
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        except OSError:
            pass


def int_list(value: str, option: str, maximum: int | None = None) -> list[int]:
    """Comma-separated integers in [1, `maximum`] (``1,8,64``); errors name `option`."""
    shown = f"{value!r:.60}"
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers like 1,8,64, but got {shown}.") from None
    if not out or any(v < 1 for v in out):
        raise UsageError(f"{option} takes positive integers like 1,8,64, but got {shown}.")
    if maximum is not None and any(v > maximum for v in out):
        raise UsageError(f"{option} takes integers from 1 to {maximum:,}, but got {shown}.")
    return out


def finite_seconds(value: float, option: str, *, maximum: float) -> float:
    """`value` if it is a finite number of seconds in (0, `maximum`]; click's FLOAT also accepts nan and inf."""
    if not (value == value and 0 < value <= maximum):  # nan != nan
        raise UsageError(f"{option} takes a number of seconds in (0, {maximum:g}], but got {value}.")
    return value


def _db_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A command's --db, else the group's (``peagle-tune --db URL show``), else PEAGLE_DB, else the default."""
    from click.core import ParameterSource

    if param.name and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE:
        return value
    group = ctx.find_root().params.get("db_url")
    return group if group else value


db_option = click.option(
    "--db",
    "db_url",
    envvar="PEAGLE_DB",
    default=None,
    callback=_db_url,
    metavar="URL",
    help="Database URL or SQLite file path (default: peagle.db in your data directory; env PEAGLE_DB).",
)


def _catalog(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Path | None:
    """Load the user catalog now (one-line error when it is malformed) and hand it to engine processes too."""
    if value is not None:
        from autotune.catalogs import CATALOG_ENV_VAR, use_catalog

        use_catalog(value)
        os.environ[CATALOG_ENV_VAR] = os.pathsep.join(
            p for p in (str(value.absolute()), os.environ.get(CATALOG_ENV_VAR, "")) if p
        )
    return value


catalog_option = click.option(
    "--catalog",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    expose_value=False,
    callback=_catalog,
    metavar="FILE",
    help="A user catalog (YAML with models:, drafters:, gpus: as in the packaged catalogs) adding or overriding "
    "entries (env PEAGLE_CATALOG).",
)


def open_store(db_url: str | None, *, writes: bool = False) -> Any:
    """The `Store` for --db (a URL or a SQLite file path; None: the default database).

    An in-memory database (``sqlite://``) is refused: each command is its own process, so it would start empty and
    lose what it stores. `writes`: the command stores results, so a read-only database is refused before any work.
    """
    from store import Store

    return Store(db_url, persistent=True, for_writing=writes)


def store_label(store: Any) -> str:
    """Where a store keeps its data, for messages: its URL with any password masked (never the object's repr)."""
    from store import mask_password

    url = getattr(store, "url", None)
    return mask_password(str(url)) if url else "the database"


def write_output(path: Path, text: str, *, force: bool, option: str = "--out") -> None:
    """Write `text` to `path` whole or not at all, never through a symbolic link.

    Without `force` an existing path (even a dangling link) is refused. The text goes to a new file beside `path`
    that is then renamed over it, so a reader, a full disk or a crash never sees half a file, and a link at
    `path` is replaced itself rather than followed (its target, maybe someone else's file, is untouched).
    """
    folder = path.parent
    if path.is_symlink():
        target = os.readlink(path)
        if not force:
            raise UsageError(
                f"{option} {path} is a symbolic link (to {target}); pass --force to replace the link with a new "
                "file (its target is left alone), or choose another path."
            )
    elif path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it.")
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file path.")
    if not folder.is_dir():
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{option} {path}: {folder} {problem}; create the folder or choose another path.")
    temporary = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as exc:
        raise PeagleError(f"{option} {path}: cannot write in {folder} ({exc.strerror or exc}).") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise PeagleError(f"{option} {path}: cannot write it ({exc.strerror or exc}); nothing was changed.") from exc
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def canonical_model(model: str) -> str:
    from autotune.catalogs import resolve_model

    try:
        return resolve_model(model).name
    except PeagleError:
        return model
