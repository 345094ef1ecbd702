"""A full disk, for real and without root: a file size limit (RLIMIT_FSIZE) set on a live run's supervisor and
workers makes every write past it fail (EFBIG; torchherd ignores SIGXFSZ), as a full disk does. The run goes
on supervising, stops its pipelines at their last checkpoints once checkpoints fail too, says why, writes what
it kept in memory once the limit is lifted, and `torchherd resume` carries it on. A sharded (`fsdp`) gang's
checkpoints, written by every rank through DCP, stop it the same way."""
from __future__ import annotations

import resource
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import TASKS
from tests.faults.support import is_alive, poll_until, records, tree, wait_gone, write_toml
from tests.test_service import LONG, long_config, of_type, stop_service
from torchherd.engine.runners.task import sharded_checkpoint as sharded
from torchherd.engine.serve.service import spawn
from torchherd.engine.worker import checkpoint as ckpt

LIMIT = 4096  # bytes: any file, written past this offset, refuses the write
pytestmark = pytest.mark.slow


def limit_files(procs: list[psutil.Process], size: int) -> None:
    for proc in procs:
        try:
            proc.rlimit(psutil.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        except psutil.NoSuchProcess:
            pass


@pytest.mark.timeout(900)
def test_a_full_disk_stops_the_run_at_its_last_checkpoints_and_resume_carries_it_on(tmp_path):
    # Regression: with events.jsonl unwritable the supervisor's tick task died with OSError 28, a worker's batch
    # was lost, pipelines read `running` after their processes had gone, and shutdown itself raised.
    config = long_config(tmp_path / "full.toml", ("only",))
    started = spawn(config=config, runs_dir=tmp_path / "runs")
    run_dir = started.run_dir
    last = run_dir / "only" / "checkpoints" / ckpt.LAST
    try:
        poll_until(lambda: of_type(records(run_dir), "checkpoint_saved") and (run_dir / "events.jsonl")
                   .stat().st_size > 3 * LIMIT, LONG, "a checkpoint, and events.jsonl past the limit")
        assert last.stat().st_size > LIMIT  # so the next checkpoint cannot be written
        service = psutil.Process(started.pid)
        workers = [p for p in tree(started.pid) if p.pid != started.pid]
        assert workers
        limit_files([service, *workers], LIMIT)
        # Every pipeline ends at its last checkpoint: its processes go, while the supervisor cannot write a line.
        assert not wait_gone(workers, LONG)
        assert is_alive(service)  # waiting for room to write what it holds
        saved = ckpt.load_latest(last.parent)[0]  # intact: it loads, and it is torchherd's
        limit_files([service], resource.RLIM_INFINITY)  # space returns
        assert not wait_gone([service], LONG)
    finally:
        stop_service(run_dir)
    recs = records(run_dir)
    assert [r["status"] for r in of_type(recs, "pipeline_finished")] == ["stopped"], recs[-6:]
    assert of_type(recs, "pipeline_finished")[0]["reason"].startswith("disk full")
    assert any("cannot write the run's files" in r["text"] for r in of_type(recs, "notice"))
    assert recs[-1]["type"] == "run_finished", recs[-4:]  # every event it held is on disk, in order
    assert "disk full" in (run_dir / "supervisor.log").read_text()

    resumed = spawn(resume=run_dir)
    try:
        poll_until(lambda: of_type(records(run_dir), "resumed"), LONG, "the resume")
        resumed_from = of_type(records(run_dir), "resumed")[-1]
        assert (resumed_from["epoch"], resumed_from["step"]) == (saved["epoch"], saved["step"])
        poll_until(lambda: len(of_type(records(run_dir), "checkpoint_saved")) > len(of_type(recs, "checkpoint_saved")),
                   LONG, "training to go on and save again")
        procs = tree(resumed.pid)  # the service and its workers
    finally:
        stop_service(run_dir)
    assert not wait_gone(procs, LONG)  # no process is left


def fsdp_config(path: Path) -> Path:
    """A sharded gang of 2 ranks that would train for hours, checkpointing (through DCP) every epoch."""
    return write_toml(path, f"""name = "svc-{uuid.uuid4().hex[:8]}"
[defaults]
max_epochs = 100000
batch_size = 32
[[pipelines]]
name = "f"
task = "{(TASKS / 'layered.py').as_posix()}:build"
ranks = 2
strategy = "fsdp"
params = {{ samples = 256, delay = 0.002 }}
[validation]
mode = "off"
[devices]
placement = "cpu"
cpu_slots = 2
[telemetry]
enabled = false
""")


@pytest.mark.timeout(900)
def test_a_full_disk_under_a_sharded_gangs_checkpoint_stops_the_run_rather_than_failing_it(tmp_path):
    # Regression: DCP raises CheckpointException, a BaseException, which the trainer's CheckpointError missed:
    # rank 0 exited 1, its restarts failed too, and the pipeline ended `failed` rather than stopping.
    started = spawn(config=fsdp_config(tmp_path / "full.toml"), runs_dir=tmp_path / "runs")
    run_dir = started.run_dir
    checkpoints = run_dir / "f" / "checkpoints"
    try:
        poll_until(lambda: of_type(records(run_dir), "checkpoint_saved") and (run_dir / "events.jsonl")
                   .stat().st_size > 3 * LIMIT, LONG, "a checkpoint, and events.jsonl past the limit")
        assert (checkpoints / "last.dcp" / ".metadata").stat().st_size > LIMIT  # so the next one cannot be written
        service = psutil.Process(started.pid)
        ranks = [p for p in tree(started.pid) if p.pid != started.pid]
        assert len(ranks) >= 2
        limit_files([service, *ranks], LIMIT)
        assert not wait_gone(ranks, LONG)  # the gang stops at its last checkpoint
        limit_files([service], resource.RLIM_INFINITY)
        assert not wait_gone([service], LONG)
    finally:
        stop_service(run_dir)
    recs = records(run_dir)
    [finished] = of_type(recs, "pipeline_finished")
    assert finished["status"] == "stopped" and finished["reason"].startswith("disk full"), recs[-6:]
    assert len(of_type(recs, "worker_started")) == 1  # no rank crashed, so nothing was restarted
    failed = [r for r in of_type(recs, "notice", pipeline="f") if "checkpoint failed" in r["text"]]
    assert failed and "File too large" in failed[0]["text"] and "\n" not in failed[0]["text"]
    saved = [r for r in of_type(recs, "checkpoint_saved") if r["path"].endswith("last.dcp")][-1]
    last = checkpoints / "last.dcp"  # the last one written whole, as it was
    assert sharded.complete(last) and torch.load(last / sharded.TRAINER_FILE, weights_only=True)["step"] == \
        saved["step"]
    assert not list(checkpoints.glob(".*.tmp"))  # the shards of the failed writes took no room afterwards
