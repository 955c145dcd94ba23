"""Predicted step costs and throughput where nothing was measured: the model backend's roofline.

For catalog models on catalog GPUs only (the roofline needs their specs); every entry returns None when the model,
GPU or workload is unknown, so callers (serving, report) fall back to saying so. Every figure here is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import PeagleError
from autotune.spec import Scenario, SpecConfig
from policies import StepCostModel, StepSample

#: Batch sizes the roofline cost model is fitted at (up to the config's max_num_seqs).
ROOFLINE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class PredictedStepCosts:
    """Predicted step time T(B, K) per depth: ``lines[k] = [(batch size, ms), ...]`` (roofline, not measured)."""

    lines: dict[int, list[tuple[int, float]]]
    source: str
    """How the model backend prices a step (e.g. "roofline")."""
    device: str
    """The GPU assumed."""


def _roofline(model: str, gpu: str) -> Any | None:
    """The model backend for a catalog model on a catalog GPU, or None when either is unknown."""
    from autotune.backends.model import ModelBackend

    try:
        return ModelBackend(model, gpu)
    except (PeagleError, ValueError, KeyError):
        return None


def _at_depth(config: SpecConfig, k: int, baseline: SpecConfig) -> SpecConfig:
    """`config` at depth k; `baseline` (no speculation) at k = 0."""
    return config.with_(num_speculative_tokens=k) if k else baseline


def roofline_cost_model(model: str, device: str, spec: SpecConfig) -> StepCostModel | None:
    """A `StepCostModel` fitted to roofline predictions (predicted, not measured) for a catalog model on a catalog
    GPU, at batch sizes 1..min(256, max_num_seqs) and depths 0..K; None when either is not in the catalogs."""
    backend = _roofline(model, device)
    if backend is None:
        return None
    sizes = [b for b in ROOFLINE_BATCH_SIZES if b <= max(spec.max_num_seqs, 1)] or [1]
    baseline = SpecConfig(max_num_seqs=spec.max_num_seqs)
    try:
        samples = [
            StepSample(b, k, backend.predict_step_ms(_at_depth(spec, k, baseline), b))
            for b in sizes
            for k in range(spec.k + 1)
        ]
        return StepCostModel.fit(samples, sequential=not spec.parallel_drafting)
    except (PeagleError, ValueError, KeyError):
        return None


def predicted_step_costs(
    model: str, gpu: str, config: SpecConfig, batch_sizes: Sequence[int], max_k: int
) -> PredictedStepCosts | None:
    """Predicted step time of `config` at depths 0..max_k over `batch_sizes` (depths the roofline cannot price are
    left out); None when the model or GPU is unknown or no depth could be priced."""
    backend = _roofline(model, gpu)
    if backend is None:
        return None
    lines: dict[int, list[tuple[int, float]]] = {}
    for k in range(max_k + 1):
        c = _at_depth(config, k, SpecConfig())
        try:
            lines[k] = [(b, backend.predict_step_ms(c, b)) for b in batch_sizes]
        except PeagleError:
            continue
    return PredictedStepCosts(lines, backend.step_cost_source, backend.device) if lines else None


def predicted_goodput(
    model: str, gpu: str, workload: str, config: SpecConfig, batch_sizes: Sequence[int], max_k: int
) -> tuple[dict[int, list[float]], str] | None:
    """Predicted output tokens/s per batch size B (concurrency = max_num_seqs = B) at depths 0..max_k, NaN where the
    model backend rejects the config, and its provenance line; None when model, GPU or workload is unknown."""
    from autotune.workloads import load_workload

    backend = _roofline(model, gpu)
    try:
        loaded = load_workload(workload)
    except (PeagleError, OSError):
        return None
    if backend is None:
        return None
    values: dict[int, list[float]] = {}
    provenance = ""
    for b in batch_sizes:
        row = []
        for k in range(max_k + 1):
            c = _at_depth(config.with_(max_num_seqs=b), k, SpecConfig(max_num_seqs=b))
            m = backend.measure(c, loaded, Scenario(concurrency=b))
            row.append(float(m.output_tokens_per_s) if m.ok and m.output_tokens_per_s else math.nan)
            if k and m.ok and not provenance:
                provenance = m.provenance.describe()
        values[b] = row
    return values, provenance
