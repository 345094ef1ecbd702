"""Warm starts (engine/launch/warm.py): pipelines that wait for a slot are forked, once it is ready, from a
process that has imported torch already; they train, log, are killed and die with their supervisor as a
cold-started worker does, and the forking process leaves with the session."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from torchherd.engine.launch.warm import WarmProcess, WarmStarter, compatible
from torchherd.engine.protocol.messages import TrainingStarted, WorkerExited, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import REPO, TASKS, make_config, still_alive, wait_for, repo_env
from tests.faults.support import RecordingLauncher

SLOW = {"delay": 0.004}  # tiny.py: an epoch takes a while, so a test acts while it trains


@pytest.fixture(autouse=True)
def own_forker(monkeypatch):
    """These tests are about a session's own forking process: the test session's (conftest.warm_children) is
    set aside while they run."""
    from torchherd.engine.launch import process

    monkeypatch.setattr(process, "_kept", None)


def test_a_child_is_forked_only_when_its_environment_differs_in_what_is_read_after_start():
    base = {"PATH": "/bin", "HOME": "/h"}
    assert compatible({**base, "CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "2", "RANK": "3",
                       "TORCHELASTIC_RUN_ID": "x", "PYTHONUNBUFFERED": "1"}, base)
    assert not compatible({**base, "TORCH_LOGS": "+dynamo"}, base)  # torch reads it at import
    assert not compatible({"PATH": "/usr/bin", "HOME": "/h"}, base)
    assert not compatible({"PATH": "/bin"}, base)


@pytest.mark.slow
def test_what_lightning_inductor_and_tensorboardx_set_in_the_supervisors_environment_still_lets_children_fork_warm():
    # Regression: Lightning's import sets PYTORCH_NVML_BASED_CUDA_CHECK, torch's inductor TORCHINDUCTOR_CACHE_DIR
    # and tensorboardX's import CRC32C_SW_MODE in the importing process; once a supervisor had checked a Lightning
    # pipeline, or a sweep's TensorBoard thread had imported tensorboardX, every later child of its session started
    # cold (the suite's sweeps took 3 to 7 times their CPU).
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("needs Lightning (pip install \"torchherd[lightning]\")")
    set_by_them = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR", "CRC32C_SW_MODE")  # a fresh shell
    env = {k: v for k, v in repo_env().items() if k not in set_by_them}  # has none (this process may have them)
    probe = ("import json, os; before = dict(os.environ); import lightning.pytorch; "
             "from torch._inductor.runtime.cache_dir_utils import cache_dir; cache_dir(); import tensorboardX.summary; "
             "print(json.dumps([before, dict(os.environ)]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env,
                         check=True).stdout
    before, after = json.loads(out.splitlines()[-1])
    assert set(set_by_them) <= set(after) - set(before)  # they did set them: the check below is not idle
    assert compatible(after, before), {k: after.get(k) for k in set(after) ^ set(before)}


# A CUDA driver library below ctypes, as far as the forking process asks it: its device count, which the real
# driver refuses with CUDA_ERROR_NOT_INITIALIZED (3) until cuInit has run. FAKE_CUDA_INITIALIZED=1: it has.
FAKE_DRIVER = r"""
#include <stdlib.h>
int cuDeviceGetCount(int *count) {
    const char *init = getenv("FAKE_CUDA_INITIALIZED");
    if (!init || init[0] != '1') return 3;
    *count = 1;
    return 0;
}
"""
TOUCHED = "import ctypes, sys; {load}from torchherd.engine.launch.warm import _cuda_touched; print(_cuda_touched())"


def test_a_loaded_cuda_driver_stops_forks_only_once_it_is_initialized(tmp_path):
    from tests.nvml_fake import compiler

    if compiler() is None:
        pytest.skip("no C compiler (cc or gcc) to build the fake CUDA driver with")
    (tmp_path / "fake_cuda.c").write_text(FAKE_DRIVER)
    (tmp_path / "empty.c").write_text("int unrelated(void) { return 0; }\n")
    for source, name in (("fake_cuda.c", "libcuda.so.1"), ("empty.c", "dir/libcuda.so.1")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        subprocess.run([compiler(), "-shared", "-fPIC", "-o", str(tmp_path / name), str(tmp_path / source)],
                       check=True, capture_output=True)

    def touched(library: str | None, initialized: bool) -> str:
        load = f"ctypes.CDLL({str(tmp_path / library)!r}); " if library else ""
        env = repo_env(FAKE_CUDA_INITIALIZED="1" if initialized else "0")
        return subprocess.run([sys.executable, "-c", TOUCHED.format(load=load)], env=env, capture_output=True,
                              text=True, check=True).stdout.strip()
    assert touched(None, False) == "False"  # no driver here at all
    assert touched("libcuda.so.1", False) == "False"  # loaded with torch, never initialized: forks may use CUDA
    assert touched("libcuda.so.1", True) == "True"  # initialized before the fork: children start cold
    assert touched("dir/libcuda.so.1", False) == "True"  # one that cannot be asked: cold, to be safe


async def wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_queued_pipelines_start_warm_train_are_killed_and_leave_nothing_behind(tmp_path):
    config = make_config(tmp_path, [{"name": "warm", "max_epochs": 2}, {"name": "killed", "params": SLOW}],
                         devices={"cpu_slots": 1}, telemetry={"enabled": False})
    launcher = RecordingLauncher()
    sup = Supervisor(config, launcher=launcher)
    stream = sup.subscribe()
    await sup.start()
    try:
        assert sup.view("warm").state.value == "queued"  # held while the forking process imports torch
        await wait_for(stream, lambda e: isinstance(e, TrainingStarted) and e.pipeline == "killed", 120)
        server = launcher._warm.proc.pid
        assert psutil.Process(launcher.handles["killed"].pid).ppid() == server  # forked by it
        sup.kill("killed")
        statuses = await asyncio.wait_for(sup.wait(), 60)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"warm": "completed", "killed": "killed"}
    assert all(isinstance(h.proc, WarmProcess) for h in launcher.handles.values())
    exited = {e.pipeline: e for e in read_events(sup.run_dir) if isinstance(e, WorkerExited)}
    assert exited["warm"].exit_code == 0 and exited["killed"].signal == "SIGTERM"  # as the forker saw them end
    log = (sup.run_dir / "warm" / "log.txt").read_text()
    assert "torchherd worker pid" in log and "epoch 2/2 done" in log  # its output, in its own log
    assert launcher._warm is None and still_alive([server]) == []  # gone with the session


@pytest.mark.slow
async def test_pipelines_that_fit_their_slots_start_cold_and_no_forker_is_started(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "max_epochs": 1}], telemetry={"enabled": False})
    launcher = RecordingLauncher()
    sup = Supervisor(config, launcher=launcher)
    await sup.start()
    try:
        assert await asyncio.wait_for(sup.wait(), 120) == {"a": "completed"}
        assert launcher._warm is None and not isinstance(launcher.handles["a"].proc, WarmProcess)
    finally:
        await sup.shutdown(graceful=False)


class EveryLaunch(RecordingLauncher):
    """The real launcher, noting for each child it starts, in order: its pipeline, whether a forking process was
    there and ready for it, and whether it was forked."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: list[tuple[str, str, bool]] = []  # (pipeline, "none" | "importing" | "ready", forked)

    def launch(self, spec):
        warm = self._forker()
        forker = "none" if warm is None else "ready" if warm.ready() else "importing"
        handle = super().launch(spec)
        self.launches.append((spec.child.name, forker, isinstance(handle.proc, WarmProcess)))
        return handle


