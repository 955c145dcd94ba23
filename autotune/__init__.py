"""peagle-tune's offline side: catalogs, workloads, backends, profiling, search, export and the CLI."""

from __future__ import annotations

from autotune.config import Measurement, Provenance, Scenario, SpecConfig, SpecCounters
from autotune.exceptions import (
    BackendUnavailableError,
    ConfigError,
    PeagleError,
    UnknownModelError,
    UsageError,
    WorkloadError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "ConfigError",
    "Measurement",
    "PeagleError",
    "Provenance",
    "Scenario",
    "SpecConfig",
    "SpecCounters",
    "UnknownModelError",
    "UsageError",
    "WorkloadError",
]
