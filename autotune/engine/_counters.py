"""vLLM's speculative-decoding counters, read the two ways vLLM offers them, in one snapshot shape.

A snapshot is ``{"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position"}``: cumulative
counts summed over engines (label sets). Offline workers read ``LLM.get_metrics()`` (`snapshot_from_metrics`), the
serve-mode client reads the ``/metrics`` text (`snapshot_from_prometheus`); a measured phase is the `spec_delta` of the
snapshots around it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SPEC_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")

#: ``LLM.get_metrics()`` names (Counters) -> snapshot fields; Prometheus adds ``_total`` to counter samples.
_COUNTERS = {f"vllm:spec_decode_{field}": field for field in SPEC_FIELDS}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def empty_snapshot() -> dict[str, Any]:
    """A snapshot with every counter at 0 and no positions."""
    return {**dict.fromkeys(SPEC_FIELDS, 0), "accepted_per_position": []}


def add_positions(total: list[int], values: Iterable[int]) -> list[int]:
    """Add `values` to `total` position by position, growing `total` with zeros; returns `total`.

    >>> add_positions([3, 1], [1, 1, 1])
    [4, 2, 1]
    """
    for i, v in enumerate(values):
        if i == len(total):
            total.append(0)
        total[i] += int(v)
    return total


def snapshot_from_metrics(metrics: Iterable[Any]) -> dict[str, Any]:
    """Sum vLLM's cumulative speculative counters over label sets from ``LLM.get_metrics()`` (Counter objects with
    ``.value``; the per-position Vector with ``.values``)."""
    snap = empty_snapshot()
    for m in metrics:
        if m.name in _COUNTERS:
            snap[_COUNTERS[m.name]] += int(m.value)
        elif m.name == _PER_POSITION:
            add_positions(snap["accepted_per_position"], m.values)
    return snap


def snapshot_from_prometheus(text: str) -> dict[str, Any]:
    """Sum vLLM's speculative counters over engines from Prometheus text (the ``/metrics`` body).

    Example: ``vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 93.0`` gives ``num_drafts == 93``;
    ``vllm:spec_decode_num_accepted_tokens_per_pos_total{...,position="1"} 3.0`` gives
    ``accepted_per_position[1] == 3``.
    """
    from prometheus_client.parser import text_string_to_metric_families  # installed with vLLM

    snap = empty_snapshot()
    per_pos: dict[int, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in _COUNTERS and sample.name.endswith("_total"):
                snap[_COUNTERS[name]] += int(sample.value)
            elif name == _PER_POSITION and sample.name.endswith("_total") and "position" in sample.labels:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0) + int(sample.value)
    size = max(per_pos) + 1 if per_pos else 0
    snap["accepted_per_position"] = [per_pos.get(i, 0) for i in range(size)]
    return snap


def spec_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """``after - before`` per counter and per draft position (`before` may have fewer positions: vLLM reports no
    per-position vector before the first speculative step)."""
    out: dict[str, Any] = {k: after[k] - before[k] for k in SPEC_FIELDS}
    b, a = list(before["accepted_per_position"]), after["accepted_per_position"]
    b += [0] * (len(a) - len(b))
    out["accepted_per_position"] = [x - y for x, y in zip(a, b, strict=False)]
    return out
