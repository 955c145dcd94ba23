"""The `peagle-tune` command line: a thin layer over the library; each command lives in its own module.

A command's module is imported only when that command runs (or shows its help): `peagle-tune --help` lists the
commands from `COMMANDS` without importing any, and `peagle-tune list` does not load the search's database, Optuna
or scipy.

Errors become one click error line only in `autotune.cli._common.errors` (every command is wrapped, and the group
wraps them again for safety); ``peagle-tune --debug`` shows tracebacks instead.
"""

from __future__ import annotations

import importlib

import click

from autotune import __version__
from autotune.cli._common import catalog_option, errors, quiet_broken_pipe

#: Each command: the module and attribute that define it, and the first paragraph of its help, which
#: `peagle-tune --help` shortens to one line as click would (tests/test_cli_startup.py holds each to the command's
#: own help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "search": ("autotune.cli.search", "search",
               "Search drafter, K, parallel drafting, max_num_seqs and max_num_batched_tokens for a model and store "
               "the best config per concurrency."),
    "show": ("autotune.cli.show", "show", "Show stored recommendations, studies, trials and profiles."),
    "export": ("autotune.cli.export", "export", "Export a recommendation in a form vLLM takes."),
    "bench": ("autotune.cli.bench", "bench",
              "Measure a recommendation served as it will be, with vLLM's own `vllm bench serve`."),
    "db": ("autotune.cli.db", "db", "Database maintenance."),
    "report": ("autotune.cli.report", "report",
               "Write PNG plots and an HTML page explaining the stored tuning results."),
    "profile": ("autotune.cli.profile", "profile",
                "Measure acceptance per workload class and draft position, and the engine step time T(B, K)."),
    "serve": ("autotune.cli.serve", "serve",
              "Serve a model with vLLM, its tuned speculative config and the adaptive depth controller."),
    "simulate": ("autotune.cli.simulate", "simulate",
                 "PREDICT serving with no speculation, static K, vLLM's batch-size schedule, the adaptive controller "
                 "and the per-phase oracle, by simulating continuous batching step by step."),
    "doctor": ("autotune.cli.doctor", "doctor",
               "Check that this machine is ready: vLLM and its model runner, GPUs, Hugging Face cache and hub, the "
               "database, the scheduler plugin and worker extension; with --launch, one real request through both."),
    "list": ("autotune.cli.catalog", "list_command",
             "List the catalog's models, drafters or GPUs, or the built-in workloads, by the names --model, "
             "--drafter, --gpu and --workload take."),
}


class _Group(click.Group):
    """The command group: commands load on first use; a failure in any command is one line (a traceback only with
    --debug)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, from `COMMANDS` (click's layout, without importing every command)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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


__all__ = ["main"]
