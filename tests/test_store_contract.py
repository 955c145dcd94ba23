"""Contract of `store.Store`, run on every backend: SQLite in memory, SQLite file and PostgreSQL.

PostgreSQL runs when PEAGLE_TEST_POSTGRES_URL is set (its peagle_* tables are dropped before and after each test).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from store import (
    InvalidRecordError,
    ProfileRecord,
    RecommendationRecord,
    RowNotFoundError,
    Store,
    StoreError,
    TrialRecord,
)
from store import _validate as v
from store._models import Environment, utcnow
from store._rows import get_or_create
from store.testing import database_url

BACKENDS = [
    pytest.param("sqlite-memory", id="sqlite-memory"),
    pytest.param("sqlite-file", id="sqlite-file"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

H200 = {"device": "NVIDIA H200", "gpu_count": 1, "driver": "570.86", "vllm_version": "0.16.0", "torch_version": "2.9"}
CPU = {"device": "cpu", "vllm_version": "0.32.0", "torch_version": "2.13.0+cpu"}

# Counts in the shape vLLM's per-position counter gives them (measured on CPU, see DESIGN.md: [202, 14, 0, 0]).
ACCEPTANCE = {
    "code": {"num_drafts": 300, "accepted_per_position": [202, 14, 0, 0]},
    "chat": {"num_drafts": 120, "accepted_per_position": [50, 9, 1, 0]},
}
STEP_COSTS = [
    {"batch_size": 1, "depth": 0, "step_ms": 11.5, "n": 40},
    {"batch_size": 1, "depth": 4, "step_ms": 13.25, "n": 40},
    {"batch_size": 8, "depth": 4, "step_ms": 19.0, "n": 32},
]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path, "the store contract")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as opened:
        yield opened


def _profile(store: Store, *, created_at: dt.datetime | None = None, **overrides: object) -> int:
    env = store.environment_id(H200)
    workload = store.workload_id("mt-bench", content_hash="hash-mt", classes=["chat", "code"])
    kwargs: dict[str, object] = {
        "drafter": "amazon/GPT-OSS-20B-P-EAGLE",
        "drafter_layers": 4,
        "method": "eagle3",
        "parallel_drafting": True,
        "max_k": 4,
        "environment_id": env,
        "workload_id": workload,
        "acceptance": ACCEPTANCE,
        "step_costs": STEP_COSTS,
        "created_at": created_at,
    }
    kwargs.update(overrides)
    model = str(kwargs.pop("model", "openai/gpt-oss-20b"))
    return store.add_profile(model, **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ environments


def test_environment_is_get_or_create_by_all_its_values(store: Store) -> None:
    first = store.environment_id(H200)
    assert store.environment_id(dict(H200)) == first
    newer_vllm = store.environment_id({**H200, "vllm_version": "0.17.0"})
    assert newer_vllm != first
    # Missing optional keys are one identity too (stored as '' so the unique constraint sees them as equal).
    cpu = store.environment_id(CPU)
    assert store.environment_id(CPU) == cpu

    record = store.get_environment(cpu)
    assert (record.device, record.gpu_count, record.driver) == ("cpu", 0, None)
    assert (record.vllm_version, record.torch_version) == ("0.32.0", "2.13.0+cpu")
    full = store.get_environment(first)
    assert full.to_dict() | {"created_at": None} == {**H200, "id": first, "created_at": None}


def test_environment_rejects_unknown_keys_and_missing_device(store: Store) -> None:
    with pytest.raises(InvalidRecordError, match=r"Unknown environment keys \['gpu'\]"):
        store.environment_id({"device": "cpu", "gpu": "H100"})
    with pytest.raises(InvalidRecordError, match="device must be a non-empty string"):
        store.environment_id({"gpu_count": 1})


# ------------------------------------------------------------------------------------------- models / drafters


def test_upsert_model_creates_then_updates_only_given_fields(store: Store) -> None:
    model_id = store.upsert_model("gpt-oss-20b", hf_id="openai/gpt-oss-20b", info={"params_b": 21})
    assert store.upsert_model("gpt-oss-20b", info={"params_b": 21, "moe": True}) == model_id
    record = store.get_model("gpt-oss-20b")
    assert record.hf_id == "openai/gpt-oss-20b"  # kept: the update passed hf_id=None
    assert record.info == {"params_b": 21, "moe": True}
    with pytest.raises(RowNotFoundError, match="upsert_model"):
        store.get_model("unknown")


def test_upsert_drafter_and_list_by_target(store: Store) -> None:
    store.upsert_drafter("p-eagle-20b", target="gpt-oss-20b", method="eagle3", layers=4, info={"trained_k": 10})
    store.upsert_drafter("eagle3-20b", target="gpt-oss-20b", method="eagle3", layers=1)
    store.upsert_drafter("p-eagle-120b", target="gpt-oss-120b", method="eagle3", layers=4)
    again = store.upsert_drafter("p-eagle-20b", target="gpt-oss-20b", method="eagle3")
    assert again == store.get_drafter("p-eagle-20b").id

    record = store.get_drafter("p-eagle-20b")
    assert (record.target, record.method, record.layers, record.info) == ("gpt-oss-20b", "eagle3", 4, {"trained_k": 10})
    assert [d.name for d in store.list_drafters(target="gpt-oss-20b")] == ["eagle3-20b", "p-eagle-20b"]
    assert len(store.list_drafters()) == 3


# ------------------------------------------------------------------------------------------------- workloads


def test_workload_is_get_or_create_by_content_hash(store: Store) -> None:
    first = store.workload_id("mt-bench", content_hash="abc", classes=["chat"], source="builtin")
    # Same content under another name: same workload, the first name stays.
    assert store.workload_id("renamed", content_hash="abc", classes=["chat"]) == first
    other = store.workload_id("humaneval", content_hash="def", classes=["code"])
    assert other != first
    record = store.get_workload(first)
    assert (record.name, record.content_hash, record.classes, record.source) == ("mt-bench", "abc", ["chat"], "builtin")
    with pytest.raises(InvalidRecordError, match="classes must be a list of strings"):
        store.workload_id("bad", content_hash="x", classes=[1, 2])  # type: ignore[list-item]


# -------------------------------------------------------------------------------------------------- profiles


def test_profile_round_trip_with_flattened_environment_and_workload(store: Store) -> None:
    cost_model = {"kind": "linear", "alpha_ms": 11.5, "beta_ms_per_token": 0.2}
    profile_id = _profile(store, cost_model=cost_model, notes={"engine_launches": 1}, created_at=T0)
    record = store.get_profile(profile_id)

    assert isinstance(record, ProfileRecord)
    assert (record.model, record.drafter, record.drafter_layers) == (
        "openai/gpt-oss-20b",
        "amazon/GPT-OSS-20B-P-EAGLE",
        4,
    )
    assert (record.method, record.parallel_drafting, record.max_k, record.kind) == ("eagle3", True, 4, "measured")
    assert record.acceptance == ACCEPTANCE
    assert record.step_costs == STEP_COSTS
    assert record.cost_model == cost_model
    assert record.notes == {"engine_launches": 1}
    assert (record.device, record.gpu_count, record.driver) == ("NVIDIA H200", 1, "570.86")
    assert (record.vllm_version, record.torch_version) == ("0.16.0", "2.9")
    assert (record.workload_name, record.workload_hash) == ("mt-bench", "hash-mt")
    assert record.created_at == T0
    # to_dict is what `peagle-tune show --json` prints: it must survive json.
    assert json.loads(json.dumps(record.to_dict()))["created_at"] == "2026-01-01T12:00:00+00:00"


def test_profile_without_workload_or_cost_model(store: Store) -> None:
    env = store.environment_id(CPU)
    profile_id = store.add_profile(
        "tiny-llama",
        method="draft_model",
        max_k=2,
        environment_id=env,
        acceptance={"all": {"num_drafts": 10, "accepted_per_position": [10, 10]}},
        step_costs=[],
        kind="live",
    )
    record = store.get_profile(profile_id)
    assert (record.drafter, record.workload_id, record.workload_name, record.cost_model) == (None, None, None, None)
    assert (record.device, record.driver, record.kind) == ("cpu", None, "live")


def test_list_profiles_is_newest_first_and_filters(store: Store) -> None:
    old = _profile(store, created_at=T0)
    new = _profile(store, created_at=T0 + dt.timedelta(hours=1))
    # Same timestamp as `new`: the later insert counts as newer.
    tie = _profile(store, created_at=T0 + dt.timedelta(hours=1), drafter="eagle3-2l", drafter_layers=2)
    other_model = _profile(store, model="openai/gpt-oss-120b", created_at=T0 + dt.timedelta(hours=2))

    assert [p.id for p in store.list_profiles()] == [other_model, tie, new, old]
    assert [p.id for p in store.list_profiles("openai/gpt-oss-20b")] == [tie, new, old]
    assert [p.id for p in store.list_profiles(drafter="eagle3-2l")] == [tie]
    assert [p.id for p in store.list_profiles(limit=2)] == [other_model, tie]


def test_latest_profile_applies_every_filter(store: Store) -> None:
    h200_chat = _profile(store, created_at=T0)
    cpu_env = store.environment_id(CPU)
    code = store.workload_id("humaneval", content_hash="hash-code", classes=["code"])
    cpu_code = _profile(store, environment_id=cpu_env, workload_id=code, created_at=T0 + dt.timedelta(minutes=5))
    live = _profile(store, kind="live", created_at=T0 + dt.timedelta(minutes=10))

    model = "openai/gpt-oss-20b"
    assert _id(store.latest_profile(model)) == live
    assert _id(store.latest_profile(model, kind="measured")) == cpu_code
    assert _id(store.latest_profile(model, device="NVIDIA H200", kind="measured")) == h200_chat
    assert _id(store.latest_profile(model, workload_hash="hash-code")) == cpu_code
    assert _id(store.latest_profile(model, device="cpu", workload_hash="hash-mt")) is None
    assert store.latest_profile(model, drafter="no-such-drafter") is None
    assert store.latest_profile("no-such-model") is None


def _id(record: ProfileRecord | RecommendationRecord | None) -> int | None:
    return None if record is None else record.id


def test_profile_needs_existing_environment_and_workload(store: Store) -> None:
    with pytest.raises(RowNotFoundError, match="No environment with id 999"):
        _profile(store, environment_id=999)
    with pytest.raises(RowNotFoundError, match="No workload with id 999"):
        _profile(store, workload_id=999)
    assert store.list_profiles() == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"acceptance": {"chat": {"num_drafts": 3}}}, r"acceptance\['chat'\]\['accepted_per_position'\]"),
        ({"acceptance": {"chat": {"num_drafts": -1, "accepted_per_position": []}}}, "num_drafts'] must be an integer"),
        ({"step_costs": [{"batch_size": 0, "depth": 1, "step_ms": 1.0, "n": 1}]}, r"batch_size'\] must be an integer"),
        (
            {"step_costs": [{"batch_size": 1, "depth": 1, "step_ms": float("nan"), "n": 1}]},
            r"step_costs\[0\]\[.step_ms.\] must be JSON",
        ),
        ({"notes": {"gain": float("inf")}}, r"notes\[.gain.\] must be JSON .* but it is inf"),
        ({"notes": {"when": dt.date(2026, 1, 1)}}, r"notes\[.when.\] must be JSON .*\(date\)"),
        ({"kind": "predicted"}, "kind must be one of measured, live"),
        ({"max_k": -1}, "max_k must be an integer >= 0"),
    ],
)
def test_profile_rejects_malformed_values(store: Store, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        _profile(store, **overrides)
    assert store.list_profiles() == []


def test_get_profile_unknown_id(store: Store) -> None:
    with pytest.raises(RowNotFoundError, match="No profile with id 42"):
        store.get_profile(42)


# ---------------------------------------------------------------------------------------------------- trials


def _trial(store: Store, number: int, **overrides: object) -> int:
    kwargs: dict[str, object] = {
        "number": number,
        "model": "openai/gpt-oss-20b",
        "config": {"method": "eagle3", "num_speculative_tokens": number + 1, "parallel_drafting": True},
        "scenario": {"concurrency": 8},
        "values": {"throughput": 100.0 + number},
        "metrics": {"tpot_ms_p50": 9.5},
        "backend": "model",
        "provenance": {"kind": "predicted", "backend": "model", "device": "NVIDIA H200"},
    }
    kwargs.update(overrides)
    study = str(kwargs.pop("study", "s1"))
    return store.add_trial(study, **kwargs)  # type: ignore[arg-type]


def test_trial_round_trip_and_update(store: Store) -> None:
    trial_id = _trial(store, 0, status="running", values={}, created_at=T0)
    record = store.get_trial(trial_id)
    assert isinstance(record, TrialRecord)
    assert (record.study, record.number, record.status, record.values) == ("s1", 0, "running", {})
    assert record.config == {"method": "eagle3", "num_speculative_tokens": 1, "parallel_drafting": True}
    assert (record.scenario, record.backend, record.created_at) == ({"concurrency": 8}, "model", T0)

    store.update_trial(trial_id, status="complete", values={"throughput": 812.5}, metrics={"tpot_ms_p50": 8.0})
    record = store.get_trial(trial_id)
    assert (record.status, record.values, record.metrics) == ("complete", {"throughput": 812.5}, {"tpot_ms_p50": 8.0})
    assert record.provenance["kind"] == "predicted"  # not passed to update_trial: kept

    failed = _trial(store, 1, status="failed", values={}, failure_reason="CUDA out of memory at K=8")
    assert store.get_trial(failed).failure_reason == "CUDA out of memory at K=8"
    with pytest.raises(RowNotFoundError):
        store.update_trial(9999, status="failed")


def test_trial_number_is_unique_per_study(store: Store) -> None:
    first = _trial(store, 3)
    with pytest.raises(InvalidRecordError, match=rf"Trial 3 of study 's1' is already stored \(id {first}\)"):
        _trial(store, 3)
    _trial(store, 3, study="s2")  # same number, other study: fine
    assert len(store.list_trials()) == 2


def test_trial_rejects_bad_status_and_non_finite_values(store: Store) -> None:
    with pytest.raises(InvalidRecordError, match="status must be one of complete, failed, pruned, running"):
        _trial(store, 0, status="done")
    with pytest.raises(InvalidRecordError, match=r"values\['throughput'\] must be a finite number"):
        _trial(store, 0, values={"throughput": float("nan")})


def test_list_trials_orders_by_study_then_number_and_filters(store: Store) -> None:
    _trial(store, 2, study="b")
    _trial(store, 0, study="b")
    _trial(store, 1, study="a", model="openai/gpt-oss-120b", status="pruned")
    _trial(store, 1, study="b", status="failed", values={})

    assert [(t.study, t.number) for t in store.list_trials()] == [("a", 1), ("b", 0), ("b", 1), ("b", 2)]
    assert [t.number for t in store.list_trials("b")] == [0, 1, 2]
    assert [t.study for t in store.list_trials(model="openai/gpt-oss-120b")] == ["a"]
    assert [(t.study, t.number) for t in store.list_trials(status="failed")] == [("b", 1)]


def test_list_studies_counts_and_best_values(store: Store) -> None:
    # Study "tp": throughput 100, 130, 130 (tie: the earlier trial 1 wins), a failed and a pruned trial.
    _trial(store, 0, study="tp", values={"throughput": 100.0, "tpot_ms_p99": 30.0}, created_at=T0)
    _trial(store, 1, study="tp", values={"throughput": 130.0, "tpot_ms_p99": 25.0}, created_at=T0)
    _trial(store, 2, study="tp", values={"throughput": 130.0, "tpot_ms_p99": 40.0}, created_at=T0)
    # Not complete: its 999 must not count as best.
    _trial(store, 3, study="tp", values={"throughput": 999.0}, status="pruned", created_at=T0)
    _trial(store, 4, study="tp", values={}, status="failed", created_at=T0 + dt.timedelta(minutes=1))
    _trial(store, 0, study="later", created_at=T0 + dt.timedelta(hours=1))

    summaries = store.list_studies(directions={"throughput": "maximize", "tpot_ms_p99": "minimize"})
    assert [s.study for s in summaries] == ["later", "tp"]  # most recently active first
    tp = summaries[1]
    assert (tp.n_trials, tp.n_complete, tp.n_failed, tp.n_pruned, tp.n_running) == (5, 3, 1, 1, 0)
    # throughput is maximised (max 130 first reached by trial 1); tpot_ms_p99 is minimised: min 25 at trial 1.
    assert tp.best_values == {"throughput": 130.0, "tpot_ms_p99": 25.0}
    assert tp.best_trial_numbers == {"throughput": 1, "tpot_ms_p99": 1}
    assert (tp.first_created_at, tp.last_created_at) == (T0, T0 + dt.timedelta(minutes=1))

    # The direction is the caller's: maximised, the largest tpot is 40 at trial 2.
    tp_max = store.list_studies(directions={"tpot_ms_p99": "maximize"})[1]
    assert (tp_max.best_values, tp_max.best_trial_numbers) == ({"tpot_ms_p99": 40.0}, {"tpot_ms_p99": 2})


def test_list_studies_never_guesses_a_direction(store: Store) -> None:
    # Neither name decides: without a direction an objective has no best value, only the counts.
    _trial(store, 0, study="s", values={"throughput": 100.0, "latency_ms": 9.0})
    summary = store.list_studies()[0]
    assert (summary.n_complete, summary.best_values, summary.best_trial_numbers) == (1, {}, {})
    with pytest.raises(InvalidRecordError, match=r"directions\['latency_ms'\] must be one of maximize, minimize"):
        store.list_studies(directions={"latency_ms": "lower"})  # type: ignore[dict-item]


# ------------------------------------------------------------------------------------------- recommendations


def _recommendation(store: Store, created_at: dt.datetime, **overrides: object) -> int:
    kwargs: dict[str, object] = {
        "gpu": "NVIDIA H200",
        "objective": "throughput",
        "best_config": {"method": "eagle3", "num_speculative_tokens": 7, "parallel_drafting": True},
        "scenario": {"concurrency": 1},
        "metrics": {"output_tokens_per_s": 412.0},
        "provenance": {"kind": "measured", "backend": "vllm", "torch_version": "2.9"},
        "pareto": [{"k": 5, "throughput": 400.0, "tpot_ms_p99": 9.0}],
        "schedule": [[1, 7], [16, 5], [64, 3]],
        "class_policy": {"chat": {"max_k": 3}},
        "vllm_version": "0.16.0",
        "workload_name": "mt-bench",
        "workload_hash": "hash-mt",
        "study": "s1",
        "created_at": created_at,
    }
    kwargs.update(overrides)
    model = str(kwargs.pop("model", "openai/gpt-oss-20b"))
    return store.add_recommendation(model, **kwargs)  # type: ignore[arg-type]


def test_recommendation_round_trip(store: Store) -> None:
    rec_id = _recommendation(store, T0)
    record = store.get_recommendation(rec_id)
    assert isinstance(record, RecommendationRecord)
    assert (record.model, record.gpu, record.device, record.objective) == (
        "openai/gpt-oss-20b",
        "NVIDIA H200",
        "NVIDIA H200",
        "throughput",
    )
    assert record.best_config == {"method": "eagle3", "num_speculative_tokens": 7, "parallel_drafting": True}
    assert record.schedule == [[1, 7], [16, 5], [64, 3]]  # JSON keeps lists
    assert record.pareto == [{"k": 5, "throughput": 400.0, "tpot_ms_p99": 9.0}]
    assert record.class_policy == {"chat": {"max_k": 3}}
    assert (record.vllm_version, record.torch_version) == ("0.16.0", "2.9")
    assert (record.workload_name, record.workload_hash, record.study) == ("mt-bench", "hash-mt", "s1")
    assert record.created_at == T0


def test_recommendations_newest_first_and_latest_filters(store: Store) -> None:
    a = _recommendation(store, T0)
    b = _recommendation(store, T0 + dt.timedelta(hours=1), objective="latency")
    c = _recommendation(store, T0 + dt.timedelta(hours=2), gpu="cpu", workload_hash="hash-code")
    d = _recommendation(store, T0 + dt.timedelta(hours=3), model="openai/gpt-oss-120b")

    assert [r.id for r in store.list_recommendations()] == [d, c, b, a]
    assert [r.id for r in store.list_recommendations("openai/gpt-oss-20b", limit=2)] == [c, b]
    assert _id(store.latest_recommendation()) == d
    assert _id(store.latest_recommendation("openai/gpt-oss-20b")) == c
    assert _id(store.latest_recommendation("openai/gpt-oss-20b", gpu="NVIDIA H200")) == b
    assert _id(store.latest_recommendation(gpu="NVIDIA H200", objective="throughput")) == d
    assert _id(store.latest_recommendation("openai/gpt-oss-20b", objective="throughput", workload_hash="hash-mt")) == a
    assert store.latest_recommendation("openai/gpt-oss-20b", gpu="NVIDIA B200") is None


def test_get_recommendation_unknown_id_says_how_to_list(store: Store) -> None:
    with pytest.raises(RowNotFoundError) as info:
        store.get_recommendation(7)
    assert str(info.value) == "No recommendation with id 7. List them with `peagle-tune show`."


# ---------------------------------------------------------------------------------------- concurrent writers


@pytest.fixture
def other_writer(store: Store, db_url: str) -> Iterator[Store]:
    """A second writer on the same database (an in-memory database lives in one Store, so there: the same one)."""
    if db_url == "sqlite://":
        yield store
        return
    with Store(db_url) as other:
        yield other


def test_get_or_create_returns_the_row_a_concurrent_writer_inserted_first(store: Store, other_writer: Store) -> None:
    # The race behind environment_id, workload_id, upsert_model/drafter and add_trial: our SELECT misses, another
    # worker inserts the same row, then our INSERT breaks the unique constraint. We must get the winner's row.
    values = v.environment(CPU)
    winner: list[int] = []

    def create_after_the_other_writer() -> Environment:
        winner.append(other_writer.environment_id(CPU))
        return Environment(**values, created_at=utcnow())

    with store._session() as session:
        row, created = get_or_create(session, select(Environment).filter_by(**values), create_after_the_other_writer)
        assert (row.id, created) == (winner[0], False)
    assert store.environment_id(CPU) == winner[0]
    assert store.get_environment(winner[0]).device == "cpu"


# ---------------------------------------------------------------------------------------------------- records


def test_records_are_detached_copies(store: Store) -> None:
    profile_id = _profile(store)
    record = store.get_profile(profile_id)
    record.acceptance["chat"]["num_drafts"] = 0
    with pytest.raises(AttributeError):
        record.max_k = 8  # type: ignore[misc]
    assert store.get_profile(profile_id).acceptance == ACCEPTANCE


def test_tuples_are_stored_as_json_lists(store: Store) -> None:
    rec_id = _recommendation(store, T0, schedule=((1, 7), (64, 3)), best_config={"k": 7, "batch": (1, 8)})
    record = store.get_recommendation(rec_id)
    assert record.schedule == [[1, 7], [64, 3]]
    assert record.best_config == {"k": 7, "batch": [1, 8]}


def test_naive_timestamps_are_taken_as_utc(store: Store) -> None:
    trial_id = _trial(store, 0, created_at=dt.datetime(2026, 1, 1, 12, 0))
    assert store.get_trial(trial_id).created_at == T0
    other_zone = dt.timezone(dt.timedelta(hours=2))
    later = _trial(store, 1, created_at=dt.datetime(2026, 1, 1, 15, 0, tzinfo=other_zone))
    assert store.get_trial(later).created_at == T0 + dt.timedelta(hours=1)  # 15:00+02:00 is 13:00 UTC


def test_default_created_at_is_now_in_utc(store: Store) -> None:
    before = dt.datetime.now(dt.UTC)
    created = store.get_trial(_trial(store, 0)).created_at
    after = dt.datetime.now(dt.UTC)
    assert created.tzinfo is not None
    assert before <= created <= after


def test_closed_store_refuses_use(db_url: str) -> None:
    store = Store(db_url)
    store.close()
    store.close()  # twice is fine
    with pytest.raises(StoreError, match="is closed"):
        store.list_profiles()
