"""The picker makes the check `torchherd run` makes: it builds every task in a fresh process (with progress
on screen) and refuses what `torchherd run` refuses; `torchherd run CONFIG` opens on it at once."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from textual.widgets import OptionList
from textual.widgets._footer import FooterKey

from torchherd.tui.app import TorchherdApp
from torchherd.tui.cli import check_then_launch_app
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.picker import PickerScreen
from tests.tui.pilots import launch, wait_for

pytestmark = pytest.mark.asyncio

SIZE = (120, 36)
TASKS = Path(__file__).resolve().parent.parent / "tasks"


def gated_task(folder: Path, body: str) -> Path:
    """A task file whose import waits until the test creates `gate`: the probe is visibly under way until then."""
    gate = folder / "gate"
    (folder / "gated.py").write_text(textwrap.dedent(f"""
        import os
        import sys
        import time

        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)  # held here until the test opens the gate
        sys.path.insert(0, {str(TASKS)!r})
        """) + textwrap.dedent(body))
    return gate


def config(folder: Path, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text('[[pipelines]]\nname = "a"\ntask = "gated.py:build"\nmax_epochs = 1\n\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 1\n')
    return path


def verdict(app) -> str:
    return str(app.screen.query_one("#verdict").content)


@pytest.mark.slow  # builds tasks in a real probe process
# Regression: a config whose task does not build showed "ready: enter launches" in the picker, and enter
# created a run whose workers all failed seconds later; `torchherd run` refused the same config.
async def test_picker_builds_the_tasks_and_refuses_a_config_torchherd_run_refuses(tmp_path: Path, runs_dir,
                                                                                   session):
    gate = gated_task(tmp_path, "def build(params):\n    raise ValueError('no data at /nowhere')\n")
    config(tmp_path)
    app = TorchherdApp(tmp_path, runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "checking 1 task" in verdict(app), timeout=30, what="progress shown")
        await pilot.press("enter")  # before the check is done: remembered, not launched
        gate.touch()
        await wait_for(pilot, lambda: app.screen.checks, timeout=60, what="tasks built")
        assert "cannot launch: 1 problem" in verdict(app)
        assert "pipelines[0].task: task factory" in verdict(app) and "no data at /nowhere" in verdict(app)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, PickerScreen) and session.sup is None
        assert any("cannot be launched" in n.message for n in app._notifications)


@pytest.mark.slow  # builds tasks in a real probe process
# Regression: `torchherd run CONFIG` showed a blank screen for about 10 s while it built the tasks.
async def test_torchherd_run_opens_on_the_check_and_then_launches(tmp_path: Path, runs_dir, session):
    gate = gated_task(tmp_path, "from tiny import build\n")
    app = check_then_launch_app(config(tmp_path), runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "checking 1 task" in verdict(app), timeout=30, what="checking screen")
        assert isinstance(app.screen, PickerScreen) and "torchherd run: checking run.toml" in \
            str(app.screen.query_one("#title").content)
        gate.touch()
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), timeout=60, what="dashboard")
        assert [p.name for p in session.sup.config.pipelines] == ["a"]


async def test_launch_more_footer_does_not_offer_resume(tmp_path: Path, runs_dir, make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        keys = [k.description for k in app.screen.query(FooterKey)]
        assert keys == ["help", "quit"]  # a config is highlighted: r resumes past runs only; nothing is behind
        await launch(pilot, session)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and app.screen.adding, what="launch more")
        await pilot.pause()
        keys = [k.description for k in app.screen.query(FooterKey)]
        # Regression: launch more offered "r resume run", which it cannot do in a live session.
        assert "resume run" not in keys and "back" in keys


# Regression: outside the repo the picker said "no .toml files in sample_configs", a folder that does not exist.
async def test_a_missing_config_folder_is_named_with_how_to_pick_one(tmp_path: Path, runs_dir, monkeypatch,
                                                                    session):
    monkeypatch.chdir(tmp_path)
    app = TorchherdApp(None, runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one("#choices", OptionList).option_count > 1, what="listed")
        choices = app.screen.query_one("#choices", OptionList)
        assert "sample_configs/ does not exist" in str(choices.get_option_at_index(1).prompt)
        assert "torchherd DIR" in verdict(app) and "torchherd CONFIG" in verdict(app)


# Regression: a config fixed in an editor while highlighted kept its old preview and ✗ verdict until the person
# moved away and back.
async def test_a_highlighted_config_saved_again_is_checked_again(tmp_path: Path, runs_dir, session):
    folder = tmp_path / "configs"
    folder.mkdir()
    config = folder / "mine.toml"
    config.write_text('[defaults]\nmax_epoch = 2\n\n[[pipelines]]\nname = "a"\n')  # a typo
    app = TorchherdApp(folder, runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and "max_epoch" in verdict(app),
                       what="the typo named")
        config.write_text('[defaults]\nmax_epochs = "two"\n\n[[pipelines]]\nname = "a"\n')  # another problem
        await wait_for(pilot, lambda: "max_epochs" in verdict(app) and "max_epoch:" not in verdict(app),
                       what="the saved file checked again, without moving")
        assert 'max_epochs = "two"' in str(app.screen.query_one("#source").content.code)


async def test_a_config_written_while_the_picker_is_open_is_listed_and_the_cursor_stays(tmp_path: Path, runs_dir,
                                                                                        session):
    # Regression: the picker did not see a config written while it was open.
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "b.toml").write_text('[[pipelines]]\nname = "a"\ntask = "regression"\n')
    (folder / "c.toml").write_text('[[pipelines]]\nname = "a"\ntask = "regression"\n')
    app = TorchherdApp(folder, runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and len(app.screen.configs) == 2,
                       what="two configs listed")
        await pilot.press("down")
        choices = app.screen.query_one("#choices", OptionList)
        await wait_for(pilot, lambda: "c.toml" in str(choices.highlighted_option.prompt), what="c highlighted")
        (folder / "a.toml").write_text('[[pipelines]]\nname = "a"\ntask = "regression"\n')
        await wait_for(pilot, lambda: [p.name for p in app.screen.configs] == ["a.toml", "b.toml", "c.toml"],
                       what="the new config listed")
        assert "c.toml" in str(choices.highlighted_option.prompt)  # the cursor stayed on its config


# Regression: a fault in torchherd's own check (a SyntaxError in a module it imports lazily) left the pane
# "checking…" for ever, with nothing to say why and enter doing nothing.
async def test_a_check_that_fails_inside_torchherd_says_so_and_launches_nothing(tmp_path: Path, runs_dir, session,
                                                                                monkeypatch):
    def broken(path, runs_dir=None):
        raise TypeError("a fault of torchherd's own")
    monkeypatch.setattr("torchherd.tui.screens.picker.check_config_file", broken)
    (tmp_path / "run.toml").write_text('[[pipelines]]\nname = "a"\ntask = "regression"\n')
    app = TorchherdApp(tmp_path, runs_dir, factory=session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.checks, timeout=30, what="the check's verdict")
        assert "torchherd could not check it: TypeError: a fault of torchherd's own" in verdict(app)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, PickerScreen) and session.sup is None
