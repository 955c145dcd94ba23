"""Schema management of the store: Alembic migrations, stale-schema detection, Optuna sharing, SQLite settings,
the default database location and the errors for databases that cannot be opened.
"""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from alembic import command
from sqlalchemy import inspect, text

import store._migrate as migrate
from store import (
    DatabaseUnavailableError,
    StaleSchemaError,
    Store,
    default_db_url,
    head_revision,
    mask_password,
    upgrade,
)
from store._engine import SQLITE_BUSY_TIMEOUT_MS, create_store_engine
from store._models import VERSION_TABLE, Base
from store.testing import database_url

REOPENABLE_BACKENDS = [
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

#: This peagle-tune's schema revision (versions/0002_benchmarks.py).
HEAD = "0002"
#: A later revision for the stale-schema tests: it adds one table, as a real 0003 migration would change the schema.
NEWER = "0003"
REVISION_NEWER = f'''"""Test-only revision after {HEAD}."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "{NEWER}"
down_revision = "{HEAD}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("peagle_test_extra", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("peagle_test_extra")
'''


@pytest.fixture(params=REOPENABLE_BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database that outlives one Store (SQLite file or PostgreSQL), so it can be reopened."""
    yield from database_url(request.param, tmp_path, "the schema tests")


@pytest.fixture
def newer_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make this peagle-tune's migrations end at a test revision after HEAD (as a newer release would)."""
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.SCRIPT_LOCATION, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / f"{NEWER}_test_extra.py").write_text(REVISION_NEWER)
    monkeypatch.setattr(migrate, "SCRIPT_LOCATION", scripts)
    yield


def _schema_differences(url: str) -> list[object]:
    engine = create_store_engine(url)
    try:
        with engine.connect() as connection:
            return migrate.schema_differences(connection)
    finally:
        engine.dispose()


def _execute(url: str, sql: str) -> None:
    engine = create_store_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(sql))
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------------------- migrations


def test_initial_migration_matches_the_models(db_url: str) -> None:
    with Store(db_url) as store:
        assert store.revision() == head_revision() == HEAD
    # Alembic's autogenerate compare: an empty diff means versions/ creates exactly the models.
    assert _schema_differences(db_url) == []
    engine = create_store_engine(db_url)
    try:
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert set(Base.metadata.tables) | {VERSION_TABLE} <= tables
    assert all(name.startswith("peagle_") for name in Base.metadata.tables)


def test_downgrade_to_base_leaves_an_empty_database_that_reopens_at_head(db_url: str) -> None:
    Store(db_url).close()
    engine = create_store_engine(db_url)
    try:
        with engine.begin() as connection:
            command.downgrade(migrate.alembic_config(connection=connection), "base")
        with engine.connect() as connection:
            assert migrate.our_tables(connection) == []
    finally:
        engine.dispose()
    # No peagle tables left: this is a new database again, created at head on open.
    with Store(db_url) as store:
        assert store.revision() == HEAD


def test_older_revision_is_stale_until_upgraded(db_url: str, newer_migrations: None) -> None:
    # Written by this release at HEAD; the "installed" peagle-tune now ships NEWER.
    migrate_head = migrate.head_revision()
    assert migrate_head == NEWER
    engine = create_store_engine(db_url)
    try:
        with engine.begin() as connection:
            command.upgrade(migrate.alembic_config(connection=connection), HEAD)
    finally:
        engine.dispose()

    with pytest.raises(StaleSchemaError) as info:
        Store(db_url)
    message = str(info.value)
    assert f"at schema revision '{HEAD}'" in message and f"needs revision '{NEWER}'" in message
    assert message.endswith(f"Please run `peagle-tune db upgrade --db {mask_password(db_url)}`.")

    assert upgrade(db_url) == NEWER
    with Store(db_url) as store:
        assert store.revision() == NEWER


def test_newer_revision_asks_to_upgrade_peagle_tune(db_url: str, newer_migrations: None) -> None:
    Store(db_url).close()  # created by the "newer" peagle-tune at NEWER
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(migrate, "SCRIPT_LOCATION", Path(migrate.__file__).resolve().parent / "migrations")
        with pytest.raises(StaleSchemaError, match=rf"revision '{NEWER}', which peagle-tune .* does not know") as info:
            Store(db_url)
        assert "pip install -U peagle-tune" in str(info.value)
        # Upgrading cannot help an older peagle-tune either.
        with pytest.raises(StaleSchemaError, match="pip install -U peagle-tune"):
            upgrade(db_url)