@pytest.mark.slow
async def test_a_sweep_whose_trials_fit_their_slots_starts_a_forker_for_its_restarts(tmp_path):
    # Regression: only pipelines queued beyond the slots started a forking process, so a promoting ASHA or PBT
    # sweep of no more trials than slots (8 on an 8-GPU box) imported torch afresh for every promotion and exploit.
    shapes = ["slow", "bad1"]  # tests/tasks/curves.py: 'slow' scores best at every rung
    sweep = {"space": {"params": {"shape": shapes}}, "scheduler": "asha", "mode": "promote", "grace_period": 1,
             "reduction_factor": 2}
    config = make_config(tmp_path, [{"name": "t"}], sweep=sweep, devices={"cpu_slots": 2}, tensorboard=False,
                         defaults={"task": f"{TASKS / 'curves.py'}:build", "max_epochs": 4,
                                   "params": {"delay": 0.005}},  # an epoch a third of a second: verdicts land
                         telemetry={"enabled": False})
    launcher = EveryLaunch()
    sup = Supervisor(config, launcher=launcher)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 240)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"t-shapeslow": "completed", "t-shapebad1": "pruned"}, statuses
    first, again = launcher.launches[:2], launcher.launches[2:]
    # They fit: both start at once, cold, not held for the forking process the sweep started for its restarts.
    assert sorted(first) == [("t-shapebad1", "importing", False), ("t-shapeslow", "importing", False)]
    # 'slow' waits alone at rung 2 at least, so it is promoted at least once; every restart made once the forking
    # process is ready is forked (before: none was started, and every restart imported torch afresh).
    assert again and all(name == "t-shapeslow" for name, _, _ in again), launcher.launches
    assert all(forked for _, forker, forked in again if forker == "ready"), launcher.launches
    assert any(forker == "ready" for _, forker, _ in again), launcher.launches
    assert launcher._warm is None  # the forking process ended with the session


