"""The profiles table: measured (or live) acceptance counts and step costs, read back with their environment and
workload flattened into one `ProfileRecord`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, select

from store import _validate as v
from store._bad_rows import checked, first_readable, readable
from store._environments import environment_record
from store._models import PROFILE_KINDS, Environment, Profile, Workload, utcnow
from store._records import ProfileRecord
from store._rows import Repository, get_row, limited, record_of, where_given


class Profiles(Repository):
    def add_profile(
        self,
        model: str,
        *,
        method: str,
        max_k: int,
        environment_id: int,
        acceptance: Mapping[str, Any],
        step_costs: Sequence[Mapping[str, Any]],
        drafter: str | None = None,
        drafter_layers: int | None = None,
        parallel_drafting: bool = False,
        workload_id: int | None = None,
        cost_model: Mapping[str, Any] | None = None,
        kind: str = "measured",
        notes: Mapping[str, Any] | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store a profile; returns its id.

        acceptance: {class: {"num_drafts": int, "accepted_per_position": [int, ...]}} (measured counts).
        step_costs: [{"batch_size": int, "depth": int, "step_ms": float (ms, measured mean), "n": int}].
        environment_id / workload_id: from `environment_id()` / `workload_id()`.
        """
        row = Profile(
            model=v.text("model", model),
            drafter=v.optional_text("drafter", drafter),
            drafter_layers=v.optional_integer("drafter_layers", drafter_layers, minimum=1),
            method=v.text("method", method, limit=v.SHORT_CHARS),
            parallel_drafting=bool(parallel_drafting),
            max_k=v.integer("max_k", max_k, minimum=0),
            environment_id=v.integer("environment_id", environment_id, minimum=1),
            workload_id=v.optional_integer("workload_id", workload_id, minimum=1),
            acceptance=v.acceptance(acceptance),
            step_costs=v.step_costs(step_costs),
            cost_model=None if cost_model is None else v.json_dict("cost_model", cost_model),
            kind=v.choice("kind", kind, PROFILE_KINDS),
            notes=v.json_dict("notes", notes),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            get_row(
                session,
                Environment,
                row.environment_id,
                f"No environment with id {row.environment_id}; get one with environment_id(info) first.",
            )
            if row.workload_id is not None:
                get_row(
                    session,
                    Workload,
                    row.workload_id,
                    f"No workload with id {row.workload_id}; get one with workload_id(...) first.",
                )
            session.add(row)
            session.flush()
            return row.id

    def get_profile(self, profile_id: int) -> ProfileRecord:
        with self._session() as session:
            missing = f"No profile with id {profile_id}. List them with `peagle-tune show --profiles`."
            return profile_record(get_row(session, Profile, profile_id, missing))

    def list_profiles(
        self, model: str | None = None, *, drafter: str | None = None, limit: int | None = None
    ) -> list[ProfileRecord]:
        """Profiles (filtered by model/drafter if given), newest first."""
        query = limited(_newest_first(model=model, drafter=drafter), limit)
        with self._session() as session:
            return list(readable(session.scalars(query).unique(), profile_record, self._bad_row))

    def latest_profile(
        self,
        model: str,
        *,
        drafter: str | None = None,
        device: str | None = None,
        workload_hash: str | None = None,
        kind: str | None = None,
    ) -> ProfileRecord | None:
        """The newest profile of `model` matching every filter given, or None if there is none."""
        query = _newest_first(model=model, drafter=drafter, device=device, workload_hash=workload_hash, kind=kind)
        with self._session() as session:
            return first_readable(session, query, profile_record, self._bad_row)


def _newest_first(
    *,
    model: str | None = None,
    drafter: str | None = None,
    device: str | None = None,
    workload_hash: str | None = None,
    kind: str | None = None,
) -> Select[Profile]:
    """Profiles matching every filter given, newest first (the later insert first on equal timestamps)."""
    if kind is not None:
        v.choice("kind", kind, PROFILE_KINDS)
    return where_given(
        select(Profile).order_by(Profile.created_at.desc(), Profile.id.desc()),
        (model, Profile.model == model),
        (drafter, Profile.drafter == drafter),
        (device, Profile.environment.has(Environment.device == device)),
        (workload_hash, Profile.workload.has(Workload.content_hash == workload_hash)),
        (kind, Profile.kind == kind),
    )


def profile_record(row: Profile) -> ProfileRecord:
    """The record of a profile row, with its environment's and workload's identifying fields flattened in."""
    env = environment_record(row.environment)
    workload = None if row.workload is None else checked(row.workload)
    return record_of(
        ProfileRecord,
        row,
        device=env.device,
        gpu_count=env.gpu_count,
        driver=env.driver,
        vllm_version=env.vllm_version,
        torch_version=env.torch_version,
        workload_name=None if workload is None else workload.name,
        workload_hash=None if workload is None else workload.content_hash,
    )
