"""The roofline's pure functions (autotune.backends._roofline, _drafter_cost, _step): derivations checked on small,
hand-built specs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autotune.backends._drafter_cost import draft_cost
from autotune.backends._roofline import (
    RooflineParams,
    attention_flops_per_token,
    expected_distinct_experts,
    moe_tile,
    routed_tokens,
    target_pass,
    tensor_tflops,
)
from autotune.backends._step import Calibration, fit_calibration, memory_budget, step_time
from autotune.catalogs import DrafterSpec, GPUSpec, ModelSpec
from autotune.errors import UsageError

# A GPU with round numbers: 1000 GB/s, 100 TFLOP/s bf16, 200 fp8, no fp4.
GPU = GPUSpec(
    key="toy",
    display_name="Toy GPU",
    aliases=(),
    memory_gb=80.0,
    memory_bandwidth_gbps=1000.0,
    bf16_tflops=100.0,
    fp8_tflops=200.0,
    fp4_tflops=None,
    source="test",
)
# Efficiencies 1, perfect overlap, no overheads, no sampler traffic, independent routing: times are bytes /
# bandwidth and FLOPs / rate exactly.
IDEAL = RooflineParams(
    kernel_overlap_loss=0.0,
    draft_token_overhead_ms=0.0,
    bandwidth_efficiency=1.0,
    compute_efficiency=1.0,
    moe_compute_efficiency=1.0,
    step_overhead_ms=0.0,
    request_overhead_ms=0.0,
    layer_overhead_ms=0.0,
    moe_layer_overhead_ms=0.0,
    spec_step_overhead_ms=0.0,
    draft_pass_overhead_ms=0.0,
    routing_locality=0.0,
    sampler_bytes_per_logit=0.0,
)


def dense(**changes: object) -> ModelSpec:
    """A dense model: 10 layers, hidden 1000, 1.1 B params of which 0.1 B is the (untied) embedding."""
    spec = ModelSpec(
        name="toy-dense",
        aliases=(),
        num_layers=10,
        hidden_size=1000,
        num_attention_heads=8,
        num_kv_heads=2,
        head_dim=125,
        vocab_size=100_000,
        num_experts=0,
        experts_per_token=0,
        total_params_b=1.1,
        active_params_b=1.1,
        expert_params_b=0.0,
        weight_format="bf16",
        bytes_per_param_expert=2.0,
        bytes_per_param_other=2.0,
        kv_bytes_per_element=2.0,
        sliding_window=None,
        sliding_window_layer_fraction=0.0,
        source="test",
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def moe() -> ModelSpec:
    """An MoE model: 10 layers x 64 experts x 1 M params = 0.64 B expert params, top-2; 0.2 B other (0.1 B of it
    the embedding)."""
    return dense(
        name="toy-moe",
        num_experts=64,
        experts_per_token=2,
        total_params_b=0.84,
        active_params_b=0.12,
        expert_params_b=0.64,
        bytes_per_param_expert=1.0,
    )


def drafter(**changes: object) -> DrafterSpec:
    spec = DrafterSpec(
        name="toy-head",
        target="toy-dense",
        method="eagle3",
        num_layers=2,
        hidden_size=1000,
        trained_k=8,
        recommended_k=5,
        parallel_drafting=True,
        reference_acceptance={},
        source="test",
    )
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


# ---- distinct experts ----------------------------------------------------------------------------------------


def test_one_token_touches_exactly_its_k_experts() -> None:
    # E * (1 - (1 - k/E)^1) = E * k/E = k.
    assert expected_distinct_experts(128, 4, 1) == pytest.approx(4.0, abs=1e-12)
    assert expected_distinct_experts(64, 2, 1) == pytest.approx(2.0, abs=1e-12)


def test_many_tokens_touch_every_expert_and_never_more() -> None:
    # (1 - 4/128)^2000 = exp(2000 * ln(0.96875)) ~ e^-63.5: every expert is touched.
    assert expected_distinct_experts(128, 4, 2000) == pytest.approx(128.0, abs=1e-9)
    values = [expected_distinct_experts(128, 4, n) for n in range(1, 600)]
    assert all(a < b or b == pytest.approx(128.0) for a, b in zip(values, values[1:], strict=False))
    assert max(values) <= 128.0


def test_dense_model_has_no_experts() -> None:
    assert expected_distinct_experts(0, 0, 1000) == 0.0


def test_distinct_experts_matches_a_simulated_router() -> None:
    # Uniform routing: each token picks 4 distinct experts of 128. 20k simulated steps of 6 tokens; the sample mean
    # has a standard error of ~0.02 experts, so 0.15 is > 5 sigma.
    rng = np.random.default_rng(0)
    trials, tokens, experts, k = 20_000, 6, 128, 4
    choice = np.argsort(rng.random((trials, tokens, experts)), axis=2)[:, :, :k]
    used = np.zeros((trials, experts), dtype=bool)
    for t in range(tokens):
        np.put_along_axis(used, choice[:, t, :], True, axis=1)
    simulated = used.sum(axis=1).mean()
    assert simulated == pytest.approx(expected_distinct_experts(experts, k, tokens), abs=0.15)


# ---- weights, KV, FLOPs --------------------------------------------------------------------------------------


def test_dense_model_reads_all_weights_but_the_embedding_whatever_the_batch() -> None:
    # 1.1 B - 0.1 B embedding (a gather) = 1.0 B params * 2 B = 2.0 GB at any batch.
    model = dense()
    for batch in (1, 64, 512):
        assert step_time(model, GPU, batch, params=IDEAL, context_tokens=0).verify.weight_bytes == pytest.approx(2e9)


def test_tied_embedding_is_read_as_the_lm_head() -> None:
    # Tied: the one table is the LM head and is read whole: all 1.1 B params * 2 B.
    st = step_time(dense(tie_word_embeddings=True), GPU, 1, params=IDEAL, context_tokens=0)
    assert st.verify.weight_bytes == pytest.approx(2.2e9)


def test_moe_reads_only_the_experts_its_tokens_touch() -> None:
    # Other params read: 0.2 B - 0.1 B embedding = 0.1 B * 2 B = 0.2 GB. One expert-layer: 0.64 B / (64 * 10)
    # = 1 M params * 1 B = 1 MB. B=1: 2 experts * 10 layers = 20 MB. 3 tokens: 64 * (1 - 62^3/64^3) = 64 * 23816/262144
    # = 5.814453125 experts per layer -> 58.14453125 MB.
    model = moe()
    one = step_time(model, GPU, 1, params=IDEAL, context_tokens=0).verify.weight_bytes
    assert one == pytest.approx(0.2e9 + 20e6)
    three = step_time(model, GPU, 3, params=IDEAL, context_tokens=0).verify.weight_bytes
    assert three == pytest.approx(0.2e9 + 58.14453125e6)
    # 1000 tokens touch every expert: 640 MB of experts.
    many = step_time(model, GPU, 1000, params=IDEAL, context_tokens=0).verify.weight_bytes
    assert many == pytest.approx(0.2e9 + 640e6, rel=1e-9)


def test_kv_is_read_once_per_request_whatever_k() -> None:
    # KV per token-layer: 2 * 2 heads * 125 * 2 B = 1000 B; 10 layers * 1000 tokens -> 10 MB per request.
    model = dense()
    head = drafter()
    for k in (0, 1, 5):
        st = step_time(model, GPU, 4, k, head, True, context_tokens=1000, params=IDEAL)
        assert st.verify.kv_bytes == pytest.approx(4 * 10e6)


def test_sliding_window_layers_see_at_most_the_window() -> None:
    # Half of 10 layers slide with a window of 100. Per layer 4 * 8 * 125 = 4000 FLOP per context token:
    # 5 * 4000 * 10_000 + 5 * 4000 * 100 = 202 MFLOP (a full model would be 400 MFLOP).
    model = dense(sliding_window=100, sliding_window_layer_fraction=0.5)
    assert attention_flops_per_token(model, 10_000) == pytest.approx(202e6)
    assert attention_flops_per_token(dense(), 10_000) == pytest.approx(400e6)


def test_step_time_is_the_roofline_of_each_component_plus_overheads() -> None:
    # Dense, B=1, no context: 2 GB / 1000 GB/s = 2 ms memory; 2 * 1.0 B FLOPs / 100 TFLOP/s = 0.02 ms compute.
    model = dense()
    st = step_time(model, GPU, 1, params=IDEAL, context_tokens=0)
    assert st.verify.memory_ms == pytest.approx(2.0)
    assert st.verify.compute_ms == pytest.approx(0.02)
    assert st.bound == "memory"
    assert st.total_ms == pytest.approx(2.0)
    # With overheads: + step 0.5 + 1 request * 0.01 + 10 layers * 0.015 (dense: no MoE term).
    params = dataclasses.replace(
        IDEAL, step_overhead_ms=0.5, request_overhead_ms=0.01, layer_overhead_ms=0.015, moe_layer_overhead_ms=0.03
    )
    assert step_time(model, GPU, 1, params=params, context_tokens=0).total_ms == pytest.approx(2.0 + 0.5 + 0.01 + 0.15)
    # B=1000: compute 2 * 1e9 * 1000 / 1e14 = 20 ms > memory 2 ms.
    big = step_time(model, GPU, 1000, params=IDEAL, context_tokens=0)
    assert big.bound == "compute"
    assert big.total_ms == pytest.approx(20.0)


def test_components_do_not_hide_each_other() -> None:
    # A compute-bound weight GEMM does not hide the KV read of attention (another kernel): B=1000, context 1000:
    # weights 20 ms compute; KV 1000 requests * 10 MB = 10 GB -> 10 ms of memory; attention FLOPs
    # 1000 tokens * 4 * 8 * 125 * 1000 * 10 layers = 0.4 TFLOP -> 4 ms, below its 10 ms of KV.
    st = step_time(dense(), GPU, 1000, params=IDEAL, context_tokens=1000)
    assert st.verify.busy_ms == pytest.approx(20.0 + 10.0)


def test_sampler_moves_the_logits_of_every_verified_token() -> None:
    # 12 B per logit: B=4, K=3 -> 16 tokens * 100k vocab * 12 B = 19.2 MB = 0.0192 ms at 1000 GB/s.
    params = dataclasses.replace(IDEAL, sampler_bytes_per_logit=12.0)
    with_sampler = target_pass(dense(), GPU, 16, 4, 0, params).busy_ms
    without = target_pass(dense(), GPU, 16, 4, 0, IDEAL).busy_ms
    assert with_sampler - without == pytest.approx(0.0192)


def test_efficiencies_divide_the_datasheet_rates() -> None:
    params = dataclasses.replace(IDEAL, bandwidth_efficiency=0.8, compute_efficiency=0.5)
    st = step_time(dense(), GPU, 1, params=params, context_tokens=0)
    assert st.verify.memory_ms == pytest.approx(2.0 / 0.8)
    assert st.verify.compute_ms == pytest.approx(0.02 / 0.5)


def test_moe_grouped_gemms_turn_compute_bound_when_tokens_share_experts() -> None:
    # toy MoE: 64 experts of 1 M params (1 B each) x 10 layers, top-2; tile 16 rows; MoE at 10% of the 200 TFLOP/s
    # fp8 rate = 20 TFLOP/s. 8 tokens: 7.5 experts, one padded tile each -> 7.5 * 16 rows * 2 * 1 M * 10
    # = 2.4 GFLOP (0.12 ms) against 75 MB of experts (0.075 ms): the tile padding already shows. 1000 tokens: all
    # 64 experts, 2000 rows = 31 per expert, so the tile grows to 32 (next power of two, `moe_tile`): 2000 rows
    # + 64 * 16 padding = 3024 rows -> 60 GFLOP = 3.0 ms against 0.64 ms of weights.
    params = dataclasses.replace(IDEAL, moe_compute_efficiency=0.1, moe_tile_rows=16)
    model = moe()
    few = target_pass(model, GPU, 8, 8, 0, params)
    experts = expected_distinct_experts(64, 2, 8)
    assert few.flops - 2 * 8 * 0.1e9 == pytest.approx(2 * 10 * experts * 16 * 1e6)
    many = target_pass(model, GPU, 1000, 1000, 0, params)
    assert moe_tile(2000, 64, params) == 32
    moe_ms = 2 * 10 * (2000 + 64 * 16) * 1e6 / 20e12 * 1e3
    assert moe_ms == pytest.approx(3.024)
    assert many.compute_bound_ms == pytest.approx(moe_ms + 2 * 1000 * 0.1e9 / 100e12 * 1e3)


def test_moe_tile_grows_with_rows_per_expert_like_triton_kernels() -> None:
    # block_m = max(16, min(next_pow2(rows // experts), 128)): gpt-oss-120b (128 experts, top-4) at 64 requests x
    # 5 verified tokens routes 1280 rows, 10 per expert -> 16; gpt-oss-20b (32 experts) at that step 40 -> 64;
    # plain decoding of 64 requests on gpt-oss-20b: 256 rows, 8 per expert -> 16; a long prefill caps at 128.
    params = RooflineParams()
    assert moe_tile(1280, 128, params) == 16
    assert moe_tile(1280, 32, params) == 64
    assert moe_tile(256, 32, params) == 16
    assert moe_tile(2560, 128, params) == 32
    assert moe_tile(8192 * 4, 32, params) == 128
    assert moe_tile(0, 32, params) == 16


def test_tokens_of_one_request_route_alike() -> None:
    # B requests verifying K drafts route like B * (1 + K * (1 - locality)) independent tokens; K = 0 is B exactly.
    assert routed_tokens(8, 0, 0.45) == 8
    assert routed_tokens(1, 7, 0.3) == pytest.approx(5.9)
    params = dataclasses.replace(IDEAL, routing_locality=0.5)
    st = step_time(moe(), GPU, 1, 4, drafter(), True, 0, params)  # 5 tokens route like 3
    assert st.verify.weight_bytes == pytest.approx(0.2e9 + 10 * expected_distinct_experts(64, 2, 3.0) * 1e6)


def test_weight_format_picks_the_tensor_rate() -> None:
    blackwell = dataclasses.replace(GPU, fp4_tflops=400.0)
    assert tensor_tflops(2.0, GPU) == 100.0  # bf16
    assert tensor_tflops(1.0, GPU) == 200.0  # fp8 tensor cores
    assert tensor_tflops(0.53125, GPU) == 100.0  # mxfp4 dequantised to bf16 where there is no FP4 (Hopper)
    assert tensor_tflops(0.53125, blackwell) == 200.0  # W4A8 on Blackwell


# ---- drafting ------------------------------------------------------------------------------------------------


def test_k0_is_the_plain_decode_step_whatever_the_drafter() -> None:
    params = RooflineParams()
    plain = step_time(moe(), GPU, 8, 0, None, False, 500, params)
    with_head = step_time(moe(), GPU, 8, 0, drafter(), True, 500, params)
    assert with_head.total_ms == plain.total_ms
    assert with_head.draft_ms == 0.0 and with_head.overhead_ms == plain.overhead_ms


def test_parallel_drafting_is_one_pass_whatever_k_and_sequential_is_k_passes() -> None:
    params = RooflineParams(kernel_overlap_loss=0.0)  # pure roofline: a memory-bound pass costs its bytes
    head = drafter()
    parallel = [draft_cost(head, dense(), GPU, 1, k, True, 500, params) for k in range(1, 9)]
    sequential = [draft_cost(head, dense(), GPU, 1, k, False, 500, params) for k in range(1, 9)]
    assert [d.passes for d in parallel] == [1] * 8
    assert [d.passes for d in sequential] == list(range(1, 9))
    # Parallel reads the head's weights once: bytes do not grow with K. Sequential reads them K times.
    assert len({d.cost.weight_bytes for d in parallel}) == 1
    for k, d in enumerate(sequential, start=1):
        assert d.cost.weight_bytes == pytest.approx(k * sequential[0].cost.weight_bytes)
        assert d.cost.total_ms == pytest.approx(k * sequential[0].cost.total_ms)
    # At B=1 both are memory-bound, so K=1 costs the same either way; at K=8 sequential costs ~8x.
    assert parallel[7].cost.total_ms < sequential[7].cost.total_ms / 4


def test_drafter_lm_head_over_a_large_vocab_is_priced() -> None:
    # The LM head is vocab * h = 100k * 1000 = 0.1 B params, three times the head's 2 layers of 16 * h^2 = 32 M.
    small_vocab = dense(vocab_size=1000)
    params = RooflineParams()
    big = draft_cost(drafter(), dense(), GPU, 1, 3, True, 0, params).cost.weight_bytes
    small = draft_cost(drafter(), small_vocab, GPU, 1, 3, True, 0, params).cost.weight_bytes
    # (2 * 16 M layers + 3 M fusion + 100 M head) * 2 B vs (32 M + 3 M + 1 M) * 2 B.
    assert big == pytest.approx((32e6 + 3e6 + 100e6) * 2)
    assert small == pytest.approx((32e6 + 3e6 + 1e6) * 2)
    # A reduced ("hot") draft vocabulary of 10k rows: (32 M + 3 M + 10 M) * 2 B.
    hot = draft_cost(drafter(draft_vocab_size=10_000), dense(), GPU, 1, 3, True, 0, params).cost.weight_bytes
    assert hot == pytest.approx((32e6 + 3e6 + 10e6) * 2)


def test_drafting_rows_follow_vllm_sequential_and_parallel_layouts() -> None:
    # B=2, K=3, 2 layers of 16 M (h=1000), fusion 3 M, LM head 100 M, no context.
    # Parallel: one pass over B(K+1) + B(K-1) = 12 rows, fusion on the 8 verified rows, LM head at B*K = 6 rows.
    # Sequential: a pass over 8 rows (fusion on all 8, LM head at 2 rows), then 2 passes over 2 rows.
    head, model = drafter(), dense()
    parallel = draft_cost(head, model, GPU, 2, 3, True, 0, IDEAL).cost
    assert parallel.flops == pytest.approx(2 * 12 * 32e6 + 2 * 8 * 3e6 + 2 * 6 * 100e6)
    sequential = draft_cost(head, model, GPU, 2, 3, False, 0, IDEAL).cost
    first = 2 * 8 * 32e6 + 2 * 8 * 3e6 + 2 * 2 * 100e6
    rest = 2 * 2 * 32e6 + 2 * 2 * 100e6
    assert sequential.flops == pytest.approx(first + 2 * rest)
    assert sequential.passes == 3 and parallel.passes == 1


def test_k_needs_a_drafter() -> None:
    with pytest.raises(ValueError, match="needs a drafter"):
        step_time(dense(), GPU, 1, 3)


# ---- memory ----------------------------------------------------------------------------------------------------


def test_memory_budget_counts_weights_drafter_and_kv() -> None:
    # usable = 0.9 * 80 - 2 = 70 GB; weights 1.1 B * 2 B = 2.2 GB; head stored = (32 M + 3 M + 100 M LM head
    # + 100 M embedding) * 2 B = 0.47 GB; KV per request at 100 + 3 + 1 tokens: 1000 B * (10 + 2 head layers)
    # * 104 = 1.248 MB.
    budget = memory_budget(dense(), GPU, 100, drafter(), 3)
    assert budget.usable_gb == pytest.approx(70.0)
    assert budget.weights_gb == pytest.approx(2.2)
    assert budget.drafter_gb == pytest.approx(0.47)
    assert budget.kv_gb_per_request == pytest.approx(1.248e-3)
    assert budget.max_requests == int((70.0 - 2.2 - 0.47) / 1.248e-3)
    # No speculation: no drafter in memory.
    assert memory_budget(dense(), GPU, 100, drafter(), 0).drafter_gb == 0.0


# ---- calibration ---------------------------------------------------------------------------------------------


def test_fit_calibration_recovers_a_known_scale_and_offset() -> None:
    # Measured = 1.7 * predicted + 0.8 exactly -> the fit returns it.
    predicted = [2.0, 3.5, 7.0, 12.0, 20.0]
    cal = fit_calibration([(p, 1.7 * p + 0.8) for p in predicted])
    assert cal.scale_verify == pytest.approx(1.7) and cal.scale_draft == pytest.approx(1.7)
    assert cal.overhead_ms == pytest.approx(0.8)
    assert cal.apply(3.0, 1.0) == pytest.approx(1.7 * 4.0 + 0.8)


def test_fit_calibration_separates_verify_and_draft_scales() -> None:
    # Steps at several (B, K) from the roofline; "measured" = 1.3 * verify side + 2.0 * draft side + 0.5.
    params = RooflineParams()
    steps = [step_time(moe(), GPU, b, k, drafter(), False, 300, params) for b in (1, 4, 16) for k in (0, 2, 5)]
    rows = [(s.verify_side_ms, s.draft_side_ms, 1.3 * s.verify_side_ms + 2.0 * s.draft_side_ms + 0.5) for s in steps]
    cal = fit_calibration(rows)
    assert (cal.scale_verify, cal.scale_draft, cal.overhead_ms) == pytest.approx((1.3, 2.0, 0.5))
    assert steps[4].calibrated_ms(cal) == pytest.approx(rows[4][2])


def test_fit_calibration_rejects_points_that_determine_nothing() -> None:
    with pytest.raises(UsageError, match="at least 2"):
        fit_calibration([(3.0, 5.0), (3.0, 6.0)])
    with pytest.raises(UsageError, match="pairs"):
        fit_calibration([(1.0, 2.0), (1.0, 2.0, 3.0)])  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="non-positive scale"):
        fit_calibration([(1.0, 9.0), (2.0, 5.0), (3.0, 1.0)])


def test_identity_calibration_changes_nothing() -> None:
    st = step_time(moe(), GPU, 4, 3, drafter(), True, 200, RooflineParams())
    assert st.calibrated_ms(Calibration()) == pytest.approx(st.total_ms)
    assert st.calibrated_ms(None) == st.total_ms


def test_params_reject_impossible_fractions() -> None:
    with pytest.raises(UsageError, match="bandwidth_efficiency"):
        RooflineParams(bandwidth_efficiency=1.5)
    with pytest.raises(UsageError, match="routing_locality"):
        RooflineParams(routing_locality=1.0)
