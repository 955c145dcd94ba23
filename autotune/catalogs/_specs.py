"""The catalog record types: a GPU, a target model, a drafter. Plain frozen dataclasses with their units."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple, NotRequired, TypedDict

from autotune.catalogs._acceptance_curve import acceptance_length, fit_curve, survival


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet figures. All compute rates are DENSE (no 2:4 sparsity)."""

    key: str
    """Lower-case catalog key, e.g. "h200"."""
    display_name: str
    """Vendor name, e.g. "NVIDIA H200 SXM 141GB"."""
    aliases: tuple[str, ...]
    """Other names accepted by `get_gpu` (case-insensitive), e.g. "h200-sxm", "NVIDIA H200"."""
    memory_gb: float
    """Device memory in GB (10^9 bytes) as the vendor states it."""
    memory_bandwidth_gbps: float
    """Peak memory bandwidth in GB/s (10^9 bytes/s)."""
    bf16_tflops: float
    """Dense BF16 tensor-core peak in TFLOPS."""
    fp8_tflops: float | None
    """Dense FP8 tensor-core peak in TFLOPS; None where the GPU has no FP8 tensor format."""
    fp4_tflops: float | None
    """Dense FP4 tensor-core peak in TFLOPS; None where the GPU has no FP4 tensor format."""
    source: str
    """Where the figures come from (datasheet and what it says)."""


class ParamCounts(NamedTuple):
    """Parameter counts in billions, derived from the architecture (biases and norms ignored)."""

    total_b: float
    active_b: float
    expert_b: float


@dataclass(frozen=True)
class ModelSpec:
    """A target model's architecture and storage format, enough for roofline predictions."""

    name: str
    """Hugging Face id (catalog entries) or the absolute path of a local model directory."""
    aliases: tuple[str, ...]
    """Other names accepted by `resolve_model` (case-insensitive)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int
    """Routed experts per layer; 0 for a dense model."""
    experts_per_token: int
    """Experts each token is routed to (top-k); 0 for a dense model."""
    total_params_b: float
    """All parameters, billions."""
    active_params_b: float
    """Parameters active per token (top-k experts only), billions, as the publisher counts them: gpt-oss counts the
    unembedding but not the embedding table, Qwen and Llama count both. `derived_params().active_b` gives the
    weights a decode step actually reads (embedding lookups excluded)."""
    expert_params_b: float
    """Routed-expert parameters of all experts of all layers, billions (0 for dense)."""
    weight_format: str
    """Human description of the checkpoint's storage, e.g. "mxfp4 experts, bf16 rest"."""
    bytes_per_param_expert: float
    """Bytes per expert parameter as stored (MXFP4: 4.25 bits = 0.53125 bytes)."""
    bytes_per_param_other: float
    """Bytes per non-expert parameter as stored (bf16: 2)."""
    kv_bytes_per_element: float
    """Bytes per K or V element in the KV cache (2 for a bf16 cache)."""
    sliding_window: int | None
    """Banded-attention window in tokens for the sliding layers; None when no layer uses one."""
    sliding_window_layer_fraction: float
    """Fraction of layers that use the sliding window (gpt-oss alternates: 0.5)."""
    source: str
    """Where the figures come from."""
    ffn_intermediate_size: int = 0
    """Width of one expert's MLP (MoE) or of the dense MLP; 0 when unknown."""
    tie_word_embeddings: bool = False
    """The unembedding shares the embedding matrix."""
    local_path: str | None = None
    """Directory the spec was read from; None for catalog entries."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def weight_bytes(self) -> float:
        """Bytes of all weights as stored (predicted from parameter counts and formats, not measured)."""
        other_b = self.total_params_b - self.expert_params_b
        return (self.expert_params_b * self.bytes_per_param_expert + other_b * self.bytes_per_param_other) * 1e9

    def kv_bytes_per_token_per_layer(self) -> float:
        """Bytes of K plus V for one token in one attention layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element

    def kv_bytes(self, context_tokens: int) -> float:
        """Bytes of KV cache one sequence of `context_tokens` tokens holds (sliding layers keep only the window).

        Example: gpt-oss-120b, 1000 tokens: 2*8*64*2 = 2048 B per token-layer; 18 full layers hold 1000 tokens,
        18 sliding layers hold 128, so 2048 * (18*1000 + 18*128) = 41,582,592 bytes.
        """
        if context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, but got {context_tokens}.")
        sliding_layers = self.num_layers * self.sliding_window_layer_fraction if self.sliding_window else 0.0
        full_layers = self.num_layers - sliding_layers
        window = min(context_tokens, self.sliding_window) if self.sliding_window else context_tokens
        return self.kv_bytes_per_token_per_layer() * (full_layers * context_tokens + sliding_layers * window)

    def derived_params(self) -> ParamCounts:
        """Parameter counts computed from the architecture fields (a cross-check of the published counts)."""
        return architecture_params(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            ffn_intermediate_size=self.ffn_intermediate_size,
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            tie_word_embeddings=self.tie_word_embeddings,
        )


