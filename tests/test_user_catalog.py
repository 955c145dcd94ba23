"""A user's catalog file adds models, drafters and GPUs without editing the package (issue 32.3): --catalog FILE
(`use_catalog`) or PEAGLE_CATALOG, the packaged schema and rules, user entries first, bad files in one line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.catalogs import (
    CATALOG_ENV_VAR,
    clear_catalogs,
    drafters_for,
    get_drafter,
    get_gpu,
    list_models,
    load_user_catalog,
    resolve_model,
    use_catalog,
)
from autotune.errors import ConfigError, UnknownModelError

TINY = """
models:
  - name: org/target
    aliases: [tiny-target]
    num_layers: 4
    hidden_size: 256
    num_attention_heads: 4
    num_kv_heads: 4
    head_dim: 64
    vocab_size: 260
    ffn_intermediate_size: 768
    tie_word_embeddings: false
    num_experts: 0
    experts_per_token: 0
    total_params_b: 0.0035
    active_params_b: 0.0035
    expert_params_b: 0
    weight_format: bf16
    bytes_per_param_expert: 2
    bytes_per_param_other: 2
    kv_bytes_per_element: 2
    sliding_window: null
    sliding_window_layer_fraction: 0
    source: tests/fixtures/models/target/config.json
drafters:
  - name: org/drafter-2l
    aliases: [tiny-head]
    target: org/target
    method: draft_model
    num_layers: 2
    hidden_size: 128
    trained_k: null
    recommended_k: null
    parallel_drafting: false
    source: tests/fixtures/models/drafter-2l (no published acceptance; measure it)
gpus:
  - key: rtx-6000-ada
    display_name: NVIDIA RTX 6000 Ada Generation
    aliases: ["NVIDIA RTX 6000 Ada Generation", rtx6000ada]
    memory_gb: 48
    memory_bandwidth_gbps: 960
    bf16_tflops: 364
    fp8_tflops: 728
    fp4_tflops: null
    source: NVIDIA RTX 6000 Ada datasheet (dense figures)
"""


@pytest.fixture(autouse=True)
def no_user_catalogs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(CATALOG_ENV_VAR, raising=False)
    clear_catalogs()
    yield
    clear_catalogs()


def _write(tmp_path: Path, text: str, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_user_model_is_found_by_its_alias_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UnknownModelError):
        resolve_model("tiny-target")
    monkeypatch.setenv(CATALOG_ENV_VAR, str(_write(tmp_path, TINY)))
    model = resolve_model("tiny-target")
    assert (model.name, model.num_layers, model.head_dim) == ("org/target", 4, 64)
    assert "openai/gpt-oss-120b" in {m.name for m in list_models()}  # the packaged catalog is still there
    monkeypatch.delenv(CATALOG_ENV_VAR)
    with pytest.raises(UnknownModelError):
        resolve_model("tiny-target")  # read at lookup time


def test_a_user_gpu_and_drafter_are_found(tmp_path: Path) -> None:
    use_catalog(_write(tmp_path, TINY))
    gpu = get_gpu("NVIDIA RTX 6000 Ada Generation")
    assert (gpu.key, gpu.memory_gb, gpu.fp4_tflops) == ("rtx-6000-ada", 48.0, None)
    head = get_drafter("tiny-head", target="tiny-target")
    assert (head.name, head.target, head.reference_acceptance) == ("org/drafter-2l", "org/target", {})
    assert [d.name for d in drafters_for("tiny-target")] == ["org/drafter-2l"]


def test_a_user_entry_wins_over_the_packaged_one_of_the_same_name(tmp_path: Path) -> None:
    packaged = get_gpu("h100")
    override = TINY.split("gpus:")[0] + f"""gpus:
  - key: h100
    display_name: NVIDIA H100 SXM 80GB (our clocks)
    aliases: []
    memory_gb: 80
    memory_bandwidth_gbps: 3000
    bf16_tflops: {packaged.bf16_tflops}
    fp8_tflops: {packaged.fp8_tflops}
    fp4_tflops: null
    source: measured on our cluster
