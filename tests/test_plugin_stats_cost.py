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


def test_a_shape_with_a_tail_has_a_mean_above_its_median() -> None:
    # Four steps of one shape (B = 2, depth 1): 5, 5, 5, 9 ms. Median 5; mean 24 / 4 = 6, what a run pays per step.
    stats = PluginStats()
    for ms in (5.0, 5.0, 9.0, 5.0):
        stats.observe_step(step_ms=ms, prompt_tokens=0, drafting_depth=1, requests=[("c", "p", 1, 1)] * 2)
    [median] = stats.step_samples()
    [mean] = stats.step_samples(statistic="mean")
    assert (median.batch_size, median.depth, median.n, median.step_ms) == (2, 1, 4, 5.0)
    assert (mean.batch_size, mean.depth, mean.n, mean.step_ms) == (2, 1, 4, pytest.approx(6.0))
    again = PluginStats.from_dict(json.loads(stats.to_json()))  # the file keeps each shape's sum and count
    assert [s.step_ms for s in again.step_samples(statistic="mean")] == [pytest.approx(6.0)]
    with pytest.raises(ValueError, match="statistic"):
        stats.step_samples(statistic="p90")  # type: ignore[arg-type]


def _launch(steps: list[tuple[str, int, int, int, float]], k: int = 4, skips: bool = True) -> PluginStats:
    """A launch's statistics: per step (phase, batch size, verified depth of every request, drafting depth, ms),
    engine K ``k``, off-steps skipping the drafter or not; read back from its file, as the simulator's users do."""
    stats = PluginStats()
    stats.info = {"num_speculative_tokens": k, "drafter_width": {"skip_drafter": skips}}
    for phase, b, d, dd, ms in steps:
        stats.observe_step(step_ms=ms, prompt_tokens=0, drafting_depth=dd, requests=[("a", phase, d, 0)] * b)
    return PluginStats.from_dict(json.loads(stats.to_json()))


def test_mean_samples_pool_a_shape_as_the_median_samples_do() -> None:
    # Depth 1 at B = 1: 3 steps of 5, 5, 8 ms drafting 1 slot and one of 6 ms drafting 4: median 5.5, mean 24/4 = 6.
    stats = _launch([("c1", 1, 1, 1, 5.0), ("c1", 1, 1, 1, 5.0), ("c1", 1, 1, 1, 8.0), ("c1", 1, 1, 4, 6.0),
                     ("c1", 1, 0, 0, 3.0), ("c1", 1, 0, 0, 4.0),  # a skipped drafter: drafter_ran False, mean 3.5
                     *[("warmup", 1, 1, 1, 100.0)] * 5])
    # A step whose requests verified different depths (1 and 4: no uniform depth) and a step with prompt tokens:
    # not decode samples of one depth.
    stats.observe_step(step_ms=30.0, prompt_tokens=0, drafting_depth=4, requests=[("a", "c1", 1, 0), ("a", "c1", 4, 0)])
    stats.observe_step(step_ms=40.0, prompt_tokens=32, drafting_depth=4, requests=[("a", "c1", 4, 0)])
    samples = stats.step_samples(["c1"], statistic="mean")
    assert [(s.batch_size, s.depth, s.n, s.drafter_ran) for s in samples] == [(1, 0, 2, False), (1, 1, 4, True)]
    assert [s.step_ms for s in samples] == pytest.approx([3.5, 6.0])
    assert [s.step_ms for s in stats.step_samples(["c1"])] == pytest.approx([3.5, 5.5])  # the medians
    assert [s.step_ms for s in stats.step_samples(["warmup"], statistic="mean")] == pytest.approx([100.0])


def test_mean_samples_of_a_baseline_and_of_sequential_drafting() -> None:
    base = _launch([("c1", 2, 0, 0, ms) for ms in (3.0, 3.0, 3.5, 3.5)], k=0, skips=False)  # 13 ms / 4 steps
    assert [(s.step_ms, s.n, s.drafter_ran) for s in base.step_samples(statistic="mean")] == [
        (pytest.approx(3.25), 4, False)]
    # Depth 2 at B = 1: two steps drafting their depth (5 + 7 ms) and two drafting 4 slots (10 + 10 ms).
    seq = _launch([("c1", 1, 2, 2, 5.0), ("c1", 1, 2, 2, 7.0), ("c1", 1, 2, 4, 10.0), ("c1", 1, 2, 4, 10.0)],
                  skips=False)
    assert [s.step_ms for s in seq.step_samples(sequential=True, statistic="mean")] == pytest.approx([6.0])
    assert [s.step_ms for s in seq.step_samples(statistic="mean")] == pytest.approx([8.0])


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
