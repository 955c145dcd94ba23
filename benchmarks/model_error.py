"""Prediction error of the model backend on the CPU fixtures (issue 11 part 5): predicted from a profile vs measured.

Usage::

    # the bundle of a quiet `python -m benchmarks.bench_runtime --rounds 3 --workdir DIR` run:
    python -m benchmarks.validate_simulate --runtime-workdir DIR --bundle B.json
    python -m benchmarks.model_error --bundle B.json [--out FILE]

No engine runs here. The bundle holds a profile made with the ``--baseline`` launch (``bundle['profile']``,
`autotune.profiling.ProfileResult.to_dict()`) and separate measured runs of every config, interleaved over rounds
(``bundle['runs'][label]``: one dict per round, ``"c8:shifting"`` -> that workload's phases at concurrency 8; at
c=1 the first ``bundle['c1_requests']`` requests of each phase were sent one at a time). Each config the predictor
can price (no speculation, static K) is predicted from the profile ALONE, through the public path every
profile-driven prediction of the CLI takes (``autotune.profiling.predictor_from_profile`` -> ``ModelBackend(
acceptance=..., cost_model=...)`` -> ``measure``, as ``--strategy model-guided`` does): measured acceptance per
class and the fitted step-cost model, at each of the bundle's concurrencies, for each bundle workload's request
mix. Other configs (the vLLM schedule, adaptive) are not model-backend configs and are listed as not predicted.

The table gives per config and workload the predicted tok/s, the measured median (min-max) over rounds, the error
(predicted / measured - 1) and, below it, the median absolute error with the load average the bundle recorded.
The issue's goal: median absolute error <= 10%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import round_tokens_per_s

NO_SPEC = "no speculation"
GOAL = 0.10


@dataclass(frozen=True)
class Row:
    """One config on one workload at one concurrency: predicted vs measured output tokens/s."""

    concurrency: int
    config: str
    workload: str
    predicted: float | None
    measured: list[float]

    @property
    def median(self) -> float | None:
        return statistics.median(self.measured) if self.measured else None

    @property
    def error(self) -> float | None:
        """predicted / measured median - 1 (None when either is missing)."""
        if self.predicted is None or not self.median:
            return None
        return self.predicted / self.median - 1.0


def bundle_workload(name: str, phases: Sequence[Sequence[Mapping[str, Any]]], limit: int | None = None) -> Any:
    """A bundle workload (phases of {class, prompt, max_tokens} requests) as one `Workload`: its request mix
    (``limit``: only the first requests of each phase, as the c=1 runs send)."""
    from autotune.workloads import Workload, WorkloadRequest

    classes: dict[str, list[Any]] = {}
    for phase in phases:
        for r in phase[:limit]:
            classes.setdefault(str(r["class"]), []).append(
                WorkloadRequest(prompt=str(r["prompt"]), max_tokens=int(r["max_tokens"]))
            )
    return Workload(name, {c: tuple(reqs) for c, reqs in classes.items()})


def _config(meta: Mapping[str, Any], profile: Mapping[str, Any], concurrency: int) -> Any:
    """The `SpecConfig` of a bundle config, or None when the model backend does not price that kind."""
    from autotune.spec import SpecConfig

    kind = meta.get("kind")
    if kind == "none":
        return SpecConfig(max_num_seqs=concurrency)
    if kind == "static":
        return SpecConfig(
            method=profile.get("method") or "draft_model",
            drafter=str(profile["drafter"]),
            num_speculative_tokens=int(meta["k"]),
            parallel_drafting=bool(profile.get("parallel_drafting")),
            max_num_seqs=concurrency,
        )
    return None


def predict(bundle: Mapping[str, Any]) -> dict[tuple[int, str, str], float | None]:
    """(concurrency, config, workload) -> tok/s predicted from the bundle's profile alone (None: a config kind the model
    backend does not price). Goes through the CLI's public path for profiles (module docstring)."""
    from autotune.backends import ModelBackend, RooflineParams
    from autotune.catalogs import get_drafter, resolve_model
    from autotune.errors import PeagleError
    from autotune.profiling import predictor_from_profile
    from autotune.spec import Scenario

    profile = bundle["profile"]
    acceptance, cost = predictor_from_profile(profile)
    target = resolve_model(str(profile["model"]))
    try:
        specs = [get_drafter(str(profile["drafter"]), target=target)]
    except PeagleError:
        specs = []
    # One profile = one drafter: its acceptance applies to every speculative config here (acceptance_drafter None,
    # so a relative or absolute spelling of the drafter's path both match).
    # The fixtures' tokenizer is byte-level: one character is one prompt token (the default assumes ~4).
    backend = ModelBackend(target, drafters=specs, acceptance=acceptance, cost_model=cost,
                           params=RooflineParams(chars_per_token=1.0), profile_label="bundle profile")
    out: dict[tuple[int, str, str], float | None] = {}
    for concurrency in map(int, bundle["concurrencies"]):
        scenario = Scenario(concurrency=concurrency)
        limit = bundle.get("c1_requests") if concurrency == 1 else None
        for name, phases in bundle["workloads"].items():
            workload = bundle_workload(name, phases, limit)
            for label, meta in bundle["configs"].items():
                config = _config(meta, profile, concurrency)
                if config is None:
                    out[(concurrency, label, name)] = None
                    continue
                m = backend.measure(config, workload, scenario)
                if not m.ok or m.output_tokens_per_s is None:
                    raise SystemExit(f"{label} on {name} at c={concurrency}: the model backend could not predict "
                                     f"it: {m.failure_reason}")
                out[(concurrency, label, name)] = float(m.output_tokens_per_s)
    return out


