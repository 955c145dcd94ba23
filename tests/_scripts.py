"""Load a repository script (scripts/*.py) as a module, for the tests that check its pure parts (the benchmarks are
the `benchmarks` package, imported as such)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_script(relative: str) -> ModuleType:
    """``relative``: the script's path from the repository root, e.g. ``"scripts/quickstart.py"``. Its directory
    goes on ``sys.path`` (a script may import its neighbours) and the module into ``sys.modules`` (dataclasses look
    their module up while the class is created)."""
    path = REPO / relative
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
