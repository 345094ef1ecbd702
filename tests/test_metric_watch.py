"""A [validation] metric the validation never reports is warned about once per pipeline, whatever the mode."""
from __future__ import annotations

import asyncio

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Notice, ValResult
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher, until


@pytest.mark.parametrize("mode", ["inline", "background"])
async def test_a_misspelled_metric_is_warned_about_once_in_either_mode(tmp_path, mode):
    # Regression: inline, `metric = "val_accuracy"` with a module that logs val_acc was silent: exit 0, no
    # best.ckpt, patience never fired (only the background validator said so).
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], telemetry={"enabled": False},
                         validation={"mode": "inline", "metric": "val_accuracy", "metric_mode": "max"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    a, b = launcher.handles
    results = [ValResult(pipeline="a", epoch=e, step=e, metrics={"val_loss": 0.5, "val_acc": 0.9}, mode=mode)
               for e in range(3)]
    a.exit(0, [*results])
    b.exit(0, [ValResult(pipeline="b", epoch=0, step=1, metrics={"val_accuracy": 0.9}, mode=mode)])
    await asyncio.wait_for(sup.wait(), 10)
    await sup.shutdown(graceful=False)
    said = [n for n in read_events(sup.run_dir) if isinstance(n, Notice) and "val_accuracy" in n.text]
    assert [(n.pipeline, n.level) for n in said] == [("a", "warning")]  # once, and not for b, which has it
    assert "reports val_acc, val_loss but not 'val_accuracy'" in said[0].text
