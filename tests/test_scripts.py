"""A user's own training script as a pipeline: run unchanged with a metrics regex, or with torchherd.client."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import json
import re
from pathlib import Path

import psutil
import pytest

from torchherd.engine.preflight.check import check_config
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, PipelineFinished, Resumed, StepMetrics,
                                                ValResult, WorkerError, WorkerExited, WorkerStarted)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.runners.script.events import ScriptEvents
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, still_alive, wait_for, repo_env
from tests.test_engine_runs import run_to_end

SCRIPTS = Path(__file__).parent / "tasks" / "scripts"
PLAIN = str(SCRIPTS / "plain_loop.py")
CLIENT = str(SCRIPTS / "client_loop.py")
EPOCH_LOSS = r"Epoch (?P<epoch>\d+), Loss: (?P<loss>[-+.\deE]+)"
NO_GPU = Inventory(cpu_count=2, note="no NVIDIA GPU (test inventory)")


def of(events, cls, pipeline):
    return [e for e in events if isinstance(e, cls) and e.pipeline == pipeline]


# ------------------------------------------------------------ what a script reports, as events


def test_printed_epochs_from_one_become_zero_based_epoch_ends_with_a_chart_point():
    events = ScriptEvents("p", epochs_total=2)
    out = events.from_match({"epoch": "1", "loss": "0.5"}) + events.from_match({"epoch": "2", "loss": "0.25"}) + \
        events.from_match({"epoch": "3", "loss": "nan"})
    ends = [e for e in out if isinstance(e, EpochEnd)]
    assert [(e.epoch, e.train_loss) for e in ends[:2]] == [(0, 0.5), (1, 0.25)]
    assert [e.step for e in out if isinstance(e, StepMetrics)] == [1, 2, 3]  # one point per epoch for the chart
    assert ends[-1].epochs_total == 3  # a script that runs longer than max_epochs says so


def test_a_script_without_max_epochs_has_an_unknown_epoch_total(tmp_path):
    # Regression: with `--epochs 20` and no max_epochs a script printed "epoch 1/10", then "11/11", "12/12": the
    # schema's default of 10 and then the epochs seen were taken for its total.
    from torchherd.tui.widgets.pipeline_table import fmt_epoch_step
    from torchherd.engine.protocol.progress import PipelineProgress, apply

    from torchherd.engine.config.load import parse_config

    [unset] = parse_config({"pipelines": [{"name": "s", "script": PLAIN}]}, str(tmp_path / "t.toml")).pipelines
    assert unset.epochs_planned == 0
    assert make_config(tmp_path, [{"name": "s", "script": PLAIN}]).pipelines[0].epochs_planned == 3  # [defaults]
    events = ScriptEvents("s", epochs_total=unset.epochs_planned)
    ends = [e for i in range(1, 13) for e in events.from_match({"epoch": str(i), "loss": "0.5"})
            if isinstance(e, EpochEnd)]
    assert {e.epochs_total for e in ends} == {0}
    row = PipelineProgress("s", epochs_total=0)
    for e in ends[:10]:
        row = apply(row, e)
    assert fmt_epoch_step(row, 10) == "11 10"


def test_a_metrics_pattern_that_matches_nothing_is_said_once_after_50_lines_or_60_s():
    # Regression: a `metrics` regex that never matched was silent: the chart waited for data and the pipeline
    # completed with 0 steps and no notice.
    from torchherd.engine.runners.script.unmatched import UnmatchedWatch

    now = [0.0]
    watch = UnmatchedWatch(["epoch=(?P<epoch>\\d+)"], clock=lambda: now[0])
    said = [watch.line(f"Epoch {i}/8 train_loss=0.6", False) for i in range(1, 60)]
    assert [i for i, s in enumerate(said) if s] == [49]  # the 50th line, once
    assert "'epoch=(?P<epoch>\\\\d+)'" in said[49] and "'Epoch 50/8 train_loss=0.6'" in said[49]
    slow = UnmatchedWatch(["x(?P<loss>1)"], clock=lambda: now[0])
    assert slow.line("a", False) is None
    now[0] = 61.0
    assert "matched none of the 2 lines" in slow.line("b", False)
    matched = UnmatchedWatch(["x(?P<loss>1)"], clock=lambda: now[0])
    assert matched.line("x1", True) is None and all(matched.line("y", False) is None for _ in range(100))


def test_printed_epochs_from_zero_and_step_lines():
    events = ScriptEvents("p", epochs_total=5)
    steps = events.from_match({"epoch": "0", "step": "10", "loss": "2.0", "lr": "1e-3"})
    steps += events.from_match({"epoch": "0", "step": "20", "loss": "1.0", "lr": None})
    [end] = events.from_match({"epoch": "0"})  # an epoch line without a loss: the mean of its steps
    assert [(s.epoch, s.step, s.loss) for s in steps] == [(0, 10, 2.0), (0, 20, 1.0)] and steps[0].lr == 1e-3
    assert (end.epoch, end.step, end.train_loss, end.steps_per_epoch) == (0, 20, 1.5, 20)
    assert events.from_match({"loss": "x"}) == [] and events.from_match({"loss": "0.5"})[0].step == 21


def test_any_other_named_group_is_a_metric_of_the_report():
    events = ScriptEvents("p", epochs_total=5)
    [step] = events.from_match({"step": "3", "loss": "0.5", "acc": "0.75", "grad_norm": "2"})
    [end] = events.from_match({"epoch": "1", "loss": "0.4", "acc": "0.8"})
    assert step.metrics == {"acc": 0.75, "grad_norm": 2.0} and end.metrics == {"acc": 0.8}


# ------------------------------------------------------------ bad input: one clear message, nothing launched


def write_config(tmp_path: Path, pipeline: str, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text("print('Epoch 1, Loss: 0.5')\n")
    (tmp_path / "val.py").write_text("def build(params):\n    raise RuntimeError('never built by check')\n")
    path = tmp_path / "run.toml"
    path.write_text(f'runs_dir = "{tmp_path / "runs"}"\n{extra}\n[[pipelines]]\nname = "a"\n{pipeline}\n')
    return path


@pytest.mark.parametrize("pipeline, extra, key, message", [
    ('script = "train.py"\ntask = "digits"', "", "pipelines[0].script", "`task` and `script` are both set"),
    ('script = "nowhere.py"', "", "pipelines[0].script", "script not found"),
    ('script = "train.py"\nmetrics = "Epoch (\\\\d+"', "", "pipelines[0].metrics", "not a valid regular expression"),
    ('script = "train.py"\nmetrics = "Epoch (\\\\d+)"', "", "pipelines[0].metrics", "has no named group"),
    ('script = "train.py"\nvalidate = "val.py:build"', '[validation]\nmode = "background"',
     "pipelines[0].validate", "never calls herd.hand_off(model)"),
    ('task = "digits"\nmetrics = "(?P<loss>\\\\S+)"', "", "pipelines[0].metrics", "only applies to a `script`"),
    ('script = "train.py"\nargs = ["--out={chekpoint_dir}"]', "", "pipelines[0].args",
     "[0] '--out={chekpoint_dir}': unknown placeholder {chekpoint_dir}; torchherd fills in {checkpoint_dir}"),
    ('script = "train.py"\ncwd = "nowhere"', "", "pipelines[0].cwd", "nowhere"),
    ('task = "digits"\nresume_args = ["--resume"]', "", "pipelines[0].resume_args", "only applies to a `script`"),
], ids=["script_and_task", "missing_script", "regex_does_not_compile", "regex_without_group",
        "validate_without_hand_off", "metrics_on_a_task", "unknown_placeholder", "missing_cwd", "resume_args_on_a_task"])
def test_bad_script_pipeline_is_one_clear_problem(tmp_path, pipeline, extra, key, message):
    report = check_config(write_config(tmp_path, pipeline, extra), inventory=NO_GPU)
    assert not report.ok
    assert [(p.key, message in p.message) for p in report.problems] == [(key, True)], report.problems


def test_script_pipeline_check_says_what_would_run(tmp_path):
    config = write_config(tmp_path, 'script = "train.py"\nargs = ["--lr", "0.1"]\nvalidate = "val.py:build"',
                          '[validation]\nmode = "background"')
    (tmp_path / "train.py").write_text("import torchherd.client as herd\nherd.hand_off(model)\n")
    report = check_config(config, inventory=NO_GPU)
    assert report.ok, report.render()
    assert any(line.startswith("a: script train.py --lr 0.1, validate val.py:build -> cpu0") for line in report.lines)


def test_args_are_filled_in_and_resume_args_added_once_the_script_has_saved(tmp_path):
    from torchherd.engine.config.load import load_config
    from torchherd.engine.runners.registry import runner_for
    from torchherd.engine.runners.script.arguments import command_line

    config = write_config(tmp_path, 'script = "train.py"\nargs = ["--out_dir={checkpoint_dir}", "--seed={rank}", '
                          '"--json={{\\"r\\": {restart}}}"]\nresume_args = ["--init_from=resume"]')
    [pipe] = load_config(config).pipelines
    pipe_dir = tmp_path / "runs" / "r1" / "a"
    argv, found = command_line(pipe, pipe_dir, rank=1, world_size=2, restart=3)
    assert argv == [str(tmp_path / "train.py"), f"--out_dir={pipe_dir / 'checkpoints'}", "--seed=1",
                    '--json={"r": 3}'] and found is None
    assert runner_for(pipe.kind).resumes_from(pipe, pipe_dir / "checkpoints") == "from scratch (no checkpoint yet)"
    (pipe_dir / "checkpoints").mkdir(parents=True)
    (pipe_dir / "checkpoints" / ".ckpt.pt.tmp").write_text("half")  # a save in progress is no checkpoint
    assert command_line(pipe, pipe_dir, 0, 1, 0)[1] is None
    (pipe_dir / "checkpoints" / "ckpt.pt").write_text("saved")
    argv, found = command_line(pipe, pipe_dir, 0, 1, 0)
    assert argv[-1] == "--init_from=resume" and found == pipe_dir / "checkpoints" / "ckpt.pt"
    assert runner_for(pipe.kind).resumes_from(pipe, pipe_dir / "checkpoints").startswith(
        "with --init_from=resume (ckpt.pt, 0 s ago)")
    no_flag = pipe.model_copy(update={"resume_args": []})
    assert "no `resume_args` tell the script to resume" in runner_for(pipe.kind).resumes_from(
        no_flag, pipe_dir / "checkpoints")
    # Regression: said so of a script that loads its checkpoint itself through the client, then resumed it.
    (tmp_path / "train.py").write_text("import torchherd.client as herd\npath = herd.resume_from()\n")
    assert runner_for(pipe.kind).resumes_from(no_flag, pipe_dir / "checkpoints").startswith(
        "from ckpt.pt, 0 s ago, which the script loads itself (herd.resume_from())")


def test_own_validation_lines_become_val_results_and_metrics_takes_a_list(tmp_path):
    events = ScriptEvents("p", epochs_total=1)
    events.from_match({"step": "7", "loss": "1.0"})
    val = events.val_from_match({"loss": "2.5", "acc": "0.9", "val_ppl": "3"})
    assert (val.step, val.metrics) == (7, {"val_loss": 2.5, "val_acc": 0.9, "val_ppl": 3.0})
    assert events.val_from_match({"step": "10", "loss": "-"}) is None
    report = check_config(write_config(tmp_path, 'script = "train.py"\nmetrics = ["(?P<loss>\\\\S+)", "nogroup"]'),
                          inventory=NO_GPU)
    assert [(p.key, p.message.startswith("[1] has no named group")) for p in report.problems] == [
        ("pipelines[0].metrics", True)], report.problems


def test_an_epochs_samples_per_second_come_from_the_reports_own_timings():
    # Regression: a client that flushed once an epoch gave "epoch 1/60 ... 29,954,974 samples/s": the first
    # epoch was timed from its first report, a moment before its end.
    events = ScriptEvents("s", epochs_total=2)
    events.step_report(10, 0, 1.0, samples=320.0, seconds=0.5, weight=10)  # 10 steps of 32 in 0.5 s
    assert events.epoch_end(0, None).samples_per_s == 640.0
    events.step_report(20, 1, 0.5, samples=320.0, seconds=0.25, weight=10)
    events.step_report(30, 1, 0.5, samples=320.0, seconds=0.75, weight=10)
    assert events.epoch_end(1, None).samples_per_s == 640.0  # 640 samples in 1 s: this epoch's alone


def test_samples_per_step_turns_printed_steps_into_samples_per_second():
    events = ScriptEvents("p", epochs_total=1, samples_per_step=512)
    [first] = events.from_match({"step": "10", "loss": "1.0"})
    [later] = events.from_match({"step": "30", "loss": "0.9"})
    [back] = events.from_match({"step": "20", "loss": "0.9"})  # a restart went back: no rate across it
    # unknown is None, not 0.0 (a flat zero curve in TensorBoard)
    assert first.samples_per_s is None and later.samples_per_s > 0.0 and back.samples_per_s is None
    assert ScriptEvents("q", 1).from_match({"step": "5", "loss": "1.0"})[0].samples_per_s is None


def test_a_script_error_is_the_exception_its_traceback_ends_in_rank_prefixes_stripped():
    from torchherd.engine.runners.script.runner import error_line

    assert error_line(["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 3',
                       "[rank1]: ValueError: bad shape", "W1125 11:00:00 torch/distributed/elastic: ...",
                       ""]) == "ValueError: bad shape"
    assert error_line(["iter 3: loss 0.5"]) == ""


def test_a_crash_report_shows_the_traceback_and_a_few_lines_not_the_whole_tail():
    # Regression: every crash printed ~40 lines of step output before the traceback, once per restart.
    from torchherd.engine.runners.script.crash import crash_excerpt

    steps = [f"iter {i}: loss 0.5" for i in range(40)]
    tb = ["Traceback (most recent call last):", '  File "train.py", line 3', "ValueError: bad shape"]
    assert crash_excerpt(steps + tb).splitlines() == steps[-3:] + tb
    assert crash_excerpt(steps).splitlines() == steps[-10:]  # no traceback: the last lines
    assert crash_excerpt(tb[1:]) == "\n".join(tb[1:])


def test_run_with_a_bad_script_pipeline_launches_nothing(tmp_path):
    config = write_config(tmp_path, 'script = "train.py"\nmetrics = "no groups"')
    out = subprocess.run([sys.executable, "-m", "torchherd", "run", str(config), "--headless"], capture_output=True,
                         text=True, timeout=120, env=repo_env())
    assert out.returncode == 2 and "pipelines[0].metrics: has no named group" in out.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------ the client


def test_client_is_a_no_op_alone_and_loads_the_standard_library_only(tmp_path):
    # A user's script pays for `import torchherd.client` whether torchherd runs it or not: outside
    # torchherd it loads nothing past the standard library (not torch, pydantic, Textual, the engine).
    code = ("import sys\nbefore = set(sys.modules)\nimport torchherd.client as herd\n"
            "loaded = sorted(set(sys.modules) - before)\n"
            "herd.report(step=1, loss=0.5, lr=0.1); herd.epoch_end(0, 0.5); herd.heartbeat(); herd.wait_if_paused(); herd.flush()\n"
            "assert herd.should_stop() is False and herd.checkpoint_requested() is False and herd.supervised() is False\n"
            "assert herd.hand_off(object()) is None and herd.resume_from() is None\n"
            "print(' '.join(loaded)); print(' '.join(sorted(set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("TORCHHERD_")},
                         cwd=tmp_path)
    loaded, after_calls = (line.split() for line in out.stdout.splitlines())
    ours = {m for m in loaded if m.partition(".")[0] == "torchherd"}
    assert ours == {"torchherd", "torchherd.client", "torchherd.client_env"}, out.stderr
    assert not {m for m in loaded if m.partition(".")[0] not in sys.stdlib_module_names | {"torchherd"}}
    assert not {"torch", "textual", "pydantic", "torchherd.engine"} & set(after_calls)


class FrameReader:
    """The runner's end of the client socket, read line by line."""

    def __init__(self, sock: socket.socket):
        self.file = sock.makefile("rb")

    def next(self, kind: str) -> dict:
        while True:
            frame = json.loads(self.file.readline())
            if frame["t"] == kind:
                return frame


