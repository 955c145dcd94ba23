"""Validation at the door: every number and name the command line takes, and the files it reads, are checked before
any work, and a bad one is one line (exit 2) saying what is wrong and what is taken.

Probes from issue 35 ("Unexpected ..., this is a bug" instead of one line; absurd sizes spending memory before they
were refused; a workload search accepted and export then refused). The rows of docs/reliability.md ("Inputs: bounds
and validation") point here.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.cli._bounds import BOUNDS, MAX_REQUESTS_PER_PHASE, Number, Numbers, number, numbers
from autotune.cli._common import UsageFailure
from autotune.engine import DTYPES, EngineOptions
from autotune.errors import ConfigError, WorkloadError
from autotune.spec import MAX_CONCURRENCY
from autotune.workloads import MAX_WORKLOAD_CLASSES, load_workload
from policies import BUILTIN_CLASSES, MAX_CLASSES, YAMLDocumentError, load_yaml_text
from store import Store

SIMULATE = ["simulate", "--model", "gpt-oss-120b", "--no-store"]
PROFILE = ["profile", "--model", "my-org/target", "--drafter", "my-org/drafter", "--workload", "mt-bench"]
SEARCH = ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--trials", "2"]


class WorkStarted(Exception):
    """Raised by the stand-ins of the first step of real work: reaching one means the bound came too late."""


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Loading a workload, planning a search, profiling or simulating fails loudly; the database is a fresh file."""

    def started(*_args: Any, **_kwargs: Any) -> Any:
        raise WorkStarted

    for target in ("autotune.workloads.load_workload", "autotune.search.plan_search",
                   "autotune.profiling.profile", "autotune.simulate.predict"):
        monkeypatch.setattr(target, started)
    monkeypatch.setenv("PEAGLE_DB", str(tmp_path / "peagle.db"))


