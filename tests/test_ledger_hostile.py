"""The device ledger's files are data: a lease or session file of the wrong types, a FIFO, a link or a folder
named like one is skipped with one notice while `ls`, `check` and a run carry on, and a ledger folder someone
else owns or can write is refused, naming the folder and its mode.

Hostile files are held by a real flock in a process of their own, as a live session holds its lease files.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TASKS, make_config, repo_env
from tests.scripted import ScriptedLauncher, until
from torchherd.engine.hardware import ledger as ledger_module
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.hardware.ledger import Ledger, UnsafeLedger
from torchherd.engine.preflight.check import check_config
from torchherd.engine.protocol.messages import Notice
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor

# Regression (issue 55): each of these, held, crashed `ls` (TypeError), `check` and every grant (unhashable
# list), or the supervisor's tick ten times a second ("not enough values to unpack"), starting no queued pipeline.
HOSTILE = {
    "cpu0.lots.p.0.lease": {"device": "cpu0", "run": "lots", "pipeline": "p", "memory": "lots"},
    "cpu1.listed.p.0.lease": {"device": ["cpu0"], "run": "listed", "pipeline": "p"},
    "garbage.session": {"run": "garbage", "pid": 1, "waiting": [[1]]},
}
HOLD = """
import fcntl, os, sys
from torchherd.engine.hardware.ledger import Lease, Ledger
folder, files = sys.argv[1], sys.argv[2:]
for name, text in zip(files[::2], files[1::2]):
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, text.encode())
    fcntl.flock(fd, fcntl.LOCK_EX)  # kept open (and so locked) until this process ends
