"""What peagle-tune emits is data, never syntax, and every file it writes goes through one safe writer.

Probes from issue 35, part A: a workload file (or GPU, or model) name holding a line break broke out of the ``#``
comment of `export --format yaml` (vLLM's ``--config`` then bound to 0.0.0.0), and of the policy export's; control
characters and rich markup in stored names reached the terminal; `report --out D` wrote through links planted at
D/index.html and at its PNG names (a dangling link's target was created); `export --out /dev/full --force` replaced
the device with a regular file; a full disk gave an error without the path. Hostile names are written into the
database with SQL, as a row from another program or an older version would hold them (the store refuses them at
the door). The rows of docs/reliability.md ("Output: escaping and writing files") point here.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import socket
import sqlite3
import stat
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.engine import config_args, export_options, serve_command
from autotune.errors import UsageError
from autotune.export import policy_document
from autotune.safe_io import check_target
from autotune.spec import SpecConfig
from store import Store

DRAFTER = "my-org/tiny-drafter"
BEST = {"method": "draft_model", "drafter": DRAFTER, "num_speculative_tokens": 3,
        "parallel_drafting": True, "max_num_seqs": 16}
#: A workload file name that, written raw after ``# ``, ends the comment and adds two keys to a YAML file.
INJECTED = "w\nhost: 0.0.0.0\nport: 1\n#.jsonl"
#: The other line breaks YAML (or a reader) honours: CR, NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR.
OTHER_BREAKS = "\rhost: 0.0.0.0\x85port: 1\u2028api-key: k\u2029#"
#: A name with markup, an escape sequence (clear screen), a title-setting OSC with BEL, a C1 CSI, a bidi override
#: and a NEL. What a terminal should show of it: the printable characters.
HOSTILE = "[bold]x\x1b[2J\x1b]0;pwned\x07\x9b1m\u202ey\x85"
SHOWN = "[bold]x[2J]0;pwned1my"


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_line(result: Result, exit_code: int) -> str:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0].removeprefix("Error: ")


def _sql(db: Path, statement: str, *params: Any) -> None:
    """Change stored rows behind the store's back (as another program or an older version could have)."""
    with sqlite3.connect(db) as conn:
        assert conn.execute(statement, params).rowcount >= 1


def _database(path: Path, *, model: str = "my-org/tiny-target", drafter: str = DRAFTER) -> int:
    with Store(str(path)) as store:
        rec = store.add_recommendation(
            "my-org/tiny-target", gpu="cpu", objective="throughput", best_config=BEST, scenario={"concurrency": 4},
            metrics={"output_tokens_per_s": 500.0}, provenance={"kind": "measured", "backend": "vllm", "device": "cpu"},
            schedule=[{"batch_min": 1, "batch_max": 4, "k": 3}, {"batch_min": 5, "batch_max": 16, "k": 1}],
            class_policy={"chat": {"max_k": 3}, "code": {"max_k": 2}}, workload_name="w.jsonl",
        )
    _sql(path, "UPDATE peagle_recommendations SET model = ?, best_config = ? WHERE id = ?",
         model, json.dumps({**BEST, "drafter": drafter}), rec)
    return rec


def _record(db: Path, rec: int) -> dict[str, Any]:
    with Store(str(db)) as store:
        return store.get_recommendation(rec).to_dict()


# ------------------------------------------------------------------------------------- exports: data, never syntax


