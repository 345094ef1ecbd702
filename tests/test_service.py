"""A run's supervisor as a service with a control socket: who may connect, what the CLI does with a live
run, how a client's history and live stream meet, and what happens to a client that stops reading.

Real processes, real sockets, real files. Nothing sleeps a fixed while: every wait polls a condition (or
an event stream) up to a generous deadline, so the tests hold on a loaded two-core machine.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from torchherd.engine.config.load import load_config
from torchherd.engine.protocol.control import Action, ClientRefused, Hello
from torchherd.engine.protocol.messages import Event, RunFinished, StepMetrics
from torchherd.engine.protocol.progress import PipelineProgress, apply
from torchherd.engine.protocol.records import to_record
from torchherd.engine.rundir.directory import (
    PID_FILE,
    RunDirectory,
    RunTaken,
    dumps,
    read_records,
    run_held,
)
from torchherd.engine.rundir.history import read_history
from torchherd.engine.serve import server as server_module
from torchherd.engine.serve.remote import YOUNG, NotLive, RemoteRun
from torchherd.engine.serve.runtime import publish, read_control, withdraw
from torchherd.engine.serve.server import ControlServer
from torchherd.engine.serve.service import ServiceFailed, spawn
from torchherd.engine.serve.wire import encode, peer_credentials, same_user
from torchherd.engine.supervise.supervisor import Supervisor

from tests.conftest import TASKS, service_of, repo_env
from tests.faults.support import (
    REPO,
    faulty_config,
    is_alive,
    poll_until,
    records,
    wait_gone,
    write_toml,
)

NOBODY = 65534  # the uid of a process of another user
LONG = 180.0  # seconds: the deadline of every wait on a run (a loaded two-core machine is slow, not stuck)


# ------------------------------------------------------------------ helpers


def torchherd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torchherd ARGS` from another shell, as a person would type it."""
    return subprocess.run([sys.executable, "-m", "torchherd", *args], capture_output=True, text=True,
                          check=False, timeout=timeout, cwd=REPO, env=repo_env(),
                          stdin=subprocess.DEVNULL)


def long_config(path: Path, pipelines: tuple[str, ...] = ("first", "second"), **defaults: Any) -> Path:
    """A TOML config whose pipelines would train for hours if nobody stopped them (a loaded machine included)."""
    params = {"samples": 256, "delay": 0.002, **defaults.pop("params", {})}
    defaults = {"max_epochs": 100_000, "batch_size": 32, **defaults}
    lines = [f'name = "svc-{uuid.uuid4().hex[:8]}"', "[defaults]", f'task = "{TASKS / "tiny.py"}:build"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in defaults.items()]
    lines.append("params = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items()) + " }")
    for name in pipelines:
        lines += ["[[pipelines]]", f'name = "{name}"']
    lines += ["[devices]", 'placement = "cpu"', "cpu_slots = 2", "[telemetry]", "enabled = false"]
    return write_toml(path, "\n".join(lines) + "\n")


def of_type(recs: list[dict[str, Any]], kind: str, **fields: Any) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("type") == kind and all(r.get(k) == v for k, v in fields.items())]


def stepping(run_dir: Path, names: set[str], more_than: int = 0) -> Callable[[], bool]:
    """A condition: each pipeline in `names` has reported more than `more_than` steps."""
    def check() -> bool:
        recs = records(run_dir)
        return all(len(of_type(recs, "step", pipeline=n)) > more_than for n in names)
    return check


