"""The devices pane at the sizes the dashboard gives it: rows that do not wrap, rows that scroll."""
from __future__ import annotations

import pytest
from textual import events
from textual.app import App
from textual.geometry import Region

from torchherd.engine.protocol import telemetry as t
from torchherd.tui.widgets.device_pane import DevicePane
from torchherd.tui.widgets.pipeline_table import PipelineTable

pytestmark = pytest.mark.asyncio

GIB = 2 ** 30
# The pane's outer size in the dashboard (dashboard.tcss): 44 wide from 100 columns, 30 below; the middle
# row leaves it 10 rows at 80x24 and up to 19 at 120x40, borders included.
WIDE, NARROW = 44, 30


def snapshot(gpus: int, workers: int) -> t.TelemetrySnapshot:
    return t.TelemetrySnapshot(
        gpus=tuple(t.GpuSample(index=i, uuid=f"GPU-{i}", name="Test GPU", util_gpu=87, mem_used=12 * GIB,
                               mem_total=40 * GIB, temperature=65, power_draw=250.0, power_limit=400.0,
                               processes=(t.GpuProcess(pid=10000 + i, used_memory=6 * GIB, owner=f"reg-{i}"),))
                   for i in range(gpus)),
        processes=tuple(t.ProcessSample(pipeline=f"reg-{i}", pid=10000 + i, cpu_percent=98.0, rss=int(0.34 * GIB),
                                        children=0, gpu_memory=6 * GIB if gpus else None) for i in range(workers)),
        host_cpu_percent=45.0, host_mem_used=12 * GIB, host_mem_total=64 * GIB, load1=3.5)


def shown(pane: DevicePane) -> list[str]:
    """The pane's lines as the screen draws them, border included."""
    region = pane.screen.find_widget(pane).region
    return [strip.text for strip in pane.render_lines(Region(0, 0, region.width, region.height))]


def pane_app(css: str) -> App:
    class PaneOnly(App):
        CSS = css

        def compose(self):
            yield PipelineTable()
            yield DevicePane()

    return PaneOnly()


# Regression: at 120x40 a worker's row wrapped its RSS over two lines ("RSS" at the end of one, "0.34 GiB"
# on the next), and the host's RAM likewise.
@pytest.mark.parametrize("width, height", [(WIDE, 12), (NARROW, 10)])
async def test_a_worker_row_fits_the_pane_without_wrapping(width, height):
    app = pane_app(f"PipelineTable {{ height: 3; }} DevicePane {{ width: {width}; height: {height}; }}")
    async with app.run_test(size=(120, 40) if width == WIDE else (80, 24)) as pilot:
        pane = app.query_one(DevicePane)
        pane.show(snapshot(gpus=0, workers=2))
        await pilot.pause()
        rows = [row.strip("│ ") for row in shown(pane)[1:-1]]
        rows = rows[:rows.index("")]
        assert len(rows) == 4, "\n".join(rows)  # the no-GPU note, the host, two workers: one row each
        workers = [row for row in rows if row.startswith("reg-")]
        assert [w.split()[0] for w in workers] == ["reg-0", "reg-1"]
        assert all("CPU  98%" in w for w in workers), "\n".join(rows)
        if width == WIDE:  # room for everything: pid and RSS beside the name, in short units
            assert all("pid 1000" in w and w.endswith("RSS 348M") for w in workers), "\n".join(rows)
            assert "RAM 12.0/64.0 GiB" in rows[1]


# Regression: at 80x24 the pane showed the GPU and host rows and cut the workers' rows off at its bottom
# with no sign, and could not be scrolled to them.
async def test_rows_that_do_not_fit_scroll_and_the_border_says_which_are_shown():
    app = pane_app(f"PipelineTable {{ height: 3; }} DevicePane {{ width: {NARROW}; height: 10; }}")
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(DevicePane)
        pane.show(snapshot(gpus=8, workers=6))  # 8 GPUs, the host, 6 workers: 15 rows in 8
        await pilot.pause()
        assert pane.border_subtitle == "rows 1-8 of 15 ↑↓"
        assert not any("reg-5" in row for row in shown(pane))
        await pilot.press("tab")  # from the table, as in the dashboard
        assert pane.has_focus
        await pilot.press("end")
        assert pane.border_subtitle == "rows 8-15 of 15 ↑↓"
        rows = shown(pane)
        assert rows[-2].startswith("│  reg-5 ") and "CPU  98%" in rows[-2], "\n".join(rows)
        await pilot.press("up", "pageup")
        assert pane.border_subtitle == "rows 1-8 of 15 ↑↓"
        await pilot.press("tab")  # the mouse wheel scrolls it without focus (Pilot has no public wheel)
        await pilot._post_mouse_events([events.MouseScrollDown], pane, offset=(4, 4))
        assert pane.border_subtitle == "rows 2-9 of 15 ↑↓"
        pane.show(snapshot(gpus=1, workers=2))  # everything fits again: nothing to say
        await pilot.pause()
        assert pane.border_subtitle == "" and shown(pane)[1].startswith("│ GPU0 ")


