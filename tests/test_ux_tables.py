"""Tables a newcomer reads at 80 columns (issue 13.1): `search` and `show` name the drafter, keep every line within
80 columns without cutting cells, hold no raw JSON, and put the details in --wide (or below the table).

CliRunner's output is not a terminal, so rich draws at 80 columns: what a pipe, and an 80-column terminal, get.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ux_cli import cli

from store import Store


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ux-tables") / "peagle.db"
    result = cli("search", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,8", "--max-k", "3",
                 "--trials", "25", "--db", str(path))
    assert result.exit_code == 0, result.output
    return str(path)


def assert_fits(text: str, width: int = 80) -> None:
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long
    assert "…" not in text  # rich's ellipsis: a cut cell
    assert not re.search(r"[{}]", text), "raw JSON in a table"


def test_search_output_fits_80_columns_and_names_the_drafter(db: str) -> None:
    result = cli("search", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,8", "--max-k", "3",
                 "--trials", "25", "--db", db)
    assert result.exit_code == 0, result.output
    # Notes above and below are soft-wrapped lines (the terminal wraps them; a pipe keeps them whole to copy).
    tables = result.stdout[result.stdout.index("gpt-oss-120b on h200") : result.stdout.index("Rule:")]
    assert_fits(tables)
    assert "p-eagle 4L" in tables and "Drafters: p-eagle = amazon/gpt-oss-120b-p-eagle" in tables
    # Piped output has no progress display and no blank lines left behind by one.
    assert "\n\n\n" not in result.output


def test_search_wide_adds_details(db: str) -> None:
    result = cli("search", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,8", "--max-k", "3",
                 "--trials", "25", "--wide", "--db", db)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("c "))
    for column in ("TPOT p99", "TTFT p99", "vs pub. K", "trials ok/fail", "launches"):
        assert column in header
    assert "amazon/gpt-oss-120b-p-eagle 4L" in result.stdout


def test_show_recommendations_at_80_columns(db: str) -> None:
    result = cli("show", "--db", db)
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout)
    assert "gpt-oss-120b on h200, sample-chat, throughput (predicted)" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"^\d+\s+\d+\s", line)]
    assert [(r[0], r[1]) for r in rows] == [("2", "8"), ("1", "1")]  # id, concurrency; highest concurrency first
    recs = {r["id"]: r for r in json.loads(cli("show", "--json", "--db", db).stdout)["recommendations"]}
    for r in rows:
        config = recs[int(r[0])]["best_config"]
        assert r[2] == "p-eagle" and r[3] == f"{config['drafter_layers']}L"  # the drafter, by name
        assert r[5] == str(config["num_speculative_tokens"]) and r[6] == str(config["max_num_seqs"])
    assert "amazon/gpt-oss-120b-p-eagle" in result.stdout  # the legend names the full id


def test_show_wide_has_full_names(db: str) -> None:
    result = cli("show", "--wide", "--db", db)
    assert result.exit_code == 0, result.output
    assert "openai/gpt-oss-120b on NVIDIA H200 SXM 141GB" in result.stdout
    assert "amazon/gpt-oss-120b-p-eagle 4L" in result.stdout


def test_show_studies_lists_whole_names_without_json(db: str) -> None:
    result = cli("show", "--studies", "--db", db)
    assert result.exit_code == 0, result.output
    assert "{" not in result.stdout
    studies = json.loads(cli("show", "--studies", "--json", "--db", db).stdout)["studies"]
    lines = [line.strip() for line in result.stdout.splitlines()]
    for s in studies:
        assert s["study"] in lines  # whole, on its own line: copy it into `show --trials`
        kind = (s["recommendation"] or {}).get("kind") or "measured or predicted: see --trials"
        assert f"{s['n_trials']} trials ({kind}): {s['n_complete']} ok, {s['n_failed']} failed" in result.stdout


def test_show_trials_at_80_columns(db: str) -> None:
    study = json.loads(cli("show", "--studies", "--json", "--db", db).stdout)["studies"][0]["study"]
    result = cli("show", "--trials", study, "--db", db)
    assert result.exit_code == 0, result.output
    body = result.stdout.split(study, 1)[1]
    assert_fits(body)
    assert "no speculation" in body and "p-eagle" in body


def empty_database(path: Path) -> str:
    """A database file with the tables and nothing stored (a read command refuses a file that does not exist)."""
    Store(str(path)).close()
    return str(path)


def test_show_profiles_empty_names_the_profile_command(tmp_path: Path) -> None:
    result = cli("show", "--profiles", "--db", empty_database(tmp_path / "empty.db"))
    assert result.exit_code == 0, result.output
    assert "peagle-tune profile" in result.stdout and "peagle-tune search" not in result.stdout


def test_group_level_db_and_command_db_precedence(db: str, tmp_path: Path) -> None:
    grouped = cli("--db", db, "show", "--json")
    assert grouped.exit_code == 0, grouped.output
    assert len(json.loads(grouped.stdout)["recommendations"]) == 2
    empty = empty_database(tmp_path / "other.db")
    # The command's own --db wins over the group's.
    assert json.loads(cli("--db", db, "show", "--json", "--db", empty).stdout)["recommendations"] == []


def test_group_db_beats_the_environment(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEAGLE_DB", empty_database(tmp_path / "env.db"))
    assert len(json.loads(cli("--db", db, "show", "--json").stdout)["recommendations"]) == 2
    assert json.loads(cli("show", "--json").stdout)["recommendations"] == []
