"""`peagle-tune serve --model M --drafter D` always serves with D (issue 10.4): with no stored recommendation (cold
start from the default controller settings, learning online) and when the recommendation says "no speculation"; and
on CPU it picks `--gpu-memory-utilization` from free RAM so vLLM starts beside other processes. All via --dry-run:
no engine starts."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hub_cache import HubCache, hub_cache_fixture  # noqa: F401  (tests/ is on sys.path; the hub_cache fixture)

from autotune.cli.serve import serve
from policies import ControllerSettings
from policies.plugin import SCHEDULER_CLS, PluginConfig
from store import Store

MODEL = "my-org/tiny-target"  # in no catalog, so the roofline knows no step cost for it
FIXTURES = Path(__file__).parent / "fixtures" / "models"
DRAFTER = str(FIXTURES / "drafter-1l")  # a parallel-drafting draft model (mask token in its config.json)
GIB_KB = 1024**2  # kB per GiB, the unit of /proc/meminfo


@pytest.fixture(autouse=True)
def cpu_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine without GPUs whose /proc/meminfo says 16 GiB total, 4 GiB available (other processes hold 12)."""
    import autotune.environment as environment
    import autotune.serving._memory as memory

    cpu = {"device": "cpu", "gpu_count": 0, "gpu_names": [], "driver": None, "vllm_version": None,
           "torch_version": None, "python_version": "3.11", "platform": "test"}
    monkeypatch.setattr(environment, "detect_environment", lambda: dict(cpu))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {16 * GIB_KB} kB\nMemFree:         {1 * GIB_KB} kB\n"
                       f"MemAvailable:    {4 * GIB_KB} kB\n")
    monkeypatch.setattr(memory, "MEMINFO_PATH", meminfo)
    return meminfo


def dry_run(db: str, *args: str) -> Result:
    result = CliRunner().invoke(serve, ["--model", MODEL, "--db", db, "--dry-run", "--verbose", *args])
    assert result.exit_code == 0, result.output
    return result


def adaptive_launch(stdout: str) -> list[str]:
    """The `vllm serve` arguments (from "serve" on) of what `peagle-tune serve` runs, as the dry run prints it."""
    part = stdout.split("# What `peagle-tune serve` runs", 1)[1]
    line = next(ln for ln in part.splitlines() if "--scheduler-cls" in ln)
    words = shlex.split(line)
    return words[words.index("serve"):]


def plugin(stdout: str) -> PluginConfig:
    return PluginConfig.from_dict(json.loads(stdout.split("# plugin config", 1)[1].split("\n", 1)[1]))


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cold_start_with_a_drafter_serves_it_adaptively_and_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    result = dry_run(db, "--drafter", DRAFTER)
    argv = adaptive_launch(result.stdout)
    spec = json.loads(option(argv, "--speculative-config"))
    assert spec["method"] == "draft_model" and spec["parallel_drafting"] is True
    assert Path(spec["model"]).name.startswith(("drafter-1l", "drafter-"))  # the drafter (or vLLM-safe alias)
    assert spec["num_speculative_tokens"] >= 1
    assert option(argv, "--scheduler-cls") == SCHEDULER_CLS
    config = plugin(result.stdout)
    assert config.mode == "adaptive" and config.static_depth == 0  # falls back to no speculation
    assert config.adaptive is not None
    assert config.adaptive["policy"]["controller"] == ControllerSettings().to_dict()  # the default settings
    assert config.adaptive["acceptance"] == {}  # nothing known: learnt online
    notes = " ".join(result.stderr.split()).split("note: ")  # prose lines wrap at 100 columns
    cold = [note for note in notes if "cold start" in note.lower()]
    assert cold and any("learning" in note for note in cold), result.stderr


def test_cold_start_without_a_drafter_still_asks_for_a_search(tmp_path: Path) -> None:
    result = CliRunner().invoke(serve, ["--model", MODEL, "--db", f"sqlite:///{tmp_path / 'e.db'}", "--dry-run"])
    assert result.exit_code == 3, result.output
    assert "peagle-tune search --model my-org/tiny-target" in result.output


def add_no_spec_recommendation(db: str) -> int:
    with Store(db) as store:
        return store.add_recommendation(
            MODEL, gpu="cpu", objective="throughput",
            best_config={"method": "none", "max_num_seqs": 8, "max_num_batched_tokens": 1024},
            metrics={"acceptance_length": 1.0, "output_tokens_per_s": 300.0},
            provenance={"kind": "measured", "backend": "vllm", "device": "cpu"},
            class_policy={"chat": {"max_k": 0}, "code": {"max_k": 0}},
            workload_name="fixture", scenario={"concurrency": 8},
        )


def test_no_speculation_recommendation_plus_drafter_serves_the_drafter(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    rid = add_no_spec_recommendation(db)
    result = dry_run(db, "--drafter", DRAFTER)
    argv = adaptive_launch(result.stdout)
    spec = json.loads(option(argv, "--speculative-config"))
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] >= 1
    assert option(argv, "--max-num-seqs") == "8"  # the tuned batch limits stay
    config = plugin(result.stdout)
    assert config.mode == "adaptive" and config.static_depth == 0
    assert config.adaptive is not None
    # The no-speculation caps (0) would keep the drafter idle: the controller decides instead.
    assert all(c.get("max_k") is None for c in config.adaptive["policy"]["classes"].values())
    assert config.class_depths == {}
    assert f"recommendation #{rid}" in result.stderr


