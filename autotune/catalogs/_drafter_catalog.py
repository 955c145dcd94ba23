"""Build the drafter catalog from drafters.yaml: published acceptance points -> per-position curves.

Two passes, because a head published at one depth borrows its position decay from heads published at two:

1. every ``{k, acceptance_length, more}`` reference with two or more depths is fitted exactly (`fit_curve`);
2. the mean fitted decay of parallel (P-EAGLE) and of sequential (EAGLE-3) heads becomes the prior of the
   one-depth references of that drafting style; ``{nearest, source}`` references borrow a sibling workload's curve;
   ``layer_variants`` turn a published layer ablation into a factor on the conditional rates.
"""

from __future__ import annotations

from typing import Any

from autotune.catalogs._acceptance_curve import fit_curve, rate_factor_for_mean
from autotune.catalogs._specs import DrafterSpec, ReferenceAcceptance
from autotune.errors import PeagleError
from policies._depth import MAX_K

_FILE = "drafters.yaml"
#: Keys of a drafters.yaml entry that are not DrafterSpec fields (they are turned into fields here).
_RAW_KEYS = {"layer_variants"}


class _Where:
    """Which file an entry came from and the error class its problems raise (the packaged drafters.yaml: our
    PeagleError; a user's catalog file: ConfigError)."""

    def __init__(self, file_name: str = _FILE, error: type[Exception] = PeagleError) -> None:
        self.file_name, self.error = file_name, error

    def fail(self, label: str, message: str) -> Exception:
        return self.error(f"catalog {self.file_name} entry {label!r}: {message}")


_PACKAGED = _Where()


def _fail(label: str, message: str, where: _Where = _PACKAGED) -> Exception:
    return where.fail(label, message)


def _points(raw: dict[str, Any], label: str, workload: str, where: _Where = _PACKAGED) -> dict[int, float]:
    if set(raw) - {"k", "acceptance_length", "source", "more"} or not {"k", "acceptance_length", "source"} <= set(raw):
        raise _fail(
            label,
            f"reference_acceptance[{workload!r}] must have k, acceptance_length and source (and optionally more: "
            "{K: AL}), or exactly nearest and source.",
            where,
        )
    try:
        points = {int(raw["k"]): float(raw["acceptance_length"])}
        more = raw.get("more") or {}
        if not isinstance(more, dict):
            raise TypeError("more must be a mapping")
        for k, al in more.items():
            points[int(k)] = float(al)
    except (TypeError, ValueError):
        raise _fail(label, f"reference_acceptance[{workload!r}]: k must be an integer and acceptance_length (and "
                    "more: {K: AL}) numbers.", where) from None
    for k, al in points.items():
        if not 1 <= k <= MAX_K:
            raise _fail(label, f"reference_acceptance[{workload!r}] has K={k}, outside [1, {MAX_K}] (the deepest K "
                        "peagle-tune takes).", where)
        if not 1.0 <= al <= k + 1:
            raise _fail(label, f"reference_acceptance[{workload!r}] has AL {al} at K={k}, outside [1, {k + 1}] "
                        "(K >= 1).", where)
    return points


def _two_depth_decays(entries: list[dict[str, Any]]) -> dict[bool, list[float]]:
    """Decays fitted from references with >= 2 depths, by drafting style (parallel_drafting True/False)."""
    out: dict[bool, list[float]] = {True: [], False: []}
    for entry in entries:
        for workload, raw in (entry.get("reference_acceptance") or {}).items():
            if isinstance(raw, dict) and "nearest" not in raw:
                points = _points(raw, entry["name"], workload)
                if len(points) >= 2:
                    out[bool(entry["parallel_drafting"])].append(fit_curve(points)[1])
    return out


def decay_priors(entries: list[dict[str, Any]]) -> dict[bool, float]:
    """Position-decay prior per drafting style: the mean of that style's two-depth fits (1.0 when it has none)."""
    fits = _two_depth_decays(entries)
    return {style: (sum(ds) / len(ds) if ds else 1.0) for style, ds in fits.items()}


def _style(parallel: bool) -> str:
    return "parallel (P-EAGLE)" if parallel else "sequential (EAGLE-3)"


def _reference(raw: dict[str, Any], label: str, workload: str, prior: float, style: str,
               where: _Where = _PACKAGED) -> ReferenceAcceptance:
    points = _points(raw, label, workload, where)
    rate, decay = fit_curve(points, prior)
    k = int(raw["k"])
    if len(points) >= 2:
        derivation = (
            f"two-depth fit through AL at K = {', '.join(str(p) for p in sorted(points))}: first rate {rate:.3f}, "
            f"decay {decay:.3f} per position"
        )
    else:
        derivation = (
            f"one-depth fit through AL({k}) = {points[k]:g} with the decay prior {prior:.3f} of {style} heads "
            f"published at two depths: first rate {rate:.3f}"
        )
    return ReferenceAcceptance(
        k=k,
        acceptance_length=points[k],
        source=str(raw["source"]).strip(),
        points=points,
        first_rate=rate,
        position_decay=decay,
        derivation=derivation,
    )


