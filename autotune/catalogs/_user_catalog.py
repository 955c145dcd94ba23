"""A user's catalog file: models, drafters and GPUs added without editing the package.

One YAML file may hold any of the top-level keys ``models:``, ``drafters:`` and ``gpus:`` (plus ``_``-prefixed keys
holding YAML anchors), each a list of entries with the schema of the packaged file of that name (see the headers of
models.yaml, drafters.yaml and gpus.yaml). A user drafter may leave out ``reference_acceptance``: it can then be
measured, not predicted. Files come from `use_catalog` (``--catalog FILE``) and from ``PEAGLE_CATALOG`` (one path,
or several separated by ``os.pathsep``), read when a lookup happens; earlier files win over later ones and every
user entry wins over a packaged entry of the same name. A file is read only when it is a regular file of at most
`MAX_CATALOG_BYTES`, through the project's bounded YAML reader; a bad file raises ConfigError in one line naming
the file, the entry and the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.catalogs._drafter_catalog import build_drafter
from autotune.catalogs._entries import check_drafter_entry, gpu_from_entry, model_from_entry, norm
from autotune.catalogs._specs import DrafterSpec, GPUSpec, ModelSpec
from autotune.errors import ConfigError
from policies import YAMLDocumentError, load_yaml_text, read_text

ENV_VAR = "PEAGLE_CATALOG"
#: Largest catalog file read: 50x the packaged drafter catalog (19 kB).
MAX_CATALOG_BYTES = 1024 * 1024
_SECTIONS = ("models", "drafters", "gpus")


@dataclass(frozen=True)
class UserCatalog:
    """The entries of one user catalog file, checked like the packaged ones."""

    path: Path
    models: tuple[ModelSpec, ...] = ()
    drafters: tuple[DrafterSpec, ...] = ()
    gpus: tuple[GPUSpec, ...] = ()


def _read(path: Path) -> str:
    return read_text(path, ConfigError, "catalog file", limit=MAX_CATALOG_BYTES)


def load_user_catalog(path: str | Path, priors: dict[bool, float]) -> UserCatalog:
    """The entries of the catalog file `path`, or ConfigError naming the file and the key.

    `priors`: the packaged catalog's position-decay priors, which user drafters published at one depth borrow."""
    path = Path(path).expanduser()
    name = str(path)
    try:
        data = load_yaml_text(_read(path))
    except YAMLDocumentError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a catalog file maps models:, drafters: and/or gpus: to lists of entries.")
    unknown = sorted(str(k) for k in data if k not in _SECTIONS and not str(k).startswith("_"))
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {unknown}; a catalog file holds models:, drafters: "
                          "and/or gpus: (and _-prefixed keys for YAML anchors).")
    sections: dict[str, list[dict[str, Any]]] = {}
    for section in _SECTIONS:
        entries = data.get(section)
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: {section} must be a list of entries, but got a {type(entries).__name__}.")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ConfigError(f"{path}: {section} entry #{i} is not a mapping of the fields of an entry.")
        sections[section] = entries
    drafters = []
    for entry in sections["drafters"]:
        values = check_drafter_entry(entry, name, ConfigError, user=True)
        drafters.append(build_drafter(values, priors, name, ConfigError))
    catalog = UserCatalog(
        path=path,
        models=tuple(model_from_entry(e, name, ConfigError) for e in sections["models"]),
        drafters=tuple(drafters),
        gpus=tuple(gpu_from_entry(e, name, ConfigError) for e in sections["gpus"]),
    )
    _check_names(path, "models", [m.name for m in catalog.models])
    _check_names(path, "drafters", [d.name for d in catalog.drafters])
    _check_names(path, "gpus", [g.key for g in catalog.gpus])
    return catalog


def _check_names(path: Path, section: str, names: list[str]) -> None:
    """Each entry's name is one printable line, and no two entries of a section share one (the first would win
    silently)."""
    seen: dict[str, int] = {}
    for i, entry_name in enumerate(names):
        if not entry_name.strip() or not entry_name.isprintable():
            raise ConfigError(f"{path}: {section} entry #{i} has the name {entry_name[:60]!r}; a name is one line of "
                              "printable text.")
        key = norm(entry_name)
        if key in seen:
            raise ConfigError(f"{path}: {section} entries #{seen[key]} and #{i} are both named {entry_name[:60]!r}; "
                              "keep one (a later catalog file overrides an earlier one's entry of the same name).")
        seen[key] = i


# ------------------------------------------------------------------------------------------- active catalogs
_chosen: list[Path] = []
#: Parsed files by (path, device, inode, size, mtime): a file is parsed again only when it changes.
_parsed: dict[tuple[str, int, int, int, int], UserCatalog] = {}


def use_catalog(path: str | Path, priors: dict[bool, float]) -> UserCatalog:
    """Check `path` now and add it to the catalogs every lookup in this process sees (``--catalog FILE``); files
    added later win over earlier ones. Subprocesses see it only through ``PEAGLE_CATALOG``."""
    catalog = _load_cached(Path(path).expanduser().absolute(), priors)
    resolved = catalog.path
    if resolved in _chosen:
        _chosen.remove(resolved)
    _chosen.insert(0, resolved)
    return catalog


def clear_catalogs() -> None:
    """Forget the files `use_catalog` added (PEAGLE_CATALOG still counts)."""
    _chosen.clear()
    _parsed.clear()


def _env_paths() -> list[Path]:
    raw = os.environ.get(ENV_VAR, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def _load_cached(path: Path, priors: dict[bool, float]) -> UserCatalog:
    try:
        st = path.stat()
    except OSError:
        return load_user_catalog(path, priors)  # raises the one-line error
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _parsed:
        _parsed[key] = load_user_catalog(path, priors)
    return _parsed[key]


def active_catalogs(priors: dict[bool, float]) -> tuple[UserCatalog, ...]:
    """The user catalogs in force now, highest precedence first: `use_catalog` files, then PEAGLE_CATALOG's."""
    paths: list[Path] = []
    for path in [*_chosen, *_env_paths()]:
        if path not in paths:
            paths.append(path)
    return tuple(_load_cached(p, priors) for p in paths)
