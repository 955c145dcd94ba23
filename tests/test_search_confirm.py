"""What a search recommends when its best config's figure came from an engine set up differently (in-launch
measurement) and is confirmed by a fresh launch (`Backend.confirm`): the fresh figure is what is stored and exported;
a fresh launch that fails or loses to no speculation makes no speculation the recommendation. And which configs the
in-launch backend reads from a drafter's launch (pure rules, no engine).

The figures are the model backend's (gpt-oss-120b on an H200); the confirming launch is the same figure scaled, so
each expected outcome follows from the scale."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.backends.base import Backend
from autotune.backends.in_launch import DrafterKey, InLaunchBackend
from autotune.backends.model import ModelBackend
from autotune.backends.vllm import VLLMBackend
from autotune.measurement import Measurement
from autotune.search import DrafterChoice, Objective, Search, SearchSpace, make_strategy
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from store import Store

PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
SPACE = SearchSpace(drafters=(PEAGLE,), k_max=4, max_num_seqs=(64,), parallel_drafting="on")
SCENARIO = Scenario(concurrency=64)


class Confirming(Backend):
    """Predicted figures; `confirm` gives the best config's figure times `scale` (None: a failed launch)."""

    name = "confirming"

    def __init__(self, scale: float | None) -> None:
        self.inner = ModelBackend("gpt-oss-120b", "h200")
        self.scale = scale
        self.confirmed: list[SpecConfig] = []

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        return self.inner.measure(config, workload, scenario)

    def confirm(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement | None:
        self.confirmed.append(config)
        m = self.inner.measure(config, workload, scenario)
        if self.scale is None:
            return Measurement.failed(config, scenario, m.provenance, "out_of_memory", "CUDA out of memory")
        assert m.output_tokens_per_s is not None
        return dataclasses.replace(m, output_tokens_per_s=m.output_tokens_per_s * self.scale)


def _run(tmp_path: Path, backend: Confirming):
    tmp_path.mkdir(parents=True, exist_ok=True)
    search = Search(
        store=Store(f"sqlite:///{tmp_path / 'peagle.db'}"), backend=backend, model="openai/gpt-oss-120b",
        device="NVIDIA H200", workload=load_workload("mt-bench"), space=SPACE, objective=Objective(),
        strategy=make_strategy("grid"), study_prefix="confirm",
    )
    return search.run_scenario(SCENARIO)


def test_the_confirmed_figure_is_the_recommendation(tmp_path: Path) -> None:
    backend = Confirming(0.97)
    result = _run(tmp_path, backend)
    assert result.best.config.speculative and backend.confirmed == [result.best.config]
    in_launch = result.confirmation["in_launch_tokens_per_s"]
    assert result.best.output_tokens_per_s == in_launch * 0.97
    assert result.confirmation["recommended"] == "confirmed"
    assert abs(result.confirmation["ratio"] - 0.97) < 1e-9
    assert result.recommendation_metrics()["confirmation"]["ratio"] == result.confirmation["ratio"]
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    rid = store.add_recommendation(
        model="openai/gpt-oss-120b", gpu="NVIDIA H200", vllm_version=None, workload_name="mt-bench",
        workload_hash="x", objective="throughput", scenario=SCENARIO.to_dict(),
        best_config=result.best.config.to_dict(), metrics=result.recommendation_metrics(),
        provenance=result.best.provenance.to_dict(), pareto=[], schedule=[], class_policy={}, study="confirm",
    )
    assert store.get_recommendation(rid).metrics["confirmation"]["recommended"] == "confirmed"


def test_a_fresh_launch_slower_than_no_speculation_recommends_no_speculation(tmp_path: Path) -> None:
    probe = _run(tmp_path / "probe", Confirming(1.0))
    assert probe.baseline is not None and probe.baseline.output_tokens_per_s and probe.best.output_tokens_per_s
    # Just below the no-speculation figure once launched fresh.
    scale = 0.99 * probe.baseline.output_tokens_per_s / probe.best.output_tokens_per_s
    result = _run(tmp_path / "slow", Confirming(scale))
    assert not result.best.config.speculative
    assert result.confirmation["recommended"] == "no speculation"
    assert "loses to no speculation" in result.confirmation["why"]


def test_a_failed_fresh_launch_recommends_no_speculation(tmp_path: Path) -> None:
    result = _run(tmp_path, Confirming(None))
    assert not result.best.config.speculative
    assert result.confirmation["fresh_ok"] is False
    assert "out_of_memory" in result.confirmation["why"]


def _in_launch(concurrencies: tuple[int, ...] = (1, 8), ks: tuple[int, ...] = (1, 2, 3)) -> InLaunchBackend:
    return InLaunchBackend(VLLMBackend("/models/target"), [Scenario(concurrency=c) for c in concurrencies], ks,
                           load_workload("mt-bench"))


def test_closed_loop_configs_at_a_searched_depth_are_read_from_the_drafters_launch() -> None:
    backend = _in_launch()
    workload = load_workload("mt-bench")
    at8 = Scenario(concurrency=8)
    config = SpecConfig("eagle3", "org/head", 3, True, max_num_seqs=8)
    assert backend.in_launch(config, workload, at8)
    assert backend.in_launch(config.with_(max_num_seqs=16), workload, at8)  # a cap above the batch never binds
    assert not backend.in_launch(config.with_(max_num_seqs=4), workload, at8)  # queueing: its own launch
    assert not backend.in_launch(config.with_(max_num_batched_tokens=512), workload, at8)
    assert not backend.in_launch(config.with_(num_speculative_tokens=4), workload, at8)  # not in the launch
    assert not backend.in_launch(config, workload, Scenario(concurrency=4))  # not a scenario of the search
    assert not backend.in_launch(config, load_workload("humaneval"), at8)
    assert backend.k_max == 3 and backend.engine_max_num_seqs == 8


def test_planned_launches_count_one_per_drafter_mode_plus_the_baseline() -> None:
    backend = _in_launch()
    grids = [
        (Scenario(concurrency=c), [SpecConfig(max_num_seqs=c)] + [
            SpecConfig("eagle3", "org/head", k, pd, max_num_seqs=s) for k in (1, 2, 3) for pd in (True, False)
            for s in (c, max(c // 2, 1))
        ])
        for c in (1, 8)
    ]
    shared, own = backend.planned_launches(grids)
    assert shared == 3  # parallel, sequential, no speculation
    assert own == 6  # max_num_seqs 4 < concurrency 8: K 1..3 x two modes
    assert DrafterKey.of(SpecConfig()).label() == "no speculation"


def test_a_rerun_reads_the_confirmation_instead_of_launching_again(tmp_path: Path) -> None:
    first = _run(tmp_path, Confirming(0.97))
    again = Confirming(0.5)  # a second launch would give another figure
    second = _run(tmp_path, again)
    assert again.confirmed == []
    assert second.best.output_tokens_per_s == first.best.output_tokens_per_s
    assert second.confirmation == first.confirmation
