"""Supervisor state machine driven by a scripted launcher: restarts, budgets, escalation, queueing."""
from __future__ import annotations

import signal

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Heartbeat, Pause, PipelineFinished, Unpause, Stop, TrainingStarted, \
    WorkerRestarting
from torchherd.engine.protocol.states import WorkerState
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher, until


def make(tmp_path, pipelines, launcher, **top):
    top.setdefault("telemetry", {"enabled": False})
    top.setdefault("validation", {"mode": "inline"})  # no validator process among the scripted handles
    config = make_config(tmp_path, pipelines, **top)
    return Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)


@pytest.fixture
def launcher():
    return ScriptedLauncher()


async def test_crashes_restart_with_backoff_until_the_budget_is_spent(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"max_restarts": 2, "backoff": 0.01, "min_uptime": 0.0})
    events = sup.subscribe()
    await sup.start()
    for attempt in range(3):
        await until(lambda: len(launcher.handles) == attempt + 1)
        # A crash after training a step (dying before it would be a failed start).
        launcher.handles[-1].exit(1, [TrainingStarted(pipeline="a", epoch=0, step=0, epochs_total=1,
                                                      steps_per_epoch=9, device="cpu", parameters=1),
                                      Heartbeat(pipeline="a", step=1)])
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.FAILED
    assert sup.view("a").restarts == 2 and len(launcher.handles) == 3
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    assert [e.restarts_left for e in seen if isinstance(e, WorkerRestarting)] == [1, 0]
    assert "budget of 2" in sup.view("a").last_error
    await sup.shutdown()


async def test_failed_starts_in_a_row_end_the_pipeline_early(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"max_restarts": 10, "backoff": 0.001, "min_uptime": 60.0, "max_failed_starts": 2})
    await sup.start()
    for attempt in range(2):
        await until(lambda: len(launcher.handles) == attempt + 1)
        launcher.handles[-1].code = 1
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.FAILED
    assert len(launcher.handles) == 2 and "2 failed starts in a row" in sup.view("a").last_error
    await sup.shutdown()


async def test_kill_escalates_to_sigkill_after_the_grace_period(tmp_path):
    launcher = ScriptedLauncher(ignore_term=True)
    sup = make(tmp_path, [{"name": "a"}], launcher, restart={"kill_grace": 0.05})
    await sup.start()
    await until(lambda: launcher.handles)
    sup.kill("a")
    assert sup.view("a").state == WorkerState.KILLING
    await until(lambda: sup.finished)
    assert launcher.handles[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert sup.view("a").state == WorkerState.KILLED
    await sup.shutdown()


async def test_restart_on_request_spends_no_budget(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher, restart={"max_restarts": 0})
    await sup.start()
    await until(lambda: launcher.handles)
    sup.restart("a")
    await until(lambda: len(launcher.handles) == 2)
    assert sup.view("a").attempt == 2 and sup.view("a").restarts == 0
    assert sup.view("a").state == WorkerState.STARTING
    launcher.handles[-1].code = 0
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.COMPLETED
    await sup.shutdown()


async def test_queued_pipeline_waits_for_a_slot_and_can_be_stopped_unstarted(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}, {"name": "b"}, {"name": "c", "priority": 2}], launcher,
               devices={"cpu_slots": 1})
    await sup.start()
    await until(lambda: launcher.handles)
    assert [v.state for v in sup.views()] == [WorkerState.QUEUED, WorkerState.QUEUED, WorkerState.STARTING]
    sup.stop("b")
    assert sup.view("b").state == WorkerState.STOPPED
    launcher.handles[0].code = 0  # c completes, a takes the slot
    await until(lambda: len(launcher.handles) == 2)
    assert sup.view("a").state == WorkerState.STARTING and sup.view("a").device.startswith("cpu0")
    launcher.handles[1].code = 0
    await until(lambda: sup.finished)
    assert {v.name: v.state.value for v in sup.views()} == {"a": "completed", "b": "stopped", "c": "completed"}
    await sup.shutdown()


