"""`peagle-tune db`."""

from __future__ import annotations

import click

from autotune.cli._common import (
    console,
    db_option,
    echo,
    errors,
)


@click.group()
def db() -> None:
    """Database maintenance.

    \b
    Example:
      peagle-tune db upgrade --db sqlite:///peagle.db
      peagle-tune db path
    """


@db.command("upgrade")
@db_option
@errors
def db_upgrade(db_url: str | None) -> None:
    """Upgrade the database schema to this version of peagle-tune, and repair tables changed by hand.

    A table, index or column (one that may be empty) missing at the current schema is added back; other changes
    are named with the fix.

    \b
    Example:
      peagle-tune db upgrade
    """
    from store import default_db_url, mask_password, normalize_db_url, upgrade

    url = normalize_db_url(db_url) if db_url else default_db_url()
    upgrade(url, on_repair=lambda what: echo(f"Repaired: {what}."))  # one line each, for scripts too
    console.print(f"Database {mask_password(url)} is at the current schema.", highlight=False)


@db.command("path")
@db_option
@errors
def db_path(db_url: str | None) -> None:
    """Print the database URL peagle-tune uses (its password, if any, as ***).

    \b
    Example:
      peagle-tune db path
    """
    from store import default_db_url, mask_password, normalize_db_url

    click.echo(mask_password(normalize_db_url(db_url) if db_url else default_db_url()))
