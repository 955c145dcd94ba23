"""Sharing one study between workers (processes, hosts): the claim lock, heartbeats, the storage, dead workers.

The study lives in the project's database (or ``--storage``), so ``--study NAME`` resumes after a crash with no
completed trial lost and several workers on several hosts can share it. Workers claim trials one at a time under a
lock (a file lock for SQLite, an advisory lock for PostgreSQL), which keeps the study's total at the requested number
with no config measured twice; heartbeats turn a killed worker's RUNNING trial into FAIL and re-queue it, and a
worker on the same host notices a dead one by its process id at once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import threading
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event, make_url
from sqlalchemy.exc import SQLAlchemyError

from autotune.errors import StudyStorageError
from autotune.search.trials import trial_info
from store import database_error, is_sqlite_memory, mask_password

log = logging.getLogger(__name__)

#: Retries of a trial whose worker died (a config that kills its worker every time is not tried forever).
MAX_RETRIES = 2
#: What the storage raises when its database fails: SQLAlchemy's errors, and Optuna's StorageInternalError, which
#: wraps them and blames "invalid data in the commit" whatever the cause (a lock, a full disk, a damaged file).
STORAGE_ERRORS: tuple[type[BaseException], ...] = (SQLAlchemyError, optuna.exceptions.StorageInternalError)


def storage_error(exc: BaseException, url: str, option: str = "--storage") -> StudyStorageError:
    """One line for a failure of the study storage at `url` (chosen with `option`): the real cause, found under
    Optuna's wrapper, in the store's words (locked, damaged, full, unreachable), password masked."""
    return StudyStorageError(f"Study storage: {database_error(exc, url, option=option)}")


def in_memory(url: str) -> bool:
    """Is `url` an in-memory SQLite database (gone with its last connection)?"""
    return is_sqlite_memory(make_url(url))


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def this_worker() -> dict[str, Any]:
    """Who this worker is (host, boot, pid), as stored with each trial it claims."""
    host, boot = _machine()
    return {"host": host, "boot": boot, "pid": os.getpid()}


@functools.cache
def _machine() -> tuple[str, str]:
    """(host name, boot id): read once per process (a claim asks for them every trial)."""
    return socket.gethostname(), _boot_id()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: dead for our purposes
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def requeue(study: optuna.Study, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
    """Enqueue a failed trial's parameters again (at most `MAX_RETRIES` times per config)."""
    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(study, storage.get_trial(trial_id))


