"""--model / --drafter values resolve to checkpoints the way vLLM will load them (issue 32.1-2): local directories,
catalog names (-> repo ids) and Hugging Face repo ids, from the cache first, with what a launch would download.

The hub is out of reach here: the cache is built from the fixtures (tests/hub_cache.py), and the online failures are
huggingface_hub's own exception classes raised by the one HfApi call we make."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from hub_cache import (  # noqa: E402  (tests/ is on sys.path)
    STANDARD_REPOS,
    HubCache,
    build_hub_cache,
    hub_cache_fixture,  # noqa: F401  (the hub_cache fixture)
    use_hub_cache,
)

from autotune.checkpoints import (  # noqa: E402
    CheckpointError,
    fetch_checkpoint,
    launch_files,
    resolve_checkpoint,
    weight_files,
)
from autotune.errors import UnknownModelError  # noqa: E402

_TARGET = STANDARD_REPOS["org/target"]
_TARGET_WEIGHTS = (_TARGET / "model.safetensors").stat().st_size


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.strip() == message
    return message


# ------------------------------------------------------------------------------------------------ from the cache
def test_a_cached_repo_resolves_offline_with_its_weights_and_nothing_to_download(hub_cache: HubCache) -> None:
    ckpt = resolve_checkpoint("org/target")
    assert (ckpt.repo_id, ckpt.revision, ckpt.source) == ("org/target", None, "cache")
    assert ckpt.commit == hub_cache.commits["org/target"]
    assert ckpt.local_dir == hub_cache.snapshot("org/target")
    assert ckpt.weight_bytes == _TARGET_WEIGHTS
    assert (ckpt.missing_bytes, ckpt.missing_files, ckpt.complete) == (0, (), True)
    assert ckpt.config["num_hidden_layers"] == 4
    assert "nothing to download" in ckpt.download_line()
    assert fetch_checkpoint(ckpt, no_download=True) == hub_cache.snapshot("org/target")


def test_a_revision_resolves_by_commit_and_by_branch(hub_cache: HubCache) -> None:
    commit = hub_cache.commits["org/target"]
    by_commit = resolve_checkpoint(f"org/target@{commit}")
    assert (by_commit.revision, by_commit.commit, by_commit.local_dir) == (commit, commit, hub_cache.snapshot(
        "org/target"))
    assert resolve_checkpoint("org/target@main").commit == commit
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("org/target@v2")  # a branch the cache does not know, offline
    assert "hf download org/target --revision v2" in _one_line(info)


def test_a_catalog_alias_names_its_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_hub_cache(tmp_path, {"amazon/gpt-oss-120b-p-eagle": STANDARD_REPOS["org/drafter-1l"]})
    use_hub_cache(monkeypatch, tmp_path)
    ckpt = resolve_checkpoint("GPT-OSS-120B-P-EAGLE", kind="drafter")
    assert (ckpt.repo_id, ckpt.catalog_name, ckpt.source) == (
        "amazon/gpt-oss-120b-p-eagle", "amazon/gpt-oss-120b-p-eagle", "cache")
    # The target's alias names its repo too; it is not cached, and offline that is said in one line.
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("gpt-oss-120b")
    message = _one_line(info)
    assert f"openai/gpt-oss-120b is not in the Hugging Face cache (HF_HOME={tmp_path})" in message
    assert "HF_HUB_OFFLINE=1" in message and "hf download openai/gpt-oss-120b" in message


def test_a_user_catalog_alias_resolves_to_the_cached_repo(
    hub_cache: HubCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_user_catalog import TINY

    from autotune.catalogs import CATALOG_ENV_VAR, clear_catalogs

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(TINY)
    monkeypatch.setenv(CATALOG_ENV_VAR, str(catalog))
    clear_catalogs()
    ckpt = resolve_checkpoint("tiny-target")
    assert (ckpt.repo_id, ckpt.catalog_name, ckpt.local_dir) == ("org/target", "org/target",
                                                                 hub_cache.snapshot("org/target"))
    assert resolve_checkpoint("tiny-head", kind="drafter").local_dir == hub_cache.snapshot("org/drafter-2l")


def test_a_hypothetical_catalog_head_has_no_checkpoint(hub_cache: HubCache) -> None:
    with pytest.raises(UnknownModelError, match="no published checkpoint") as info:
        resolve_checkpoint("amazon/gpt-oss-120b-p-eagle:2-layer", kind="drafter")
    _one_line(info)


def test_a_repo_missing_from_the_cache_offline_is_one_line_naming_the_fix(hub_cache: HubCache) -> None:
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("org/not-cached")
    message = _one_line(info)
    assert message.startswith("org/not-cached is not in the Hugging Face cache")
    assert str(hub_cache.root) in message and "unset HF_HUB_OFFLINE" in message


def test_a_local_directory_is_its_own_checkpoint() -> None:
    ckpt = resolve_checkpoint(str(_TARGET))
    assert (ckpt.source, ckpt.repo_id, ckpt.local_dir) == ("local", None, _TARGET.resolve())
    assert (ckpt.weight_bytes, ckpt.missing_bytes) == (_TARGET_WEIGHTS, 0)
    assert fetch_checkpoint(ckpt, no_download=True) == _TARGET.resolve()


# ------------------------------------------------------------------------------------------------ partial caches
def test_a_partial_cache_reports_the_missing_files_and_no_download_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_hub_cache(tmp_path, {"org/target": _TARGET}, partial={"org/target": ["config.json"]})
    use_hub_cache(monkeypatch, tmp_path)
    ckpt = resolve_checkpoint("org/target")
    missing = ["model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert list(ckpt.missing_files) == missing
    assert ckpt.missing_bytes == sum((_TARGET / f).stat().st_size for f in missing)
    assert ckpt.weight_bytes == _TARGET_WEIGHTS and ckpt.local_dir is None and not ckpt.complete
    assert ckpt.download_line() == f"org/target: 7.1 MB to download (3 files) into {tmp_path / 'hub'}"
    with pytest.raises(CheckpointError) as info:
        fetch_checkpoint(ckpt, no_download=True)
    message = _one_line(info)
    assert "7.1 MB" in message and "drop --no-download" in message
    with pytest.raises(CheckpointError) as offline:
        fetch_checkpoint(ckpt)
    assert "HF_HUB_OFFLINE=1" in _one_line(offline)


def test_without_a_file_listing_missing_weights_have_an_unknown_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub < 2 kept no listing of the repo: offline, nothing says how big the weights are.
    build_hub_cache(tmp_path, {"org/target": _TARGET}, partial={"org/target": ["config.json"]}, tree_listing=False)
    use_hub_cache(monkeypatch, tmp_path)
    ckpt = resolve_checkpoint("org/target")
    assert (ckpt.weight_bytes, ckpt.missing_bytes, ckpt.complete) == (None, None, False)
    assert "size unknown" in ckpt.download_line()
    # ... and with the weights there, the same cache is complete.
    build_hub_cache(tmp_path, {"org/target": _TARGET}, tree_listing=False)
    assert resolve_checkpoint("org/target").weight_bytes == _TARGET_WEIGHTS


def test_a_cached_file_linking_outside_the_cache_is_refused(hub_cache: HubCache, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"x" * 10)
    link = hub_cache.snapshot("org/target") / "model.safetensors"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the Hugging Face cache") as info:
        resolve_checkpoint("org/target")
    _one_line(info)


# ------------------------------------------------------------------------------------------------ hostile names
@pytest.mark.parametrize(
    "value",
    ["../../etc-nonexistent", "a/b/c", "org/na me", "org/name@../../refs", "org/..", "-org/x", "org/x--y",
     "org/" + "x" * 300, "x" * 5000, "org/ta\nrget", "org/target@", "", "gpt-oss-12"],
)
def test_a_bad_name_is_one_line(hub_cache: HubCache, value: str) -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve_checkpoint(value)
    assert len(_one_line(info)) < 2000


def test_a_close_miss_suggests_the_catalog_name(hub_cache: HubCache) -> None:
    with pytest.raises(UnknownModelError, match=r"Did you mean gpt-oss-120b \(openai/gpt-oss-120b\)\?"):
        resolve_checkpoint("gpt-oss-12b")


# ------------------------------------------------------------------------------------------------ the hub's answers
def _http_error(cls: type[Exception], status: int, repo: str) -> Exception:
    http = __import__(huggingface_hub.errors.Response.__module__.split(".")[0])
    url = f"https://huggingface.co/api/models/{repo}"
    response = http.Response(status, request=http.Request("GET", url))
    return cls(f"{status} Client Error.\n\nfor url: {url}", response=response)


@pytest.fixture()
def online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    build_hub_cache(tmp_path, STANDARD_REPOS)
    use_hub_cache(monkeypatch, tmp_path, offline=False)

    def fail(error: Exception) -> None:
        def model_info(self: Any, repo_id: str, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)

    return fail


def test_a_complete_cache_answers_without_asking_the_hub(online: Any) -> None:
    online(AssertionError("the hub must not be asked when the cache holds the whole snapshot"))
    assert resolve_checkpoint("org/target").source == "cache"


def test_a_gated_repo_says_where_to_accept_the_license(online: Any) -> None:
    online(_http_error(huggingface_hub.errors.GatedRepoError, 403, "meta-llama/Llama-3.1-8B-Instruct"))
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("llama-3.1-8b")
    message = _one_line(info)
    assert "accept its license at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct" in message
    assert "HF_TOKEN" in message


def test_a_refused_token_says_to_set_a_valid_one(online: Any) -> None:
    online(_http_error(huggingface_hub.errors.HfHubHTTPError, 401, "org/private"))
    with pytest.raises(CheckpointError, match=r"refused the token .*HTTP 401.*HF_TOKEN") as info:
        resolve_checkpoint("org/private")
    _one_line(info)


def test_a_repo_not_on_the_hub_suggests_the_catalog_id(online: Any) -> None:
    online(_http_error(huggingface_hub.errors.RepositoryNotFoundError, 404, "openai/gpt-oss-x"))
    with pytest.raises(UnknownModelError) as info:
        resolve_checkpoint("openai/gpt-oss-x")
    message = _one_line(info)
    assert "openai/gpt-oss-x is not on the Hugging Face hub" in message
    assert "Did you mean openai/gpt-oss-20b?" in message


@pytest.mark.parametrize(("typed", "meant"), [("openai/gpt-oss-120", "openai/gpt-oss-120b"),
                                              ("openai/gpt-oss-12b", "openai/gpt-oss-120b"),
                                              ("opnai/gpt-oss-20b", "openai/gpt-oss-20b")])
def test_a_typo_of_a_catalog_repo_id_is_caught_before_the_hub(online: Any, typed: str, meant: str) -> None:
    """One or two characters off a catalog repo id, and not in the cache: "did you mean", and no request."""
    online(AssertionError("a near miss of a catalog id must not reach the hub"))
    with pytest.raises(UnknownModelError) as info:
        resolve_checkpoint(typed)
    message = _one_line(info)
    assert f"did you mean {meant}?" in message
    assert f"download {typed}" in message  # how to use the repo as typed, if it really exists


def test_an_unknown_revision_names_it(online: Any) -> None:
    online(_http_error(huggingface_hub.errors.RevisionNotFoundError, 404, "org/target"))
    with pytest.raises(UnknownModelError, match="org/target has no revision 'v9'") as info:
        resolve_checkpoint("org/target@v9")
    _one_line(info)


def test_a_network_error_says_to_check_the_network_or_go_offline(online: Any) -> None:
    http = __import__(huggingface_hub.errors.Response.__module__.split(".")[0])
    online(http.ConnectError("[Errno -3] Temporary failure in name resolution\nmore"))
    with pytest.raises(CheckpointError, match="cannot reach the Hugging Face hub .*HF_HUB_OFFLINE=1") as info:
        resolve_checkpoint("org/not-cached")
    _one_line(info)


# ------------------------------------------------------------------------------------------------ which files
def test_weights_are_what_vllm_loads() -> None:
    gpt_oss = ["config.json", "model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors",
               "model.safetensors.index.json", "original/model--00001-of-00007.safetensors", "metal/model.bin",
               "tokenizer.json", "chat_template.jinja", "original/config.json", "README.md"]
    assert weight_files(gpt_oss) == ["model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors"]
    assert weight_files(gpt_oss, ["model-00001-of-00002.safetensors"]) == ["model-00001-of-00002.safetensors"]
    assert launch_files(gpt_oss) == ["chat_template.jinja", "config.json", "model-00000-of-00002.safetensors",
                                     "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                                     "tokenizer.json"]
    assert weight_files(["consolidated.safetensors", "model.safetensors"]) == ["consolidated.safetensors"]
    assert weight_files(["pytorch_model.bin", "config.json"]) == ["pytorch_model.bin"]


def test_no_network_module_is_imported_by_resolving_a_local_directory() -> None:
    import subprocess
    import sys

    code = ("import sys; from autotune.checkpoints import resolve_checkpoint; "
            f"resolve_checkpoint({str(_TARGET)!r}); print('huggingface_hub' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_a_truncated_cached_weights_file_is_missing_not_complete(hub_cache: HubCache) -> None:
    # Issue 44.8: a weights blob cut to 1,000 bytes passed as "in the cache ... nothing to download", and the
    # engines died on it ("invalid header length") 91 s later.
    blob = (hub_cache.snapshot("org/target") / "model.safetensors").resolve()
    size = blob.stat().st_size
    with blob.open("r+b") as f:
        f.truncate(1000)
    ckpt = resolve_checkpoint("org/target")
    assert not ckpt.complete and ckpt.local_dir is None
    assert ckpt.missing_files == ("model.safetensors",) and ckpt.missing_bytes == size
    assert "to download (1 file)" in ckpt.download_line()
    with pytest.raises(CheckpointError, match="--no-download"):
        fetch_checkpoint(ckpt, no_download=True)


@pytest.mark.parametrize("size", ["abc", -1e12, 1.5, 10**18])
def test_a_hub_listing_with_a_size_that_is_no_byte_count_is_one_line(size: object) -> None:
    # Issue 44.8: size "abc" gave "Unexpected ... bug"; -1e12 printed "-1.0 TB to download".
    from types import SimpleNamespace

    from autotune.checkpoints._hub import sibling_sizes

    info = SimpleNamespace(id="org/x", siblings=[SimpleNamespace(rfilename="model.safetensors", size=size, lfs=None)])
    with pytest.raises(CheckpointError) as info_error:
        sibling_sizes(info)
    assert "gives 'model.safetensors' the size" in _one_line(info_error) and "no byte count" in str(info_error.value)


def test_a_damaged_cached_listing_counts_as_no_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_hub_cache(tmp_path, {"org/target": _TARGET})
    use_hub_cache(monkeypatch, tmp_path)
    for tree in (tmp_path / "hub").glob("models--org--target/trees/*.json"):
        data = json.loads(tree.read_text())
        data["files"]["model.safetensors"]["size"] = -10**12
        tree.write_text(json.dumps(data))
    ckpt = resolve_checkpoint("org/target")  # judged by the weights present, as without a listing
    assert ckpt.complete and ckpt.missing_bytes == 0 and ckpt.weight_bytes == _TARGET_WEIGHTS


@pytest.mark.parametrize("kind", ["loop", "fifo", "directory"])
def test_a_damaged_cached_config_names_what_it_is(hub_cache: HubCache, kind: str) -> None:
    # Issue 44.8: a config.json that is a symlink loop, a FIFO or a directory was "not in the Hugging Face cache".
    config = hub_cache.snapshot("org/target") / "config.json"
    config.unlink()
    if kind == "loop":
        config.symlink_to(config.name)
    elif kind == "fifo":
        os.mkfifo(config)
    else:
        config.mkdir()
    expected = {"loop": "is a link that resolves to nothing readable", "fifo": "is a FIFO",
                "directory": "is a directory"}[kind]
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("org/target")
    message = _one_line(info)
    assert f"{config} {expected}" in message and "delete" in message
