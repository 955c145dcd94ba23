"""`peagle-tune serve --dry-run` on a machine without a GPU (issue 13.4): it uses the recommendation for --gpu (any
name of the GPU), or the only GPU's tuned (several are listed, exit 2: issue 33), says so, and prints a `vllm
serve ...` line that can be copied."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from ux_cli import cli


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.environment as environment

    cpu = {"device": "cpu", "gpu_count": 0, "gpu_names": [], "driver": None, "vllm_version": None,
           "torch_version": None, "python_version": "3.11", "platform": "test"}
    monkeypatch.setattr(environment, "detect_environment", lambda: dict(cpu))


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ux-serve") / "peagle.db")
    # gpt-oss-20b: vLLM would not start gpt-oss-120b on one 80 GB H100 (autotune.fit), so it could not be tuned there.
    for gpu in ("h200", "h100"):  # two GPUs tuned: a dry run without --gpu must be told which
        result = cli("search", "--model", "gpt-oss-20b", "--gpu", gpu, "--concurrency", "8", "--max-k", "4",
                     "--trials", "15", "--db", path)
        assert result.exit_code == 0, result.output
    return path


def rec_for(db: str, gpu_name: str) -> dict[str, Any]:
    rows = json.loads(cli("show", "--json", "--db", db).stdout)["recommendations"]
    return next(r for r in rows if r["gpu"] == gpu_name)


def vllm_line(stdout: str) -> list[str]:
    lines = [line for line in stdout.splitlines() if line.startswith("vllm serve ")]
    assert lines, stdout
    return shlex.split(lines[0])


def test_dry_run_without_gpu_lists_the_gpus_tuned_and_exits_2(db: str) -> None:
    """Two GPUs were tuned and this machine is neither: the dry run names --gpu instead of taking the newest (issue
    33: never pick silently)."""
    result = cli("serve", "--model", "gpt-oss-20b", "--dry-run", "--db", db)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    listed = {int(line.split()[0]) for line in result.stderr.splitlines() if line[:1].isdigit()}
    assert listed == {rec_for(db, "NVIDIA H100 SXM 80GB")["id"], rec_for(db, "NVIDIA H200 SXM 141GB")["id"]}
    assert "--gpu (h100 or h200)" in result.stderr.splitlines()[-1]


def test_dry_run_without_gpu_takes_the_only_gpu_tuned_and_prints_vllm_serve(tmp_path: Path) -> None:
    path = str(tmp_path / "one-gpu.db")
    result = cli("search", "--model", "gpt-oss-20b", "--gpu", "h100", "--concurrency", "8", "--max-k", "4",
                 "--trials", "15", "--db", path)
    assert result.exit_code == 0, result.output
    result = cli("serve", "--model", "gpt-oss-20b", "--dry-run", "--db", path)
    assert result.exit_code == 0, result.output
    rec = rec_for(path, "NVIDIA H100 SXM 80GB")
    err = " ".join(result.stderr.split())
    assert f"#{rec['id']}" in err and "none for this machine, cpu; the only GPU tuned" in err
    argv = vllm_line(result.stdout)
    assert argv[:3] == ["vllm", "serve", "openai/gpt-oss-20b"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    best = rec["best_config"]
    assert spec["model"] == best["drafter"] and spec["num_speculative_tokens"] == best["num_speculative_tokens"]
    assert argv[argv.index("--max-num-seqs") + 1] == str(best["max_num_seqs"])
    assert "python -m autotune" not in result.stdout.split("# What")[0]


@pytest.mark.parametrize("name", ["h200", "NVIDIA H200", "H200 SXM", "nvidia-h200-sxm-141gb"])
def test_gpu_picks_that_gpus_recommendation(db: str, name: str) -> None:
    result = cli("serve", "--model", "gpt-oss-20b", "--gpu", name, "--dry-run", "--db", db)
    assert result.exit_code == 0, result.output
    rec = rec_for(db, "NVIDIA H200 SXM 141GB")
    assert f"recommendation #{rec['id']}" in result.stderr
    argv = vllm_line(result.stdout)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == rec["best_config"]["num_speculative_tokens"]


def test_gpu_without_a_recommendation_exits_3_with_the_search_to_run(db: str) -> None:
    result = cli("serve", "--model", "gpt-oss-20b", "--gpu", "b200", "--dry-run", "--db", db)
    assert result.exit_code == 3, result.output
    assert "peagle-tune search --model openai/gpt-oss-20b --gpu b200" in result.output


def test_a_real_launch_still_needs_this_machines_recommendation(db: str) -> None:
    result = cli("serve", "--model", "gpt-oss-20b", "--no-record", "--db", db)
    assert result.exit_code == 3, result.output
    assert "this machine's device (cpu)" in result.output


def test_the_vllm_serve_line_parses_with_vllms_own_parser(db: str, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    result = cli("serve", "--model", "gpt-oss-20b", "--gpu", "h200", "--dry-run", "--db", db)
    argv = vllm_line(result.stdout)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    rec = rec_for(db, "NVIDIA H200 SXM 141GB")
    assert args.model_tag == "openai/gpt-oss-20b"
    assert args.max_num_seqs == rec["best_config"]["max_num_seqs"]
    assert args.speculative_config["num_speculative_tokens"] == rec["best_config"]["num_speculative_tokens"]