def test_no_speculation_recommendation_without_drafter_is_unchanged(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    add_no_spec_recommendation(db)
    result = dry_run(db)
    assert "--speculative-config" not in adaptive_launch(result.stdout)
    assert "WITHOUT speculation" in " ".join(result.stderr.split())


def test_cpu_memory_fraction_comes_from_available_ram(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    result = dry_run(db, "--drafter", DRAFTER)
    # 0.9 * 4 GiB available / 16 GiB total = 0.225, rounded down to 0.22 (vLLM then reserves 3.52 GiB <= 4 GiB free)
    assert option(adaptive_launch(result.stdout), "--gpu-memory-utilization") == "0.22"
    assert "--gpu-memory-utilization 0.22" in result.stdout.split("# What")[0]  # the plain line too
    assert "# CPU memory: --gpu-memory-utilization 0.22" in result.stdout
    assert "--gpu-memory-utilization 0.22" in " ".join(result.stderr.split())


def test_plenty_of_free_ram_keeps_vllms_default(tmp_path: Path, cpu_machine: Path) -> None:
    cpu_machine.write_text(f"MemTotal: {16 * GIB_KB} kB\nMemAvailable: {15 * GIB_KB} kB\n")
    result = dry_run(f"sqlite:///{tmp_path / 'empty.db'}", "--drafter", DRAFTER)
    # 0.9 * 15 / 16 = 0.84375 < 0.92 (vLLM's default): 0.84
    assert option(adaptive_launch(result.stdout), "--gpu-memory-utilization") == "0.84"
    cpu_machine.write_text(f"MemTotal: {16 * GIB_KB} kB\nMemAvailable: {int(16 * GIB_KB)} kB\n")
    result = dry_run(f"sqlite:///{tmp_path / 'empty.db'}", "--drafter", DRAFTER)
    assert option(adaptive_launch(result.stdout), "--gpu-memory-utilization") == "0.9"  # 0.9 * 16 / 16


@pytest.mark.parametrize("given", [["--gpu-memory-utilization", "0.5"], ["--gpu_memory_utilization=0.5"],
                                   ["--gpu-memory-util", "0.5"]])
def test_the_users_memory_fraction_wins(tmp_path: Path, given: list[str]) -> None:
    result = dry_run(f"sqlite:///{tmp_path / 'empty.db'}", "--drafter", DRAFTER, "--", *given)
    argv = adaptive_launch(result.stdout)
    assert argv[-len(given):] == given
    assert sum(a.replace("_", "-").startswith("--gpu-memory-util") for a in argv) == 1
    assert "# CPU memory" not in result.stdout
    assert "as given after `--`" in result.stderr


def test_a_gpu_machine_gets_no_cpu_memory_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.environment as environment

    gpu = {"device": "NVIDIA H200", "gpu_count": 1, "gpu_names": ["NVIDIA H200"], "driver": "x",
           "vllm_version": None, "torch_version": None, "python_version": "3.11", "platform": "test"}
    monkeypatch.setattr(environment, "detect_environment", lambda: dict(gpu))
    result = dry_run(f"sqlite:///{tmp_path / 'empty.db'}", "--drafter", DRAFTER)
    assert "--gpu-memory-utilization" not in result.stdout and "memory:" not in result.stderr


def test_meminfo_parsing_and_the_fraction(tmp_path: Path) -> None:
    from autotune.serving import cpu_memory_fraction, read_meminfo

    node = tmp_path / "node-meminfo"  # no MemAvailable: vLLM's own sum (free + file pages + reclaimable slab)
    node.write_text(f"MemTotal: {8 * GIB_KB} kB\nMemFree: {1 * GIB_KB} kB\nActive(file): {1 * GIB_KB} kB\n"
                    f"Inactive(file): {1 * GIB_KB} kB\nSReclaimable: {1 * GIB_KB} kB\n")
    total, available = read_meminfo(node) or (0, 0)
    assert (total, available) == (8 * 1024**3, 4 * 1024**3)
    assert cpu_memory_fraction(total, available) == 0.45  # 0.9 * 4 / 8
    assert cpu_memory_fraction(100, 0) == 0.01  # never 0 (vLLM needs > 0); vLLM then explains the memory shortage
    assert read_meminfo(tmp_path / "missing") is None


def test_a_hint_names_a_hostile_model_as_one_shell_word(tmp_path: Path) -> None:
    # Issue 44.6: pasting the hint for a model named `t$(touch PWNED)x` ran the command substitution.
    hostile = "my-org/t$(touch PWNED)x"
    result = CliRunner().invoke(serve, ["--model", hostile, "--db", f"sqlite:///{tmp_path / 'e.db'}", "--dry-run"])
    assert result.exit_code == 3, result.output
    hint = result.output.split("`peagle-tune search ", 1)[1].split("`", 1)[0]
    assert shlex.split(hint)[:2] == ["--model", hostile]  # one word, as typed: the shell substitutes nothing
    assert "'my-org/t$(touch PWNED)x'" in hint


def test_a_cached_repo_id_drafter_is_served_as_search_takes_it(tmp_path: Path, hub_cache: HubCache) -> None:
    # Issue 44.6: `serve --drafter org/name` (a cached repo id that `search` accepts) was "unknown drafter".
    result = dry_run(f"sqlite:///{tmp_path / 'empty.db'}", "--drafter", "org/drafter-1l")
    spec = json.loads(option(adaptive_launch(result.stdout), "--speculative-config"))
    assert (spec["method"], spec["model"], spec["parallel_drafting"]) == ("draft_model", "org/drafter-1l", True)
