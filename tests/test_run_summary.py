"""`[alerts] on_finish`: as a run ends, the alert command runs once with its summary (how it ended, each
pipeline's state, best value and best checkpoint; a failure's error and log), placeholders filled; a completed
run's summary rings no bell. The real Supervisor over scripted workers, the command a real process."""
from __future__ import annotations

import json
import sys

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.health import Alert
from torchherd.engine.protocol.messages import RunFinished, TrainingStarted, ValResult, WorkerError
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher, until

# The command: each run appends its argv (after the program) as one JSON line.
WRITE = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"


async def ended_run(tmp_path, fail: bool) -> tuple[Supervisor, list[list[str]]]:
    """A run of pipelines a (validated, best 0.25) and b, which completes or (`fail`) raises; the command's argv."""
    told = tmp_path / "told.jsonl"
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], telemetry={"enabled": False},
                         restart={"max_restarts": 0, "min_uptime": 0.0},
                         alerts={"on_finish": True, "command": [sys.executable, "-c", WRITE, str(told), "{rule}",
                                                                "{status}", "{run_dir}", "{title}", "{message}"]})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    a, b = launcher.handles
    a.exit(0, [TrainingStarted(pipeline="a", epoch=0, step=0, epochs_total=1, steps_per_epoch=4, device="cpu",
                               parameters=1),
               ValResult(pipeline="a", epoch=0, step=4, metrics={"val_loss": 0.25})])
    (sup.run_dir / "a" / "checkpoints").mkdir(parents=True, exist_ok=True)
    (sup.run_dir / "a" / "checkpoints" / "best.pt").write_bytes(b"")  # as the trainer keeps it
    if fail:
        b.exit(1, [WorkerError(pipeline="b", error="ZeroDivisionError: float division by zero", where="train",
                               step=3)])
    else:
        b.exit(0)
    await until(lambda: sup.finished)
    await sup.shutdown()  # waits for the summary's command
    lines = told.read_text().splitlines() if told.exists() else []
    return sup, [json.loads(line) for line in lines]


async def test_a_completed_run_sends_its_summary_to_the_command_once_and_rings_no_bell(tmp_path):
    sup, told = await ended_run(tmp_path, fail=False)
    assert len(told) == 1, told
    rule, status, run_dir, title, message = told[0]
    assert (rule, status, run_dir) == ("finished", "completed", str(sup.run_dir))
    assert title == f"torchherd: {sup.run_id} completed"
    best = sup.run_dir / "a" / "checkpoints" / "best.pt"
    assert message.startswith(f"run {sup.run_id} completed in ")
    assert f"a completed (trained to its limits), best val_loss 0.25 ({best})" in message, message
    assert "b completed" in message
    events = read_events(sup.run_dir)
    summaries = [e for e in events if isinstance(e, Alert) and e.rule == "finished"]
    assert len(summaries) == 1 and not summaries[0].bell
    assert isinstance(events[-1], RunFinished)  # the summary comes before the run's last word


async def test_a_failed_runs_summary_names_its_error_and_log(tmp_path):
    sup, told = await ended_run(tmp_path, fail=True)
    assert len(told) == 1, told
    rule, status, _, title, message = told[0]
    assert (rule, status, title) == ("finished", "failed", f"torchherd: {sup.run_id} failed")
    assert "ZeroDivisionError: float division by zero" in message, message
    assert f"log {sup.run_dir / 'b' / 'log.txt'}" in message, message
    summary = next(e for e in read_events(sup.run_dir) if isinstance(e, Alert) and e.rule == "finished")
    assert summary.bell


async def test_without_on_finish_no_summary_is_sent(tmp_path):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 1)
    launcher.handles[0].exit(0)
    await until(lambda: sup.finished)
    await sup.shutdown()
    assert not [e for e in read_events(sup.run_dir) if isinstance(e, Alert)]
