"""Pilot tests: every dashboard key, the picker, launch more, past runs, quitting; against FakeSupervisor."""
from __future__ import annotations

import pytest
from conftest import launch_good, wait_for, write_past_run
from textual.widgets import OptionList

from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import ConfirmScreen, HelpScreen, QuitScreen
from torchherd.tui.screens.log_view import LogScreen
from torchherd.tui.screens.picker import PickerScreen
from torchherd.tui.widgets.log_views import EventLog
from torchherd.tui.widgets.loss_chart import LossChart
from torchherd.tui.widgets.pipeline_table import PipelineTable

pytestmark = pytest.mark.asyncio

SIZE = (120, 36)


def screen_text(widget) -> str:
    """What a line-based widget currently shows, as plain text."""
    return "\n".join(strip.text for strip in widget.lines) if hasattr(widget, "lines") else str(widget.render())


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


async def test_launch_and_data_reach_the_table(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        sup.train("alpha", 100)
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "step").endswith(" 100"), what="step 100 shown")
        assert table.cell("alpha", "val") != "-"
        assert table.cell("beta", "state") == "running"


async def test_kill_asks_first(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, DashboardScreen) and sup.calls == []
        await pilot.press("k", "y")
        await wait_for(pilot, lambda: sup.calls == [("kill", "alpha")], what="kill")
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "state") == "killed", what="killed shown")


@pytest.mark.parametrize("key,command", [("r", "restart"), ("s", "stop"), ("c", "checkpoint")])
async def test_command_keys(make_app, key, command):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("down")  # select beta
        await pilot.press(key)
        await wait_for(pilot, lambda: sup.calls == [(command, "beta")], what=command)


async def test_restart_shows_new_attempt(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].attempt == 2, what="attempt 2")
        assert app.bridge.state.rows["alpha"].state == "running"


async def test_pause_then_resume(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].state == "paused", what="paused")
        await pilot.press("p")
        await wait_for(pilot, lambda: sup.calls == [("pause", "alpha"), ("resume", "alpha")], what="resume")


async def test_full_log_and_help(make_app, runs_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        log = sup.run_dir / "alpha" / "log.txt"
        log.parent.mkdir(parents=True)
        log.write_text("hello from alpha\n")
        await pilot.press("l")
        assert isinstance(app.screen, LogScreen)
        await wait_for(pilot, lambda: "hello from alpha" in "\n".join(app.screen.query_one("#full").lines),
                       what="log text")
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)


async def test_chart_keys_toggle(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        sup.train("alpha", 200)
        chart = app.screen.query_one(LossChart)
        await wait_for(pilot, lambda: "⠀" not in "".join(s.text for s in chart._lines) or chart._lines,
                       what="chart drawn")
        await pilot.press("a", "g", "e", "x")
        assert (chart.overlay, chart.log_y, chart.smooth, chart.x_mode) == (True, True, True, "time")
        assert "all pipelines | x time | log | EMA" in chart.border_title


async def test_failure_traceback_in_event_log(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        sup.crash("beta")
        events = app.screen.query_one(EventLog)
        await wait_for(pilot, lambda: "ZeroDivisionError" in "\n".join(s.text for s in events.lines),
                       what="traceback")
        assert "loss = model(x).sum() / zero" in "\n".join(s.text for s in events.lines)


async def test_launch_more_adds_to_the_session(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("n")
        assert isinstance(app.screen, PickerScreen) and app.screen.adding
        await wait_for(pilot, lambda: app.screen.configs, what="configs listed")
        await pilot.press("down", "down")  # tiny.toml
        await wait_for(pilot, lambda: any(p.name == "tiny.toml" for p in app.screen.checks), timeout=60,
                       what="tiny checked")
        await pilot.press("enter")
        await wait_for(pilot, lambda: sup.added == ["tiny"], what="added")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="back on dashboard")
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="third row")


async def test_past_run_opens_read_only(make_app, runs_dir):
    write_past_run(runs_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.runs, what="runs listed")
        choices = app.screen.query_one("#choices", OptionList)
        choices.highlighted = choices.option_count - 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await pilot.pause()
        state = app.screen.state
        assert state.read_only and state.rows["alpha"].state == "failed"
        await pilot.press("k", "y")
        await pilot.pause()
        assert any("read-only" in n.message for n in app._notifications)
        await pilot.press("escape")
        assert isinstance(app.screen, PickerScreen)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")


async def test_quit_asks_and_cancel_keeps_running(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("c")
        assert isinstance(app.screen, DashboardScreen) and sup.shutdowns == []
        await pilot.press("q", "s")
        await wait_for(pilot, lambda: not app.is_running, what="exit")
        assert sup.shutdowns == [True] and not sup.alive


async def test_ctrl_c_routes_through_the_quit_dialog(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch_good(pilot)
        await pilot.press("ctrl+c")
        assert isinstance(app.screen, QuitScreen)


async def test_step_flood_is_coalesced(make_app):
    # A flood of step events must cost a few redraws, not one per event.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        sup = await launch_good(pilot)
        dashboard = app.screen
        count = 0
        original = dashboard.redraw

        def counting() -> None:
            nonlocal count
            count += 1
            original()

        dashboard.redraw = counting
        sup.train("alpha", 50_000, every=10, val=False)
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].step == 50_000, what="all applied")
        await wait_for(pilot, lambda: count >= 1 and not dashboard._pending, what="redraw done")
        assert count <= 3
        assert len(app.bridge.state.series["alpha"].bins.lo) <= 512


async def test_resize_switches_table_columns(make_app):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await launch_good(pilot)
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: not table.compact and table.row_count == 2, what="wide table")
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: table.compact, what="compact table")
        assert "device" not in table.render_line(0).text


async def test_launch_flag_skips_the_picker(make_app):
    # `torchherd run CONFIG` without --headless: straight to the dashboard.
    from conftest import CONFIGS
    app = make_app(CONFIGS / "good.toml", launch=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: app.screen.query_one(PipelineTable).row_count == 2, what="rows")
