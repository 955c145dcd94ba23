"""`Store`: opens (and creates) the database, hands out sessions, and composes the per-table repositories.

Configs, scenarios and metrics go in and come out as JSON dicts; what they mean belongs to autotune/policies.
Each table's reads and writes live in its repository (`_environments`, `_workloads`, `_catalog`, `_profiles`,
`_trials`, `_recommendations`, `_benchmarks`); `Store` exposes their methods as its own (``store.add_trial`` is
`Trials.add_trial`). Every call opens a short session through `Store._session`, and `Store._translated` is the one
place where SQLAlchemy errors become `StoreError`s (the words are in `_translate`). Each repository call is one
transaction: a write that fails (locked, disk full, damaged file) is rolled back whole.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import MethodType, TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from store._bad_rows import BadRowError
from store._benchmarks import Benchmarks
from store._catalog import Drafters, Models
from store._engine import open_engine
from store._environments import Environments
from store._migrate import (
    SchemaState,
    current_revision,
    schema_status,
    stale_schema_message,
    upgrade_engine,
)
from store._profiles import Profiles
from store._recommendations import Recommendations
from store._translate import read_only_message, translate
from store._trials import Trials
from store._url import (
    default_db_url,
    mask_password,
    normalize_db_url,
    parse_db_url,
    sqlite_file,
    sqlite_path_problem,
)
from store._workloads import Workloads
from store.exceptions import (
    BadRowWarning,
    DatabaseCorruptError,
    DatabaseUnavailableError,
    StaleSchemaError,
    StoreError,
)

#: Problems `PRAGMA quick_check` lists at most before a write is refused (the message shows the first).
QUICK_CHECK_ERRORS = 10

P = ParamSpec("P")
R = TypeVar("R")


def upgrade(url: str | None = None, on_repair: Callable[[str], None] | None = None) -> str:
    """Migrate the peagle-tune tables at `url` (default: `default_db_url()`) to the head revision; returns it.

    Optuna's tables in the same database are not touched. A database written by a newer peagle-tune raises
    `StaleSchemaError` (upgrade peagle-tune instead). Tables that drifted from the models at head are repaired
    where nothing is lost (each repair told to `on_repair`), else `StaleSchemaError` names the fix.
    """
    with Store(url, check_schema=False, for_writing=True) as store:
        return store.upgrade(on_repair)


class _Delegate(Generic[P, R]):
    """A `Store` method that is a repository's method: ``add_trial = _Delegate("_trials", Trials.add_trial)``.

    ``store.add_trial`` is then the bound method of ``store._trials``, with its signature and docstring (for mypy
    too), so each table's code lives once, in its repository.
    """

    def __init__(self, repository: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._repository = repository
        self._method = method
        self.__doc__ = method.__doc__
        self.__wrapped__ = method

    @overload
    def __get__(self, store: None, owner: type | None = None) -> _Delegate[P, R]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(self, store: object | None, owner: type | None = None) -> _Delegate[P, R] | Callable[P, R]:
        if store is None:
            return self
        bound: Callable[P, R] = MethodType(self._method, getattr(store, self._repository))
        return bound


class Store:
    """peagle-tune's database of environments, models, drafters, workloads, profiles, trials and recommendations.

    ``Store(url)`` opens `url` (None: `default_db_url()`; a plain path means a SQLite file). An empty database,
    or one holding only Optuna's tables, is created at the head revision. A database at another revision raises
    `StaleSchemaError` saying what to run; `check_schema=False` skips that check (only for `upgrade()`).

    A stored row that cannot be read (unparseable JSON, a lone surrogate, a name longer than its column) is skipped
    by listings and reported once in one line naming its table, id and problem: to `on_bad_row` (the CLI prints it
    on stderr), else as a `BadRowWarning`; `bad_rows` lists them. Reading that row by id raises `BadRowError`.

    A SQLite file this user cannot write, or one named with ``?mode=ro``, is opened read-only (`read_only` says
    why): reads work, writes raise `DatabaseUnavailableError`. Callers about to store results say so up front:
    ``for_writing=True`` refuses a read-only database and a SQLite file with a damaged page (``PRAGMA quick_check``,
    `DatabaseCorruptError` with the way to recover), ``persistent=True`` an in-memory one (``sqlite://``, which
    vanishes with the process), before any work is done. `lock_timeout_s` is how long a write waits for another
    writer's lock (default 30 s, or the URL's ``?timeout=``) before `DatabaseLockedError`.

    Example::

        with Store("sqlite:///peagle.db") as store:
            env = store.environment_id({"device": "NVIDIA H200", "gpu_count": 1, "vllm_version": "0.16.0"})
            wl = store.workload_id("mt-bench", content_hash="ab12...", classes=["chat"])
            pid = store.add_profile("openai/gpt-oss-20b", drafter="amazon/GPT-OSS-20B-P-EAGLE", method="eagle3",
                                    max_k=8, environment_id=env, workload_id=wl, acceptance={...}, step_costs=[...])
            store.latest_profile("openai/gpt-oss-20b", device="NVIDIA H200")
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        check_schema: bool = True,
        for_writing: bool = False,
        persistent: bool = False,
        lock_timeout_s: float | None = None,
        on_bad_row: Callable[[str], None] | None = None,
    ) -> None:
        self._url = normalize_db_url(url if url is not None else default_db_url())
        self._parsed = parse_db_url(self._url)
        file = sqlite_file(self._parsed)
        problem = sqlite_path_problem(file.path) if file is not None else None
        if problem is not None:
            raise DatabaseUnavailableError(problem)
        self._closed = False
        self._engine, self._access = open_engine(self._url, lock_timeout_s=lock_timeout_s)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self._on_bad_row = on_bad_row
        self._bad_rows: dict[tuple[str, object], BadRowError] = {}
        self._environments = Environments(self._session, self._skip)
        self._workloads = Workloads(self._session, self._skip)
        self._models = Models(self._session, self._skip)
        self._drafters = Drafters(self._session, self._skip)
        self._profiles = Profiles(self._session, self._skip)
        self._trials = Trials(self._session, self._skip)
        self._recommendations = Recommendations(self._session, self._skip)
        self._benchmarks = Benchmarks(self._session, self._skip)
        try:
            self._refuse(for_writing=for_writing, persistent=persistent)
            with self._translated():
                self._open(check_schema)
                if for_writing:
                    self._check_pages()
        except BaseException:
            self._engine.dispose()
            raise

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _refuse(self, *, for_writing: bool, persistent: bool) -> None:
        """Refuse, before any work, a database that cannot keep what the caller is about to store."""
        masked = mask_password(self._parsed)
        if persistent and self._access.in_memory:
            raise DatabaseUnavailableError(
                f"{masked} is an in-memory SQLite database: everything stored in it is lost when this process "
                "exits. Give a database file instead (--db peagle.db, or sqlite:////abs/path/peagle.db)."
            )
        if for_writing and self._access.read_only is not None:
            raise DatabaseUnavailableError(read_only_message(self._parsed, self._access, "this command stores results"))

    def _open(self, check_schema: bool) -> None:
        with self._engine.connect() as connection:
            status = schema_status(connection)
        if status.state is SchemaState.FRESH and self._access.read_only is not None:
            raise DatabaseUnavailableError(
                f"{mask_password(self._parsed)} has no peagle-tune tables, and it is open read-only "
                f"({self._access.read_only}), so they cannot be created. Point --db at the database a search "
                "wrote, or open this one writable once."
            )
        if status.state is SchemaState.FRESH:
            try:
                upgrade_engine(self._engine, self._url)
            except SQLAlchemyError:
                # Another process may have created the schema at the same moment: fine if it is at head now.
                with self._engine.connect() as connection:
                    if schema_status(connection).state is not SchemaState.CURRENT:
                        raise
        elif status.state is not SchemaState.CURRENT and check_schema:
            raise StaleSchemaError(stale_schema_message(status, self._url))

    def _skip(self, bad: BadRowError) -> None:
        """A listing skipped a row it cannot read: say so once per row (`on_bad_row`, else a `BadRowWarning`)."""
        key = (bad.table, bad.row_id)
        if key in self._bad_rows:
            return
        self._bad_rows[key] = bad
        if self._on_bad_row is not None:
            self._on_bad_row(bad.skipped)
        else:
            warnings.warn(bad.skipped, BadRowWarning, stacklevel=4)

    @property
    def bad_rows(self) -> list[BadRowError]:
        """The rows listings skipped so far because they cannot be read (table, id and problem in each)."""
        return list(self._bad_rows.values())

    def _check_pages(self) -> None:
        """Refuse to write into a SQLite file with a damaged page: ``PRAGMA quick_check`` (every page and record
        read once, without the index cross-checks of integrity_check) before a command stores anything."""
        file = self._access.file
        if file is None:
            return
        with self._engine.connect() as connection:
            rows = [str(row[0]) for row in connection.exec_driver_sql(f"PRAGMA quick_check({QUICK_CHECK_ERRORS})")]
        if rows == ["ok"]:
            return
        # One problem per row, or several lines in one row under a "*** in database main ***" heading.
        found = [line for row in rows for line in row.splitlines() if line.strip() and not line.startswith("***")]
        found = found or rows
        more = " and other problems" if len(found) > 1 else ""
        raise DatabaseCorruptError(
            f"{mask_password(self._parsed)} is damaged: PRAGMA quick_check found \"{found[0][:200]}\"{more}. Nothing "
            f"was written. Copy out what SQLite can still read (`sqlite3 {file.path} .recover | sqlite3 "
            "recovered.db`) and pass --db recovered.db, or restore it from a backup, or start a new database with "
            "--db."
        )

    @property
    def url(self) -> str:
        """The database URL with its password (pass it to Optuna: ``optuna.create_study(storage=store.url)``)."""
        return self._parsed.render_as_string(hide_password=False)

    @property
    def in_memory(self) -> bool:
        """True for an in-memory SQLite database (``sqlite://``): it vanishes with this `Store`."""
        return self._access.in_memory

    @property
    def read_only(self) -> str | None:
        """Why this database is open read-only (``?mode=ro``, a file this user cannot write, a read-only
        filesystem), or None when it is writable. Reads work either way; writes raise `DatabaseUnavailableError`."""
        return self._access.read_only

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Store {mask_password(self._parsed)}{state}>"

    def revision(self) -> str | None:
        """The schema revision recorded in the database (None if none)."""
        self._check_open()
        with self._translated(), self._engine.connect() as connection:
            return current_revision(connection)

    def upgrade(self, on_repair: Callable[[str], None] | None = None) -> str:
        """Migrate our tables to the head revision (Optuna's are untouched) and repair drift from the models there
        (`store._migrate.repair_drift`, each repair told to `on_repair`); returns the head revision."""
        self._check_open()
        with self._translated():
            return upgrade_engine(self._engine, self._url, on_repair)

    def close(self) -> None:
        """Release the database connections. Closing twice is fine; using a closed store raises `StoreError`."""
        if not self._closed:
            self._engine.dispose()
            self._closed = True

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"This Store for {mask_password(self._parsed)} is closed; open a new one with Store(url).")

    @contextmanager
    def _session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on any error (SQLAlchemy's become `StoreError`s)."""
        self._check_open()
        with self._translated():
            session = self._sessions()
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                session.close()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """The one place SQLAlchemy errors become `StoreError`s (sessions, opening, revision, upgrade)."""
        try:
            yield
        except SQLAlchemyError as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: SQLAlchemyError) -> StoreError:
        """The `StoreError` for a SQLAlchemy error: what failed, on which database (password masked), and the fix."""
        return translate(exc, self._parsed, self._access)

    # ------------------------------------------------------------------------------- records, by repository

    environment_id = _Delegate("_environments", Environments.environment_id)
    get_environment = _Delegate("_environments", Environments.get_environment)

    upsert_model = _Delegate("_models", Models.upsert_model)
    get_model = _Delegate("_models", Models.get_model)
    upsert_drafter = _Delegate("_drafters", Drafters.upsert_drafter)
    get_drafter = _Delegate("_drafters", Drafters.get_drafter)
    list_drafters = _Delegate("_drafters", Drafters.list_drafters)

    workload_id = _Delegate("_workloads", Workloads.workload_id)
    get_workload = _Delegate("_workloads", Workloads.get_workload)

    add_profile = _Delegate("_profiles", Profiles.add_profile)
    get_profile = _Delegate("_profiles", Profiles.get_profile)
    list_profiles = _Delegate("_profiles", Profiles.list_profiles)
    latest_profile = _Delegate("_profiles", Profiles.latest_profile)

    add_trial = _Delegate("_trials", Trials.add_trial)
    add_trials = _Delegate("_trials", Trials.add_trials)
    update_trial = _Delegate("_trials", Trials.update_trial)
    get_trial = _Delegate("_trials", Trials.get_trial)
    list_trials = _Delegate("_trials", Trials.list_trials)
    list_studies = _Delegate("_trials", Trials.list_studies)

    add_recommendation = _Delegate("_recommendations", Recommendations.add_recommendation)
    get_recommendation = _Delegate("_recommendations", Recommendations.get_recommendation)
    list_recommendations = _Delegate("_recommendations", Recommendations.list_recommendations)
    latest_recommendation = _Delegate("_recommendations", Recommendations.latest_recommendation)

    add_benchmark = _Delegate("_benchmarks", Benchmarks.add_benchmark)
    list_benchmarks = _Delegate("_benchmarks", Benchmarks.list_benchmarks)
