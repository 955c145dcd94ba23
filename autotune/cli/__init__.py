"""The `peagle-tune` command line: a thin layer over the library; each command lives in its own module.

Library errors become click errors only in `autotune.cli._common.errors`.
"""

from __future__ import annotations

import click

from autotune import __version__
from autotune.cli.db import db
from autotune.cli.export import export
from autotune.cli.profile import profile
from autotune.cli.report import report
from autotune.cli.search import search
from autotune.cli.serve import serve
from autotune.cli.show import show


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="peagle-tune")
def main() -> None:
    """Tune and serve speculative decoding (P-EAGLE / EAGLE-3) for vLLM.

    Example:

        peagle-tune search --model gpt-oss-120b --gpu h200

        peagle-tune export --format vllm-json
    """


for _command in (search, show, export, db, report, profile, serve):
    main.add_command(_command)

__all__ = ["main"]
