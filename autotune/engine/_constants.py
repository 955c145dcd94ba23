"""Numbers every engine launch shares, defined once (seconds unless a name says otherwise)."""

from __future__ import annotations

LOOPBACK = "127.0.0.1"
"""The address measurement servers bind to: never reachable from other machines."""

WARMUP_MAX_TOKENS = 16
"""Warm-up requests are cut to this many tokens: enough to run prefill, drafting and verification once."""

POLL_S = 0.25
"""How often a parent looks at a running worker (result file, exit, deadline)."""
HEALTH_POLL_S = 0.5
"""How often a parent asks a starting or running server for ``/health``."""
HEALTH_TIMEOUT_S = 2.0
"""How long one ``/health`` request may take before the server counts as not (yet) healthy."""

RESULT_SHUTDOWN_GRACE_S = 30.0
"""After a worker has written its result, how long it may take to shut its engine down before it is killed."""
SERVER_SHUTDOWN_GRACE_S = 15.0
"""After a measurement, how long ``vllm serve`` may take to exit on SIGTERM before its group is killed."""
ORPHAN_GRACE_S = 5.0
"""When a group's leader exited on its own, how long the rest may take to exit (and free /dev/shm) before SIGKILL."""
GROUP_EXIT_WAIT_S = 10.0
"""After SIGKILL, how long to wait for every member of the group to be gone (so memory is free for the next)."""

DEFAULT_TIMEOUT_S = 1800.0
"""Wall-clock limit of one engine launch, engine start included."""
DEFAULT_CPU_KV_CACHE_GIB = 4
"""VLLM_CPU_KVCACHE_SPACE on machines without GPUs (see `autotune.engine.EngineOptions.cpu_kv_cache_gib`)."""
