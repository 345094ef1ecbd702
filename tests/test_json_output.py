"""`--json` on the headless commands: `check`, `export`, the requests to a live run, and `run`, `resume` and
`attach`, whose events come as the same lines events.jsonl holds, then one `end` object. stdout holds JSON only.

Real commands on real run directories made by real tiny runs; every wait polls a condition up to a deadline.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TASKS, repo_env, service_of
from tests.faults.support import REPO, poll_until, records, write_toml
from tests.test_service import LONG, long_config, stepping, stop_service, torchherd
from torchherd.tui.cli import main


def run_main(capsys, *argv: str) -> tuple[int, Any, str]:
    """`torchherd ARGV` in this process: its status, its stdout as the one JSON object it must be, its stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def tiny_config(path: Path, runs: Path) -> Path:
    """One pipeline of tests/tasks/tiny.py, two short epochs on one CPU slot."""
    return write_toml(path, f'name = "json-tiny"\nruns_dir = "{runs}"\n[defaults]\n'
                            f'task = "{TASKS / "tiny.py"}:build"\nmax_epochs = 2\nbatch_size = 32\n'
                            'params = { samples = 64 }\n[[pipelines]]\nname = "a"\n'
                            '[devices]\nplacement = "cpu"\ncpu_slots = 1\n[telemetry]\nenabled = false\n')


def test_check_json_says_ok_the_pipelines_and_the_plan(tmp_path, capsys):
    config = tiny_config(tmp_path / "tiny.toml", tmp_path / "runs")
    code, said, _ = run_main(capsys, "check", str(config), "--json")
    assert code == 0 and said["ok"] is True and said["problems"] == [] and said["config"] == str(config)
    assert said["pipelines"] == [{"name": "a", "kind": "task", "ranks": 1}]
    assert any(line.startswith("a: task ") and "-> cpu0" in line for line in said["plan"]), said["plan"]
    assert any(line.startswith("restarts: up to") for line in said["plan"])


def test_check_json_names_each_problems_file_key_and_value_and_exits_2(tmp_path, capsys):
    bad = write_toml(tmp_path / "bad.toml", f'name = "x"\n[defaults]\ntask = "{TASKS / "tiny.py"}:build"\n'
                                            '[[pipelines]]\nname = "a"\nbatch_size = -3\n')
    code, said, _ = run_main(capsys, "check", str(bad), "--json")
    assert code == 2 and said["ok"] is False and said["plan"] == []
    [problem] = said["problems"]
    assert (problem["key"], problem["value"]) == ("pipelines[0].batch_size", -3)
    assert problem["file"].endswith("bad.toml") and "greater than or equal to 1" in problem["message"]
    # A file that does not parse is one object too: the problem is the file's, its value unknown.
    broken = write_toml(tmp_path / "broken.toml", "name = \n")
    code, said, _ = run_main(capsys, "check", str(broken), "--json")
    assert code == 2 and said["ok"] is False and said["pipelines"] == []
    [problem] = said["problems"]
    assert (problem["key"], problem["value"]) == ("", None) and "TOML syntax error" in problem["message"]


@pytest.mark.parametrize("argv, stream", [
    (["attach", "NOPE", "--json"], True), (["resume", "NOPE", "--json"], True),
    (["export", "NOPE", "--tensorboard", "TB", "--json"], False), (["stop", "NOPE", "--json"], False),
    (["stacks", "NOPE", "g", "--json"], False)])
def test_a_bad_run_directory_is_one_json_object_with_ok_false_and_exit_2(tmp_path, capsys, argv, stream):
    argv = [str(tmp_path / "nope") if a == "NOPE" else str(tmp_path / "tb") if a == "TB" else a for a in argv]
    code, said, err = run_main(capsys, *argv, "--runs-dir", str(tmp_path))
    assert code == 2 and said["ok"] is False and "no such run" in said["error"]
    assert "no such run" in err  # a person reads it too
    if stream:  # a followed run's last object, as when it ends
        assert (said["type"], said["exit"]) == ("end", 2)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A real tiny run, `torchherd run CONFIG --json` to its end: its run directory and the command's output."""
    tmp = tmp_path_factory.mktemp("json-run")
    config = tiny_config(tmp / "tiny.toml", tmp / "runs")
    done = torchherd("run", str(config), "--json")
    [run_dir] = (tmp / "runs").iterdir()
    return run_dir, done


