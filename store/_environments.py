"""The environments table: the hardware and software a profile was measured on, one row per distinct set of values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from store import _validate as v
from store._models import Environment, utcnow
from store._records import EnvironmentRecord
from store._rows import Repository, get_or_create, get_row, record_of


class Environments(Repository):
    def environment_id(self, info: Mapping[str, Any]) -> int:
        """Id of the environment with exactly these values, created if new.

        `info` keys: device ("cpu" or GPU name, required), gpu_count, driver, vllm_version, torch_version.
        Unknown keys raise `InvalidRecordError`; missing optional keys count as unknown ('' / 0).
        """
        values = v.environment(info)
        with self._session() as session:
            row, _ = get_or_create(
                session, select(Environment).filter_by(**values), lambda: Environment(**values, created_at=utcnow())
            )
            return row.id

    def get_environment(self, environment_id: int) -> EnvironmentRecord:
        with self._session() as session:
            row = get_row(session, Environment, environment_id, f"No environment with id {environment_id}.")
            return environment_record(row)


def environment_record(row: Environment) -> EnvironmentRecord:
    """The record of an environment row: unknown text fields ('' in the table) come back as None."""
    return record_of(
        EnvironmentRecord,
        row,
        driver=row.driver or None,
        vllm_version=row.vllm_version or None,
        torch_version=row.torch_version or None,
    )
