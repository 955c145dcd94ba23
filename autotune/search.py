"""Search: an Optuna study per scenario over the space, each trial measured (or predicted) by a backend.

Pieces, top to bottom:

- `Objective`: what is optimised (throughput, latency, goodput under SLOs, or the throughput/TPOT Pareto front) and
  the SLO constraints (Optuna constraints: a trial is feasible when every value is <= 0);
- `Strategy`: how the next config is chosen (`blackbox` TPE/GP with pruning, `random`, `grid`; `register_strategy`
  is where `model-guided` plugs in);
- coordination: the study lives in the project's database (or `--storage`), so `--study NAME` resumes after a crash
  with no completed trial lost and several workers on several hosts can share it. Workers claim trials one at a time
  under a lock (a file lock for SQLite, an advisory lock for PostgreSQL), which keeps the study's total at the
  requested number with no config measured twice; heartbeats turn a killed worker's RUNNING trial into FAIL and
  re-queue it;
- `Search`: runs the loop, writes every trial to our store as well, and picks the recommendation.

Every figure keeps the provenance the backend gave it (measured or predicted).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import re
import socket
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event, make_url
from sqlalchemy.exc import SQLAlchemyError

from autotune.backends.base import Backend
from autotune.config import Measurement, Scenario, SpecConfig
from autotune.exceptions import PeagleError, UsageError
from autotune.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.space import SearchSpace
from autotune.workloads import Workload
from store import InvalidRecordError, Store, mask_password

log = logging.getLogger(__name__)

__all__ = [
    "OBJECTIVES",
    "STRATEGIES",
    "BlackboxStrategy",
    "GridStrategy",
    "Objective",
    "ParetoPoint",
    "ProgressCallback",
    "RandomStrategy",
    "RelativeToBestPruner",
    "ScenarioResult",
    "Search",
    "SearchEvent",
    "Strategy",
    "StrategyContext",
    "StudyStorageError",
    "default_study_prefix",
    "make_strategy",
    "measurement_metrics",
    "register_strategy",
    "study_name_for",
]

# ----------------------------------------------------------------------------------------------------- objectives

OBJECTIVES: tuple[str, ...] = ("throughput", "latency", "goodput", "pareto")

#: SLO name -> the metric it bounds (ms).
SLO_METRICS: dict[str, str] = {"tpot_ms_p99": "TPOT p99", "ttft_ms_p99": "TTFT p99"}


class _TrialFailed(Exception):
    """A measurement that came back without the figure the objective needs."""


class StudyStorageError(PeagleError):
    """The Optuna storage (--storage, or the --db database) cannot be opened."""


@dataclass(frozen=True)
class Objective:
    """What a search optimises, and the SLOs every recommended config must meet.

    - ``throughput``: maximise output tokens/s;
    - ``latency``: minimise TPOT p50 (ms per output token; p99 is reported);
    - ``goodput``: maximise output tokens/s among configs that meet the SLOs (at least one SLO required);
    - ``pareto``: maximise output tokens/s and minimise TPOT p99 together; the front is kept and the recommended
      point is the front's highest-throughput config that meets the SLOs given.

    SLOs given with any objective are Optuna constraints (``trial.set_constraint``): ``metric - slo`` in ms, feasible
    when <= 0. Violating trials stay in the study and the store with their constraint values and are never
    recommended.
    """

    name: str = "throughput"
    slo_tpot_p99_ms: float | None = None
    """Largest acceptable TPOT p99, ms."""
    slo_ttft_p99_ms: float | None = None
    """Largest acceptable TTFT p99, ms."""

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, but got {self.name!r}.")
        for option, value in (("--slo-tpot-p99", self.slo_tpot_p99_ms), ("--slo-ttft-p99", self.slo_ttft_p99_ms)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"{option} must be a positive number of milliseconds, but got {value}.")
        if self.name == "goodput" and not self.slos:
            raise UsageError(
                "--objective goodput maximises throughput subject to SLOs, but none was given. "
                "Pass --slo-tpot-p99 MS and/or --slo-ttft-p99 MS, or use --objective throughput."
            )

    @property
    def slos(self) -> dict[str, float]:
        """{metric: bound in ms} for the SLOs given."""
        out: dict[str, float] = {}
        if self.slo_tpot_p99_ms is not None:
            out["tpot_ms_p99"] = float(self.slo_tpot_p99_ms)
        if self.slo_ttft_p99_ms is not None:
            out["ttft_ms_p99"] = float(self.slo_ttft_p99_ms)
        return out

    @property
    def multi(self) -> bool:
        return self.name == "pareto"

    @property
    def value_names(self) -> list[str]:
        """The metrics Optuna optimises, in order (also the keys of a stored trial's ``values``)."""
        return {
            "throughput": ["output_tokens_per_s"],
            "goodput": ["output_tokens_per_s"],
            "latency": ["tpot_ms_p50"],
            "pareto": ["output_tokens_per_s", "tpot_ms_p99"],
        }[self.name]

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        return ["minimize" if n.startswith(("tpot", "ttft")) else "maximize" for n in self.value_names]

    def values(self, metrics: Mapping[str, Any]) -> list[float]:
        """The objective values of a measurement's metrics (see `measurement_metrics`)."""
        out = []
        for name in self.value_names:
            value = metrics.get(name)
            if value is None or not math.isfinite(float(value)):
                raise _TrialFailed(f"the backend returned no {name} figure, which objective {self.name} needs")
            out.append(float(value))
        return out

    def constraints(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """{metric: value - SLO} in ms; feasible when every entry is <= 0. A missing figure violates its SLO."""
        out: dict[str, float] = {}
        for metric, bound in self.slos.items():
            value = metrics.get(metric)
            out[metric] = math.inf if value is None else float(value) - bound
        return out

    def progress_value(self, partial: Measurement) -> float | None:
        """The value a partial (warm-up) measurement reports for pruning; None for multi-objective studies, which
        Optuna cannot prune."""
        if self.multi or not partial.ok:
            return None
        value = partial.tpot_ms_p50 if self.name == "latency" else partial.output_tokens_per_s
        return None if value is None or not math.isfinite(value) else float(value)

    def describe(self) -> str:
        base = {
            "throughput": "max output tokens/s",
            "latency": "min TPOT p50",
            "goodput": "max output tokens/s",
            "pareto": "Pareto front of output tokens/s vs TPOT p99",
        }[self.name]
        slos = ", ".join(f"{SLO_METRICS[m]} <= {v:g} ms" for m, v in self.slos.items())
        return f"{base} subject to {slos}" if slos else base

    def slug(self) -> str:
        """Short name for default study names, e.g. ``goodput-tpot30-ttft500``."""
        parts = [self.name]
        if self.slo_tpot_p99_ms is not None:
            parts.append(f"tpot{self.slo_tpot_p99_ms:g}")
        if self.slo_ttft_p99_ms is not None:
            parts.append(f"ttft{self.slo_ttft_p99_ms:g}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measurement_metrics(m: Measurement) -> dict[str, Any]:
    """The figures a trial keeps (tokens/s; TPOT and TTFT p50/p99 in ms; acceptance length).

    A backend that gives no p99 (the model backend predicts one steady-state value per config, with no tail) has its
    p50 used as the p99, and ``p99_from_p50`` lists the metrics where that was done.
    """
    out: dict[str, Any] = {
        "output_tokens_per_s": m.output_tokens_per_s,
        "tpot_ms_p50": m.tpot_ms_p50,
        "tpot_ms_p99": m.tpot_ms_p99,
        "ttft_ms_p50": m.ttft_ms_p50,
        "ttft_ms_p99": m.ttft_ms_p99,
    }
    filled = []
    for kind in ("tpot", "ttft"):
        if out[f"{kind}_ms_p99"] is None and out[f"{kind}_ms_p50"] is not None:
            out[f"{kind}_ms_p99"] = out[f"{kind}_ms_p50"]
            filled.append(f"{kind}_ms_p99")
    if filled:
        out["p99_from_p50"] = filled
    if m.spec is not None:
        out["acceptance_length"] = m.spec.mean_acceptance_length
    if "acceptance_length" in m.extra:
        out["acceptance_length"] = m.extra["acceptance_length"]
    if m.speedup_vs_no_spec is not None:
        out["speedup_vs_no_spec"] = m.speedup_vs_no_spec
    return out


# ------------------------------------------------------------------------------------------------------- pruning

#: A backend that can report an intermediate result takes ``measure(config, workload, scenario, on_progress=cb)``
#: and calls ``cb(partial)`` after its warm-up phase with a partial `Measurement` (tokens/s and TPOT so far). ``cb``
#: returns False when the search prunes the trial: the backend should then stop and return what it has.
ProgressCallback = Callable[[Measurement], bool]


def _accepts_progress(backend: Backend) -> bool:
    import inspect

    try:
        return "on_progress" in inspect.signature(backend.measure).parameters
    except (TypeError, ValueError):
        return False


class RelativeToBestPruner(optuna.pruners.BasePruner):
    """Prune a trial whose latest intermediate value is clearly worse than the best finished (feasible) trial.

    "Clearly worse" is beyond `margin` relative to the best: below ``best * (1 - margin)`` when maximising, above
    ``best * (1 + margin)`` when minimising. Nothing is pruned until `n_startup_trials` trials have completed.
    """

    def __init__(self, margin: float = 0.3, n_startup_trials: int = 5) -> None:
        if not 0 < margin < 1:
            raise UsageError(f"The pruning margin must be in (0, 1), but got {margin}.")
        self.margin = margin
        self.n_startup_trials = n_startup_trials

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        done = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if all(c <= 0 for c in t.constraints.values())
        ]
        if len(done) < self.n_startup_trials:
            return False
        if study.direction == optuna.study.StudyDirection.MAXIMIZE:
            best = max(float(t.value) for t in done if t.value is not None)
            return value < best - abs(best) * self.margin
        best = min(float(t.value) for t in done if t.value is not None)
        return value > best + abs(best) * self.margin


# ---------------------------------------------------------------------------------------------------- strategies


@dataclass
class StrategyContext:
    """What a strategy's hooks see: the search (backend, space, objective), the study, the scenario, the target."""

    search: Search
    study: optuna.Study
    scenario: Scenario
    target: int
    """Trials the study should finish (shared by every worker)."""


class Strategy(abc.ABC):
    """How a search chooses configs. Small on purpose, like Optuna's samplers: a sampler, an optional pruner, the
    configs to try first, and hooks after each trial.

    A ``model-guided`` strategy plugs in here: `initial_configs` returns the top predicted configs for
    ``ctx.scenario`` (and the baselines); `after_trial` recalibrates the predictor from each measurement and may
    enqueue more configs (``ctx.study.enqueue_trial(ctx.search.space.params_of(config))``); `should_stop` ends the
    search once the best is confirmed within the measurement noise; `ScenarioResult.n_measurements` reports the
    launches. Register it with `register_strategy` (its factory receives ``sampler=`` when --sampler is given).
    """

    name: ClassVar[str] = "base"

    @property
    def label(self) -> str:
        """Name with options, for default study names (e.g. ``blackbox-gp``)."""
        return self.name

    @abc.abstractmethod
    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        """The Optuna sampler; `deterministic` is True when the backend predicts (same config, same value)."""

    def pruner(self, objective: Objective) -> optuna.pruners.BasePruner:
        """The Optuna pruner used when the backend reports intermediate values (default: never prune)."""
        return optuna.pruners.NopPruner()

    def default_trials(self, space: SearchSpace) -> int:
        """Trials per scenario when the user gives no --trials."""
        return 60

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        """Configs to enqueue, in order, before the sampler chooses (configs already in the study are skipped).
        Called under the claim lock each time a worker opens the study."""
        return []

    def after_trial(self, ctx: StrategyContext, config: SpecConfig, measurement: Measurement) -> None:  # noqa: B027
        """Called after each trial this worker measured."""

    def should_stop(self, ctx: StrategyContext) -> bool:
        """True ends this worker's search before the target is reached."""
        return False


class BlackboxStrategy(Strategy):
    """Optuna's TPE (or GP) over real measurements, baselines first, pruning clearly worse trials after warm-up.

    When the whole grid fits in the trial budget it is measured exhaustively instead.
    """

    name = "blackbox"

    def __init__(self, sampler: str = "tpe", prune_margin: float = 0.3, prune_after: int = 5) -> None:
        if sampler not in ("tpe", "gp"):
            raise UsageError(f"--sampler must be tpe or gp, but got {sampler!r}.")
        self.sampler_name = sampler
        self.prune_margin = prune_margin
        self.prune_after = prune_after

    @property
    def label(self) -> str:
        return self.name if self.sampler_name == "tpe" else f"{self.name}-{self.sampler_name}"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            # Grouped multivariate TPE (the conditional space) and GP are stable but flagged experimental.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if self.sampler_name == "gp":
                return optuna.samplers.GPSampler(seed=seed, deterministic_objective=deterministic)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)

    def pruner(self, objective: Objective) -> optuna.pruners.BasePruner:
        if objective.multi:
            return optuna.pruners.NopPruner()
        return RelativeToBestPruner(self.prune_margin, self.prune_after)

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        grid = ctx.search.space.grid()
        return grid if len(grid) <= ctx.target else ctx.search.space.baselines()[: ctx.target]


class RandomStrategy(Strategy):
    """Uniformly random configs (Optuna's RandomSampler); the reference point for comparing strategies."""

    name = "random"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


class GridStrategy(Strategy):
    """Every config of the space, in `SearchSpace.grid` order (the first `--trials` of them if given)."""

    name = "grid"

    def sampler(self, objective: Objective, seed: int, *, deterministic: bool) -> optuna.samplers.BaseSampler:
        # Every trial comes from the queue; the sampler only ever fills nothing.
        return optuna.samplers.RandomSampler(seed=seed)

    def default_trials(self, space: SearchSpace) -> int:
        return len(space.grid())

    def initial_configs(self, ctx: StrategyContext) -> list[SpecConfig]:
        return ctx.search.space.grid()[: ctx.target]


def _model_guided(**_options: Any) -> Strategy:
    raise UsageError(
        "--strategy model-guided (profile once per drafter, verify the top predicted configs) is not available in "
        "this version. Use --strategy blackbox, random or grid."
    )


StrategyFactory = Callable[..., Strategy]

#: name -> factory(sampler=...). ``model-guided`` is reserved for the profile-driven strategy.
STRATEGIES: dict[str, StrategyFactory] = {
    "blackbox": BlackboxStrategy,
    "random": lambda **_: RandomStrategy(),
    "grid": lambda **_: GridStrategy(),
    "model-guided": _model_guided,
}


def register_strategy(name: str, factory: StrategyFactory) -> None:
    """Make `factory` (called as ``factory(sampler=NAME_OR_NONE)``) available as ``--strategy NAME``."""
    STRATEGIES[name] = factory


def make_strategy(name: str, sampler: str | None = None) -> Strategy:
    """The strategy called `name`; `sampler` (tpe, gp) applies to blackbox only."""
    if name not in STRATEGIES:
        raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, but got {name!r}.")
    if sampler is not None and name != "blackbox":
        raise UsageError(f"--sampler {sampler} applies to --strategy blackbox only, but the strategy is {name}.")
    return STRATEGIES[name](**({"sampler": sampler} if sampler is not None else {}))


# -------------------------------------------------------------------------------------------------- coordination

#: Retries of a trial whose worker died (a config that kills its worker every time is not tried forever).
MAX_RETRIES = 2
#: Consecutive sampled duplicates after which an unmeasured config is enqueued to keep the search moving.
DUPLICATE_STREAK_LIMIT = 8
#: Key of our per-trial attributes (a dict) in Optuna's trial user attributes.
ATTR = "peagle"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _this_worker() -> dict[str, Any]:
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


class _ClaimLock(AbstractContextManager["_ClaimLock"]):
    """Serialises claiming the next trial (and setting a study up) across all workers of a database.

    SQLite file: an exclusive ``flock`` on ``<db>.claims.lock`` (workers share a host with the file).
    PostgreSQL: a session advisory lock keyed by the study name (released by the server if a worker dies).
    In-memory SQLite: a process-local lock. Other databases: no lock (`exclusive` is False), so concurrent workers
    may overshoot the trial total by up to one trial each.
    """

    _memory_lock = threading.Lock()
    _warned: ClassVar[set[str]] = set()

    def __init__(self, url: str, study_name: str) -> None:
        parsed = make_url(url)
        self.backend = parsed.get_backend_name()
        self._fd: int | None = None
        self._conn: Any = None
        self._engine: Any = None
        self.exclusive = True
        database = parsed.database or ""
        if self.backend == "sqlite" and database not in ("", ":memory:") and "mode=memory" not in database:
            self._kind = "file"
            self._path = f"{database}.claims.lock"
        elif self.backend == "sqlite":
            self._kind = "memory"
        elif self.backend == "postgresql":
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            self._kind = "postgres"
            self._key = int.from_bytes(hashlib.sha256(f"peagle:{study_name}".encode()).digest()[:8], "big", signed=True)
            self._engine = create_engine(parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        else:
            self._kind = "none"
            self.exclusive = False
            if self.backend not in self._warned:
                self._warned.add(self.backend)
                log.warning(
                    "No cross-worker lock for %s databases: concurrent workers may overshoot --trials by up to one "
                    "trial each. Use SQLite or PostgreSQL for shared studies.",
                    self.backend,
                )

    def __enter__(self) -> _ClaimLock:
        if self._kind == "file":
            import fcntl

            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        elif self._kind == "memory":
            self._memory_lock.acquire()
        elif self._kind == "postgres":
            from sqlalchemy import text

            self._conn = self._engine.connect()
            self._conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._kind == "file" and self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        elif self._kind == "memory":
            self._memory_lock.release()
        elif self._kind == "postgres" and self._conn is not None:
            from sqlalchemy import text

            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            finally:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


class _Heartbeat(AbstractContextManager["_Heartbeat"]):
    """Records the trial's heartbeat every `interval` seconds while it is measured (a killed worker stops it)."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: int) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peagle-heartbeat-{trial_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # a missed beat only risks a retry; never kill the measurement for it
                log.warning("heartbeat of trial %s failed: %s", self._trial_id, exc)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


def open_storage(url: str, heartbeat_interval: int = 60, grace_period: int | None = None) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage for `url`, with heartbeats (a trial whose worker stops beating for `grace_period`
    seconds, default 2 x interval, becomes FAIL and is re-queued up to `MAX_RETRIES` times).

    SQLite files get a 30 s lock timeout and ``synchronous=NORMAL`` (WAL keeps every committed trial across a process
    crash; only an OS crash can lose the last commits), which makes each trial's commits cheap.
    """
    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    memory = sqlite and (parsed.database in (None, "", ":memory:") or "mode=memory" in str(parsed.database))
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 30}} if sqlite else {"pool_pre_ping": True}
    if memory:
        # One shared connection, or every pooled connection would see its own empty database (the study lives
        # as long as this storage: in-memory studies cannot be resumed).
        from sqlalchemy.pool import StaticPool

        engine_kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=MAX_RETRIES
                ),
            )
        except (SQLAlchemyError, ImportError, RuntimeError, ValueError) as exc:
            raise StudyStorageError(
                f"Cannot open the Optuna storage {mask_password(url)}: {str(exc).splitlines()[0]}. Check --storage "
                "(a SQLAlchemy URL such as postgresql://user@host/db; the database must exist and be reachable) or "
                "leave it out to keep studies in the --db database."
            ) from exc
    if sqlite and not memory:

        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", _pragmas)
        storage.engine.dispose()  # reconnect with the pragmas
    return storage


