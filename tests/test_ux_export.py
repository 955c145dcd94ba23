"""`peagle-tune export` says what it exports (issue 13.2): which recommendation, concurrency, GPU and figures (a
comment header in YAML, a stderr line for JSON and args), takes --concurrency, offers the batch-size schedule after a
search over several concurrencies, and exits 3 when nothing matches. Since issue 33 it never picks among
recommendations that differ: without --concurrency after a search of three, it lists them and exits 2."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from ux_cli import cli


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ux-export") / "peagle.db")
    result = cli("search", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,8,64", "--max-k", "4",
                 "--trials", "20", "--db", path)
    assert result.exit_code == 0, result.output
    return path


def recs(db: str) -> dict[int, dict[str, Any]]:
    """Stored recommendations by concurrency."""
    rows = json.loads(cli("show", "--json", "--db", db).stdout)["recommendations"]
    return {r["scenario"]["concurrency"]: r for r in rows}


def test_without_concurrency_it_lists_the_search_and_exits_2(db: str) -> None:
    """Three concurrencies were searched, each with its own max_num_seqs: export does not pick one (issue 33)."""
    result = cli("export", "--db", db)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    ids = {int(line.split()[0]) for line in result.stderr.splitlines() if line[:1].isdigit()}
    assert ids == {r["id"] for r in recs(db).values()}
    assert "--concurrency (1, 8 or 64)" in result.stderr.splitlines()[-1]


def test_json_export_names_what_it_exports_on_stderr(db: str) -> None:
    result = cli("export", "--concurrency", "64", "--db", db)
    assert result.exit_code == 0, result.output
    top = recs(db)[64]
    assert json.loads(result.stdout) == {
        "method": "eagle3", "model": top["best_config"]["drafter"],
        "num_speculative_tokens": top["best_config"]["num_speculative_tokens"],
        **({"parallel_drafting": True} if top["best_config"]["parallel_drafting"] else {}),
    }
    err = " ".join(result.stderr.split())
    tps = top["metrics"]["output_tokens_per_s"]
    assert f"recommendation #{top['id']}" in err and "concurrency 64" in err
    assert "NVIDIA H200 SXM 141GB" in err and f"{tps:.1f} tok/s" in err and "predicted" in err


def test_a_recommendation_by_id_offers_the_rest_of_its_search(db: str) -> None:
    result = cli("export", "--recommendation", str(recs(db)[64]["id"]), "--db", db)
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    assert f"c=1 (#{recs(db)[1]['id']})" in err and f"c=8 (#{recs(db)[8]['id']})" in err
    assert "--concurrency C" in err
    # The batch-size schedule is offered only where its export would not warn: not for a pick that drafts in
    # parallel, which vLLM 0.32 mishandles with a schedule (issue 33.9).
    parallel = recs(db)[64]["best_config"]["parallel_drafting"]
    assert ("--format schedule" in err) is not parallel
    schedule = cli("export", "--recommendation", str(recs(db)[64]["id"]), "--format", "schedule", "--db", db)
    assert ("mishandles" in schedule.stderr) is parallel


def test_concurrency_picks_that_recommendation(db: str) -> None:
    result = cli("export", "--concurrency", "8", "--format", "vllm-args", "--db", db)
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--max-num-seqs") + 1] == str(recs(db)[8]["best_config"]["max_num_seqs"])
    assert f"recommendation #{recs(db)[8]['id']}" in result.stderr and "concurrency 8" in result.stderr


def test_yaml_starts_with_a_comment_header_vllm_still_reads(db: str, tmp_path: Path) -> None:
    result = cli("export", "--concurrency", "1", "--format", "yaml", "--db", db)
    assert result.exit_code == 0, result.output
    header = [line for line in result.stdout.splitlines() if line.startswith("#")]
    rec = recs(db)[1]
    assert f"# recommendation #{rec['id']}:" in header[0] and "concurrency 1" in header[0]
    assert "NVIDIA H200 SXM 141GB" in header[0] and "tok/s" in header[1]
    doc = yaml.safe_load(result.stdout)
    assert doc["speculative-config"]["num_speculative_tokens"] == rec["best_config"]["num_speculative_tokens"]
    pytest.importorskip("vllm")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path = tmp_path / "serve.yaml"
    path.write_text(result.stdout)
    args = FlexibleArgumentParser().load_config_file(str(path))
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == rec["best_config"]["num_speculative_tokens"]


def test_schedule_comes_from_the_highest_concurrency_of_the_search(db: str) -> None:
    result = cli("export", "--format", "schedule", "--db", db)
    assert result.exit_code == 0, result.output
    ranges = json.loads(result.stdout)["num_speculative_tokens_per_batch_size"]
    top = recs(db)[64]
    assert ranges[-1][1] == top["best_config"]["max_num_seqs"]  # covers every batch size the server runs
    assert f"recommendation #{top['id']}" in result.stderr


@pytest.mark.parametrize(
    "args", [["--concurrency", "3"], ["--recommendation", "999"], ["--model", "gpt-oss-20b"]]
)
def test_nothing_to_export_exits_3(db: str, args: list[str]) -> None:
    result = cli("export", *args, "--db", db)
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and "<" not in result.output


def test_out_file_names_the_recommendation(db: str, tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    result = cli("export", "--concurrency", "8", "--out", str(out), "--db", db)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["num_speculative_tokens"] == recs(db)[8]["best_config"]["num_speculative_tokens"]
    assert f"Wrote vllm-json for recommendation #{recs(db)[8]['id']} to {out}" in " ".join(result.stderr.split())
