"""`PluginStats`: what the scheduler plugin measured in the engine, aggregated, and its JSON file (stats.json).

The engine-core process fills it step by step (`PluginStats.observe_step`) and writes it atomically to the config's
``stats_path``; the parent reads it back with `PluginStats.load` and turns it into acceptance profiles
(`PluginStats.acceptance`) and step-cost samples (`PluginStats.step_samples`). Pure Python: no vLLM import.
Recording is `policies.plugin._stats_recording.StatsRecorder`'s (the tables), the file `policies.plugin._stats_file`'s;
`PluginStats` adds the queries.

Worked example: one decode step of three requests at verified depth 2, where the two "code" requests accepted 2 and
1 drafts and the "chat" one none; 9 tokens verified (3 * (2 + 1)) in 10 ms::

    >>> s = PluginStats()
    >>> s.observe_step(step_ms=10.0, prompt_tokens=0, drafting_depth=2,
    ...                requests=[("code", "p", 2, 2), ("code", "p", 2, 1), ("chat", "p", 2, 0)])
    >>> s.acceptance("code", 2)
    AcceptanceProfile(num_drafts=2, accepted_per_position=(2, 1))
    >>> [(x.batch_size, x.depth, x.tokens, x.step_ms) for x in s.step_samples()]
    [(3, 2, 9, 10.0)]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from policies import AcceptanceProfile, StepSample
from policies.plugin import _stats_file
from policies.plugin._stats_file import STATS_VERSION
from policies.plugin._stats_recording import StatsRecorder

__all__ = ["STATS_VERSION", "PluginStats"]


class PluginStats(StatsRecorder):
    """What the plugin measured, aggregated (the engine process fills it; the parent reads it from JSON).

    The tables and how steps are recorded: `StatsRecorder`. Here: the queries over them, and the file
    (`to_dict` / `to_json` / `from_dict`, `save` / `load`).
    """

    # -- reading --
    def phases(self) -> list[str]:
        return sorted({k[0] for k in self._acceptance} | {k[0] for k in self._costs})

    def classes(self, phases: Iterable[str] | None = None) -> list[str]:
        wanted = None if phases is None else set(phases)
        return sorted({c for p, c, _ in self._acceptance if wanted is None or p in wanted})

    def acceptance(self, cls: str, depth: int, phases: Iterable[str] | None = None) -> AcceptanceProfile | None:
        """Measured counts of ``cls`` over the steps it verified exactly ``depth`` drafts (None: no such step)."""
        wanted = None if phases is None else set(phases)
        total = [0] * (depth + 1)
        for (p, c, d), row in self._acceptance.items():
            if c == cls and d == depth and (wanted is None or p in wanted):
                total = [a + b for a, b in zip(total, row, strict=True)]
        if total[0] == 0:
            return None
        return AcceptanceProfile(total[0], tuple(total[1:]))

    def acceptance_by_depth(self, cls: str, phases: Iterable[str] | None = None) -> dict[int, AcceptanceProfile]:
        depths = sorted({d for _, c, d in self._acceptance if c == cls})
        out = {}
        for d in depths:
            prof = self.acceptance(cls, d, phases)
            if prof is not None:
                out[d] = prof
        return out

    def step_costs(self, phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Decode-step cost entries: phase, batch_size, depth (uniform verified depth or None), verified_tokens,
        drafting_depth, n (steps), mean_ms, samples_ms (measured)."""
        wanted = None if phases is None else set(phases)
        out = []
        ordered = sorted(self._costs.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][4]))
        for (phase, b, d, v, dd), e in ordered:
            if wanted is None or phase in wanted:
                out.append(
                    {"phase": phase, "batch_size": b, "depth": d, "verified_tokens": v, "drafting_depth": dd,
                     "n": e.n, "mean_ms": e.sum_ms / e.n, "samples_ms": list(e.samples)}
                )
        return out

    def prompt_steps(self, phases: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Steps with prompt tokens summed per (phase, whether the drafter ran), as the statistics file's
        ``mixed_step_costs`` holds them ("phase", "drafter_ran", "n", "sum_ms", "prompt_tokens", "requests"), for
        ``phases`` (None: every phase)."""
        wanted = None if phases is None else set(phases)
        return [
            {"phase": p, "drafter_ran": ran, "n": int(e[0]), "sum_ms": e[1], "prompt_tokens": int(e[2]),
             "requests": int(e[3])}
            for (p, ran), e in sorted(self.mixed_costs.items()) if wanted is None or p in wanted
        ]

    def step_samples(
        self,
        phases: Iterable[str] | None = None,
        *,
        sequential: bool = False,
        uniform_only: bool = True,
        statistic: Literal["median", "mean"] = "median",
    ) -> list[StepSample]:
        """Measured step times as `StepSample`s, one per (batch size, depth[, drafting depth]) with the median.

        ``statistic="mean"``: each shape's mean instead (its summed step time / its steps: what a run of that shape
        pays per step, since a run's duration is the sum of its steps; step times have a tail, so the mean is above
        the median). Phases are pooled (``phases``: those only; None: every phase). ``sequential``: the drafting
        depth (drafter passes) is the sample's depth and only steps whose drafting depth equals the verified depth
        are kept, so each sample has one K; otherwise (parallel drafting, one drafter pass at the configured K) the
        verified depth is. The drafter ran in every step (depth applied by trimming, or a drafting width > 0), so
        ``drafter_ran=True``, except when the engine had no speculative decoding (``info["num_speculative_tokens"]
        == 0``: a no-speculation baseline) and, when the workers skipped off-steps
        (``info["drafter_width"]["skip_drafter"]``), for steps of drafting depth 0.
        """
        if statistic not in ("median", "mean"):
            raise ValueError(f"statistic must be 'median' or 'mean', but got {statistic!r}.")
        speculative = self.info.get("num_speculative_tokens", 1) != 0
        skips = bool((self.info.get("drafter_width") or {}).get("skip_drafter"))
        pooled: dict[tuple[int, int, int, bool], tuple[list[float], int, float]] = {}
        for e in self.step_costs(phases):
            d = e["depth"]
            if d is None:
                if uniform_only:
                    continue
                d = e["drafting_depth"] if sequential else max(0, e["verified_tokens"] // e["batch_size"] - 1)
            if sequential and e["drafting_depth"] != d:
                continue
            ran = speculative and (e["drafting_depth"] > 0 or not skips)
            key = (e["batch_size"], d, e["verified_tokens"], ran)
            samples, n, total_ms = pooled.get(key, ([], 0, 0.0))
            pooled[key] = (samples + e["samples_ms"], n + e["n"], total_ms + e["mean_ms"] * e["n"])
        out = []
        for (b, d, v, ran), (samples, n, total_ms) in sorted(pooled.items()):
            samples.sort()
            mid = len(samples) // 2
            if statistic == "mean" or not samples:  # shapes beyond max_cost_keys keep no samples: their mean
                ms = total_ms / n
            else:
                ms = samples[mid] if len(samples) % 2 else 0.5 * (samples[mid - 1] + samples[mid])
            out.append(StepSample(b, d, float(ms), n=n, verified_tokens=v, drafter_ran=ran))
        return out

    def totals(self) -> dict[str, Any]:
        """Drafts, draft tokens, accepted tokens and accepted per position over every step (all phases)."""
        drafts = tokens = accepted = 0
        per_pos = list(self._per_pos_offset)
        for (_p, _c, d), row in self._acceptance.items():
            drafts += row[0]
            tokens += d * row[0]
            if len(per_pos) < d:
                per_pos += [0] * (d - len(per_pos))
            for i in range(d):
                accepted += row[i + 1]
                per_pos[i] += row[i + 1]
        off = self._totals_offset
        return {"num_drafts": drafts + off["num_drafts"], "num_draft_tokens": tokens + off["num_draft_tokens"],
                "num_accepted_tokens": accepted + off["num_accepted_tokens"], "accepted_per_position": per_pos}

    def class_counts(self) -> dict[str, list[int]]:
        """Per class over every step (phases pooled): [drafts, draft tokens, accepted tokens, accepted at position
        0, 1, ...] (cumulative; what the plugin's Prometheus counters export, `policies.plugin.PluginMetrics`)."""
        out: dict[str, list[int]] = {}
        for (_p, cls, d), row in self._acceptance.items():
            c = out.get(cls)
            if c is None:
                c = out[cls] = [0, 0, 0]
            c[0] += row[0]
            c[1] += d * row[0]
            if len(c) < 3 + d:
                c += [0] * (3 + d - len(c))
            for i in range(d):
                c[2] += row[i + 1]
                c[3 + i] += row[i + 1]
        return out

    def depth_histogram(self) -> dict[int, int]:
        """Verified depth -> request-steps at that depth (all steps)."""
        return dict(sorted(self._depth_hist.items()))

    # -- the file (`policies.plugin._stats_file`) --
    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain JSON-able data."""
        return _stats_file.to_dict(self)

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``, built incrementally (`policies.plugin._stats_file.to_json`)."""
        return _stats_file.to_json(self)

    @classmethod
    def from_dict(cls, data: Any, source: str = "plugin stats") -> PluginStats:
        return _stats_file.from_dict(cls, data, source)

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a file)."""
        _stats_file.save(self, path)

    @classmethod
    def load(cls, path: str | Path) -> PluginStats:
        return _stats_file.load(cls, path)
