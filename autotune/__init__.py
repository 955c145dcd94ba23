"""peagle-tune's offline side: catalogs, workloads, backends, profiling, search, export and the CLI."""

from __future__ import annotations

from autotune.errors import (
    BackendUnavailableError,
    ConfigError,
    PeagleError,
    UnknownModelError,
    UsageError,
    WorkloadError,
)
from autotune.measurement import Measurement, Provenance, SpecCounters
from autotune.spec import Scenario, SpecConfig

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
