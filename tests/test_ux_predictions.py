"""What a predicted result tells its reader (issue 34): each speedup's range, what the step time is made of and
which bound applies, and why the speedup can rise with concurrency; in the tables at 80 columns and in --json.

The model backend predicts, so every search here takes seconds. CliRunner's output is drawn at COLUMNS=80.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.cli._tables import RISE_NOTE
from autotune.cli._tables._cells import speedup_rise_note
from autotune.measurement import Measurement, Provenance
from autotune.search import measurement_metrics
from autotune.spec import Scenario, SpecConfig

SEARCH = ["search", "--backend", "model", "--gpu", "h200"]
PARTS = ("weights", "experts", "attention_kv", "drafter", "fixed_overhead")


@pytest.fixture(autouse=True)
def _narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def ok(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


def assert_fits(text: str, width: int = 80) -> None:
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"


def one_line(text: str) -> str:
    return " ".join(text.split())


def range_text(speedup: float, sigma: float) -> str:
    return f"{speedup:.2f}x ({speedup * math.exp(-sigma):.2f}-{speedup * math.exp(sigma):.2f})"


@pytest.fixture(scope="module")
def gpt120(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], str, str]:
    """gpt-oss-120b on an H200 at c=1, 8, 64 (the issue's U-shaped case): the database, --json, the table and
    --wide (the same studies, resumed)."""
    db = str(tmp_path_factory.mktemp("ux-predictions") / "peagle.db")
    args = [*SEARCH, "--model", "gpt-oss-120b", "--concurrency", "1,8,64", "--db", db]
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    return db, doc, ok(*args).stdout, ok(*args, "--wide").stdout


def test_json_carries_each_speedups_range_and_step_breakdown(gpt120: tuple[str, dict[str, Any], str, str]) -> None:
    _db, doc, _, _ = gpt120
    for scenario in doc["scenarios"]:
        m = scenario["metrics"]
        sigma, speedup = m["prediction_log_sigma"], m["speedup_vs_no_spec"]
        assert sigma > 0
        low, high = m["speedup_range"]
        assert low < speedup < high
        assert (low, high) == pytest.approx((speedup * math.exp(-sigma), speedup * math.exp(sigma)))
        low, high = scenario["speedup_range"]  # around the scenario's speedup over its baseline trial
        assert (low, high) == pytest.approx((scenario["speedup_vs_no_spec"] * math.exp(-sigma),
                                             scenario["speedup_vs_no_spec"] * math.exp(sigma)))
        assert set(m["step_breakdown_ms"]) == set(PARTS)
        assert sum(m["step_breakdown_ms"].values()) == pytest.approx(m["step_ms"])
        assert m["step_breakdown_ms"]["experts"] > 0  # an MoE target
        assert m["bound"] in ("memory", "compute")
        # The step and the acceptance length make the TPOT the table shows.
        assert m["step_ms"] / m["acceptance_length"] == pytest.approx(m["tpot_ms_p50"])


def test_stored_trials_and_recommendations_carry_the_figures(gpt120: tuple[str, dict[str, Any], str, str]) -> None:
    db, doc, _, _ = gpt120
    for scenario in doc["scenarios"]:
        trials = json.loads(ok("show", "--trials", scenario["study"], "--json", "--db", db).stdout)["trials"]
        done = [t for t in trials if t["status"] == "complete"]
        speculative = [t for t in done if t["config"]["method"] != "none"]
        assert speculative and len(speculative) < len(done)
        for t in speculative:
            m = t["metrics"]
            assert m["speedup_range"] == pytest.approx([m["speedup_vs_no_spec"] * math.exp(-m["prediction_log_sigma"]),
                                                        m["speedup_vs_no_spec"] * math.exp(m["prediction_log_sigma"])])
            assert sum(m["step_breakdown_ms"].values()) == pytest.approx(m["step_ms"])
        for t in done:
            if t["config"]["method"] == "none":  # no speculation: a step to explain, no speedup to spread
                assert "speedup_range" not in t["metrics"] and "prediction_log_sigma" not in t["metrics"]
                assert sum(t["metrics"]["step_breakdown_ms"].values()) == pytest.approx(t["metrics"]["step_ms"])
    recs = json.loads(ok("show", "--json", "--db", db).stdout)["recommendations"]
    assert len(recs) == 3
    for rec in recs:
        m = rec["metrics"]
        low, high = m["speedup_range"]
        assert low < m["speedup_vs_no_spec"] < high
        assert high / m["speedup_vs_no_spec"] == pytest.approx(math.exp(m["prediction_log_sigma"]))
        assert m["bound"] in ("memory", "compute") and "step_breakdown_ms" in m


def test_measured_figures_carry_no_prediction_figures() -> None:
    config = SpecConfig(method="eagle3", drafter="amazon/gpt-oss-120b-p-eagle", num_speculative_tokens=3)
    extra = {"prediction_log_sigma": 0.05, "step_ms": 5.0, "step_breakdown_ms": {"weights": 5.0}, "bound": "memory"}
    for provenance, carried in ((Provenance(kind="measured", backend="vllm", device="cpu"), False),
                                (Provenance(kind="predicted", backend="model", device="h200"), True)):
        m = Measurement(config=config, scenario=Scenario(concurrency=1), output_tokens_per_s=100.0,
                        speedup_vs_no_spec=1.5, provenance=provenance, extra=extra)
        metrics = measurement_metrics(m)
        assert ("speedup_range" in metrics) is carried and ("bound" in metrics) is carried


def test_tables_show_each_speedup_with_its_range_at_80_columns(gpt120: tuple[str, dict[str, Any], str, str]) -> None:
    db, doc, out, _ = gpt120
    table = out[out.index("best config per concurrency"):out.index("Each drafter")]
    assert_fits(table)
    for scenario in doc["scenarios"]:
        text = range_text(scenario["speedup_vs_no_spec"], scenario["metrics"]["prediction_log_sigma"])
        row = next(line for line in table.splitlines() if line.split()[:1] == [str(scenario["concurrency"])])
        assert text in row
    assert "(low-high): predicted range, one sigma of the calibration." in one_line(table)
    shown = ok("show", "--db", db).stdout
    assert_fits(shown)
    for rec in json.loads(ok("show", "--json", "--db", db).stdout)["recommendations"]:
        m = rec["metrics"]
        row = next(line for line in shown.splitlines() if line.split()[:1] == [str(rec["id"])])
        assert range_text(m["speedup_vs_no_spec"], m["prediction_log_sigma"]) in row


def test_a_range_that_does_not_fit_goes_below_the_table(tmp_path: Path) -> None:
    """The latency objective adds a TTFT column: the ranges no longer fit in 80 columns and go to a line below."""
    args = [*SEARCH, "--model", "gpt-oss-20b", "--concurrency", "1,64", "--max-k", "4", "--trials", "20",
            "--objective", "latency", "--db", str(tmp_path / "p.db")]
    doc = json.loads(ok(*args, "--json").stdout)
    out = ok(*args).stdout
    table = out[out.index("best config per concurrency"):out.index("Rule:")]
    assert_fits(table)
    ranges = []
    for scenario in doc["scenarios"]:
        s, sigma = scenario["speedup_vs_no_spec"], scenario["metrics"]["prediction_log_sigma"]
        row = next(line for line in table.splitlines() if line.split()[:1] == [str(scenario["concurrency"])])
        assert f"{s:.2f}x" in row and "(" not in row
        ranges.append(f"c={scenario['concurrency']} {s * math.exp(-sigma):.2f}-{s * math.exp(sigma):.2f}")
    assert f"vs none, predicted range (one sigma): {'; '.join(ranges)}." in one_line(table)
    wide = ok(*args, "--wide").stdout
    for scenario in doc["scenarios"]:
        assert range_text(scenario["speedup_vs_no_spec"], scenario["metrics"]["prediction_log_sigma"]) in wide


def test_wide_shows_what_each_step_is_made_of(gpt120: tuple[str, dict[str, Any], str, str]) -> None:
    _db, doc, out, wide = gpt120
    assert "Step time (ms, predicted)" not in out
    table = wide[wide.index("Step time (ms, predicted)"):wide.index("Each drafter")]
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.split()[:1] and
            line.split()[0].isdigit()}
    for scenario in doc["scenarios"]:
        m = scenario["metrics"]
        row = rows[str(scenario["concurrency"])]
        parts = [f"{m['step_breakdown_ms'][p]:.2f}" for p in PARTS]
        assert row[-7:] == [*parts, f"{m['step_ms']:.2f}", m["bound"]]


def test_footnote_says_why_the_speedup_rises_with_concurrency(gpt120: tuple[str, dict[str, Any], str, str]) -> None:
    """gpt-oss-120b on an H200: the speedup over no speculation falls from c=1 to 8 and rises again at 64."""
    db, doc, out, _ = gpt120
    shown = [round(s["speedup_vs_no_spec"], 2) for s in doc["scenarios"]]
    assert shown[2] > shown[0] > shown[1]
    table = out[out.index("best config per concurrency"):out.index("Each drafter")]
    note = f"vs none rises c=8-64: {RISE_NOTE}"  # it falls from c=1 to 8: the note names only where it rises
    assert note in table.splitlines()  # one line of its own at 80 columns
    assert note in ok("show", "--db", db).stdout.splitlines()


def test_no_footnote_when_the_speedup_falls_with_concurrency(tmp_path: Path) -> None:
    args = [*SEARCH, "--model", "gpt-oss-20b", "--concurrency", "8,64", "--max-k", "4", "--trials", "20", "--db",
            str(tmp_path / "p.db")]
    doc = json.loads(ok(*args, "--json").stdout)
    low, high = (s["speedup_vs_no_spec"] for s in doc["scenarios"])
    assert high < low
    assert RISE_NOTE not in ok(*args).stdout


def test_footnote_names_only_the_concurrencies_where_the_speedup_rises() -> None:
    """The issue's gpt-oss-20b on H100 (vs none 1.86x, 2.08x, 1.28x at c=1, 8, 64): it rises from 1 to 8 only, so
    the note says so and never "rises with c"; a speedup that rises at every step says "with c"."""
    moe = {"experts": 0.5}
    assert speedup_rise_note([(1, 1.86, moe), (8, 2.08, moe), (64, 1.28, moe)]) == f"vs none rises c=1-8: {RISE_NOTE}"
    assert speedup_rise_note([(1, 1.2, moe), (8, 1.5, moe), (64, 1.7, moe)]) == f"vs none rises with c: {RISE_NOTE}"
    assert speedup_rise_note([(1, 2.0, moe), (8, 1.5, moe), (64, 1.2, moe)]) is None  # falls throughout
    assert speedup_rise_note([(1, 1.2, {"experts": 0}), (8, 1.5, {"experts": 0})]) is None  # dense: no experts
