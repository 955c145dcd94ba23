"""Checks on values before they are written, so every backend stores (and returns) the same thing.

JSON is normalised by a round trip through `json` (tuples become lists, keys become strings) and must be strict:
NaN and infinity are rejected because PostgreSQL's JSON type refuses them. Text must be valid Unicode (a lone
surrogate such as ``"c\\ud800"`` is stored by both backends but cannot be printed, written to a file or drawn, so
one such row would break every `show` and `report`); names (model, study, GPU, ...) and the keys of JSON objects
(class labels, metric names) must also be printable (no control characters) and fit their column.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

from store.exceptions import InvalidRecordError

#: Longest name: the size of the model / drafter / workload / study columns, and the bound on JSON object keys.
NAME_CHARS = 300
#: Longest short name: versions, methods, objectives, backends.
SHORT_CHARS = 64
#: Longest GPU / device name.
DEVICE_CHARS = 200
#: Longest content hash.
HASH_CHARS = 128


def unicode_problem(value: str) -> str | None:
    """Why `value` is not valid Unicode text (it holds a lone surrogate), or None when it is."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds a lone surrogate {value[exc.start]!r} at character {exc.start} (not valid Unicode: it cannot "
                "be printed or written to a file)")
    return None


def name_problem(value: str, limit: int | None) -> str | None:
    """Why `value` is not a usable name (not valid Unicode, a control character, longer than `limit`), or None."""
    problem = unicode_problem(value)
    if problem is not None:
        return problem
    if limit is not None and len(value) > limit:
        return f"is {len(value):,} characters long; at most {limit:,} fit"
    if not value.isprintable():
        i, char = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        return f"holds the control character {char!r} at character {i} (names must be printable)"
    return None


def json_value(field: str, value: Any) -> Any:
    """`value` after a strict JSON round trip; `InvalidRecordError` names the offending item when it is not JSON."""
    problem = _first_non_json(value, field)
    if problem is not None:
        where, item = problem
        if isinstance(item, str):
            why = name_problem(item, NAME_CHARS) if where.endswith(" key") else unicode_problem(item)
            raise InvalidRecordError(f"{where} {item!r:.80} {why}; it is not stored. Use printable text.")
        raise InvalidRecordError(
            f"{where} must be JSON (dict, list, str, int, finite float, bool, None), but it is {item!r:.80} "
            f"({type(item).__name__}). Convert dataclasses with .to_dict() and replace NaN/inf with None."
        )
    return json.loads(json.dumps(value, allow_nan=False))


def _first_non_json(value: Any, where: str) -> tuple[str, Any] | None:
    """(path, item) of the first item `json.dumps(allow_nan=False)` would reject, or None."""
    if isinstance(value, str):
        return None if unicode_problem(value) is None else (where, value)
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return (f"{where} key", key)
            if isinstance(key, str) and name_problem(key, NAME_CHARS) is not None:
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


def text(field: str, value: Any, *, limit: int | None = NAME_CHARS, required: bool = True, name: bool = True) -> str:
    """A name of at most `limit` characters (printable, valid Unicode; non-empty when `required`). `name=False`:
    free text (a failure reason, a source path): only valid Unicode is required."""
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidRecordError(f"{field} must be a non-empty string, but got {value!r:.80}.")
    problem = name_problem(value, limit) if name else unicode_problem(value)
    if problem is not None:
        raise InvalidRecordError(f"{field} {value!r:.80} {problem}; it is not stored.")
    return value


def optional_text(field: str, value: Any, *, limit: int | None = NAME_CHARS, name: bool = True) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecordError(f"{field} must be a string or None, but got {value!r:.80}.")
    return text(field, value, limit=limit, required=False, name=name)


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
    out: dict[str, Any] = {"device": text("environment device", info.get("device"), limit=DEVICE_CHARS)}
    gpu_count = info.get("gpu_count")
    out["gpu_count"] = 0 if gpu_count is None else integer("environment gpu_count", gpu_count, minimum=0)
    for key in ("driver", "vllm_version", "torch_version"):
        # '' (not NULL) for unknown: SQL treats NULLs as distinct, which would defeat the unique identity.
        out[key] = optional_text(f"environment {key}", info.get(key), limit=SHORT_CHARS) or ""
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
    for i, item in enumerate(data):
        text(f"{field}[{i}]", item)
    return data
