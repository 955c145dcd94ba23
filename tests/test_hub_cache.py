"""The stand-in for the Hugging Face hub (tests/hub_cache.py) is a cache huggingface_hub, transformers and vLLM
accept as their own: found by repo id offline, listed by `scan_cache_dir` without complaint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from hub_cache import (  # noqa: E402  (tests/ is on sys.path)
    STANDARD_REPOS,
    HubCache,
    build_hub_cache,
    cached_commit,
    hub_cache_fixture,  # noqa: F401  (the hub_cache fixture)
    use_hub_cache,
)

_TARGET = STANDARD_REPOS["org/target"]


def test_the_layout_is_huggingface_hubs(tmp_path: Path) -> None:
    cache = build_hub_cache(tmp_path, {"org/target": _TARGET})
    assert cache == tmp_path / "hub"
    repo = cache / "models--org--target"
    commit = (repo / "refs" / "main").read_text()
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    weights = repo / "snapshots" / commit / "model.safetensors"
    assert weights.is_symlink() and not os.path.isabs(os.readlink(weights))
    assert weights.resolve().parent == (repo / "blobs").resolve()
    assert weights.read_bytes() == (_TARGET / "model.safetensors").read_bytes()
    # LFS files are stored under their sha256, git files under git's blob sha1 (what the hub's etags are).
    import hashlib

    assert weights.resolve().name == hashlib.sha256(weights.read_bytes()).hexdigest()
    config = (_TARGET / "config.json").read_bytes()
    assert (repo / "snapshots" / commit / "config.json").resolve().name == hashlib.sha1(
        b"blob %d\0" % len(config) + config
    ).hexdigest()


def test_scan_cache_dir_lists_every_repo_without_warnings(tmp_path: Path) -> None:
    cache = build_hub_cache(tmp_path, STANDARD_REPOS)
    info = huggingface_hub.scan_cache_dir(cache)
    assert info.warnings == []
    assert {r.repo_id for r in info.repos} == set(STANDARD_REPOS)
    for repo in info.repos:
        expected = sum(p.stat().st_size for p in STANDARD_REPOS[repo.repo_id].iterdir() if p.is_file())
        assert repo.size_on_disk == expected
        (revision,) = repo.revisions
        assert revision.refs == frozenset({"main"})
        assert revision.commit_hash == cached_commit(cache, repo.repo_id)


def test_huggingface_hub_finds_the_files_offline(hub_cache: HubCache) -> None:
    snapshot = hub_cache.snapshot("org/target")
    assert Path(huggingface_hub.snapshot_download("org/target")) == snapshot
    assert Path(huggingface_hub.snapshot_download("org/target", local_files_only=True)) == snapshot
    commit = hub_cache.commits["org/target"]
    assert Path(huggingface_hub.snapshot_download("org/target", revision=commit)) == snapshot
    cached = huggingface_hub.try_to_load_from_cache("org/target", "model.safetensors")
    assert cached == str(snapshot / "model.safetensors")
    assert huggingface_hub.hf_hub_download("org/drafter-1l", "config.json") == str(
        hub_cache.snapshot("org/drafter-1l") / "config.json"
    )
    with pytest.raises(huggingface_hub.errors.LocalEntryNotFoundError):
        huggingface_hub.snapshot_download("org/not-cached")


def test_a_partial_snapshot_is_incomplete_to_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_hub_cache(tmp_path, {"org/target": _TARGET}, partial={"org/target": ["config.json"]})
    use_hub_cache(monkeypatch, tmp_path)
    assert huggingface_hub.hf_hub_download("org/target", "config.json").endswith("config.json")
    assert huggingface_hub.try_to_load_from_cache("org/target", "model.safetensors") is None
    with pytest.raises(huggingface_hub.errors.LocalEntryNotFoundError, match="model.safetensors"):
        huggingface_hub.snapshot_download("org/target")


@pytest.mark.slow
def test_transformers_loads_config_and_tokenizer_by_repo_id_offline(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    build_hub_cache(tmp_path, STANDARD_REPOS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    code = (
        "import json, transformers\n"
        "c = transformers.AutoConfig.from_pretrained('org/target')\n"
        "t = transformers.AutoTokenizer.from_pretrained('org/target')\n"
        "print(json.dumps([c.num_hidden_layers, c.hidden_size, len(t('hello')['input_ids']) > 0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((_TARGET / "config.json").read_text())
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [config["num_hidden_layers"], config["hidden_size"], True]


@pytest.mark.slow
def test_vllm_resolves_the_repo_id_offline(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    build_hub_cache(tmp_path, STANDARD_REPOS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    code = (
        "from vllm.transformers_utils.config import get_config\n"
        "from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf\n"
        "c = get_config('org/target', trust_remote_code=False)\n"
        "folder = download_weights_from_hf('org/target', None, ['*.safetensors'])\n"
        "print(c.num_hidden_layers, folder)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    layers, folder = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(layers) == json.loads((_TARGET / "config.json").read_text())["num_hidden_layers"]
    assert Path(folder) == tmp_path / "hub" / "models--org--target" / "snapshots" / cached_commit(
        tmp_path / "hub", "org/target"
    )