ledger = Ledger(folder)
with ledger.locked():
    ledger.take([Lease(device="cpu1", run="good", pipeline="p")])
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
"""


@pytest.fixture
def hostile():
    """The user's ledger with HOSTILE's files (and one good lease, of run `good` on cpu1) held by a live process."""
    folder = Ledger().folder
    argv = [x for name, data in HOSTILE.items() for x in (name, json.dumps(data))]
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), *argv], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=repo_env(), cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield folder
    finally:
        holder.stdin.close()
        holder.wait(30)


def torchherd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", *args], capture_output=True, text=True, cwd=REPO,
                          env=repo_env(), timeout=timeout)


def said_once(text: str, names) -> None:
    """Each of `names` is named by exactly one line of `text`, a notice that it was skipped."""
    for name in names:
        lines = [line for line in text.splitlines() if name in line]
        assert len(lines) == 1 and "skipped" in lines[0], (name, text)


def write_config(tmp_path: Path, slots: int = 2) -> Path:
    path = tmp_path / "box.toml"
    path.write_text(f'name = "box"\nruns_dir = "{tmp_path / "runs"}"\n[defaults]\ntask = "{TASKS / "tiny.py"}:build"\n'
                    f'[[pipelines]]\nname = "a"\n[devices]\nplacement = "cpu"\ncpu_slots = {slots}\n'
                    '[validation]\nmode = "off"\n')
    return path


def test_ls_lists_around_hostile_ledger_files_and_says_each_once(hostile, tmp_path):
    listed = torchherd("ls", "--runs-dir", str(tmp_path / "runs"))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "  cpu1  run good  p" in listed.stdout  # the good lease is listed as ever
    said_once(listed.stderr, HOSTILE)
    assert "$.memory" in listed.stderr and "$.device" in listed.stderr and "$.waiting[0][0]" in listed.stderr
    shown = torchherd("ls", "--json", "--runs-dir", str(tmp_path / "runs"))
    assert shown.returncode == 0 and json.loads(shown.stdout) == [], shown.stderr


def test_check_plans_around_hostile_ledger_files_and_says_each_once(hostile, tmp_path):
    report = check_config(write_config(tmp_path))
    assert report.ok, report.render()
    said_once("\n".join(report.lines), [n for n in HOSTILE if n.endswith(".lease")])  # on CPUs it reads leases only
    assert any("cpu1 held now by run good (you)" in line for line in report.lines), report.lines


async def test_a_run_grants_and_starts_its_queue_around_hostile_ledger_files_saying_each_once(hostile, tmp_path):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], telemetry={"enabled": False},
                         devices={"cpu_slots": 1})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    try:
        await until(lambda: launcher.handles, timeout=30)
        launcher.handles[0].code = 0  # the first completes: the queued one takes its slot
        await until(lambda: len(launcher.handles) == 2, timeout=30)
        launcher.handles[1].code = 0
        await until(lambda: sup.finished, timeout=30)
    finally:
        await sup.shutdown(graceful=False)
    notices = [e.text for e in read_events(sup.run_dir) if isinstance(e, Notice)]
    assert not [t for t in notices if "supervisor error" in t], notices
    said_once("\n".join(notices), HOSTILE)


def test_a_fifo_a_link_or_a_folder_named_like_an_entry_neither_hangs_nor_stops_a_grant(tmp_path):
    folder = Ledger().folder
    os.mkfifo(folder / "cpu0.fifo.p.0.lease")  # an open for reading would wait for a writer for ever
    (folder / "cpu1.link.p.0.lease").symlink_to(tmp_path / "elsewhere")
    (folder / "folder.session").mkdir()
    grant = ("from torchherd.engine.hardware.ledger import Ledger\nledger = Ledger()\n"
             "with ledger.locked() as held:\n    print(len(held), len(ledger.presences()))\n"
             "print(*ledger.notices(), sep='\\n')")
    try:
        done = subprocess.run([sys.executable, "-c", grant], capture_output=True, text=True, cwd=REPO,
                              env=repo_env(), timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO named like a lease hung the grant")
    assert done.returncode == 0, done.stderr
    first, *notices = done.stdout.splitlines()
    assert first == "0 0"
    said_once("\n".join(notices), ["cpu0.fifo.p.0.lease", "cpu1.link.p.0.lease", "folder.session"])
    assert "a FIFO" in done.stdout and "a link" in done.stdout and "a folder" in done.stdout
    assert torchherd("ls", "--runs-dir", str(tmp_path / "runs"), timeout=60).returncode == 0


@pytest.mark.parametrize("mode, who", [(0o1777, "others"), (0o770, "its group")])
def test_a_ledger_folder_others_can_write_is_refused_naming_it_and_its_mode(tmp_path, monkeypatch, mode, who):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    monkeypatch.setenv("TORCHHERD_LEDGER", str(shared))
    with pytest.raises(UnsafeLedger) as info:
        Ledger()
    assert str(info.value).startswith(f"{shared}: ") and f"writable by {who} (mode {mode:04o})" in str(info.value)
    assert "chmod 700" in str(info.value) and "TORCHHERD_LEDGER" in str(info.value)
    report = check_config(write_config(tmp_path))
    assert not report.ok and [p.file for p in report.problems] == [str(shared)], report.render()
    listed = torchherd("ls", "--runs-dir", str(tmp_path / "runs"))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    [line] = [line for line in listed.stderr.splitlines() if str(shared) in line]
    assert f"(mode {mode:04o})" in line
    assert list(shared.iterdir()) == []  # nothing of ours written into it


def test_a_ledger_folder_or_lock_of_someone_elses_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "ledger"
    folder.mkdir(mode=0o700)
    real = os.getuid()
    with monkeypatch.context() as patched, pytest.raises(UnsafeLedger, match=f"belongs to uid {real}, not you"):
        patched.setattr(ledger_module.os, "getuid", lambda: real + 1)  # as if another user had made it
        Ledger(folder)
    os.mkfifo(folder / ".lock")
    with pytest.raises(UnsafeLedger, match=r"its \.lock is not a plain file of yours; remove it"):
        Ledger(folder)
    os.unlink(folder / ".lock")
    (folder / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeLedger, match=r"its \.lock cannot be opened"):
        Ledger(folder)
    assert not (tmp_path / "elsewhere").exists()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
