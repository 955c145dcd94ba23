"""The Workload type: named classes of prompts with sampling parameters."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: a prompt (or chat messages) and its sampling parameters."""

    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    """OpenAI-style chat messages; used instead of `prompt` when given."""
    max_tokens: int = 128
    temperature: float = 0.0

    @property
    def is_chat(self) -> bool:
        """Whether the request is served as a chat: its messages go through the model's chat template (offline:
        `autotune.engine.EngineSession.prompt`; serve mode: ``/v1/chat/completions``), while a plain prompt is sent
        as raw text (``LLM.generate``; ``/v1/completions``). Both measurement modes decide by this property."""
        return self.prompt is None and self.messages is not None

    def text(self) -> str:
        """The prompt as plain text (chat messages joined "role: content"), what length estimates count."""
        if self.prompt is not None:
            return self.prompt
        assert self.messages is not None
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in self.messages)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.prompt is not None:
            d["prompt"] = self.prompt
        if self.messages is not None:
            d["messages"] = list(self.messages)
        return d


@dataclass(frozen=True)
class Workload:
    """Named classes of requests. Acceptance is profiled per class (code accepts far more drafts than chat)."""

    name: str
    classes: dict[str, tuple[WorkloadRequest, ...]] = field(default_factory=dict)
    source: str = ""
    """Where it came from (builtin name, file path, dataset id)."""
    description: str = ""
    """What it is, for people: the dataset and its loader, or that it is a sample (empty for a user's file)."""

    @property
    def class_names(self) -> list[str]:
        return sorted(self.classes)

    def requests(self) -> list[tuple[str, WorkloadRequest]]:
        """All requests as (class, request), classes interleaved round-robin so any prefix mixes classes."""
        out: list[tuple[str, WorkloadRequest]] = []
        lists = [(c, list(self.classes[c])) for c in self.class_names]
        i = 0
        while any(i < len(reqs) for _, reqs in lists):
            for c, reqs in lists:
                if i < len(reqs):
                    out.append((c, reqs[i]))
            i += 1
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self.classes.values())

    def content_hash(self) -> str:
        """sha256 over the canonical JSON of classes and requests: same content, same hash, whatever the file name."""
        canon = {c: [r.to_dict() for r in self.classes[c]] for c in self.class_names}
        return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()

    def subset(self, per_class: int) -> Workload:
        """The first `per_class` requests of every class."""
        return Workload(self.name, {c: r[:per_class] for c, r in self.classes.items()}, self.source,
                        self.description)

    def summary(self, count_tokens: Callable[[str], int] | None = None) -> dict[str, Any]:
        """What every output names: the workload, its dataset, the prompts used and their input and output lengths
        in tokens. Inputs are counted by `count_tokens` (the target's tokenizer) when given, else estimated at
        `autotune.fit.CHARS_PER_TOKEN` characters a token; a chat request adds `autotune.fit.CHAT_TEMPLATE_TOKENS`
        (what `autotune.fit.max_model_len_of` counts)."""
        from autotune.fit import CHARS_PER_TOKEN, CHAT_TEMPLATE_TOKENS

        count = count_tokens or (lambda text: math.ceil(len(text) / CHARS_PER_TOKEN))
        requests = [r for _, r in self.requests()]
        inputs = [count(r.text()) + (CHAT_TEMPLATE_TOKENS if r.is_chat else 0) for r in requests] or [0]
        outputs = [r.max_tokens for r in requests] or [0]
        return {
            "name": self.name, "source": self.source, "description": self.description, "prompts": len(requests),
            "classes": {c: len(self.classes[c]) for c in self.class_names},
            "input_tokens": {"min": min(inputs), "mean": round(sum(inputs) / len(inputs)), "max": max(inputs),
                             "how": ("counted with the target's tokenizer" if count_tokens else
                                     f"estimated at {CHARS_PER_TOKEN} characters a token")
                             + (f", {CHAT_TEMPLATE_TOKENS} added for the chat template" if any(
                                 r.is_chat for r in requests) else "")},
            "output_tokens": {"min": min(outputs), "max": max(outputs)},
        }


def summary_line(summary: dict[str, Any]) -> str:
    """`Workload.summary` in one sentence: ``Workload: <name>: <what>; N prompts, input a-b tokens (mean m, how),
    output o tokens.``"""
    inputs, outputs = summary["input_tokens"], summary["output_tokens"]
    out = f"{outputs['min']}" if outputs["min"] == outputs["max"] else f"{outputs['min']}-{outputs['max']}"
    what = summary["description"] or summary["source"]
    return (f"Workload: {summary['name']}: {what}; {summary['prompts']} prompts, input {inputs['min']}-"
            f"{inputs['max']} tokens (mean {inputs['mean']}, {inputs['how']}), output {out} tokens.")