async def apoll(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """poll_until for a test whose supervisor runs on this event loop (so it must not block it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := predicate()):
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
    return value


@pytest.fixture
def sock_dir():
    """A short folder for an in-process server's socket (AF_UNIX paths hold at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="th-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def served(sup: Supervisor, sock: Path, **kw: Any) -> AsyncIterator[ControlServer]:
    """`sup` started and served on `sock` in this process, as the service does; always shut down after."""
    await sup.start()
    server = ControlServer(sup, sock, **kw)
    try:
        await server.start()
        publish(sup.run_dir, sock)
        yield server
    finally:
        await sup.shutdown(graceful=False)
        await server.close()
        withdraw(sup.run_dir, sock)


@pytest.fixture
def default_collector():
    """Python's own collector thresholds for the test, whatever an earlier test's client set; put back after."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def raw_client(sock: Path, *, read_only: bool = True, live: bool = True) -> socket.socket:
    """A connected socket that has said hello, and reads nothing unless the test does."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(sock))
    raw.sendall(encode(Hello(pid=os.getpid(), read_only=read_only, live=live)))
    return raw


def stop_service(run_dir: Path) -> None:
    """End a service a test started (if still there): SIGTERM stops it gracefully, SIGKILL if it lingers."""
    try:
        service = service_of(run_dir)
        if "torchherd.engine.serve.service" not in service.cmdline():
            return  # the pid is no longer a service's
    except (OSError, ValueError, IndexError, psutil.Error):
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        service.send_signal(signal.SIGTERM)
    if wait_gone([service], LONG):
        for p in [service] + service.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        wait_gone([service], 30)


# ------------------------------------------------------------------ peer credentials


def test_peer_credentials_of_a_socketpair_are_this_process():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())
        assert peer_credentials(b) == (os.getpid(), os.getuid(), os.getgid())
    assert same_user(os.getuid())
    assert not same_user(os.getuid() + 1)
    assert not same_user(NOBODY if os.getuid() != NOBODY else 0)


def test_peer_credentials_across_a_listening_socket_name_the_connecting_process(sock_dir):
    # A real connect/accept: the accepted side sees the connecting process, as the server does.
    path = sock_dir / "l.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
            accepted, _ = listener.accept()
            with accepted:
                assert peer_credentials(accepted) == (os.getpid(), os.getuid(), os.getgid())


# ------------------------------------------------------------------ clients that are refused

# The other user's side: connect, say hello, and report what came back (a Welcome would be data).
OTHER_USER_CLIENT = r"""
import os, socket, sys
print(os.getpid(), os.getuid())
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(120)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    print("eof", len(got))
except (ConnectionResetError, BrokenPipeError) as exc:
    print("reset", type(exc).__name__)
"""


def _python_runnable_by(uid: int) -> str | None:
    """An interpreter that `uid` may execute (ours may sit under a home folder only we can enter)."""
    candidates = [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", ""),
                  "/usr/bin/python3", shutil.which("python3") or ""]
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            if subprocess.run([exe, "-I", "-S", "-c", "pass"], user=uid, cwd="/", capture_output=True,
                              check=False, timeout=120).returncode == 0:
                return exe
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def _quiet_config(tmp_path: Path):
    """One pipeline on the gated faulty task, so it holds at its first step: a live run that makes no noise."""
    return faulty_config(tmp_path, [{"name": "a"}], defaults={
        "params": {"gate_file": str(tmp_path / "never"), "gate_at_call": 1}})


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
async def test_a_client_of_another_user_is_refused_and_recorded(tmp_path, sock_dir):
    python = await asyncio.to_thread(_python_runnable_by, NOBODY)
    if python is None:
        pytest.skip(f"no Python interpreter that uid {NOBODY} may run")
    sup = Supervisor(_quiet_config(tmp_path))
    # The socket's folder (0700) and mode (0600) keep other users out before any check; opened here on
    # purpose so the peer-credential check is all that stands between them and the run.
    os.chmod(sock_dir, 0o711)
    sock = sock_dir / "c.sock"
    async with served(sup, sock) as server:
        os.chmod(sock, 0o666)
        stream = sup.subscribe(replay=False)
        hello = encode(Hello(pid=12345, read_only=False)).hex()
        out = await asyncio.to_thread(subprocess.run, [python, "-I", "-S", "-c", OTHER_USER_CLIENT, str(sock), hello],
                                      user=NOBODY, cwd="/", capture_output=True, text=True, timeout=LONG)
        assert out.returncode == 0, out.stderr
        ids, verdict = out.stdout.splitlines()
        pid, uid = map(int, ids.split())
        assert uid == NOBODY
        # Closed on it before a word: no Welcome, nothing at all.
        assert verdict in ("eof 0", "reset ConnectionResetError", "reset BrokenPipeError"), out.stdout
        refused = await asyncio.wait_for(_first_of(stream, ClientRefused), LONG)
        assert (refused.uid, refused.pid) == (NOBODY, pid)  # the kernel's word, not the hello's pid
        assert refused.reason == "another user's process"
        assert server.clients == []  # never joined the live stream
        # It reaches events.jsonl (flushed by the supervisor's tick).
        recs = await apoll(lambda: of_type(records(sup.run_dir), "client_refused"), LONG, "client_refused on disk")
        assert [(r["uid"], r["pid"]) for r in recs] == [(NOBODY, refused.pid)]
        # The run's own user is still served.
        run = await RemoteRun.connect(sup.run_dir, read_only=True, live=False, history=False)
        assert run.welcome.run_id == sup.run_id
        await run.close()


