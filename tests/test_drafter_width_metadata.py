"""The worker's short path for the spec-decode metadata of a step without drafts gives what vLLM's own builder gives
(`policies.plugin.drafter_width.zero_draft_metadata` against ``GPUModelRunner._calc_spec_decode_metadata``). That
the engine takes it, with greedy outputs unchanged, is tested on vLLM in tests/test_drafter_width_vllm.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
runner_module = pytest.importorskip("vllm.v1.worker.gpu_model_runner")

from policies.plugin.drafter_width import zero_draft_metadata  # noqa: E402

GPUModelRunner = runner_module.GPUModelRunner
FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
          "bonus_logits_indices", "logits_indices")


def _runner() -> Any:
    """The attributes vLLM's builder reads, with the dtypes of a real runner (``input_ids``: int32 buffer)."""
    runner = SimpleNamespace(
        device=torch.device("cpu"),
        _arange_scratch=np.empty(1024, dtype=np.int64),
        arange_np=np.arange(1024, dtype=np.int64),
        input_ids=SimpleNamespace(gpu=torch.arange(1024, dtype=torch.int32)),
    )
    runner._get_cumsum_and_arange = lambda *a, **k: GPUModelRunner._get_cumsum_and_arange(runner, *a, **k)
    return runner


@pytest.mark.parametrize("scheduled", [[1], [1, 1, 1, 1, 1, 1, 1, 1], [30, 1, 12, 1]])
def test_the_short_path_equals_vllms_metadata_field_by_field(scheduled: list[int]) -> None:
    # decode-only batches and batches with prompt chunks: each request samples at its last scheduled position
    runner = _runner()
    drafts = np.zeros(len(scheduled), dtype=np.int32)
    cu = np.cumsum(np.asarray(scheduled, dtype=np.int32))
    want = GPUModelRunner._calc_spec_decode_metadata(runner, drafts, cu)
    got = zero_draft_metadata(runner, drafts, cu)
    assert got.num_draft_tokens == want.num_draft_tokens and got.max_spec_len == 0
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.device == b.device, name
        assert torch.equal(a, b), name
    assert got.logits_indices.tolist() == [c - 1 for c in cu.tolist()]
