"""Generic rich tables for `peagle-tune show`: one row per stored record, nested values summarised."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.table import Table

#: Columns shown per listing, in order; records keep everything for --json.
COLUMNS: dict[str, tuple[str, ...]] = {
    "recommendations": ("id", "model", "gpu", "workload_name", "objective", "scenario", "best_config", "metrics",
                        "provenance", "created_at"),
    "trials": ("number", "status", "config", "values", "backend", "failure_reason"),
    "profiles": ("id", "model", "drafter", "device", "vllm_version", "workload_name", "max_k", "kind", "created_at"),
    "studies": (),
}


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("best_config", "config") and isinstance(value, dict):
        if value.get("method", "none") == "none":
            return f"no-spec seqs={value.get('max_num_seqs')}"
        pd = "+pd" if value.get("parallel_drafting") else ""
        return f"{value['method']}{pd} K={value['num_speculative_tokens']} seqs={value.get('max_num_seqs')}"
    if key == "scenario" and isinstance(value, dict):
        return f"c={value.get('concurrency')}"
    if key == "metrics" and isinstance(value, dict):
        tps, sp = value.get("output_tokens_per_s"), value.get("speedup_vs_no_spec")
        return f"{tps:.1f} tok/s" + (f", {sp:.2f}x vs no spec" if sp else "") if tps else "-"
    if key == "provenance" and isinstance(value, dict):
        return str(value.get("kind", "?")) + f" ({value.get('backend')}, {value.get('device')})"
    if key == "values" and isinstance(value, dict):
        return ", ".join(f"{k}={v:.2f}" for k, v in value.items())
    if isinstance(value, dict | list):
        return json.dumps(value)[:60]
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)[:60]


def table(kind: str, rows: Sequence[dict[str, Any]]) -> Table:
    cols = COLUMNS.get(kind) or (tuple(rows[0].keys()) if rows else ())
    t = Table(title=f"{kind} ({len(rows)})")
    for c in cols:
        t.add_column(c)
    for row in rows:
        t.add_row(*(_cell(c, row.get(c)) for c in cols))
    if not rows:
        t.caption = "nothing stored yet: run `peagle-tune search --model MODEL`"
    return t