async def test_a_pipeline_that_finished_leaves_the_pane_whatever_reading_comes_after():
    # Regression: a finished pipeline kept its last reading ("CPU 58% RSS 392M", or "RSS 0M" as it ended) until
    # the run was closed: the last snapshot before the run's end still held its worker.
    from torchherd.engine.protocol import messages as m
    from torchherd.tui.runstate import RunState
    from torchherd.tui.widgets.device_pane import describe

    state = RunState()
    state.apply(m.RunStarted(run_id="r", run_dir="/tmp/r", config_path="c.toml", pipelines=("reg-0", "reg-1")))
    state.apply(snapshot(gpus=0, workers=2))
    assert "reg-0" in describe(state.telemetry).plain and "reg-1" in describe(state.telemetry).plain
    seen = state.telemetry_version
    state.apply(m.PipelineFinished(pipeline="reg-0", status="completed", reason="epochs done"))
    assert "reg-0" not in describe(state.telemetry).plain and "reg-1" in describe(state.telemetry).plain
    assert state.telemetry_version > seen  # the pane redraws
    state.apply(snapshot(gpus=0, workers=2))  # a pass that raced the finish
    assert [p.pipeline for p in state.telemetry.processes] == ["reg-1"]
    assert state.telemetry.host_cpu_percent == 45.0  # the rest of the reading stands


async def test_once_the_run_has_finished_no_process_is_shown_the_validator_included():
    # Regression: after the run finished the pane still read "(validator) pid 6046 CPU 19% RSS 323M".
    import dataclasses

    from torchherd.engine.protocol import messages as m
    from torchherd.engine.supervise.telemetry_feed import VALIDATOR
    from torchherd.tui.runstate import RunState
    from torchherd.tui.widgets.device_pane import describe

    reading = snapshot(gpus=0, workers=1)
    reading = dataclasses.replace(reading, processes=(*reading.processes, t.ProcessSample(
        pipeline=VALIDATOR, pid=20000, cpu_percent=19.0, rss=int(0.3 * GIB), children=0, gpu_memory=None)))
    state = RunState()
    state.apply(m.RunStarted(run_id="r", run_dir="/tmp/r", config_path="c.toml", pipelines=("reg-0",)))
    state.apply(reading)
    state.apply(m.PipelineFinished(pipeline="reg-0", status="completed", reason="epochs done"))
    assert [p.pipeline for p in state.telemetry.processes] == [VALIDATOR]  # it scores the last snapshots
    state.apply(m.RunFinished(statuses={"reg-0": "completed"}, ok=True))
    assert state.telemetry.processes == () and "(validator)" not in describe(state.telemetry).plain
    state.apply(reading)  # a pass that raced the end
    assert state.telemetry.processes == () and state.telemetry.host_cpu_percent == 45.0


async def test_a_run_that_ended_with_no_reading_says_so_rather_than_waiting():
    # Regression: a past run opened in the app read "waiting for telemetry…" for ever.
    from torchherd.engine.protocol import messages as m
    from torchherd.tui.runstate import RunState
    from torchherd.tui.widgets.device_pane import describe

    state = RunState()
    state.apply(m.RunStarted(run_id="r", run_dir="/tmp/r", config_path="c.toml", pipelines=("reg-0",)))
    assert describe(state.telemetry, ended=state.finished).plain == "waiting for telemetry…"
    seen = state.telemetry_version
    state.apply(m.PipelineFinished(pipeline="reg-0", status="completed", reason="epochs done"))
    state.apply(m.RunFinished(statuses={"reg-0": "completed"}, ok=True))
    assert state.telemetry_version > seen  # the pane redraws
    assert describe(state.telemetry, ended=state.finished).plain == "no readings: the run has ended"
    seen = state.telemetry_version
    state.apply(m.PipelineQueued(pipeline="more", priority=0, position=0))  # added to the finished session
    assert state.telemetry_version > seen and not state.finished
    app = pane_app(f"DevicePane {{ width: {WIDE}; height: 10; }}")
    async with app.run_test(size=(120, 40)) as pilot:
        pane = app.query_one(DevicePane)
        pane.show(None, ended=True)
        await pilot.pause()
        assert shown(pane)[1].startswith("│ no readings: the run has ended"), shown(pane)


# Regression: the pane's own row scrolling was named `_scroll_to`, shadowing the Widget method every Textual
# scroll goes through (scroll_to, scroll_home, scroll_visible, a ScrollTo message): any of them called on the
# pane raised TypeError (unexpected keyword 'animate'). Found by the type checker (an incompatible override).
async def test_textuals_own_scrolling_still_works_on_the_pane():
    app = pane_app(f"PipelineTable {{ height: 3; }} DevicePane {{ width: {NARROW}; height: 10; }}")
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(DevicePane)
        pane.show(snapshot(gpus=8, workers=6))
        await pilot.pause()
        pane.scroll_home(animate=False, immediate=True)
        pane.scroll_to(y=0, animate=False, immediate=True)
        await pilot.pause()
        assert pane.border_subtitle == "rows 1-8 of 15 ↑↓"  # its own rows, untouched by Textual's scroll
