"""The Ray backend's pieces that need no cluster: its config, slots from `ray.nodes()`, the node book,
and the dial-back listener's token check. They run without Ray installed."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
from types import SimpleNamespace

import pytest

from torchherd.engine.protocol.channel import StatusSender, decode_batch, dial_back, encode_batch
from torchherd.engine.config.load import parse_config
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.config.schema import DevicesConfig
from torchherd.engine.protocol.messages import Notice
from torchherd.engine.protocol.telemetry import GpuSample, ProcessSample, TelemetrySnapshot
from torchherd.engine.protocol.records import from_record, to_record
from torchherd.engine.launch.ray.placement import NodeBook, NoRoom, cluster_inventory, plan_cluster_slots, read_nodes
from torchherd.engine.launch.ray.telemetry import RemoteTelemetry, merge
from torchherd.engine.launch.ray.transport import DialBackListener
from torchherd.engine.protocol.messages import WorkerStarted
from tests.conftest import make_config, wait_for
from tests.scripted import FakeHandle, ScriptedLauncher, until

NODES = [  # what ray.nodes() says about a head with 4 CPUs and a node with 2 CPUs and 2 GPUs, one dead node
    {"NodeID": "aa" * 14, "Alive": True, "NodeManagerHostname": "head", "NodeManagerAddress": "10.0.0.1",
     "Resources": {"CPU": 4.0, "memory": 1e9}},
    {"NodeID": "bb" * 14, "Alive": True, "NodeManagerHostname": "gpu1", "NodeManagerAddress": "10.0.0.2",
     "Resources": {"CPU": 2.0, "GPU": 2.0}},
    {"NodeID": "cc" * 14, "Alive": False, "NodeManagerHostname": "gone", "Resources": {"CPU": 64.0}},
]


def config(**top):
    return parse_config({"pipelines": [{"name": "a", "task": "regression"}], **top}, "c.toml")


def test_cluster_keys_are_checked_and_name_the_key():
    assert config().cluster.backend == "local"
    assert config(cluster={"backend": "ray", "address": "10.0.0.5:6379"}).cluster.address == "10.0.0.5:6379"
    with pytest.raises(ConfigError) as err:
        config(cluster={"backend": "ray", "address": "head node"})
    assert err.value.problems[0].key == "cluster.address"


def test_a_ray_config_without_ray_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        config(cluster={"backend": "ray"})
    [problem] = err.value.problems
    assert problem.key == "cluster.backend" and 'pip install "torchherd[ray]"' in problem.message


def test_cpu_slots_spread_over_live_nodes_and_gpus_number_across_nodes():
    inv = cluster_inventory(read_nodes(NODES))
    assert [n.label for n in inv.nodes] == ["head", "gpu1"] and inv.cpu_count == 6
    assert [g.index for g in inv.gpus] == [0, 1] and inv.home(1) == ("bb" * 14, 1)
    slots, problems = plan_cluster_slots(DevicesConfig(placement="cpu", cpu_slots=3), inv)
    assert problems == [] and [s.node[:2] for s in slots] == ["aa", "bb", "aa"]  # the first free ones spread
    slots, _ = plan_cluster_slots(DevicesConfig(placement="auto"), inv)
    assert [(s.device, s.node[:2]) for s in slots] == [("cuda", "bb"), ("cuda", "bb")]


@pytest.mark.parametrize("devices, key, words", [
    ({"placement": [0, 5]}, "devices.placement[1]", "no GPU 5"),
    ({"placement": "cpu", "threads_per_worker": 8}, "devices.threads_per_worker", "largest has 4"),
    ({"placement": "cpu", "cpu_slots": 7}, "devices.cpu_slots", "room for 6"),
])
def test_what_no_node_could_host_is_refused_up_front(devices, key, words):
    slots, problems = plan_cluster_slots(DevicesConfig(**devices), cluster_inventory(read_nodes(NODES)), "c.toml")
    assert [p.key for p in problems] == [key] and words in problems[0].message


def test_a_gang_larger_than_the_cluster_is_refused_and_one_larger_than_a_node_is_not():
    from torchherd.engine.preflight.plan import gang_problems

    slots, _ = plan_cluster_slots(DevicesConfig(placement="cpu"), cluster_inventory(read_nodes(NODES)), "c.toml")
    assert len(slots) == 6  # 4 on the head, 2 on gpu1
    ray_run = {"cluster": {"backend": "ray", "address": "10.0.0.5:6379"}}
    spans = parse_config({"pipelines": [{"name": "g", "task": "regression", "ranks": 5}], **ray_run}, "c.toml")
    assert gang_problems(spans, slots) == []  # no node has 5 slots: the gang spans both
    big = parse_config({"pipelines": [{"name": "g", "task": "regression", "ranks": 7}], **ray_run}, "c.toml")
    [problem] = gang_problems(big, slots)
    assert problem.key == "pipelines[0].ranks" and "7 ranks need 7 device slots" in problem.message


def test_node_book_moves_work_off_a_node_that_left():
    book = NodeBook(cluster_inventory(read_nodes(NODES)))
    first = book.choose("cpu", 2)
    book.hold("run/a/1", first, "cpu", 2)
    assert first == "aa" * 14
    assert book.choose("cpu", 2) in ("aa" * 14, "bb" * 14)
    assert book.refresh(read_nodes(NODES[1:])) == ["head"]
    assert book.choose("cpu", 2) == "bb" * 14
    book.hold("run/b/1", "bb" * 14, "cpu", 2)
    with pytest.raises(NoRoom, match="no live node"):
        book.choose("cpu", 1)


def test_slots_follow_the_cluster_and_an_allocation_on_a_node_that_left_moves():
    from torchherd.engine.supervise.scheduler import Scheduler

    devices = DevicesConfig(placement="cpu", cpu_slots=3)
    slots, _ = plan_cluster_slots(devices, cluster_inventory(read_nodes(NODES)))
    sched = Scheduler(slots)
    for name in ("a", "b", "c"):
        sched.enqueue(name, 0, ord(name))
    grants = dict(sched.allocate())
    assert [s.node[:2] for s in grants["b"]] == ["bb"] and sched.free == []
    # The GPU node leaves: the head alone holds the three slots (4 CPUs), of which a and c hold two.
    book = NodeBook(cluster_inventory(read_nodes(NODES)))
    book.refresh(read_nodes(NODES[:1]))
    assert book.generation == 1
    shrunk, problems = plan_cluster_slots(devices, book.inventory, fit=True)
    assert problems == [] and [s.node[:2] for s in shrunk] == ["aa"] * 3
    sched.resize(shrunk)
    assert len(sched.free) == 1  # counted by node, not by name: cpu1 is b's name and a free head slot's
    moved = sched.refit(grants["b"])
    assert moved is not None and moved[0].node == "aa" * 14 and sched.free == []
    assert sched.refit(grants["a"]) is grants["a"]  # a live allocation stays as it is
    sched.release(moved)
    assert len(sched.free) == 1
    # Asked for more CPU slots than the live nodes hold, a running session takes what there is.
    fewer, problems = plan_cluster_slots(DevicesConfig(placement="cpu", cpu_slots=6), book.inventory, fit=True)
    assert problems == [] and len(fewer) == 4


def test_refit_without_a_free_slot_leaves_the_allocation():
    from torchherd.engine.supervise.scheduler import Scheduler

    inv = cluster_inventory(read_nodes(NODES))
    slots, _ = plan_cluster_slots(DevicesConfig(placement="cpu", cpu_slots=2, threads_per_worker=2), inv)
    sched = Scheduler(slots)
    sched.enqueue("a", 0, 0)
    sched.enqueue("b", 0, 1)
    grants = dict(sched.allocate())
    sched.resize([s for s in slots if s.node == "aa" * 14])  # the head's one slot is a's
    assert sched.refit(grants["b"]) is None
    sched.release(grants["a"])
    assert sched.refit(grants["b"]) == [slots[0]]


async def test_only_the_attempts_token_opens_the_connection():
    listener = DialBackListener("127.0.0.1")
    got: list[socket.socket] = []
    arrived = asyncio.Event()
    token = listener.expect(lambda sock: (got.append(sock), arrived.set()))
    host, port = listener.address.rsplit(":", 1)
    try:
        # A stranger with a wrong token is cut off without a word.
        stranger = await asyncio.to_thread(socket.create_connection, (host, int(port)))
        stranger.sendall(b"0" * 32)
        assert await asyncio.to_thread(stranger.recv, 1) == b""
        stranger.close()
        # The child with the right one gets through, and its framed batches read back as events.
        status, control = await asyncio.to_thread(dial_back, listener.address, token)
        await asyncio.wait_for(arrived.wait(), 10)
        sender = StatusSender(status)
        sender.send(Notice(text="hello"))
        sender.close()
        sock = got[0]
        data = await asyncio.to_thread(sock.recv, 1 << 16)
        assert [e.text for e in decode_batch(data[4:])] == ["hello"]
        assert listener.rejected == 1
        # A token is good for one connection only.
        again = await asyncio.to_thread(socket.create_connection, (host, int(port)))
        again.sendall(token.encode())
        assert await asyncio.to_thread(again.recv, 1) == b""
        again.close()
        for conn in (status, control, sock):
            conn.close()
    finally:
        listener.close()


def test_validation_runs_on_each_node_across_cluster_nodes():
    from torchherd.engine.launch.ray.placement import plan_cluster_validation

    inv = cluster_inventory(read_nodes(NODES))
    slots, _ = plan_cluster_slots(DevicesConfig(placement="cpu", cpu_slots=2), inv)
    plan = plan_cluster_validation(config(validation={"mode": "background"}), slots, inv)
    assert (plan.mode, plan.device, plan.per_node) == ("background", "cpu", True) and "2 cluster nodes" in plan.why
    one = cluster_inventory(read_nodes(NODES[:1]))
    single = plan_cluster_validation(config(validation={"mode": "background"}), slots[:1], one)
    assert single.mode == "background" and not single.per_node  # one node: one validator, as locally
    busy, _ = plan_cluster_slots(DevicesConfig(placement="cpu", cpu_slots=6), inv)
    assert plan_cluster_validation(config(validation={"mode": "auto"}), busy, inv).mode == "inline"  # no spare core


def service(tmp_path, launcher, results):
    """A validation service over `launcher`; what it publishes, and each result as (pipeline, result) in `results`."""
    from torchherd.engine.protocol.messages import ValResult
    from torchherd.engine.supervise.validation_service import ValidationService

    published = []

    def publish(event):
        published.append(event)
        if isinstance(event, ValResult):
            results.append((event.pipeline, event))

    svc = ValidationService(backend=launcher, publish=publish, run_dir=tmp_path / "run",
                            snapshot_root=tmp_path / "shm" / "torchherd-r-0123", on_early_stop=lambda name, e: None)
    return svc, published


def test_one_validator_per_node_each_watching_its_own_root(tmp_path):
    from torchherd.engine.protocol.messages import ValResult
    from torchherd.engine.hardware.placement import ValidationPlan

    launcher, results = ScriptedLauncher(), []
    svc, _ = service(tmp_path, launcher, results)
    svc.start_for(ValidationPlan("background", "cpu", None, 1, "test", per_node=True))
    assert launcher.specs == []  # none up front: a node gets one with its first validated worker
    a, b, c = (svc.hand_off_dir(n, node) for n, node in (("a", "n1" * 7), ("b", "n2" * 7), ("c", "n1" * 7)))
    assert [s.node for s in launcher.specs] == ["n1" * 7, "n2" * 7]
    roots = [s.child.snapshot_root for s in launcher.specs]
    assert len(set(roots)) == 2 and str(a.parent) == str(c.parent) == roots[0] and str(b.parent) == roots[1]
    assert all(r.startswith(str(svc.snapshot_root) + "-") for r in roots)  # two nodes on one machine never mix
    launcher.handles[1].on_events([ValResult(pipeline="b", epoch=0, step=1, metrics={"loss": 1.0}, seq=1)])
    assert [name for name, _ in results] == ["b"]


def test_a_dead_node_validator_restarts_alone_and_one_whose_node_left_is_dropped(tmp_path):
    import signal
    import time

    from torchherd.engine.protocol.messages import SnapshotSkipped, SnapshotTaken
    from torchherd.engine.hardware.placement import ValidationPlan

    launcher = ScriptedLauncher()
    svc, published = service(tmp_path, launcher, [])
    svc.start_for(ValidationPlan("background", "cpu", None, 1, "test", per_node=True))
    svc.hand_off_dir("a", "n1")
    svc.hand_off_dir("b", "n2")
    svc.on_snapshot("b", SnapshotTaken(pipeline="b", seq=1, epoch=0, step=5, slot=0, stall_ms=0.1, nbytes=8))
    launcher.handles[0].exit(-signal.SIGKILL)
    svc.tick(time.monotonic())
    svc.tick(time.monotonic() + 60)  # past the backoff
    assert [s.node for s in launcher.specs] == ["n1", "n2", "n1"] and launcher.specs[2].child.attempt == 2
    launcher.handles[1].cause = "node left"  # as RayHandle says
    launcher.handles[1].exit(-signal.SIGKILL)
    svc.tick(time.monotonic() + 120)
    assert len(launcher.specs) == 3 and "n2" not in svc.validators  # not restarted on a node that is gone
    skipped = [e for e in published if isinstance(e, SnapshotSkipped)]
    assert [(e.pipeline, e.seq) for e in skipped] == [("b", 1)] and not svc.pending(training_done=True)


def test_a_node_label_with_a_slash_names_one_validator_folder(tmp_path):
    # Regression: a label is "host/id" when the cluster's hosts share a name; the validator's folder was
    # nested under validator-host/ and its spec and log were not where people (and tests) look.
    from torchherd.engine.hardware.placement import ValidationPlan

    class Hosts(ScriptedLauncher):  # two hosts named "vm": ClusterInventory.label tells them apart by node id
        def node_label(self, node):
            return "vm/" + node[:6]

    launcher = Hosts()
    svc, published = service(tmp_path, launcher, [])
    svc.start_for(ValidationPlan("background", "cpu", None, 1, "test", per_node=True))
    svc.hand_off_dir("a", "bb" * 14)
    folder = launcher.specs[0].log_path.parent
    assert folder.parent == svc.run_dir and folder.name == "validator-vm-bbbbbb"
    assert published[0].device.endswith(" on node vm/bbbbbb")


def test_a_local_plan_keeps_one_validator_whatever_the_node(tmp_path):
    from torchherd.engine.hardware.placement import ValidationPlan

    launcher = ScriptedLauncher()
    svc, _ = service(tmp_path, launcher, [])
    svc.start_for(ValidationPlan("background", "cpu", None, 1, "test"))
    assert svc.hand_off_dir("a", "n1") == svc.snapshot_root / "a"  # a one-node cluster: the session's root
    assert [s.node for s in launcher.specs] == [""] and svc.snapshot_root.is_dir()


def test_ensure_root_makes_a_node_root_once_and_refuses_a_stranger(tmp_path):
    import os

    from torchherd.engine.launch.ray.rundir import ensure_root
    from torchherd.engine.rundir.directory import PID_FILE, SNAPSHOT_MARKER

    root = tmp_path / "torchherd-r-0123-n1"
    ensure_root(str(root))
    (root / "a").mkdir()  # a worker's snapshots: a second actor on the node must keep them
    ensure_root(str(root), own=True)
    assert (root / "a").is_dir() and (root / SNAPSHOT_MARKER).is_file()
    assert (root / PID_FILE).read_text().split() == [str(os.getpid())]
    assert oct(root.stat().st_mode & 0o777) == "0o700" and [p.name for p in tmp_path.iterdir()] == [root.name]
    stranger = tmp_path / "torchherd-r-0123-n2"
    stranger.mkdir()  # no marker: not ours to adopt
    with pytest.raises(OSError):
        ensure_root(str(stranger))


class RemoteHandle(FakeHandle):
    """A scripted attempt on another node whose pid is known only once its actor has started the child."""

    node = "node2"
    known = False

    @property
    def pids(self):
        return (self.pid,) if self.known else ()


async def test_worker_started_waits_for_the_remote_pid_and_names_the_node(tmp_path):
    # Regression: on Ray every worker_started said pid 0 (the actor had not started the child yet).
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.supervise.supervisor import Supervisor

    launcher = ScriptedLauncher()
    launcher.make = lambda n: RemoteHandle(0)  # as a RayHandle: pid 0 until the actor says
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False}, validation={"mode": "inline"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=1), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        await until(lambda: launcher.handles)
        handle = launcher.handles[0]
        await until(lambda: sup.view("a").state.value == "starting")
        assert sup.view("a").node == "node2"
        handle.pid, handle.known = 7000, True
        started = await wait_for(events, lambda e: isinstance(e, WorkerStarted))
        assert (started.pid, started.node) == (7000, "node2")  # an early one would say pid 0
    finally:
        await sup.shutdown(graceful=False)


def test_the_headless_line_names_the_node():
    import io

    from torchherd.engine.protocol.messages import WorkerStarted
    from torchherd.tui.headless import LinePrinter

    out = io.StringIO()
    printer = LinePrinter(out, start=0.0)
    printer.handle(WorkerStarted(pipeline="a", pid=41, device="cpu1", attempt=1, node="gpu1"))
    printer.handle(WorkerStarted(pipeline="b", pid=42, device="cpu0", attempt=1))
    text = out.getvalue()
    assert "a: started pid 41 on cpu1 of node gpu1 (attempt 1)" in text
    assert "b: started pid 42 on cpu0 (attempt 1)" in text


async def test_the_node_column_shows_only_when_a_pipeline_runs_elsewhere():
    from textual.app import App

    from torchherd.engine.protocol.progress import PipelineProgress
    from torchherd.tui.widgets.pipeline_table import PipelineTable

    class One(App):
        def compose(self):
            yield PipelineTable()

    app = One()
    async with app.run_test(size=(140, 8)) as pilot:
        table = app.query_one(PipelineTable)
        table.update_rows([PipelineProgress(name="a", device="cpu0")], 0.0, 140)
        await pilot.pause()
        assert "node" not in table.render_line(0).text
        table.update_rows([PipelineProgress(name="a", device="cpu0"),
                           PipelineProgress(name="b", device="cpu1", node="gpu1")], 0.0, 140)
        await pilot.pause()
        assert "node" in table.render_line(0).text and "gpu1" in table.render_line(2).text
        assert table.cell("a", "node") == "-"


async def test_telemetry_samples_only_workers_on_this_machine(tmp_path):
    # Regression: a worker's pid on another node was sampled from this machine's /proc (someone else's process).
    import os

    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.protocol.telemetry import TelemetrySnapshot
    from torchherd.engine.supervise.supervisor import Supervisor

    launcher = ScriptedLauncher()
    here = os.getpid()  # a live local process, so the local one is sampled for sure
    launcher.make = lambda n: FakeHandle(here) if n == 0 else RemoteHandle(here)
    config = make_config(tmp_path, [{"name": "local"}, {"name": "remote"}], validation={"mode": "inline"},
                         telemetry={"enabled": True, "interval": 0.05})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        snap = await wait_for(events, lambda e: isinstance(e, TelemetrySnapshot) and e.processes)
        assert [p.pipeline for p in snap.processes] == ["local"]
    finally:
        await sup.shutdown(graceful=False)


async def test_shutdown_closes_a_launcher_that_can_be_closed(tmp_path):
    # Regression: a Ray session ended with the dial-back listener's socket still open.
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.supervise.supervisor import Supervisor

    class Closable(ScriptedLauncher):
        closed = 0

        def close(self):
            self.closed += 1

    launcher = Closable()
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False}, validation={"mode": "inline"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=1), tick=0.005)
    await sup.start()
    await until(lambda: launcher.handles)
    await sup.shutdown(graceful=False)
    await sup.shutdown(graceful=False)
    assert launcher.closed == 1


async def test_the_listener_closes_once():
    listener = DialBackListener("127.0.0.1")
    listener.expect(lambda sock: None)
    listener.close()
    listener.close()  # a second close (the launcher's, after the supervisor's) is harmless


async def test_an_attempt_lost_with_its_node_restarts_without_spending_the_budget(tmp_path):
    import signal

    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.protocol.messages import WorkerExited
    from torchherd.engine.supervise.supervisor import Supervisor

    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False}, validation={"mode": "inline"},
                         restart={"max_restarts": 0})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=1), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        await until(lambda: launcher.handles)
        launcher.handles[0].started("a")
        await until(lambda: sup.view("a").state.value == "running")
        launcher.handles[0].cause = "node left"  # as RayHandle says when the actor's node is gone
        launcher.handles[0].exit(-signal.SIGKILL)
        exited = await wait_for(events, lambda e: isinstance(e, WorkerExited))
        assert exited.reason == "restarted"
        await until(lambda: len(launcher.handles) == 2)  # a budget of 0 would have failed it instead
        assert sup.view("a").restarts == 0 and sup.view("a").attempt == 2
    finally:
        await sup.shutdown(graceful=False)


# ------------------------------------------------------------ other nodes' telemetry


class _Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error, self.ready = value, error, False


class _FakeRay:
    """The few Ray calls RemoteTelemetry makes: an answer is ready only when the test says so."""

    def __init__(self):
        self.made, self.calls, self.killed = [], [], []
        self.util = SimpleNamespace(scheduling_strategies=SimpleNamespace(
            NodeAffinitySchedulingStrategy=lambda node, soft: ("on", node, soft)))

    def wait(self, refs, timeout):
        assert timeout == 0  # never waits on a node
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def get(self, ref):
        if ref.error:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart):
        self.killed.append(actor)

    def actor_class(self):
        fake = self

        class Actor:
            def __init__(self, options):
                self.options_ = options
                self.sample = SimpleNamespace(remote=self._sample)

            def _sample(self, pids):
                ref = _Ref()
                fake.calls.append((self, dict(pids), ref))
                return ref

        return SimpleNamespace(options=lambda **kw: SimpleNamespace(remote=lambda: fake.made.append(Actor(kw))
                                                                    or fake.made[-1]))


def _snap(*names, gpus=()):
    return TelemetrySnapshot(processes=tuple(ProcessSample(pipeline=n, pid=100 + i, cpu_percent=1.0, rss=1,
                                                           children=0) for i, n in enumerate(names)),
                             gpus=gpus, host_cpu_percent=5.0)


def test_merge_labels_other_nodes_rows_and_keeps_local_ones_as_they_were():
    local = _snap("a", gpus=(GpuSample(index=0, uuid="u0", name="H"),))
    remote = _snap("b", gpus=(GpuSample(index=0, uuid="u1", name="H"),))
    merged = merge(local, {"node2": remote})
    assert [(p.pipeline, p.node) for p in merged.processes] == [("a", ""), ("b", "node2")]
    assert [(g.uuid, g.node) for g in merged.gpus] == [("u0", ""), ("u1", "node2")]
    assert merged.host_cpu_percent == 5.0  # host figures stay this machine's
    assert merge(local, {}) is local
    back = from_record(json.loads(json.dumps(to_record(merged))))
    assert back == merged and back.processes[1].node == "node2"


def test_remote_telemetry_asks_each_node_once_at_a_time_and_merges_what_arrived():
    fake = _FakeRay()
    wanted = {"n2" * 14: {"b": 42}}
    remote = RemoteTelemetry(lambda: wanted, lambda node: "node2", ray=fake, actor_class=fake.actor_class())
    first = remote.extend(_snap("a"))
    assert [p.node for p in first.processes] == [""]  # nothing has answered yet
    assert len(fake.made) == 1 and fake.made[0].options_["scheduling_strategy"] == ("on", "n2" * 14, False)
    assert fake.made[0].options_["num_cpus"] == 0
    remote.extend(_snap("a"))
    assert len(fake.calls) == 1  # the first call is still out: not asked again
    actor, pids, ref = fake.calls[0]
    assert pids == {"b": 42}
    ref.value, ref.ready = _snap("b"), True
    merged = remote.extend(_snap("a"))
    assert [(p.pipeline, p.node) for p in merged.processes] == [("a", ""), ("b", "node2")]
    assert len(fake.calls) == 2  # and the next question is out
    wanted.clear()  # its workers ended: its sampler goes, and so do its rows
    assert [p.node for p in remote.extend(_snap("a")).processes] == [""]
    assert fake.killed == [actor]


def test_a_node_sampler_that_died_is_replaced():
    fake = _FakeRay()
    wanted = {"n2" * 14: {"b": 42}}
    remote = RemoteTelemetry(lambda: wanted, lambda node: "node2", ray=fake, actor_class=fake.actor_class())
    remote.extend(_snap("a"))
    fake.calls[0][2].error, fake.calls[0][2].ready = RuntimeError("actor died"), True
    assert [p.node for p in remote.extend(_snap("a")).processes] == [""]
    assert len(fake.made) == 2 and fake.killed == [fake.made[0]]
    remote.close()
    assert fake.killed == fake.made


async def test_a_token_of_non_ascii_bytes_is_refused_not_raised_on():
    # Regression: hmac.compare_digest raised TypeError on a str token with non-ASCII characters, in a callback
    # of the event loop, and the connection was never closed.
    listener = DialBackListener("127.0.0.1")
    listener.expect(lambda sock: None)
    host, port = listener.address.rsplit(":", 1)
    try:
        stranger = await asyncio.to_thread(socket.create_connection, (host, int(port)), 10)
        stranger.sendall(b"\xff" * 32)
        assert await asyncio.to_thread(stranger.recv, 1) == b""  # cut off (10 s timeout: socket.timeout)
        stranger.close()
        assert listener.rejected == 1
    finally:
        listener.close()


async def test_connections_that_never_send_a_token_are_capped():
    # Regression: every silent connection was held for HELLO_TIMEOUT (30 s), however many there were.
    from torchherd.engine.launch.ray import transport

    listener = DialBackListener("127.0.0.1")
    listener.expect(lambda sock: None)
    host, port = listener.address.rsplit(":", 1)
    silent = []
    try:
        for _ in range(transport.MAX_GREETING + 5):
            silent.append(await asyncio.to_thread(socket.create_connection, (host, int(port)), 10))
        # The five beyond the cap are closed at once; the others wait for their token.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while listener.rejected < 5 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert listener.rejected == 5 and len(listener._greeting) == transport.MAX_GREETING
    finally:
        for conn in silent:
            conn.close()
        listener.close()


def test_a_pickle_after_the_token_is_never_unpickled(tmp_path):
    # Regression: after the token, batches were unpickled from plain TCP: anyone on the path could run code.
    import os
    import pickle

    from torchherd.engine.launch.channel_handle import ChannelHandle
    from torchherd.engine.protocol.channel import ChannelError

    marker = tmp_path / "ran"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    payload = pickle.dumps([RunsCode()])
    with pytest.raises(ChannelError):
        decode_batch(payload)
    # Through a worker's channel: the batch is left out, saying so, and the next one is read.
    from multiprocessing import Pipe

    class Channel(ChannelHandle):  # only the channel: no process behind it
        poll = terminate = kill = dump_stacks = close = lambda self, *a: None

    reader, writer = Pipe(duplex=False)
    handle = Channel(reader, Pipe(duplex=False)[1])
    writer.send_bytes(payload)
    writer.send_bytes(encode_batch([Notice(text="next")]))
    writer.close()
    events = handle.drain()
    assert [type(e).__name__ for e in events] == ["Notice", "Notice"]
    assert "not a batch" in events[0].text and events[1].text == "next"
    assert not marker.exists()
