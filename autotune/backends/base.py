"""The Backend interface: one method, like Optuna's samplers keep theirs small."""

from __future__ import annotations

import abc

from autotune.measurement import Measurement
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload


class Backend(abc.ABC):
    """Measures (vllm) or predicts (model) how one config serves one workload at one scenario."""

    name: str = "base"

    @abc.abstractmethod
    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """Return a Measurement. Failures (OOM, crash, invalid config, timeout) come back as
        ``Measurement.failed(...)``, never as an exception that would end a study."""
