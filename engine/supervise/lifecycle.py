"""The lifecycle of a pipeline's attempts: launch, terminate, escalate, catch hangs, classify exits, restart.

Every state change of a pipeline is made here, through `set_state` and its guard.
Why a worker ended is read from a table (what we asked of it, then its exit
code), and what follows from that reason is a second table.
"""
from __future__ import annotations

import signal
import time
from functools import partial
from typing import Callable, Protocol

from ..protocol.channel import WorkerExit
from ..launch.backend import Handle, NoRoom
from ..launch.gang import GangHandle
from ..protocol.messages import (Event, Notice, PipelineFinished, Stalled, Stop, WorkerExited, WorkerRestarting,
                                       WorkerStarted, WorkerStateChanged)
from .pipeline import Attempt, PipelineRun
from .scheduler import Scheduler
from ..protocol.names import ExitReason, Intent
from ..protocol.states import WorkerState, check_transition

S = WorkerState
R = ExitReason
HANG_DUMP_WAIT = 1.0  # seconds between asking a hung worker for its stack and killing it
STALL_FACTOR = 5  # a live worker is flagged after this many times its slowest gap, or stall_warning (x5 before a step)

# Why an attempt ended: what we asked of it wins over its exit code, and so does what its launcher knows
# better than the code (`handle.cause`): "node left", an attempt lost with its cluster node, is moved
# to a live one as a restart is, spending no budget.
ROOM_WAIT = 1.0  # seconds between looks for room for a pipeline whose node left and that fits nowhere yet


BY_INTENT = {Intent.RESTART: R.RESTARTED, Intent.KILL: R.KILLED, Intent.HUNG: R.HUNG, Intent.NODE_LEFT: R.RESTARTED}
BY_CODE: dict[int, ExitReason] = {WorkerExit.STOPPED: R.STOPPED, WorkerExit.COMPLETED: R.COMPLETED,
                                  WorkerExit.RESTART: R.RESTART_REQUESTED, WorkerExit.FATAL: R.FAILED}
WITH_ERROR = (R.FAILED, R.CRASHED, R.HUNG, R.RESTART_REQUESTED)  # reasons that carry the worker's error
EXIT_SHOWN = (R.FAILED, R.CRASHED, R.HUNG)  # reasons whose exit ("exit code 3") is the error when none was sent


def classify(intent: Intent | None, code: int) -> ExitReason:
    """The reason an attempt ended, from why we asked it to end (if we did) and its exit status."""
    if intent in BY_INTENT:
        return BY_INTENT[intent]
    if intent == Intent.STOP and code != WorkerExit.COMPLETED:
        return R.STOPPED  # asked to stop; however it went, it is not a crash
    return BY_CODE.get(code, R.CRASHED)


def describe_exit(code: int) -> str:
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class Intake(Protocol):
    """Where the events an attempt's handle delivers go (supervise/intake.py's WorkerIntake)."""

    def take(self, run: PipelineRun, handle: Handle, events: list[Event]) -> None: ...


class States:
    """Moves a pipeline from state to state through the guard, keeping the scheduler's queue and the events in
    step with it; and hears a live attempt's news (a stalled one is no longer)."""

    def __init__(self, *, scheduler: Scheduler, publish: Callable[[Event], None]):
        self._scheduler, self._publish = scheduler, publish

    def set_state(self, run: PipelineRun, state: WorkerState) -> None:
        check_transition(run.state, state)
        previous, run.state = run.state, state
        if state == S.QUEUED:
            self._scheduler.enqueue(run.name, run.plan.config.priority, run.plan.order, run.plan.request)
        elif previous == S.QUEUED:
            self._scheduler.dequeue(run.name)
        if previous != state:
            self._publish(WorkerStateChanged(pipeline=run.name, state=state.value, previous=previous.value))

    def heard(self, run: PipelineRun) -> None:
        """News from the running attempt: it made progress (and is no longer stalled, if it was)."""
        if run.live.heard(time.monotonic()):
            self._publish(Stalled(pipeline=run.name, quiet=0.0))