@pytest.mark.slow
async def test_a_client_the_credential_check_rejects_gets_no_welcome_and_is_recorded(tmp_path, sock_dir,
                                                                                    monkeypatch):
    # Runs as any user: the server's check is told this uid is not its own.
    monkeypatch.setattr(server_module, "same_user", lambda uid: False)
    sup = Supervisor(_quiet_config(tmp_path))
    async with served(sup, sock_dir / "c.sock") as server:
        stream = sup.subscribe(replay=False)
        with pytest.raises((NotLive, ConnectionError)):
            await asyncio.wait_for(RemoteRun.connect(sup.run_dir, history=False), LONG)
        refused = await asyncio.wait_for(_first_of(stream, ClientRefused), LONG)
        assert refused.uid == os.getuid() and refused.pid == os.getpid()
        assert server.clients == []
        recs = await apoll(lambda: of_type(records(sup.run_dir), "client_refused"), LONG, "client_refused on disk")
        assert [(r["uid"], r["pid"]) for r in recs] == [(os.getuid(), os.getpid())]


@pytest.mark.slow
async def test_a_read_only_client_is_refused_actions_and_every_request_is_recorded(tmp_path, sock_dir,
                                                                                    default_collector):
    sup = Supervisor(_quiet_config(tmp_path))
    async with served(sup, sock_dir / "c.sock"):
        watcher = await RemoteRun.connect(sup.run_dir, read_only=True, live=False, history=False)
        try:
            reply = await asyncio.wait_for(watcher.request(Action.STOP), LONG)
            assert (reply.ok, reply.text) == (False, "this client is read-only")
            detached = await asyncio.wait_for(watcher.request(Action.DETACH), LONG)
            assert detached.ok  # leaving is always allowed
        finally:
            await watcher.close()
        writer = await RemoteRun.connect(sup.run_dir, live=False, history=False)
        try:
            unknown = await asyncio.wait_for(writer.request(Action.PAUSE, "nosuch"), LONG)
            assert (unknown.ok, unknown.text) == (False, "no pipeline named 'nosuch'")
        finally:
            await writer.close()
        assert sup.views()[0].state.value not in ("stopping", "stopped")  # the refused stop did nothing
        assert gc.get_threshold()[0] == 700  # clients that follow nothing leave the collector alone
        recs = await apoll(lambda: (found := of_type(records(sup.run_dir), "client_command"))[1:] and found, LONG,
                           "both client commands on disk")
        assert [(r["action"], r["pipeline"], r["ok"], r["client_pid"]) for r in recs] == [
            ("stop", "", False, os.getpid()), ("pause", "nosuch", False, os.getpid())]
        assert recs[0]["text"] == "this client is read-only"


