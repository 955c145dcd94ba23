"""Which configs the confirmation launches fresh when in-launch figures are estimates: on a device with FULL CUDA
graphs a phase below K_max ran PIECEWISE in its drafter's launch (a fresh launch at its K replays FULL), so every
config within that spread of the best is launched fresh (at most 3 per concurrency) and the pick is made on the fresh
figures; without FULL graphs (the CPU build: NONE) only the best is confirmed, as before. Pure rules, then a search
over a backend whose figures are set by hand (no engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.backends.base import Backend
from autotune.backends.model import ModelBackend
from autotune.measurement import Measurement
from autotune.search import DrafterChoice, Objective, Search, SearchSpace, make_strategy
from autotune.search.confirm import (
    Figure,
    confirmation_candidates,
    extra_confirmation_launches,
    figure_graph_mode,
    in_launch_spread,
)
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from policies._graphs import PIECEWISE_PENALTY_SHARE
from store import Store

SPREAD = PIECEWISE_PENALTY_SHARE  # 59.6 / 50.0 - 1 = 0.192 (vLLM #49548)


def _k(k: int) -> SpecConfig:
    return SpecConfig("eagle3", "org/head", k, True, max_num_seqs=8)


def test_only_the_launch_depth_replays_full_graphs_and_the_cpu_build_has_none() -> None:
    assert [figure_graph_mode("FULL_AND_PIECEWISE", k, 4) for k in (1, 3, 4)] == ["PIECEWISE", "PIECEWISE", "FULL"]
    assert figure_graph_mode("FULL_DECODE_ONLY", 0, 0) == "FULL"  # the launch without speculation: 1-token decodes
    assert figure_graph_mode("PIECEWISE", 4, 4) == "PIECEWISE"
    assert figure_graph_mode("NONE", 2, 4) == figure_graph_mode(None, 2, 4) == "NONE"


def test_with_full_graphs_the_piecewise_figures_within_their_spread_of_the_best_are_candidates() -> None:
    # Best K=4 (K_max, FULL) at 100 tok/s. Reach = figure x 1.192: K=3 at 90 -> 107.3, K=2 at 85 -> 101.3 (both above
    # 100), K=1 at 80 -> 95.4 (below).
    figures = [Figure(_k(4), 100.0), Figure(_k(3), 90.0, SPREAD), Figure(_k(2), 85.0, SPREAD),
               Figure(_k(1), 80.0, SPREAD)]
    assert confirmation_candidates(figures, _k(4)) == [_k(4), _k(3), _k(2)]
    assert confirmation_candidates(figures, _k(4), cap=2) == [_k(4), _k(3)]
    # A fourth figure within reach still leaves 3 launches: the highest reach wins the places.
    near = [*figures, Figure(_k(5), 99.0, SPREAD)]  # reach 118.0
    assert confirmation_candidates(near, _k(4)) == [_k(4), _k(5), _k(3)]


def test_without_full_graphs_only_the_best_is_confirmed() -> None:
    # NONE (CPU) or a PIECEWISE launch: a fresh launch runs as the drafter's launch did, so no figure has a spread.
    figures = [Figure(_k(4), 100.0), Figure(_k(3), 99.9), Figure(_k(2), 85.0)]
    assert confirmation_candidates(figures, _k(4)) == [_k(4)]
    with pytest.raises(ValueError, match="cap >= 1"):
        confirmation_candidates(figures, _k(4), cap=0)


def test_the_plan_counts_the_extra_launches_only_with_full_graphs() -> None:
    # 3 concurrencies with 4 configs below K_max each: 2 more per concurrency; one with a single such config: 1.
    assert extra_confirmation_launches("FULL_AND_PIECEWISE", [4, 4, 4]) == 6
    assert extra_confirmation_launches("FULL", [4, 1]) == 3
    assert extra_confirmation_launches("NONE", [4, 4, 4]) == 0
    assert extra_confirmation_launches("PIECEWISE", [4]) == 0


# ---- a search: the figures a drafter's launch gives, and what fresh launches give ------------------------------

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=4)
SPACE = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(8,), parallel_drafting="on")
SCENARIO = Scenario(concurrency=8)
IN_LAUNCH = {0: 100.0, 1: 120.0, 2: 135.0, 3: 140.0, 4: 150.0}
"""tok/s per K in the drafters' launches (0: no speculation). With FULL graphs: K=3 reaches 140 x 1.192 = 166.9 and
K=2 160.9, above the best's 150; K=1 143.0 is not."""
FRESH = {1: 125.0, 2: 148.0, 3: 161.0, 4: 150.0}
"""tok/s of fresh launches: K=3 gains 15% with FULL graphs and beats K=4."""


