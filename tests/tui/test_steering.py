"""What a key's notification says for a script pipeline: what the script can really do without
torchherd.client, read from the run's config.json and the script's source."""
from __future__ import annotations

import json

from torchherd.tui.commands import Checkpoint, Pause, Stop
from torchherd.tui.steering import ScriptSteering, script_steering
from tests.conftest import TASKS, make_config

SCRIPTS = TASKS / "scripts"


def run_dir_of(tmp_path, pipelines):
    config = make_config(tmp_path, pipelines)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps([config.model_dump(mode="json")]))
    return run_dir


def test_a_script_without_the_client_is_told_what_c_s_and_p_will_really_do(tmp_path):
    # Regression: `c` popped up "writes a checkpoint after its current step" and `s` "it checkpoints, then
    # exits" for a script without torchherd.client, while the event log said neither would happen.
    alone, beside = tmp_path / "alone", tmp_path / "beside"  # a module beside a script counts as its own
    for folder, name in ((alone, "plain_loop.py"), (beside, "client_loop.py")):
        folder.mkdir()
        (folder / name).write_text((SCRIPTS / name).read_text())
    run_dir = run_dir_of(tmp_path, [
        {"name": "plain", "script": str(alone / "plain_loop.py")},
        {"name": "waits", "script": str(alone / "plain_loop.py"), "stop_mode": "after_checkpoint",
         "stop_signal": "SIGTERM"},
        {"name": "client", "script": str(beside / "client_loop.py")},
        {"name": "task"}])
    plain = script_steering(run_dir, "plain")
    assert plain == ScriptSteering(client=False, stop_signal="SIGINT", stop_mode="signal")
    assert "cannot checkpoint on request" in Checkpoint("plain").doing(plain)
    assert "SIGINT now; what it trained since its last save is lost" in Stop("plain").doing(plain)
    assert "frozen (SIGSTOP)" in Pause("plain").doing(plain)
    waits = script_steering(run_dir, "waits")
    assert "SIGTERM after its next save" in Stop("waits").doing(waits)
    client, task = script_steering(run_dir, "client"), script_steering(run_dir, "task")
    assert client.client and task is None
    for steering in (client, task):
        assert Checkpoint("x").doing(steering) == "x writes a checkpoint after its current step"
        assert Stop("x").doing(steering) == "stopping x: it checkpoints, then exits"
