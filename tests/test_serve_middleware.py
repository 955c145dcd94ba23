"""The API-server middleware: requests get their class from the policy (served model name, prompt; a client label
only where the policy lets it), stamped for the engine, and never fail."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from autotune.serving import PeagleClassMiddleware, label_request, prompt_text
from policies import ClassPolicy, RequestPolicy
from policies.plugin import route_stamp
from policies.plugin.labels import RequestLabeler, stamped_class

POLICY = RequestPolicy(static_k=3, max_k=5, classes={"code": ClassPolicy(max_k=5), "chat": ClassPolicy(max_k=1)},
                       model_classes={"coder": "code", "small": "chat"}, default_class="chat")
KEY = "per-launch-secret"


def test_a_client_label_never_replaces_the_model_name_class_or_raises_the_cap() -> None:
    for label in ("legal", "chat", "code"):
        payload: dict[str, Any] = {"model": "coder", "prompt": "hi", "vllm_xargs": {"peagle_class": label}}
        label_request(payload, POLICY)
        assert payload["vllm_xargs"] == {"peagle_class": "code"}, label
    raising: dict[str, Any] = {"model": "small", "prompt": "hi", "vllm_xargs": {"peagle_class": "code"}}
    label_request(raising, POLICY)
    assert raising["vllm_xargs"]["peagle_class"] == "chat"
    lowering: dict[str, Any] = {"model": "plain", "prompt": "def f(x): pass", "vllm_xargs": {"peagle_class": "chat"}}
    assert not label_request(lowering, POLICY)  # prompt says code (cap 5): the client may ask for chat (cap 1)


def test_the_class_is_stamped_for_the_engine_and_a_clients_stamp_is_dropped() -> None:
    forged = route_stamp("code", "guessed-key")
    payload: dict[str, Any] = {"model": "small", "prompt": "hi",
                               "vllm_xargs": {"peagle_class": "code", "peagle_route": forged}}
    assert label_request(payload, POLICY, KEY)
    xargs = payload["vllm_xargs"]
    assert xargs["peagle_class"] == "chat" and stamped_class(xargs, KEY) == "chat"
    # In the engine: the stamp verifies, so a request on "coder" gets code's cap; a forged one does not.
    stamped: dict[str, Any] = {"model": "coder", "prompt": "hi"}
    label_request(stamped, POLICY, KEY)
    labeler = RequestLabeler(POLICY, route_key=KEY)
    assert labeler.label("a", stamped["vllm_xargs"]).view.max_k == 5
    assert labeler.label("b", {"peagle_class": "code", "peagle_route": forged}).view.max_k == 1


def test_served_model_name_then_builtin_classifier_then_default() -> None:
    by_name: dict[str, Any] = {"model": "coder", "prompt": "Tell me a story"}
    assert label_request(by_name, POLICY) and by_name["vllm_xargs"] == {"peagle_class": "code"}
    by_prompt: dict[str, Any] = {"model": "plain", "prompt": "What is 12 * 7?", "vllm_xargs": {"peagle_speculate": 0}}
    assert label_request(by_prompt, POLICY)
    assert by_prompt["vllm_xargs"] == {"peagle_speculate": 0, "peagle_class": "math"}  # other xargs kept
    token_ids: dict[str, Any] = {"model": "plain", "prompt": [1, 2, 3]}
    assert label_request(token_ids, POLICY) and token_ids["vllm_xargs"]["peagle_class"] == "chat"


def test_chat_requests_are_classified_by_the_last_user_message() -> None:
    payload = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                            {"role": "user", "content": [{"type": "text", "text": "def f(x):\n  return x"}]}]}
    assert prompt_text(payload) == "def f(x):\n  return x"


def _call(
    body: bytes, path: str = "/v1/completions", chunks: int = 1, route_key: str | None = None
) -> tuple[bytes, dict[bytes, bytes]]:
    """Run the middleware on one POST whose body arrives in ``chunks`` messages; returns what the app received."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        seen["body"] = b"".join(parts)
        seen["headers"] = dict(scope["headers"])

    size = max(1, len(body) // chunks + 1)
    pieces = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: Any) -> None:
        pass

    middleware = PeagleClassMiddleware(app, policy=POLICY, route_key=route_key)
    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    asyncio.run(middleware(scope, receive, send))
    return seen["body"], seen["headers"]


def test_middleware_rewrites_the_body_and_its_length() -> None:
    body = json.dumps({"model": "coder", "prompt": "x", "max_tokens": 4}).encode()
    got, headers = _call(body, chunks=3)
    assert json.loads(got)["vllm_xargs"] == {"peagle_class": "code"}
    assert headers[b"content-length"] == str(len(got)).encode()
    got, _ = _call(body, route_key=KEY)
    assert stamped_class(json.loads(got)["vllm_xargs"], KEY) == "code"


def test_middleware_passes_other_paths_and_bad_bodies_through_unchanged() -> None:
    body = json.dumps({"model": "coder", "prompt": "x"}).encode()
    assert _call(body, path="/v1/embeddings")[0] == body
    assert _call(b"{not json")[0] == b"{not json"  # vLLM answers 400 itself, as it would without us
    assert _call(b'{"vllm_xargs": "oops"}')[0] == b'{"vllm_xargs": "oops"}'