@pytest.mark.parametrize("name", [INJECTED, OTHER_BREAKS], ids=["newlines", "cr-nel-u2028-u2029"])
def test_yaml_export_has_exactly_its_keys_whatever_the_names(tmp_path: Path, name: str) -> None:
    db = tmp_path / "p.db"
    model = f"my-org/m{name}"
    rec = _database(db, model=model)
    _sql(db, "UPDATE peagle_recommendations SET workload_name = ?, gpu = ?", name, f"H200{name}")
    out = tmp_path / "serve.yaml"
    result = _run("export", "--db", str(db), "--format", "yaml", "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    # Before: {"host": "0.0.0.0", "port": 1, ...} came from the header's comment.
    # A GPU recommendation: the memory arguments the fit check assumed (vLLM's default utilization) follow.
    assert doc == {**export_options(model, SpecConfig.from_dict(BEST)), "tensor-parallel-size": 1,
                   "gpu-memory-utilization": 0.92}
    assert "host" not in doc and "port" not in doc
    header = list(itertools.takewhile(lambda line: line.startswith("# "), text.splitlines()))
    assert len(header) == 4 and header[3] == "# Serve with: vllm serve --config THIS_FILE.yaml", header
    assert text.splitlines()[4].startswith("model: ")  # the names stayed inside the header's first line
    assert _record(db, rec)["workload_name"] == name  # the name itself was stored hostile


def test_policy_export_has_exactly_its_keys_whatever_the_names(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    rec = _database(db)
    _sql(db, "UPDATE peagle_recommendations SET workload_name = ?, provenance = ?", INJECTED,
         json.dumps({"kind": "measured", "backend": "vllm", "device": f"cpu{INJECTED}", "profile": INJECTED}))
    out = tmp_path / "policy.yaml"
    assert _run("export", "--db", str(db), "--format", "policy", "--out", str(out)).exit_code == 0
    doc = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert doc == policy_document(_record(db, rec))
    assert "host" not in doc and "port" not in doc


def test_shell_export_reads_back_word_for_word(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    model, drafter = f"my-org/m {HOSTILE}'\n", f"d;$(touch pwned){HOSTILE}"
    _database(db, model=model, drafter=drafter)
    result = _run("export", "--db", str(db), "--format", "vllm-args")
    assert result.exit_code == 0, result.output
    line = result.stdout
    assert line.endswith("\n") and not [c for c in line[:-1] if not c.isprintable()]  # no raw control character
    words = subprocess.run(["bash", "-c", f'args() {{ printf "%s\\0" "$@"; }}; args {line}'], cwd=tmp_path,
                           capture_output=True, check=True).stdout.decode("utf-8").split("\0")[:-1]
    config = config_args(SpecConfig.from_dict({**BEST, "drafter": drafter}), engine_paths=False)
    assert words == serve_command(model, {**config, "tensor_parallel_size": 1})  # CPU: no memory fraction
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("fmt", ["vllm-json", "schedule"])
def test_json_exports_hold_the_name_as_a_string(tmp_path: Path, fmt: str) -> None:
    db = tmp_path / "p.db"
    drafter = f'd"}}, "model": "evil{HOSTILE}{INJECTED}'
    _database(db, drafter=drafter)
    result = _run("export", "--db", str(db), "--format", fmt)
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)
    assert spec["model"] == drafter
    assert set(spec) == {"method", "model", "num_speculative_tokens", "parallel_drafting"} | (
        {"num_speculative_tokens_per_batch_size"} if fmt == "schedule" else set())


# ---------------------------------------------------------------------------------------- terminal: no controls


def _unsafe(text: str) -> list[str]:
    """Characters a terminal acts on (controls but newline, format characters such as bidi overrides, line and
    paragraph separators, lone surrogates)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


@pytest.fixture
def hostile_db(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "h.db"
    study = f"study-{HOSTILE}"
    with Store(str(db)) as store:
        env = store.environment_id({"device": "cpu"})
        store.add_profile("my-org/tiny-target", drafter="my-org/d", method="eagle3", max_k=2, environment_id=env,
                          acceptance={"chat": {"num_drafts": 10, "accepted_per_position": [5, 2]}}, step_costs=[])
        for number, status in ((0, "complete"), (1, "failed")):
            store.add_trial("s", number=number, model="my-org/tiny-target", config=BEST, backend="model",
                            provenance={"kind": "predicted"}, scenario={"concurrency": 4}, status=status,
                            values={"output_tokens_per_s": 100.0} if status == "complete" else None,
                            failure_reason="x" if status == "failed" else None)
    _database(db, model=f"my-org/{HOSTILE}", drafter=f"my-org/{HOSTILE}")
    _sql(db, "UPDATE peagle_recommendations SET workload_name = ?, gpu = ?, study = ?", HOSTILE, HOSTILE, study)
    _sql(db, "UPDATE peagle_trials SET study = ?, model = ?", study, f"my-org/{HOSTILE}")
    _sql(db, "UPDATE peagle_trials SET failure_reason = ? WHERE status = 'failed'", HOSTILE)
    _sql(db, "UPDATE peagle_profiles SET model = ?, drafter = ?", f"my-org/{HOSTILE}", f"my-org/{HOSTILE}")
    return db, study


@pytest.mark.parametrize("view", [[], ["--wide"], ["--studies"], ["--trials", "STUDY"], ["--trials", "STUDY", "--wide"],
                                  ["--profiles", "--wide"]])
def test_show_prints_stored_names_without_control_characters(hostile_db: tuple[Path, str], view: list[str]) -> None:
    db, study = hostile_db
    result = _run("show", "--db", str(db), *(study if a == "STUDY" else a for a in view))
    assert result.exit_code == 0, result.output
    assert _unsafe(result.output) == []
    assert SHOWN in result.output  # markup printed as written, the rest of the name kept


def test_export_and_errors_print_names_without_control_characters(hostile_db: tuple[Path, str]) -> None:
    db, _study = hostile_db
    result = _run("export", "--db", str(db))
    assert result.exit_code == 0, result.output
    assert _unsafe(result.stderr) == [] and SHOWN in result.stderr  # "Exporting ... of recommendation #1: ..."
    message = _one_line(_run("show", "--db", str(db), "--model", HOSTILE), 3)
    assert _unsafe(message) == []
    bad_choice = _run("export", "--db", str(db), "--format", HOSTILE)  # click's own message quotes the value
    assert bad_choice.exit_code == 2 and _unsafe(bad_choice.output) == []


# ------------------------------------------------------------------------------- files: links, devices, full disk


def _report_db(path: Path) -> Path:
    with Store(str(path)) as store:
        env = store.environment_id({"device": "cpu", "vllm_version": "0.32.0"})
        store.add_profile(
            "my-org/tiny-target", drafter="my-org/d", method="eagle3", max_k=3, environment_id=env,
            acceptance={"chat": {"num_drafts": 100, "accepted_per_position": [60, 30, 10]}},
            # T(B, K) = 5 + 0.5 B + 0.1 B K ms: positive and increasing, so the step-cost figure is drawn.
            step_costs=[{"batch_size": b, "depth": k, "step_ms": 5 + 0.5 * b + 0.1 * b * k, "n": 10}
                        for b in (1, 4) for k in range(4)],
        )
    return path


@pytest.fixture(scope="module")
def report_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A database and the names of the files its report writes."""
    base = tmp_path_factory.mktemp("report")
    db = _report_db(base / "r.db")
    first = base / "first"
    assert _run("report", "--db", str(db), "--out", str(first)).exit_code == 0
    names = sorted(p.name for p in first.iterdir())
    assert "index.html" in names and len(names) >= 3
    return db, names


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.slow
def test_report_never_writes_through_links(report_db: tuple[Path, list[str]], tmp_path: Path, dangling: bool) -> None:
    db, names = report_db
    out = tmp_path / "out"
    out.mkdir()
    png = next(n for n in names if n.endswith(".png"))
    victims = {name: tmp_path / f"victim-{name}" for name in ("index.html", png)}
    for name, victim in victims.items():
        if not dangling:
            victim.write_text("someone else's", encoding="utf-8")
        (out / name).symlink_to(victim)
    message = _one_line(_run("report", "--db", str(db), "--out", str(out)), 2)
    assert message.startswith(f"--out {out / 'index.html'} is a symbolic link (to ")
    assert "pass --force" in message
    (out / "index.html").unlink()  # the page's link gone, the PNG's link alone still refuses
    message = _one_line(_run("report", "--db", str(db), "--out", str(out)), 2)
    assert message.startswith(f"--out {out / png} is a symbolic link") and "pass --force" in message
    assert sorted(p.name for p in out.iterdir()) == [png]  # nothing written before the refusal
    (out / "index.html").symlink_to(victims["index.html"])
    assert _run("report", "--db", str(db), "--out", str(out), "--force").exit_code == 0
    for name, victim in victims.items():
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 100
        if dangling:
            assert not victim.exists()  # before: the link's target was created
        else:
            assert victim.read_text(encoding="utf-8") == "someone else's"
    assert sorted(p.name for p in out.iterdir()) == names


def _special(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """A path that is not a regular file, and what the refusal calls it."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe")
        return tmp_path / "pipe", "a FIFO"
    if kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(tmp_path / "sock"))
        server.close()  # the socket file stays
        return tmp_path / "sock", "a socket"
    # A writer that regressed would replace the device itself, as the probe did: only where it cannot.
    if os.access("/dev", os.W_OK) or not os.path.exists("/dev/full"):
        pytest.skip("/dev is writable here (root): a regression would replace this machine's /dev/full")
    return Path("/dev/full"), "a character device"


@pytest.mark.parametrize("kind", ["fifo", "socket", "dev-full"])
def test_export_refuses_a_non_regular_target_even_with_force(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "p.db"
    _database(db)
    target, what = _special(kind, tmp_path)
    before = os.lstat(target)
    message = _one_line(_run("export", "--db", str(db), "--out", str(target), "--force"), 2)
    assert message == (f"--out {target} is {what}, not a regular file; peagle-tune writes only regular files: "
                       "choose a file path.")
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_the_writer_refuses_dev_full_before_writing() -> None:
    """The check alone (it writes nothing, so it is safe to run as root): /dev/full is refused even with force."""
    with pytest.raises(UsageError) as refused:
        check_target(Path("/dev/full"), force=True)
    assert str(refused.value) == ("--out /dev/full is a character device, not a regular file; peagle-tune writes only "
                                  "regular files: choose a file path.")
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_report_refuses_a_fifo_for_its_page(report_db: tuple[Path, list[str]], tmp_path: Path) -> None:
    db, _names = report_db
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "index.html")
    message = _one_line(_run("report", "--db", str(db), "--out", str(out), "--force"), 2)
    assert message.startswith(f"--out {out / 'index.html'} is a FIFO, not a regular file")
    assert stat.S_ISFIFO(os.lstat(out / "index.html").st_mode) and len(list(out.iterdir())) == 1


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def write(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_names_the_file_and_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "p.db"
    _database(db)
    out = tmp_path / "spec.json"
    out.write_text("old", encoding="utf-8")
    _disk_full(monkeypatch)
    message = _one_line(_run("export", "--db", str(db), "--out", str(out), "--force"), 1)
    assert message == f"--out {out}: cannot write it (No space left on device); nothing was changed."
    assert out.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.db", "spec.json"]  # no temporary file left


def test_a_full_disk_under_report_names_the_file(report_db: tuple[Path, list[str]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = report_db
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.html").write_text("old page", encoding="utf-8")
    _disk_full(monkeypatch)
    message = _one_line(_run("report", "--db", str(db), "--out", str(out), "--force"), 1)
    found = re.fullmatch(rf"--out {re.escape(str(out))}/(.+\.png): cannot write it \(No space left on device\); "
                         r"nothing was changed\.", message)
    assert found and found[1] in names, message  # the first figure it tried to write, by its path
    assert (out / "index.html").read_text(encoding="utf-8") == "old page"
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]


def test_report_file_names_are_bounded_and_distinct_whatever_the_study_names(tmp_path: Path) -> None:
    """A study name as long as its column (300 characters) made a figure name over the 255 bytes file systems take;
    two names that differ only in punctuation ("a b", "a-b") shared one file, the second figure replacing the first."""
    db = tmp_path / "r.db"
    studies = ["s" * 300, "a b", "a-b"]
    with Store(str(db)) as store:
        for study in studies:
            for number, tps in enumerate((100.0, 120.0)):
                store.add_trial(study, number=number, model="my-org/tiny-target", config={**BEST, "max_num_seqs": 4},
                                backend="model", provenance={"kind": "predicted"}, scenario={"concurrency": 4},
                                values={"output_tokens_per_s": tps})
    out = tmp_path / "out"
    result = _run("report", "--db", str(db), "--out", str(out))
    assert result.exit_code == 0, result.output
    figures = sorted(p.name for p in out.glob("*.png"))
    assert len(figures) == len(studies)  # one trials figure per study, none replaced by another's
    assert all(len(name.encode()) <= 124 for name in figures), figures
