"""The app as a client of a run's service: attached to a run already training it shows the run's history,
its kill is carried out by the service and recorded with the app's pid, a read-only attach cannot kill, and
quitting with Detach leaves the service training on to the end.

Every run is a real service (`torchherd run --detach`, or `engine.serve.service.spawn`) over real workers of
tests/tasks/faulty.py. Each worker is held at a gate (`gate_at_call`: its forward call GATE waits until the
gate file exists), so what has happened before the test acts is exact: steps 1..GATE-1 and not one more.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from torchherd.engine.protocol.control import Action, ClientCommand
from torchherd.engine.protocol.messages import Event, PipelineFinished, RunFinished
from torchherd.engine.rundir.directory import run_held
from torchherd.engine.serve.remote import NotLive, RemoteRun
from torchherd.engine.serve.service import spawn
from torchherd.tui.app import TorchherdApp
from torchherd.tui.commands import Kill
from torchherd.tui.messages import CommandRequested
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import ConfirmScreen, QuitScreen
from torchherd.tui.widgets.pipeline_table import PipelineTable

from tests.conftest import TASKS, repo_env
from tests.faults.support import REPO, is_alive, kill_all, records, tree, wait_gone
from tests.tui.pilots import wait_for
from torchherd.tui.start import Attach

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]  # real services and training processes

SIZE = (120, 36)
GATE = 13  # each worker's 13th forward call waits for the gate: steps 1..12 happen, then it holds
STEPS = 20  # 640 samples in batches of 32: one epoch of 20 steps, then the pipeline completes
SLOW = 120.0  # seconds for anything that waits on a process starting or training (a loaded 2-core machine)


def write_config(tmp_path: Path, names: list[str], gate: Path) -> Path:
    """One epoch of STEPS steps per pipeline, every step reported, each worker held at forward call GATE."""
    pipelines = "".join(f'\n[[pipelines]]\nname = "{name}"\n' for name in names)
    path = tmp_path / "attach.toml"
    # A name of its own: two test sessions on one machine must not start runs with the same id.
    path.write_text(f"""
name = "attach-{uuid.uuid4().hex[:8]}"

[defaults]
task = "{TASKS / 'faulty.py'}:build"
max_epochs = 1
batch_size = 32
log_every_n_steps = 1
params = {{ samples = 640, gate_file = "{gate}", gate_at_call = {GATE} }}

[validation]
mode = "off"
metric = "accuracy"  # what the attached table names (regression: an attach showed "val loss")
metric_mode = "max"

[devices]
placement = "cpu"
cpu_slots = {len(names)}

[telemetry]
enabled = false
{pipelines}""")
    return path


def steps_of(run_dir: Path, name: str) -> list[dict]:
    return [r for r in records(run_dir) if r.get("type") == "step" and r.get("pipeline") == name]


def held(run_dir: Path, *names: str) -> bool:
    """Every named pipeline has reported its last step before the gate."""
    return all(any(r["step"] == GATE - 1 for r in steps_of(run_dir, name)) for name in names)


def of_type(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(run_dir) if r.get("type") == kind]


async def end_service(run_dir: Path | None, pid: int | None, gate: Path) -> None:
    """Leave nothing running: open the gate; a service still up is asked to kill its pipelines, then, if it
    has not ended within a minute, it and its workers are SIGKILLed."""
    gate.touch()
    if pid is None:
        return
    procs = tree(pid)
    if not procs or not is_alive(procs[0]):
        return
    if run_dir is not None:
        with contextlib.suppress(NotLive, OSError, asyncio.TimeoutError):
            run = await RemoteRun.connect(run_dir, live=False, history=False)
            try:
                await asyncio.wait_for(run.request(Action.KILL), 30)
            finally:
                await run.close()
    left = await asyncio.to_thread(wait_gone, procs, 60)
    kill_all(left)
    await asyncio.to_thread(wait_gone, left, 10)


async def service_ended(pid: int) -> None:
    """The service exits by itself once its run has finished."""
    procs = tree(pid)
    assert not await asyncio.to_thread(wait_gone, procs, SLOW), f"the service (pid {pid}) is still running"


def run_detached(config: Path, runs_dir: Path) -> tuple[Path, int]:
    """`torchherd run CONFIG --detach`: it returns once the service serves; where the run is, and its pid."""
    env = repo_env()
    command = [sys.executable, "-m", "torchherd", "run", str(config), "--detach", "--runs-dir", str(runs_dir)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, cwd=REPO, env=env, timeout=SLOW,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    pid = re.search(r"supervisor pid (\d+)", done.stdout)
    where = re.search(r"run directory: (.+)", done.stdout)
    assert pid and where, done.stdout
    return Path(where.group(1).strip()), int(pid.group(1))


async def dashboard_of(pilot) -> DashboardScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), timeout=SLOW, what="the dashboard")
    return app.screen


def shown(app: TorchherdApp) -> list[str]:
    """Every notification (toast) the app shows from now on, kept: a toast expires after a few seconds, which
    on a loaded machine can pass before the test looks."""
    messages: list[str] = []
    notify = app.notify  # screens notify through their app

    def keep(message, *args, **kwargs):
        messages.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = keep
    return messages


async def wait_for_file(condition, what: str, timeout: float = SLOW) -> None:
    """Poll what other processes write (no app running yet): the first truthy `condition()`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