@pytest.mark.slow
def test_a_headless_run_prints_its_events_as_events_jsonl_lines_then_how_it_ended(finished_run):
    run_dir, done = finished_run
    assert done.returncode == 0, done.stdout + done.stderr
    *events, end = done.stdout.splitlines(keepends=True)
    file = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    # The same bytes as the run's file, from its run_started on (the session a headless run prints).
    assert events == file[-len(events):] and json.loads(events[0])["type"] == "run_started"
    assert json.loads(events[-1])["type"] == "run_finished"
    said = json.loads(end)
    assert (said["type"], said["ok"], said["exit"], said["how"]) == ("end", True, 0, "finished")
    assert said["run_dir"] == str(run_dir) and said["statuses"] == {"a": "completed"}
    assert "checking 1 task" in done.stderr  # what a person reads goes to stderr


@pytest.mark.slow
def test_attach_json_of_an_ended_run_gives_its_whole_file_and_how_it_ended(finished_run):
    run_dir, _ = finished_run
    history = torchherd("attach", str(run_dir), "--from-start", "--json")
    assert history.returncode == 0, history.stderr
    *events, end = history.stdout.splitlines(keepends=True)
    assert "".join(events) == (run_dir / "events.jsonl").read_text()
    said = json.loads(end)
    assert (said["how"], said["state"], said["exit"], said["statuses"]) == ("ended", "completed", 0,
                                                                            {"a": "completed"})
    now = torchherd("attach", str(run_dir), "--json")  # without --from-start: how it ended, nothing else
    assert [json.loads(line)["how"] for line in now.stdout.splitlines()] == ["ended"]
    not_live = torchherd("stop", str(run_dir), "--json")
    said = json.loads(not_live.stdout)
    assert not_live.returncode == 1 and said["ok"] is False and "no torchherd supervisor" in said["error"]
    assert (said["action"], said["run"]) == ("stop", run_dir.name)
    nothing = torchherd("resume", str(run_dir), "--json")
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["how"] == "nothing to resume"


@pytest.mark.slow
def test_export_json_lists_the_files_it_wrote(finished_run, tmp_path):
    run_dir, _ = finished_run
    done = torchherd("export", str(run_dir), "--tensorboard", str(tmp_path / "tb"), "--json")
    said = json.loads(done.stdout)
    assert done.returncode == 0 and said["ok"] is True and said["pipelines"] == 1, done.stderr
    assert said["files"] and all(Path(f).is_file() and Path(f).parent == tmp_path / "tb" / "a"
                                 for f in said["files"])
    assert (said["schedules"], said["skipped"], said["run_dir"]) == (None, {}, str(run_dir))
    again = torchherd("export", str(run_dir), "--tensorboard", str(tmp_path / "tb"), "--json")
    said = json.loads(again.stdout)
    assert again.returncode == 2 and said["ok"] is False and "already holds TensorBoard files" in said["error"]


def attach_json(run_dir: Path, out: Path) -> subprocess.Popen:
    """`torchherd attach RUN --json`, following the live run, its stdout in `out`."""
    with open(out, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "torchherd", "attach", str(run_dir), "--json"],
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.PIPE, cwd=REPO,
                                env=repo_env(PYTHONUNBUFFERED="1"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_detached_run_is_followed_and_stopped_in_json(tmp_path):
    config = long_config(tmp_path / "long.toml", ("first",))
    run_dir = None
    try:
        started = torchherd("run", str(config), "--detach", "--runs-dir", str(tmp_path / "runs"), "--json")
        assert started.returncode == 0, started.stdout + started.stderr
        said = json.loads(started.stdout)
        run_dir = Path(said["run_dir"])
        assert (said["how"], said["pid"], said["stop"]) == ("detached", service_of(run_dir).pid,
                                                           f"torchherd stop {run_dir}")
        poll_until(stepping(run_dir, {"first"}), LONG, "first to train")
        follower = attach_json(run_dir, tmp_path / "attach.jsonl")
        poll_until(lambda: (tmp_path / "attach.jsonl").stat().st_size, LONG, "a live event on attach's stdout")
        stopped = torchherd("stop", str(run_dir), "--json")
        said = json.loads(stopped.stdout)
        assert stopped.returncode == 0 and said["ok"] is True, stopped.stderr
        assert (said["action"], said["reply"], said["pipeline"]) == ("stop", "stop every pipeline", None)
        _, err = follower.communicate(timeout=LONG)
        assert follower.returncode == 3 and "following run" in err.decode()  # stopped; the notice on stderr
        *events, end = json_lines((tmp_path / "attach.jsonl").read_text())
        assert events and all(e in records(run_dir) for e in events)
        assert (end["type"], end["how"], end["exit"], end["statuses"]) == ("end", "finished", 3,
                                                                          {"first": "stopped"})
    finally:
        if run_dir is not None:
            stop_service(run_dir)