def references(entry: dict[str, Any], priors: dict[bool, float],
               where: _Where = _PACKAGED) -> dict[str, ReferenceAcceptance]:
    """The entry's reference_acceptance with fitted curves; ``nearest`` entries copy their sibling's curve."""
    label = str(entry.get("name", "?"))
    raw_refs = entry.get("reference_acceptance")
    if not isinstance(raw_refs, dict):
        raise _fail(label, "reference_acceptance must be a mapping.", where)
    prior = priors[bool(entry["parallel_drafting"])]
    out: dict[str, ReferenceAcceptance] = {}
    for workload, raw in raw_refs.items():
        if not isinstance(raw, dict):
            raise _fail(label, f"reference_acceptance[{workload!r}] must be a mapping.", where)
        if "nearest" not in raw:
            out[str(workload)] = _reference(raw, label, str(workload), prior, _style(bool(entry["parallel_drafting"])),
                                            where)
    for workload, raw in raw_refs.items():
        if "nearest" not in raw:
            continue
        if set(raw) != {"nearest", "source"}:
            raise _fail(label, f"reference_acceptance[{workload!r}] with nearest takes exactly nearest and source.",
                        where)
        sibling = out.get(str(raw["nearest"]))
        if sibling is None:
            raise _fail(label, f"reference_acceptance[{workload!r}] borrows {raw['nearest']!r}, which it lacks.",
                        where)
        borrowed = ReferenceAcceptance(**sibling)
        borrowed["source"] = (
            f"NEAREST WORKLOAD: {str(raw['source']).strip()} Figures used ({raw['nearest']}): {sibling['source']}"
        )
        borrowed["nearest"] = str(raw["nearest"])
        out[str(workload)] = borrowed
    return out


def layer_factors(entry: dict[str, Any], priors: dict[bool, float],
                  where: _Where = _PACKAGED) -> tuple[dict[int, float], str]:
    """(layer count -> conditional-rate factor, source) from the entry's layer_variants; {} when it has none."""
    raw = entry.get("layer_variants") or {}
    if not raw:
        return {}, ""
    label = str(entry["name"])
    prior = priors[bool(entry["parallel_drafting"])]
    factors: dict[int, float] = {int(entry["num_layers"]): 1.0}
    notes: list[str] = []
    sources: list[str] = []
    for layers, spec in raw.items():
        if not isinstance(spec, dict) or set(spec) != {"k", "mean_acceptance_length", "base", "source"}:
            raise _fail(label, f"layer_variants[{layers}] must have exactly k, mean_acceptance_length, base, source.",
                        where)
        k = int(spec["k"])
        if not 1 <= k <= MAX_K:
            raise _fail(label, f"layer_variants[{layers}] has K={k}, outside [1, {MAX_K}].", where)
        curves = [fit_curve({k: float(al)}, prior) for al in spec["base"].values()]
        factor = rate_factor_for_mean(float(spec["mean_acceptance_length"]), curves, k)
        factors[int(layers)] = factor
        base_mean = sum(float(v) for v in spec["base"].values()) / len(spec["base"])
        notes.append(
            f"{layers} layers: mean AL({k}) {base_mean:.2f} -> {float(spec['mean_acceptance_length']):g}, "
            f"rate factor {factor:.3f}"
        )
        source = str(spec["source"]).strip()
        if source not in sources:
            sources.append(source)
    return factors, f"{'; '.join(notes)} (decay prior {prior:.3f}). {' '.join(sources)}"


def build_drafter(entry: dict[str, Any], priors: dict[bool, float], file_name: str = _FILE,
                  error: type[Exception] = PeagleError) -> DrafterSpec:
    """The DrafterSpec of a checked entry (`_entries.check_drafter_entry`); problems in its acceptance figures
    raise `error` naming `file_name`, the entry and the key."""
    where = _Where(file_name, error)
    values = {k: v for k, v in entry.items() if k not in _RAW_KEYS}
    values["aliases"] = tuple(str(a) for a in entry.get("aliases", ()))
    values["source"] = str(entry["source"]).strip()
    values["reference_acceptance"] = references(entry, priors, where)
    if entry.get("layer_variants") is not None and not isinstance(entry["layer_variants"], dict):
        raise where.fail(str(entry.get("name", "?")), "layer_variants must be a mapping.")
    try:
        factors, source = layer_factors(entry, priors, where)
    except (TypeError, ValueError, AttributeError, KeyError, ZeroDivisionError) as exc:
        raise where.fail(str(entry.get("name", "?")), f"layer_variants: {exc}.") from None
    values["layer_rate_factors"] = factors
    values["layer_variants_source"] = source
    return DrafterSpec(**values)
