"""The Backend interface: one method, like Optuna's samplers keep theirs small, plus what a backend declares about
itself (`Capabilities`, the engine it launches) so callers never branch on its name."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from autotune.measurement import Measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload

if TYPE_CHECKING:
    from autotune.engine import EngineOptions


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do."""

    predicts: bool = False
    """Its figures are predictions: the same config always gives the same figures, a measurement costs no engine,
    and it needs published acceptance figures for a drafter it has no profile of. A search then tells its sampler the
    objective is deterministic and evaluates extra configs freely (batch-size schedules, per-class depth caps)."""
    launches_engines: bool = False
    """Every measurement starts a fresh engine: a search counts them as launches, and only configs an engine can load
    (no hypothetical drafters) can be measured."""


class Backend(abc.ABC):
    """Measures (vllm) or predicts (model) how one config serves one workload at one scenario."""

    name: str = "base"
    """Short name, stored with every figure's provenance and a study's attributes (never branched on)."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    options: EngineOptions | None = None
    """How this backend launches engines (None: it launches none). Profiles taken for its trials use the same."""

    @property
    def target_model(self) -> str | None:
        """The target model an engine of this backend loads (a local directory or hub id); None: it loads none."""
        return None

    @property
    def engine_launches(self) -> int | None:
        """Engine launches this backend has made so far, when a measurement is not always one launch (a backend
        that measures many configs in one launch); None: every measurement of a launching backend is one launch."""
        return None

    def confirm(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement | None:
        """A fresh measurement of the config a search recommends, when this backend's figure of it came from an
        engine not set up exactly as that config would be (in-launch measurements); None: the figure stands."""
        return None

    def figure_inputs(self) -> str:
        """What a predicting backend's figures depend on besides the config and workload (constants, calibration,
        profiles), as text. Part of a study's fingerprint, so a refit or a new profile starts a new study instead of
        resuming one whose stored figures it would no longer give. Empty: nothing (measuring backends)."""
        return ""

    @abc.abstractmethod
    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """Return a Measurement. Failures (OOM, crash, invalid config, timeout) come back as
        ``Measurement.failed(...)``, never as an exception that would end a study."""
