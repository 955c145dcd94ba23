"""peagle-tune's store: profiles, trials and recommendations in SQLite (PostgreSQL for fleets).

Tables are named ``peagle_*`` and versioned by Alembic in `peagle_alembic_version`, so Optuna can keep its study
in the same database (``optuna.create_study(storage=store.url)``). Configs and metrics are stored as JSON dicts.
"""

from __future__ import annotations

from store._migrate import head_revision
from store._records import (
    BenchmarkRecord,
    DrafterRecord,
    EnvironmentRecord,
    ModelRecord,
    ProfileRecord,
    RecommendationRecord,
    StudySummary,
    TrialRecord,
    WorkloadRecord,
)
from store._store import Store, upgrade
from store._studies import Direction
from store._translate import database_error
from store._url import (
    DB_ENV_VAR,
    default_db_url,
    is_sqlite_memory,
    mask_password,
    normalize_db_url,
    parse_db_url,
    sqlite_file,
)
from store._validate import NAME_CHARS as MAX_NAME_CHARS
from store.exceptions import (
    BadRowError,
    BadRowWarning,
    DatabaseCorruptError,
    DatabaseFullError,
    DatabaseLockedError,
    DatabaseUnavailableError,
    DuplicateRecordError,
    InvalidRecordError,
    RowNotFoundError,
    StaleSchemaError,
    StoreError,
)

__all__ = [
    "BadRowError",
    "BenchmarkRecord",
    "BadRowWarning",
    "DB_ENV_VAR",
    "DatabaseCorruptError",
    "DatabaseFullError",
    "DatabaseLockedError",
    "DatabaseUnavailableError",
    "Direction",
    "DuplicateRecordError",
    "DrafterRecord",
    "EnvironmentRecord",
    "InvalidRecordError",
    "MAX_NAME_CHARS",
    "ModelRecord",
    "ProfileRecord",
    "RecommendationRecord",
    "RowNotFoundError",
    "StaleSchemaError",
    "Store",
    "StoreError",
    "StudySummary",
    "TrialRecord",
    "WorkloadRecord",
    "database_error",
    "default_db_url",
    "head_revision",
    "mask_password",
    "is_sqlite_memory",
    "normalize_db_url",
    "parse_db_url",
    "sqlite_file",
    "upgrade",
]
