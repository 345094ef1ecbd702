"""What `torchherd ls` and attach do with the socket a run folder's control.json names: control.json is data
anyone may have written, so only this user's own stale socket, in its private runtime folder, is removed, and a
client talks only to a supervisor of its own user."""
from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from torchherd.engine.rundir.directory import RunDirectory
from torchherd.engine.serve import remote
from torchherd.engine.serve.remote import NotLive, RemoteRun
from torchherd.engine.serve.runtime import CONTROL_FILE, clean_stale, runtime_dir, socket_path
from torchherd.tui.verbs import list_command


@pytest.fixture
def private_runtime(monkeypatch):
    """A runtime folder of the test's own (short: AF_UNIX paths hold at most 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="th-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    yield runtime_dir()
    shutil.rmtree(base, ignore_errors=True)


def dead_run(runs_dir: Path, socket_named: Path) -> Path:
    """A run folder as a dead supervisor (or someone hostile) left it: started, never finished, control.json."""
    run_dir = runs_dir / "20260101-000000-copied"
    run_dir.mkdir(parents=True)
    line = {"type": "run_started", "time": 1.0, "run_id": run_dir.name, "run_dir": str(run_dir),
            "config_path": None, "pipelines": ["a"]}
    (run_dir / "events.jsonl").write_text(json.dumps(line) + "\n")
    (run_dir / CONTROL_FILE).write_text(json.dumps({"socket": str(socket_named), "pid": 1}))
    return run_dir


def bound(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_ls_leaves_alone_a_file_that_control_json_names(tmp_path, private_runtime):
    # Regression: `torchherd ls` unlinked whatever path a run folder's control.json named (victim.txt was gone).
    victim = tmp_path / "victim.txt"
    victim.write_text("a paper's results\n")
    dead_run(tmp_path / "runs", victim)
    out = io.StringIO()
    assert list_command(tmp_path / "runs", as_json=False, out=out) == 0
    assert "cut short, resumable" in out.getvalue()
    assert victim.read_text() == "a paper's results\n"


def test_a_socket_of_another_run_in_the_runtime_folder_is_left_alone(tmp_path, private_runtime):
    # Regression: a copied run folder's control.json naming a live run's socket had that socket unlinked.
    other = private_runtime / "someone-else.sock"
    with bound(other):
        run_dir = dead_run(tmp_path / "runs", other)
        assert clean_stale(run_dir)
        assert other.exists()
        assert not (run_dir / CONTROL_FILE).exists()


def test_a_file_in_the_runtime_folder_under_the_runs_own_socket_name_is_not_unlinked(tmp_path, private_runtime):
    run_dir = dead_run(tmp_path / "runs", Path("/nonexistent"))
    not_a_socket = socket_path(run_dir)
    not_a_socket.write_text("not a socket\n")
    (run_dir / CONTROL_FILE).write_text(json.dumps({"socket": str(not_a_socket), "pid": 1}))
    clean_stale(run_dir)
    assert not_a_socket.read_text() == "not a socket\n"


def test_the_runs_own_stale_socket_is_cleaned_up(tmp_path, private_runtime):
    run_dir = dead_run(tmp_path / "runs", Path("/nonexistent"))
    sock = socket_path(run_dir)
    bound(sock).close()  # a supervisor that died (SIGKILL) leaves its socket file behind
    (run_dir / CONTROL_FILE).write_text(json.dumps({"socket": str(sock), "pid": 1}))
    assert clean_stale(run_dir)
    assert not sock.exists()


async def test_a_client_refuses_a_socket_another_user_serves(tmp_path, private_runtime, monkeypatch):
    # Regression: the client never checked who served the socket control.json named before sending to it.
    run_dir = tmp_path / "run"
    held = RunDirectory(run_dir)  # the run reads as live: its pid file is locked
    sock = private_runtime / "served.sock"
    greeted = asyncio.Event()

    async def serve(reader, writer):
        greeted.set()
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(sock))
    (run_dir / CONTROL_FILE).write_text(json.dumps({"socket": str(sock), "pid": os.getpid()}))
    seen: list[int] = []
    monkeypatch.setattr(remote, "same_user", lambda uid: seen.append(uid) or False)  # as if another uid served it
    try:
        with pytest.raises(NotLive, match="not by this user"):
            await RemoteRun.connect(run_dir)
        assert seen == [os.getuid()]  # the kernel's word on the server, not control.json's
    finally:
        server.close()
        await server.wait_closed()
        held.close()
