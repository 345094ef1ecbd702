"""Pilot tests of the app's screens and navigation against the real Supervisor over scripted workers:
the picker, launching, launch more, past runs, escape, quitting, and a flood of step events."""
from __future__ import annotations

import asyncio

import time
from pathlib import Path

import pytest
from textual.widgets import OptionList

from torchherd.engine.protocol.states import WorkerState
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import QuitScreen
from torchherd.tui.screens.picker import PickerScreen
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.conftest import CONFIGS
from tests.tui.pilots import launch, wait_for
from tests.tui.scripting import write_past_run
from torchherd.tui.start import Attach, Launch

pytestmark = pytest.mark.asyncio

SIZE = (120, 36)
S = WorkerState


async def test_picker_shows_check_and_refuses_invalid_config(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.configs, what="configs listed")
        choices = app.screen.query_one("#choices", OptionList)
        assert [str(choices.get_option_at_index(i).prompt).strip() for i in (1, 2, 3)] == \
            ["bad.toml", "good.toml", "tiny.toml"]
        await wait_for(pilot, lambda: any(p.name == "bad.toml" for p in app.screen.checks), what="bad checked")
        verdict = str(app.screen.query_one("#verdict").content)
        assert "cannot launch: 2 problems" in verdict and "max_epoch" in verdict
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, PickerScreen)  # not launched
        assert any("cannot be launched" in n.message for n in app._notifications)
        await pilot.press("down")
        await wait_for(pilot, lambda: "ready" in str(app.screen.query_one("#verdict").content), timeout=60,
                       what="good checked")  # its tasks are built in a fresh process first
        assert "alpha: task regression" in str(app.screen.query_one("#verdict").content)


async def test_launch_and_data_reach_the_table(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 100)
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "step").endswith(" 100"), what="step 100 shown")
        assert table.cell("alpha", "val") != "-"
        assert table.cell("beta", "state") == "running"
        assert app.bridge.state.rows["beta"].state is S.RUNNING  # typed, not a string
        assert app.launched  # from the picker: the app's exit status is the run's


@pytest.mark.slow  # builds a second config's tasks in a probe process
async def test_launch_more_adds_to_the_session_and_queues(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("n")
        assert isinstance(app.screen, PickerScreen) and app.screen.adding
        await wait_for(pilot, lambda: app.screen.configs, what="configs listed")
        await pilot.press("down", "down")  # tiny.toml
        await wait_for(pilot, lambda: any(p.name == "tiny.toml" for p in app.screen.checks), timeout=60,
                       what="tiny checked")
        # Regression: the check said "enter launches ... -> cpu0" with both slots busy, and nothing of names.
        verdict = str(app.screen.query_one("#verdict").content)
        assert verdict.startswith("✓ ready: enter adds it to this session") and "queue for free devices" in verdict
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="back on dashboard")
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="third row")
        assert session.state("tiny") == "queued"  # both slots are taken
        assert table.cell("tiny", "state") == "queued"
        # Regression: the status line kept the first config's run name as if the session held it alone.
        status = str(app.screen.query_one("#status").content)
        assert f"{app.bridge.state.run_id} + tiny" in status, status


async def test_past_run_opens_read_only(make_app, runs_dir, clock):
    await write_past_run(runs_dir, clock)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.runs, what="runs listed")
        # Regression: the first picker's footer offered "esc back" (it did nothing) and "r resume run" on a
        # config (nothing either). Only keys that act are offered: r on a past run, no escape at all.
        def offered() -> set[str]:
            return {b.binding.action for b in app.screen.active_bindings.values() if b.enabled and b.binding.show}
        await wait_for(pilot, lambda: offered() == {"app.help", "app.request_quit"}, what="a config's keys")
        choices = app.screen.query_one("#choices", OptionList)
        choices.highlighted = choices.option_count - 1
        await wait_for(pilot, lambda: offered() == {"resume", "app.help", "app.request_quit"}, what="a run's keys")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await pilot.pause()
        state = app.screen.state
        assert state.read_only and state.rows["alpha"].state is S.FAILED
        assert state.rows["alpha"].step == 100
        assert not app.launched  # only looked at: its failure is not this command's
        await pilot.press("k")
        await pilot.pause()
        assert any("read-only" in n.message for n in app._notifications)
        await pilot.press("escape")
        assert isinstance(app.screen, PickerScreen)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")


