"""Symbolic links planted in a run folder (a copied or downloaded run): a resume refuses the folder with one line
naming the link, and what torchherd writes there (events.jsonl, a pipeline's log.txt and worker.json, the stacks
folder) is never written through a link, so nothing lands outside the run folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchherd.engine.protocol.spec import Transport, WorkerSpec, write_spec
from torchherd.engine.rundir.appending import AppendFile
from torchherd.engine.protocol.nolinks import LinkRefused, find_link, make_dirs, open_file
from torchherd.engine.supervise.health.watch import _gather

OLD_RUN = Path(__file__).parent / "old_runs" / "sweep_cut_while_paused"  # a real run folder, resumable
PIPELINE = "reg-lr0.01-batch_size32"
PLANTS = ["events.jsonl", f"{PIPELINE}/log.txt", f"{PIPELINE}/worker.json", f"{PIPELINE}/stacks"]


def planted(tmp_path: Path, where: str) -> tuple[Path, Path, Path]:
    """A copy of a real run with a link at `where` to a place outside it (its events.jsonl moved out there, the
    rest to nothing yet); returns the run, the link and the outside folder."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(OLD_RUN, run)
    outside.mkdir()
    link = run / where
    if link.exists():
        link.rename(outside / link.name)
    link.symlink_to(outside if where.endswith("stacks") else outside / Path(where).name)
    return run, link, outside


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.slow  # a real `torchherd resume` a link
@pytest.mark.parametrize("where", PLANTS)
def test_a_resume_refuses_a_run_folder_with_a_link_it_did_not_make(tmp_path, where):
    # Regression: a run folder's links were followed: log.txt appended to, worker.json truncated and chmodded,
    # events.jsonl and the stacks written wherever a link planted in a copied run folder pointed.
    run, link, outside = planted(tmp_path, where)
    before = snapshot(outside)
    proc = subprocess.run([sys.executable, "-m", "torchherd", "resume", str(run), "--headless"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if str(link) in line]
    assert len(lines) == 1 and "symbolic link" in lines[0], proc.stdout + proc.stderr
    assert snapshot(outside) == before
    assert link.is_symlink()  # left for the user to look at


def test_a_link_in_a_run_folder_is_found_but_not_in_a_scripts_checkpoints(tmp_path):
    run, link, _ = planted(tmp_path, f"{PIPELINE}/stacks")
    assert find_link(run) == link
    link.unlink()
    assert find_link(run) is None
    (run / PIPELINE / "checkpoints").mkdir()
    (run / PIPELINE / "checkpoints" / "latest").symlink_to("epoch-3")  # a script's own: not torchherd's to judge
    assert find_link(run) is None


@pytest.mark.parametrize("where", PLANTS)
def test_no_writer_follows_a_link_planted_in_a_live_run_folder(tmp_path, where):
    run, link, outside = planted(tmp_path, where)
    before = snapshot(outside)
    with pytest.raises(LinkRefused, match="symbolic link"):
        if where == "events.jsonl":
            AppendFile(link)
        elif where.endswith("log.txt"):
            open_file(link, "ab")
        elif where.endswith("worker.json"):
            spec = WorkerSpec(pipeline={}, validation={}, device="cpu", threads=1, pipeline_dir=str(run / PIPELINE),
                              attempt=1)
            write_spec(link, spec, Transport())
        else:  # `torchherd stacks RUN PIPELINE` gathers each rank's stacks into PIPELINE/stacks/<time>/
            refused = _gather(run, link / "20260101-000000", ["a stack"], "verdict")
            assert refused is not None and refused.link == link
            raise refused
    with pytest.raises(LinkRefused):
        make_dirs(run / PIPELINE / "stacks" / "x", run) if where.endswith("stacks") else open_file(link, "w")
    assert snapshot(outside) == before
