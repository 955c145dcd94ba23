"""`peagle-tune report`: PNG figures and one self-contained HTML page that explain a tuning result.

``write_report(store, out_dir)`` draws acceptance per draft position, AL(K), the step-cost surface T(B, K), predicted
tokens/s against K per batch size, and the trials (and Pareto fronts) of every study, then writes ``index.html``
with the recommended ``--speculative-config`` at the top. Every figure says whether it is measured (device, vLLM
version, date) or predicted (model backend, GPU assumed, profile used).
"""

from __future__ import annotations

from autotune.report._plots import (
    plot_acceptance,
    plot_acceptance_length,
    plot_goodput,
    plot_pareto,
    plot_step_cost,
    plot_trials,
)
from autotune.report._report import INDEX, write_report
from autotune.report._series import (
    AcceptanceData,
    ClassAcceptance,
    GoodputData,
    StepCostData,
    StudyData,
    TrialPoint,
    acceptance_from_catalog,
    acceptance_from_profile,
    goodput_from_profile,
    objective_directions,
    slos_of,
    step_cost_from_profile,
    study_data,
)

__all__ = [
    "INDEX",
    "AcceptanceData",
    "ClassAcceptance",
    "GoodputData",
    "StepCostData",
    "StudyData",
    "TrialPoint",
    "acceptance_from_catalog",
    "acceptance_from_profile",
    "goodput_from_profile",
    "objective_directions",
    "plot_acceptance",
    "plot_acceptance_length",
    "plot_goodput",
    "plot_pareto",
    "plot_step_cost",
    "plot_trials",
    "slos_of",
    "step_cost_from_profile",
    "study_data",
    "write_report",
]
