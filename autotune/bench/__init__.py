"""`peagle-tune bench`: a recommendation served as it will be, measured by vLLM's own ``vllm bench serve``.

`plan_bench` decides the server (plain ``vllm serve`` with the exported arguments, or ``peagle-tune serve``) and the
benchmark's argv without starting anything; `run_bench` runs them and reads vLLM's result; `compare` puts the
measured figures beside the recommendation's (searched or predicted) with the error.
"""

from __future__ import annotations

from autotune.bench._figures import COMPARED, FigureError, compare, figures_from_result, stored_kind
from autotune.bench._plan import BenchPlan, Mode, dataset_rows, plan_bench
from autotune.bench._run import BenchRun, bench_provenance, run_bench

__all__ = [
    "COMPARED",
    "BenchPlan",
    "BenchRun",
    "FigureError",
    "Mode",
    "bench_provenance",
    "compare",
    "dataset_rows",
    "figures_from_result",
    "plan_bench",
    "run_bench",
    "stored_kind",
]