def compare(
    bundle: Mapping[str, Any], predicted: Mapping[tuple[int, str, str], float | None]
) -> tuple[list[str], list[Row]]:
    """Pure comparison: predicted vs the bundle's measured rounds; (markdown lines, rows)."""
    rows = []
    for c in map(int, bundle["concurrencies"]):
        for label in bundle["configs"]:
            if predicted.get((c, label, next(iter(bundle["workloads"])))) is None:
                continue  # not a model-backend config (the vLLM schedule, adaptive): listed once below
            for name in bundle["workloads"]:
                measured = round_tokens_per_s(bundle["runs"].get(label) or [], f"c{c}:{name}")
                rows.append(Row(c, label, name, predicted[(c, label, name)], measured))
    skipped = [label for label in bundle["configs"]
               if all(predicted.get((int(c), label, n)) is None
                      for c in bundle["concurrencies"] for n in bundle["workloads"])]
    load = bundle.get("load_average") or {}
    runs = max((len(r.measured) for r in rows), default=0)
    profile = bundle["profile"]
    lines = [
        f"Measured {bundle.get('date', '?')} (load average before {load.get('before')}, after {load.get('after')}); "
        f"concurrencies {bundle['concurrencies']}; median of {runs} runs per config (min-max in brackets). Predicted "
        f"from the profile alone (drafter {Path(str(profile.get('drafter'))).name}, baseline launch: "
        f"{bool(profile.get('baseline_samples'))}): its acceptance per class and fitted step-cost model through "
        "`predictor_from_profile` -> `ModelBackend.measure`.",
        "",
        "| c | config | workload | predicted tok/s | measured tok/s | error |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        pred = "-" if r.predicted is None else f"{r.predicted:.1f}"
        if r.median is None:
            meas = "failed" if r.predicted is not None else "-"
        else:
            meas = f"{r.median:.1f} ({min(r.measured):.1f}-{max(r.measured):.1f})"
        err = "-" if r.error is None else f"{r.error:+.1%}"
        lines.append(f"| {r.concurrency} | {r.config} | {r.workload} | {pred} | {meas} | {err} |")
    if skipped:
        lines += ["", "Not model-backend configs (not predicted): " + ", ".join(skipped) + "."]
    errors = [abs(r.error) for r in rows if r.error is not None]
    if errors:
        med = statistics.median(errors)
        lines += ["", f"Median absolute error over {len(errors)} predictions: {med:.1%} (largest "
                      f"{max(errors):.1%}; goal <= {GOAL:.0%}: {'met' if med <= GOAL else 'NOT met'})."]
    else:
        lines += ["", "No config was both predicted and measured."]
    return lines, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="JSON bundle of benchmarks.validate_simulate")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    bundle = json.loads(args.bundle.read_text())
    lines, _ = compare(bundle, predict(bundle))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
