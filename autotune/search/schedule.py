"""Batch-size -> K schedules: the best depth per batch size, merged into vLLM's inclusive ranges.

Pure logic over a goodput function; the caller decides whether that function is predicted (model backend, fitted
profile) or measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleEntry:
    """Batch sizes ``batch_min..batch_max`` (inclusive) are served at depth ``k`` (0 = no speculation)."""

    batch_min: int
    batch_max: int
    k: int

    def as_vllm(self) -> list[int]:
        """vLLM's ``num_speculative_tokens_per_batch_size`` entry: ``[range_start, range_end, K]``."""
        return [self.batch_min, self.batch_max, self.k]


def best_depth_per_batch(
    goodput: Callable[[int, int], float], batch_sizes: Sequence[int], ks: Sequence[int], margin: float = 0.0
) -> dict[int, int]:
    """For each batch size, the depth in `ks` with the highest goodput (tokens/s), by the search's pick rule
    (`autotune.search.compare.pick_tied`): depths within `margin` (relative; the figures' spread, `tie_margin`) of
    the best tie, and the smallest of them wins, which verifies fewer tokens for the same output.

    >>> best_depth_per_batch(lambda b, k: b * (1 + k) / (1 + 0.1 * b * k), [1, 64], [0, 1, 4])
    {1: 4, 64: 0}
    >>> best_depth_per_batch(lambda b, k: b * (1 + k) / (1 + 0.1 * b * k), [1], [0, 1, 4], margin=0.5)
    {1: 1}
    """
    from autotune.search.compare import pick_tied

    out: dict[int, int] = {}
    for b in batch_sizes:
        values = {k: goodput(b, k) for k in ks}
        out[b] = pick_tied(list(ks), values.__getitem__, max(margin, 1e-9), lambda k: k)[0]
    return out


def merge_schedule(best: dict[int, int], max_batch: int) -> list[ScheduleEntry]:
    """Merge per-batch-size depths (sampled at some batch sizes) into contiguous inclusive ranges covering
    1..max_batch. A sampled batch size's depth holds up to the next sampled size, the way a step function over
    the samples would.

    >>> merge_schedule({1: 5, 4: 5, 16: 3, 64: 0}, 128)
    [ScheduleEntry(batch_min=1, batch_max=15, k=5), ScheduleEntry(batch_min=16, batch_max=63, k=3), \
ScheduleEntry(batch_min=64, batch_max=128, k=0)]
    """
    if not best:
        return []
    points = sorted(b for b in best if b <= max_batch)
    if not points or points[0] != 1:
        # Batch 1 is always present in practice; extend the smallest sample down to 1.
        points = [1, *points] if points else [1]
        best = {**best, 1: best[min(best)]}
    entries: list[ScheduleEntry] = []
    for i, b in enumerate(points):
        end = points[i + 1] - 1 if i + 1 < len(points) else max_batch
        k = best[b]
        if entries and entries[-1].k == k:
            entries[-1] = ScheduleEntry(entries[-1].batch_min, end, k)
        else:
            entries.append(ScheduleEntry(b, end, k))
    return entries


def default_batch_sizes(max_batch: int) -> list[int]:
    """Powers of two up to `max_batch`, plus `max_batch` itself."""
    sizes = [1]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes
