"""Resolve a ``--model`` / ``--drafter`` value to a checkpoint, and fetch what a launch still needs.

`resolve_checkpoint` accepts a local directory, a catalog name or alias (its repo id), or a Hugging Face repo id
``ORG/NAME[@REVISION]``, and looks the repo up the way vLLM will load it: the local cache first (no network when
the snapshot is complete), then the hub (`HfApi.model_info` with file sizes; only config.json and the safetensors
index are downloaded) unless HF_HUB_OFFLINE=1. `fetch_checkpoint` downloads the missing files right before a
launch, or refuses with the size when downloads are off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.checkpoints import _hub
from autotune.checkpoints._cache import CachedRepo, read_cached, read_config, read_json, walk_files
from autotune.checkpoints._errors import CheckpointError
from autotune.checkpoints._files import (
    CONFIG_FILE,
    IGNORED_PATTERNS,
    LAUNCH_PATTERNS,
    SAFETENSORS_INDEX,
    format_bytes,
    index_shards,
    launch_files,
    weight_files,
)
from autotune.checkpoints._names import (
    is_commit,
    local_directory,
    looks_like_path,
    parse_repo_ref,
    shown,
    split_revision,
)
from autotune.errors import UnknownModelError

Kind = Literal["model", "drafter"]
Source = Literal["local", "cache", "hub"]


@dataclass(frozen=True)
class Checkpoint:
    """Where a model's files are and what a launch would still download.

    ``local_dir`` is the directory to load from: the local directory given, or the cache snapshot when it holds
    every file a launch reads (None while files are missing: `fetch_checkpoint` returns it then). Sizes are bytes;
    ``weight_bytes`` / ``missing_bytes`` are None only offline when the cache holds no weights and no file listing
    (nothing says how big they are).
    """

    requested: str
    """The value as given (``gpt-oss-120b``, ``org/name@v1``, ``./my-model``)."""
    repo_id: str | None
    """Hugging Face repo id; None for a local directory."""
    revision: str | None
    """Revision as asked (branch, tag or commit); None: the default branch."""
    commit: str | None
    """The commit hash the revision resolved to (cache or hub); None for a local directory or when unknown."""
    local_dir: Path | None
    config: dict[str, Any] = field(repr=False, compare=False)
    """The parsed config.json."""
    weight_bytes: int | None
    """Bytes of the weight files vLLM loads (see `autotune.checkpoints._files`)."""
    missing_bytes: int | None
    """Bytes a launch would download (0 when complete)."""
    missing_files: tuple[str, ...]
    """Repo-relative files a launch would download."""
    source: Source
    """"local" (a directory), "cache" (resolved from the cache alone), "hub" (the hub was asked)."""
    cache_dir: Path | None = None
    """The Hugging Face hub cache a download goes into; None for a local directory."""
    catalog_name: str | None = None
    """The catalog entry the value named, when it named one (its name is the repo id)."""

    @property
    def name(self) -> str:
        """``repo_id[@revision]``, or the local directory."""
        if self.repo_id is None:
            return str(self.local_dir)
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    @property
    def launch_dir(self) -> Path | None:
        """The directory a launch loads from: `local_dir`, or the cache snapshot `fetch_checkpoint` fills (the
        snapshot of `commit`); None when the commit is not known."""
        if self.local_dir is not None:
            return self.local_dir
        if self.repo_id is None or self.commit is None or self.cache_dir is None:
            return None
        return self.cache_dir / ("models--" + self.repo_id.replace("/", "--")) / "snapshots" / self.commit

    @property
    def complete(self) -> bool:
        """True when a launch downloads nothing."""
        return self.missing_bytes == 0 and not self.missing_files and self.local_dir is not None

    def download_line(self) -> str:
        """One line: what a launch will download and how big, or that nothing is needed.

        Example: ``openai/gpt-oss-120b: 65.3 GB to download (14 files) into /root/.cache/huggingface/hub``.
        """
        if self.weight_bytes is None:
            weights = "weights of unknown size"
        elif self.weight_bytes == 0:
            weights = "no weight files"
        else:
            weights = f"{format_bytes(self.weight_bytes)} of weights"
        if self.source == "local":
            return f"{self.local_dir}: local directory, {weights}"
        if self.complete:
            return f"{self.name}: in the Hugging Face cache {self.cache_dir} ({weights}), nothing to download"
        if self.missing_bytes is None:
            return (f"{self.name}: weights not in the Hugging Face cache {self.cache_dir}, size unknown "
                    "(HF_HUB_OFFLINE=1 and no file listing cached)")
        count = len(self.missing_files)
        return (f"{self.name}: {format_bytes(self.missing_bytes)} to download ({count} file{'s' * (count != 1)}) "
                f"into {self.cache_dir}")


# ------------------------------------------------------------------------------------------------ catalog names
def _catalog_repo(name: str, kind: Kind) -> str | None:
    """The repo id of the catalog entry `name` names (case-insensitive name or alias), else None."""
    from autotune.catalogs import get_drafter, resolve_model

    try:
        if kind == "model":
            return resolve_model(name).name
        drafter = get_drafter(name)
    except UnknownModelError:
        return None
    if not drafter.published:
        raise UnknownModelError(
            f"drafter {shown(name)} is a hypothetical head ({drafter.name}) with no published checkpoint: it can be "
            "predicted (--backend model) but not launched; give a published drafter or a local directory."
        )
    return drafter.name


def _catalog_pairs(kind: Kind) -> list[tuple[str, str]]:
    from autotune.catalogs import list_drafters, list_models

    entries: list[tuple[str, tuple[str, ...]]] = (
        [(m.name, m.aliases) for m in list_models()] if kind == "model"
        else [(d.name, d.aliases) for d in list_drafters()]
    )
    return [(n, repo) for repo, aliases in entries for n in (repo, *aliases)]


def _catalog_names(kind: Kind) -> str:
    """``repo (alias, alias); repo ...`` of the catalog entries of `kind`."""
    groups: dict[str, list[str]] = {}
    for shown_name, repo in _catalog_pairs(kind):
        if shown_name != repo:
            groups.setdefault(repo, []).append(shown_name)
        else:
            groups.setdefault(repo, [])
    return "; ".join(f"{repo} ({', '.join(aliases)})" if aliases else repo for repo, aliases in groups.items())


def _suggest(name: str, kind: Kind) -> str:
    return _hub.suggestion(name, _catalog_pairs(kind))


#: difflib similarity of a repo id to a catalog one (lower-cased) that makes it a typo of it: one or two characters
#: off in an id of about 20 ("openai/gpt-oss-120" -> "openai/gpt-oss-120b" scores 0.97).
NEAR_MISS = 0.9


def _refuse_near_miss(repo_id: str, revision: str | None, kind: Kind) -> None:
    """Raise "did you mean" when `repo_id` (neither a catalog entry nor in the HF cache) is a near miss of a catalog
    repo id, before any network call: ``openai/gpt-oss-120`` is a typo of ``openai/gpt-oss-120b`` far more often
    than a repo of its own. A repo that really has such a name is used once it is in the cache (the hint says how)."""
    import difflib

    wanted = repo_id.lower()
    scored = sorted(((difflib.SequenceMatcher(None, wanted, repo.lower()).ratio(), repo)
                     for repo in {repo for _name, repo in _catalog_pairs(kind)}), reverse=True)
    if not scored or scored[0][0] < NEAR_MISS or scored[0][1].lower() == wanted:
        return
    raise UnknownModelError(
        f"unknown {kind} {shown(repo_id)}: did you mean {scored[0][1]}? It is neither a catalog {kind} nor in the "
        f"Hugging Face cache; if {repo_id} is the repo you mean, download it first with "
        f"{_hub.download_hint(repo_id, revision)}."
    )


# ------------------------------------------------------------------------------------------------ resolution
def resolve_checkpoint(value: str, kind: Kind = "model") -> Checkpoint:
    """The checkpoint `value` names, with its config and the bytes a launch would download (nothing is downloaded
    but config.json and the safetensors index when they are not cached).

    Order: an existing directory; a catalog name or alias of `kind` (-> its repo id); ``ORG/NAME[@REVISION]``.
    Raises UnknownModelError (bad id, no such repo or revision, a directory without config.json) or CheckpointError
    (gated, token, offline without a cached copy, network), each one line naming the fix.
    """
    text = value.strip()
    if not text:
        raise UnknownModelError(f"the {kind} is empty; give a catalog name, ORG/NAME or a local directory.")
    local = local_directory(text)
    if local is not None:
        return _local_checkpoint(value, local)
    if looks_like_path(text):
        raise UnknownModelError(
            f"{kind} {shown(text)} is not an existing directory; give the path of a Hugging Face model directory "
            "(config.json plus weights), a catalog name or ORG/NAME."
        )
    name, revision = split_revision(text)
    catalog_repo = _catalog_repo(name, kind)
    if catalog_repo is None and "/" not in name:
        known = _catalog_names(kind)
        raise UnknownModelError(
            f"unknown {kind} {shown(text)}: not a catalog name or alias ({known}), a local directory, or a Hugging "
            f"Face repo id ORG/NAME[@REVISION].{_suggest(name, kind)}"
        )
    ref = parse_repo_ref(
        (catalog_repo or name) + (f"@{revision}" if revision is not None else ""), kind
    )
    return _repo_checkpoint(value, ref.repo_id, ref.revision, catalog_repo, kind)


def _local_checkpoint(requested: str, folder: Path) -> Checkpoint:
    config = read_config(folder)
    present = walk_files(folder, confine_to=None, what=f"{folder}")
    weights = weight_files(present, _local_index(folder, present))
    return Checkpoint(
        requested=requested, repo_id=None, revision=None, commit=None, local_dir=folder.resolve(), config=config,
        weight_bytes=sum(present[f] for f in weights), missing_bytes=0, missing_files=(), source="local",
    )


def _local_index(folder: Path, present: dict[str, int]) -> list[str] | None:
    if SAFETENSORS_INDEX not in present:
        return None
    try:
        return index_shards(read_json(folder / SAFETENSORS_INDEX, "safetensors index"))
    except UnknownModelError:
        return None  # a broken index: count every safetensors file, as a launch would fail on it anyway


def _config_from(folder: Path, present: dict[str, int], repo_id: str) -> dict[str, Any] | None:
    if CONFIG_FILE not in present:
        path = folder / CONFIG_FILE
        if os.path.lexists(path):  # there, but not a readable regular file: say what it is, not "not cached"
            kind = ("a directory" if path.is_dir() else "a FIFO" if path.is_fifo() else
                    "a link that resolves to nothing readable (dangling, a loop, or outside the cache)"
                    if path.is_symlink() else "not a regular file")
            raise CheckpointError(f"{path} is {kind}: the cached snapshot of {repo_id} is damaged; delete "
                                  f"{folder} and let the next run download it again.")
        return None
    config = read_json(folder / CONFIG_FILE, f"config.json of {repo_id}")
    if not isinstance(config, dict):
        raise UnknownModelError(f"{folder / CONFIG_FILE} holds a {type(config).__name__}; expected a JSON object.")
    return config


def _plan(listing: dict[str, int], shards: list[str] | None, present: dict[str, int]) -> tuple[list[str], list[str]]:
    """(weight files, missing files) of a launch given the repo's listing and the cached files. A cached file
    shorter than the listing says (an interrupted or damaged download) is missing too: vLLM would fail on it
    ("invalid header length") minutes into a launch."""
    needed = launch_files(listing, shards)
    return weight_files(listing, shards), [f for f in needed if present.get(f, -1) < listing[f]]


def _repo_checkpoint(requested: str, repo_id: str, revision: str | None, catalog: str | None,
                     kind: Kind) -> Checkpoint:
    cache_dir = _hub.cache_dir()
    cached = read_cached(cache_dir, repo_id, revision)
    if cached is None and catalog is None:
        _refuse_near_miss(repo_id, revision, kind)
    found = _from_cache(requested, repo_id, revision, catalog, cache_dir, cached)
    if found is not None and (found.complete or _hub.offline()):
        return found
    if _hub.offline():
        raise _hub.offline_error(repo_id, revision)
    return _from_hub(requested, repo_id, revision, catalog, cache_dir, kind)


def _from_cache(requested: str, repo_id: str, revision: str | None, catalog: str | None, cache_dir: Path,
                cached: CachedRepo | None) -> Checkpoint | None:
    """What the cache alone says; None when it has no snapshot with a config.json for this revision."""
    if cached is None:
        return None
    config = _config_from(cached.folder, cached.present, repo_id)
    if config is None:
        return None
    shards = _local_index(cached.folder, cached.present)
    weight_bytes: int | None
    missing_bytes: int | None
    if cached.listing is not None:
        weights, missing = _plan(cached.listing, shards, cached.present)
        weight_bytes = sum(cached.listing[f] for f in weights)
        missing_bytes = sum(cached.listing[f] for f in missing)
    else:
        # No listing (huggingface_hub < 2 wrote the cache): complete when the weights a launch reads are there.
        weights = weight_files(cached.present, shards)
        missing = [s for s in shards or () if s not in cached.present]
        known = bool(weights) and not missing
        weight_bytes = sum(cached.present[f] for f in weights) if known else None
        missing_bytes = 0 if known else None
    return Checkpoint(
        requested=requested, repo_id=repo_id, revision=revision, commit=cached.commit,
        local_dir=cached.folder if missing_bytes == 0 and not missing else None, config=config,
        weight_bytes=weight_bytes, missing_bytes=missing_bytes, missing_files=tuple(missing), source="cache",
        cache_dir=cache_dir, catalog_name=catalog,
    )


def _from_hub(requested: str, repo_id: str, revision: str | None, catalog: str | None, cache_dir: Path,
              kind: Kind) -> Checkpoint:
    info = _hub.model_info(repo_id, revision, suggest=_suggest(repo_id, kind))
    commit = str(info.sha) if getattr(info, "sha", None) else revision
    listing = _hub.sibling_sizes(info)
    if CONFIG_FILE not in listing:
        raise UnknownModelError(
            f"{repo_id} has no config.json at {revision or 'main'}: it is not a Hugging Face transformers model "
            "vLLM can load; give another repo or revision."
        )
    cached = read_cached(cache_dir, repo_id, commit) if is_commit(commit) else None
    present = dict(cached.present) if cached is not None else {}
    needed_before = launch_files(listing)
    if getattr(info, "gated", False) and any(f not in present for f in needed_before):
        _hub.check_access(repo_id, revision)
    folder = cached.folder if cached is not None else None
    for small in (CONFIG_FILE, SAFETENSORS_INDEX):  # both top-level: their folder is the snapshot
        if small in listing and small not in present:
            folder = _hub.download_file(repo_id, small, commit or "main").parent
            present[small] = listing[small]
    if folder is None:  # config.json is listed, so it was cached or downloaded above
        raise CheckpointError(f"{repo_id}: config.json could not be placed in the cache {cache_dir}.")
    config = _config_from(folder, present, repo_id) or {}
    shards = _local_index(folder, present)
    weights, missing = _plan(listing, shards, present)
    complete = not missing
    return Checkpoint(
        requested=requested, repo_id=repo_id, revision=revision, commit=commit,
        local_dir=folder if complete else None, config=config,
        weight_bytes=sum(listing[f] for f in weights), missing_bytes=sum(listing[f] for f in missing),
        missing_files=tuple(missing), source="hub", cache_dir=cache_dir, catalog_name=catalog,
    )


# ------------------------------------------------------------------------------------------------ fetching
def fetch_checkpoint(checkpoint: Checkpoint, *, no_download: bool = False) -> Path:
    """The directory to launch from, downloading the checkpoint's missing files first (configs, tokenizer files
    and the weights vLLM loads) into the Hugging Face cache.

    With `no_download` (``--no-download``) a checkpoint with files missing raises CheckpointError naming the size
    and the flag instead; offline (HF_HUB_OFFLINE=1) it raises saying how to get the files.
    """
    if checkpoint.complete and checkpoint.local_dir is not None:
        return checkpoint.local_dir
    repo_id = checkpoint.repo_id
    if repo_id is None:  # a local directory is always complete
        raise CheckpointError(f"{checkpoint.requested}: not a local directory nor a repo id.")
    size = "weights of unknown size" if checkpoint.missing_bytes is None else format_bytes(checkpoint.missing_bytes)
    if no_download:
        raise CheckpointError(
            f"{checkpoint.name} needs {size} downloaded ({len(checkpoint.missing_files) or 'some'} files) into "
            f"{checkpoint.cache_dir}, and --no-download is set: drop --no-download, or run "
            f"{_hub.download_hint(repo_id, checkpoint.revision)} first."
        )
    if _hub.offline():
        raise _hub.offline_error(repo_id, checkpoint.revision, f"misses {size} in the Hugging Face cache")
    # Known listing: exactly the missing files (the snapshot folder keeps those already cached).
    patterns = list(checkpoint.missing_files) if checkpoint.missing_bytes is not None else list(LAUNCH_PATTERNS)
    revision = checkpoint.commit or checkpoint.revision
    hub = _hub.hub()
    # With a known listing the patterns are exactly the missing files: forced, so a short cached blob is replaced
    # (huggingface_hub otherwise keeps a file that is present, whatever its size).
    forced = checkpoint.missing_bytes is not None
    folder = _hub.call(repo_id, revision, lambda: hub.snapshot_download(
        repo_id, revision=revision, allow_patterns=patterns, ignore_patterns=list(IGNORED_PATTERNS),
        force_download=forced))
    return Path(folder)
