"""Load the packaged YAML catalogs (and user catalog files, see `_user_catalog`) and look GPUs, target models and
drafters up by name, alias or local path."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from autotune.catalogs._acceptance_curve import fit_curve, survival
from autotune.catalogs._drafter_catalog import build_drafter, decay_priors
from autotune.catalogs._entries import check_drafter_entry, gpu_from_entry, model_from_entry
from autotune.catalogs._hf_config import drafter_from_config, model_from_config, read_config
from autotune.catalogs._specs import DrafterSpec, GPUSpec, ModelSpec
from autotune.catalogs._user_catalog import UserCatalog, active_catalogs
from autotune.catalogs._user_catalog import load_user_catalog as _load_user_catalog
from autotune.catalogs._user_catalog import use_catalog as _use_catalog
from autotune.errors import ConfigError, PeagleError, UnknownModelError
from autotune.names import did_you_mean
from policies import load_yaml_text

#: Catalog key of the default GPU (see `default_gpu`).
DEFAULT_GPU = "h200"

_VARIANT = re.compile(r"^(?P<base>.+):(?P<layers>\d+)-layer$")


def _norm(name: str) -> str:
    return name.strip().lower()


def _read_yaml(file_name: str, top_key: str) -> list[dict[str, Any]]:
    text = resources.files("autotune.catalogs").joinpath(file_name).read_text(encoding="utf-8")
    data = load_yaml_text(text)
    if not isinstance(data, dict) or not isinstance(data.get(top_key), list):
        raise PeagleError(f"catalog {file_name} must map {top_key!r} to a list of entries.")
    # Top-level keys starting with "_" only hold YAML anchors shared by entries.
    unknown = [k for k in data if k != top_key and not str(k).startswith("_")]
    if unknown:
        raise PeagleError(f"catalog {file_name} has unknown top-level keys {unknown}; expected only {top_key!r}.")
    entries = data[top_key]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PeagleError(f"catalog {file_name} entry #{i} is not a mapping.")
    return entries


@functools.cache
def _packaged_gpus() -> tuple[GPUSpec, ...]:
    return tuple(gpu_from_entry(entry, "gpus.yaml") for entry in _read_yaml("gpus.yaml", "gpus"))


@functools.cache
def _packaged_models() -> tuple[ModelSpec, ...]:
    return tuple(model_from_entry(entry, "models.yaml") for entry in _read_yaml("models.yaml", "models"))


@functools.cache
def _drafter_entries() -> tuple[tuple[dict[str, Any], ...], dict[bool, float]]:
    entries = [check_drafter_entry(entry, "drafters.yaml") for entry in _read_yaml("drafters.yaml", "drafters")]
    return tuple(entries), decay_priors(entries)


@functools.cache
def _packaged_drafters() -> tuple[DrafterSpec, ...]:
    """Every drafters.yaml entry (published or not), with fitted acceptance curves (see `_drafter_catalog`)."""
    entries, priors = _drafter_entries()
    return tuple(build_drafter(entry, priors) for entry in entries)


def _user() -> tuple[UserCatalog, ...]:
    """The user catalogs in force (``--catalog``, PEAGLE_CATALOG), read at lookup time."""
    return active_catalogs(_drafter_entries()[1])


_T = TypeVar("_T")


def _merged(user: list[_T], packaged: tuple[_T, ...], key: Callable[[_T], str]) -> tuple[_T, ...]:
    """User entries first (the first of a name wins), then the packaged entries no user entry replaces."""
    seen: set[str] = set()
    out: list[_T] = []
    for item in [*user, *packaged]:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return tuple(out)


def _gpus() -> tuple[GPUSpec, ...]:
    user = _user()
    if not user:
        return _packaged_gpus()
    return _merged([g for c in user for g in c.gpus], _packaged_gpus(), lambda g: _norm(g.key))


def _models() -> tuple[ModelSpec, ...]:
    user = _user()
    if not user:
        return _packaged_models()
    return _merged([m for c in user for m in c.models], _packaged_models(), lambda m: _norm(m.name))


def _drafters() -> tuple[DrafterSpec, ...]:
    """Every drafter (published or not): user catalogs' first, then the packaged ones they do not replace."""
    user = _user()
    if not user:
        return _packaged_drafters()
    return _merged([d for c in user for d in c.drafters], _packaged_drafters(), lambda d: _norm(d.name))


