"""The dashboard's sweep view over a real Supervisor with scripted workers: trials best first with their
values, state, best metric and rung at 80 and 120 columns, the chart on the best trials, `u` promoting the
selected pruned trial through the same command path as kill and restart, and no view for a run that is no
sweep."""
from __future__ import annotations

import math

from torchherd.tui.commands import Promote
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.widgets.loss_chart import GLYPHS, LossChart
from torchherd.tui.widgets.sweep_table import SweepTable
from tests.tui.conftest import CONFIGS
from tests.tui.pilots import launch, settled, wait_for
from torchherd.tui.start import Launch

GRID = CONFIGS / "sweep" / "grid.toml"
BEST, WORST = "t-lr0.03-batch_size32", "t-lr0.03-batch_size128"  # the first two trials, side by side


def curve(scale: float):
    return lambda step: scale * (2.0 * math.exp(-step / 120) + 0.1)


async def _first_rung(pilot, session) -> None:
    """The first two trials train an epoch each: the first is kept at rung 1, the second (worse) pruned."""
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
    await wait_for(pilot, lambda: len(session.launcher.handles) == 2, what="two trials started")
    for name in (BEST, WORST):
        session.start_training(name)
    session.train(BEST, 50, loss=curve(1.0))
    await wait_for(pilot, lambda: app.bridge.state.trials[BEST].rung == 1, what="the first judged")
    session.train(WORST, 50, loss=curve(3.0))
    await wait_for(pilot, lambda: app.bridge.state.rows[WORST].state.value == "pruned", what="the second pruned")
    await settled(pilot)


def table_text(table: SweepTable) -> list[str]:
    return [table.render_line(y).text.rstrip() for y in range(table.size.height)]


async def test_the_sweep_view_ranks_trials_by_the_metric_with_values_state_best_and_rung(make_app, session):
    app = make_app(GRID, start=Launch(GRID))
    async with app.run_test(size=(80, 24)) as pilot:
        await _first_rung(pilot, session)
        dashboard = app.screen
        assert {"t", "u"} <= {b.binding.key for b in dashboard.active_bindings.values()}
        await pilot.press("t")
        table = dashboard.query_one(SweepTable)
        await wait_for(pilot, lambda: table.display and table.size.height > 3, what="the sweep view")
        assert table.names[:2] == [BEST, WORST]  # best (lowest val_loss) first, then the pruned one
        assert set(table.names[2:]) == {n for n in app.bridge.state.trials} - {BEST, WORST}  # no result: last
        lines = table_text(table)
        head = lines[0].split()
        assert head == ["#", "trial", "lr", "batch_size", "state", "best", "loss", "rung", "epoch"]
        first, second = lines[1].split(), lines[2].split()
        assert first[:4] == [f"1{GLYPHS[0]}", BEST, "0.03", "32"] and first[4] == "running" and first[-2:] == ["1", "2/4"]
        assert second[:4] == [f"2{GLYPHS[1]}", WORST, "0.03", "128"] and second[4] == "pruned" and second[-2] == "1"
        assert lines[3].split()[-3:] == ["-", "-", "-"]  # no result, no rung yet
        best = app.bridge.state.trials[BEST].best
        assert f"{best:.3g}"[:4] in lines[1]
        assert all(len(line) <= 78 for line in lines)
        reason = str(dashboard.query_one("#reason").render())
        assert BEST in reason and "rung 1" in reason  # why the selected trial stands where it does
        await pilot.press("down")
        await wait_for(pilot, lambda: dashboard.selected == WORST, what="the pruned trial selected")
        reason = str(dashboard.query_one("#reason").render())
        assert "pruned" in reason and "rung cut" in reason and "u promotes it" in reason


async def test_at_120_columns_the_trials_names_show_too(make_app, session):
    app = make_app(GRID, start=Launch(GRID))
    async with app.run_test(size=(120, 40)) as pilot:
        await _first_rung(pilot, session)
        await pilot.press("t")
        table = app.screen.query_one(SweepTable)
        await wait_for(pilot, lambda: table.display and table.size.height > 3, what="the sweep view")
        lines = table_text(table)
        assert lines[0].split()[:3] == ["#", "trial", "lr"]
        assert BEST in lines[1] and WORST in lines[2]
        assert all(len(line) <= 118 for line in lines)