class Launches(Backend):
    """Figures from `IN_LAUNCH` (model-backend measurements with the tokens/s replaced), tagged as in-launch with
    `graph_mode` the launch's CUDA-graph mode; `confirm` gives `FRESH` for speculative configs."""

    name = "launches"

    def __init__(self, graph_mode: str, in_launch: dict[int, float] = IN_LAUNCH,
                 fresh: dict[int, float] = FRESH) -> None:
        self.inner = ModelBackend("gpt-oss-120b", "h200")
        self.graph_mode = graph_mode
        self.in_launch, self.fresh = in_launch, fresh
        self.confirmed: list[int] = []

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        m = self.inner.measure(config, workload, scenario)
        k = config.k if config.speculative else 0
        provenance = dataclasses.replace(m.provenance, cudagraph_mode=self.graph_mode)
        launch_k = SPACE.k_max if config.speculative else 0
        extra = {"in_launch": {"depth": k, "graph_mode": figure_graph_mode(self.graph_mode, k, launch_k)}}
        return dataclasses.replace(m, output_tokens_per_s=self.in_launch[k], provenance=provenance, extra=extra,
                                   tpot_ms_p50=1000.0 / self.in_launch[k])

    def confirm(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement | None:
        if not config.speculative:
            return None
        self.confirmed.append(config.k)
        m = self.measure(config, workload, scenario)
        return dataclasses.replace(m, output_tokens_per_s=self.fresh[config.k], extra={"in_launch": None,
                                   "graph_mode": figure_graph_mode(self.graph_mode, config.k, config.k)})


def _search(tmp_path: Path, backend: Launches):
    search = Search(
        store=Store(f"sqlite:///{tmp_path / 'peagle.db'}"), backend=backend, model="openai/gpt-oss-120b",
        device="NVIDIA H200", workload=load_workload("mt-bench"), space=SPACE, objective=Objective(),
        strategy=make_strategy("grid"), study_prefix="graphs",
    )
    return search.run_scenario(SCENARIO)


def test_with_full_graphs_the_pick_is_made_on_fresh_launches_of_the_candidates(tmp_path: Path) -> None:
    backend = Launches("FULL_AND_PIECEWISE")
    result = _search(tmp_path, backend)
    assert backend.confirmed == [4, 3, 2]  # the in-launch best, then the candidates by reach
    assert result.best.config.k == 3 and result.best.output_tokens_per_s == FRESH[3]
    note = result.confirmation
    assert note["recommended"] == "confirmed" and note["in_launch_best"] == "eagle3+pd K=4 (4L) seqs=8"
    assert note["launches"] == 3 and note["graph_mode"] == "FULL_AND_PIECEWISE"
    assert [(c["in_launch_graph_mode"], c["fresh_graph_mode"], c["spread"]) for c in note["candidates"]] == [
        ("FULL", "FULL", 0.0), ("PIECEWISE", "FULL", SPREAD), ("PIECEWISE", "FULL", SPREAD)]
    assert abs(note["ratio"] - FRESH[3] / IN_LAUNCH[3]) < 1e-9
    assert in_launch_spread(result.best) == 0.0  # the stored figure is the fresh one: no spread left
    from autotune.cli.search import _confirmation_text

    text = _confirmation_text(note)
    assert text.startswith("eagle3+pd K=3 (4L) seqs=8 confirmed: 161.0 tok/s in a fresh launch against 140.0")
    assert "fresh launches of 3 of 3 candidates (in-launch best eagle3+pd K=4 (4L) seqs=8" in text


def test_without_full_graphs_the_confirmation_launches_the_best_alone(tmp_path: Path) -> None:
    backend = Launches("NONE")
    result = _search(tmp_path, backend)
    assert backend.confirmed == [4]
    assert result.best.config.k == 4 and result.best.output_tokens_per_s == FRESH[4]
    assert result.confirmation["launches"] == 1 and "candidates" not in result.confirmation


@pytest.mark.parametrize(("fresh_k1", "best_k"), [(95.0, 0), (110.0, 1)])
def test_no_speculation_best_in_launch_is_kept_unless_a_candidate_beats_it_fresh(
    tmp_path: Path, fresh_k1: float, best_k: int
) -> None:
    # No speculation 100 tok/s (its launch replays FULL graphs: no spread); K=1 at 90 in-launch reaches 107.3 with
    # FULL graphs, so it is launched fresh; K=2..4 (reach 83.4 at most) are not.
    in_launch = {0: 100.0, 1: 90.0, 2: 70.0, 3: 65.0, 4: 60.0}
    backend = Launches("FULL_AND_PIECEWISE", in_launch, {1: fresh_k1, 2: 0.0, 3: 0.0, 4: 60.0})
    result = _search(tmp_path, backend)
    assert backend.confirmed == [1]
    note = result.confirmation
    assert note["launches"] == 1 and len(note["candidates"]) == 2
    if best_k == 0:
        assert not result.best.config.speculative and result.best.output_tokens_per_s == 100.0
        assert note["recommended"] == "kept"
    else:
        assert result.best.config.k == 1 and result.best.output_tokens_per_s == fresh_k1
        assert note["recommended"] == "confirmed"


def _plan(monkeypatch: pytest.MonkeyPatch, graph_mode: str | None) -> tuple[dict[str, int], list[str]]:
    """The in-launch plan of 2 concurrencies over `SPACE`'s drafter, K 1..4, with a fresh launch's graph mode
    `graph_mode` (None: this machine's prediction)."""
    from autotune.backends.vllm import VLLMBackend
    from autotune.search import session

    if graph_mode is not None:
        monkeypatch.setattr(session, "_fresh_graph_mode", lambda fresh, config: graph_mode)
    scenarios = [Scenario(concurrency=c) for c in (1, 8)]
    spaces = [dataclasses.replace(SPACE, max_num_seqs=(c,)) for c in (1, 8)]
    notes: list[str] = []
    _, planned = session._in_launch(VLLMBackend("/models/target"), spaces, scenarios, load_workload("mt-bench"),
                                    notes)
    return planned, notes


def test_the_plan_says_how_many_launches_full_graphs_add(monkeypatch: pytest.MonkeyPatch) -> None:
    planned, notes = _plan(monkeypatch, "FULL_AND_PIECEWISE")
    # 1 drafter launch + 1 without speculation; 1 confirmation per concurrency; K 1..3 lie below K_max = 4 at each
    # concurrency, so up to 2 more each.
    assert planned == {"in_launch": 2, "confirmation": 2, "confirmation_graphs": 4, "own": 0, "total": 8}
    (line,) = [n for n in notes if n.startswith("Launches planned")]
    assert "+ up to 2 to confirm" in line and "+ up to 4 more: with FULL_AND_PIECEWISE CUDA graphs" in line


def test_on_this_cpu_the_plan_adds_no_confirmation_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.engine import engine_device

    if engine_device() != "cpu":
        pytest.skip("this machine runs vLLM on a GPU")
    planned, notes = _plan(monkeypatch, None)  # predicted for this machine: NONE
    assert planned["confirmation_graphs"] == 0 and planned["total"] == 4
    assert any(n.endswith("a fresh launch of exactly that config.") for n in notes)
