"""Engine-side cost of the scheduler plugin per step, without a model (a script that prints figures, not a test).

Usage::

    python -m benchmarks.bench_plugin_overhead [--batch 8] [--steps 2000] [--repeats 5] [--mode adaptive]
        [--stats-file DIR/adaptive-new-stats.json]

What runs: vLLM's real ``Scheduler`` and the plugin's ``PeagleScheduler`` (a subclass) are driven with the same
seeded workload and fake runner outputs, in the synchronous engine-core order (``schedule``, ``get_grammar_bitmask``,
``update_from_output``, ``update_draft_token_ids``). The batch is kept at ``--batch`` requests of two classes
("predictable": every draft accepted; "entropic": none or the first one, seeded): a finished request (64 output
tokens) is replaced at once, so prefills and joins happen as in a closed-loop benchmark. The plugin runs with the
controller, cost model and acceptance prior of the issue-10 runtime benchmark (adaptive mode), the drafter-width
handshake answered as a worker with the patch would (width lowering and off-steps on), and a stats file.

Figures per repeat (``--repeats`` fresh schedulers, ``--warmup`` steps not timed, then ``--steps`` timed steps):

- ``plugin``: the wall time the plugin accounts for itself (``PluginStats.overhead_ms`` per step): what the runtime
  benchmark reports as the plugin's cost;
- ``delta wall`` / ``delta cpu``: wall (perf_counter) and thread CPU time per step of the whole loop with
  ``PeagleScheduler`` minus the same with vLLM's ``Scheduler`` (everything the plugin adds, vLLM calls included);
- a breakdown of the plugin's parts (one more instrumented run; wrapping adds a little time to each part).

Figures are the median (min-max) over repeats, in microseconds per step. The load average (``os.getloadavg``) is
printed before and after: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.fakes import FakeEngineCore
from policies.plugin import CLASS_KEY

K = 4
PROMPT_LEN = 12
MAX_TOKENS = 64

# The adaptive section of the issue-10 runtime benchmark's plugin config (adaptive-new-plugin.json of its work
# directory).
ADAPTIVE: dict[str, Any] = {
    "policy": {
        "version": 1, "model": None, "static_k": 4, "max_k": 4, "default_class": "predictable",
        "classes": {"entropic": {"min_k": 0}}, "model_classes": {},
        "controller": {"hysteresis": 0.03, "patience": 32, "refresh_every": 16, "per_request": True,
                       "drafter_always_runs": True, "explore_every": 16, "reoptimize_churn": 0.05,
                       "learn_step_cost": True, "decay": 0.98, "prior_strength": 20.0},
    },
    "cost_model": {
        "version": 1, "sequential": False, "forgetting": 0.99,
        "coefficients": {"base": 3.0623521245083767, "per_request": 0.060778348317801684,
                         "per_verified_token": 0.15185214206948588, "drafter_fixed": 2.2772066844501544,
                         "drafter_per_request": 0.26624890470275814},
    },
    "acceptance": {
        "entropic": {"num_drafts": 1562, "accepted_per_position": [361, 0, 0, 0]},
        "predictable": {"num_drafts": 551, "accepted_per_position": [546, 507, 500, 489]},
    },
}


class FakeExecutor:
    """Answers the drafter-width handshake as one worker with the patch would (lowering and off-steps on)."""

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = ()) -> list[Any]:
        from policies.plugin.drafter_width import WorkerStatus

        return [WorkerStatus(True, None, 0, k_max=K, method="draft_model", parallel=True, lower_width=True,
                             off_steps="catch_up").to_dict()]


def _build(core: FakeEngineCore, scheduler_cls: type, batch: int) -> Any:
    """A scheduler for `batch` requests: 64 KV blocks per request, synchronous scheduling."""
    return core.build(scheduler_cls, batch, num_blocks=64 * batch, async_scheduling=False)


class Workload:
    """Keeps ``batch`` requests running (half of each class) and answers every step like a model runner would."""

    def __init__(self, scheduler: Any, batch: int, seed: int) -> None:
        self.scheduler = scheduler
        self.rng = random.Random(seed)
        self.next_id = 0
        self.classes: dict[str, str] = {}
        for i in range(batch):
            self._add("predictable" if i % 2 == 0 else "entropic")

    def _add(self, cls: str) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        name = f"r{self.next_id}"
        self.next_id += 1
        self.classes[name] = cls
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, extra_args={CLASS_KEY: cls})
        self.scheduler.add_request(Request(name, list(range(1, PROMPT_LEN + 1)), params, None))

    def step(self) -> None:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        s = self.scheduler
        output = s.schedule()
        s.get_grammar_bitmask(output)
        ids = list(output.num_scheduled_tokens)
        spec = output.scheduled_spec_decode_tokens
        sampled = []
        for r in ids:
            drafted = len(spec.get(r, ()))
            accepted = drafted if self.classes[r] == "predictable" else min(drafted, self.rng.randrange(2))
            sampled.append([7] * (1 + accepted))
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=sampled)
        outputs = s.update_from_output(output, runner)
        finished = [r for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None
                    for r in (o.request_id,)]
        width = output.num_spec_tokens_to_schedule
        live = [r for r in ids if r in s.requests]
        if live and width:
            s.update_draft_token_ids(DraftTokenIds(live, [[5] * width for _ in live]))
        for r in finished:
            self._add(self.classes.pop(r))


def _plugin_env(tmp: Path, mode: str) -> None:
    from policies.plugin import CONFIG_ENV, PluginConfig

    stats = tmp / "stats.json"
    if mode == "adaptive":
        config = PluginConfig(mode="adaptive", stats_path=str(stats), adaptive=ADAPTIVE)
    else:
        config = PluginConfig(mode="static", stats_path=str(stats), class_depths={"entropic": 1})
    os.environ[CONFIG_ENV] = str(config.save(tmp / "plugin.json"))


def _timed(scheduler: Any, batch: int, warmup: int, steps: int, seed: int) -> tuple[float, float, float]:
    """(wall us/step, thread CPU us/step, plugin-accounted us/step) over ``steps`` steps after ``warmup``."""
    work = Workload(scheduler, batch, seed)
    for _ in range(warmup):
        work.step()
    stats = getattr(scheduler, "_stats", None)
    own0 = stats.overhead_ms if stats is not None else 0.0
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        work.step()
    w1, c1 = time.perf_counter(), time.thread_time()
    own = ((stats.overhead_ms - own0) * 1000.0 / steps) if stats is not None else 0.0
    return (w1 - w0) * 1e6 / steps, (c1 - c0) * 1e6 / steps, own


def _instrument(scheduler: Any) -> dict[str, list[float]]:
    """Wrap the plugin's parts with perf_counter sections; returns the accumulators (seconds, calls)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def wrap(owner: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                a = acc[label]
                a[0] += time.perf_counter() - t
                a[1] += 1

        setattr(owner, name, timed)

    wrap(scheduler, "_decide", "schedule: _decide (total)")
    if scheduler._controller is not None:
        wrap(scheduler._controller, "decide", "  controller.decide")
        wrap(scheduler._controller, "refresh", "    controller.refresh")
        wrap(scheduler._controller, "observe_tally", "record: controller.observe_tally")
    wrap(scheduler._decider.batch, "sync", "  TrackedBatch.sync")
    wrap(scheduler, "_observe", "update_from_output: _observe")
    wrap(scheduler, "_record", "update_from_output: _record (total)")
    wrap(scheduler._stats, "observe_tally", "  record: stats.observe_tally")
    wrap(scheduler._metrics, "call", "  metrics calls (decision, tally, push)")
    wrap(scheduler, "_flush", "update_from_output: _flush (stats file)")
    wrap(scheduler, "_trim", "update_draft_token_ids: _trim")
    return acc


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mode", choices=("adaptive", "static"), default="adaptive")
    parser.add_argument("--stats-file", type=Path, default=None,
                        help="a stats.json from an engine run: also time writing it (the plugin's flush)")
    args = parser.parse_args(argv)

    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    from vllm.v1.core.sched.scheduler import Scheduler

    from policies.scheduler import PeagleScheduler

    core = FakeEngineCore(FakeExecutor())
    load0 = os.getloadavg()
    rows: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        _plugin_env(Path(tmp), args.mode)
        for rep in range(args.repeats):
            seed = 1000 + rep
            base_wall, base_cpu, _ = _timed(_build(core, Scheduler, args.batch), args.batch, args.warmup, args.steps,
                                            seed)
            plugin = _build(core, PeagleScheduler, args.batch)
            wall, cpu, own = _timed(plugin, args.batch, args.warmup, args.steps, seed)
            rows["vLLM Scheduler wall"].append(base_wall)
            rows["PeagleScheduler wall"].append(wall)
            rows["delta wall (plugin - vLLM)"].append(wall - base_wall)
            rows["delta cpu (plugin - vLLM)"].append(cpu - base_cpu)
            rows["plugin (stats overhead_ms/step)"].append(own)
            plugin.shutdown()
        plugin = _build(core, PeagleScheduler, args.batch)
        acc = _instrument(plugin)
        work = Workload(plugin, args.batch, 7)
        for _ in range(args.warmup):
            work.step()
        acc.clear()
        for _ in range(args.steps):
            work.step()
        stats_size = len(json.dumps(plugin._stats.to_dict()))
        plugin.shutdown()
    load1 = os.getloadavg()

    print(f"batch {args.batch}, mode {args.mode}, {args.repeats} repeats x {args.steps} steps (+{args.warmup} warm-up)")
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} {load1[1]:.2f} "
          f"{load1[2]:.2f} (the machine may be shared)")
    print("us per step, median (min-max) over repeats:")
    for name, values in rows.items():
        print(f"  {name:34s} {_fmt(values)}")
    print(f"breakdown (one instrumented run, {args.steps} steps), us per step (calls):")
    for name, (total, calls) in acc.items():
        print(f"  {name:44s} {total * 1e6 / args.steps:7.1f} ({int(calls)})")
    print(f"stats JSON after the instrumented run: {stats_size} bytes")
    if args.stats_file is not None:
        from policies.plugin import PluginStats

        stats = PluginStats.load(args.stats_file)
        with tempfile.TemporaryDirectory() as tmp:
            times = []
            for _ in range(5):
                t = time.perf_counter()
                stats.save(Path(tmp) / "s.json")
                times.append((time.perf_counter() - t) * 1000.0)
        print(f"writing {args.stats_file} ({args.stats_file.stat().st_size} bytes): {_fmt(times)} ms per flush")
    return 0


if __name__ == "__main__":
    sys.exit(main())
