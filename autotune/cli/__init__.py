"""The `peagle-tune` command line: a thin layer over the library; each command lives in its own module.

Errors become one click error line only in `autotune.cli._common.errors` (every command is wrapped, and the group
wraps them again for safety); ``peagle-tune --debug`` shows tracebacks instead.
"""

from __future__ import annotations

import click

from autotune import __version__
from autotune.cli._common import catalog_option, errors, quiet_broken_pipe
from autotune.cli.catalog import list_command
from autotune.cli.db import db
from autotune.cli.doctor import doctor
from autotune.cli.export import export
from autotune.cli.profile import profile
from autotune.cli.report import report
from autotune.cli.search import search
from autotune.cli.serve import serve
from autotune.cli.show import show
from autotune.cli.simulate import simulate


class _Group(click.Group):
    """The command group: a failure in any command is one line (a traceback only with --debug)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return errors(super().invoke)(ctx)
        except BrokenPipeError:  # the reader stopped reading (`peagle-tune show | head`): done, quietly
            quiet_broken_pipe()
            raise click.exceptions.Exit(0) from None


#: Help text wraps at the terminal's width (click's default stops at 80 columns even in a wider terminal); click
#: takes min(terminal columns, this) - 2, so this is only a bound for absurd widths.
HELP_WIDTH = 400


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": HELP_WIDTH})
@click.version_option(__version__, prog_name="peagle-tune")
@click.option("--debug", is_flag=True, help="Show the traceback of an error instead of one line (or PEAGLE_DEBUG=1).")
@click.option("--db", "db_url", default=None, metavar="URL",
              help="Database URL or SQLite file for every command (a command's own --db wins; env PEAGLE_DB).")
@catalog_option
def main(debug: bool, db_url: str | None) -> None:
    """Tune and serve speculative decoding (P-EAGLE / EAGLE-3) for vLLM.

    Searches the drafter, draft depth K, parallel drafting and max_num_seqs per concurrency (predicted from a GPU
    roofline and published acceptance where no GPU is at hand, measured with vLLM where it can load the model),
    stores the recommendations and exports them in the forms vLLM takes.

    \b
    Example:
      peagle-tune list drafters --model gpt-oss-120b
      peagle-tune search --model gpt-oss-120b --gpu h200
      peagle-tune show
      peagle-tune export --concurrency 8 --format vllm-json
      peagle-tune serve --model gpt-oss-120b --gpu h200 --dry-run
      peagle-tune --db ./tuning.db show --studies

    Exit codes: 0 done, 1 failed, 2 usage error, 3 not found (nothing stored matches the id, study or model).
    """


for _command in (search, show, export, db, report, profile, serve, simulate, doctor, list_command):
    main.add_command(_command)

__all__ = ["main"]
