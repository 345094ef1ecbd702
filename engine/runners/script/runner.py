"""The script runner: a training script of the user's own as a pipeline, unchanged or with torchherd.client.

The worker runs `python train.py ARGS` (engine/runners/script/process.py) and copies its
output into the pipeline's log as it comes, matching the `metrics` regex on the way
(engine/runners/script/events.py); it turns the client's frames into the same events, and
carries the supervisor's commands to the script: as frames when it uses the client,
else as signals (SIGINT to stop, SIGSTOP/SIGCONT to pause). While the script shows
signs of life it beats the heartbeat the supervisor's hang check reads.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from .... import client_env
from .... import client_frames as wire
from ...config.metric_patterns import patterns
from ...protocol.channel import WorkerExit
from ...protocol.messages import EpochEnd, Notice, StepMetrics, TrainingStarted, ValResult, WorkerError
from ...protocol.names import PipelineKind, ValidationMode
from ...protocol.progress import judge, metric_value
from ...worker.control import HEARTBEAT_INTERVAL
from ...worker.handoff import snapshot_meta
from .arguments import command_line, describe_checkpoint, newest_checkpoint
from .crash import crash_excerpt, error_line  # error_line: tests import it from here too
from .events import ScriptEvents, parse_number
from .frames import ClientFrames
from .process import ScriptProcess, forward_stacks, script_environment, stacks_site
from .unmatched import UnmatchedWatch
from .validation import InlineScorer

if TYPE_CHECKING:
    from ...config.schema import Pipeline, ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.spec import WorkerSpec
    from ...worker.control import WorkerControl

TICK = 0.05  # seconds between looks at the control pipe and the script
CPU_ALIVE = 0.02  # seconds of CPU in a heartbeat interval that count as life for a silent script
KILL_AFTER = 5.0  # seconds between SIGTERM and SIGKILL when a NaN policy ends the script
SAVE_SETTLE = 0.25  # seconds a new checkpoint file stays untouched before a waiting stop signals the script
LIMIT_GRACE = 10.0  # seconds a script at its max_steps or max_time may take to end by itself before its signal
STACKS_QUIET = 2.0  # seconds after a stack request whose output and CPU are no sign of training
OUTPUT_JOIN = 2.0  # seconds to wait for the output after exit (a grandchild may still hold the pipe)
MAX_LINE = 1 << 16  # bytes of one line kept for matching; a longer one is matched on its end
TAIL_LINES = 60  # lines of output kept to explain a crash


def run_script(spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
               control: WorkerControl) -> int:
    """The `script` runner (see runners/run.py): returns the worker's exit code."""
    return ScriptAttempt(spec, pipe, validation, sender, control).run()


