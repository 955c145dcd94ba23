"""`peagle-tune report`: the page and figures a user reads to understand a tuning result.

The database holds one profile built from a derivation (geometric acceptance, a linear step cost; numbers below)
plus the trials and recommendations of a real `peagle-tune search` with the model backend (predicted).
"""

from __future__ import annotations

import html
import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli.report import report
from autotune.cli.search import search
from autotune.report import write_report
from policies import StepCostModel, StepSample
from store import Store

MODEL = "openai/gpt-oss-120b"
DRAFTER = "amazon/gpt-oss-120b-p-eagle"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Derived profile: survival s_i = a^(i+1) per class (constant conditional rate a), 4000 drafts per class.
RATES = {"chat": 0.6, "code": 0.8}
NUM_DRAFTS = 4000
MAX_K = 6
BATCH_SIZES = (1, 4, 16)


def step_ms(b: int, k: int) -> float:
    """Linear P-EAGLE step cost (ms): 4 + 0.3 B + 0.02 B (K+1) + [K>0] (1.5 + 0.05 B)."""
    drafted = 1.0 if k > 0 else 0.0
    return 4.0 + 0.3 * b + 0.02 * b * (k + 1) + drafted * (1.5 + 0.05 * b)


def add_derived_profile(store: Store) -> int:
    env = store.environment_id({"device": "cpu", "gpu_count": 1, "vllm_version": "0.32.0"})
    wl = store.workload_id("fixture-mix", content_hash="f" * 64, classes=sorted(RATES))
    acceptance = {
        cls: {
            "num_drafts": NUM_DRAFTS,
            "accepted_per_position": [round(NUM_DRAFTS * a ** (i + 1)) for i in range(MAX_K)],
        }
        for cls, a in RATES.items()
    }
    samples = [StepSample(b, k, step_ms(b, k), n=50) for b in BATCH_SIZES for k in range(MAX_K + 1)]
    costs = [{"batch_size": s.batch_size, "depth": s.depth, "step_ms": s.step_ms, "n": s.n} for s in samples]
    model = StepCostModel.fit(samples)
    return store.add_profile(
        MODEL,
        drafter=DRAFTER,
        drafter_layers=4,
        method="eagle3",
        parallel_drafting=True,
        max_k=MAX_K,
        environment_id=env,
        workload_id=wl,
        acceptance=acceptance,
        step_costs=costs,
        cost_model=model.to_dict(),
    )


