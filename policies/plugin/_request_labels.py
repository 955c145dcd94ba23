"""Each live request's labels as the scheduler plugin reads them every step: class, phase, cap and opt-out from its
``sampling_params.extra_args`` (`RequestLabeler`), cached per request object. Pure Python: no vLLM import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from policies.plugin.labels import Labeled, RequestLabeler

__all__ = ["RequestLabels"]


class _PerRequest:
    """Values cached per live request. An entry remembers the request object, so a reused request id never inherits
    a finished request's value; entries of finished requests are dropped once the cache outgrows the live set."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Any, Any]] = {}

    def get(self, req_id: str, request: Any) -> Any:
        entry = self._entries.get(req_id)
        return entry[1] if entry is not None and entry[0] is request else None

    def put(self, req_id: str, request: Any, value: Any) -> None:
        self._entries[req_id] = (request, value)

    def prune(self, live: Mapping[str, Any]) -> None:
        if len(self._entries) > 2 * len(live) + 256:
            self._entries = {r: e for r, e in self._entries.items() if live.get(r) is e[0]}


class RequestLabels:
    """Labels of the requests in ``requests`` (vLLM's live request dict, read, never changed).

    ``class_phase``: request id -> (request, (class, phase), traced), where traced says ``admit_trace(request id,
    class, phase)`` accepted the request when it was first labelled (`PluginStats.admit_trace`: its steps are
    recorded). The step observer reads it directly (one lookup per request and step).
    """

    def __init__(self, requests: Mapping[str, Any], logger: logging.Logger) -> None:
        self.requests = requests
        self.labeler = RequestLabeler()
        self.admit_trace: Callable[[str, str, str], bool] | None = None
        self.class_phase: dict[str, tuple[Any, tuple[str, str], bool]] = {}
        self._labels = _PerRequest()
        self._logger = logger

    def labeled(self, req_id: str) -> Labeled:
        """A live request's class, phase, cap and opt-out (`RequestLabeler`), cached per request."""
        request = self.requests.get(req_id)
        labeled: Labeled | None = self._labels.get(req_id, request)
        if labeled is not None:
            return labeled
        params = getattr(request, "sampling_params", None) if request is not None else None
        labeler = self.labeler
        rejected = labeler.rejected
        labeled = labeler.label(req_id, getattr(params, "extra_args", None))
        if rejected == 0 and labeler.rejected:
            self._logger.warning("PeagleScheduler: request %s: %s; its own labels are ignored (logged once; counted "
                                 "in the stats info as request_labels.rejected).", req_id, labeler.last_rejection)
        if request is not None:
            self._labels.put(req_id, request, labeled)
            self._labels.prune(self.requests)
        return labeled

    def label(self, req_id: str) -> tuple[str, str]:
        """(class, phase) of a live request (`labeled`), cached per request object: read for every request in every
        step."""
        requests = self.requests
        request = requests.get(req_id)
        entry = self.class_phase.get(req_id)
        if entry is not None and entry[0] is request:
            return entry[1]
        labeled = self.labeled(req_id)
        label = (labeled.cls, labeled.phase)
        if request is not None:
            if len(self.class_phase) > 2 * len(requests) + 256:
                self.class_phase = {r: e for r, e in self.class_phase.items() if requests.get(r) is e[0]}
            admit = self.admit_trace
            traced = admit is not None and admit(req_id, *label)
            self.class_phase[req_id] = (request, label, traced)
        return label

    def counts(self) -> dict[str, Any] | None:
        """Rejected and folded labels for the stats info (None: none)."""
        labeler = self.labeler
        if labeler.rejected or any(labeler.folded.values()):
            return {"rejected": labeler.rejected, **labeler.folded}
        return None