def use_catalog(path: str | Path) -> UserCatalog:
    """Add the user catalog file `path` (``--catalog FILE``) to every lookup in this process, after checking it
    (ConfigError naming the file and the key). Its entries win over packaged ones of the same name. Child
    processes see user catalogs only through the PEAGLE_CATALOG environment variable."""
    return _use_catalog(path, _drafter_entries()[1])


def load_user_catalog(path: str | Path) -> UserCatalog:
    """The entries of the user catalog file `path`, checked like the packaged files, without adding them to the
    lookups (see `use_catalog`). Raises ConfigError in one line naming the file and the key."""
    return _load_user_catalog(path, _drafter_entries()[1])


def position_decay_prior(parallel_drafting: bool) -> float:
    """The catalog's position-decay prior for heads that draft in parallel (P-EAGLE) or sequentially (EAGLE-3):
    the mean decay of the catalog's heads published at two depths (see drafters.yaml)."""
    return _drafter_entries()[1][bool(parallel_drafting)]


def acceptance_survival(points: Mapping[int, float], parallel_drafting: bool, max_k: int) -> tuple[float, ...]:
    """Per-position survival through published ``{K: AL}`` points, the way the catalog derives it: exact through
    two depths, else through one with `position_decay_prior`. Example: ``({5: 2.9}, True, 8)`` is the curve of the
    P-EAGLE paper's GPT-OSS 120B head on MT-Bench."""
    rate, decay = fit_curve(dict(points), position_decay_prior(parallel_drafting))
    return survival(rate, decay, max_k)


def _names(items: list[tuple[str, tuple[str, ...]]]) -> str:
    return ", ".join(f"{name} ({', '.join(aliases)})" if aliases else name for name, aliases in items)


def list_gpus() -> list[GPUSpec]:
    """Every catalog GPU, in catalog order."""
    return list(_gpus())


