"""When a gang goes wrong: a hung gang stays flagged, the odd rank is named, a slow rank is called a straggler.

Real 2-rank gloo script gangs on the CPU (tests/tasks/scripts/hang_rank.py): few steps, tiny tensors.
Every wait is on an event, bounded; no wall-clock time is asserted.
"""
from __future__ import annotations

import asyncio
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.health import Alert, Straggler, Triage
from torchherd.engine.protocol.messages import Stalled
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, wait_for
from tests.faults.support import supervised
from torchherd.tui.headless import LinePrinter

pytestmark = pytest.mark.slow

HANG_RANK = str(Path(__file__).parent / "tasks" / "scripts" / "hang_rank.py")
STEP_LINE = r"step (?P<step>\d+) loss (?P<loss>[-+.\deE]+)"


def script_gang(tmp_path: Path, args: list[str], **top) -> Supervisor:
    cfg = make_config(tmp_path, [{"name": "g", "ranks": 2, "script": HANG_RANK, "args": args,
                                  "metrics": STEP_LINE}], validation={"mode": "off"},
                      defaults={"task": None}, telemetry={"enabled": False}, **top)
    return Supervisor(cfg, inventory=Inventory(cpu_count=2, note="test inventory"))


# Regression (issue 40): rank 0, spinning in an all_reduce that rank 1 never joined, burned CPU, and CPU use
# counted as a script's progress: the hung gang was never flagged, or its flag cleared ("stepping again").
async def test_a_gang_hung_in_a_collective_stays_flagged_while_its_waiting_rank_spins(tmp_path):
    sup = script_gang(tmp_path, ["--hang-at", "20", "--hang-for", "600", "--spin"],
                      restart={"stall_warning": 3.0})
    async with supervised(sup) as stream:
        flagged = await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet > 0, 90)
        assert flagged.pipeline == "g" and not flagged.first_step
        with pytest.raises(asyncio.TimeoutError):  # several heartbeat intervals of a spinning rank 0
            await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet == 0, 8)


async def test_a_gang_stuck_on_one_rank_is_triaged_naming_that_rank_first_and_alerted_once(tmp_path):
    sup = script_gang(tmp_path, ["--hang-at", "20", "--hang-for", "600"], restart={"stall_warning": 3.0})
    async with supervised(sup) as stream:
        triage = await wait_for(stream, lambda e: isinstance(e, Triage), 90)
    assert triage.verdict.startswith("rank 1 is in `time.sleep(args.hang_for)`"), triage.verdict
    assert "rank 0 waits in all_reduce" in triage.verdict
    folder = Path(triage.folder)
    assert folder.parent == sup.run_dir / "g" / "stacks"
    assert "hang_rank.py" in (folder / "rank1.txt").read_text() and (folder / "rank0.txt").exists()
    events = read_events(sup.run_dir)
    assert [e.rule for e in events if isinstance(e, Alert)] == ["stall"]
    out = io.StringIO()
    LinePrinter(out).handle(triage)
    assert "g: triage: rank 1 is in" in out.getvalue()


async def test_a_rank_slow_in_its_data_path_is_flagged_as_a_straggler_with_its_ratio(tmp_path):
    # Rank 1 sleeps 20 ms per sample read (640 ms a batch), rank 0 not at all: generous beyond any noise.
    cfg = make_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 1000, "log_every_n_steps": 1,
                                  "params": {"samples": 256, "slow_rank": 1, "slow_delay": 0.02}}],
                      validation={"mode": "off"}, telemetry={"enabled": False})
    sup = Supervisor(cfg, inventory=Inventory(cpu_count=2, note="test inventory"))
    async with supervised(sup) as stream:
        found = await wait_for(stream, lambda e: isinstance(e, Straggler), 120)
    assert (found.pipeline, found.rank) == ("g", 1) and found.ratio >= 1.5
    assert found.slowest > found.median


async def test_torchherd_stacks_answers_with_where_each_rank_of_a_hung_gang_is(tmp_path):
    from torchherd.engine.protocol.control import Action
    from torchherd.tui.verbs import _ask
    from tests.test_service import served

    sock = Path(tempfile.mkdtemp(prefix="th-test-")) / "control.sock"  # AF_UNIX paths are short
    sup = script_gang(tmp_path, ["--hang-at", "20", "--hang-for", "600"], restart={"stall_warning": 3.0})
    stream = sup.subscribe()
    try:
        async with served(sup, sock):
            await wait_for(stream, lambda e: isinstance(e, Triage), 90)  # stuck for good: the stall's own triage
            out, err = io.StringIO(), io.StringIO()
            assert await _ask(sup.run_dir, Action.STACKS, "g", out, err) == 0, err.getvalue()
            as_json = io.StringIO()  # `torchherd stacks RUN g --json`
            assert await _ask(sup.run_dir, Action.STACKS, "g", as_json, err, as_json=True) == 0, err.getvalue()
    finally:
        shutil.rmtree(sock.parent, ignore_errors=True)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("triage: rank 1 is in `time.sleep(args.hang_for)`"), lines
    assert "rank 0 waits in all_reduce" in lines[1] and lines[2].startswith("stacks in ")
    said = json.loads(as_json.getvalue())
    assert (said["ok"], said["action"], said["pipeline"], said["run"]) == (True, "stacks", "g", sup.run_dir.name)
    assert said["triage"]["verdict"].startswith("rank 1 is in `time.sleep(args.hang_for)`"), said
    assert len(said["triage"]["ranks"]) == 2 and Path(said["triage"]["folder"]).parent == sup.run_dir / "g" / "stacks"