def test_client_coalesces_reports_and_pause_holds_report_until_resume():
    from torchherd.client_socket import Client

    ours, theirs = socket.socketpair()
    ours.settimeout(10.0)  # seconds: a frame that never comes fails the test instead of hanging it
    client = Client(os.dup(theirs.fileno()), None)
    theirs.close()
    frames = FrameReader(ours)
    assert frames.next("hello")["pid"] == os.getpid()
    for step in range(1, 5):
        client.queue_report(step, None, float(step), 32, {"lr": 0.1})
    client.flush()
    frame = frames.next("step")
    assert (frame["step"], frame["loss"], frame["n"], frame["metrics"]) == (4, 2.5, 4, {"lr": 0.1})

    ours.sendall(b'{"t": "pause"}\n')
    held, released = threading.Event(), threading.Event()

    def step():
        seen = threading.Event()
        for _ in range(1000):  # until the client's reader thread has taken the pause in (10 s at most)
            if client.paused or seen.wait(0.01):
                break
        held.set()
        client.hold()
        released.set()
    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    assert held.wait(10)
    assert not released.wait(0.3)  # paused: the loop waits here
    ours.sendall(b'{"t": "resume"}\n')
    assert released.wait(10)
    ours.sendall(b'{"t": "stop"}\n')
    ours.close()
    thread.join(10)


