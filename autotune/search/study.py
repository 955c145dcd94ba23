"""The study loop: one Optuna study per scenario, trials claimed one at a time, each measured (or predicted) by the
backend, written to the study and to our store, until the study has its trials; then the recommendation is picked.

Every figure keeps the provenance the backend gave it (measured or predicted). Workers share a study through its
storage (`coordination`); the strategy chooses configs through a narrow `StrategyContext`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import random
import re
import warnings
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.backends.base import Backend
from autotune.errors import StudyStorageError, UsageError
from autotune.measurement import Measurement
from autotune.search import depths
from autotune.search.confirm import Figure, candidate_note, confirm_fresh, confirmation_candidates, in_launch_spread
from autotune.search.coordination import (
    STORAGE_ERRORS,
    ClaimLock,
    Heartbeat,
    fail_orphans,
    in_memory,
    open_storage,
    requeue,
    storage_error,
    this_worker,
)
from autotune.search.events import EventCallback, SearchEvent
from autotune.search.objective import MissingFigureError, Objective, measurement_metrics
from autotune.search.private import private_copy, write_back
from autotune.search.profiles import store_or_profile
from autotune.search.records import TrialRecorder
from autotune.search.result import ScenarioResult, summarize
from autotune.search.space import SearchSpace
from autotune.search.strategies import BlackboxStrategy
from autotune.search.strategy import ProfileProvider, Strategy, StrategyContext
from autotune.search.trials import ATTR, counted, slim, state_counts, trial_config, trial_info, trial_measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload
from store import MAX_NAME_CHARS, Store, StoreError, normalize_db_url

log = logging.getLogger(__name__)

#: Consecutive sampled duplicates after which an unmeasured config is enqueued to keep the search moving.
DUPLICATE_STREAK_LIMIT = 8


#: Study attribute prefix of a confirming launch's measurement (followed by the config as JSON).
CONFIRMATION_ATTR = "peagle_confirmation:"


#: Longest study prefix: the store keeps names of `MAX_NAME_CHARS`, and ``-c<concurrency>`` (at most ``-c65536``)
#: is added to it.
MAX_STUDY_PREFIX_CHARS = MAX_NAME_CHARS - len("-c65536")


def study_name_for(prefix: str, scenario: Scenario) -> str:
    return f"{prefix}-c{scenario.concurrency}"


def fitting_study_prefix(prefix: str) -> str:
    """`prefix`, or, when longer than `MAX_STUDY_PREFIX_CHARS`, its start and a hash of the whole (the same name on
    every run, so a long default name still resumes its study)."""
    if len(prefix) <= MAX_STUDY_PREFIX_CHARS:
        return prefix
    digest = hashlib.sha256(prefix.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{prefix[:MAX_STUDY_PREFIX_CHARS - len(digest) - 1]}-{digest}"


def checked_study_prefix(prefix: str) -> str:
    """A --study name as given, if the store can keep it: printable text of 1 to `MAX_STUDY_PREFIX_CHARS`."""
    problem = ""
    if not prefix.strip():
        problem = "it is empty"
    elif len(prefix) > MAX_STUDY_PREFIX_CHARS:
        problem = f"it has {len(prefix):,} characters"
    elif not prefix.isprintable():
        i, char = next((i, c) for i, c in enumerate(prefix) if not c.isprintable())
        problem = f"it holds {char!r} at character {i}"
    if problem:
        raise UsageError(
            f"--study takes a name of 1 to {MAX_STUDY_PREFIX_CHARS} printable characters (the database keeps "
            f"{MAX_NAME_CHARS}, and -c<concurrency> is added), but {problem}."
        )
    return prefix


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", s).strip("-").lower()


def default_study_prefix(model: str, device: str, workload: str, objective: str, strategy: str = "blackbox") -> str:
    return "-".join(_slug(p) for p in (model.split("/")[-1], device, workload, objective, strategy))


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (stored, wanted)} for each key of `wanted` whose value differs; a dict value (the space) by its own
    keys, as ``space.k_max``."""
    out: dict[str, tuple[Any, Any]] = {}
    for key, value in wanted.items():
        old = stored.get(key)
        if old == value:
            continue
        if isinstance(old, dict) and isinstance(value, dict):
            out.update({f"{key}.{k}": (old.get(k), v) for k, v in value.items() if old.get(k) != v})
            out.update({f"{key}.{k}": (v, None) for k, v in old.items() if k not in value})
        else:
            out[key] = (old, value)
    return out