def _gpu_slug(name: str) -> str:
    """`name` reduced for matching: lower case, "nvidia" dropped, runs of other characters as one "-"
    ("NVIDIA H100 PCIe" -> "h100-pcie", "H100_SXM" -> "h100-sxm")."""
    text = re.sub(r"\bnvidia\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


_GPU_FAMILY = re.compile(r"(?<![a-z0-9])(g[bh]\d{3}|rtx-?\w+|[abhlvt]\d{2,3}s?)(?![0-9])")
_GPU_MEMORY = re.compile(r"(?<![0-9])(\d{2,3})-?gb(?![a-z])")


def _gpu_traits(text: str) -> tuple[str | None, str | None, int | None]:
    """(family, form factor, memory GB) named in a GPU name, e.g. "NVIDIA H100 80GB HBM3" -> ("h100", "sxm", 80).

    HBM3 on an H100 means the SXM part (the PCIe card has HBM2e), as nvidia-smi's "NVIDIA H100 80GB HBM3" says."""
    slug = _gpu_slug(text)
    family = _GPU_FAMILY.search(slug)
    form = None
    if "pcie" in slug:
        form = "pcie"
    elif "nvl" in slug:
        form = "nvl"
    elif "sxm" in slug or "hgx" in slug or (family is not None and family.group(1) == "h100" and "hbm3" in slug):
        form = "sxm"
    memory = _GPU_MEMORY.search(slug)
    return (family.group(1) if family else None, form, int(memory.group(1)) if memory else None)


def _catalog_traits(gpu: GPUSpec) -> tuple[str | None, str | None, int]:
    family, form, _ = _gpu_traits(f"{gpu.key} {gpu.display_name}")
    return family, form, int(gpu.memory_gb)


def _unknown_gpu(name: str, family: str | None, closest: GPUSpec | None) -> UnknownModelError:
    known = "; ".join(f"{g.key} ({g.display_name})" for g in _gpus())
    hint = ""
    if closest is not None:
        hint = (f" The catalog has no {name.strip()!r}; the closest entry is {closest.key} ({closest.display_name}): "
                f"pass --gpu {closest.key} to predict with its figures.")
    elif family and family.startswith(("gb", "gh")):
        hint = " Grace superchips (GB200, GH200) are not in the catalog; --gpu b200 or h200 is the nearest GPU."
    guess = "" if closest is not None else did_you_mean(name, {n: g.key for g in _gpus() for n in (g.key, *g.aliases)})
    return UnknownModelError(
        f"unknown GPU {name!r}: {guess}known GPUs are {known}. Names as nvidia-smi prints them (\"NVIDIA H100 80GB "
        f"HBM3\", \"NVIDIA H100 PCIe\") and forms like h100-sxm, \"H100 SXM\" or a100-40gb work too.{hint}"
    )


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU `name` means: its key, display name or an alias (case, spaces, dashes and a leading "NVIDIA"
    ignored: "H100 SXM", "h100_sxm", "NVIDIA H100 PCIe"), else the one entry whose family, form factor (SXM, PCIe)
    and memory match what the name says (nvidia-smi's "NVIDIA H100 80GB HBM3", "A100-SXM4-40GB"). A family with
    several entries and nothing to tell them apart gives the family's own key (``h100`` is the SXM part). Raises
    UnknownModelError listing the catalog, with the closest entry when the family is known."""
    wanted = _gpu_slug(name)
    for gpu in _gpus():
        if wanted in {_gpu_slug(n) for n in (gpu.key, gpu.display_name, *gpu.aliases)}:
            return gpu
    family, form, memory = _gpu_traits(name)
    same_family = [g for g in _gpus() if _catalog_traits(g)[0] == family] if family else []
    matching = [
        g for g in same_family
        if (form is None or _catalog_traits(g)[1] in (form, None))
        and (memory is None or _catalog_traits(g)[2] == memory)
    ]
    if len(matching) > 1:
        matching = [g for g in matching if g.key == family] or matching[:0]
    if len(matching) == 1:
        return matching[0]
    closest = next((g for g in same_family if g.key == family), same_family[0] if same_family else None)
    raise _unknown_gpu(name, family, closest)


def default_gpu() -> GPUSpec:
    """The GPU predictions assume when none is given: the H200.

    It is the GPU the P-EAGLE gpt-oss-20b model card evaluated on (one H200, MXFP4 weights, FP8 KV cache), it holds
    gpt-oss-120b (~65 GB of weights) on one card with room left for KV cache, and it is the Hopper part most
    commonly rented for serving today; the B200 figures in the P-EAGLE blog are the other published point.
    """
    return get_gpu(DEFAULT_GPU)


def list_models() -> list[ModelSpec]:
    """Every catalog target model, in catalog order."""
    return list(_models())


def _local_dir(name_or_path: str) -> Path | None:
    try:
        path = Path(name_or_path).expanduser()
        return path if path.is_dir() else None
    except (OSError, RuntimeError, ValueError):  # a name too long for a path, an unknown ~user, a NUL byte
        return None


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def _find_model(name: str) -> ModelSpec | None:
    wanted = _norm(name)
    for model in _models():
        if wanted == _norm(model.name) or wanted in {_norm(a) for a in model.aliases}:
            return model
    return None


def _unknown_model(name: str) -> UnknownModelError:
    if _looks_like_path(name):
        return UnknownModelError(
            f"{name!r} is not an existing directory and not a catalog model; give the path of a Hugging Face model "
            f"directory (with config.json) or one of: {_names([(m.name, m.aliases) for m in _models()])}."
        )
    known = _names([(m.name, m.aliases) for m in _models()])
    return UnknownModelError(
        f"unknown model {name!r}: {did_you_mean(name, model_names())}known models are {known}; a local path to a "
        "Hugging Face model directory (with config.json) also works (`peagle-tune list models`)."
    )


def model_names() -> dict[str, str]:
    """Every name a catalog model is known by (id, aliases) -> the name suggestions show for it (its id without the
    organisation)."""
    return {n: m.name.rsplit("/", 1)[-1] for m in _models() for n in (m.name, *m.aliases)}


def drafter_names(target: ModelSpec | None = None) -> dict[str, str]:
    """Every name a catalog drafter (of `target`, if given) is known by (id, aliases) -> the name suggestions show
    for it (its id)."""
    return {n: d.name for d in _drafters() if target is None or d.target == target.name
            for n in (d.name, *d.aliases)}


def resolve_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """The target model named by a catalog name or alias (case-insensitive), or read from a local HF directory.

    An existing directory wins over a catalog name, so a local copy is described by its own config.json.
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    local = _local_dir(name_or_path)
    if local is not None:
        return model_from_config(read_config(local), local)
    model = _find_model(name_or_path)
    if model is None:
        raise _unknown_model(name_or_path)
    return model


def list_drafters(*, include_hypothetical: bool = False) -> list[DrafterSpec]:
    """Every published catalog drafter; with `include_hypothetical`, also the heads that exist only in a paper
    (published: false), each head followed by its hypothetical layer variants."""
    if include_hypothetical:
        return [v for d in _drafters() for v in d.variants()]
    return [d for d in _drafters() if d.published]


def drafters_for(model: str | ModelSpec, *, include_hypothetical: bool = False) -> list[DrafterSpec]:
    """The catalog drafters trained for `model` (name, alias, local path or ModelSpec); P-EAGLE heads first.

    With `include_hypothetical`, paper-only heads are listed too and each head is followed by its hypothetical
    layer variants (published=False), e.g. a 2-layer P-EAGLE head whose acceptance is derived from the paper's
    layer ablation and the published 4-layer head.
    """
    spec = resolve_model(model)
    found = [d for d in list_drafters(include_hypothetical=include_hypothetical) if d.target == spec.name]
    return sorted(found, key=lambda d: not d.parallel_drafting)


def _find_drafter(name: str) -> DrafterSpec | None:
    wanted = _norm(name)
    for drafter in _drafters():
        if wanted == _norm(drafter.name) or wanted in {_norm(a) for a in drafter.aliases}:
            return drafter
    variant = _VARIANT.match(name.strip())
    if variant:
        base = _find_drafter(variant["base"])
        if base is not None and int(variant["layers"]) in base.layer_rate_factors:
            return base.with_layers(int(variant["layers"]))
    return None


def get_drafter(name_or_path: str, target: str | ModelSpec | None = None) -> DrafterSpec:
    """The drafter named by a catalog name, alias or ``<name>:<n>-layer`` variant, or read from a local directory.

    For a local directory, `target` (if given) becomes its target. For a catalog drafter, a `target` it was not
    trained for raises ConfigError.
    """
    target_spec = resolve_model(target) if target is not None else None
    local = _local_dir(name_or_path)
    if local is not None:
        return drafter_from_config(read_config(local), local, target_spec.name if target_spec else None)
    drafter = _find_drafter(name_or_path)
    if drafter is None:
        mine = [d for d in _drafters() if target_spec is None or d.target == target_spec.name]
        known = ", ".join(d.name for d in mine) or "none in the catalog"
        whose = f" for {target_spec.name}" if target_spec is not None else ""
        guess = did_you_mean(name_or_path, drafter_names(target_spec)) or did_you_mean(name_or_path, drafter_names())
        raise UnknownModelError(
            f"unknown drafter {name_or_path!r}: {guess}known drafters{whose} are {known}; a local path to a Hugging "
            "Face drafter directory (with config.json) also works (`peagle-tune list drafters`)."
        )
    if target_spec is not None and drafter.target != target_spec.name:
        others = ", ".join(d.name for d in drafters_for(target_spec)) or "none in the catalog"
        raise ConfigError(
            f"drafter {drafter.name} was trained for {drafter.target}, not {target_spec.name}; a drafter only "
            f"works with its own target. Drafters for {target_spec.name}: {others}."
        )
    return drafter