# ------------------------------------------------------------ real processes

@pytest.mark.slow
async def test_unmodified_scripts_report_epochs_restart_after_a_crash_and_stop_on_their_signal(tmp_path):
    marker, saved, termed = tmp_path / "crashed-once", tmp_path / "saved-on-ctrl-c", tmp_path / "saved-on-sigterm"
    config = make_config(tmp_path, [
        {"name": "plain", "script": PLAIN, "args": ["--epochs", "3"], "metrics": EPOCH_LOSS},
        {"name": "crashy", "script": PLAIN, "args": ["--epochs", "3", "--crash-once", str(marker)],
         "metrics": EPOCH_LOSS},
        {"name": "ctrl-c", "script": PLAIN, "args": ["--epochs", "10000", "--delay", "0.2", "--on-interrupt",
                                                     str(saved)], "metrics": EPOCH_LOSS},
        # ignores Ctrl-C, saves on SIGTERM: stop_signal says so
        {"name": "sigterm", "script": PLAIN, "args": ["--epochs", "10000", "--delay", "0.2", "--on-sigterm",
                                                      str(termed)], "metrics": EPOCH_LOSS, "stop_signal": "SIGTERM"},
    ], devices={"cpu_slots": 4}, restart={"min_uptime": 0.0}, validation={"mode": "off"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        seen = set()
        await wait_for(stream, lambda e: isinstance(e, EpochEnd) and seen.add(e.pipeline) is None
                       and {"ctrl-c", "sigterm"} <= seen)
        sup.stop("ctrl-c")
        sup.stop("sigterm")
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"plain": "completed", "crashy": "completed", "ctrl-c": "stopped", "sigterm": "stopped"}
    events = read_events(sup.run_dir)
    ends = of(events, EpochEnd, "plain")
    assert [(e.epoch, e.train_loss) for e in ends] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert [e.loss for e in of(events, StepMetrics, "plain")] == [1.0, 0.5, 0.3333]  # what the chart plots
    log = (sup.run_dir / "plain" / "log.txt").read_text()
    assert "Epoch 3, Loss: 0.3333" in log
    # what `python plain_loop.py` sees: no torchrun variables for one process, and the script's own folder
    assert "RANK=None WORLD_SIZE=None MASTER_PORT=None" in log and f"restart=0 cwd={SCRIPTS}" in log
    [error] = of(events, WorkerError, "crashy")
    assert error.error.startswith("RuntimeError: plain_loop crashed on purpose") and "Traceback" in error.traceback
    assert [i for i, line in enumerate(error.traceback.splitlines()) if "Traceback" in line][0] <= 3
    assert sup.view("crashy").restarts == 1 and "restart=1" in (sup.run_dir / "crashy" / "log.txt").read_text()
    assert saved.read_text().startswith("interrupted at epoch")  # the script caught KeyboardInterrupt and saved
    assert [e.exit_code for e in of(events, WorkerExited, "ctrl-c")] == [10]
    assert termed.read_text().startswith("sigterm at epoch")  # it got its own stop signal, at once
    assert [e.exit_code for e in of(events, WorkerExited, "sigterm")] == [10]


@pytest.mark.slow
async def test_a_run_whose_metrics_pattern_never_matches_says_so_once(tmp_path):
    # Regression: the pipeline ended `completed` with 0 steps and no notice.
    config = make_config(tmp_path, [{"name": "s", "script": PLAIN, "args": ["--epochs", "60", "--delay", "0"],
                                     "metrics": r"epoch=(?P<epoch>\d+)"}], validation={"mode": "off"},
                         telemetry={"enabled": False})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"s": "completed"}
    said = [n.text for n in of(read_events(sup.run_dir), Notice, "s") if "matched none" in n.text]
    assert len(said) == 1 and "'epoch=(?P<epoch>\\\\d+)'" in said[0] and "'Epoch " in said[0], said