async def test_pause_resume_and_checkpoint_refuse_a_pipeline_they_cannot_act_on(tmp_path, launcher):
    # Regression: `torchherd pause RUN medium` on a queued pipeline said "pause medium", exit 0, and medium
    # ran unpaused once it got a slot; a pause of a paused one took too, doing nothing.
    sup = make(tmp_path, [{"name": "a"}, {"name": "b"}], launcher, devices={"cpu_slots": 1})
    await sup.start()
    await until(lambda: launcher.handles)
    running = launcher.specs[0].child.name
    queued = ({"a", "b"} - {running}).pop()
    launcher.handles[0].started(running)
    for act, why in ((sup.pause, "it cannot be paused before it starts"),
                     (sup.checkpoint, "it cannot be checkpointed before it starts"),
                     (sup.unpause, "is queued, not paused: nothing to unpause")):
        with pytest.raises(ValueError, match=why):
            act(queued)
    with pytest.raises(ValueError, match="is running, not paused"):
        sup.unpause(running)
    sup.pause(running)
    with pytest.raises(ValueError, match=f"{running} is paused already"):
        sup.pause(running)
    assert [type(c) for c in launcher.handles[0].sent] == [Pause]  # only what took reached the worker
    assert sup.view(queued).state == WorkerState.QUEUED
    await sup.shutdown(graceful=False)


async def test_a_pipeline_restarted_after_it_ended_is_not_listed_as_ended(tmp_path, launcher):
    # Regression: `torchherd ls --json` said "wide": "stopped" while wide, restarted, trained on (try 2).
    from torchherd.engine.rundir.directory import summarize

    sup = make(tmp_path, [{"name": "a"}, {"name": "b"}], launcher)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    sup.stop("a")
    by_name = {spec.child.name: handle for spec, handle in zip(launcher.specs, launcher.handles)}
    by_name["a"].code = 10  # stopped after a checkpoint
    await until(lambda: sup.view("a").state == WorkerState.STOPPED)
    assert summarize(sup.run_dir).statuses == {"a": "stopped"}
    sup.restart("a")
    await until(lambda: len(launcher.handles) == 3)
    summary = summarize(sup.run_dir)
    assert summary.statuses == {} and summary.to_resume == ("a", "b")  # neither has ended
    await sup.shutdown(graceful=False)


async def test_a_pipeline_that_ran_and_waits_in_the_queue_again_ends_as_stopped_not_never_ran(tmp_path, launcher):
    # Regression: after a resume and a stop, the table read "medium never ran 1 15/300" for a pipeline that had
    # trained 15 epochs: queued again and stopped there, its reason was "stopped before it started".
    from torchherd.engine.protocol.states import ended_label

    sup = make(tmp_path, [{"name": "a"}, {"name": "b"}], launcher, devices={"cpu_slots": 1})
    events = sup.subscribe()
    await sup.start()
    await until(lambda: launcher.handles)
    first = launcher.specs[0].child.name
    other = ({"a", "b"} - {first}).pop()
    sup.stop(first)
    launcher.handles[0].code = 10  # stopped after a checkpoint; the other takes the slot
    await until(lambda: len(launcher.handles) == 2)
    sup.restart(first)  # queued again behind the other
    assert sup.view(first).state == WorkerState.QUEUED
    sup.stop(first)
    sup.kill(other)
    await until(lambda: sup.finished)
    ends = {}
    while (e := events.get_nowait()) is not None:
        if isinstance(e, PipelineFinished):
            ends[e.pipeline] = (e.status, e.reason)
    assert ends[first] == ("stopped", "stopped while queued")
    assert ended_label(*ends[first]) == "stopped"
    await sup.shutdown()


