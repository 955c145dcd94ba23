"""The committed fixture files are what vLLM and the tests expect (no engine: fast).

Covers the contracts a backend author relies on: one shared byte-level vocabulary with the mask token that
parallel drafting needs, an 8-layer target whose EAGLE-3 taps are distinct, the workload records, the size budget,
and that the drafter training layout equals what vLLM's drafter computes for a bonus token followed by masks.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = FIXTURES / "models"
WORKLOAD = FIXTURES.parent.parent / "examples" / "workloads" / "fixture.jsonl"
TRAINED = ("target", "drafter-1l", "drafter-2l")
MASK_ID = 259  # <mask> follows the 256 byte tokens and <bos>, <eos>, <pad>

needs_models = pytest.mark.skipif(not (MODELS / "target" / "config.json").exists(), reason="fixtures not built")
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="torch/transformers not installed",
)


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((MODELS / name / "config.json").read_text()))


@needs_models
def test_trained_models_share_one_vocabulary_and_drafters_name_the_mask_token() -> None:
    configs = {name: _config(name) for name in TRAINED}
    assert {c["vocab_size"] for c in configs.values()} == {260}
    for name in ("drafter-1l", "drafter-2l"):
        # vLLM's parallel drafting reads the mask token id from the drafter's config.json
        assert configs[name]["pard_token"] == MASK_ID
        assert configs[name]["architectures"] == ["LlamaForCausalLM"]
    assert configs["drafter-1l"]["num_hidden_layers"] == 1
    assert configs["drafter-2l"]["num_hidden_layers"] == 2
    tokenizers = {(MODELS / n / "tokenizer.json").read_text() for n in (*TRAINED, "target-deep", "eagle3-head")}
    assert len(tokenizers) == 1


@needs_models
@needs_torch
def test_tokenizer_is_byte_level_with_bos_and_mask() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODELS / "target"))
    text = "def add_3(x):\n    return x + 3\né"
    ids = tok(text)["input_ids"]
    assert ids == [256, *text.encode("utf-8")]  # <bos> then one id per UTF-8 byte
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_tokens_to_ids("<mask>") == MASK_ID


@needs_models
def test_peagle_fixture_configs_fit_vllm_eagle3() -> None:
    deep, head = _config("target-deep"), _config("eagle3-head")
    layers = deep["num_hidden_layers"]
    taps = (2, layers // 2, layers - 3)  # vLLM's default EAGLE-3 auxiliary layers
    assert len(set(taps)) == 3, taps
    assert head["architectures"] == ["LlamaForCausalLMEagle3"]
    assert head["target_hidden_size"] == deep["hidden_size"]
    assert head["pard_token"] == MASK_ID
    assert not (MODELS / "target-deep" / "model.safetensors").exists()  # config only: load_format="dummy"


@needs_models
def test_committed_weights_stay_under_20_mb() -> None:
    total = sum(f.stat().st_size for f in MODELS.rglob("*") if f.is_file())
    assert total < 20 * 1024 * 1024, total


def test_workload_has_both_classes_within_the_trained_context() -> None:
    records = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    by_class: dict[str, int] = {}
    for rec in records:
        assert set(rec) == {"prompt", "class", "max_tokens", "temperature"}, rec
        assert rec["temperature"] == 0 and 32 <= rec["max_tokens"] <= 64, rec
        # <bos> + prompt bytes + generated tokens must fit the 256-token training sequences
        assert 1 + len(rec["prompt"].encode("utf-8")) + rec["max_tokens"] <= 256, rec
        by_class[rec["class"]] = by_class.get(rec["class"], 0) + 1
    assert set(by_class) == {"predictable", "entropic"}
    assert all(16 <= n <= 32 for n in by_class.values()), by_class


@needs_torch
def test_training_layout_equals_vllm_parallel_drafting_inputs() -> None:
    # vLLM feeds the drafter [..., bonus at p, mask at p+1, ..., mask at p+k] under causal attention; the output at
    # the k-th mask is draft k+1. The packed training layout must give the same logits at every mask slot.
    import torch

    sys.path.insert(0, str(FIXTURES))
    import build_fixtures as bf

    model = bf.new_model(bf.DRAFTER_SHAPES["drafter-2l"], seed=0).eval()
    n, k_train = 24, 4
    tokens = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(0))
    anchors = torch.tensor([0, 7, 20])
    positions, label_pos, is_mask, attend = bf.pard_layout(n, anchors, k_train)
    inputs = torch.cat([tokens, torch.full((1, int(is_mask.sum())), bf.MASK_ID)], dim=1)
    with torch.no_grad():
        packed = model(input_ids=inputs, position_ids=positions[None], attention_mask=attend[None, None]).logits[0]
        assert torch.allclose(packed[:n], model(input_ids=tokens).logits[0], atol=1e-5)
        for slot in range(n, inputs.shape[1]):
            k = 1 + (slot - n) // anchors.numel()
            p = int(positions[slot]) - k
            plain = torch.cat([tokens[:, : p + 1], torch.full((1, k), bf.MASK_ID)], dim=1)
            assert torch.allclose(packed[slot], model(input_ids=plain).logits[0, -1], atol=1e-5), (k, p)
            assert int(label_pos[slot]) == p + k + 1  # the k-th mask after bonus p predicts token p + k + 1
