"""Shared machines: a run's weight snapshots go to a fresh, private folder nobody can make first, stale-snapshot
cleanup touches only this user's torchherd folders, and a run name cannot climb out of the runs folder."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_config, wait_for
from torchherd.engine.rundir import directory as rundir
from torchherd.engine.config.load import parse_config
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.rundir.directory import PID_FILE, SNAPSHOT_MARKER, claim_root, remove_root, snapshot_root

OLD = 3600  # seconds: older than any folder a starting torchherd may still be filling


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def stale(path: Path, marker: bool = True) -> Path:
    """A snapshot folder whose torchherd died an hour ago."""
    path.mkdir()
    if marker:
        (path / SNAPSHOT_MARKER).write_text("x")
    (path / PID_FILE).write_text(f"{dead_pid()}\n")
    os.utime(path, (os.path.getatime(path), os.path.getmtime(path) - OLD))
    return path


# Regression: snapshots went to /dev/shm/torchherd-<run id>; a folder someone else made there first was
# adopted as it was (mode and owner unchecked) and filled with the model's weights.
def test_a_folder_made_first_at_the_snapshot_path_is_never_adopted(tmp_path: Path):
    root = snapshot_root("20250101-000000-run", tmp_path)
    root.mkdir(mode=0o777)
    try:
        with pytest.raises(FileExistsError, match="already exists"):
            claim_root(root)
        assert list(root.iterdir()) == []  # nothing of ours written into it
        remove_root(root)
        assert root.is_dir()  # and not ours to delete
    finally:
        root.rmdir()


def test_the_snapshot_folder_is_fresh_private_and_unpredictable(tmp_path: Path):
    roots = {snapshot_root("20250101-000000-run", tmp_path) for _ in range(3)}
    assert len(roots) == 3  # the run id alone does not name it
    root = roots.pop()
    old_umask = os.umask(0)  # the most permissive umask: 0700 must not depend on it
    try:
        claim_root(root)
    finally:
        os.umask(old_umask)
    try:
        st = os.lstat(root)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert (root / SNAPSHOT_MARKER).is_file() and (root / PID_FILE).read_text().strip() == str(os.getpid())
    finally:
        remove_root(root)
    assert not root.exists()


def test_stale_cleanup_touches_only_this_users_marked_folders(tmp_path: Path, monkeypatch):
    dead = stale(tmp_path / "torchherd-dead-0001")
    unmarked = stale(tmp_path / "torchherd-unmarked-0002", marker=False)
    other = stale(tmp_path / "torchherd-other-user-0003")
    target = stale(tmp_path / "elsewhere")
    link = tmp_path / "torchherd-link-0004"
    link.symlink_to(target)
    me = os.getuid()
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):  # as if another user owned one folder and its marker
        st = real_lstat(path, *args, **kwargs)
        if str(path).startswith(str(other)):
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, me + 1) + tuple(st)[5:])
        return st

    monkeypatch.setattr(rundir.os, "lstat", lstat)
    claim_root(tmp_path / "torchherd-mine-0005")
    assert not dead.exists()
    assert unmarked.is_dir() and other.is_dir() and target.is_dir() and link.is_symlink()


def test_stale_cleanup_leaves_a_live_run_alone(tmp_path: Path):
    live = stale(tmp_path / "torchherd-live-0001")
    (live / PID_FILE).write_text(f"{os.getpid()}\n")
    claim_root(tmp_path / "torchherd-mine-0002")
    assert live.is_dir()


# Regression: `name = "../../escape"` was accepted, and the run directory is named after it.
@pytest.mark.parametrize("name", ["../../escape", "a/b", ".hidden", "x" * 65])
def test_a_run_name_that_is_not_a_plain_folder_name_is_refused(tmp_path: Path, name: str):
    with pytest.raises(ConfigError) as info:
        parse_config({"name": name, "pipelines": [{"name": "a", "task": "regression"}]},
                     str(tmp_path / "c.toml"), tmp_path)
    problems = info.value.problems
    assert [p.key for p in problems] == ["name"]
    assert "letters, digits" in problems[0].message and repr(name) in problems[0].message


def test_a_plain_run_name_is_accepted(tmp_path: Path):
    assert make_config(tmp_path, [{"name": "a"}], name="lr-sweep_2.1").name == "lr-sweep_2.1"


@pytest.mark.slow
async def test_a_real_run_snapshots_into_a_private_folder_and_removes_it(tmp_path: Path):
    from torchherd.engine.protocol.messages import RunFinished, SnapshotTaken
    from torchherd.engine.supervise.supervisor import Supervisor

    config = make_config(tmp_path, [{"name": "a"}], validation={"mode": "background"},
                         devices={"cpu_slots": 1}, defaults={"max_epochs": 2})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, SnapshotTaken))
        root = sup.snapshot_root
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700 and (root / SNAPSHOT_MARKER).is_file()
        assert (root / "a" / "meta.json").is_file()
        await wait_for(stream, lambda e: isinstance(e, RunFinished), timeout=120)
    finally:
        await sup.shutdown(graceful=False, timeout=5)
    assert not root.exists()


# Regression: a new run checked that its folder did not exist, then made it with mkdir(exist_ok=True): in a shared
# runs folder (/tmp) a folder someone else made in between was adopted, and the run wrote its config, events and
# checkpoints into a folder another user owns and can read or plant files in.
async def test_a_new_run_never_adopts_a_folder_someone_made_first(tmp_path: Path, monkeypatch):
    import torchherd.engine.supervise.supervisor as supervisor_module
    from torchherd.engine.rundir.directory import RunTaken
    from torchherd.engine.supervise.supervisor import Supervisor

    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False})
    planted = tmp_path / "runs" / "taken"
    monkeypatch.setattr(supervisor_module, "new_run_id", lambda base, name: "taken")  # the id checked as free...
    sup = Supervisor(config)
    planted.mkdir(parents=True)  # ...then made by someone else before the run makes it
    (planted / "events.jsonl").write_text("")
    with pytest.raises(RunTaken, match="already exists"):
        await sup.start()
    assert sorted(p.name for p in planted.iterdir()) == ["events.jsonl"]
    assert (planted / "events.jsonl").read_text() == ""


def test_a_resumed_run_reopens_its_own_folder(tmp_path: Path):
    from torchherd.engine.rundir.directory import RunDirectory

    RunDirectory(tmp_path / "run", fresh=True).close()
    RunDirectory(tmp_path / "run").close()  # a resume: the folder is the run's own
