"""Checkpoints by name: a local directory, a catalog name or alias, or a Hugging Face repo id[@revision].

`resolve_checkpoint` says where a model's files are and what a launch would download (sizes from the cache or the
hub's file listing; weights are never downloaded to find out); `Checkpoint.download_line` says it in one line;
`fetch_checkpoint` downloads the missing files right before a launch, or refuses under ``--no-download``.
huggingface_hub is imported only when a repo id is resolved (vLLM installs it). Failures are one line:
`UnknownModelError` for a wrong name, `CheckpointError` for a checkpoint that cannot be had here.
"""

from __future__ import annotations

from autotune.checkpoints._checkpoint import Checkpoint, Kind, Source, fetch_checkpoint, resolve_checkpoint
from autotune.checkpoints._errors import CheckpointError
from autotune.checkpoints._files import LAUNCH_PATTERNS, format_bytes, launch_files, weight_files
from autotune.checkpoints._names import RepoRef, parse_repo_ref

__all__ = [
    "LAUNCH_PATTERNS",
    "Checkpoint",
    "CheckpointError",
    "Kind",
    "RepoRef",
    "Source",
    "fetch_checkpoint",
    "format_bytes",
    "launch_files",
    "parse_repo_ref",
    "resolve_checkpoint",
    "weight_files",
]
