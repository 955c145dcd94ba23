"""Every measured figure names the deployment it was measured in (issue 39, item 2): plain ``vllm serve`` (vLLM's
scheduling and runner: async on a GPU) or ``peagle-tune serve`` (the scheduler plugin). Provenance records it
(`autotune.engine.deployment`, from the launch's arguments), and `show`, search's results table and the export
header say it in one short line, at 80 columns; ``--json`` keeps it as a field.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ux_cli import cli, columns_80  # noqa: F401

from autotune.cli._tables._cells import deployment_note
from autotune.cli._tables._search import deployment_notes
from store import Store

MODEL = "my-org/tiny-target"
PLAIN = "vllm serve (async, V2)"
PLUGIN = "peagle-tune serve (async, V1)"


def _add(store: Store, concurrency: int, deployment: str | None) -> int:
    provenance: dict[str, Any] = {"kind": "measured", "backend": "vllm", "device": "NVIDIA H200",
                                  "vllm_version": "0.32.0"}
    if deployment is not None:
        provenance["deployment"] = deployment
    return store.add_recommendation(
        MODEL, gpu="NVIDIA H200", objective="throughput",
        best_config={"method": "eagle3", "drafter": "my-org/tiny-eagle3", "num_speculative_tokens": 3,
                     "parallel_drafting": False, "max_num_seqs": concurrency},
        metrics={"output_tokens_per_s": 100.0 * concurrency, "speedup_vs_no_spec": 1.5},
        provenance=provenance, class_policy={}, workload_name="fixture", scenario={"concurrency": concurrency},
    )


@pytest.fixture()
def db(tmp_path: Path) -> tuple[str, dict[str, int]]:
    path = str(tmp_path / "peagle.db")
    with Store(f"sqlite:///{path}") as store:
        ids = {"plain-1": _add(store, 1, PLAIN), "plain-8": _add(store, 8, PLAIN), "plugin-8": _add(store, 8, PLUGIN),
               "old-8": _add(store, 8, None)}
    return path, ids


def test_a_note_names_one_deployment_or_each_with_its_figures() -> None:
    assert deployment_note([("c=1", PLAIN), ("c=8", PLAIN)]) == f"Measured in {PLAIN}."
    assert deployment_note([("c=1", PLUGIN), ("c=8", PLAIN), ("c=64", PLUGIN)]) == (
        f"Measured in {PLUGIN} (c=1, c=64); {PLAIN} (c=8).")
    assert deployment_note([("c=1", None)]) is None  # predictions and old rows record none: no note


def test_show_groups_recommendations_by_deployment_and_names_it(db: tuple[str, dict[str, int]]) -> None:
    path, ids = db
    result = cli("show", "--db", path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"Measured in {PLAIN}." in lines and f"Measured in {PLUGIN}." in lines
    assert max(map(len, lines)) <= 80
    # The old row (no deployment recorded) is a group of its own, with no claim about where it ran.
    assert sum(line.startswith("Measured in") for line in lines) == 2
    rows = json.loads(cli("show", "--json", "--db", path).stdout)["recommendations"]
    by_id = {r["id"]: r["provenance"].get("deployment") for r in rows}
    assert by_id == {ids["plain-1"]: PLAIN, ids["plain-8"]: PLAIN, ids["plugin-8"]: PLUGIN, ids["old-8"]: None}


def test_the_export_header_says_where_its_figures_were_measured(db: tuple[str, dict[str, int]]) -> None:
    path, ids = db
    for fmt in ("yaml", "policy"):
        result = cli("export", "--recommendation", str(ids["plugin-8"]), "--format", fmt, "--db", path)
        assert result.exit_code == 0, result.output
        header = [line for line in result.stdout.splitlines() if line.startswith("#")]
        assert f"# Figures measured in {PLUGIN}." in header, fmt
        assert f"Figures measured in {PLUGIN}." in result.stderr  # what the CLI says it exports
    old = cli("export", "--recommendation", str(ids["old-8"]), "--format", "yaml", "--db", path)
    assert "measured in" not in old.stdout


def _result(c: int, best: str | None, baseline: str | None) -> Any:
    figure = lambda d: SimpleNamespace(provenance=SimpleNamespace(deployment=d))  # noqa: E731
    return SimpleNamespace(scenario=SimpleNamespace(concurrency=c), best=figure(best),
                           baseline=None if baseline is None else figure(baseline))


def test_search_names_the_deployment_and_a_baseline_measured_elsewhere() -> None:
    same = SimpleNamespace(results=[_result(1, PLAIN, PLAIN), _result(8, PLAIN, PLAIN)])
    assert deployment_notes(same) == [f"Measured in {PLAIN}.", None]  # type: ignore[arg-type]
    # A plugin figure against a plain baseline compares two engines: said under the table.
    mixed = SimpleNamespace(results=[_result(1, PLUGIN, PLAIN), _result(8, PLAIN, PLAIN)])
    assert deployment_notes(mixed) == [  # type: ignore[arg-type]
        f"Measured in {PLUGIN} (c=1); {PLAIN} (c=8).", f"vs none: baseline measured in {PLAIN}."]
