"""Can this machine measure the search? Checkpoints by name, the device, the memory fit, said plainly.

`resolve_target` turns ``--model`` into the `ModelSpec` the search is keyed by and, where an engine might load it,
its `Checkpoint`; `resolve_drafters` does the same for drafters. `choose_backend` then picks vllm when vLLM
imports, every checkpoint is available (cached, or downloadable unless ``--no-download``) and they fit the device
(GPU memory through NVML, or RAM for vLLM's CPU build), else the model backend, and says which of the three failed.
`fetch` downloads what a launch needs, right before the first launch.

Nothing here starts an engine or imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import BackendUnavailableError, PeagleError, UnknownModelError, UsageError


@dataclass
class Checkpoints:
    """The checkpoints an engine of the search would load: the target's and each drafter's (by the name the search
    uses), and why they cannot be had here (None: they can)."""

    target: Any = None
    """`autotune.checkpoints.Checkpoint` of the target, or None."""
    drafters: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def all(self) -> list[Any]:
        return [c for c in [self.target, *self.drafters.values()] if c is not None]

    def lines(self) -> list[str]:
        """One line per checkpoint: where it is, and what a launch downloads."""
        return [c.download_line() for c in self.all]



def _is_repo_id(value: str) -> bool:
    from autotune.checkpoints import parse_repo_ref

    try:
        parse_repo_ref(value)
    except PeagleError:
        return False
    return True


def resolve_target(value: str, want_checkpoint: bool) -> tuple[Any, Any, str | None]:
    """(ModelSpec, Checkpoint or None, why there is no checkpoint) for ``--model`` `value`.

    A local directory or a catalog name describe the model without a checkpoint; a Hugging Face repo id that is not
    in the catalog is described by its config.json, so it is resolved even for the model backend (errors raise).
    With `want_checkpoint` (an engine might load it) the checkpoint is resolved and a failure is returned as text.
    """
    from autotune.catalogs import resolve_model
    from autotune.catalogs._hf_config import model_from_config
    from autotune.checkpoints import CheckpointError, resolve_checkpoint

    try:
        spec = resolve_model(value)
    except UnknownModelError:
        if not _is_repo_id(value):
            raise
        checkpoint = resolve_checkpoint(value, "model")
        path = checkpoint.local_dir or Path(checkpoint.repo_id or value)
        spec = dataclasses.replace(model_from_config(checkpoint.config, path), name=checkpoint.name, local_path=None,
                                   aliases=())
        return spec, checkpoint, None
    if not want_checkpoint:
        return spec, None, None
    try:
        return spec, resolve_checkpoint(spec.local_path or value, "model"), None
    except (CheckpointError, UnknownModelError) as exc:
        return spec, None, str(exc)


def drafter_spec(value: str, target: Any) -> Any:
    """The `DrafterSpec` of ``--drafter`` `value` for `target` (a ModelSpec): a catalog name, a local directory,
    or a Hugging Face repo id described by its config.json (named by its repo id)."""
    from autotune.catalogs import get_drafter
    from autotune.catalogs._hf_config import drafter_from_config
    from autotune.checkpoints import resolve_checkpoint

    try:
        return get_drafter(value, target=target)
    except UnknownModelError:
        if not _is_repo_id(value):
            raise
    checkpoint = resolve_checkpoint(value, "drafter")
    path = checkpoint.local_dir or Path(checkpoint.repo_id or value)
    spec = drafter_from_config(checkpoint.config, path, None if target is None else target.name)
    return dataclasses.replace(spec, name=checkpoint.name, local_path=None, aliases=(),
                               source=f"config.json of {checkpoint.name}")


def resolve_drafters(names: Sequence[str], found: Checkpoints) -> None:
    """Resolve the checkpoint of each drafter `names` (as the search names them) into `found`; the first failure
    becomes `found.problem`."""
    from autotune.checkpoints import CheckpointError, resolve_checkpoint

    for name in names:
        try:
            found.drafters[name] = resolve_checkpoint(name, "drafter")
        except (CheckpointError, UnknownModelError) as exc:
            found.problem = f"drafter {name}: {exc}"
            return


def token_counter(directory: Path | None) -> Any:
    """A function counting the tokens of a text with the tokenizer.json in `directory` (a checkpoint's), or None
    when there is none or it cannot be read (then lengths are estimated from characters)."""
    if directory is None or not (Path(directory) / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
    except Exception:  # a tokenizer this `tokenizers` cannot read: estimate instead
        return None
    return lambda text: len(tokenizer.encode(text).ids)


def workload_max_model_len(workload: Any, target: Any, given: int | None = None) -> tuple[int, bool]:
    """(max_model_len, counted): what every launch of `workload` passes to vLLM and the fit check sizes the KV cache
    by: `given` (the user's) when set, else `autotune.fit.max_model_len_of` the workload within the model's
    max_position_embeddings, prompts counted with the tokenizer of `target` (an `autotune.checkpoints.Checkpoint`)
    when it is on disk (`counted`), else estimated from characters."""
    from autotune.fit import max_model_len_of

    limit = target.config.get("max_position_embeddings")
    count = None if given else token_counter(target.local_dir)
    length = max_model_len_of(workload, limit if isinstance(limit, int) and limit > 0 else None, given, count)
    return length, count is not None


def check_fit(found: Checkpoints, gpus: list[dict[str, Any]], *, seqs: int, tokens: int, tensor_parallel_size: int,
              gpu_memory_utilization: float | None, cpu_kv_cache_gib: float | None) -> Any:
    """The `autotune.fit.MemoryFit` of the target with its largest drafter on this machine's device at max_model_len
    `tokens` (`workload_max_model_len`) and `seqs` sequences at once: each GPU (NVML's `gpus`, a MIG slice's own
    memory) at the tensor-parallel size, or RAM for vLLM's CPU build. None when sizes are unknown."""
    from autotune import fit
    from autotune.environment import available_ram_bytes

    target = found.target
    if target is None or target.weight_bytes is None:
        return None
    drafters = [d for d in found.drafters.values() if d.weight_bytes is not None]
    drafter = max(drafters, key=lambda d: d.weight_bytes, default=None)
    common: dict[str, Any] = {
        "model": target.name, "target_weight_bytes": target.weight_bytes, "target_config": target.config,
        "drafter_weight_bytes": drafter.weight_bytes if drafter else 0,
        "drafter_config": drafter.config if drafter else None, "max_model_len": tokens, "max_num_seqs": seqs,
    }
    if gpus and gpus[0].get("memory_bytes"):
        return fit.check_gpu_fit(
            **common, device_memory_bytes=int(gpus[0]["memory_bytes"]), device_name=str(gpus[0]["name"]),
            gpu_memory_utilization=gpu_memory_utilization or fit.DEFAULT_GPU_MEMORY_UTILIZATION,
            tensor_parallel_size=tensor_parallel_size, gpus_here=len(gpus),
        )
    ram = available_ram_bytes()
    if gpus or ram is None:
        return None
    return fit.check_cpu_fit(**common, kv_cache_gib=cpu_kv_cache_gib or 4, available_ram_bytes=ram)


def choose_backend(requested: str, *, has_vllm: bool, found: Checkpoints | None, memory: Any,
                   no_download: bool) -> tuple[str, str]:
    """(backend, why) from what was checked, in order: vLLM installed, checkpoints available, fit. ``--backend
    vllm`` raises on the first that fails, ``auto`` falls back to the model backend and says which failed."""
    if requested == "model":
        return "model", "--backend model"
    problem = None
    if not has_vllm:
        problem = "vLLM is not installed"
    elif found is None or found.problem:
        problem = f"a checkpoint is not available here: {(found.problem if found else 'none') or ''}".rstrip(".")
    elif memory is not None and not memory.fits:
        problem = f"the model does not fit here: {memory.message}".rstrip(".")
    elif no_download and any(not c.complete for c in found.all):
        missing = [c.name for c in found.all if not c.complete]
        problem = f"{', '.join(missing)} would need a download and --no-download is set"
    if requested == "vllm":
        if problem is None:
            return "vllm", "--backend vllm"
        if not has_vllm:
            raise BackendUnavailableError(
                "--backend vllm needs vLLM: install it with `pip install 'peagle-tune[vllm]'` on a GPU machine "
                "or `pip install 'peagle-tune[cpu]'` for the CPU build."
            )
        raise UsageError(f"--backend vllm: {problem}.")
    if problem is None:
        return "vllm", "vLLM is installed, the checkpoints are available and they fit"
    return "model", f"{problem}; so figures are predicted"


def fetch(found: Checkpoints, no_download: bool, say: Any = None) -> Checkpoints:
    """`found` with every checkpoint complete: missing files downloaded into the Hugging Face cache (or a one-line
    refusal under `no_download`)."""
    from autotune.checkpoints import fetch_checkpoint

    def done(c: Any) -> Any:
        if c is None or c.complete:
            return c
        if say is not None:
            say(f"Downloading {c.download_line()}")
        return dataclasses.replace(c, local_dir=fetch_checkpoint(c, no_download=no_download), missing_bytes=0,
                                   missing_files=())

    return Checkpoints(done(found.target), {n: done(c) for n, c in found.drafters.items()}, found.problem)

