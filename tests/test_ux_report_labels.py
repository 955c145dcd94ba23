"""Trial and Pareto plots are tagged PREDICTED / MEASURED like the report's other figures (issue 13.7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.report import _plots, plot_pareto, plot_trials, study_data
from store import Store


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Any]]:
    db = tmp_path_factory.mktemp("ux-labels") / "peagle.db"
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--max-k", "3",
                                       "--objective", "pareto", "--trials", "12", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with Store(f"sqlite:///{db}") as store:
        study = store.list_studies()[0].study
        return study, store.list_trials(study=study)


def _titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    titles: list[str] = []

    def finish(fig: Any, title: str, caption: str, path: Path, **kwargs: Any) -> Path:
        titles.append(title)
        _plots._pyplot().close(fig)
        return path

    monkeypatch.setattr(_plots, "_finish", finish)
    return titles


def test_trial_and_pareto_plots_say_predicted(trials: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    study, rows = trials
    data = study_data(study, rows)
    assert data.kind == "predicted"
    titles = _titles(monkeypatch)
    plot_trials(data, tmp_path / "t.png")
    plot_pareto(data, tmp_path / "p.png")
    assert titles[0].startswith("[PREDICTED] Trials:") and titles[1].startswith("[PREDICTED] Pareto front:")


def test_measured_and_mixed_studies_say_so(trials: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    import dataclasses

    study, rows = trials
    measured = [dataclasses.replace(t, provenance={**t.provenance, "kind": "measured"}) for t in rows]
    assert study_data(study, measured).kind == "measured"
    mixed = study_data(study, measured[:1] + list(rows[1:]))
    assert mixed.kind == "mixed"
    titles = _titles(monkeypatch)
    plot_trials(mixed, tmp_path / "m.png")
    assert titles[0].startswith("[MEASURED + PREDICTED] Trials:")
