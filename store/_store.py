"""The repository: `Store` opens (and creates) the database and reads/writes records.

Configs, scenarios and metrics go in and come out as JSON dicts; what they mean belongs to autotune/policies.
Every method opens a short session through `_session`, the one place where SQLAlchemy errors become `StoreError`s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from sqlalchemy import Engine, Select, select
from sqlalchemy.exc import DisconnectionError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from store import _validate as v
from store._engine import SQLITE_BUSY_TIMEOUT_MS, create_store_engine
from store._migrate import (
    SchemaState,
    current_revision,
    schema_status,
    stale_schema_message,
    upgrade_engine,
)
from store._models import (
    PROFILE_KINDS,
    TRIAL_STATUSES,
    Drafter,
    Environment,
    Model,
    Profile,
    Recommendation,
    Trial,
    Workload,
    utcnow,
)
from store._records import (
    DrafterRecord,
    EnvironmentRecord,
    ModelRecord,
    ProfileRecord,
    RecommendationRecord,
    StudySummary,
    TrialRecord,
    WorkloadRecord,
)
from store._url import default_db_url, is_sqlite_memory, mask_password, normalize_db_url, parse_db_url
from store.exceptions import (
    DatabaseUnavailableError,
    InvalidRecordError,
    NotFoundError,
    StaleSchemaError,
    StoreError,
)

Direction = Literal["maximize", "minimize"]

#: Substrings of an objective name that mean "lower is better" when `list_studies` gets no direction for it.
MINIMIZE_HINTS: tuple[str, ...] = ("_ms", "latency", "tpot", "ttft", "cost")


# Words in driver messages (psycopg, psycopg2, pymysql) that mean the connection itself failed.
_CONNECT_FAILURE_HINTS: tuple[str, ...] = (
    "connect",
    "could not translate host",
    "authentication",
    "password",
    "does not exist",
    "access denied",
    "timeout expired",
)


def default_direction(objective: str) -> Direction:
    """Direction assumed for `objective`: "minimize" if its name contains one of `MINIMIZE_HINTS`, else "maximize"."""
    return "minimize" if any(h in objective.lower() for h in MINIMIZE_HINTS) else "maximize"


def upgrade(url: str | None = None) -> str:
    """Migrate the peagle-tune tables at `url` (default: `default_db_url()`) to the head revision; returns it.

    Optuna's tables in the same database are not touched. A database written by a newer peagle-tune raises
    `StaleSchemaError` (upgrade peagle-tune instead).
    """
    with Store(url, check_schema=False) as store:
        return store.upgrade()


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite returns naive datetimes; every timestamp we write is UTC.
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _none_if_empty(value: str) -> str | None:
    return value or None


class Store:
    """peagle-tune's database of environments, models, drafters, workloads, profiles, trials and recommendations.

    ``Store(url)`` opens `url` (None: `default_db_url()`; a plain path means a SQLite file). An empty database,
    or one holding only Optuna's tables, is created at the head revision. A database at another revision raises
    `StaleSchemaError` saying what to run; `check_schema=False` skips that check (only for `upgrade()`).

    Example::

        with Store("sqlite:///peagle.db") as store:
            env = store.environment_id({"device": "NVIDIA H200", "gpu_count": 1, "vllm_version": "0.16.0"})
            wl = store.workload_id("mt-bench", content_hash="ab12...", classes=["chat"])
            pid = store.add_profile("openai/gpt-oss-20b", drafter="amazon/GPT-OSS-20B-P-EAGLE", method="eagle3",
                                    max_k=8, environment_id=env, workload_id=wl, acceptance={...}, step_costs=[...])
            store.latest_profile("openai/gpt-oss-20b", device="NVIDIA H200")
    """

    def __init__(self, url: str | None = None, *, check_schema: bool = True) -> None:
        self._url = normalize_db_url(url if url is not None else default_db_url())
        self._parsed = parse_db_url(self._url)
        self._closed = False
        self._engine: Engine = create_store_engine(self._url)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            with self._translated():
                self._open(check_schema)
        except BaseException:
            self._engine.dispose()
            raise

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _open(self, check_schema: bool) -> None:
        with self._engine.connect() as connection:
            status = schema_status(connection)
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

    @property
    def url(self) -> str:
        """The database URL with its password (pass it to Optuna: ``optuna.create_study(storage=store.url)``)."""
        return self._parsed.render_as_string(hide_password=False)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Store {mask_password(self._parsed)}{state}>"

    def revision(self) -> str | None:
        """The schema revision recorded in the database (None if none)."""
        self._check_open()
        with self._translated(), self._engine.connect() as connection:
            return current_revision(connection)

    def upgrade(self) -> str:
        """Migrate our tables to the head revision (Optuna's are untouched); returns the head revision."""
        self._check_open()
        with self._translated():
            return upgrade_engine(self._engine, self._url)

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
        masked = mask_password(self._parsed)
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        lowered = detail.lower()
        sqlite_file = self._parsed.get_backend_name() == "sqlite" and not is_sqlite_memory(self._parsed)
        if sqlite_file and "not a database" in lowered:
            return DatabaseUnavailableError(
                f"Cannot open {masked}: the file {self._parsed.database} is not a SQLite database ({detail}). "
                "Choose another file with --db or PEAGLE_DB."
            )
        if isinstance(exc, OperationalError | InterfaceError | DisconnectionError):
            if "database is locked" in lowered or "database is busy" in lowered:
                return DatabaseUnavailableError(
                    f"{masked} is locked by another process ({detail}; peagle-tune waits up to "
                    f"{SQLITE_BUSY_TIMEOUT_MS // 1000} s for a lock). Wait for that process to finish, or give this "
                    "run its own database with --db or PEAGLE_DB."
                )
            if sqlite_file and any(k in lowered for k in ("unable to open", "readonly", "read-only", "disk i/o")):
                folder = Path(self._parsed.database or ".").parent
                return DatabaseUnavailableError(
                    f"Cannot open the peagle-tune database {masked}: {detail}. Check that the folder {folder} exists "
                    "and is writable, or choose another file with --db or PEAGLE_DB."
                )
            if not sqlite_file and any(k in lowered for k in _CONNECT_FAILURE_HINTS):
                return DatabaseUnavailableError(
                    f"Cannot connect to the peagle-tune database {masked}: {detail}. Check that the database server "
                    "is running and reachable and that the user, password, host and database name in the URL are "
                    "right (set it with --db or PEAGLE_DB)."
                )
            return DatabaseUnavailableError(
                f"The database {masked} failed: {detail}. If tables are missing, run `peagle-tune db upgrade --db "
                f"{masked}`; otherwise check that the database is reachable and retry."
            )
        if isinstance(exc, IntegrityError):
            return StoreError(f"The write to {masked} broke a database rule: {detail}.")
        return StoreError(f"Database error on {masked}: {detail}.")

    # --------------------------------------------------------------------------------------------- environments

    def environment_id(self, info: Mapping[str, Any]) -> int:
        """Id of the environment with exactly these values, created if new.

        `info` keys: device ("cpu" or GPU name, required), gpu_count, driver, vllm_version, torch_version.
        Unknown keys raise `InvalidRecordError`; missing optional keys count as unknown ('' / 0).
        """
        values = v.environment(info)
        query = select(Environment.id).filter_by(**values)
        with self._session() as session:
            found = session.scalar(query)
            if found is not None:
                return found
            row = Environment(**values, created_at=utcnow())
            session.add(row)
            try:
                session.flush()
            except IntegrityError:
                # A concurrent writer created it between our SELECT and INSERT.
                session.rollback()
                found = session.scalar(query)
                if found is None:
                    raise
                return found
            return row.id

    def get_environment(self, environment_id: int) -> EnvironmentRecord:
        with self._session() as session:
            row = session.get(Environment, environment_id)
            if row is None:
                raise NotFoundError(f"No environment with id {environment_id}.")
            return _environment_record(row)

    # ------------------------------------------------------------------------------------------ models/drafters

    def upsert_model(self, name: str, *, hf_id: str | None = None, info: Mapping[str, Any] | None = None) -> int:
        """Create or update the model `name`; returns its id. None arguments keep the stored value."""
        v.text("model name", name)
        hf = v.optional_text("hf_id", hf_id)
        data = None if info is None else v.json_dict("info", info)
        with self._session() as session:
            row = session.scalar(select(Model).where(Model.name == name))
            now = utcnow()
            if row is None:
                row = Model(name=name, hf_id=hf, info=data or {}, created_at=now, updated_at=now)
                session.add(row)
            else:
                if hf is not None:
                    row.hf_id = hf
                if data is not None:
                    row.info = data
                row.updated_at = now
            session.flush()
            return row.id

    def get_model(self, name: str) -> ModelRecord:
        with self._session() as session:
            row = session.scalar(select(Model).where(Model.name == name))
            if row is None:
                raise NotFoundError(f"No model named {name!r} in the store. Register it with upsert_model().")
            return ModelRecord(
                id=row.id,
                name=row.name,
                hf_id=row.hf_id,
                info=dict(row.info),
                created_at=_utc(row.created_at),
                updated_at=_utc(row.updated_at),
            )

    def upsert_drafter(
        self,
        name: str,
        *,
        target: str,
        method: str,
        layers: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> int:
        """Create or update the drafter `name` (for target model `target`); returns its id.

        target and method are always written; None layers/info keep the stored value.
        """
        v.text("drafter name", name)
        v.text("drafter target", target)
        v.text("drafter method", method)
        n_layers = v.optional_integer("drafter layers", layers, minimum=1)
        data = None if info is None else v.json_dict("info", info)
        with self._session() as session:
            row = session.scalar(select(Drafter).where(Drafter.name == name))
            now = utcnow()
            if row is None:
                row = Drafter(
                    name=name,
                    target=target,
                    method=method,
                    layers=n_layers,
                    info=data or {},
                    created_at=now,
                    updated_at=now,
                )
                session.add(row)
            else:
                row.target = target
                row.method = method
                if n_layers is not None:
                    row.layers = n_layers
                if data is not None:
                    row.info = data
                row.updated_at = now
            session.flush()
            return row.id

    def get_drafter(self, name: str) -> DrafterRecord:
        with self._session() as session:
            row = session.scalar(select(Drafter).where(Drafter.name == name))
            if row is None:
                raise NotFoundError(f"No drafter named {name!r} in the store. Register it with upsert_drafter().")
            return _drafter_record(row)

    def list_drafters(self, target: str | None = None) -> list[DrafterRecord]:
        """Drafters (of `target` if given), by name."""
        query = select(Drafter).order_by(Drafter.name)
        if target is not None:
            query = query.where(Drafter.target == target)
        with self._session() as session:
            return [_drafter_record(row) for row in session.scalars(query)]

    # ------------------------------------------------------------------------------------------------ workloads

    def workload_id(self, name: str, *, content_hash: str, classes: Sequence[str], source: str = "") -> int:
        """Id of the workload with this content hash, created if new (name/classes/source of the first call stay)."""
        v.text("workload name", name)
        v.text("workload content_hash", content_hash)
        class_list = v.string_list("workload classes", classes)
        v.text("workload source", source, required=False)
        query = select(Workload.id).where(Workload.content_hash == content_hash)
        with self._session() as session:
            found = session.scalar(query)
            if found is not None:
                return found
            row = Workload(name=name, content_hash=content_hash, classes=class_list, source=source, created_at=utcnow())
            session.add(row)
            try:
                session.flush()
            except IntegrityError:
                session.rollback()
                found = session.scalar(query)
                if found is None:
                    raise
                return found
            return row.id

    def get_workload(self, workload_id: int) -> WorkloadRecord:
        with self._session() as session:
            row = session.get(Workload, workload_id)
            if row is None:
                raise NotFoundError(f"No workload with id {workload_id}.")
            return WorkloadRecord(
                id=row.id,
                name=row.name,
                content_hash=row.content_hash,
                classes=list(row.classes),
                source=row.source,
                created_at=_utc(row.created_at),
            )

    # ------------------------------------------------------------------------------------------------- profiles

    def add_profile(
        self,
        model: str,
        *,
        method: str,
        max_k: int,
        environment_id: int,
        acceptance: Mapping[str, Any],
        step_costs: Sequence[Mapping[str, Any]],
        drafter: str | None = None,
        drafter_layers: int | None = None,
        parallel_drafting: bool = False,
        workload_id: int | None = None,
        cost_model: Mapping[str, Any] | None = None,
        kind: str = "measured",
        notes: Mapping[str, Any] | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store a profile; returns its id.

        acceptance: {class: {"num_drafts": int, "accepted_per_position": [int, ...]}} (measured counts).
        step_costs: [{"batch_size": int, "depth": int, "step_ms": float (ms, measured mean), "n": int}].
        environment_id / workload_id: from `environment_id()` / `workload_id()`.
        """
        row = Profile(
            model=v.text("model", model),
            drafter=v.optional_text("drafter", drafter),
            drafter_layers=v.optional_integer("drafter_layers", drafter_layers, minimum=1),
            method=v.text("method", method),
            parallel_drafting=bool(parallel_drafting),
            max_k=v.integer("max_k", max_k, minimum=0),
            environment_id=v.integer("environment_id", environment_id, minimum=1),
            workload_id=v.optional_integer("workload_id", workload_id, minimum=1),
            acceptance=v.acceptance(acceptance),
            step_costs=v.step_costs(step_costs),
            cost_model=None if cost_model is None else v.json_dict("cost_model", cost_model),
            kind=v.choice("kind", kind, PROFILE_KINDS),
            notes=v.json_dict("notes", notes),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            if session.get(Environment, row.environment_id) is None:
                raise NotFoundError(
                    f"No environment with id {row.environment_id}; get one with environment_id(info) first."
                )
            if row.workload_id is not None and session.get(Workload, row.workload_id) is None:
                raise NotFoundError(f"No workload with id {row.workload_id}; get one with workload_id(...) first.")
            session.add(row)
            session.flush()
            return row.id

    def get_profile(self, profile_id: int) -> ProfileRecord:
        with self._session() as session:
            row = session.get(Profile, profile_id)
            if row is None:
                raise NotFoundError(f"No profile with id {profile_id}. List them with `peagle-tune show --profiles`.")
            return _profile_record(row)

    def list_profiles(
        self, model: str | None = None, *, drafter: str | None = None, limit: int | None = None
    ) -> list[ProfileRecord]:
        """Profiles (filtered by model/drafter if given), newest first."""
        query = self._profile_query(model=model, drafter=drafter)
        if limit is not None:
            query = query.limit(v.integer("limit", limit, minimum=1))
        with self._session() as session:
            return [_profile_record(row) for row in session.scalars(query).unique()]

    def latest_profile(
        self,
        model: str,
        *,
        drafter: str | None = None,
        device: str | None = None,
        workload_hash: str | None = None,
        kind: str | None = None,
    ) -> ProfileRecord | None:
        """The newest profile of `model` matching every filter given, or None if there is none."""
        query = self._profile_query(
            model=model, drafter=drafter, device=device, workload_hash=workload_hash, kind=kind
        ).limit(1)
        with self._session() as session:
            row = session.scalars(query).unique().first()
            return None if row is None else _profile_record(row)

    @staticmethod
    def _profile_query(
        *,
        model: str | None = None,
        drafter: str | None = None,
        device: str | None = None,
        workload_hash: str | None = None,
        kind: str | None = None,
    ) -> Select[Profile]:
        query = select(Profile).order_by(Profile.created_at.desc(), Profile.id.desc())
        if model is not None:
            query = query.where(Profile.model == model)
        if drafter is not None:
            query = query.where(Profile.drafter == drafter)
        if device is not None:
            query = query.where(Profile.environment.has(Environment.device == device))
        if workload_hash is not None:
            query = query.where(Profile.workload.has(Workload.content_hash == workload_hash))
        if kind is not None:
            query = query.where(Profile.kind == v.choice("kind", kind, PROFILE_KINDS))
        return query

    # --------------------------------------------------------------------------------------------------- trials

    def add_trial(
        self,
        study: str,
        *,
        number: int,
        model: str,
        config: Mapping[str, Any],
        backend: str,
        scenario: Mapping[str, Any] | None = None,
        values: Mapping[str, float] | None = None,
        metrics: Mapping[str, Any] | None = None,
        status: str = "complete",
        failure_reason: str | None = None,
        provenance: Mapping[str, Any] | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store trial `number` of `study`; returns its id. (study, number) is unique: use `update_trial` to change.

        values: {objective: value} in the objective's unit (tokens/s, ms); backend: "vllm" or "model".
        """
        row = Trial(
            study=v.text("study", study),
            number=v.integer("number", number, minimum=0),
            model=v.text("model", model),
            config=v.json_dict("config", config),
            scenario=v.json_dict("scenario", scenario),
            values=v.objective_values(values),
            metrics=v.json_dict("metrics", metrics),
            status=v.choice("status", status, TRIAL_STATUSES),
            failure_reason=v.optional_text("failure_reason", failure_reason),
            backend=v.text("backend", backend),
            provenance=v.json_dict("provenance", provenance),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            existing = session.scalar(select(Trial.id).where(Trial.study == study, Trial.number == number))
            if existing is not None:
                raise InvalidRecordError(
                    f"Trial {number} of study {study!r} is already stored (id {existing}); trial numbers are unique "
                    f"per study. Use update_trial({existing}, ...) to change it."
                )
            session.add(row)
            session.flush()
            return row.id

    def update_trial(
        self,
        trial_id: int,
        *,
        status: str | None = None,
        values: Mapping[str, float] | None = None,
        metrics: Mapping[str, Any] | None = None,
        failure_reason: str | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        """Finish or correct a stored trial (e.g. "running" -> "complete"); None arguments keep the stored value."""
        changes: dict[str, Any] = {}
        if status is not None:
            changes["status"] = v.choice("status", status, TRIAL_STATUSES)
        if values is not None:
            changes["values"] = v.objective_values(values)
        if metrics is not None:
            changes["metrics"] = v.json_dict("metrics", metrics)
        if failure_reason is not None:
            changes["failure_reason"] = v.optional_text("failure_reason", failure_reason)
        if provenance is not None:
            changes["provenance"] = v.json_dict("provenance", provenance)
        with self._session() as session:
            row = session.get(Trial, trial_id)
            if row is None:
                raise NotFoundError(f"No trial with id {trial_id}.")
            for key, value in changes.items():
                setattr(row, key, value)

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self._session() as session:
            row = session.get(Trial, trial_id)
            if row is None:
                raise NotFoundError(f"No trial with id {trial_id}.")
            return _trial_record(row)

    def list_trials(
        self, study: str | None = None, *, model: str | None = None, status: str | None = None
    ) -> list[TrialRecord]:
        """Trials (filtered if asked) in the order they were run: by study, then trial number."""
        query = select(Trial).order_by(Trial.study, Trial.number)
        if study is not None:
            query = query.where(Trial.study == study)
        if model is not None:
            query = query.where(Trial.model == model)
        if status is not None:
            query = query.where(Trial.status == v.choice("status", status, TRIAL_STATUSES))
        with self._session() as session:
            return [_trial_record(row) for row in session.scalars(query)]

    def list_studies(self, directions: Mapping[str, Direction] | None = None) -> list[StudySummary]:
        """One summary per study in our trials table, most recently active first.

        The best value of each objective is the max, or the min for objectives that `directions` marks
        "minimize" (objectives not in `directions` follow `default_direction`: latency-like names are minimized).
        """
        directions = dict(directions or {})
        for objective, direction in directions.items():
            v.choice(f"directions[{objective!r}]", direction, ("maximize", "minimize"))
        query = select(Trial.study, Trial.number, Trial.model, Trial.status, Trial.values, Trial.created_at).order_by(
            Trial.study, Trial.number
        )
        with self._session() as session:
            rows = session.execute(query).all()
        grouped: dict[str, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row.study, []).append(row)
        summaries = [_study_summary(study, trials, directions) for study, trials in grouped.items()]
        summaries.sort(key=lambda s: (s.last_created_at, s.study), reverse=True)
        return summaries

    # ------------------------------------------------------------------------------------------ recommendations

    def add_recommendation(
        self,
        model: str,
        *,
        gpu: str,
        objective: str,
        best_config: Mapping[str, Any],
        scenario: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        provenance: Mapping[str, Any] | None = None,
        pareto: Sequence[Any] | None = None,
        schedule: Sequence[Any] | None = None,
        class_policy: Mapping[str, Any] | None = None,
        vllm_version: str | None = None,
        workload_name: str | None = None,
        workload_hash: str | None = None,
        study: str | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store a recommendation for `model` on `gpu` ("cpu" or GPU name); returns its id."""
        row = Recommendation(
            model=v.text("model", model),
            gpu=v.text("gpu", gpu),
            vllm_version=v.optional_text("vllm_version", vllm_version),
            workload_name=v.optional_text("workload_name", workload_name),
            workload_hash=v.optional_text("workload_hash", workload_hash),
            objective=v.text("objective", objective),
            scenario=v.json_dict("scenario", scenario),
            best_config=v.json_dict("best_config", best_config),
            metrics=v.json_dict("metrics", metrics),
            provenance=v.json_dict("provenance", provenance),
            pareto=v.json_list("pareto", pareto),
            schedule=v.json_list("schedule", schedule),
            class_policy=v.json_dict("class_policy", class_policy),
            study=v.optional_text("study", study),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            session.add(row)
            session.flush()
            return row.id

    def get_recommendation(self, recommendation_id: int) -> RecommendationRecord:
        with self._session() as session:
            row = session.get(Recommendation, recommendation_id)
            if row is None:
                raise NotFoundError(
                    f"No recommendation with id {recommendation_id}. List them with `peagle-tune show`."
                )
            return _recommendation_record(row)

    def list_recommendations(self, model: str | None = None, *, limit: int | None = None) -> list[RecommendationRecord]:
        """Recommendations (for `model` if given), newest first."""
        query = self._recommendation_query(model=model)
        if limit is not None:
            query = query.limit(v.integer("limit", limit, minimum=1))
        with self._session() as session:
            return [_recommendation_record(row) for row in session.scalars(query)]

    def latest_recommendation(
        self,
        model: str | None = None,
        *,
        gpu: str | None = None,
        workload_hash: str | None = None,
        objective: str | None = None,
    ) -> RecommendationRecord | None:
        """The newest recommendation matching every filter given, or None if there is none."""
        query = self._recommendation_query(
            model=model, gpu=gpu, workload_hash=workload_hash, objective=objective
        ).limit(1)
        with self._session() as session:
            row = session.scalars(query).first()
            return None if row is None else _recommendation_record(row)

    @staticmethod
    def _recommendation_query(
        *,
        model: str | None = None,
        gpu: str | None = None,
        workload_hash: str | None = None,
        objective: str | None = None,
    ) -> Select[Recommendation]:
        query = select(Recommendation).order_by(Recommendation.created_at.desc(), Recommendation.id.desc())
        if model is not None:
            query = query.where(Recommendation.model == model)
        if gpu is not None:
            query = query.where(Recommendation.gpu == gpu)
        if workload_hash is not None:
            query = query.where(Recommendation.workload_hash == workload_hash)
        if objective is not None:
            query = query.where(Recommendation.objective == objective)
        return query


# ------------------------------------------------------------------------------------------- row -> record


def _environment_record(row: Environment) -> EnvironmentRecord:
    return EnvironmentRecord(
        id=row.id,
        device=row.device,
        gpu_count=row.gpu_count,
        driver=_none_if_empty(row.driver),
        vllm_version=_none_if_empty(row.vllm_version),
        torch_version=_none_if_empty(row.torch_version),
        created_at=_utc(row.created_at),
    )


def _drafter_record(row: Drafter) -> DrafterRecord:
    return DrafterRecord(
        id=row.id,
        name=row.name,
        target=row.target,
        method=row.method,
        layers=row.layers,
        info=dict(row.info),
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
    )


def _profile_record(row: Profile) -> ProfileRecord:
    env = row.environment
    workload = row.workload
    return ProfileRecord(
        id=row.id,
        model=row.model,
        drafter=row.drafter,
        drafter_layers=row.drafter_layers,
        method=row.method,
        parallel_drafting=bool(row.parallel_drafting),
        max_k=row.max_k,
        acceptance=v.json_value("acceptance", row.acceptance),
        step_costs=v.json_value("step_costs", row.step_costs),
        cost_model=None if row.cost_model is None else v.json_value("cost_model", row.cost_model),
        kind=row.kind,
        notes=v.json_value("notes", row.notes),
        environment_id=row.environment_id,
        device=env.device,
        gpu_count=env.gpu_count,
        driver=_none_if_empty(env.driver),
        vllm_version=_none_if_empty(env.vllm_version),
        torch_version=_none_if_empty(env.torch_version),
        workload_id=row.workload_id,
        workload_name=None if workload is None else workload.name,
        workload_hash=None if workload is None else workload.content_hash,
        created_at=_utc(row.created_at),
    )


def _trial_record(row: Trial) -> TrialRecord:
    return TrialRecord(
        id=row.id,
        study=row.study,
        number=row.number,
        model=row.model,
        config=v.json_value("config", row.config),
        scenario=v.json_value("scenario", row.scenario),
        values={k: float(x) for k, x in row.values.items()},
        metrics=v.json_value("metrics", row.metrics),
        status=row.status,
        failure_reason=row.failure_reason,
        backend=row.backend,
        provenance=v.json_value("provenance", row.provenance),
        created_at=_utc(row.created_at),
    )


def _recommendation_record(row: Recommendation) -> RecommendationRecord:
    provenance = v.json_value("provenance", row.provenance)
    torch_version = provenance.get("torch_version")
    return RecommendationRecord(
        id=row.id,
        model=row.model,
        gpu=row.gpu,
        vllm_version=row.vllm_version,
        torch_version=torch_version if isinstance(torch_version, str) else None,
        workload_name=row.workload_name,
        workload_hash=row.workload_hash,
        objective=row.objective,
        scenario=v.json_value("scenario", row.scenario),
        best_config=v.json_value("best_config", row.best_config),
        metrics=v.json_value("metrics", row.metrics),
        provenance=provenance,
        pareto=v.json_value("pareto", row.pareto),
        schedule=v.json_value("schedule", row.schedule),
        class_policy=v.json_value("class_policy", row.class_policy),
        study=row.study,
        created_at=_utc(row.created_at),
    )


def _study_summary(study: str, trials: list[Any], directions: Mapping[str, Direction]) -> StudySummary:
    counts = {status: 0 for status in TRIAL_STATUSES}
    best_values: dict[str, float] = {}
    best_numbers: dict[str, int] = {}
    for trial in trials:  # ordered by trial number, so ties keep the earliest trial
        counts[trial.status] += 1
        if trial.status != "complete":
            continue
        for objective, value in trial.values.items():
            sign = -1.0 if directions.get(objective, default_direction(objective)) == "minimize" else 1.0
            if objective not in best_values or sign * value > sign * best_values[objective]:
                best_values[objective] = float(value)
                best_numbers[objective] = trial.number
    created = [_utc(t.created_at) for t in trials]
    return StudySummary(
        study=study,
        models=tuple(sorted({t.model for t in trials})),
        n_trials=len(trials),
        n_complete=counts["complete"],
        n_failed=counts["failed"],
        n_pruned=counts["pruned"],
        n_running=counts["running"],
        best_values=best_values,
        best_trial_numbers=best_numbers,
        first_created_at=min(created),
        last_created_at=max(created),
    )
