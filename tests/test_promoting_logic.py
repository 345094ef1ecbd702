"""Promoting ASHA in a session driven by a scripted launcher: a trial outside the best of its rung pauses
(waiting_at_rung 1, its slot to the next trial), is queued again once the rung has filled enough for
it, and the trials never promoted end pruned, with why, when nothing else can run."""
from __future__ import annotations

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import PipelineFinished, TrainingStarted, TrialDecision, ValResult
from torchherd.engine.protocol.states import WorkerState, ended_label
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher, until

S = WorkerState
# One slot, one rung (epoch 1 of 2); val_loss at the rung by trial, in the order they start.
VALUES = {"t-lr0.1": 0.35, "t-lr0.2": 0.3, "t-lr0.3": 0.9, "t-lr0.4": 0.95}


def _scored(handle, name: str, value: float, epoch: int = 0) -> None:
    handle.on_events([TrainingStarted(pipeline=name, epoch=epoch, step=epoch * 10, epochs_total=2,
                                      steps_per_epoch=10, device="cpu", parameters=1),
                      ValResult(pipeline=name, epoch=epoch, step=(epoch + 1) * 10, metrics={"val_loss": value})])


async def test_a_paused_trial_is_promoted_as_its_rung_fills_and_the_rest_end_pruned(tmp_path):
    launcher = ScriptedLauncher(obey_stop=True)  # a Stop ends the fake worker as a checkpointed stop
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 2}, devices={"cpu_slots": 1},
                         sweep={"space": {"params": {"lr": [0.1, 0.2, 0.3, 0.4]}}, "scheduler": "asha",
                                "grace_period": 1}, telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=1), tick=0.005)
    first, best, third, fourth = VALUES
    await sup.start()
    try:
        for n, name in enumerate(VALUES):
            await until(lambda: len(launcher.handles) == n + 1)
            _scored(launcher.handles[n], name, VALUES[name])
            if name == best:  # among the best 1 of 2: it trains on to its end
                await until(lambda: sup.view(first).state == S.WAITING_AT_RUNG)
                launcher.handles[n].exit(0)
        # 4 at the rung: the best 2 are `best` (gone on) and `first`, paused until now: it trains on.
        await until(lambda: len(launcher.handles) == 5)
        assert sup.view(first).state in (S.STARTING, S.RUNNING) and sup.view(first).attempt == 2
        _scored(launcher.handles[4], first, 0.2, epoch=1)
        launcher.handles[4].exit(0)
        statuses = await until_finished(sup)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {first: "completed", best: "completed", third: "pruned", fourth: "pruned"}
    events = read_events(sup.run_dir)
    decided = [(e.pipeline, e.action) for e in events if isinstance(e, TrialDecision)]
    assert decided == [(first, "pause"), (best, "continue"), (third, "pause"), (fourth, "pause"),
                       (first, "promote"), (third, "prune"), (fourth, "prune")], decided
    ends = [e for e in events if isinstance(e, PipelineFinished) and e.pipeline == third]
    assert ended_label(ends[0].status, ends[0].rung) == "waiting at rung 1"  # what the table says meanwhile
    assert ends[-1].reason == "val_loss 0.9 at epoch 1, never among the best 2 of the 4 trials that reached rung 1"


async def until_finished(sup: Supervisor) -> dict[str, str]:
    await until(lambda: sup.finished)
    return await sup.wait()


async def test_resume_only_a_paused_trial_trains_it_on_and_keeps_the_other_paused(tmp_path):
    # Regression guard: resuming rebuilt the pauses and paused again the trial `--only` named.
    launcher = ScriptedLauncher(obey_stop=True)
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 2}, devices={"cpu_slots": 1},
                         sweep={"space": {"params": {"lr": [0.1, 0.2, 0.3]}}, "scheduler": "asha"},
                         telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=1), tick=0.005)
    await sup.start()
    try:
        for n, (name, value) in enumerate([("t-lr0.1", 0.9), ("t-lr0.2", 0.95)]):
            await until(lambda: len(launcher.handles) == n + 1)
            _scored(launcher.handles[n], name, value)
            await until(lambda: sup.view(name).state == S.WAITING_AT_RUNG)  # both pause; 0.1, best of 2, goes on
        await until(lambda: len(launcher.handles) == 3)  # and starts again, ahead of lr 0.3
    finally:
        await sup.shutdown(graceful=False)
    again = ScriptedLauncher(obey_stop=True)
    resumed = Supervisor.resume_run(sup.run_dir, only=["t-lr0.2"], launcher=again,
                                    inventory=Inventory(cpu_count=1), tick=0.005)
    await resumed.start()
    try:
        await until(lambda: len(again.handles) == 1)
        assert resumed.view("t-lr0.2").state in (S.STARTING, S.RUNNING)
        assert "t-lr0.2" in resumed.sweep.exempt
    finally:
        await resumed.shutdown(graceful=False)
