"""`peagle-tune show`, `db` and error handling through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from autotune.cli import main


@pytest.fixture()
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'peagle.db'}"


def _search(db: str, *args: str) -> None:
    result = CliRunner().invoke(
        main, ["search", "--model", "gpt-oss-120b", "--concurrency", "1", "--trials", "20", "--db", db, *args]
    )
    assert result.exit_code == 0, result.output


def test_show_lists_the_recommendation_a_search_stored(db: str) -> None:
    _search(db)
    result = CliRunner().invoke(main, ["show", "--json", "--db", db])
    assert result.exit_code == 0, result.output
    recs = json.loads(result.output)["recommendations"]
    assert len(recs) == 1
    assert recs[0]["model"] == "openai/gpt-oss-120b"
    assert recs[0]["provenance"]["kind"] == "predicted"


def test_show_studies_and_trials(db: str) -> None:
    _search(db)
    studies = json.loads(CliRunner().invoke(main, ["show", "--studies", "--json", "--db", db]).output)["studies"]
    assert len(studies) == 1
    name = studies[0]["study"]
    trials = json.loads(CliRunner().invoke(main, ["show", "--trials", name, "--json", "--db", db]).output)["trials"]
    assert len(trials) == studies[0]["n_trials"] > 0


def test_export_of_an_empty_database_says_to_search_first(db: str) -> None:
    result = CliRunner().invoke(main, ["export", "--db", db])
    assert result.exit_code == 3  # the one exit code for "nothing stored matches"
    assert "peagle-tune search" in result.output


def test_unknown_model_is_a_one_line_usage_error(db: str) -> None:
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-999", "--db", db])
    assert result.exit_code == 2
    assert "known models are" in result.output and "local path" in result.output


def test_database_from_a_newer_peagle_tune_is_refused_with_the_fix(db: str) -> None:
    _search(db)
    engine = sa.create_engine(db)
    with engine.begin() as conn:  # a newer peagle-tune migrated this database past our head revision
        conn.execute(sa.text("UPDATE peagle_alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    result = CliRunner().invoke(main, ["show", "--db", db])
    assert result.exit_code == 1
    assert "pip install -U peagle-tune" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_db_path_honours_peagle_db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PEAGLE_DB", str(tmp_path / "x.db"))
    result = CliRunner().invoke(main, ["db", "path"])
    assert result.exit_code == 0
    assert str(tmp_path / "x.db") in result.output
