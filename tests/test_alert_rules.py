"""The logic under alerts, stragglers and triage, without processes: the rules and their rate limit, the
straggler rule over rank reports, and the verdict read from faulthandler's dumps."""
from __future__ import annotations

import math
import random
import re

import pytest

from torchherd.engine.config.alerts import AlertsConfig
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.protocol.health import RankPace, Straggler
from torchherd.engine.protocol.messages import Notice, Stalled, StepMetrics, WorkerError, WorkerExited
from torchherd.engine.supervise.health.alert_rules import AlertRules, robust_z
from torchherd.engine.supervise.health.stragglers import GangPace
from torchherd.engine.supervise.health.triage import Place, read_places, verdict
from tests.conftest import make_config


def step(loss: float, n: int, t: float = 0.0) -> StepMetrics:
    return StepMetrics(pipeline="a", epoch=0, step=n, loss=loss, time=t)


def rules(**kw) -> AlertRules:
    return AlertRules(AlertsConfig(**kw))


def test_a_loss_that_jumps_and_stays_up_is_one_alert_and_noise_is_none():
    r = rules(spike=10.0, interval=0.0)
    noisy = [1.0 - 0.001 * i + (0.02 if i % 2 else -0.02) for i in range(40)]
    assert [a for i, loss in enumerate(noisy) for a in r.take(step(loss, i))] == []
    assert r.take(step(5.0, 41)) == [] and r.take(step(4.0, 42)) == []  # up, and still up: not yet
    [alert] = r.take(step(6.0, 43))  # the third report in a row up there: a spike
    assert alert.rule == "spike" and alert.pipeline == "a" and "loss 5 at step 41" in alert.message
    assert "to step 43" in alert.message
    assert [a for i in range(44, 80) for a in r.take(step(5.0, i))] == []  # it stays up: still the one alert


def test_one_outlier_batch_is_no_spike_however_far_out_and_is_one_with_spike_persist_1():
    """The same hard batch every 30 reports, 100 times the loss: healthy, so no alert (each alerted before)."""
    losses = [(100.0 if i % 30 == 29 else 1.0) * (0.5 + 0.5 / (1 + i / 50)) * (1.01 if i % 2 else 0.99)
              for i in range(300)]
    quiet, loud = rules(interval=0.0), rules(interval=0.0, spike_persist=1)
    assert [a for i, loss in enumerate(losses) for a in quiet.take(step(loss, i))] == []
    assert len([a for i, loss in enumerate(losses) for a in loud.take(step(loss, i))]) == 10
    # Two hard batches in a row: still under spike_persist; a third would be a spike.
    r = rules(interval=0.0)
    assert [a for i in range(30) for a in r.take(step(1.0 + 0.01 * (i % 3), i))] == []
    assert r.take(step(50.0, 30)) == [] and r.take(step(50.0, 31)) == [] and r.take(step(1.0, 32)) == []
    assert r.take(step(50.0, 33)) == [] and r.take(step(50.0, 34)) == [] and r.take(step(1.01, 35)) == []


def test_a_robust_z_score_ignores_one_outlier_in_the_window():
    assert robust_z(1.1, [1.0, 1.1, 0.9, 1.0, 50.0]) < 2


def expected_spikes(losses: list[float], size: int, spike: float, persist: int) -> list[int]:
    """The rule's meaning, written plainly: robust_z on every report, a rise that must last `persist` reports."""
    from torchherd.engine.supervise.health.alert_rules import spread

    window: list[float] = []
    rise: list[float] | None = None  # [level, reports]
    found = []
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            continue
        if rise is not None and not loss >= rise[0]:
            rise = None
        if rise is not None:
            rise[1] += 1
        elif len(window) >= 10 and robust_z(loss, window[-size:]) >= spike:
            median, scale = spread(window[-size:])
            rise = [median + spike * scale, 1]
        if rise is not None and rise[1] == persist:
            found.append(i)
        window.append(loss)
    return found


