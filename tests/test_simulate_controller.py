"""The adaptive configs run the real `policies.DepthController` through the public `policies` API."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import policies
from autotune.simulate import (
    AcceptanceModel,
    Adaptive,
    FittedStepCost,
    NoSpeculation,
    Phase,
    ServingConfig,
    SimRequest,
    StaticDepth,
    run_configs,
    simulate,
)
from policies import AcceptanceProfile, ControllerSettings, RequestPolicy, StepCostModel

SIMULATE = Path(__file__).resolve().parent.parent / "autotune" / "simulate"

GOOD = AcceptanceProfile.from_survival([0.95, 0.9, 0.85, 0.8])
BAD = AcceptanceProfile.from_survival([0.0, 0.0, 0.0, 0.0])
# Verification is cheap per token, drafting a fixed cost: deep speculation pays for GOOD; BAD never accepts, so
# every verified BAD token is pure cost.
COST = StepCostModel({"base": 5.0, "per_request": 0.1, "per_verified_token": 0.1, "drafter_fixed": 1.0,
                      "drafter_per_request": 0.05})


def test_simulator_imports_only_public_policies_names() -> None:
    for path in sorted(SIMULATE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("policies"):
                assert node.module == "policies", f"{path.name} imports {node.module}"
                for alias in node.names:
                    assert alias.name in policies.__all__, f"{path.name} imports non-public {alias.name}"


def _phases(n: int = 16) -> list[Phase]:
    good = Phase("good", tuple(SimRequest(i, "good", 4, 60) for i in range(n)))
    bad = Phase("bad", tuple(SimRequest(n + i, "bad", 4, 60) for i in range(n)))
    return [good, bad]


def _policy(**settings: Any) -> RequestPolicy:
    return RequestPolicy(static_k=2, max_k=4, default_class="good", controller=ControllerSettings(**settings))


def test_controller_learns_deep_for_the_good_class_and_zero_for_the_bad_one() -> None:
    acc = AcceptanceModel({"good": GOOD, "bad": BAD}, 4, seed=0)
    adaptive = Adaptive(_policy(), COST, {"good": GOOD, "bad": BAD})
    run = simulate(_phases(), adaptive, FittedStepCost(COST), acc, concurrency=4)
    plan = run.rule_summary["final_plan"]
    assert plan["bad"] == 0
    assert plan["good"] == 4
    assert run.rule_summary["controller_steps"] > 0
    assert "controller_fallbacks" not in run.rule_summary


def test_controller_learns_online_without_priors() -> None:
    # No stored profile: the estimator starts uninformed and learns from the simulated steps it verifies.
    acc = AcceptanceModel({"good": GOOD, "bad": BAD}, 4, seed=1)
    run = simulate(_phases(24), Adaptive(_policy(), COST), FittedStepCost(COST), acc, concurrency=4)
    assert run.rule_summary["final_plan"]["bad"] <= 1


def test_drafter_width_control_skips_the_drafter_when_no_request_speculates() -> None:
    acc = AcceptanceModel({"good": GOOD, "bad": BAD}, 4, seed=2)
    bad_only = [Phase("bad", tuple(SimRequest(i, "bad", 4, 60) for i in range(12)))]
    priors = {"good": GOOD, "bad": BAD}
    trim = simulate(bad_only, Adaptive(_policy(), COST, priors), FittedStepCost(COST), acc, concurrency=4)
    width = simulate(bad_only, Adaptive(_policy(), COST, priors, drafter_width=True), FittedStepCost(COST), acc,
                     concurrency=4)
    assert trim.drafter_steps == trim.steps  # trimming: the drafter runs every step
    assert width.drafter_steps < width.steps / 2
    plain = simulate(bad_only, NoSpeculation(), FittedStepCost(COST), acc, concurrency=4)
    # Only exploration steps (every explore_every-th) and the first steps still draft: within 10% of no speculation.
    assert width.duration_ms < trim.duration_ms
    assert width.duration_ms == pytest.approx(plain.duration_ms, rel=0.10)


def test_adaptive_tracks_a_shift_between_static_extremes() -> None:
    # Shifting good -> bad: K=4 is best on the first phase, no speculation on the second; the controller should be
    # at least as good as the best single static config over the whole run.
    acc = AcceptanceModel({"good": GOOD, "bad": BAD}, 4, seed=3)
    configs: list[ServingConfig] = [NoSpeculation(), StaticDepth(1), StaticDepth(4),
                                    Adaptive(_policy(), COST, {"good": GOOD, "bad": BAD}, drafter_width=True)]
    rows = run_configs({"shift": _phases(24)}, lambda seqs: configs, FittedStepCost(COST), acc, concurrencies=[4])
    by = {r.config: r for r in rows}
    best_static = max(by[c].output_tokens_per_s for c in ("no speculation", "static K=1", "static K=4"))
    assert by["adaptive (drafter width)"].output_tokens_per_s >= 0.98 * best_static
    oracle = by["per-phase oracle"]
    assert oracle.notes["per_phase"] == ["static K=4", "no speculation"]
    assert oracle.output_tokens_per_s >= best_static
