"""The exceptions the ``policies`` package raises on purpose, under one root.

Catch `PolicyError` for "anything policies refused"; the children say what. File and config errors are also
``ValueError``s (as before), so callers that catch ``ValueError`` keep working. Every message states the rule, the
value and the fix. Plain argument checks in the numeric cores (a negative depth passed to `RequestView`, an empty
survival curve) stay ordinary ``ValueError``s: they are programming errors, not user input.

Tree::

    PolicyError
    ├── PolicyFileError      a request-policy file (or dict) that breaks the format
    ├── PluginConfigError    a scheduler-plugin config or stats file that cannot be used
    └── InjectedFault        raised on purpose by the ``fault_class`` test hook
        ├── PluginFault      ... in the plugin's own logic (fault_where="plugin")
        └── ControllerFault  ... in `DepthController.decide` (fault_where="controller")
"""

from __future__ import annotations

__all__ = [
    "ControllerFault",
    "InjectedFault",
    "PluginConfigError",
    "PluginFault",
    "PolicyError",
    "PolicyFileError",
]


class PolicyError(Exception):
    """Root of every error the ``policies`` package raises on purpose."""


class PolicyFileError(PolicyError, ValueError):
    """A policy file (or dict) that breaks the format: the message names the file, the key path and the rule."""


class PluginConfigError(PolicyError, ValueError):
    """A scheduler-plugin config or stats file that cannot be used; the message names the key and the fix."""


class InjectedFault(PolicyError, RuntimeError):
    """Raised on purpose by the ``fault_class`` test hook, to show that the engine keeps serving."""


class PluginFault(InjectedFault):
    """The ``fault_class`` hook with ``fault_where="plugin"``: the plugin turns itself off."""


class ControllerFault(InjectedFault):
    """The ``fault_class`` hook with ``fault_where="controller"``: that step falls back to the static depth."""
