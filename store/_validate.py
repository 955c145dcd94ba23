"""Checks on values before they are written, so every backend stores (and returns) the same thing.

JSON is normalised by a round trip through `json` (tuples become lists, keys become strings) and must be strict:
NaN and infinity are rejected because PostgreSQL's JSON type refuses them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

from store.exceptions import InvalidRecordError


def json_value(field: str, value: Any) -> Any:
    """`value` after a strict JSON round trip; `InvalidRecordError` names the offending item when it is not JSON."""
    problem = _first_non_json(value, field)
    if problem is not None:
        where, item = problem
        raise InvalidRecordError(
            f"{where} must be JSON (dict, list, str, int, finite float, bool, None), but it is {item!r:.80} "
            f"({type(item).__name__}). Convert dataclasses with .to_dict() and replace NaN/inf with None."
        )
    return json.loads(json.dumps(value, allow_nan=False))


def _first_non_json(value: Any, where: str) -> tuple[str, Any] | None:
    """(path, item) of the first item `json.dumps(allow_nan=False)` would reject, or None."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return (f"{where} key", key)
            found = _first_non_json(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _first_non_json(item, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    return (where, value)


def json_dict(field: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON object (None -> {})."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRecordError(f"{field} must be a dict, but got {type(value).__name__}: {value!r:.80}.")
    result: dict[str, Any] = json_value(field, dict(value))
    return result


def json_list(field: str, value: Any) -> list[Any]:
    """A JSON array (None -> [])."""
    if value is None:
        return []
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise InvalidRecordError(f"{field} must be a list, but got {type(value).__name__}: {value!r:.80}.")
    result: list[Any] = json_value(field, list(value))
    return result


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def text(field: str, value: Any, *, required: bool = True) -> str:
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidRecordError(f"{field} must be a non-empty string, but got {value!r}.")
    return value


def optional_text(field: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecordError(f"{field} must be a string or None, but got {value!r}.")
    return value


def integer(field: str, value: Any, *, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise InvalidRecordError(f"{field} must be an integer >= {minimum}, but got {value!r}.")
    return int(value)


def optional_integer(field: str, value: Any, *, minimum: int) -> int | None:
    return None if value is None else integer(field, value, minimum=minimum)


def choice(field: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidRecordError(f"{field} must be one of {', '.join(allowed)}, but got {value!r}.")
    return str(value)


def timestamp(field: str, value: dt.datetime | None, *, default: dt.datetime) -> dt.datetime:
    """An aware UTC datetime (None -> `default`; a naive datetime is taken as UTC)."""
    if value is None:
        return default
    if not isinstance(value, dt.datetime):
        raise InvalidRecordError(f"{field} must be a datetime, but got {value!r}.")
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


ENVIRONMENT_KEYS = ("device", "gpu_count", "driver", "vllm_version", "torch_version")


def environment(info: Mapping[str, Any]) -> dict[str, Any]:
    """Column values identifying an environment; unknown keys are errors, missing optional ones are ''/0."""
    if not isinstance(info, Mapping):
        raise InvalidRecordError(f"environment info must be a dict, but got {type(info).__name__}.")
    unknown = sorted(set(info) - set(ENVIRONMENT_KEYS))
    if unknown:
        raise InvalidRecordError(
            f"Unknown environment keys {unknown}; known keys are {list(ENVIRONMENT_KEYS)} (device is required)."
        )
    out: dict[str, Any] = {"device": text("environment device", info.get("device"))}
    gpu_count = info.get("gpu_count")
    out["gpu_count"] = 0 if gpu_count is None else integer("environment gpu_count", gpu_count, minimum=0)
    for key in ("driver", "vllm_version", "torch_version"):
        # '' (not NULL) for unknown: SQL treats NULLs as distinct, which would defeat the unique identity.
        out[key] = optional_text(f"environment {key}", info.get(key)) or ""
    return out


def acceptance(value: Mapping[str, Any]) -> dict[str, Any]:
    """{class: {"num_drafts": int >= 0, "accepted_per_position": [int >= 0, ...]}} (extra keys are kept)."""
    data = json_dict("acceptance", value)
    for cls, entry in data.items():
        where = f"acceptance[{cls!r}]"
        if not isinstance(entry, dict):
            raise InvalidRecordError(
                f"{where} must be a dict {{'num_drafts': int, 'accepted_per_position': [int, ...]}}, but got "
                f"{entry!r:.80}."
            )
        integer(f"{where}['num_drafts']", entry.get("num_drafts"), minimum=0)
        per_position = entry.get("accepted_per_position")
        if not isinstance(per_position, list) or not all(_is_int(x) and x >= 0 for x in per_position):
            raise InvalidRecordError(
                f"{where}['accepted_per_position'] must be a list of integers >= 0 (accepted drafts per position), "
                f"but got {per_position!r:.80}."
            )
    return data


def step_costs(value: Any) -> list[dict[str, Any]]:
    """[{"batch_size": int >= 1, "depth": int >= 0, "step_ms": finite float >= 0, "n": int >= 1}, ...]."""
    data = json_list("step_costs", value)
    for i, entry in enumerate(data):
        where = f"step_costs[{i}]"
        if not isinstance(entry, dict):
            raise InvalidRecordError(
                f"{where} must be a dict with batch_size, depth, step_ms and n, but got {entry!r:.80}."
            )
        integer(f"{where}['batch_size']", entry.get("batch_size"), minimum=1)
        integer(f"{where}['depth']", entry.get("depth"), minimum=0)
        integer(f"{where}['n']", entry.get("n"), minimum=1)
        step_ms: Any = entry.get("step_ms")
        if not (_is_number(step_ms) and step_ms >= 0):
            raise InvalidRecordError(f"{where}['step_ms'] must be a finite number of ms >= 0, but got {step_ms!r}.")
    return data


def objective_values(value: Mapping[str, Any] | None) -> dict[str, float]:
    """{objective: finite number}."""
    if value is not None and not isinstance(value, Mapping):
        raise InvalidRecordError(f"values must be a dict {{objective: number}}, but got {value!r:.80}.")
    for key, number in (value or {}).items():
        if not _is_number(number):
            raise InvalidRecordError(
                f"values[{key!r}] must be a finite number, but got {number!r}. Record a failed trial with "
                "status='failed' and no value instead."
            )
    data = json_dict("values", value)
    return {k: float(v) for k, v in data.items()}


def string_list(field: str, value: Any) -> list[str]:
    data = json_list(field, value)
    if not all(isinstance(x, str) for x in data):
        raise InvalidRecordError(f"{field} must be a list of strings, but got {data!r:.80}.")
    return data
