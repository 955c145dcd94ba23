"""`run_server` on a stand-in for ``vllm serve``: signal forwarding, periodic and final live-profile records."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from pathlib import Path

from test_serve_launch import ENV, MODEL, add_profile, add_recommendation

from autotune.serving import LiveRecorder, ServeLaunch, build_launch, resolve_tuned_config, run_server
from store import Store

# Stands in for `vllm serve`: like the plugin, it writes statistics to the configured stats_path (one step of
# class "predictable" now, a second one when it is told to stop), and exits 0 on SIGTERM.
FAKE_SERVER = """
import os, signal, sys, time
from pathlib import Path
from policies.plugin import PluginConfig, PluginStats

config = PluginConfig.from_env()
stats = PluginStats()
def step():
    rows = [("predictable", "default", 3, 3)] * 4
    stats.observe_step(step_ms=9.0, prompt_tokens=0, requests=rows, drafting_depth=5)
    stats.save(config.stats_path)
def stop(signum, frame):
    step()
    Path(sys.argv[1]).write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
step()
while True:
    time.sleep(0.05)
"""


@dataclasses.dataclass
class FakeServe:
    """A `serve` launch of `FAKE_SERVER` with a stored recommendation and profile, and its live recorder."""

    store: Store
    launch: ServeLaunch
    recorder: LiveRecorder
    marker: Path
    """Where the server writes the signal that stopped it."""
    logs: list[str]


def fake_serve(tmp_path: Path, port: int) -> FakeServe:
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    add_recommendation(store)
    add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    launch = build_launch(tuned, port=port, run_dir=tmp_path / "run")
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    marker = tmp_path / "terminated"
    launch = dataclasses.replace(launch, argv=(sys.executable, str(script), str(marker)))
    logs: list[str] = []
    recorder = LiveRecorder(store, tuned, launch.stats_path, log=logs.append, environment=ENV)
    return FakeServe(store, launch, recorder, marker, logs)


def test_stop_is_forwarded_and_live_profiles_are_recorded_periodically_and_at_exit(tmp_path: Path) -> None:
    fake = fake_serve(tmp_path, 18999)
    store, launch, recorder, marker, logs = fake.store, fake.launch, fake.recorder, fake.marker, fake.logs
    stop = threading.Event()

    def stop_after_first_record() -> None:
        deadline = time.monotonic() + 60
        while not recorder.profile_ids and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_after_first_record, daemon=True).start()
    code = run_server(launch, recorder, record_every_s=0.2, log=logs.append, stop=stop)

    assert code == 0
    assert marker.read_text() == "15"  # the server got SIGTERM
    # One record while running (4 drafts), one after the exit with the final statistics (8 drafts).
    assert len(recorder.profile_ids) == 2, logs
    final = store.get_profile(recorder.profile_ids[-1])
    assert final.kind == "live" and final.acceptance["predictable"]["num_drafts"] == 8
    assert not launch.metrics_dir.exists()  # Prometheus multiprocess files are removed after the run
    assert launch.plugin_path.is_file()  # the plugin config stays for inspection


def test_a_closed_terminal_stops_the_server_gracefully(tmp_path: Path) -> None:
    # Issue 44.2: SIGHUP of `serve` (the terminal closed) left the vLLM server running with no final statistics. Here
    # the SIGHUP reaches this process (the main thread, where run_server installs its handlers) once the server runs.
    fake = fake_serve(tmp_path, 18998)
    store, launch, recorder, marker, logs = fake.store, fake.launch, fake.recorder, fake.marker, fake.logs

    def hang_up_once_running() -> None:
        deadline = time.monotonic() + 60
        while not recorder.profile_ids and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGHUP)

    threading.Thread(target=hang_up_once_running, daemon=True).start()
    code = run_server(launch, recorder, record_every_s=0.2, log=logs.append)

    assert code == 0
    assert marker.read_text() == str(int(signal.SIGTERM))  # forwarded as SIGTERM: the server shut down gracefully
    final = store.get_profile(recorder.profile_ids[-1])
    assert final.acceptance["predictable"]["num_drafts"] == 8  # its statistics at the stop were recorded