@pytest.mark.slow
async def test_pipelines_that_fit_their_slots_are_never_held_for_a_forker_still_importing(tmp_path):
    # A forking process started for restarts (or kept by the app) holds nothing that fits: a trial queued while a
    # slot is free would read to PBT as one waiting for a slot, and the trials ahead of it would yield to it.
    launcher = RecordingLauncher()
    launcher.expect_restarts()
    try:
        assert launcher._warm is not None and not launcher.hold_launches(queued=1, free=1)
        await_ready(launcher._warm)
        config = make_config(tmp_path, [{"name": "a", "max_epochs": 1}], telemetry={"enabled": False})
        sup = Supervisor(config, launcher=launcher)
        await sup.start()
        try:
            assert await asyncio.wait_for(sup.wait(), 120) == {"a": "completed"}
        finally:
            await sup.shutdown(graceful=False)
        assert isinstance(launcher.handles["a"].proc, WarmProcess)  # once ready, it forks what fits too
    finally:
        launcher.close()


async def two_queued_on_one_slot(tmp_path, launcher: RecordingLauncher, **top) -> None:
    """Run two one-epoch pipelines on one CPU slot (so one waits) to completion."""
    config = make_config(tmp_path, [{"name": "a", "max_epochs": 1}, {"name": "b", "max_epochs": 1}],
                         devices={"cpu_slots": 1}, telemetry={"enabled": False}, **top)
    sup = Supervisor(config, launcher=launcher)
    await sup.start()
    try:
        assert await asyncio.wait_for(sup.wait(), 120) == {"a": "completed", "b": "completed"}
    finally:
        await sup.shutdown(graceful=False)


@pytest.mark.slow
async def test_warm_start_false_starts_queued_pipelines_cold(tmp_path):
    from torchherd.engine.config.schema import ClusterConfig
    from torchherd.engine.launch.registry import backend_for

    backend = backend_for(ClusterConfig(warm_start=False), tmp_path)
    assert backend.warm_start is False and not backend.hold_launches(queued=2, free=1)  # nothing held, none started
    launcher = RecordingLauncher()
    launcher.warm_start = False
    await two_queued_on_one_slot(tmp_path, launcher, cluster={"warm_start": False})
    assert launcher._warm is None and not any(isinstance(h.proc, WarmProcess) for h in launcher.handles.values())


@pytest.mark.slow
async def test_queued_pipelines_start_cold_when_the_forking_process_is_gone(tmp_path):
    launcher = RecordingLauncher()
    # One that ends at once, as the forking process does when its imports started CUDA (a fork cannot use it).
    launcher._warm = WarmStarter({**os.environ, "PYTHONUNBUFFERED": "1"}, [sys.executable, "-c", "pass"])
    await two_queued_on_one_slot(tmp_path, launcher)
    assert not any(isinstance(h.proc, WarmProcess) for h in launcher.handles.values())



def await_ready(starter: WarmStarter, timeout: float = 120.0) -> None:
    """Wait for a forking process's imports to be done (its 'ready' report)."""
    deadline = time.monotonic() + timeout
    while not starter.ready() and time.monotonic() < deadline:
        starter.wait_report(0.2)
    assert starter.ready()


