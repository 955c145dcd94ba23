"""The database and the search's results under hostile rows, bad trials, concurrent workers and damaged pages.

Probes from issue 35: a lone-surrogate class label was stored and then failed `show --simulation` and `report` for
the whole database (SQLite and PostgreSQL); a 5,000-character study name broke every report on SQLite and failed
after the first trial on PostgreSQL (varchar 300); a trial with a NaN figure made the search fail on a NaN
`speedup_vs_published_k` with no recommendation stored; three workers on one SQLite study stored three identical
recommendations; search wrote into a database with a damaged page; a password in the URL query was printed. The rows
of docs/reliability.md ("Database and results") point here.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import multiprocessing
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from autotune.backends.model import ModelBackend
from autotune.cli import main
from autotune.cli._common import store_label
from autotune.errors import UsageError
from autotune.search import DrafterChoice, GridStrategy, Search, SearchSpace
from autotune.search.study import MAX_STUDY_PREFIX_CHARS, fitting_study_prefix
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from store import DatabaseCorruptError, InvalidRecordError, Store, StoreError, mask_password
from store.testing import database_url

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
PEAGLE = DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path, "the database probes")


def _raw(url: str, sql: str, **params: Any) -> None:
    """Write to the database behind the store's back, as another program (or an older peagle-tune) could."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(sql), params)
    finally:
        engine.dispose()


def _trials(store: Store, study: str, n: int) -> list[int]:
    return [store.add_trial(study, number=i, model="m", config={"k": i}, backend="model",
                            values={"output_tokens_per_s": 100.0 + i}) for i in range(n)]


# ------------------------------------------------------------------------------------------- names at the door


def test_a_lone_surrogate_label_is_refused_when_written(db_url: str) -> None:
    with Store(db_url) as store:
        with pytest.raises(InvalidRecordError) as info:
            store.add_trial("st", number=0, model="m", config={"k": 1}, backend="model",
                            metrics={"per_class": {"c\ud800": 1.0}})
        assert str(info.value) == (
            "metrics['per_class'] key 'c\\ud800' holds a lone surrogate '\\ud800' at character 1 (not valid Unicode: "
            "it cannot be printed or written to a file); it is not stored. Use printable text."
        )
        with pytest.raises(InvalidRecordError) as info:
            store.workload_id("w", content_hash="h", classes=["chat", "c\ud800"])
        assert str(info.value) == (
            "workload classes[1] 'c\\ud800' holds a lone surrogate '\\ud800' at character 1 (not valid Unicode: it "
            "cannot be printed or written to a file); it is not stored. Use printable text."
        )
        with pytest.raises(InvalidRecordError, match=r"^model 'a\\x1b\[31m' holds the control character '\\x1b'"):
            store.add_trial("st", number=0, model="a\x1b[31m", config={}, backend="model")
        assert store.list_trials() == []


def test_a_5000_character_study_name_is_refused_at_the_door(db_url: str) -> None:
    with Store(db_url) as store:
        with pytest.raises(InvalidRecordError) as info:
            store.add_trial("x" * 5000, number=0, model="m", config={}, backend="model")
        assert str(info.value) == f"study '{'x' * 79} is 5,000 characters long; at most 300 fit; it is not stored."
        assert store.list_trials() == []
    # The search refuses it before the first trial, with the limit; its own long default names are shortened.
    with pytest.raises(UsageError) as refused:
        Search(store=Store("sqlite://"), backend=ModelBackend("gpt-oss-120b", "h200"), model="openai/gpt-oss-120b",
               device="NVIDIA H200", workload=load_workload("mt-bench"), space=SearchSpace(drafters=(PEAGLE,)),
               study_prefix="x" * 5000)
    assert str(refused.value) == (
        "--study takes a name of 1 to 293 printable characters (the database keeps 300, and -c<concurrency> is "
        "added), but it has 5,000 characters."
    )
    long = "gpt-oss-120b-" + "w" * 400
    short = fitting_study_prefix(long)
    assert len(short) == MAX_STUDY_PREFIX_CHARS == 293 and short == fitting_study_prefix(long)
    assert short.startswith("gpt-oss-120b-www") and short != fitting_study_prefix(long + "x")


# ------------------------------------------------------------------------------------ bad stored rows skipped


def _show(db: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["show", *args, "--db", db])


