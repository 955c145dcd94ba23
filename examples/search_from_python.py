"""Search from the library API with the model backend, then read the recommendations back from the store.

No GPU, no vLLM and no download are needed: the model backend predicts each config from the GPU's roofline and the
drafters' published acceptance, and every figure below is labelled PREDICTED. Run from the repository root::

    .venv/bin/python examples/search_from_python.py --db /tmp/peagle-example.db

A later run with the same database reports the stored search instead of searching again (delete the file to redo
it). `peagle-tune show --db /tmp/peagle-example.db` and `peagle-tune export --db ...` read the same rows.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from autotune.search import SearchOptions, run_search
from store import Store

#: The example workload beside this script: a team assistant's chat, code and math requests.
TEAM_WORKLOAD = Path(__file__).resolve().parent / "workloads" / "team-assistant.jsonl"


def _wrap(text: str, first: str) -> str:
    return textwrap.fill(text, 80, initial_indent=first, subsequent_indent="    ", break_long_words=False,
                         break_on_hyphens=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="database URL or SQLite file (created if missing)")
    parser.add_argument("--model", default="gpt-oss-120b", help="catalog name (default: %(default)s)")
    parser.add_argument("--gpu", default="h200", help="catalog GPU the prediction is for (default: %(default)s)")
    parser.add_argument("--workload", default=str(TEAM_WORKLOAD),
                        help="built-in name or JSONL/ShareGPT file (default: examples/workloads/team-assistant.jsonl)")
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable (default: 1 and 64)")
    parser.add_argument("--trials", type=int, default=30, help="Optuna trials per concurrency (default: %(default)s)")
    args = parser.parse_args(argv)

    options = SearchOptions(model=args.model, gpu=args.gpu, backend="model", trials=args.trials,
                            workload=args.workload,
                            concurrencies=args.concurrency or [1, 64])
    store = Store(args.db, for_writing=True)
    try:
        run = run_search(store, options)
        print(_wrap(f"Searched {run.model} for {run.device}, workload {run.workload}, objective "
                    f"{run.objective.name}, {run.backend} backend: every figure is PREDICTED.", ""))
        for note in run.notes:
            print(_wrap(note, "  note: "))
        # What the search stored, read back as any later process would: one recommendation per concurrency.
        for rec in reversed(store.list_recommendations(model=run.model, limit=len(options.concurrencies))):
            config, metrics = rec.best_config, rec.metrics
            print(f"#{rec.id} concurrency {rec.scenario['concurrency']}: K={config['num_speculative_tokens']}, "
                  f"max_num_seqs {config['max_num_seqs']}, drafter")
            print(f"    {config['drafter']}")
            print(f"    {metrics['output_tokens_per_s']:.0f} output tok/s, {metrics['speedup_vs_no_spec']:.2f}x no "
                  f"speculation, AL {metrics['acceptance_length']:.2f} ({rec.provenance['kind']}, "
                  f"{rec.provenance['backend']} backend)")
            caps = ", ".join(f"{name} {policy['max_k']}" for name, policy in sorted(rec.class_policy.items()))
            print(f"    depth cap per class: {caps}")
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
