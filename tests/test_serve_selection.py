"""`peagle-tune serve` selects as `export` does (issue 41, item 3), at 80 columns on the model backend:

- several matching searches that differ in config are listed and refused with exit 2, with export's error line
  naming the option that tells them apart;
- where one drafter is not best at every load (gpt-oss-20b on the H100: P-EAGLE at c=1, an EAGLE-3 head at c=64),
  one line says so and the next gives the other drafter's figure against the served one's at each stored load;
- the plain `vllm serve` line carries the arguments `export --format vllm-args` does (--max-model-len included).
"""

from __future__ import annotations

import json
import shlex
import sqlite3
from typing import Any

import pytest
from click.testing import Result
from ux_cli import cli, columns_80  # noqa: F401  (tests/ is on sys.path; columns_80: autouse)

SEARCH = ["search", "--backend", "model", "--model", "gpt-oss-20b", "--gpu", "h100"]
SERVE = ["serve", "--model", "gpt-oss-20b", "--gpu", "h100", "--dry-run"]


def ok(*args: str) -> Result:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


def recs(db: str) -> list[dict[str, Any]]:
    return list(json.loads(ok("show", "--json", "--db", db).stdout)["recommendations"])


def joined(text: str) -> str:
    """`text` with the console's line wrapping undone."""
    return " ".join(text.split())


def vllm_argv(stdout: str) -> list[str]:
    (line,) = [line for line in stdout.splitlines() if line.startswith("vllm serve ")]
    return shlex.split(line)