async def test_attach_to_a_run_that_has_ended_opens_it_as_it_ended(make_app, runs_dir, clock):
    run_dir = await write_past_run(runs_dir, clock)
    app = make_app(start=Attach(run_dir))  # as `torchherd attach RUN` once its supervisor has gone
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        state = app.screen.state
        assert state.read_only and state.rows["alpha"].state is S.FAILED and state.rows["alpha"].step == 100
        assert any("no longer live" in n.message for n in app._notifications)
        assert not any(n.title == "cannot attach" for n in app._notifications)
        await pilot.press("escape")
        assert isinstance(app.screen, PickerScreen)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")


async def test_headless_attach_to_a_run_that_has_ended_says_how_it_ended(runs_dir, clock):
    import io

    from torchherd.tui.attach import follow_run
    from torchherd.tui.headless import EXIT_FAILED, LinePrinter

    run_dir = await write_past_run(runs_dir, clock)
    out = io.StringIO()
    assert await follow_run(run_dir, LinePrinter(out), from_start=False) == EXIT_FAILED  # alpha failed
    assert out.getvalue() == f"torchherd: {run_dir} is not live: failed, resumable (--from-start prints its history)\n"
    out = io.StringIO()
    assert await follow_run(run_dir, LinePrinter(out), from_start=True) == EXIT_FAILED
    text = out.getvalue()
    assert text.startswith("[    0.0s] run 20231114-220000-old: 1 pipeline(s)") and "alpha: failed" in text, text
    assert "[   10.0s] alpha: epoch 2/4" in text  # timed by the run's own clock, not when it was printed
    assert text.endswith(f"torchherd: {run_dir} is not live: failed, resumable\n")
    # Cut short: its supervisor died before the end was written.
    events = run_dir / "events.jsonl"
    events.write_text("".join(line for line in events.read_text().splitlines(keepends=True)
                              if '"type":"pipeline_finished"' not in line and '"type":"run_finished"' not in line))
    out = io.StringIO()
    assert await follow_run(run_dir, LinePrinter(out), from_start=False) == EXIT_FAILED
    assert "is not live: cut short, resumable" in out.getvalue()


async def test_a_long_run_id_is_cut_in_the_picker_not_wrapped(make_app, runs_dir, clock):
    # Regression: "20261126-183521-script_client" wrapped its last letter alone onto the next line.
    long_id = "20231114-220000-a-config-with-a-long-name"
    await write_past_run(runs_dir, clock, run_id=long_id)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.runs, what="runs listed")
        choices = app.screen.query_one("#choices", OptionList)
        prompt = str(choices.get_option_at_index(choices.option_count - 1).prompt)
        first = prompt.splitlines()[0]
        assert first.endswith("…") and long_id.startswith(first.strip()[:-1]), prompt
        assert len(first) <= choices.content_region.width - 1  # one line, room for a scroll bar


async def test_escape_from_a_live_run_opens_the_picker_and_comes_back(make_app, session):
    # Regression: escape did nothing on a live dashboard, though the help offered it.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        dashboard = app.screen
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="picker")
        assert app.bridge.live and session.state("alpha") == "running"  # the run goes on underneath
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is dashboard, what="the same dashboard again")


async def test_escape_from_a_finished_run_closes_it_for_a_new_one(make_app, session):
    # Regression: escape did nothing once the run had finished either.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        first = session.sup
        session.exit("alpha", 0)
        session.exit("beta", 0)
        await wait_for(pilot, lambda: app.bridge.state.finished, what="run finished")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="picker")
        assert not app.screen.adding and not app.bridge.live
        await launch(pilot, session, running=False)  # a new session, a new run directory
        assert session.sup is not first and session.sup.run_dir != first.run_dir
        assert app.bridge.run_dirs == [first.run_dir.resolve(), session.sup.run_dir.resolve()]
        app.bridge.remember(first.run_dir)  # the first run carried on from the picker (stop, `r`, then `q`)
        assert app.bridge.run_dirs == [first.run_dir.resolve(), session.sup.run_dir.resolve()]  # said once


