"""GPU names as people and nvidia-smi write them (issue 13.5), GPU detection through NVML alone (issues 13.9, 32.5):
names and total memory, and a --gpu that contradicts the detected GPU."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from autotune import environment
from autotune.catalogs import get_gpu, list_gpus
from autotune.errors import UnknownModelError


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H100 PCIe", "h100-pcie"),           # nvidia-smi, PCIe card
        ("NVIDIA H100 80GB HBM3", "h100"),           # nvidia-smi, SXM part
        ("H100 SXM", "h100"),
        ("h100-pcie", "h100-pcie"),
        ("h100_sxm5", "h100"),
        ("a100-40gb", "a100-40gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("A100 40GB", "a100-40gb"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 SXM 141GB", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("  h200 ", "h200"),
    ],
)
def test_names_people_and_nvidia_smi_use(name: str, key: str) -> None:
    assert get_gpu(name).key == key


def test_pcie_and_40gb_parts_have_their_own_figures() -> None:
    # Datasheets: H100 PCIe 2.0 TB/s and 756 dense BF16 TFLOPS vs SXM 3.35 TB/s and 989; A100 40GB 1,555 GB/s.
    pcie, sxm = get_gpu("h100-pcie"), get_gpu("h100")
    assert (pcie.memory_bandwidth_gbps, pcie.bf16_tflops) == (2000, 756)
    assert pcie.memory_bandwidth_gbps < sxm.memory_bandwidth_gbps and pcie.bf16_tflops < sxm.bf16_tflops
    assert (get_gpu("a100-40gb").memory_bandwidth_gbps, get_gpu("a100-40gb").memory_gb) == (1555, 40)


def test_unknown_gpu_lists_the_catalog_and_says_what_is_absent() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_gpu("NVIDIA GB200")
    message = str(info.value)
    assert "\n" not in message
    for gpu in list_gpus():
        assert f"{gpu.key} ({gpu.display_name})" in message
    assert "GB200" in message and "not in the catalog" in message


def test_a_known_family_in_an_unknown_form_names_the_closest_entry() -> None:
    with pytest.raises(UnknownModelError, match=r"closest entry is a100 .*--gpu a100"):
        get_gpu("NVIDIA A100 80GB PCIe")


def test_search_accepts_an_nvidia_smi_name_and_says_which_gpu(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from autotune.cli import main

    # gpt-oss-20b: vLLM would not start gpt-oss-120b on one 80 GB card (autotune.fit), which is not the point here.
    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-20b", "--gpu", "NVIDIA H100 PCIe",
                                       "--concurrency", "1", "--max-k", "2", "--trials", "5", "--json",
                                       "--db", str(tmp_path / "p.db")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["device"] == "NVIDIA H100 PCIe 80GB"


# --------------------------------------------------------------------------------------------------- detection


class _NVMLError(Exception):
    pass


_H100_BYTES = 81_559 * 2**20  # what NVML reports as the total of an H100 80GB HBM3


def _fake_pynvml(names: list[str], *, fail_init: bool = False, memory: int | None = _H100_BYTES) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError  # type: ignore[attr-defined]
    calls: list[str] = []

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")
        calls.append("init")

    def memory_info(handle: int) -> Any:
        if memory is None:
            raise _NVMLError("Not Supported")
        return types.SimpleNamespace(total=memory + handle, free=1, used=2)

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: b"570.86.15"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: names[h]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = memory_info  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    return module


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    environment._detect.cache_clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield monkeypatch
    environment._detect.cache_clear()


def test_gpus_come_from_nvml(fresh: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"])
    fresh.setitem(sys.modules, "pynvml", fake)
    fresh.setenv("CUDA_VISIBLE_DEVICES", "1")
    env = environment.detect_environment()
    assert (env["device"], env["gpu_count"], env["driver"]) == ("NVIDIA H100 80GB HBM3", 1, "570.86.15")
    assert fake.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert get_gpu(env["device"]).key == "h100"  # what NVML says is a name the catalog takes


def test_each_gpu_comes_with_its_total_memory(fresh: pytest.MonkeyPatch) -> None:
    fresh.setitem(sys.modules, "pynvml", _fake_pynvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]))
    gpus = environment.detect_gpus()
    assert [(g["index"], g["memory_bytes"]) for g in gpus] == [("0", _H100_BYTES), ("1", _H100_BYTES + 1)]


def test_a_gpu_whose_memory_nvml_cannot_report_is_still_listed(fresh: pytest.MonkeyPatch) -> None:
    fresh.setitem(sys.modules, "pynvml", _fake_pynvml(["NVIDIA H200"], memory=None))
    assert [(g["name"], g["memory_bytes"]) for g in environment.detect_gpus()] == [("NVIDIA H200", None)]


@pytest.mark.parametrize("pynvml", [None, _fake_pynvml([], fail_init=True)], ids=["not-installed", "no-driver"])
def test_without_nvml_the_machine_is_a_cpu_and_nvidia_smi_is_not_run(
    fresh: pytest.MonkeyPatch, pynvml: types.ModuleType | None
) -> None:
    fresh.setitem(sys.modules, "pynvml", pynvml)  # None: import pynvml raises ImportError
    fresh.setattr(environment.os, "environ", {**environment.os.environ, "PATH": "/nonexistent"})
    import subprocess

    fresh.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nvidia-smi must not run"))
    assert environment.detect_gpus() == []
    assert environment.detect_environment()["device"] == "cpu"


# ------------------------------------------------------------------------------------------------ --gpu check
_EIGHT_H100 = [{"index": str(i), "name": "NVIDIA H100 80GB HBM3", "driver": "570", "memory_bytes": _H100_BYTES}
               for i in range(8)]


def test_a_gpu_flag_that_contradicts_the_detected_gpu_says_so_in_one_line() -> None:
    message = environment.gpu_flag_conflict("h200", _EIGHT_H100)
    assert message == ("--gpu h200 contradicts the detected NVIDIA H100 80GB HBM3 (x8); drop --gpu, or use "
                       "--backend model to predict for another GPU")


@pytest.mark.parametrize("flag", ["h100", "H100 SXM", "NVIDIA H100 80GB HBM3"])
def test_a_gpu_flag_naming_the_detected_gpu_is_consistent(flag: str) -> None:
    assert environment.gpu_flag_conflict(flag, _EIGHT_H100) is None


def test_no_detected_gpu_or_one_outside_the_catalog_leaves_the_flag_alone() -> None:
    assert environment.gpu_flag_conflict("h200", []) is None  # predicting on a CPU machine
    rtx = [{"index": "0", "name": "NVIDIA GeForce RTX 4090", "driver": "570", "memory_bytes": 24 * 10**9}]
    assert environment.gpu_flag_conflict("l40s", rtx) is None  # --gpu picks the figures for an unlisted card


def test_an_unknown_gpu_flag_is_an_unknown_gpu() -> None:
    with pytest.raises(UnknownModelError, match="unknown GPU"):
        environment.gpu_flag_conflict("z9000", _EIGHT_H100)


def test_available_ram_is_memavailable(tmp_path: Any) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    assert environment.available_ram_bytes(meminfo) == 20_000_000 * 1024
    assert (environment.available_ram_bytes(tmp_path / "absent") or 0) > 0  # os.sysconf's free pages


# --------------------------------------------------------------------------------------------------- MIG (issue 39.8)
_A100_BYTES = 81_920 * 2**20  # NVML's total of an A100-SXM4-80GB
_SLICE_BYTES = 40_192 * 2**20  # NVML's total of one 3g.40gb MIG slice of it (nvidia-smi: 40192MiB)


def _fake_mig_pynvml() -> types.ModuleType:
    """NVML as it answers for one A100 80GB in MIG mode with two 3g.40gb slices (of 7 possible slots): the parent
    reports the whole card; MIG handles report their slice; empty slots raise NVML_ERROR_NOT_FOUND."""
    module = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError  # type: ignore[attr-defined]
    module.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    parent = "gpu0"
    slices = {0: "mig0", 1: "mig1"}
    names = {parent: "NVIDIA A100-SXM4-80GB", "mig0": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
             "mig1": "NVIDIA A100-SXM4-80GB MIG 3g.40gb"}
    uuids = {parent: "GPU-5c1d8b2e-0000-0000-0000-000000000000", "mig0": "MIG-0b1a2c3d-1111-1111-1111-111111111111",
             "mig1": "MIG-9e8f7a6b-2222-2222-2222-222222222222"}

    def mig_handle(handle: str, index: int) -> str:
        if handle != parent or index not in slices:
            raise _NVMLError("Not Found")
        return slices[index]

    def mig_mode(handle: str) -> tuple[int, int]:
        if handle != parent:
            raise _NVMLError("Not Supported")
        return (1, 1)  # (current, pending): enabled

    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: parent  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: names[h]  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: uuids[h]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = (  # type: ignore[attr-defined]
        lambda h: types.SimpleNamespace(total=_A100_BYTES if h == parent else _SLICE_BYTES, free=1, used=2))
    module.nvmlDeviceGetMigMode = mig_mode  # type: ignore[attr-defined]
    module.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7  # type: ignore[attr-defined]
    module.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    return module


def test_under_mig_each_slice_is_a_gpu_with_its_own_memory(fresh: pytest.MonkeyPatch) -> None:
    fresh.setitem(sys.modules, "pynvml", _fake_mig_pynvml())
    gpus = environment.detect_gpus()
    assert [(g["index"], g["name"], g["memory_bytes"]) for g in gpus] == [
        ("0:0", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", _SLICE_BYTES),
        ("0:1", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", _SLICE_BYTES),
    ]
    # CUDA_VISIBLE_DEVICES naming one slice by its UUID (what `nvidia-smi -L` prints) leaves that slice.
    fresh.setenv("CUDA_VISIBLE_DEVICES", "MIG-9e8f7a6b-2222-2222-2222-222222222222")
    assert [g["index"] for g in environment.detect_gpus()] == ["0:1"]
    # The parent's index or UUID leaves all its slices.
    fresh.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert [g["index"] for g in environment.detect_gpus()] == ["0:0", "0:1"]


def test_the_fit_under_mig_uses_the_slice_memory(fresh: pytest.MonkeyPatch) -> None:
    from autotune.search.machine import Checkpoints, check_fit

    fresh.setitem(sys.modules, "pynvml", _fake_mig_pynvml())
    # A 16 GB bf16 model (Llama-3-8B-shaped): one slice of 0.92 x 42.1 GB = 38.8 GB holds it; the check says 42.1 GB,
    # not the card's 85.9 GB.
    target = types.SimpleNamespace(name="org/llama-8b", weight_bytes=16_060_000_000, config={
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128})
    memory = check_fit(Checkpoints(target=target), environment.detect_gpus(), seqs=8, tokens=8192,
                       tensor_parallel_size=1, gpu_memory_utilization=None, cpu_kv_cache_gib=None)
    assert memory is not None and memory.fits
    assert memory.per_device_budget == int(0.92 * _SLICE_BYTES)
    assert "0.92 x 42.1 GB = 38.8 GB on one NVIDIA A100-SXM4-80GB MIG 3g.40gb" in memory.message
