"""The plugin's statistics file (stats.json): `PluginStats` as plain JSON-able data and back, written atomically.

`to_json` gives the text of ``json.dumps(to_dict(stats))`` but reuses the serialised step-time samples and finished
traces until they change, so a flush while the engine runs costs little more than the parts that changed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.errors import PluginConfigError
from policies.plugin._stats_recording import _CostKey
from policies.plugin.config import CONFIG_ENV, SCHEDULER_CLS

if TYPE_CHECKING:
    from policies.plugin.stats import PluginStats

__all__ = ["STATS_VERSION", "from_dict", "load", "save", "to_dict", "to_json"]

STATS_VERSION = 1
"""The stats file format this peagle-tune reads and writes."""
_BULK = "\x00bulk"  # placeholder of the parts `to_json` splices in


def to_dict(stats: PluginStats, *, bulk: bool = True) -> dict[str, Any]:
    """Everything, as plain JSON-able data (``bulk=False``: `to_json`'s placeholders for the bulky parts)."""
    info = dict(stats.info)
    if stats._class_labels.folded or stats._phase_labels.folded:
        info["folded_labels"] = {"classes": stats._class_labels.folded, "phases": stats._phase_labels.folded}
    capped = sum(1 for e in stats._costs.values() if not e.room)
    if capped:
        info["step_cost_keys_without_samples"] = capped
    return {
        "version": STATS_VERSION,
        "info": info,
        "steps": stats.steps,
        "decode_steps": stats.decode_steps,
        "mixed_steps": stats.mixed_steps,
        "fallback": stats.fallback,
        "errors": list(stats.errors),
        "overhead_ms": stats.overhead_ms,
        "draft_fetch": {"n": stats.draft_fetches, "sum_ms": stats.draft_fetch_ms},
        "between_steps": {k: {"n": int(n), "sum_ms": ms} for k, (n, ms) in sorted(stats.between_steps.items())},
        "mixed_step_costs": stats.prompt_steps(),
        "totals": stats.totals(),
        "depth_histogram": {str(k): v for k, v in stats.depth_histogram().items()},
        "acceptance": [
            {"phase": p, "class": c, "depth": d, "num_drafts": row[0], "accepted_per_position": row[1:]}
            for (p, c, d), row in sorted(stats._acceptance.items())
        ],
        "step_costs": [
            {"phase": p, "batch_size": b, "depth": d, "verified_tokens": v, "drafting_depth": dd, "n": e.n,
             "sum_ms": e.sum_ms, "samples_ms": e.samples}
            for (p, b, d, v, dd), e in stats._costs.items()
        ] if bulk else _BULK,
        "traces": stats.traces() if bulk else _BULK,
    }


def to_json(stats: PluginStats) -> str:
    """``json.dumps(stats.to_dict())``, the same text, built incrementally: the step-time samples of a shape and
    the finished traces are serialised once and reused until they change, so writing the file while the engine
    runs (every ``flush_every_s``, and after it goes idle) costs little more than the parts that changed."""
    data = to_dict(stats, bulk=False)
    head = json.dumps(data)
    costs = []
    names: dict[str, str] = {}
    for (p, b, d, v, dd), e in stats._costs.items():
        if e.json is None:
            e.json = json.dumps(e.samples)
        phase = names.get(p)
        if phase is None:
            phase = names[p] = json.dumps(p)
        # json.dumps' own text for these fields: ints, null, and repr() of a finite float
        total = repr(e.sum_ms) if math.isfinite(e.sum_ms) else json.dumps(e.sum_ms)
        costs.append(f'{{"phase": {phase}, "batch_size": {b}, "depth": {"null" if d is None else d}, '
                     f'"verified_tokens": {v}, "drafting_depth": {dd}, "n": {e.n}, "sum_ms": {total}, '
                     f'"samples_ms": {e.json}}}')
    traces = []
    cached = stats._trace_json
    for i, trace in enumerate(stats._traces):
        text = cached[i] if i < len(cached) else None
        if text is None:
            text = json.dumps(trace)
            if i < len(cached):
                cached[i] = text
        traces.append(text)
    traces.extend(json.dumps(t) for t in stats._running_traces())
    head = head.replace(f'"step_costs": {json.dumps(_BULK)}', f'"step_costs": [{", ".join(costs)}]', 1)
    return head.replace(f'"traces": {json.dumps(_BULK)}', f'"traces": [{", ".join(traces)}]', 1)


def from_dict(cls: type[PluginStats], data: Any, source: str = "plugin stats") -> PluginStats:
    if not isinstance(data, Mapping) or data.get("version") != STATS_VERSION:
        raise PluginConfigError(
            f"{source}: not a version-{STATS_VERSION} plugin stats object (got "
            f"{type(data).__name__ if not isinstance(data, Mapping) else 'version ' + repr(data.get('version'))})."
        )
    try:
        stats = cls()
        stats.info = dict(data.get("info") or {})
        stats.steps = int(data["steps"])
        stats.decode_steps = int(data["decode_steps"])
        stats.mixed_steps = int(data["mixed_steps"])
        stats.fallback = bool(data["fallback"])
        stats.errors = [str(e) for e in data.get("errors") or []]
        stats.overhead_ms = float(data.get("overhead_ms", 0.0))
        fetch = data.get("draft_fetch") or {}
        stats.draft_fetches, stats.draft_fetch_ms = int(fetch.get("n", 0)), float(fetch.get("sum_ms", 0.0))
        stats.between_steps = {
            str(k): [int(v["n"]), float(v["sum_ms"])] for k, v in (data.get("between_steps") or {}).items()
        }
        stats.mixed_costs = {
            (str(m["phase"]), bool(m["drafter_ran"])): [int(m["n"]), float(m["sum_ms"]), int(m["prompt_tokens"]),
                                                         int(m["requests"])]
            for m in data.get("mixed_step_costs") or []
        }
        totals = data["totals"]
        loaded = {k: int(totals[k]) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        loaded_per_pos = [int(x) for x in totals["accepted_per_position"]]
        stats._depth_hist = {int(k): int(v) for k, v in (data.get("depth_histogram") or {}).items()}
        for a in data["acceptance"]:
            per_pos = [int(x) for x in a["accepted_per_position"]]
            if len(per_pos) != int(a["depth"]):
                raise ValueError(f"acceptance entry has depth {a['depth']} but {len(per_pos)} positions")
            akey = (str(a["phase"]), str(a["class"]), int(a["depth"]))
            stats._acceptance[akey] = [int(a["num_drafts"]), *per_pos]
        derived = stats.totals()
        stats._totals_offset = {k: v - derived[k] for k, v in loaded.items()}
        derived_per_pos = derived["accepted_per_position"]
        width = max(len(loaded_per_pos), len(derived_per_pos))
        loaded_per_pos += [0] * (width - len(loaded_per_pos))
        derived_per_pos += [0] * (width - len(derived_per_pos))
        stats._per_pos_offset = [a - b for a, b in zip(loaded_per_pos, derived_per_pos, strict=True)]
        for c in data["step_costs"]:
            depth = None if c["depth"] is None else int(c["depth"])
            key = (
                str(c["phase"]), int(c["batch_size"]), depth, int(c["verified_tokens"]), int(c["drafting_depth"])
            )
            samples = [float(x) for x in c["samples_ms"]]
            stats._costs[key] = _CostKey(samples, int(c["n"]), float(c["sum_ms"]),
                                         room=stats.max_samples_per_key if samples else 0)
        stats._traces = [
            {"class": str(t["class"]), "phase": str(t["phase"]), "steps": [[int(d), int(a)] for d, a in t["steps"]]}
            for t in data.get("traces") or []
        ]
        stats._trace_json = [None] * len(stats._traces)
    except (KeyError, TypeError, ValueError) as exc:
        raise PluginConfigError(f"{source}: malformed plugin stats ({type(exc).__name__}: {exc}).") from None
    return stats


def save(stats: PluginStats, path: str | Path) -> None:
    """Write atomically (a reader never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_text(to_json(stats), encoding="utf-8")
    tmp.replace(p)


def load(cls: type[PluginStats], path: str | Path) -> PluginStats:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PluginConfigError(
            f"{p}: no plugin stats ({exc.strerror or exc}); was the engine started with "
            f"scheduler_cls={SCHEDULER_CLS!r} and {CONFIG_ENV} naming a config with stats_path?"
        ) from exc
    except json.JSONDecodeError as exc:
        raise PluginConfigError(f"{p}: not valid JSON: {exc}.") from exc
    return from_dict(cls, data, source=str(p))
