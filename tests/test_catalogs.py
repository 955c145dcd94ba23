"""Catalogs: lookups, aliases, unknown names, local HF directories, and sanity of every catalog figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.catalogs import (
    acceptance_survival,
    default_gpu,
    drafters_for,
    get_drafter,
    get_gpu,
    list_drafters,
    list_gpus,
    list_models,
    position_decay_prior,
    reference_survival,
    resolve_model,
)
from autotune.catalogs._acceptance_curve import acceptance_length, fit_curve, rate_factor_for_mean
from autotune.errors import ConfigError, UnknownModelError
from autotune.workloads import REFERENCE_FOR_CLASS

#: Benchmarks the catalog keys reference acceptance by: the built-in workload classes' plus SPEED-Bench (the vLLM
#: P-EAGLE blog's third workload, used for calibration).
REFERENCE_WORKLOADS = {*REFERENCE_FOR_CLASS.values(), "speed-bench"}

# The published Llama-3.1-8B-Instruct config.json fields (the parser only needs these).
LLAMA_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# gpt-oss-120b's config.json fields (MoE, MXFP4 experts, alternating sliding/full attention).
GPT_OSS_120B_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4"},
}


def _write_config(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


# ---------------------------------------------------------------- GPUs


def test_every_gpu_has_a_source_and_positive_dense_rates() -> None:
    gpus = list_gpus()
    assert {"h100", "h200", "b200", "a100", "l40s"} <= {g.key for g in gpus}
    for gpu in gpus:
        assert gpu.source.strip(), gpu.key
        assert gpu.memory_gb > 0 and gpu.memory_bandwidth_gbps > 0 and gpu.bf16_tflops > 0, gpu.key
        for rate in (gpu.fp8_tflops, gpu.fp4_tflops):
            assert rate is None or rate > 0, gpu.key


def test_low_precision_rates_are_twice_the_next_wider_format() -> None:
    # On Ada, Hopper and Blackwell tensor cores FP8 runs at 2x BF16 and FP4 at 2x FP8. Mixing a sparse figure
    # (2x dense) with a dense one would break this ratio, so it guards the "dense everywhere" rule.
    for gpu in list_gpus():
        if gpu.fp8_tflops is not None:
            assert gpu.fp8_tflops / gpu.bf16_tflops == pytest.approx(2.0, rel=0.02), gpu.key
        if gpu.fp4_tflops is not None:
            assert gpu.fp8_tflops is not None
            assert gpu.fp4_tflops / gpu.fp8_tflops == pytest.approx(2.0, rel=0.02), gpu.key


def test_h200_has_h100_compute_with_more_bandwidth() -> None:
    # Same GH100 die; the H200 only changes memory (datasheets: 3.35 -> 4.8 TB/s, 80 -> 141 GB).
    h100, h200 = get_gpu("h100"), get_gpu("h200")
    assert h200.bf16_tflops == h100.bf16_tflops and h200.fp8_tflops == h100.fp8_tflops
    assert (h100.memory_bandwidth_gbps, h200.memory_bandwidth_gbps) == (3350, 4800)


@pytest.mark.parametrize("name", ["h200", "H200", "h200-sxm", "NVIDIA H200", "  nvidia h200 "])
def test_get_gpu_accepts_aliases_case_insensitively(name: str) -> None:
    assert get_gpu(name).key == "h200"


def test_a100_has_no_fp8() -> None:
    assert get_gpu("a100-80gb").fp8_tflops is None


def test_unknown_gpu_lists_known_keys_on_one_line() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_gpu("v100")
    message = str(info.value)
    assert "'v100'" in message and "\n" not in message
    assert all(key in message for key in ("h100", "h200", "b200", "a100", "l40s"))


def test_default_gpu_is_h200() -> None:
    assert default_gpu().key == "h200"


# ---------------------------------------------------------------- target models


def test_every_model_has_a_source_and_consistent_positive_numbers() -> None:
    names = {m.name for m in list_models()}
    assert {"openai/gpt-oss-120b", "openai/gpt-oss-20b", "Qwen/Qwen3-Coder-30B-A3B-Instruct"} <= names
    for m in list_models():
        assert m.source.strip() and m.local_path is None, m.name
        for value in (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
                      m.vocab_size, m.total_params_b, m.active_params_b, m.bytes_per_param_expert,
                      m.bytes_per_param_other, m.kv_bytes_per_element):
            assert value > 0, m.name
        assert m.active_params_b <= m.total_params_b and m.expert_params_b < m.total_params_b, m.name
        assert m.num_attention_heads % m.num_kv_heads == 0, m.name  # GQA groups
        assert 0.0 <= m.sliding_window_layer_fraction <= 1.0, m.name
        if m.sliding_window is None:
            assert m.sliding_window_layer_fraction == 0.0, m.name
        if m.is_moe:
            assert 0 < m.experts_per_token <= m.num_experts and m.expert_params_b > 0, m.name
        else:
            assert m.experts_per_token == 0 and m.expert_params_b == 0, m.name


def test_published_parameter_counts_match_the_architecture() -> None:
    # derived_params() recomputes counts from layer shapes (biases ignored). Total and expert counts must agree
    # with the published ones within 0.5% (gpt-oss biases are 0.03%). Publishers differ on whether the embedding
    # table counts as "active" (gpt-oss: no, Qwen/Llama: yes), so the published active count lies between the
    # weights a step reads and that plus the embedding table (1% slack for rounding to 2 digits).
    for m in list_models():
        derived = m.derived_params()
        assert derived.total_b == pytest.approx(m.total_params_b, rel=0.005), m.name
        assert derived.expert_b == pytest.approx(m.expert_params_b, rel=0.005, abs=1e-9), m.name
        embedding_b = m.vocab_size * m.hidden_size / 1e9
        assert derived.active_b <= m.active_params_b * 1.01, m.name
        assert m.active_params_b - derived.active_b <= embedding_b * 1.01, m.name


def test_gpt_oss_120b_weights_fit_one_80gb_gpu() -> None:
    # OpenAI: gpt-oss-120b "fits into a single 80GB GPU" thanks to MXFP4 experts:
    # 114.70e9 * 0.53125 + (116.83 - 114.70)e9 * 2 = 65.19 GB.
    model = resolve_model("gpt-oss-120b")
    assert model.weight_bytes() == pytest.approx(65.19e9, rel=0.001)
    assert model.weight_bytes() < get_gpu("h100").memory_gb * 1e9


def test_kv_bytes_keep_only_the_window_on_sliding_layers() -> None:
    # gpt-oss-120b: 2 (K,V) * 8 kv heads * 64 dims * 2 bytes = 2048 B per token-layer; 1000 tokens:
    # 18 full layers * 1000 + 18 sliding layers * 128 = 20,304 token-layers -> 41,582,592 bytes.
    assert resolve_model("gpt-oss-120b").kv_bytes(1000) == 41_582_592
    # Llama-3.1-8B has no window: 2 * 8 * 128 * 2 = 4096 B per token-layer * 32 layers * 1000 tokens.
    assert resolve_model("llama-3.1-8b").kv_bytes(1000) == 4096 * 32 * 1000


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt-oss-120b", "openai/gpt-oss-120b"),
        ("OPENAI/GPT-OSS-120B", "openai/gpt-oss-120b"),
        ("gpt-oss-20b", "openai/gpt-oss-20b"),
        ("qwen3-coder-30b-a3b", "Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        ("Qwen3-Coder-30B-A3B-Instruct", "Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)
def test_resolve_model_accepts_names_and_aliases(name: str, expected: str) -> None:
    assert resolve_model(name).name == expected


def test_resolve_model_passes_a_spec_through() -> None:
    spec = resolve_model("gpt-oss-20b")
    assert resolve_model(spec) is spec


def test_unknown_model_lists_known_names_and_mentions_local_paths() -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve_model("mistral-7b")
    message = str(info.value)
    assert "'mistral-7b'" in message and "\n" not in message
    assert "openai/gpt-oss-120b" in message and "local path" in message


def test_local_dense_directory_becomes_a_model_spec(tmp_path: Path) -> None:
    directory = _write_config(tmp_path / "my-llama", LLAMA_8B_CONFIG)
    spec = resolve_model(str(directory))
    assert spec.local_path == str(directory.resolve()) and spec.name == str(directory.resolve())
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.head_dim) == (32, 4096, 8, 128)
    assert spec.num_experts == 0 and spec.expert_params_b == 0.0
    # Same architecture as the catalog entry, so the same 8.03 B (derivation in models.yaml).
    assert spec.total_params_b == pytest.approx(8.03, rel=0.002)
    assert spec.bytes_per_param_other == 2.0 and spec.sliding_window is None


def test_local_moe_directory_reads_experts_quantization_and_sliding_layers(tmp_path: Path) -> None:
    spec = resolve_model(str(_write_config(tmp_path / "oss", GPT_OSS_120B_CONFIG)))
    assert (spec.num_experts, spec.experts_per_token, spec.head_dim) == (128, 4, 64)
    # 3 * 2880 * 2880 * 128 * 36 = 114.66 B expert weights (biases ignored), MXFP4 = 4.25 bits.
    assert spec.expert_params_b == pytest.approx(114.66, rel=0.001)
    assert spec.bytes_per_param_expert == pytest.approx(0.53125)
    assert spec.weight_format == "mxfp4 experts, bfloat16 rest"
    assert (spec.sliding_window, spec.sliding_window_layer_fraction) == (128, 0.5)


def test_local_qwen_moe_uses_moe_intermediate_size_and_no_window(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "head_dim": 128, "num_attention_heads": 32, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
        "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    spec = resolve_model(str(_write_config(tmp_path / "qwen", config)))
    # 3 * 2048 * 768 * 128 * 48 = 28.99 B experts; 30.53 B total as derived in models.yaml.
    assert spec.expert_params_b == pytest.approx(28.99, rel=0.001)
    assert spec.total_params_b == pytest.approx(30.53, rel=0.001)
    assert spec.sliding_window is None and spec.sliding_window_layer_fraction == 0.0


def test_directory_without_config_json_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="config.json"):
        resolve_model(str(tmp_path))


def test_missing_path_says_it_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError, match="not an existing directory"):
        resolve_model(str(tmp_path / "nope"))


def test_config_missing_required_field_names_it(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "hidden_size"}
    with pytest.raises(UnknownModelError, match="hidden_size"):
        resolve_model(str(_write_config(tmp_path / "broken", config)))


# ---------------------------------------------------------------- drafters


def test_every_drafter_has_a_source_a_catalog_target_and_sane_numbers() -> None:
    for d in list_drafters(include_hypothetical=True):
        assert d.source.strip() and d.local_path is None, d.name
        assert d.published or "HYPOTHETICAL" in d.source, d.name
        assert d.target == resolve_model(d.target or "").name, d.name
        assert d.method == "eagle3" and d.num_layers > 0 and d.hidden_size > 0, d.name
        for k in (d.trained_k, d.recommended_k):
            assert k is None or k > 0, d.name
        if d.trained_k is not None and d.recommended_k is not None:
            assert d.recommended_k <= d.trained_k, d.name
        for workload, ref in d.reference_acceptance.items():
            # AL counts the bonus token: 1 <= AL <= K + 1.
            assert 1.0 <= ref["acceptance_length"] <= ref["k"] + 1, (d.name, workload)
            assert ref["source"].strip(), (d.name, workload)
            assert workload in REFERENCE_WORKLOADS, (d.name, workload)
        if d.layer_rate_factors:
            assert d.layer_rate_factors.get(d.num_layers) == 1.0 and d.layer_variants_source, d.name
            assert all(0.0 < f <= 1.0 for n, f in d.layer_rate_factors.items() if n < d.num_layers), d.name


def test_published_p_eagle_reference_points() -> None:
    d = get_drafter("amazon/gpt-oss-120b-p-eagle")
    assert (d.num_layers, d.trained_k, d.recommended_k, d.parallel_drafting) == (4, 8, 5, True)
    assert {w: (r["k"], r["acceptance_length"]) for w, r in d.reference_acceptance.items()} == {
        "mt-bench": (5, 2.68), "humaneval": (5, 3.15), "gsm8k": (5, 3.55)
    }
    d20 = get_drafter("amazon/GPT-OSS-20B-P-EAGLE")
    assert (d20.num_layers, d20.trained_k, d20.recommended_k) == (4, 10, 7)


def test_each_workload_class_finds_its_reference_acceptance() -> None:
    # The model backend maps a workload class to a catalog benchmark; code accepts more drafts than chat.
    refs = get_drafter("gpt-oss-120b-p-eagle").reference_acceptance
    by_class = {cls: refs[bench]["acceptance_length"] for cls, bench in REFERENCE_FOR_CLASS.items()}
    assert by_class["code"] > by_class["chat"]


def test_drafters_for_lists_parallel_heads_first_and_only_for_that_target() -> None:
    found = drafters_for("gpt-oss-120b")
    assert found[0].name == "amazon/gpt-oss-120b-p-eagle"
    assert all(d.target == "openai/gpt-oss-120b" for d in found)
    assert any(not d.parallel_drafting for d in found)  # an EAGLE-3 baseline is listed
    flags = [d.parallel_drafting for d in found]
    assert flags == sorted(flags, reverse=True)
    assert [d.name for d in drafters_for("llama-3.1-8b")] == ["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]
    assert [d.name for d in drafters_for("qwen3-coder-30b")] == [
        "amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE",
        "lmsys/SGLang-EAGLE3-Qwen3-Coder-30B-A3B-Instruct-SpecForge",
    ]


def test_hypothetical_two_layer_variants_are_marked_unpublished_and_derived_from_table_11() -> None:
    found = drafters_for("gpt-oss-120b", include_hypothetical=True)
    variant = next(d for d in found if d.name == "amazon/gpt-oss-120b-p-eagle:2-layer")
    assert variant.published is False and variant.num_layers == 2
    assert "HYPOTHETICAL" in variant.source and "Table 11" in variant.source
    # The factor on every conditional rate takes the paper's 4-layer mean AL(5) over MT-Bench / HumanEval / GSM8K
    # (2.9, 3.5, 3.5 -> 3.3) to the 2-layer 3.0, with the P-EAGLE decay prior.
    prior = position_decay_prior(True)
    base = [fit_curve({5: al}, prior) for al in (2.9, 3.5, 3.5)]
    factor = get_drafter("amazon/gpt-oss-120b-p-eagle").layer_rate_factors[2]
    assert factor == pytest.approx(rate_factor_for_mean(3.0, base, 5))
    assert sum(acceptance_length(a * factor, d, 5) for a, d in base) / 3 == pytest.approx(3.0, abs=1e-6)
    # Applied to the card's MT-Bench curve (AL 2.68 at K=5): 2-layer heads reach 93-97% of the baseline AL in the
    # paper; GPT-OSS 120B's 2-layer mean is 3.0 / 3.3 = 91% of its 4-layer one.
    al = variant.reference_acceptance["mt-bench"]["acceptance_length"]
    assert 0.88 * 2.68 < al < 0.95 * 2.68
    assert all(d.published for d in drafters_for("gpt-oss-120b"))
    assert get_drafter("amazon/gpt-oss-120b-p-eagle:2-layer") == variant


def test_every_target_has_a_p_eagle_and_an_eagle3_head_it_can_predict() -> None:
    # Completeness: each catalog target has at least one parallel-drafting (P-EAGLE) and one plain EAGLE-3 head
    # whose acceptance covers every built-in workload class, so the model backend can compare them.
    for model in list_models():
        heads = drafters_for(model.name, include_hypothetical=True)
        for parallel in (True, False):
            predictable = [
                d for d in heads
                if d.parallel_drafting is parallel and set(REFERENCE_FOR_CLASS.values()) <= set(d.reference_acceptance)
            ]
            assert predictable, (model.name, "P-EAGLE" if parallel else "EAGLE-3")


def test_gpt_oss_and_qwen_heads_are_predictable_without_hypotheticals() -> None:
    # The targets of the P-EAGLE release have a released head of each kind with acceptance.
    for model in ("gpt-oss-120b", "gpt-oss-20b", "qwen3-coder-30b"):
        heads = [d for d in drafters_for(model) if d.reference_acceptance]
        assert {d.parallel_drafting for d in heads} == {True, False}, model


def test_two_published_depths_fix_the_per_position_curve_exactly() -> None:
    # vLLM P-EAGLE blog, GPT-OSS 20B: AL at K=3 and K=7 for both heads; the curve reproduces both.
    for name in ("amazon/GPT-OSS-20B-P-EAGLE", "RedHatAI/gpt-oss-20b-speculator.eagle3"):
        for workload, ref in get_drafter(name).reference_acceptance.items():
            if "nearest" in ref:
                continue
            survival = reference_survival(ref, 16)
            for k, al in ref.get("points", {}).items():
                # SPEED-Bench EAGLE-3 (2.24 at K=3, 2.59 at K=7) needs a rate that RISES with depth; the curve is
                # clamped to a constant rate, 0.021 short at K=7.
                tolerance = 0.025 if ref["position_decay"] >= 1.0 else 1e-6
                assert 1.0 + sum(survival[:k]) == pytest.approx(al, abs=tolerance), (name, workload, k)
            assert all(b <= a for a, b in zip(survival, survival[1:], strict=False))
    # HumanEval, P-EAGLE: AL(3) = 3.02, AL(7) = 3.94 -> the conditional rate falls from 0.838 by 4.5% per position.
    ref = get_drafter("amazon/GPT-OSS-20B-P-EAGLE").reference_acceptance["humaneval"]
    assert (ref["first_rate"], ref["position_decay"]) == pytest.approx((0.838, 0.955), abs=1e-3)


def test_one_published_depth_borrows_the_decay_of_heads_of_its_kind() -> None:
    # The prior is the mean two-depth decay of the catalog's heads drafting the same way; with it the one
    # published point is reproduced and acceptance beyond it falls faster than a constant rate would say.
    parallel = [r["position_decay"] for r in get_drafter("amazon/GPT-OSS-20B-P-EAGLE").reference_acceptance.values()
                if len(r.get("points", {})) == 2]
    assert position_decay_prior(True) == pytest.approx(sum(parallel) / len(parallel))
    ref = get_drafter("amazon/gpt-oss-120b-p-eagle").reference_acceptance["mt-bench"]
    curve = reference_survival(ref, 8)
    assert 1 + sum(curve[:5]) == pytest.approx(2.68, abs=1e-6)
    constant = fit_curve({5: 2.68}, 1.0)
    assert 1 + sum(curve) < acceptance_length(*constant, 8)
    assert acceptance_survival({5: 2.68}, True, 8) == pytest.approx(curve)


def test_a_workload_without_its_own_figure_borrows_the_nearest_and_says_so() -> None:
    ref = get_drafter("RedHatAI/gpt-oss-20b-speculator.eagle3").reference_acceptance["gsm8k"]
    humaneval = get_drafter("RedHatAI/gpt-oss-20b-speculator.eagle3").reference_acceptance["humaneval"]
    assert ref["nearest"] == "humaneval" and ref["source"].startswith("NEAREST WORKLOAD")
    assert ref["acceptance_length"] == humaneval["acceptance_length"]


def test_derived_eagle3_figures_follow_their_stated_arithmetic() -> None:
    # NVIDIA's gpt-oss-120b head has no published AL: the paper's EAGLE-3 accepted tokens scaled by the released
    # P-EAGLE card / paper ratio (source text): 1 + (E - 1) * (card - 1) / (paper - 1).
    refs = get_drafter("nvidia/gpt-oss-120b-Eagle3-short-context").reference_acceptance
    for workload, eagle3, paper, card in (("mt-bench", 2.7, 2.9, 2.68), ("humaneval", 3.5, 3.5, 3.15),
                                          ("gsm8k", 3.3, 3.5, 3.55)):
        assert refs[workload]["acceptance_length"] == pytest.approx(1 + (eagle3 - 1) * (card - 1) / (paper - 1),
                                                                    abs=0.005)
        assert "DERIVED" in refs[workload]["source"]


def test_paper_only_heads_are_hypothetical_and_listed_only_on_request() -> None:
    head = get_drafter("p-eagle-paper/Llama-3.1-8B-Instruct-P-EAGLE")
    assert head.published is False and "HYPOTHETICAL" in head.source
    assert head.name not in [d.name for d in drafters_for("llama-3.1-8b")]
    assert head.name in [d.name for d in drafters_for("llama-3.1-8b", include_hypothetical=True)]


def test_a_layer_count_without_a_published_ratio_cannot_be_predicted() -> None:
    with pytest.raises(ValueError, match="3-layer"):
        get_drafter("amazon/gpt-oss-120b-p-eagle").with_layers(3)
    # A head without a published layer ablation has no variants at all.
    assert get_drafter("amazon/gpt-oss-120b-p-eagle-long-context").variants() == [
        get_drafter("amazon/gpt-oss-120b-p-eagle-long-context")
    ]
    with pytest.raises(UnknownModelError):
        get_drafter("amazon/gpt-oss-120b-p-eagle:3-layer")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("amazon/gpt-oss-20b-p-eagle", "amazon/GPT-OSS-20B-P-EAGLE"),
        ("GPT-OSS-120B-P-EAGLE", "amazon/gpt-oss-120b-p-eagle"),
        ("nvidia/gpt-oss-120b-Eagle3", "nvidia/gpt-oss-120b-Eagle3-throughput"),
    ],
)
def test_get_drafter_accepts_aliases_case_insensitively(name: str, expected: str) -> None:
    assert get_drafter(name).name == expected


def test_get_drafter_rejects_a_drafter_for_another_target() -> None:
    with pytest.raises(ConfigError) as info:
        get_drafter("amazon/gpt-oss-120b-p-eagle", target="gpt-oss-20b")
    assert "amazon/GPT-OSS-20B-P-EAGLE" in str(info.value)  # the fix: drafters for the right target
    assert get_drafter("amazon/gpt-oss-120b-p-eagle", target="gpt-oss-120b").target == "openai/gpt-oss-120b"


def test_unknown_drafter_lists_known_names_and_mentions_local_paths() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_drafter("someone/nonexistent-eagle")
    message = str(info.value)
    assert "amazon/gpt-oss-120b-p-eagle" in message and "local path" in message and "\n" not in message


@pytest.mark.parametrize(
    ("extra", "parallel"),
    [({"pard_token": 128002}, True), ({"mask_token_id": 5}, True), ({"ptd_token_id": 7}, True), ({}, False)],
)
def test_local_drafter_parallel_drafting_follows_its_mask_token(
    tmp_path: Path, extra: dict[str, Any], parallel: bool
) -> None:
    config = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 2, "hidden_size": 256, **extra}
    directory = _write_config(tmp_path / "head", config)
    drafter = get_drafter(str(directory), target="gpt-oss-20b")
    assert drafter.parallel_drafting is parallel
    assert (drafter.num_layers, drafter.hidden_size, drafter.method) == (2, 256, "eagle3")
    assert drafter.target == "openai/gpt-oss-20b" and drafter.local_path == str(directory.resolve())


def test_local_plain_causal_lm_drafter_is_a_draft_model(tmp_path: Path) -> None:
    directory = _write_config(tmp_path / "tiny", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
                                                  "hidden_size": 128, "num_speculative_tokens": 4})
    drafter = get_drafter(str(directory))
    assert (drafter.method, drafter.target, drafter.trained_k) == ("draft_model", None, 4)


def test_local_model_directory_has_no_catalog_drafters(tmp_path: Path) -> None:
    assert drafters_for(str(_write_config(tmp_path / "m", LLAMA_8B_CONFIG))) == []

