"""What a step does with the drafter when every planned depth is 0 (an off-step), as a pure rule.

The scheduler plugin's workers (`policies.plugin.drafter_width`) apply it at the handshake; the simulator
(`autotune.simulate`) applies the same rule to the drafter it simulates. Modes: ``catch_up`` skips the drafter and
replays the skipped tokens when the request drafts again, prompts included; ``catch_up_decode`` does the same for
steps without prompt tokens only and lets the drafter read every prompt (what ``catch_up`` becomes under prefix
caching when the engine core does not guard the cache, `policies.plugin.prefix_guard`: vLLM caches a prompt's full
blocks for later requests with the same prefix, and a block whose drafter KV a skipped prompt left unwritten would
feed those requests' drafter KV it never wrote, for as long as the block stays cached: their drafts change, and with
them their acceptance, in either direction; outputs never change);
``sync_pass`` runs the drafter over one slot to keep its KV cache; ``holes`` skips without replay (kept for
measurement).
"""

from __future__ import annotations

__all__ = ["MAX_CATCH_UP_TOKENS", "OFF_STEP_MODES", "REPLAY_MODES", "off_step_mode"]

OFF_STEP_MODES: tuple[str, ...] = ("catch_up", "catch_up_decode", "sync_pass", "holes")
REPLAY_MODES: tuple[str, ...] = ("catch_up", "catch_up_decode")
"""Modes in which a request replays the tokens a skipped step left without drafter KV."""
MAX_CATCH_UP_TOKENS = 512
"""Default cap of tokens one request replays (``DrafterWidthSettings.max_catch_up_tokens``); a longer gap is left
unwritten (acceptance may drop, outputs never change)."""


def off_step_mode(
    requested: str, *, token_only: bool, async_scheduling: bool, prefix_caching: bool = False
) -> tuple[str, str | None]:
    """(mode, why it differs from ``requested`` or None): what an off-step does on a worker (see the module
    docstring). Replaying skipped tokens needs a token-only drafter (an EAGLE head drafts from the target's hidden
    states, which are gone) and synchronous scheduling (under async the worker's token copy lags); otherwise the
    drafter runs a one-slot sync pass.

    Under ``prefix_caching`` (on, and not guarded by the engine core) no prompt is left unread (``catch_up`` ->
    ``catch_up_decode``).

    Example: ``off_step_mode("catch_up", token_only=False, async_scheduling=False)[0] == "sync_pass"``;
    ``off_step_mode("catch_up", token_only=True, async_scheduling=False, prefix_caching=True)[0] ==
    "catch_up_decode"``.
    """
    if requested not in OFF_STEP_MODES:
        raise ValueError(f"off_steps must be one of {OFF_STEP_MODES}, but got {requested!r}.")
    if requested != "sync_pass" and async_scheduling:
        return "sync_pass", "async scheduling: off-steps run a one-slot sync pass"
    if requested in REPLAY_MODES and not token_only:
        return "sync_pass", "the drafter drafts from target hidden states: off-steps run a one-slot sync pass"
    if requested == "catch_up" and prefix_caching:
        return "catch_up_decode", ("prefix caching is on: the drafter reads every prompt (a cached block must hold "
                                   "its KV); off-steps without prompt tokens still skip it and catch up")
    return requested, None
