"""Request classification in vLLM's API server: an ASGI middleware that labels each request with its class.

vLLM's engine (where the scheduler plugin runs) sees token ids and ``SamplingParams.extra_args``, not the request's
model name or prompt text, so classification by served model name or by the built-in prompt classifier has to
happen in the API server. `peagle-tune serve` installs `PeagleClassMiddleware` with ``vllm serve --middleware``.

For ``POST /v1/completions`` and ``/v1/chat/completions`` it sets ``vllm_xargs.peagle_class`` to
`policies.RequestPolicy.classify` of (the client's ``peagle_class``, served model name, prompt text): the operator's
policy decides, and a client's own label only counts where the policy lets it (never raising the request's cap,
never replacing a ``model_classes`` assignment by default; see `policies.RequestPolicy.resolve`). With the
per-launch key in ``PEAGLE_LABEL_KEY`` it also stamps that class (``vllm_xargs.peagle_route``,
`policies.plugin.route_stamp`) so the engine can tell the operator's assignment from a client's claim; a stamp a
client sent is dropped. vLLM passes ``vllm_xargs`` on as ``SamplingParams.extra_args``.

Requests the middleware does not see (other endpoints, bodies over 64 MiB) reach the engine unstamped, where the
plugin resolves their labels against the policy's default class: they can lose the model-name class, never gain a
deeper cap. Any failure leaves the request untouched: the middleware never fails a request.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from policies import CLASS_KEY, RequestPolicy
from policies.plugin import LABEL_KEY_ENV, ROUTE_KEY, route_stamp

__all__ = ["CLASSIFIED_PATHS", "PeagleClassMiddleware", "label_request", "prompt_text"]

logger = logging.getLogger("vllm.peagle_middleware")

CLASSIFIED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_MAX_BODY_BYTES = 64 * 1024 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def prompt_text(payload: Mapping[str, Any]) -> str | None:
    """The text the built-in classifier reads: a completion's prompt (the first, if a list of strings), or a chat's
    last user message (text parts joined). None for token-id prompts or no text."""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if not isinstance(message, Mapping) or message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
                return "\n".join(p for p in parts if isinstance(p, str)) or None
    return None


def label_request(payload: dict[str, Any], policy: RequestPolicy, route_key: str | bytes | None = None) -> bool:
    """Set ``payload["vllm_xargs"]["peagle_class"]`` to the class the policy gives the request, and (with
    ``route_key``) ``vllm_xargs["peagle_route"]`` to its stamp; a client's own ``peagle_route`` is removed.

    Returns True when the payload changed. Example: with ``model_classes={"coder": "code"}``, the payload
    ``{"model": "coder", "prompt": "hi", "vllm_xargs": {"peagle_class": "legal"}}`` gets
    ``vllm_xargs == {"peagle_class": "code"}``: a client label does not replace the model name's class.
    """
    xargs = payload.get("vllm_xargs")
    if xargs is None:
        xargs = {}
    if not isinstance(xargs, dict):  # vLLM rejects the request itself
        return False
    model = payload.get("model")
    cls = policy.classify(xargs, model if isinstance(model, str) else None, prompt_text(payload))
    before = dict(xargs)
    xargs.pop(ROUTE_KEY, None)
    xargs[CLASS_KEY] = cls
    if route_key:
        xargs[ROUTE_KEY] = route_stamp(cls, route_key)
    if xargs == before and "vllm_xargs" in payload:
        return False
    payload["vllm_xargs"] = xargs
    return True


def _load_policy() -> RequestPolicy | None:
    from autotune.serving._launch import POLICY_ENV

    path = os.environ.get(POLICY_ENV)
    if not path:
        logger.warning("PeagleClassMiddleware: %s is not set; requests are not classified.", POLICY_ENV)
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return RequestPolicy.from_dict(json.load(f), source=path)
    except (OSError, ValueError) as exc:
        logger.error("PeagleClassMiddleware: cannot load the policy %s (%s); requests are not classified.", path, exc)
        return None


class PeagleClassMiddleware:
    """ASGI middleware (``vllm serve --middleware autotune.serving.PeagleClassMiddleware``); see the module
    docstring. The policy comes from the JSON file named by ``PEAGLE_POLICY``, the stamp key from
    ``PEAGLE_LABEL_KEY`` (none: no stamp; the engine then keeps every request in the policy's default class or
    lower)."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        policy: RequestPolicy | None = None,
        route_key: str | bytes | None = None,
    ):
        self.app = app
        self.policy = policy if policy is not None else _load_policy()
        self.route_key = route_key if route_key is not None else (os.environ.get(LABEL_KEY_ENV) or None)
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.policy is None
            or scope.get("type") != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in CLASSIFIED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        first: list[Message] = []
        while more:
            message = await receive()
            if message.get("type") != "http.request":  # a disconnect: hand everything to the app unchanged
                first.append(message)
                break
            body = message.get("body", b"")
            chunks.append(body)
            size += len(body)
            more = bool(message.get("more_body", False))
            if size > _MAX_BODY_BYTES:
                break
        raw = b"".join(chunks)
        new = raw
        if not more and not first:
            new = self._relabel(raw)
        replay: list[Message] = [{"type": "http.request", "body": new, "more_body": more}, *first]

        async def replay_receive() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        if new is not raw:
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(new)).encode()))
            scope = dict(scope)
            scope["headers"] = headers
        await self.app(scope, replay_receive, send)

    def _relabel(self, raw: bytes) -> bytes:
        assert self.policy is not None
        try:
            payload = json.loads(raw)
            if isinstance(payload, dict) and label_request(payload, self.policy, self.route_key):
                return json.dumps(payload).encode()
        except Exception as exc:  # noqa: BLE001 - never fail a request because of classification
            if not self._warned:
                self._warned = True
                logger.warning("PeagleClassMiddleware: request left unclassified (%s: %s).", type(exc).__name__, exc)
        return raw
