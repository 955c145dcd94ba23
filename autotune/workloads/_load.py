"""`load_workload`: a workload from a built-in name, a JSONL or ShareGPT file, or ``hf:<dataset>``."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.errors import WorkloadError
from autotune.names import did_you_mean
from autotune.workloads._parse import (
    DEFAULT_CLASS,
    JSONL_EXPECTED,
    SHAREGPT_EXPECTED,
    parse_jsonl,
    parse_sharegpt,
)
from autotune.workloads._workload import Workload, WorkloadRequest
from policies import BUILTIN_CLASSES, MAX_CLASSES, read_bytes

#: Most classes a workload may have besides the built-in ones (code, math, chat): a served policy knows at most
#: `policies.MAX_CLASSES` classes, the built-in ones among them, and `export --format policy` and `serve` give
#: each class of the tuned workload its own cap. Checked when the workload is loaded, so a search never tunes for a
#: workload its result cannot be served with.
MAX_WORKLOAD_CLASSES = MAX_CLASSES - len(BUILTIN_CLASSES)
#: The byte order mark some editors write at the start of a UTF-8 file; `json` refuses it, so it is skipped.
BOM = "\ufeff"
#: Largest workload file read (it is parsed whole): ShareGPT's V3 dump, the biggest dataset `vllm bench` takes, is
#: 673 MB.
MAX_WORKLOAD_BYTES = 1024 * 1024 * 1024

#: Workload class -> the published benchmark whose acceptance figures stand for it in the drafter catalog
#: (`DrafterSpec.reference_acceptance` keys).
REFERENCE_FOR_CLASS: dict[str, str] = {"chat": "mt-bench", "code": "humaneval", "math": "gsm8k"}

#: Short names for ``hf:<name>``: dataset id, split, config, workload class.
HF_DATASETS: dict[str, tuple[str, str, str | None, str]] = {
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", "train", None, "chat"),
    "humaneval": ("openai/openai_humaneval", "test", None, "code"),
    "gsm8k": ("openai/gsm8k", "test", "main", "math"),
}
_HF_TEXT_FIELDS = ("turns", "prompt", "question", "instruction", "input", "text")
_FORMATS_HINT = (
    f"use a local file instead: JSONL ({JSONL_EXPECTED.removeprefix('expected ')}) or ShareGPT JSON "
    f"({SHAREGPT_EXPECTED.removeprefix('expected ')})"
)


def list_builtin_workloads() -> list[str]:
    """Names of the workloads shipped with peagle-tune (autotune/workloads/builtin/*.jsonl), sorted."""
    folder = resources.files("autotune.workloads").joinpath("builtin")
    return sorted(p.name.removesuffix(".jsonl") for p in folder.iterdir() if p.name.endswith(".jsonl"))


def _build(name: str, source: str, pairs: list[tuple[str, WorkloadRequest]]) -> Workload:
    classes: dict[str, list[WorkloadRequest]] = {}
    for cls, request in pairs:
        classes.setdefault(cls, []).append(request)
    known = classes.keys() | set(BUILTIN_CLASSES)
    if len(known) > MAX_CLASSES:
        raise WorkloadError(
            f"{source}: the workload has {len(classes):,} classes, but a served policy knows at most {MAX_CLASSES} "
            f"(the built-in {', '.join(BUILTIN_CLASSES)} among them: {len(known):,} here); merge classes into at "
            f"most {MAX_WORKLOAD_CLASSES} besides those."
        )
    return Workload(name, {c: tuple(r) for c, r in classes.items()}, source)


def _read_text(path: Path) -> str:
    """The file as UTF-8 text without a leading byte order mark (a regular file of at most `MAX_WORKLOAD_BYTES`);
    a decoding error names the line it is on."""
    data = read_bytes(path, WorkloadError, "workload file (JSONL or ShareGPT JSON)", limit=MAX_WORKLOAD_BYTES)
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(f"{path}:{line}: the file is not UTF-8 text ({exc.reason}); expected UTF-8 JSON") from exc


def _load_file(path: Path) -> Workload:
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix == ".json" or (suffix != ".jsonl" and text.lstrip().startswith("[")):
        pairs, _skipped = parse_sharegpt(text, str(path))
    else:
        pairs = parse_jsonl(text, str(path))
    return _build(path.stem, str(path), pairs)


def _load_builtin(name: str) -> Workload:
    text = resources.files("autotune.workloads").joinpath("builtin", f"{name}.jsonl").read_text(encoding="utf-8")
    return _build(name, f"builtin:{name}", parse_jsonl(text, f"builtin/{name}.jsonl"))


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers within `timeout_s` seconds, asked through huggingface_hub itself (its
    endpoint, HF_ENDPOINT, proxies and offline mode: with HF_HUB_OFFLINE=1 the hub is unreachable without a
    request). Any HTTP answer counts as reachable; a missing huggingface_hub or a network error does not."""
    try:
        from huggingface_hub import constants, get_session, is_offline_mode
    except ImportError:
        return False
    if is_offline_mode():
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout_s)
    except Exception:  # OfflineModeIsEnabled, connection/DNS/timeout errors: all mean "not reachable from here"
        return False
    return True


def _hf_text(row: dict[str, Any]) -> str | None:
    for key in _HF_TEXT_FIELDS:
        value = row.get(key)
        if isinstance(value, list) and value and isinstance(value[0], str):
            value = value[0]  # Multi-turn benchmarks (MT-Bench): replay the first turn.
        if isinstance(value, str) and value.strip():
            return value
    return None


def _load_hf(dataset: str) -> Workload:
    """Load ``hf:<dataset>`` with the `datasets` package (short names in `HF_DATASETS`, else a dataset id)."""
    dataset_id, split, config, cls = HF_DATASETS.get(dataset.lower(), (dataset, "test", None, DEFAULT_CLASS))
    try:
        import datasets
    except ImportError as exc:
        raise WorkloadError(
            f"hf:{dataset}: the Hugging Face hub could not be reached (the `datasets` package is not installed; "
            f"`pip install datasets` needs hub access to download {dataset_id}); {_FORMATS_HINT}"
        ) from exc
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    if not offline and not _hub_reachable():
        raise WorkloadError(f"hf:{dataset}: the Hugging Face hub could not be reached to download {dataset_id}; "
                            f"{_FORMATS_HINT}")
    try:
        rows = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as exc:  # any hub, cache or format failure means the same to the user
        raise WorkloadError(
            f"hf:{dataset}: could not load {dataset_id} (split {split}) from the Hugging Face hub or its cache "
            f"({type(exc).__name__}: {exc}); {_FORMATS_HINT}"
        ) from exc
    pairs = []
    for row in rows:
        text = _hf_text(dict(row))
        if text is not None:
            pairs.append((cls, WorkloadRequest(messages=({"role": "user", "content": text},))))
    if not pairs:
        raise WorkloadError(
            f"hf:{dataset}: no row of {dataset_id} has a text field ({', '.join(_HF_TEXT_FIELDS)}); {_FORMATS_HINT}"
        )
    return _build(dataset, f"hf:{dataset_id}:{split}", pairs)


def load_workload(spec: str | os.PathLike[str], *, max_per_class: int | None = None) -> Workload:
    """A workload from a built-in name, a JSONL or ShareGPT JSON file, or ``hf:<dataset>``.

    - built-ins: `list_builtin_workloads()` ("mt-bench", "humaneval", "gsm8k", "mixed"), also as ``builtin:<name>``;
    - ``*.jsonl``: one record per line, {"prompt": str} or {"messages": [{"role", "content"}]}, with optional
      "class" (default "default"), "max_tokens" (1 to 10,000,000), "temperature" (>= 0);
    - ``*.json``: a ShareGPT list; each conversation's first human turn (after any system turns) becomes one chat
      request of class "sharegpt";
    - ``hf:<dataset>``: a Hugging Face dataset (needs the `datasets` package and hub access).

    An existing file wins over a built-in of the same name. `max_per_class` keeps the first N requests of each
    class. Malformed input raises WorkloadError ``<file>:<line>: <what is wrong>; expected ...``.
    """
    if max_per_class is not None and (isinstance(max_per_class, bool) or max_per_class < 1):
        raise WorkloadError(f"max_per_class must be an integer >= 1 (or None for all), but got {max_per_class!r}.")
    text = os.fspath(spec)
    path = Path(text).expanduser()
    builtins = list_builtin_workloads()
    name = text.removeprefix("builtin:")
    if text.startswith("hf:"):
        workload = _load_hf(text.removeprefix("hf:"))
    elif path.is_file():
        workload = _load_file(path)
    elif name in builtins:
        workload = _load_builtin(name)
    elif path.exists():
        raise WorkloadError(f"{path}: is not a regular file; expected a JSONL or ShareGPT JSON file")
    else:
        raise WorkloadError(
            f"no workload {text!r}: {did_you_mean(name, builtins)}it is not a built-in ({', '.join(builtins)}), not "
            "an existing file and not hf:<dataset>; give a built-in name, a .jsonl/.json path or hf:<dataset>."
        )
    return workload.subset(max_per_class) if max_per_class is not None else workload