def test_the_spike_rule_over_a_batch_alerts_where_robust_z_on_every_report_would():
    """take_steps rules most reports out from the sorted window without robust_z: never one robust_z flags."""
    rng = random.Random(7)
    for trial in range(300):
        size, spike, persist = rng.choice([10, 11, 50]), rng.choice([1.0, 3.0, 10.0]), rng.choice([1, 2, 3])
        losses = [rng.choice([0.5, 0.5, 1.0, 0.0, -0.0, 1.0 + 2 ** -52, rng.gauss(1, 0.1), rng.expovariate(0.1),
                              math.nan, math.inf]) for _ in range(rng.randrange(10, 120))]
        r = rules(spike=spike, spike_window=size, spike_persist=persist, interval=0.0)
        batch = [step(loss, i, t=float(i)) for i, loss in enumerate(losses)]
        half = rng.randrange(len(batch))
        got = r.take_steps(batch[:half]) + r.take_steps(batch[half:])
        steps = [int(re.findall(r"step (\d+)", a.message)[-1]) for a in got]
        assert steps == expected_spikes(losses, size, spike, persist), trial


def test_nan_stall_straggler_and_oom_each_raise_their_rule():
    r = rules()
    seen = [a.rule for ev in (
        Notice(pipeline="a", level="warning", text="training loss is nan at epoch 0 step 3 (step report)"),
        Stalled(pipeline="b", quiet=61.0), Stalled(pipeline="b", quiet=0.0),
        Straggler(pipeline="c", rank=1, ratio=1.6, median=0.1, slowest=0.16),
        Straggler(pipeline="c", rank=1, ratio=0.0, median=0.1, slowest=0.1),
        WorkerExited(pipeline="d", pid=1, attempt=1, exit_code=1, error="CUDA out of memory: tried to allocate"),
        WorkerError(pipeline="e", error="NonFiniteLoss: training loss is inf", where="train"))
        for a in r.take(ev)]
    assert seen == ["nan", "stall", "straggler", "oom", "nan"]


def test_one_alert_per_rule_and_pipeline_per_interval_then_a_count():
    r = rules(interval=60.0)
    first = r.take(Stalled(pipeline="a", quiet=5.0, time=100.0))
    assert len(first) == 1 and first[0].count == 1
    assert r.take(Stalled(pipeline="a", quiet=5.0, time=120.0)) == []
    assert len(r.take(Stalled(pipeline="b", quiet=5.0, time=121.0))) == 1  # another pipeline: its own limit
    [later] = r.take(Stalled(pipeline="a", quiet=5.0, time=170.0))
    assert later.count == 2 and "2 times" in later.message


def test_the_disk_rule_fires_under_its_share_free_and_never_when_off():
    assert rules(disk_free=0.05).disk(4 << 30, 100 << 30, "/runs", 0.0)[0].rule == "disk"
    assert rules(disk_free=0.05).disk(6 << 30, 100 << 30, "/runs", 0.0) == []
    assert rules(disk_free=0.0).disk(0, 100 << 30, "/runs", 0.0) == []


def test_the_bell_setting_travels_with_each_alert():
    assert rules(bell=False).take(Stalled(pipeline="a", quiet=5.0))[0].bell is False


def pace(rank: int, seconds: float) -> RankPace:
    return RankPace(pipeline="g", rank=rank, step=1, step_time=seconds)


def test_a_rank_consistently_slower_is_flagged_once_and_cleared_once():
    gang = GangPace(world=2, ratio=1.5)
    out = []
    for _ in range(4):
        out += [gang.take(pace(0, 0.010)), gang.take(pace(1, 0.050))]
    flagged = [e for e in out if e is not None]
    assert len(flagged) == 1 and flagged[0].rank == 1 and flagged[0].ratio == pytest.approx(5.0)
    out = []
    for _ in range(4):
        out += [gang.take(pace(0, 0.010)), gang.take(pace(1, 0.011))]
    cleared = [e for e in out if e is not None]
    assert len(cleared) == 1 and cleared[0].ratio == 0


