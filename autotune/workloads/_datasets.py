"""``hf:<dataset>``: the datasets `vllm bench serve` reads, fetched through the Hugging Face hub cache.

The repo's data files come through huggingface_hub (the cache checkpoints use; offline with HF_HUB_OFFLINE=1) and
their rows go to vLLM's own loader (`vllm/benchmarks/datasets/datasets.py`: MTBenchDataset:3467, HumanEvalDataset:
3529, GSM8KDataset:3589), whose `sample` builds the prompts as `vllm bench serve` does; vLLM's
`HuggingFaceDataset.load_data` (:3118) would call the `datasets` package, which the rows replace. Without vLLM the
field the loader reads is read (`DatasetSpec.field`). Output lengths are those of the published figures compared with.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autotune.errors import WorkloadError
from autotune.names import did_you_mean
from autotune.workloads._parse import MAX_TOKENS_LIMIT
from autotune.workloads._workload import Workload, WorkloadRequest


@dataclass(frozen=True)
class DatasetSpec:
    """A benchmark dataset on the hub and the vLLM loader that builds its prompts."""

    key: str
    title: str
    repo_id: str
    files: str
    """Glob of the data files in the repo (the split vLLM's benchmark reads)."""
    loader: str
    """The class in `vllm.benchmarks.datasets.datasets` that builds the prompts."""
    workload_class: str
    """The workload class of every prompt: `REFERENCE_FOR_CLASS` maps it to the published acceptance."""
    field: str
    """The row field vLLM's loader reads (a list: its first turn), used only where vLLM is not installed."""
    output_len: int
    output_source: str
    """The published measurement the output length matches."""


_P_EAGLE = "as in the P-EAGLE paper (arXiv 2602.01469) Table 9 and the vLLM P-EAGLE blog"
#: ``hf:<key>`` (or ``hf:<repo id>``) -> the dataset. Files and splits: the ones vLLM's benchmark passes
#: (`--dataset-path philschmid/mt-bench`; HumanEval's test split; GSM8K's "main" config, test split).
DATASETS: dict[str, DatasetSpec] = {
    d.key: d
    for d in (
        DatasetSpec("mt-bench", "MT-Bench", "philschmid/mt-bench", "*.jsonl", "MTBenchDataset", "chat", "turns",
                    2048, _P_EAGLE),
        DatasetSpec("humaneval", "HumanEval", "openai/openai_humaneval", "openai_humaneval/test-*.parquet",
                    "HumanEvalDataset", "code", "prompt", 2048, _P_EAGLE),
        DatasetSpec("gsm8k", "GSM8K", "openai/gsm8k", "main/test-*.parquet", "GSM8KDataset", "math", "question",
                    2048, _P_EAGLE),
    )
}
#: Options after the name, comma-separated: ``hf:mt-bench,prompts=8,output-len=64``.
OPTIONS = ("prompts", "output-len")


def find_dataset(name: str) -> DatasetSpec | None:
    """The catalog entry for a key (``mt-bench``) or a repo id (``philschmid/mt-bench``), case-insensitive."""
    lowered = name.strip().lower()
    for spec in DATASETS.values():
        if lowered in (spec.key, spec.repo_id.lower()):
            return spec
    return None


def parse_spec(text: str) -> tuple[DatasetSpec, dict[str, int]]:
    """``<name>[,prompts=N][,output-len=M]`` (without ``hf:``) -> the dataset and its options."""
    name, *parts = [p.strip() for p in text.split(",")]
    spec = find_dataset(name)
    if spec is None:
        known = [d.key for d in DATASETS.values()] + [d.repo_id for d in DATASETS.values()]
        raise WorkloadError(
            f"hf:{name}: {did_you_mean(name, known)}not a dataset peagle-tune reads; use one of "
            f"{', '.join('hf:' + d.key for d in DATASETS.values())}, or a local .jsonl/.json file."
        )
    options: dict[str, int] = {}
    for part in parts:
        key, _, value = part.partition("=")
        if key not in OPTIONS or not value.strip().isdigit() or not 0 < int(value) <= MAX_TOKENS_LIMIT:
            raise WorkloadError(
                f"hf:{text}: {part!r:.40} is not an option; write hf:{spec.key},prompts=N,output-len=M with "
                f"integers > 0 (both optional: all prompts, {spec.output_len} output tokens)."
            )
        options[key] = int(value)
    return spec, options


def _fetch_hint(spec: DatasetSpec) -> str:
    return (f"fetch it with `hf download {spec.repo_id} --repo-type dataset` where the hub can be reached, or "
            "use --workload sample-chat (12 sample prompts)")


def dataset_files(spec: DatasetSpec, *, download: bool = True) -> list[Path]:
    """The dataset's data files in the hub cache, downloaded first when `download` and not offline."""
    try:
        import huggingface_hub
        import huggingface_hub.constants  # a submodule the package does not import by itself
    except ImportError:
        raise WorkloadError(f"hf:{spec.key}: reading {spec.repo_id} needs huggingface_hub (vLLM installs it): "
                            f"`pip install huggingface_hub`; or use --workload sample-chat.") from None
    offline = huggingface_hub.constants.HF_HUB_OFFLINE or not download
    try:
        folder = huggingface_hub.snapshot_download(
            spec.repo_id, repo_type="dataset", allow_patterns=[spec.files], local_files_only=offline
        )
    except Exception as exc:  # not cached offline, or any hub/network failure: the same to the user
        if offline or type(exc).__name__ == "LocalEntryNotFoundError":  # the hub unreachable, nothing cached
            where = "is not in the Hugging Face cache" + ("" if offline else " and the hub cannot be reached")
        else:
            where = f"could not be downloaded ({type(exc).__name__}: {str(exc)[:120]})"
        raise WorkloadError(f"hf:{spec.key}: {spec.repo_id} {where}; {_fetch_hint(spec)}.") from exc
    files = sorted(p for p in Path(folder).rglob("*")
                   if p.is_file() and fnmatch.fnmatch(p.relative_to(folder).as_posix(), spec.files))
    if not files:
        raise WorkloadError(f"hf:{spec.key}: the cached {spec.repo_id} has no file matching {spec.files}; "
                            f"{_fetch_hint(spec)}.")
    return files


def _hub_cache_dir() -> Path:
    """The hub cache folder huggingface_hub uses (its constants where it is imported; else the same environment
    variables read the same way), without importing it: `list workloads` stays light."""
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        return Path(hub.HF_HUB_CACHE)
    env = os.environ
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    return Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or Path(home) / "hub")


