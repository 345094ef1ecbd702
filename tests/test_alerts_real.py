"""Alerts from a real run: a loss that turns NaN under nan_policy "warn" raises one `alert` (not one per
report), an out-of-memory crash one, and each runs the configured command once, argv with its placeholders
filled, its output in alerts.log."""
from __future__ import annotations

import asyncio
import sys

import pytest

from torchherd.engine.protocol.health import Alert
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.faults.support import faulty_config, finish, poll_until, supervised

pytestmark = pytest.mark.slow

WRITE = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '|' + sys.argv[3] + '\\n'); print('told')"


async def test_a_nan_loss_and_an_oom_crash_are_one_alert_each_and_one_run_of_the_command_each(tmp_path):
    told = tmp_path / "told.txt"
    cfg = faulty_config(tmp_path, [
        {"name": "a", "nan_policy": "warn", "params": {"samples": 256, "fault": "nan", "fault_at_call": 3}},
        {"name": "b", "params": {"samples": 256, "fault": "oom", "fault_at_call": 3,
                                 "once_file": str(tmp_path / "oom-once")}}],
        defaults={"max_epochs": 2}, validation={"mode": "off"}, restart={"min_uptime": 0.0},
        alerts={"command": [sys.executable, "-c", WRITE, str(told), "{rule}", "{title}"]})
    sup = Supervisor(cfg)
    async with supervised(sup):
        assert await finish(sup) == {"a": "completed", "b": "completed"}  # b restarted after its OOM
    alerts = [e for e in read_events(sup.run_dir) if isinstance(e, Alert)]
    # every report of a is NaN, and b's error and its exit both say out of memory: one alert each
    assert sorted((a.rule, a.pipeline, a.count) for a in alerts) == [("nan", "a", 1), ("oom", "b", 1)]
    await asyncio.to_thread(poll_until, lambda: told.exists() and len(told.read_text().splitlines()) == 2, 30,
                            "the alert command's two lines")
    assert sorted(told.read_text().splitlines()) == ["nan|a: loss is not finite", "oom|b: out of memory"]
    assert (sup.run_dir / "alerts.log").read_text().splitlines().count("told") == 2  # the commands' output
