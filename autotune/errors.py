"""One root exception for peagle-tune, with specific children.

Library code raises these; only the CLI turns them into `click.ClickException`s. Every message states the rule,
the values and the fix.
"""

from __future__ import annotations


class PeagleError(Exception):
    """Root of every error peagle-tune raises on purpose."""


class UsageError(PeagleError):
    """The user asked for something invalid (unknown model or GPU, K out of range, bad option). CLI exit code 2."""


class NotFoundError(UsageError):
    """Nothing stored matches what was asked for (a recommendation id, a study, a profile). CLI exit code 3, the one
    code for "not found" (the message says what to run to make or list it)."""


class UnknownModelError(UsageError):
    """A model, drafter or GPU name that is in no catalog and is not a local path."""


class ConfigError(UsageError):
    """A speculative configuration that vLLM would reject or that makes no sense (K out of range, ...)."""


class WorkloadError(UsageError):
    """A workload file that cannot be read or has a malformed record (message names file and line)."""


class BackendUnavailableError(PeagleError):
    """The requested backend cannot run here (for example vLLM is not installed)."""


class StudyStorageError(PeagleError):
    """The Optuna storage of a search (--storage, or the --db database) cannot be opened."""


class PrivateDirectoryError(PeagleError):
    """A directory peagle-tune writes run files into (serve's run directory, drafter aliases) is not private to this
    user (a symlink, owned by someone else, writable by others) or cannot be written; the message names the path,
    the problem and what to do."""


class ServerExitedError(PeagleError):
    """``vllm serve`` stopped without being asked to (its engine died, it failed to start or it exited on its own);
    the message says when, with which exit status, and where its log is."""