async def test_a_shutdown_that_kills_launches_nothing_into_the_slots_it_frees(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}, {"name": "b"}, {"name": "c"}], launcher, devices={"cpu_slots": 1})
    events = sup.subscribe()
    await sup.start()
    await until(lambda: launcher.handles)
    await sup.shutdown(graceful=False)
    # The running one is killed; the queued ones never start, though its slot came free while the session ended.
    assert len(launcher.handles) == 1 and launcher.handles[0].signals == [signal.SIGKILL]
    started = launcher.specs[0].child.name
    ends = {}
    while (e := events.get_nowait()) is not None:
        if isinstance(e, PipelineFinished):
            ends[e.pipeline] = (e.status, e.reason)
    assert {name: end for name, end in ends.items() if name != started} == \
        {name: ("killed", "session ended before it started") for name in "abc" if name != started}
    assert ends[started][0] == "killed"


async def test_pause_resume_and_stop_send_commands(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher)
    await sup.start()
    await until(lambda: launcher.handles)
    launcher.handles[0].started("a")
    assert sup.view("a").state == WorkerState.RUNNING
    sup.pause("a")
    assert sup.view("a").state == WorkerState.PAUSED
    sup.unpause("a")
    sup.stop("a")
    assert [type(c) for c in launcher.handles[0].sent] == [Pause, Unpause, Stop]
    assert sup.view("a").state == WorkerState.STOPPING
    launcher.handles[0].code = 10  # the worker's "stopped after a checkpoint"
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.STOPPED
    await sup.shutdown()


async def test_a_worker_that_completes_while_paused_is_completed(tmp_path, launcher):
    # Regression: a pause that reached the worker as it finished its last epoch left the pipeline
    # PAUSED for ever (PAUSED -> COMPLETED was refused), so wait() never returned.
    sup = make(tmp_path, [{"name": "a"}], launcher)
    await sup.start()
    await until(lambda: launcher.handles)
    launcher.handles[0].started("a")
    sup.pause("a")
    launcher.handles[0].code = 0
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.COMPLETED
    await sup.shutdown()


async def test_unknown_pipeline_name_is_a_key_error(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher)
    await sup.start()
    with pytest.raises(KeyError, match="no pipeline named 'zz'"):
        sup.kill("zz")
    await sup.shutdown(graceful=False)


async def test_a_silent_worker_is_declared_hung_dumped_killed_and_restarted(tmp_path, launcher):
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"hang_timeout": 0.05, "start_timeout": 0.1, "min_uptime": 0.0, "backoff": 0.01})
    await sup.start()
    await until(lambda: launcher.handles)
    launcher.handles[0].started("a")  # RUNNING, then silence (before its first step: start_timeout)
    await until(lambda: len(launcher.handles) == 2, timeout=10)
    first = launcher.handles[0]
    assert signal.SIGUSR1 in first.signals and signal.SIGTERM in first.signals
    assert first.signals.index(signal.SIGUSR1) < first.signals.index(signal.SIGTERM)
    assert sup.view("a").restarts == 1
    await sup.shutdown(graceful=False)


