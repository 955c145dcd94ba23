"""The Hugging Face hub, through huggingface_hub: its settings, the calls we make, and its errors as one line.

huggingface_hub reads HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE into `huggingface_hub.constants` when first
imported; they are read from there at call time, so we see what huggingface_hub (and vLLM, in its own process with
the same environment) sees.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from autotune.checkpoints._cache import byte_count
from autotune.checkpoints._errors import CheckpointError
from autotune.checkpoints._names import shown
from autotune.errors import PeagleError, UnknownModelError

T = TypeVar("T")
_NETWORK_MODULES = ("httpx", "httpx2", "requests", "urllib3", "httpcore", "socket", "ssl")


def hub() -> ModuleType:
    """huggingface_hub, or CheckpointError saying how to get it (vLLM depends on it; peagle-tune alone does not)."""
    try:
        import huggingface_hub
        import huggingface_hub.constants  # a submodule the package does not import by itself
    except ImportError:
        raise CheckpointError(
            "resolving Hugging Face repo ids needs huggingface_hub, which is not installed: "
            "`pip install huggingface_hub` (vLLM installs it), or give a local model directory."
        ) from None
    return huggingface_hub


def cache_dir() -> Path:
    """The hub cache folder huggingface_hub uses (HF_HUB_CACHE, default ``$HF_HOME/hub``)."""
    return Path(hub().constants.HF_HUB_CACHE)


def hf_home() -> str:
    return str(hub().constants.HF_HOME)


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub read it."""
    return bool(hub().constants.HF_HUB_OFFLINE)


def download_hint(repo_id: str, revision: str | None = None) -> str:
    args = repo_id + (f" --revision {revision}" if revision else "")
    return f"`hf download {args}` (`huggingface-cli download` on huggingface_hub < 1.0)"


def offline_error(repo_id: str, revision: str | None = None,
                  what: str = "is not in the Hugging Face cache") -> CheckpointError:
    name = repo_id + (f"@{revision}" if revision else "")
    return CheckpointError(
        f"{name} {what} (HF_HOME={hf_home()}) and HF_HUB_OFFLINE=1: run {download_hint(repo_id, revision)} on a "
        "machine with hub access and copy the cache here, or unset HF_HUB_OFFLINE."
    )


def suggestion(name: str, candidates: Iterable[tuple[str, str]]) -> str:
    """`` did you mean X?`` for the closest (shown name, repo id) pair to `name`, or ""."""
    pairs = list(candidates)
    by_key = {shown_name.lower(): (shown_name, repo) for shown_name, repo in pairs}
    close = difflib.get_close_matches(name.lower(), list(by_key), n=1, cutoff=0.6)
    if not close:
        return ""
    shown_name, repo = by_key[close[0]]
    return f" Did you mean {shown_name}" + (f" ({repo})" if repo != shown_name else "") + "?"


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return any(cls.__module__.split(".")[0] in _NETWORK_MODULES for cls in type(exc).__mro__)


