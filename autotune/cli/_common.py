"""Shared pieces of the CLI: error translation, the --db option, opening the store, writing output files."""

from __future__ import annotations

import errno
import functools
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from autotune.errors import NotFoundError, PeagleError, UsageError
from autotune.safe_text import terminal_text

F = TypeVar("F", bound=Callable[..., Any])



class _Console(Console):
    """A rich console whose broken pipe (``peagle-tune show | head``) is a `BrokenPipeError` for the command group to
    end quietly (rich's own handling exits with status 1).

    Names in what it prints are text, never syntax: markup is off (``[bold]x`` prints as written; style with
    ``style=`` or `rich.text.Text`), and every segment of text is passed through `terminal_text` on its way out,
    so no name from a file, the database or an argument can send control characters or escape sequences to the
    terminal, whichever table or message holds it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        super().__init__(*args, **kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Any:
        for segment in super().render(renderable, options):
            if segment.control is None and segment.text:
                safe = terminal_text(segment.text)
                if safe != segment.text:
                    segment = Segment(safe, segment.style)
            yield segment

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


#: Widest a line of prose is printed (notes such as ``Backend:``, ``Rule:``, ``Next:``), in a terminal or piped.
PROSE_COLUMNS = 100


def say(out: Console, text: str, style: str | None = None) -> None:
    """A line of prose, word-wrapped at the terminal's width (COLUMNS when set) and never wider than `PROSE_COLUMNS`,
    also when piped (rich would otherwise leave it one long line or wrap it at 80). ``--json`` carries the long
    forms."""
    width = min(out.width, PROSE_COLUMNS) if out.is_terminal or os.environ.get("COLUMNS") else PROSE_COLUMNS
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    out.print("\n".join(lines), style=style, highlight=False, markup=False, soft_wrap=True)


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
    """`message` on one line (whitespace collapsed, control characters removed: `terminal_text`), cut in the middle
    beyond `MAX_MESSAGE_CHARS`."""
    text = " ".join(terminal_text(message).split())
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
        try:
            return fn(*args, **kwargs)
        except click.exceptions.ClickException as exc:  # click's own (bad option values) quote what was typed
            setattr(exc, "message", terminal_text(exc.message))  # noqa: B010 (click declares it Final)
            raise
        except (click.exceptions.Abort, click.exceptions.Exit, BrokenPipeError):
            raise  # a reader that stopped reading (`| head`) ends the command quietly: see `quiet_broken_pipe`
        except Exception as exc:
            if debug_enabled():
                raise
            # Imported here, when a command failed: `list` and `--help` need neither the store nor the policies.
            from policies import PolicyError, PolicyFileError
            from store import RowNotFoundError, StoreError

            if isinstance(exc, NotFoundError | RowNotFoundError):
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


def echo(text: str, *, nl: bool = True, err: bool = False) -> None:
    """Print plain `text` (not through rich) without control characters (`terminal_text`)."""
    click.echo(terminal_text(text), nl=nl, err=err)


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

        try:
            use_catalog(value)
        except PeagleError as exc:  # the group's option is parsed before any command's error handling
            raise click.BadParameter(one_line(str(exc)), ctx=_ctx, param=_param) from None
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


def open_store(db_url: str | None, *, writes: bool = False, existing: bool = False) -> Any:
    """The `Store` for --db (a URL or a SQLite file path; None: the default database).

    An in-memory database (``sqlite://``) is refused: each command is its own process, so it would start empty and
    lose what it stores. `writes`: the command stores results, so a read-only database, or a SQLite file with a
    damaged page, is refused before any work. `existing`: the command only reads what is stored, so a SQLite file
    named with --db (or PEAGLE_DB) that does not exist is "not found" (exit 3), not a new empty database. A stored
    row that cannot be read is skipped by listings and reported in one line on stderr (table, id and what is wrong);
    the other rows are shown.
    """
    from store import Store, normalize_db_url, parse_db_url, sqlite_file

    file = sqlite_file(parse_db_url(normalize_db_url(db_url))) if existing and db_url is not None else None
    if file is not None and not file.path.exists():
        raise NotFoundError(f"There is no database at {file.path}: check --db (or PEAGLE_DB); `peagle-tune search` "
                            "creates one.")

    return Store(db_url, persistent=True, for_writing=writes, on_bad_row=lambda line: click.echo(line, err=True))


def store_label(store: Any) -> str:
    """Where a store keeps its data, for messages: its URL with any password masked (never the object's repr)."""
    from store import mask_password

    url = getattr(store, "url", None)
    return mask_password(str(url)) if url else "the database"


def canonical_model(model: str) -> str:
    from autotune.catalogs import resolve_model

    try:
        return resolve_model(model).name
    except PeagleError:
        return model
