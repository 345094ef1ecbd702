"""What the dashboard shows, against the real Supervisor over scripted workers: numbers that fit, epochs
counted from 1, validation on the right axis, the overlay's legend, the help, the log, failures."""
from __future__ import annotations

import math

import pytest
from rich.cells import cell_len
from textual.geometry import Region
from textual.widgets import Static

from torchherd.engine.protocol import messages as m
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import HelpScreen
from torchherd.tui.screens.log_view import LogScreen
from torchherd.tui.screens.picker import PickerScreen
from torchherd.tui.widgets.log_views import EventLog
from torchherd.tui.widgets.loss_chart import GLYPHS, GUTTER, MARKER, RESTART, LossChart
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.conftest import CONFIGS
from tests.tui.pilots import launch, lines_of, settled, wait_for
from torchherd.tui.start import Launch

pytestmark = pytest.mark.asyncio

SIZE = (120, 36)
NUMERIC = ("attempt", "step", "progress", "loss", "val", "best", "rate", "elapsed", "eta")


def chart_rows(chart: LossChart) -> list[str]:
    return chart.drawn_text()


def log_texts(app) -> list[str]:
    return [entry.text for entry in app.bridge.state.log]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_every_number_fits_its_column(make_app, session, size):
    # Regression: at 80x24 a loss of 3.027e-05 was cut to "3.027e-" and read as 3.027.
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await launch(pilot, session)
        session.start_training("alpha", epochs=100, steps_per_epoch=20_000)
        t = session.clock.now
        session.feed("alpha", *[m.StepMetrics(pipeline="alpha", epoch=61, step=1_234_000 + i, loss=3.027e-05 * (1 + i),
                                              lr=1e-4, samples_per_s=123_456.7, time=t + i) for i in range(1, 4)],
                     m.ValResult(pipeline="alpha", epoch=61, step=1_234_003, time=t + 4,
                                 metrics={"val_loss": -0.000123456, "accuracy": 0.98765}))
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "val") != "-", what="numbers shown")
        await settled(pilot)
        for index, name in enumerate(table.names):
            line = table.render_line(index + 1).text
            for column in table.visible_columns():
                text = table.cell(name, column.key)
                assert cell_len(text) <= column.width, (column.key, text)
                if column.key in NUMERIC:
                    assert "…" not in text and text in line, (column.key, text, line)
        assert float(table.cell("alpha", "loss")) == pytest.approx(1.2108e-04, rel=1e-2)
        assert float(table.cell("alpha", "val")) == pytest.approx(-0.000123456, rel=1e-2)
        assert table.cell("alpha", "step") == "62/100 1.2M"
        chart = app.screen.query_one(LossChart)
        labels = [row[:GUTTER - 2].strip() for row in chart_rows(chart)[:-1] if row[:GUTTER - 2].strip()]
        assert labels and all(math.isfinite(float(label)) for label in labels), labels


async def test_epochs_are_counted_from_one_everywhere(make_app, session):
    # Regression: the event log said "epoch 0" for the epoch the table called 1/4.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 50)  # the first epoch, with its validation
        session.feed("alpha", m.CheckpointSaved(pipeline="alpha", path="last.pt", epoch=1, step=50, reason="epoch",
                                                time=session.clock.now),
                     m.CheckpointSaved(pipeline="alpha", path="last.pt", epoch=1, step=60, reason="request",
                                       time=session.clock.now))
        table = app.screen.query_one(PipelineTable)
        # The request checkpoint at step 60 is the newest word on where training stands.
        await wait_for(pilot, lambda: table.cell("alpha", "step") == "2/4 60", what="second epoch in the table")
        texts = log_texts(app)
        for expected in ("epoch 1/4 done", "validated epoch 1/4, step 50", "checkpoint (epoch) after epoch 1/4",
                         "checkpoint (request) in epoch 2/4, step 60"):
            assert any(expected in text for text in texts), (expected, texts)
        assert not any("epoch 0" in text for text in texts), texts