async def collect(stream, into: list[Event]) -> None:
    async for event in stream:
        into.append(event)


async def test_attached_app_shows_the_steps_from_before_it_attached(tmp_path, runs_dir):
    gate = tmp_path / "gate"
    config = write_config(tmp_path, ["long"], gate)
    run_dir = pid = None
    try:
        run_dir, pid = await asyncio.to_thread(run_detached, config, runs_dir)
        await wait_for_file(lambda: held(run_dir, "long"), "steps 1..12 before anyone attaches")
        before = steps_of(run_dir, "long")
        assert [r["step"] for r in before] == list(range(1, GATE))

        app = TorchherdApp(None, runs_dir, start=Attach(run_dir))
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await dashboard_of(pilot)
            state = app.bridge.state
            # What happened before the attach came from the history replay: every step, with its loss.
            await wait_for(pilot, lambda: "long" in state.rows and state.rows["long"].step == GATE - 1,
                           what="the history replayed")
            assert state.rows["long"].state.value == "running"
            assert list(state.series["long"].steps) == [r["step"] for r in before]
            assert list(state.series["long"].loss) == pytest.approx([r["loss"] for r in before])
            table = dashboard.query_one(PipelineTable)
            await wait_for(pilot, lambda: table.row_count == 1 and table.cell("long", "step") == f"1/1 {GATE - 1}",
                           what="the table showing step 12")
            assert state.run_id == run_dir.name and not state.read_only

            gate.touch()  # the rest of the epoch comes live
            await wait_for(pilot, lambda: state.finished, timeout=SLOW, what="the run to finish, seen live")
            # History, then live, met exactly: each step once, none missing.
            assert list(state.series["long"].steps) == list(range(1, STEPS + 1))
            assert state.rows["long"].state.value == "completed" and state.rows["long"].step == STEPS
            await pilot.press("q")  # nothing alive: no question, the app exits
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
        await service_ended(pid)
        assert [(r["action"], r["ok"]) for r in of_type(run_dir, "client_command")] == []  # it only watched
        assert of_type(run_dir, "run_finished")[-1]["statuses"] == {"long": "completed"}
    finally:
        await end_service(run_dir, pid, gate)