def test_missing_version_row_is_stale_and_upgrade_restores_it(db_url: str) -> None:
    with Store(db_url) as store:
        store.environment_id({"device": "cpu"})
    _execute(db_url, f"DELETE FROM {VERSION_TABLE}")

    with pytest.raises(StaleSchemaError) as info:
        Store(db_url)
    assert f"no schema revision in {VERSION_TABLE}" in str(info.value)
    assert f"Please run `peagle-tune db upgrade --db {mask_password(db_url)}`." in str(info.value)

    # The tables match the head schema, so upgrade records the revision and keeps the data.
    assert upgrade(db_url) == HEAD
    with Store(db_url) as store:
        assert store.revision() == HEAD
        assert store.environment_id({"device": "cpu"}) == 1


@pytest.mark.parametrize(
    ("damage", "difference"),
    [
        (
            "DROP TABLE peagle_trials",
            "2 differences: missing table peagle_trials; missing index ix_peagle_trials_model",
        ),
        ("ALTER TABLE peagle_models DROP COLUMN hf_id", "1 differences: missing column peagle_models.hf_id"),
    ],
)
def test_upgrade_refuses_unversioned_tables_that_differ(db_url: str, damage: str, difference: str) -> None:
    Store(db_url).close()
    _execute(db_url, f"DROP TABLE {VERSION_TABLE}")
    _execute(db_url, damage)
    with pytest.raises(StaleSchemaError) as info:
        upgrade(db_url)
    assert f"differ from revision '{HEAD}' ({difference})" in str(info.value)
    assert "Move this database aside" in str(info.value)


def test_store_upgrade_method_on_current_database_is_a_no_op(db_url: str) -> None:
    with Store(db_url) as store:
        profile_env = store.environment_id({"device": "cpu"})
        assert store.upgrade() == HEAD
        assert store.environment_id({"device": "cpu"}) == profile_env


def _open_and_register_cpu(url: str, barrier: threading.Barrier | None) -> int:
    if barrier is not None:
        barrier.wait()
    with Store(url) as store:
        return store.environment_id({"device": "cpu"})


