"""Every dashboard command key against the real Supervisor over scripted workers: the state transitions
it makes, the commands the worker receives, the exit it reports, and what a key that cannot act says."""
from __future__ import annotations

import pytest

from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol.states import WorkerState
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import ConfirmScreen
from torchherd.tui.screens.picker import PickerScreen
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.pilots import launch, wait_for

pytestmark = pytest.mark.asyncio

SIZE = (120, 36)
S = WorkerState


def sent(session, name: str) -> list[type]:
    return [type(c) for c in session.launcher.handle(name).sent]


async def test_kill_asks_first_then_goes_killing_to_killed(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        assert "SIGTERM" in str(app.screen.question)
        await pilot.press("n")
        assert isinstance(app.screen, DashboardScreen) and session.state("alpha") == "running"
        await pilot.press("k", "y")
        await wait_for(pilot, lambda: session.state("alpha") == "killed", what="killed")
        assert session.transitions("alpha")[-2:] == [("running", "killing"), ("killing", "killed")]
        assert [e.reason for e in session.exits("alpha")] == ["killed"]
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "state") == "killed", what="killed shown")
        assert session.state("beta") == "running"


async def test_kill_dialog_for_a_queued_pipeline_says_what_really_happens(make_app, session):
    # Regression: the dialog promised SIGTERM to a process group for a pipeline that had no process.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and app.screen.configs, what="picker")
        await pilot.press("down", "down")  # tiny.toml: both slots are taken, so it queues
        await wait_for(pilot, lambda: any(p.name == "tiny.toml" for p in app.screen.checks), what="checked")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: app.screen.query_one(PipelineTable).row_count == 3, what="tiny listed")
        await pilot.press("down", "down")
        await wait_for(pilot, lambda: app.screen.selected == "tiny", what="tiny selected")
        await pilot.press("k")
        question = str(app.screen.question)
        assert "queued" in question and "leaves the queue" in question and "SIGTERM" not in question
        await pilot.press("y")
        await wait_for(pilot, lambda: session.state("tiny") == "killed", what="killed")
        assert session.transitions("tiny") == [("queued", "killed")]
        assert session.exits("tiny") == []  # no process ever existed


async def test_restart_goes_killing_then_starting_as_attempt_2(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("r")
        await wait_for(pilot, lambda: session.sup.view("alpha").attempt == 2, what="attempt 2")
        assert session.transitions("alpha")[-2:] == [("running", "killing"), ("killing", "starting")]
        assert [e.reason for e in session.exits("alpha")] == ["restarted"]
        assert session.sup.view("alpha").restarts == 0  # a person's restart spends no budget
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "attempt") == "2", what="try 2 shown")
        session.start_training("alpha")
        await wait_for(pilot, lambda: table.cell("alpha", "state") == "running", what="running again")


async def test_stop_goes_stopping_to_stopped_with_exit_code_10(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("down", "s")  # beta
        await wait_for(pilot, lambda: session.state("beta") == "stopped", what="stopped")
        assert session.transitions("beta")[-2:] == [("running", "stopping"), ("stopping", "stopped")]
        assert m.Stop in sent(session, "beta")
        exited = session.exits("beta")
        assert [(e.exit_code, e.reason) for e in exited] == [(10, "stopped")]
        assert session.state("alpha") == "running"


async def test_pause_then_resume(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].state is S.PAUSED, what="paused")
        await pilot.press("p")
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].state is S.RUNNING, what="running")
        assert session.transitions("alpha")[-2:] == [("running", "paused"), ("paused", "running")]
        assert sent(session, "alpha") == [m.Pause, m.Unpause]


async def test_checkpoint_key_asks_the_worker_for_one(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("c")
        await wait_for(pilot, lambda: sent(session, "alpha") == [m.CheckpointNow], what="checkpoint sent")
        assert any("writes a checkpoint" in n.message for n in app._notifications)


async def test_pause_on_a_killed_pipeline_says_it_cannot_be_paused(make_app, session):
    # Regression: p on a killed pipeline notified "pause: alpha" and did nothing.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("k", "y")
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].state is S.KILLED, what="killed")
        before = len(session.seen())
        await pilot.press("p")
        await wait_for(pilot, lambda: app._notifications, what="a notification")
        messages = [n.message for n in app._notifications]
        assert any("alpha is killed: it cannot be paused" in text for text in messages)
        assert not any(text.startswith("pause") for text in messages)
        assert len(session.seen()) == before and session.state("alpha") == "killed"


async def test_crash_restarts_count_in_the_try_column(make_app, session):
    session.restart = {"backoff": 0.01}  # seconds before the restart
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.crash("beta")
        await wait_for(pilot, lambda: session.sup.view("beta").attempt == 2, what="restart after backoff")
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("beta", "attempt") == "2 ↻1/3", what="try shows the budget")
        assert table.cell("alpha", "attempt") == "1"


async def test_a_key_on_a_run_that_has_ended_says_how_each_pipeline_is_carried_on(make_app, session):
    # Regression: u on a finished sweep's pruned trial said "`torchherd resume RUN` carries on what did not
    # finish", which answers "nothing to resume" for a sweep whose trials all ended well. (The real run's
    # end, a service gone, is in test_attach_app; here the state says so.)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        state = app.bridge.state
        state.apply(m.PipelineFinished(pipeline="alpha", status="pruned", reason="rung cut"))
        state.apply(m.PipelineFinished(pipeline="beta", status="completed", reason="epochs done"))
        state.live = False  # its supervisor has gone with the run
        said = []
        for name, key in (("alpha", "r"), ("beta", "s")):
            await wait_for(pilot, lambda: app.screen.selected is not None, what="a selection")
            while app.screen.selected != name:
                await pilot.press("down")
            await pilot.press(key)
            await wait_for(pilot, lambda: len(app._notifications) > len(said), what="the app to say why not")
            said.append(list(app._notifications)[-1].message)
        assert said[0].endswith(f"(`torchherd resume {state.run_dir} --only alpha` carries it on)"), said
        assert said[1].endswith("(beta completed)"), said
