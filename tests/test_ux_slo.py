"""SLOs in sight and next steps that work (issue 33, items 3 and 9), at 80 columns on the model backend:

- search's tables say the SLO, show TTFT for the latency and pareto objectives, and mark a max_num_seqs below the
  concurrency as queueing (``32q`` and a legend line); the model backend models no tail, so its p99 SLO checks are
  labelled "p99 = p50 (no tail modelled)"; `show` and the export header say the SLO too;
- search's `Next:` line suggests only commands that work for the stored config without a warning: no
  `--format schedule` for a config that drafts in parallel (vLLM 0.32 mishandles it), `serve` instead.

CliRunner's output is not a terminal: what a pipe gets, drawn at COLUMNS=80.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from ux_cli import cli, columns_80  # noqa: F401  (tests/ is on sys.path; columns_80: autouse)

SEARCH = ["search", "--model", "gpt-oss-120b", "--backend", "model", "--gpu", "h200", "--max-k", "4",
          "--trials", "20"]
NO_TAIL = "p99 = p50 (no tail modelled)"


def flat(text: str) -> str:
    return " ".join(text.split())


def narrow(text: str) -> None:
    """Every line fits 80 columns (the notes wrap at the terminal's width, COLUMNS here), but for one word that
    cannot be broken (a database path longer than a line)."""
    for line in text.splitlines():
        if len(line.split()) > 1:
            assert len(line) <= 80, line


def stored(db: str) -> list[dict[str, Any]]:
    return list(json.loads(cli("show", "--json", "--db", db).stdout)["recommendations"])


@pytest.fixture(scope="module")
def latency_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Result]:
    """A latency search under a TPOT SLO at c=64 whose max_num_seqs choices include 32 (queueing) and 64."""
    db = str(tmp_path_factory.mktemp("slo") / "peagle.db")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("COLUMNS", "80")
        result = cli(*SEARCH, "--concurrency", "64", "--objective", "latency", "--slo-tpot-p99", "12",
                     "--max-num-seqs", "32,64", "--db", db)
    assert result.exit_code == 0, result.output
    return db, result


def test_a_latency_search_shows_ttft_queueing_and_its_slo_labelled(latency_db: tuple[str, Result]) -> None:
    db, result = latency_db
    (rec,) = stored(db)
    # Min TPOT p50: half the batch per step, so the 32-sequence config wins and half the clients queue.
    assert rec["best_config"]["max_num_seqs"] == 32
    out = result.stdout
    narrow(out)
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("c  drafter"))
    assert "TTFT" in header.split()
    row = next(line for line in lines if line.startswith("64 "))
    cells = row.split()
    assert "32q" in cells
    # The TTFT cell (right-aligned under its header) is the stored median in ms, queueing included.
    end = re.search(r"\bTTFT\b(?! p99)", header).end()  # type: ignore[union-attr]
    assert row[:end].split()[-1] == f"{rec['metrics']['ttft_ms_p50']:.0f}"
    text = flat(out)
    assert "q: max_num_seqs below the concurrency: requests queue" in text
    assert f"SLO: TPOT p99 <= 12 ms; {NO_TAIL}." in text


def test_show_and_the_export_header_say_the_slo(latency_db: tuple[str, Result]) -> None:
    db, _ = latency_db
    shown = cli("show", "--db", db)
    assert shown.exit_code == 0, shown.output
    narrow(shown.stdout)
    assert f"SLO: TPOT p99 <= 12 ms; {NO_TAIL}." in flat(shown.stdout)
    assert re.search(r"^\s*\d+\s+64\s.*\s32q\s", shown.stdout, flags=re.M), shown.stdout
    exported = cli("export", "--format", "yaml", "--db", db)
    assert exported.exit_code == 0, exported.output
    first = exported.stdout.splitlines()[0]
    assert first.startswith("# recommendation #") and first.endswith(f"; SLO: TPOT p99 <= 12 ms; {NO_TAIL}")


def test_a_search_without_slos_says_none_and_marks_no_queueing(tmp_path: Path) -> None:
    db = str(tmp_path / "peagle.db")
    result = cli(*SEARCH, "--concurrency", "8", "--max-num-seqs", "8", "--db", db)
    assert result.exit_code == 0, result.output
    assert "SLO:" not in result.stdout and "q: max_num_seqs" not in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("c  drafter"))
    assert "TTFT" not in header  # throughput: no TTFT column at 80 columns
    assert "SLO:" not in cli("show", "--db", db).stdout


def test_a_pareto_search_shows_ttft_and_labels_its_p99s(tmp_path: Path) -> None:
    db = str(tmp_path / "peagle.db")
    result = cli(*SEARCH, "--concurrency", "64", "--objective", "pareto", "--max-num-seqs", "32,64", "--db", db)
    assert result.exit_code == 0, result.output
    narrow(result.stdout)
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("c  drafter"))
    assert "TTFT" in header.split()
    # The front's p99 columns are the model backend's p50s, and say so.
    assert f"TPOT p99, TTFT p99: {NO_TAIL}." in flat(result.stdout)


# --------------------------------------------------------------------------------------------- next steps that work


def suggested(output: str) -> list[list[str]]:
    """The commands the `Next:` line suggests, as argument lists (without `peagle-tune`)."""
    paragraph = flat(output[output.index("\nNext:") + 1:].split("\n\n")[0])  # wrapped at 80 columns here
    return [shlex.split(c)[1:] for c in re.findall(r"`(peagle-tune [^`]+)`", paragraph)]


def test_next_never_suggests_an_export_that_warns(tmp_path: Path) -> None:
    """Every config drafts in parallel here: the schedule export would warn (vLLM 0.32), so Next suggests serve,
    which applies K per batch size itself, and every command it suggests runs without a warning."""
    db = str(tmp_path / "peagle.db")
    result = cli(*SEARCH, "--concurrency", "64,1", "--parallel-drafting", "on", "--drafter",
                 "amazon/gpt-oss-120b-p-eagle", "--db", db)
    assert result.exit_code == 0, result.output
    assert all(r["best_config"]["parallel_drafting"] for r in stored(db))
    commands = suggested(result.stdout)
    assert [c[0] for c in commands] == ["export", "show", "serve"]
    assert "schedule" not in " ".join(commands[0])
    for command in commands:
        ran = cli(*command, "--db", db)
        assert ran.exit_code == 0, (command, ran.output)
        assert "warning" not in ran.stderr.lower(), (command, ran.output)
    # The schedule export it no longer suggests is the one that warns.
    schedule = cli("export", "--format", "schedule", "--db", db)
    assert schedule.exit_code == 0 and "mishandles" in schedule.stderr


def test_next_suggests_the_schedule_when_vllm_takes_it(tmp_path: Path) -> None:
    db = str(tmp_path / "peagle.db")
    result = cli(*SEARCH, "--concurrency", "64,1", "--parallel-drafting", "off", "--db", db)
    assert result.exit_code == 0, result.output
    commands = suggested(result.stdout)
    assert [c[0] for c in commands] == ["export", "show", "export"] and commands[2][-2:] == ["--format", "schedule"]
    for command in commands:
        ran = cli(*command, "--db", db)
        assert ran.exit_code == 0 and "warning" not in ran.stderr.lower(), (command, ran.output)
    assert "num_speculative_tokens_per_batch_size" in cli(*commands[2], "--db", db).stdout
