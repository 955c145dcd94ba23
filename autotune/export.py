"""Render a recommendation in the forms vLLM (and our runtime controller) take.

- ``vllm-json``: the ``--speculative-config`` JSON (also what ``LLM(speculative_config=...)`` takes);
- ``vllm-args``: a ``vllm serve`` command line;
- ``yaml``: a file for ``vllm serve --config FILE.yaml`` (vLLM turns nested dicts into JSON arguments);
- ``schedule``: the speculative config with vLLM's ``num_speculative_tokens_per_batch_size`` ranges
  (``[[batch_min, batch_max, K], ...]``, inclusive, starting at batch size 1);
- ``policy``: the runtime policy file (`policies.load_policy` reads it; format owned by ``policies``).

Every export says what it is: `describe` names the recommendation, its concurrency, GPU, workload and figures
(the CLI prints it on stderr), and the YAML forms start with it as a comment header.

Names in an export (model, drafter, GPU, workload file, SLOs) are data, never syntax: YAML and JSON are written by
their serializers, shell words are quoted (`autotune.engine.shell_line`), and comment lines are built by
`comment_lines`, so a name holding a line break (a workload file named ``w\nhost: 0.0.0.0\n#.jsonl``) cannot end
its comment and add a key to a ``vllm serve --config`` file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from autotune.engine import config_args, export_options, serve_command, shell_line
from autotune.errors import UsageError
from autotune.safe_text import printable_line
from autotune.selection import objective_label, slo_words
from autotune.spec import SpecConfig

FORMATS = ("vllm-json", "vllm-args", "yaml", "schedule", "policy")

#: vLLM 0.32 mishandles per-batch-size schedules together with parallel drafting (vLLM issue #45695).
SCHEDULE_PD_WARNING = (
    "vLLM 0.32 mishandles num_speculative_tokens_per_batch_size together with parallel_drafting "
    "(vLLM issue #45695); with a P-EAGLE drafter serve through `peagle-tune serve`, which applies the "
    "schedule by trimming drafts in its scheduler instead."
)
#: A vllm-json export of a config without speculation.
NO_SPECULATION_WARNING = "The recommendation is to serve WITHOUT speculation; there is no speculative config."


def schedule_unsupported(config: SpecConfig) -> str | None:
    """Why vLLM would mishandle `config` with a per-batch-size schedule (``num_speculative_tokens_per_batch_size``),
    or None when it takes it: the one rule the schedule export, `peagle-tune serve`'s plain `vllm serve` line and
    search's `Next:` line follow."""
    return SCHEDULE_PD_WARNING if config.speculative and config.parallel_drafting else None


def format_warnings(fmt: str, recommendation: Mapping[str, Any]) -> list[str]:
    """What exporting `recommendation` (a stored recommendation's dict, or one with its ``best_config``,
    ``metrics`` and ``schedule``) in `fmt` warns about; `render` says these, and `clean_formats` leaves out the
    formats that have any."""
    config = SpecConfig.from_dict(dict(recommendation["best_config"]))
    warnings: list[str] = []
    hypothetical = hypothetical_warning(recommendation)
    if hypothetical and fmt != "policy":
        warnings.append(hypothetical)
    if fmt == "vllm-json" and not config.speculative:
        warnings.append(NO_SPECULATION_WARNING)
    if fmt == "schedule":
        unsupported = schedule_unsupported(config)
        if unsupported:
            warnings.append(unsupported)
    return warnings


def clean_formats(recommendation: Mapping[str, Any]) -> list[str]:
    """The formats `recommendation` exports without a warning or an error (a schedule needs one that speculates
    somewhere), in `FORMATS` order: what a hint may suggest."""
    config = SpecConfig.from_dict(dict(recommendation["best_config"]))
    schedule = recommendation.get("schedule") or []
    has_schedule = config.speculative and any(int(e.get("k", 0)) > 0 for e in schedule)
    return [f for f in FORMATS if not format_warnings(f, recommendation) and (f != "schedule" or has_schedule)]


def hypothetical_warning(recommendation: Mapping[str, Any]) -> str | None:
    """A warning when the recommended drafter is a hypothetical variant (no checkpoint exists), else None."""
    metrics = recommendation.get("metrics") or {}
    if not metrics.get("hypothetical_drafter"):
        return None
    drafter = (recommendation.get("best_config") or {}).get("drafter")
    return (
        f"The recommended drafter {drafter} is HYPOTHETICAL: its acceptance is scaled from a published head and no "
        "checkpoint exists, so vLLM cannot load it. Treat this as a what-if, or re-run the search without "
        "--include-hypothetical."
    )


