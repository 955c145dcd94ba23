"""`peagle-tune serve` without an engine: tuned-config lookup, its errors, and the exact launch a dry run prints."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli.serve import serve
from autotune.errors import UsageError
from autotune.serving import build_launch, resolve_tuned_config
from policies import ClassPolicy, PolicyFile, PolicyFileError, RequestPolicy, StepCostModel
from policies.plugin import CONFIG_ENV, SCHEDULER_CLS, PluginConfig
from store import Store

MODEL = "my-org/tiny-target"  # in no catalog: the CLI keeps the name as given
DRAFTER = "my-org/tiny-drafter-pd"
COST = {"base": 6.0, "per_request": 0.1, "per_verified_token": 0.2, "drafter_fixed": 1.5, "drafter_per_request": 0.05}
CLASS_CAPS = {"predictable": {"max_k": 5}, "entropic": {"max_k": 1}}
ENV = {"device": "cpu", "gpu_count": 0, "driver": None, "vllm_version": "0.32.0", "torch_version": "2.13.0"}


def add_recommendation(store: Store, *, gpu: str = "cpu", k: int = 3, class_policy: dict[str, Any] | None = None,
                       al: float = 2.4, drafter: str = DRAFTER, launch_k: int | None = None) -> int:
    return store.add_recommendation(
        MODEL,
        gpu=gpu,
        objective="throughput",
        best_config={"method": "draft_model", "drafter": drafter, "num_speculative_tokens": k,
                     "parallel_drafting": True, "max_num_seqs": 16, "max_num_batched_tokens": 1024},
        metrics={"acceptance_length": al, "output_tokens_per_s": 500.0,
                 **({} if launch_k is None else {"launch_k": launch_k})},
        provenance={"kind": "measured", "backend": "vllm", "device": gpu},
        class_policy=class_policy if class_policy is not None else CLASS_CAPS,
        workload_name="fixture",
        scenario={"concurrency": 4},
    )


def add_profile(store: Store, *, kind: str = "measured", parallel: bool = True) -> int:
    env_id = store.environment_id({k: v for k, v in ENV.items()})
    return store.add_profile(
        MODEL,
        method="draft_model",
        max_k=5,
        environment_id=env_id,
        acceptance={"predictable": {"num_drafts": 1000, "accepted_per_position": [900, 800, 700, 600, 500]},
                    "entropic": {"num_drafts": 800, "accepted_per_position": [200, 40, 8, 1, 0]}},
        step_costs=[{"batch_size": 1, "depth": 0, "step_ms": 7.0, "n": 10}],
        drafter=DRAFTER,
        parallel_drafting=parallel,
        cost_model=StepCostModel(COST).to_dict(),
        kind=kind,
    )


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'peagle.db'}")


def test_no_recommendation_names_the_search_command(store: Store) -> None:
    with pytest.raises(UsageError, match="peagle-tune search --model my-org/tiny-target"):
        resolve_tuned_config(store, MODEL, device="cpu")


def test_recommendation_for_another_device_is_named_with_the_way_to_serve_it(store: Store) -> None:
    rid = add_recommendation(store, gpu="NVIDIA H200")
    with pytest.raises(UsageError, match=r"on NVIDIA H200: pass --recommendation ID"):
        resolve_tuned_config(store, MODEL, device="cpu")
    tuned = resolve_tuned_config(store, MODEL, device="cpu", recommendation_id=rid)  # explicit id is honoured
    assert any("tuned for NVIDIA H200" in n for n in tuned.notes)


def test_recommendation_of_another_model_is_refused(store: Store) -> None:
    rid = add_recommendation(store)
    with pytest.raises(UsageError, match="is for model 'my-org/tiny-target'"):
        resolve_tuned_config(store, "other/model", device="cpu", recommendation_id=rid)


def test_broken_policy_file_error_names_the_key(store: Store, tmp_path: Path) -> None:
    add_recommendation(store)
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\nstatic_k: 3\nmax_k: 5\nclasses:\n  code: {max_k: 9}\n")
    with pytest.raises(PolicyFileError, match=r"classes\.code\.max_k"):
        resolve_tuned_config(store, MODEL, device="cpu", policy_path=bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("version: 1\nstatic_k: 3\nmax_k: 5\nclases: {}\n")
    with pytest.raises(PolicyFileError, match=r"unknown key\(s\) \['clases'\]"):
        resolve_tuned_config(store, MODEL, device="cpu", policy_path=typo)


def test_on_a_gpu_serve_launches_at_the_tuned_k_whose_steps_replay_full_graphs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The device is the stand-in: vLLM's GPU build with a visible GPU, where the default graph mode is
    # FULL_AND_PIECEWISE. Only the launch's K replays FULL graphs, so serve launches at the tuned K=3, not the policy's
    # max_k 5 (the CPU build launches at 5: the test below).
    import autotune.engine._variants as variants

    monkeypatch.setattr(variants, "engine_device", lambda *a, **k: "cuda")
    add_recommendation(store, k=3)
    add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    assert tuned.spec.k == 3 and tuned.policy.max_k == 3 and tuned.static_k == 3
    assert any("FULL CUDA graphs" in note and "--max-k" in note for note in tuned.notes)
    deeper = resolve_tuned_config(store, MODEL, device="cpu", max_k=5)  # the user asks for a deeper launch
    assert deeper.spec.k == 5


def test_on_a_gpu_serve_launches_at_the_searchs_fastest_k_and_falls_back_to_the_pick(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The search picked K=3 (the smallest K within the prediction's spread) and found K=4 fastest: the adaptive
    # engine launches at 4, the controller may go below it, and falls back to 3.
    import autotune.engine._variants as variants

    monkeypatch.setattr(variants, "engine_device", lambda *a, **k: "cuda")
    add_recommendation(store, k=3, launch_k=4)
    add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    assert tuned.spec.k == 4 and tuned.policy.max_k == 4 and tuned.static_k == 3


def test_recommendation_policy_with_the_newest_profile_gives_an_adaptive_plugin(store: Store) -> None:
    add_recommendation(store, k=3)
    pid = add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    # Drafter depth = the policy's max_k = max(K=3, class caps 5 and 1) = 5; fallback = the recommended K=3.
    assert tuned.spec.k == 5 and tuned.static_k == 3
    assert tuned.policy.limits("entropic") == (0, 1)
    # A CPU profile: no CUDA graphs, so no PIECEWISE penalty (policies._graphs).
    assert tuned.cost_model is not None and tuned.cost_model.coefficients == pytest.approx({**COST, "piecewise": 0.0})
    assert f"profile #{pid}" in tuned.cost_source
    assert tuned.acceptance["predictable"].accepted_per_position == (900, 800, 700, 600, 500)
    plugin = build_launch(tuned, run_dir=Path("/run")).plugin
    assert plugin.mode == "adaptive" and plugin.static_depth == 3
    assert plugin.class_depths == {"predictable": 5, "entropic": 1}
    assert plugin.adaptive is not None and plugin.adaptive["policy"]["static_k"] == 3


def test_profile_with_other_parallel_drafting_is_not_used(store: Store) -> None:
    add_recommendation(store)
    add_profile(store, parallel=False)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    assert tuned.profile is None
    assert any("parallel_drafting=False" in n for n in tuned.notes)


def test_without_profile_acceptance_comes_from_the_recommendation_and_no_cost_model_means_static(
    store: Store,
) -> None:
    add_recommendation(store, k=3, al=2.4)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    # A model in no catalog on a CPU has no roofline: no step-cost model, so no adaptation.
    assert tuned.cost_model is None and not tuned.adaptive
    plugin = build_launch(tuned).plugin
    assert plugin.mode == "static" and plugin.static_depth == 3
    # The prior reproduces the recommendation's AL at its K (geometric per position).
    assert tuned.acceptance["predictable"].acceptance_length(3) == pytest.approx(2.4, abs=1e-3)
    assert tuned.reference_acceptance_length() == {"*": 2.4}


def test_catalog_model_without_profile_gets_a_roofline_cost_model(store: Store) -> None:
    store.add_recommendation(
        "openai/gpt-oss-120b",
        gpu="NVIDIA H200",
        objective="throughput",
        best_config={"method": "eagle3", "drafter": "amazon/gpt-oss-120b-p-eagle", "num_speculative_tokens": 5,
                     "parallel_drafting": True, "max_num_seqs": 64},
        metrics={"acceptance_length": 2.9},
    )
    tuned = resolve_tuned_config(store, "openai/gpt-oss-120b", device="NVIDIA H200")
    assert tuned.adaptive and "roofline" in tuned.cost_source
    assert tuned.cost_model is not None
    # A bigger batch costs more per step and verifying deeper costs more: the roofline's basic shape.
    assert tuned.cost_model.predict(64, 5) > tuned.cost_model.predict(1, 5)
    assert tuned.cost_model.predict(64, 5) > tuned.cost_model.predict(64, 1)


def test_policy_file_overrides_caps_and_static_k(store: Store, tmp_path: Path) -> None:
    add_recommendation(store, k=3)
    add_profile(store)
    path = PolicyFile.save(
        RequestPolicy(static_k=2, max_k=4, classes={"predictable": ClassPolicy(max_k=4, min_k=1)},
                      model_classes={"coder": "predictable"}),
        tmp_path / "policy.json",
    )
    tuned = resolve_tuned_config(store, MODEL, device="cpu", policy_path=path)
    assert tuned.static_k == 2 and tuned.spec.k == 4
    assert tuned.policy.limits("predictable") == (1, 4)
    assert tuned.policy.model_classes == {"coder": "predictable"}
    plugin = build_launch(tuned).plugin
    assert plugin.static_depth == 2 and plugin.class_depths == {"predictable": 4}


def test_max_k_below_the_static_k_is_refused(store: Store) -> None:
    add_recommendation(store, k=3)
    with pytest.raises(UsageError, match="--max-k 2 is below the static K 3"):
        resolve_tuned_config(store, MODEL, device="cpu", max_k=2)


def test_hypothetical_drafter_needs_a_real_one(store: Store) -> None:
    store.add_recommendation(
        MODEL, gpu="cpu", objective="throughput",
        best_config={"method": "eagle3", "drafter": "x/head:2-layer", "num_speculative_tokens": 3,
                     "parallel_drafting": True},
        metrics={"hypothetical_drafter": True},
    )
    with pytest.raises(UsageError, match="HYPOTHETICAL"):
        resolve_tuned_config(store, MODEL, device="cpu")
    tuned = resolve_tuned_config(store, MODEL, device="cpu", drafter="/models/real-head")
    assert tuned.spec.drafter == "/models/real-head"


def test_extra_args_may_not_fight_the_tuned_config(store: Store) -> None:
    add_recommendation(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    for arg in ("--speculative-config={}", "--port", "--scheduler-cls", "--async-scheduling"):
        with pytest.raises(UsageError, match="conflicts with what `peagle-tune serve` sets"):
            build_launch(tuned, extra_args=[arg, "x"])


# ---- the CLI's dry run ------------------------------------------------------------------------------------------
def _dry_run(db: str, *args: str) -> Any:
    return CliRunner().invoke(serve, ["--model", MODEL, "--db", db, "--dry-run", "--verbose", *args],
                              catch_exceptions=False)


def _parse(output: str) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The three sections the dry run prints: command, environment, plugin config."""
    command_part, rest = output.split("# environment", 1)
    env_part, config_part = rest.split("# plugin config", 1)
    argv = shlex.split(command_part.split("# command", 1)[1].strip())
    env = dict(shlex.split(line)[0].split("=", 1) for line in env_part.splitlines()[1:] if "=" in line)
    config = json.loads(config_part.split("\n", 1)[1])
    return argv, env, config