def test_a_bad_stored_row_is_reported_in_one_line_and_skipped(db_url: str, tmp_path: Path) -> None:
    with Store(db_url) as store:
        ids = _trials(store, "st", 3)
        store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"})
        bad_rec = store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"})
    # A lone surrogate in a stored label: both backends keep it (PostgreSQL's json type too).
    _raw(db_url, "UPDATE peagle_trials SET metrics = :m WHERE id = :id", m='{"label": "c\\ud800"}', id=ids[1])
    _raw(db_url, "UPDATE peagle_recommendations SET class_policy = :c WHERE id = :id",
         c='{"c\\ud800": {"max_k": 1}}', id=bad_rec)
    skipped = (f"Skipped row {ids[1]} of peagle_trials: its metrics['label'] holds a lone surrogate '\\ud800' at "
               "character 1 (not valid Unicode: it cannot be printed or written to a file). Delete or fix that row.")
    result = _show(db_url, "--trials", "st", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [skipped]
    assert '"number": 0' in result.stdout and '"number": 2' in result.stdout and '"number": 1' not in result.stdout
    result = _show(db_url)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"Skipped row {bad_rec} of peagle_recommendations: its class_policy key 'c\\ud800' holds a lone surrogate "
        "'\\ud800' at character 1 (not valid Unicode: it cannot be printed or written to a file). Delete or fix "
        "that row."
    ]
    report = CliRunner().invoke(main, ["report", "--out", str(tmp_path / "report"), "--db", db_url])
    assert report.exit_code == 0, report.output
    assert skipped in report.stderr.splitlines() and (tmp_path / "report" / "index.html").is_file()
    # The row itself, asked for by id, is one error line naming it.
    result = _show(db_url, "--recommendation", str(bad_rec))
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: Row {bad_rec} of peagle_recommendations cannot be read: its class_policy key 'c\\ud800' holds a "
        "lone surrogate '\\ud800' at character 1 (not valid Unicode: it cannot be printed or written to a file). "
        f"Delete or fix that row (DELETE FROM peagle_recommendations WHERE id = {bad_rec}); the other rows are read."
    ]


def test_the_latest_recommendation_skips_newer_rows_it_cannot_read(db_url: str) -> None:
    with Store(db_url) as store:
        good, *bad = [store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"k": k})
                      for k in range(4)]
    for row in bad:
        _raw(db_url, "UPDATE peagle_recommendations SET best_config = :c WHERE id = :id", c='{"c\\ud800": 1}', id=row)
    lines: list[str] = []
    with Store(db_url, on_bad_row=lines.append) as store:
        latest = store.latest_recommendation("m")
        assert latest is not None and latest.id == good and latest.best_config == {"k": 0}
        assert store.latest_recommendation("m", gpu="NVIDIA H200") is None
    newest_first = [f"Skipped row {row} of peagle_recommendations" for row in bad[::-1]]
    assert [line.split(":")[0] for line in lines] == newest_first