async def test_the_chart_overlays_the_best_trials_in_rank_order_and_t_goes_back(make_app, session):
    app = make_app(GRID, start=Launch(GRID))
    async with app.run_test(size=(120, 40)) as pilot:
        await _first_rung(pilot, session)
        chart = app.screen.query_one(LossChart)
        assert chart.only is None
        await pilot.press("t")
        await wait_for(pilot, lambda: chart.only == [BEST, WORST], what="the overlay of the ranked trials")
        assert chart.border_title.startswith("loss: top 2 trials")
        legend = chart.legend.plain
        assert f"{GLYPHS[0]} #1" in legend and f"{GLYPHS[1]} #2" in legend
        await pilot.press("t")
        await wait_for(pilot, lambda: chart.only is None, what="the pipelines again")
        assert not app.screen.query_one(SweepTable).display


async def test_u_promotes_the_selected_pruned_trial_through_the_command_path(make_app, session):
    app = make_app(GRID, start=Launch(GRID))
    async with app.run_test(size=(80, 24)) as pilot:
        await _first_rung(pilot, session)
        sent = []
        bridge_command = app.bridge.command
        app.bridge.command = lambda command: (sent.append(command), bridge_command(command))
        await pilot.press("t")
        await pilot.press("down")
        await wait_for(pilot, lambda: app.screen.selected == WORST, what="the pruned trial selected")
        await pilot.press("u")
        await wait_for(pilot, lambda: sent, what="the command")
        assert sent == [Promote(WORST)]
        assert WORST in session.sup.sweep.exempt
        await wait_for(pilot, lambda: app.bridge.state.rows[WORST].state.value in ("queued", "starting"),
                       what="the promoted trial back in the queue")
        await pilot.press("up")  # the best one, still running: it is never pruned, and goes on as it was
        await wait_for(pilot, lambda: app.screen.selected == BEST, what="the best trial selected")
        await pilot.press("u")
        await wait_for(pilot, lambda: BEST in session.sup.sweep.exempt, what="the running trial promoted")
        assert session.state(BEST) == "running"


async def test_a_run_that_is_no_sweep_has_no_sweep_view(make_app, session):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await launch(pilot, session)
        dashboard = app.screen
        assert not app.bridge.state.trials
        shown = {b.binding.key for b in dashboard.active_bindings.values()}
        assert "k" in shown and "t" not in shown and "u" not in shown
        await pilot.press("t")
        assert not dashboard.sweep_view and not dashboard.query_one(SweepTable).display


async def test_a_pbt_sweep_offers_no_promote_and_shows_lineage_not_rungs(make_app, session, tmp_path):
    # Regression: PBT's view said "no rung reached yet" and offered `u promote`, which PBT always refuses.
    pbt = tmp_path / "pbt.toml"
    pbt.write_text(GRID.read_text().replace('scheduler = "asha"\nmode = "stop"', 'scheduler = "pbt"')
                   .replace("grace_period = 1\nreduction_factor = 2\n", "perturbation_interval = 1\n"))
    app = make_app(pbt, start=Launch(pbt))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: len(session.launcher.handles) == 2, what="two trials started")
        dashboard = app.screen
        shown = {b.binding.key for b in dashboard.active_bindings.values()}
        assert "t" in shown and "u" not in shown
        await pilot.press("t")
        table = dashboard.query_one(SweepTable)
        await wait_for(pilot, lambda: table.display and table.size.height > 3, what="the sweep view")
        await settled(pilot)
        assert "promote" not in str(table.border_subtitle)
        head = table_text(table)[0].split()
        assert "lineage" in head and "rung" not in head  # before any exploit too: PBT has no rungs
        reason = str(dashboard.query_one("#reason").render())
        assert "no decision yet" in reason and "rung" not in reason and "promotes" not in reason


# ------------------------------------------------------------ the logic beside them


