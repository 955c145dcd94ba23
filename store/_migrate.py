"""Alembic, configured in code: the script folder ships inside the package, no alembic.ini.

Our version table is `peagle_alembic_version` and the environment sees only ``peagle_`` tables, so Alembic never
touches Optuna's tables (or its `alembic_version`) in a shared database.

To add a revision after changing `store/_models.py`: open a scratch database at the current head (``Store(url)``)
and autogenerate against it, then review the file and name it ``versions/NNNN_<what>.py``::

    from alembic import command
    from store._engine import create_store_engine
    from store._migrate import alembic_config
    with create_store_engine("sqlite:////tmp/scratch.db").begin() as connection:
        command.revision(alembic_config(connection=connection), message="...", autogenerate=True, rev_id="0002")

`tests/test_store_schema.py` checks that the migrations produce exactly the models.
"""

from __future__ import annotations

import ast
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text

from store._models import TABLE_PREFIX, VERSION_TABLE, Base
from store._url import mask_password
from store.exceptions import StaleSchemaError

if TYPE_CHECKING:
    from alembic.config import Config

#: Folder with env.py, script.py.mako and versions/ (package data).
SCRIPT_LOCATION = Path(__file__).resolve().parent / "migrations"

# Alembic's `context` proxy is a module global: one migration at a time per process.
_MIGRATION_LOCK = threading.Lock()
# Key of the PostgreSQL advisory lock that serialises schema changes between processes ("peagle" in ASCII).
_PG_ADVISORY_LOCK_KEY = 0x706561676C65


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Reflect only our tables (Alembic's `include_name` hook); everything inside them is ours."""
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Compare/migrate only our tables and what belongs to them (Alembic's `include_object` hook)."""
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
    table = getattr(obj, "table", None)
    if table is not None:
        return str(table.name).startswith(TABLE_PREFIX)
    return True


def context_options() -> dict[str, Any]:
    """Keyword arguments for `alembic.context.configure` shared by env.py and the schema checks."""
    return {
        "target_metadata": Base.metadata,
        "version_table": VERSION_TABLE,
        "include_name": include_name,
        "include_object": include_object,
        "compare_type": True,
        # SQLite cannot ALTER most things; batch mode rebuilds tables for future migrations.
        "render_as_batch": True,
    }


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic `Config` pointing at the packaged migrations; `connection` is used by env.py when given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if url is not None:
        # ConfigParser interpolates '%': escape it (URL-encoded passwords contain it).
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The schema revision this peagle-tune writes: the single Alembic head, i.e. the one revision of
    ``versions/`` that no other revises (read from the files' ``revision`` and ``down_revision`` as Alembic reads
    them; a test holds it to Alembic's answer)."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in sorted((SCRIPT_LOCATION / "versions").glob("*.py")):
        names = _revision_names(path)
        if isinstance(names.get("revision"), str):
            revisions.add(names["revision"])
            down = names.get("down_revision")
            revised.update([down] if isinstance(down, str) else down or ())
    heads = sorted(revisions - revised)
    if len(heads) != 1:  # a packaging bug, not a user error
        raise RuntimeError(f"peagle-tune's migrations must have exactly one head, but found {heads}.")
    return heads[0]


_PARSED: dict[tuple[str, int, int], dict[str, Any]] = {}
_PARSE_LOCK = threading.Lock()


def _revision_names(path: Path) -> dict[str, Any]:
    """The module-level ``revision`` and ``down_revision`` literals of a migration file, parsed once per file
    version (every store open asks) and under a lock: CPython 3.11's ``ast.parse`` in several threads at once can
    fail with "AST constructor recursion depth mismatch"."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _PARSE_LOCK:
        if key not in _PARSED:
            _PARSED[key] = _parse_revision_names(path)
        return dict(_PARSED[key])


def _parse_revision_names(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    target: ast.expr
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
            found[target.id] = ast.literal_eval(value)
    return found


def current_revision(connection: Connection) -> str | None:
    """The revision recorded in `peagle_alembic_version` (Alembic's version table, read as Alembic reads it), or
    None if there is none."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    heads = [str(r) for r in connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()]
    if not heads:
        return None
    if len(heads) > 1:
        return ",".join(sorted(heads))
    return heads[0]


def our_tables(connection: Connection) -> list[str]:
    """Names of our tables in the database (without the version table)."""
    names = inspect(connection).get_table_names()
    return sorted(n for n in names if n.startswith(TABLE_PREFIX) and n != VERSION_TABLE)


def schema_differences(connection: Connection) -> list[Any]:
    """Alembic's autogenerate diff between the database's ``peagle_`` tables and the models (empty: they match)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    ctx = MigrationContext.configure(connection, opts=context_options())
    return list(compare_metadata(ctx, Base.metadata))


_DIFF_LABELS = {
    "add_table": "missing table",
    "remove_table": "unexpected table",
    "add_column": "missing column",
    "remove_column": "unexpected column",
    "add_index": "missing index",
    "remove_index": "unexpected index",
    "add_constraint": "missing constraint",
    "remove_constraint": "unexpected constraint",
    "add_fk": "missing foreign key",
    "remove_fk": "unexpected foreign key",
}


def describe_difference(diff: Any) -> str:
    """One Alembic autogenerate diff entry in words, e.g. "missing table peagle_trials" ("missing": in the models,
    not in the database)."""
    if isinstance(diff, list):  # modify_* entries come grouped per column
        return "; ".join(describe_difference(d) for d in diff)
    op = str(diff[0])
    if op in ("add_column", "remove_column"):
        return f"{_DIFF_LABELS[op]} {diff[2]}.{diff[3].name}"
    if op.startswith("modify_"):
        return f"{op.removeprefix('modify_')} of {diff[2]}.{diff[3]} differs"
    return f"{_DIFF_LABELS.get(op, op)} {getattr(diff[1], 'name', diff[1])}"


class SchemaState(enum.Enum):
    FRESH = "fresh"  # none of our tables: create at head
    CURRENT = "current"  # at head
    OLDER = "older"  # a known revision before head: `peagle-tune db upgrade`
    NEWER = "newer"  # an unknown revision, written by a newer peagle-tune
    UNVERSIONED = "unversioned"  # our tables but no revision row


@dataclass(frozen=True)
class SchemaStatus:
    state: SchemaState
    current: str | None
    head: str
    tables: tuple[str, ...]


def schema_status(connection: Connection) -> SchemaStatus:
    """Classify the database's peagle schema relative to this peagle-tune's head revision."""
    head = head_revision()
    # Tables before the revision: a concurrent creator commits both at once, and without a snapshot (SQLite
    # autocommit reads) reading in this order never pairs "no revision yet" with "tables just appeared".
    tables = tuple(our_tables(connection))
    current = current_revision(connection)
    if current is None:
        state = SchemaState.UNVERSIONED if tables else SchemaState.FRESH
    elif current == head:
        state = SchemaState.CURRENT
    elif _is_known(current):
        state = SchemaState.OLDER
    else:
        state = SchemaState.NEWER
    return SchemaStatus(state=state, current=current, head=head, tables=tables)


def _is_known(revision: str) -> bool:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(alembic_config())
    try:
        return all(script.get_revision(r) is not None for r in revision.split(","))
    except CommandError:
        return False


def _package_version() -> str:
    try:
        return importlib_metadata.version("peagle-tune")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def stale_schema_message(status: SchemaStatus, url: str) -> str:
    """The user-facing explanation of a schema this peagle-tune cannot use, with the command that fixes it."""
    masked = mask_password(url)
    upgrade_cmd = f"Please run `peagle-tune db upgrade --db {masked}`."
    version = _package_version()
    if status.state is SchemaState.OLDER:
        return (
            f"The peagle-tune tables in {masked} are at schema revision {status.current!r}, but peagle-tune "
            f"{version} needs revision {status.head!r}. {upgrade_cmd}"
        )
    if status.state is SchemaState.NEWER:
        return (
            f"The peagle-tune tables in {masked} are at schema revision {status.current!r}, which peagle-tune "
            f"{version} does not know (its newest is {status.head!r}): a newer peagle-tune wrote this database. "
            "Please upgrade peagle-tune (`pip install -U peagle-tune`), or use another database with --db or "
            "PEAGLE_DB."
        )
    shown = ", ".join(status.tables[:3]) + (", ..." if len(status.tables) > 3 else "")
    return (
        f"{masked} has peagle-tune tables ({shown}) but no schema revision in {VERSION_TABLE}. {upgrade_cmd} "
        "It records the revision when the tables match this peagle-tune's schema and otherwise says what differs."
    )


def _lock_schema(connection: Connection) -> None:
    """Serialise schema changes between processes for the rest of this transaction.

    SQLite: BEGIN IMMEDIATE takes the write lock (waiting up to busy_timeout) and makes the DDL one atomic
    transaction, so another process never sees half-created tables. PostgreSQL: a transaction advisory lock.
    """
    dialect = connection.dialect.name
    if dialect == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif dialect == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_ADVISORY_LOCK_KEY})


def repair_drift(connection: Connection, url: str) -> list[str]:
    """Make a database at the head revision hold the models' tables again; returns what was repaired, in words.

    At head the tables are exactly the models (`tests/test_store_schema.py`), unless someone changed them by hand.
    Repaired, since nothing stored is lost or made up: a missing table or index is created, a missing column that
    may be NULL (no foreign key, not unique) is added back, its values NULL (they were gone with the column). Anything
    else the models need (a NOT NULL column, a key, a constraint) raises `StaleSchemaError` naming each one and the
    fix; then nothing is repaired. What the models do not know (another tool's table or column) is left alone.
    """
    from sqlalchemy.schema import CreateColumn

    diffs = [d for group in schema_differences(connection) for d in (group if isinstance(group, list) else [group])]
    created = {d[1].name for d in diffs if d[0] == "add_table"}
    plan: list[tuple[int, str, Any]] = []  # (order: tables, columns, then indexes; what was done; Table/Index/SQL)
    left: list[str] = []
    quote = connection.dialect.identifier_preparer.quote
    for diff in diffs:
        op = diff[0]
        if op == "add_table":
            plan.append((0, f"created the missing table {diff[1].name}", diff[1]))
        elif op == "add_index" and diff[1].table.name not in created:
            plan.append((2, f"created the missing index {diff[1].name}", diff[1]))
        elif op == "add_column" and diff[3].nullable and not diff[3].foreign_keys and not diff[3].unique:
            table_name, column = diff[2], diff[3]
            spec = CreateColumn(column).compile(dialect=connection.dialect)
            plan.append((1, f"added the missing column {table_name}.{column.name} (NULL in every row)",
                         f"ALTER TABLE {quote(table_name)} ADD COLUMN {spec}"))
        elif op in ("add_column", "add_fk", "add_constraint"):  # NOT NULL, keyed or unique: no safe value
            left.append(describe_difference(diff))
    if left:
        shown = "; ".join(left[:5]) + ("; ..." if len(left) > 5 else "")
        raise StaleSchemaError(
            f"{mask_password(url)} is at schema revision {head_revision()!r}, but its tables differ from it in ways "
            f"peagle-tune cannot repair without losing or making up data ({shown}). Restore the database from a "
            "backup, or move it aside and start a new one (--db or PEAGLE_DB)."
        )
    plan.sort(key=lambda step: step[0])
    for _, _, ddl in plan:
        if isinstance(ddl, str):
            connection.exec_driver_sql(ddl)
        else:
            ddl.create(connection)
    return [what for _, what, _ in plan]


def upgrade_engine(engine: Engine, url: str, on_repair: Callable[[str], None] | None = None) -> str:
    """Bring the database to the head revision; returns the head. Optuna's tables are never touched.

    A database with our tables but no revision row is stamped at head if its tables match the models exactly;
    otherwise `StaleSchemaError` lists the differences. A newer (unknown) revision raises `StaleSchemaError`. A
    database that was at head, or was just migrated there, is checked against the models (`repair_drift`): each
    repair is told to `on_repair`. Safe to run from several processes at once: the state is read under a lock and
    the change is atomic.
    """
    from alembic import command

    with _MIGRATION_LOCK, engine.begin() as connection:
        _lock_schema(connection)
        status = schema_status(connection)
        if status.state is SchemaState.NEWER:
            raise StaleSchemaError(stale_schema_message(status, url))
        cfg = alembic_config(connection=connection)
        if status.state is SchemaState.UNVERSIONED:
            diffs = schema_differences(connection)
            if diffs:
                shown = "; ".join(describe_difference(d) for d in diffs[:5]) + ("; ..." if len(diffs) > 5 else "")
                raise StaleSchemaError(
                    f"Cannot upgrade {mask_password(url)}: it has peagle-tune tables without a schema revision in "
                    f"{VERSION_TABLE}, and they differ from revision {status.head!r} ({len(diffs)} differences: "
                    f"{shown}). Move this database aside and start a new one (--db or PEAGLE_DB), or restore its "
                    f"{VERSION_TABLE} table from a backup."
                )
            command.stamp(cfg, "head")
            return status.head
        if status.state is not SchemaState.CURRENT:
            command.upgrade(cfg, "head")
        if status.state is not SchemaState.FRESH:  # tables just created from the migrations are the models
            for repaired in repair_drift(connection, url):
                if on_repair is not None:
                    on_repair(repaired)
    return status.head