async def test_a_crash_on_a_full_gpu_says_so(tmp_path, launcher):
    from torchherd.engine.hardware.devices import GpuInfo
    from torchherd.engine.protocol.telemetry import GpuSample, TelemetrySnapshot

    gpu = GpuInfo(index=0, name="Fake GPU", uuid="GPU-0", memory_total=80 * 2**30)
    config = make_config(tmp_path, [{"name": "a"}], devices={"placement": [0]}, telemetry={"enabled": False},
                         restart={"max_restarts": 0}, validation={"mode": "inline"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(gpus=(gpu,), cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: launcher.handles)
    sup.on_telemetry(TelemetrySnapshot(gpus=(GpuSample(
        index=0, uuid="GPU-0", name="Fake GPU", util_gpu=100, util_mem=90, mem_used=79 * 2**30,
        mem_total=80 * 2**30, temperature=80, power_draw=300.0, power_limit=350.0, processes=()),),
        processes=(), host_cpu_percent=1.0, host_mem_used=1, host_mem_total=2, load1=0.1, sample_ms=1.0))
    launcher.handles[0].code = 1
    await until(lambda: sup.finished)
    assert "GPU 0 memory was full: 79.0 of 80.0 GiB used" in sup.view("a").last_error
    await sup.shutdown(graceful=False)


# Regression: a validator result that overtook the worker's snapshot_taken left the
# snapshot pending forever, so run_finished never came.
async def test_a_result_that_overtakes_its_hand_off_report_still_finishes_the_run(tmp_path, launcher):
    from torchherd.engine.protocol.messages import SnapshotTaken, ValResult

    config = make_config(tmp_path, [{"name": "a"}], validation={"mode": "background", "device": "cpu"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=4), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    validator, worker = launcher.handles
    worker.started("a")
    validator.on_events([ValResult(pipeline="a", epoch=0, step=8, metrics={"val_loss": 1.0}, mode="background",
                                   seq=2)])
    worker.on_events([SnapshotTaken(pipeline="a", seq=1, epoch=0, step=4, slot=0, stall_ms=0.1, nbytes=8),
                      SnapshotTaken(pipeline="a", seq=2, epoch=0, step=8, slot=1, stall_ms=0.1, nbytes=8)])
    worker.code = 0
    await until(lambda: sup.finished)
    validator.code = 0
    await sup.shutdown(graceful=False)


async def test_a_worker_stuck_building_its_task_is_declared_hung_too(tmp_path, launcher):
    # Regression: hang_timeout only watched RUNNING, so a task build stuck on a dead mount held its slot for ever.
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"hang_timeout": 0.02, "start_timeout": 0.05, "min_uptime": 0.0, "backoff": 0.01})
    await sup.start()
    await until(lambda: len(launcher.handles) == 2, timeout=10)  # never reported TrainingStarted
    assert signal.SIGUSR1 in launcher.handles[0].signals
    await sup.shutdown(graceful=False)


async def test_a_worker_asking_for_a_restart_is_not_a_failed_start(tmp_path, launcher):
    # Regression: exit code 12 (nan_policy "restart") was treated as a crash and counted as a failed start.
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"max_restarts": 5, "min_uptime": 60.0, "max_failed_starts": 1, "backoff": 0.01})
    await sup.start()
    await until(lambda: launcher.handles)
    launcher.handles[0].code = 12
    await until(lambda: len(launcher.handles) == 2)
    assert sup.view("a").restarts == 1 and sup.view("a").state == WorkerState.STARTING
    await sup.shutdown(graceful=False)


# Regression (found by scripts/soak.py): a restarted worker numbered its snapshots from its checkpoint,
# reusing seqs an earlier attempt had handed off; the validator ignored them and the run never finished.
async def test_a_restarted_worker_continues_the_snapshot_numbering(tmp_path, launcher):
    from torchherd.engine.protocol.messages import SnapshotTaken

    config = make_config(tmp_path, [{"name": "a"}], validation={"mode": "background", "device": "cpu"},
                         restart={"min_uptime": 0.0, "backoff": 0.01})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=4), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    worker = launcher.handles[1]
    worker.on_events([SnapshotTaken(pipeline="a", seq=7, epoch=3, step=70, slot=0, stall_ms=0.1, nbytes=8)])
    worker.code = -9
    await until(lambda: len(launcher.handles) == 3)
    assert launcher.specs[2].child.snapshot_seq == 7
    launcher.handles[0].code = 0
    await sup.shutdown(graceful=False)


# Regression (found by scripts/soak.py): stop() during a restart in progress was ignored, the worker
# came back and the run never finished.
async def test_stop_during_a_restart_ends_the_pipeline_stopped(tmp_path):
    launcher = ScriptedLauncher(ignore_term=True)
    sup = make(tmp_path, [{"name": "a"}], launcher, restart={"kill_grace": 30.0})
    await sup.start()
    await until(lambda: launcher.handles)
    sup.restart("a")
    assert sup.view("a").state == WorkerState.KILLING
    sup.stop("a")
    launcher.handles[0].code = -15
    await until(lambda: sup.finished)
    assert sup.view("a").state == WorkerState.STOPPED and len(launcher.handles) == 1
    await sup.shutdown(graceful=False)


