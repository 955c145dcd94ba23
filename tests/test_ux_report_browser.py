"""The HTML report in a real browser (issue 13.9): Debian's headless chromium opens `peagle-tune report`'s page, and
the test fails on any console error, uncaught exception, failed resource load or image that did not render; it
keeps a full-page screenshot. A broken copy (one figure deleted) must fail the same check. Skipped when no chromium
is installed (`.ci/run` installs it).

The browser is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in
NUL on file descriptors 3 and 4), so no driver or websocket package is needed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.cli import main

BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium installed (apt-get install chromium)")

#: Seconds the page gets to load, and each DevTools reply to arrive.
TIMEOUT_S = 60.0


class Browser:
    """Headless chromium, one page, spoken to over the DevTools pipe."""

    def __init__(self, profile_dir: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the browser reads commands on fd 3 and writes replies on fd 4
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        assert BROWSER is not None
        self.proc = subprocess.Popen(
            [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--hide-scrollbars", "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, pass_fds=(3, 4), close_fds=True,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read_message(self) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], TIMEOUT_S)
            assert ready, "the browser did not answer"
            chunk = os.read(self._from_browser, 1 << 16)
            assert chunk, "the browser closed the pipe"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                assert "error" not in reply, reply
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_for(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read_message())

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page produced."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                out.append("exception: " + str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        return out

    def evaluate(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return reply["result"].get("value")

    def screenshot(self, path: Path) -> None:
        metrics = self.send("Page.getLayoutMetrics")["cssContentSize"]
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1})
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)


#: Images that did not load or render (no pixels): their src attributes.
BROKEN_IMAGES = ("Promise.all(Array.from(document.images).map(i => i.decode().then(() => null, () => null)))"
                 ".then(() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                 ".map(i => i.getAttribute('src')))")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`peagle-tune report` of a predicted grid search at two concurrencies (with a Pareto study for its figure)."""
    base = tmp_path_factory.mktemp("ux-report")
    db = str(base / "peagle.db")
    for args in (["--concurrency", "1,8", "--max-k", "3", "--trials", "20"],
                 ["--concurrency", "8", "--max-k", "3", "--objective", "pareto", "--strategy", "grid"]):
        result = CliRunner().invoke(main, ["search", "--model", "gpt-oss-120b", "--gpu", "h200", *args, "--db", db])
        assert result.exit_code == 0, result.output
    out = base / "report"
    result = CliRunner().invoke(main, ["report", "--out", str(out), "--db", db])
    assert result.exit_code == 0, result.output
    return out


def check_in_browser(page: Path, shot: Path) -> tuple[list[str], list[str], int]:
    """(errors, broken images, number of images) of `page` in headless chromium; a screenshot goes to `shot`."""
    browser = Browser(shot.parent / f"profile-{shot.stem}")
    try:
        browser.open(page.resolve().as_uri())
        broken = list(browser.evaluate(BROKEN_IMAGES) or [])
        count = int(browser.evaluate("document.images.length"))
        browser.screenshot(shot)
        return browser.errors(), broken, count
    finally:
        browser.close()


@pytest.mark.slow
def test_report_renders_without_errors_or_missing_images(report_dir: Path, tmp_path: Path) -> None:
    shot = report_dir / "screenshot.png"
    errors, broken, count = check_in_browser(report_dir / "index.html", shot)
    assert errors == []
    assert broken == []
    pngs = {p.name for p in report_dir.glob("*.png")} - {shot.name}
    assert count >= len(pngs) >= 3  # every figure the report wrote is on the page
    from matplotlib import image

    pixels = image.imread(shot)
    assert pixels.shape[0] > 1000 and pixels.std() > 0.05  # a long page with content, not a blank one


def test_a_missing_figure_is_caught(report_dir: Path, tmp_path: Path) -> None:
    broken_dir = tmp_path / "broken"
    shutil.copytree(report_dir, broken_dir)
    victim = sorted(p for p in broken_dir.glob("*.png") if p.name != "screenshot.png")[0]
    victim.unlink()
    errors, broken, _ = check_in_browser(broken_dir / "index.html", tmp_path / "broken.png")
    assert any(victim.name in b for b in broken), broken
    assert any("ERR_FILE_NOT_FOUND" in e or victim.name in e for e in errors), errors


@pytest.fixture(scope="module")
def comparison_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """`peagle-tune report` of three grid searches at c=1 and c=8 that recommend the same configs: throughput,
    goodput under an SLO every config meets, and throughput again under another study name (issue 33.8)."""
    base = tmp_path_factory.mktemp("ux-report-compare")
    db = str(base / "peagle.db")
    grid = ["search", "--model", "gpt-oss-120b", "--gpu", "h200", "--concurrency", "1,8", "--max-k", "2",
            "--strategy", "grid", "--db", db]
    for extra in ([], ["--objective", "goodput", "--slo-tpot-p99", "1000"], ["--study", "again"]):
        result = CliRunner().invoke(main, [*grid, *extra])
        assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(main, ["show", "--json", "--db", db])
    recs = json.loads(shown.stdout)["recommendations"]
    out = base / "report"
    result = CliRunner().invoke(main, ["report", "--out", str(out), "--db", db])
    assert result.exit_code == 0, result.output
    by_objective: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_objective.setdefault(r["objective"], []).append(r)
    return out, by_objective


