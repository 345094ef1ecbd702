"""Promoting a sweep's pruned trial with real worker processes over the control socket: `torchherd promote RUN
NAME` un-prunes it, it trains on from its checkpoint, later rungs that would cut it do not, and the command is
recorded in events.jsonl with the asking client's pid; a trial that ended otherwise is refused, and recorded."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

from torchherd.engine.protocol.control import Action, ClientCommand
from torchherd.engine.protocol.messages import PipelineFinished, Resumed, TrialDecision
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.serve.remote import RemoteRun
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.tui.bridge import replay_run
from tests.conftest import make_config, repo_env
from tests.faults.support import REPO
from tests.test_service import LONG, apoll, served, sock_dir  # noqa: F401 (sock_dir: a fixture)

pytestmark = pytest.mark.slow

# One slot: the fast learner trains its four epochs first and sets every rung's cut; lr 0 never learns, so it
# is pruned at its first rung, and (promoted) would be cut again at the next one.
SWEEP = {"space": {"params": {"lr": [0.1, 0.0]}}, "scheduler": "asha", "mode": "stop", "grace_period": 1,
         "reduction_factor": 2}
# Seconds each sample takes (256 an epoch: half a second): the cut reaches lr 0 in its second epoch. Without it
# an epoch took milliseconds and, on a loaded machine, lr 0 had trained all four before its first rung's verdict.
DELAY = 0.002


async def _cli(*args: str) -> tuple[int, str, str, int]:
    """`python -m torchherd ARGS` from another shell, without blocking the supervisor on this loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "torchherd", *args, cwd=REPO, env=repo_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), LONG)
    return proc.returncode, out.decode(), err.decode(), proc.pid


@pytest.mark.timeout(600)
async def test_a_promoted_trial_trains_on_is_never_pruned_again_and_is_recorded(tmp_path, sock_dir):  # noqa: F811
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 4, "params": {"delay": DELAY}},
                         sweep=SWEEP, devices={"cpu_slots": 1}, telemetry={"enabled": False})
    fast, still = [p.name for p in config.pipelines]
    sup = Supervisor(config)
    async with served(sup, sock_dir / "p.sock"):
        await apoll(lambda: sup.finished, LONG, "the sweep to end")
        assert (sup.view(fast).state.value, sup.view(still).state.value) == ("completed", "pruned")
        pruned_at = len(read_events(sup.run_dir))

        code, out, err, pid = await _cli("promote", str(sup.run_dir), still)
        assert code == 0, out + err
        assert out.strip() == f"{sup.run_dir.name}: promote {still}"
        await apoll(lambda: sup.view(still).state.value == "completed", LONG, "the promoted trial to complete")

        client = await RemoteRun.connect(sup.run_dir, live=False, history=False)
        try:
            refused = await asyncio.wait_for(client.request(Action.PROMOTE, fast), LONG)
        finally:
            await client.close()
        assert not refused.ok and "completed, not pruned" in refused.text

    later = read_events(sup.run_dir)[pruned_at:]
    commands = [e for e in later if isinstance(e, ClientCommand)]
    assert [(c.action, c.pipeline, c.ok, c.client_pid) for c in commands] == [
        ("promote", still, True, pid), ("promote", fast, False, os.getpid())]
    resumed = [e for e in later if isinstance(e, Resumed) and e.pipeline == still]
    assert resumed and resumed[0].epoch >= 1  # from the checkpoint it was pruned with, not from scratch
    decisions = [e for e in later if isinstance(e, TrialDecision) and e.pipeline == still]
    assert decisions and all(d.action == "continue" for d in decisions)
    # The next rung would have cut it (lr 0 learns nothing): it is kept only because it was promoted.
    assert any(d.cutoff is not None and d.value > d.cutoff and d.reason.endswith("(promoted: never pruned)")
               for d in decisions), decisions
    [finished] = [e for e in later if isinstance(e, PipelineFinished) and e.pipeline == still]
    assert finished.status == "completed"
    # The app opening the run afterwards folds the same story into its sweep view.
    state = replay_run(sup.run_dir)
    assert [r.name for r in state.ranked()] == [fast, still]
    assert any(r.startswith("promoted:") for r in state.trials[still].reasons)
    assert state.trials[still].reasons[-1].endswith("(promoted: never pruned)")
