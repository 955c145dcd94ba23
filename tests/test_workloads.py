"""Workload loaders: JSONL, ShareGPT JSON, built-ins and hf:<dataset>, with located errors for bad input."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from autotune.catalogs import get_drafter
from autotune.errors import WorkloadError
from autotune.workloads import (
    REFERENCE_FOR_CLASS,
    Workload,
    WorkloadRequest,
    list_builtin_workloads,
    load_workload,
)
from autotune.workloads import _load as load_module


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ---------------------------------------------------------------- JSONL


def test_jsonl_records_become_classes_of_requests(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "traffic.jsonl", [
        {"prompt": "def f():", "class": "code", "max_tokens": 64},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "class": "chat", "temperature": 0.7},
        {"prompt": "plain"},
    ])
    workload = load_workload(str(path))
    assert workload.name == "traffic" and workload.source == str(path)
    assert workload.class_names == ["chat", "code", "default"]
    assert workload.classes["code"] == (WorkloadRequest(prompt="def f():", max_tokens=64),)
    chat = workload.classes["chat"][0]
    assert chat.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert (chat.temperature, chat.max_tokens) == (0.7, 128)  # 128: WorkloadRequest's default
    assert workload.classes["default"][0].text() == "plain"


def test_blank_lines_are_skipped_and_line_numbers_still_count_them(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b", "max_tokens": -1}\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"w\.jsonl:4: "):
        load_workload(str(path))


@pytest.mark.parametrize(
    ("second_line", "fragment"),
    [
        ('{"prompt": "x",}', "invalid JSON"),
        ('["prompt", "x"]', "must be a JSON object"),
        ('{"class": "chat"}', 'neither "prompt" nor "messages"'),
        ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "both"),
        ('{"prompt": 42}', '"prompt" must be a non-empty string'),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"messages": []}', '"messages" must be a non-empty list'),
        ('{"messages": [{"role": "robot", "content": "y"}]}', "role 'robot'"),
        ('{"messages": [{"role": "user", "content": 3}]}', 'non-empty string "content"'),
        ('{"messages": [{"role": "user", "content": "y", "name": "z"}]}', "unsupported keys"),
        ('{"prompt": "x", "max_tokens": -5}', '"max_tokens" must be an integer > 0'),
        ('{"prompt": "x", "max_tokens": 0}', '"max_tokens" must be an integer > 0'),
        ('{"prompt": "x", "max_tokens": 2.5}', '"max_tokens" must be an integer > 0'),
        ('{"prompt": "x", "max_tokens": true}', '"max_tokens" must be an integer > 0'),
        ('{"prompt": "x", "temperature": -0.1}', '"temperature" must be a number >= 0'),
        ('{"prompt": "x", "temperature": "hot"}', '"temperature" must be a number >= 0'),
        ('{"prompt": "x", "class": ""}', '"class" must be a non-empty string'),
        ('{"prompt": "x", "max_token": 5}', "unknown keys ['max_token']"),
    ],
)
def test_malformed_jsonl_names_file_line_and_expected_format(tmp_path: Path, second_line: str, fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + second_line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:2: ")
    assert fragment in message and "expected" in message


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_jsonl_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(WorkloadError, match=rf"^{re.escape(str(path))}:1: the file has no records.*expected"):
        load_workload(str(path))


def test_non_utf8_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=rf"^{re.escape(str(path))}:2: the file is not UTF-8"):
        load_workload(str(path))


def test_unreadable_file_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _jsonl(tmp_path / "locked.jsonl", [{"prompt": "x"}])

    real_open = os.open

    def deny(name: Any, *args: Any, **kwargs: Any) -> int:
        if str(name) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(name))
        return real_open(name, *args, **kwargs)

    # Tests run as root here, so chmod cannot make a file unreadable; simulate the OS refusing.
    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    assert str(info.value) == f"{path}: cannot read the workload file (JSONL or ShareGPT JSON) (Permission denied)."


def test_a_fifo_or_a_device_is_refused_without_blocking_or_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "workload.jsonl"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        with pytest.raises(WorkloadError, match=r"is not a regular file; expected a JSONL or ShareGPT JSON file"):
            load_workload(path)


def test_a_workload_file_bigger_than_any_dataset_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 44.4: a 1 GB file was read whole (2.2 GB RSS) before "invalid JSON line 1". The bound is ShareGPT V3's
    # size; lowered here to keep the test file small.
    monkeypatch.setattr(load_module, "MAX_WORKLOAD_BYTES", 1000)
    path = tmp_path / "huge.jsonl"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(WorkloadError, match=r"huge\.jsonl: the workload file .* has more than 1,000 bytes"):
        load_workload(str(path))


def test_a_directory_is_not_a_workload_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not a regular file"):
        load_workload(str(tmp_path))


# ---------------------------------------------------------------- ShareGPT


SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "Name a prime."},
        {"from": "gpt", "value": "7"},
        {"from": "human", "value": "Another?"},
    ]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Hi"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "Tell me a joke."}]},
]


def test_sharegpt_replays_system_turns_and_the_first_human_turn(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(SHAREGPT, indent=2), encoding="utf-8")
    workload = load_workload(str(path))
    assert workload.class_names == ["sharegpt"]
    # "b" starts with the model speaking, so it has nothing to replay and is skipped.
    assert [r.messages for r in workload.classes["sharegpt"]] == [
        ({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}),
        ({"role": "user", "content": "Tell me a joke."},),
    ]


def test_sharegpt_error_names_the_line_where_the_conversation_starts(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    # Line 1 "[", lines 2-4 the first conversation, line 5 the bad object.
    path.write_text(
        '[\n{"conversations": [\n  {"from": "human", "value": "hi"}\n]},\n{"prompt": "oops"}\n]\n', encoding="utf-8"
    )
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:5: ") and "conversations" in message and "save it as .jsonl" in message


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ('{"conversations": []}', 1, "not a list"),
        ('[\n{"conversations": [{"from": "human", "value": "x"}]},\n{"conversations": [}\n]', 3, "invalid JSON"),
        ('[\n{"conversations": [{"from": "robot", "value": "x"}]}\n]', 2, "'robot'"),
        ('[\n{"conversations": [{"from": "human", "value": 5}]}\n]', 2, 'string "from" and "value"'),
        ("[]", 1, "the list is empty"),
        ('[{"conversations": [{"from": "gpt", "value": "hello"}]}]', 1, "none of the 1 conversations"),
        ("", 1, "the file is empty"),
    ],
)
def test_malformed_sharegpt_names_file_and_line(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ") and fragment in message and "expected" in message


# ---------------------------------------------------------------- content hash and ordering


def test_content_hash_ignores_file_name_and_formatting_but_not_content(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [{"prompt": "a", "class": "x"}, {"prompt": "b", "class": "y", "max_tokens": 32}]
    first = load_workload(str(_jsonl(tmp_path / "one.jsonl", records)))
    reordered_keys = tmp_path / "two.jsonl"
    reordered_keys.write_text('{"class": "x", "prompt": "a"}\n\n{"max_tokens": 32, "class": "y", "prompt": "b"}\n')
    second = load_workload(str(reordered_keys))
    assert first.name != second.name
    assert first.content_hash() == second.content_hash()
    changed = load_workload(str(_jsonl(tmp_path / "three.jsonl", [records[0], {**records[1], "max_tokens": 33}])))
    assert changed.content_hash() != first.content_hash()


def test_requests_interleave_classes_round_robin() -> None:
    def reqs(prefix: str, n: int) -> tuple[WorkloadRequest, ...]:
        return tuple(WorkloadRequest(prompt=f"{prefix}{i}") for i in range(n))

    workload = Workload("w", {"b": reqs("b", 1), "a": reqs("a", 3), "c": reqs("c", 2)})
    order = [(cls, r.prompt) for cls, r in workload.requests()]
    assert order == [("a", "a0"), ("b", "b0"), ("c", "c0"), ("a", "a1"), ("c", "c1"), ("a", "a2")]


def test_max_per_class_keeps_the_first_requests_of_each_class() -> None:
    workload = load_workload("mixed", max_per_class=2)
    assert {c: len(r) for c, r in workload.classes.items()} == {"chat": 2, "code": 2, "math": 2}
    full = load_workload("mixed")
    assert workload.classes["code"] == full.classes["code"][:2]


@pytest.mark.parametrize("bad", [0, -1])
def test_max_per_class_must_be_positive(bad: int) -> None:
    with pytest.raises(WorkloadError, match="max_per_class must be an integer >= 1"):
        load_workload("mixed", max_per_class=bad)


# ---------------------------------------------------------------- built-ins


EXPECTED_BUILTIN_CLASSES = {"mt-bench": ["chat"], "humaneval": ["code"], "gsm8k": ["math"],
                            "mixed": ["chat", "code", "math"]}


def test_builtin_names() -> None:
    assert list_builtin_workloads() == sorted(EXPECTED_BUILTIN_CLASSES)


@pytest.mark.parametrize("name", sorted(EXPECTED_BUILTIN_CLASSES))
def test_every_builtin_loads_with_8_to_16_requests_per_class(name: str) -> None:
    workload = load_workload(name)
    assert workload.class_names == EXPECTED_BUILTIN_CLASSES[name]
    assert workload.source == f"builtin:{name}"
    assert all(8 <= len(requests) <= 16 for requests in workload.classes.values())
    assert load_workload(f"builtin:{name}").content_hash() == workload.content_hash()


def test_mixed_is_exactly_the_three_single_class_builtins() -> None:
    mixed = load_workload("mixed")
    for single in ("mt-bench", "humaneval", "gsm8k"):
        part = load_workload(single)
        (cls,) = part.class_names
        assert mixed.classes[cls] == part.classes[cls]


def test_builtin_classes_map_to_catalog_reference_benchmarks() -> None:
    # Built-in names equal the benchmarks the catalog's reference acceptance is keyed by.
    assert {REFERENCE_FOR_CLASS[c] for c in load_workload("mixed").class_names} == {"mt-bench", "humaneval", "gsm8k"}
    refs = get_drafter("amazon/gpt-oss-120b-p-eagle").reference_acceptance
    for cls in load_workload("mixed").class_names:
        assert REFERENCE_FOR_CLASS[cls] in refs and REFERENCE_FOR_CLASS[cls] in list_builtin_workloads()


def test_an_existing_file_wins_over_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _jsonl(tmp_path / "gsm8k", [{"prompt": "mine", "class": "math"}])
    monkeypatch.chdir(tmp_path)
    assert len(load_workload("gsm8k")) == 1
    assert len(load_workload("builtin:gsm8k")) == 12


def test_unknown_spec_lists_the_builtins(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload(str(tmp_path / "missing.jsonl"))
    assert all(name in str(info.value) for name in list_builtin_workloads())


# ---------------------------------------------------------------- hf:<dataset>


def test_hf_without_datasets_package_explains_the_file_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(WorkloadError) as info:
        load_workload("hf:mt-bench")
    message = str(info.value)
    assert "could not be reached" in message and "JSONL" in message and "ShareGPT" in message
    assert '"prompt"' in message and '"conversations"' in message


def _fake_datasets(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]] | Exception) -> list[tuple]:
    calls: list[tuple] = []

    def load_dataset(dataset_id: str, config: str | None, split: str) -> list[dict[str, Any]]:
        calls.append((dataset_id, config, split))
        if isinstance(rows, Exception):
            raise rows
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hf_unreachable_hub_is_a_workload_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_datasets(monkeypatch, [])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(load_module, "_hub_reachable", lambda timeout_s=3.0: False)
    with pytest.raises(WorkloadError, match="could not be reached.*JSONL.*ShareGPT"):
        load_workload("hf:humaneval")


def test_hf_rows_become_chat_requests_of_the_benchmark_class(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_datasets(monkeypatch, [{"prompt": ["Turn one", "Turn two"], "category": "writing"},
                                         {"prompt": "Single"}, {"category": "no text"}])
    monkeypatch.setattr(load_module, "_hub_reachable", lambda timeout_s=3.0: True)
    workload = load_workload("hf:mt-bench")
    assert calls == [("HuggingFaceH4/mt_bench_prompts", None, "train")]
    assert workload.class_names == ["chat"]
    assert [r.messages for r in workload.classes["chat"]] == [
        ({"role": "user", "content": "Turn one"},), ({"role": "user", "content": "Single"},)
    ]


def test_hf_load_failure_is_a_workload_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_datasets(monkeypatch, ConnectionError("offline"))
    monkeypatch.setattr(load_module, "_hub_reachable", lambda timeout_s=3.0: True)
    with pytest.raises(WorkloadError, match=r"could not load org/data .*ConnectionError: offline.*JSONL"):
        load_workload("hf:org/data")
