"""The benchmarks table: measured figures of a recommendation served as it will be (`peagle-tune bench`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from store import _validate as v
from store._bad_rows import readable
from store._models import BENCHMARK_MODES, Benchmark, Recommendation, utcnow
from store._records import BenchmarkRecord
from store._rows import Repository, get_row, record_of, where_given


class Benchmarks(Repository):
    def add_benchmark(
        self,
        recommendation_id: int,
        *,
        mode: str,
        concurrency: int,
        num_prompts: int,
        figures: Mapping[str, Any],
        provenance: Mapping[str, Any],
        commands: Mapping[str, Any] | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store the figures ``vllm bench serve`` measured for recommendation `recommendation_id`; returns the id.

        mode: "static" (plain ``vllm serve``) or "adaptive" (``peagle-tune serve``). figures: measured values by
        name (``output_tokens_per_s`` in tokens/s, latencies in ms). provenance: where and when they were measured.
        """
        row = Benchmark(
            recommendation_id=v.integer("recommendation_id", recommendation_id, minimum=1),
            mode=v.choice("mode", mode, BENCHMARK_MODES),
            concurrency=v.integer("concurrency", concurrency, minimum=1),
            num_prompts=v.integer("num_prompts", num_prompts, minimum=1),
            figures=v.json_dict("figures", figures),
            provenance=v.json_dict("provenance", provenance),
            commands=v.json_dict("commands", commands),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            get_row(session, Recommendation, row.recommendation_id,
                    f"No recommendation with id {row.recommendation_id}. List them with `peagle-tune show`.")
            session.add(row)
            session.flush()
            return row.id

    def list_benchmarks(self, recommendation_id: int | None = None) -> list[BenchmarkRecord]:
        """Benchmarks (of `recommendation_id` if given), newest first."""
        query = where_given(
            select(Benchmark).order_by(Benchmark.created_at.desc(), Benchmark.id.desc()),
            (recommendation_id, Benchmark.recommendation_id == recommendation_id),
        )
        with self._session() as session:
            return list(readable(session.scalars(query), _record, self._bad_row))


def _record(row: Benchmark) -> BenchmarkRecord:
    return record_of(BenchmarkRecord, row)