@pytest.fixture
def db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh database file (for the probes that stop in the real workload, space or model readers)."""
    path = tmp_path / "peagle.db"
    monkeypatch.setenv("PEAGLE_DB", str(path))
    return path


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _error(result: Result) -> str:
    """The one error line of a refused command, after checking it exited 2 (usage) without a Python error."""
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, WorkStarted)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0].removeprefix("Error: ")


# ------------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
@pytest.mark.parametrize("command", [SEARCH, SIMULATE])
def test_a_seed_outside_32_bits_is_refused(no_work: None, command: list[str], seed: str) -> None:
    # before: search ended in "Unexpected ValueError: Seed must be between 0 and 2**32 - 1 ... a bug"; simulate
    # took 4294967296 silently
    assert _error(_run(*command, "--seed", seed)) == (
        f"--seed takes an integer from 0 to 4,294,967,295, but got {seed}. vLLM and numpy take 32-bit seeds."
    )


def test_the_seed_bound_holds_exactly_at_its_ends() -> None:
    seed = number("--seed")
    assert seed.convert("0", None, None) == 0 and seed.convert("4294967295", None, None) == 2**32 - 1
    with pytest.raises(UsageFailure):
        seed.convert("4294967296", None, None)


@pytest.mark.parametrize(
    "command",
    [["export"], ["show"], ["serve", "--model", "gpt-oss-120b", "--dry-run"]],
)
def test_a_huge_recommendation_id_is_refused(no_work: None, command: list[str]) -> None:
    # before: "Unexpected OverflowError: Python int too large to convert to SQLite INTEGER ... a bug"
    huge = "9" * 30
    assert _error(_run(*command, "--recommendation", huge)) == (
        f"--recommendation takes an integer from 1 to 2,147,483,647, but got {huge}. Ids are positive 32-bit "
        "database integers (`peagle-tune show` lists them)."
    )


def test_simulate_max_num_seqs_zero_is_refused(no_work: None) -> None:
    # before: "Unexpected ValueError: a step has at least one request (decoding or prefilling).. ... a bug"
    assert _error(_run(*SIMULATE, "--max-num-seqs", "0")) == (
        "--max-num-seqs takes an integer from 1 to 65,536, but got 0. vLLM sizes per-sequence buffers by it at "
        "start-up."
    )


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (PROFILE, "--num-prompts", "100000000000"),  # before: 9.2 GB before it was refused
        (PROFILE, "--num-prompts", "1e11"),
        (SIMULATE, "--requests-per-phase", "100000000"),  # before: 2 GB
    ],
)
def test_absurd_request_counts_are_refused_before_any_request_is_built(
    no_work: None, command: list[str], option: str, value: str
) -> None:
    assert MAX_REQUESTS_PER_PHASE == 4 * MAX_CONCURRENCY  # what simulate's default, max(48, 4 x c), gives at most
    assert _error(_run(*command, option, value)) == (
        f"{option} takes an integer from 1 to 262,144, but got {value}. Requests are built before a phase runs: at "
        "most 4 x the largest concurrency."
    )


@pytest.mark.parametrize("command", [SIMULATE, PROFILE, ["search", "--model", "gpt-oss-120b"]])
def test_every_command_caps_concurrency_at_65536(no_work: None, command: list[str]) -> None:
    # before: simulate took --concurrency 100000 (search and profile had the cap)
    assert _error(_run(*command, "--concurrency", "100000")) == (
        "--concurrency takes integers from 1 to 65,536, but got '100000'. No engine runs more than 65,536 requests "
        "at once."
    )


def test_repeated_values_are_merged_in_order(no_work: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # before: 20,001 copies of --concurrency 8 were 20,001 scenarios
    seen: list[list[int]] = []

    def plan(_store: Any, options: Any) -> Any:
        seen.append(options.concurrencies)
        raise WorkStarted

    monkeypatch.setattr("autotune.search.plan_search", plan)
    result = _run("search", "--model", "gpt-oss-120b", "--concurrency", ",".join(["8"] * 20_001 + ["1", "8"]))
    assert result.exit_code == 1 and seen == [[8, 1]]  # reached the search with one 8 and the 1, in order
    assert numbers("--max-num-seqs").convert("64,8,64,8", None, None) == [64, 8]


def test_too_many_different_values_are_refused(no_work: None) -> None:
    # profile runs one phase per concurrency and the plugin keeps 32 phases apart, one being the warm-up
    values = ",".join(str(c) for c in range(1, 33))
    assert _error(_run(*SIMULATE, "--concurrency", values)) == (
        "--concurrency takes at most 31 different values, but got 32; run the rest separately."
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--timeout", "inf"], "--timeout takes a number of seconds in (0, 86400], but got inf. A launch that takes "
                               "more than a day is stuck."),
        (["--timeout", "nan"], "--timeout takes a number of seconds in (0, 86400], but got nan. A launch that takes "
                               "more than a day is stuck."),
        (["--max-k", "0"], "--max-k takes an integer from 1 to 16, but got 0. Draft depths run from 1 to 16, the "
                           "deepest K of any config, profile or policy."),
    ],
)
def test_profile_floats_and_depths_are_bounded(no_work: None, args: list[str], expected: str) -> None:
    assert _error(_run(*PROFILE, *args)) == expected


def test_every_numeric_option_has_one_bound() -> None:
    """Every INT/FLOAT option of every command goes through the table (click's own int/float types take any size,
    nan and inf)."""
    import click
    from ux_cli import command_tree

    unbounded = []
    for path, command in command_tree(main):
        name = " ".join(("peagle-tune", *path))
        for param in command.params:
            if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
                unbounded.append(f"{name} {param.opts[0]}")
            if isinstance(param.type, Number | Numbers):
                assert param.type.option == param.opts[0] and param.opts[0] in BOUNDS
    assert unbounded == []


# ----------------------------------------------------------------------------------- vLLM's config validation


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-model-len", "0"], "--max-model-len takes an integer from 1 to 10,000,000, but got 0. 10M tokens is "
                                   "the longest context window of any released model."),
        (["--dtype", "bogus"], "--dtype takes one of auto, half, float16, bfloat16, float, float32 (what vLLM "
                               "takes), but got 'bogus'."),
    ],
)
def test_what_vllm_would_refuse_is_refused_before_a_launch(no_work: None, args: list[str], expected: str) -> None:
    # before: vLLM's own traceback (pydantic ValidationError) after the engine process started
    assert _error(_run(*PROFILE, *args)) == expected


def test_engine_options_refuse_what_vllm_refuses() -> None:
    with pytest.raises(ConfigError, match="dtype must be one of auto, half"):
        EngineOptions(dtype="bogus")
    with pytest.raises(ConfigError, match="max_model_len must be >= 1"):
        EngineOptions(max_model_len=0)


def test_the_dtypes_are_vllms() -> None:
    """`DTYPES` is vLLM's ModelDType literal, read from its source (importing vLLM takes half a minute)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = (Path(next(iter(spec.submodule_search_locations))) / "config" / "model.py").read_text()
    literal = re.search(r"^ModelDType = Literal\[([^\]]*)\]", source, re.MULTILINE)
    assert literal is not None
    assert tuple(re.findall(r'"([^"]+)"', literal[1])) == DTYPES