@pytest.mark.slow
async def test_a_script_that_ends_at_its_max_steps_is_let_finish_and_one_that_would_not_is_stopped(tmp_path):
    # Regression: max_steps = 200 with a script that trains 200 steps, then saves: torchherd's SIGINT reached it
    # at its last step, and the save after its loop never ran (KeyboardInterrupt, exit -2; "completed").
    done, interrupted = tmp_path / "saved-at-the-end", tmp_path / "interrupted"
    steps = r"Epoch (?P<step>\d+), Loss: (?P<loss>[-+.\deE]+)"
    config = make_config(tmp_path, [
        {"name": "ends", "script": PLAIN, "args": ["--epochs", "3", "--done", str(done), "--on-interrupt",
                                                   str(interrupted)], "metrics": steps, "max_steps": 3},
        {"name": "endless", "script": PLAIN, "args": ["--epochs", "100000", "--delay", "0.02"], "metrics": steps,
         "max_steps": 3},
    ], devices={"cpu_slots": 2}, restart={"stop_timeout": 4.0}, validation={"mode": "off"})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    assert statuses == {"ends": "completed", "endless": "completed"}
    assert done.read_text() == "done after epoch 3\n" and not interrupted.exists()  # it ended by itself
    events = read_events(sup.run_dir)
    assert [e.exit_code for e in of(events, WorkerExited, "ends")] == [0]
    # The other trained on past its limit until the grace (three quarters of stop_timeout) ran out, then its
    # stop signal ended it: trained to its limits all the same.
    assert "plain_loop: interrupted, saved" in (sup.run_dir / "endless" / "log.txt").read_text()
    assert max(e.step for e in of(events, StepMetrics, "endless")) > 3


