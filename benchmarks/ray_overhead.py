"""What the Ray backend costs over local processes, on this machine.

Prints samples/s of one pipeline under the Ray backend over the local backend (same
task, one thread, best of alternating rounds; goal >= 0.95), step events/s that 4 Ray
workers push into the supervisor over their dial-back connections (goal >= 30,000),
and the time from a worker's SIGKILL to its next reported step on each backend.
Starts a private one-machine Ray (4 logical CPUs) under a temporary RAY_TMPDIR.
Run: python benchmarks/ray_overhead.py   (ROUNDS=3 by default; --quick: both parts once at the least size, for
CI, figures meaningless)

`python benchmarks/ray_overhead.py validation` measures background validation instead,
on a local two-node cluster (ray.cluster_utils.Cluster, head and one node, 2 CPUs each)
against the local backend: two pipelines, one per node, each scored by its own node's
validator; per node, the time from session start to the first result and the median
time from a snapshot's hand-off report to its result.

Given a spec file instead, it is the stand-in worker of the events/s figure: it dials
back and sends step reports as fast as a StatusSender takes them.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchherd.engine.protocol.messages import (EpochEnd, Notice, SnapshotTaken, StepMetrics, ValResult,  # noqa: E402
                                       WorkerExited, WorkerStarted)

QUICK = "--quick" in sys.argv[1:]
PARAMS = {"samples": 640 if QUICK else 40_000, "features": 64, "hidden": 256, "lr": 0.01}
EPOCHS = 1 if QUICK else 3
BATCH = 64
FLOOD = 2_000 if QUICK else 200_000  # step reports per stand-in worker
VAL_SAMPLES, VAL_EPOCHS = (640, 2) if QUICK else (8_000, 12)  # the validation part's pipelines


def config(tmp: Path, backend: str, epochs: int = EPOCHS):
    from torchherd.engine.config.load import parse_config

    data = {"runs_dir": str(tmp), "name": f"bench-{backend}",
            "pipelines": [{"name": "bench", "task": "regression", "params": PARAMS,
                           "max_epochs": epochs, "batch_size": BATCH, "log_every_n_steps": 10}],
            "devices": {"placement": "cpu", "cpu_slots": 1, "threads_per_worker": 1},
            "validation": {"mode": "off"}, "telemetry": {"enabled": False},
            "restart": {"min_uptime": 0.0, "backoff": 0.0},
            "cluster": {"backend": backend, "address": "local"}}
    return parse_config(data, str(tmp / "bench.toml"), tmp)


async def samples_per_s(tmp: Path, backend: str) -> float:
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.supervise.supervisor import Supervisor

    inventory = Inventory(cpu_count=os.cpu_count() or 1) if backend == "local" else None
    sup = Supervisor(config(tmp, backend), inventory=inventory)
    stream = sup.subscribe()
    await sup.start()
    await sup.wait()
    await sup.shutdown()
    samples = duration = 0.0
    async for ev in stream:
        if isinstance(ev, EpochEnd):
            samples += ev.samples_per_s * ev.duration
            duration += ev.duration
    return samples / duration


def worker_pid(pipeline_dir: Path) -> int:
    import psutil

    spec = str(pipeline_dir / "worker.json")
    for p in psutil.process_iter(["pid", "cmdline"]):
        if spec in (p.info["cmdline"] or []):
            return p.info["pid"]
    return 0


async def kill_to_next_step(tmp: Path, backend: str) -> float:
    """Seconds from SIGKILL of the training process to the restarted attempt's first step report."""
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.supervise.supervisor import Supervisor

    inventory = Inventory(cpu_count=os.cpu_count() or 1) if backend == "local" else None
    sup = Supervisor(config(tmp, backend, epochs=1000), inventory=inventory)
    stream = sup.subscribe()
    await sup.start()
    try:
        async for ev in stream:
            if isinstance(ev, StepMetrics):
                break
        pid = worker_pid(sup.run_dir / "bench")
        if not pid:  # never os.kill(0): that is this process's own group (and whatever runs the benchmark)
            raise RuntimeError(f"no process runs {sup.run_dir / 'bench' / 'worker.json'}")
        killed = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        restarted = False
        async for ev in stream:
            restarted = restarted or isinstance(ev, WorkerExited)
            if restarted and isinstance(ev, StepMetrics):
                return time.perf_counter() - killed
        raise RuntimeError("the stream ended before the restarted worker reported")
    finally:
        await sup.shutdown(graceful=False)


