"""Session setup shared by the engine tests.

vLLM 0.32 runs a draft_model drafter whose path contains "eagle-" as EAGLE, and a checkout is often named
`peagle-tune`: the engine tests then reach the fixture models through a neutral symlink (PEAGLE_TEST_MODELS), as the
product does for users (autotune/engine/_drafters.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.engine import safe_draft_model_path
from autotune.engine._drafters import hijacking_substring

_MODELS = Path(__file__).resolve().parent / "fixtures" / "models"

if "PEAGLE_TEST_MODELS" not in os.environ and _MODELS.is_dir() and hijacking_substring(str(_MODELS)):
    os.environ["PEAGLE_TEST_MODELS"] = safe_draft_model_path(str(_MODELS))