#: The page's P-EAGLE vs EAGLE-3 tables: per table, its rows' cells (text), and which rows are marked recommended.
DRAFTER_TABLES = ("Array.from(document.querySelectorAll('table.drafters')).map(t => Array.from(t.rows).slice(1)"
                  ".map(r => ({cells: Array.from(r.cells).map(c => c.textContent), "
                  "recommended: r.classList.contains('recommended')})))")


@pytest.mark.slow
def test_the_report_compares_p_eagle_with_eagle3_per_concurrency(
    comparison_dir: tuple[Path, dict[str, list[dict[str, Any]]]], tmp_path: Path
) -> None:
    out, recs = comparison_dir
    browser = Browser(tmp_path / "profile")
    try:
        browser.open((out / "index.html").resolve().as_uri())
        tables = browser.evaluate(DRAFTER_TABLES)
        cards = int(browser.evaluate("document.querySelectorAll('.card').length"))
        notes = browser.evaluate("Array.from(document.querySelectorAll('.card .same')).map(p => p.textContent)")
        ids = browser.evaluate("Array.from(document.querySelectorAll('table:not(.drafters) tr td:first-child'))"
                               ".map(td => td.textContent)")
        assert browser.errors() == []
    finally:
        browser.close()
    # One table per search shown (throughput, goodput; their grids pick alike): per concurrency, every variant
    # searched, with the figures stored.
    assert len(tables) == 2
    throughput = {r["scenario"]["concurrency"]: r for r in recs["throughput"]}
    for rows in tables:
        assert len(rows) == sum(len(r["metrics"]["per_drafter"]) for r in throughput.values())
        concurrency = None
        for row in rows:
            cells = row["cells"]
            concurrency = int(cells[0]) if cells[0] else concurrency
            stored = throughput[concurrency]["metrics"]["per_drafter"]
            match = [d for d in stored if d["drafter"].split(":")[0] == cells[1].rstrip("*")
                     and str(d["layers"]) == cells[2] and d["parallel_drafting"] == (cells[3] == "parallel (P-EAGLE)")
                     and d["hypothetical"] == cells[1].endswith("*")]
            assert len(match) == 1, cells
            assert cells[6] == f"{match[0]['output_tokens_per_s']:,.0f}"
            assert cells[8] == ("ref" if match[0]["is_eagle3_reference"] else f"{match[0]['speedup_vs_eagle3']:.2f}x")
            best = throughput[concurrency]["best_config"]
            assert row["recommended"] == ((best["drafter"], best["parallel_drafting"]) == (
                match[0]["best_config"]["drafter"], match[0]["parallel_drafting"]))
        assert [r["cells"][0] for r in rows if r["cells"][0]] == ["1", "8"]
        kinds = {(r["cells"][2], r["cells"][3]) for r in rows}
        assert {("4", "parallel (P-EAGLE)"), ("2", "parallel (P-EAGLE)"), ("1", "sequential")} <= kinds
        assert sum(r["recommended"] for r in rows) == 2  # one per concurrency
    # One entry per distinct recommendation: the goodput search recommends the throughput search's configs, so
    # two cards (c=1, c=8) each naming the other recommendation; the table shows each config and load once.
    assert cards == 2 and len(notes) == 2
    assert all(re.search(r"#\d+ \((throughput|goodput-tpot1000)\)", n) for n in notes), notes
    assert len(ids) == 2 and all("also" in i for i in ids)


#: The page's advantage figures: per figure, the ids of its lines and published points and its caption.
ADVANTAGE = ("Array.from(document.querySelectorAll('figure.advantage')).map(f => ({"
             "ids: Array.from(f.querySelectorAll('svg [id^=\"advantage-\"], svg [id^=\"published-\"]'))"
             ".filter(e => e.getBoundingClientRect().width > 0).map(e => e.id), "
             "text: f.querySelector('svg').textContent, caption: f.querySelector('figcaption').textContent}))")


def test_the_report_plots_the_advantage_beside_every_published_point(
    comparison_dir: tuple[Path, dict[str, list[dict[str, Any]]]], tmp_path: Path
) -> None:
    """Issue 34: P-EAGLE over EAGLE-3 against concurrency, each parallel drafting variant a line, beside every
    published ratio for gpt-oss-120b (the calibration points shipped with the package), each with its source."""
    from autotune.report._series import published_advantage

    out, _recs = comparison_dir
    browser = Browser(tmp_path / "profile")
    try:
        browser.open((out / "index.html").resolve().as_uri())
        figures = browser.evaluate(ADVANTAGE)
        assert browser.errors() == []
    finally:
        browser.close()
    published = published_advantage("openai/gpt-oss-120b")
    # PR #32887 (B200, c=1 and 8), PR #32628 (c=1 and 8), the paper's Table 10 (H200, c=2 and 4).
    assert {(p.point_id.split("-")[0], p.concurrency) for p in published} == {
        ("pr32887", 1), ("pr32887", 8), ("pr32628", 1), ("pr32628", 8), ("paper", 2), ("paper", 4)}
    assert len(figures) == 2  # one per search shown, as the tables
    for figure in figures:
        drawn = set(figure["ids"])
        assert {"advantage-0", "advantage-1"} <= drawn  # the 4- and 2-layer P-EAGLE heads
        for p in published:
            assert f"published-{p.point_id}-c{p.concurrency}" in drawn
            assert p.label in figure["text"]  # the legend names each source
            assert " ".join(p.source.split()) in " ".join(figure["caption"].split())
