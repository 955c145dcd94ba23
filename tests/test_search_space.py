"""The search space: conditional parameters, grid, baselines and Optuna round trips."""

from __future__ import annotations

import optuna
import pytest

from autotune.config import SpecConfig
from autotune.exceptions import ConfigError
from autotune.space import DrafterChoice, SearchSpace

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
