"""Hostile or broken files: every reader fails fast with one line naming the file, the place and the fix.

Probes from issue 12 ("Hostile or broken files and URLs"): a 488-byte YAML alias bomb, non-UTF-8 files, workload
lines with a 5,001-digit number or 100,000-deep nesting, absurd ``max_tokens``; each used to end in a MemoryError
after 29 s or a traceback. The rows of docs/reliability.md point here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from autotune.catalogs import load_user_catalog
from autotune.cli.profile import profile
from autotune.errors import ConfigError, WorkloadError
from autotune.search.space import load_space_file
from autotune.workloads import load_workload
from policies import (
    YAML_MAX_DEPTH,
    YAML_MAX_EXPANDED,
    PolicyFileError,
    YAMLDocumentError,
    load_json_text,
    load_policy,
    load_yaml_text,
)
from policies._files import MAX_TEXT_BYTES
from policies.plugin import PluginConfig, PluginConfigError

#: A message a user reads on one terminal line or two; the bomb's old message was 2 GB.
MAX_MESSAGE = 600
#: "Fails fast": the bounded loader takes about 5 ms on the bomb; 5 s leaves room for a loaded shared machine and is
#: still 6x below the 29 s the unbounded load took before its MemoryError.
FAST_S = 5.0


def alias_bomb(levels: int = 9, fanout: int = 9) -> str:
    """A valid policy file whose static_k is `fanout`**`levels` strings through nested aliases, padded to 488 bytes.

    Each level is one list of `fanout` aliases to the level below, so the text grows by `fanout` aliases per level
    while the expanded value grows `fanout`-fold: 9**9 = 387,420,489 strings from 488 bytes.
    """
    lines = ["version: 1", "max_k: 8", "static_k:", "  - &a [" + ", ".join(['"lol"'] * fanout) + "]"]
    names = "abcdefghijklmnopqrstuvwxyz"
    for i in range(1, levels):
        lines.append(f"  - &{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * fanout) + "]")
    text = "\n".join(lines) + "\n"
    return text + "#" * max(0, 487 - len(text)) + "\n"


def _write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- YAML


def test_the_alias_bomb_fails_fast_with_a_short_message(tmp_path: Path) -> None:
    text = alias_bomb()
    assert len(text.encode()) == 488
    path = _write(tmp_path, "bomb.yaml", text)
    start = time.perf_counter()
    with pytest.raises(PolicyFileError) as info:
        load_policy(path)
    elapsed = time.perf_counter() - start
    message = str(info.value)
    assert elapsed < FAST_S
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "alias" in message and f"{YAML_MAX_EXPANDED:,}" in message
    assert len(message) < MAX_MESSAGE and "\n" not in message


def test_a_bomb_just_past_the_bound_is_refused_and_one_just_inside_loads() -> None:
    # Expanded size of [&a [x]*n, *a * m] = 1 (outer) + (1 + 2n) (anchored list of n one-character scalars)
    # + m * (1 + 2n) (aliases written out) = 1 + (m + 1)(1 + 2n).
    n = 999
    inner = "[" + ", ".join(["x"] * n) + "]"

    def doc(m: int) -> str:
        return "[&a " + inner + "".join(", *a" for _ in range(m)) + "]"

    fits = (YAML_MAX_EXPANDED - 1) // (1 + 2 * n) - 1
    assert 1 + (fits + 1) * (1 + 2 * n) <= YAML_MAX_EXPANDED < 1 + (fits + 2) * (1 + 2 * n)
    assert len(load_yaml_text(doc(fits))) == fits + 1
    with pytest.raises(YAMLDocumentError, match="alias bomb"):
        load_yaml_text(doc(fits + 1))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [1, *a]\n", "line 1, column 4: an alias refers to a collection that contains it"),
        ("[" * 100_000, f"collections are nested more than {YAML_MAX_DEPTH} levels deep"),
        ("- " * (YAML_MAX_DEPTH + 1) + "x\n", f"line 1, column {2 * YAML_MAX_DEPTH + 1}: collections are nested"),
        ("a: *nowhere\n", "line 1, column 4: found undefined alias 'nowhere'"),
        ("a: [1, 2\n", "line 2, column 1: while parsing a flow sequence; expected ',' or ']'"),
    ],
)
def test_broken_yaml_is_one_located_line(text: str, message: str) -> None:
    with pytest.raises(YAMLDocumentError) as info:
        load_yaml_text(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < MAX_MESSAGE


def test_the_bounded_loader_reads_what_safe_load_reads() -> None:
    catalogs = Path(__file__).resolve().parents[1] / "autotune" / "catalogs"
    for path in sorted(catalogs.glob("*.yaml")):  # the drafter catalog shares entries through anchors
        text = path.read_text(encoding="utf-8")
        assert load_yaml_text(text) == yaml.safe_load(text), path.name
    assert load_yaml_text("") is None
    assert load_yaml_text("base: &b {k: 2}\nuse: *b\n") == {"base": {"k": 2}, "use": {"k": 2}}


def test_a_huge_value_is_cut_in_the_message(tmp_path: Path) -> None:
    path = _write(tmp_path, "policy.yaml", "version: 1\nmax_k: 8\nstatic_k: '" + "7" * 200_000 + "'\n")
    with pytest.raises(PolicyFileError, match="static_k: must be an integer") as info:
        load_policy(path)
    assert len(str(info.value)) < MAX_MESSAGE


# -------------------------------------------------------------------------------------------------- encodings


def test_a_non_utf8_policy_file_names_the_line_and_the_byte(tmp_path: Path) -> None:
    path = _write(tmp_path, "policy.yaml", "version: 1\nstatic_k: 3\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(PolicyFileError) as info:
        load_policy(path)
    assert str(info.value) == (
        f"{path}:3: the policy file is not UTF-8 text (byte 0xe9 at column 6: invalid continuation byte); "
        "save it as UTF-8."
    )


def test_a_non_utf8_workload_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "w.jsonl", b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=f"^{path}:2: the file is not UTF-8 text"):
        load_workload(path)


# ------------------------------------------------------------------------------------------------------ JSON

DIGITS = 5_001  # the probe: past CPython's 4,300-digit limit for int(str)
DEPTH = 100_000  # the probe: 100x Python's recursion limit


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("big.jsonl", '{"prompt": "ok"}\n{"prompt": "hi", "max_tokens": ' + "9" * DIGITS + "}\n",
         f":2: invalid JSON (A number has {DIGITS:,} digits (at most 4,300 can be read) at column 32)"),
        ("deep.jsonl", '{"prompt": "hi", "metadata": ' + "[" * DEPTH + "]" * DEPTH + "}\n",
         f":1: invalid JSON (Nesting too deep ({DEPTH + 1:,} levels"),
        ("big.json", '[{"conversations": [{"from": "human", "value": "hi"}]},\n {"x": ' + "9" * DIGITS + "}]\n",
         f":2: invalid JSON (A number has {DIGITS:,} digits"),
        ("deep.json", '[\n{"conversations": [{"from": "human", "value": "hi"}], "x": ' + "[" * DEPTH + "]" * DEPTH
         + "}]\n", f":2: invalid JSON (Nesting too deep ({DEPTH + 1:,} levels"),
    ],
)
def test_huge_numbers_and_deep_nesting_in_workloads_are_located(
    tmp_path: Path, name: str, body: str, message: str
) -> None:
    path = _write(tmp_path, name, body)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert str(info.value).startswith(f"{path}{message}")
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.parametrize("max_tokens", ["1e100", str(10**23), "10000001", "0"])
def test_absurd_max_tokens_are_refused(tmp_path: Path, max_tokens: str) -> None:
    path = _write(tmp_path, "w.jsonl", '{"prompt": "hi", "max_tokens": ' + max_tokens + "}\n")
    with pytest.raises(WorkloadError, match=':1: "max_tokens" must be an integer > 0 and <= 10,000,000, but got'):
        load_workload(path)


def test_the_longest_context_window_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path, "w.jsonl", '{"prompt": "hi", "max_tokens": 10000000}\n')
    [(_, request)] = load_workload(path).requests()
    assert request.max_tokens == 10_000_000


def test_a_record_with_thousands_of_unknown_keys_gets_a_short_message(tmp_path: Path) -> None:
    record = {"prompt": "hi", **{f"key{i:05d}" + "x" * 100: 1 for i in range(5000)}}
    path = _write(tmp_path, "w.jsonl", json.dumps(record) + "\n")
    with pytest.raises(WorkloadError, match=r"unknown keys \[.*\.\.\. \(5000 in all\)\]") as info:
        load_workload(path)
    # What the message adds to the file's path (the user's; 10 characters longer under pytest-xdist) is bounded.
    assert len(str(info.value).replace(str(path), "")) < MAX_MESSAGE


def test_policy_and_plugin_config_json_are_bounded_too(tmp_path: Path) -> None:
    deep = _write(tmp_path, "policy.json", '{"version": ' + "[" * DEPTH + "]" * DEPTH + "}")
    with pytest.raises(PolicyFileError, match=f"{deep}: not valid JSON: Nesting too deep"):
        load_policy(deep)
    big = _write(tmp_path, "plugin.json", '{"max_k": ' + "9" * DIGITS + "}")
    with pytest.raises(PluginConfigError, match=f"{big}: not valid JSON: A number has {DIGITS:,} digits"):
        PluginConfig.load(big)
    latin = _write(tmp_path, "plugin2.json", b'{"mode": "caf\xe9"}')
    with pytest.raises(PluginConfigError, match=f"{latin}:1: the plugin config is not UTF-8 text"):
        PluginConfig.load(latin)
    with pytest.raises(json.JSONDecodeError, match="Extra data: line 1 column 4"):
        load_json_text("{} []")


# ------------------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("body", ['{"prompt": "x", "n": ' + "7" * DIGITS + "}\n", "[" * DEPTH + "\n"])
def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path, body: str) -> None:
    path = _write(tmp_path, "w.jsonl", body)
    result = CliRunner().invoke(
        profile, ["--model", "gpt-oss-20b", "--drafter", "x", "--workload", str(path), "--db", str(tmp_path / "p.db")]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}:1: invalid JSON"), result.output


# ------------------------------------------------------------------ issue 44.4: special and oversized files


@pytest.fixture
def no_hang() -> Any:
    """Fail a test that blocks (a FIFO read with no writer used to hang forever) instead of hanging the suite."""

    def expired(_signum: int, _frame: Any) -> None:
        raise TimeoutError("the reader blocked")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(int(FAST_S))
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


_READERS: dict[str, tuple[Any, type[Exception]]] = {
    "--space": (load_space_file, ConfigError),
    "--policy": (load_policy, PolicyFileError),
    "plugin config": (PluginConfig.load, PluginConfigError),
    "--catalog": (load_user_catalog, ConfigError),
}


@pytest.mark.parametrize("reader", list(_READERS))
def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path, reader: str, no_hang: None) -> None:
    load, error = _READERS[reader]
    fifo = tmp_path / "input.yaml"
    os.mkfifo(fifo)
    with pytest.raises(error, match=r"input\.yaml: the .* is a FIFO, not a regular file; give a file\."):
        load(fifo)
    with pytest.raises(error, match=r"^/dev/zero: the .* is a device, not a regular file; give a file\."):
        load("/dev/zero")


@pytest.mark.parametrize("reader", ["--space", "--policy", "plugin config"])
def test_a_file_past_the_bound_is_refused_before_it_is_read(tmp_path: Path, reader: str) -> None:
    load, error = _READERS[reader]
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:  # sparse: the size is what counts, not the disk it takes
        f.truncate(MAX_TEXT_BYTES + 1)
    with pytest.raises(error, match=rf"big\.yaml: the .* has more than {MAX_TEXT_BYTES:,} bytes"):
        load(path)