# ------------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("m\x1b[2J", "holds the control character '\\x1b' at character 1"),
        ("c\ud800", "holds a lone surrogate '\\ud800' at character 1 (it is not valid Unicode)"),
        ("m" * 301, "is 301 characters long (at most 300)"),
    ],
)
def test_a_model_name_is_printable_unicode_of_bounded_length(no_work: None, name: str, problem: str) -> None:
    assert _error(_run(*SIMULATE, "--model", name)) == f"--model {name!r:.60} {problem}; give a printable name."


# ------------------------------------------------------------------------------------------------- files


def test_a_yaml_integer_over_4300_digits_is_one_located_line(db: Path, tmp_path: Path) -> None:
    # before: "Unexpected ValueError: Exceeds the limit (4300 digits) for integer string conversion ... a bug"
    space = tmp_path / "space.yaml"
    space.write_text("k_max: " + "9" * 5000 + "\n", encoding="utf-8")
    assert _error(_run("search", "--model", "gpt-oss-120b", "--space", str(space))) == (
        f"{space}: not valid YAML: line 1, column 8: an integer of 5,000 characters is beyond the 4,300 decimal "
        "digits Python reads; write a smaller number."
    )


def test_a_yaml_integer_python_could_not_print_is_refused_too() -> None:
    with pytest.raises(YAMLDocumentError, match="line 1, column 4: an integer of 4,002 characters"):
        load_yaml_text("a: 0x" + "f" * 4000)  # reads as 4,817 decimal digits: its first str() would fail
    assert load_yaml_text("a: " + "9" * 4300) == {"a": int("9" * 4300)}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 100_000 + "]" * 100_000,
         "Nesting too deep (100,000 levels; Python's JSON reader stops near 1,000): line 1 column 100000 (char 99999)"),
        ('{"hidden_size": ' + "9" * 5000 + "}",
         "A number has 5,000 digits (at most 4,300 can be read): line 1 column 17 (char 16)"),
    ],
    ids=["deep", "digits"],
)
@pytest.mark.parametrize("command", [["search"], ["simulate", "--no-store"]])
def test_a_hostile_config_json_is_one_line_naming_the_file(
    db: Path, tmp_path: Path, command: list[str], text: str, reason: str
) -> None:
    # before: "Unexpected RecursionError" / "Unexpected ValueError ... a bug"
    (tmp_path / "model").mkdir()
    config = tmp_path / "model" / "config.json"
    config.write_text(text, encoding="utf-8")
    assert _error(_run(*command, "--model", str(tmp_path / "model"))) == (
        f"{config}: the config.json is not valid JSON ({reason}); expected a Hugging Face config.json."
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_byte_order_mark_at_the_start_of_a_workload_is_skipped(tmp_path: Path, suffix: str) -> None:
    # before: "<file>:1: invalid JSON (Expecting value at column 1)", the BOM not named
    if suffix == ".jsonl":
        text = '{"prompt": "hi", "class": "chat"}\n{"prompt": "two", "class": "code"}\n'
    else:
        text = json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}])
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"marked{suffix}"
    plain.write_text(text, encoding="utf-8")
    marked.write_text(text, encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    assert load_workload(marked).content_hash() == load_workload(plain).content_hash()


def _classes_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "class": f"c{i}"}) + "\n" for i in range(n)),
                    encoding="utf-8")
    return path