@pytest.mark.slow
def test_a_fork_that_comes_after_the_supervisor_gave_up_on_it_is_ended_by_the_forking_process(tmp_path, monkeypatch):
    # Regression: a start the forking process answered after REPLY_WAIT (a loaded machine) was started cold as
    # well; its late fork was ended only when the session next read a report, and a session that read none
    # (one warm child, then shut down) left it running beside the cold one.
    from torchherd.engine.launch import warm as warm_module
    from torchherd.engine.launch.process import _forking_process

    starter = _forking_process()
    try:
        await_ready(starter)
        deadline = time.monotonic() + 120
        spec = tmp_path / "spec.json"
        os.mkfifo(spec)  # the late child blocks reading it: it lives until someone ends it
        log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT)
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        monkeypatch.setattr(warm_module, "REPLY_WAIT", 0.2)
        os.kill(starter.proc.pid, signal.SIGSTOP)  # it answers nothing in time
        try:
            with pytest.raises(OSError, match="did not answer"):
                starter.start(str(spec), dict(os.environ), str(tmp_path), (log, status_w, control_r))
        finally:
            os.kill(starter.proc.pid, signal.SIGCONT)
        # Read its reports straight off the socket: the session's own reading (which ends a late fork too) stays
        # out of it, as in a session that reads nothing more.
        reports, late = [], None
        while time.monotonic() < deadline and not any(r.get("exited") == late for r in reports if late):
            readable, _, _ = select.select([starter._sock], [], [], 0.5)
            if readable:
                reports.append(json.loads(starter._sock.recv(warm_module.MESSAGE)))
                late = next((r["pid"] for r in reports if "pid" in r), None)
        assert late is not None, reports  # it did fork, late
        assert {"exited": late, "code": -signal.SIGKILL} in reports, reports
        assert still_alive([late]) == []
    finally:
        starter.close()
        for fd in (log, status_r, status_w, control_r, control_w):
            os.close(fd)

@pytest.mark.slow
def test_a_forked_childs_own_process_group_is_there_when_its_pid_is_told(tmp_path):
    # Regression: the forking process told the pid at once and the child called setsid a moment later, so a
    # session that ended a child just started (a test's quick shutdown) signalled a group not there yet: the
    # signal missed, and the child lived on (CI: 'child processes left behind: ... torchherd.engine.launch.warm').
    from torchherd.engine.launch.process import _forking_process

    starter = _forking_process()
    spec = tmp_path / "spec.json"
    os.mkfifo(spec)  # each child blocks reading it: it lives until its group is signalled
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT)
    status_r, status_w = os.pipe()
    control_r, control_w = os.pipe()
    pids = []
    try:
        await_ready(starter)
        for _ in range(40):
            pid = starter.start(str(spec), dict(os.environ), str(tmp_path), (log, status_w, control_r)).pid
            pids.append(pid)
            os.killpg(pid, signal.SIGKILL)  # ProcessLookupError: no such group yet
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(starter.returncode(pid) is None for pid in pids):
            starter.wait_report(0.2)
        assert {starter.returncode(pid) for pid in pids} == {-signal.SIGKILL}
    finally:
        starter.close()
        for fd in (log, status_r, status_w, control_r, control_w):
            os.close(fd)


HOLDER = """
import asyncio, json, sys
from tests.conftest import make_config
from tests.faults.support import RecordingLauncher
from torchherd.engine.supervise.supervisor import Supervisor

async def main(tmp):
    config = make_config(tmp, [{"name": "warm", "params": {"delay": 0.004}, "max_epochs": 50}, {"name": "queued"}],
                         devices={"cpu_slots": 1}, telemetry={"enabled": False})
    launcher = RecordingLauncher()
    sup = Supervisor(config, launcher=launcher)
    await sup.start()
    while sup.view("warm").state.value != "running":
        await asyncio.sleep(0.05)
    print(json.dumps({"worker": launcher.handles["warm"].pid, "server": launcher._warm.proc.pid,
                      "warm": type(launcher.handles["warm"].proc).__name__}), flush=True)
    await asyncio.sleep(600)

asyncio.run(main(__import__("pathlib").Path(sys.argv[1])))
"""


@pytest.mark.slow
async def test_a_kept_forker_starts_even_the_first_pipelines_warm_and_outlives_their_session(tmp_path):
    from torchherd.engine.launch.process import keep_warm, let_go

    warm = keep_warm()
    try:
        await_ready(warm)
        config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], defaults={"max_epochs": 1})
        sup = Supervisor(config)  # two pipelines on two slots: nothing queues, no forker of its own
        await sup.start()
        statuses = await asyncio.wait_for(sup.wait(), 120)
        await sup.shutdown()
        assert statuses == {"a": "completed", "b": "completed"}
        pids = [e.pid for e in read_events(sup.run_dir) if isinstance(e, WorkerStarted)]
        assert len(pids) == 2 and all(pid in warm._live for pid in pids), (pids, warm._live)
        assert warm.ready() and psutil.Process(warm.proc.pid).is_running()  # it stays for the next session
    finally:
        let_go()
    assert warm.proc.poll() is not None


@pytest.mark.slow
def test_warm_started_workers_and_their_forker_die_with_their_supervisor(tmp_path):
    env = repo_env()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()  # blocks until it prints (or dies: then "")
        assert line, "the supervisor ended before a warm-started worker trained"
        pids = json.loads(line)
        assert pids["warm"] == "WarmProcess"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert still_alive([pids["worker"], pids["server"]], timeout=10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