def vllm_schedule(schedule: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """A stored schedule (``[{"batch_min", "batch_max", "k"}, ...]``) as vLLM's
    ``num_speculative_tokens_per_batch_size``, checked against vLLM's rules: positive inclusive ranges, sorted,
    non-overlapping, the first starting at 1, K >= 0.

    >>> vllm_schedule([{"batch_min": 1, "batch_max": 7, "k": 6}, {"batch_min": 8, "batch_max": 64, "k": 2}])
    [[1, 7, 6], [8, 64, 2]]
    """
    entries = sorted(([int(e["batch_min"]), int(e["batch_max"]), int(e["k"])] for e in schedule), key=lambda e: e[0])
    if not entries or entries[0][0] != 1:
        raise UsageError(f"A batch-size schedule must start at batch size 1 (vLLM's rule), but got {entries}.")
    previous_end = 0
    for start, end, k in entries:
        if start > end or start <= previous_end or k < 0:
            raise UsageError(
                "A batch-size schedule needs sorted, non-overlapping inclusive ranges with K >= 0, but got "
                f"{entries}. Re-run `peagle-tune search` to rebuild it."
            )
        previous_end = end
    return entries


def render(fmt: str, recommendation: dict[str, Any], *, as_json: bool = False) -> tuple[str, list[str]]:
    """Render `recommendation` (a stored recommendation's dict) in `fmt`. Returns (text, warnings).

    `as_json` writes the policy file as JSON (for a ``.json`` file name) instead of YAML.
    """
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, but got {fmt!r}.")
    model = recommendation["model"]
    config = SpecConfig.from_dict(recommendation["best_config"])
    warnings = format_warnings(fmt, recommendation)
    if fmt == "vllm-json":
        spec = config.speculative_config()
        if spec is None:
            return "null\n", warnings
        return json.dumps(spec, indent=2) + "\n", warnings
    max_model_len = export_max_model_len(recommendation)
    if fmt == "vllm-args":
        return shell_line(serve_command(model, serve_args(recommendation))) + "\n", warnings
    if fmt == "yaml":
        header = comment_lines([*describe(recommendation), "Serve with: vllm serve --config THIS_FILE.yaml"])
        options = export_options(model, config, max_model_len)
        options.update({key.replace("_", "-"): value for key, value in fit_args(recommendation, config).items()})
        return header + yaml.safe_dump(options, sort_keys=False), warnings
    if fmt == "schedule":
        return _schedule(config, recommendation), warnings
    doc = policy_document(recommendation)
    if as_json:
        return json.dumps(doc, indent=2) + "\n", warnings
    return _policy_header(recommendation) + yaml.safe_dump(doc, sort_keys=False), warnings


def serve_args(recommendation: Mapping[str, Any], config: SpecConfig | None = None,
               speculative_extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``vllm serve`` arguments a vllm-args export prints (`config_args` with the drafter path as stored, and
    `export_max_model_len`): for `config` (default: the recommendation's), `speculative_extra` added to its
    speculative config (`serve --dry-run` adds K per batch size)."""
    if config is None:
        config = SpecConfig.from_dict(recommendation["best_config"])
    args = config_args(config, engine_paths=False, speculative_extra=speculative_extra)
    args.update(fit_args(recommendation, config))
    return args


def fit_args(recommendation: Mapping[str, Any], config: SpecConfig | None = None) -> dict[str, Any]:
    """The memory arguments the search's fit check assumed (`autotune.search.machine.check_fit`), which every
    export carries: max_model_len (`export_max_model_len`, when stored), tensor_parallel_size (1 too) and, for a
    GPU, gpu_memory_utilization (the stored one, else vLLM's default the fit check used,
    `autotune.fit.DEFAULT_GPU_MEMORY_UTILIZATION`). A CPU recommendation has none: there vLLM reads it as the share
    of RAM to reserve, chosen from free memory at launch (`autotune.serving.cpu_memory_fraction`)."""
    from autotune.fit import DEFAULT_GPU_MEMORY_UTILIZATION

    if config is None:
        config = SpecConfig.from_dict(recommendation["best_config"])
    args: dict[str, Any] = {}
    max_model_len = export_max_model_len(recommendation)
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    args["tensor_parallel_size"] = config.tensor_parallel_size
    if str(recommendation.get("gpu") or "cpu").lower() != "cpu":
        stored = (recommendation.get("metrics") or {}).get("gpu_memory_utilization")
        valid = isinstance(stored, int | float) and not isinstance(stored, bool) and 0 < stored <= 1
        args["gpu_memory_utilization"] = float(stored) if valid and stored is not None else (
            DEFAULT_GPU_MEMORY_UTILIZATION)
    return args


def fit_line(recommendation: Mapping[str, Any]) -> str:
    """`fit_args` as ``vllm serve`` flags in a sentence, for the exports that hold only the speculative config
    (vllm-json, schedule, policy) and the YAML header: ``Launch with --max-model-len 512 --tensor-parallel-size 1
    --gpu-memory-utilization 0.92, as the fit check assumed.``"""
    flags = " ".join(f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
                     for k, v in fit_args(recommendation).items())
    return f"Launch with {flags}, as the fit check assumed."


def export_max_model_len(recommendation: Mapping[str, Any]) -> int | None:
    """The ``--max-model-len`` an export passes: the one the recommendation's launches used or its workload needs
    (stored in its metrics by the search, `autotune.fit.max_model_len_of`); None for recommendations stored before
    (vLLM then sizes for the model's own limit and may refuse to start where the search's launches did not)."""
    value = (recommendation.get("metrics") or {}).get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def pick_lines(recommendation: Mapping[str, Any]) -> list[str]:
    """How the recommendation's K was picked, as the search printed it: the K that tied with it
    (``metrics.tie_note``, `autotune.search.compare.tie_note`) and its figure over the drafter's model-card K
    (``metrics.speedup_vs_published_k``); [] when neither was stored."""
    metrics = recommendation.get("metrics") or {}
    config = recommendation.get("best_config") or {}
    out = [f"{metrics['tie_note']}."] if isinstance(metrics.get("tie_note"), str) else []
    pub, pub_k, k = metrics.get("speedup_vs_published_k"), metrics.get("published_k"), config.get(
        "num_speculative_tokens")
    if isinstance(pub, int | float) and isinstance(pub_k, int) and pub_k != k:
        kind = (recommendation.get("provenance") or {}).get("kind") or "figures of unknown origin"
        out.append(f"K={k} is {pub:.2f}x the model card's K={pub_k} ({kind}).")
    return out


def describe(recommendation: Mapping[str, Any]) -> list[str]:
    """What an export holds, in two lines: the recommendation (id, model, GPU, workload, objective, concurrency,
    its SLOs if any: `autotune.selection.slo_words`) and its config and figures (tokens/s, speedup over no
    speculation, measured or predicted); a third names the deployment measured figures come from
    (`deployment_line`), when recorded. Example::

        recommendation #3: openai/gpt-oss-120b on NVIDIA H200 SXM 141GB, mt-bench, throughput, concurrency 64
        amazon/gpt-oss-120b-p-eagle (4L), parallel drafting, K=4, max_num_seqs=64: 6509.8 tok/s, 1.72x vs no
        speculation (predicted by the model backend)
    """
    metrics = recommendation.get("metrics") or {}
    provenance = recommendation.get("provenance") or {}
    scenario = recommendation.get("scenario") or {}
    where = (f"recommendation #{recommendation.get('id')}: {recommendation.get('model')} on "
             f"{recommendation.get('gpu')}, {recommendation.get('workload_name')}, {objective_label(recommendation)}, "
             f"concurrency {scenario.get('concurrency')}")
    slo = slo_words(recommendation)
    if slo:
        where += f"; SLO: {slo}"
    try:
        config = SpecConfig.from_dict(dict(recommendation.get("best_config") or {}))
    except Exception:  # stored by another version: say what it holds
        what = str(recommendation.get("best_config"))
    else:
        if config.speculative:
            layers = f" ({config.drafter_layers}L)" if config.drafter_layers else ""
            mode = "parallel drafting" if config.parallel_drafting else "sequential drafting"
            what = f"{config.drafter}{layers}, {mode}, K={config.k}, max_num_seqs={config.max_num_seqs}"
        else:
            what = f"no speculation, max_num_seqs={config.max_num_seqs}"
    figures = []
    tps, speedup = metrics.get("output_tokens_per_s"), metrics.get("speedup_vs_no_spec")
    if isinstance(tps, int | float):
        figures.append(f"{tps:.1f} tok/s")
    if isinstance(speedup, int | float):
        figures.append(f"{speedup:.2f}x vs no speculation")
    kind = provenance.get("kind")
    source = f"{kind} by the {provenance.get('backend')} backend" if kind else "figures of unknown origin"
    lines = [where, f"{what}: {', '.join(figures) or 'no figures'} ({source})"]
    lines += pick_lines(recommendation)
    try:
        lines.append(fit_line(recommendation))
    except Exception:  # a config another version stored: `what` above already says what it holds
        pass
    deployment = deployment_line(recommendation)
    return lines if deployment is None else [*lines, deployment]


def deployment_line(recommendation: Mapping[str, Any]) -> str | None:
    """"Figures measured in vllm serve (async, V2)." (`autotune.measurement.Provenance.deployment`); None when the
    figures record none (predicted, or stored before it was recorded)."""
    deployment = (recommendation.get("provenance") or {}).get("deployment")
    return f"Figures measured in {deployment}." if deployment else None


def _schedule(config: SpecConfig, recommendation: Mapping[str, Any]) -> str:
    spec = config.speculative_config()
    schedule = recommendation.get("schedule") or []
    if spec is None or not schedule:
        raise UsageError(
            "This recommendation has no batch-size schedule (it serves without speculation, was measured without a "
            "profile, or was made before schedules existed). Re-run `peagle-tune search` with the model backend "
            "to get one."
        )
    entries = vllm_schedule(schedule)
    top = max(k for _, _, k in entries)
    if top == 0:
        raise UsageError(
            f"The schedule never speculates (K=0 for every batch size: {entries}); serve without speculation "
            "instead (`peagle-tune export --format vllm-args` of a no-speculation config)."
        )
    # vLLM uses min(num_speculative_tokens, scheduled K) per step, so the drafter's K is the schedule's deepest depth.
    spec["num_speculative_tokens"] = top
    spec["num_speculative_tokens_per_batch_size"] = entries
    # One [start, end, K] range per line.
    return re.sub(r"\[\s+(\d+),\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2, \3]", json.dumps(spec, indent=2)) + "\n"


def policy_document(recommendation: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime policy file (`policies.RequestPolicy`, format version 1) for a recommendation.

    static_k is the recommended K; each workload class gets its best K at the tuned scenario as its cap; max_k (the
    drafter's K) is the deepest of those. The file is built and validated by `policies.RequestPolicy`.
    """
    from policies import ClassPolicy, RequestPolicy

    config = SpecConfig.from_dict(recommendation["best_config"])
    class_policy = recommendation.get("class_policy") or {}
    caps = {name: int(values.get("max_k", config.k)) for name, values in sorted(class_policy.items())}
    max_k = max([config.k, *caps.values()])
    default_class = "chat" if "chat" in caps or not caps else next(iter(caps))
    policy = RequestPolicy(
        static_k=config.k,
        max_k=max_k,
        classes={name: ClassPolicy(max_k=cap) for name, cap in caps.items()},
        default_class=default_class,
        model=recommendation["model"],
    )
    return policy.to_dict()


def _policy_header(recommendation: Mapping[str, Any]) -> str:
    provenance = recommendation.get("provenance") or {}
    scenario = recommendation.get("scenario") or {}
    lines = [
        f"peagle-tune runtime policy from recommendation #{recommendation.get('id')} "
        f"({recommendation.get('objective')}, concurrency {scenario.get('concurrency')}, "
        f"{recommendation.get('workload_name')}).",
        f"Figures {provenance.get('kind', '?')} by the {provenance.get('backend', '?')} backend for "
        f"{provenance.get('device', '?')}" + (f" from {provenance['profile']}" if provenance.get("profile") else "")
        + ".",
        *filter(None, [deployment_line(recommendation)]),
        fit_line(recommendation),
        "Load with policies.load_policy(path); serve with `peagle-tune serve`.",
    ]
    schedule = recommendation.get("schedule") or []
    if schedule:
        ranges = ", ".join(f"{e['batch_min']}-{e['batch_max']}: K={e['k']}" for e in schedule)
        lines.append(f"Batch-size schedule (export --format schedule): {ranges}.")
    return comment_lines(lines)


def comment_lines(lines: Iterable[str]) -> str:
    """`lines` as YAML (and shell) comments, one ``# `` line each. Every character that is not printable, line
    breaks of every kind among them, becomes ``?`` (`printable_line`), so no text can end its comment.

    >>> comment_lines(["from w\\nhost: 0.0.0.0"])
    '# from w?host: 0.0.0.0\\n'
    """
    return "".join(f"# {printable_line(line)}\n" for line in lines)

