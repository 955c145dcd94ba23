"""Catalog entries (YAML mappings) checked and turned into GPUSpec / ModelSpec / drafter entries.

The same rules hold for the packaged files and for a user's catalog file (`_user_catalog`): the keys are the
fields of the spec (required ones present, no others), every entry has a non-empty ``source``, and each value has
the field's type (numbers finite, positive unless `MAY_BE_ZERO`, at most `MAX_NUMBER`, depths at most MAX_K).
Failures are one line naming the file, the entry and the key; `error` is the class raised (PeagleError for the
packaged files, which are ours to fix; ConfigError for a user's file).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autotune.catalogs._specs import DrafterSpec, GPUSpec, ModelSpec
from autotune.errors import PeagleError
from policies._depth import MAX_K

#: DrafterSpec fields a drafters.yaml entry does not hold (derived by `_drafter_catalog`).
DRAFTER_DERIVED = {"local_path", "layer_rate_factors", "layer_variants_source"}
#: Keys of a drafters.yaml entry that are not DrafterSpec fields.
DRAFTER_RAW = {"layer_variants"}
#: Numeric fields that may be 0 (a dense model has no experts, a model no sliding window); every other number in a
#: catalog is a physical size or count, so it must be positive.
MAY_BE_ZERO = {"num_experts", "experts_per_token", "expert_params_b", "sliding_window_layer_fraction",
               "ffn_intermediate_size"}
#: Largest number a catalog takes (no real size comes near: 1e9 GB, TFLOPS, billions of parameters, layers); beyond
#: it the roofline's arithmetic overflows.
MAX_NUMBER = 1e9
#: Fields that are a draft depth: at most the deepest K peagle-tune takes.
DEPTH_FIELDS = {"trained_k", "recommended_k"}


def norm(name: str) -> str:
    return name.strip().lower()


def _label(entry: dict[str, Any]) -> str:
    label = entry.get("name") or entry.get("key") or "?"
    return str(label)[:100]


def check_keys(
    entry: dict[str, Any],
    cls: type,
    file_name: str,
    skip: set[str],
    extra: set[str] | None = None,
    *,
    optional: set[str] | None = None,
    error: type[Exception] = PeagleError,
) -> None:
    """`entry` has the fields of `cls` (less `skip`; `optional` ones may be left out) and maybe `extra` keys."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    missing_default = dataclasses.MISSING
    required = {n for n, f in fields.items() if f.default is missing_default and f.default_factory is missing_default}
    required -= optional or set()
    label = _label(entry)
    unknown = sorted(str(k) for k in set(entry) - set(fields) - (extra or set()))
    missing = sorted(required - set(entry))
    if unknown or missing:
        raise error(
            f"catalog {file_name} entry {label!r}: unknown keys {unknown}, missing keys {missing}; "
            f"expected the fields of {cls.__name__}."
        )
    if not str(entry.get("source", "")).strip():
        raise error(f"catalog {file_name} entry {label!r} has no source; every number needs one.")


def _typed(entry: dict[str, Any], cls: type, file_name: str, error: type[Exception]) -> dict[str, Any]:
    """`entry`'s values converted to the types of `cls`'s fields (annotations as written), or `error` naming
    the key. Numbers must be non-negative (every figure in a catalog is)."""
    annotations = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out = dict(entry)
    for key, value in entry.items():
        kind = annotations.get(key)
        if kind is None:
            continue
        nullable = kind.endswith(" | None")
        base = kind.removesuffix(" | None")

        def bad(expected: str, key: str = key, value: Any = value) -> Exception:
            return error(
                f"catalog {file_name} entry {_label(entry)!r}: {key} must be {expected}, but got {str(value)[:60]!r}."
            )

        if value is None:
            if not nullable:
                raise bad(f"a {base} (not empty)")
            continue
        if base in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float) or (base == "int" and
                                                                                  not isinstance(value, int)):
                raise bad("an integer" if base == "int" else "a number")
            if not math.isfinite(value):
                raise bad("a finite number")
            if value < 0 or (value == 0 and key not in MAY_BE_ZERO):
                raise bad("non-negative" if key in MAY_BE_ZERO else "positive")
            if value > (MAX_K if key in DEPTH_FIELDS else MAX_NUMBER):
                raise bad(f"at most {MAX_K if key in DEPTH_FIELDS else MAX_NUMBER:g}")
            out[key] = float(value) if base == "float" else value
        elif base == "str":
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise bad("a string")
            out[key] = str(value).strip() if key == "source" else str(value)
        elif base == "bool":
            if not isinstance(value, bool):
                raise bad("true or false")
        elif base.startswith("tuple[str"):
            if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
                raise bad("a list of names")
            out[key] = tuple(str(v) for v in value)
        elif base.startswith("dict"):
            if not isinstance(value, dict):
                raise bad("a mapping")
    return out


def gpu_from_entry(entry: dict[str, Any], file_name: str, error: type[Exception] = PeagleError) -> GPUSpec:
    check_keys(entry, GPUSpec, file_name, skip=set(), error=error)
    values = _typed(entry, GPUSpec, file_name, error)
    values["key"] = norm(values["key"])
    return GPUSpec(**values)


def model_from_entry(entry: dict[str, Any], file_name: str, error: type[Exception] = PeagleError) -> ModelSpec:
    check_keys(entry, ModelSpec, file_name, skip={"local_path"}, error=error)
    return ModelSpec(**_typed(entry, ModelSpec, file_name, error))


def check_drafter_entry(
    entry: dict[str, Any], file_name: str, error: type[Exception] = PeagleError, *, user: bool = False
) -> dict[str, Any]:
    """A drafters.yaml entry with checked keys and typed values (still raw: `build_drafter` makes the spec).

    A user's entry may leave out reference_acceptance (then the drafter can be measured, not predicted)."""
    optional = {"reference_acceptance"} if user else set()
    check_keys(entry, DrafterSpec, file_name, skip=DRAFTER_DERIVED, extra=DRAFTER_RAW, optional=optional, error=error)
    values = _typed(entry, DrafterSpec, file_name, error)
    values.setdefault("reference_acceptance", {})
    return values
