"""Alerts and a gang's ranks in the app, against the real Supervisor over scripted workers: the banner and
the bell (NO_BELL silences it), the event log's lines, a straggler in the table and the ranks' spread."""
from __future__ import annotations

import pytest

from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol.health import RankPace, Straggler
from torchherd.tui.widgets.alert_banner import AlertBanner
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.pilots import launch, settled, wait_for

pytestmark = pytest.mark.asyncio

NAN = "training loss is nan at epoch 0 step 3 (step report)"


def log_texts(app) -> list[str]:
    return [entry.text for entry in app.bridge.state.log]


@pytest.mark.parametrize("quiet", [False, True])
async def test_an_alert_shows_a_banner_and_rings_the_bell_unless_no_bell(make_app, session, monkeypatch, quiet):
    if quiet:
        monkeypatch.setenv("NO_BELL", "1")
    else:
        monkeypatch.delenv("NO_BELL", raising=False)
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await launch(pilot, session)
        name = session.sup.views()[0].name
        session.feed(name, m.Notice(pipeline=name, level="warning", text=NAN, time=session.clock.now))
        banner = app.screen.query_one(AlertBanner)
        await wait_for(pilot, lambda: banner.seen == 1, what="the alert's banner")
        await settled(pilot)
        assert banner.display and "loss is not finite" in str(banner.render())
        assert banner.rang == (0 if quiet else 1)
        assert any(t.startswith(f"ALERT {name}: loss is not finite") for t in log_texts(app))


async def test_a_straggler_shows_in_the_state_column_and_the_spread_under_the_table(make_app, session):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await launch(pilot, session)
        name = session.sup.views()[0].name
        t = session.clock.now
        session.feed(name, RankPace(pipeline=name, rank=0, step=10, step_time=0.010, time=t),
                     RankPace(pipeline=name, rank=1, step=10, step_time=0.050, time=t),
                     Straggler(pipeline=name, rank=1, ratio=5.0, median=0.010, slowest=0.050, time=t))
        table = app.screen.query_one(PipelineTable)
        await wait_for(pilot, lambda: table.cell(name, "state") == "r1 5.0x", what="the straggler's state")
        table.focus()
        await settled(pilot)
        reason = str(app.screen.query_one("#reason").render())
        assert "slowest rank 1 50 ms/batch, its peers' median 10 ms (5.0x)" in reason and "straggler r1 5.0x" in reason
        assert any("straggler rank 1: 5.0x" in t for t in log_texts(app))


async def test_w_opens_the_gangs_ranks_with_their_pace_and_where_the_triage_found_them(make_app, session):
    from torchherd.engine.protocol.health import Triage
    from torchherd.tui.screens.ranks import RanksScreen

    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await launch(pilot, session)
        name = session.sup.views()[0].name
        t = session.clock.now
        session.feed(name, RankPace(pipeline=name, rank=0, step=10, step_time=0.010, time=t),
                     RankPace(pipeline=name, rank=1, step=10, step_time=0.050, time=t),
                     Triage(pipeline=name, verdict="rank 1 is in `time.sleep(60)` (train.py:3); rank 0 waits in "
                            "all_reduce", ranks=("all_reduce", "`time.sleep(60)` (train.py:3)"), time=t))
        await wait_for(pilot, lambda: app.bridge.state.rows[name].rank_places != (), what="the triage folded")
        app.screen.query_one(PipelineTable).focus()
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, RanksScreen), what="the ranks view")
        text = str(app.screen.query_one("#ranks-text").render())
        assert "   1      50.0       5.0x  `time.sleep(60)` (train.py:3)" in text, text
        assert "   0      10.0       0.2x  all_reduce" in text, text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, RanksScreen), what="closed")