def test_one_slow_window_or_a_tiny_absolute_gap_is_no_straggler():
    gang = GangPace(world=2, ratio=1.5)
    out = [gang.take(pace(0, 0.010)), gang.take(pace(1, 0.050)), gang.take(pace(0, 0.010)), gang.take(pace(1, 0.010))]
    out += [gang.take(pace(r, t)) for _ in range(5) for r, t in ((0, 0.0001), (1, 0.0005))]  # 5x, 0.4 ms
    assert [e for e in out if e is not None] == []


# Regression (issue 52): on 2 cores a CPU gang's ranks were flagged as stragglers again and again because the
# validator shared their cores; telemetry showed every core busy.
async def test_a_cpu_gangs_rank_slowed_while_every_core_is_busy_is_no_straggler(tmp_path):
    from torchherd.engine.protocol.messages import WorkerStarted
    from torchherd.engine.protocol.telemetry import TelemetrySnapshot
    from torchherd.engine.supervise.health.watch import HealthWatch
    from tests.scripted import PolicySession

    session = PolicySession(make_config(tmp_path, [{"name": "g", "ranks": 2}]), tmp_path)
    watch = HealthWatch(session.view, session.out)
    watch.on_event(WorkerStarted(pipeline="g", pid=1, device="cpu0 + cpu1", attempt=1, pids=(1, 2)))

    def slow_reports(host_cpu_percent: float) -> list:
        watch.on_event(TelemetrySnapshot(host_cpu_percent=host_cpu_percent, load1=0.5))
        for _ in range(4):
            watch.on_event(pace(0, 0.010))
            watch.on_event(pace(1, 0.050))
        return [e for e in session.recorded if isinstance(e, Straggler)]

    assert slow_reports(100.0) == []  # a neighbour's load: not the rank's
    assert [e.rank for e in slow_reports(20.0)] == [1]  # the cores have room: the rank itself is slow


DUMP0 = '''Thread 0x00007f5f79afe6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f5f7d5feb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2500 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/train.py", line 30 in <module>
'''
DUMP1 = '''Current thread 0x00007f3c5ce9ab80 (most recent call first):
  File "/home/me/train.py", line 28 in <module>
'''


def test_the_verdict_names_the_rank_outside_the_collective_first():
    places = read_places([DUMP0, DUMP1])
    assert places[0] == Place(True, "all_reduce") and not places[1].waiting
    # train.py is not on this machine: no source line to show, so the function and where it is
    assert verdict(places) == "rank 1 is in <module> (train.py:28); rank 0 waits in all_reduce"


def test_the_verdict_says_when_every_rank_waits_alike_and_which_stacks_are_missing():
    assert verdict([Place(True, "barrier")] * 3) == "every rank waits in barrier"
    assert verdict([Place(True, "barrier"), None]) == "rank 0 waits in barrier; rank 1: no stack found"


def test_alert_keys_are_checked_naming_the_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, [{"name": "a"}], alerts={"command": ["notify-send", "{titel}"]})
    assert "alerts.command" in str(err.value) and "{titel}" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, [{"name": "a"}], alerts={"straggler": 0.9})
    assert "alerts.straggler" in str(err.value)


def snapshot(util: int | None, t: float, owner: str = "a"):
    from torchherd.engine.protocol.telemetry import GpuProcess, GpuSample, TelemetrySnapshot

    gpu = GpuSample(index=0, uuid="GPU-0", name="fake", util_gpu=util, processes=(GpuProcess(pid=11, used_memory=1 << 30, owner=owner),))
    return TelemetrySnapshot(gpus=(gpu,), time=t)