def _open_in_process(url: str, barrier: object, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        results.put(_open_and_register_cpu(url, None))  # type: ignore[attr-defined]
    except Exception as exc:  # report, do not hang the parent
        results.put(repr(exc))  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_concurrent_first_open_creates_the_schema_once(db_url: str, workers: str) -> None:
    # Optuna workers started together all open the same new database: none may see half-created tables.
    n = 4
    if workers == "threads":
        barrier = threading.Barrier(n)
        results: list[object] = []
        threads = [
            threading.Thread(target=lambda: results.append(_open_and_register_cpu(db_url, barrier))) for _ in range(n)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        ctx = multiprocessing.get_context("fork")
        process_barrier = ctx.Barrier(n)
        queue = ctx.Queue()
        processes = [ctx.Process(target=_open_in_process, args=(db_url, process_barrier, queue)) for _ in range(n)]
        for process in processes:
            process.start()
        results = [queue.get(timeout=120) for _ in range(n)]
        for process in processes:
            process.join()
    assert results == [1] * n  # every worker opened it and got the same environment row
    with Store(db_url) as store:
        assert store.revision() == HEAD


# ---------------------------------------------------------------------------------------------------- Optuna


def test_optuna_study_shares_the_sqlite_file(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with Store(url) as store:
        study = optuna.create_study(study_name="k-search", storage=store.url, direction="maximize")
        study.optimize(lambda trial: float(trial.suggest_int("k", 1, 8)), n_trials=3)
        store.add_trial("k-search", number=0, model="m", config={"k": 1}, backend="model", values={"x": 1.0})

    # Our schema check and Alembic ignore Optuna's tables (and its own alembic_version).
    with Store(url) as store:
        assert store.revision() == HEAD
        assert store.upgrade() == HEAD
        assert [t.study for t in store.list_trials()] == ["k-search"]
    assert _schema_differences(url) == []
    loaded = optuna.load_study(study_name="k-search", storage=url)
    assert len(loaded.trials) == 3
    loaded.optimize(lambda trial: float(trial.suggest_int("k", 1, 8)), n_trials=1)
    assert len(optuna.load_study(study_name="k-search", storage=url).trials) == 4


def test_store_opens_a_database_optuna_created_first(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'optuna-first.db'}"
    optuna.create_study(study_name="first", storage=url)
    with Store(url) as store:  # only Optuna's tables: ours are created, not reported as stale
        assert store.revision() == HEAD
    assert [s.study_name for s in optuna.get_all_study_summaries(storage=url)] == ["first"]
    with sqlite3.connect(tmp_path / "optuna-first.db") as raw:
        optuna_version = raw.execute("SELECT version_num FROM alembic_version").fetchall()
    assert len(optuna_version) == 1 and optuna_version[0][0] != HEAD


# ---------------------------------------------------------------------------------------------------- SQLite


def test_sqlite_file_uses_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    Store(f"sqlite:///{path}").close()
    # journal_mode=WAL is persistent in the file: a plain sqlite3 connection sees it.
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    engine = create_store_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == SQLITE_BUSY_TIMEOUT_MS == 30_000
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_sqlite_memory_is_one_database_per_store() -> None:
    with Store("sqlite://") as first, Store("sqlite://") as second:
        first.environment_id({"device": "cpu"})
        assert first.get_environment(1).device == "cpu"  # seen by a later session of the same store
        assert second.list_profiles() == []
        second.environment_id({"device": "NVIDIA H200"})
        assert second.get_environment(1).device == "NVIDIA H200"


# ------------------------------------------------------------------------------------------ default location


def test_peagle_db_path_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PEAGLE_DB", "runs/tune.db")
    (tmp_path / "runs").mkdir()
    expected = f"sqlite:///{tmp_path.resolve() / 'runs' / 'tune.db'}"
    assert default_db_url() == expected
    with Store() as store:
        assert store.url == expected
    assert (tmp_path / "runs" / "tune.db").is_file()


def test_peagle_db_url_override_is_used_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEAGLE_DB", "postgresql+psycopg2://u:p@db.example:5432/peagle")
    assert default_db_url() == "postgresql+psycopg2://u:p@db.example:5432/peagle"


def test_default_db_is_in_the_user_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PEAGLE_DB", raising=False)
    monkeypatch.setattr("store._url.platformdirs.user_data_dir", lambda app: str(tmp_path / "data" / app))
    assert default_db_url() == f"sqlite:///{tmp_path / 'data' / 'peagle-tune' / 'peagle.db'}"
    assert (tmp_path / "data" / "peagle-tune").is_dir()  # created so the first run just works


def test_plain_path_argument_means_a_sqlite_file(tmp_path: Path) -> None:
    with Store(str(tmp_path / "plain.db")) as store:
        assert store.url == f"sqlite:///{tmp_path / 'plain.db'}"


# ------------------------------------------------------------------------------------------ unavailable databases


def test_missing_folder_says_which_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(DatabaseUnavailableError, match=f"^The folder {missing} of the database {missing / 'peagle.db'} "
                       r"does not exist: create it \(mkdir -p "):
        Store(f"sqlite:///{missing / 'peagle.db'}")


def test_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text('{"not": "a database"}' * 100)
    with pytest.raises(DatabaseUnavailableError, match=f"the file {path} is not a SQLite database"):
        Store(str(path))


def test_unreachable_server_masks_the_password() -> None:
    # Port 1 on localhost refuses connections at once.
    url = "postgresql://tuner:s3cret-pw@127.0.0.1:1/peagle"  # psycopg 3, the [postgres] extra
    with pytest.raises(DatabaseUnavailableError) as info:
        Store(url)
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "postgresql://tuner:***@127.0.0.1:1/peagle" in message
    assert "server is running" in message


def test_missing_driver_names_the_install_command() -> None:
    with pytest.raises(DatabaseUnavailableError, match="driver for 'postgresql\\+nosuchdriver' is not available"):
        Store("postgresql+nosuchdriver://u:pw@localhost/db")


def test_malformed_url_lists_the_accepted_forms() -> None:
    with pytest.raises(DatabaseUnavailableError, match="Cannot parse the database URL .* or a plain file path"):
        Store("not a url://x")


def _alembic_heads() -> list[str]:
    from alembic.script import ScriptDirectory

    return list(ScriptDirectory.from_config(migrate.alembic_config()).get_heads())


def test_the_head_read_without_alembic_is_alembics_head() -> None:
    # Opening a store reads the head from the migration files itself (Alembic takes ~0.6 s to import).
    assert [migrate.head_revision()] == _alembic_heads() == [HEAD]


def test_the_head_read_without_alembic_follows_a_newer_migration(newer_migrations: None) -> None:
    assert [migrate.head_revision()] == _alembic_heads() == [NEWER]


def test_the_revision_read_without_alembic_is_alembics(db_url: str) -> None:
    from alembic.migration import MigrationContext

    Store(db_url).close()
    engine = create_store_engine(db_url)
    try:
        with engine.connect() as connection:
            theirs = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_heads()
            assert [migrate.current_revision(connection)] == list(theirs) == [HEAD]
    finally:
        engine.dispose()
