"""Resuming and sharing studies: a killed search resumes with no completed trial lost, several worker processes
share one study (SQLite, and PostgreSQL when PEAGLE_TEST_POSTGRES_URL is set) with none lost or duplicated, and a
worker that stops beating has its trial failed and re-queued.

Worker processes run the real CLI (`autotune.cli.main`) with the model backend slowed down by a sleep, so that a
kill lands mid-search and two workers overlap, and with the study shared trial by trial as a measuring search shares
it (a predicting one searches a private copy, `autotune.search.private`); this file is also that worker script (see
the bottom). In-process tests of the shared path pass ``private=False`` for the same reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, make_url, text

from autotune.backends.model import ModelBackend
from autotune.cli import main
from autotune.errors import UsageError
from autotune.search import DrafterChoice, GridStrategy, Objective, RandomStrategy, Search, SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from store import Store
from store.testing import POSTGRES_URL_ENV, postgres_test_url

THIS = Path(__file__).resolve()
TRIALS = 12
"""Trials two workers share (of 34 configs, so the sampler, not the grid, decides what they measure)."""
PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
# 1 baseline + 8 parallel + 8 sequential K at each of max_num_seqs 32, 64: 34 configs.
SEARCH_ARGS = ["search", "--model", "gpt-oss-120b", "--backend", "model", "--concurrency", "64",
               "--max-num-seqs", "32,64", "--max-k", "8", "--json"]


def worker(db: str, study: str, trials: int, sleep_s: float, barrier: Path | None = None, *extra: str) -> list[str]:
    cmd = [sys.executable, str(THIS), str(sleep_s), str(barrier or "-"), "--", *SEARCH_ARGS,
           "--db", db, "--study", study, "--trials", str(trials), *extra]
    return cmd


def optuna_trials(db: str, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=f"{study}-c64", storage=db).trials


def measured(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Trials that measured a config (not duplicates told from an earlier trial, not trials of dead workers)."""
    out = []
    for t in trials:
        info = t.user_attrs.get("peagle", {})
        finished = t.state.name in ("COMPLETE", "PRUNED") or info.get("status") == "failed"
        if finished and info.get("duplicate_of") is None:
            out.append(t)
    return out


def config_key(t: optuna.trial.FrozenTrial) -> str:
    return json.dumps(t.user_attrs["peagle"]["config"], sort_keys=True)


def stored_count(db: str) -> int:
    engine = create_engine(db)
    try:
        with engine.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM peagle_trials")).scalar_one())
    except Exception:
        return 0  # not created yet
    finally:
        engine.dispose()


