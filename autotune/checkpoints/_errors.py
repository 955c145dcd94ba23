"""The error of a checkpoint that is named right but cannot be had here (gated, token, offline, network)."""

from __future__ import annotations

from autotune.errors import PeagleError


class CheckpointError(PeagleError):
    """A checkpoint that exists (or may) but cannot be read or downloaded here: a gated repo, a refused token, the
    hub unreachable or HF_HUB_OFFLINE=1 without a cached copy, a download refused by --no-download. The message is
    one line naming the repo and the fix. A wrong name (bad repo id, unknown repo or revision) is an
    `UnknownModelError` instead."""
