"""Issue 12, "Predictable paths in shared /tmp": serve's run directory and the drafter aliases on a shared host.

An attacker pre-creates the folders peagle-tune writes into (world-writable, owned by another uid) and plants
symlinks to a victim file; a careless user points ``--run-dir`` at a folder holding another tool's ``stats.json``
and ``prometheus/``. Each case must be refused with one line naming the path and what to do, or handled without
following any link, and the victim's files must be byte-identical afterwards. Nothing is created by ``--dry-run``.

The hostile folders are owned by "nobody" (the tests run as root here; those cases are skipped otherwise). No engine
is started: `start_process_group` is replaced by a tripwire, so a check that wrongly passes fails the test instead
of launching vLLM.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_serve_launch import MODEL, add_profile, add_recommendation

from autotune.cli.serve import serve
from autotune.engine import safe_draft_model_path, user_private_root
from autotune.engine._drafters import drafter_alias_dir
from autotune.errors import PrivateDirectoryError
from autotune.serving import ServeLaunch, build_launch, default_run_dir, resolve_tuned_config
from store import Store

VICTIM_TEXT = "the victim's own file\n"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="creating a folder owned by another uid needs root")


def _nobody() -> int:
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@pytest.fixture()
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared temp directory (what TMPDIR names): sticky and world-writable, like /tmp."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture()
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'peagle.db'}"
    with Store(url) as store:
        add_recommendation(store)
        add_profile(store)
    return url


@pytest.fixture(autouse=True)
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """Every `vllm serve` launch attempted (each stopped by a tripwire before any process starts)."""
    attempts: list[tuple[object, ...]] = []

    def tripwire(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError("the run directory was accepted: vllm serve would have been launched")

    monkeypatch.setattr("autotune.serving._server.start_process_group", tripwire)
    return attempts


def _launch(db: str, run_dir: Path | None = None, port: int = 8123) -> ServeLaunch:
    with Store(db) as store:
        tuned = resolve_tuned_config(store, MODEL, device="cpu")
    return build_launch(tuned, port=port, run_dir=run_dir)


def _hostile_dir(path: Path, mode: int = 0o777) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    os.chown(path, _nobody(), _nobody())
    return path


def _serve(db: str, *args: str) -> Result:
    return CliRunner().invoke(serve, ["--model", MODEL, "--db", db, *args])


def _one_error_line(result: Result) -> str:
    """The CLI's error: exit 1, exactly one `Error:` line, no traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# -- serve's default run directory -------------------------------------------------------------------------------


def test_default_run_dir_is_per_user_and_a_dry_run_creates_nothing(tmp: Path, db: str) -> None:
    assert default_run_dir(8123) == tmp / f"ptune-{os.getuid()}" / "serve-8123"
    result = _serve(db, "--port", "8123", "--dry-run", "--verbose")
    assert result.exit_code == 0, result.output
    assert f"PEAGLE_SCHEDULER_CONFIG={default_run_dir(8123) / 'plugin.json'}" in result.stdout
    assert list(tmp.iterdir()) == []


