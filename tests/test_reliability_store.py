"""Broken and unusual databases: one line that names the problem and the fix, and nothing half-written.

Probes from issue 12: ``--db sqlite://`` kept results in memory without a word, ``?mode=ro`` was ignored (writes went
through), a read-only database could not even be read by `show`/`export`/`report`, a corrupted middle page and a
lock held past the timeout gave the wrong explanation, and a full disk while storing must leave nothing
half-written. The rows of docs/reliability.md point here.
"""

from __future__ import annotations

import gc
import os
import random
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import event

from autotune.cli.export import export
from autotune.cli.report import report
from autotune.cli.show import show
from store import (
    DatabaseCorruptError,
    DatabaseFullError,
    DatabaseLockedError,
    DatabaseUnavailableError,
    Store,
)

N_TRIALS = 200
PAD = "x" * 1000  # ~1 KB per trial: 200 trials fill ~50 pages of 4 KB, so a "middle page" holds trials


def _populate(path: Path, n: int = N_TRIALS) -> None:
    with Store(str(path)) as store:
        for i in range(n):
            store.add_trial("st", number=i, model="m", config={"k": i, "pad": PAD}, backend="model",
                            values={"output_tokens_per_s": float(i)})
        store.add_recommendation("m", gpu="cpu", objective="throughput", best_config={"method": "none"},
                                 scenario={"concurrency": 1})