@pytest.mark.slow
async def test_silent_script_is_hung_and_a_killed_script_leaves_no_children(tmp_path):
    config = make_config(tmp_path, [
        {"name": "silent", "script": PLAIN, "args": ["--silent-hang"], "metrics": EPOCH_LOSS},
        {"name": "parent", "script": PLAIN, "args": ["--epochs", "10000", "--delay", "0.2", "--children", "2"],
         "metrics": EPOCH_LOSS},
    ], restart={"max_restarts": 0, "hang_timeout": 5.0, "start_timeout": 20.0},  # silent never steps: start_timeout
       validation={"mode": "off"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "parent")
        await wait_for(stream, lambda e: isinstance(e, EpochEnd) and e.pipeline == "parent")
        group = [started.pid] + [p.pid for p in psutil.Process(started.pid).children(recursive=True)]
        assert len(group) >= 4  # the worker, the script and the script's two children
        sup.kill("parent")
        silent = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "silent")
        assert silent.status == "failed" and "hung" in silent.reason
        statuses = await asyncio.wait_for(sup.wait(), 60)
        assert statuses["parent"] == "killed" and still_alive(group) == []
    finally:
        await sup.shutdown(graceful=False)


@pytest.mark.slow
async def test_client_script_pauses_stops_with_its_checkpoint_resumes_and_is_validated(tmp_path):
    config = make_config(tmp_path, [
        {"name": "c", "script": CLIENT, "args": ["--epochs", "2", "--steps", "40", "--delay", "0.02"],
         "validate": str(SCRIPTS / "val.py") + ":build"},
    ], devices={"cpu_slots": 1}, validation={"mode": "background", "device": "cpu"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
        sup.pause("c")
        sup.checkpoint("c")
        first = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        sup.checkpoint("c")
        second = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        assert second.step == first.step  # paused: no step between two checkpoints
        sup.unpause("c")
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step > second.step)
        sup.stop("c")
        stopped = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "stop")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "stopped" and Path(stopped.path).exists()
    finally:
        await sup.shutdown(graceful=False)

    again = Supervisor.resume_run(sup.run_dir)
    await again.start()
    try:
        assert await asyncio.wait_for(again.wait(), 120) == {"c": "completed"}
    finally:
        await again.shutdown(graceful=True)
    events = read_events(sup.run_dir)
    [resumed] = of(events, Resumed, "c")
    assert (resumed.path, resumed.step) == (stopped.path, stopped.step)
    assert of(events, EpochEnd, "c")[0].step > stopped.step  # carried on, not from step 0
    scored = [e for e in of(events, ValResult, "c") if not e.error]
    assert scored and scored[-1].mode == "background" and scored[-1].metrics["val_loss"] < 1.0