def translate(exc: Exception, repo_id: str, revision: str | None, suggest: str = "") -> PeagleError:
    """A huggingface_hub failure about `repo_id` as our one-line error naming the fix."""
    errors = hub().errors
    status = _status(exc)
    url = f"https://huggingface.co/{repo_id}"
    if isinstance(exc, errors.GatedRepoError):
        return CheckpointError(
            f"{repo_id} is gated: accept its license at {url} with your account, then set HF_TOKEN to a token of "
            "that account (https://huggingface.co/settings/tokens)."
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return UnknownModelError(
            f"{repo_id} has no revision {shown(revision or 'main')}: give a branch, tag or commit hash listed at "
            f"{url}/commits, or drop @{revision}."
        )
    if isinstance(exc, errors.DisabledRepoError):
        return CheckpointError(f"{repo_id} has been disabled on the Hugging Face hub ({url}); choose another model.")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return UnknownModelError(
            f"{repo_id} is not on the Hugging Face hub: check the id at {url} (a private repo also needs HF_TOKEN "
            f"set to a token with access).{suggest}"
        )
    if isinstance(exc, errors.OfflineModeIsEnabled | errors.LocalEntryNotFoundError):
        if offline():
            return offline_error(repo_id, revision)
        hint = download_hint(repo_id, revision)
        return CheckpointError(
            f"{repo_id} is not in the Hugging Face cache (HF_HOME={hf_home()}) and the hub could not be reached "
            f"({_reason(exc)}): check the network (HF_ENDPOINT, HTTPS_PROXY), or run {hint} where the hub is "
            "reachable."
        )
    if isinstance(exc, errors.HfHubHTTPError):
        if status == 401:
            return CheckpointError(
                f"the Hugging Face hub refused the token for {repo_id} (HTTP 401): set HF_TOKEN to a valid token "
                "(https://huggingface.co/settings/tokens) or run `hf auth login`; unset HF_TOKEN for public repos."
            )
        if status == 403:
            return CheckpointError(
                f"the token has no read access to {repo_id} (HTTP 403): give it read access at "
                "https://huggingface.co/settings/tokens, or set HF_TOKEN to another token."
            )
        if status == 429:
            return CheckpointError(
                f"the Hugging Face hub rate-limited the requests for {repo_id} (HTTP 429): wait a few minutes, and "
                "set HF_TOKEN (authenticated requests get a higher limit)."
            )
        return CheckpointError(
            f"the Hugging Face hub failed on {repo_id} ({_reason(exc)}): retry later, or set HF_HUB_OFFLINE=1 to use "
            "the cached copy only."
        )
    if _is_network_error(exc):
        return CheckpointError(
            f"cannot reach the Hugging Face hub for {repo_id} ({_reason(exc)}): check the network (HF_ENDPOINT, "
            "HTTPS_PROXY), or set HF_HUB_OFFLINE=1 to use the cache only."
        )
    return CheckpointError(f"huggingface_hub failed on {repo_id} ({_reason(exc)}).")


def call(repo_id: str, revision: str | None, fn: Callable[[], T], suggest: str = "") -> T:
    """``fn()`` (a huggingface_hub call about `repo_id`) with its failures as `translate` says."""
    try:
        return fn()
    except PeagleError:
        raise
    except Exception as exc:  # every hub, HTTP or network failure: translate() names what went wrong
        raise translate(exc, repo_id, revision, suggest) from exc


def model_info(repo_id: str, revision: str | None, suggest: str = "") -> Any:
    """`HfApi().model_info` with every file's size (no file is downloaded)."""
    api = hub().HfApi()
    return call(repo_id, revision, lambda: api.model_info(repo_id, revision=revision, files_metadata=True), suggest)


def check_access(repo_id: str, revision: str | None) -> None:
    """Raise the gated/token error now, before a download, when the repo is gated (`HfApi.auth_check`, if the
    installed huggingface_hub has it)."""
    api = hub().HfApi()
    auth_check = getattr(api, "auth_check", None)
    if auth_check is not None:
        call(repo_id, revision, lambda: auth_check(repo_id))


def download_file(repo_id: str, filename: str, commit: str) -> Path:
    """One file of the repo at `commit` into the cache (`hf_hub_download`)."""
    download = hub().hf_hub_download
    return Path(call(repo_id, commit, lambda: download(repo_id, filename, revision=commit)))


def sibling_sizes(info: Any) -> dict[str, int]:
    """Path -> bytes of every file `model_info(files_metadata=True)` lists (LFS files by their LFS size)."""
    out: dict[str, int] = {}
    for sibling in getattr(info, "siblings", None) or []:
        lfs = getattr(sibling, "lfs", None)
        raw = getattr(lfs, "size", None) if lfs is not None else None
        if raw is None:
            raw = getattr(sibling, "size", None)
        size = byte_count(raw)
        if size is None:
            raise CheckpointError(
                f"The hub's file listing of {getattr(info, 'id', 'the repo')} gives {str(sibling.rfilename)!r:.80} the "
                f"size {raw!r:.40}, which is no byte count; retry later, or use a local directory."
            )
        out[str(sibling.rfilename)] = size
    return out
