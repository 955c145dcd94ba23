"""Recommendations a user can find, choose and trust (issue 33, items 1, 2, 4, 6, 7), at 80 columns on the model
backend:

- serve, export and show select by the same options (--concurrency, --gpu, --workload, --objective,
  --recommendation); several matches that differ in config are listed and exit 2 naming the option to add;
  `export --concurrency 64` gives max_num_seqs >= 64; serve defaults to the one search's highest concurrency;
- `peagle-tune list models|drafters|gpus|workloads`, and "did you mean" for mistyped names; nothing stored is exit 3;
- the picking rule: max_num_seqs above the concurrency only when it pays more than the tie margin;
- long drafter and study names at 80 columns; `| head` exits 0;
- simulate is quiet when piped and uses search's workload.

CliRunner's output is not a terminal: what a pipe gets, drawn at COLUMNS=80.
"""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from ux_cli import cli, columns_80  # noqa: F401  (tests/ is on sys.path; columns_80: autouse)

from autotune.search.result import tie_margin

SEARCH = ["search", "--backend", "model", "--gpu", "h200", "--max-k", "4", "--trials", "20"]


def ok(*args: str) -> Result:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


def recs(db: str) -> list[dict[str, Any]]:
    return list(json.loads(ok("show", "--json", "--db", db).stdout)["recommendations"])


def at(db: str, concurrency: int, objective: str = "throughput") -> dict[str, Any]:
    return next(r for r in recs(db) if r["scenario"]["concurrency"] == concurrency and r["objective"] == objective)


def listed_ids(stderr: str) -> set[int]:
    """The ids in the first column of a candidates table."""
    return {int(line.split()[0]) for line in stderr.splitlines() if re.match(r"^\d+\s", line)}


def argv_option(text: str, option: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("vllm serve "))
    argv = shlex.split(line)
    return argv[argv.index(option) + 1]


def assert_fits(text: str, width: int = 80) -> None:
    assert not [line for line in text.splitlines() if len(line) > width]
    assert "…" not in text  # rich's ellipsis: a cut cell


