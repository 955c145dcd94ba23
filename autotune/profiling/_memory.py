"""Memory of profile's launches: the workload's max_model_len, and ``gpu_memory_utilization`` split between the
two engines `profile --side-by-side` keeps resident at once on a GPU.

vLLM takes ``gpu_memory_utilization x total`` of the GPU per engine and refuses to start when less than that is
free (``v1/worker/utils.py`` 760-771), so two engines at its default 0.92 cannot share one GPU: each gets half of
what one would take, and the fit (`autotune.fit.check_gpu_fit`) is checked at that half before anything starts.
vLLM's CPU build reserves its KV space from RAM instead (VLLM_CPU_KVCACHE_SPACE), so on CPU nothing is split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autotune.engine import EngineOptions
from autotune.errors import ConfigError, PeagleError
from autotune.fit import DEFAULT_GPU_MEMORY_UTILIZATION, split_gpu_memory_utilization
from autotune.workloads import Workload

__all__ = ["launch_memory"]


def launch_memory(
    options: EngineOptions,
    model: str,
    drafters: Sequence[str],
    workload: Workload,
    max_num_seqs: int,
    side_by_side: bool,
    say: Callable[[str], None],
    gpus: list[dict[str, Any]] | None = None,
) -> EngineOptions:
    """`options` with the workload's max_model_len (`autotune.search.machine.workload_max_model_len`; the user's
    wins) and, for `side_by_side` on a GPU (NVML's `gpus`; None: detect), half the ``gpu_memory_utilization`` one
    engine would take (the user's ``engine_extra`` value, else vLLM's default) for each engine. Raises
    ConfigError in one line when the drafter's engine does not fit in that half."""
    from autotune.checkpoints import resolve_checkpoint
    from autotune.environment import detect_gpus
    from autotune.search.machine import Checkpoints, check_fit, resolve_drafters, workload_max_model_len

    gpus = detect_gpus() if gpus is None else gpus
    try:
        target = resolve_checkpoint(model, "model")
    except PeagleError:
        target = None  # the launch then fails with its own message; nothing to size here
    changes: dict[str, Any] = {}
    if options.max_model_len is None and target is not None:
        length, counted = workload_max_model_len(workload, target)
        changes["max_model_len"] = length
        say(f"      --max-model-len {length}: the workload's longest prompt ("
            + ("counted with the model's tokenizer" if counted else "estimated at 3 characters a token")
            + ") plus its max_tokens, with headroom")
    if not (side_by_side and gpus):
        return EngineOptions.build(options, **changes) if changes else options
    one = float(options.engine_extra.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    each = split_gpu_memory_utilization(one, 2)
    if target is not None:
        found = Checkpoints(target=target)
        resolve_drafters(list(drafters), found)
        tp = int(options.engine_extra.get("tensor_parallel_size") or 1)
        tokens = changes.get("max_model_len") or options.max_model_len or \
            int(target.config.get("max_position_embeddings") or 0)
        memory = check_fit(found, gpus, seqs=max_num_seqs, tokens=tokens, tensor_parallel_size=tp,
                           gpu_memory_utilization=each, cpu_kv_cache_gib=None) if tokens else None
        if memory is not None and not memory.fits:
            raise ConfigError(
                f"--side-by-side keeps two engines on {gpus[0]['name']}, each at gpu_memory_utilization {each:g} "
                f"(half of {one:g}), and the drafter's does not fit: {memory.message.rstrip('.')}; or profile "
                "without --side-by-side."
            )
    say(f"      side by side on one GPU: each engine takes gpu_memory_utilization {each:g} (half of {one:g})")
    return EngineOptions.build(options, engine_extra={**options.engine_extra, "gpu_memory_utilization": each},
                               **changes)
