"""GPU names as people and nvidia-smi write them (issue 13.5), and GPU detection through NVML with nvidia-smi as the
fallback (issue 13.9)."""

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

    result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--gpu", "NVIDIA H100 PCIe",
                                       "--concurrency", "1", "--max-k", "2", "--trials", "5", "--json",
                                       "--db", str(tmp_path / "p.db")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["device"] == "NVIDIA H100 PCIe 80GB"


# --------------------------------------------------------------------------------------------------- detection


class _NVMLError(Exception):
    pass


def _fake_pynvml(names: list[str], *, fail_init: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError  # type: ignore[attr-defined]
    calls: list[str] = []

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")
        calls.append("init")

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: b"570.86.15"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(names)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: names[h]  # type: ignore[attr-defined]
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
    fresh.setattr(environment, "_nvidia_gpus", lambda: pytest.fail("nvidia-smi must not run when NVML answers"))
    fresh.setenv("CUDA_VISIBLE_DEVICES", "1")
    env = environment.detect_environment()
    assert (env["device"], env["gpu_count"], env["driver"]) == ("NVIDIA H100 80GB HBM3", 1, "570.86.15")
    assert fake.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert get_gpu(env["device"]).key == "h100"  # what NVML says is a name the catalog takes


def test_nvidia_smi_is_the_fallback_when_nvml_cannot_load(fresh: pytest.MonkeyPatch) -> None:
    fresh.setitem(sys.modules, "pynvml", _fake_pynvml([], fail_init=True))
    fresh.setattr(environment, "_nvidia_gpus", lambda: [{"index": "0", "name": "NVIDIA H200", "driver": "570"}])
    env = environment.detect_environment()
    assert (env["device"], env["gpu_count"]) == ("NVIDIA H200", 1)


def test_no_nvml_and_no_nvidia_smi_is_a_cpu(fresh: pytest.MonkeyPatch) -> None:
    fresh.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    fresh.setattr(environment, "_nvidia_gpus", lambda: [])
    assert environment.detect_environment()["device"] == "cpu"