def test_bad_json_and_an_absurd_study_name_on_sqlite_are_skipped(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    with Store(db) as store:
        ids = _trials(store, "st", 3)
    # SQLite keeps any text in a JSON column and any length in a VARCHAR(300).
    _raw(db, "UPDATE peagle_trials SET config = '{not json' WHERE id = :id", id=ids[0])
    _raw(db, "UPDATE peagle_trials SET study = :s WHERE id = :id", s="y" * 5000, id=ids[2])
    result = _show(db, "--studies", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"Skipped row {ids[2]} of peagle_trials: its study is 5,000 characters long, more than the 300 its column "
        "holds. Delete or fix that row."
    ]
    assert '"n_trials": 2' in result.stdout  # rows 0 and 1 of "st" (the study lists no config)
    result = _show(db, "--trials", "st", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"Skipped row {ids[0]} of peagle_trials: its config is not valid JSON (JSONDecodeError: Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1)). Delete or fix that row."
    ]
    assert '"number": 1' in result.stdout and '"number": 0' not in result.stdout


def test_a_simulation_with_one_hostile_row_still_shows_and_reports(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    stored = CliRunner().invoke(main, ["simulate", "--model", "gpt-oss-120b", "--concurrency", "1", "--shape",
                                       "stationary", "--json", "--db", db])
    assert stored.exit_code == 0, stored.output
    with Store(db) as store:
        trials = store.list_trials()
    study, victim = trials[0].study, trials[1]
    # A lone surrogate in one row's config label, written as its JSON escape (as a hand-made row would hold it).
    with sqlite3.connect(tmp_path / "peagle.db") as raw:
        (metrics,) = raw.execute("SELECT metrics FROM peagle_trials WHERE id = ?", (victim.id,)).fetchone()
        label = '"config": ' + json.dumps(victim.metrics["row"]["config"])
        assert label in metrics
        raw.execute("UPDATE peagle_trials SET metrics = ? WHERE id = ?",
                    (metrics.replace(label, '"config": "c\\ud800"', 1), victim.id))
    with Store(db, on_bad_row=lambda line: None) as store:
        assert [t.id for t in store.list_trials(study=study)] == [t.id for t in trials if t.id != victim.id]
        assert [bad.row_id for bad in store.bad_rows] == [victim.id]
    result = _show(db, "--simulation", study)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"Skipped row {victim.id} of peagle_trials: its metrics['row']['config'] holds a lone surrogate '\\ud800' at "
        "character 1 (not valid Unicode: it cannot be printed or written to a file). Delete or fix that row."
    ]
    assert trials[0].metrics["row"]["config"] in result.stdout and trials[2].metrics["row"]["config"] in result.stdout
    report = CliRunner().invoke(main, ["report", "--out", str(tmp_path / "report"), "--db", db])
    assert report.exit_code == 0, report.output
    assert report.stderr.splitlines() == result.stderr.splitlines()


# ------------------------------------------------------------------------------------------ NaN trials


class _NanAtPublishedK(ModelBackend):
    """The model backend, with the publisher's K (5) measured as the fastest config but with a NaN TPOT."""

    def measure(self, config: SpecConfig, workload: Any, scenario: Scenario) -> Any:
        m = super().measure(config, workload, scenario)
        if config.k == PEAGLE.recommended_k:
            assert m.output_tokens_per_s is not None
            return dataclasses.replace(m, output_tokens_per_s=m.output_tokens_per_s * 10, tpot_ms_p50=math.nan)
        return m


def test_a_nan_trial_is_left_out_and_the_recommendation_is_stored(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "peagle.db"))
    search = Search(store=store, backend=_NanAtPublishedK("gpt-oss-120b", "h200"), model="openai/gpt-oss-120b",
                    device="NVIDIA H200", workload=load_workload("mt-bench"), study_prefix="p",
                    space=SearchSpace(drafters=(PEAGLE,), k_max=8, max_num_seqs=(64,)), strategy=GridStrategy())
    [result] = search.run([Scenario(concurrency=64)])
    # K=5 with and without parallel drafting: complete (throughput is finite) but with a NaN figure.
    assert result.n_excluded == 2 and result.n_complete == 17 and result.best.config.k != 5
    assert result.rule.endswith("; 2 trials with NaN or infinite figures left out")
    rid = search.recommend(result, {})
    [rec] = store.list_recommendations()
    assert rec.id == rid and rec.metrics["n_excluded"] == 2
    # The publisher's K has no usable figures: no comparison with it, rather than a NaN speedup.
    assert rec.metrics["speedup_vs_published_k"] is None and rec.metrics["published_k"] is None
    assert math.isfinite(rec.metrics["speedup_vs_no_spec"])


# -------------------------------------------------------------------------------------- concurrent workers


def _recommend(url: str, barrier: Any, ids: Any) -> None:
    store = Store(url)
    barrier.wait()  # all three look for the recommendation at the same moment
    ids.put(store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"k": 3},
                                     metrics={"output_tokens_per_s": 1.0}, study="st-c64"))


