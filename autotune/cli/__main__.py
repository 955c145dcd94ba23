"""`python -m autotune.cli`."""

from __future__ import annotations

from autotune.cli import main

main()