async def ray_events_per_s(tmp: Path, workers: int = 4, count: int = FLOOD) -> float:
    """Step events/s from `workers` Ray actors' children into this event loop, over dial-back connections."""
    from torchherd.engine.config.schema import ClusterConfig
    from torchherd.engine.launch.process import LaunchSpec
    from torchherd.engine.launch.ray.launcher import RayLauncher
    from torchherd.engine.protocol.spec import WorkerSpec

    launcher = RayLauncher(ClusterConfig(backend="ray", address="local"))
    received, reports, done = 0, [], asyncio.Event()

    def on_events(events):
        nonlocal received
        for ev in events:
            if isinstance(ev, StepMetrics):
                received += 1
            elif isinstance(ev, Notice) and ev.text.startswith("{"):  # not the launcher's "runs on node"
                reports.append(ev.text)
                if len(reports) == workers:
                    done.set()

    handles = []
    for i in range(workers):
        d = tmp / "flood" / f"w{i}"
        spec = LaunchSpec(child=WorkerSpec(pipeline={"name": f"w{i}", "params": {"count": count}}, validation={},
                                           device="cpu", threads=1, pipeline_dir=str(d), attempt=1),
                          log_path=d / "log.txt", gpu_index=None, module="benchmarks.ray_overhead",
                          env={"PYTHONPATH": str(ROOT)})
        handle = launcher.launch(spec)
        handle.attach(on_events)
        handles.append(handle)
    first = None
    while not done.is_set():
        await asyncio.sleep(0.01)
        failed = [h.name for h in handles if h.poll() not in (None, 0)]
        if failed:
            raise RuntimeError(f"flood workers {failed} failed: {[h.drain() for h in handles]}")
        if first is None and received:
            first = time.perf_counter()  # actor and interpreter start-up are not the channel's cost
    elapsed = time.perf_counter() - first
    while any(h.poll() is None for h in handles):
        await asyncio.sleep(0.01)
    for h in handles:
        h.close()
    launcher.close()
    assert received == workers * count, (received, workers * count)
    return received / elapsed


def flood(spec_path: str) -> None:
    """The stand-in worker: dial back, send `count` step reports, then one notice that it is done."""
    from torchherd.engine.protocol.channel import StatusSender, dial_back
    from torchherd.engine.protocol.spec import read_spec

    spec, transport = read_spec(Path(spec_path))
    count = spec.pipeline["params"]["count"]
    status, _control = dial_back(transport.address, transport.token)
    sender = StatusSender(status, max_pending=10 * count)
    for i in range(count):
        sender.step(StepMetrics(pipeline=spec.name, epoch=0, step=i, loss=0.5, lr=0.1, samples_per_s=1000.0))
    sender.send(Notice(pipeline=spec.name, text=json.dumps({"count": count})))
    sender.close(timeout=60)