# --------------------------------------------------------------------------------------------------- trial helpers


def _info(t: FrozenTrial) -> dict[str, Any]:
    value = t.user_attrs.get(ATTR)
    return value if isinstance(value, dict) else {}


def _counted(t: FrozenTrial) -> bool:
    """Does `t` use one of the study's trials: finished with a result, or running? (Duplicates of an already
    measured config and trials whose worker died do not.)"""
    info = _info(t)
    if info.get("duplicate_of") is not None:
        return False
    if t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and info.get("status") == "failed"


def _feasible(t: FrozenTrial) -> bool:
    return all(v <= 0 for v in t.constraints.values())


def _violation(t: FrozenTrial) -> float:
    return sum(max(v, 0.0) for v in t.constraints.values())


def _slim(m: Measurement) -> dict[str, Any]:
    """A JSON-safe dict of a measurement for a trial attribute (the engine log tail is left out)."""
    data = m.to_dict()
    data["log_tail"] = None
    return json.loads(json.dumps(data, default=str))


# ------------------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ParetoPoint:
    """One config on the Pareto front (throughput vs TPOT p99)."""

    config: SpecConfig
    metrics: dict[str, Any]
    trial: int
    hypothetical: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.to_dict(), "metrics": self.metrics, "trial": self.trial}
        if self.hypothetical:
            out["hypothetical"] = True
        return out