def architecture_params(
    *,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int,
    vocab_size: int,
    ffn_intermediate_size: int,
    num_experts: int,
    experts_per_token: int,
    tie_word_embeddings: bool,
) -> ParamCounts:
    """Parameter counts (billions) of a Llama-style decoder with gated MLPs (three matrices per MLP).

    Per layer: attention = 2*h*(q_heads*d) + 2*h*(kv_heads*d); MLP = 3*h*ffn (per expert for MoE, plus a router of
    h*E). Embedding and unembedding are v*h each (once when tied). Active counts read top-k experts and the
    unembedding, not the embedding table (a lookup). Example (Llama-3.1-8B): 32*(2*4096*4096 + 2*4096*1024)
    + 32*3*4096*14336 + 2*128256*4096 = 8.03 B.
    """
    attention = 2 * hidden_size * num_attention_heads * head_dim + 2 * hidden_size * num_kv_heads * head_dim
    mlp_one = 3 * hidden_size * ffn_intermediate_size
    embed = vocab_size * hidden_size
    unembed = 0 if tie_word_embeddings else vocab_size * hidden_size
    if num_experts > 0:
        experts = num_layers * num_experts * mlp_one
        router = num_layers * hidden_size * num_experts
        rest = num_layers * attention + router + embed + unembed
        active = num_layers * experts_per_token * mlp_one + num_layers * attention + router + vocab_size * hidden_size
        return ParamCounts((experts + rest) / 1e9, active / 1e9, experts / 1e9)
    total = num_layers * (attention + mlp_one) + embed + unembed
    active = num_layers * (attention + mlp_one) + vocab_size * hidden_size
    return ParamCounts(total / 1e9, active / 1e9, 0.0)


class ReferenceAcceptance(TypedDict):
    """A published acceptance length: AL at depth k (mean tokens per verification step, bonus token included).

    ``k`` / ``acceptance_length`` is the primary point (the deepest published K). The optional keys carry what the
    catalog derived from it (see `autotune.catalogs._acceptance_curve`): every published ``{K: AL}`` point, the
    per-position curve through them (``first_rate``, ``position_decay``) and, in words, how it was derived and,
    when this workload has no figure of its own, the ``nearest`` workload whose figure it borrows.
    """

    k: int
    acceptance_length: float
    source: str
    points: NotRequired[dict[int, float]]
    """Every published K -> AL for this workload and head (includes ``k``)."""
    first_rate: NotRequired[float]
    """Conditional acceptance rate of draft position 1 of the fitted curve."""
    position_decay: NotRequired[float]
    """Factor by which the conditional rate falls per position (1 = constant rate)."""
    derivation: NotRequired[str]
    """How the per-position curve was obtained (two published K, or one K plus a decay prior)."""
    nearest: NotRequired[str]
    """Set when the figures are borrowed from another workload of the same head: that workload's name."""


def reference_survival(ref: ReferenceAcceptance, max_k: int) -> tuple[float, ...]:
    """The per-position survival ``(s_1, ..., s_max_k)`` a reference predicts.

    Catalog references carry their fitted curve; a bare ``{k, acceptance_length}`` (e.g. built by hand) gets the
    constant-rate fit through its one point. Example: gpt-oss-120b P-EAGLE on MT-Bench (AL 2.68 at K = 5, decay
    prior of parallel heads) -> s_1 = 0.72, and AL(5) reproduces 2.68.
    """
    if "first_rate" in ref and "position_decay" in ref:
        return survival(ref["first_rate"], ref["position_decay"], max_k)
    rate, decay = fit_curve({ref["k"]: ref["acceptance_length"]}, 1.0)
    return survival(rate, decay, max_k)


