"""The CLI's tables: `peagle-tune search`'s results, drafter comparison and Pareto fronts (`_search`), and
`peagle-tune show`'s listings and the recommendations a selection must choose between (`_show`), on the cells,
legends and table shape they share (`_cells`). Drawing only: the numbers come from the library.

Designed for an 80-column terminal: few, well-chosen columns with short names (a drafter's repository name, the
GPU's catalog key), no borders but the header rule, and the details (full ids, p99s, trial counts, provenance) below
the table or in the ``--wide`` columns. Cells never hold raw JSON.
"""

from __future__ import annotations

from autotune.cli._tables._bench import bench_view, compare_rows, compare_view
from autotune.cli._tables._cells import (
    RISE_NOTE,
    config_text,
    fmt,
    model_alias,
    plain_table,
    short_gpu,
    titled,
)
from autotune.cli._tables._search import comparison_table, pareto_table, results_table, step_table
from autotune.cli._tables._show import (
    candidates_table,
    profiles_view,
    recommendations_view,
    studies_view,
    trials_view,
)

__all__ = [
    "RISE_NOTE",
    "bench_view",
    "candidates_table",
    "compare_rows",
    "compare_view",
    "comparison_table",
    "config_text",
    "fmt",
    "model_alias",
    "pareto_table",
    "plain_table",
    "profiles_view",
    "recommendations_view",
    "results_table",
    "short_gpu",
    "step_table",
    "studies_view",
    "titled",
    "trials_view",
]
