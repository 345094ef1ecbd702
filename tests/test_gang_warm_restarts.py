"""A gang that may restart gets the session's forking process from the start, so its restarted ranks are forked
with torch imported rather than started as fresh Pythons (benchmarks/recovery.py: seconds -> a fraction of one);
a single process, or a gang with no restarts left to it, starts none."""
from __future__ import annotations

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher


class Expecting(ScriptedLauncher):
    """The scripted backend, counting the supervisor's calls to get ready for restarts."""

    def __init__(self) -> None:
        super().__init__(obey_stop=True)
        self.expected = 0

    def expect_restarts(self) -> None:
        self.expected += 1


@pytest.mark.parametrize(("ranks", "max_restarts", "expected"), [(2, 3, 1), (2, 0, 0), (1, 3, 0)])
async def test_the_forking_process_starts_with_a_gang_that_may_restart(tmp_path, ranks, max_restarts, expected):
    launcher = Expecting()
    config = make_config(tmp_path, [{"name": "g", "ranks": ranks}], telemetry={"enabled": False},
                         restart={"max_restarts": max_restarts})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    try:
        assert launcher.expected == expected
    finally:
        await sup.shutdown(graceful=False)