@dataclass
class ScenarioResult:
    """The outcome of searching one scenario."""

    scenario: Scenario
    study_name: str
    objective: Objective
    strategy: str
    best: Measurement
    """The recommended config's measurement (or, when `feasible` is False, the config closest to the SLOs)."""
    baseline: Measurement | None
    """No speculation at the best config's max_num_seqs."""
    published: Measurement | None
    """The best config's drafter at its publisher's K."""
    n_trials: int
    """Finished trials of the study (all workers): complete + failed + pruned."""
    n_failed: int
    n_pruned: int = 0
    n_running: int = 0
    """Trials other workers were still measuring when this worker finished."""
    n_measurements: int = 0
    """backend.measure calls made by this worker for the study and comparisons (engine launches with vLLM)."""
    feasible: bool = True
    rule: str = ""
    """How the best config was chosen, in words."""
    pareto: list[ParetoPoint] = field(default_factory=list)
    hypothetical: str | None = None
    """Set when the best config uses a hypothetical drafter: what it is (no checkpoint exists)."""
    constraints: dict[str, float] = field(default_factory=dict)
    """The best config's constraint values (metric - SLO, ms; <= 0 met)."""
    schedule: list[ScheduleEntry] = field(default_factory=list)
    class_policy: dict[str, dict[str, int]] = field(default_factory=dict)
    recommendation_id: int | None = None

    @property
    def n_complete(self) -> int:
        return self.n_trials - self.n_failed - self.n_pruned

    def speedup_over(self, other: Measurement | None) -> float | None:
        if other is None or not other.ok or not other.output_tokens_per_s or not self.best.output_tokens_per_s:
            return None
        return self.best.output_tokens_per_s / other.output_tokens_per_s


