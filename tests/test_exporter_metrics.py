"""The exporter's figures of one run's events.jsonl, folded as a scrape folds them: a gang's ranks, and an elastic
gang's MAX beside them so a gang running short shows (the real exporter process: tests/test_exporter.py)."""
from __future__ import annotations

from torchherd.engine.protocol.messages import GangResized, RunStarted, WorkerStarted
from torchherd.engine.rundir.lines import encode_line
from torchherd.engine.serve.exporter import RunTail, run_metrics


def figures(tmp_path, events) -> dict[str, dict[tuple, float]]:
    (tmp_path / "events.jsonl").write_bytes(b"".join(encode_line(e) for e in events))
    tail = RunTail(tmp_path)
    tail.read_on()
    return {family.name: {tuple(s.labels.values()): s.value for s in family.samples}
            for family in run_metrics([tail])}


def test_a_gangs_ranks_and_an_elastic_gangs_max_are_figures_of_their_own(tmp_path):
    run = tmp_path.name
    got = figures(tmp_path, [
        RunStarted(run_id=run, run_dir=str(tmp_path), config_path="run.toml",
                   pipelines=("solo", "fixed", "elastic")),
        WorkerStarted(pipeline="solo", pid=10, device="cpu0", attempt=1),
        WorkerStarted(pipeline="fixed", pid=11, device="cpu1,cpu2", attempt=1, pids=(11, 12)),
        WorkerStarted(pipeline="elastic", pid=13, device="cpu3,cpu4", attempt=1, pids=(13, 14), min_ranks=1,
                      max_ranks=4),
        GangResized(pipeline="elastic", from_ranks=4, to_ranks=2, why="2 of 4 CPU slots free")])
    assert got["torchherd_pipeline_ranks"] == {(run, "solo"): 1, (run, "fixed"): 2, (run, "elastic"): 2}
    assert got["torchherd_pipeline_ranks_max"] == {(run, "elastic"): 4}  # fixed gangs have none: never short