# Regression: with the validator far behind (19 of 20 snapshots skipped) nothing said that patience and best.pt
# then mean little.
def test_a_validator_far_behind_is_said_once_with_what_would_help():
    from torchherd.engine.protocol.messages import SnapshotTaken
    from torchherd.engine.supervise.validation_service import SnapshotLedger, far_behind_text

    ledger = SnapshotLedger()
    for seq in range(1, 31):
        ledger.taken(SnapshotTaken(pipeline="a", seq=seq, epoch=0, step=seq, slot=0, stall_ms=0.1, nbytes=8))
    ledger.resolve(10)  # its first score, the 10th: 1-9 were handed off while it started, no lag of its
    ledger.resolve(20)  # the 20th: 11-19 overtaken
    assert not ledger.far_behind()  # 9 skipped since it started: too few to judge
    ledger.resolve(30)  # and the 30th: 21-29 overtaken
    assert ledger.far_behind() and ledger.skipped == 27
    assert far_behind_text(ledger).startswith("the validator scored 3 of 30 snapshots so far")
    ledger.said_behind = True
    assert not ledger.far_behind()
    # Regression: a Lightning pipeline was told of best.pt; its validator keeps best.ckpt.
    assert "best.pt is the best" in far_behind_text(ledger)
    ledger.best_file = "best.ckpt"
    assert "best.ckpt is the best" in far_behind_text(ledger)


async def test_a_gang_whose_rank_was_killed_leads_with_that_rank_and_its_peers_echo_after(tmp_path, launcher):
    # Regression: headless printed rank 0's 40-line gloo "Connection reset by peer" traceback first, then
    # "worker pid 988 crashed (signal SIGKILL)": the root cause came second.
    from torchherd.engine.protocol.messages import Notice, WorkerError, WorkerExited
    from torchherd.engine.rundir.directory import read_events

    sup = make(tmp_path, [{"name": "g", "ranks": 2}], launcher, restart={"max_restarts": 0})
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    r0, r1 = launcher.handles
    r0.on_events([WorkerError(pipeline="g", error="RuntimeError: Connection reset by peer", where="train",
                              traceback="Traceback (most recent call last):\n" + "  frame\n" * 40)])
    r1.exit(-signal.SIGKILL)
    r0.exit(1)
    await until(lambda: sup.finished)
    await sup.shutdown(graceful=False)
    told = [e for e in read_events(sup.run_dir) if isinstance(e, (WorkerError, WorkerExited, Notice))
            and getattr(e, "pipeline", "") == "g"]
    exited = [i for i, e in enumerate(told) if isinstance(e, WorkerExited)][0]
    assert told[exited].rank == 1 and told[exited].signal == "SIGKILL"
    assert not any(isinstance(e, WorkerError) for e in told)  # rank 0's traceback is its echo, not the cause
    echo = [e for e in told[exited:] if isinstance(e, Notice) and "rank 0 failed after rank 1" in e.text]
    assert len(echo) == 1 and "Connection reset by peer" in echo[0].text


async def test_no_validator_is_started_for_script_pipelines_it_would_have_nothing_to_score(tmp_path, launcher):
    # Regression: a script pipeline without `validate` (validation left to auto) still started the validator
    # process (222 MiB in the devices pane) for nothing.
    from torchherd.engine.protocol.spec import ValidatorSpec
    from tests.conftest import TASKS

    script = str(TASKS / "scripts" / "plain_loop.py")
    sup = make(tmp_path / "one", [{"name": "s", "script": script}], launcher,
               validation={"mode": "background", "device": "cpu"})
    await sup.start()
    await until(lambda: len(launcher.specs) >= 1)
    assert not any(isinstance(s.child, ValidatorSpec) for s in launcher.specs)
    # a config with something to score, added to the session, starts it
    more = make_config(tmp_path / "two", [{"name": "t"}], validation={"mode": "background", "device": "cpu"})
    sup.add_config(more)
    await until(lambda: any(isinstance(s.child, ValidatorSpec) for s in launcher.specs))
    await sup.shutdown(graceful=False)


