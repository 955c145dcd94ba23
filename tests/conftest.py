"""Session setup shared by the tests.

vLLM 0.32 runs a draft_model drafter whose path contains "eagle-" as EAGLE, and a checkout is often named
`peagle-tune`: the engine tests then reach the fixture models through a neutral symlink (PEAGLE_TEST_MODELS), as the
product does for users (autotune/engine/_drafters.py).

Engine launches are what the suite spends its time on: engines that tests only read from are shared through
``engine_pool`` (tests/_engines.py), and every launch appends a line to PEAGLE_LAUNCH_LOG
(`autotune.engine._launch_log`; a temporary file unless set), and the run ends with their count per test file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _engines import EnginePool

from autotune.engine import safe_draft_model_path
from autotune.engine._drafters import hijacking_substring
from autotune.engine._launch_log import LAUNCH_LOG_ENV

_MODELS = Path(__file__).resolve().parent / "fixtures" / "models"

if "PEAGLE_TEST_MODELS" not in os.environ and _MODELS.is_dir() and hijacking_substring(str(_MODELS)):
    os.environ["PEAGLE_TEST_MODELS"] = safe_draft_model_path(str(_MODELS))

# Set before pytest-xdist starts its workers, so they and every engine process they start inherit it.
_OWN_LAUNCH_LOG = LAUNCH_LOG_ENV not in os.environ
if _OWN_LAUNCH_LOG:
    fd, _path = tempfile.mkstemp(prefix="peagle-launches-", suffix=".jsonl")
    os.close(fd)
    os.environ[LAUNCH_LOG_ENV] = _path


@pytest.fixture(scope="session")
def engine_pool(tmp_path_factory: pytest.TempPathFactory) -> EnginePool:
    """Measurements several engine tests read, each run once per session (tests/_engines.py)."""
    return EnginePool(tmp_path_factory.mktemp("engine-pool"))


def launch_counts(path: Path) -> Counter[str]:
    """Engine launches per test file in a launch log (lines outside any test count under "(no test)")."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        if line.strip():
            test = json.loads(line).get("test") or ""
            counts[test.split("::", 1)[0].rsplit("/", 1)[-1] or "(no test)"] += 1
    return counts


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    path = Path(os.environ[LAUNCH_LOG_ENV])
    counts = launch_counts(path) if path.is_file() else Counter()
    if counts:
        per_file = ", ".join(f"{name} {n}" for name, n in counts.most_common())
        terminalreporter.write_line(f"engine launches: {sum(counts.values())} ({per_file})")
    if _OWN_LAUNCH_LOG:
        path.unlink(missing_ok=True)
