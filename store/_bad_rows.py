"""Stored rows that cannot be read back: found per row, reported in one line, skipped by listings.

A row written by hand, by another program or by an older peagle-tune may hold JSON that does not parse (SQLite
keeps any text in a JSON column), a lone surrogate (``"c\\ud800"``: both backends store it, but it cannot be printed,
written or drawn), a name longer than its column (SQLite does not enforce sizes), or JSON of the wrong shape. Such a
row must not fail every `show` and `report`: listings skip it and report it once (`BadRowError.skipped`), and a
lookup of that one row raises `BadRowError`, whose message names the table, the id and what is wrong.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy import JSON, Select, inspect
from sqlalchemy.orm import Session

from store._validate import unicode_problem
from store.exceptions import BadRowError

RowT = TypeVar("RowT")
RecordT = TypeVar("RecordT")

#: Longest text of one JSON column a record is built from (a cell of absurd size is reported, not read).
MAX_JSON_CHARS = 64 * 1024 * 1024


class UnreadableJSON:
    """What a JSON column holds when its text does not parse (the engine's deserializer returns it instead of
    raising, so the other rows of a query can still be read)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable JSON: {self.reason}>"


def tolerant_json_loads(text: str | bytes) -> Any:
    """`json.loads` for the engine (``create_engine(json_deserializer=...)``): `UnreadableJSON` instead of an
    exception for text that is not JSON or is absurdly long."""
    if len(text) > MAX_JSON_CHARS:
        return UnreadableJSON(f"{len(text):,} characters, more than the {MAX_JSON_CHARS:,} read")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return UnreadableJSON(f"{type(exc).__name__}: {str(exc)[:120]}")


def _value_problem(value: Any, where: str) -> str | None:
    """Why a value read from column `where` is unusable (unparseable JSON, or a lone surrogate anywhere in it), in
    words starting with where in the value it is ("metrics['row']['classes'][1] holds ..."), or None."""
    if isinstance(value, UnreadableJSON):
        return f"{where} is not valid JSON ({value.reason})"
    if isinstance(value, str):
        problem = unicode_problem(value)
        return None if problem is None else f"{where} {problem}"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _value_problem(key, f"{where} key {key!r:.40}") if isinstance(key, str) else None
            problem = problem or _value_problem(item, f"{where}[{key!r}]")
            if problem is not None:
                return problem
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problem = _value_problem(item, f"{where}[{i}]")
            if problem is not None:
                return problem
    return None


@functools.cache
def _json_shapes(model: Any) -> dict[str, type]:
    """{column: dict or list}: the container each JSON column of `model` must hold, from its ``Mapped[...]``."""
    hints = typing.get_type_hints(model)
    shapes: dict[str, type] = {}
    mapper: Any = inspect(model)
    for column in mapper.columns:
        if not isinstance(column.type, JSON):
            continue
        (inner,) = typing.get_args(hints[column.key])
        union = typing.get_origin(inner) in (typing.Union, types.UnionType)
        for option in typing.get_args(inner) if union else (inner,):
            origin = typing.get_origin(option) or option
            if origin in (dict, list):
                shapes[column.key] = origin
    return shapes


def row_problem(row: Any) -> str | None:
    """What makes the ORM `row` unreadable, in words starting with its column ("config is not valid JSON (...)"),
    or None when it reads."""
    model: Any = type(row)
    shapes = _json_shapes(model)
    mapper: Any = inspect(model)
    for column in mapper.columns:
        value = getattr(row, column.key)
        if value is None:
            continue
        length = getattr(column.type, "length", None)
        if isinstance(value, str) and length is not None and len(value) > length:
            return f"{column.key} is {len(value):,} characters long, more than the {length:,} its column holds"
        problem = _value_problem(value, column.key)
        if problem is not None:
            return problem
        shape = shapes.get(column.key)
        if shape is not None and not isinstance(value, shape):
            return f"{column.key} is a JSON {type(value).__name__}, not a JSON {'object' if shape is dict else 'array'}"
    return None


def checked(row: RowT) -> RowT:
    """`row`, or `BadRowError` when it cannot be read."""
    problem = row_problem(row)
    if problem is not None:
        raise BadRowError(type(row).__tablename__, getattr(row, "id", "?"), problem)  # type: ignore[attr-defined]
    return row


def readable(
    rows: Iterable[RowT], to_record: Callable[[RowT], RecordT], report: Callable[[BadRowError], None]
) -> Iterator[RecordT]:
    """The record of each row of `rows` that can be read (`to_record` raises `BadRowError` for the others, as
    `record_of` does): each other row is handed to `report` and skipped."""
    for row in rows:
        try:
            record = to_record(row)
        except BadRowError as bad:
            report(bad)
            continue
        yield record


def first_readable(
    session: Session, query: Select[Any], to_record: Callable[[Any], RecordT], report: Callable[[BadRowError], None]
) -> RecordT | None:
    """The record of the first row of `query` that can be read (the rows before it are handed to `report`), or None.

    Reads one row, and further rows (in growing pages) only while those read cannot be read, so the newest of a
    long table costs one ``LIMIT 1``, as it did before bad rows were skipped.
    """
    offset, size = 0, 1
    while True:
        rows = session.scalars(query.offset(offset).limit(size)).unique().all()
        for record in readable(rows, to_record, report):
            return record
        if len(rows) < size:
            return None
        offset, size = offset + size, min(size * 8, 512)