def test_a_fresh_default_run_dir_is_created_private(tmp: Path, db: str) -> None:
    launch = _launch(db)
    launch.write_files()
    for folder in (user_private_root(), launch.run_dir, launch.metrics_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for path in (launch.plugin_path, launch.policy_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert json.loads(launch.plugin_path.read_text())["stats_path"] == str(launch.stats_path)


@needs_root
def test_a_pre_created_world_writable_root_of_another_user_is_refused(tmp: Path, db: str, victim: Path) -> None:
    # The attack of the issue: pre-create the predictable folder 0777 and plant plugin.json -> the victim's file.
    hostile = _hostile_dir(user_private_root())
    planted = _hostile_dir(hostile / "serve-8123")
    (planted / "plugin.json").symlink_to(victim)
    line = _one_error_line(_serve(db, "--port", "8123"))
    assert f"{hostile} belongs to nobody (uid {_nobody()}), not to you" in line
    assert "pass --run-dir with a directory of yours, or set TMPDIR to one" in line
    assert victim.read_text() == VICTIM_TEXT
    assert sorted(p.name for p in planted.iterdir()) == ["plugin.json"]  # nothing written next to the link


def test_a_group_or_world_writable_root_of_your_own_is_refused_with_the_chmod(
    tmp: Path, db: str, launches: list[tuple[object, ...]]
) -> None:
    root = user_private_root()
    root.mkdir()
    os.chmod(root, 0o777)
    line = _one_error_line(_serve(db))
    assert f"{root} is writable by group and others (mode 0777)" in line and f"chmod go-w {root}" in line
    assert launches == []
    os.chmod(root, 0o700)  # after the fix it is accepted: the launch goes ahead (up to the tripwire)
    _serve(db)
    assert len(launches) == 1


def test_a_symlinked_root_is_refused_and_not_followed(tmp: Path, db: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    user_private_root().symlink_to(elsewhere)
    line = _one_error_line(_serve(db))
    assert f"{user_private_root()} is a symbolic link (to {elsewhere})" in line
    assert list(elsewhere.iterdir()) == []


# -- --run-dir ------------------------------------------------------------------------------------------------------


@needs_root
def test_a_hostile_run_dir_is_refused_and_its_symlink_not_followed(tmp_path: Path, db: str, victim: Path) -> None:
    run_dir = _hostile_dir(tmp_path / "shared-run")
    (run_dir / "plugin.json").symlink_to(victim)
    line = _one_error_line(_serve(db, "--run-dir", str(run_dir)))
    assert f"{run_dir} belongs to nobody" in line and "choose a directory of yours with --run-dir" in line
    assert victim.read_text() == VICTIM_TEXT


def test_files_serve_did_not_create_are_neither_wiped_nor_overwritten(tmp_path: Path, db: str, victim: Path) -> None:
    run_dir = tmp_path / "project"
    (run_dir / "prometheus").mkdir(parents=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    (run_dir / "prometheus" / "counter_1.db").write_text("another tool's metrics")
    (run_dir / "stats.json").write_text('{"another": "tool"}')
    (run_dir / "policy.json").symlink_to(victim)
    line = _one_error_line(_serve(db, "--run-dir", str(run_dir)))
    assert f"{run_dir} already holds policy.json, stats.json, prometheus, which peagle-tune serve did not" in line
    assert (run_dir / "prometheus" / "counter_1.db").read_text() == "another tool's metrics"
    assert (run_dir / "stats.json").read_text() == '{"another": "tool"}'
    assert victim.read_text() == VICTIM_TEXT and (run_dir / "policy.json").is_symlink()
    assert not (run_dir / "plugin.json").exists()


def test_a_later_launch_replaces_its_own_files_without_following_links(tmp_path: Path, db: str, victim: Path) -> None:
    launch = _launch(db, tmp_path / "run")
    launch.write_files()  # first launch: the directory is created and marked as serve's
    launch.stats_path.write_text("{}")  # what the plugin wrote
    (launch.metrics_dir / "counter_99.db").write_text("stale")
    launch.plugin_path.unlink()
    launch.plugin_path.symlink_to(victim)  # e.g. the user linked it to inspect it elsewhere
    launch.write_files()
    assert victim.read_text() == VICTIM_TEXT
    assert not launch.plugin_path.is_symlink() and json.loads(launch.plugin_path.read_text())["mode"]
    assert not launch.stats_path.exists() and list(launch.metrics_dir.iterdir()) == []
    unrelated = launch.run_dir / "notes.txt"
    unrelated.write_text("mine")
    launch.cleanup()
    assert not launch.metrics_dir.exists() and unrelated.read_text() == "mine"  # only its own files go


def test_run_dir_os_errors_are_one_line_naming_the_path(tmp_path: Path, db: str) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    line = _one_error_line(_serve(db, "--run-dir", str(not_a_dir / "run")))
    assert f"{not_a_dir}: exists and is not a directory; choose a directory of yours with --run-dir." in line
    with pytest.raises(PrivateDirectoryError, match=rf"^{not_a_dir}: Not a directory; choose a directory"):
        _launch(db, not_a_dir).write_files()  # (the CLI's --run-dir refuses a file before this)
    # plugin.json turned into a directory in a directory serve owns: os.replace fails, named with its path.
    launch = _launch(db, tmp_path / "run")
    launch.write_files()
    launch.plugin_path.unlink()
    launch.plugin_path.mkdir()
    with pytest.raises(PrivateDirectoryError, match=r"Is a directory \(renaming to .*plugin\.json\)"):
        launch.write_files()


# -- drafter aliases --------------------------------------------------------------------------------------------------


@pytest.fixture()
def misread_drafter(tmp_path: Path) -> Path:
    """A drafter directory whose path vLLM would misread (it contains "eagle-")."""
    path = tmp_path / "my-eagle-drafter"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_the_alias_lives_in_a_private_dir_and_a_dry_run_creates_none(
    tmp: Path, tmp_path: Path, misread_drafter: Path
) -> None:
    planned = safe_draft_model_path(str(misread_drafter), create=False)
    assert Path(planned).parent == drafter_alias_dir() == tmp / f"ptune-{os.getuid()}" / "drafters"
    assert list(tmp.iterdir()) == []
    db = f"sqlite:///{tmp_path / 'drafter.db'}"
    with Store(db) as store:
        add_recommendation(store, drafter=str(misread_drafter))
    result = _serve(db, "--dry-run", "--verbose")
    assert result.exit_code == 0, result.output
    assert f'"model": "{planned}"' in result.stdout and list(tmp.iterdir()) == []
    assert safe_draft_model_path(str(misread_drafter)) == planned
    assert os.readlink(planned) == str(misread_drafter)
    assert stat.S_IMODE(drafter_alias_dir().stat().st_mode) == 0o700


@needs_root
def test_a_hostile_alias_dir_is_refused_so_no_one_can_repoint_the_drafter(tmp: Path, misread_drafter: Path) -> None:
    hostile = _hostile_dir(user_private_root())
    drafters = _hostile_dir(hostile / "drafters")
    evil = tmp / "evil-drafter"
    evil.mkdir()
    link = Path(safe_draft_model_path(str(misread_drafter), create=False))
    link.symlink_to(evil)
    with pytest.raises(PrivateDirectoryError, match=rf"{hostile} belongs to nobody .* set TMPDIR"):
        safe_draft_model_path(str(misread_drafter))
    assert os.readlink(link) == str(evil) and sorted(p.name for p in drafters.iterdir()) == [link.name]


def test_a_stale_alias_in_your_own_dir_is_replaced_not_followed(tmp: Path, tmp_path: Path,
                                                                 misread_drafter: Path) -> None:
    first = safe_draft_model_path(str(misread_drafter))
    old = tmp_path / "old-drafter"
    old.mkdir()
    os.unlink(first)
    os.symlink(old, first)
    assert safe_draft_model_path(str(misread_drafter)) == first
    assert os.readlink(first) == str(misread_drafter) and old.is_dir() and list(old.iterdir()) == []
    os.chmod(drafter_alias_dir(), 0o775)
    with pytest.raises(PrivateDirectoryError, match=r"writable by group \(mode 0775\)"):
        safe_draft_model_path(str(misread_drafter))
