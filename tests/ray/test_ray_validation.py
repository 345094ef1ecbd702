"""Background validation on a two-node Ray cluster: a validator on each node, on that node's snapshots.

Snapshots stay in the shared memory of the worker's node, so each node that hosts a
validated worker runs its own validator, watching a snapshot root named after the node
(the test cluster's nodes share this machine's /dev/shm; the names keep them apart).
One run: both pipelines are scored, each root holds only its own node's pipeline, a
SIGKILLed validator actor is restarted and scores again, and the session frees the roots.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from torchherd.engine.protocol.messages import Notice, ValidatorStarted, ValResult
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.ray.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def node_roots(sup: Supervisor) -> dict[Path, set[str]]:
    """Each node's snapshot root of this run, with the pipelines whose snapshots are in it."""
    root = sup.snapshot_root
    return {p: {d.name for d in p.iterdir() if d.is_dir()} for p in root.parent.glob(f"{root.name}-*")}


def validator_actor(sup: Supervisor, snapshot_root: Path) -> psutil.Process:
    """The Ray actor process hosting the validator that watches `snapshot_root`."""
    for spec in sup.run_dir.glob("validator-*/validator.json"):
        if str(snapshot_root) not in spec.read_text():
            continue
        for p in psutil.Process().children(recursive=True):
            try:
                if str(spec) in p.cmdline():
                    return p.parent()
            except psutil.Error:
                continue
    raise AssertionError(f"no validator process watches {snapshot_root}")


async def test_each_node_validates_its_own_workers_and_a_killed_validator_restarts(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a"}, {"name": "b"}], cluster.address,
                        defaults={"max_epochs": 400, "params": {"delay": 0.004}},
                        validation={"mode": "background", "device": "cpu"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    started: list[ValidatorStarted] = []
    scored: set[str] = set()

    def note(event) -> None:
        if isinstance(event, ValidatorStarted):
            started.append(event)
        if isinstance(event, ValResult) and not event.error:
            scored.add(event.pipeline)

    await sup.start()
    try:
        await wait_for(stream, lambda e: note(e) or scored == {"a", "b"}, 120)
        assert len(started) == 2 and all(" on node " in e.device for e in started)
        assert all(e.pid > 0 for e in started)  # regression: announced before the actor knew its pid (0)
        assert len({e.device for e in started}) == 2  # one validator per node, each named by its node
        roots = node_roots(sup)
        assert sorted(sorted(names) for names in roots.values()) == [["a"], ["b"]]
        b_root = next(r for r, names in roots.items() if names == {"b"})

        os.kill(validator_actor(sup, b_root).pid, signal.SIGKILL)
        await wait_for(stream, lambda e: isinstance(e, Notice) and "validator on node" in e.text
                       and "exited" in e.text, 60)
        restarted = await wait_for(stream, lambda e: isinstance(e, ValidatorStarted), 60)
        assert restarted.attempt == 2 and restarted.pid > 0
        again = await wait_for(stream, lambda e: isinstance(e, ValResult) and e.pipeline == "b" and not e.error, 120)
        assert again.seq > 0
    finally:
        await sup.shutdown(graceful=False)
    assert node_roots(sup) == {}  # each node's root freed there
