"""Drafters as vLLM 0.32 reads them: paths it would misread, and the parallel-drafting mask token.

vLLM auto-detects the speculative method from the drafter's path: with method ``draft_model``, a path that contains
"eagle-", "eagle3", "dflash" or "dspark" is silently run as another method (``~/peagle-tune/drafter`` becomes an
EAGLE head). A symlink under a neutral name, in a directory private to the user (`drafter_alias_dir`), keeps the
user's directory layout working. Parallel drafting needs a mask token in the drafter's config.json; checking it here
turns vLLM's late engine error into an early, named one.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.engine._private import ensure_private_dir, os_error_line, user_private_root
from autotune.errors import PrivateDirectoryError

#: Substrings of a drafter path that make vLLM replace method "draft_model" (``SpeculativeConfig.__post_init__``).
METHOD_HIJACKING_SUBSTRINGS = ("eagle-", "eagle3", "dflash", "dspark")

#: Keys vLLM 0.32 reads the parallel-drafting mask token from (``llm_base_proposer._init_parallel_drafting_params``).
MASK_TOKEN_KEYS: tuple[str, ...] = (
    "dflash_config.mask_token_id",
    "mask_token_id",
    "dspark_noise_token_id",
    "pard_token",
    "ptd_token_id",
)


def hijacking_substring(path: str) -> str | None:
    """The substring of `path` that would make vLLM run a draft_model drafter as another method, if any.

    >>> hijacking_substring("/home/me/peagle-tune/models/drafter")
    'eagle-'
    >>> hijacking_substring("/models/tiny-drafter") is None
    True
    """
    lowered = path.lower()
    return next((s for s in METHOD_HIJACKING_SUBSTRINGS if s in lowered), None)


def drafter_alias_dir() -> Path:
    """``<tmp>/ptune-<uid>/drafters``, private to this user (``/tmp/ptune-<uid>/drafters`` when the temp directory's
    own path would be misread). Not created here."""
    root = user_private_root()
    if hijacking_substring(str(root)) is not None:
        root = user_private_root("/tmp")
    return root / "drafters"


def safe_draft_model_path(path: str, *, create: bool = True) -> str:
    """`path` itself when vLLM reads it right, else a symlink to it under a neutral name: ``drafter-<hash>`` in this
    user's `drafter_alias_dir` (the hash is of the resolved path, so the name is stable across runs).

    Only local directories can be aliased; a hub id containing such a substring is returned unchanged (vLLM's own
    naming rules apply to it). ``create=False`` names the alias without creating anything (dry runs, lookups).
    The directories are created 0700 or refused when someone else could write them (`PrivateDirectoryError`): a
    stranger who could repoint the link would choose the drafter vLLM loads.
    """
    if hijacking_substring(path) is None or not Path(path).is_dir():
        return path
    target = str(Path(path).resolve())
    folder = drafter_alias_dir()
    link = folder / f"drafter-{hashlib.sha256(target.encode()).hexdigest()[:16]}"
    if not create:
        return str(link)
    fix = f"set TMPDIR to a directory of yours (drafter aliases go to {folder})"
    ensure_private_dir(folder.parent, fix=fix)
    ensure_private_dir(folder, fix=fix, parents=False)
    try:
        if not (link.is_symlink() and os.readlink(link) == target):
            tmp = folder / f".{link.name}.{secrets.token_hex(6)}"
            os.symlink(target, tmp, target_is_directory=True)  # fails rather than follows if tmp exists
            os.replace(tmp, link)  # replaces a stale link; never writes through it
    except OSError as exc:
        raise PrivateDirectoryError(os_error_line(exc, link, fix)) from None
    return str(link)


def looks_local(name: str) -> bool:
    """True when `name` is meant as a local path (absolute, relative, home-relative, or existing)."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists()


def model_config_json(name: str) -> dict[str, Any] | None:
    """The config.json of a local model directory, or of a hub model already in the Hugging Face cache.

    Returns None when it cannot be found without a download (then vLLM gets the final word).
    """
    path: Path | None = None
    if looks_local(name):
        path = Path(name).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        cached = try_to_load_from_cache(name, "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    if path is None or not path.is_file():
        return None
    from autotune.checkpoints._cache import read_json  # bounded in size, depth and number length

    data = read_json(path, "config.json")
    return data if isinstance(data, dict) else None


def mask_token(drafter_config: Mapping[str, Any]) -> tuple[str, int] | None:
    """(key, token id) of the parallel-drafting mask token in a drafter's config.json, in vLLM's order of
    precedence; None when it has none. Example: ``{"pard_token": 259}`` -> ``("pard_token", 259)``."""
    for key in MASK_TOKEN_KEYS:
        value: Any = drafter_config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None
