"""The numbers behind each report figure, derived from stored records (no plotting here).

Each ``*Data`` object carries its own provenance line (`caption`): what was measured (device, vLLM version, date) or
predicted (model backend, GPU assumed, profile used). Builders never raise for missing optional inputs; they return
None and the report says why in `notes`.

One module per kind of figure: `_acceptance` (acceptance per position, AL(K)), `_throughput` (step time T(B, K) and
tokens/s against K, from a profile or the model backend), `_studies` (trials and Pareto fronts), `_simulations`
(stored simulations), `_recommendations` (per-drafter rows, P-EAGLE's advantage over EAGLE-3); `_labels` holds the
names and provenance lines they share.
"""

from __future__ import annotations

from autotune.report._series._acceptance import (
    AcceptanceData,
    ClassAcceptance,
    acceptance_from_catalog,
    acceptance_from_profile,
)
from autotune.report._series._labels import config_label, kind_of, profile_label, provenance_caption, short_name
from autotune.report._series._recommendations import (
    AdvantageData,
    DrafterRow,
    advantage_data,
    distinct,
    drafter_rows,
    published_advantage,
)
from autotune.report._series._simulations import (
    SCHEDULE_LINE,
    SimulationData,
    is_simulation_study,
    simulation_data,
)
from autotune.report._series._studies import StudyData, TrialPoint, objective_directions, slos_of, study_data
from autotune.report._series._throughput import (
    GoodputData,
    StepCostData,
    backend_context,
    goodput_from_backend,
    goodput_from_profile,
    step_cost_from_backend,
    step_cost_from_profile,
)

__all__ = [
    "SCHEDULE_LINE",
    "AcceptanceData",
    "AdvantageData",
    "ClassAcceptance",
    "DrafterRow",
    "GoodputData",
    "SimulationData",
    "StepCostData",
    "StudyData",
    "TrialPoint",
    "acceptance_from_catalog",
    "acceptance_from_profile",
    "advantage_data",
    "backend_context",
    "config_label",
    "distinct",
    "drafter_rows",
    "goodput_from_backend",
    "goodput_from_profile",
    "is_simulation_study",
    "kind_of",
    "objective_directions",
    "profile_label",
    "provenance_caption",
    "published_advantage",
    "short_name",
    "simulation_data",
    "slos_of",
    "step_cost_from_backend",
    "step_cost_from_profile",
    "study_data",
]