def test_three_workers_store_one_recommendation(db_url: str) -> None:
    Store(db_url).close()  # the schema exists before the workers race
    ctx = multiprocessing.get_context("spawn")
    barrier, ids = ctx.Barrier(3), ctx.Queue()
    workers = [ctx.Process(target=_recommend, args=(db_url, barrier, ids)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    got = [ids.get(timeout=10) for _ in workers]
    with Store(db_url) as store:
        [rec] = store.list_recommendations()
    assert got == [rec.id] * 3


@pytest.mark.slow
def test_three_search_workers_on_one_sqlite_study_store_one_recommendation(tmp_path: Path) -> None:
    from test_search_workers import worker

    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    (tmp_path / "barrier").mkdir()
    procs = [subprocess.Popen(worker(db, "w3", 12, 0.02, tmp_path / "barrier"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(3)]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode()[-2000:]
    assert len(Store(db).list_recommendations()) == 1


# ------------------------------------------------------------------------------------------- damaged pages


def test_search_refuses_to_write_into_a_damaged_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "peagle.db"
    with Store(str(path)) as store:
        _trials(store, "st", 200)
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = int(raw.execute("PRAGMA page_size").fetchone()[0])
    pages = path.stat().st_size // page_size
    with path.open("r+b") as f:  # a leaf page of the trials claims 99 cells: readable, but wrong
        f.seek(page_size * (pages // 2) + 3)
        f.write(b"\x00\x63")
    with sqlite3.connect(path) as raw:
        first = next(line for row in raw.execute("PRAGMA quick_check") for line in str(row[0]).splitlines()
                     if not line.startswith("***"))
    before = path.read_bytes()
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--backend", "model", "--concurrency",
                                       "8", "--trials", "2", "--db", str(path)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: sqlite:///{path} is damaged: PRAGMA quick_check found \"{first}\" and other problems. Nothing was "
        f"written. Copy out what SQLite can still read (`sqlite3 {path} .recover | sqlite3 recovered.db`) and pass "
        "--db recovered.db, or restore it from a backup, or start a new database with --db."
    ]
    assert path.read_bytes() == before
    with pytest.raises(DatabaseCorruptError):
        Store(str(path), for_writing=True)
    with Store(str(path)) as store:  # reading is still allowed: show and export what can be read
        assert store.read_only is None


# -------------------------------------------------------------------------------------------- passwords


def test_a_password_in_the_url_query_is_masked() -> None:
    url = "postgresql+psycopg://tuner:pw@db.example:5432/peagle?password=s3cret&sslmode=require&sslpassword=k3y"
    masked = "postgresql+psycopg://tuner:***@db.example:5432/peagle?password=***&sslmode=require&sslpassword=***"
    assert mask_password(url) == masked

    class _Stored:
        pass

    stored = _Stored()
    stored.url = url  # type: ignore[attr-defined]
    assert store_label(stored) == masked
    result = CliRunner().invoke(main, ["db", "path", "--db", url])
    assert result.exit_code == 0 and "s3cret" not in result.output and "k3y" not in result.output
    assert result.output.strip() == masked



@pytest.mark.parametrize("args", [["show"], ["show", "--studies"], ["export"], ["report", "--out", "r"]],
                         ids=" ".join)
def test_a_read_command_on_a_database_that_does_not_exist_says_so_and_creates_nothing(
    tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 44.7: `show --db typo.db` created a 100 KB database and exited 0.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*args, "--db", "typo.db"])
    assert result.exit_code == 3, result.output
    assert f"There is no database at {tmp_path / 'typo.db'}: check --db (or PEAGLE_DB)" in result.output
    assert not (tmp_path / "typo.db").exists()


def test_a_planted_claim_lock_link_is_not_followed(tmp_path: Path) -> None:
    # Issue 44.7: a symbolic link at <db>.claims.lock was followed (created or locked the file it points to).
    target = tmp_path / "someone-elses-file"
    (tmp_path / "peagle.db.claims.lock").symlink_to(target)
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--trials", "3",
                                       "--db", str(tmp_path / "peagle.db")])
    assert result.exit_code == 1, result.output
    assert "peagle.db.claims.lock: it is a symbolic link; peagle-tune creates this file itself" in result.output
    assert not target.exists()


def test_a_database_path_that_is_a_directory_names_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 44.7: PEAGLE_DB set to a directory said "check that the folder is writable".
    monkeypatch.setenv("PEAGLE_DB", str(tmp_path))
    result = CliRunner().invoke(main, ["show"])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path} is a directory, not a database file: give a file, e.g. --db {tmp_path / 'peagle.db'}" \
        in result.output


# ------------------------------------------------------------------------- drift, full disk, PEAGLE_DB (issue 44.7)


def _drop(path: Path, *statements: str) -> None:
    """Change the tables by hand, as a user or another program could (foreign keys off, as sqlite3 opens)."""
    with sqlite3.connect(path) as raw:
        for sql in statements:
            raw.execute(sql)


def _drift(url: str) -> list[str]:
    from store._migrate import describe_difference, schema_differences

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [describe_difference(d) for d in schema_differences(connection)]
    finally:
        engine.dispose()


def test_db_upgrade_repairs_a_table_a_column_and_an_index_dropped_at_the_current_revision(tmp_path: Path) -> None:
    # Issue 44.7: a column dropped at the current revision made `search` say "run db upgrade", and `db upgrade` said
    # "at the current schema" (exit 0), still broken.
    path = tmp_path / "peagle.db"
    url = f"sqlite:///{path}"
    Store(url).close()
    _drop(path, "ALTER TABLE peagle_recommendations DROP COLUMN vllm_version", "DROP TABLE peagle_workloads",
          "DROP INDEX ix_peagle_trials_model")
    assert sorted(_drift(url)) == ["missing column peagle_recommendations.vllm_version",
                                   "missing index ix_peagle_trials_model", "missing table peagle_workloads"]
    with Store(url) as store, pytest.raises(StoreError, match="has no column named vllm_version. If tables are "
                                            "missing, run `peagle-tune db upgrade"):
        store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"})

    result = CliRunner().invoke(main, ["db", "upgrade", "--db", url], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert sorted(line for line in result.output.splitlines() if line.startswith("Repaired:")) == [
        "Repaired: added the missing column peagle_recommendations.vllm_version (NULL in every row).",
        "Repaired: created the missing index ix_peagle_trials_model.",
        "Repaired: created the missing table peagle_workloads.",
    ]
    assert _drift(url) == []
    with Store(url) as store:
        rid = store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"},
                                       vllm_version="0.32.0")
        assert store.get_recommendation(rid).vllm_version == "0.32.0"
        assert store.workload_id("w", content_hash="ab" * 32, classes=["a"]) > 0


def test_db_upgrade_names_the_fix_for_drift_it_cannot_repair_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "peagle.db"
    url = f"sqlite:///{path}"
    Store(url).close()
    # objective is NOT NULL without a default: adding it back would make up every row's value.
    _drop(path, "ALTER TABLE peagle_recommendations DROP COLUMN objective",
          "ALTER TABLE peagle_recommendations DROP COLUMN vllm_version")
    result = CliRunner().invoke(main, ["db", "upgrade", "--db", url], terminal_width=400)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"Error: {url} is at schema revision {Store(url, check_schema=False).revision()!r}, but its tables differ "
        "from it in ways peagle-tune cannot repair without losing or making up data (missing column "
        "peagle_recommendations.objective). Restore the database from a backup, or move it aside and start a new "
        "one (--db or PEAGLE_DB)."
    ]
    assert sorted(_drift(url)) == ["missing column peagle_recommendations.objective",
                                   "missing column peagle_recommendations.vllm_version"]  # nothing half-repaired


