"""The bounds of every number and name the command line takes, in one table, checked while click parses.

Each numeric option has one `Bound` in `BOUNDS` (the same entry for every command that takes the option) with its
range and why the range is what it is. `number(option)` is the click type of a single value and `numbers(option)`
of a comma-separated list (``1,8,64``: de-duplicated in order, at most `Bound.max_values` values). A value out of
range is refused while the arguments are parsed, before any file is read, any store opened or any engine launched,
with one line: ``--seed takes an integer from 0 to 4,294,967,295, but got -1. vLLM and numpy take 32-bit seeds.``
(exit 2).

Names (`name_callback`) are checked the same way: valid Unicode (no lone surrogate), printable (no control
character or line break) and at most `NAME_BOUNDS` characters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from autotune.cli._common import UsageFailure
from autotune.names import name_problem
from autotune.spec import MAX_CONCURRENCY, MAX_K, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, MAX_TENSOR_PARALLEL
from autotune.workloads import MAX_TOKENS_LIMIT
from store import MAX_NAME_CHARS

#: Most requests of one measured or simulated phase: four times the largest concurrency, what simulate's default
#: (max(48, 4 x c)) gives there. Requests are built before a phase runs (``profile --num-prompts 100000000000``
#: took 9.2 GB before it was refused; ``simulate --requests-per-phase 100000000``, 2 GB).
MAX_REQUESTS_PER_PHASE = 4 * MAX_CONCURRENCY
#: Most values a comma-separated option takes after de-duplication (each is a search, a phase or a choice).
MAX_VALUES = 64
#: Largest database id: ids are SQL ``integer`` columns, 32-bit on PostgreSQL (SQLite's are 64-bit).
MAX_ID = 2**31 - 1


@dataclass(frozen=True)
class Bound:
    """The range of one numeric option and the reason for it (shown when a value is refused)."""

    low: float
    high: float
    why: str
    """One sentence: why the range is what it is."""
    integer: bool = True
    low_open: bool = False
    """For numbers: the range excludes `low` (``(0, 86400]``)."""
    unit: str = ""
    """What the number counts, for the message ("seconds")."""
    max_values: int = MAX_VALUES
    """As a comma-separated list: most distinct values."""

    def describe(self, many: bool = False) -> str:
        if self.integer:
            return f"{'integers' if many else 'an integer'} from {self.low:,.0f} to {self.high:,.0f}"
        what = f"a number of {self.unit}" if self.unit else "a number"
        return f"{what} in {'(' if self.low_open else '['}{_shown(self.low)}, {_shown(self.high)}]"

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # click's FLOAT takes nan and inf
            return False
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high


def _shown(x: float) -> str:
    """3600000 -> "3600000", 0.1 -> "0.1" (not 3.6e+06)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


_K = Bound(1, MAX_K, f"Draft depths run from 1 to {MAX_K}, the deepest K of any config, profile or policy.")
_DAY_S = 24 * 3600.0

#: Every numeric option of every command: option -> its bound.
BOUNDS: dict[str, Bound] = {
    "--seed": Bound(0, 2**32 - 1, "vLLM and numpy take 32-bit seeds."),
    "--recommendation": Bound(1, MAX_ID, "Ids are positive 32-bit database integers (`peagle-tune show` lists them)."),
    "--profile": Bound(1, MAX_ID, "Ids are positive 32-bit database integers (`peagle-tune show --profiles`)."),
    "--concurrency": Bound(
        1, MAX_CONCURRENCY, f"No engine runs more than {MAX_NUM_SEQS:,} requests at once.",
        max_values=31,  # profile measures a phase per concurrency; the plugin keeps 32 phases apart, one is warm-up
    ),
    "--max-num-seqs": Bound(1, MAX_NUM_SEQS, "vLLM sizes per-sequence buffers by it at start-up."),
    "--max-num-batched-tokens": Bound(
        1, MAX_NUM_BATCHED_TOKENS, "2^24 is 1.6x the longest context window of any released model."
    ),
    "--tensor-parallel-size": Bound(1, MAX_TENSOR_PARALLEL, "64 GPUs: the largest single node sold today."),
    "--max-k": _K,
    "--k-min": _K,
    "--static-k": _K,
    "--num-prompts": Bound(
        1, MAX_REQUESTS_PER_PHASE, "Requests are built before a phase runs: at most 4 x the largest concurrency."
    ),
    "--requests-per-phase": Bound(
        1, MAX_REQUESTS_PER_PHASE, "Requests are built before a phase runs: at most 4 x the largest concurrency."
    ),
    "--output-tokens": Bound(1, MAX_TOKENS_LIMIT, "10M tokens is the longest context window of any released model."),
    "--max-model-len": Bound(1, MAX_TOKENS_LIMIT, "10M tokens is the longest context window of any released model."),
    "--trials": Bound(1, 100_000, "Each trial is stored, and the samplers slow down with every trial they keep."),
    "--heartbeat": Bound(1, _DAY_S, "A worker silent for twice this has its trial re-queued; a day is the most.",
                         unit="seconds"),
    "--port": Bound(1, 65535, "TCP ports run from 1 to 65535."),
    "--timeout": Bound(0, _DAY_S, "A launch that takes more than a day is stuck.", integer=False, low_open=True,
                       unit="seconds"),
    "--record-every": Bound(0, 7 * _DAY_S, "A profile stored less often than weekly is stored only at shutdown anyway.",
                            integer=False,
                            low_open=True, unit="seconds"),
    "--slo-tpot-p99": Bound(0, 3_600_000, "An SLO is a positive time of at most an hour.", integer=False,
                            low_open=True, unit="milliseconds"),
    "--slo-ttft-p99": Bound(0, 3_600_000, "An SLO is a positive time of at most an hour.", integer=False,
                            low_open=True, unit="milliseconds"),
    "--rate": Bound(0, 1_000_000, "A million requests per second is beyond any one server.", integer=False,
                    low_open=True, unit="requests/s"),
    "--chars-per-token": Bound(0.1, 100, "Tokenizers give 0.1 to 100 characters per token; more or less would "
                               "make prompts of absurd length.", integer=False),
    "--drift-threshold": Bound(0, 10, "It is a relative change like 0.15 (15%).", integer=False, low_open=True),
}


