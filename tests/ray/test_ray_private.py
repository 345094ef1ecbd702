"""A private Ray (`address = "local"`) that the supervisor started ends with it, even after a SIGKILL.

Ray's own fate-sharing takes its GCS and raylet down with the supervisor but not the agents
the raylet starts; torchherd's reaper (engine/launch/ray/reaper.py) ends those.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.faults.support import HeadlessCli, is_alive, poll_until
from tests.ray.conftest import ray, ray_toml  # noqa: F401  (importing it skips this module without Ray)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_sigkilled_supervisor_leaves_no_process_of_its_private_ray(tmp_path, monkeypatch):
    tmp = tempfile.mkdtemp(prefix=f"thray{os.getuid()}-")  # never /tmp/ray: the machine is shared
    os.mkdir(os.path.join(tmp, "ray"))
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    cli = HeadlessCli(ray_toml(tmp_path / "local.toml", "local", 1), tmp_path / "runs")
    try:
        cli.wait_records(lambda recs: any(r["type"] == "step" for r in recs), 120, "a step")
        cli.remember()
        assert any("raylet" in " ".join(p.cmdline()) for p in cli.known if is_alive(p))
        cli.kill_supervisor()
        poll_until(lambda: not [p for p in cli.known if is_alive(p)], 20, "every Ray process to end")
    finally:
        left = cli.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    assert left == []
