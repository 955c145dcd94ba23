"""Helpers for tests that run the store against real databases (imported by tests, not by the library).

Set `PEAGLE_TEST_POSTGRES_URL` (e.g. ``postgresql+psycopg://user:pass@localhost:5432/peagle_test``) to run the
contract tests on PostgreSQL too; the tests drop every ``peagle_*`` table in that database before and after use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import MetaData

from store._engine import create_store_engine
from store._models import TABLE_PREFIX

#: Environment variable naming a PostgreSQL database the tests may wipe (only its peagle_* tables).
POSTGRES_URL_ENV = "PEAGLE_TEST_POSTGRES_URL"


def postgres_test_url() -> str | None:
    """The PostgreSQL URL for tests, or None when `PEAGLE_TEST_POSTGRES_URL` is unset or empty."""
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    return url or None


def drop_peagle_tables(url: str) -> None:
    """Drop every table whose name starts with ``peagle_`` (ours and our version table); others are left alone."""
    engine = create_store_engine(url)
    try:
        with engine.begin() as connection:
            metadata = MetaData()
            metadata.reflect(connection, only=lambda name, _meta: name.startswith(TABLE_PREFIX))
            metadata.drop_all(connection)
    finally:
        engine.dispose()


def database_url(kind: str, tmp_path: Path, tests: str) -> Iterator[str]:
    """The database a test runs on, for a parametrized pytest fixture to ``yield from``.

    `kind`: ``"sqlite-memory"`` (gone with its Store), ``"sqlite-file"`` or ``"sqlite"`` (a file under `tmp_path`, so
    it can be reopened), or ``"postgres"`` (`postgres_test_url`, its peagle_* tables dropped before and after; the
    test is skipped, saying "set PEAGLE_TEST_POSTGRES_URL to run `tests` on PostgreSQL", when it is unset).
    """
    if kind == "sqlite-memory":
        yield "sqlite://"
    elif kind in ("sqlite-file", "sqlite"):
        yield f"sqlite:///{tmp_path / 'peagle.db'}"
    elif kind == "postgres":
        url = postgres_test_url()
        if url is None:
            import pytest  # only tests call this; the library does not need pytest

            pytest.skip(f"set {POSTGRES_URL_ENV} to run {tests} on PostgreSQL")
        drop_peagle_tables(url)
        yield url
        drop_peagle_tables(url)
    else:
        raise ValueError(f"unknown test database kind {kind!r}: use sqlite-memory, sqlite-file or postgres")