class ScriptAttempt(ClientFrames):
    """One attempt of a script pipeline: the script process, its output, its client and its commands."""

    def __init__(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
                 control: WorkerControl) -> None:
        self.spec, self.pipe, self.validation, self.sender, self.control = spec, pipe, validation, sender, control
        self.name = pipe.name
        self.dir = Path(spec.pipeline_dir).absolute()  # the script runs elsewhere: its paths must not be relative
        self.ckpt_dir = self.dir / "checkpoints"
        self.state_path = self.dir / "script_state.json"  # what later attempts need: see _save_state
        try:
            self.state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            self.state = {}
        self.events = ScriptEvents(self.name, pipe.epochs_planned, self.state.get("epoch_base"), pipe.samples_per_step)
        self.regexes = [re.compile(p) for p in patterns(pipe.metrics)]
        self.unmatched = UnmatchedWatch(patterns(pipe.metrics) if not spec.rank else [])
        self.val_regexes = [re.compile(p) for p in patterns(pipe.val_metrics)]
        self.best: float | None = None  # of the script's own validation, for `patience`
        self.since_best = 0
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.proc: ScriptProcess | None = None
        self.sock: socket.socket | None = None
        self._sock_lock = threading.Lock()
        self.client = self.polls_stop = self.client_beats = False  # what the script's client said so far
        self.output_seen = self.client_seen = self.scoring = False  # signs of life since the last beat
        self.prints_steps = False  # a `metrics` line with a step matched: from then on CPU use proves nothing
        self.paused = False
        self.stopped_by_signal = False  # paused with SIGSTOP (no client then): SIGCONT undoes it
        self.stopping = False
        self.limit = ""  # "max_time" / "max_steps" once reached: the stop it asks for is a completion
        self.fail_code: int | None = None  # set by the NaN policy
        self.kill_at: float | None = None
        self.inline_dir: str | None = None
        self.inline: InlineScorer | None = None
        self.told_no_client = False
        self.stop_signal = signal.Signals[pipe.stop_signal]
        self.stacks_at = float("-inf")  # when the supervisor last asked for its stacks
        self.signal_at: float | None = None  # stop_mode "after_checkpoint": when to signal at the latest
        self.stop_after: float | None = None  # ... once a checkpoint newer than this mtime appears

    @property
    def process(self) -> ScriptProcess:
        """The script's process, from run() on (before it, nothing asks)."""
        assert self.proc is not None, "the script has not been started"
        return self.proc

    # ------------------------------------------------------------ start

    def _environment(self, fd: int) -> dict[str, str]:
        extra = {client_env.ENV_PIPELINE: self.name, client_env.ENV_CHECKPOINT_DIR: str(self.ckpt_dir),
                 client_env.ENV_FD: str(fd),
                 **stacks_site(self.dir / ".stacks")}
        v = self.validation
        directory = self.spec.snapshot_dir if v.mode == ValidationMode.BACKGROUND else ""
        if self.pipe.validate_factory and v.mode == ValidationMode.INLINE:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            directory = self.inline_dir = tempfile.mkdtemp(prefix=f"torchherd-{self.name}-", dir=shm)
        if self.pipe.validate_factory and directory:
            meta = snapshot_meta(self.pipe, v, self.dir, None, PipelineKind.SCRIPT)
            extra[client_env.ENV_SNAPSHOT] = wire.SnapshotTarget(
                dir=directory, mode=str(v.mode), slots=v.slots, policy=v.policy, checksum=v.checksum,
                seq=self.spec.snapshot_seq, meta=meta, staging=v.handoff_staging).to_env()
        # an elastic gang's script at one rank still runs as a rank of its gang: torchrun's variables, WORLD_SIZE=1
        return script_environment(self.spec.attempt, self.spec.device, self.spec.threads, extra,
                                  self.spec.world_size, self.pipe.torchrun_env or self.pipe.elastic)

    def run(self) -> int:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        self.sock = ours
        env = self._environment(theirs.fileno())
        script, found = command_line(self.pipe, self.dir, self.spec.rank, self.spec.world_size,
                                     max(self.spec.attempt - 1, 0))
        cwd = self.pipe.workdir or str(Path(self.pipe.script_ref).parent)
        if found is not None and self.spec.rank == 0:
            self.sender.send(Notice(pipeline=self.name, level="info", text=(
                f"resuming: {shlex.join(self.pipe.resume_args)} ({describe_checkpoint(found)} in checkpoints/)")))
        print(f"torchherd: running {shlex.join([Path(sys.executable).name, *script])} in {cwd}", flush=True)
        threads = []
        try:
            self.proc = ScriptProcess(script, cwd, env, theirs.fileno())
            forward_stacks(self.proc.pid, self._stacks_asked)
            theirs.close()
            for target in (self._pump_output, self._read_client):
                threads.append(threading.Thread(target=target, name=f"torchherd-{target.__name__}", daemon=True))
                threads[-1].start()
            self.sender.send(TrainingStarted(pipeline=self.name, epoch=0, step=0, device=self.spec.device,
                                             parameters=0, **self._length()))
            code = self._supervise()
            for thread in threads:  # the last lines and frames it sent, before the exit is reported
                thread.join(OUTPUT_JOIN)
            if (notice := self.unmatched.ended()) is not None:  # a short script: fewer lines than the watch waits for
                self.sender.send(Notice(pipeline=self.name, level="warning", text=notice))
            print(f"torchherd: the script exited with code {code}", flush=True)
            return self._exit_code(code)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.signal_tree(signal.SIGKILL)
            theirs.close()
            ours.close()
            if self.inline_dir:
                shutil.rmtree(self.inline_dir, ignore_errors=True)
            self._save_state()

    def _length(self) -> dict[str, int]:
        """How long it trains, as far as the config tells: with max_steps, one stretch of max_steps (so
        progress and ETA fill in for a script that counts iterations); else max_epochs of unknown length."""
        pipe = self.pipe
        if pipe.max_steps is not None:
            return {"epochs_total": 1, "steps_per_epoch": pipe.max_steps}
        return {"epochs_total": pipe.epochs_planned, "steps_per_epoch": 0}

    # ------------------------------------------------------------ supervise

    def _supervise(self) -> int:
        start = last_beat = time.monotonic()
        trained_before = float(self.state.get("trained_time", 0.0))
        paused_since: float | None = None
        paused_total = 0.0
        cpu = self.process.cpu_seconds()
        control = self.control
        while True:
            control.poll(TICK)
            now = time.monotonic()
            if control.paused != self.paused:
                self._set_paused(control.paused)
                if control.paused:
                    paused_since = now
                elif paused_since is not None:
                    paused_total += now - paused_since
            if control.take_checkpoint_request():
                self._checkpoint_now()
            pausing = now - paused_since if self.paused and paused_since is not None else 0.0
            trained = trained_before + now - start - paused_total - pausing
            self.state["trained_time"] = trained
            if not self.stopping:
                if self.pipe.max_time is not None and trained >= self.pipe.max_time:
                    self.limit = "max_time"
                elif self.pipe.max_steps is not None and self.events.step >= self.pipe.max_steps:
                    self.limit = "max_steps"
                if control.should_stop or self.limit or self.fail_code is not None:
                    self._begin_stop(now)
            code = self.process.poll()
            if code is not None:
                return code
            if self.signal_at is not None and (now >= self.signal_at or self._checkpoint_since_stop()):
                self.signal_at = None
                self.process.signal(self.stop_signal)
            if self.kill_at is not None and now >= self.kill_at:
                self.process.signal_tree(signal.SIGKILL)
                self.kill_at = None
            if now - last_beat >= HEARTBEAT_INTERVAL:
                last_beat = now
                cpu = self._beat(cpu)

    def _begin_stop(self, now: float) -> None:
        self.stopping = True
        if self.stopped_by_signal:
            self.stopped_by_signal = False
            self.process.signal_tree(signal.SIGCONT)
        self._frame(wire.StopRequest())
        if self.fail_code is not None:
            self.process.signal_tree(signal.SIGTERM)
            self.kill_at = now + KILL_AFTER
        elif not self.polls_stop and self.pipe.stop_mode == "after_checkpoint" and not self.limit:
            # It cannot save on demand: let it reach its next checkpoint, then signal it. Signalled at
            # the latest with a quarter of stop_timeout left, so it is not killed mid-save.
            newest = newest_checkpoint(self.ckpt_dir)
            self.stop_after = newest.stat().st_mtime if newest is not None else 0.0
            self.signal_at = now + 0.75 * self.spec.stop_timeout
            self._tell(f"stopping after its next save in checkpoints/ (waiting up to "
                       f"{0.75 * self.spec.stop_timeout:.0f} s), then {self.stop_signal.name}")
        elif not self.polls_stop and self.limit:
            # It reached the limit the config sets (max_steps: often where the script ends by itself, then
            # saves): a moment to end on its own, then its stop signal, as at the end of a wait for a save.
            self.stop_after = time.time()
            self.signal_at = now + min(LIMIT_GRACE, 0.75 * self.spec.stop_timeout)
        elif not self.polls_stop:
            # No client that looks for it: its stop signal (Ctrl-C's SIGINT unless the config says
            # otherwise; a script may catch KeyboardInterrupt to save). The supervisor's stop_timeout,
            # then kill_grace, escalate.
            self.process.signal(self.stop_signal)
            if not self.limit:
                newest = newest_checkpoint(self.ckpt_dir)
                since = f"its last save ({describe_checkpoint(newest)})" if newest is not None else "it started"
                self._tell(f"stopping with {self.stop_signal.name}: unless the script saves on it, what it "
                           f"trained since {since} is lost (stop_mode = \"after_checkpoint\" waits for a save)")

    def _tell(self, text: str) -> None:
        if not self.spec.rank:  # rank 0 speaks for a gang
            self.sender.send(Notice(pipeline=self.name, level="info", text=text))

    def _checkpoint_since_stop(self) -> bool:
        """Whether the script wrote a checkpoint since the stop was asked for (stop_mode after_checkpoint)."""
        newest = newest_checkpoint(self.ckpt_dir)
        try:
            mtime = newest.stat().st_mtime if newest is not None else 0.0
        except OSError:
            return False
        # untouched for a moment: the script has finished writing it (a signal mid-save would spoil it)
        return mtime > (self.stop_after or 0.0) and time.time() - mtime >= SAVE_SETTLE

    def _set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused and self.stopped_by_signal:
            self.stopped_by_signal = False
            self.process.signal_tree(signal.SIGCONT)
        if self.client:
            self._frame(wire.PauseRequest() if paused else wire.ResumeRequest())
        elif paused:  # no client to hold the loop at a step boundary: freeze the processes
            self.stopped_by_signal = True
            self.process.signal_tree(signal.SIGSTOP)

    def _checkpoint_now(self) -> None:
        if self.client:
            self._frame(wire.CheckpointRequest())
        elif not self.told_no_client:
            self.told_no_client = True
            self.sender.send(Notice(pipeline=self.name, level="warning", text=(
                "checkpoint on request needs torchherd.client in the script: "
                "`if herd.checkpoint_requested(): herd.save(state)` in its loop")))

    def _beat(self, cpu: float) -> float:
        """Send a heartbeat if the script showed life since the last one; returns its CPU seconds now."""
        now_cpu = self.process.cpu_seconds()
        if self.client_beats:  # the client reports steps: only they (or heartbeat()) prove progress
            alive = self.client_seen
        elif self.prints_steps:  # progress is a step (or output): a rank left spinning in a collective burns CPU
            alive = self.output_seen
        else:
            alive = self.output_seen or self.client_seen or now_cpu - cpu > CPU_ALIVE
        alive = alive or self.scoring
        if time.monotonic() - self.stacks_at < STACKS_QUIET:
            alive = False  # that output (and CPU) was its stack dump, not training
        self.output_seen = self.client_seen = False
        if alive and not self.paused:
            self.control.heartbeat(self.events.step)
        return now_cpu

    def _stacks_asked(self) -> None:
        self.stacks_at = time.monotonic()

    def _exit_code(self, code: int) -> int:
        if self.fail_code is not None:
            return self.fail_code
        if self.limit:
            return WorkerExit.COMPLETED
        if self.control.should_stop:
            return WorkerExit.STOPPED
        if code == 0:
            return WorkerExit.COMPLETED
        if code < 0 and -code in signal.Signals._value2member_map_:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        lines = list(self.tail)
        error = error_line(lines)
        who = f"rank {self.spec.rank} of the script" if self.spec.world_size > 1 else "the script"
        error = f"{error} ({who} {how})" if error else f"{who} {how}"
        self.sender.send(WorkerError(pipeline=self.name, error=error, traceback=crash_excerpt(lines), where="train",
                                     rank=self.spec.rank, step=self.events.step or -1))
        return WorkerExit.ERROR

    # ------------------------------------------------------------ the script's output

    def _pump_output(self) -> None:
        fd = self.process.output_fd
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            view = memoryview(chunk)
            while view:  # into the worker's stdout, which is the pipeline's log.txt
                view = view[os.write(1, view):]
            self.output_seen = True
            *lines, pending = re.split(rb"[\r\n]", pending + chunk)  # \r too: progress bars redraw a line
            pending = pending[-MAX_LINE:]
            for raw in lines:
                self._on_line(raw.decode("utf-8", "replace"))
        if pending:
            self._on_line(pending.decode("utf-8", "replace"))

    def _on_line(self, line: str) -> None:
        if not line.strip():
            return
        self.tail.append(line)
        for regex in self.val_regexes:
            if (match := regex.search(line)) is not None:
                self._own_validation(self.events.val_from_match(match.groupdict()))
                break
        matched = False
        for regex in self.regexes:
            if (match := regex.search(line)) is not None:
                groups = match.groupdict()
                # a step report (not an epoch's end): from now on steps and output, not CPU, prove progress
                self.prints_steps = self.prints_steps or groups.get("step") is not None or groups.get("epoch") is None
                counted = self.events.epoch_base
                for event in self.events.from_match(groups):
                    self._emit(event, parse_number(groups.get("loss")))
                if counted is None and self.events.epoch_base is not None:
                    self._save_state()  # how it counts epochs, kept at once: a gang's kill may end this attempt
                matched = True
                break
        # a script reporting through the client does not need its lines matched
        if (notice := self.unmatched.line(line, matched or self.client)) is not None:
            self.sender.send(Notice(pipeline=self.name, level="warning", text=notice))

    def _own_validation(self, result: ValResult | None) -> None:
        """A validation the script printed: sent, and judged against the best so far for `patience`."""
        if result is None or self.spec.rank:
            return
        self.sender.send(result)
        v = self.validation
        value = metric_value(result.metrics, v.metric)
        if value is None:
            return
        _, self.best, self.since_best, stop = judge(value, self.best, self.since_best, v)
        if stop:
            self._early_stop(stop)

    def _emit(self, event: StepMetrics | EpochEnd, loss: float | None) -> None:
        """Send a step or epoch event; a `loss` the script reported that is NaN or infinite meets the NaN policy."""
        if loss is not None:
            # Epochs counted from 1, as the table and every other line show them.
            code = self.control.non_finite(float(loss), f"epoch {event.epoch + 1} step {event.step}")
            if code is not None and self.fail_code is None:
                self.fail_code = code  # the supervise loop ends the script
        (self.sender.step if isinstance(event, StepMetrics) else self.sender.send)(event)

    # ------------------------------------------------------------ state

    def _save_state(self) -> None:
        """Remember across attempts: how the script counts epochs, which checkpoint holds which step, time trained."""
        if self.spec.rank:
            return  # rank 0 keeps the gang's
        self.state["epoch_base"] = self.events.epoch_base
        tmp = self.state_path.with_name(f".{self.state_path.name}.tmp")
        try:
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.state_path)
        except OSError:
            pass
