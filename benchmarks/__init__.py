"""The performance harness: scripts that print figures (not tests), run from the repository root as modules.

Example: ``python -m benchmarks.bench_runtime --rounds 3``. Each script says what it runs and what it prints; the
measurements they share (tokens/s, spreads, the machine's load) live in `benchmarks.common`, and the scheduler test
double the plugin-overhead benchmark and the tests drive in `benchmarks.fakes`. Engines come from `autotune.engine`,
configurations from `autotune.spec.SpecConfig`, request labels from `policies.plugin`.
"""
