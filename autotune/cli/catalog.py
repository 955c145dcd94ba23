"""`peagle-tune list models|drafters|gpus|workloads`: what the catalogs and built-in workloads hold, by the names the
other commands take."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from rich.console import RenderableType
from rich.text import Text

from autotune.cli._common import console, errors, wide_console

KINDS = ("models", "drafters", "gpus", "workloads")


def accepted_name(name: str, aliases: Sequence[str]) -> str:
    """The shortest name a catalog lookup accepts for an entry, without an organisation where it has one (what to
    type after --model or --drafter): ``openai/gpt-oss-120b`` -> ``gpt-oss-120b``."""
    plain = [a for a in aliases if "/" not in a]
    return min(plain, key=len) if plain else name


@click.command("list")
@click.argument("kind", type=click.Choice(KINDS), metavar="models|drafters|gpus|workloads")
@click.option("--model", default=None, help="drafters: only those for this target model.")
@click.option("--all", "include_all", is_flag=True,
              help="drafters: also the HYPOTHETICAL ones (layer variants and paper-only heads, predicted only).")
@click.option("--wide", is_flag=True, help="Full ids and more columns (tables wider than 80 columns).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@errors
def list_command(kind: str, model: str | None, include_all: bool, wide: bool, as_json: bool) -> None:
    """List the catalog's models, drafters or GPUs, or the built-in workloads, by the names --model, --drafter,
    --gpu and --workload take.

    \b
    Example:
      peagle-tune list models
      peagle-tune list drafters --model gpt-oss-120b
      peagle-tune list gpus --json
      peagle-tune list workloads
    """
    if model is not None and kind != "drafters":
        from autotune.errors import UsageError

        raise UsageError(f"--model narrows `list drafters` only; drop it or run `peagle-tune list drafters --model "
                         f"{model}`.")
    rows = {"models": _models, "drafters": lambda: _drafters(model, include_all), "gpus": _gpus,
            "workloads": _workloads}[kind]()
    if as_json:
        click.echo(json.dumps({kind: rows}, indent=2))
        return
    out = wide_console() if wide else console
    out.print(_view(kind, rows, wide=wide))


# ------------------------------------------------------------------------------------------------------ the rows


def _models() -> list[dict[str, Any]]:
    from autotune.catalogs import list_drafters, list_models

    drafters = list_drafters()
    return [
        {
            "name": accepted_name(m.name, m.aliases),
            "id": m.name,
            "aliases": list(m.aliases),
            "total_params_b": m.total_params_b,
            "active_params_b": m.active_params_b,
            "weight_format": m.weight_format,
            "drafters": sum(d.target == m.name for d in drafters),
        }
        for m in list_models()
    ]


def _drafters(model: str | None, include_all: bool) -> list[dict[str, Any]]:
    from autotune.catalogs import drafter_names, list_drafters, resolve_model

    target = resolve_model(model).name if model else None
    names = drafter_names()
    out = []
    for d in list_drafters(include_hypothetical=include_all):
        if target is not None and d.target != target:
            continue
        base, _, variant = d.name.partition(":")  # a layer variant is its head's name + ":N-layer"
        name = accepted_name(base, [n for n, ident in names.items() if ident == base]) + (
            f":{variant}" if variant else "")
        out.append({
            "name": name,
            "id": d.name,
            "target": d.target,
            "kind": "P-EAGLE" if d.parallel_drafting else ("EAGLE-3" if d.method == "eagle3" else d.method),
            "method": d.method,
            "layers": d.num_layers,
            "parallel_drafting": d.parallel_drafting,
            "recommended_k": d.recommended_k,
            "published_acceptance": sorted(d.reference_acceptance),
            "hypothetical": not d.published,
        })
    return out


def _gpus() -> list[dict[str, Any]]:
    from autotune.catalogs import list_gpus

    return [
        {
            "name": g.key,
            "display_name": g.display_name,
            "aliases": list(g.aliases),
            "memory_gb": g.memory_gb,
            "memory_bandwidth_gbps": g.memory_bandwidth_gbps,
            "bf16_tflops": g.bf16_tflops,
            "fp8_tflops": g.fp8_tflops,
        }
        for g in list_gpus()
    ]


def _workloads() -> list[dict[str, Any]]:
    """The benchmark datasets ``hf:<name>`` reads (whether cached; their size is known once they are), then the
    samples shipped with peagle-tune."""
    from autotune.workloads import DATASETS, list_builtin_workloads, load_workload
    from autotune.workloads._datasets import dataset_cached

    out: list[dict[str, Any]] = []
    for d in DATASETS.values():
        cached = dataset_cached(d)
        out.append({"name": f"hf:{d.key}", "classes": {d.workload_class: None}, "requests": None,
                    "source": f"hf:{d.repo_id}", "what": f"{d.title}, {'cached' if cached else 'not cached'}",
                    "cached": cached, "output_tokens": d.output_len, "loader": f"vllm {d.loader}"})
    for name in list_builtin_workloads():
        workload = load_workload(name)
        classes = {c: len(requests) for c, requests in workload.classes.items()}
        out.append({"name": name, "classes": classes, "requests": sum(classes.values()), "source": workload.source,
                    "what": "sample prompts"})
    return out


# ------------------------------------------------------------------------------------------------------ the tables


def _view(kind: str, rows: list[dict[str, Any]], *, wide: bool) -> RenderableType:
    from autotune.cli._tables import fmt, model_alias, plain_table, titled

    if not rows:
        return Text(f"No {kind} match.")
    if kind == "models":
        cols = ["model", "id", "params", "active", "drafters", *(["weights"] if wide else [])]
        table = plain_table(*cols, right={"params", "active", "drafters"})
        for r in rows:
            table.add_row(r["name"], r["id"], fmt(r["total_params_b"], ".1f", "B"),
                          fmt(r["active_params_b"], ".1f", "B"), str(r["drafters"]),
                          *([r["weight_format"]] if wide else []))
        return titled(f"Models ({len(rows)}); --model takes the name, the id or a local directory:", table,
                      "params: total parameters; active: per token (MoE); drafters: released heads in the catalog.")
    if kind == "drafters":
        cols = ["drafter", "target", "kind", "L", "PD", "K", "acc.", *(["published acceptance", "id"] if wide else [])]
        table = plain_table(*cols, right={"L", "K"})
        for r in rows:
            k = "-" if r["recommended_k"] is None else str(r["recommended_k"])
            table.add_row(
                r["name"] + ("*" if r["hypothetical"] else ""), model_alias(r["target"]), r["kind"], str(r["layers"]),
                "yes" if r["parallel_drafting"] else "no", k, "yes" if r["published_acceptance"] else "no",
                *([", ".join(r["published_acceptance"]) or "-", r["id"]] if wide else []),
            )
        notes = ["L: layers; PD: parallel drafting; K: the publisher's K; acc.: published acceptance, which the model "
                 "backend predicts from (without it, profile the drafter on a GPU)."]
        if any(r["hypothetical"] for r in rows):
            notes.append("* HYPOTHETICAL: no released checkpoint (predicted only, never served).")
        return titled(f"Drafters ({len(rows)}); --drafter takes the name, the id or a local directory:", table, *notes)
    if kind == "gpus":
        cols = ["gpu", "name", "memory", "bandwidth", "BF16", "FP8"]
        table = plain_table(*cols, right={"memory", "bandwidth", "BF16", "FP8"})
        for r in rows:
            table.add_row(r["name"], r["display_name"], fmt(r["memory_gb"], ".0f", " GB"),
                          fmt(r["memory_bandwidth_gbps"], ".0f", " GB/s"), fmt(r["bf16_tflops"], ".0f"),
                          fmt(r["fp8_tflops"], ".0f"))
        return titled(f"GPUs ({len(rows)}); --gpu takes the key, the name or what nvidia-smi prints:", table,
                      "BF16, FP8: dense tensor-core TFLOPS (datasheet).")
    cols = ["workload", "classes", "requests", "what"]
    table = plain_table(*cols, right={"requests"})
    for r in rows:
        table.add_row(r["name"], ", ".join(f"{c} {n}" if n else c for c, n in r["classes"].items()),
                      "-" if r["requests"] is None else str(r["requests"]), r["what"])
    return titled(f"Workloads ({len(rows)}); --workload also takes a .jsonl / ShareGPT .json file:", table,
                  "hf:NAME: the dataset vllm bench serve reads, from the Hugging Face cache (hf:NAME,prompts=N,"
                  "output-len=M for fewer); sample-*: 12 prompts a class written for peagle-tune.")