class Lifecycle:
    """Starts and ends attempts and moves pipelines through their states (`States`); each attempt's events go to
    the intake, built before it."""

    def __init__(self, *, start: Callable[[PipelineRun], Handle], scheduler: Scheduler, states: States,
                 intake: Intake, publish: Callable[[Event], None], gpu_note: Callable[[PipelineRun], str]):
        self._start, self._scheduler, self._publish = start, scheduler, publish  # start: raises OSError
        self.states, self._intake = states, intake
        self.set_state, self.heard = states.set_state, states.heard  # every state change goes through the guard
        self._gpu_note = gpu_note  # what the GPU looked like, for a crash's message

    def _on_events(self, run: PipelineRun, handle: Handle, events: list[Event]) -> None:
        self._intake.take(run, handle, events)

    # ------------------------------------------------------------ states

    def finish(self, run: PipelineRun, state: WorkerState, reason: str, rung: float | None = None) -> None:
        """Into a final or resting state (`rung`: where one waiting at a rung waits): its slots go back to the
        pool and the run directory says how it ended."""
        run.finish_reason = reason
        self.set_state(run, state)
        if run.slots:
            self._scheduler.release(run.slots, run.name)
            run.slots = []
        figures = run.figures()
        self._publish(PipelineFinished(pipeline=run.name, status=state.value, reason=reason, epoch=figures.epoch,
                                       step=figures.step, rung=rung if state == S.WAITING_AT_RUNG else None,
                                       never_ran=not run.attempts))

    # ------------------------------------------------------------ starting

    def launch(self, run: PipelineRun) -> None:
        """Start the next attempt on the pipeline's slots (QUEUED/BACKOFF/KILLING -> STARTING)."""
        run.attempts += 1
        run.restart_at = None
        run.stop_as, run.stop_rung = S.STOPPED, None  # a new attempt: what the last stop ended in does not carry over
        attempt, previous = Attempt(number=run.attempts), run.current
        run.current = attempt
        try:
            handle = self._start(run)
        except NoRoom as exc:
            if run.state != S.BACKOFF:  # a first start with no room: a failed start, as any other
                self._failed_to_start(run, exc)
                return
            run.attempts, run.current = run.attempts - 1, previous  # none was made: it waits for room in BACKOFF
            run.restart_at = time.monotonic() + ROOM_WAIT
            if run.last_error != str(exc):
                run.last_error = str(exc)
                self._publish(Notice(pipeline=run.name, level="warning", text=f"waiting for room: {exc}"))
            return
        except OSError as exc:
            self._failed_to_start(run, exc)
            return
        attempt.handle = handle
        attempt.started_mono = attempt.last_progress = time.monotonic()
        attempt.started_at = time.time()
        handle.attach(partial(self._on_events, run, handle))
        self.set_state(run, S.STARTING)  # QUEUED/BACKOFF/KILLING -> STARTING
        self._announce(run, attempt)

    def _failed_to_start(self, run: PipelineRun, exc: OSError) -> None:
        run.last_error = f"could not start the worker: {exc}"
        self.set_state(run, S.STARTING)  # -> STARTING (it failed at once)
        self.after_crash(run, uptime=0.0, exit_desc=run.last_error, stepped=False)

    def _announce(self, run: PipelineRun, attempt: Attempt, force: bool = False) -> None:
        """WorkerStarted, once the launcher knows every process's pid: at once locally; on Ray when
        the actor has started its child (a tick or so later). `force`: now, with what is known."""
        handle = attempt.handle
        assert handle is not None, "announced only once started"
        pids = handle.pids
        if attempt.announced or (len(pids) < max(1, len(run.slots)) and not force):
            return
        attempt.announced = True
        gpu = run.slots[0].gpu if run.slots else None
        self._publish(WorkerStarted(pipeline=run.name, pid=pids[0] if pids else handle.pid,
                                    device=",".join(s.name for s in run.slots), attempt=attempt.number,
                                    gpu_uuid=gpu.uuid if gpu is not None else "",
                                    pids=pids if len(run.slots) > 1 else (), node=handle.node))

    # ------------------------------------------------------------ ending

    def request_stop(self, run: PipelineRun, reason: str) -> None:
        """Ask a live worker to finish its step, checkpoint and exit (-> STOPPING)."""
        assert run.current is not None and run.handle is not None
        run.current.intent, run.stop_reason = Intent.STOP, reason
        run.current.deadline = time.monotonic() + run.plan.run_config.restart.stop_timeout
        run.handle.send(Stop(reason=reason))
        self.set_state(run, S.STOPPING)  # STARTING/RUNNING/PAUSED -> STOPPING

    def terminate(self, run: PipelineRun) -> None:
        """The polite signal now, the hard one after the grace period (-> KILLING)."""
        assert run.current is not None and run.handle is not None
        run.handle.terminate()
        run.current.deadline = time.monotonic() + run.plan.run_config.restart.kill_grace
        self.set_state(run, S.KILLING)  # alive -> KILLING

    def tick(self, run: PipelineRun, now: float) -> None:
        """Reap an exited worker, escalate an overdue one, catch a hung one, leave BACKOFF when due."""
        attempt, handle = run.current, run.handle
        if handle is None or attempt is None:
            if run.state == S.BACKOFF and run.restart_at is not None and now >= run.restart_at:
                self.launch(run)
            return
        code = handle.poll()
        if not attempt.announced:
            self._announce(run, attempt, force=code is not None)
        if code is not None:
            self.exited(run, code)
        elif attempt.deadline is not None and now >= attempt.deadline:
            if run.state == S.HUNG:
                self.terminate(run)  # its stack had time to reach the log
            elif run.state == S.KILLING and not attempt.escalated:
                attempt.escalated = True
                handle.kill()  # it ignored the polite signal for kill_grace
            elif run.state == S.STOPPING:
                run.stop_reason = f"did not stop within {run.plan.run_config.restart.stop_timeout:g}s; killed"
                self.terminate(run)
        elif self._is_hung(run, now):
            attempt.intent = Intent.HUNG
            handle.dump_stacks()
            attempt.deadline = now + HANG_DUMP_WAIT
            timeout = run.plan.run_config.restart.hang_timeout
            run.last_error = f"hung: no training step for {timeout:g}s (stack dumped to its log)" + \
                self._gpu_note(run)
            self.set_state(run, S.HUNG)  # STARTING/RUNNING -> HUNG
            self._publish(Notice(pipeline=run.name, level="error", text=run.last_error))
        else:
            self._watch_stall(run, now)

    def _watch_stall(self, run: PipelineRun, now: float) -> None:
        """Flag, once, a live worker that has made no step for a while; nothing is killed (`hang_timeout` does)."""
        attempt = run.current
        if run.state not in (S.STARTING, S.RUNNING) or attempt is None or attempt.stalled:
            return
        warn = run.plan.run_config.restart.stall_warning
        limit = max(warn, STALL_FACTOR * attempt.slowest) if attempt.stepped else STALL_FACTOR * warn
        quiet = now - attempt.last_progress
        if quiet > limit:
            attempt.stalled = True
            self._publish(Stalled(pipeline=run.name, quiet=quiet, first_step=not attempt.stepped))

    def _is_hung(self, run: PipelineRun, now: float) -> bool:
        timeout = run.plan.run_config.restart.hang_timeout
        attempt = run.current
        if timeout is None or attempt is None:
            return False
        if run.state == S.STARTING or (run.state == S.RUNNING and not attempt.stepped):
            # building the task and the first step (a gang's first collective, compilation, autotuning)
            start = run.plan.run_config.restart.start_timeout
            return now - attempt.last_progress > (start if start is not None else max(3 * timeout, 60.0))
        return run.state == S.RUNNING and now - attempt.last_progress > timeout

    def exited(self, run: PipelineRun, code: int) -> None:
        """The worker is gone: say why, then finish, relaunch or back off."""
        attempt = run.current
        assert attempt is not None and attempt.handle is not None
        handle = attempt.handle
        self._on_events(run, handle, handle.drain())  # what it sent last, before it is forgotten
        handle.close()
        attempt.handle = None
        uptime = time.monotonic() - attempt.started_mono
        exit_desc = describe_exit(code)
        reason = classify(attempt.intent or handle.cause, code)
        sig = exit_desc[len("killed by "):] if code < 0 and exit_desc.startswith("killed by ") else ""
        rank, pid = 0, handle.pid
        cause, echoes = handle.told_errors() if isinstance(handle, GangHandle) else ([], [])
        for event in cause:  # the root cause's own words lead (its peers' echoes follow the exit)
            self._on_events(run, handle, [event])
        if attempt.intent is None and isinstance(handle, GangHandle) and handle.failed_rank is not None:
            rank, pid, exit_desc = self._gang_root_cause(run, handle, exit_desc)
        error = run.last_error if reason in WITH_ERROR else ""
        self._publish(WorkerExited(
            pipeline=run.name, pid=pid, attempt=run.attempts, exit_code=code if code >= 0 else None,
            signal=sig, reason=reason,
            error=error or ("" if reason not in EXIT_SHOWN else exit_desc),
            traceback=run.last_traceback if error else "", uptime=uptime, rank=rank))
        for notice in echoes:
            self._publish(notice)
        OUTCOMES[reason](self, run, uptime, exit_desc)

    @staticmethod
    def _gang_root_cause(run: PipelineRun, gang: GangHandle, exit_desc: str) -> tuple[int, int, str]:
        """The rank that failed first is why the gang ended; what its peers reported after is its echo."""
        rank = gang.exit_rank  # the failed rank: this is asked only once one failed
        error = gang.errors.get(rank)
        exit_desc = f"rank {rank} {exit_desc}"
        if error is not None:
            run.last_error, run.last_traceback = f"rank {rank}: {error.error}", error.traceback
            run.live.failure = (error.error, error.step) if error.where == "train" else None
        else:
            run.last_error, run.last_traceback = exit_desc, ""
            run.live.failure = None
        return rank, gang.ranks[rank].pid, exit_desc

    def _relaunch(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        run.last_error = run.last_traceback = ""
        if run.state == S.KILLING:
            self.launch(run)  # KILLING -> STARTING, same slots, no budget spent
        else:  # it ended for a cause that costs nothing (its node left): start again on the next tick
            run.restart_at = time.monotonic()
            self.set_state(run, S.BACKOFF)  # STARTING/RUNNING/PAUSED/STOPPING/HUNG -> BACKOFF

    def _killed(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        self.finish(run, S.KILLED, "killed on request")

    def _stopped(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        self.finish(run, run.stop_as, run.stop_reason or "stopped", run.stop_rung)

    def _completed(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        self.finish(run, S.COMPLETED, "trained to its limits")

    def _failed(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        self.finish(run, S.FAILED, run.last_error or exit_desc)

    def _restart_requested(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        # nan_policy = "restart": back to the last checkpoint. It spends the budget, so a loss
        # that always diverges still ends, but it is no failed start however quick.
        self.after_crash(run, uptime=float("inf"), exit_desc="the worker asked to be restarted")

    def _crashed(self, run: PipelineRun, uptime: float, exit_desc: str) -> None:
        failure, previous = run.live.failure, run.last_failure
        run.last_failure = failure
        if failure is not None and failure == previous:
            error, step = failure
            # `step` is the last it finished (the error line may name the next: "bad batch at step 30"); the
            # epoch as the table counts it, since a script's own step counter may start over each epoch
            p = run.progress
            total = f"/{p.epochs_total}" if p.epochs_total else ""
            at = f"in epoch {p.epoch_number}{total} after step {step:,}" if step > 0 else \
                "in its first step" if step == 0 else "before its first step"
            self.finish(run, S.FAILED, f"the same error {at} twice in a row, so a restart cannot fix it: {error}")
            return
        self.after_crash(run, uptime, exit_desc, stepped=run.live.stepped)

    def after_crash(self, run: PipelineRun, uptime: float, exit_desc: str, stepped: bool = True) -> None:
        """Restart under the policy (-> BACKOFF), or end the pipeline as failed."""
        decision = run.plan.policy.decide(run.restarts, run.failed_starts, uptime, stepped)
        run.failed_starts = decision.failed_starts
        what = (run.last_error or exit_desc) + self._gpu_note(run)
        if not decision.restart:
            self.finish(run, S.FAILED, f"{decision.reason}: {what}")
            return
        run.restarts += 1
        run.restart_at = time.monotonic() + decision.delay
        run.last_error = what
        self.set_state(run, S.BACKOFF)  # STARTING/RUNNING/... -> BACKOFF
        self._publish(WorkerRestarting(pipeline=run.name, attempt=run.attempts + 1, delay=decision.delay,
                                       restarts_left=run.plan.run_config.restart.max_restarts - run.restarts,
                                       reason=f"{decision.reason}: {what}"))


OUTCOMES: dict[ExitReason, Callable[[Lifecycle, PipelineRun, float, str], None]] = {
    R.RESTARTED: Lifecycle._relaunch,
    R.KILLED: Lifecycle._killed,
    R.STOPPED: Lifecycle._stopped,
    R.COMPLETED: Lifecycle._completed,
    R.FAILED: Lifecycle._failed,
    R.RESTART_REQUESTED: Lifecycle._restart_requested,
    R.CRASHED: Lifecycle._crashed,
    R.HUNG: Lifecycle._crashed,
}
