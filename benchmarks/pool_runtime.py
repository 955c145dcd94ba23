"""Pool the per-round ratios of several `benchmarks.bench_runtime` runs (a script that prints figures, not a test).

Usage::

    python -m benchmarks.pool_runtime DIR [DIR ...]

``DIR``: a work directory of ``benchmarks.bench_runtime`` (its ``rounds.json``). Per run and workload, the best
static configuration (no speculation or static K=1..4) is the one with the highest median tok/s over the run's
rounds; each round then gives one ratio, adaptive (new) over that configuration in the same round. The entropic
phase (the shifting workload's second phase) is compared with no speculation, and so is the idle drafter (the
speculative engine pinned at depth 0, in runs that have it) there and on the stationary workload: the ceiling of
any controller where no speculation is best. Printed: each run's per-round ratios, then over all runs the median
with the interquartile range (linear interpolation). All figures are measured tok/s of the runs.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import quantile, tokens_per_s

STATIC = ("no speculation", "static K=1", "static K=2", "static K=3", "static K=4")
ADAPTIVE = "adaptive (new)"
IDLE = "idle drafter (depth 0)"
WORKLOADS = ("c1:shifting", "c1:stationary", "c8:shifting", "c8:stationary")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    pooled: dict[str, list[float]] = {}
    for workdir in argv:
        rounds = json.loads((Path(workdir) / "rounds.json").read_text())
        for key in WORKLOADS:
            if key not in rounds[ADAPTIVE][0]:
                continue
            median = {c: statistics.median(tokens_per_s(r[key]) for r in rounds[c]) for c in STATIC}
            best = max(median, key=lambda c: median[c])
            ratios = [tokens_per_s(a[key]) / tokens_per_s(b[key])
                      for a, b in zip(rounds[ADAPTIVE], rounds[best], strict=True)]
            pooled.setdefault(f"{key} vs best static", []).extend(ratios)
            print(f"{workdir} {key}: best static {best}; per round {', '.join(f'{x:.3f}' for x in ratios)}")
        for c in ("c8", "c1"):
            key = f"{c}:shifting"
            if key not in rounds[ADAPTIVE][0]:
                continue
            ratios = [tokens_per_s(a[key], 1) / tokens_per_s(b[key], 1)
                      for a, b in zip(rounds[ADAPTIVE], rounds["no speculation"], strict=True)]
            pooled.setdefault(f"{c} entropic phase vs no speculation", []).extend(ratios)
            print(f"{workdir} {c} entropic phase: per round {', '.join(f'{x:.3f}' for x in ratios)}")
            if rounds.get(IDLE):
                for name, index, wkey in (("entropic phase", 1, key), ("stationary", None, f"{c}:stationary")):
                    ratios = [tokens_per_s(a[wkey], index) / tokens_per_s(b[wkey], index)
                              for a, b in zip(rounds[IDLE], rounds["no speculation"], strict=True)]
                    pooled.setdefault(f"{c} {name}: idle drafter vs no speculation", []).extend(ratios)
                    print(f"{workdir} {c} {name}, idle drafter: per round {', '.join(f'{x:.3f}' for x in ratios)}")
    print("pooled (measured), median (interquartile range):")
    for name, values in pooled.items():
        print(f"  {name}: {statistics.median(values):.3f}x ({quantile(values, 0.25):.3f}-{quantile(values, 0.75):.3f}),"
              f" {len(values)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