async def test_a_lightning_pipelines_snapshot_ledger_names_best_ckpt(tmp_path, launcher):
    # Regression: the far-behind warning told a Lightning user of best.pt; Lightning's is best.ckpt.
    from tests.conftest import TASKS

    sup = make(tmp_path, [{"name": "lit", "task": f"lightning:{TASKS / 'lit_tiny.py'}:LitTiny"}, {"name": "t"}],
               launcher, validation={"mode": "background", "device": "cpu"})
    await sup.start()
    await until(lambda: {"lit", "t"} <= set(sup._validation.ledgers))
    assert sup._validation.ledger("lit").best_file == "best.ckpt"
    assert sup._validation.ledger("t").best_file == "best.pt"
    await sup.shutdown(graceful=False)


async def test_promote_unprunes_a_pruned_trial_exempts_a_running_one_and_refuses_an_ended_one(tmp_path, launcher):
    from torchherd.engine.protocol.messages import ValResult

    sweep = {"space": {"params": {"lr": [0.1, 0.0]}}, "scheduler": "asha", "mode": "stop", "grace_period": 1}
    sup = make(tmp_path, [{"name": "t"}], launcher, defaults={"max_epochs": 4}, sweep=sweep)
    fast, still = "t-lr0.1", "t-lr0"
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    for handle, name, loss in zip(launcher.handles, (fast, still), (0.1, 9.0)):
        handle.on_events([TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=4, steps_per_epoch=10,
                                          device="cpu", parameters=1),
                          ValResult(pipeline=name, epoch=0, step=10, metrics={"val_loss": loss})])
    await until(lambda: sup.view(still).state == WorkerState.STOPPING)  # cut at rung 1 by the fast one
    launcher.handles[1].exit(10)  # it checkpoints and exits, as told
    await until(lambda: sup.view(still).state == WorkerState.PRUNED)

    sup.promote(still)
    assert still in sup.sweep.exempt
    await until(lambda: len(launcher.handles) == 3)  # back in the queue, and started again at once
    sup.promote(fast)  # still running: it is only exempt from now on, nothing restarts
    assert fast in sup.sweep.exempt and sup.view(fast).state == WorkerState.RUNNING
    assert launcher.handles[0].signals == []
    launcher.handles[0].exit(0)
    await until(lambda: sup.view(fast).state == WorkerState.COMPLETED)
    with pytest.raises(ValueError, match="completed, not pruned"):
        sup.promote(fast)
    with pytest.raises(KeyError):
        sup.promote("nosuch")
    await sup.shutdown(graceful=False)

    plain = make(tmp_path, [{"name": "a"}], ScriptedLauncher())
    await plain.start()
    with pytest.raises(ValueError, match="prunes nothing"):
        plain.promote("a")
    await plain.shutdown(graceful=False)


