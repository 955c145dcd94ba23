"""Parse workload files (JSONL records, ShareGPT JSON) into (class, WorkloadRequest) pairs with located errors.

Every error is a WorkloadError reading ``<file>:<line>: <what is wrong>; expected <what is accepted>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from autotune.errors import WorkloadError
from autotune.names import name_problem
from autotune.workloads._workload import WorkloadRequest
from policies import decode_json_at, load_json_text
from policies.plugin.labels import MAX_LABEL_CHARS

DEFAULT_CLASS = "default"
#: Largest "max_tokens" a record may ask for: the longest context window of any released model (Llama 4 Scout,
#: 10M tokens). Larger values are typos or hostile, and would make a trial or a prediction run (nearly) forever.
MAX_TOKENS_LIMIT = 10_000_000
SHAREGPT_CLASS = "sharegpt"
CHAT_ROLES = ("system", "developer", "user", "assistant")

JSONL_EXPECTED = (
    'expected one JSON object per line with "prompt" (string) or "messages" (list of {"role", "content"} '
    'strings), and optionally "class" (1 to 64 printable characters, default "default"), "max_tokens" (integer '
    '> 0, <= 10,000,000), '
    '"temperature" (number >= 0), "id", "metadata"'
)
SHAREGPT_EXPECTED = (
    'expected a ShareGPT JSON list of {"conversations": [{"from": "human" | "gpt" | "system", "value": string}, '
    "...]} objects"
)
_RECORD_KEYS = frozenset({"prompt", "messages", "class", "max_tokens", "temperature", "id", "metadata"})
_SHAREGPT_ROLES = {"human": "user", "user": "user", "system": "system"}
_SHAREGPT_REPLY = {"gpt", "assistant", "chatgpt", "bard", "model"}


def _fail(where: str, what: str, expected: str = JSONL_EXPECTED) -> WorkloadError:
    return WorkloadError(f"{where}: {what}; {expected}")


def _names(keys: list[str], shown: int = 5) -> str:
    """The first `shown` of `keys`, each cut to 40 characters (a hostile record may hold thousands of long keys)."""
    listed = ", ".join(f"{k!r:.40}" for k in keys[:shown])
    return f"[{listed}{f', ... ({len(keys)} in all)' if len(keys) > shown else ''}]"


def _messages(raw: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise _fail(where, f'"messages" must be a non-empty list, but got {json.dumps(raw)[:60]}')
    out = []
    for i, message in enumerate(raw, start=1):
        if not isinstance(message, dict):
            raise _fail(where, f"message {i} must be an object, but got {type(message).__name__}")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise _fail(where, f"message {i} has unsupported keys {_names(extra)}")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise _fail(where, f"message {i} has role {role!r:.40}, not one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise _fail(where, f'message {i} needs a non-empty string "content", but got {content!r:.60}')
        out.append({"role": role, "content": content})
    return tuple(out)


def request_from_record(record: Any, where: str) -> tuple[str, WorkloadRequest]:
    """Validate one JSONL record and return (class, request). `where` is ``file:line`` for error messages."""
    if not isinstance(record, dict):
        raise _fail(where, f"a record must be a JSON object, but got {type(record).__name__}")
    unknown = sorted(set(record) - _RECORD_KEYS)
    if unknown:
        raise _fail(where, f"unknown keys {_names(unknown)}")
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt and has_messages:
        raise _fail(where, 'the record has both "prompt" and "messages"; give one of them')
    if not has_prompt and not has_messages:
        raise _fail(where, 'the record has neither "prompt" nor "messages"')
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    if has_prompt:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise _fail(where, f'"prompt" must be a non-empty string, but got {json.dumps(prompt)[:60]}')
    else:
        messages = _messages(record["messages"], where)

    cls = record.get("class", DEFAULT_CLASS)
    if not isinstance(cls, str) or not cls.strip():
        raise _fail(where, f'"class" must be a non-empty string, but got {json.dumps(cls)[:60]}')
    # The label the scheduler plugin counts acceptance under: it takes 1..MAX_LABEL_CHARS printable characters.
    problem = name_problem(cls.strip(), MAX_LABEL_CHARS)
    if problem is not None:
        raise _fail(where, f'"class" {json.dumps(cls)[:60]} {problem}')
    max_tokens = record.get("max_tokens", WorkloadRequest.max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens <= MAX_TOKENS_LIMIT:
        shown = json.dumps(max_tokens)[:60]
        raise _fail(where, f'"max_tokens" must be an integer > 0 and <= {MAX_TOKENS_LIMIT:,}, but got {shown}')
    temperature = record.get("temperature", WorkloadRequest.temperature)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise _fail(where, f'"temperature" must be a number >= 0, but got {json.dumps(temperature)[:60]}')
    request = WorkloadRequest(
        prompt=prompt, messages=messages, max_tokens=max_tokens, temperature=float(temperature)
    )
    return cls.strip(), request


def parse_jsonl(text: str, label: str) -> list[tuple[str, WorkloadRequest]]:
    """Records of a JSONL text (blank lines skipped). `label` names the file in error messages."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{label}:{number}"
        try:
            record = load_json_text(line)
        except json.JSONDecodeError as exc:
            raise _fail(where, f"invalid JSON ({exc.msg} at column {exc.colno})") from exc
        out.append(request_from_record(record, where))
    if not out:
        raise _fail(f"{label}:1", "the file has no records (it is empty or blank)")
    return out


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _skip_ws(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _array_items(text: str, label: str) -> Iterator[tuple[int, Any]]:
    """(line, item) for each element of a top-level JSON array, so errors can name the element's line."""
    i = _skip_ws(text, 0)
    if i == len(text):
        raise _fail(f"{label}:1", "the file is empty", SHAREGPT_EXPECTED)
    if text[i] != "[":
        raise _fail(f"{label}:{_line_of(text, i)}", "the top-level JSON value is not a list", SHAREGPT_EXPECTED)
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "]":
        return
    while True:
        try:
            item, end = decode_json_at(text, i)
        except json.JSONDecodeError as exc:
            raise _fail(f"{label}:{exc.lineno}", f"invalid JSON ({exc.msg} at column {exc.colno})",
                        SHAREGPT_EXPECTED) from exc
        yield _line_of(text, i), item
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            rest = _skip_ws(text, i + 1)
            if rest != len(text):
                raise _fail(f"{label}:{_line_of(text, rest)}", "extra data after the list", SHAREGPT_EXPECTED)
            return
        raise _fail(f"{label}:{_line_of(text, i)}", "invalid JSON (expected ',' or ']' after a list element)",
                    SHAREGPT_EXPECTED)


def _sharegpt_messages(item: Any, where: str) -> tuple[dict[str, str], ...] | None:
    """System turns before the first human turn plus that turn; None when there is no usable human turn."""
    if not isinstance(item, dict):
        raise _fail(where, f"a conversation must be a JSON object, but got {type(item).__name__}", SHAREGPT_EXPECTED)
    turns = item.get("conversations")
    if not isinstance(turns, list):
        hint = " (this looks like a JSONL record: save it as .jsonl)" if "prompt" in item or "messages" in item else ""
        raise _fail(where, f'the object has no "conversations" list{hint}', SHAREGPT_EXPECTED)
    messages: list[dict[str, str]] = []
    for n, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) or not isinstance(
            turn.get("value"), str
        ):
            raise _fail(where, f'turn {n} needs string "from" and "value"', SHAREGPT_EXPECTED)
        speaker = turn["from"].lower()
        role = _SHAREGPT_ROLES.get(speaker)
        if role is None and speaker not in _SHAREGPT_REPLY:
            raise _fail(where, f"turn {n} is from {turn['from']!r:.40}, not human, gpt or system", SHAREGPT_EXPECTED)
        if role == "system":
            if turn["value"].strip():
                messages.append({"role": "system", "content": turn["value"]})
            continue
        if role == "user":
            if not turn["value"].strip():
                return None
            messages.append({"role": "user", "content": turn["value"]})
            return tuple(messages)
        return None  # The model speaks first: there is no prompt to replay.
    return None


def parse_sharegpt(text: str, label: str) -> tuple[list[tuple[str, WorkloadRequest]], int]:
    """Requests of a ShareGPT JSON text (class "sharegpt") and how many conversations were skipped.

    Each conversation becomes one chat request: its leading system turns plus its first human turn. Conversations
    that start with a model turn or have an empty first human turn are skipped (they replay nothing); wrong types
    are errors.
    """
    out = []
    skipped = 0
    for line, item in _array_items(text, label):
        messages = _sharegpt_messages(item, f"{label}:{line}")
        if messages is None:
            skipped += 1
            continue
        out.append((SHAREGPT_CLASS, WorkloadRequest(messages=messages)))
    if not out:
        what = "the list is empty" if not skipped else f"none of the {skipped} conversations has a human turn first"
        raise _fail(f"{label}:1", what, SHAREGPT_EXPECTED)
    return out, skipped
