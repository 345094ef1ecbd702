"""The devices pane fed by the real telemetry sampler reading a fake NVIDIA driver (tests/nvml_fake)."""
from __future__ import annotations

import os

from textual.geometry import Region

from torchherd.engine.telemetry.sampler import TelemetrySampler
from torchherd.tui.widgets.device_pane import DevicePane, describe
from tests.nvml_fake import GPU_IS_LOST, FakeDriver, FakeGpu, GiB
from tests.tui.pilots import launch, settled, wait_for


def shown(widget) -> list[str]:
    """The lines of `widget` as the screen draws them, border included, clipped to what is on screen."""
    region = widget.screen.find_widget(widget).region  # clipped by its container
    lines = widget.render_lines(Region(0, 0, region.width, region.height))
    return [strip.text for strip in lines]


# Regression: at 80x24 each GPU's line wrapped over three rows of the 30-column pane, which showed GPU0 to
# GPU2 and cut the other five off without a sign.
async def test_the_devices_pane_shows_eight_gpus_at_80x24_and_one_that_is_lost(make_app, session,
                                                                              fake_nvml: FakeDriver):
    me = os.getpid()
    fake_nvml.gpus = [FakeGpu(memory_used=(10 + i) * GiB, util_gpu=10 * i, processes=[(me, 6 * GiB)])
                      for i in range(8)]
    fake_nvml.write()
    sampler = TelemetrySampler(pids=lambda: {"alpha": me}, in_container=False)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await launch(pilot, session)
        pane = app.screen.query_one(DevicePane)
        for lost in (None, 3):
            if lost is not None:
                fake_nvml.gpus[lost].fail = GPU_IS_LOST
                fake_nvml.write()
            snapshot = sampler.sample_once()
            session.show_telemetry(snapshot)
            state = app.bridge.state
            await wait_for(pilot, lambda: state.telemetry is not None and state.telemetry.gpus == snapshot.gpus and
                           app.screen.drawn_versions[2] == state.telemetry_version, what="telemetry drawn")
            await settled(pilot)
            rows = shown(pane)
            for i in range(8):
                row = next((r for r in rows if f" GPU{i} " in r), None)
                assert row is not None, "\n".join(rows)
                assert ("GPU is lost" in row) == (i == lost) and (f" {10 + i}/80G " in row) == (i != lost)
            assert any(r.startswith("│ host ") for r in rows), "\n".join(rows)
    sampler.stop()


# Regression: a GPU NVML could not open when sampling began (lost, no permission) was left out of the pane
# without a word, the pane showing the sampler's note only when there was no GPU at all.
def test_a_gpu_lost_before_sampling_began_is_named_in_the_pane(fake_nvml: FakeDriver):
    fake_nvml.gpus = [FakeGpu() for _ in range(3)]
    fake_nvml.gpus[1].fail = GPU_IS_LOST
    fake_nvml.write()
    sampler = TelemetrySampler(in_container=False)
    snapshot = sampler.sample_once()
    sampler.stop()
    assert [g.index for g in snapshot.gpus] == [0, 2]
    for width in (None, 26):
        text = describe(snapshot, width).plain
        assert "GPU0 " in text and "GPU2 " in text and "GPU 1 skipped" in text and "GPU is lost" in text