"""
    use_catalog(_write(tmp_path, override))
    assert get_gpu("h100").memory_bandwidth_gbps == 3000
    assert get_gpu("NVIDIA H100 80GB HBM3").memory_bandwidth_gbps == 3000


def test_one_file_may_hold_a_single_section(tmp_path: Path) -> None:
    gpus_only = "gpus:" + TINY.split("gpus:")[1]
    catalog = load_user_catalog(_write(tmp_path, gpus_only))
    assert ([g.key for g in catalog.gpus], catalog.models, catalog.drafters) == (["rtx-6000-ada"], (), ())


def test_a_changed_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, TINY)
    monkeypatch.setenv(CATALOG_ENV_VAR, str(path))
    assert get_gpu("rtx6000ada").memory_gb == 48
    path.write_text(TINY.replace("memory_gb: 48", "memory_gb: 96"))
    os.utime(path, ns=(1, 2))  # a different mtime even within the clock's resolution
    assert get_gpu("rtx6000ada").memory_gb == 96


_DRAFTER_SOURCE = "    source: tests/fixtures/models/drafter-2l (no published acceptance; measure it)"
_BAD_FILES = {
    "missing key": (lambda t: t.replace("    memory_gb: 48\n", ""),
                    r"catalog\.yaml entry 'rtx-6000-ada'.*missing keys \['memory_gb'\]"),
    "not a number": (lambda t: t.replace("memory_gb: 48", "memory_gb: lots"),
                     r"catalog\.yaml entry 'rtx-6000-ada'.*memory_gb must be a number"),
    "unknown key": (lambda t: t.replace("num_layers: 4", "num_layers: 4\n    colour: blue"),
                    r"entry 'org/target'.*unknown keys \['colour'\]"),
    "negative": (lambda t: t.replace("head_dim: 64", "head_dim: -64"), r"head_dim must be positive"),
    # Issue 44.5: each of these gave a traceback, or a stored recommendation from meaningless inputs.
    "NaN bandwidth": (lambda t: t.replace("memory_bandwidth_gbps: 960", "memory_bandwidth_gbps: .nan"),
                      r"entry 'rtx-6000-ada'.*memory_bandwidth_gbps must be a finite number"),
    "infinite memory": (lambda t: t.replace("memory_gb: 48", "memory_gb: .inf"), r"memory_gb must be a finite number"),
    "zero layers": (lambda t: t.replace("num_layers: 4", "num_layers: 0", 1), r"num_layers must be positive"),
    "1e308 parameters": (lambda t: t.replace("total_params_b: ", "total_params_b: 1.0e+308 #", 1),
                         r"total_params_b must be at most 1e\+09"),
    "K of a billion": (
        lambda t: t.replace(_DRAFTER_SOURCE, _DRAFTER_SOURCE + "\n    reference_acceptance: {mt-bench: {k: 1000000000, "
                            "acceptance_length: 3, source: ours}}"),
        r"entry 'org/drafter-2l'.*K=1000000000, outside \[1, 16\]"),
    "not a bool": (lambda t: t.replace("parallel_drafting: false", "parallel_drafting: maybe"),
                   r"parallel_drafting must be true or false"),
    "no source": (lambda t: t.replace("source: NVIDIA RTX 6000 Ada datasheet (dense figures)", "source: ''"),
                  r"entry 'rtx-6000-ada' has no source"),
    "unknown section": (lambda t: t + "\nbackends: []\n", r"unknown top-level keys \['backends'\]"),
    "section not a list": (lambda t: "models: {}\n", r"models must be a list"),
    "entry not a mapping": (lambda t: "gpus:\n  - 3\n", r"gpus entry #0 is not a mapping"),
    "malformed YAML": (lambda t: "models: [\n", r"catalog\.yaml: line"),
    "duplicate name": (lambda t: t.replace("gpus:", "gpus:" + t.split("gpus:")[1].rstrip("\n") + "\n", 1),
                       r"gpus entries #0 and #1 are both named 'rtx-6000-ada'; keep one"),
    "name with a newline": (lambda t: t.replace("name: org/target", 'name: "org/tar\\nget"', 1),
                            r"models entry #0 has the name 'org/tar\\nget'; a name is one line of printable text"),
    "impossible acceptance": (
        lambda t: t.replace(_DRAFTER_SOURCE, _DRAFTER_SOURCE + "\n    reference_acceptance: {mt-bench: {k: 5, "
                            "acceptance_length: 9, source: ours}}"),
        r"entry 'org/drafter-2l'.*AL 9.0 at K=5"),
}


@pytest.mark.parametrize("edit,expected", list(_BAD_FILES.values()), ids=list(_BAD_FILES))
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path: Path, edit: object, expected: str) -> None:
    path = _write(tmp_path, edit(TINY))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=expected) as info:
        use_catalog(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message


def test_a_file_too_big_or_not_a_file_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("models: []\n" + "#" * (2 * 1024 * 1024))
    with pytest.raises(ConfigError, match="more than 1,048,576"):
        load_user_catalog(big)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_user_catalog(tmp_path)
    with pytest.raises(ConfigError, match="cannot read the catalog file"):
        load_user_catalog(tmp_path / "absent.yaml")


def test_an_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"_a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}]" for i in range(1, 9)]
    path = _write(tmp_path, "_" + "\n".join(lines) + "\nmodels: []\n")
    with pytest.raises(ConfigError, match="expands to more than"):
        load_user_catalog(path)


def test_the_group_catalog_option_fails_in_one_line(tmp_path: Path) -> None:
    # Issue 44.5: `peagle-tune --catalog /missing.yaml list gpus` printed a 41-53 line traceback.
    from click.testing import CliRunner

    from autotune.cli import main

    missing = tmp_path / "missing.yaml"
    result = CliRunner().invoke(main, ["--catalog", str(missing), "list", "gpus"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert f"Error: Invalid value for '--catalog': {missing}: cannot read the catalog file (No such file or " \
           "directory)." in result.output
    assert "Traceback" not in result.output