def test_dry_run_prints_the_exact_command_env_and_plugin_config(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    with Store(db) as store:
        rid = add_recommendation(store, k=3)
        add_profile(store)
    result = _dry_run(db, "--port", "8123", "--run-dir", str(tmp_path / "run"), "--", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    argv, env, config = _parse(result.stdout)
    assert argv[1:5] == ["-m", "autotune.engine", "serve", MODEL]
    opts = dict(zip(argv[5::1], argv[6::1], strict=False))
    assert opts["--host"] == "127.0.0.1" and opts["--port"] == "8123"
    assert json.loads(opts["--speculative-config"]) == {
        "method": "draft_model", "model": DRAFTER, "num_speculative_tokens": 5, "parallel_drafting": True
    }
    assert opts["--max-num-seqs"] == "16" and opts["--max-num-batched-tokens"] == "1024"
    assert opts["--scheduler-cls"] == SCHEDULER_CLS and "--no-async-scheduling" in argv
    assert opts["--middleware"] == "autotune.serving.PeagleClassMiddleware"
    assert argv[-2:] == ["--dtype", "float32"]  # extra args go last, unchanged
    assert env[CONFIG_ENV] == str(tmp_path / "run" / "plugin.json")
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "run" / "prometheus")
    plugin = PluginConfig.from_dict(config)
    assert plugin.mode == "adaptive" and plugin.static_depth == 3
    assert plugin.stats_path == str(tmp_path / "run" / "stats.json")
    assert f"recommendation #{rid}" in result.stderr
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_dry_run_binds_loopback_unless_told_and_warns_otherwise(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    with Store(db) as store:
        add_recommendation(store)
    result = _dry_run(db, "--host", "0.0.0.0")
    assert result.exit_code == 0, result.output
    argv, _, _ = _parse(result.stdout)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "reachable from other machines" in result.stderr


def test_cli_errors_are_one_line_usage_errors(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'peagle.db'}"
    result = CliRunner().invoke(serve, ["--model", MODEL, "--db", db, "--dry-run"])
    assert result.exit_code == 3 and "peagle-tune search" in result.output  # 3: nothing stored matches
    with Store(db) as store:
        add_recommendation(store)
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"version": 1, "static_k": 3, "max_k": 5, "controller": {"hysteresis": "high"}}))
    result = CliRunner().invoke(serve, ["--model", MODEL, "--db", db, "--dry-run", "--policy", str(bad)])
    assert result.exit_code == 2 and "controller.hysteresis" in result.output
