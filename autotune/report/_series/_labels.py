"""Labels and provenance lines the report's figures share: names cut to their last part, dates, captions of
what was measured or predicted, and cells' number checks."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from autotune.errors import PeagleError
from autotune.spec import SpecConfig
from store import ProfileRecord

CONFIDENCE = 0.95
"""Confidence level of every interval the report draws."""


def date_text(value: dt.datetime | str | None) -> str:
    if value is None:
        return "date unknown"
    if isinstance(value, str):
        return value[:10]
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d")


def profile_label(profile: ProfileRecord) -> str:
    return f"profile #{profile.id}"


def measured_caption(profile: ProfileRecord) -> str:
    """``Measured: profile #3 (drafter X, workload W) on cpu, vLLM 0.32.0, 2026-01-31``."""
    device = f"{profile.gpu_count}x {profile.device}" if profile.gpu_count > 1 else profile.device
    what = "live serving stats" if profile.kind == "live" else "offline profiling run"
    return (
        f"Measured ({what}): {profile_label(profile)}, drafter {profile.drafter or '?'}"
        f"{' +parallel drafting' if profile.parallel_drafting else ''}, workload {profile.workload_name or '?'}; "
        f"on {device}, vLLM {profile.vllm_version or 'version unknown'}, {date_text(profile.created_at)}."
    )


def provenance_caption(provenance: dict[str, Any]) -> str:
    """One line for a stored provenance dict (a trial's or a recommendation's)."""
    kind = provenance.get("kind")
    device = provenance.get("device") or "an unknown device"
    if kind == "measured":
        return (
            f"Measured on {device}, vLLM {provenance.get('vllm_version') or 'version unknown'}, "
            f"{date_text(provenance.get('date'))}."
        )
    if kind == "predicted":
        return (
            f"Predicted by the {provenance.get('backend') or 'model'} backend for {device} (GPU assumed, not "
            f"measured), from {provenance.get('profile') or 'an unknown profile'}."
        )
    return "Source unknown (no provenance stored)."


def kind_of(provenance: dict[str, Any]) -> str:
    """"measured", "predicted" or "unknown"."""
    kind = provenance.get("kind")
    return str(kind) if kind in ("measured", "predicted") else "unknown"


def config_label(config: dict[str, Any]) -> str:
    try:
        return SpecConfig.from_dict(config).label()
    except (PeagleError, TypeError):
        return str(config)


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def short_name(name: str | None) -> str:
    return (name or "?").rstrip("/").split("/")[-1]


def positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def finite_number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