# ------------------------------------------------------------ an unchanged GPT-style script: resume and stop

GPT = str(SCRIPTS / "gpt_like.py")
ITER = r"iter (?P<step>\d+): loss (?P<loss>[-+.\deE]+)"
VAL = r"step (?P<step>\d+): train loss [-+.\deE]+, val loss (?P<loss>[-+.\deE]+)"
EVAL = 20  # the script's checkpoint interval, in iterations


def gpt_pipeline(name: str, ranks: int, *extra: str, **keys) -> dict:
    return {"name": name, "script": GPT, "ranks": ranks, "metrics": [ITER], "val_metrics": VAL,
            "args": ["--out_dir={checkpoint_dir}", "--max_iters=160", f"--eval_interval={EVAL}", "--delay=0.08",
                     *extra], "resume_args": ["--init_from=resume"], "stop_mode": "after_checkpoint", **keys}


def resumed_from(log: Path) -> list[int]:
    return [int(line.rsplit(" ", 1)[1]) for line in log.read_text().splitlines()
            if line.startswith("gpt_like: resuming from iter")]


def ckpt_iter(run_dir: Path, name: str) -> int:
    import torch
    return torch.load(run_dir / name / "checkpoints" / "ckpt.pt", map_location="cpu")["iter_num"]


@pytest.mark.slow
async def test_an_unchanged_gpt_script_resumes_after_a_kill_stops_after_its_checkpoint_and_resumes_again(tmp_path):
    # Regression: a script that resumes only with a flag restarted from iteration 0 and overwrote its good
    # checkpoint; its checkpoints landed beside the config; a one-rank script took its DDP branch on RANK=0;
    # a graceful stop (Ctrl-C) threw away everything since its last save.
    config = make_config(tmp_path, [gpt_pipeline("solo", 1), gpt_pipeline("gang", 2),
                                    # ignores Ctrl-C: its stop signal is SIGTERM
                                    gpt_pipeline("stubborn", 1, "--ignore_sigint", stop_signal="SIGTERM")],
                         devices={"cpu_slots": 4}, validation={"mode": "off"},
                         restart={"min_uptime": 0.0, "stop_timeout": 60})
    sup = Supervisor(config, inventory=NO_GPU)
    stream = sup.subscribe()
    await sup.start()
    names = ("solo", "gang", "stubborn")
    last: dict[str, int] = {}
    try:
        def past(step: int, since: dict[str, int] | None = None):
            def seen(e) -> bool:
                if isinstance(e, StepMetrics) and e.pipeline in names:
                    last[e.pipeline] = e.step
                return all(last.get(n, -1) >= step + (since or {}).get(n, 0) for n in names)
            return seen
        await wait_for(stream, past(2 * EVAL + 5), timeout=120)
        killed_at, kept_at = dict(last), {}
        for name in names:  # SIGKILL the script itself (rank 0's in the gang), not its worker
            worker = psutil.Process(sup.view(name).pid)
            [script] = [p for p in worker.children() if "gpt_like.py" in " ".join(p.cmdline())]
            script.kill()
            script.wait(30)
            # the checkpoint it died with (its step reports can lag behind it on a loaded machine)
            kept_at[name] = ckpt_iter(sup.run_dir, name)
        notices = []
        await wait_for(stream, lambda e: isinstance(e, Notice) and e.pipeline in names and "resuming" in e.text
                       and notices.append(e.pipeline) is None and set(notices) == set(names), timeout=120)
        last.clear()
        await wait_for(stream, past(0), timeout=120)  # each prints where it resumed before its first iteration
        resumed = {n: resumed_from(sup.run_dir / n / "log.txt") for n in names}
        for name in names:
            [start] = resumed[name]  # from its last checkpoint: at most one interval lost
            assert start == kept_at[name] and start % EVAL == 0 and killed_at[name] - EVAL <= start, \
                (name, start, kept_at, killed_at)
        await wait_for(stream, past(EVAL + 5, since={n: resumed[n][0] for n in names}), timeout=120)
        sup.stop()
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"solo": "stopped", "gang": "stopped", "stubborn": "stopped"}
    run_dir = sup.run_dir
    saved = {n: ckpt_iter(run_dir, n) for n in names}
    events = read_events(run_dir)
    for name in names:  # its own validation lines are val_results at the step it printed
        vals = of(events, ValResult, name)
        assert vals and all(v.step % EVAL == 0 and set(v.metrics) == {"val_loss"} for v in vals)
    for name in names:
        log = (run_dir / name / "log.txt").read_text()
        assert f"cwd={SCRIPTS}" in log and f"ddp={name == 'gang'}" in log
        printed = [int(m) for m in re.findall(r"^iter (\d+):", log, re.M)]
        # the waiting stop signalled it just after a save: only the steps in the moment after it are lost
        assert saved[name] > resumed[name][0] and printed[-1] - saved[name] < EVAL // 2, (name, saved, printed[-1])
    proc = subprocess.run([sys.executable, "-m", "torchherd", "resume", str(run_dir), "--headless"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "solo with --init_from=resume (ckpt.pt," in proc.stdout
    events = read_events(run_dir)
    for name in names:
        assert resumed_from(run_dir / name / "log.txt")[-1] == saved[name]
        # killed, restarted, stopped, resumed: attempts (and TORCHHERD_RESTART_COUNT) count on across resume
        assert [e.attempt for e in of(events, WorkerStarted, name)] == [1, 2, 3]
        assert re.findall(r"^iter (\d+):", (run_dir / name / "log.txt").read_text(), re.M)[-1] == "160"
