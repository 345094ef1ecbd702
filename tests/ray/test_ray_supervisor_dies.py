"""Fault: the supervisor of a Ray run dies (SIGKILL): its actors and their children end with it.

The actors are owned by the supervisor's Ray driver, so the cluster ends them when it
disconnects; each child follows its actor by its parent-death signal.
"""
from __future__ import annotations


import pytest

from tests.faults.support import HeadlessCli, poll_until
from tests.ray.conftest import ours_alive, ray, ray_toml

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def our_actors() -> list[str]:
    """Live named actors in torchherd's namespace on the cluster."""
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "torchherd"]


def test_sigkilled_supervisor_leaves_no_actor_and_no_child(tmp_path, cluster):
    cli = HeadlessCli(ray_toml(tmp_path / "ray.toml", cluster.address, 2), tmp_path / "runs")
    try:
        cli.wait_records(lambda recs: {r["pipeline"] for r in recs if r["type"] == "step"} >= {"a", "b"},
                         120, "both pipelines to report a step")
        assert len(ours_alive()) == 4  # two actors, two children
        assert len(our_actors()) == 2
        cli.kill_supervisor()
        poll_until(lambda: not ours_alive(), 15, "the actors and their children to end")
        poll_until(lambda: not our_actors(), 15, "the cluster to forget the actors")
    finally:
        left = cli.cleanup()
    assert left == []
    assert ray.is_initialized()  # the cluster itself lives on for others
