"""Reading Optuna trials the way a search writes them: our attributes, which trials count, their config.

Every trial carries a dict of our attributes under the user attribute `ATTR` (``"peagle"``): the worker that
claimed it, the config, and once finished its status, metrics, measurement and provenance (see `Search`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import PeagleError
from autotune.measurement import Measurement
from autotune.search.space import SearchSpace
from autotune.spec import SpecConfig

#: Key of our per-trial attributes (a dict) in Optuna's trial user attributes.
ATTR = "peagle"

#: Names of the states a search counts, as events and results report them.
STATE_NAMES: dict[TrialState, str] = {
    TrialState.COMPLETE: "complete",
    TrialState.FAIL: "failed",
    TrialState.PRUNED: "pruned",
    TrialState.RUNNING: "running",
}


def trial_info(t: FrozenTrial) -> dict[str, Any]:
    """Our attributes of trial `t` ({} for a trial claimed without them)."""
    value = t.user_attrs.get(ATTR)
    return value if isinstance(value, dict) else {}


def counted(t: FrozenTrial) -> bool:
    """Does `t` use one of the study's trials: finished with a result, or running? (Duplicates of an already
    measured config and trials whose worker died do not.)"""
    info = trial_info(t)
    if info.get("duplicate_of") is not None:
        return False
    if t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and info.get("status") == "failed"


def state_counts(trials: Sequence[FrozenTrial]) -> dict[str, int]:
    """Counted trials per state name (complete, failed, pruned, running)."""
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    for t in trials:
        if counted(t):
            counts[STATE_NAMES[t.state]] += 1
    return counts


def feasible(t: FrozenTrial) -> bool:
    """Does `t` meet every SLO (every constraint value <= 0)?"""
    return all(v <= 0 for v in t.constraints.values())


def violation(t: FrozenTrial) -> float:
    """How far `t` is from meeting the SLOs: the sum of its positive constraint values, ms."""
    return sum(max(v, 0.0) for v in t.constraints.values())


def trial_config(space: SearchSpace, t: FrozenTrial) -> SpecConfig | None:
    """The config trial `t` measures: from our attributes, else from its (possibly enqueued) parameters; None when
    neither describes a config of `space`."""
    info = trial_info(t)
    if "config" in info:
        return SpecConfig.from_dict(info["config"])
    params = t.params or t.system_attrs.get("fixed_params") or {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return space.suggest(optuna.trial.FixedTrial(dict(params)))
    except (ValueError, KeyError, PeagleError):
        return None


def trial_measurement(t: FrozenTrial) -> Measurement | None:
    """The measurement stored with a complete trial, or None (not stored, or unreadable)."""
    data = trial_info(t).get("measurement")
    if data is None:
        return None
    try:
        return Measurement.from_dict(data)
    except (TypeError, ValueError, KeyError, PeagleError):
        return None


def slim(m: Measurement) -> dict[str, Any]:
    """A JSON-safe dict of a measurement for a trial attribute (the engine log tail is left out)."""
    data = m.to_dict()
    data["log_tail"] = None
    return json.loads(json.dumps(data, default=str))