@dataclass
class _Run:
    """State of one scenario's search in this worker."""

    study: optuna.Study
    storage: optuna.storages.BaseStorage
    lock: ClaimLock | None
    """The claim lock of a study shared in the database with other workers (claims, heartbeats, a write per
    trial); None: a private copy in memory (`autotune.search.private`), written back when the search ends."""
    scenario: Scenario
    target: int
    ctx: StrategyContext
    recorder: TrialRecorder
    grid: list[SpecConfig]
    measurements: int = 0
    streak: int = 0
    rng: random.Random = field(default_factory=random.Random)
    configs: dict[int, SpecConfig] = field(default_factory=dict)
    """The config of each claimed trial by number (read once: a claimed trial's config never changes)."""


@dataclass
class _Claim:
    trial: optuna.trial.Trial
    config: SpecConfig
    info: dict[str, Any]
    """Our attributes of the trial as set at the claim."""
    duplicate_of: FrozenTrial | None
    done: int
    counts: dict[str, int]


@dataclass
class Search:
    """One search: a model on a device, a workload, a space, an objective and a strategy, per scenario.

    ``n_trials`` is the study's total across all workers (None: the strategy's default; never more than the grid).
    ``study_prefix`` names the studies (``<prefix>-c<concurrency>``); re-running with the same name resumes them.
    ``storage_url`` is where the Optuna study lives (default: the store's database). ``private`` runs the study in
    memory and writes it back at the end, which a predicting backend does (None: exactly when the backend predicts);
    measuring backends share it through the database trial by trial. ``profiles`` is where a
    strategy's ``ctx.profile(drafter)`` gets drafter profiles (default: `store_or_profile` with this search's store
    and backend, profiling at the scenario's concurrency, 1 and ``profile_concurrencies``).
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
    profiles: ProfileProvider | None = None
    profile_concurrencies: Sequence[int] = ()
    private: bool | None = None
    _cache: dict[tuple[SpecConfig, Scenario], Measurement] = field(default_factory=dict, init=False)
    storages: dict[str, optuna.storages.RDBStorage] = field(default_factory=dict, repr=False)
    """Study storages opened so far, by URL (Optuna checks its schema at each opening, ~0.2 s): searches of one run
    share this dict. Their connections are closed after each scenario."""

    def __post_init__(self) -> None:
        if self.n_trials is not None and self.n_trials < 1:
            raise UsageError(f"--trials must be >= 1, but got {self.n_trials}.")
        if self.heartbeat_interval < 1:
            raise UsageError(f"--heartbeat must be >= 1 second, but got {self.heartbeat_interval}.")
        if self.study_prefix is None:
            self.study_prefix = fitting_study_prefix(default_study_prefix(
                self.model, self.device, self.workload.name, self.objective.slug(), self.strategy.label
            ) + f"-{self.fingerprint()}")
        else:
            self.study_prefix = checked_study_prefix(self.study_prefix)
        if self.profiles is None:
            self.profiles = functools.partial(
                store_or_profile, store=self.store, backend=self.backend, model=self.model, device=self.device,
                concurrencies=tuple(self.profile_concurrencies),
            )

    def fingerprint(self) -> str:
        """6 hex digits identifying the space, the workload content and what a predicting backend's figures depend
        on (part of default study names, so a changed space, workload or refitted model starts a new study instead
        of resuming an incompatible one)."""
        parts: list[Any] = [self.space.to_dict(), self.workload.content_hash()]
        inputs = self.backend.figure_inputs()
        if inputs:  # measuring backends add nothing: their existing study names stay valid
            parts.append(inputs)
        blob = json.dumps(parts, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:6]

    @property
    def target(self) -> int:
        """Trials per scenario: --trials (or the strategy's default), at most the number of configs in the space."""
        wanted = self.n_trials if self.n_trials is not None else self.strategy.default_trials(self.space)
        return min(wanted, len(self.space.grid()))

    def measure(self, config: SpecConfig, scenario: Scenario) -> Measurement:
        """Measure once per (config, scenario) within this process; predictions and measurements are reused."""
        key = (config, scenario)
        if key not in self._cache:
            self._cache[key] = self.backend.measure(config, self.workload, scenario)
        return self._cache[key]

    # ---- the loop ------------------------------------------------------------------------------------------------

    def run(self, scenarios: Sequence[Scenario], on_event: EventCallback | None = None) -> list[ScenarioResult]:
        return [self.run_scenario(s, on_event) for s in scenarios]

    def run_scenario(self, scenario: Scenario, on_event: EventCallback | None = None) -> ScenarioResult:
        """Run (or resume, or join) the study of `scenario` until it has `target` finished trials, then pick."""
        study_name = study_name_for(str(self.study_prefix), scenario)
        # --storage may be a file path, like --db; a database error anywhere in the study becomes one line.
        try:
            url = normalize_db_url(self.storage_url) if self.storage_url else self.store.url
        except StoreError as exc:
            raise StudyStorageError(f"--storage: {exc}") from exc
        option = "--storage" if self.storage_url else "--db or PEAGLE_DB"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            if url not in self.storages:
                self.storages[url] = open_storage(url, self.heartbeat_interval, self.grace_period, option)
            storage = self.storages[url]
            lock = ClaimLock(url, study_name)
        except STORAGE_ERRORS as exc:
            raise storage_error(exc, url, option) from exc
        with warnings.catch_warnings():
            # fail_stale_trials, the retry callback and metric names are stable but flagged experimental; Optuna also
            # warns that heartbeats are meant for Study.optimize, but this loop beats itself (see Heartbeat).
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            warnings.filterwarnings("ignore", message=".*independent sampl", category=UserWarning)
            private = self.backend.capabilities.predicts if self.private is None else self.private
            try:
                if private:
                    return self._run_private(scenario, study_name, storage, lock, on_event)
                return self._run_shared(scenario, study_name, storage, lock, on_event)
            except STORAGE_ERRORS as exc:
                raise storage_error(exc, url, option) from exc
            finally:
                lock.close()
                storage.engine.dispose()
                if in_memory(url):  # its database went with its connection
                    del self.storages[url]

    def _run_shared(
        self,
        scenario: Scenario,
        study_name: str,
        storage: optuna.storages.RDBStorage,
        lock: ClaimLock,
        on_event: EventCallback | None,
    ) -> ScenarioResult:
        """The study in the database, shared with any other worker: each trial is claimed under the lock and
        written when it finishes, so a killed worker loses only the trial it was measuring."""
        with lock:
            study = self._open_study(storage, study_name, scenario)
            run = self._new_run(study, storage, lock, scenario)
            self._enqueue_initial(run)
            # Release trials of workers that died, so the start counts are right.
            optuna.storages.fail_stale_trials(study)
            fail_orphans(study, storage, lock, study.get_trials(deepcopy=False))
        return self._search(run, on_event)

    def _run_private(
        self,
        scenario: Scenario,
        study_name: str,
        storage: optuna.storages.RDBStorage,
        lock: ClaimLock,
        on_event: EventCallback | None,
    ) -> ScenarioResult:
        """The study copied into memory, searched there and written back in one transaction (predictions: no trial
        is worth a database round trip). The claim lock is held throughout, so workers of one study take turns,
        each going on from what the last one wrote."""
        with lock:
            stored = self._open_study(storage, study_name, scenario)
            optuna.storages.fail_stale_trials(stored)
            fail_orphans(stored, storage, lock, stored.get_trials(deepcopy=False))
            study, memory, base = private_copy(stored)
            run = self._new_run(study, memory, None, scenario)
            self._enqueue_initial(run)
            result = self._search(run, on_event)
            write_back(stored, storage, study, base)
            run.recorder.sync(study.get_trials(deepcopy=False))
        return result

    def _new_run(self, study: optuna.Study, storage: optuna.storages.BaseStorage, lock: ClaimLock | None,
                 scenario: Scenario) -> _Run:
        ctx = StrategyContext(
            study, scenario, self.target, self.space, self.objective, self.workload,
            self.backend.target_model or self.model, self.profiles,
        )
        recorder = TrialRecorder(self.store, study.study_name, self.model, scenario, self.objective.value_names)
        return _Run(study, storage, lock, scenario, self.target, ctx, recorder, self.space.grid(),
                    rng=random.Random(f"{self.seed}:{study.study_name}"))

    def _search(self, run: _Run, on_event: EventCallback | None) -> ScenarioResult:
        """Claim and evaluate trials until the study has its target, then pick the result."""
        study, study_name = run.study, run.study.study_name
        start = state_counts(study.get_trials(deepcopy=False))
        launches_before = self.backend.engine_launches
        self._emit(on_event, SearchEvent.of("start", study_name, run.target, start))
        self._loop(run, on_event)
        if run.lock is not None:  # before a confirming launch, which takes minutes
            run.recorder.sync(study.get_trials(deepcopy=False))
        trials = study.get_trials(deepcopy=False)
        self._emit(on_event, SearchEvent.of("end", study_name, run.target, state_counts(trials)))
        result = self._result(run, trials)
        launches_after = self.backend.engine_launches
        if launches_before is not None and launches_after is not None:
            result.launches = launches_after - launches_before
        return result

    def _open_study(self, storage: optuna.storages.RDBStorage, name: str, scenario: Scenario) -> optuna.Study:
        """Create or load the study (under the claim lock) and check it is the same search.

        Each opening of a study (a worker joining, or a resumed run) gets its own sampler seed, ``seed + openings``:
        the first run is reproducible, and two workers (or a resumed run) do not replay the same random proposals.
        """
        study = optuna.create_study(
            study_name=name, storage=storage, directions=self.objective.directions, load_if_exists=True
        )
        meta = {
            "model": self.model,
            "device": self.device,
            "workload": self.workload.name,
            "workload_hash": self.workload.content_hash(),
            "objective": self.objective.to_dict(),
            "scenario": scenario.to_dict(),
            "backend": self.backend.name,
            "space": self.space.to_dict(),
        }
        stored = study.user_attrs.get(ATTR)
        if stored is None:
            stored = {**meta, "strategy": self.strategy.name, "openings": 0}
            study.set_metric_names(self.objective.value_names)
        else:
            # A narrower space resumed under the old name would still recommend what the new options exclude.
            differ = _differences(stored, json.loads(json.dumps(meta)))
            if differ:
                detail = "; ".join(f"{k}: study has {a!r}, this run {b!r}" for k, (a, b) in differ.items())
                raise UsageError(
                    f"Study {name!r} was created for another search ({detail}). Resume it with the same options, "
                    "or pass a new --study name."
                )
        openings = int(stored.get("openings", 0))
        study.set_user_attr(ATTR, {**stored, "openings": openings + 1})
        study.sampler = self.strategy.sampler(
            self.objective, self.seed + openings, deterministic=self.backend.capabilities.predicts
        )
        return study

    def _enqueue_initial(self, run: _Run) -> None:
        """Enqueue the strategy's initial configs that the study does not hold yet (in any state)."""
        trials = run.study.get_trials(deepcopy=False)
        present = {c for c in (self._config_of(t) for t in trials) if c is not None}
        for config in self.strategy.initial_configs(run.ctx):
            if config not in present:
                run.ctx.enqueue(config)
                present.add(config)

    def _config_of(self, t: FrozenTrial) -> SpecConfig | None:
        return trial_config(self.space, t)

    def _loop(self, run: _Run, on_event: EventCallback | None) -> None:
        if self.strategy.should_stop(run.ctx):  # e.g. a resumed model-guided study that had confirmed its best
            return
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
                    if isinstance(run.storage, optuna.storages.RDBStorage):
                        with Heartbeat(run.storage, claim.trial._trial_id, self.heartbeat_interval):
                            state, measurement = self._evaluate(run, claim)
                    else:
                        state, measurement = self._evaluate(run, claim)
            except BaseException:
                self._abandon(run, claim)
                raise
            counts = dict(claim.counts)
            if state != "duplicate":
                counts[state] += 1
            done = claim.done + (state != "duplicate")
            self._emit(on_event, SearchEvent.of("trial", run.study.study_name, run.target, counts, done, state,
                                                claim.config))
            if measurement is not None:
                self.strategy.after_trial(run.ctx, claim.config, measurement)
            if self.strategy.should_stop(run.ctx):
                return

    def _claim(self, run: _Run) -> _Claim | None:
        """Under the claim lock: fail dead workers' trials, stop at the target, else ask for the next trial."""
        study = run.study
        with run.lock or nullcontext():
            optuna.storages.fail_stale_trials(study)  # a no-op in memory
            trials = study.get_trials(deepcopy=False)
            if run.lock is not None and fail_orphans(study, run.storage, run.lock, trials):
                trials = study.get_trials(deepcopy=False)
            claimed_trials = [t for t in trials if counted(t)]
            if len(claimed_trials) >= run.target:
                return None
            claimed: dict[SpecConfig, FrozenTrial] = {}
            for t in claimed_trials:
                config = run.configs.get(t.number) or self._config_of(t)
                if config is not None:
                    run.configs[t.number] = config
                    claimed.setdefault(config, t)
            if not any(t.state == TrialState.WAITING for t in trials):
                unclaimed = [c for c in run.grid if c not in claimed]
                if not unclaimed:
                    return None  # every config of the space has been measured (or is being measured)
                # A prediction is deterministic and cheap: a repeated proposal teaches the sampler nothing, so move
                # on at the first one (each claim costs a storage round trip; measured backends keep the streak).
                limit = 1 if self.backend.capabilities.predicts else DUPLICATE_STREAK_LIMIT
                if run.streak >= limit:
                    run.ctx.enqueue(run.rng.choice(unclaimed))
                    run.streak = 0
            trial = study.ask()
            config = self.space.suggest(trial)
            duplicate = claimed.get(config)
            info: dict[str, Any] = {"worker": this_worker(), "config": config.to_dict()}
            if duplicate is not None:
                info["duplicate_of"] = duplicate.number
            trial.set_user_attr(ATTR, info)
            done = sum(1 for t in claimed_trials if t.state.is_finished())
            return _Claim(trial, config, info, duplicate, done, state_counts(trials))

    def _abandon(self, run: _Run, claim: _Claim) -> None:
        """An interrupted measurement (Ctrl-C, a crash in our code): FAIL the trial and re-queue its config."""
        trial = claim.trial
        try:
            if run.storage.get_trial(trial._trial_id).state.is_finished():
                return
            trial.set_user_attr(ATTR, {**claim.info, "status": "interrupted"})
            run.study.tell(trial, state=TrialState.FAIL)
            if claim.duplicate_of is None:
                requeue(run.study, run.storage, trial._trial_id)
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
        else:
            run.study.tell(trial, state=TrialState.FAIL)
        return "duplicate"

    def _evaluate(self, run: _Run, claim: _Claim) -> tuple[str, Measurement]:
        """Measure the claimed config, tell the study (values, SLO constraints, our attributes) and store it."""
        trial, config = claim.trial, claim.config
        m = self._measure_counted(run, config)
        metrics = measurement_metrics(m)
        values: list[float] = []
        constraints: dict[str, float] = {}
        failure: str | None = None
        if not m.ok:
            status, failure = "failed", f"{m.failure_kind}: {m.failure_reason}"
        else:
            try:
                values = self.objective.values(metrics)
                constraints = self.objective.constraints(metrics)
                status = "complete"
            except MissingFigureError as exc:
                status, failure = "failed", str(exc)
        if constraints:
            metrics["constraints"] = constraints
            metrics["feasible"] = all(v <= 0 for v in constraints.values())
        info = {**claim.info, "status": status, "metrics": metrics, "measurement": slim(m),
                "provenance": m.provenance.to_dict()}
        if failure:
            info["failure"] = failure
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr(ATTR, info)
        if status == "complete":
            run.study.tell(trial, values)
        else:
            run.study.tell(trial, state=TrialState.FAIL)
        if run.lock is not None:  # a private study's trials are stored when it is written back
            run.recorder.record(trial.number, config, status, values, metrics, m.provenance.to_dict(), failure)
        return status, m

    @staticmethod
    def _emit(on_event: EventCallback | None, event: SearchEvent) -> None:
        if on_event is not None:
            on_event(event)

    # ---- the result ----------------------------------------------------------------------------------------------

    def _result(self, run: _Run, trials: Sequence[FrozenTrial]) -> ScenarioResult:
        result = summarize(
            run.study, trials, run.scenario, self.objective, self.space, self.strategy.name,
            lambda config: self._measure_counted(run, config),
        )
        result.n_measurements = run.measurements
        report = self.strategy.report(run.ctx)
        result.strategy_report = report
        result.profile_launches = int(report.get("profile_launches", 0))
        if result.feasible:
            self._confirm_pick(run, trials, result)
        config = result.best.config
        if result.feasible and config.speculative:
            result.schedule = depths.depth_schedule(
                self.backend, lambda c, _w, s: self.measure(c, s), config, self.workload, self.space
            )
            result.class_policy = depths.class_caps(self.backend, config, self.workload, run.scenario, self.space)
        return result

    def _confirmation(self, run: _Run, config: SpecConfig) -> Measurement | None:
        """The backend's confirming launch of `config` (`Backend.confirm`), kept in the study, so a re-run of a
        finished search (or another worker) reads it instead of launching again."""
        key = CONFIRMATION_ATTR + json.dumps(config.to_dict(), sort_keys=True)
        stored = run.study.user_attrs.get(key)
        if isinstance(stored, dict):
            try:
                return Measurement.from_dict(stored)
            except (TypeError, ValueError, KeyError):
                pass  # unreadable (another version): launch again
        fresh = self.backend.confirm(config, self.workload, run.scenario)
        if fresh is not None:
            run.study.set_user_attr(key, slim(fresh))
        return fresh

    def _confirm_pick(self, run: _Run, trials: Sequence[FrozenTrial], result: ScenarioResult) -> None:
        """Confirm the pick in fresh launches (`Backend.confirm`): the best config, and where in-launch figures are
        estimates (FULL CUDA graphs, `autotune.search.confirm`) the configs within their spread of it, at most
        `MAX_CANDIDATES`. The pick is then made on the fresh figures (a candidate that needs no launch keeps its
        own), and `_confirm` recommends it, or no speculation when it fails, misses the SLOs or loses to that."""
        best = result.best
        figures: dict[SpecConfig, Measurement] = {}
        for t in trials:
            if t.state != TrialState.COMPLETE or trial_info(t).get("duplicate_of") is not None:
                continue
            m = trial_measurement(t)
            if m is not None and m.config != best.config and self.objective.score(m) is not None:
                figures.setdefault(m.config, m)
        figures[best.config] = best
        ranked = [Figure(c, score, in_launch_spread(m)) for c, m in figures.items()
                  if (score := self.objective.score(m, check_slos=False)) is not None]
        candidates = confirmation_candidates(ranked, best.config)
        launched = {c: fresh for c in candidates if (fresh := self._confirmation(run, c)) is not None}
        if not launched:
            return
        served = {c: launched.get(c, figures[c]) for c in candidates}
        scores = {c: self.objective.score(m) for c, m in served.items()}
        pick = max((c for c in candidates if scores[c] is not None), key=lambda c: scores[c] or 0.0,
                   default=best.config)
        if pick in launched:
            confirm_fresh(self.objective, result, figures[pick], launched[pick])
        else:  # its figure needs no fresh launch (no speculation, or measured fresh) and beat every fresh candidate
            result.best = served[pick]
            result.confirmation = {"config": pick.label(), "tokens_per_s": served[pick].output_tokens_per_s,
                                   "in_launch_tokens_per_s": None, "fresh_tokens_per_s": None, "fresh_ok": None,
                                   "recommended": "kept"}
        note = result.confirmation
        assert note is not None
        note["launches"] = len(launched)  # fresh launches made (a re-run reads them back from the study)
        info = best.extra.get("in_launch")
        if isinstance(info, dict) and info.get("first_phase_outliers"):  # a first phase slower than its shape's later
            note["first_phase_outliers"] = info["first_phase_outliers"]  # ones, in the best's drafter launch
        if len(candidates) > 1:
            note["graph_mode"] = best.provenance.cudagraph_mode
            note["in_launch_best"] = best.config.label()
            note["candidates"] = [candidate_note(figures[c], launched.get(c)) for c in candidates]

    def _measure_counted(self, run: _Run, config: SpecConfig) -> Measurement:
        """`measure`, counting a measurement this worker had not made yet against the scenario."""
        run.measurements += int((config, run.scenario) not in self._cache)
        return self.measure(config, run.scenario)

    def recommendation_metrics(self, result: ScenarioResult) -> dict[str, Any]:
        """What a stored recommendation of `result` keeps as metrics (`ScenarioResult.recommendation_metrics`) and
        the max_model_len it is exported with: what its launches passed (`EngineOptions`), else the workload's
        (`autotune.fit.max_model_len_of`, as predicted)."""
        from autotune.fit import max_model_len_of

        options = getattr(self.backend, "options", None)
        max_model_len = getattr(options, "max_model_len", None) or max_model_len_of(self.workload)
        return {**result.recommendation_metrics(), "max_model_len": max_model_len}

    def recommend(self, result: ScenarioResult, environment: Mapping[str, Any]) -> int | None:
        """Store `result` as a recommendation and return its id; None (nothing stored) when no config met the SLOs."""
        if not result.feasible:
            return None
        best = result.best
        rid = self.store.add_recommendation(
            model=self.model,
            gpu=self.device,
            vllm_version=environment.get("vllm_version"),
            workload_name=self.workload.name,
            workload_hash=self.workload.content_hash(),
            objective=self.objective.name,
            scenario=result.scenario.to_dict(),
            best_config=best.config.to_dict(),
            metrics=self.recommendation_metrics(result),
            provenance=best.provenance.to_dict(),
            pareto=[p.to_dict() for p in result.pareto],
            schedule=[dataclasses.asdict(e) for e in result.schedule],
            class_policy=result.class_policy,
            study=result.study_name,
        )
        result.recommendation_id = rid
        return rid