@pytest.mark.slow
def test_killed_search_resumes_with_no_completed_trial_lost(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    proc = subprocess.Popen(worker(db, "s", 20, 0.3), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while stored_count(db) < 4:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the worker stored no trials"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    before = {t.number: (t.params, t.values) for t in optuna_trials(db, "s") if t.state.name == "COMPLETE"}
    assert 4 <= len(before) < 20

    result = CliRunner().invoke(main, [*SEARCH_ARGS, "--db", db, "--study", "s", "--trials", "20"])
    assert result.exit_code == 0, result.output
    after = optuna_trials(db, "s")
    by_number = {t.number: t for t in after}
    for number, (params, values) in before.items():  # every trial completed before the kill is intact
        assert by_number[number].state.name == "COMPLETE"
        assert (by_number[number].params, by_number[number].values) == (params, values)
    done = measured(after)
    assert len(done) == 20 and len({config_key(t) for t in done}) == 20
    assert not any(t.state.name == "RUNNING" for t in after)
    # Our trials table has the same 20, and the best value did not get worse.
    assert len(Store(db).list_trials(study="s-c64")) == 20
    doc = json.loads(result.stdout)
    best_before = max(v[0] for _, v in before.values())
    assert doc["scenarios"][0]["output_tokens_per_s"] >= best_before


def run_two_workers(db: str, study: str, trials: int, tmp_path: Path, *extra: str) -> list[subprocess.CompletedProcess]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen(worker(db, study, trials, 0.02, barrier, *extra), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def check_shared_study(db: str, study: str, trials: int, runs: list[subprocess.CompletedProcess]) -> None:
    for r in runs:
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    all_trials = optuna_trials(db, study)
    done = measured(all_trials)
    assert len(done) == trials  # the total across both workers, none lost
    assert len({t.number for t in done}) == trials
    assert len({config_key(t) for t in done}) == trials  # no config measured twice
    # Both workers measured (each passed the barrier holding a trial), and our trials table agrees.
    pids = {t.user_attrs["peagle"]["worker"]["pid"] for t in done}
    assert len(pids) == 2
    stored = Store(db).list_trials(study=f"{study}-c64")
    assert sorted(t.number for t in stored) == sorted(t.number for t in done)


@pytest.mark.slow
def test_two_workers_share_one_sqlite_study(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    runs = run_two_workers(db, "shared", TRIALS, tmp_path)
    check_shared_study(db, "shared", TRIALS, runs)


@pytest.fixture
def postgres_db() -> Iterator[str]:
    """A fresh PostgreSQL database on the test server, dropped afterwards."""
    url = postgres_test_url()
    if url is None:
        pytest.skip(f"set {POSTGRES_URL_ENV} to run the shared-study test on PostgreSQL")
    name = f"peagle_search_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.postgres
def test_two_workers_share_one_postgres_study(tmp_path: Path, postgres_db: str) -> None:
    # Worker A keeps everything on the server (--db); worker B, as on another host, keeps its own SQLite store and
    # shares only the study (--storage).
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    host_b = f"sqlite:///{tmp_path / 'host-b.db'}"
    commands = [
        worker(postgres_db, "fleet", TRIALS, 0.02, barrier),
        worker(host_b, "fleet", TRIALS, 0.02, barrier, "--storage", postgres_db),
    ]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode()[-2000:]
    done = measured(optuna_trials(postgres_db, "fleet"))
    assert len(done) == TRIALS and len({t.number for t in done}) == TRIALS
    assert len({config_key(t) for t in done}) == TRIALS
    assert len({t.user_attrs["peagle"]["worker"]["pid"] for t in done}) == 2
    # Each store holds what its worker measured plus what the study had finished when it ended; together, all.
    stored = [{t.number for t in Store(db).list_trials(study="fleet-c64")} for db in (postgres_db, host_b)]
    assert stored[0] | stored[1] == {t.number for t in done}


# ------------------------------------------------------------------------------------------ in-process behaviour

SPACE = SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(32, 64))


def make(db: str, space: SearchSpace = SPACE, **kw: Any) -> Search:
    return Search(
        store=Store(db),
        backend=ModelBackend("gpt-oss-120b", "h200"),
        model="openai/gpt-oss-120b",
        device="NVIDIA H200",
        workload=load_workload("mt-bench"),
        space=space,
        study_prefix="p",
        **kw,
    )


def test_resuming_with_a_larger_budget_keeps_the_first_trials(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    first = make(db, n_trials=8).run_scenario(Scenario(64))
    before = {t.number: t.values for t in optuna_trials(db, "p")}
    second = make(db, n_trials=14).run_scenario(Scenario(64))
    after = {t.number: t.values for t in optuna_trials(db, "p")}
    assert {n: after[n] for n in before} == before
    assert (first.n_trials, second.n_trials) == (8, 14)
    assert len({config_key(t) for t in measured(optuna_trials(db, "p"))}) == 14


def test_an_in_memory_database_runs_a_study_without_resumption() -> None:
    result = make("sqlite://", strategy=GridStrategy(), n_trials=5).run_scenario(Scenario(64))
    assert result.n_trials == 5 and result.best.config in SPACE.grid()[:5]


def test_resuming_a_study_with_another_objective_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    make(db, n_trials=3).run_scenario(Scenario(64))
    with pytest.raises(UsageError, match="was created for another search .*objective"):
        make(db, n_trials=3, objective=Objective("latency")).run_scenario(Scenario(64))


def test_resuming_a_study_with_a_narrower_space_is_refused_naming_the_difference(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    make(db, n_trials=3).run_scenario(Scenario(64))
    narrower = SearchSpace(drafters=(PEAGLE,), k_max=1, max_num_seqs=(32,))
    with pytest.raises(UsageError, match=r"space\.k_max: study has 8, this run 1; space\.max_num_seqs: study has "
                                         r"\[32, 64\], this run \[32\]"):
        make(db, n_trials=3, space=narrower).run_scenario(Scenario(64))


def test_a_named_study_resumed_with_the_drafter_excluded_is_refused_not_exported(tmp_path: Path) -> None:
    # Issue 44.1: the second search excluded the P-EAGLE head and parallel drafting, and export still gave them.
    db = str(tmp_path / "peagle.db")
    base = ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--study", "s", "--db", db, "--trials", "8"]
    assert CliRunner().invoke(main, base).exit_code == 0
    narrowed = CliRunner().invoke(main, [*base, "--drafter", "nvidia/gpt-oss-120b-Eagle3-short-context",
                                         "--parallel-drafting", "off"])
    assert narrowed.exit_code == 2
    assert "was created for another search (space.drafters: study has" in narrowed.output
    assert "pass a new --study name" in narrowed.output


def test_an_interrupted_trial_is_requeued_and_measured_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    search = make(db, strategy=GridStrategy(), n_trials=6, private=False)
    real = search.backend.measure
    calls = {"n": 0}

    def interrupt_third(config: SpecConfig, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(config, *args, **kwargs)

    monkeypatch.setattr(search.backend, "measure", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        search.run_scenario(Scenario(64))
    states = [t.state.name for t in optuna_trials(db, "p")]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "WAITING", "WAITING", "WAITING", "WAITING"]
    result = make(db, strategy=GridStrategy(), n_trials=6, private=False).run_scenario(Scenario(64))
    done = measured(optuna_trials(db, "p"))
    # The grid's first 6 configs, each measured once; the interrupted third was re-queued, not lost.
    assert sorted(config_key(t) for t in done) == sorted(json.dumps(c.to_dict(), sort_keys=True)
                                                          for c in SPACE.grid()[:6])
    assert result.n_trials == 6


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning", "ignore:Heartbeat of storage")
def test_a_worker_that_stops_beating_has_its_trial_failed_and_requeued(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    make(db, strategy=RandomStrategy(), n_trials=2).run_scenario(Scenario(64))
    # A worker on another host claims a trial, beats once, then goes silent (its heartbeat is an hour old).
    storage = optuna.storages.RDBStorage(db, heartbeat_interval=60)
    study = optuna.load_study(study_name="p-c64", storage=storage)
    trial = study.ask()
    config = SPACE.suggest(trial)
    trial.set_user_attr("peagle", {"worker": {"host": "elsewhere", "boot": "x", "pid": 1}, "config": config.to_dict()})
    storage.record_heartbeat(trial._trial_id)
    engine = create_engine(db)
    with engine.begin() as c:
        c.execute(text("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')"))
    engine.dispose()
    storage.engine.dispose()

    # The next run fails the silent trial (heartbeat older than the grace period) and measures its re-queued copy
    # first, as the third and last trial.
    make(db, strategy=RandomStrategy(), n_trials=3).run_scenario(Scenario(64))
    trials = optuna_trials(db, "p")
    stale = next(t for t in trials if t.number == trial.number)
    assert stale.state.name == "FAIL"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == trial.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].params == stale.params
    assert len(measured(trials)) == 3


# ---------------------------------------------------------------------------------------------- worker script


def _slow_backend(sleep_s: float, barrier: str) -> None:
    """Slow ModelBackend.measure down and share the study as a measuring search does; with a barrier directory, the
    first measurement of each worker waits until two workers have arrived (each holding a claimed trial), so both
    are sure to take part."""
    post_init = Search.__post_init__

    def shared(self: Search) -> None:
        post_init(self)
        self.private = False

    Search.__post_init__ = shared  # type: ignore[method-assign]
    original = ModelBackend.measure
    state = {"arrived": False}

    def measure(self: ModelBackend, *args: Any, **kwargs: Any) -> Any:
        if barrier != "-" and not state["arrived"]:
            state["arrived"] = True
            Path(barrier, str(os.getpid())).touch()
            deadline = time.monotonic() + 120
            while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(sleep_s)
        return original(self, *args, **kwargs)

    ModelBackend.measure = measure  # type: ignore[method-assign]


if __name__ == "__main__":
    _sleep, _barrier, _sep, *_args = sys.argv[1:]
    _slow_backend(float(_sleep), _barrier)
    main(_args, prog_name="peagle-tune")
