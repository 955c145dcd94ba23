"""Every CLI failure is one line naming the problem and the fix, with a non-zero exit; `--debug` shows tracebacks.

Probes from issue 12: `--storage` as a plain path, ``::::`` or a server that is down; a locked or damaged database
under a search (127 lines of Optuna traceback blaming "invalid data"); `export --out` into a missing folder, through
a dangling symbolic link, and non-atomic `--force`; `db path` printing the password; absurd values
(`--max-num-seqs 99999999999999999999`, `--concurrency 100000`, `--record-every nan`); `serve -- --speculative_config`
and other spellings vLLM reads as options `serve` owns; a trial with an infinite value silently missing from our
trials table. The rows of docs/reliability.md point here.
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.errors import UsageError
from autotune.search.records import TrialRecorder
from autotune.serving import build_launch, resolve_tuned_config
from autotune.spec import MAX_CONCURRENCY, MAX_NUM_SEQS, Scenario, SpecConfig
from store import InvalidRecordError, Store

MODEL = "my-org/tiny-target"  # in no catalog: the CLI keeps the name as given
SEARCH = ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--trials", "2"]


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_line(result: Result, exit_code: int) -> str:
    """The single error line of a failed command (click's "Error: ..."), after checking the exit code."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # click's exit, no Python error
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    assert len(lines[0]) < 1100
    return lines[0].removeprefix("Error: ")


def _recommendation(store: Store, **config: Any) -> int:
    best = {"method": "draft_model", "drafter": "my-org/tiny-drafter", "num_speculative_tokens": 3,
            "parallel_drafting": True, "max_num_seqs": 16, **config}
    return store.add_recommendation(
        MODEL, gpu="cpu", objective="throughput", best_config=best, scenario={"concurrency": 4},
        metrics={"output_tokens_per_s": 500.0}, provenance={"kind": "measured", "backend": "vllm", "device": "cpu"},
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "peagle.db"
    with Store(str(path)) as store:
        _recommendation(store)
    return path


# ------------------------------------------------------------------------------------------- one line, --debug


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("autotune.export.render", broken)
    message = _one_line(_run("export", "--db", str(db)), 1)
    assert message == (
        "Unexpected RuntimeError: boom. This is a bug in peagle-tune: rerun with --debug for the traceback and "
        "report it."
    )
    result = _run("--debug", "export", "--db", str(db))
    assert isinstance(result.exception, RuntimeError)  # raised through: Python prints the traceback


def test_an_os_error_names_the_path(db: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    message = _one_line(_run("report", "--db", str(db), "--out", str(blocker / "sub" / "dir")), 1)
    assert message.startswith(f"Cannot use {blocker / 'sub'}") and "Not a directory" in message


def test_db_path_and_upgrade_mask_the_password() -> None:
    result = _run("db", "path", "--db", "postgresql://tuner:s3cret-pw@127.0.0.1:1/peagle")
    assert result.exit_code == 0 and result.output == "postgresql://tuner:***@127.0.0.1:1/peagle\n"
    message = _one_line(_run("db", "upgrade", "--db", "postgresql://tuner:s3cret-pw@127.0.0.1:1/peagle"), 1)
    assert "s3cret-pw" not in message and "tuner:***@127.0.0.1:1" in message


# ------------------------------------------------------------------------------------------------ --db handling


@pytest.mark.parametrize("command", [["show"], ["export"], SEARCH])
def test_an_in_memory_database_is_refused_by_every_command(command: list[str]) -> None:
    message = _one_line(_run(*command, "--db", "sqlite://"), 1)
    assert message.startswith("sqlite:// is an in-memory SQLite database: everything stored in it is lost")


def test_a_search_refuses_a_read_only_database_before_any_trial(db: Path) -> None:
    message = _one_line(_run(*SEARCH, "--db", f"sqlite:///{db}?mode=ro"), 1)
    assert "is open read-only (the URL asks for it with ?mode=ro), but this command stores results" in message
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM peagle_trials").fetchone()[0] == 0


# ------------------------------------------------------------------------------------------------- --storage


def test_storage_as_a_plain_path_is_a_sqlite_file(db: Path, tmp_path: Path) -> None:
    optuna_db = tmp_path / "optuna.db"
    result = _run(*SEARCH, "--db", str(db), "--storage", str(optuna_db), "--json")
    assert result.exit_code == 0, result.output
    with sqlite3.connect(optuna_db) as raw:
        assert raw.execute("SELECT count(*) FROM trials").fetchone()[0] == 2  # Optuna's table, in that file


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("::::", "--storage: Cannot parse the database URL '::::': it has a ':' but no '://'."),
        ("postgresql://tuner:pw@127.0.0.1:1/x", "Study storage: Cannot connect to the database "
         "postgresql://tuner:***@127.0.0.1:1/x: connection failed"),
    ],
)
def test_a_bad_storage_is_one_line(db: Path, storage: str, expected: str) -> None:
    # before: 58 lines of SQLAlchemy traceback ("Could not parse SQLAlchemy URL"), 143 lines for the server
    message = _one_line(_run(*SEARCH, "--db", str(db), "--storage", storage), 1)
    assert message.startswith(expected)


def test_a_lock_held_past_the_timeout_under_a_search_is_one_line_with_the_right_cause(db: Path) -> None:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        message = _one_line(_run(*SEARCH, "--db", f"sqlite:///{db}?timeout=0.5"), 1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # before: 139 lines ending in Optuna's StorageInternalError "This typically happens due to invalid data"
    assert message.startswith(f"Study storage: sqlite:///{db}?timeout=0.5 is locked by another process writing")
    assert "waited 0.5 s for the lock" in message and "invalid data" not in message


def test_a_damaged_database_under_a_search_is_one_line(db: Path) -> None:
    assert _run(*SEARCH, "--db", str(db)).exit_code == 0  # Optuna's tables now exist beside ours
    with sqlite3.connect(db) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file itself
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        try:  # the page of Optuna's studies table, the first thing a search reads
            page = raw.execute("SELECT pageno FROM dbstat WHERE name = 'studies'").fetchone()[0]
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no dbstat table to find the page")
    with db.open("r+b") as f:
        f.seek(page_size * (page - 1))
        f.write(random.Random(3).randbytes(page_size))
    message = _one_line(_run(*SEARCH, "--db", str(db)), 1)
    assert "is damaged (database disk image is malformed)" in message and ".recover" in message


# ------------------------------------------------------------------------------------------------ export --out


def test_export_into_a_missing_or_non_folder_is_one_line(db: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "x.json"
    assert _one_line(_run("export", "--db", str(db), "--out", str(missing)), 2) == (
        f"--out {missing}: {missing.parent} does not exist; create the folder or choose another path."
    )
    under_file = db / "x.json"
    assert "is not a folder" in _one_line(_run("export", "--db", str(db), "--out", str(under_file)), 2)


def test_export_never_writes_through_a_symbolic_link(db: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.json"  # does not exist yet: the link dangles
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    message = _one_line(_run("export", "--db", str(db), "--out", str(link)), 2)
    assert message.startswith(f"--out {link} is a symbolic link (to {victim}); pass --force to replace the link")
    assert not victim.exists()  # before: the export created the link's target
    result = _run("export", "--db", str(db), "--out", str(link), "--force")
    assert result.exit_code == 0, result.output
    assert not link.is_symlink() and json.loads(link.read_text(encoding="utf-8"))["num_speculative_tokens"] == 3
    assert not victim.exists()


def test_export_force_replaces_atomically(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "spec.json"
    out.write_text("old, complete content", encoding="utf-8")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("autotune.cli._common.os.fsync", disk_full)
    message = _one_line(_run("export", "--db", str(db), "--out", str(out), "--force"), 1)
    assert message == f"--out {out}: cannot write it (No space left on device); nothing was changed."
    assert out.read_text(encoding="utf-8") == "old, complete content"  # before: truncated, then half written
    assert not list(tmp_path.glob(".spec.json.*"))  # the temporary file is gone
    monkeypatch.undo()
    assert _run("export", "--db", str(db), "--out", str(out), "--force").exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # an ordinary file, as write_text made it


# ------------------------------------------------------------------------------------------------ absurd values


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-num-seqs", "99999999999999999999"],
         f"--max-num-seqs takes integers from 1 to {MAX_NUM_SEQS:,}, but got '99999999999999999999'."),
        (["--concurrency", "100000"], f"--concurrency takes integers from 1 to {MAX_CONCURRENCY:,}, but got '100000'."),
        (["--max-num-seqs", "9" * 5001], "--max-num-seqs takes comma-separated integers like 1,8,64, but got '999"),
    ],
)
def test_absurd_search_values_are_refused(db: Path, args: list[str], expected: str) -> None:
    # before: accepted; 99999999999999999999 was stored and exported as `--max-num-seqs 99999999999999999999`
    assert _one_line(_run(*SEARCH, *args, "--db", str(db)), 2).startswith(expected)


def test_an_absurd_space_file_value_is_refused_with_a_cut_message(db: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("max_num_seqs: [" + ", ".join(["99999999999999999999"] * 2000) + "]\n", encoding="utf-8")
    message = _one_line(_run(*SEARCH, "--space", str(space), "--db", str(db)), 2)
    assert message.startswith(f"{space}: max_num_seqs: must be a non-empty list of integers in [1, {MAX_NUM_SEQS:,}]")
    assert len(message) < 400


def test_a_stored_absurd_config_is_refused_on_export(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Store(str(path)) as store:
        _recommendation(store, max_num_seqs=99999999999999999999)  # written before the bound existed
    message = _one_line(_run("export", "--format", "vllm-args", "--db", str(path)), 2)
    assert message == f"max_num_seqs must be in [1, {MAX_NUM_SEQS:,}], but got 99999999999999999999."


def test_absurd_scenarios_and_configs_are_refused_in_the_library() -> None:
    for bad in (0, MAX_CONCURRENCY + 1):
        with pytest.raises(UsageError, match="concurrency must be in"):
            Scenario(bad)
    with pytest.raises(UsageError, match="request_rate must be"):
        Scenario(1, request_rate=math.nan)
    with pytest.raises(UsageError, match="max_num_seqs must be in"):
        SpecConfig(max_num_seqs=MAX_NUM_SEQS + 1)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_serve_record_every_must_be_a_finite_positive_time(db: Path, value: str) -> None:
    message = _one_line(_run("serve", "--model", MODEL, "--dry-run", "--record-every", value, "--db", str(db)), 2)
    assert message.startswith("--record-every takes a number of seconds in (0, 604800]")


# --------------------------------------------------------------------------------------- serve's own options


@pytest.mark.parametrize(
    ("args", "owned"),
    [
        (["--speculative_config", "{}"], "--speculative-config"),  # vLLM turns _ into -
        (["--speculative-conf", "{}"], "--speculative-config"),  # argparse abbreviations
        (["--speculative-config.method", "ngram"], "--speculative-config"),  # dotted JSON keys
        (["--scheduler_cls", "x"], "--scheduler-cls"),
        (["--async_scheduling"], "--async-scheduling"),
        (["--no-async"], "--no-async-scheduling"),
        (["--por", "9000"], "--port"),
        (["--host=0.0.0.0"], "--host"),
    ],
)
def test_serve_refuses_every_spelling_of_its_own_options(db: Path, args: list[str], owned: str) -> None:
    with Store(str(db)) as store:
        tuned = resolve_tuned_config(store, MODEL, device="cpu")
    with pytest.raises(UsageError, match=f"^`{owned}` after `--` conflicts with what `peagle-tune serve` sets"):
        build_launch(tuned, extra_args=args)


def test_serve_checks_the_keys_of_a_vllm_config_file(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text('max-num-seqs: 8\nscheduler_cls: "my.Scheduler"\n', encoding="utf-8")
    with Store(str(db)) as store:
        tuned = resolve_tuned_config(store, MODEL, device="cpu")
    with pytest.raises(UsageError, match=f"`--scheduler-cls` in the --config file {config} conflicts"):
        build_launch(tuned, extra_args=["--config", str(config)])
    config.write_text("max-num-seqs: 8\n", encoding="utf-8")
    build_launch(tuned, extra_args=[f"--config={config}", "--max-num-seqs", "8"])  # other options pass


# --------------------------------------------------------------------------------- trials the store refuses


def _recorder(store: Store) -> TrialRecorder:
    return TrialRecorder(store, "st", MODEL, Scenario(4), ["output_tokens_per_s"])


def test_a_trial_with_infinite_or_nan_numbers_is_stored_not_dropped(tmp_path: Path) -> None:
    config = SpecConfig(max_num_seqs=4)
    with Store(str(tmp_path / "t.db")) as store:
        recorder = _recorder(store)
        recorder.record(0, config, "complete", [math.inf], {"tpot_ms_p50": math.nan, "ok": 1.0},
                        {"backend": "model", "x": [math.inf]}, None)
        [trial] = store.list_trials(study="st")
        # before: the store's InvalidRecordError was taken for "already stored" and the trial silently dropped
        assert trial.number == 0 and trial.values == {} and trial.metrics["tpot_ms_p50"] is None
        assert trial.metrics["non_finite"] == [
            "values.output_tokens_per_s=inf", "metrics.tpot_ms_p50=nan", "provenance.x[0]=inf"
        ]
        recorder.record(0, config, "complete", [1.0], {}, {"backend": "model"}, None)  # already stored: skipped
        assert len(store.list_trials(study="st")) == 1
        with pytest.raises(InvalidRecordError, match="status must be one of"):
            recorder.record(1, config, "exploded", [1.0], {}, {"backend": "model"}, None)  # a real refusal
