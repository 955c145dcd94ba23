"""The Hugging Face hub check goes through huggingface_hub (issue 13.9): its offline mode answers without a request,
its session (endpoint, proxies) asks otherwise; any HTTP answer is "reachable", a network error is not."""

from __future__ import annotations

from typing import Any

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")

from autotune.workloads import _load  # noqa: E402


class _Session:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.calls: list[tuple[str, float]] = []

    def head(self, url: str, timeout: float) -> Any:
        self.calls.append((url, timeout))
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def test_offline_mode_is_unreachable_without_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _Session(object())
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: True)
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: session)
    assert _load._hub_reachable() is False
    assert session.calls == []


def test_an_answer_from_the_endpoint_is_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    session = _Session(object())
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: session)
    assert _load._hub_reachable(timeout_s=2.5) is True
    assert session.calls == [(huggingface_hub.constants.ENDPOINT, 2.5)]


def test_a_network_error_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: _Session(ConnectionError("no route to host")))
    assert _load._hub_reachable() is False


def test_no_raw_socket_is_used() -> None:
    import inspect

    assert "socket" not in inspect.getsource(_load)