def flags(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a `vllm serve` argv (every flag it prints takes a value)."""
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--")}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One throughput search of gpt-oss-20b on the H100 at c=1, 8, 64."""
    path = str(tmp_path_factory.mktemp("serve-selection") / "one.db")
    ok(*SEARCH, "--concurrency", "1,8,64", "--db", path)
    return path


@pytest.fixture(scope="module")
def db_two(db: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`db` plus a latency search (TPOT p99 <= 5 ms) at c=8: two searches for one model and GPU."""
    path = str(tmp_path_factory.mktemp("serve-selection") / "two.db")
    source, target = sqlite3.connect(db), sqlite3.connect(path)  # backup: the write-ahead log's commits too
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    ok(*SEARCH, "--concurrency", "8", "--objective", "latency", "--slo-tpot-p99", "5", "--db", path)
    return path


def test_serve_refuses_two_searches_that_differ_as_export_does(db_two: str) -> None:
    stored = recs(db_two)
    top = max((r for r in stored if r["objective"] == "throughput"), key=lambda r: r["scenario"]["concurrency"])
    latency = next(r for r in stored if r["objective"] == "latency")
    assert top["best_config"] != latency["best_config"]  # the case tested: the two searches' configs differ
    served = cli(*SERVE, "--db", db_two)
    assert served.exit_code == 2, served.output
    assert served.stdout == ""  # no line to copy
    table, error = served.stderr.rsplit("Error:", 1)
    listed = {int(line.split()[0]) for line in table.splitlines() if line[:1].isdigit()}
    assert listed == {top["id"], latency["id"]}  # each search's highest concurrency
    assert len(error.strip().splitlines()) == 1
    assert "--objective (latency-tpot5 or throughput)" in joined(error)
    exported = cli("export", "--model", "gpt-oss-20b", "--gpu", "h100", "--format", "schedule", "--db", db_two)
    assert exported.exit_code == 2 and exported.stderr.rsplit("Error:", 1)[1] == error  # the one rule
    chosen = ok(*SERVE, "--objective", "throughput", "--db", db_two)
    assert flags(vllm_argv(chosen.stdout))["--max-num-seqs"] == str(top["best_config"]["max_num_seqs"])


def key(config: dict[str, Any]) -> tuple[str, bool]:
    return config["drafter"], bool(config["parallel_drafting"])


def figure(rec: dict[str, Any], drafter: tuple[str, bool]) -> float:
    """The search's figure for `drafter` at `rec`'s load: its best config's, as stored in ``per_drafter``."""
    return float(max(row["output_tokens_per_s"] for row in rec["metrics"]["per_drafter"]
                     if key(row["best_config"]) == drafter))


def test_serve_says_when_no_drafter_is_best_at_every_load_and_what_each_costs(db: str) -> None:
    by_load = {r["scenario"]["concurrency"]: r for r in recs(db)}
    served, other = key(by_load[64]["best_config"]), key(by_load[1]["best_config"])
    assert served != other and not served[1] and other[1]  # the case: P-EAGLE at c=1, an EAGLE-3 head at c=64
    result = ok(*SERVE, "--db", db)
    err = joined(result.stderr)
    assert ("drafter by load: no one drafter is best at every load (P-EAGLE 4L at c=1, 8; speculator.eagle3 1L at "
            "c=64); serving speculator.eagle3 1L, c=64's best, at every load.") in err
    # Each load's P-EAGLE figure against the EAGLE-3 head's, from the stored per-drafter figures.
    cells = ", ".join(f"c={c} {figure(r, other):.1f} vs {figure(r, served):.1f} "
                      f"({figure(r, other) / figure(r, served):.2f}x)" for c, r in sorted(by_load.items()))
    assert f"P-EAGLE 4L vs speculator.eagle3 1L, tok/s (predicted by the model backend): {cells}." in err
    # P-EAGLE's c=1 figure is that load's recommendation's own figure (it is that load's best).
    assert figure(by_load[1], other) == pytest.approx(by_load[1]["metrics"]["output_tokens_per_s"])
    screen = sum(max(1, -(-len(line) // 80)) for line in (result.stdout + result.stderr).splitlines())
    assert screen <= 40  # the default dry run stays one screen with the two added lines


def test_one_drafter_best_at_every_load_adds_no_line(db: str) -> None:
    result = ok(*SERVE, "--concurrency", "64", "--db", db)  # one load: nothing to compare
    assert "drafter by load" not in result.stderr


def test_dry_runs_vllm_serve_line_carries_exports_arguments(db: str) -> None:
    top = max(recs(db), key=lambda r: r["scenario"]["concurrency"])
    exported = flags(vllm_argv(ok("export", "--recommendation", str(top["id"]), "--format", "vllm-args",
                                  "--db", db).stdout))
    served = flags(vllm_argv(ok(*SERVE, "--db", db).stdout))
    assert exported["--max-model-len"] == str(top["metrics"]["max_model_len"])  # stored by the search
    for flag, value in exported.items():
        if flag == "--speculative-config":  # serve adds K per batch size at the schedule's deepest K
            spec, plain = json.loads(served[flag]), json.loads(value)
            assert {k: spec[k] for k in ("method", "model")} == {k: plain[k] for k in ("method", "model")}
        else:
            assert served[flag] == value, flag
    own = vllm_argv(ok(*SERVE, "--db", db, "--", "--max-model-len", "512").stdout)
    assert own.count("--max-model-len") == 1 and flags(own)["--max-model-len"] == "512"  # the user's value wins


def test_drafter_by_load_on_plain_numbers() -> None:
    """No speculation best at c=64, a drafter at c=1: no speculation's figure at c=1 is that load's figure over its
    speedup (800 / 1.6 = 500 tok/s); the drafter's at c=64 is its per-drafter row."""
    import datetime as dt
    from types import SimpleNamespace

    from autotune.cli.serve import _figures_label
    from autotune.selection import drafter_by_load, entry

    drafter = {"method": "eagle3", "drafter": "org/d", "num_speculative_tokens": 3, "parallel_drafting": True,
               "drafter_layers": 1, "max_num_seqs": 1}
    none = {"method": None, "drafter": None, "num_speculative_tokens": 0, "max_num_seqs": 64}

    def rec(i: int, c: int, config: dict[str, Any], metrics: dict[str, Any]) -> Any:
        return SimpleNamespace(id=i, model="m", gpu="cpu", workload_name="w", objective="throughput",
                               scenario={"concurrency": c}, best_config=config, metrics=metrics, schedule=[],
                               provenance={"kind": "measured", "backend": "vllm", "device": "cpu",
                                           "vllm_version": "0.32"},
                               created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))

    low = rec(1, 1, drafter, {"output_tokens_per_s": 800.0, "speedup_vs_no_spec": 1.6})
    high = rec(2, 64, none, {"output_tokens_per_s": 9000.0, "per_drafter": [
        {"best_config": {**drafter, "max_num_seqs": 64}, "output_tokens_per_s": 8100.0}]})
    split = drafter_by_load([entry(high), entry(low)])
    assert split is not None
    assert split.served == ("", False) and split.others == [("org/d", True)]
    assert [load.entry.concurrency for load in split.loads] == [1, 64]
    assert split.loads[0].tokens_per_s == {("org/d", True): 800.0, ("", False): pytest.approx(500.0)}
    assert split.loads[1].tokens_per_s == {("org/d", True): 8100.0, ("", False): 9000.0}
    assert drafter_by_load([entry(low)]) is None  # one load: one drafter
    assert _figures_label(low) == "measured by the vllm backend on cpu, vLLM 0.32"
