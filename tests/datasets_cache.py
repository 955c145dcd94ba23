"""An offline Hugging Face cache of the benchmark datasets ``hf:<name>`` reads, built from tests/fixtures/datasets.

Each dataset repo holds a few rows in its hub format (`build_datasets_cache`): philschmid/mt-bench a
``question.jsonl`` (FastChat's MT-Bench rows: ``turns``, ``category``), openai/openai_humaneval and openai/gsm8k
Parquet files at the paths vLLM's benchmark reads (written here from the JSONL fixtures with pyarrow). The cache
is laid out by `hub_cache.build_hub_cache` (``datasets--org--name``), so huggingface_hub resolves them offline.
A test module takes the fixture with ``from datasets_cache import datasets_cache_fixture  # noqa: F401``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_cache import build_hub_cache, use_hub_cache

from autotune.fit import CHAT_TEMPLATE_TOKENS

FIXTURE_DATASETS = Path(__file__).resolve().parent / "fixtures" / "datasets"
#: Repo id -> (fixture rows, the file the repo holds them in).
DATASET_REPOS: dict[str, tuple[Path, str]] = {
    "philschmid/mt-bench": (FIXTURE_DATASETS / "mt-bench" / "question.jsonl", "question.jsonl"),
    "openai/openai_humaneval": (FIXTURE_DATASETS / "humaneval" / "test.jsonl",
                                "openai_humaneval/test-00000-of-00001.parquet"),
    "openai/gsm8k": (FIXTURE_DATASETS / "gsm8k" / "test.jsonl", "main/test-00000-of-00001.parquet"),
}


def chat_input_tokens(prompt: str) -> int:
    """What the search counts for a chat prompt with the fixture's byte tokenizer: "user: " + the prompt in UTF-8
    bytes, <bos>, and the chat template's allowance (`autotune.fit.CHAT_TEMPLATE_TOKENS`)."""
    return len(f"user: {prompt}".encode()) + 1 + CHAT_TEMPLATE_TOKENS


def fixture_rows(repo_id: str) -> list[dict[str, object]]:
    """The rows the fixture repo `repo_id` holds, in file order."""
    text = DATASET_REPOS[repo_id][0].read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def build_datasets_cache(root: Path, repos: list[str] | None = None) -> Path:
    """The dataset repos (`DATASET_REPOS`, or those named) in a hub cache under ``<root>/hub``; returns that folder.
    Parquet files need pyarrow (the test is skipped without it)."""
    staged: dict[str, Path] = {}
    for repo_id in repos or list(DATASET_REPOS):
        source, name = DATASET_REPOS[repo_id]
        target = root / "staging" / repo_id / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".parquet"):
            pa = pytest.importorskip("pyarrow")
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(fixture_rows(repo_id)), target)
        else:
            target.write_bytes(source.read_bytes())
        staged[repo_id] = root / "staging" / repo_id
    return build_hub_cache(root, staged, repo_type="dataset")


@pytest.fixture(name="datasets_cache")
def datasets_cache_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every `DATASET_REPOS` repo in a hub cache under tmp_path (its ``HF_HOME`` is yielded), huggingface_hub
    pointed at it and offline. A test that also needs the fixture models builds both into one root instead."""
    root = tmp_path / "hf-datasets"
    build_datasets_cache(root)
    use_hub_cache(monkeypatch, root)
    yield root
