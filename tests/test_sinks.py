"""Sinks cost the run nothing: a sink of the user's own gets every event in order in a process of its own, and
what it prints stays in its log; its step reports are thinned as TensorBoard's are unless told otherwise; one that
raises is said once; one that blocks for ever neither holds the run's end nor its training (step reports past the
buffer are dropped, said once and counted). The real Supervisor over scripted workers; each sink a real host
process."""
from __future__ import annotations

import json
import time

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Notice, RunFinished, StepMetrics, TrainingStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.sinks import feed
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config
from tests.scripted import ScriptedLauncher, until


def steps(name: str, count: int, apart: float = 0.0) -> list:
    """`count` step reports; `apart`: seconds between their times (the worker's clock), else all at once."""
    t0 = time.time()
    return [TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=1, steps_per_epoch=count, device="cpu",
                            parameters=1)] + [StepMetrics(pipeline=name, epoch=0, step=i + 1, loss=1.0 / (i + 1),
                                                          **({"time": t0 + i * apart} if apart else {}))
                                              for i in range(count)]


async def run_with(tmp_path, sink: str, count: int = 20, apart: float = 0.0, **tracking) -> Supervisor:
    """A run of one scripted pipeline that reports `count` steps and completes, fed to sink `sink` of
    tests/tasks/sinks.py."""
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False},
                         tracking={"sinks": [f"{TASKS / 'sinks.py'}:{sink}"], **tracking})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 1)
    launcher.handles[0].exit(0, steps("a", count, apart))
    await until(lambda: sup.finished, timeout=120)
    await sup.shutdown()
    return sup


def notices(sup: Supervisor) -> list[str]:
    return [e.text for e in read_events(sup.run_dir) if isinstance(e, Notice) and "tracking" in e.text]


@pytest.mark.slow
async def test_a_sink_of_the_users_own_gets_every_event_in_order_and_its_prints_stay_in_its_log(tmp_path):
    sup = await run_with(tmp_path, "Recording", points_per_s=0)
    folder = sup.run_dir / "tracking"
    got = [json.loads(line) for line in (folder / "recorded.jsonl").read_text().splitlines()]
    assert [g["step"] for g in got if g["type"] == "step"] == list(range(1, 21))
    assert got[0]["type"] == "run_started" and got[-1]["type"] == "run_finished"
    assert (folder / "closed").read_text() == "yes"  # closed at the session's end
    assert "wrote" in (folder / "Recording.log").read_text()
    assert notices(sup) == []


@pytest.mark.slow
async def test_a_sink_that_raises_is_said_once_and_the_run_completes(tmp_path):
    sup = await run_with(tmp_path, "Raising")
    said = notices(sup)
    assert said == ["tracking (Raising): RuntimeError: the tracker's server said no"], said
    events = read_events(sup.run_dir)
    assert isinstance(events[-1], RunFinished) and events[-1].ok


@pytest.mark.slow
async def test_a_sink_that_blocks_for_ever_holds_up_neither_training_nor_the_runs_end(tmp_path, monkeypatch):
    monkeypatch.setattr(feed, "STALL", 1.0)  # (10 s in use: a tracker's slow write is not a stall)
    sup = await run_with(tmp_path, "Blocking", count=300, buffer=100, points_per_s=0)
    said = notices(sup)
    assert any("is 100 events behind: step reports are dropped" in s for s in said), said
    assert any("took no events for 1 s" in s for s in said), said
    dropped = [s for s in said if "step reports were dropped" in s]
    assert len(dropped) == 1 and int(dropped[0].split(": ")[1].split()[0]) >= 200, said
    events = read_events(sup.run_dir)
    assert [e.step for e in events if isinstance(e, StepMetrics)] == list(range(1, 301))  # the run lost nothing
    assert isinstance(events[-1], RunFinished) and events[-1].ok


@pytest.mark.slow
async def test_step_reports_faster_than_points_per_s_reach_a_sink_thinned_and_the_last_one_before_the_end(tmp_path):
    sup = await run_with(tmp_path, "Recording", count=100, apart=0.012)  # 83 reports a second; 20 go on
    got = [json.loads(line) for line in (sup.run_dir / "tracking" / "recorded.jsonl").read_text().splitlines()]
    sent = [g["step"] for g in got if g["type"] == "step"]
    assert sent == [*range(1, 100, 5), 100], sent  # one each 0.05 s of the worker's clock, and the newest at the end
    ends = [g["type"] for g in got if g["type"] in ("step", "pipeline_finished")]
    assert ends[-2:] == ["step", "pipeline_finished"]  # the held one goes before its pipeline's end
    assert len([e for e in read_events(sup.run_dir) if isinstance(e, StepMetrics)]) == 100  # the run kept all
