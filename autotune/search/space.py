"""The search space: drafter (with its layer count), K, parallel drafting, max_num_seqs, max_num_batched_tokens.

Conditional, define-by-run: the baseline (no speculation) has no K, and drafters without a mask token have no
parallel-drafting choice. `SpaceSpec` is what a user writes to narrow or widen it (CLI options or a space file);
`SearchSpace` is the resolved space a search samples from.

Space file (YAML or JSON; every key optional, unknown keys are errors)::

    drafters: [amazon/gpt-oss-120b-p-eagle]   # ids or local paths (default: the catalog's for the model)
    k_min: 1                                  # draft depth range, 1 <= k_min <= k_max <= 16
    k_max: 8
    max_num_seqs: [32, 64, 128]               # default: around each concurrency (c/2, c, 2c)
    max_num_batched_tokens: [8192, null]      # null = vLLM's default
    parallel_drafting: auto                   # auto | on | off
    include_hypothetical: false               # model backend only: unreleased 2-layer variants
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.errors import ConfigError
from autotune.spec import MAX_K, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, SpecConfig
from policies import load_json_text, load_yaml_text, read_text

if TYPE_CHECKING:
    import optuna

NO_SPEC = "none"
PARALLEL_DRAFTING_MODES: tuple[str, ...] = ("auto", "on", "off")


@dataclass(frozen=True)
class DrafterChoice:
    """A drafter the search may pick."""

    name: str
    """Model id or local path, as vLLM takes it in the speculative config's ``model``; for a hypothetical variant
    the catalog's ``<id>:<n>-layer`` name (which no engine can load)."""
    method: str
    """``eagle3`` (EAGLE-3 / P-EAGLE heads) or ``draft_model`` (a small LM, PARD with parallel drafting)."""
    layers: int | None
    parallel_capable: bool
    """The checkpoint carries a mask token (pard_token / mask_token_id / ptd_token_id)."""
    recommended_k: int | None = None
    """The K its publisher serves (the baseline every recommendation is compared against)."""
    hypothetical: bool = False
    """An unreleased layer variant of a published head: predictable by the model backend, but no checkpoint exists."""
    note: str = ""
    """Where a hypothetical variant's acceptance comes from (shown next to it)."""


