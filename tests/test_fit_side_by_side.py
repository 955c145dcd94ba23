"""Memory of profile's launches (issue 39, items 5 and 6): every launch passes the workload's max_model_len, and
``profile --side-by-side`` on a GPU gives each of its two engines half the gpu_memory_utilization one would take,
or refuses in one line when half does not hold the drafter's engine; on CPU nothing is split. NVML's answer (the
GPU list) is the only stand-in: the checkpoints are the test fixtures, read as a launch reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.engine import EngineOptions
from autotune.errors import ConfigError
from autotune.fit import split_gpu_memory_utilization
from autotune.profiling._memory import launch_memory
from autotune.spec import SpecConfig
from autotune.workloads import load_workload

MODELS = Path(__file__).parent / "fixtures" / "models"
TARGET = str(MODELS / "target")
DRAFTER = str(MODELS / "drafter-1l")
H100 = {"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "memory_bytes": 85_520_809_984}


@pytest.fixture()
def workload(tmp_path: Path) -> object:
    # The fixtures' tokenizer is byte-level: a 100-character prompt (plus "user: ") is 106 tokens.
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 48}) + "\n")
    return load_workload(str(path))


def test_the_launch_passes_the_workload_max_model_len_counted_with_the_tokenizer(workload: object) -> None:
    lines: list[str] = []
    options = launch_memory(EngineOptions(), TARGET, [DRAFTER], workload, 4, False, lines.append,  # type: ignore[arg-type]
                            gpus=[])
    # 106 tokens + 128 for a chat template = 234, + 25% = 293, + 48 output = 341 -> 512, the fixture's
    # max_position_embeddings.
    assert options.max_model_len == 512 and options.engine_args(SpecConfig())["max_model_len"] == 512
    assert any("counted with the model's tokenizer" in line for line in lines)
    # The user's value wins.
    assert launch_memory(EngineOptions(max_model_len=300), TARGET, [DRAFTER], workload, 4, False,  # type: ignore[arg-type]
                         lines.append, gpus=[]).max_model_len == 300


def test_a_long_raw_prompt_is_capped_at_the_model_limit_and_a_short_one_is_not(tmp_path: Path) -> None:
    # Raw prompts (no chat template): 150 bytes + 25% = 188, + 48 = 236 -> 256; 500 bytes -> 673 -> 1024 -> 512.
    for chars, expected in ((150, 256), (500, 512)):
        path = tmp_path / f"raw{chars}.jsonl"
        path.write_text(json.dumps({"prompt": "y" * chars, "max_tokens": 48}) + "\n")
        options = launch_memory(EngineOptions(), TARGET, [], load_workload(str(path)), 4, False,
                                lambda _line: None, gpus=[])
        assert options.max_model_len == expected


def test_side_by_side_on_a_gpu_gives_each_engine_half(workload: object) -> None:
    lines: list[str] = []
    options = launch_memory(EngineOptions(), TARGET, [DRAFTER], workload, 4, True, lines.append,  # type: ignore[arg-type]
                            gpus=[H100])
    assert options.engine_extra["gpu_memory_utilization"] == 0.46 == split_gpu_memory_utilization(0.92, 2)
    assert any("each engine takes gpu_memory_utilization 0.46 (half of 0.92)" in line for line in lines)
    # The user's utilization is the one halved.
    user = EngineOptions(engine_extra={"gpu_memory_utilization": 0.8})
    assert launch_memory(user, TARGET, [DRAFTER], workload, 4, True, lines.append,  # type: ignore[arg-type]
                         gpus=[H100]).engine_extra["gpu_memory_utilization"] == 0.4


def test_side_by_side_refuses_in_one_line_when_half_does_not_fit(workload: object) -> None:
    # An 8 GB GPU: one engine at 0.92 has 7.36 GB for the fixtures' few MB + 3.5 GiB (3.76 GB) of overhead; half,
    # 0.46 x 8 GB = 3.68 GB, does not hold the overhead.
    small = {**H100, "name": "NVIDIA Small 8GB", "memory_bytes": 8 * 10**9}
    with pytest.raises(ConfigError) as raised:
        launch_memory(EngineOptions(), TARGET, [DRAFTER], workload, 4, True, lambda _line: None,  # type: ignore[arg-type]
                      gpus=[small])
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("--side-by-side keeps two engines on NVIDIA Small 8GB, each at gpu_memory_utilization "
                              "0.46 (half of 0.92), and the drafter's does not fit: ")
    assert "0.46 x 8.0 GB = 3.7 GB" in message and message.endswith("or profile without --side-by-side.")


def test_side_by_side_on_cpu_splits_nothing(workload: object) -> None:
    options = launch_memory(EngineOptions(), TARGET, [DRAFTER], workload, 4, True, lambda _line: None,  # type: ignore[arg-type]
                            gpus=[])
    assert "gpu_memory_utilization" not in options.engine_extra


def test_the_split_rounds_down() -> None:
    assert split_gpu_memory_utilization(0.92, 2) == 0.46
    assert split_gpu_memory_utilization(0.9, 4) == 0.22  # 0.225 rounded down: the last engine must still start
    with pytest.raises(ValueError):
        split_gpu_memory_utilization(0.92, 0)
