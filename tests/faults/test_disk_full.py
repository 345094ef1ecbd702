"""A full disk, for real and without root: a file size limit (RLIMIT_FSIZE) set on a live run's supervisor and
workers makes every write past it fail (EFBIG; torchherd ignores SIGXFSZ), as a full disk does. The run goes
on supervising, stops its pipelines at their last checkpoints once checkpoints fail too, says why, writes what
it kept in memory once the limit is lifted, and `torchherd resume` carries it on."""
from __future__ import annotations

import resource

import psutil
import pytest

from tests.faults.support import is_alive, poll_until, records, tree, wait_gone
from tests.test_service import LONG, long_config, of_type, stop_service
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
