"""What a search will do before it launches anything (`peagle-tune search --plan`): the checkpoints and the GB they
download, the launches by kind, which GPUs run which launch, and the wall time and GPU-hours, as an estimate.

A launch's time is its start-up (`startup_s`: assumed rates per GB of weights, plus compile and graph capture) and
its measured phases: requests x output tokens at the throughput the model backend predicts (None where it cannot
predict, e.g. on a CPU). Workers take launches longest first; confirmations start once every drafter's launch has
measured (`assign`). Nothing here imports vLLM or starts an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import UsageError

#: What `startup_s` assumes, said with every estimate.
STARTUP_BASIS = {
    True: "~90 s of compile and CUDA-graph capture plus weights read at ~1 GB/s per launch",
    False: "~100 s per launch on a CPU plus weights read at ~0.5 GB/s",
}


def startup_s(weight_bytes: float, on_gpu: bool) -> float:
    """Seconds one engine launch takes to start (assumed, `STARTUP_BASIS`). Example: 66 GB on a GPU -> 156 s.
    On a CPU: a search of the fixtures (3 launches of 2 MB models, phases of a few tokens) took 313 s on 2 cores
    with vLLM 0.32's CPU build, ~100 s a launch."""
    return 90 + weight_bytes / 1e9 if on_gpu else 100 + weight_bytes / 0.5e9


def parse_gpus(text: str) -> list[str]:
    """``--gpus`` as device ids: ``0,1,2``, ranges ``0-7`` or both (``0-3,6``); each id once, in order given."""
    ids: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise UsageError(f"--gpus takes device ids such as 0,1,2 or 0-7, but got {text!r}.")
        for i in range(int(lo), int(hi or lo) + 1):
            if str(i) not in ids:
                ids.append(str(i))
    return ids


def worker_groups(device_ids: Sequence[str], tp: int) -> tuple[list[tuple[str, ...]], list[str]]:
    """(groups of `tp` device ids, one worker each; the ids left idle). Example: 8 ids at tp 3 -> 2 groups, 2 idle."""
    if len(device_ids) < tp:
        raise UsageError(f"--tensor-parallel-size {tp} needs {tp} GPUs, but --gpus gives {len(device_ids)}: "
                         f"{', '.join(device_ids) or 'none'}.")
    n = len(device_ids) // tp
    groups = [tuple(device_ids[i * tp:(i + 1) * tp]) for i in range(n)]
    return groups, list(device_ids[n * tp:])


@dataclass(frozen=True)
class LaunchUnit:
    """One engine launch of the search: a unit of work a worker claims."""

    kind: str
    """"drafter" (one drafter and drafting mode, every K), "baseline" (no speculation) or "confirmation"."""
    label: str
    startup_s: float
    phases_s: float | None
    """The measured phases at the predicted throughput; None: no prediction."""

    @property
    def stage(self) -> int:
        """1: drafter and baseline launches; 2: confirmations (they need every figure of stage 1)."""
        return 2 if self.kind == "confirmation" else 1

    @property
    def seconds(self) -> float:
        return self.startup_s + (self.phases_s or 0.0)


def assign(units: Sequence[LaunchUnit], workers: int) -> tuple[list[list[int]], float]:
    """(unit indexes per worker, wall seconds): each stage's units longest first to the worker free soonest; stage 2
    starts when stage 1 has ended on every worker. Example: units of 3, 2, 2 s on 2 workers -> [[0], [1, 2]], 4 s."""
    if workers < 1:
        raise ValueError("assign needs at least one worker")
    out: list[list[int]] = [[] for _ in range(workers)]
    wall = 0.0
    for stage in (1, 2):
        ends = [0.0] * workers
        todo = sorted((i for i, u in enumerate(units) if u.stage == stage), key=lambda i: -units[i].seconds)
        for i in todo:
            w = min(range(workers), key=lambda j: (ends[j], j))
            out[w].append(i)
            ends[w] += units[i].seconds
        wall += max(ends)
    return out, wall