@dataclass(frozen=True)
class SearchEvent:
    """Progress of one scenario's study, for progress bars. Counts cover every worker of the study."""

    kind: Literal["start", "trial", "end"]
    study: str
    target: int
    done: int
    """Finished trials counted against the target."""
    complete: int
    failed: int
    pruned: int
    running: int
    """Trials in flight on other workers."""
    trial_state: str | None = None
    """This worker's last trial: complete, failed, pruned or duplicate (a config already measured: not re-run)."""
    config: SpecConfig | None = None


EventCallback = Callable[[SearchEvent], None]


def study_name_for(prefix: str, scenario: Scenario) -> str:
    return f"{prefix}-c{scenario.concurrency}"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower()


def default_study_prefix(model: str, device: str, workload: str, objective: str, strategy: str = "blackbox") -> str:
    return "-".join(_slug(p) for p in (model.split("/")[-1], device, workload, objective, strategy))


@dataclass
class _Run:
    """State of one scenario's search in this worker."""

    study: optuna.Study
    storage: optuna.storages.RDBStorage
    lock: _ClaimLock
    scenario: Scenario
    target: int
    ctx: StrategyContext
    measurements: int = 0
    streak: int = 0
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class _Claim:
    trial: optuna.trial.Trial
    config: SpecConfig
    info: dict[str, Any]
    """Our attributes of the trial as set at the claim."""
    duplicate_of: FrozenTrial | None
    done: int
    counts: dict[str, int]


# -------------------------------------------------------------------------------------------------------- search


