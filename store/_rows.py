"""What every per-table repository shares: the session factory `Store` hands it, race-safe get-or-create, lookups.

A repository never opens the engine or translates errors: it asks `Store` for a short session (``with
self._session() as session``), and `Store` commits, rolls back and turns SQLAlchemy errors into `StoreError`s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from store import _validate as v
from store._bad_rows import BadRowError, checked
from store.exceptions import RowNotFoundError

RowT = TypeVar("RowT")
RecordT = TypeVar("RecordT")

#: Opens one short session that commits on success and rolls back on error (`Store._session`).
Sessions = Callable[[], AbstractContextManager[Session]]
#: Told of each stored row a listing skips because it cannot be read (`Store` reports it once, in one line).
BadRowReport = Callable[[BadRowError], None]


def _raise(bad: BadRowError) -> None:
    raise bad


class Repository:
    """Base of the per-table repositories: every public call opens one session of its own from `sessions`;
    listings hand the rows they cannot read to `bad_row` and go on (default: raise)."""

    def __init__(self, sessions: Sessions, bad_row: BadRowReport = _raise) -> None:
        self._session = sessions
        self._bad_row = bad_row


def get_or_create(session: Session, query: Select[RowT], create: Callable[[], RowT]) -> tuple[RowT, bool]:
    """The row `query` finds, else the row `create()` makes, inserted now; returns (row, True if it was created).

    Safe when several processes create the same row at once, provided a unique constraint covers what `query`
    matches: the loser's INSERT fails with `IntegrityError`, and it returns the winner's row instead. That failure
    rolls the whole session back, so call this before any other write of the session (every repository method opens
    a session of its own, so this holds).
    """
    found = session.scalars(query).first()
    if found is not None:
        return found, False
    row = create()
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        # A concurrent writer inserted it between our SELECT and INSERT.
        session.rollback()
        found = session.scalars(query).first()
        if found is None:
            raise
        return found, False
    return row, True


def get_row(session: Session, table: type[RowT], row_id: int, missing: str) -> RowT:
    """The row of `table` with primary key `row_id`; `RowNotFoundError(missing)` when there is none."""
    row = session.get(table, row_id)
    if row is None:
        raise RowNotFoundError(missing)
    return row


def named_row(session: Session, table: type[RowT], name: str, missing: str) -> RowT:
    """The row of `table` whose unique `name` column is `name`; `RowNotFoundError(missing)` when there is none."""
    row = session.scalars(select(table).filter_by(name=name)).first()
    if row is None:
        raise RowNotFoundError(missing)
    return row


def where_given(query: Select[RowT], *filters: tuple[object, ColumnElement[bool]]) -> Select[RowT]:
    """`query` narrowed by each (value, condition) pair whose value was given (is not None)."""
    for value, condition in filters:
        if value is not None:
            query = query.where(condition)
    return query


def limited(query: Select[RowT], limit: int | None) -> Select[RowT]:
    """`query` returning at most `limit` rows (an integer >= 1; None: all)."""
    return query if limit is None else query.limit(v.integer("limit", limit, minimum=1))


def record_of(record_type: type[RecordT], row: object, **overrides: Any) -> RecordT:
    """A `record_type` (a frozen dataclass of `_records`) filled from `row`'s attributes of the same names.

    The record must not share anything with the session: JSON columns (dicts, lists) are copied by a round trip,
    timestamps become aware UTC datetimes. `overrides` give the fields that are not a column of `row` as is
    (e.g. a profile's environment fields); any other missing attribute is an error. A row that cannot be read
    (unparseable JSON, a lone surrogate, a name longer than its column) raises `BadRowError`.
    """
    checked(row)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(record_type):  # type: ignore[arg-type]
        if field.name in overrides:
            values[field.name] = overrides[field.name]
            continue
        value = getattr(row, field.name)
        if isinstance(value, dt.datetime):
            value = utc(value)
        elif isinstance(value, dict | list):
            value = json.loads(json.dumps(value))
        values[field.name] = value
    return record_type(**values)


def utc(value: dt.datetime) -> dt.datetime:
    """`value` as an aware UTC datetime: SQLite returns naive datetimes, and every timestamp we write is UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def set_given(row: object, **values: object) -> None:
    """Set each attribute of `row` whose new value was given (is not None); None keeps the stored value."""
    for name, value in values.items():
        if value is not None:
            setattr(row, name, value)
