"""What a prediction needs of a workload: request counts per class, mean output per class and token lengths."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.backends._roofline import RooflineParams
from autotune.workloads import Workload

__all__ = ["WorkloadShape"]


@dataclass(frozen=True)
class WorkloadShape:
    """What the prediction needs of a workload: request counts, mean output per class and token lengths.

    Prompt lengths are estimated from text (``chars / RooflineParams.chars_per_token``); output lengths are the
    requests' ``max_tokens`` (a request is assumed to generate all of them).
    """

    requests_by_class: dict[str, int]
    output_tokens_by_class: dict[str, float]
    prompt_tokens: float
    """Mean prompt length, tokens."""
    output_tokens: float
    """Mean output length, tokens."""
    max_prompt_tokens: int
    max_output_tokens: int

    @property
    def context_tokens(self) -> float:
        """Mean context of a decoding request: prompt plus half the output (tokens)."""
        return self.prompt_tokens + self.output_tokens / 2.0

    @property
    def max_context_tokens(self) -> int:
        return self.max_prompt_tokens + self.max_output_tokens

    @classmethod
    def of(cls, workload: Workload, params: RooflineParams) -> WorkloadShape:
        counts: dict[str, int] = {}
        outputs: dict[str, float] = {}
        prompts: list[float] = []
        outs: list[int] = []
        for name, requests in workload.classes.items():
            if not requests:
                continue
            counts[name] = len(requests)
            outputs[name] = sum(r.max_tokens for r in requests) / len(requests)
            prompts.extend(max(len(r.text()) / params.chars_per_token, 1.0) for r in requests)
            outs.extend(r.max_tokens for r in requests)
        if not prompts:
            # An empty workload still has a class mix (names only): assume the default lengths.
            names = list(workload.classes) or ["chat"]
            default_out = float(params.default_output_tokens)
            return cls(
                {c: 1 for c in names},
                {c: default_out for c in names},
                float(params.default_prompt_tokens),
                default_out,
                params.default_prompt_tokens,
                params.default_output_tokens,
            )
        return cls(
            counts,
            outputs,
            sum(prompts) / len(prompts),
            sum(outs) / len(outs),
            int(math.ceil(max(prompts))),
            max(outs),
        )