def test_read_commands_work_on_a_full_disk_and_a_write_names_the_cause(tmp_path: Path) -> None:
    # Issue 44.7: with the disk at 0 bytes free, show/export/report of an existing database failed with "disk I/O
    # error. Check that the folder is writable" (a reader of a WAL database creates its 32 KiB -shm index).
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        path = mnt / "peagle.db"
        with Store(str(path)) as store:
            _trials(store, "st", 3)
            store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"},
                                     scenario={"concurrency": 1})
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'ballast'}", "bs=4k"], capture_output=True)
        assert os.statvfs(mnt).f_bfree == 0
        runner = CliRunner()
        for args in (["show", "--trials", "st"], ["export"], ["report", "--out", str(tmp_path / "report")]):
            result = runner.invoke(main, [*args, "--db", str(path)])
            assert result.exit_code == 0, (args, result.output)
        assert sorted(p.name for p in mnt.iterdir()) == ["ballast", "peagle.db"]  # nothing written beside it
        result = runner.invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--trials", "1",
                                      "--db", str(path)], terminal_width=300)
        assert result.exit_code == 1, result.output
        assert result.output.strip() == (
            f"Error: sqlite:///{path} is open read-only (its disk is full), but this command stores results. To "
            "store, free space on that disk, or choose another database with --db or PEAGLE_DB."
        )
    finally:
        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("case", ["fifo", "device", "link loop", "missing folder", "file as folder"])
def test_peagle_db_errors_name_the_real_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    # Issue 44.7: PEAGLE_DB errors said "unable to open database file" / "disk I/O error. Check that the folder ...
    # is writable", or "Unexpected RuntimeError ... bug" for a link loop, whatever the cause.
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo.db")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    value, expected = {
        "fifo": (tmp_path / "fifo.db", f"{tmp_path / 'fifo.db'} is a FIFO, not a database file"),
        "device": (Path("/dev/null"), "/dev/null is a character device, not a database file"),
        "link loop": (tmp_path / "loop", f"The database path '{tmp_path / 'loop'}' cannot be followed (Symlink loop"),
        "missing folder": (tmp_path / "new" / "p.db", f"The folder {tmp_path / 'new'} of the database "
                           f"{tmp_path / 'new' / 'p.db'} does not exist: create it (mkdir -p {tmp_path / 'new'})"),
        "file as folder": (tmp_path / "afile" / "p.db", f"{tmp_path / 'afile'} is a file, not a folder, so the "
                           f"database {tmp_path / 'afile' / 'p.db'} cannot be created under it"),
    }[case]
    monkeypatch.setenv("PEAGLE_DB", str(value))
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--concurrency", "8", "--trials", "1"],
                                terminal_width=400)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {expected}"), lines
    assert "PEAGLE_DB" in lines[0] and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fifo.db", "loop"]
