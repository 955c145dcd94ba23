"""The bound on the draft depth K that every part of peagle-tune shares (no imports: configs, catalogs and the CLI
read it without loading the controller)."""

from __future__ import annotations

MAX_K = 16
"""Deepest draft depth (K) peagle-tune handles anywhere: policy files, search spaces, speculative configs."""