@dataclass
class RunPlan:
    """A search's plan: what downloads, what launches where, and how long it should take (an estimate)."""

    device: str
    """The GPU (or CPU) of every worker, as the notes name it."""
    groups: list[tuple[str, ...]]
    idle: list[str]
    on_gpu: bool
    checkpoints: list[dict[str, Any]]
    """name, weight_bytes, download_bytes (None: unknown), source (what the sizes come from)."""
    units: list[LaunchUnit]
    throughput_source: str | None = None
    """Where the phases' throughput comes from (None: not predicted, phases left out)."""

    def __post_init__(self) -> None:
        self.assignment, self.wall_s = assign(self.units, max(len(self.groups), 1))

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.groups) + len(self.idle) if self.on_gpu else 0

    @property
    def gpu_hours(self) -> float:
        """GPU-hours held: the wall time on every GPU of the set (idle ones too: they are held)."""
        return self.wall_s / 3600 * self.gpus

    def counts(self) -> dict[str, int]:
        kinds = ("drafter", "baseline", "confirmation")
        return {k: sum(1 for u in self.units if u.kind == k) for k in kinds}

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimate": True, "device": self.device, "on_gpu": self.on_gpu,
            "workers": [{"devices": list(g), "launches": [self.units[i].label for i in self.assignment[w]]}
                        for w, g in enumerate(self.groups)],
            "idle_devices": self.idle, "checkpoints": self.checkpoints,
            "launches": [{"kind": u.kind, "label": u.label, "startup_s": round(u.startup_s, 1),
                          "phases_s": None if u.phases_s is None else round(u.phases_s, 1)} for u in self.units],
            "launch_counts": self.counts(), "wall_s": round(self.wall_s), "gpu_hours": round(self.gpu_hours, 2),
            "basis": self.basis(),
        }

    def basis(self) -> str:
        phases = (f"measured phases at {self.throughput_source}" if self.throughput_source else
                  "measured phases not included (no throughput prediction for this device)")
        return f"{STARTUP_BASIS[self.on_gpu]}; {phases}; downloads not included"

    def lines(self) -> list[str]:
        """The plan as note lines (wrapped by the caller)."""
        out = []
        for c in self.checkpoints:
            size = _gb(c["weight_bytes"])
            down = c["download_bytes"]
            get = "size unknown" if down is None else "nothing to download" if down == 0 else f"{_gb(down)} to download"
            out.append(f"Plan, checkpoint: {c['name']}: {size} of weights, {get} ({c['source']}).")
        n = self.counts()
        out.append(f"Plan, launches: {n['drafter']} drafter x mode (every K each), {n['baseline']} baseline, up to "
                   f"{n['confirmation']} confirmations; {len(self.units)} in all.")
        for w, group in enumerate(self.groups):
            where = f"GPU {','.join(group)}" if self.on_gpu else f"worker {w + 1}"
            launches = [self.units[i] for i in self.assignment[w]]
            busy = sum(u.seconds for u in launches)
            out.append(f"Plan, {where}: {len(launches)} launches, ~{_duration(busy)}: "
                       + "; ".join(u.label for u in launches) + ".")
        if self.idle:
            out.append(f"Plan: GPU {','.join(self.idle)} idle (fewer than --tensor-parallel-size left over).")
        held = f"{self.gpus} GPU{'s' * (self.gpus != 1)} held"
        hours = f", {self.gpu_hours:.1f} GPU-hours ({held})" if self.on_gpu else ""
        out.append(f"Plan, time (estimate): ~{_duration(self.wall_s)} wall{hours}; {self.basis()}.")
        return out


def _gb(n: float | None) -> str:
    return "? GB" if n is None else f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def phase_seconds(tokens: float, tokens_per_s: float | None) -> float | None:
    """Seconds a measured phase of `tokens` output tokens takes at `tokens_per_s` (None: unknown)."""
    if tokens_per_s is None or tokens_per_s <= 0:
        return None
    return tokens / tokens_per_s


def total_phases(parts: Sequence[float | None]) -> float | None:
    """The sum of a launch's phases, None when any is unknown."""
    return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


Predictor = Callable[[Any, Any], "float | None"]
"""(SpecConfig, Scenario) -> predicted output tokens/s, or None."""