async def test_a_resumed_worker_says_which_epoch_it_carries_on_from(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session, running=False)
        session.feed("alpha", m.Resumed(pipeline="alpha", path="last.pt", epoch=2, step=100, time=session.clock.now))
        session.start_training("alpha", epoch=2, step=100)
        await wait_for(pilot, lambda: any("from epoch 3/4, step 100" in t for t in log_texts(app)), what="resume")
        assert any("resumed from its checkpoint: epoch 3, step 100" in t for t in log_texts(app))


async def test_accuracy_is_not_drawn_on_the_loss_axis(make_app, session):
    # Regression: with metric = "accuracy" the markers sat at 0.5-1.0 on a loss axis near 0.01.
    app = make_app(CONFIGS / "metrics" / "accuracy.toml", start=Launch(CONFIGS / "metrics" / "accuracy.toml"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: session.sup.views()[0].state.value == "starting", what="started")
        session.start_training("alpha")
        session.train("alpha", 200, loss=lambda step: 0.01 + 0.002 * math.exp(-step / 100))
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "best") == "0.7", what="best accuracy")
        await settled(pilot)
        header = table.render_line(0).text
        assert "val acc" in header
        assert table.cell("alpha", "val") == "0.7"
        rows = chart_rows(app.screen.query_one(LossChart))
        rule = next(i for i, row in enumerate(rows) if "val acc┼" in row)
        assert not any(MARKER in row for row in rows[:rule])  # the loss plot has no accuracy in it
        assert sum(row.count(MARKER) for row in rows[rule:]) == 4  # one per epoch, in the strip
        assert float(rows[0][:GUTTER - 2]) < 0.1  # the loss axis is the loss's, not stretched to 0.7


async def test_a_loss_metric_keeps_its_markers_on_the_loss_axis(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 200)
        await wait_for(pilot, lambda: len(app.bridge.state.series["alpha"].val) == 4, what="results")
        await settled(pilot)
        rows = chart_rows(app.screen.query_one(LossChart))
        assert not any("┼" in row for row in rows)
        assert sum(row.count(MARKER) for row in rows) >= 3  # markers may share a cell
        assert "val loss" in app.screen.query_one(PipelineTable).render_line(0).text


async def test_a_restart_that_goes_back_is_marked_on_the_chart_and_said_in_the_log(make_app, session):
    # Regression: after a restart the step axis jumped back without a word.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 120, val=False)
        session.train("alpha", 60, start=60, val=False)  # back to its checkpoint at step 60, and on
        await wait_for(pilot, lambda: any("went back from step 120 to step 70" in t for t in log_texts(app)),
                       what="the note")
        await settled(pilot)
        chart = app.screen.query_one(LossChart)
        rows = chart_rows(chart)
        assert rows[-1].count(RESTART) == 1 and "went back" in chart.legend.plain
        session.train("beta", 50, val=False)
        await pilot.press("down")  # beta never went back: no mark
        await wait_for(pilot, lambda: app.screen.selected == "beta", what="beta selected")
        await settled(pilot)
        assert RESTART not in chart_rows(chart)[-1] and "went back" not in chart.legend.plain


async def test_overlay_has_a_legend_with_a_glyph_per_pipeline(make_app, session, monkeypatch):
    # Regression: the overlay had no legend and, under NO_COLOR, every curve was the same grey.
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 200)
        session.train("beta", 120, t0=session.clock.now - 200, loss=lambda step: 1.5 - step / 200)
        await wait_for(pilot, lambda: app.bridge.state.rows["beta"].step == 120, what="data")
        await pilot.press("a")
        chart = app.screen.query_one(LossChart)
        await wait_for(pilot, lambda: chart.overlay, what="overlay")
        assert f"{GLYPHS[0]} alpha" in chart.legend.plain and f"{GLYPHS[1]} beta" in chart.legend.plain
        text = "\n".join(chart_rows(chart))
        assert GLYPHS[0] in text and GLYPHS[1] in text


