"""The plugin statistics stay cheap to keep and to write in a long session: the file written incrementally is the
same JSON as the full dump, step shapes beyond the cap keep their count and mean only, totals and the Prometheus
counters are sums of the acceptance counts (nothing extra counted per step)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from policies.plugin import PluginMetrics, PluginStats


def _session(stats: PluginStats, steps: int, seed: int = 3) -> list[tuple[str, int, int]]:
    """A random decode workload of two classes with finishing requests; returns every (class, drafted, accepted)."""
    rng = random.Random(seed)
    seen = []
    for step in range(steps):
        rows = []
        for r in range(rng.randint(1, 4)):
            cls = "code" if r % 2 == 0 else "chat"
            drafted = rng.choice([0, 1, 2, 4])
            accepted = rng.randint(0, drafted)
            rows.append((f"s{step // 40}r{r}", cls, drafted, accepted))
            seen.append((cls, drafted, accepted))
        stats.observe_step(step_ms=5.0 + rng.random(), prompt_tokens=0, drafting_depth=4,
                           requests=[(c, "p0", d, a) for _, c, d, a in rows], request_ids=[r for r, *_ in rows])
    return seen


def test_incremental_file_is_the_full_dump_and_round_trips(tmp_path: Path) -> None:
    # Small reservoirs, so both the cost samples and the finished traces are replaced while the session runs.
    stats = PluginStats(max_samples_per_key=4, max_traces=3, max_trace_steps=16)
    path = tmp_path / "stats.json"
    for _ in range(4):  # written repeatedly while running, as the plugin flushes
        _session(stats, 300)
        stats.observe_draft_fetch(0.25)  # the engine core's fetch after a step, timed outside the step window
        assert stats.to_json() == json.dumps(stats.to_dict())
        stats.save(path)
        assert json.loads(path.read_text()) == stats.to_dict()
    again = PluginStats.load(path)
    assert again.to_json() == path.read_text()
    assert again.traces() == stats.traces() and again.totals() == stats.totals()
    assert (again.draft_fetches, again.draft_fetch_ms) == (4, pytest.approx(1.0))


def test_step_shapes_beyond_the_cap_keep_count_and_mean_only() -> None:
    stats = PluginStats(max_cost_keys=2)
    for batch, ms in ((1, [4.0, 6.0, 20.0]), (2, [7.0]), (3, [10.0, 14.0])):  # the third shape is beyond the cap
        for x in ms:
            stats.observe_step(step_ms=x, prompt_tokens=0, drafting_depth=2, requests=[("c", "p", 2, 1)] * batch)
    by_batch = {e["batch_size"]: e for e in stats.step_costs()}
    assert by_batch[1]["samples_ms"] == [4.0, 6.0, 20.0] and by_batch[3]["samples_ms"] == []
    assert by_batch[3]["n"] == 2 and by_batch[3]["mean_ms"] == 12.0
    medians = {s.batch_size: s.step_ms for s in stats.step_samples()}
    assert medians == {1: 6.0, 2: 7.0, 3: 12.0}  # medians of the kept samples; the mean without samples
    data = stats.to_dict()
    assert data["info"]["step_cost_keys_without_samples"] == 1
    again = PluginStats.from_dict(json.loads(stats.to_json()))
    assert {s.batch_size: s.step_ms for s in again.step_samples()} == medians


def test_totals_and_class_counts_are_the_counts_of_every_draft() -> None:
    stats = PluginStats()
    seen = _session(stats, 200)
    drafts = [(c, d, a) for c, d, a in seen if d > 0]
    totals = stats.totals()
    assert totals["num_drafts"] == len(drafts)
    assert totals["num_draft_tokens"] == sum(d for _, d, _ in drafts)
    assert totals["num_accepted_tokens"] == sum(a for _, _, a in drafts)
    assert totals["accepted_per_position"] == [sum(1 for _, _, a in drafts if a > i) for i in range(4)]
    counts = stats.class_counts()
    for cls in ("code", "chat"):
        mine = [(d, a) for c, d, a in drafts if c == cls]
        expected = [len(mine), sum(d for d, _ in mine), sum(a for _, a in mine),
                    *(sum(1 for _, a in mine if a > i) for i in range(4))]
        assert counts[cls] == expected


def test_metrics_pulled_from_the_stats_equal_per_step_counting() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    stats = PluginStats()
    pulled = PluginMetrics(4, 2, engine="pull", counts_source=stats.class_counts)
    counted = PluginMetrics(4, 2, engine="count")
    rng = random.Random(5)
    for step in range(300):
        rows = [("code" if r % 2 else "chat", d, rng.randint(0, d)) for r in range(3) for d in [rng.choice([0, 2, 4])]]
        stats.observe_step(step_ms=5.0, prompt_tokens=0, drafting_depth=4,
                           requests=[(c, "p", d, a) for c, d, a in rows])
        counted.observe_requests(rows)
        if step % 37 == 0:  # pushes at arbitrary steps see what grew since the last one
            pulled.push()
            counted.push()
    pulled.push()
    counted.push()
    names = ["peagle:drafts_total", "peagle:draft_tokens_total", "peagle:accepted_tokens_total"]
    for cls in ("code", "chat"):
        for name in names:
            a = prometheus_client.REGISTRY.get_sample_value(name, {"engine": "pull", "class": cls})
            b = prometheus_client.REGISTRY.get_sample_value(name, {"engine": "count", "class": cls})
            assert a == b and a is not None and a > 0
        for i in range(4):
            labels = {"class": cls, "position": str(i)}
            assert prometheus_client.REGISTRY.get_sample_value(
                "peagle:accepted_tokens_per_pos_total", {"engine": "pull", **labels}
            ) == prometheus_client.REGISTRY.get_sample_value(
                "peagle:accepted_tokens_per_pos_total", {"engine": "count", **labels}
            )