async def test_a_workers_batch_reaches_the_files_taps_and_subscribers_in_the_order_it_was_sent(tmp_path, launcher):
    # Step reports are published a run at a time (publish_steps): everything else between them keeps its place.
    from torchherd.engine.protocol.messages import EpochEnd, StepMetrics
    from torchherd.engine.rundir.directory import read_records

    sup = make(tmp_path, [{"name": "a"}], launcher)
    events, tapped = sup.subscribe(replay=False), []
    sup.tap(lambda event, line, kept: tapped.append((type(event).__name__, getattr(event, "step", None), line)))
    await sup.start()
    await until(lambda: len(launcher.handles) == 1)

    def step(i):
        return StepMetrics(pipeline="a", epoch=0, step=i, loss=1.0 / i, lr=0.1, samples_per_s=10.0)
    batch = [TrainingStarted(pipeline="a", epoch=0, step=0, epochs_total=1, steps_per_epoch=4, device="cpu",
                             parameters=1), step(1), step(2), Heartbeat(pipeline="a", step=2), step(3),
             EpochEnd(pipeline="a", epoch=0, step=3, train_loss=0.5, duration=1.0, samples_per_s=10.0,
                      epochs_total=1, steps_per_epoch=4), step(4), step(5)]
    launcher.handles[0].on_events(batch)
    sent = [(type(e).__name__, e.step) for e in batch if not isinstance(e, Heartbeat)]
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    assert [(type(e).__name__, e.step) for e in seen if hasattr(e, "step")] == sent
    assert [(name, step) for name, step, _ in tapped if step is not None] == sent
    sup._opened.rundir.flush()
    written = read_records(sup.run_dir / "events.jsonl")
    assert [(r["type"], r.get("step")) for r in written if "step" in r] == [
        ("training_started", 0), ("step", 1), ("step", 2), ("step", 3), ("epoch_end", 3), ("step", 4), ("step", 5)]
    assert [r["step"] for r in read_records(sup.run_dir / "a" / "metrics.jsonl")] == [1, 2, 3, 3, 4, 5]
    assert b"".join(line for _, step, line in tapped if step is not None) in (sup.run_dir / "events.jsonl").read_bytes()
    assert sup.view("a").step == 5 and sup.view("a").train_loss == pytest.approx(0.2)  # the newest step report
    launcher.handles[0].exit(0)
    await until(lambda: sup.finished)
    await sup.shutdown()


def test_an_attempt_has_stepped_once_a_step_report_passes_the_step_it_resumed_at():
    from torchherd.engine.protocol.messages import StepMetrics
    from torchherd.engine.supervise.pipeline import Attempt

    def steps(*numbers):
        return [StepMetrics(pipeline="a", epoch=0, step=n, loss=1.0, lr=0.1, samples_per_s=1.0) for n in numbers]
    attempt = Attempt(number=2)
    attempt.saw_steps(steps(1, 2))  # before its TrainingStarted: nothing to compare with
    attempt.saw(TrainingStarted(pipeline="a", epoch=1, step=40, epochs_total=2, steps_per_epoch=40, device="cpu",
                                parameters=1))
    attempt.saw_steps(steps(39, 40))  # replayed up to where it resumed: no step of its own yet
    assert not attempt.stepped
    attempt.saw_steps(steps(40, 41, 42))
    assert attempt.stepped
    attempt.saw_steps(steps(40))  # stays stepped
    assert attempt.stepped


async def test_the_validators_news_is_kept_again_once_a_finished_run_has_work_again(tmp_path, launcher):
    # Regression guard: the publisher drops the validator's news once run_finished is written (readers take it to
    # be the last event); a pipeline restarted after that must have its results kept again.
    from torchherd.engine.protocol.messages import ValResult
    from torchherd.engine.rundir.directory import read_events

    sup = make(tmp_path, [{"name": "a"}], launcher)
    await sup.start()
    try:
        await until(lambda: len(launcher.handles) == 1)
        launcher.handles[0].exit(0)  # completed
        await until(lambda: sup.finished)
        sup._publish.validation(ValResult(pipeline="a", epoch=0, step=1, metrics={"val_loss": 9.0}))  # too late
        sup.restart("a")
        await until(lambda: len(launcher.handles) == 2)
        sup._publish.validation(ValResult(pipeline="a", epoch=0, step=2, metrics={"val_loss": 0.5}))
    finally:
        await sup.shutdown(graceful=False)
    kept = [e.metrics["val_loss"] for e in read_events(sup.run_dir) if isinstance(e, ValResult)]
    assert kept == [0.5]
