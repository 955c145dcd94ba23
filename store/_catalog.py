"""The models and drafters tables: what a user registers by name (created on the first upsert, updated after)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, TypeVar

from sqlalchemy import select

from store import _validate as v
from store._bad_rows import readable
from store._models import Drafter, Model, utcnow
from store._records import DrafterRecord, ModelRecord
from store._rows import Repository, get_or_create, named_row, record_of, set_given, where_given

NamedT = TypeVar("NamedT", Model, Drafter)


class _Named(Repository):
    """A table of rows registered by a unique name, each with an ``info`` JSON dict (models, drafters)."""

    def _upsert(self, table: type[NamedT], name: str, **values: Any) -> int:
        """Create the row named `name` or update it; returns its id. A None value keeps the stored one (a new row
        gets the column's default, {} for info)."""
        given = {key: value for key, value in values.items() if value is not None}
        now = utcnow()
        with self._session() as session:
            row, created = get_or_create(
                session,
                select(table).filter_by(name=name),
                lambda: table(name=name, **{"info": {}, **given}, created_at=now, updated_at=now),
            )
            if not created:
                set_given(row, **given, updated_at=now)
            return row.id


class Models(_Named):
    def upsert_model(self, name: str, *, hf_id: str | None = None, info: Mapping[str, Any] | None = None) -> int:
        """Create or update the model `name`; returns its id. None arguments keep the stored value."""
        v.text("model name", name)
        hf = v.optional_text("hf_id", hf_id)
        return self._upsert(Model, name, hf_id=hf, info=None if info is None else v.json_dict("info", info))

    def get_model(self, name: str) -> ModelRecord:
        with self._session() as session:
            missing = f"No model named {name!r} in the store. Register it with upsert_model()."
            return record_of(ModelRecord, named_row(session, Model, name, missing))


class Drafters(_Named):
    def upsert_drafter(
        self,
        name: str,
        *,
        target: str,
        method: str,
        layers: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> int:
        """Create or update the drafter `name` (for target model `target`); returns its id.

        target and method are always written; None layers/info keep the stored value.
        """
        v.text("drafter name", name)
        v.text("drafter target", target)
        v.text("drafter method", method, limit=v.SHORT_CHARS)
        return self._upsert(
            Drafter,
            name,
            target=target,
            method=method,
            layers=v.optional_integer("drafter layers", layers, minimum=1),
            info=None if info is None else v.json_dict("info", info),
        )

    def get_drafter(self, name: str) -> DrafterRecord:
        with self._session() as session:
            missing = f"No drafter named {name!r} in the store. Register it with upsert_drafter()."
            return record_of(DrafterRecord, named_row(session, Drafter, name, missing))

    def list_drafters(self, target: str | None = None) -> list[DrafterRecord]:
        """Drafters (of `target` if given), by name."""
        query = where_given(select(Drafter).order_by(Drafter.name), (target, Drafter.target == target))
        with self._session() as session:
            return list(readable(session.scalars(query), functools.partial(record_of, DrafterRecord), self._bad_row))
