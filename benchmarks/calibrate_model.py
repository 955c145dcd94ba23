"""Calibrate the model backend's roofline against published throughput, and report predicted vs published.

Usage::

    python -m benchmarks.calibrate_model                      # evaluate the committed constants (RooflineParams)
    python -m benchmarks.calibrate_model --fit                # refit the free constants, print them
    python -m benchmarks.calibrate_model --shape              # also the concurrency sweep per target
    python -m benchmarks.calibrate_model --advantage          # P-EAGLE / EAGLE-3 vs concurrency, step breakdown
    python -m benchmarks.calibrate_model --write-doc docs/benchmarks/model.md   # regenerate the report's tables

The points live in ``autotune/backends/model_calibration.yaml`` (sources and setups there); the test
``tests/test_model_backend_calibration.py`` reads the same file. Each point predicts a published figure with
`ModelBackend` (catalog model, GPU and drafters; the paper's own acceptance where the source measured the paper's
heads). The fit (`--fit`) adjusts only `FREE` constants of `RooflineParams`, by least squares on the log error of
every point (a published range counts as exact inside it), each group of points weighted equally, plus a Gaussian
prior per constant pulling it toward the physically expected value: a few published ratios must not drag a
constant to an implausible value. Points marked `held_out` are predicted but not fitted. `--fit --write` stores the
fitted values, and the speedup spread drawn from the residuals, in ``autotune/backends/roofline.yaml`` (priors and
sources beside them), which `RooflineParams` reads for its defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from autotune.backends import CONSTANTS_FILE, ModelBackend, RooflineParams, fitted_constants
from autotune.catalogs import acceptance_survival, get_drafter
from autotune.measurement import Measurement
from autotune.spec import MAX_K, Scenario, SpecConfig
from autotune.workloads import Workload, WorkloadRequest
from benchmarks.common import REPO
from policies import AcceptanceProfile

DATA = REPO / "autotune" / "backends" / "model_calibration.yaml"

#: The fitted constants: name -> (prior mean, prior sigma, lower bound, upper bound). The priors (and their sources)
#: live in autotune/backends/roofline.yaml; the bounds keep the optimiser inside physical values.
BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.55, 0.95),
    "compute_efficiency": (0.20, 0.80),
    "moe_compute_efficiency": (0.10, 0.80),
    "step_overhead_ms": (0.0, 2.0),
    "draft_pass_overhead_ms": (0.0, 1.5),
    "routing_locality": (0.0, 0.9),
    "spec_request_overhead_ms": (0.0, 0.2),
    "kernel_overlap_loss": (0.0, 1.0),
    "draft_token_overhead_ms": (0.0, 0.05),
}


def _free(name: str) -> tuple[float, float, float, float]:
    """(prior mean, prior sigma, lower bound, upper bound) of one fitted constant."""
    mean, sigma = (float(v) for v in fitted_constants()["constants"][name]["prior"])
    return mean, sigma, *BOUNDS[name]


FREE: dict[str, tuple[float, float, float, float]] = {name: _free(name) for name in BOUNDS}
#: Relative error one point is allowed before it costs as much as one prior sigma.
POINT_SIGMA = 0.05


@dataclass(frozen=True)
class Prediction:
    """One predicted figure of a point (one workload x concurrency) against its published value."""

    point: str
    workload: str
    concurrency: int
    predicted: float
    published: float | tuple[float, float]
    detail: str = ""
    held_out: bool = False
    """Not used by the fit (`held_out` in the data file): its error measures prediction, not fit."""

    @property
    def centre_log_error(self) -> float:
        """Log error against the published figure (the middle of a published range): the residual the speedup
        ranges are drawn from (a range's width is spread the model cannot resolve either)."""
        published = self.published
        centre = (published[0] + published[1]) / 2.0 if isinstance(published, tuple) else published
        return math.log(self.predicted / centre)

    @property
    def error(self) -> float:
        """Relative error: 0 inside a published range, else (predicted - nearest published end) / that end."""
        if isinstance(self.published, tuple):
            low, high = self.published
            if low <= self.predicted <= high:
                return 0.0
            end = low if self.predicted < low else high
            return (self.predicted - end) / end
        return (self.predicted - self.published) / self.published

    @property
    def log_error(self) -> float:
        if isinstance(self.published, tuple):
            low, high = self.published
            if low <= self.predicted <= high:
                return 0.0
            return math.log(self.predicted / (low if self.predicted < low else high))
        return math.log(self.predicted / self.published)


def load(path: Path = DATA) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise SystemExit(f"{path}: expected a mapping with a `points` list.")
    return data


def workload(name: str, prompt_tokens: int, output_tokens: int) -> Workload:
    """Four requests of one class named after the benchmark (the model backend looks the class up by that name),
    with ~prompt_tokens of prompt (4 characters per token) and output_tokens each."""
    request = WorkloadRequest(prompt="x" * (4 * prompt_tokens), max_tokens=output_tokens)
    return Workload(name, {name: (request,) * 4})


def _params(values: Mapping[str, float] | None) -> RooflineParams:
    changes: dict[str, Any] = dict(values or {})
    return dataclasses.replace(RooflineParams(), **changes)


class Evaluator:
    """Predicts every point of the data file for one set of roofline constants (backends cached per setup)."""

    def __init__(self, data: Mapping[str, Any], params: RooflineParams) -> None:
        self.data = data
        self.params = params
        setup = data.get("setup") or {}
        self.prompt_tokens = int(setup.get("prompt_tokens", 150))
        self.output_tokens = int(setup.get("output_tokens", 2048))

    @functools.cache  # noqa: B019 - one evaluator per parameter set, discarded after use
    def backend(self, model: str, gpu: str, drafter: str | None, override: str | None) -> ModelBackend:
        acceptance: dict[str, AcceptanceProfile] = {}
        if drafter is not None and override is not None:
            parallel = get_drafter(drafter).parallel_drafting
            for wl, points in yaml.safe_load(override).items():
                survival = acceptance_survival({int(k): float(v) for k, v in points.items()}, parallel, MAX_K)
                acceptance[wl] = AcceptanceProfile.from_survival(survival, num_drafts=100_000)
        return ModelBackend(
            model,
            gpu,
            params=self.params,
            acceptance=acceptance or None,
            acceptance_drafter=drafter if acceptance else None,
            profile_label="P-EAGLE paper Table 9" if acceptance else None,
        )

    def measurement(self, point: Mapping[str, Any], cfg: Mapping[str, Any], wl: str, c: int, k: int) -> Measurement:
        """The model backend's prediction of `cfg` at depth `k` on workload `wl` at concurrency `c`."""
        override = (point.get("acceptance") or {}).get(cfg["drafter"])
        backend = self.backend(point["model"], point["gpu"], cfg["drafter"],
                               yaml.safe_dump(override) if override else None)
        config = SpecConfig(
            method="eagle3",
            drafter=cfg["drafter"],
            num_speculative_tokens=k,
            parallel_drafting=bool(cfg.get("parallel", False)),
            drafter_layers=cfg.get("layers"),
            max_num_seqs=c,
        )
        m = backend.measure(config, workload(wl, self.prompt_tokens, self.output_tokens), Scenario(concurrency=c))
        if not m.ok or m.output_tokens_per_s is None:
            raise RuntimeError(f"{point['id']}: {config.label()} failed: {m.failure_reason}")
        return m

    def _tokens_per_s(self, point: Mapping[str, Any], cfg: Mapping[str, Any], wl: str, c: int, k: int) -> float:
        return float(self.measurement(point, cfg, wl, c, k).output_tokens_per_s or 0.0)

    def _baseline(self, point: Mapping[str, Any], wl: str, c: int) -> float:
        backend = self.backend(point["model"], point["gpu"], None, None)
        m = backend.measure(SpecConfig(max_num_seqs=c), workload(wl, self.prompt_tokens, self.output_tokens),
                            Scenario(concurrency=c))
        return float(m.output_tokens_per_s or 0.0)

    def best(self, point: Mapping[str, Any], cfg: Mapping[str, Any], wl: str, c: int) -> tuple[float, int]:
        """(tokens/s, K) at the best K of the config's k_choices (or its fixed k)."""
        choices = cfg.get("k_choices") or [cfg["k"]]
        return max((self._tokens_per_s(point, cfg, wl, c, int(k)), int(k)) for k in choices)

    def predict(self, point: Mapping[str, Any]) -> list[Prediction]:
        published = point["published"]
        target: float | tuple[float, float] = (
            (float(published[0]), float(published[1])) if isinstance(published, list) else float(published)
        )
        out = []
        for wl in point["workloads"]:
            for c in point["concurrencies"]:
                cfg = point["config"]
                metric = point["metric"]
                if metric == "tpot_ratio":
                    lo = self._tokens_per_s(point, cfg, wl, c, int(cfg["k_from"]))
                    hi = self._tokens_per_s(point, cfg, wl, c, int(cfg["k_to"]))
                    value, detail = lo / hi, f"K={cfg['k_from']} -> K={cfg['k_to']}"
                else:
                    tps, k = self.best(point, cfg, wl, c)
                    if metric == "tokens_per_s":
                        value, detail = tps, f"K={k}"
                    elif metric == "speedup_vs_no_spec":
                        value, detail = tps / self._baseline(point, wl, c), f"K={k}"
                    elif metric == "ratio":
                        other, k_other = self.best(point, point["versus"], wl, c)
                        value, detail = tps / other, f"K={k} vs K={k_other}"
                    else:
                        raise SystemExit(f"{point['id']}: unknown metric {metric!r}.")
                held = point.get("held_out", False)
                held_out = held is True or (isinstance(held, list) and int(c) in held)
                out.append(Prediction(point["id"], wl, int(c), value, target, detail, held_out))
        return out

    def predictions(self) -> list[Prediction]:
        return [p for point in self.data["points"] for p in self.predict(point)]

    def best_k(self) -> list[tuple[Mapping[str, Any], int]]:
        """(check, predicted best K) for every `best_k` shape check."""
        out = []
        for check in self.data.get("best_k") or []:
            _, k = self.best(check, check["config"], check["workload"], int(check["concurrency"]))
            out.append((check, k))
        return out


def residuals(values: Sequence[float], data: Mapping[str, Any]) -> np.ndarray:
    """Weighted log errors of every point (each group's weight shared by its predictions) and the priors."""
    named = dict(zip(FREE, values, strict=True))
    evaluator = Evaluator(data, _params(named))
    rows: list[float] = []
    for point in data["points"]:
        if point.get("fit", True) is False:
            continue
        preds = [p for p in evaluator.predict(point) if not p.held_out]
        if not preds:
            continue
        weight = float(point.get("weight", 1.0)) / len(preds)
        rows.extend(math.sqrt(weight) * p.log_error / POINT_SIGMA for p in preds)
    for name, value in named.items():
        mean, sigma, _, _ = FREE[name]
        rows.append((value - mean) / sigma)
    return np.asarray(rows)


def fit(data: Mapping[str, Any]) -> dict[str, float]:
    from scipy.optimize import least_squares

    start = [getattr(RooflineParams(), name) for name in FREE]
    lower = [FREE[n][2] for n in FREE]
    upper = [FREE[n][3] for n in FREE]
    result = least_squares(residuals, start, bounds=(lower, upper), args=(data,), diff_step=1e-3, x_scale="jac")
    return {name: round(float(v), 3) for name, v in zip(FREE, result.x, strict=True)}


SPEEDUP_METRICS = ("ratio", "speedup_vs_no_spec")


def speedup_sigma(data: Mapping[str, Any], preds: Sequence[Prediction]) -> float:
    """Root mean square of the log error against each published figure's middle, over the speedup-type
    predictions of every point that is fitted or held out (the `fit: false` reported points excluded)."""
    metric = {p["id"]: p["metric"] for p in data["points"]}
    reported = {p["id"] for p in data["points"] if p.get("fit", True) is False}
    errors = [p.centre_log_error for p in preds if metric[p.point] in SPEEDUP_METRICS and p.point not in reported]
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else 0.0


def split_table(data: Mapping[str, Any], preds: Sequence[Prediction]) -> list[str]:
    """Fit and held-out error per source and concurrency: median and largest absolute error."""
    source = {p["id"]: p["id"].split("-")[0] for p in data["points"]}
    reported = {p["id"] for p in data["points"] if p.get("fit", True) is False}
    groups: dict[tuple[str, str, int], list[float]] = {}
    for p in preds:
        split = "reported" if p.point in reported else ("held out" if p.held_out else "fit")
        groups.setdefault((source[p.point], split, p.concurrency), []).append(abs(p.error))
    lines = ["| source | split | c | predictions | median error | largest error |", "|---|---|---:|---:|---:|---:|"]
    for (src, split, c), errs in sorted(groups.items(), key=lambda kv: (kv[0][1] != "fit", kv[0])):
        lines.append(f"| {src} | {split} | {c} | {len(errs)} | {float(np.median(errs)):.1%} | {max(errs):.1%} |")
    for split in ("fit", "held out"):
        errs = [abs(p.error) for p in preds if p.point not in reported and p.held_out == (split == "held out")]
        if errs:
            lines.append(f"| all | {split} | - | {len(errs)} | {float(np.median(errs)):.1%} | {max(errs):.1%} |")
    return lines


def write_constants(values: Mapping[str, float], sigma: float, path: Path = CONSTANTS_FILE) -> None:
    """Write fitted values and the speedup spread into the constants file, keeping priors and sources."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for name, value in values.items():
        data["constants"][name]["value"] = float(value)
    data["speedup_log_sigma"] = round(float(sigma), 4)
    text = path.read_text(encoding="utf-8")
    header = text[: text.index("\nconstants:") + 1]
    lines = ["constants:"]
    for name, entry in data["constants"].items():
        prior = ", ".join(f"{v:g}" for v in entry["prior"])
        source = json.dumps(entry["source"])
        lines.append(f"  {name}: {{value: {entry['value']:g}, prior: [{prior}], source: {source}}}")
    lines += [
        "# Spread of a predicted speedup (log scale, one sigma) from the calibration's residuals: the root mean",
        "# square of the log error against the middle of each published figure, over every fitted and held-out",
        "# prediction.",
        f"speedup_log_sigma: {data['speedup_log_sigma']:g}",
    ]
    path.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")


def _fmt(value: float | tuple[float, float], metric: str) -> str:
    spec = ".0f" if metric == "tokens_per_s" else ".3f"
    if isinstance(value, tuple):
        return f"{value[0]:{spec}}-{value[1]:{spec}}"
    return f"{value:{spec}}"


def table(data: Mapping[str, Any], preds: Sequence[Prediction]) -> list[str]:
    metric = {p["id"]: p["metric"] for p in data["points"]}
    setup = {p["id"]: f"{p['model']} {p['gpu'].upper()}" for p in data["points"]}
    lines = [
        "| point | setup | metric | workload | c | predicted | published | error | best K |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for p in preds:
        lines.append(
            f"| {p.point} | {setup[p.point]} | {metric[p.point]} | {p.workload} | {p.concurrency} | "
            f"{_fmt(p.predicted, metric[p.point])} | {_fmt(p.published, metric[p.point])} | {p.error:+.1%} | "
            f"{p.detail} |"
        )
    return lines


def best_k_table(checks: Sequence[tuple[Mapping[str, Any], int]]) -> list[str]:
    lines = ["| check | drafter | c | predicted best K | published |", "|---|---|---:|---:|---:|"]
    for check, k in checks:
        layers = f" ({check['config']['layers']}L)" if check["config"].get("layers") else ""
        lines.append(f"| {check['id']} | {check['config']['drafter']}{layers} | {check['concurrency']} | {k} | "
                     f"{check['published']} |")
    return lines


SUMMARY_START, SUMMARY_END = "<!-- summary:start -->", "<!-- summary:end -->"
START, END = "<!-- calibration:start -->", "<!-- calibration:end -->"
SHAPE_START, SHAPE_END = "<!-- shape:start -->", "<!-- shape:end -->"

#: Target -> (P-EAGLE head, EAGLE-3 head) for the concurrency sweep of `shape_table`.
SHAPE_HEADS = {
    "gpt-oss-120b": ("amazon/gpt-oss-120b-p-eagle", "nvidia/gpt-oss-120b-Eagle3-short-context"),
    "gpt-oss-20b": ("amazon/GPT-OSS-20B-P-EAGLE", "RedHatAI/gpt-oss-20b-speculator.eagle3"),
    "qwen3-coder-30b": ("amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE",
                        "lmsys/SGLang-EAGLE3-Qwen3-Coder-30B-A3B-Instruct-SpecForge"),
}
SHAPE_CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)
#: The sweep's concurrencies in the report: those of the published points (PR #32887: 1 and 8; the blog: 1 and 64).
DOC_SHAPE_CONCURRENCIES = (1, 8, 64)


def shape_table(data: Mapping[str, Any], params: RooflineParams, gpus: Sequence[str] = ("b200", "h200"),
                concurrencies: Sequence[int] = SHAPE_CONCURRENCIES) -> list[str]:
    """Per target, GPU and concurrency (MT-Bench, the data file's setup): no-speculation tokens/s and the best
    config (K in 1..8) of P-EAGLE 4-layer, P-EAGLE 2-layer (hypothetical) and EAGLE-3 as speedups over it."""
    evaluator = Evaluator(data, params)
    lines = [
        "| target | GPU | c | no spec tok/s | P-EAGLE 4L | P-EAGLE 2L* | EAGLE-3 | P-EAGLE 4L / EAGLE-3 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, (peagle, eagle3) in SHAPE_HEADS.items():
        for gpu in gpus:
            point = {"id": "shape", "model": model, "gpu": gpu}
            for c in concurrencies:
                base = evaluator._baseline(point, "mt-bench", c)
                ks = list(range(1, 9))
                four = evaluator.best(point, {"drafter": peagle, "parallel": True, "k_choices": ks}, "mt-bench", c)
                two = evaluator.best(point, {"drafter": peagle, "parallel": True, "layers": 2, "k_choices": ks},
                                     "mt-bench", c)
                seq = evaluator.best(point, {"drafter": eagle3, "parallel": False, "k_choices": ks}, "mt-bench", c)
                lines.append(
                    f"| {model} | {gpu.upper()} | {c} | {base:.0f} | {four[0] / base:.2f}x (K={four[1]}) | "
                    f"{two[0] / base:.2f}x (K={two[1]}) | {seq[0] / base:.2f}x (K={seq[1]}) | {four[0] / seq[0]:.2f} |"
                )
    return lines


ADVANTAGE_START, ADVANTAGE_END = "<!-- advantage:start -->", "<!-- advantage:end -->"
#: The setup of the published per-concurrency advantage (the vLLM P-EAGLE blog): target, GPU.
ADVANTAGE_SETUP = ("gpt-oss-20b", "b200")


def _advantage_points(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The data file's `ratio` points for `ADVANTAGE_SETUP` (the first one's heads and K sweep are used)."""
    model, gpu = ADVANTAGE_SETUP
    points = [p for p in data["points"] if (p["model"], p["gpu"], p["metric"]) == (model, gpu, "ratio")]
    if not points:
        raise SystemExit(f"no `ratio` point for {model} on {gpu} in the data file.")
    return points


def advantage_table(data: Mapping[str, Any], params: RooflineParams) -> list[str]:
    """P-EAGLE over EAGLE-3 (each at its best K of the published sweep) per concurrency and workload for the
    blog's setup (`ADVANTAGE_SETUP`), beside the published ranges of the data file's `ratio` points for it."""
    model, gpu = ADVANTAGE_SETUP
    points = _advantage_points(data)
    published = {int(c): (p["published"], p["id"]) for p in points for c in p["concurrencies"]}
    workloads = list(points[0]["workloads"])
    evaluator = Evaluator(data, params)
    point = {"id": "advantage", "model": model, "gpu": gpu}
    lines = [
        "| c | " + " | ".join(workloads) + " | published | source |",
        "|---:|" + "---:|" * len(workloads) + "---:|---|",
    ]
    for c in SHAPE_CONCURRENCIES:
        cells = []
        for wl in workloads:
            mine, k = evaluator.best(point, points[0]["config"], wl, c)
            other, k_other = evaluator.best(point, points[0]["versus"], wl, c)
            cells.append(f"{mine / other:.2f} (K={k} vs {k_other})")
        figure, source = published.get(c, (None, "-"))
        shown = "-" if figure is None else (f"{figure[0]:.2f}-{figure[1]:.2f}" if isinstance(figure, list)
                                            else f"{figure:.2f}")
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {shown} | {source} |")
    return lines


def breakdown_table(data: Mapping[str, Any], params: RooflineParams, workload_name: str = "mt-bench") -> list[str]:
    """What each head's step is made of at its best K of the published sweep (as in `advantage_table`) per
    concurrency: the uncalibrated roofline parts (`StepTime.breakdown`, ms) and the experts read per MoE layer."""
    model, gpu = ADVANTAGE_SETUP
    first = _advantage_points(data)[0]
    evaluator = Evaluator(data, params)
    point = {"id": "breakdown", "model": model, "gpu": gpu}
    lines = [
        "| c | head | K | AL | step ms | weights | experts (per layer) | attention/KV | drafter | fixed | bound |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in SHAPE_CONCURRENCIES:
        for head, cfg in (("P-EAGLE", first["config"]), ("EAGLE-3", first["versus"])):
            _, k = evaluator.best(point, cfg, workload_name, c)
            extra = evaluator.measurement(point, cfg, workload_name, c, k).extra
            parts = extra["step_breakdown_ms"]
            lines.append(
                f"| {c} | {head} | {k} | {extra['acceptance_length']:.2f} | {extra['step_ms']:.2f} | "
                f"{parts['weights']:.2f} | {parts['experts']:.2f} ({extra['experts_per_layer']:.1f}) | "
                f"{parts['attention_kv']:.2f} | {parts['drafter']:.2f} | {parts['fixed_overhead']:.2f} | "
                f"{extra['bound']} |"
            )
    return lines


def _replace_section(text: str, start: str, end: str, body: Sequence[str], path: Path) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} section to replace.")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + "\n".join([start, *body, end]) + tail


def write_doc(path: Path, values: Mapping[str, float], summary: Sequence[str], points: Sequence[str],
              shape: Sequence[str], advantage: Sequence[str]) -> None:
    """Replace the generated parts of the report (between the markers) with this run's tables: the error summary
    (`split_table`), the per-point tables, the concurrency sweep and the advantage with its step breakdown."""
    text = path.read_text(encoding="utf-8")
    constants = ", ".join(f"`{k}` = {v:g}" for k, v in values.items())
    text = _replace_section(text, SUMMARY_START, SUMMARY_END, summary, path)
    text = _replace_section(text, START, END, [f"Constants: {constants}.", "", *points], path)
    text = _replace_section(text, SHAPE_START, SHAPE_END, shape, path)
    text = _replace_section(text, ADVANTAGE_START, ADVANTAGE_END, advantage, path)
    path.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="refit the free constants and evaluate with them")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--write-doc", type=Path, help="write the tables into this markdown report")
    parser.add_argument("--shape", action="store_true", help="also print the concurrency sweep per target")
    parser.add_argument("--advantage", action="store_true",
                        help="also print P-EAGLE over EAGLE-3 per concurrency for GPT-OSS 20B on a B200 beside the "
                        "published points, and each head's step breakdown at its best K")
    parser.add_argument("--write", action="store_true",
                        help="write the fitted constants and the speedup spread into autotune/backends/roofline.yaml")
    args = parser.parse_args(argv)
    data = load(args.data)
    values = fit(data) if args.fit else {name: getattr(RooflineParams(), name) for name in FREE}
    print("constants:", ", ".join(f"{k}={v:g}" for k, v in values.items()))
    evaluator = Evaluator(data, _params(values))
    preds = evaluator.predictions()
    points = table(data, preds) + [""] + best_k_table(evaluator.best_k())
    print("\n".join(points))
    sigma = speedup_sigma(data, preds)
    worst = max(abs(p.error) for p in preds)
    within = sum(abs(p.error) <= 0.10 for p in preds)
    summary = [
        *split_table(data, preds),
        "",
        f"Speedup spread (one sigma, log scale): {sigma:.4f}. {within} of {len(preds)} predictions within 10% of "
        f"the published figure (worst {worst:+.1%}).",
    ]
    print("\n".join(summary))
    if args.write:
        write_constants(values, sigma)
        print(f"wrote {CONSTANTS_FILE}")
    if args.shape:
        print("\n".join(shape_table(data, _params(values))))
    advantage: list[str] = []
    if args.advantage or args.write_doc:
        advantage = advantage_table(data, _params(values)) + [""] + breakdown_table(data, _params(values))
    if args.advantage:
        print("\n".join(advantage))
    if args.write_doc:
        shape = shape_table(data, _params(values), concurrencies=DOC_SHAPE_CONCURRENCIES)
        write_doc(args.write_doc, values, summary, points, shape, advantage)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