def checkpoint_rows(found: Any) -> list[dict[str, Any]]:
    """`RunPlan.checkpoints` of the `Checkpoints` an engine loads (sizes from the cache or the hub's listing)."""
    return [{"name": c.name, "weight_bytes": c.weight_bytes, "download_bytes": c.missing_bytes,
             "source": "local directory" if c.source == "local" else "Hugging Face cache and hub listing"}
            for c in found.all]


def catalog_rows(model: Any, drafters: Sequence[Any], params: Any) -> list[dict[str, Any]]:
    """`RunPlan.checkpoints` from the catalog's parameter counts (a box not at hand downloads them all)."""
    from autotune.backends._drafter_cost import drafter_weight_params

    source = "predicted from the catalog; a fresh box downloads all"
    rows = [{"name": model.name, "weight_bytes": int(model.weight_bytes()),
             "download_bytes": int(model.weight_bytes()), "source": source}]
    for d in drafters:
        size = int(drafter_weight_params(d, model, params)[1] * params.drafter_bytes_per_param)
        rows.append({"name": d.name, "weight_bytes": size, "download_bytes": size, "source": source})
    return rows


def launch_units(
    spaces: Sequence[Any], scenarios: Sequence[Any], workload: Any, sizes: dict[str | None, float], on_gpu: bool,
    confirmations: int, predict: Predictor | None,
) -> list[LaunchUnit]:
    """The launches of an in-launch search (`autotune.backends.in_launch`): one per drafter and drafting mode
    measuring every K of the space at every scenario, one without speculation, and `confirmations` fresh launches
    (spread over the scenarios). `sizes`: weight bytes by drafter name (None: the target); `scenarios` as measured
    (their num_prompts); `predict`: tokens/s of a config at a scenario."""
    from autotune.backends.in_launch import DrafterKey
    from autotune.backends.vllm import select_requests
    from autotune.spec import SpecConfig

    tokens = {s: sum(r.max_tokens for rs in select_requests(workload, s.num_prompts).values() for r in rs)
              for s in scenarios}
    keys: dict[DrafterKey, list[Any]] = {}
    for space, scenario in zip(spaces, scenarios, strict=True):
        for config in space.grid():
            if config.max_num_seqs >= scenario.concurrency and config.max_num_batched_tokens is None:
                keys.setdefault(DrafterKey.of(config), []).append((config, scenario))
                keys.setdefault(DrafterKey(tensor_parallel_size=config.tensor_parallel_size), [])
    target = sizes.get(None, 0.0)

    def rate(config: Any, scenario: Any) -> float | None:
        return predict(config, scenario) if predict is not None else None

    units = []
    best: dict[Any, float | None] = {}
    for key, configs in keys.items():
        if key.drafter is None:
            tp = key.tensor_parallel_size
            parts = [phase_seconds(tokens[s], rate(SpecConfig(max_num_seqs=s.concurrency, tensor_parallel_size=tp), s))
                     for s in scenarios]
            units.append(LaunchUnit("baseline", "no speculation", startup_s(target, on_gpu), total_phases(parts)))
            continue
        seen = {(c.k, s) for c, s in configs}
        parts = []
        for k, s in sorted(seen, key=lambda ks: (ks[1].concurrency, ks[0])):
            config = next(c for c, sc in configs if c.k == k and sc == s)
            tps = rate(config, s)
            best[s] = max(best.get(s) or 0.0, tps or 0.0) if tps is not None else best.get(s)
            parts.append(phase_seconds(tokens[s], tps))
        mode = f"{key.method}, parallel" if key.parallel_drafting else str(key.method)
        units.append(LaunchUnit("drafter", f"{key.drafter} ({mode})", startup_s(target + sizes.get(key.drafter, 0),
                                                                                on_gpu), total_phases(parts)))
    largest = max((v for k, v in sizes.items() if k is not None), default=0.0)
    ordered = sorted(scenarios, key=lambda s: -s.concurrency)
    for i in range(confirmations):
        s = ordered[i % len(ordered)]
        label = f"confirmation c={s.concurrency}" + (f" #{i // len(ordered) + 1}" if i >= len(ordered) else "")
        units.append(LaunchUnit("confirmation", label, startup_s(target + largest, on_gpu),
                                phase_seconds(tokens[s], best.get(s))))
    return units