async def test_kill_from_the_app_is_carried_out_by_the_service_and_recorded_with_its_pid(tmp_path, runs_dir):
    gate = tmp_path / "gate"
    config = write_config(tmp_path, ["victim", "bystander"], gate)
    started = watcher = reading = None
    try:
        started = await asyncio.to_thread(spawn, config=config, runs_dir=runs_dir)
        run_dir = started.run_dir
        await wait_for_file(lambda: held(run_dir, "victim", "bystander"), "both pipelines training")
        # A second client, watching live from before the kill.
        watcher = await RemoteRun.connect(run_dir, read_only=True, history=False)
        seen: list[Event] = []
        reading = asyncio.ensure_future(collect(watcher.subscribe(replay=False), seen))

        app = TorchherdApp(None, runs_dir, start=Attach(run_dir))
        toasts = shown(app)
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await dashboard_of(pilot)
            table = dashboard.query_one(PipelineTable)
            await wait_for(pilot, lambda: table.row_count == 2 and dashboard.selected is not None, what="two rows")
            for _ in range(table.row_count):
                if dashboard.selected == "victim":
                    break
                await pilot.press("down")
                await pilot.pause()
            assert dashboard.selected == "victim"
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the kill question")
            await pilot.press("y")

            def killed() -> bool:
                return any(isinstance(e, PipelineFinished) and e.pipeline == "victim" for e in seen)

            await wait_for(pilot, killed, timeout=SLOW, what="the watcher to see the victim killed")
            [finished] = [e for e in seen if isinstance(e, PipelineFinished)]
            assert (finished.pipeline, finished.status) == ("victim", "killed")
            [command] = [e for e in seen if isinstance(e, ClientCommand)]
            assert (command.action, command.pipeline, command.ok) == ("kill", "victim", True)
            assert command.client_pid == os.getpid()  # the app's process (it runs in this one)
            assert watcher.statuses == {"victim": "killed", "bystander": "running"}  # only the one asked for
            await wait_for(pilot, lambda: app.bridge.state.rows["victim"].state.value == "killed",
                           what="the app to show it killed")
            assert toasts == ["killing victim"]
            await wait_for(pilot, lambda: table.cell("victim", "state") == "killed", what="the table to say so")

            gate.touch()  # the bystander trains on to the end
            await wait_for(pilot, lambda: app.bridge.state.finished, timeout=SLOW, what="the run to finish")
            # Its service ended with it: a key says nothing can act now, never "restarting victim".
            await wait_for(pilot, lambda: not app.bridge.state.live, timeout=SLOW, what="the service's end")
            await pilot.press("r")
            await wait_for(pilot, lambda: len(toasts) == 2, what="the app to say why not")
            assert toasts[1] == (f"the run has ended and its supervisor with it: nothing can act on victim now "
                                 f"(`torchherd resume {run_dir}` carries on what did not finish)")
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
        await asyncio.wait_for(watcher.wait(), SLOW)
        await service_ended(started.pid)
        # On disk, as every later reader sees it: one command, the app's, carried out.
        commands = of_type(run_dir, "client_command")
        assert [(c["action"], c["pipeline"], c["client_pid"], c["ok"]) for c in commands] == [
            ("kill", "victim", os.getpid(), True)]
        assert of_type(run_dir, "run_finished")[-1]["statuses"] == {"victim": "killed", "bystander": "completed"}
        assert max(r["step"] for r in steps_of(run_dir, "victim")) == GATE - 1  # killed at the gate
    finally:
        if reading is not None:
            reading.cancel()
        if watcher is not None:
            await watcher.close()
        await end_service(started.run_dir if started else None, started.pid if started else None, gate)