async def _first_of(stream, kind: type) -> Event:
    async for event in stream:
        if isinstance(event, kind):
            return event
    raise AssertionError(f"the stream ended before a {kind.__name__}")


# ------------------------------------------------------------------ the CLI against a live service


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cli_detached_run_is_listed_steered_stopped_and_then_not_live(tmp_path):
    config = long_config(tmp_path / "long.toml")
    runs = tmp_path / "runs"
    run_dir = None
    try:
        started = torchherd("run", str(config), "--detach", "--runs-dir", str(runs))
        assert started.returncode == 0, started.stdout + started.stderr
        [line] = [ln for ln in started.stdout.splitlines() if ln.strip().startswith("run directory:")]
        run_dir = Path(line.split(":", 1)[1].strip())
        assert run_dir.parent == runs and f"torchherd stop {run_dir}" in started.stdout
        # The CLI has returned; the run lives on in a service of its own session.
        service = service_of(run_dir)
        assert is_alive(service) and os.getsid(service.pid) == service.pid
        assert service.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        assert run_held(run_dir)
        control = read_control(run_dir)
        assert control is not None and control.pid == service.pid and control.socket.exists()
        steps_at_return = len(of_type(records(run_dir), "step"))
        poll_until(stepping(run_dir, {"first", "second"}), LONG, "both pipelines to train")
        poll_until(lambda: len(of_type(records(run_dir), "step")) > steps_at_return, LONG,
                   "steps after the CLI returned")

        listed = torchherd("ls", "--json", "--runs-dir", str(runs))
        assert listed.returncode == 0, listed.stderr
        [entry] = json.loads(listed.stdout)
        assert (entry["run_id"], entry["live"], entry["state"], entry["pid"]) == (run_dir.name, True, "live",
                                                                                 service.pid)
        plain = torchherd("ls", "--runs-dir", str(runs))
        assert plain.returncode == 0 and plain.stdout.startswith(run_dir.name), plain.stdout
        assert f" live (pid {service.pid}) " in plain.stdout and "first, second" in plain.stdout

        # Bad input: exit 2, and nothing reaches the run.
        nosuch = torchherd("kill", str(run_dir), "nosuch")
        assert nosuch.returncode == 2, nosuch.stderr
        assert "no pipeline named 'nosuch'" in nosuch.stderr and "first, second" in nosuch.stderr
        unnamed = torchherd("pause", str(run_dir))
        assert unnamed.returncode == 2  # argparse: NAME is required for pause
        assert "the following arguments are required: NAME" in unnamed.stderr, unnamed.stderr
        unknown_run = torchherd("stop", "no-such-run", "--runs-dir", str(runs))
        assert unknown_run.returncode == 2 and "no-such-run: no such run" in unknown_run.stderr
        assert not of_type(records(run_dir), "client_command")

        # pause and resume-pipeline take, and are recorded with the asking client's pid.
        paused = torchherd("pause", str(run_dir), "first")
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.strip() == f"{run_dir.name}: pause first"
        poll_until(lambda: of_type(records(run_dir), "worker_state", pipeline="first", state="paused"), LONG,
                   "first to be paused")
        resumed = torchherd("resume-pipeline", str(run_dir), "first")
        assert resumed.returncode == 0, resumed.stderr
        poll_until(lambda: of_type(records(run_dir), "worker_state", pipeline="first", state="running",
                                   previous="paused"), LONG, "first to run again")
        commands = of_type(records(run_dir), "client_command")
        assert [(c["action"], c["pipeline"], c["ok"]) for c in commands] == [("pause", "first", True),
                                                                             ("unpause", "first", True)]
        assert all(c["client_pid"] not in (0, service.pid, os.getpid()) for c in commands)

        stopped = torchherd("stop", run_dir.name, "--runs-dir", str(runs))  # by run id this time
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"{run_dir.name}: stop every pipeline"
        assert not wait_gone([service], LONG), "the service did not end after the stop"

        recs = records(run_dir)
        assert recs[-1]["type"] == "run_finished", recs[-3:]
        assert recs[-1]["statuses"] == {"first": "stopped", "second": "stopped"} and recs[-1]["ok"] is False
        for name in ("first", "second"):
            [final] = of_type(recs, "checkpoint_saved", pipeline=name, reason="stop")
            assert final["step"] > 0 and Path(final["path"]).is_file()
            [finished] = of_type(recs, "pipeline_finished", pipeline=name)
            assert (finished["status"], finished["reason"]) == ("stopped", "requested")
        assert of_type(recs, "client_command", action="stop", pipeline="", ok=True)
        # The service cleaned up after itself: no lock, no socket, no control.json.
        assert not run_held(run_dir) and read_control(run_dir) is None and not control.socket.exists()
        assert not (run_dir / PID_FILE).exists()

        again = torchherd("stop", str(run_dir))
        assert again.returncode == 1, again.stdout + again.stderr
        assert "no torchherd supervisor is running it" in again.stderr
        after = torchherd("ls", "--json", "--runs-dir", str(runs))
        [entry] = json.loads(after.stdout)
        assert (entry["live"], entry["state"], entry["resumable"], entry["pid"]) == (False, "stopped, resumable",
                                                                                    True, None)

        # Carried on in the background too: the CLI returns, a new service trains on from the checkpoints.
        resumed = torchherd("resume", str(run_dir), "--detach")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "resuming first, second in the background" in resumed.stdout
        assert f"torchherd stop {run_dir}" in resumed.stdout
        second_service = service_of(run_dir)
        assert second_service.pid != service.pid and is_alive(second_service)
        poll_until(lambda: len(of_type(records(run_dir), "resumed")) == 2, LONG, "both pipelines to resume")
        assert torchherd("stop", str(run_dir)).returncode == 0
        assert not wait_gone([second_service], LONG), "the resumed run's service did not end after the stop"
    finally:
        if run_dir is not None:
            stop_service(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_live_run_cannot_be_resumed_or_opened_again(tmp_path):
    config = long_config(tmp_path / "one.toml", ("only",))
    started = spawn(config=config, runs_dir=tmp_path / "runs")
    run_dir = started.run_dir
    try:
        assert service_of(run_dir).pid == started.pid
        poll_until(stepping(run_dir, {"only"}), LONG, "the pipeline to train")
        for extra in ((), ("--headless",)):
            refused = torchherd("resume", str(run_dir), *extra)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert str(run_dir) in refused.stderr and "still running it" in refused.stderr
        with pytest.raises(RunTaken, match="another torchherd process is running this run") as taken:
            RunDirectory(run_dir)
        assert str(run_dir) in str(taken.value)
        # The service itself refuses too, had the CLI not checked first; and the lock file is untouched.
        with pytest.raises(ServiceFailed, match="another torchherd process is running this run"):
            spawn(resume=run_dir)
        assert (run_dir / PID_FILE).read_text().split() == [str(started.pid)]
        assert read_control(run_dir).pid == started.pid
        before = len(of_type(records(run_dir), "step"))
        poll_until(lambda: len(of_type(records(run_dir), "step")) > before, LONG, "training to go on")
        assert not of_type(records(run_dir), "run_finished")
    finally:
        stop_service(run_dir)
    recs = records(run_dir)
    assert recs[-1]["type"] == "run_finished" and recs[-1]["statuses"] == {"only": "stopped"}
    assert of_type(recs, "pipeline_finished", pipeline="only")[0]["reason"] == "SIGTERM"
    assert len(of_type(recs, "run_started")) == 1  # nothing else ever wrote this run


# ------------------------------------------------------------------ history, then live


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_history_and_live_stream_meet_without_gap_or_duplicate(tmp_path):
    # A step report every step, fast enough that the splice falls mid-stream.
    config = long_config(tmp_path / "steps.toml", ("a",), batch_size=8, log_every_n_steps=1,
                         params={"delay": 0.001})
    started = await asyncio.to_thread(spawn, config=config, runs_dir=tmp_path / "runs")
    run_dir = started.run_dir
    service_of_started = service_of(run_dir)
    try:
        await apoll(stepping(run_dir, {"a"}, more_than=20), LONG, "20 steps before attaching")
        run = await RemoteRun.connect(run_dir)
        history = list(run.history)
        streamed: list[Event] = []
        stream = run.subscribe(replay=True)

        async def take_all() -> None:
            stopping = False
            async for event in stream:
                streamed.append(event)
                live_steps = sum(isinstance(e, StepMetrics) for e in streamed[len(history):])
                if live_steps >= 40 and not stopping:
                    stopping = True
                    run.stop()  # the run ends; its last events, run_finished among them, arrive live

        await asyncio.wait_for(take_all(), LONG)  # ends when the service closes the connection
        await run.close()
        assert not await asyncio.to_thread(wait_gone, [service_of_started], LONG), "the service did not end"
    finally:
        await asyncio.to_thread(stop_service, run_dir)

    assert streamed[:len(history)] == history
    live = streamed[len(history):]
    assert any(isinstance(e, StepMetrics) for e in history) and any(isinstance(e, StepMetrics) for e in live)
    assert isinstance(live[-1], RunFinished)
    # Every event the run wrote, once, in order: the history read from the file and the live events from
    # the socket add up to events.jsonl exactly.
    on_disk = read_records(run_dir / "events.jsonl")
    assert [json.loads(dumps(to_record(e))) for e in streamed] == on_disk
    steps = [e for e in streamed if isinstance(e, StepMetrics) and e.pipeline == "a"]
    numbers = [s.step for s in steps]
    assert numbers == sorted(set(numbers)), "steps repeat or go back"
    for prev, cur in itertools.pairwise(steps):
        assert cur.step - prev.step == 1 + cur.dropped, (prev, cur)  # a report per step; coalesced ones counted
    assert of_type(on_disk, "client_command", action="stop", ok=True)


# ------------------------------------------------------------------ a client that stops reading


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_the_history_in_short_then_every_live_event_with_no_gap(tmp_path, sock_dir, default_collector):
    # What the app attaches with: the supervisor's summary (a few of the step reports, everything else),
    # then the live stream; the fold of it gives the figures the whole history gives.
    config = load_config(long_config(tmp_path / "short.toml", ("a",), batch_size=8, log_every_n_steps=1,
                                     max_epochs=100, params={"delay": 0.001}))
    sup = Supervisor(config)
    async with served(sup, sock_dir / "c.sock") as server:
        server.summary.points = 8
        await apoll(stepping(sup.run_dir, {"a"}, more_than=30), LONG, "30 steps before attaching")
        run = await RemoteRun.connect(sup.run_dir, read_only=True, summary=True)
        assert gc.get_threshold() == (YOUNG, 10, 10)  # a process that follows a run spares its events in flight
        sup.stop()  # the run ends; its last events, run_finished among them, arrive live
        streamed = await asyncio.wait_for(_until(run.subscribe(replay=True), RunFinished), LONG)
        await run.close()
        await sup.wait()
    history, live = streamed[:len(run.history)], streamed[len(run.history):]
    assert history == run.history and isinstance(live[-1], RunFinished)
    on_disk = records(sup.run_dir)
    before = on_disk[:len(on_disk) - len(live)]
    assert [json.loads(dumps(to_record(e))) for e in live] == on_disk[len(before):]  # no gap, no duplicate
    as_records = [json.loads(dumps(to_record(e))) for e in history]
    assert [r for r in as_records if r["type"] != "step"] == [r for r in before if r["type"] != "step"]
    steps, all_steps = of_type(as_records, "step"), of_type(before, "step")
    assert len(all_steps) > 30 and len(steps) <= 9 and steps[0] == all_steps[0] and steps[-1] == all_steps[-1]
    assert _fold(history) == _fold(read_history(sup.run_dir)[:len(before)])


def _fold(events: list[Event]) -> PipelineProgress:
    progress = PipelineProgress(name="a")
    for event in events:
        progress = apply(progress, event)
    return progress


async def _until(stream, kind: type) -> list[Event]:
    got: list[Event] = []
    async for event in stream:
        got.append(event)
        if isinstance(event, kind):
            break
    return got


FLOOD = {"batch_size": 1, "log_every_n_steps": 1, "max_epochs": 2}  # a step report every step, no delay


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_client_that_stops_reading_costs_the_run_nothing_and_catches_up_from_the_file(tmp_path, sock_dir):
    gate = tmp_path / "gate"  # the flood waits until every client is attached and has stopped reading
    config = faulty_config(tmp_path, [{"name": "flood"}], defaults={
        **FLOOD, "params": {"samples": 4000, "gate_file": str(gate), "gate_at_call": 1}})
    sup = Supervisor(config)
    bound = 32 << 10  # the flood's lines are over a MiB: a client sent them would pass this many times over
    out_path = tmp_path / "attached.txt"
    async with served(sup, sock_dir / "c.sock", max_backlog=bound) as server:
        raw = raw_client(server.path)  # says hello, then never reads
        # An attached CLI, then frozen: the same as a terminal that stopped reading.
        cli = attach_cli(sup.run_dir, out_path)
        try:
            await apoll(lambda: len(server.clients) == 2 and out_path.read_text(errors="replace").strip(), LONG,
                        "the CLI to attach and print the run's start")
            cli.send_signal(signal.SIGSTOP)
            gate.touch()
            done = asyncio.ensure_future(asyncio.wait_for(sup.wait(), LONG))
            waiting = []  # what waits in the supervisor for the two clients, sampled while the flood runs
            while not done.done():
                waiting.append(sum(c.backlog() for c in server.clients))
                await asyncio.wait({done}, timeout=0.02)
            assert done.result() == {"flood": "completed"}
            # The run wrote many times the bound while they read nothing (fewer step reports on a loaded
            # machine, where a worker folds those its supervisor has not taken yet, but always hundreds of KiB).
            written = (sup.run_dir / "events.jsonl").stat().st_size
            assert written > 8 * bound and len(waiting) > 1, (written, len(waiting))
            # Neither held the run back or cost it memory: each is only told how far events.jsonl goes.
            assert max(waiting) < bound // 4, waiting
            drops = [r["text"] for r in of_type(records(sup.run_dir), "notice") if "was dropped" in r["text"]]
            assert server.dropped == 0 and not drops and len(server.clients) == 2, (server.dropped, drops)
            # Woken, the CLI reads on in the file from where it stopped, prints the run's end and exits 0.
            cli.send_signal(signal.SIGCONT)
            code = await asyncio.to_thread(cli.wait, LONG)
            said = out_path.read_text(errors="replace")
            assert code == 0 and "flood" in said and "completed" in said and "dropped" not in said, (code, said[-3000:])
            # A fresh client attaches and sees the run's completion.
            fresh = await RemoteRun.connect(sup.run_dir, read_only=True)
            assert any(isinstance(e, RunFinished) and e.ok for e in fresh.history)
            assert fresh.statuses == {"flood": "completed"} and not fresh.alive
            await fresh.close()
        finally:
            raw.close()
            if cli.poll() is None:
                cli.send_signal(signal.SIGCONT)
                cli.kill()
                cli.wait(30)


def attach_cli(run_dir: Path, out_path: Path) -> subprocess.Popen:
    """`torchherd attach RUN --headless --from-start --read-only`, its output in `out_path`."""
    with open(out_path, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "torchherd", "attach", str(run_dir), "--headless",
                                 "--from-start", "--read-only"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO,
                                env=repo_env(PYTHONUNBUFFERED="1"))