class ClaimLock(AbstractContextManager["ClaimLock"]):
    """Serialises claiming the next trial (and setting a study up) across all workers of a database.

    SQLite file: an exclusive ``flock`` on ``<db>.claims.lock`` (workers share a host with the file).
    PostgreSQL: a session advisory lock keyed by the study name (released by the server if a worker dies).
    In-memory SQLite: a process-local lock. Other databases: no lock (`exclusive` is False), so concurrent workers
    may overshoot the trial total by up to one trial each.
    """

    _memory_lock = threading.Lock()
    _warned: ClassVar[set[str]] = set()

    def __init__(self, url: str, study_name: str) -> None:
        parsed = make_url(url)
        self.backend = parsed.get_backend_name()
        self._fd: int | None = None
        self._conn: Any = None
        self._engine: Any = None
        self.exclusive = True
        if self.backend == "sqlite" and not in_memory(url):
            self._kind = "file"
            self._path = f"{parsed.database}.claims.lock"
        elif self.backend == "sqlite":
            self._kind = "memory"
        elif self.backend == "postgresql":
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            self._kind = "postgres"
            self._key = int.from_bytes(hashlib.sha256(f"peagle:{study_name}".encode()).digest()[:8], "big", signed=True)
            self._engine = create_engine(parsed, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        else:
            self._kind = "none"
            self.exclusive = False
            if self.backend not in self._warned:
                self._warned.add(self.backend)
                log.warning(
                    "No cross-worker lock for %s databases: concurrent workers may overshoot --trials by up to one "
                    "trial each. Use SQLite or PostgreSQL for shared studies.",
                    self.backend,
                )

    def __enter__(self) -> ClaimLock:
        if self._kind == "file":
            import fcntl

            try:  # never through a planted link (to someone's file, which we would create or lock)
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as exc:
                link = os.path.islink(self._path)
                raise StudyStorageError(
                    f"Cannot use the claim lock {self._path}: "
                    + ("it is a symbolic link; peagle-tune creates this file itself: remove the link."
                       if link else f"{exc.strerror or exc}; check that the database's folder is writable.")
                ) from None
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        elif self._kind == "memory":
            self._memory_lock.acquire()
        elif self._kind == "postgres":
            from sqlalchemy import text

            self._conn = self._engine.connect()
            self._conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._kind == "file" and self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        elif self._kind == "memory":
            self._memory_lock.release()
        elif self._kind == "postgres" and self._conn is not None:
            from sqlalchemy import text

            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
            finally:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


class Heartbeat(AbstractContextManager["Heartbeat"]):
    """Records the trial's heartbeat every `interval` seconds while it is measured (a killed worker stops it)."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: int) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peagle-heartbeat-{trial_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # a missed beat only risks a retry; never kill the measurement for it
                log.warning("heartbeat of trial %s failed: %s", self._trial_id, exc)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()


def open_storage(
    url: str, heartbeat_interval: int = 60, grace_period: int | None = None, option: str = "--storage"
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage for `url`, with heartbeats (a trial whose worker stops beating for `grace_period`
    seconds, default 2 x interval, becomes FAIL and is re-queued up to `MAX_RETRIES` times).

    SQLite files get a 30 s lock timeout (or the URL's ``?timeout=SECONDS``, as for the store) and
    ``synchronous=NORMAL`` (WAL keeps every committed trial across a process crash; only an OS crash can lose the last
    commits), which makes each trial's commits cheap. Workers starting together on a fresh database would race to
    create Optuna's tables, so this runs under a claim lock.
    """
    setup_lock = ClaimLock(url, "optuna-schema")
    try:
        with setup_lock:
            return _open_storage(url, heartbeat_interval, grace_period, option)
    finally:
        setup_lock.close()


def _open_storage(
    url: str, heartbeat_interval: int, grace_period: int | None, option: str
) -> optuna.storages.RDBStorage:
    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    memory = in_memory(url)
    timeout_s = _lock_timeout_s(parsed.query.get("timeout"))
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": timeout_s}} if sqlite else {"pool_pre_ping": True}
    if memory:
        # One shared connection, or every pooled connection would see its own empty database (the study lives
        # as long as this storage: in-memory studies cannot be resumed).
        from sqlalchemy.pool import StaticPool

        engine_kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=MAX_RETRIES
                ),
            )
        except STORAGE_ERRORS as exc:
            raise storage_error(exc, url, option) from exc
        except (ImportError, RuntimeError, ValueError) as exc:
            raise StudyStorageError(
                f"Cannot open the Optuna storage {mask_password(url)}: {str(exc).splitlines()[0]}. Check --storage "
                "(a SQLAlchemy URL such as postgresql://user@host/db; the database must exist and be reachable) or "
                "leave it out to keep studies in the --db database."
            ) from exc
    if sqlite and not memory:

        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout={round(timeout_s * 1000)}")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", _pragmas)
        storage.engine.dispose()  # reconnect with the pragmas
    return storage


def _lock_timeout_s(value: Any) -> float:
    """Seconds a SQLite storage waits for another writer's lock: the URL's ``?timeout=`` (checked by the store when
    the URL is --db), else 30."""
    try:
        seconds = float(value) if isinstance(value, str) else 30.0
    except ValueError:
        return 30.0
    return seconds if 0 <= seconds <= 3600 else 30.0


def fail_orphans(
    study: optuna.Study, storage: optuna.storages.BaseStorage, lock: ClaimLock, trials: Sequence[FrozenTrial]
) -> bool:
    """Fail (and re-queue) RUNNING trials whose worker is gone: a worker on this host whose process is dead, or
    (while we hold an exclusive claim lock) a trial claimed without our attributes, i.e. a worker that died
    inside its claim. Workers on other hosts are left to the heartbeat. Returns True when a trial was failed."""
    me = this_worker()
    failed = False
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        worker = trial_info(t).get("worker")
        if worker is None:
            dead = lock.exclusive
        else:
            local = worker.get("host") == me["host"] and worker.get("boot") == me["boot"]
            dead = local and worker.get("pid") != me["pid"] and not _process_alive(int(worker.get("pid", 0)))
        if not dead:
            continue
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                log.warning(
                    "Trial %s of study %s was left running by a worker that is gone; it is re-queued.",
                    t.number, study.study_name,
                )
                requeue(study, storage, t._trial_id)
                failed = True
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    return failed