@dataclass(frozen=True)
class DrafterSpec:
    """A speculative-decoding head for one target model, with what its publisher measured."""

    name: str
    """Hugging Face id, the absolute path of a local directory, or ``<id>:<n>-layer`` for a hypothetical variant."""
    target: str | None
    """The target model's catalog name; None for a local drafter given without a target."""
    method: str
    """vLLM speculative method: "eagle3" for EAGLE-3 and P-EAGLE heads ("eagle", "draft_model" for local dirs)."""
    num_layers: int
    """Decoder layers of the head."""
    hidden_size: int
    """The head's hidden width."""
    trained_k: int | None
    """Draft positions the head was trained for; None when not published."""
    recommended_k: int | None
    """num_speculative_tokens its publisher serves it with; None when not published."""
    parallel_drafting: bool
    """Supports vLLM's parallel drafting (its config carries pard_token, mask_token_id or ptd_token_id)."""
    reference_acceptance: dict[str, ReferenceAcceptance]
    """Workload name (mt-bench, humaneval, gsm8k, speed-bench) -> published acceptance length at depth k."""
    source: str
    """Where the figures come from."""
    aliases: tuple[str, ...] = ()
    """Other names accepted by `get_drafter` (case-insensitive)."""
    layer_rate_factors: dict[int, float] = field(default_factory=dict)
    """Layer count -> factor on every conditional acceptance rate of this head for a head of that many layers
    (derived from published layer ablations; this head's own count maps to 1.0). Other counts are hypothetical
    variants (`with_layers`)."""
    layer_variants_source: str = ""
    """Where `layer_rate_factors` come from and how they were derived."""
    draft_vocab_size: int | None = None
    """Rows of the head's LM head; None: the target's full vocabulary (EAGLE-3 heads often keep a 32k "hot"
    vocabulary, which makes each drafting pass much cheaper)."""
    published: bool = True
    """False for heads no one has released: layer variants and paper-only heads (the model backend can predict
    them, no engine can load them)."""
    local_path: str | None = None
    """Directory the spec was read from; None for catalog entries."""

    def with_layers(self, num_layers: int) -> DrafterSpec:
        """This head at another layer count: itself when unchanged, else a hypothetical variant (published=False)
        whose acceptance curves have every conditional rate multiplied by ``layer_rate_factors[num_layers]``.

        Example: amazon/gpt-oss-120b-p-eagle.with_layers(2) keeps the MT-Bench curve's decay and scales its rates by
        the factor that takes the paper's 4-layer average AL 3.3 to the 2-layer 3.0 (Table 11).
        """
        if num_layers == self.num_layers:
            return self
        if num_layers not in self.layer_rate_factors:
            known = ", ".join(str(n) for n in sorted(self.layer_rate_factors)) or "none"
            raise ValueError(
                f"{self.name} has no acceptance data for a {num_layers}-layer head (known layer counts: {known}); "
                "only layer counts with a published or derivable acceptance can be predicted."
            )
        factor = self.layer_rate_factors[num_layers] / self.layer_rate_factors.get(self.num_layers, 1.0)
        note = (
            f"every conditional acceptance rate x {factor:.3f} for a hypothetical {num_layers}-layer head "
            f"({self.layer_variants_source})"
        )
        reference = {workload: _scaled(ref, factor, note) for workload, ref in self.reference_acceptance.items()}
        return dataclasses.replace(
            self,
            name=f"{self.name}:{num_layers}-layer",
            aliases=(),
            num_layers=num_layers,
            reference_acceptance=reference,
            # A variant is a prediction from its base; predicting again from a prediction would compound guesses.
            layer_rate_factors={},
            source=f"HYPOTHETICAL {num_layers}-layer variant of {self.name}, not a published checkpoint; "
            f"acceptance: {note}. Base: {self.source}",
            published=False,
            local_path=None,
        )

    def variants(self) -> list[DrafterSpec]:
        """This checkpoint followed by its hypothetical layer variants (published=False), fewest layers first."""
        others = [self.with_layers(n) for n in sorted(self.layer_rate_factors) if n != self.num_layers]
        return [self, *others]


def _scaled(ref: ReferenceAcceptance, factor: float, note: str) -> ReferenceAcceptance:
    rate, decay = (
        (ref["first_rate"], ref["position_decay"])
        if "first_rate" in ref and "position_decay" in ref
        else fit_curve({ref["k"]: ref["acceptance_length"]}, 1.0)
    )
    new_rate = min(1.0, rate * factor)
    points = {k: round(acceptance_length(new_rate, decay, k), 4) for k in ref.get("points", {ref["k"]: 0.0})}
    out = ReferenceAcceptance(
        k=ref["k"],
        acceptance_length=points[ref["k"]],
        source=f"{ref['source']} -- {note}",
        points=points,
        first_rate=new_rate,
        position_decay=decay,
        derivation=f"{ref.get('derivation', 'one-point constant-rate fit')}; then {note}",
    )
    if "nearest" in ref:
        out["nearest"] = ref["nearest"]
    return out
