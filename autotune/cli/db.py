"""`peagle-tune db`."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import (
    console,
    db_option,
    errors,
)


@click.group()
def db() -> None:
    """Database maintenance.

    Example:

        peagle-tune db upgrade --db sqlite:///peagle.db
    """


@db.command("upgrade")
@db_option
@errors
def db_upgrade(db_url: str | None) -> None:
    """Upgrade the database schema to this version of peagle-tune.

    Example:

        peagle-tune db upgrade
    """
    from store import default_db_url, upgrade

    if db_url and "://" not in db_url:
        db_url = f"sqlite:///{Path(db_url).expanduser().resolve()}"
    url = db_url or default_db_url()
    upgrade(url)
    console.print(f"Database {url} is at the current schema.")


@db.command("path")
@db_option
def db_path(db_url: str | None) -> None:
    """Print the database URL peagle-tune uses.

    Example:

        peagle-tune db path
    """
    from store import default_db_url

    click.echo(db_url or default_db_url())
