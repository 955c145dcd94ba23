"""Shared pieces of the CLI: error translation, the --db option, opening the store."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from autotune.errors import PeagleError, UsageError

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)


class UsageFailure(click.ClickException):
    """A usage error (bad model name, K out of range, ...): one line, exit code 2."""

    exit_code = 2


def errors(fn: F) -> F:
    """Translate library errors into one-line click errors (exit 2 for usage errors, 1 otherwise)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from policies import PolicyFileError
        from store import StoreError

        try:
            return fn(*args, **kwargs)
        except (UsageError, PolicyFileError) as exc:
            raise UsageFailure(str(exc)) from exc
        except (PeagleError, StoreError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def int_list(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers like 1,8,64, but got {value!r}.") from None
    if not out or any(v < 1 for v in out):
        raise UsageError(f"{option} takes positive integers like 1,8,64, but got {value!r}.")
    return out


db_option = click.option(
    "--db",
    "db_url",
    envvar="PEAGLE_DB",
    default=None,
    help="Database URL or SQLite file path (default: peagle.db in your data directory; env PEAGLE_DB).",
)


def open_store(db_url: str | None) -> Any:
    from store import Store

    if db_url and "://" not in db_url:
        db_url = f"sqlite:///{Path(db_url).expanduser().resolve()}"
    return Store(db_url)


def canonical_model(model: str) -> str:
    from autotune.catalogs import resolve_model

    try:
        return resolve_model(model).name
    except PeagleError:
        return model