async def test_chart_keys_toggle(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.train("alpha", 200)
        chart = app.screen.query_one(LossChart)
        await pilot.press("a", "g", "e", "x", "o")
        assert (chart.overlay, chart.log_y, chart.smooth, chart.x_mode, chart.clip) == (True, True, True, "time", False)
        assert "all pipelines | x time | log | EMA" in chart.border_title


async def test_m_charts_the_values_a_pipeline_reports_besides_its_loss(make_app, session):
    # Regression: the README says step reports feed the charts, but a user's own values (my_loss,
    # train_acc_step) could not be charted at all.
    from torchherd.engine.protocol import messages as m

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.feed("alpha", *(m.StepMetrics(pipeline="alpha", epoch=0, step=s, loss=1.0 / s, time=session.clock.now + s,
                                               metrics={"my_loss": 5.0 - s / 10, "train_acc_step": s / 100})
                                for s in range(1, 41)))
        await wait_for(pilot, lambda: app.bridge.state.rows["alpha"].step == 40, what="data")
        chart = app.screen.query_one(LossChart)
        await pilot.press("m")
        await wait_for(pilot, lambda: chart.border_title.startswith("my_loss: alpha"), what="my_loss charted")
        assert "my_loss" in chart.legend.plain and any("4.9" in row or "5" in row for row in chart_rows(chart))
        await pilot.press("m")
        await wait_for(pilot, lambda: chart.border_title.startswith("train_acc_step: alpha"), what="next value")
        await pilot.press("m")
        await wait_for(pilot, lambda: chart.border_title.startswith("loss: alpha"), what="back to the loss")
        await pilot.press("down")  # beta reports nothing but its loss: m says so
        await wait_for(pilot, lambda: app.screen.selected == "beta", what="beta selected")
        await pilot.press("m")
        await wait_for(pilot, lambda: any("no value but its loss" in n.message for n in app._notifications),
                       what="said")


async def test_help_scrolls_at_80x24(make_app, session):
    # Regression: the help was cut at 80x24 and could not be scrolled.
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await launch(pilot, session)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.query_one("#help-text")
        await pilot.pause()
        assert text.region.y >= 0 and text.region.bottom <= 24
        assert text.max_scroll_y > 0 and text.scroll_y == 0
        await pilot.press("end")
        await wait_for(pilot, lambda: text.scroll_y == text.max_scroll_y, what="scrolled to the end")
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)


async def test_help_from_the_picker_starts_with_its_keys_and_no_line_wraps(make_app):
    # Regression: ? on the picker showed the dashboard's keys (the picker's came last), and at 80x24 the
    # d line wrapped "its" and "step)" to the dialog's first column.
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), what="the picker")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.pause()
        text = app.screen.query_one("#help-text")
        lines = [strip.text for strip in text.query_one(Static).render_lines(
            Region(0, 0, text.query_one(Static).size.width, text.query_one(Static).size.height))]
        assert lines[0].strip() == "Picker keys", lines[:3]
        starts = [line.strip() for line in lines if line.strip() and not line.startswith(" ")]
        assert starts == ["Picker keys", "Dashboard keys", "Table columns", "Chart"], starts  # wraps start at 0


async def test_help_explains_the_try_column(make_app):
    from torchherd.tui.screens.dialogs import HELP

    assert "try" in HELP and "↻3/3" in HELP and "max_restarts" in HELP


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_l_opens_the_full_log_of_the_selected_pipeline(make_app, session, size):
    # Regression: at 80x24, l has to open the full log the help promises, wherever the focus is.
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await launch(pilot, session)
        log = session.sup.run_dir / "beta" / "log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(f"line {i} of beta\n" for i in range(200)))
        await pilot.press("down")
        await wait_for(pilot, lambda: app.screen.selected == "beta", what="beta selected")
        for focus_moves in (0, 1, 2):
            await pilot.press(*["tab"] * focus_moves, "l")
            assert isinstance(app.screen, LogScreen) and app.screen.pipeline == "beta"
            title = str(app.screen.query_one("#full").border_title)
            assert title.startswith("beta: ") and title.endswith("beta/log.txt") and len(title) < size[0] - 4
            full = app.screen.query_one("#full")
            await wait_for(pilot, lambda: "line 199 of beta" in lines_of(full), what="the whole log")
            assert "line 0 of beta" in lines_of(full)
            await pilot.press("escape")
            assert isinstance(app.screen, DashboardScreen)