def test_search_refuses_a_workload_export_and_serve_could_not_serve(db: Path, tmp_path: Path) -> None:
    # before: a 1,000-class workload was searched and stored, then export --format policy and serve refused it
    workload = _classes_file(tmp_path / "k1000.jsonl", 1000)
    assert _error(_run("search", "--model", "gpt-oss-120b", "--workload", str(workload), "--concurrency", "1")) == (
        f"{workload}: the workload has 1,000 classes, but a served policy knows at most 64 (the built-in code, math, "
        "chat among them: 1,003 here); merge classes into at most 61 besides those."
    )
    if db.exists():  # nothing was stored
        with Store(str(db)) as store:
            assert store.list_recommendations() == []


def test_the_class_bound_is_the_policys(tmp_path: Path) -> None:
    """61 classes besides the 3 built-in ones load (a policy of them knows 64); 62 do not."""
    from autotune.export import policy_document

    assert MAX_WORKLOAD_CLASSES == MAX_CLASSES - len(BUILTIN_CLASSES) == 61
    fits = load_workload(_classes_file(tmp_path / "fits.jsonl", MAX_WORKLOAD_CLASSES))
    rec = {"best_config": {"method": "eagle3", "drafter": "d", "num_speculative_tokens": 3}, "model": "m",
           "class_policy": {c: {"max_k": 2} for c in fits.class_names}}
    assert len(policy_document(rec)["classes"]) == MAX_WORKLOAD_CLASSES  # export --format policy takes it
    with pytest.raises(WorkloadError, match="the workload has 62 classes"):
        load_workload(_classes_file(tmp_path / "over.jsonl", MAX_WORKLOAD_CLASSES + 1))


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        ("c\\ud800", "holds a lone surrogate '\\ud800' at character 1 (it is not valid Unicode)"),
        ("a\\u001b[2J", "holds the control character '\\x1b' at character 1"),
        ("x" * 65, "is 65 characters long (at most 64)"),
    ],
)
def test_a_class_label_is_what_the_plugin_counts_under(tmp_path: Path, label: str, problem: str) -> None:
    # before: "c\ud800" was searched and stored, then every `show --simulation` and `report` of the database failed
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": "hi", "class": "' + label + '"}\n', encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    shown = json.dumps(json.loads(f'"{label}"'))[:60]
    assert str(info.value).startswith(f'{path}:2: "class" {shown} {problem}; expected one JSON object per line')


@pytest.mark.parametrize("args", [
    ["serve", "--model=--scheduler-cls=evil.Sched", "--dry-run"],
    ["serve", "--model", "gpt-oss-120b", "--drafter=--scheduler-cls=evil.Sched", "--dry-run"],
    ["search", "--model=--scheduler-cls=evil.Sched"],
    ["search", "--model", "gpt-oss-120b", "--drafter=--worker-cls=evil.W"],
    ["profile", "--model=--scheduler-cls=evil.Sched"],
    ["simulate", "--model=--scheduler-cls=evil.Sched"],
], ids=lambda a: " ".join(a[:2]))
def test_a_checkpoint_name_that_reads_as_an_option_is_refused(args: list[str]) -> None:
    # Issue 44.6: `serve --model=--scheduler-cls=evil.Sched --dry-run` put that option into vLLM's command line.
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "starts with '-', which vLLM would read as an option" in result.output