def _refuse(option: str, bound: Bound, shown: str, many: bool = False) -> UsageFailure:
    return UsageFailure(f"{option} takes {bound.describe(many)}, but got {shown}. {bound.why}")


def _parse(option: str, bound: Bound, text: str, many: bool = False) -> float:
    """One value of `option` from `text`; UsageFailure when it is no number or out of range."""
    shown = f"{text!r:.60}" if many else f"{text:.60}"
    try:
        value: float = int(text) if bound.integer else float(text)
    except ValueError:  # also a number of more than 4,300 digits
        raise _refuse(option, bound, shown, many) from None
    if not bound.holds(value):
        raise _refuse(option, bound, shown, many)
    return value


def check(option: str, value: float) -> float:
    """`value` when it is within `BOUNDS[option]`, else UsageFailure (for values that do not come from click)."""
    bound = BOUNDS[option]
    if not bound.holds(value):
        raise _refuse(option, bound, f"{value}")
    return value


class Number(click.ParamType):
    """A single number within `BOUNDS[option]`."""

    def __init__(self, option: str) -> None:
        self.option = option
        self.bound = BOUNDS[option]
        self.name = "integer" if self.bound.integer else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return check(self.option, value)  # a default
        number = _parse(self.option, self.bound, str(value).strip())
        return int(number) if self.bound.integer else float(number)


class Numbers(click.ParamType):
    """Comma-separated integers within `BOUNDS[option]` (``1,8,64``), de-duplicated in order."""

    name = "list"

    def __init__(self, option: str) -> None:
        self.option = option
        self.bound = BOUNDS[option]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        text = str(value)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise UsageFailure(f"{self.option} takes comma-separated integers like 1,8,64, but got {text!r:.60}.")
        out: dict[int, None] = {}
        for part in parts:
            try:
                number = int(part)
            except ValueError:
                raise UsageFailure(
                    f"{self.option} takes comma-separated integers like 1,8,64, but got {text!r:.60}."
                ) from None
            if not self.bound.holds(number):
                raise _refuse(self.option, self.bound, f"{text!r:.60}", many=True)
            out[number] = None
        if len(out) > self.bound.max_values:
            raise UsageFailure(
                f"{self.option} takes at most {self.bound.max_values} different values, but got {len(out):,}; "
                "run the rest separately."
            )
        return list(out)


def number(option: str) -> Number:
    """The click type of `option`'s single value (its bound is `BOUNDS[option]`)."""
    return Number(option)


def numbers(option: str) -> Numbers:
    """The click type of `option`'s comma-separated values (its bound is `BOUNDS[option]`)."""
    return Numbers(option)


def dtype_callback(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """--dtype, refused before any launch unless vLLM takes it (vLLM's own refusal is a traceback in its log)."""
    from autotune.engine import DTYPES

    if value not in DTYPES:
        raise UsageFailure(f"--dtype takes one of {', '.join(DTYPES)} (what vLLM takes), but got {value!r:.60}.")
    return value


# ------------------------------------------------------------------------------------------------------- names
#: Names the command line takes: option -> most characters (--study is checked by the search, which appends to it).
#: Options naming a checkpoint, which reach vLLM's command line.
CHECKPOINT_OPTIONS = ("--model", "--drafter")
NAME_BOUNDS: dict[str, int] = {
    "--model": MAX_NAME_CHARS,  # the database's name columns
    "--drafter": MAX_NAME_CHARS,
    "--workload": MAX_NAME_CHARS,
    "--gpu": MAX_NAME_CHARS,  # a GPU name is resolved to a catalog entry; what is stored is the catalog's name
}


def checked_name(option: str, value: str) -> str:
    """`value` when `name_problem` finds nothing, else a one-line UsageFailure naming `option`."""
    problem = name_problem(value, NAME_BOUNDS[option])
    if problem is not None:
        raise UsageFailure(f"{option} {value!r:.60} {problem}; give a printable name.")
    if option in CHECKPOINT_OPTIONS and value.startswith("-"):
        # `--model=--scheduler-cls=x.Y` would reach vLLM's command line as an option of its own.
        raise UsageFailure(f"{option} {value!r:.60} starts with '-', which vLLM would read as an option; give a "
                           f"name, a repo id or a path (./{value[:40]} for a directory named so).")
    return value


def name_callback(option: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback checking `option`'s value (or each value of a repeated option, de-duplicated in order)."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, tuple):
            return tuple(dict.fromkeys(checked_name(option, v) for v in value))
        return checked_name(option, value)

    return callback
