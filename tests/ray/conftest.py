"""A local multi-node Ray cluster for the Ray backend's tests, and configs that run on it.

One cluster per test module (head with 2 CPUs, plus a node with 2 CPUs and a fake GPU, or what the
module's own `local_cluster` asks for),
its files under a per-user temporary folder (never /tmp/ray: the machine is shared), and
ray.shutdown at the end. The root conftest's no-orphans check would see the cluster's own
processes as orphans; here it checks what torchherd started instead: no actor of ours and
no torchherd child may outlive a test.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from torchherd.engine.config.schema import RunConfig
from tests.conftest import TASKS, make_config

ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "torchherd[ray]"')

OURS = ("torchherd.engine.launch.child", "ChildHost")  # in the command line of what torchherd starts on a node


def ray_config(tmp_path: Path, pipelines: list[dict[str, Any]], address: str, **top: Any) -> RunConfig:
    """make_config for the Ray backend on the test cluster: one CPU slot per node, telemetry off."""
    top.setdefault("telemetry", {"enabled": False})
    top["devices"] = {"placement": "cpu", "cpu_slots": 2, **top.get("devices", {})}
    return make_config(tmp_path, pipelines, cluster={"backend": "ray", "address": address}, **top)


def ray_toml(path: Path, address: str, pipelines: int) -> Path:
    """A config file for the CLI: `pipelines` long runs of tests/tasks/tiny.py on the Ray backend."""
    task = f"{TASKS / 'tiny.py'}:build".replace("\\", "/")
    names = "".join(f'\n[[pipelines]]\nname = "{chr(97 + i)}"\n' for i in range(pipelines))
    path.write_text(f"""
[defaults]
task = "{task}"
max_epochs = 1000
params = {{ delay = 0.002 }}
{names}
[devices]
placement = "cpu"
cpu_slots = {pipelines}

[validation]
mode = "inline"

[telemetry]
enabled = false

[cluster]
backend = "ray"
address = "{address}"
""")
    return path


def ours_alive() -> list[str]:
    """Processes torchherd started on this test's cluster that still run (zombies excluded).

    The cluster's processes descend from this one; other people's runs on the machine do not.
    """
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if any(mark in line for mark in OURS):
            out.append(f"{p.pid} {line[:80]}")
    return out


@pytest.fixture(autouse=True)
def no_orphans():
    """Overrides the root check: nothing torchherd started on the cluster outlives a test."""
    yield
    deadline = time.monotonic() + 15.0  # seconds: actors end themselves after their child is reaped
    left = ours_alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ours_alive()
    assert not left, f"left running on the cluster: {left}"


@contextmanager
def local_cluster(**node: Any) -> Iterator[Any]:
    """A head (2 CPUs) and one more node (Ray's add_node arguments `node`), joined by this test process."""
    from ray.cluster_utils import Cluster

    # Short: Ray's unix sockets live under it and their paths may not exceed 107 bytes.
    tmp = tempfile.mkdtemp(prefix=f"thray{os.getuid()}-", dir=tempfile.gettempdir())
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    os.mkdir(os.path.join(tmp, "ray"))  # Ray writes ray_current_cluster there before creating it
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    c.add_node(**node)
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="torchherd", log_to_driver=False, include_dashboard=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    """A head (2 CPUs) and a second node (2 CPUs, one fake GPU), joined by this test process."""
    with local_cluster(num_cpus=2, num_gpus=1) as c:
        yield c
