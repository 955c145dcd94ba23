"""In-launch measurement: every static K of one drafter measured in ONE engine launch.

An engine started at K_max drafts and verifies exactly K <= K_max when every request carries the depth cap K
(``peagle_max_k``, which the scheduler plugin applies; its worker extension makes the drafter draft only that
width). So the first config of a (method, drafter, parallel drafting) that a search asks for launches one engine at
K_max, which runs, for every scenario of the search and every K of the space, the scenario's requests class by class,
closed-loop at the scenario's concurrency, with vLLM's prefix cache emptied before each phase (a fresh engine starts
empty). One launch without speculation measures the baseline the same way. Every later config of that drafter is
read from its launch.

In-launch: configs whose max_num_seqs is at or above the concurrency (closed loop: the batch never exceeds the
concurrency, so the cap does not bind), with vLLM's default max_num_batched_tokens, at a scenario of the search, with
a K of the space. Anything else gets a fresh launch of its own (`VLLMBackend`).

An engine started at K_max is not one started at K: parallel drafting reserves K_max extra KV slots per request at
init, and CUDA graphs are captured for K_max shapes (FULL graphs replay only for uniform 1 + K_max decode steps: a
phase below K_max runs PIECEWISE, ``extra["in_launch"]["graph_mode"]``). `InLaunchBackend.confirm` therefore
launches the recommended config fresh (with FULL graphs, the candidates within the PIECEWISE spread of it too:
`autotune.search.confirm`), so what is exported is what was measured; `benchmarks/bench_in_launch.py` compares the
two.

Before its first measured phase a launch runs every (K, concurrency) it measures for a couple of decode steps
(`autotune.profiling.shape_warmup`), so a first use (a Triton compile per drafting width on a GPU, the allocator
growing) lands in no figure; a first phase still slower than the later ones of its shape is reported
(``extra["in_launch"]["first_phase_outliers"]``, a warning line in the progress).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.base import Backend, Capabilities
from autotune.backends.vllm import VLLMBackend, select_requests
from autotune.engine import EngineOptions, measured_provenance, require_vllm
from autotune.errors import ConfigError
from autotune.measurement import FailureKind, Measurement, Provenance
from autotune.search.confirm import figure_graph_mode
from autotune.spec import Method, Scenario, SpecConfig
from autotune.workloads import Workload

__all__ = ["DrafterKey", "InLaunchBackend"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DrafterKey:
    """What one launch serves: a drafter with its method and drafting mode (drafter None: no speculation)."""

    method: Method | None = None
    drafter: str | None = None
    parallel_drafting: bool = False
    tensor_parallel_size: int = 1

    @classmethod
    def of(cls, config: SpecConfig) -> DrafterKey:
        tp = config.tensor_parallel_size
        if not config.speculative:
            return cls(tensor_parallel_size=tp)
        return cls(config.method, config.drafter, config.parallel_drafting, tp)

    def label(self) -> str:
        if self.drafter is None:
            return "no speculation"
        return f"{self.drafter} ({self.method}{', parallel drafting' if self.parallel_drafting else ''})"


@dataclass
class _Launch:
    """One launch's figures: engine report per (K, scenario) in the offline job's format, or why it failed."""

    ok: bool
    provenance: Provenance
    reports: dict[tuple[int, Scenario], dict[str, Any]] = field(default_factory=dict)
    failure: tuple[FailureKind, str, str | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class InLaunchBackend(Backend):
    """Measures a search's static configs from one engine launch per drafter (plus one without speculation);
    configs that cannot be measured that way, and confirmations, go to `fresh` (one launch each).

    Args:
        fresh: the `VLLMBackend` whose model and engine options every launch uses.
        scenarios: the search's scenarios; each launch measures all of them.
        ks: the depths of the space; the engine is started at their maximum.
        workload: the search's workload (another workload gets fresh launches).
        progress: called with one line per launch.
    """

    name = "vllm"
    capabilities = Capabilities(launches_engines=True)

    def __init__(
        self,
        fresh: VLLMBackend,
        scenarios: Sequence[Scenario],
        ks: Sequence[int],
        workload: Workload,
        progress: Progress | None = None,
    ) -> None:
        if fresh.mode != "offline":
            raise ConfigError("in-launch measurement runs closed-loop phases offline; use VLLMBackend(mode='offline').")
        if not scenarios or not ks or min(ks) < 1:
            raise ConfigError(f"in-launch measurement needs scenarios and depths >= 1, but got {list(ks)}.")
        self.fresh = fresh
        self.scenarios = tuple(dict.fromkeys(scenarios))
        self.ks = tuple(sorted(set(ks)))
        self.workload_hash = workload.content_hash()
        self.say = progress or (lambda _line: None)
        self._launches: dict[DrafterKey, _Launch] = {}
        self._count = 0

    # -- what the search sees ----------------------------------------------------------------------------------
    @property
    def options(self) -> EngineOptions:  # type: ignore[override]
        return self.fresh.options

    @property
    def target_model(self) -> str:
        return self.fresh.model

    @property
    def engine_launches(self) -> int:
        return self._count

    @property
    def k_max(self) -> int:
        return self.ks[-1]

    @property
    def engine_max_num_seqs(self) -> int:
        return max(s.concurrency for s in self.scenarios)

    def in_launch(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> bool:
        """Whether `config` at `scenario` is read from its drafter's launch (else it gets a fresh launch)."""
        return self._fits(config, scenario) and workload.content_hash() == self.workload_hash

    def _fits(self, config: SpecConfig, scenario: Scenario) -> bool:
        return (
            scenario in self.scenarios
            and scenario.request_rate is None
            and config.max_num_batched_tokens is None
            and config.max_num_seqs >= scenario.concurrency
            and (not config.speculative or config.k in self.ks)
        )

    def planned_launches(self, grids: Sequence[tuple[Scenario, Sequence[SpecConfig]]]) -> tuple[int, int]:
        """(launches that measure in-launch, configs that need a launch of their own) for measuring every config of
        each scenario's grid."""
        keys: set[DrafterKey] = set()
        own = 0
        for scenario, configs in grids:
            for config in configs:
                if self._fits(config, scenario):
                    keys.add(DrafterKey.of(config))
                    keys.add(DrafterKey(tensor_parallel_size=config.tensor_parallel_size))  # the baseline's launch
                else:
                    own += 1
        return len(keys), own

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        """`config` at `scenario`: from its drafter's launch (made on first use), or a fresh launch of its own."""
        require_vllm("The vllm backend", ", or use the model backend (--backend model)")
        if not self.in_launch(config, workload, scenario):
            return self._fresh(config, workload, scenario)
        try:
            self.fresh.validate(config)
        except ConfigError as exc:
            return Measurement.failed(config, scenario, measured_provenance(), "invalid_config", str(exc))
        key = DrafterKey.of(config)
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = self._launch(key, workload)
        if not launch.ok:
            assert launch.failure is not None
            kind, reason, log = launch.failure
            m = Measurement.failed(config, scenario, launch.provenance, kind, f"the launch of {key.label()}: {reason}",
                                   log)
            m.extra["in_launch"] = dict(launch.info)
            return m
        k = config.k if config.speculative else 0
        launch_k = self.k_max if key.drafter is not None else 0
        extra: dict[str, Any] = {
            "mode": "offline",
            "engine_max_num_seqs": self.engine_max_num_seqs,
            # FULL graphs replay only at the launch's K: a phase below it ran PIECEWISE (`autotune.search.confirm`).
            "in_launch": {**launch.info, "depth": k,
                          "graph_mode": figure_graph_mode(launch.provenance.cudagraph_mode, k, launch_k)},
        }
        return self.fresh.measurement(config, scenario, launch.provenance, launch.reports[(k, scenario)], extra)

    def confirm(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement | None:
        """A fresh launch of exactly `config`, unless its figure already came from one set up that way: a config
        measured fresh, or no speculation (its launch differs from a fresh one in max_num_seqs, which does not bind
        in a closed loop, and in the scheduler plugin, which only records step times there)."""
        if not self.needs_confirmation(config, workload, scenario):
            return None
        self.say(f"confirming {config.label()} at concurrency {scenario.concurrency} with a fresh launch")
        return self._fresh(config, workload, scenario)

    def needs_confirmation(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> bool:
        """Whether `confirm` launches: a speculative config whose figure came from its drafter's launch."""
        return config.speculative and self.in_launch(config, workload, scenario)

    # -- launches ----------------------------------------------------------------------------------------------
    def _fresh(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        self._count += 1
        m = self.fresh.measure(config, workload, scenario)
        m.extra["in_launch"] = None
        k = config.k if config.speculative else 0
        m.extra["graph_mode"] = figure_graph_mode(m.provenance.cudagraph_mode, k, k)
        return m

    def _phases(self, workload: Workload, depths: Sequence[int]) -> tuple[list[dict[str, Any]], list[Any]]:
        """The launch's phases (scenario by scenario, depth by depth, class by class) and what each one measures:
        (depth, scenario, class)."""
        phases: list[dict[str, Any]] = []
        keys: list[Any] = []
        for scenario in self.scenarios:
            classes = select_requests(workload, scenario.num_prompts)
            for k in depths:
                for cls, requests in classes.items():
                    phases.append({
                        "name": f"k{k}",
                        "concurrency": scenario.concurrency,
                        "max_k": k if k else None,
                        "reset_prefix_cache": True,
                        "requests": [{"class": cls, **r.to_dict()} for r in requests],
                    })
                    keys.append((k, scenario, cls))
        return phases, keys

    def _launch(self, key: DrafterKey, workload: Workload) -> _Launch:
        from autotune.profiling import (
            first_phase_outliers,
            outlier_warning,
            plugin_provenance,
            run_plugin_job,
            shape_warmup,
            warmup_cost,
        )
        from policies.plugin import PluginConfig

        depths: Sequence[int] = self.ks if key.drafter is not None else (0,)
        tp = key.tensor_parallel_size
        config = SpecConfig(tensor_parallel_size=tp) if key.drafter is None else SpecConfig(
            key.method or "eagle3", key.drafter, self.k_max, key.parallel_drafting, tensor_parallel_size=tp
        )
        seqs = self.engine_max_num_seqs
        phases, keys = self._phases(workload, depths)
        # Every (K, concurrency) the launch measures runs a couple of decode steps first (`shape_warmup`).
        warmup = shape_warmup(workload.requests(), (s.concurrency for s in self.scenarios), depths)
        self._count += 1
        what = f"K_max={self.k_max}, K in {list(depths)}" if key.drafter is not None else "the baseline"
        self.say(f"launching vLLM for {key.label()}: {what}, {len(phases)} phases after a warm-up of "
                 f"{warmup_cost(warmup)}")
        kwargs = self.fresh.options.llm_kwargs(config, max_num_seqs=seqs)
        provenance = plugin_provenance(self.fresh.options.llm_kwargs(config, max_num_seqs=seqs, engine_paths=False),
                                       self.fresh.options)
        run = run_plugin_job(self.fresh.model, kwargs, phases, PluginConfig(mode="static"), warmup=warmup,
                             options=self.fresh.options, log_dir=self.fresh.log_dir)
        info: dict[str, Any] = {"engine_k": config.k, "engine_max_num_seqs": seqs, "launch": self._count,
                                "load_s": (run.result.get("timings") or {}).get("load_s"), "total_s": run.total_s}
        if run.stats is not None and key.drafter is not None:
            width = run.stats.info.get("drafter_width")
            info["drafts_only_planned_width"] = bool(run.stats.info.get("lower_drafting_depth"))
            if isinstance(width, dict) and width.get("fallback"):
                info["drafter_width_fallback"] = str(width["fallback"])
        if not run.ok:
            reason = run.failure_reason or "the engine failed"
            return _Launch(False, provenance, failure=(run.failure_kind or "engine_died", reason, run.log_tail),
                           info=info)
        info["warmup"] = run.result.get("warmup", [])
        info["first_phase_outliers"] = first_phase_outliers(run.result["phases"])
        for outlier in info["first_phase_outliers"]:
            self.say(outlier_warning(outlier))
        reports: dict[tuple[int, Scenario], dict[str, Any]] = {}
        for (k, scenario, cls), phase in zip(keys, run.result["phases"], strict=True):
            report = reports.setdefault((k, scenario), {"classes": {}, "timings": run.result.get("timings", {})})
            report["classes"][cls] = {
                "wall_s": phase["wall_s"], "num_requests": phase["num_requests"],
                "output_tokens": phase["output_tokens"], "ttft_ms": phase["ttft_ms"], "tpot_ms": phase["tpot_ms"],
                "spec": phase["spec"],
            }
        return _Launch(True, provenance, reports, info=info)
