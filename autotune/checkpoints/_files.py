"""Which files of a checkpoint a vLLM launch reads, and how big they are (pure).

vLLM 0.32 (``DefaultModelLoader._prepare_weights`` / ``download_weights_from_hf``, load_format "auto"):

- ``consolidated*.safetensors`` present: Mistral format, those files;
- else, with ``model.safetensors.index.json``: exactly the shards of its ``weight_map``;
- else the first of ``*.safetensors``, ``*.bin``, ``*.pt`` that matches any file, all its matches;

always skipping ``original/**/*`` (LoadConfig.ignore_patterns: gpt-oss keeps a second copy of its weights there).
Configs and tokenizer files are read from the repo's top level (config.json, generation_config.json,
tokenizer*.json, tokenizer.model, *.tiktoken, merges/vocab .txt, chat templates).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from fnmatch import fnmatchcase

CONFIG_FILE = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MISTRAL_INDEX = "consolidated.safetensors.index.json"
#: vLLM's LoadConfig.ignore_patterns default.
IGNORED_PATTERNS: tuple[str, ...] = ("original/**/*", "original/*")
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
_MISTRAL_PATTERN = "consolidated*.safetensors"
#: Top-level files a launch reads besides weights.
_SMALL_PATTERNS = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja")
#: What `fetch_checkpoint` downloads when the file listing is unknown (huggingface_hub allow_patterns).
LAUNCH_PATTERNS: tuple[str, ...] = (*_SMALL_PATTERNS, "*.safetensors")


def _kept(paths: Iterable[str]) -> list[str]:
    return sorted(p for p in paths if not any(fnmatchcase(p, pat) for pat in IGNORED_PATTERNS))


def weight_files(paths: Iterable[str], index_shards: Collection[str] | None = None) -> list[str]:
    """The weight files vLLM loads among `paths` (repo-relative), by the rules above.

    `index_shards`: the file names in model.safetensors.index.json's weight_map when it was read; None when the
    repo has no index or it could not be read (then every safetensors file counts, an over-estimate at worst).
    Example: ``["config.json", "model.safetensors", "original/model.safetensors"]`` -> ``["model.safetensors"]``.
    """
    kept = _kept(paths)
    mistral = [p for p in kept if fnmatchcase(p, _MISTRAL_PATTERN)]
    if mistral:
        return mistral
    if index_shards:
        present = set(kept)
        return sorted(s for s in set(index_shards) if s in present)
    for pattern in _WEIGHT_PATTERNS:
        found = [p for p in kept if fnmatchcase(p, pattern)]
        if found:
            return found
    return []


def launch_files(paths: Iterable[str], index_shards: Collection[str] | None = None) -> list[str]:
    """Every file of `paths` a launch reads: top-level configs and tokenizer files, and `weight_files`."""
    paths = list(paths)
    small = [p for p in paths if "/" not in p and any(fnmatchcase(p, pat) for pat in _SMALL_PATTERNS)]
    return sorted({*small, *weight_files(paths, index_shards)})


def index_shards(index: object) -> list[str] | None:
    """The shard names of a parsed safetensors index (``{"weight_map": {tensor: file}}``); None when malformed."""
    if not isinstance(index, Mapping):
        return None
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, Mapping) or not weight_map:
        return None
    shards = {v for v in weight_map.values() if isinstance(v, str)}
    return sorted(shards) or None


def format_bytes(n: float) -> str:
    """Bytes in decimal units with one decimal: 65_300_000_000 -> "65.3 GB", 7_090_760 -> "7.1 MB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