def test_the_columns_drop_the_names_where_they_do_not_fit_and_keep_every_value():
    from torchherd.tui.ranking import TrialRow

    rows = [TrialRow(f"mlp-lr{lr}-weight_decay{wd}-dropout0.1", {"params.lr": lr, "params.weight_decay": wd,
                                                                  "params.dropout": 0.1}, best=lr)
            for lr in (0.1, 0.01) for wd in (0.0, 0.0001)]
    table = SweepTable()
    table.update_trials(rows, {}, 0.0, 80, "accuracy")
    keys = [c.key for c in table.columns]
    assert "name" not in keys and keys[0] == "rank"
    assert [c.label for c in table.columns[1:4]] == ["lr", "weight_decay", "dropout"]
    assert sum(c.width + 1 for c in table.columns) <= 78
    assert table.cells[rows[0].name]["best"] == "0.1" and table.cells[rows[0].name]["state"] == "queued"
    table.update_trials(rows, {}, 0.0, 160, "accuracy")
    assert [c.key for c in table.columns][1] == "name"
    assert table.columns[4].label == "dropout" and "best acc" in [c.label for c in table.columns]


def test_the_cursor_stays_on_its_trial_when_the_ranking_changes():
    from torchherd.tui.ranking import TrialRow

    a, b, c = (TrialRow(n, {"params.lr": v}) for n, v in (("a", 1), ("b", 2), ("c", 3)))
    table = SweepTable()
    table.update_trials([a, b, c], {}, 0.0, 80, "val_loss")
    table.cursor = 1  # on b
    table.update_trials([b, c, a], {}, 0.0, 80, "val_loss")
    assert table.selected == "b" and table.cursor == 0
    table.update_trials([c, a], {}, 0.0, 80, "val_loss")  # b gone (cannot happen in a run, but no crash)
    assert table.selected in ("c", "a")


def test_the_chart_overlays_only_the_named_trials_in_their_order():
    from torchherd.tui.series import LossSeries

    chart = LossChart()
    chart.series = {n: LossSeries() for n in ("a", "b", "c", "d")}
    chart.selected = "a"
    assert [n for n, _, _ in chart._visible()] == ["a"] and not chart.overlaid
    chart.only = ["c", "a", "gone"]
    assert [(n, colour) for n, _, colour in chart._visible()] == [("c", 0), ("a", 1)]
    assert chart.overlaid and chart._title().startswith("loss: top 3 trials")


def test_promote_applies_to_a_pruned_or_live_trial_and_says_why_not_otherwise():
    from torchherd.engine.protocol.states import WorkerState as S
    from torchherd.tui.commands import refusal

    for state in (S.PRUNED, S.QUEUED, S.STARTING, S.RUNNING, S.PAUSED, S.BACKOFF):
        assert refusal(Promote("t"), state) is None
    assert refusal(Promote("t"), S.COMPLETED) == "t is completed, not pruned: it cannot be promoted; r starts it again"
    assert refusal(Promote("t"), S.STOPPING) == "t is stopping: it cannot be promoted now"


async def test_a_sweep_added_with_n_gets_a_sweep_view_of_its_own(make_app, session):
    app = make_app(GRID, start=Launch(GRID))
    async with app.run_test(size=(120, 40)) as pilot:
        await _first_rung(pilot, session)
        dashboard = app.screen
        added = await app.bridge.launch(CONFIGS / "sweep" / "added.toml")  # what `n` does once a config is picked
        assert sorted(added) == ["u-lr0.05", "u-lr0.1"]
        await wait_for(pilot, lambda: set(added) <= set(app.bridge.state.rows), what="the added trials' rows")
        dashboard._select("u-lr0.1")
        await pilot.press("t")
        table = dashboard.query_one(SweepTable)
        await wait_for(pilot, lambda: table.display and set(table.names) == set(added), what="the added sweep")
        assert app.bridge.state.sweep_for("u-lr0.1").overlay == 1
        await pilot.press("t")  # back to the table; the grid's own trial selected, the grid's sweep again
        dashboard._select(BEST)
        await pilot.press("t")
        await wait_for(pilot, lambda: table.names[:2] == [BEST, WORST] and len(table.names) == 6, what="the grid")