async def test_quit_asks_and_stops_the_workers_gracefully(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("c")
        assert isinstance(app.screen, DashboardScreen) and session.state("alpha") == "running"
        await pilot.press("q", "s")
        await wait_for(pilot, lambda: not app.is_running, what="exit")
    assert {v.name: v.state for v in session.sup.views()} == {"alpha": S.STOPPED, "beta": S.STOPPED}
    assert [e.exit_code for e in session.exits("alpha")] == [10]  # each checkpointed and exited itself


async def test_ctrl_c_routes_through_the_quit_dialog(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        await pilot.press("ctrl+c")
        assert isinstance(app.screen, QuitScreen)


async def test_step_flood_is_coalesced(make_app, session):
    # A flood of step events must cost a few redraws, not one per event.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        dashboard = app.screen
        count = 0
        original = dashboard.redraw

        def counting() -> None:
            nonlocal count
            count += 1
            original()

        dashboard.redraw = counting
        began = time.monotonic()
        session.train("alpha", 50_000, every=10, val=False, steps_per_epoch=50_000, epochs=1)
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].step == 50_000, what="all applied")
        await wait_for(pilot, lambda: count >= 1 and not dashboard.redraw_pending, what="redraw done")
        # The rate limit, whatever the machine's speed: at most one redraw per interval the flood
        # lasted (plus the first and the last), never one per event (5,000 of them).
        allowed = 2 + (time.monotonic() - began) / dashboard.interval
        assert count <= allowed, (count, allowed)
        assert len(app.bridge.state.series["alpha"].bins.lo) <= 512


async def test_resize_switches_table_columns(make_app, session):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await launch(pilot, session)
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: not table.compact and table.row_count == 2, what="wide table")
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: table.compact, what="compact table")
        header = table.render_line(0).text  # compact keeps device and try, drops the progress bar and elapsed
        assert "device" in header and "try" in header and "progress" not in header and "elapsed" not in header


async def test_launch_flag_skips_the_picker(make_app):
    # `torchherd run CONFIG` without --headless: straight to the dashboard.
    app = make_app(CONFIGS / "good.toml", start=Launch(CONFIGS / "good.toml"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: app.screen.query_one(PipelineTable).row_count == 2, what="rows")


async def test_run_app_prints_the_run_directory_after_exit(monkeypatch, capsys, runs_dir, clock):
    # Regression: quitting the app printed nothing, not even where the run was written.
    from torchherd.tui import app as app_module

    run_dir = await write_past_run(runs_dir, clock)

    def fake_run(self) -> None:  # the app ran a session in run_dir and was quit
        self.bridge.run_dirs.append(run_dir)

    monkeypatch.setattr(app_module.TorchherdApp, "run", fake_run)
    assert app_module.run_app(CONFIGS / "good.toml", start=Launch(CONFIGS / "good.toml")) == 1  # its pipeline failed
    out = capsys.readouterr().out.splitlines()
    assert out == ["torchherd: run 20231114-220000-old failed", "  alpha failed", f"  run directory: {run_dir}",
                   f"  carry it on once what failed is fixed, from the start (nothing was saved): torchherd resume "
                   f"{run_dir}"]  # a failed run resumes too; this one saved nothing (regression: "from its
    # checkpoints", for a pipeline that had none and had failed with an error no restart could fix)
    (run_dir / "alpha" / "checkpoints").mkdir(parents=True)
    (run_dir / "alpha" / "checkpoints" / "last.pt").write_text("saved")
    assert app_module.run_app(CONFIGS / "good.toml", start=Launch(CONFIGS / "good.toml")) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"  carry it on once what failed is fixed, from its checkpoints: torchherd resume {run_dir}")