async def test_failure_traceback_in_event_log(make_app, session):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.crash("beta")
        events = app.screen.query_one(EventLog)
        await wait_for(pilot, lambda: "ZeroDivisionError" in lines_of(events), what="traceback")
        assert "loss = model(x).sum() / zero" in lines_of(events)


async def test_a_failure_reason_reads_without_brackets_in_brackets(make_app, session):
    # Regression: "failed (ZeroDivisionError: ... (restart budget of 0 used up))".
    session.restart = {"max_restarts": 0}
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await launch(pilot, session)
        session.crash("beta")
        await wait_for(pilot, lambda: session.state("beta") == "failed", what="failed")
        want = "finished failed: restart budget of 0 used up: ZeroDivisionError: float division by zero"
        await wait_for(pilot, lambda: want in log_texts(app), what="the failure line")
        assert not any("))" in text for text in log_texts(app))


# Regression: at 120 columns a sweep's trials read "reg-lr0.03-ba…" twice over (names cut at 14 cells) with 10
# columns empty at the right; at 100 it dropped progress, best, samples/s and elapsed, 20 columns left empty.
@pytest.mark.parametrize("width, shown, dropped", [
    (120, ["progress", "elapsed", "best"], ["rate"]),  # the names whole first, then what fits
    (100, ["elapsed"], ["progress", "best", "rate"]),
    (80, [], ["progress", "elapsed", "best", "rate"]),  # 78 cells: the columns people act on, names cut
])
async def test_names_take_the_spare_width_first_then_the_columns_that_fit(width, shown, dropped):
    from textual.app import App

    from torchherd.engine.protocol.progress import PipelineProgress

    class TableOnly(App):
        def compose(self):
            yield PipelineTable()

    names = ["reg-lr0.03-batch_size32", "reg-lr0.03-batch_size128"]
    app = TableOnly()
    async with app.run_test(size=(width, 12)) as pilot:
        table = app.query_one(PipelineTable)
        table.update_rows([PipelineProgress(n) for n in names], now=0.0, terminal_width=width)
        await pilot.pause()
        keys = [c.key for c in table.visible_columns()]
        assert all(k in keys for k in shown) and not any(k in keys for k in dropped), keys
        assert sum(c.width + 1 for c in table.visible_columns()) <= table.size.width
        rows = [table.render_line(i + 1).text for i in range(2)]
        if width >= 100:
            assert [r.split()[0] for r in rows] == names, rows  # told apart
        else:
            assert all(r.startswith("reg-lr0.03-ba… ") for r in rows), rows


# Regression: at 80x24 the table dropped the device and try columns (which GPU, how many restarts spent) but
# kept elapsed; with 12 pipelines 4 rows showed and nothing said there were 8 more.
async def test_at_80_columns_the_table_keeps_device_and_try_and_says_how_many_rows_are_hidden():
    from textual.app import App

    from torchherd.engine.protocol.progress import PipelineProgress

    class TableOnly(App):
        CSS = "PipelineTable { max-height: 7; }"

        def compose(self):
            yield PipelineTable()

    app = TableOnly()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(PipelineTable)
        rows = [PipelineProgress(f"p{i}", device=f"cuda:{i % 8}") for i in range(12)]
        table.update_rows(rows, now=0.0, terminal_width=80)
        await pilot.pause()
        keys = [c.key for c in table.visible_columns()]
        assert "device" in keys and "attempt" in keys and "elapsed" not in keys
        assert sum(c.width + 1 for c in table.visible_columns()) <= 78
        assert table.border_subtitle == "rows 1-4 of 12 ↑↓"
        await pilot.press("end")
        assert table.border_subtitle == "rows 9-12 of 12 ↑↓"
        table.styles.max_height = 20  # room for every row: nothing to say
        await pilot.pause()
        assert table.border_subtitle == ""


