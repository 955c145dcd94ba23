"""What a step does with the drafter when every planned depth is 0 (an off-step), as a pure rule.

The scheduler plugin's workers (`policies.plugin.drafter_width`) apply it at the handshake; the simulator
(`autotune.simulate`) applies the same rule to the drafter it simulates. Modes: ``catch_up`` skips the drafter and
replays the skipped tokens when the request drafts again; ``sync_pass`` runs the drafter over one slot to keep its KV
cache; ``holes`` skips without replay (kept for measurement).
"""

from __future__ import annotations

__all__ = ["MAX_CATCH_UP_TOKENS", "OFF_STEP_MODES", "off_step_mode"]

OFF_STEP_MODES: tuple[str, ...] = ("catch_up", "sync_pass", "holes")
MAX_CATCH_UP_TOKENS = 512
"""Default cap of tokens one request replays (``DrafterWidthSettings.max_catch_up_tokens``); a longer gap is left
unwritten (acceptance may drop, outputs never change)."""


def off_step_mode(requested: str, *, token_only: bool, async_scheduling: bool) -> tuple[str, str | None]:
    """(mode, why it differs from ``requested`` or None): what an off-step does on a worker (see the module
    docstring). Replaying skipped tokens needs a token-only drafter (an EAGLE head drafts from the target's hidden
    states, which are gone) and synchronous scheduling (under async the worker's token copy lags); otherwise the
    drafter runs a one-slot sync pass.

    Example: ``off_step_mode("catch_up", token_only=False, async_scheduling=False)[0] == "sync_pass"``.
    """
    if requested not in OFF_STEP_MODES:
        raise ValueError(f"off_steps must be one of {OFF_STEP_MODES}, but got {requested!r}.")
    if requested in ("catch_up", "holes") and async_scheduling:
        return "sync_pass", "async scheduling: off-steps run a one-slot sync pass"
    if requested == "catch_up" and not token_only:
        return "sync_pass", "the drafter drafts from target hidden states: off-steps run a one-slot sync pass"
    return requested, None