def _rows(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        return int(raw.execute("SELECT count(*) FROM peagle_trials").fetchone()[0])


def _integrity(path: Path) -> str:
    with sqlite3.connect(path) as raw:
        return str(raw.execute("PRAGMA integrity_check").fetchone()[0])


def _one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "peagle.db"
    _populate(path)
    return path


# --------------------------------------------------------------------------------------------------- in memory


def test_in_memory_database_is_refused_where_results_must_persist() -> None:
    with Store("sqlite://") as store:
        assert store.in_memory and store.read_only is None
    with pytest.raises(DatabaseUnavailableError) as info:
        Store("sqlite://", persistent=True)
    assert str(info.value) == (
        "sqlite:// is an in-memory SQLite database: everything stored in it is lost when this process exits. Give a "
        "database file instead (--db peagle.db, or sqlite:////abs/path/peagle.db)."
    )


# --------------------------------------------------------------------------------------------------- read-only


@pytest.mark.parametrize("spelling", ["sqlite:///{path}?mode=ro", "sqlite:///file:{path}?mode=ro&uri=true"])
def test_mode_ro_is_honoured(db: Path, spelling: str) -> None:
    url = spelling.format(path=db)
    with Store(url) as store:
        assert store.read_only == "the URL asks for it with ?mode=ro"
        assert len(store.list_trials()) == N_TRIALS
        with pytest.raises(DatabaseUnavailableError, match=r"is open read-only \(the URL asks for it with \?mode=ro"
                           r"\), but this call writes to it\. To store, drop \?mode=ro from the URL"):
            store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
    assert _rows(db) == N_TRIALS  # before: the URL option was dropped with a warning and the trial was written
    with pytest.raises(DatabaseUnavailableError, match="but this command stores results"):
        Store(url, for_writing=True)  # refused before a search spends an hour on trials it cannot store


def test_mode_ro_on_a_missing_file_does_not_create_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    with pytest.raises(DatabaseUnavailableError, match=f"the file {path} does not exist"):
        Store(f"sqlite:///{path}?mode=ro")
    assert not path.exists()


def test_read_only_fresh_database_says_there_is_nothing_to_read(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    with pytest.raises(DatabaseUnavailableError, match="has no peagle-tune tables, and it is open read-only"):
        Store(f"sqlite:///{path}?mode=ro")


def test_unknown_sqlite_url_options_are_refused_not_ignored(db: Path) -> None:
    with pytest.raises(DatabaseUnavailableError, match=r"unknown option\(s\) \['mdoe'\]; SQLite URLs take mode=ro"):
        Store(f"sqlite:///{db}?mdoe=ro")
    with pytest.raises(DatabaseUnavailableError, match="mode='wr'; use mode=ro"):
        Store(f"sqlite:///{db}?mode=wr")


def _read_commands(db: str, out: Path) -> None:
    """show, export and report all read the database and exit 0."""
    runner = CliRunner()
    result = runner.invoke(show, ["--trials", "st", "--json", "--db", db])
    assert result.exit_code == 0, result.output
    assert f'"number": {N_TRIALS - 1}' in result.output
    result = runner.invoke(export, ["--format", "vllm-json", "--db", db])
    assert result.exit_code == 0, result.output
    result = runner.invoke(report, ["--out", str(out), "--db", db])
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file()


def test_show_export_and_report_read_a_mode_ro_database(db: Path, tmp_path: Path) -> None:
    _read_commands(f"sqlite:///{db}?mode=ro", tmp_path / "out")
    assert _rows(db) == N_TRIALS


def _unmount(mnt: Path) -> None:
    """Unmount a test tmpfs; lazily if an open file (a connection not yet collected) still holds it."""
    gc.collect()
    if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A populated database on a read-only tmpfs (root only: the only read-only case root cannot write through)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only filesystem needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        _populate(mnt / "peagle.db")  # closing the last connection checkpoints the WAL into the file
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
        yield mnt / "peagle.db"
    finally:
        _unmount(mnt)


def test_a_database_on_a_read_only_filesystem_is_readable(read_only_mount: Path, tmp_path: Path) -> None:
    # before: "Cannot open ... unable to open database file. Check that the folder exists and is writable"
    with Store(str(read_only_mount)) as store:
        assert store.read_only == "it is on a read-only filesystem"
        assert len(store.list_trials()) == N_TRIALS
        with pytest.raises(DatabaseUnavailableError, match="To store, copy it to a writable disk"):
            store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
    _read_commands(str(read_only_mount), tmp_path / "out")


def test_a_file_this_user_cannot_write_is_readable(db: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through file permissions (the read-only mount test covers root)")
    db.chmod(0o444)
    with Store(str(db)) as store:
        assert store.read_only == "this user cannot write the file"
        assert len(store.list_trials()) == N_TRIALS
        with pytest.raises(DatabaseUnavailableError, match=r"make the file writable \(chmod u\+w\)"):
            store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
    _read_commands(str(db), tmp_path / "out")


# --------------------------------------------------------------------------------------------------- corrupted


def test_a_corrupted_middle_page_is_named_with_the_way_to_recover(db: Path) -> None:
    with sqlite3.connect(db) as raw:
        page_size = int(raw.execute("PRAGMA page_size").fetchone()[0])
    pages = db.stat().st_size // page_size
    assert pages > 40  # derived above: 200 trials of ~1 KB
    with db.open("r+b") as f:
        f.seek(page_size * (pages // 2))
        f.write(random.Random(12).randbytes(page_size))
    with Store(str(db)) as store, pytest.raises(DatabaseCorruptError) as info:
        store.list_trials()
    message = str(info.value)
    assert message.startswith(f"sqlite:///{db} is damaged (database disk image is malformed)")
    assert f"`sqlite3 {db} .recover | sqlite3 recovered.db`" in message
    result = CliRunner().invoke(show, ["--trials", "st", "--db", str(db)])
    assert result.exit_code == 1
    assert _one_line(result.output) == f"Error: {message}"


# -------------------------------------------------------------------------------------------------------- locks


def test_a_lock_held_past_the_timeout_is_one_line_with_the_right_cause(db: Path) -> None:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer takes the write lock and keeps it
    try:
        with Store(str(db), lock_timeout_s=0.5) as store:
            assert len(store.list_trials()) == N_TRIALS  # WAL: readers are not blocked by the writer
            start = time.perf_counter()
            with pytest.raises(DatabaseLockedError) as info:
                store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
            waited = time.perf_counter() - start
        assert 0.5 <= waited < 5.0
        assert str(info.value) == (
            f'sqlite:///{db} is locked by another process writing to it: the database said "database is locked" '
            "after peagle-tune waited 0.5 s for the lock. Wait for that process to finish and retry, give this run "
            "its own database with --db or PEAGLE_DB, or wait longer with ?timeout=SECONDS in the URL."
        )
        with Store(f"sqlite:///{db}?timeout=0.2") as store, pytest.raises(DatabaseLockedError, match="waited 0.2 s"):
            store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Store(str(db)) as store:  # the lock is gone: the same write goes through
        store.add_trial("st", number=N_TRIALS, model="m", config={}, backend="model")
    assert _rows(db) == N_TRIALS + 1


# ---------------------------------------------------------------------------------------------------- disk full


def _fill(store: Store, first: int) -> tuple[int, DatabaseFullError]:
    """Add ~8 KB trials numbered from `first` until the database is full; (trials stored, the error)."""
    number = first
    while True:
        try:
            store.add_trial("st", number=number, model="m", config={"pad": "y" * 8000}, backend="model")
        except DatabaseFullError as exc:
            return number - first, exc
        number += 1
        assert number < first + 10_000, "the database never filled up"


def _assert_nothing_half_written(path: Path, before: int, stored: int, error: DatabaseFullError) -> None:
    assert str(error).startswith(f"sqlite:///{path}: the disk is full (database or disk is full). The write was "
                                 "rolled back")
    assert _integrity(path) == "ok"
    with sqlite3.connect(path) as raw:
        numbers = [n for (n,) in raw.execute("SELECT number FROM peagle_trials ORDER BY number")]
    assert numbers == list(range(before + stored))  # every call before the failing one, nothing of that one


def test_a_full_database_rolls_the_write_back_whole(db: Path) -> None:
    """SQLite's own "full" error at the exact point a write needs a new page (max_page_count caps the file)."""
    with Store(str(db)) as store:
        engine = store._engine
        with sqlite3.connect(db) as raw:
            pages = int(raw.execute("PRAGMA page_count").fetchone()[0])
        limit = {"pages": pages + 10}  # room for a few 8 KB trials, then SQLITE_FULL

        @event.listens_for(engine, "connect")
        def _cap(dbapi_connection: sqlite3.Connection, _record: object) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count={limit['pages']}")

        engine.dispose()  # new connections get the cap
        stored, error = _fill(store, N_TRIALS)
        assert stored >= 1
        _assert_nothing_half_written(db, N_TRIALS, stored, error)
        limit["pages"] = 1_000_000
        engine.dispose()  # space freed: the same write goes through
        store.add_trial("st", number=N_TRIALS + stored, model="m", config={"pad": "y" * 8000}, backend="model")
    assert _rows(db) == N_TRIALS + stored + 1


def test_a_full_disk_rolls_the_write_back_whole(tmp_path: Path) -> None:
    """A real full filesystem: a 1 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        path = mnt / "peagle.db"
        before = 20
        _populate(path, n=before)
        ballast = mnt / "ballast"
        with Store(str(path)) as store:
            ballast.write_bytes(b"\0" * (64 * 1024))  # something to delete once the disk is full
            stored, error = _fill(store, before)
            _assert_nothing_half_written(path, before, stored, error)
            ballast.unlink()
            store.add_trial("st", number=before + stored, model="m", config={"pad": "y"}, backend="model")
        assert _rows(path) == before + stored + 1
        assert _integrity(path) == "ok"
    finally:
        _unmount(mnt)


def test_an_uncreatable_default_folder_says_to_choose_a_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be", encoding="utf-8")
    monkeypatch.delenv("PEAGLE_DB", raising=False)
    monkeypatch.setattr("store._url.platformdirs.user_data_dir", lambda app: str(blocker / app))
    with pytest.raises(DatabaseUnavailableError, match=f"Cannot create {blocker / 'peagle-tune'}, the folder of the "
                       r"default database \(Not a directory\)\. Choose a database with --db or PEAGLE_DB"):
        Store()
