"""The search space: conditional parameters, grid, baselines and Optuna round trips."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.search import DrafterChoice, SearchSpace, load_space_file, space_from_options
from autotune.spec import SpecConfig

PEAGLE = DrafterChoice("org/p-eagle", "eagle3", 4, parallel_capable=True, recommended_k=5)
EAGLE3 = DrafterChoice("org/eagle3", "eagle3", 1, parallel_capable=False, recommended_k=3)


def test_grid_counts_conditional_parameters() -> None:
    space = SearchSpace(drafters=(PEAGLE, EAGLE3), k_max=4, max_num_seqs=(8, 16))
    grid = space.grid()
    # per max_num_seqs: 1 baseline + P-EAGLE 2 pd options x 4 K + EAGLE-3 1 option x 4 K = 13
    assert len(grid) == 2 * 13
    assert len(set(grid)) == len(grid)
    assert not any(c.parallel_drafting for c in grid if c.drafter == EAGLE3.name)


def test_enqueued_params_reproduce_every_grid_config() -> None:
    space = SearchSpace(drafters=(PEAGLE, EAGLE3), k_max=3, max_num_seqs=(4, 8))
    study = optuna.create_study()
    for config in space.grid():
        study.enqueue_trial(space.params_of(config))
    seen = []
    for _ in space.grid():
        trial = study.ask()
        seen.append(space.suggest(trial))
        study.tell(trial, 0.0)
    assert seen == space.grid()


def test_baselines_are_no_spec_and_published_k() -> None:
    space = SearchSpace(drafters=(PEAGLE, EAGLE3), k_max=4, max_num_seqs=(8,))
    base = space.baselines()
    assert base[0] == SpecConfig(max_num_seqs=8)
    # P-EAGLE's published K=5 lies outside k_max=4 and is clipped; EAGLE-3's K=3 is kept.
    assert [(c.drafter, c.k) for c in base[1:]] == [(PEAGLE.name, 4), (EAGLE3.name, 3)]
    assert base[1].parallel_drafting is True


@pytest.mark.parametrize("k_min,k_max", [(0, 4), (3, 2), (1, 17)])
def test_k_range_out_of_bounds_is_a_config_error(k_min: int, k_max: int) -> None:
    with pytest.raises(ConfigError, match="k_min <= k_max"):
        SearchSpace(drafters=(PEAGLE,), k_min=k_min, k_max=k_max)


def test_parallel_drafting_on_rejects_drafter_without_mask_token() -> None:
    with pytest.raises(ConfigError, match="pard_token"):
        SearchSpace(drafters=(PEAGLE, EAGLE3), parallel_drafting="on")


# ------------------------------------------------------------------------------------------------- space files


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_space_file_yaml_and_json_give_the_same_spec(tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "space.yaml", (
        "drafters: [org/p-eagle]\nk_min: 2\nk_max: 6\nmax_num_seqs: [32, 64]\n"
        "max_num_batched_tokens: [8192, null]\nparallel_drafting: off\ninclude_hypothetical: true\n"
    ))
    json_file = write(tmp_path, "space.json", json.dumps({
        "drafters": ["org/p-eagle"], "k_min": 2, "k_max": 6, "max_num_seqs": [32, 64],
        "max_num_batched_tokens": [8192, None], "parallel_drafting": "off", "include_hypothetical": True,
    }))
    spec = load_space_file(yaml_file)
    assert spec == load_space_file(json_file)
    # YAML reads a bare `off` as false; the file still means "off".
    assert spec.parallel_drafting == "off"
    assert spec.max_num_batched_tokens == (8192, None)


@pytest.mark.parametrize(
    "text,key",
    [
        ("k_max: 20\n", "k_max"),
        ("k_min: 0\n", "k_min"),
        ("max_num_seqs: [0, 8]\n", "max_num_seqs"),
        ("max_num_seqs: 64\n", "max_num_seqs"),
        ("max_num_batched_tokens: [abc]\n", "max_num_batched_tokens"),
        ("parallel_drafting: sometimes\n", "parallel_drafting"),
        ("drafters: []\n", "drafters"),
        ("include_hypothetical: maybe\n", "include_hypothetical"),
    ],
)
def test_space_file_errors_name_the_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, "space.yaml", text)
    with pytest.raises(ConfigError, match=rf"{path}: {key}: must"):
        load_space_file(path)


def test_space_file_unknown_key_and_bad_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['max_k'\]; known keys are"):
        load_space_file(write(tmp_path, "a.yaml", "max_k: 8\n"))
    with pytest.raises(ConfigError, match="k_min must be <= k_max, but got k_min=6, k_max=2"):
        load_space_file(write(tmp_path, "b.yaml", "k_min: 6\nk_max: 2\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_space_file(write(tmp_path, "c.yaml", "k_min: [\n"))


def test_command_line_values_override_the_file_and_errors_name_the_option(tmp_path: Path) -> None:
    spec = load_space_file(write(tmp_path, "s.yaml", "k_max: 6\nmax_num_seqs: [8]\n"))
    merged = spec.overridden_by(space_from_options(k_max=4, max_num_seqs=None))
    assert (merged.k_max, merged.max_num_seqs) == (4, (8,))
    with pytest.raises(ConfigError, match="command line: --max-k: must be an integer in"):
        space_from_options(k_max=40)


def test_hypothetical_drafters_are_flagged_in_configs() -> None:
    variant = DrafterChoice("org/p-eagle:2-layer", "eagle3", 2, parallel_capable=True, recommended_k=5,
                            hypothetical=True)
    space = SearchSpace(drafters=(PEAGLE, variant), k_max=2, max_num_seqs=(8,))
    flagged = {c.drafter for c in space.grid() if space.hypothetical(c)}
    assert flagged == {"org/p-eagle:2-layer"}
    assert all(space.contains(c) for c in space.grid())
    assert not space.contains(SpecConfig(max_num_seqs=16))