def test_a_running_pipelines_idle_gpu_is_one_alert_after_its_minutes_and_busy_again_resets_it():
    r = rules(idle_gpu=5.0, idle_minutes=10.0)
    assert r.idle(snapshot(2, 0.0)) == [] and r.idle(snapshot(2, 599.0)) == []
    [alert] = r.idle(snapshot(0, 600.0))
    assert alert.rule == "idle" and alert.pipeline == "a" and "0% of the time for 10.0 min" in alert.message
    assert r.idle(snapshot(0, 700.0)) == []  # one per interval
    r = rules(idle_gpu=5.0, idle_minutes=10.0)
    assert r.idle(snapshot(0, 0.0)) == [] and r.idle(snapshot(50, 300.0)) == [] and r.idle(snapshot(0, 400.0)) == []
    assert r.idle(snapshot(0, 900.0)) == []  # idle again only since 400 s
    assert rules(idle_gpu=5.0, idle_minutes=0).idle(snapshot(0, 0.0), paused=frozenset({"a"})) == []
    assert rules(idle_gpu=0).idle(snapshot(0, 1e6)) == []  # off
    assert rules(idle_minutes=0).idle(snapshot(None, 0.0)) == []  # no reading is no idle
    assert rules(idle_minutes=0).idle(snapshot(0, 0.0, owner="other")) == []  # someone else's process


def test_a_validator_that_falls_behind_is_one_alert_and_a_background_score_resets_the_count():
    from torchherd.engine.protocol.messages import SnapshotTaken, ValResult

    def taken(seq: int) -> SnapshotTaken:
        return SnapshotTaken(pipeline="a", seq=seq, epoch=0, step=10 * seq, slot=0, stall_ms=1.0, nbytes=1, time=float(seq))

    r = rules(validator_behind=3)
    r.take(ValResult(pipeline="a", epoch=0, step=0, metrics={}, mode="background"))  # the validator is up
    assert r.take(taken(1)) == [] and r.take(taken(2)) == []
    [alert] = r.take(taken(3))
    assert alert.rule == "validator" and "3 snapshots handed off" in alert.message
    assert r.take(taken(4)) == []  # one per interval
    r = rules(validator_behind=3)
    for seq in range(1, 10):  # a score after every second snapshot: never behind
        assert r.take(taken(seq)) == []
        if seq % 2 == 0:
            assert r.take(ValResult(pipeline="a", epoch=0, step=10 * seq, metrics={}, mode="background")) == []
    assert rules(validator_behind=0).take(taken(99)) == []


def test_snapshots_handed_off_while_the_validator_starts_are_no_lag_until_its_grace_has_passed():
    from torchherd.engine.protocol.messages import SnapshotTaken
    from torchherd.engine.supervise.health.alert_rules import STARTUP_GRACE

    def taken(seq: int, at: float) -> SnapshotTaken:
        return SnapshotTaken(pipeline="a", seq=seq, epoch=seq, step=seq, slot=0, stall_ms=1.0, nbytes=1, time=at)

    r = rules(validator_behind=3)
    # Epochs of a tenth of a second on a GPU: ten snapshots before the validator has imported torch.
    assert [r.take(taken(seq, 100.0 + seq / 10)) for seq in range(1, 11)] == [[]] * 10
    [alert] = r.take(taken(11, 100.1 + STARTUP_GRACE))  # never scored a minute on: that is lag
    assert alert.rule == "validator" and "11 snapshots handed off" in alert.message


def test_an_alert_is_text_in_its_pipelines_tensorboard_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchherd.engine.protocol.health import Alert
    from torchherd.engine.rundir.tensorboard import TensorBoardExport

    export = TensorBoardExport(tmp_path / "tb", make_config(tmp_path, [{"name": "a"}]))
    export.on_event(step(0.5, 7))
    export.on_event(Alert(pipeline="a", rule="spike", title="a: loss spike", message="loss 9 at step 7"))
    export.close()
    acc = EventAccumulator(str(tmp_path / "tb" / "a"), size_guidance={"tensors": 0})
    acc.Reload()
    [tag] = [t for t in acc.Tags()["tensors"] if t.startswith("alerts/spike")]
    [written] = acc.Tensors(tag)
    assert written.step == 7 and written.tensor_proto.string_val == [b"a: loss spike: loss 9 at step 7"]
