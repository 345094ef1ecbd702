"""An elastic gang's size in the app: its device cell (`2/4 ranks`, `2/4` at 80 columns), the line under the table,
and the ranks view (`w`) with its size of MIN..MAX and its resizes, against the real Supervisor over scripted workers
where the supervisor decides the size."""
from __future__ import annotations

import pytest
from textual.app import App

from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol.progress import PipelineProgress, apply
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.ranks import RanksScreen, ranks_text
from torchherd.tui.start import Launch
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.pilots import settled, wait_for

WHY = "rank 1 killed by SIGKILL; 1 of 2 CPU slots free: cpu1 held by this run (urgent)"
ELASTIC = """# An elastic gang beside a pipeline that outranks it: the gang starts on the slot left, 1 rank of 1:2.
[defaults]
task = "regression"
max_epochs = 2
params = { samples = 64, features = 4, hidden = 8 }

[[pipelines]]
name = "urgent"
priority = 1

[[pipelines]]
name = "g"
ranks = "1:2"

[devices]
placement = "cpu"
cpu_slots = 2
"""


def rows() -> list[PipelineProgress]:
    """A fixed gang and an elastic one shrunk to one rank, folded from the events the supervisor emits."""
    fixed = apply(PipelineProgress("f"), m.WorkerStarted(pipeline="f", pid=7, device="cpu0,cpu1", attempt=1,
                                                         pids=(7, 8)))
    gang = PipelineProgress("g")
    for ev in (m.WorkerStarted(pipeline="g", pid=9, device="cpu2,cpu3", attempt=1, pids=(9, 10), min_ranks=1,
                               max_ranks=2),
               m.GangResized(pipeline="g", from_ranks=2, to_ranks=1, why=WHY, samples_per_step=64,
                             samples_per_step_before=64, time=1_700_000_000.0),
               m.WorkerStarted(pipeline="g", pid=11, device="cpu2", attempt=2, min_ranks=1, max_ranks=2)):
        gang = apply(gang, ev)
    return [fixed, gang]


def test_the_ranks_view_of_an_elastic_gang_says_its_size_and_its_resizes():
    text = ranks_text(rows()[1])
    assert text.startswith("[b]g[/b]: 1 of 1..2 ranks (elastic)\n"), text
    assert "resizes     ranks   samples/step  why\n22:13:20   2 -> 1       64 -> 64  " + WHY in text, text
    grown = PipelineProgress("h", ranks=2, min_ranks=1, max_ranks=2, rank_times=(0.010, 0.012))
    assert ranks_text(grown).endswith("   1      12.0       1.2x  -\n\nresizes: none yet")


@pytest.mark.parametrize("width, cell", [(80, "1/2"), (120, "1/2 ranks")])
async def test_the_device_cell_of_an_elastic_gang_gives_its_size_and_a_fixed_gangs_its_slots(width, cell):
    class TableOnly(App):
        def compose(self):
            yield PipelineTable()

    app = TableOnly()
    async with app.run_test(size=(width, 12)) as pilot:
        table = app.query_one(PipelineTable)
        table.update_rows(rows(), now=0.0, terminal_width=width)
        await pilot.pause()
        assert sum(c.width + 1 for c in table.visible_columns()) <= table.size.width
        fixed, gang = (table.render_line(i + 1).text.split() for i in range(2))
        assert fixed[:2] == ["f", "cpu0-1"]
        assert gang[:2 + cell.count(" ")] == ["g", *cell.split()], gang


async def test_an_elastic_gang_started_on_the_slot_left_shows_1_of_2_at_80_columns_and_w_says_why(
        make_app, session, tmp_path):
    config = tmp_path / "elastic.toml"
    config.write_text(ELASTIC)
    app = make_app(config, start=Launch(config))
    async with app.run_test(size=(80, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.row_count == 2 and table.cell("g", "device") == "1/2",
                       what="the gang's size")
        assert table.cell("urgent", "device") in ("cpu0", "cpu1")
        table.focus()
        while table.selected != "g":
            await pilot.press("down")
        await settled(pilot)
        reason = str(app.screen.query_one("#reason").render())
        assert "1/2 ranks of 1:2 on cpu" in reason, reason
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, RanksScreen), what="the ranks view")
        text = str(app.screen.query_one("#ranks-text").render())
        assert "g: 1 of 1..2 ranks (elastic)" in text, text
        assert "2 -> 1       64 -> 64  1 of 2 CPU slots free: cpu" in text, text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, RanksScreen), what="closed")
