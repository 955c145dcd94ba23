"""What the simulator serves: requests (class, prompt and output length), grouped in phases, and how they arrive.

A workload is a sequence of `Phase`s. Closed loop (``concurrency=c``): c clients with no think time share a phase's
requests; a phase starts when the previous one has finished (the way ``benchmarks/bench_runtime.py`` runs one
``llm.generate`` per phase). Open loop (``request_rate``): requests arrive as a Poisson process in phase order, with
no barrier between phases.

Two standard shapes over a workload's classes (`phases_from_workload`):

- shifting: one phase per class (each class alone, in the given order), then one phase mixing all classes;
- stationary: the same number of phases, every one mixing all classes (same number of requests).

Prompt lengths are estimated from the text (``chars / chars_per_token``; 4 for English BPE, 1 for the byte-level
fixtures plus their ``<bos>``); output lengths are the requests' ``max_tokens`` (a request generates all of them,
as with ``ignore_eos`` or a greedy run that never stops early).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from autotune.errors import UsageError
from autotune.workloads import Workload

__all__ = ["SHAPES", "Phase", "SimRequest", "WorkloadShape", "phases_from_workload"]

WorkloadShape = Literal["shifting", "stationary"]
SHAPES: tuple[WorkloadShape, ...] = ("shifting", "stationary")


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request: its class, prompt length and output length (tokens).

    ``index``: position in the whole workload (0, 1, ...); it seeds the request's acceptance stream, so the same
    request sees the same acceptance draws in every config (common random numbers). ``prompt_key``: the prompt's
    identity for a `PrefixCache` (equal keys, equal prompts; None: never cached).
    """

    index: int
    cls: str
    prompt_tokens: int
    output_tokens: int
    prompt_key: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise UsageError(
                f"request {self.index}: prompt_tokens and output_tokens must be >= 1, but got "
                f"{self.prompt_tokens} and {self.output_tokens}."
            )

    @property
    def request_id(self) -> str:
        return f"r{self.index}"


@dataclass(frozen=True)
class Phase:
    """Requests served together; in closed loop a phase starts when the previous one has finished."""

    name: str
    requests: tuple[SimRequest, ...]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def classes(self) -> list[str]:
        return sorted({r.cls for r in self.requests})


def phases_from_workload(
    workload: Workload,
    shape: WorkloadShape,
    per_phase: int,
    *,
    classes: Sequence[str] | None = None,
    chars_per_token: float = 4.0,
    extra_prompt_tokens: int = 0,
    output_tokens: int | None = None,
) -> list[Phase]:
    """The phases of a shifting or stationary workload with ``per_phase`` requests per phase.

    ``classes``: which of the workload's classes, in phase order (default: all, sorted). Each class's prompts are
    used cyclically. A mixed phase alternates the classes request by request. ``extra_prompt_tokens``: added to
    every prompt (a chat template, a ``<bos>``). ``output_tokens``: override every request's ``max_tokens``.

    Example: classes (chat, code), shifting, 4 per phase -> [chat x4], [code x4], [chat, code, chat, code].
    """
    if shape not in SHAPES:
        raise UsageError(f"shape must be one of {', '.join(SHAPES)}, but got {shape!r}.")
    if per_phase < 1:
        raise UsageError(f"per_phase (requests per phase) must be >= 1, but got {per_phase}.")
    if not (math.isfinite(chars_per_token) and chars_per_token > 0):
        raise UsageError(f"chars_per_token must be > 0, but got {chars_per_token}.")
    names = list(classes) if classes else workload.class_names
    missing = [c for c in names if not workload.classes.get(c)]
    if missing:
        raise UsageError(
            f"workload {workload.name!r} has no requests of class(es) {missing}; its classes are "
            f"{workload.class_names}."
        )
    pools = {
        c: [
            (
                max(1, int(round(len(r.text()) / chars_per_token)) + extra_prompt_tokens),
                output_tokens if output_tokens is not None else r.max_tokens,
            )
            for r in workload.classes[c]
        ]
        for c in names
    }
    cursor = dict.fromkeys(names, 0)
    counter = 0

    def take(cls: str) -> SimRequest:
        nonlocal counter
        pool = pools[cls]
        prompt, out = pool[cursor[cls] % len(pool)]
        cursor[cls] += 1
        request = SimRequest(counter, cls, prompt, out)
        counter += 1
        return request

    def mixed(n: int) -> tuple[SimRequest, ...]:
        return tuple(take(names[i % len(names)]) for i in range(n))

    phases: list[Phase] = []
    if shape == "shifting":
        for cls in names:
            phases.append(Phase(cls, tuple(take(cls) for _ in range(per_phase))))
        phases.append(Phase("mixed", mixed(per_phase)))
    else:
        for i in range(len(names) + 1):
            phases.append(Phase(f"mixed-{i}", mixed(per_phase)))
    return phases
