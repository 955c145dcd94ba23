"""Drafter paths vLLM would misread.

vLLM 0.32 auto-detects the speculative method from the drafter's path: with method ``draft_model``, a path that
contains "eagle-", "eagle3", "dflash" or "dspark" is silently run as another method (``~/peagle-tune/drafter`` becomes
an EAGLE head). A symlink under a neutral name keeps the user's directory layout working.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

#: Substrings of a drafter path that make vLLM replace method "draft_model" (``SpeculativeConfig.__post_init__``).
METHOD_HIJACKING_SUBSTRINGS = ("eagle-", "eagle3", "dflash", "dspark")


def hijacking_substring(path: str) -> str | None:
    """The substring of `path` that would make vLLM run a draft_model drafter as another method, if any.

    >>> hijacking_substring("/home/me/peagle-tune/models/drafter")
    'eagle-'
    >>> hijacking_substring("/models/tiny-drafter") is None
    True
    """
    lowered = path.lower()
    return next((s for s in METHOD_HIJACKING_SUBSTRINGS if s in lowered), None)


def safe_draft_model_path(path: str) -> str:
    """`path` itself when vLLM reads it right, else a symlink to it under a neutral name in the temp directory.

    Only local directories can be aliased; a hub id containing such a substring is returned unchanged (vLLM's own
    naming rules apply to it).
    """
    if hijacking_substring(path) is None or not Path(path).is_dir():
        return path
    base = Path(tempfile.gettempdir())
    if hijacking_substring(str(base)) is not None:
        base = Path("/tmp")
    digest = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    link = base / "pt-drafters" / f"drafter-{digest}"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink() or os.readlink(link) != str(Path(path).resolve()):
        tmp = link.with_name(f"{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path(path).resolve(), target_is_directory=True)
        os.replace(tmp, link)
    return str(link)
