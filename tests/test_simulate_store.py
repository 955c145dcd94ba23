"""Simulations are stored like other predictions (trials of a study, provenance "predicted", backend "simulate"):
what `peagle-tune simulate` stores reads back equal, `show` lists and prints it, `--no-store` stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.show import show
from autotune.cli.simulate import simulate
from autotune.errors import NotFoundError, UsageError
from autotune.simulate import (
    SIMULATE_BACKEND,
    SimulationResult,
    gpu_setup,
    list_simulations,
    load_simulation,
    phases_from_workload,
    predict,
    store_simulation,
)
from autotune.workloads import load_workload
from store import Store

SMALL = ["--model", "gpt-oss-120b", "--gpu", "h200", "--workload", "mixed", "--classes", "chat,code",
         "--concurrency", "1,4",
         "--requests-per-phase", "4", "--output-tokens", "24", "--static-k", "2,4"]


def _small_result() -> SimulationResult:
    w = load_workload("mixed")
    workloads = {s: phases_from_workload(w, s, 4, classes=["chat", "code"], output_tokens=24)
                 for s in ("shifting", "stationary")}
    setup = gpu_setup("gpt-oss-120b", "h200", workloads)
    return predict(setup, workloads, concurrencies=[1, 4], static_ks=[2, 4], seed=3)


def test_a_stored_simulation_reads_back_equal(tmp_path: Path) -> None:
    result = _small_result()
    with Store(f"sqlite:///{tmp_path / 'p.db'}") as db:
        study = store_simulation(db, result)
        again = store_simulation(db, result)  # same second: a new name, never mixed with the first one's rows
        assert again != study
        assert load_simulation(db, study) == result
        trials = db.list_trials(study=study)
        # One predicted trial per row, in the result's order, comparable on tokens/s like search trials.
        assert [t.number for t in trials] == list(range(len(result.rows)))
        assert {t.backend for t in trials} == {SIMULATE_BACKEND}
        assert {t.provenance["kind"] for t in trials} == {"predicted"}
        assert [t.values["output_tokens_per_s"] for t in trials] == [r.output_tokens_per_s for r in result.rows]
        listed = list_simulations(db)
        assert {s.study for s in listed} == {study, again}
        summary = next(s for s in listed if s.study == study)
        assert (summary.model, summary.device) == (result.model, result.device)
        assert summary.concurrencies == [1, 4] and summary.workloads == ["shifting", "stationary"]
        assert summary.rows == len(result.rows)
        with pytest.raises(UsageError):
            store_simulation(db, result, study=study)  # a name with rows is refused
        with pytest.raises(NotFoundError):
            load_simulation(db, "no-such-simulation")


def test_simulate_stores_by_default_and_show_lists_and_prints_it(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    runner = CliRunner()
    ran = runner.invoke(simulate, [*SMALL, "--db", db, "--json"])
    assert ran.exit_code == 0, ran.output
    printed = json.loads(ran.stdout)
    study = printed["stored_as"]
    assert study and study.startswith("simulate-gpt-oss-120b-nvidia-h200")

    listed = runner.invoke(show, ["--simulations", "--db", db])
    assert listed.exit_code == 0, listed.output
    assert study in listed.stdout and "PREDICTED" in listed.stdout and "H200" in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80

    shown = runner.invoke(show, ["--simulation", study, "--db", db, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == printed  # what was printed is what is stored

    table = runner.invoke(show, ["--simulation", study, "--db", db])
    assert table.exit_code == 0, table.output
    assert table.stdout.startswith("PREDICTED") and "adaptive (trim)" in table.stdout and "x 4 requests" in table.stdout

    missing = runner.invoke(show, ["--simulation", "nope", "--db", db])
    assert missing.exit_code == 3 and "--simulations" in missing.output


def test_no_store_stores_nothing(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    ran = CliRunner().invoke(simulate, [*SMALL, "--concurrency", "1", "--shape", "shifting", "--db", str(db),
                                        "--no-store", "--json"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["stored_as"] is None
    with Store(f"sqlite:///{db}") as store:
        assert store.list_trials() == []