@dataclass
class Search:
    """One search: a model on a device, a workload, a space, an objective and a strategy, per scenario.

    ``n_trials`` is the study's total across all workers (None: the strategy's default; never more than the grid).
    ``study_prefix`` names the studies (``<prefix>-c<concurrency>``); re-running with the same name resumes them.
    ``storage_url`` is where the Optuna study lives (default: the store's database).
    """

    store: Store
    backend: Backend
    model: str
    device: str
    workload: Workload
    space: SearchSpace
    objective: Objective = field(default_factory=Objective)
    strategy: Strategy = field(default_factory=BlackboxStrategy)
    n_trials: int | None = None
    seed: int = 0
    study_prefix: str | None = None
    storage_url: str | None = None
    heartbeat_interval: int = 60
    grace_period: int | None = None
    _cache: dict[tuple[SpecConfig, Scenario], Measurement] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.n_trials is not None and self.n_trials < 1:
            raise UsageError(f"--trials must be >= 1, but got {self.n_trials}.")
        if self.heartbeat_interval < 1:
            raise UsageError(f"--heartbeat must be >= 1 second, but got {self.heartbeat_interval}.")
        if self.study_prefix is None:
            self.study_prefix = default_study_prefix(
                self.model, self.device, self.workload.name, self.objective.slug(), self.strategy.label
            ) + f"-{self.fingerprint()}"

    # ---- public helpers ------------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """6 hex digits identifying the space and workload content (part of default study names, so a changed space
        or workload starts a new study instead of resuming an incompatible one)."""
        blob = json.dumps([self.space.to_dict(), self.workload.content_hash()], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:6]

    @property
    def target(self) -> int:
        """Trials per scenario: --trials (or the strategy's default), at most the number of configs in the space."""
        wanted = self.n_trials if self.n_trials is not None else self.strategy.default_trials(self.space)
        return min(wanted, len(self.space.grid()))

    def measure(
        self, config: SpecConfig, scenario: Scenario, on_progress: ProgressCallback | None = None
    ) -> Measurement:
        """Measure once per (config, scenario) within this process; predictions and measurements are reused."""
        key = (config, scenario)
        if key not in self._cache:
            if on_progress is not None:
                m = self.backend.measure(config, self.workload, scenario, on_progress=on_progress)  # type: ignore[call-arg]
            else:
                m = self.backend.measure(config, self.workload, scenario)
            self._cache[key] = m
        return self._cache[key]

    # ---- the loop ------------------------------------------------------------------------------------------------

    def run(self, scenarios: Sequence[Scenario], on_event: EventCallback | None = None) -> list[ScenarioResult]:
        return [self.run_scenario(s, on_event) for s in scenarios]

    def run_scenario(self, scenario: Scenario, on_event: EventCallback | None = None) -> ScenarioResult:
        """Run (or resume, or join) the study of `scenario` until it has `target` finished trials, then pick."""
        study_name = study_name_for(str(self.study_prefix), scenario)
        url = self.storage_url or self.store.url
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        setup_lock = _ClaimLock(url, "optuna-schema")
        try:
            with setup_lock:  # workers starting together on a fresh database would race to create Optuna's tables
                storage = open_storage(url, self.heartbeat_interval, self.grace_period)
        finally:
            setup_lock.close()
        lock = _ClaimLock(url, study_name)
        with warnings.catch_warnings():
            # fail_stale_trials, the retry callback and metric names are stable but flagged experimental; Optuna also
            # warns that heartbeats are meant for Study.optimize, but this loop beats itself (see _Heartbeat).
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            warnings.filterwarnings("ignore", message=".*independent sampl", category=UserWarning)
            try:
                return self._run_scenario(scenario, study_name, storage, lock, on_event)
            finally:
                lock.close()
                storage.engine.dispose()

    def _run_scenario(
        self,
        scenario: Scenario,
        study_name: str,
        storage: optuna.storages.RDBStorage,
        lock: _ClaimLock,
        on_event: EventCallback | None,
    ) -> ScenarioResult:
        with lock:
            study = self._open_study(storage, study_name, scenario)
            run = _Run(
                study=study,
                storage=storage,
                lock=lock,
                scenario=scenario,
                target=self.target,
                ctx=StrategyContext(self, study, scenario, self.target),
                rng=random.Random(f"{self.seed}:{study_name}"),
            )
            self._enqueue_initial(run)
            # Release trials of workers that died, so the start counts are right.
            optuna.storages.fail_stale_trials(study)
            self._fail_orphans(run, study.get_trials(deepcopy=False))
        self._emit(on_event, run, "start", study.get_trials(deepcopy=False))
        self._loop(run, on_event)
        self._sync_store(run)
        trials = study.get_trials(deepcopy=False)
        self._emit(on_event, run, "end", trials)
        return self._result(run, trials)

    def _open_study(self, storage: optuna.storages.RDBStorage, name: str, scenario: Scenario) -> optuna.Study:
        """Create or load the study (under the claim lock) and check it is the same search.

        Each opening of a study (a worker joining, or a resumed run) gets its own sampler seed, ``seed + openings``:
        the first run is reproducible, and two workers (or a resumed run) do not replay the same random proposals.
        """
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            pruner=self.strategy.pruner(self.objective),
            directions=self.objective.directions,
            load_if_exists=True,
        )
        meta = {
            "model": self.model,
            "device": self.device,
            "workload": self.workload.name,
            "workload_hash": self.workload.content_hash(),
            "objective": self.objective.to_dict(),
            "scenario": scenario.to_dict(),
            "backend": self.backend.name,
        }
        stored = study.user_attrs.get(ATTR)
        if stored is None:
            stored = {**meta, "space": self.space.to_dict(), "strategy": self.strategy.name, "openings": 0}
            study.set_metric_names(self.objective.value_names)
        else:
            differ = {k: (stored.get(k), v) for k, v in meta.items() if stored.get(k) != v}
            if differ:
                detail = "; ".join(f"{k}: study has {a!r}, this run {b!r}" for k, (a, b) in differ.items())
                raise UsageError(
                    f"Study {name!r} was created for another search ({detail}). Resume it with the same options, "
                    "or pass a new --study name."
                )
        openings = int(stored.get("openings", 0))
        study.set_user_attr(ATTR, {**stored, "openings": openings + 1})
        study.sampler = self.strategy.sampler(
            self.objective, self.seed + openings, deterministic=self.backend.name == "model"
        )
        return study

    def _enqueue_initial(self, run: _Run) -> None:
        """Enqueue the strategy's initial configs that the study does not hold yet (in any state)."""
        trials = run.study.get_trials(deepcopy=False)
        present = {c for c in (self._config_of(t) for t in trials) if c is not None}
        for config in self.strategy.initial_configs(run.ctx):
            if config not in present:
                run.study.enqueue_trial(self.space.params_of(config))
                present.add(config)

    def _config_of(self, t: FrozenTrial) -> SpecConfig | None:
        info = _info(t)
        if "config" in info:
            return SpecConfig.from_dict(info["config"])
        params = t.params or t.system_attrs.get("fixed_params") or {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self.space.suggest(optuna.trial.FixedTrial(dict(params)))
        except (ValueError, KeyError, PeagleError):
            return None

    def _loop(self, run: _Run, on_event: EventCallback | None) -> None:
        while True:
            claim = self._claim(run)
            if claim is None:
                return
            try:
                if claim.duplicate_of is not None:
                    state = self._tell_duplicate(run, claim)
                    run.streak += 1
                    measurement = None
                else:
                    run.streak = 0
                    with _Heartbeat(run.storage, claim.trial._trial_id, self.heartbeat_interval):
                        state, measurement = self._evaluate(run, claim)
            except BaseException:
                self._abandon(run, claim)
                raise
            counts = dict(claim.counts)
            if state != "duplicate":
                counts[state] += 1
            self._emit_counts(on_event, run, "trial", claim.done + (state != "duplicate"), counts, state, claim.config)
            if measurement is not None:
                self.strategy.after_trial(run.ctx, claim.config, measurement)
            if self.strategy.should_stop(run.ctx):
                return

    def _claim(self, run: _Run) -> _Claim | None:
        """Under the claim lock: fail dead workers' trials, stop at the target, else ask for the next trial."""
        study = run.study
        with run.lock:
            optuna.storages.fail_stale_trials(study)
            trials = study.get_trials(deepcopy=False)
            if self._fail_orphans(run, trials):
                trials = study.get_trials(deepcopy=False)
            counted = [t for t in trials if _counted(t)]
            if len(counted) >= run.target:
                return None
            claimed: dict[SpecConfig, FrozenTrial] = {}
            for t in counted:
                config = self._config_of(t)
                if config is not None:
                    claimed.setdefault(config, t)
            if not any(t.state == TrialState.WAITING for t in trials):
                unclaimed = [c for c in self.space.grid() if c not in claimed]
                if not unclaimed:
                    return None  # every config of the space has been measured (or is being measured)
                if run.streak >= DUPLICATE_STREAK_LIMIT:
                    study.enqueue_trial(self.space.params_of(run.rng.choice(unclaimed)))
                    run.streak = 0
            trial = study.ask()
            config = self.space.suggest(trial)
            duplicate = claimed.get(config)
            info: dict[str, Any] = {"worker": _this_worker(), "config": config.to_dict()}
            if duplicate is not None:
                info["duplicate_of"] = duplicate.number
            trial.set_user_attr(ATTR, info)
            counts = self._counts(trials)
            done = sum(1 for t in counted if t.state.is_finished())
            return _Claim(trial, config, info, duplicate, done, counts)

    def _fail_orphans(self, run: _Run, trials: Sequence[FrozenTrial]) -> bool:
        """Fail (and re-queue) RUNNING trials whose worker is gone: a worker on this host whose process is dead, or
        (while we hold an exclusive claim lock) a trial claimed without our attributes, i.e. a worker that died
        inside its claim. Workers on other hosts are left to the heartbeat."""
        me = _this_worker()
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)
        failed = False
        for t in trials:
            if t.state != TrialState.RUNNING:
                continue
            worker = _info(t).get("worker")
            if worker is None:
                dead = run.lock.exclusive
            else:
                local = worker.get("host") == me["host"] and worker.get("boot") == me["boot"]
                dead = local and worker.get("pid") != me["pid"] and not _process_alive(int(worker.get("pid", 0)))
            if not dead:
                continue
            try:
                if run.storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    log.warning(
                        "Trial %s of study %s was left running by a worker that is gone; it is re-queued.",
                        t.number, run.study.study_name,
                    )
                    retry(run.study, run.storage.get_trial(t._trial_id))
                    failed = True
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
        return failed

    def _abandon(self, run: _Run, claim: _Claim) -> None:
        """An interrupted measurement (Ctrl-C, a crash in our code): FAIL the trial and re-queue its config."""
        trial = claim.trial
        try:
            if run.storage.get_trial(trial._trial_id).state.is_finished():
                return
            trial.set_user_attr(ATTR, {**claim.info, "status": "interrupted"})
            run.study.tell(trial, state=TrialState.FAIL)
            if claim.duplicate_of is None:
                optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(
                    run.study, run.storage.get_trial(trial._trial_id)
                )
        except Exception as exc:  # the heartbeat will catch it
            log.warning("could not release trial %s: %s", trial.number, exc)

    def _tell_duplicate(self, run: _Run, claim: _Claim) -> str:
        """A config already measured in this study: tell the sampler the earlier result instead of measuring again."""
        original = run.storage.get_trial(claim.duplicate_of._trial_id) if claim.duplicate_of is not None else None
        trial = claim.trial
        if original is not None and original.state == TrialState.COMPLETE and original.values is not None:
            for key, value in original.constraints.items():
                trial.set_constraint(key, value)
            run.study.tell(trial, original.values)
        elif original is not None and original.state == TrialState.PRUNED:
            run.study.tell(trial, state=TrialState.PRUNED)
        else:
            run.study.tell(trial, state=TrialState.FAIL)
        return "duplicate"

    def _evaluate(self, run: _Run, claim: _Claim) -> tuple[str, Measurement]:
        trial, config, scenario = claim.trial, claim.config, run.scenario
        pruned = False

        def on_progress(partial: Measurement) -> bool:
            nonlocal pruned
            value = self.objective.progress_value(partial)
            if value is None:
                return True
            trial.report(value, step=0)  # step 0: the end of the backend's warm-up
            if trial.should_prune():
                pruned = True
                return False
            return True

        use_progress = _accepts_progress(self.backend) and not self.objective.multi
        fresh = (config, scenario) not in self._cache
        m = self.measure(config, scenario, on_progress if use_progress else None)
        run.measurements += int(fresh)
        metrics = measurement_metrics(m)
        values: list[float] = []
        constraints: dict[str, float] = {}
        failure: str | None = None
        if pruned:
            status = "pruned"
        elif not m.ok:
            status, failure = "failed", f"{m.failure_kind}: {m.failure_reason}"
        else:
            try:
                values = self.objective.values(metrics)
                constraints = self.objective.constraints(metrics)
                status = "complete"
            except _TrialFailed as exc:
                status, failure = "failed", str(exc)
        if constraints:
            metrics["constraints"] = constraints
            metrics["feasible"] = all(v <= 0 for v in constraints.values())
        info = {**claim.info, "status": status, "metrics": metrics, "measurement": _slim(m),
                "provenance": m.provenance.to_dict()}
        if failure:
            info["failure"] = failure
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr(ATTR, info)
        if status == "complete":
            run.study.tell(trial, values)
        else:
            run.study.tell(trial, state=TrialState.PRUNED if status == "pruned" else TrialState.FAIL)
        self._record(run, trial.number, config, status, values, metrics, m, failure)
        return status, m

    def _record(
        self,
        run: _Run,
        number: int,
        config: SpecConfig,
        status: str,
        values: Sequence[float],
        metrics: Mapping[str, Any],
        m: Measurement | None,
        failure: str | None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            self.store.add_trial(
                study=run.study.study_name,
                number=number,
                model=self.model,
                config=config.to_dict(),
                scenario=run.scenario.to_dict(),
                values=dict(zip(self.objective.value_names, values, strict=False)),
                metrics=dict(metrics),
                status=status,
                failure_reason=failure,
                backend=m.provenance.backend if m is not None else str((provenance or {}).get("backend", "?")),
                provenance=m.provenance.to_dict() if m is not None else dict(provenance or {}),
            )
        except InvalidRecordError:
            pass  # another worker (or an earlier run) stored it already

    def _sync_store(self, run: _Run) -> None:
        """Store finished trials our trials table lacks (a worker killed between Optuna's commit and ours)."""
        stored = {t.number for t in self.store.list_trials(study=run.study.study_name)}
        for t in run.study.get_trials(deepcopy=False):
            info = _info(t)
            if t.number in stored or not _counted(t) or not t.state.is_finished() or "status" not in info:
                continue
            values = list(t.values or []) if t.state == TrialState.COMPLETE else []
            self._record(
                run, t.number, SpecConfig.from_dict(info["config"]), info["status"], values,
                info.get("metrics", {}), None, info.get("failure"), info.get("provenance"),
            )

    @staticmethod
    def _counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
        counts = {"complete": 0, "failed": 0, "pruned": 0, "running": 0}
        names = {TrialState.COMPLETE: "complete", TrialState.FAIL: "failed", TrialState.PRUNED: "pruned",
                 TrialState.RUNNING: "running"}
        for t in trials:
            if _counted(t):
                counts[names[t.state]] += 1
        return counts

    def _emit(self, on_event: EventCallback | None, run: _Run, kind: Literal["start", "trial", "end"],
              trials: Sequence[FrozenTrial]) -> None:
        counts = self._counts(trials)
        done = counts["complete"] + counts["failed"] + counts["pruned"]
        self._emit_counts(on_event, run, kind, done, counts, None, None)

    @staticmethod
    def _emit_counts(on_event: EventCallback | None, run: _Run, kind: Literal["start", "trial", "end"], done: int,
                     counts: Mapping[str, int], state: str | None, config: SpecConfig | None) -> None:
        if on_event is None:
            return
        on_event(SearchEvent(kind, run.study.study_name, run.target, done, counts["complete"], counts["failed"],
                             counts["pruned"], counts["running"], state, config))

    # ---- picking the recommendation ------------------------------------------------------------------------------

    def _result(self, run: _Run, trials: Sequence[FrozenTrial]) -> ScenarioResult:
        study, scenario = run.study, run.scenario
        counted = [t for t in trials if _counted(t)]
        complete = [t for t in counted if t.state == TrialState.COMPLETE]
        failed = [t for t in counted if t.state == TrialState.FAIL]
        pruned = [t for t in counted if t.state == TrialState.PRUNED]
        running = [t for t in counted if t.state == TrialState.RUNNING]
        if not complete:
            reasons = sorted({str(_info(t).get("failure", "unknown")) for t in failed})
            raise UsageError(
                f"No trial of study {study.study_name!r} completed ({len(failed)} failed, {len(pruned)} pruned, "
                f"{len(running)} running elsewhere): {'; '.join(reasons)[:500]}. Fix the cause above "
                f"(see `peagle-tune show --trials {study.study_name}`) and run again."
            )
        pareto: list[ParetoPoint] = []
        if self.objective.multi:
            front = self._front(study)
            pareto = [self._point(t) for t in front]
            chosen, feasible = self._pick_front(front, complete, scenario)
        else:
            chosen, feasible = self._pick_single(complete, scenario)
        config = self._config_of(chosen)
        assert config is not None
        best = self._measurement_of(run, chosen, config)
        base_config = SpecConfig(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens)
        baseline = self._lookup_or_measure(run, complete, base_config)
        published = None
        choice = self.space.names.get(str(config.drafter)) if config.speculative else None
        if choice is not None and choice.recommended_k:
            published_config = config.with_(num_speculative_tokens=choice.recommended_k)
            published = self._lookup_or_measure(run, complete, published_config)
        hypo = self.space.hypothetical(config)
        result = ScenarioResult(
            scenario=scenario,
            study_name=study.study_name,
            objective=self.objective,
            strategy=self.strategy.name,
            best=best,
            baseline=baseline,
            published=published,
            n_trials=len(complete) + len(failed) + len(pruned),
            n_failed=len(failed),
            n_pruned=len(pruned),
            n_running=len(running),
            n_measurements=run.measurements,
            feasible=feasible,
            rule=self._rule(feasible),
            pareto=pareto,
            hypothetical=(
                f"{hypo.name} is HYPOTHETICAL ({hypo.note or 'an unreleased variant'}): no checkpoint exists, so vLLM "
                "cannot serve it" if hypo else None
            ),
            constraints=dict(chosen.constraints),
        )
        if feasible and config.speculative:
            result.schedule = self.schedule(config)
            result.class_policy = self.class_policy(config, scenario)
        return result

    def _rule(self, feasible: bool) -> str:
        slos = ", ".join(f"{SLO_METRICS[m]} <= {v:g} ms" for m, v in self.objective.slos.items())
        if not feasible:
            return (
                f"no config met {slos}; shown is the config closest to them (smallest total violation), which is NOT "
                "recommended"
            )
        meeting = f" among configs meeting {slos}" if slos else ""
        tie = "; ties within 0.1% go to the smallest K, then max_num_seqs closest to the concurrency"
        if self.objective.multi:
            return f"the Pareto front's highest-throughput point{meeting}{tie}"
        what = "lowest TPOT p50" if self.objective.name == "latency" else "highest output tokens/s"
        return f"{what}{meeting}{tie}"

    def _front(self, study: optuna.Study) -> list[FrozenTrial]:
        """study.best_trials (feasible-only when SLOs are set), one trial per config, by throughput."""
        seen: set[SpecConfig] = set()
        out: list[FrozenTrial] = []
        for t in sorted(study.best_trials, key=lambda t: (-float(t.values[0]), t.number)):
            config = self._config_of(t)
            if _info(t).get("duplicate_of") is not None or config is None or config in seen:
                continue
            seen.add(config)
            out.append(t)
        return out

    def _point(self, t: FrozenTrial) -> ParetoPoint:
        config = self._config_of(t)
        assert config is not None
        hypothetical = self.space.hypothetical(config) is not None
        return ParetoPoint(config, dict(_info(t).get("metrics", {})), t.number, hypothetical)

    def _tie_key(self, scenario: Scenario) -> Callable[[FrozenTrial], tuple[int, int, int]]:
        def key(t: FrozenTrial) -> tuple[int, int, int]:
            c = self._config_of(t)
            assert c is not None
            return (c.k, abs(c.max_num_seqs - scenario.concurrency), c.max_num_seqs)

        return key

    def _pick_single(self, complete: list[FrozenTrial], scenario: Scenario) -> tuple[FrozenTrial, bool]:
        """The best feasible trial; ties within 0.1% go to the smallest K, then max_num_seqs closest to the
        concurrency, which serve the same with less verification work and memory."""
        feasible = [t for t in complete if _feasible(t) and t.value is not None]
        if not feasible:
            return min(complete, key=lambda t: (_violation(t), t.number)), False
        sign = 1.0 if self.objective.directions[0] == "maximize" else -1.0
        top = max(sign * float(t.value) for t in feasible)  # type: ignore[arg-type]
        tied = [t for t in feasible if sign * float(t.value) >= top - abs(top) * 1e-3]  # type: ignore[arg-type]
        return min(tied, key=self._tie_key(scenario)), True

    def _pick_front(
        self, front: list[FrozenTrial], complete: list[FrozenTrial], scenario: Scenario
    ) -> tuple[FrozenTrial, bool]:
        if not front:  # constrained and nothing feasible
            return min(complete, key=lambda t: (_violation(t), t.number)), False
        top = max(float(t.values[0]) for t in front)
        tied = [t for t in front if float(t.values[0]) >= top - abs(top) * 1e-3]
        return min(tied, key=self._tie_key(scenario)), True

    def _measurement_of(self, run: _Run, t: FrozenTrial, config: SpecConfig) -> Measurement:
        data = _info(t).get("measurement")
        if data is not None:
            try:
                return Measurement.from_dict(data)
            except (TypeError, ValueError, KeyError, PeagleError):
                pass
        return self._measure_outside(run, config)

    def _lookup_or_measure(self, run: _Run, complete: list[FrozenTrial], config: SpecConfig) -> Measurement:
        for t in complete:
            if _info(t).get("duplicate_of") is None and self._config_of(t) == config:
                return self._measurement_of(run, t, config)
        return self._measure_outside(run, config)

    def _measure_outside(self, run: _Run, config: SpecConfig) -> Measurement:
        fresh = (config, run.scenario) not in self._cache
        m = self.measure(config, run.scenario)
        run.measurements += int(fresh)
        return m

    def goodput(self, config: SpecConfig, workload: Workload | None = None) -> Callable[[int, int], float]:
        """tokens/s of `config`'s drafter at batch b and depth k (k=0: no speculation), from the backend."""

        def value(b: int, k: int) -> float:
            c = config.with_(max_num_seqs=max(b, 1))
            c = c.with_(num_speculative_tokens=k) if k else SpecConfig(max_num_seqs=c.max_num_seqs)
            scenario = Scenario(concurrency=b)
            m = self.measure(c, scenario) if workload is None else self.backend.measure(c, workload, scenario)
            return float(m.output_tokens_per_s or 0.0) if m.ok else 0.0

        return value

    def schedule(self, config: SpecConfig) -> list[ScheduleEntry]:
        """Best K per batch-size range for the chosen drafter, up to its max_num_seqs (predicted with the model
        backend; with a real engine it needs a profile, so it is left empty)."""
        if self.backend.name != "model":
            return []
        sizes = default_batch_sizes(max(config.max_num_seqs, 1))
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        best = best_depth_per_batch(self.goodput(config), sizes, ks)
        return merge_schedule(best, config.max_num_seqs)

    def class_policy(self, config: SpecConfig, scenario: Scenario) -> dict[str, dict[str, int]]:
        """Per-class K cap: the best K for each workload class alone at this scenario (model backend only)."""
        if self.backend.name != "model" or len(self.workload.classes) < 1:
            return {}
        ks = [0, *range(self.space.k_min, self.space.k_max + 1)]
        out: dict[str, dict[str, int]] = {}
        for cls, reqs in sorted(self.workload.classes.items()):
            sub = Workload(f"{self.workload.name}:{cls}", {cls: reqs}, self.workload.source)
            best = best_depth_per_batch(self.goodput(config, sub), [scenario.concurrency], ks)
            out[cls] = {"max_k": best[scenario.concurrency]}
        return out

    def recommend(self, result: ScenarioResult, environment: Mapping[str, Any]) -> int | None:
        """Store `result` as a recommendation and return its id; None (nothing stored) when no config met the SLOs."""
        if not result.feasible:
            return None
        best = result.best
        metrics: dict[str, Any] = {
            **measurement_metrics(best),
            "speedup_vs_no_spec": result.speedup_over(result.baseline),
            "speedup_vs_published_k": result.speedup_over(result.published),
            "published_k": result.published.config.k if result.published else None,
            "objective": self.objective.to_dict(),
            "rule": result.rule,
            "strategy": result.strategy,
            "n_trials": result.n_trials,
            "n_failed": result.n_failed,
            "n_pruned": result.n_pruned,
        }
        if result.constraints:
            metrics["constraints"] = result.constraints
        if result.hypothetical:
            metrics["hypothetical_drafter"] = True
            metrics["hypothetical_note"] = result.hypothetical
        rid = self.store.add_recommendation(
            model=self.model,
            gpu=self.device,
            vllm_version=environment.get("vllm_version"),
            workload_name=self.workload.name,
            workload_hash=self.workload.content_hash(),
            objective=self.objective.name,
            scenario=result.scenario.to_dict(),
            best_config=best.config.to_dict(),
            metrics=metrics,
            provenance=best.provenance.to_dict(),
            pareto=[p.to_dict() for p in result.pareto],
            schedule=[dataclasses.asdict(e) for e in result.schedule],
            class_policy=result.class_policy,
            study=result.study_name,
        )
        result.recommendation_id = rid
        return rid

