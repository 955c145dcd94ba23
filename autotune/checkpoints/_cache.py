"""What the local Hugging Face hub cache holds for a repo, read without the network and without trusting it.

The layout is huggingface_hub's: ``<cache>/models--ORG--NAME/refs/<branch>`` holds a commit hash,
``snapshots/<commit>/<file>`` are symlinks into ``blobs/`` (or the cache-wide blob store), and huggingface_hub >= 2
keeps the repo's file listing per commit (`get_cached_repo_tree`). Files are taken only when they resolve inside
the cache folder; a link pointing elsewhere is refused rather than followed. Reads are bounded (a ref of at most
1 kB, JSON files of at most `JSON_MAX_BYTES`, at most `MAX_FILES` entries per snapshot).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.checkpoints._errors import CheckpointError
from autotune.checkpoints._names import is_commit
from autotune.errors import UnknownModelError
from policies import load_json_text

#: Largest config.json / safetensors index read (a 405B model's index is ~5 MB; configs are a few kB).
JSON_MAX_BYTES = 64 * 1024 * 1024
#: Most directory entries walked in one snapshot or local model directory.
MAX_FILES = 100_000
_REF_MAX_BYTES = 1024


@dataclass(frozen=True)
class CachedRepo:
    """A repo's snapshot in the cache at one commit: the files present (path -> bytes) and, when huggingface_hub
    recorded it, the repo's whole file listing at that commit (path -> bytes)."""

    commit: str
    folder: Path
    present: dict[str, int] = field(default_factory=dict)
    listing: dict[str, int] | None = None


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """``<cache>/models--ORG--NAME`` (huggingface_hub's `repo_folder_name`)."""
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def _read_small(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file `path` (symlinks followed), None when absent, not a file or over `limit`."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def cached_commit(cache_dir: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit `revision` (None: main) points to in the cache: itself for a commit hash, else ``refs/<rev>``."""
    if is_commit(revision):
        return revision
    data = _read_small(repo_folder(cache_dir, repo_id) / "refs" / (revision or "main"), _REF_MAX_BYTES)
    text = data.decode("ascii", "replace").strip() if data is not None else ""
    return text if is_commit(text) else None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk_files(folder: Path, *, confine_to: Path | None, what: str) -> dict[str, int]:
    """Relative POSIX path -> size of every file under `folder`, without descending into linked directories.

    With `confine_to`, a file whose link resolves outside that folder raises CheckpointError (a cache is not a
    place for links elsewhere); dangling links count as absent (huggingface_hub downloads them again).
    """
    root = os.path.realpath(confine_to) if confine_to is not None else None
    out: dict[str, int] = {}
    seen = 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        seen += len(dirnames) + len(filenames)
        if seen > MAX_FILES:
            raise CheckpointError(f"{folder} holds more than {MAX_FILES:,} entries; {what} must be a model folder.")
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = Path(path).relative_to(folder).as_posix()
            real = os.path.realpath(path)
            if root is not None and not _inside(real, root):
                raise CheckpointError(
                    f"{path} links to {real}, outside the Hugging Face cache {confine_to}; delete "
                    f"{folder} and download it again."
                )
            try:
                st = os.stat(real)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[rel] = st.st_size
    return out


def _listing(cache_dir: Path, repo_id: str, commit: str) -> dict[str, int] | None:
    """The file listing huggingface_hub cached for `commit` (>= 2.0: `get_cached_repo_tree`), else None."""
    try:
        from huggingface_hub import get_cached_repo_tree
    except ImportError:
        return None
    try:
        files = get_cached_repo_tree(repo_id, revision=commit, cache_dir=cache_dir)
    except Exception:  # CachedRepoTreeNotFoundError, or a corrupt listing: then the listing is unknown
        return None
    out: dict[str, int] = {}
    for f in files:
        lfs = getattr(f, "lfs", None)
        size = byte_count(getattr(lfs, "size", None) if lfs is not None else getattr(f, "size", 0))
        if size is None:  # a damaged listing ("abc", -1e12): as unknown as a missing one
            return None
        out[str(f.path)] = size
    return out


#: Largest file size a listing may give (1 PB): beyond it the listing is damaged, not the repo huge.
MAX_FILE_BYTES = 10**15


def byte_count(value: Any) -> int | None:
    """`value` as a file's size in bytes (None or absent: 0), or None when it is no byte count (text, negative,
    fractional, beyond `MAX_FILE_BYTES`)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value <= MAX_FILE_BYTES else None


def read_cached(cache_dir: Path, repo_id: str, revision: str | None) -> CachedRepo | None:
    """The cached snapshot of `repo_id` at `revision`, or None when the cache has no snapshot for it."""
    commit = cached_commit(cache_dir, repo_id, revision)
    if commit is None:
        return None
    folder = repo_folder(cache_dir, repo_id) / "snapshots" / commit
    if not folder.is_dir() or folder.is_symlink():
        return None
    present = walk_files(folder, confine_to=cache_dir, what=f"the cached snapshot of {repo_id}")
    return CachedRepo(commit=commit, folder=folder, present=present, listing=_listing(cache_dir, repo_id, commit))


def read_json(path: Path, what: str, error: type[Exception] = UnknownModelError) -> Any:
    """The parsed JSON file `path` (at most `JSON_MAX_BYTES`); `error` in one line when it cannot be had."""
    data = _read_small(path, JSON_MAX_BYTES)
    if data is None:
        raise error(f"{path}: cannot read the {what} (missing, not a regular file, or over "
                    f"{JSON_MAX_BYTES // 2**20} MiB).")
    try:
        return load_json_text(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise error(f"{path}: the {what} is not valid JSON ({reason}); expected a Hugging Face {what}.") from None


def read_config(folder: Path) -> dict[str, Any]:
    """A model folder's config.json as a dict (UnknownModelError when missing or not a JSON object)."""
    path = folder / "config.json"
    if not path.is_file():
        raise UnknownModelError(
            f"{folder} has no config.json; a model must be a Hugging Face model directory (config.json plus weights)."
        )
    config = read_json(path, "config.json")
    if not isinstance(config, dict):
        raise UnknownModelError(f"{path} holds a {type(config).__name__}; expected a JSON object (a HF config).")
    return config
