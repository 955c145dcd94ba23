"""peagle-tune's offline side: catalogs, workloads, backends, profiling, search, export and the CLI.

The names below are imported on first use (PEP 562), so `peagle-tune --help` and the light commands do not pay for
numpy and the measurement types they never touch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "BackendUnavailableError": "autotune.errors",
    "ConfigError": "autotune.errors",
    "PeagleError": "autotune.errors",
    "UnknownModelError": "autotune.errors",
    "UsageError": "autotune.errors",
    "WorkloadError": "autotune.errors",
    "Measurement": "autotune.measurement",
    "Provenance": "autotune.measurement",
    "SpecCounters": "autotune.measurement",
    "Scenario": "autotune.spec",
    "SpecConfig": "autotune.spec",
}

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


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