@dataclass(frozen=True)
class SearchSpace:
    """The configs a search may try, with `suggest` (Optuna, define-by-run), `grid` and `baselines`."""

    drafters: tuple[DrafterChoice, ...]
    k_max: int = 8
    k_min: int = 1
    max_num_seqs: tuple[int, ...] = (64,)
    parallel_drafting: str = "auto"
    """``auto``: try both where the drafter supports it; ``on``: only parallel; ``off``: only sequential."""
    max_num_batched_tokens: tuple[int | None, ...] = (None,)
    include_baseline: bool = True
    tensor_parallel_size: int = 1
    """vLLM's tensor_parallel_size of every config (not searched: the device decides it)."""
    names: dict[str, DrafterChoice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_max <= MAX_K:
            raise ConfigError(
                f"K range must satisfy 1 <= k_min <= k_max <= {MAX_K}, but got k_min={self.k_min}, "
                f"k_max={self.k_max}. Pass e.g. --k-min 1 --max-k 8."
            )
        if self.parallel_drafting not in PARALLEL_DRAFTING_MODES:
            raise ConfigError(f"parallel_drafting must be auto, on or off, but got {self.parallel_drafting!r}.")
        if not self.max_num_seqs or any(s < 1 for s in self.max_num_seqs):
            raise ConfigError(f"max_num_seqs choices must be positive integers, but got {list(self.max_num_seqs)}.")
        if not self.max_num_batched_tokens or any(t is not None and t < 1 for t in self.max_num_batched_tokens):
            raise ConfigError(
                "max_num_batched_tokens choices must be positive integers (or null for vLLM's default), but got "
                f"{list(self.max_num_batched_tokens)}."
            )
        if not self.drafters and not self.include_baseline:
            raise ConfigError("The space is empty: it has no drafter and excludes the no-speculation baseline.")
        if self.parallel_drafting == "on":
            lacking = [d.name for d in self.drafters if not d.parallel_capable]
            if lacking:
                raise ConfigError(
                    f"Parallel drafting was required but drafters {lacking} have no mask token in config.json "
                    "(vLLM reads `pard_token`, `mask_token_id` or `ptd_token_id`). Drop them or use "
                    "--parallel-drafting auto."
                )
        names = {d.name: d for d in self.drafters}
        if len(names) != len(self.drafters):
            raise ConfigError(f"Drafters must be listed once each, but got {[d.name for d in self.drafters]}.")
        object.__setattr__(self, "names", names)

    def parallel_options(self, drafter: DrafterChoice) -> list[bool]:
        """The parallel-drafting values the space offers `drafter`, parallel first (where it can draft in one pass)."""
        if not drafter.parallel_capable or self.parallel_drafting == "off":
            return [False]
        if self.parallel_drafting == "on":
            return [True]
        return [True, False]

    def suggest(self, trial: optuna.trial.BaseTrial) -> SpecConfig:
        """Sample a config in an Optuna trial (define-by-run, conditional parameters)."""
        choices = ([NO_SPEC] if self.include_baseline else []) + [d.name for d in self.drafters]
        name = trial.suggest_categorical("drafter", choices)
        seqs = trial.suggest_categorical("max_num_seqs", list(self.max_num_seqs))
        mnbt: int | None = self.max_num_batched_tokens[0]
        if len(self.max_num_batched_tokens) > 1:
            picked = trial.suggest_categorical("max_num_batched_tokens", list(self.max_num_batched_tokens))
            mnbt = None if picked is None else int(picked)
        if name == NO_SPEC:
            return self.no_spec(int(seqs), mnbt)
        drafter = self.names[str(name)]
        k = trial.suggest_int("k", self.k_min, self.k_max)
        pd_options = self.parallel_options(drafter)
        pd = pd_options[0] if len(pd_options) == 1 else trial.suggest_categorical("parallel_drafting", pd_options)
        return self.config(drafter, k, bool(pd), int(seqs), mnbt)

    def no_spec(self, seqs: int, mnbt: int | None = None) -> SpecConfig:
        """The config without speculation at `seqs` and `mnbt`."""
        tp = self.tensor_parallel_size
        return SpecConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, tensor_parallel_size=tp)

    def config(
        self, drafter: DrafterChoice, k: int, parallel: bool, seqs: int, mnbt: int | None = None
    ) -> SpecConfig:
        return SpecConfig(
            method=drafter.method,  # type: ignore[arg-type]
            drafter=drafter.name,
            num_speculative_tokens=k,
            parallel_drafting=parallel,
            drafter_layers=drafter.layers,
            max_num_seqs=seqs,
            max_num_batched_tokens=mnbt,
            tensor_parallel_size=self.tensor_parallel_size,
        )

    def params_of(self, config: SpecConfig) -> dict[str, Any]:
        """Optuna parameters that make `suggest` return `config` (for ``study.enqueue_trial``)."""
        params: dict[str, Any] = {"max_num_seqs": config.max_num_seqs}
        if len(self.max_num_batched_tokens) > 1:
            params["max_num_batched_tokens"] = config.max_num_batched_tokens
        if not config.speculative:
            params["drafter"] = NO_SPEC
            return params
        assert config.drafter is not None
        params.update(drafter=config.drafter, k=config.k)
        if len(self.parallel_options(self.names[config.drafter])) > 1:
            params["parallel_drafting"] = config.parallel_drafting
        return params

    def contains(self, config: SpecConfig) -> bool:
        """True when `suggest` can return `config`."""
        if config.max_num_seqs not in self.max_num_seqs:
            return False
        if config.max_num_batched_tokens not in self.max_num_batched_tokens:
            return False
        if config.tensor_parallel_size != self.tensor_parallel_size:
            return False
        if not config.speculative:
            return self.include_baseline
        drafter = self.names.get(str(config.drafter))
        return (
            drafter is not None
            and self.config(drafter, config.k, config.parallel_drafting, config.max_num_seqs,
                            config.max_num_batched_tokens) == config
            and self.k_min <= config.k <= self.k_max
            and config.parallel_drafting in self.parallel_options(drafter)
        )

    def grid(self) -> list[SpecConfig]:
        """Every config of the space, in a fixed order: per (max_num_seqs, max_num_batched_tokens), the baseline,
        then each drafter's parallel (if offered) and sequential configs by increasing K."""
        out: list[SpecConfig] = []
        for seqs, mnbt in itertools.product(self.max_num_seqs, self.max_num_batched_tokens):
            if self.include_baseline:
                out.append(self.no_spec(seqs, mnbt))
            for d in self.drafters:
                for pd in self.parallel_options(d):
                    for k in range(self.k_min, self.k_max + 1):
                        out.append(self.config(d, k, pd, seqs, mnbt))
        return out

    def baselines(self, seqs: Sequence[int] | None = None) -> list[SpecConfig]:
        """No speculation, and each drafter at its publisher's K (clipped to the space), per max_num_seqs."""
        out: list[SpecConfig] = []
        for s in seqs or self.max_num_seqs:
            mnbt = self.max_num_batched_tokens[0]
            if self.include_baseline:
                out.append(self.no_spec(s, mnbt))
            for d in self.drafters:
                if d.recommended_k:
                    k = min(max(d.recommended_k, self.k_min), self.k_max)
                    pd = self.parallel_options(d)[0]
                    out.append(self.config(d, k, pd, s, mnbt))
        return out

    def hypothetical(self, config: SpecConfig) -> DrafterChoice | None:
        """The hypothetical drafter `config` uses, or None when it uses a real checkpoint (or none)."""
        choice = self.names.get(str(config.drafter)) if config.speculative else None
        return choice if choice is not None and choice.hypothetical else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (drafters by name), e.g. for a study's attributes."""
        return {
            "drafters": [d.name for d in self.drafters],
            "k_min": self.k_min,
            "k_max": self.k_max,
            "max_num_seqs": list(self.max_num_seqs),
            "max_num_batched_tokens": list(self.max_num_batched_tokens),
            "parallel_drafting": self.parallel_drafting,
            "include_baseline": self.include_baseline,
            **({"tensor_parallel_size": self.tensor_parallel_size} if self.tensor_parallel_size > 1 else {}),
        }


