"""Wall time of the quick commands and of the main one, as a user runs them (a new process each time).

    python -m benchmarks.bench_cli_speed [--rounds 5] [--tree DIR ...]

Each round runs, in this order, `peagle-tune --help`, `peagle-tune list models` and `peagle-tune search --model
gpt-oss-120b` (the model backend's predicted search, 3 concurrencies x 60 trials) with a fresh database, for every
source tree given (``--tree``: a checkout whose packages are put first on PYTHONPATH, e.g. a `git worktree` of an
older commit; default: this one), so the trees alternate within a round and share the machine's state. Prints the
median (min-max) per command and tree, and the load average before and after. Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "list models": ["list", "models"],
    "search --model gpt-oss-120b": ["search", "--model", "gpt-oss-120b"],
}


def run_once(tree: Path, args: list[str], db_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "PEAGLE_DB": f"sqlite:///{db_dir / 'peagle.db'}"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", *args], env=env, cwd=db_dir,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: peagle-tune {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, action="append", help="a source tree (default: this checkout)")
    opts = parser.parse_args()
    trees = [t.resolve() for t in (opts.tree or [Path(__file__).resolve().parents[1]])]
    times: dict[tuple[str, Path], list[float]] = {}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for _ in range(opts.rounds):
        for name, args in COMMANDS.items():
            for tree in trees:
                with tempfile.TemporaryDirectory(prefix="peagle-bench-") as tmp:
                    times.setdefault((name, tree), []).append(run_once(tree, args, Path(tmp)))
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{opts.rounds} rounds; seconds, median (min-max)")
    for (name, tree), values in times.items():
        print(f"  {name:<30} {statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})  {tree}")


if __name__ == "__main__":
    main()
