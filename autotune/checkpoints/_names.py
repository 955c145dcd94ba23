"""What a ``--model`` / ``--drafter`` value names: a local directory, or a Hugging Face repo id with a revision.

Pure: validates the text only. A repo id is ``ORG/NAME`` as the hub spells it (letters, digits, ``-``, ``_``,
``.``; no ``--`` or ``..``; at most 96 characters, huggingface_hub's own rule), optionally followed by
``@REVISION`` (a branch, tag or commit hash: git ref characters, no ``..``, at most 255 characters).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from autotune.errors import UnknownModelError

#: huggingface_hub's REPO_ID_REGEX, per part: starts and ends with a letter or digit inside.
_PART = re.compile(r"^(?!\.)[A-Za-z0-9_.\-]{1,96}(?<![.\-])$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/\-]{0,254}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHOWN = 120


class RepoRef(NamedTuple):
    """A Hugging Face repo id and the revision asked for (None: the default branch)."""

    repo_id: str
    revision: str | None


def shown(text: str) -> str:
    """`text` quoted for a one-line message: control characters escaped, at most 120 characters."""
    out = repr(text)
    return out if len(out) <= _SHOWN else out[: _SHOWN - 4] + "...'"


def is_commit(revision: str | None) -> bool:
    """True for a full 40-hex commit hash (immutable: a cached snapshot of it is final)."""
    return revision is not None and _COMMIT.fullmatch(revision) is not None


def looks_like_path(text: str) -> bool:
    """True when `text` can only mean a filesystem path (``/x``, ``./x``, ``../x``, ``~/x``, backslashes)."""
    return text.startswith(("/", ".", "~")) or "\\" in text


def local_directory(text: str) -> Path | None:
    """The existing directory `text` names, else None (a repo id is tried next)."""
    if "\0" in text:
        return None
    try:
        path = Path(text).expanduser()
        return path if path.is_dir() else None
    except (OSError, RuntimeError, ValueError):  # unknown ~user, overlong names
        return None


def split_revision(text: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@`` -> ``(text, None)``."""
    name, at, revision = text.partition("@")
    return name, (revision if at else None)


def _revision_problem(revision: str) -> str | None:
    if not revision:
        return "the revision after @ is empty"
    if not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision or revision.endswith(("/", ".lock")):
        return (
            "a revision is a branch, tag or commit hash (letters, digits, '.', '_', '-', '/'; no '..'; at most "
            "255 characters)"
        )
    return None


def _repo_problem(repo_id: str) -> str | None:
    parts = repo_id.split("/")
    if len(parts) != 2:
        return "a repo id has exactly one '/' (ORG/NAME)"
    if not all(_PART.fullmatch(p) for p in parts) or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        return (
            "ORG and NAME take letters, digits, '-', '_' and '.', may not start or end with '-' or '.', nor hold "
            "'--' or '..', and have at most 96 characters"
        )
    return None


def parse_repo_ref(text: str, what: str = "model") -> RepoRef:
    """``ORG/NAME[@REVISION]`` as a `RepoRef`; anything else raises UnknownModelError in one line saying why.

    Example: ``"openai/gpt-oss-120b@main"`` -> ``RepoRef("openai/gpt-oss-120b", "main")``.
    """
    repo_id, revision = split_revision(text)
    problem = _repo_problem(repo_id) or (None if revision is None else _revision_problem(revision))
    if problem is None:
        problem = _hub_problem(repo_id)
    if problem is not None:
        raise UnknownModelError(
            f"{what} {shown(text)} is not a local directory, a catalog name or a Hugging Face repo id: {problem}; "
            "give ORG/NAME[@REVISION], a catalog name or alias, or the path of a model directory."
        )
    return RepoRef(repo_id, revision)


def _hub_problem(repo_id: str) -> str | None:
    """huggingface_hub's own validator, when it is installed (it is the authority on repo ids)."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return None
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        return " ".join(str(exc).split())[:200]
    return None
