"""`load_workload`: a workload from a sample name, a JSONL or ShareGPT file, or ``hf:<dataset>``; the default."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from autotune.errors import WorkloadError
from autotune.names import did_you_mean
from autotune.workloads._parse import parse_jsonl, parse_sharegpt
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

#: Old names of the built-in samples, still accepted: they are 12 invented prompts a class, not the benchmarks
#: (``hf:mt-bench`` and the others are, `autotune.workloads._datasets`).
SAMPLE_ALIASES: dict[str, str] = {"mt-bench": "sample-chat", "humaneval": "sample-code", "gsm8k": "sample-math",
                                  "mixed": "sample-mixed"}
#: The workload `search` and `profile` measure on with the vllm backend when --workload is not given.
DEFAULT_MEASURED = "hf:mt-bench"
#: The workload the model backend predicts for when --workload is not given (its requests' lengths; acceptance is the
#: published figure of the class's benchmark, `REFERENCE_FOR_CLASS`).
DEFAULT_PREDICTED = "sample-chat"


def list_builtin_workloads() -> list[str]:
    """Names of the sample workloads shipped with peagle-tune (autotune/workloads/builtin/*.jsonl: ``sample-chat``,
    ``sample-code``, ``sample-math``, ``sample-mixed``), sorted; `SAMPLE_ALIASES` are their old names."""
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
    workload = _build(name, f"builtin:{name}", parse_jsonl(text, f"builtin/{name}.jsonl"))
    classes = ", ".join(f"{len(r)} {c}" for c, r in sorted(workload.classes.items()))
    benchmarks = ", ".join(f"hf:{REFERENCE_FOR_CLASS[c]}" for c in workload.class_names if c in REFERENCE_FOR_CLASS)
    description = f"sample prompts written for peagle-tune ({classes}), not a benchmark dataset (those: {benchmarks})"
    return Workload(workload.name, workload.classes, workload.source, description)


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


def load_workload(spec: str | os.PathLike[str], *, max_per_class: int | None = None,
                  download: bool = True) -> Workload:
    """A workload from a sample name, a JSONL or ShareGPT JSON file, or ``hf:<dataset>``.

    - samples: `list_builtin_workloads()` (sample-chat, sample-code, sample-math, sample-mixed: 12 invented prompts a
      class), also as ``builtin:<name>`` and by their old names (`SAMPLE_ALIASES`: mt-bench, ...);
    - ``*.jsonl``: one record per line, {"prompt": str} or {"messages": [{"role", "content"}]}, with optional
      "class" (default "default"), "max_tokens" (1 to 10,000,000), "temperature" (>= 0);
    - ``*.json``: a ShareGPT list; each conversation's first human turn (after any system turns) becomes one chat
      request of class "sharegpt";
    - ``hf:<dataset>[,prompts=N][,output-len=M]``: a benchmark dataset as `vllm bench serve` reads it
      (`autotune.workloads._datasets.DATASETS`: hf:mt-bench, hf:humaneval, hf:gsm8k, or their repo ids), from the
      Hugging Face cache, downloaded first when `download` and the hub is not offline;
    - ``spec-bench:<question.jsonl>``, ``speed-bench:<dir>`` (``,category=C,prompts=N,output-len=M``; SPEED-Bench
      also ``,subset=S``): the benchmarks vLLM reads from local files, each category a class
      (`autotune.workloads._local_datasets`).

    An existing file wins over a sample of the same name. `max_per_class` keeps the first N requests of each
    class. Malformed input raises WorkloadError ``<file>:<line>: <what is wrong>; expected ...``.
    """
    from autotune.workloads._datasets import DATASETS, load_dataset_workload
    from autotune.workloads._local_datasets import LOCAL_DATASETS, load_local_dataset

    if max_per_class is not None and (isinstance(max_per_class, bool) or max_per_class < 1):
        raise WorkloadError(f"max_per_class must be an integer >= 1 (or None for all), but got {max_per_class!r}.")
    text = os.fspath(spec)
    path = Path(text).expanduser()
    builtins = list_builtin_workloads()
    name = text.removeprefix("builtin:")
    prefix, _, rest = text.partition(":")
    if text.startswith("hf:"):
        workload = load_dataset_workload(text.removeprefix("hf:"), download=download)
    elif prefix in LOCAL_DATASETS and not path.is_file():
        local = load_local_dataset(prefix, rest)
        checked = _build(local.name, local.source, local.requests())  # the class count a policy can serve
        workload = Workload(local.name, checked.classes, local.source, local.description)
    elif path.is_file():
        workload = _load_file(path)
    elif name in builtins:
        workload = _load_builtin(name)
    elif name in SAMPLE_ALIASES:
        sample = _load_builtin(SAMPLE_ALIASES[name])
        workload = Workload(sample.name, sample.classes, sample.source,
                            f"{sample.description}; {name} is its old name")
    elif path.exists():
        raise WorkloadError(f"{path}: is not a regular file; expected a JSONL or ShareGPT JSON file")
    else:
        datasets = [f"hf:{d}" for d in DATASETS] + [f"{d}:PATH" for d in LOCAL_DATASETS]
        near = did_you_mean(name, builtins + datasets + list(SAMPLE_ALIASES))
        raise WorkloadError(
            f"no workload {text!r}: {near}it is not a dataset "
            f"({', '.join(datasets)}), a sample ({', '.join(builtins)}) or an existing .jsonl/.json file."
        )
    return workload.subset(max_per_class) if max_per_class is not None else workload


def resolve_workload(spec: str | None, *, required: bool, download: bool = True) -> tuple[Workload, str | None]:
    """The workload `spec` names, or the default when None; and why the default dataset stood aside (else None).

    The default is the benchmark dataset (`DEFAULT_MEASURED`). `required` (the vllm backend asked for by name)
    fetches it when missing and refuses in one line when it cannot be had; otherwise only a cached copy is read, and
    the samples (`DEFAULT_PREDICTED`) stand in: `default_note` says so in the words of the backend chosen.
    """
    if spec is not None:
        return load_workload(spec, download=download), None
    try:
        return load_workload(DEFAULT_MEASURED, download=download and required), None
    except WorkloadError as exc:
        if required:
            raise WorkloadError(f"The default workload {exc}") from exc
        reason = str(exc).removeprefix(f"{DEFAULT_MEASURED}: ").split(";")[0]
    return load_workload(DEFAULT_PREDICTED), reason


def default_note(reason: str, measured: bool) -> str:
    """What stood in for the default dataset (`resolve_workload`'s reason) and what the figures then rest on."""
    if measured:
        return (f"Measuring on {DEFAULT_PREDICTED} (12 sample prompts), not the default {DEFAULT_MEASURED}: "
                f"{reason}; fetch it (`hf download philschmid/mt-bench --repo-type dataset`) or pass --workload hf:...")
    return (f"Predicting with the published MT-Bench acceptance and the lengths of {DEFAULT_PREDICTED} (12 sample "
            f"prompts): {reason}.")