# Regression: a pipeline that made no step (hang_timeout unset) looked like any running one, and nothing asked
# its processes where they were stuck.
async def test_a_stalled_pipeline_is_flagged_and_d_asks_for_its_stacks(make_app, session):
    import signal

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await launch(pilot, session)
        session.train("alpha", 5)
        session.feed("alpha", m.Stalled(pipeline="alpha", quiet=400.0, time=session.clock.now))
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell("alpha", "state").startswith("stall "), what="the flag")
        assert any("no step for 6 min" in text and "d writes" in text for text in log_texts(app))
        table.focus()
        await pilot.press("d")
        handle = session.launcher.handle("alpha")
        await wait_for(pilot, lambda: signal.SIGUSR1 in handle.signals, what="its stacks asked for")
        assert session.sup.view("alpha").state.value == "running"
        session.feed("alpha", m.Stalled(pipeline="alpha", quiet=0.0, time=session.clock.now))
        await wait_for(pilot, lambda: table.cell("alpha", "state") == "running", what="the flag cleared")


def chart_only():
    """An app that holds only a LossChart."""
    from textual.app import App

    class ChartOnly(App):
        def compose(self):
            yield LossChart()

    return ChartOnly()


# Regression: a loss that fell from 12 to 0.086, then stayed there, was drawn as a row of arrows over a y axis
# of 0.0864-0.0866: against a plateau that flat every point of the descent onto it was an outlier.
async def test_a_descent_onto_a_flat_plateau_shows_its_tail_not_a_zoom_into_the_plateau():
    from torchherd.tui.series import LossSeries

    series = LossSeries()
    for step in range(10, 1001, 10):
        series.append(step, float(step), 0.086 + 12.0 * math.exp(-step / 40) + 1e-5 * math.sin(step))
    app = chart_only()
    async with app.run_test(size=(60, 16)) as pilot:
        chart = app.query_one(LossChart)
        chart.series, chart.selected = {"alpha": series}, "alpha"
        chart.redraw()
        await pilot.pause()
        rows = chart_rows(chart)[:-1]
        top = float(rows[0][:GUTTER - 2])
        assert 0.2 <= top < 1 and "↑ clipped" in chart.legend.plain, rows  # the first steps clipped, said
        drawn = sum(any(ch not in " ⠀↑" for ch in row[GUTTER:]) for row in rows)
        assert drawn > len(rows) // 2, rows  # the descent's tail runs down the plot onto the plateau


# Regression: the first loss (about 20) set the top of the y axis, and every later point sat on its bottom row.
async def test_a_first_loss_far_above_the_rest_is_clipped_and_the_chart_says_so():
    from torchherd.tui.series import LossSeries

    series = LossSeries()
    for step in range(10, 1001, 10):
        series.append(step, float(step), 20.0 if step == 10 else 0.3 + 0.3 * math.exp(-step / 300))
    app = chart_only()
    async with app.run_test(size=(60, 16)) as pilot:
        chart = app.query_one(LossChart)
        chart.series, chart.selected = {"alpha": series}, "alpha"
        chart.redraw()
        await pilot.pause()
        rows = chart_rows(chart)[:-1]  # the plot, without the x axis
        assert float(rows[0][:GUTTER - 2]) < 1  # the top label: the bulk of the curve, not 20
        assert "↑ clipped" in chart.legend.plain and "↑" in rows[0][GUTTER:]  # said, and marked where
        assert sum(any(ch not in " ⠀" for ch in row[GUTTER:]) for row in rows) > len(rows) // 2  # not flat
        chart.log_y = True  # g: the log axis clips the same outlier
        chart.redraw()
        assert "↑ clipped" in chart.legend.plain and "log" in chart.border_title
        chart.log_y, chart.clip = False, False  # o: every point, the first on top, nothing said
        chart.redraw()
        rows = chart_rows(chart)[:-1]
        assert float(rows[0][:GUTTER - 2]) >= 20 and "clipped" not in chart.legend.plain