async def validation_latency(tmp: Path, backend: str, address: str = "local") -> dict[str, tuple[float, ...]]:
    """Per node ("" here), in seconds: start to the first result, the first hand-off to the first result
    (a validator started with its node's first worker starts up inside it), and the median hand-off to
    result."""
    import statistics

    from torchherd.engine.config.load import parse_config
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.supervise.supervisor import Supervisor

    data = {"runs_dir": str(tmp), "name": f"val-{backend}",
            "pipelines": [{"name": n, "task": "regression", "params": {**PARAMS, "samples": VAL_SAMPLES},
                           "max_epochs": VAL_EPOCHS, "batch_size": BATCH, "log_every_n_steps": 10} for n in ("a", "b")],
            "devices": {"placement": "cpu", "cpu_slots": 2, "threads_per_worker": 1},
            "validation": {"mode": "background", "device": "cpu"},
            "telemetry": {"enabled": False}, "cluster": {"backend": backend, "address": address}}
    config = parse_config(data, str(tmp / "val.toml"), tmp)
    inventory = Inventory(cpu_count=os.cpu_count() or 1) if backend == "local" else None
    sup = Supervisor(config, inventory=inventory)
    stream = sup.subscribe()
    begun = time.perf_counter()
    await sup.start()
    node: dict[str, str] = {}
    handed: dict[tuple[str, int], float] = {}
    first: dict[str, float] = {}
    opened: dict[str, float] = {}
    lags: dict[str, list[float]] = {}

    async def watch() -> None:  # arrival times here: transport included
        async for ev in stream:
            now = time.perf_counter()
            if isinstance(ev, WorkerStarted):
                node[ev.pipeline] = ev.node
            elif isinstance(ev, SnapshotTaken):
                handed[(ev.pipeline, ev.seq)] = now
            elif isinstance(ev, ValResult) and not ev.error:
                where = node.get(ev.pipeline, "")
                if where not in first:
                    first[where] = now - begun
                    opened[where] = now - min(t for (p, _), t in handed.items() if node.get(p, "") == where)
                if (ev.pipeline, ev.seq) in handed:
                    lags.setdefault(where, []).append(now - handed[(ev.pipeline, ev.seq)])

    watcher = asyncio.ensure_future(watch())
    try:
        await sup.wait()
    finally:
        await sup.shutdown()
    await watcher  # the stream ends with the session
    return {where: (first[where], opened[where], statistics.median(lags.get(where, [float("nan")])))
            for where in first}


def main_validation() -> None:
    """Background validation: first-result latency per node on a two-node cluster, against local."""
    import ray
    from ray.cluster_utils import Cluster

    ray_tmp = tempfile.mkdtemp(prefix=f"thray{os.getuid()}-")
    os.mkdir(os.path.join(ray_tmp, "ray"))
    os.environ["RAY_TMPDIR"] = ray_tmp
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="torchherd", log_to_driver=False, include_dashboard=False,
             logging_level="error")
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            for backend, address in (("local", "local"), ("ray", cluster.address)):
                for where, (first, opened, lag) in sorted(asyncio.run(validation_latency(tmp / backend, backend,
                                                                                 address)).items()):
                    print(f"{backend:5} node {where or '(this one)':16} first result {first:5.2f} s after start, "
                          f"{opened:5.2f} s after the first hand-off; hand-off to result median "
                          f"{lag * 1000:5.0f} ms", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def main() -> None:
    import ray

    rounds = 1 if QUICK else int(os.environ.get("ROUNDS", "3"))
    ray_tmp = tempfile.mkdtemp(prefix=f"thray{os.getuid()}-")  # Ray's files: never /tmp/ray on a shared box
    os.mkdir(os.path.join(ray_tmp, "ray"))
    os.environ["RAY_TMPDIR"] = ray_tmp
    ray.init(num_cpus=4, namespace="torchherd", log_to_driver=False, include_dashboard=False,
             logging_level="error")
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            local, remote = [], []
            for i in range(rounds):  # alternate, so drift on a shared machine hits both alike
                local.append(asyncio.run(samples_per_s(tmp / f"local{i}", "local")))
                remote.append(asyncio.run(samples_per_s(tmp / f"ray{i}", "ray")))
                print(f"round {i + 1}: local {local[-1]:,.0f} samples/s, Ray {remote[-1]:,.0f} samples/s", flush=True)
            lo, ra = max(local), max(remote)
            print(f"training speed: local {lo:,.0f} samples/s, Ray {ra:,.0f} samples/s, "
                  f"ratio Ray/local {ra / lo:.3f} (goal >= 0.95)")
            rate = asyncio.run(ray_events_per_s(tmp))
            print(f"status channel: {rate:,.0f} step events/s from 4 Ray workers into the supervisor "
                  "(goal >= 30,000)")
            for backend in ("local", "ray"):
                t = asyncio.run(kill_to_next_step(tmp / f"kill-{backend}", backend))
                print(f"SIGKILL of the training process to its next step, {backend}: {t:.2f} s")
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    if argv == ["validation"]:
        main_validation()
    elif argv:
        flood(argv[0])
    else:
        main()
        if QUICK:  # every part once
            main_validation()
