"""When a gang goes wrong: a hung gang stays flagged, the odd rank is named, a slow rank is called a straggler.

Real 2-rank gloo script gangs on the CPU (tests/tasks/scripts/hang_rank.py): few steps, tiny tensors.
Every wait is on an event, bounded; no wall-clock time is asserted.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Stalled
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, wait_for
from tests.faults.support import supervised

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

