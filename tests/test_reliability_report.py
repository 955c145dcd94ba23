"""Hostile text in the database cannot put markup or script into `peagle-tune report`'s page, nor stop the page.

Anyone who can write to a shared database (a SQLite file in a group folder, a fleet's PostgreSQL) chooses the class
names, model and drafter names, workload names, studies, devices and failure reasons the report prints. Each text
field below holds markup (numbers stay numbers: this is about text); the page must show it as text: only the tags
the report itself writes, no event-handler attribute, no image that is not one of its own PNGs.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner

from autotune.cli.report import report
from store import Store

XSS = "<img src=x onerror=alert(1)>"
SCRIPT = '</code><script>alert("s")</script>'
# matplotlib reads $...$ in a label as math; an unbalanced or unknown command must not stop the figures either.
MATH = r"$\frac{$ & %s \\"
ATTR = '" onmouseover="alert(2)'

#: The tags `autotune/report/_html.py` writes; anything else in the page came from the database.
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b", "code", "span", "div", "pre",
    "details", "summary", "table", "tr", "th", "td", "ul", "li", "figure", "img", "figcaption",
}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _hostile_database(path: Path) -> None:
    """One model whose every text field is hostile: a profile, a study with a failed trial, a recommendation."""
    model = f"evil/{XSS}"
    with Store(str(path)) as store:
        env = store.environment_id({"device": f"cpu {XSS}", "vllm_version": SCRIPT})
        workload = store.workload_id(f"wl {XSS}", content_hash="e" * 64, classes=[XSS, MATH, SCRIPT])
        store.add_profile(
            model,
            drafter=f"drafter/{ATTR}",
            method="eagle3",
            max_k=3,
            environment_id=env,
            workload_id=workload,
            acceptance={
                XSS: {"num_drafts": 100, "accepted_per_position": [60, 30, 10]},
                MATH: {"num_drafts": 100, "accepted_per_position": [50, 20, 5]},
                SCRIPT: {"num_drafts": 100, "accepted_per_position": [40, 10, 2]},
            },
            # T(B, K) = 5 + 0.5 B + 0.1 B K ms: any positive, increasing surface draws the figure.
            step_costs=[
                {"batch_size": b, "depth": k, "step_ms": 5 + 0.5 * b + 0.1 * b * k, "n": 10}
                for b in (1, 4) for k in range(4)
            ],
            notes={"why": XSS},
        )
        config = {"method": "eagle3", "drafter": f"drafter/{ATTR}", "num_speculative_tokens": 2,
                  "parallel_drafting": False, "max_num_seqs": 4}
        prov = {"kind": "measured", "backend": "vllm", "device": XSS, "vllm_version": SCRIPT, "date": ATTR}
        study = f"study {XSS}"
        store.add_trial(study, number=0, model=model, config=config, backend="vllm", provenance=prov,
                        scenario={"concurrency": 4}, values={"output_tokens_per_s": 100.0})
        store.add_trial(study, number=1, model=model, config={"method": XSS}, backend="vllm", provenance=prov,
                        scenario={"concurrency": 4}, status="failed", failure_reason=SCRIPT)
        store.add_recommendation(
            model,
            gpu=f"gpu {XSS}",
            objective=f"throughput {SCRIPT}",
            best_config=config,
            scenario={"concurrency": 4},
            metrics={"output_tokens_per_s": 100.0, "objective": {"name": XSS}, "published_k": ATTR},
            provenance=prov,
            schedule=[{"batch_min": 1, "batch_max": 4, "k": SCRIPT}],
            class_policy={XSS: {"max_k": SCRIPT}, MATH: ATTR},
            vllm_version=SCRIPT,
            workload_name=f"wl {XSS}",
            study=study,
        )


def test_hostile_stored_text_appears_escaped_and_the_page_is_still_written(tmp_path: Path) -> None:
    db = tmp_path / "hostile.db"
    _hostile_database(db)
    out = tmp_path / "out"
    result = CliRunner().invoke(report, ["--out", str(out), "--db", str(db)])
    assert result.exit_code == 0, result.output
    text = (out / "index.html").read_text(encoding="utf-8")

    parser = _Tags()
    parser.feed(text)
    tags = {tag for tag, _ in parser.tags}
    assert tags <= PAGE_TAGS, tags - PAGE_TAGS
    handlers = [(tag, name) for tag, attrs in parser.tags for name, _ in attrs if name.startswith("on")]
    assert handlers == []
    images = [dict(attrs).get("src") for tag, attrs in parser.tags if tag == "img"]
    assert images and all(src and src.endswith(".png") and (out / src).is_file() for src in images)

    # The class name is on the page, as text (the per-class caps of the recommendation list it).
    assert html.escape(XSS) in text
    assert XSS not in text
    assert "<script" not in text
    assert html.escape(ATTR) in text or html.escape(ATTR, quote=True) in text
