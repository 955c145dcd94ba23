"""The public faces of `policies` and `policies.plugin`: every exported name exists, constants are one object, the
errors share one root, either package imports first without a cycle, and the worked examples in the docstrings hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import subprocess
import sys

import pytest

import policies
import policies.plugin
from policies import errors


@pytest.mark.parametrize("package", [policies, policies.plugin, errors], ids=lambda p: p.__name__)
def test_every_exported_name_exists(package: object) -> None:
    names = package.__all__  # type: ignore[attr-defined]
    assert len(names) == len(set(names))
    assert [n for n in names if not hasattr(package, n)] == []


def test_shared_constants_are_defined_once() -> None:
    assert policies.plugin.CLASS_KEY is policies.CLASS_KEY == "peagle_class"
    assert policies.plugin.SPECULATE_KEY is policies.SPECULATE_KEY == "peagle_speculate"
    assert policies.MAX_K == 16


def test_every_error_has_one_root_and_file_errors_stay_value_errors() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.PolicyError), name
    # Callers written before the error tree caught ValueError; they must keep working.
    assert issubclass(errors.PolicyFileError, ValueError) and issubclass(errors.PluginConfigError, ValueError)
    with pytest.raises(errors.PolicyError, match="version"):
        policies.RequestPolicy.from_dict({"static_k": 1, "max_k": 2})
    with pytest.raises(errors.PolicyError, match="mode must be one of"):
        policies.plugin.PluginConfig.from_dict({"mode": "turbo"})


@pytest.mark.parametrize("first", ["policies.plugin", "policies.plugin.stats", "policies.errors"])
def test_any_module_imports_first_without_a_cycle_or_vllm(first: str) -> None:
    code = f"import {first}, sys; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]


def _pure_modules() -> list[str]:
    names = [policies.__name__]
    for package in (policies, policies.plugin):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if info.name not in ("policies.scheduler", "policies.plugin.scheduler", "policies.plugin"):
                names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _pure_modules())
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
