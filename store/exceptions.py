"""Errors the store raises. `StoreError` is the root; the CLI turns them into messages.

`store` depends on nothing else of peagle-tune, so `StoreError` does not derive from `autotune`'s `PeagleError`;
the CLI catches both roots. SQLAlchemy errors are translated in one place (`Store._translated`), never leaked.
"""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error the store raises on purpose."""


class StaleSchemaError(StoreError):
    """The database schema is not the one this peagle-tune uses (older, newer or unrecognised).

    The message says what to run: `peagle-tune db upgrade --db <url>` for an older schema, upgrading peagle-tune
    for a newer one.
    """


class RowNotFoundError(StoreError, LookupError):
    """No row with the requested id or name (the CLI reports it like `autotune.errors.NotFoundError`, exit 3)."""


class DatabaseUnavailableError(StoreError):
    """The database cannot be opened or reached (bad URL, missing driver, server down, file not writable, locked)."""


class InvalidRecordError(StoreError, ValueError):
    """A value passed to the store breaks a rule of the schema (unknown status, NaN in JSON, malformed acceptance)."""


class DatabaseLockedError(DatabaseUnavailableError):
    """Another process held the database's write lock for longer than this store waits (30 s by default)."""


class DatabaseCorruptError(DatabaseUnavailableError):
    """The database file is damaged (SQLite: "database disk image is malformed"); the message says how to recover."""


class DatabaseFullError(DatabaseUnavailableError):
    """The disk holding the database is full; the write was rolled back whole (nothing of it was stored)."""


class DuplicateRecordError(InvalidRecordError):
    """The record is stored already (a trial number of a study): the one `InvalidRecordError` a writer racing
    another worker may ignore. Every other `InvalidRecordError` means the value itself was refused."""


class BadRowWarning(UserWarning):
    """A listing skipped a stored row it cannot read; the message names the table, the id and what is wrong."""


class BadRowError(StoreError):
    """A stored row that cannot be read: `table`, `row_id` and `problem` say which and why."""

    def __init__(self, table: str, row_id: object, problem: str) -> None:
        self.table, self.row_id, self.problem = table, row_id, problem
        super().__init__(
            f"Row {row_id} of {table} cannot be read: its {problem}. Delete or fix that row "
            f"(DELETE FROM {table} WHERE id = {row_id}); the other rows are read."
        )

    @property
    def skipped(self) -> str:
        """The one line a listing reports when it skips this row."""
        return f"Skipped row {self.row_id} of {self.table}: its {self.problem}. Delete or fix that row."
