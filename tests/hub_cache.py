"""A Hugging Face hub cache built from local fixture directories, in the layout huggingface_hub itself writes.

This machine cannot reach the hub; users resolve checkpoints by repo id through it. Tests stand in for the hub with
a cache of the fixture models, so that with ``HF_HOME=<root>`` and ``HF_HUB_OFFLINE=1`` huggingface_hub
(`snapshot_download`, `try_to_load_from_cache`, `scan_cache_dir`), transformers and vLLM find them by id::

    <root>/hub/models--ORG--NAME/
        refs/main                        the commit hash (40 hex digits, no newline)
        blobs/<etag>                     file contents: sha256 for LFS files (weights), git blob sha1 otherwise
        snapshots/<commit>/<file>        relative symlinks to ../../blobs/<etag>
        trees/<commit>.json              the repo's file listing (huggingface_hub >= 2 writes it on download)

`build_hub_cache` writes it; `partial` leaves some files out of a snapshot while the listing still names them (an
interrupted download). The `hub_cache` fixture builds the standard repos and points huggingface_hub at them, in
this process (its constants are read at import, so they are patched) and for subprocesses (the environment).
A test module takes it with ``from hub_cache import hub_cache_fixture  # noqa: F401`` (tests/ is on sys.path) and a
``hub_cache`` argument.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURE_MODELS = Path(__file__).resolve().parent / "fixtures" / "models"

#: Repo ids the `hub_cache` fixture serves, and the fixture directory each one holds.
STANDARD_REPOS: dict[str, Path] = {
    "org/target": FIXTURE_MODELS / "target",
    "org/drafter-1l": FIXTURE_MODELS / "drafter-1l",
    "org/drafter-2l": FIXTURE_MODELS / "drafter-2l",
    "org/eagle3-head": FIXTURE_MODELS / "eagle3-head",
}

#: Files the hub stores through Git LFS (their etag is the sha256 of the content), as .gitattributes of model repos
#: on the hub declare them; every other file is a plain git blob (etag: git's sha1).
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".msgpack", ".h5", ".onnx")
_TREE_FORMAT_VERSION = 1


def repo_folder(repo_id: str, repo_type: str = "model") -> str:
    """huggingface_hub's folder name for a repo: ``org/name`` -> ``models--org--name`` (``datasets--`` for a
    dataset repo)."""
    return f"{repo_type}s--" + repo_id.replace("/", "--")


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _files(directory: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every regular file under `directory` (sorted)."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[path.relative_to(directory).as_posix()] = path
    if not out:
        raise ValueError(f"{directory} holds no files to cache")
    return out


def _commit(repo_id: str, listing: Mapping[str, dict[str, object]]) -> str:
    """A stable 40-hex commit hash for `repo_id` with these files (same inputs, same hash)."""
    text = json.dumps([repo_id, sorted((p, info["blob_id"]) for p, info in listing.items())])
    return hashlib.sha1(text.encode()).hexdigest()


def build_hub_cache(
    root: Path,
    repos: Mapping[str, Path],
    *,
    partial: Mapping[str, Collection[str]] | None = None,
    tree_listing: bool = True,
    repo_type: str = "model",
) -> Path:
    """Write a hub cache for `repos` (repo id -> local model directory) under ``<root>/hub``; returns that folder.

    With ``HF_HOME=<root>`` (or ``HF_HUB_CACHE=<returned folder>``) and ``HF_HUB_OFFLINE=1`` huggingface_hub
    resolves ``repo_id`` (revision "main" or the commit, see `cached_commit`) to ``snapshots/<commit>/``.
    `partial` maps a repo id to the only files its snapshot gets (e.g. ``{"org/target": ["config.json"]}``); the
    tree listing still names every file, as after an interrupted download. `tree_listing=False` leaves the listing
    out, as huggingface_hub < 2 did. `repo_type` "dataset" writes dataset repos (``datasets--org--name``).
    """
    cache = Path(root) / "hub"
    for repo_id, directory in repos.items():
        files = _files(Path(directory))
        listing: dict[str, dict[str, object]] = {}
        etags: dict[str, str] = {}
        for rel, path in files.items():
            data = path.read_bytes()
            blob_id = _git_blob_sha1(data)
            info: dict[str, object] = {"size": len(data), "blob_id": blob_id}
            etag = blob_id
            if rel.endswith(_LFS_SUFFIXES):
                etag = hashlib.sha256(data).hexdigest()
                info.update(lfs_sha256=etag, lfs_size=len(data))
            listing[rel] = info
            etags[rel] = etag
        commit = _commit(repo_id, listing)
        storage = cache / repo_folder(repo_id, repo_type)
        keep = set(files) if partial is None or repo_id not in partial else set(partial[repo_id])
        unknown = keep - set(files)
        if unknown:
            raise ValueError(f"partial files {sorted(unknown)} are not in {directory}")
        snapshot = storage / "snapshots" / commit
        for rel in sorted(keep):
            blob = storage / "blobs" / etags[rel]
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                blob.write_bytes(files[rel].read_bytes())
            link = snapshot / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.relpath(blob, link.parent))
        snapshot.mkdir(parents=True, exist_ok=True)
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / "main").write_text(commit)  # huggingface_hub writes no trailing newline
        if tree_listing:
            trees = storage / "trees"
            trees.mkdir(parents=True, exist_ok=True)
            data = {"format_version": _TREE_FORMAT_VERSION, "files": {p: listing[p] for p in sorted(listing)}}
            (trees / f"{commit}.json").write_text(json.dumps(data, indent=1))
    return cache


def cached_commit(cache: Path, repo_id: str, revision: str = "main") -> str:
    """The commit hash `revision` points to in the cache `build_hub_cache` returned."""
    return (Path(cache) / repo_folder(repo_id) / "refs" / revision).read_text().strip()


@dataclass(frozen=True)
class HubCache:
    """What the `hub_cache` fixture built: ``HF_HOME`` (`root`), the hub cache folder and each repo's commit."""

    root: Path
    cache: Path
    commits: dict[str, str]

    def snapshot(self, repo_id: str) -> Path:
        return self.cache / repo_folder(repo_id) / "snapshots" / self.commits[repo_id]


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, root: Path, *, offline: bool = True) -> None:
    """Point huggingface_hub at ``<root>/hub`` (HF_HOME=root) with HF_HUB_OFFLINE, here and in subprocesses.

    huggingface_hub reads HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE into `huggingface_hub.constants` when first
    imported, so the constants are patched as well as the environment. It is imported before the environment
    changes: imported first under the patched environment, its constants would keep the cache after the test."""
    try:
        from huggingface_hub import constants
    except ImportError:
        constants = None
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    if constants is None:
        return
    monkeypatch.setattr(constants, "HF_HOME", str(root))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(Path(root) / "hub"))
    monkeypatch.setattr(constants, "HUGGINGFACE_HUB_CACHE", str(Path(root) / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture(name="hub_cache")
def hub_cache_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubCache]:
    """`STANDARD_REPOS` in a hub cache under tmp_path, with huggingface_hub pointed at it and offline."""
    root = tmp_path / "hf-home"
    cache = build_hub_cache(root, STANDARD_REPOS)
    use_hub_cache(monkeypatch, root)
    yield HubCache(root=root, cache=cache, commits={r: cached_commit(cache, r) for r in STANDARD_REPOS})