async def test_the_app_exits_as_headless_would_after_a_user_stop(monkeypatch, capsys, runs_dir, clock):
    # Regression: the app exited 1 after a user stop, where headless exits 3 for the same run.
    from tests.conftest import make_config
    from tests.tui.scripting import Session, until
    from torchherd.tui import app as app_module
    from torchherd.tui.headless import EXIT_STOPPED, exit_status

    session = Session(clock, run_id="20231114-230000-stopped")
    sup = session(make_config(runs_dir.parent, [{"name": "alpha"}], name="stopped"), runs_dir)
    await sup.start()
    await until(lambda: session.launcher.handles, what="the worker to start")
    session.start_training("alpha")
    session.train("alpha", 50)
    sup.stop()
    statuses = await asyncio.wait_for(sup.wait(), 30)
    await sup.shutdown()
    assert exit_status(statuses) == EXIT_STOPPED

    def fake_run(self) -> None:  # the app ran that session and was quit
        self.bridge.run_dirs.append(sup.run_dir)

    monkeypatch.setattr(app_module.TorchherdApp, "run", fake_run)
    assert app_module.run_app(CONFIGS / "good.toml", start=Launch(CONFIGS / "good.toml")) == EXIT_STOPPED
    assert "torchherd: run 20231114-230000-stopped stopped" in capsys.readouterr().out

    def picked_and_launched(self) -> None:  # `torchherd`, the config launched from the picker (exited 0)
        self.bridge.run_dirs.append(sup.run_dir)
        self.launched = True

    monkeypatch.setattr(app_module.TorchherdApp, "run", picked_and_launched)
    assert app_module.run_app(CONFIGS) == EXIT_STOPPED


async def test_torchherd_run_in_the_app_reports_its_run_after_exit(monkeypatch, capsys, runs_dir, clock):
    # Regression: `torchherd run CONFIG`, then escape to the picker and q, printed nothing and exited 3
    # ("quit before it launched") for a run that had completed.
    from torchherd.tui import app as app_module
    from torchherd.tui import cli

    run_dir = await write_past_run(runs_dir, clock)

    def fake_run(self) -> None:  # the app ran a session in run_dir, went back to the picker, was quit
        self.bridge.run_dirs.append(run_dir)

    monkeypatch.setattr(app_module.TorchherdApp, "run", fake_run)
    assert cli.run_app_checked(CONFIGS / "good.toml", runs_dir) == 1  # its pipeline failed
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "torchherd: run 20231114-220000-old failed" and f"  run directory: {run_dir}" in out


# Regression: `torchherd` in a project folder holding its own run.toml said "There is no folder sample_configs
# here"; and a folder's pyproject.toml would have been offered as a config.
async def test_with_no_argument_the_app_looks_in_this_folder_when_it_holds_configs(tmp_path, monkeypatch):
    from torchherd.tui.app import default_folder
    from torchherd.tui.bridge import list_configs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    assert default_folder() == Path("sample_configs")  # nothing here: the bundled folder, and its hint
    (tmp_path / "run.toml").write_text("[[pipelines]]\nname = 'a'\ntask = 'regression'\n")
    assert default_folder() == Path(".")
    assert list_configs(Path(".")) == [Path("run.toml")]
    (tmp_path / "sample_configs").mkdir()
    assert default_folder() == Path("sample_configs")
    # Regression: a run directory's saved config copies were offered as launchable, and failed to launch
    # ("script not found: runs/.../train.py").
    run_dir = tmp_path / "runs" / "20260101-000000-run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text((tmp_path / "run.toml").read_text())
    (run_dir / "events.jsonl").write_text("")
    assert list_configs(run_dir) == []



async def test_the_quit_dialog_tells_running_from_queued():
    # Regression: "10 pipelines are still running" when 2 ran and 8 waited in the queue.
    from textual.app import App
    from textual.widgets import Static

    app = App()
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(QuitScreen(["a", "b"], can_detach=True, queued=[f"q{i}" for i in range(8)]))
        await pilot.pause()
        text = str(app.screen.query_one(".question", Static).content)
        assert text.startswith("[b]2 pipelines are still running, 8 queued[/b]\na, b, q0, q1, q2, q3 …")