@pytest.fixture(scope="module")
def db_one(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One throughput search of gpt-oss-120b on the H200 at concurrency 64 then 1 (so the newest is c=1's)."""
    path = str(tmp_path_factory.mktemp("ux-selection") / "one.db")
    ok(*SEARCH, "--model", "gpt-oss-120b", "--concurrency", "64,1", "--db", path)
    return path


@pytest.fixture(scope="module")
def db_two(db_one: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`db_one` plus a latency search with a TPOT SLO at concurrency 64: two recommendations for c=64."""
    path = str(tmp_path_factory.mktemp("ux-selection") / "two.db")
    # SQLite's backup copies what is committed, the write-ahead log's pages included (a copy of the main file alone
    # misses the commits not yet checkpointed into it).
    source, target = sqlite3.connect(db_one), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    ok(*SEARCH, "--model", "gpt-oss-120b", "--concurrency", "64", "--objective", "latency", "--slo-tpot-p99", "12",
       "--db", path)
    return path


# ------------------------------------------------------------------------------------------------------ selection


def test_export_concurrency_64_gives_max_num_seqs_of_at_least_64(db_one: str) -> None:
    result = ok("export", "--concurrency", "64", "--format", "vllm-args", "--db", db_one)
    seqs = int(argv_option(result.stdout, "--max-num-seqs"))
    assert seqs >= 64 and seqs == at(db_one, 64)["best_config"]["max_num_seqs"]
    assert f"recommendation #{at(db_one, 64)['id']}" in result.stderr


def test_several_matches_that_differ_are_listed_and_exit_2_naming_the_option(db_two: str) -> None:
    result = cli("export", "--concurrency", "64", "--db", db_two)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # nothing exported
    table, error = result.stderr.rsplit("Error:", 1)
    assert_fits(table)
    at_64 = [r for r in recs(db_two) if r["scenario"]["concurrency"] == 64]
    assert len(at_64) == 2 and listed_ids(table) == {r["id"] for r in at_64}
    assert "throughput" in table and "latency-tpot12" in table  # the objective with its SLO tells them apart
    for r in at_64:  # each row shows its config's max_num_seqs and figure
        row = next(line for line in table.splitlines() if line.startswith(f"{r['id']} "))
        assert f"x{r['best_config']['max_num_seqs']}" in row
        assert f"{r['metrics']['output_tokens_per_s']:.1f}" in row
    assert "--objective" in error and len(error.strip().splitlines()) == 1
    chosen = ok("export", "--concurrency", "64", "--objective", "throughput", "--format", "vllm-args",
                "--db", db_two)
    assert int(argv_option(chosen.stdout, "--max-num-seqs")) >= 64


@pytest.mark.parametrize("command", [["export"], ["show"], ["serve", "--model", "m"]])
def test_serve_export_and_show_take_the_same_selection_options(command: list[str]) -> None:
    text = ok(*command, "--help").stdout
    for option in ("--concurrency", "--gpu", "--workload", "--objective", "--recommendation"):
        assert re.search(rf"^\s+{option}\b", text, flags=re.M), option


def test_show_selects_as_export_does(db_two: str) -> None:
    latency = json.loads(ok("show", "--objective", "latency", "--json", "--db", db_two).stdout)["recommendations"]
    assert [r["id"] for r in latency] == [at(db_two, 64, "latency")["id"]]
    same = json.loads(ok("show", "--objective", "latency-tpot12", "--concurrency", "64", "--gpu", "NVIDIA H200",
                         "--json", "--db", db_two).stdout)["recommendations"]
    assert [r["id"] for r in same] == [r["id"] for r in latency]
    text = ok("show", "--db", db_two).stdout
    assert_fits(text)
    assert "sample-chat, latency-tpot12 (predicted)" in text  # SLO runs are told apart from plain ones


def test_serve_default_is_the_search_at_its_highest_concurrency(db_one: str) -> None:
    """c=1 was stored last; serving its max_num_seqs=1 would queue every other client."""
    result = ok("serve", "--model", "gpt-oss-120b", "--gpu", "h200", "--dry-run", "--db", db_one)
    top = at(db_one, 64)
    assert argv_option(result.stdout, "--max-num-seqs") == str(top["best_config"]["max_num_seqs"])
    err = " ".join(result.stderr.split())
    seqs = top["best_config"]["max_num_seqs"]
    assert f"max_num_seqs {seqs} from the highest concurrency, 64 (#{top['id']})" in err
    ranges = ", ".join(f"{e['batch_min']}: K={e['k']}" if e["batch_min"] == e["batch_max"]
                       else f"{e['batch_min']}-{e['batch_max']}: K={e['k']}" for e in top["schedule"])
    assert f"K by batch size: {ranges}" in err


def test_serve_concurrency_and_objective_choose_like_export(db_two: str) -> None:
    result = ok("serve", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "64", "--objective",
                "throughput", "--dry-run", "--db", db_two)
    assert int(argv_option(result.stdout, "--max-num-seqs")) >= 64
    assert f"#{at(db_two, 64)['id']}" in result.stderr
    ambiguous = cli("serve", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "64", "--dry-run",
                    "--db", db_two)
    assert ambiguous.exit_code == 2 and "--objective" in ambiguous.stderr.splitlines()[-1]
    # Without --concurrency: two searches that differ (issue 41 item 3: before, the latest was served).
    both = cli("serve", "--model", "gpt-oss-120b", "--gpu", "h200", "--dry-run", "--db", db_two)
    assert both.exit_code == 2 and "--objective" in both.stderr.splitlines()[-1]
    assert listed_ids(both.stderr) == {at(db_two, 64)["id"], at(db_two, 64, "latency")["id"]}


def test_a_recommendation_id_must_agree_with_the_other_options(db_one: str) -> None:
    result = cli("export", "--recommendation", str(at(db_one, 1)["id"]), "--concurrency", "64", "--db", db_one)
    assert result.exit_code == 2 and "concurrency 1, not 64" in result.output


# ---------------------------------------------------------------------------------------- not found, suggestions


@pytest.mark.parametrize("args,words", [
    (["show", "--model", "gpt-oss-12b"], ["gpt-oss-120b"]),
    (["show", "--model", "gptoss-120b"], ["did you mean gpt-oss-120b?"]),
    (["export", "--workload", "samplechat"], ["did you mean sample-chat?"]),
    (["show", "--concurrency", "3"], ["stored concurrencies: 1, 64"]),
    (["serve", "--model", "gpt-oss-120b", "--gpu", "b200", "--dry-run"], ["stored gpus: h200"]),
])
def test_nothing_stored_matches_is_exit_3_with_what_is_stored(db_one: str, args: list[str], words: list[str]) -> None:
    result = cli(*args, "--db", db_one)
    assert result.exit_code == 3, result.output
    assert len(result.output.strip().splitlines()) == 1
    for w in words:
        assert w in result.output.lower()


@pytest.mark.parametrize("args,suggestion", [
    (["--model", "gptoss-120b"], "did you mean gpt-oss-120b?"),
    (["--model", "gpt-oss-120b", "--workload", "mtbench"], "did you mean mt-bench?"),
    (["--model", "gpt-oss-120b", "--gpu", "h2000"], "did you mean h200?"),
    (["--model", "gpt-oss-120b", "--drafter", "gpt-oss-120b-peagle"], "did you mean amazon/gpt-oss-120b-p-eagle"),
])
def test_unknown_catalog_names_get_the_closest_ones(tmp_path: Path, args: list[str], suggestion: str) -> None:
    result = cli("search", "--backend", "model", *args, "--db", str(tmp_path / "x.db"))
    assert result.exit_code == 2, result.output
    assert suggestion in result.output and len(result.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------------------- list


@pytest.mark.parametrize("kind", ["models", "drafters", "gpus", "workloads"])
def test_list_fits_80_columns_and_every_name_is_one_the_commands_take(kind: str) -> None:
    from autotune.catalogs import get_drafter, get_gpu, resolve_model
    from autotune.workloads import DATASETS, load_workload

    every = ["--all"] if kind == "drafters" else []  # hypothetical drafters too: the longest names
    text = ok("list", kind, *every).stdout
    assert_fits(text)
    rows = json.loads(ok("list", kind, *every, "--json").stdout)[kind]
    assert rows
    for row in rows:
        assert re.search(rf"^{re.escape(row['name'])}\*?\s", text, flags=re.M), row["name"]  # shown by that name
        if kind == "models":
            assert resolve_model(row["name"]).name == row["id"]
        elif kind == "drafters":
            assert get_drafter(row["name"]).name == row["id"]
        elif kind == "gpus":
            assert get_gpu(row["name"]).key == row["name"]
        elif row["name"].startswith("hf:"):  # a dataset: its class (the count comes with loading it)
            assert row["requests"] is None and isinstance(row["cached"], bool)
            assert list(row["classes"]) == [DATASETS[row["name"].removeprefix("hf:")].workload_class]
        else:
            assert {c: len(r) for c, r in load_workload(row["name"]).classes.items()} == row["classes"]


def test_list_drafters_says_target_layers_parallel_drafting_and_published_acceptance() -> None:
    from autotune.catalogs import drafters_for, get_drafter

    rows = json.loads(ok("list", "drafters", "--model", "gpt-oss-120b", "--json").stdout)["drafters"]
    assert {r["id"] for r in rows} == {d.name for d in drafters_for("gpt-oss-120b")}
    text = ok("list", "drafters", "--model", "gpt-oss-120b").stdout
    for r in rows:
        spec = get_drafter(r["id"])
        assert (r["target"], r["layers"], r["parallel_drafting"]) == (spec.target, spec.num_layers,
                                                                       spec.parallel_drafting)
        assert r["published_acceptance"] == sorted(spec.reference_acceptance)
        cells = next(line for line in text.splitlines() if line.startswith(r["name"] + " ")).split()
        assert cells[1:] == ["gpt-oss-120b", "P-EAGLE" if spec.parallel_drafting else "EAGLE-3",
                             str(spec.num_layers), "yes" if spec.parallel_drafting else "no",
                             str(spec.recommended_k) if spec.recommended_k else "-",
                             "yes" if spec.reference_acceptance else "no"]
    assert {"yes", "no"} <= {line.split()[-1] for line in text.splitlines() if line.startswith("gpt-oss")}


def test_list_takes_no_unknown_kind() -> None:
    result = cli("list", "tokenizers")
    assert result.exit_code == 2 and "models" in result.output


# ---------------------------------------------------------------------------------------------- the picking rule


def test_tie_rule_keeps_max_num_seqs_within_the_concurrency_unless_more_pays() -> None:
    import optuna

    from autotune.search import Objective
    from autotune.search.result import TIE, pick
    from autotune.search.trials import ATTR
    from autotune.spec import Scenario, SpecConfig

    def config(k: int, seqs: int) -> SpecConfig:
        return SpecConfig(method="eagle3", drafter="org/d", num_speculative_tokens=k, drafter_layers=1,
                          max_num_seqs=seqs)

    def trial(c: SpecConfig, tps: float) -> Any:
        return optuna.trial.create_trial(value=tps, user_attrs={ATTR: {"config": c.to_dict(), "metrics": {
            "output_tokens_per_s": tps}}})

    configs: dict[int, SpecConfig] = {}

    def config_of(t: Any) -> SpecConfig:
        return configs[id(t)]

    def picked(*pairs: tuple[SpecConfig, float]) -> SpecConfig:
        trials = []
        for c, tps in pairs:
            t = trial(c, tps)
            configs[id(t)] = c
            trials.append(t)
        chosen, feasible = pick(Objective(), trials, [], Scenario(concurrency=64), config_of)
        assert feasible
        return config_of(chosen)

    # 128 sequences at a smaller K, within the margin: the tie goes to the config within the concurrency.
    assert picked((config(3, 128), 1000.0), (config(4, 64), 1000.0 * (1 - TIE / 2))).max_num_seqs == 64
    # More than the margin better: 128 is recommended.
    assert picked((config(3, 128), 1000.0 * (1 + 2 * TIE)), (config(4, 64), 1000.0)).max_num_seqs == 128


def test_search_does_not_recommend_more_sequences_than_clients_for_nothing(tmp_path: Path) -> None:
    """qwen3-coder-30b at c=64: the sampler found K=5 at max_num_seqs 128 and never tried it at 64, which the model
    backend predicts at the same tok/s (64 clients never fill 128 slots). Before issue 33, 128 was recommended."""
    db = str(tmp_path / "qwen.db")
    doc = json.loads(ok("search", "--backend", "model", "--gpu", "h200", "--model", "qwen3-coder-30b",
                        "--concurrency", "64", "--json", "--db", db).stdout)
    (scenario,) = doc["scenarios"]
    best = scenario["best_config"]
    assert best["max_num_seqs"] <= 64
    trials = json.loads(ok("show", "--trials", scenario["study"], "--json", "--db", db).stdout)["trials"]
    fastest = max((t for t in trials if t["status"] == "complete"), key=lambda t: t["metrics"]["output_tokens_per_s"])
    top = fastest["metrics"]["output_tokens_per_s"]
    # The tie rule's margin: the spread of the fastest trial's prediction, as stored with its metrics.
    margin = tie_margin(fastest["metrics"]["prediction_log_sigma"])
    rec = recs(db)[0]
    assert rec["metrics"]["output_tokens_per_s"] >= top * (1 - margin)  # nothing better than the margin thrown away
    assert "max_num_seqs <= the concurrency" in rec["metrics"]["rule"]


# ---------------------------------------------------------------------------------------------------- 80 columns


def test_a_samples_old_name_selects_its_searches(db_one: str) -> None:
    # Searched without --workload on the model backend: sample-chat; mt-bench (its old name) selects the same.
    stored = [r["id"] for r in recs(db_one)]
    for name in ("sample-chat", "mt-bench"):
        shown = json.loads(ok("show", "--workload", name, "--json", "--db", db_one).stdout)["recommendations"]
        assert [r["id"] for r in shown] == stored
    assert ok("export", "--workload", "mt-bench", "--concurrency", "1", "--db", db_one).exit_code == 0


@pytest.fixture(scope="module")
def qwen_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    path = str(tmp_path_factory.mktemp("ux-selection") / "qwen.db")
    result = ok(*SEARCH, "--model", "qwen3-coder-30b", "--concurrency", "8,64", "--objective", "goodput",
                "--slo-tpot-p99", "30", "--db", path)
    return path, result.stdout


def test_long_drafter_names_get_short_aliases_and_a_legend(qwen_db: tuple[str, str]) -> None:
    _, out = qwen_db
    tables = out[out.index("best config per concurrency"):out.index("Rule:")]
    assert_fits(tables)
    rows = [line for line in tables.splitlines() if re.search(r"\s(on|off)\s+\d+\s+\d+q?\s+[\d.]+", line)]
    # An indented line is a row or a header: no cell wrapped onto a line of its own (titles and legends are flush).
    for line in tables.splitlines():
        if line.startswith(" ") and line.strip() and not line.lstrip().startswith("c "):
            assert line in rows, line
    assert "eagle3 = lmsys/SGLang-EAGLE3-Qwen3-Coder-30B-A3B-Instruct-SpecForge" in " ".join(tables.split())
    assert any(" eagle3 1L " in row for row in rows)


def test_study_names_are_never_wrapped_and_their_cut_form_works(qwen_db: tuple[str, str]) -> None:
    db, _ = qwen_db
    studies = json.loads(ok("show", "--studies", "--json", "--db", db).stdout)["studies"]
    assert any(len(s["study"]) > 78 for s in studies)  # the case being tested: longer than an indented line
    text = ok("show", "--studies", "--db", db).stdout
    assert_fits(text)
    wide = ok("show", "--studies", "--wide", "--db", db).stdout
    for s in studies:
        assert f"  {s['study']}" in wide.splitlines()
        shown = next(line.strip() for line in text.splitlines()
                     if line.startswith("  ") and not line.startswith("    ") and
                     line.strip()[:20] == s["study"][:20] and line.strip()[-8:] == s["study"][-8:])
        trials = json.loads(ok("show", "--trials", shown, "--json", "--db", db).stdout)["trials"]
        assert len(trials) == s["n_trials"]


def test_a_reader_that_stops_early_is_not_an_error() -> None:
    """`peagle-tune list drafters --all | head -0`: the reader is gone before the first line; exit 0, nothing on
    stderr (before issue 33: exit 1)."""
    import os

    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "list", "drafters", "--all"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "80"})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has started and written anything
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert err == b""


# ------------------------------------------------------------------------------------------------------ simulate

SIMULATE = ["simulate", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,4", "--requests-per-phase",
            "4", "--output-tokens", "16", "--static-k", "2", "--no-store"]


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_simulate_is_quiet_when_piped(json_flag: list[str]) -> None:
    result = ok(*SIMULATE, *json_flag)
    assert result.stderr == ""  # before issue 33: one "simulating ..." line per config and load
    assert result.stdout


def test_simulate_defaults_to_searchs_workload() -> None:
    from autotune.cli.search import search
    from autotune.cli.simulate import simulate
    from autotune.workloads import resolve_workload

    default = {p.name: p.default for p in search.params}["workload"]
    assert {p.name: p.default for p in simulate.params}["workload"] == default
    data = json.loads(ok(*SIMULATE, "--json").stdout)
    workload, _ = resolve_workload(default, required=False)  # the model backend's default
    assert set(data["settings"]["class_token_weights"]) == set(workload.classes)