def dataset_cached(spec: DatasetSpec) -> bool:
    """Whether a snapshot of the dataset in the Hugging Face cache holds its files (no network, no import)."""
    snapshots = _hub_cache_dir() / ("datasets--" + spec.repo_id.replace("/", "--")) / "snapshots"
    return snapshots.is_dir() and any(
        fnmatch.fnmatch(p.relative_to(snap).as_posix(), spec.files)
        for snap in snapshots.iterdir() if snap.is_dir() for p in snap.rglob("*") if p.is_file()
    )


def _rows(path: Path, spec: DatasetSpec) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise WorkloadError(f"hf:{spec.key}: {path.name} is Parquet, which needs pyarrow: "
                                "`pip install pyarrow` (the project's vllm and cpu extras install it).") from None
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return rows
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{number}: invalid JSON ({exc.msg}); the cached {spec.repo_id} is "
                                    f"damaged: delete it and {_fetch_hint(spec)}.") from exc
    return out


class PromptLengths:
    """What vLLM's loaders ask of a tokenizer with ``skip_chat_template``: ``tokenizer(text).input_ids``, only for
    `SampleRequest.prompt_len`, which is not used here (input lengths are counted with the target's tokenizer,
    `describe_lengths`); the chat template is applied where the request is served (`WorkloadRequest.is_chat`)."""

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=range(math.ceil(len(text) / 3)))


def _vllm_prompts(spec: DatasetSpec, rows: list[dict[str, Any]], n: int,
                  output_len: int) -> list[tuple[str, int]] | None:
    """(prompt, output length) of the first `n` requests vLLM's loader builds from `rows` (file order, as with
    ``--disable-shuffle``); None without vLLM."""
    try:
        from vllm.benchmarks.datasets import datasets as vllm_datasets
    except ImportError:
        return None
    base = getattr(vllm_datasets, spec.loader)

    class FromRows(base):  # type: ignore[misc, valid-type]
        def load_data(self) -> None:
            self.data = rows

    loader = FromRows(dataset_path=spec.repo_id, dataset_split="test", disable_shuffle=True)
    samples = loader.sample(PromptLengths(), n, output_len=output_len, skip_chat_template=True, no_oversample=True)
    return [(str(s.prompt), int(s.expected_output_len)) for s in samples]


def _field_prompts(spec: DatasetSpec, rows: list[dict[str, Any]], n: int, output_len: int) -> list[tuple[str, int]]:
    out = []
    for row in rows[:n]:
        value = row.get(spec.field)
        if isinstance(value, list | tuple) and value:
            value = value[0]
        if isinstance(value, str) and value.strip():
            out.append((value, output_len))
    return out


def load_dataset_workload(text: str, *, download: bool = True) -> Workload:
    """The workload ``hf:<text>`` names: the dataset's prompts as vLLM's loader builds them, each a chat request
    of the dataset's class with the published output length (or ``output-len``)."""
    spec, options = parse_spec(text)
    rows = [row for path in dataset_files(spec, download=download) for row in _rows(path, spec)]
    n = options.get("prompts", len(rows))
    output_len = options.get("output-len", spec.output_len)
    prompts = _vllm_prompts(spec, rows, n, output_len)
    how = f"vLLM's {spec.loader}"
    if prompts is None:
        prompts, how = _field_prompts(spec, rows, n, output_len), f"the field {spec.field!r} vLLM's {spec.loader} reads"
    if not prompts:
        raise WorkloadError(f"hf:{spec.key}: no row of the cached {spec.repo_id} has a prompt; {_fetch_hint(spec)}.")
    requests = tuple(WorkloadRequest(messages=({"role": "user", "content": p},), max_tokens=tokens)
                     for p, tokens in prompts)
    length = "from output-len" if "output-len" in options else spec.output_source
    description = (f"{spec.title} ({spec.repo_id}; prompts by {how}; {len(requests)} of its {len(rows)} rows; "
                   f"output length {length})")
    name = f"hf:{spec.key}" + "".join(f",{k}={v}" for k, v in options.items())
    return Workload(name, {spec.workload_class: requests}, f"hf:{spec.repo_id}", description)
