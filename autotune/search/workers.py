"""Every GPU of the box searching: one worker process per group of --tensor-parallel-size GPUs
(``CUDA_VISIBLE_DEVICES``), the launches of an in-launch search as the units of work.

The units (a drafter and drafting mode, the baseline, a confirmation of a config at a concurrency) live in a queue
beside the search's studies (`LaunchQueue`: attributes of the Optuna study ``<prefix>-launches`` in the same storage,
claimed under the study's `ClaimLock`), each with its result once done, so a killed worker loses only the unit it
was running: a worker on the same host sees its process gone, another host sees its heartbeat stop, and the unit is
claimed again (at most `MAX_RETRIES` more times). The coordinating process reads every launch's figures from there,
runs the studies (trials are then reads), queues the confirmations the picks need, and recommends once per scenario.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from autotune.errors import UsageError
from autotune.search.coordination import MAX_RETRIES, ClaimLock, _process_alive, in_memory, open_storage, this_worker

UNIT = "unit:"
"""Study attribute prefix of a unit (followed by its id)."""
CLOSED = "closed"
"""Study attribute set when the coordinator needs no more units: idle workers exit."""


def unit_id(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _alive(worker: dict[str, Any], beat: float, grace_s: float) -> bool:
    """Is the worker that claimed a unit still at it? Same host: its process; another host: a recent heartbeat."""
    me = this_worker()
    if worker.get("host") == me["host"] and worker.get("boot") == me["boot"]:
        return worker.get("pid") == me["pid"] or _process_alive(int(worker.get("pid", 0)))
    return time.time() - beat < grace_s


class LaunchQueue:
    """The units of a parallel search, shared by every worker through the study storage at `url`."""

    def __init__(self, url: str, name: str, heartbeat_s: int = 60) -> None:
        if in_memory(url):
            raise UsageError("Several workers share a search through its database: pass --db FILE (or --storage URL), "
                             "not an in-memory database.")
        self.url, self.name, self.heartbeat_s = url, name, heartbeat_s
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = open_storage(url, heartbeat_s)
        with ClaimLock(url, name):
            study = optuna.create_study(study_name=name, storage=self.storage, load_if_exists=True)
        self.study_id = study._study_id

    def _attrs(self) -> dict[str, Any]:
        return dict(self.storage.get_study_user_attrs(self.study_id))

    def _set(self, key: str, value: Any) -> None:
        self.storage.set_study_user_attr(self.study_id, key, value)

    def units(self) -> dict[str, dict[str, Any]]:
        """Every unit by id: ``spec``, ``state`` (waiting, running, done, failed), ``result`` once done."""
        return {k[len(UNIT):]: v for k, v in self._attrs().items() if k.startswith(UNIT)}

    def add(self, specs: Sequence[dict[str, Any]]) -> list[str]:
        """Queue the units `specs` not queued yet; their ids, in order."""
        ids = [unit_id(s) for s in specs]
        with ClaimLock(self.url, self.name):
            have = self.units()
            for uid, spec in zip(ids, specs, strict=True):
                if uid not in have:
                    self._set(UNIT + uid, {"spec": spec, "state": "waiting", "tries": 0})
            self._set(CLOSED, False)
        return ids

    def close(self) -> None:
        with ClaimLock(self.url, self.name):
            self._set(CLOSED, True)

    def claim(self) -> tuple[str, dict[str, Any]] | str:
        """The next unit to run (id, spec), else "wait" (units running elsewhere, or the queue still open) or "done"."""
        with ClaimLock(self.url, self.name):
            attrs = self._attrs()
            busy = False
            for key, unit in attrs.items():
                if not key.startswith(UNIT) or unit["state"] in ("done", "failed"):
                    continue
                if unit["state"] == "running" and _alive(unit["worker"], unit["beat"], 2 * self.heartbeat_s):
                    busy = True
                    continue
                if unit["tries"] > MAX_RETRIES:  # it killed its worker every time
                    self._set(key, {**unit, "state": "failed", "result": None})
                    continue
                self._set(key, {**unit, "state": "running", "worker": this_worker(), "beat": time.time(),
                                "tries": unit["tries"] + 1})
                return key[len(UNIT):], unit["spec"]
            return "wait" if busy or not attrs.get(CLOSED, False) else "done"

    def beat(self, uid: str) -> None:
        """Record that this worker still runs `uid` (unless another worker took it over)."""
        with ClaimLock(self.url, self.name):
            unit = self._attrs().get(UNIT + uid)
            if unit and unit["state"] == "running" and unit["worker"] == this_worker():
                self._set(UNIT + uid, {**unit, "beat": time.time()})

    def finish(self, uid: str, result: Any) -> None:
        with ClaimLock(self.url, self.name):
            unit = self._attrs()[UNIT + uid]
            self._set(UNIT + uid, {**unit, "state": "done", "result": result, "finished_by": this_worker()})

    def wait(self, ids: Sequence[str], workers: Sequence[subprocess.Popen[bytes]], poll_s: float = 1.0) -> None:
        """Block until every unit `ids` is done or failed; refuse when every worker has exited before that."""
        while True:
            units = self.units()
            if all(units[i]["state"] in ("done", "failed") for i in ids):
                return
            if workers and all(w.poll() is not None for w in workers):
                codes = ", ".join(str(w.returncode) for w in workers)
                raise UsageError(f"Every search worker exited (codes {codes}) with launches left; see their output "
                                 "above, then re-run the same command: it resumes from what they finished.")
            time.sleep(poll_s)


def serve_units(queue: LaunchQueue, run_unit: Callable[[dict[str, Any]], Any], poll_s: float = 1.0) -> int:
    """A worker's loop: claim a unit, run it (heartbeats beating), store its result; until the queue is closed and
    empty. Returns the units this worker finished."""
    done = 0
    while True:
        got = queue.claim()
        if got == "done":
            return done
        if got == "wait":
            time.sleep(poll_s)
            continue
        assert isinstance(got, tuple)
        uid, spec = got
        stop = threading.Event()

        def beat(uid: str = uid, stop: threading.Event = stop) -> None:
            while not stop.wait(queue.heartbeat_s):
                queue.beat(uid)

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            result = run_unit(spec)
        finally:
            stop.set()
            thread.join()
        queue.finish(uid, result)
        done += 1


# ---- what a unit is, for an in-launch search ------------------------------------------------------------------

def drafter_unit(key: Any) -> dict[str, Any]:
    return {"kind": "launch", "key": dataclasses.asdict(key)}


def confirmation_unit(config: Any, scenario: Any) -> dict[str, Any]:
    return {"kind": "confirmation", "config": config.to_dict(), "scenario": scenario.to_dict()}


def launch_to_dict(launch: Any) -> dict[str, Any]:
    return json.loads(json.dumps({
        "ok": launch.ok, "provenance": launch.provenance.to_dict(),
        "reports": [[k, s.to_dict(), r] for (k, s), r in launch.reports.items()],
        "failure": list(launch.failure) if launch.failure else None, "info": launch.info,
    }, default=str))


def launch_from_dict(data: dict[str, Any] | None, label: str) -> Any:
    """A stored launch (None: the unit failed every try) as `autotune.backends.in_launch._Launch`."""
    from autotune.backends.in_launch import _Launch
    from autotune.engine import measured_provenance
    from autotune.measurement import Provenance
    from autotune.spec import Scenario

    if data is None:
        return _Launch(False, measured_provenance(), failure=(
            "engine_died", f"the launch of {label} killed its worker {MAX_RETRIES + 1} times", None))
    failure = tuple(data["failure"]) if data["failure"] else None
    return _Launch(data["ok"], Provenance.from_dict(data["provenance"]),
                   {(k, Scenario.from_dict(s)): r for k, s, r in data["reports"]}, failure, data["info"])


def run_unit_with(backend: Any, workload: Any) -> Callable[[dict[str, Any]], Any]:
    """How a worker runs a unit with its `InLaunchBackend`."""
    from autotune.backends.in_launch import DrafterKey
    from autotune.search.trials import slim
    from autotune.spec import Scenario, SpecConfig

    def run(spec: dict[str, Any]) -> Any:
        if spec["kind"] == "launch":
            return launch_to_dict(backend._launch(DrafterKey(**spec["key"]), workload))
        m = backend.confirm(SpecConfig.from_dict(spec["config"]), workload, Scenario.from_dict(spec["scenario"]))
        return None if m is None else slim(m)

    return run


# ---- the coordinator -----------------------------------------------------------------------------------------

def run_parallel(plan: Any, options: Any, run_scenario: Any = None) -> list[Any]:
    """Every scenario's result of `plan` (an in-launch `SearchPlan` whose `run_plan` has several worker groups),
    its launches run by one worker per group: the drafter and baseline launches first, then the studies read their
    figures, then the confirmations the picks need run (also in parallel) and the studies pick on them."""
    from autotune.backends.in_launch import DrafterKey, InLaunchBackend
    from autotune.measurement import Measurement

    backend = plan.backend
    assert isinstance(backend, InLaunchBackend) and plan.run_plan is not None
    store = plan.searches[0][0].store
    queue = LaunchQueue(storage_url(store, options), queue_name(plan), options.heartbeat)
    keys: dict[DrafterKey, None] = {}
    for search, scenario in plan.searches:
        for config in search.space.grid():
            if backend.in_launch(config, plan.workload, scenario):
                keys.setdefault(DrafterKey.of(config))
                keys.setdefault(DrafterKey(tensor_parallel_size=config.tensor_parallel_size))
    ids = queue.add([drafter_unit(k) for k in keys])
    procs = spawn(plan.run_plan.groups, options, str(store.url))
    try:
        queue.wait(ids, procs)
        units = queue.units()
        for key, uid in zip(keys, ids, strict=True):
            backend._launches[key] = launch_from_dict(units[uid].get("result"), key.label())
        pending: list[dict[str, Any]] = []

        def confirm(config: Any, workload: Any, scenario: Any) -> Measurement | None:
            """A confirmation from the queue; queued (and None for now) when no worker has run it yet."""
            if not backend.needs_confirmation(config, workload, scenario):
                return None
            spec = confirmation_unit(config, scenario)
            unit = queue.units().get(unit_id(spec))
            if unit is None or unit["state"] not in ("done", "failed"):
                pending.append(spec)
                return None
            if unit["state"] == "failed":
                return Measurement.failed(config, scenario, _provenance(), "engine_died",
                                          f"the confirming launch killed its worker {MAX_RETRIES + 1} times")
            return Measurement.from_dict(unit["result"]) if unit.get("result") else None

        setattr(backend, "confirm", confirm)  # noqa: B010 - this process launches nothing itself
        results = [search.run_scenario(scenario) for search, scenario in plan.searches]
        if pending:
            queue.wait(queue.add(pending), procs)
            results = [run_scenario(search, scenario) if run_scenario else search.run_scenario(scenario)
                       for search, scenario in plan.searches]
        units = queue.units()
        results[0].launches = (results[0].launches or 0) + len(ids)  # the workers' launches, counted once
        for result in results:
            mine = [u for u in units.values() if u["spec"]["kind"] == "confirmation"
                    and u["spec"]["scenario"] == result.scenario.to_dict() and u.get("result") is not None]
            result.launches = (result.launches or 0) + len(mine)
        return results
    finally:
        queue.close()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()


def _provenance() -> Any:
    from autotune.engine import measured_provenance

    return measured_provenance()


# ---- the worker process -----------------------------------------------------------------------------------------

def options_json(options: Any) -> str:
    return json.dumps(dataclasses.asdict(options), default=str)


def options_from_json(text: str) -> Any:
    from autotune.search.session import SearchOptions
    from autotune.search.space import SpaceSpec

    data = json.loads(text)
    space: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.pop("space").items()}
    return SearchOptions(**data, space=SpaceSpec(**space))


def spawn(groups: Sequence[tuple[str, ...]], options: Any, db_url: str) -> list[subprocess.Popen[bytes]]:
    """One worker process per group of device ids, each seeing only its GPUs."""
    procs = []
    for group in groups:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(group)}
        cmd = [sys.executable, "-m", "autotune.search.workers", options_json(options), db_url, ",".join(group)]
        # Their lines go to stderr (stdout may carry --json).
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=2))
    return procs


def queue_name(plan: Any) -> str:
    return f"{plan.searches[0][0].study_prefix}-launches"


def storage_url(store: Any, options: Any) -> str:
    from store import normalize_db_url

    return normalize_db_url(options.storage) if options.storage else str(store.url)


def main(argv: Sequence[str]) -> int:
    """``python -m autotune.search.workers OPTIONS_JSON DB_URL DEVICES``: serve a search's launch queue."""
    from autotune.search.session import plan_search
    from store import Store

    options, db_url, devices = options_from_json(argv[0]), argv[1], argv[2]
    store = Store(db_url)
    plan = plan_search(store, options)
    backend = plan.backend
    setattr(backend, "say", lambda line: print(f"[GPU {devices}] {line}", file=sys.stderr, flush=True))  # noqa: B010
    queue = LaunchQueue(storage_url(store, options), queue_name(plan), options.heartbeat)
    done = serve_units(queue, run_unit_with(backend, plan.workload))
    print(f"[GPU {devices}] worker done: {done} launches", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

