"""``spec-bench:<file>`` and ``speed-bench:<dir>``: the benchmarks vLLM reads from local files, categories as classes.

vLLM's `vllm bench serve --dataset-name spec_bench | speed_bench` reads them from disk (Spec-Bench's question.jsonl
from GitHub; SPEED-Bench prepared from nvidia/SPEED-Bench by NeMo-Skills' script): `SpecBench` (datasets.py:2946)
and `SpeedBench` (:4562). Their `load_data` needs pandas; the rows are read here, filtered by category as
`load_data` does (:2972-2973, :4607-4608), and each category's prompts come from the loader's `sample`
(`CustomDataset.sample`, :2475), one call per category as `--spec-bench-category` makes. Each category is a class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import WorkloadError
from autotune.names import name_problem
from autotune.workloads._parse import MAX_TOKENS_LIMIT
from autotune.workloads._workload import Workload, WorkloadRequest
from policies.plugin.labels import MAX_LABEL_CHARS


@dataclass(frozen=True)
class LocalDataset:
    key: str
    title: str
    loader: str
    what: str
    """What the path names and how to get it."""
    output_len: int
    output_source: str
    options: tuple[str, ...]


LOCAL_DATASETS: dict[str, LocalDataset] = {
    d.key: d
    for d in (
        LocalDataset("spec-bench", "Spec-Bench", "SpecBench",
                     "Spec-Bench's question.jsonl (github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl)",
                     256, "vllm bench serve's --spec-bench-output-len default", ("category", "prompts", "output-len")),
        LocalDataset("speed-bench", "SPEED-Bench", "SpeedBench",
                     "the directory NeMo-Skills' speed-bench prepare.py writes from nvidia/SPEED-Bench",
                     2048, "as in the vLLM P-EAGLE blog's SPEED-Bench figures",
                     ("subset", "category", "prompts", "output-len")),
    )
}


def _parse(dataset: LocalDataset, text: str) -> tuple[Path, dict[str, str]]:
    path, *parts = [p.strip() for p in text.split(",")]
    options: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition("=")
        numeric = key in ("prompts", "output-len")
        if key not in dataset.options or not value or (numeric and not (
                value.isdigit() and 0 < int(value) <= MAX_TOKENS_LIMIT)):
            raise WorkloadError(
                f"{dataset.key}:{text}: {part!r:.40} is not an option; write {dataset.key}:PATH"
                f"{''.join(f',{o}=...' for o in dataset.options)} (each optional; prompts and output-len integers "
                f"> 0)."
            )
        options[key] = value
    if not path:
        raise WorkloadError(f"{dataset.key}: give the path of {dataset.what}, as {dataset.key}:PATH.")
    return Path(path).expanduser(), options


def _read_jsonl(path: Path, dataset: LocalDataset) -> list[dict[str, Any]]:
    if not path.is_file():
        raise WorkloadError(f"{dataset.key}:{path}: no such file; give the path of {dataset.what}.")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{number}: invalid JSON ({exc.msg}); expected {dataset.what}") from exc
            if not isinstance(row, dict) or not isinstance(row.get("category"), str):
                raise WorkloadError(f"{path}:{number}: a row needs a \"category\" string; expected {dataset.what}")
            rows.append(row)
    return rows


def _prompt(dataset: LocalDataset, row: dict[str, Any]) -> Any:
    """The field `load_data` keeps: Spec-Bench's first turn, SPEED-Bench's first message's content."""
    if dataset.key == "spec-bench":
        turns = row.get("turns")
        return turns[0] if isinstance(turns, list) and turns else None
    messages = row.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return first.get("content") if isinstance(first, dict) else None


def _sample(dataset: LocalDataset, prompts: list[str], n: int, output_len: int) -> list[tuple[str, int]]:
    """vLLM's loader's requests for `prompts` (one category's, in file order); the prompts as they are without
    vLLM."""
    try:
        from vllm.benchmarks.datasets import datasets as vllm_datasets
    except ImportError:
        return [(p, output_len) for p in prompts[:n]]
    from autotune.workloads._datasets import PromptLengths

    base = getattr(vllm_datasets, dataset.loader)

    class FromRows(base):  # type: ignore[misc, valid-type]
        def load_data(self) -> None:
            self.data = [{"prompt": p} for p in prompts]

    loader = FromRows(dataset_path="rows", disable_shuffle=True)
    samples = loader.sample(PromptLengths(), n, output_len=output_len, skip_chat_template=True, no_oversample=True)
    return [(str(s.prompt), int(s.expected_output_len)) for s in samples]


def load_local_dataset(key: str, text: str) -> Workload:
    """The workload ``<key>:<text>`` names (`LOCAL_DATASETS`): each category a class, its prompts built by vLLM's
    loader, `prompts` of them per category."""
    dataset = LOCAL_DATASETS[key]
    path, options = _parse(dataset, text)
    if key == "speed-bench":
        path = path / f"{options.get('subset', 'qualitative')}.jsonl"
    rows = _read_jsonl(path, dataset)
    if "category" in options:
        rows = [r for r in rows if r["category"] == options["category"]]
    by_category: dict[str, list[str]] = {}
    for row in rows:
        prompt = _prompt(dataset, row)
        category = row["category"].strip()
        problem = name_problem(category, MAX_LABEL_CHARS)  # a class is a label the scheduler plugin counts under
        if problem is not None:
            raise WorkloadError(f"{dataset.key}:{text}: the category {category!r:.60} {problem}.")
        if isinstance(prompt, str) and prompt.strip():
            by_category.setdefault(category, []).append(prompt)
    if not by_category:
        raise WorkloadError(f"{dataset.key}:{text}: no row has a prompt"
                            f"{' in category ' + options['category'] if 'category' in options else ''}; expected "
                            f"{dataset.what}.")
    output_len = int(options.get("output-len", dataset.output_len))
    classes: dict[str, tuple[WorkloadRequest, ...]] = {}
    for category, prompts in sorted(by_category.items()):
        n = int(options.get("prompts", len(prompts)))
        classes[category] = tuple(WorkloadRequest(messages=({"role": "user", "content": p},), max_tokens=tokens)
                                  for p, tokens in _sample(dataset, prompts, n, output_len))
    length = "from output-len" if "output-len" in options else dataset.output_source
    description = (f"{dataset.title} ({path}; prompts by vLLM's {dataset.loader}; categories as classes; output "
                   f"length {length})")
    name = f"{key}:{path.name}" + "".join(f",{k}={v}" for k, v in options.items())
    return Workload(name, classes, f"{key}:{path}", description)
