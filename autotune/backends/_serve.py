"""Kept so that ``python -m autotune.backends._serve serve ...`` command lines printed by earlier versions
(``peagle-tune serve --dry-run``) still run. The ``vllm`` CLI shim lives in `autotune.engine`:
``python -m autotune.engine serve``."""

from __future__ import annotations

import sys

from autotune.engine import run_vllm_cli

if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    run_vllm_cli(sys.argv[1:])