def add_multi_objective_study(store: Store) -> None:
    """A two-objective study (throughput up, TPOT p99 down) with one failed trial."""
    prov = {"kind": "measured", "backend": "vllm", "device": "cpu", "vllm_version": "0.32.0", "date": "2026-01-02"}
    points = [(0, 100.0, 10.0), (1, 200.0, 20.0), (2, 150.0, 30.0), (3, 250.0, 40.0)]
    for number, tps, p99 in points:
        config = {"method": "eagle3", "drafter": DRAFTER, "num_speculative_tokens": number + 1,
                  "parallel_drafting": True, "max_num_seqs": 8}
        store.add_trial("mo-study", number=number, model=MODEL, config=config, backend="vllm", provenance=prov,
                        scenario={"concurrency": 8}, values={"throughput": tps, "tpot_ms_p99": p99})
    store.add_trial("mo-study", number=4, model=MODEL, config={"method": "none", "max_num_seqs": 8}, backend="vllm",
                    provenance=prov, scenario={"concurrency": 8}, status="failed", failure_reason="engine died")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "peagle.db"
    with Store(str(path)) as store:
        add_derived_profile(store)
        add_multi_objective_study(store)
    result = CliRunner().invoke(
        search, ["--model", "gpt-oss-120b", "--concurrency", "1,64", "--trials", "12", "--db", str(path)]
    )
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture(scope="module")
def page(db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out")
    result = CliRunner().invoke(report, ["--out", str(out), "--db", str(db), "--force"])
    assert result.exit_code == 0, result.output
    return out / "index.html"


@pytest.mark.slow
def test_report_writes_valid_pngs_beside_the_page(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    images = re.findall(r'<img src="([^"]+)"', text)
    # profile: acceptance, AL(K), step cost, tokens/s; 3 studies (c1, c64, mo-study); 1 Pareto front
    assert len(images) == 4 + 3 + 1
    for name in images:
        png = page.parent / html.unescape(name)
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 10_000, name  # a drawn figure, not an empty canvas


def test_summary_has_the_speculative_config_to_paste(db: Path, page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    with Store(str(db)) as store:
        recs = store.list_recommendations(MODEL)
    assert len(recs) == 2  # one per concurrency searched
    # What a user copies: the text of each <pre> after unescaping, split as a shell would.
    blocks = [shlex.split(html.unescape(m)) for m in re.findall(r'<pre class="specconfig">(.*?)</pre>', text)]
    pasted = [json.loads(args[1]) for args in blocks if args[0] == "--speculative-config"]
    for rec in recs:
        cfg = rec.best_config
        expected = {"method": cfg["method"], "model": cfg["drafter"], "num_speculative_tokens": cfg[
            "num_speculative_tokens"]}
        if cfg["parallel_drafting"]:
            expected["parallel_drafting"] = True
        assert expected in pasted


def test_every_figure_says_measured_or_predicted(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", text, flags=re.S)
    assert captions
    for caption in captions:
        assert "MEASURED" in caption or "PREDICTED" in caption, caption
    plain = html.unescape(text)
    # The profile's figures name device, vLLM version; the search's recommendations name the GPU assumed.
    assert "Measured (offline profiling run): profile #1" in plain
    assert "on cpu, vLLM 0.32.0" in plain
    assert "Predicted by the model backend for NVIDIA H200 SXM 141GB (GPU assumed" in plain


def test_page_is_self_contained(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text
    assert not re.search(r'(src|href)="(https?:)?//', text)


def test_stored_text_is_escaped(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with Store(str(db)) as store:
        store.add_recommendation(
            MODEL, gpu="cpu", objective="throughput", workload_name="<script>alert(1)</script>",
            best_config={"method": "none", "max_num_seqs": 4}, scenario={"concurrency": 4},
            provenance={"kind": "measured", "device": "cpu", "vllm_version": "0.32.0"},
        )
        index = write_report(store, tmp_path / "out")
    text = index.read_text(encoding="utf-8")
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "Serve without speculation" in text


def test_empty_database_is_an_error_that_says_what_to_run(tmp_path: Path) -> None:
    Store(str(tmp_path / "empty.db")).close()  # tables, nothing stored (a file that does not exist is "not found")
    result = CliRunner().invoke(report, ["--out", str(tmp_path / "out"), "--db", str(tmp_path / "empty.db")])
    assert result.exit_code == 2
    assert "peagle-tune search" in result.output
    assert not (tmp_path / "out").exists()


def test_unknown_model_lists_the_models_that_have_data(db: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(report, ["--model", "nobody/none", "--out", str(tmp_path), "--db", str(db)])
    assert result.exit_code == 2
    assert MODEL in result.output


def test_existing_page_is_not_overwritten_without_force(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with Store(str(db)) as store:
        add_derived_profile(store)
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("mine", encoding="utf-8")
    result = CliRunner().invoke(report, ["--out", str(out), "--db", str(db)])
    assert result.exit_code == 2
    assert "--force" in result.output
    assert (out / "index.html").read_text(encoding="utf-8") == "mine"
    result = CliRunner().invoke(report, ["--out", str(out), "--db", str(db), "--force"])
    assert result.exit_code == 0, result.output
    assert "profile #1" in html.unescape((out / "index.html").read_text(encoding="utf-8"))


def test_report_command_has_an_example() -> None:
    assert report.help is not None and "Example:" in report.help