# ---------------------------------------------------------------------------------------------- user's space spec


@dataclass(frozen=True)
class SpaceSpec:
    """What a user asks of the space; None means "not given" (the default, or what a lower layer said).

    Built from a space file (`load_space_file`) and from CLI options; `overridden_by` layers them (CLI wins).
    """

    drafters: tuple[str, ...] | None = None
    """Drafter ids or local paths (None: the catalog's drafters for the model)."""
    k_min: int | None = None
    k_max: int | None = None
    max_num_seqs: tuple[int, ...] | None = None
    """max_num_seqs choices (None: around each concurrency c: c/2, c, 2c)."""
    max_num_batched_tokens: tuple[int | None, ...] | None = None
    """max_num_batched_tokens choices; a None entry is vLLM's default (None: only vLLM's default)."""
    parallel_drafting: str | None = None
    include_hypothetical: bool | None = None
    """Let the model backend consider unreleased layer variants of published heads (labelled hypothetical)."""

    def __post_init__(self) -> None:
        _validate_spec(dataclasses.asdict(self), "space")

    def overridden_by(self, other: SpaceSpec) -> SpaceSpec:
        """This spec with every field `other` sets replaced by `other`'s value."""
        changes = {
            f.name: getattr(other, f.name) for f in dataclasses.fields(other) if getattr(other, f.name) is not None
        }
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any, source: str = "space") -> SpaceSpec:
        """Validate a space-file mapping. Errors are `ConfigError`s naming `source` and the key."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: a space file must be a mapping (YAML/JSON object) with keys {sorted(SPACE_KEYS)}, "
                f"but got {type(data).__name__}."
            )
        unknown = sorted(str(k) for k in data if k not in SPACE_KEYS)
        if unknown:
            shown = ", ".join(f"{k!r:.40}" for k in unknown[:5])
            shown += f", ... ({len(unknown)} in all)" if len(unknown) > 5 else ""
            raise ConfigError(f"{source}: unknown key(s) [{shown}]; known keys are {sorted(SPACE_KEYS)}.")
        if isinstance(data.get("parallel_drafting"), bool):
            # YAML 1.1 reads a bare `on`/`off` as a boolean.
            data = {**data, "parallel_drafting": "on" if data["parallel_drafting"] else "off"}
        _validate_spec(data, source)

        def seq(key: str) -> tuple[Any, ...] | None:
            value = data.get(key)
            return None if value is None else tuple(value)

        return cls(
            drafters=seq("drafters"),
            k_min=data.get("k_min"),
            k_max=data.get("k_max"),
            max_num_seqs=seq("max_num_seqs"),
            max_num_batched_tokens=seq("max_num_batched_tokens"),
            parallel_drafting=data.get("parallel_drafting"),
            include_hypothetical=data.get("include_hypothetical"),
        )


SPACE_KEYS = frozenset(f.name for f in dataclasses.fields(SpaceSpec))

#: The CLI option of each space key (for error messages about command-line values).
CLI_OPTIONS: dict[str, str] = {
    "drafters": "--drafter",
    "k_min": "--k-min",
    "k_max": "--max-k",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "parallel_drafting": "--parallel-drafting",
    "include_hypothetical": "--include-hypothetical",
}


def space_from_options(**values: Any) -> SpaceSpec:
    """A `SpaceSpec` from CLI values (None: not given); errors name the CLI option."""
    unknown = sorted(set(values) - SPACE_KEYS)
    if unknown:
        raise TypeError(f"unknown space option(s) {unknown}")
    _validate_spec(values, "command line", CLI_OPTIONS)
    spec: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return SpaceSpec(**spec)


def load_space_file(path: str | Path) -> SpaceSpec:
    """Read a space file (YAML, or JSON for ``.json``). Errors name the file and the offending key."""
    p = Path(path)
    text = read_text(p, ConfigError, "space file")  # unreadable or not UTF-8: one line naming the file (and line)
    is_json = p.suffix.lower() == ".json"
    try:
        # Bounded readers: an alias bomb or 100,000-deep nesting is refused in milliseconds (see policies._files).
        data = load_json_text(text) if is_json else load_yaml_text(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: not valid {'JSON' if is_json else 'YAML'}: {exc}".replace("\n", " ")) from exc
    return SpaceSpec.from_dict(data if data is not None else {}, source=str(p))


def _validate_spec(data: Mapping[str, Any], source: str, names: Mapping[str, str] | None = None) -> None:
    def name(key: str) -> str:
        return (names or {}).get(key, key)

    def fail(key: str, rule: str) -> None:
        raise ConfigError(f"{source}: {name(key)}: {rule}, but got {data[key]!r:.80}.")

    def positive_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    def int_list(key: str, allow_null: bool, maximum: int) -> None:
        value = data.get(key)
        if value is None:
            return
        ok = isinstance(value, list | tuple) and len(value) > 0
        ok = ok and all((positive_int(v) and v <= maximum) or (allow_null and v is None) for v in value)
        if not ok:
            what = f"integers in [1, {maximum:,}]" + (" or null (vLLM's default)" if allow_null else "")
            fail(key, f"must be a non-empty list of {what}, e.g. [32, 64]")
        if len(set(value)) != len(value):
            fail(key, "must not repeat a value")

    drafters = data.get("drafters")
    if drafters is not None and (
        not isinstance(drafters, list | tuple) or not drafters or not all(isinstance(d, str) and d for d in drafters)
    ):
        fail("drafters", "must be a non-empty list of drafter ids or local paths")
    for key in ("k_min", "k_max"):
        value = data.get(key)
        if value is not None and not (positive_int(value) and value <= MAX_K):
            fail(key, f"must be an integer in [1, {MAX_K}]")
    k_min, k_max = data.get("k_min"), data.get("k_max")
    if k_min is not None and k_max is not None and k_min > k_max:
        raise ConfigError(
            f"{source}: {name('k_min')} must be <= {name('k_max')}, but got {name('k_min')}={k_min}, "
            f"{name('k_max')}={k_max}."
        )
    int_list("max_num_seqs", allow_null=False, maximum=MAX_NUM_SEQS)
    int_list("max_num_batched_tokens", allow_null=True, maximum=MAX_NUM_BATCHED_TOKENS)
    if data.get("parallel_drafting") is not None and data["parallel_drafting"] not in PARALLEL_DRAFTING_MODES:
        fail("parallel_drafting", "must be one of auto, on, off")
    if data.get("include_hypothetical") is not None and not isinstance(data["include_hypothetical"], bool):
        fail("include_hypothetical", "must be true or false")
