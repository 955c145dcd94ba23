"""The class path vLLM loads the plugin by: ``policies.scheduler.PeagleScheduler`` (`policies.plugin.SCHEDULER_CLS`).

Existing command lines, exports and stored configs name this path, so it stays; the adapter itself lives in
`policies.plugin.scheduler`. Importing this module imports vLLM (engine process only).
"""

from __future__ import annotations

from policies.plugin.scheduler import PeagleAsyncScheduler, PeagleScheduler

__all__ = ["PeagleAsyncScheduler", "PeagleScheduler"]
