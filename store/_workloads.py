"""The workloads table: request sets identified by their content hash (the name and classes of the first call stay)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from store import _validate as v
from store._models import Workload, utcnow
from store._records import WorkloadRecord
from store._rows import Repository, get_or_create, get_row, record_of


class Workloads(Repository):
    def workload_id(self, name: str, *, content_hash: str, classes: Sequence[str], source: str = "") -> int:
        """Id of the workload with this content hash, created if new (name/classes/source of the first call stay)."""
        v.text("workload name", name)
        v.text("workload content_hash", content_hash, limit=v.HASH_CHARS)
        class_list = v.string_list("workload classes", classes)
        v.text("workload source", source, limit=None, required=False, name=False)
        with self._session() as session:
            row, _ = get_or_create(
                session,
                select(Workload).where(Workload.content_hash == content_hash),
                lambda: Workload(
                    name=name, content_hash=content_hash, classes=class_list, source=source, created_at=utcnow()
                ),
            )
            return row.id

    def get_workload(self, workload_id: int) -> WorkloadRecord:
        with self._session() as session:
            row = get_row(session, Workload, workload_id, f"No workload with id {workload_id}.")
            return record_of(WorkloadRecord, row)
