"""`peagle-tune report` plots stored simulations: tok/s and TPOT against concurrency per config, tagged PREDICTED
(simulate) with the GPU and model; a simulation is not drawn as a search study."""

from __future__ import annotations

from pathlib import Path

from autotune.report import write_report
from autotune.report._series import SCHEDULE_LINE, simulation_data
from autotune.simulate import gpu_setup, phases_from_workload, predict, store_simulation
from autotune.workloads import load_workload
from store import Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _store_small_simulation(db: Store) -> str:
    w = load_workload("mixed")
    workloads = {"shifting": phases_from_workload(w, "shifting", 4, classes=["chat", "code"], output_tokens=24)}
    setup = gpu_setup("gpt-oss-120b", "h200", workloads)
    return store_simulation(db, predict(setup, workloads, concurrencies=[1, 4], static_ks=[2, 4]))


def test_report_has_the_simulation_plot_labelled_predicted(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'p.db'}") as db:
        study = _store_small_simulation(db)
        trials = db.list_trials(study=study)
        index = write_report(db, tmp_path / "report")
    data, why = simulation_data(study, trials)
    assert data is not None, why
    # One line per config across concurrencies: the schedule's label changes with max_num_seqs, its line does not.
    assert data.configs == ["no speculation", "static K=2", "static K=4", SCHEDULE_LINE, "adaptive (trim)",
                            "adaptive (drafter width)", "per-phase oracle"]
    assert [c for c, _ in data.tokens_per_s[("shifting", SCHEDULE_LINE)]] == [1, 4]
    assert ("shifting", "per-phase oracle") not in data.tpot_ms_p50  # computed, so no latency

    pngs = sorted((tmp_path / "report").glob("*simulation*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes().startswith(PNG_MAGIC)
    page = index.read_text(encoding="utf-8")
    assert "Simulated serving against concurrency" in page
    figure = page[page.index(f'<img src="{pngs[0].name}"'):]
    caption = figure[: figure.index("</figure>")]
    for needed in ("PREDICTED", "NVIDIA H200", "openai/gpt-oss-120b", "peagle-tune simulate", study):
        assert needed in caption, needed
    assert "Search trials" not in page  # the simulation's rows are not search trials
    assert data.title == "Simulated serving: gpt-oss-120b on NVIDIA H200 SXM 141GB"


def test_an_unreadable_simulation_is_a_note_not_a_crash(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'p.db'}") as db:
        db.add_trial("simulate-odd", number=0, model="m", config={}, backend="simulate", values={"x": 1.0})
        index = write_report(db, tmp_path / "report")
    page = index.read_text(encoding="utf-8")
    assert "No simulation figure" in page and not list((tmp_path / "report").glob("*.png"))