async def test_read_only_app_cannot_kill(tmp_path, runs_dir):
    gate = tmp_path / "gate"
    config = write_config(tmp_path, ["watched"], gate)
    started = None
    try:
        started = await asyncio.to_thread(spawn, config=config, runs_dir=runs_dir)
        run_dir = started.run_dir
        await wait_for_file(lambda: held(run_dir, "watched"), "training")

        app = TorchherdApp(None, runs_dir, start=Attach(run_dir, read_only=True))
        toasts = shown(app)
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await dashboard_of(pilot)
            state = app.bridge.state
            await wait_for(pilot, lambda: dashboard.selected == "watched", what="the pipeline selected")
            assert state.read_only and state.rows["watched"].state.value == "running"
            assert (state.metric, state.metric_mode) == ("accuracy", "max")  # the config's, as a launch has
            assert "val acc" in dashboard.query_one(PipelineTable).render_line(0).text

            await pilot.press("k")
            await wait_for(pilot, lambda: toasts, what="the app to say why not")
            assert toasts == ["this view is read-only (attach without --read-only to steer): nothing can be changed"]
            assert not isinstance(app.screen, ConfirmScreen)  # no question: nothing to confirm

            # Were the kill sent anyway (what the dashboard posts when it may), the service refuses it, and
            # the refusal comes back to the app's event log.
            app.post_message(CommandRequested(Kill("watched")))
            await wait_for(pilot, lambda: any("kill refused: this client is read-only" in e.text for e in state.log),
                           timeout=SLOW, what="the service's refusal in the event log")
            # The service records it as it replies; the file is flushed on its next tick.
            await wait_for(pilot, lambda: of_type(run_dir, "client_command"), timeout=SLOW, what="the record")
            refused = of_type(run_dir, "client_command")
            assert [(c["action"], c["pipeline"], c["client_pid"], c["ok"], c["text"]) for c in refused] == [
                ("kill", "watched", os.getpid(), False, "this client is read-only")]

            before = len(toasts)
            await pilot.press("n")  # nor can it add a config to the run
            await wait_for(pilot, lambda: len(toasts) > before, what="the app to say why not")
            assert toasts[before:] == ["this view is read-only (attach without --read-only to add configs)"]
            # Quitting asks nothing (it can stop nothing): it leaves, the run going.
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
            assert not isinstance(app.screen, QuitScreen)
        assert app.detached and run_held(run_dir)
        gate.touch()  # nothing was killed: it trains to the end
        await service_ended(started.pid)
        assert of_type(run_dir, "run_finished")[-1]["statuses"] == {"watched": "completed"}
        assert [r["step"] for r in steps_of(run_dir, "watched")] == list(range(1, STEPS + 1))
    finally:
        await end_service(started.run_dir if started else None, started.pid if started else None, gate)


async def test_quit_then_detach_leaves_the_service_training_to_the_end(tmp_path, runs_dir):
    gate = tmp_path / "gate"
    config = write_config(tmp_path, ["long"], gate)
    started = later = reading = None
    try:
        started = await asyncio.to_thread(spawn, config=config, runs_dir=runs_dir)
        run_dir = started.run_dir
        service = psutil.Process(started.pid)
        await wait_for_file(lambda: held(run_dir, "long"), "training")

        app = TorchherdApp(None, runs_dir, start=Attach(run_dir))
        async with app.run_test(size=SIZE) as pilot:
            await dashboard_of(pilot)
            await wait_for(pilot, lambda: getattr(app.bridge.state.rows.get("long"), "step", 0) == GATE - 1,
                           what="the steps so far")
            await pilot.press("q")
            await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), what="the quit question")
            assert app.screen.can_detach  # the run has a service of its own
            await pilot.press("d")
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
        assert app.detached and app.return_code == 0

        # The app is gone; the service is not, and nothing was asked of it but to let the app go.
        assert is_alive(service) and run_held(run_dir)
        later = await RemoteRun.connect(run_dir)  # another client, from the run's start
        assert later.statuses == {"long": "running"}
        assert max(e.step for e in later.history if e.type == "step") == GATE - 1
        assert not [e for e in later.history if isinstance(e, (ClientCommand, PipelineFinished))]
        events: list[Event] = []
        reading = asyncio.ensure_future(collect(later.subscribe(replay=False), events))

        gate.touch()  # training goes on with no app attached: the service writes the remaining steps
        await wait_for_file(lambda: len(steps_of(run_dir, "long")) == STEPS, "the steps after the detach")
        statuses = await asyncio.wait_for(later.wait(), SLOW)
        await asyncio.wait_for(reading, SLOW)
        assert statuses == {"long": "completed"}
        assert [e.step for e in events if e.type == "step"] == list(range(GATE, STEPS + 1))
        [end] = [e for e in events if isinstance(e, RunFinished)]
        assert end.ok and end.statuses == {"long": "completed"}
        await service_ended(started.pid)
        assert of_type(run_dir, "client_command") == []
    finally:
        if reading is not None:
            reading.cancel()
        if later is not None:
            await later.close()
        await end_service(started.run_dir if started else None, started.pid if started else None, gate)
