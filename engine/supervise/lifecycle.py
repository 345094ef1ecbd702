"""The lifecycle of a pipeline's attempts: launch, terminate, escalate, catch hangs, classify exits, restart.

Every state change of a pipeline is made here, through `set_state` and its guard.
Why a worker ended is read from a table (what we asked of it, then its exit
code), and what follows from that reason is a second table.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from ..launch.backend import Handle, NoRoom
from ..launch.gang import GangHandle
from ..protocol.channel import WorkerExit
from ..protocol.messages import (
    Event,
    Notice,
    PipelineFinished,
    Stalled,
    Stop,
    WorkerExited,
    WorkerRestarting,
    WorkerStarted,
    WorkerStateChanged,
)
from ..protocol.names import ExitReason, Intent
from ..protocol.states import WorkerState, check_transition
from .pipeline import Attempt, SupervisedPipeline
from .resizing import failed_again, resized_event
from .scheduler import Scheduler
from .watched import WatchedClock

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
    if intent == Intent.RESIZE and code != WorkerExit.COMPLETED:
        return R.RESTARTED  # asked to stop to start again at another size: no crash either
    return BY_CODE.get(code, R.CRASHED)


def describe_exit(code: int) -> str:
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class Intake(Protocol):
    """Where the events an attempt's handle delivers go (supervise/intake.py's WorkerIntake)."""

    def take(self, pipe: SupervisedPipeline, handle: Handle, events: list[Event]) -> None: ...


class States:
    """Moves a pipeline from state to state through the guard, keeping the scheduler's queue and the events in
    step with it; and hears a live attempt's news (a stalled one is no longer) on the watched clock, which its
    silence is judged on."""

    def __init__(self, *, scheduler: Scheduler, publish: Callable[[Event], None], clock: WatchedClock):
        self._scheduler, self._publish, self.clock = scheduler, publish, clock

    def set_state(self, pipe: SupervisedPipeline, state: WorkerState) -> None:
        check_transition(pipe.state, state)
        previous, pipe.state = pipe.state, state
        if state == S.QUEUED:
            self._scheduler.enqueue(pipe.name, pipe.plan.config.priority, pipe.plan.order, pipe.plan.request)
        elif previous in (S.QUEUED, S.BACKOFF):  # BACKOFF: an elastic gang waits in the queue for its new grant
            self._scheduler.dequeue(pipe.name)
        if previous != state:
            self._publish(WorkerStateChanged(pipeline=pipe.name, state=state.value, previous=previous.value))

    def heard(self, pipe: SupervisedPipeline) -> None:
        """News from the running attempt: it made progress (and is no longer stalled, if it was). One that is
        being stopped or killed is not said to be training again: its last words are not steps."""
        attempt = pipe.live
        if attempt.heard(self.clock()) and pipe.state in (S.STARTING, S.RUNNING):
            self._publish(Stalled(pipeline=pipe.name, quiet=0.0, first_step=not attempt.stepped))


class Lifecycle:
    """Starts and ends attempts and moves pipelines through their states (`States`); each attempt's events go to
    the intake, built before it."""

    def __init__(self, *, start: Callable[[SupervisedPipeline], Handle], scheduler: Scheduler, states: States,
                 intake: Intake, publish: Callable[[Event], None], gpu_note: Callable[[SupervisedPipeline], str]):
        self._start, self._scheduler, self._publish = start, scheduler, publish  # start: raises OSError
        self.states, self._intake = states, intake
        self.set_state, self.heard = states.set_state, states.heard  # every state change goes through the guard
        self._gpu_note = gpu_note  # what the GPU looked like, for a crash's message

    def _on_events(self, pipe: SupervisedPipeline, handle: Handle, events: list[Event]) -> None:
        self._intake.take(pipe, handle, events)

    # ------------------------------------------------------------ states

    def finish(self, pipe: SupervisedPipeline, state: WorkerState, reason: str, rung: float | None = None) -> None:
        """Into a final or resting state (`rung`: where one waiting at a rung waits): its slots go back to the
        pool and the run directory says how it ended."""
        pipe.finish_reason = reason
        self.set_state(pipe, state)
        if pipe.slots:
            self._scheduler.release(pipe.slots, pipe.name)
            pipe.slots = []
        figures = pipe.figures()
        self._publish(PipelineFinished(pipeline=pipe.name, status=state.value, reason=reason, epoch=figures.epoch,
                                       step=figures.step, rung=rung if state == S.WAITING_AT_RUNG else None,
                                       never_ran=not pipe.attempts))

    # ------------------------------------------------------------ starting

    def launch(self, pipe: SupervisedPipeline) -> None:
        """Start the next attempt on the pipeline's slots (QUEUED/BACKOFF/KILLING -> STARTING)."""
        if not pipe.slots:  # an elastic gang that gave its slots back: it starts once the scheduler grants some
            return
        pipe.attempts += 1
        pipe.restart_at = None
        pipe.stop_as, pipe.stop_rung = S.STOPPED, None  # a new attempt: what the last stop ended in does not carry over
        attempt, previous = Attempt(number=pipe.attempts), pipe.current
        pipe.current = attempt
        try:
            handle = self._start(pipe)
        except NoRoom as exc:
            if pipe.state != S.BACKOFF:  # a first start with no room: a failed start, as any other
                self._failed_to_start(pipe, exc)
                return
            pipe.attempts, pipe.current = pipe.attempts - 1, previous  # none was made: it waits for room in BACKOFF
            pipe.restart_at = time.monotonic() + ROOM_WAIT
            if pipe.last_error != str(exc):
                pipe.last_error = str(exc)
                self._publish(Notice(pipeline=pipe.name, level="warning", text=f"waiting for room: {exc}"))
            return
        except OSError as exc:
            self._failed_to_start(pipe, exc)
            return
        attempt.handle = handle
        self._say_resized(pipe, previous)
        attempt.started_mono, attempt.last_progress = time.monotonic(), self.states.clock()
        attempt.started_at = time.time()
        handle.attach(partial(self._on_events, pipe, handle))
        self.set_state(pipe, S.STARTING)  # QUEUED/BACKOFF/KILLING -> STARTING
        self._announce(pipe, attempt)

    def _say_resized(self, pipe: SupervisedPipeline, previous: Attempt | None) -> None:
        """An elastic gang starting at another size than its last attempt (or, first, than its MAX): gang_resized,
        saying why (the `Resize` asked of `previous`, if that is how it ended) and what became of its batch."""
        before, now = pipe.ranks_run or pipe.plan.config.max_ranks, len(pipe.slots)
        cause, pipe.regrant_cause = pipe.regrant_cause, ""
        grown = pipe.resize_why if previous is not None and previous.intent == Intent.RESIZE else ""
        pipe.resize_why = ""
        short = self._scheduler.short.pop(pipe.name, "")
        pipe.ranks_run = now
        if not pipe.plan.config.elastic or now == before:
            return
        again = "its slots were free again" if now > before and not grown else ""
        why = "; ".join(w for w in (grown or cause, short or again) if w)
        self._publish(resized_event(pipe.plan.config, before, now, why))

    def _failed_to_start(self, pipe: SupervisedPipeline, exc: OSError) -> None:
        pipe.last_error = f"could not start the worker: {exc}"
        self.set_state(pipe, S.STARTING)  # -> STARTING (it failed at once)
        self.after_crash(pipe, uptime=0.0, exit_desc=pipe.last_error, stepped=False)

    def _announce(self, pipe: SupervisedPipeline, attempt: Attempt, force: bool = False) -> None:
        """WorkerStarted, once the launcher knows every process's pid: at once locally; on Ray when
        the actor has started its child (a tick or so later). `force`: now, with what is known."""
        handle = attempt.handle
        assert handle is not None, "announced only once started"
        pids = handle.pids
        if attempt.announced or (len(pids) < max(1, len(pipe.slots)) and not force):
            return
        attempt.announced = True
        gpu = pipe.slots[0].gpu if pipe.slots else None
        config = pipe.plan.config
        low, high = (config.min_ranks, config.max_ranks) if config.elastic else (0, 0)
        self._publish(WorkerStarted(pipeline=pipe.name, pid=pids[0] if pids else handle.pid,
                                    device=",".join(s.name for s in pipe.slots), attempt=attempt.number,
                                    gpu_uuid=gpu.uuid if gpu is not None else "",
                                    pids=pids if len(pipe.slots) > 1 else (), node=handle.node,
                                    min_ranks=low, max_ranks=high))

    # ------------------------------------------------------------ ending

    def request_stop(self, pipe: SupervisedPipeline, reason: str) -> None:
        """Ask a live worker to finish its step, checkpoint and exit (-> STOPPING)."""
        assert pipe.current is not None and pipe.handle is not None
        pipe.current.intent, pipe.stop_reason = Intent.STOP, reason
        pipe.current.deadline = time.monotonic() + pipe.plan.run_config.restart.stop_timeout
        pipe.handle.send(Stop(reason=reason))
        self.set_state(pipe, S.STOPPING)  # STARTING/RUNNING/PAUSED -> STOPPING

    def request_resize(self, pipe: SupervisedPipeline, why: str) -> None:
        """Ask an elastic gang to checkpoint and exit, to start again from there at the size it is granted then
        (-> STOPPING; on its exit -> BACKOFF, its slots given back, no restart spent)."""
        self.request_stop(pipe, f"to resize: {why}")
        pipe.live.intent, pipe.resize_why = Intent.RESIZE, why

    def terminate(self, pipe: SupervisedPipeline) -> None:
        """The polite signal now, the hard one after the grace period (-> KILLING)."""
        assert pipe.current is not None and pipe.handle is not None
        pipe.handle.terminate()
        pipe.current.deadline = time.monotonic() + pipe.plan.run_config.restart.kill_grace
        self.set_state(pipe, S.KILLING)  # alive -> KILLING

    def tick(self, pipe: SupervisedPipeline, now: float) -> None:
        """Reap an exited worker, escalate an overdue one, catch a hung one, leave BACKOFF when due."""
        attempt, handle = pipe.current, pipe.handle
        if handle is None or attempt is None:
            if pipe.state == S.BACKOFF and pipe.restart_at is not None and now >= pipe.restart_at:
                self.launch(pipe)
            return
        code = handle.poll()
        if not attempt.announced:
            self._announce(pipe, attempt, force=code is not None)
        if code is not None:
            self.exited(pipe, code)
        elif attempt.deadline is not None and now >= attempt.deadline:
            if pipe.state == S.HUNG:
                self.terminate(pipe)  # its stack had time to reach the log
            elif pipe.state == S.KILLING and not attempt.escalated:
                attempt.escalated = True
                handle.kill()  # it ignored the polite signal for kill_grace
            elif pipe.state == S.STOPPING:
                pipe.stop_reason = f"did not stop within {pipe.plan.run_config.restart.stop_timeout:g}s; killed"
                self.terminate(pipe)
        elif self._judge_silence(pipe, attempt, handle):
            attempt.intent = Intent.HUNG
            handle.dump_stacks()
            attempt.deadline = now + HANG_DUMP_WAIT
            timeout = pipe.plan.run_config.restart.hang_timeout
            pipe.last_error = f"hung: no training step for {timeout:g}s (stack dumped to its log)" + \
                self._gpu_note(pipe)
            self.set_state(pipe, S.HUNG)  # STARTING/RUNNING -> HUNG
            self._publish(Notice(pipeline=pipe.name, level="error", text=pipe.last_error))

    def _judge_silence(self, pipe: SupervisedPipeline, attempt: Attempt, handle: Handle) -> bool:
        """Whether the live attempt is hung; else flag it once if it stalls. Judged on all it sent: its reports
        may wait unread in its channel (the loop was busy, or this process was stopped and the tick came first
        on waking), so they are read first, and its silence is counted in watched seconds (watched.py)."""
        handle.read_waiting()  # delivered through the intake: a report heard restarts its silence
        if pipe.current is not attempt or pipe.state not in (S.STARTING, S.RUNNING):
            return False  # what it sent moved it on (a stop, say)
        quiet = self.states.clock() - attempt.last_progress
        if self._is_hung(pipe, attempt, quiet):
            return True
        self._watch_stall(pipe, attempt, quiet)
        return False

    def _watch_stall(self, pipe: SupervisedPipeline, attempt: Attempt, quiet: float) -> None:
        """Flag, once, a live worker that has made no step for a while; nothing is killed (`hang_timeout` does)."""
        if attempt.stalled:
            return
        warn = pipe.plan.run_config.restart.stall_warning
        limit = max(warn, STALL_FACTOR * attempt.slowest) if attempt.stepped else STALL_FACTOR * warn
        if quiet > limit:
            attempt.stalled = True
            self._publish(Stalled(pipeline=pipe.name, quiet=quiet, first_step=not attempt.stepped))

    @staticmethod
    def _is_hung(pipe: SupervisedPipeline, attempt: Attempt, quiet: float) -> bool:
        timeout = pipe.plan.run_config.restart.hang_timeout
        if timeout is None:
            return False
        if pipe.state == S.STARTING or (pipe.state == S.RUNNING and not attempt.stepped):
            # building the task and the first step (a gang's first collective, compilation, autotuning)
            start = pipe.plan.run_config.restart.start_timeout
            return quiet > (start if start is not None else max(3 * timeout, 60.0))
        return pipe.state == S.RUNNING and quiet > timeout

    def exited(self, pipe: SupervisedPipeline, code: int) -> None:
        """The worker is gone: say why, then finish, relaunch or back off."""
        attempt = pipe.current
        assert attempt is not None and attempt.handle is not None
        handle = attempt.handle
        self._on_events(pipe, handle, handle.drain())  # what it sent last, before it is forgotten
        handle.close()
        attempt.handle = None
        uptime = time.monotonic() - attempt.started_mono
        exit_desc = describe_exit(code)
        reason = classify(attempt.intent or handle.cause, code)
        sig = exit_desc[len("killed by "):] if code < 0 and exit_desc.startswith("killed by ") else ""
        rank, pid = 0, handle.pid
        cause, echoes = handle.told_errors() if isinstance(handle, GangHandle) else ([], [])
        for event in cause:  # the root cause's own words lead (its peers' echoes follow the exit)
            self._on_events(pipe, handle, [event])
        if attempt.intent is None and isinstance(handle, GangHandle) and handle.failed_rank is not None:
            rank, pid, exit_desc = self._gang_root_cause(pipe, handle, exit_desc)
        error = pipe.last_error if reason in WITH_ERROR else ""
        self._publish(WorkerExited(
            pipeline=pipe.name, pid=pid, attempt=pipe.attempts, exit_code=code if code >= 0 else None,
            signal=sig, reason=reason,
            error=error or ("" if reason not in EXIT_SHOWN else exit_desc),
            traceback=pipe.last_traceback if error else "", uptime=uptime, rank=rank))
        for notice in echoes:
            self._publish(notice)
        OUTCOMES[reason](self, pipe, uptime, exit_desc)

    @staticmethod
    def _gang_root_cause(pipe: SupervisedPipeline, gang: GangHandle, exit_desc: str) -> tuple[int, int, str]:
        """The rank that failed first is why the gang ended; what its peers reported after is its echo."""
        rank = gang.exit_rank  # the failed rank: this is asked only once one failed
        error = gang.errors.get(rank)
        exit_desc = f"rank {rank} {exit_desc}"
        if error is not None:
            pipe.last_error, pipe.last_traceback = f"rank {rank}: {error.error}", error.traceback
            pipe.live.failure = (error.error, error.step) if error.where == "train" else None
        else:
            pipe.last_error, pipe.last_traceback = exit_desc, ""
            pipe.live.failure = None
        if len(pipe.slots) == len(gang.ranks) > 1:  # rank k ran on the attempt's slot k (attempts.py)
            pipe.live.failed_on = (pipe.slots[rank], rank)
        return rank, gang.ranks[rank].pid, exit_desc

    def _relaunch(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        pipe.last_error = pipe.last_traceback = ""
        if pipe.intent == Intent.RESIZE:  # it stopped at its checkpoint to be granted again at another size
            pipe.restart_at = time.monotonic()
            self.set_state(pipe, S.BACKOFF)  # STOPPING/KILLING -> BACKOFF
            self._regrant(pipe)
        elif pipe.state == S.KILLING:
            self.launch(pipe)  # KILLING -> STARTING, same slots, no budget spent
        else:  # it ended for a cause that costs nothing (its node left): start again on the next tick
            pipe.restart_at = time.monotonic()
            self.set_state(pipe, S.BACKOFF)  # STARTING/RUNNING/PAUSED/STOPPING/HUNG -> BACKOFF

    def _killed(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        self.finish(pipe, S.KILLED, "killed on request")

    def _stopped(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        self.finish(pipe, pipe.stop_as, pipe.stop_reason or "stopped", pipe.stop_rung)

    def _completed(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        self.finish(pipe, S.COMPLETED, "trained to its limits")

    def _failed(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        self.finish(pipe, S.FAILED, pipe.last_error or exit_desc)

    def _restart_requested(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        # nan_policy = "restart": back to the last checkpoint. It spends the budget, so a loss
        # that always diverges still ends, but it is no failed start however quick.
        self.after_crash(pipe, uptime=float("inf"), exit_desc="the worker asked to be restarted")

    def _crashed(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str) -> None:
        failure, previous = pipe.live.failure, pipe.last_failure
        pipe.last_failure = failure
        # a gang that will start without the slot its rank kept failing on runs differently: no repeat to end it
        if not self._avoid_failing_slot(pipe) and failure is not None and failure == previous:
            error, step = failure
            # `step` is the last it finished (the error line may name the next: "bad batch at step 30"); the
            # epoch as the table counts it, since a script's own step counter may start over each epoch
            p = pipe.progress
            total = f"/{p.epochs_total}" if p.epochs_total else ""
            at = f"in epoch {p.epoch_number}{total} after step {step:,}" if step > 0 else \
                "in its first step" if step == 0 else "before its first step"
            self.finish(pipe, S.FAILED, f"the same error {at} twice in a row, so a restart cannot fix it: {error}")
            return
        self.after_crash(pipe, uptime, exit_desc, stepped=pipe.live.stepped)

    def _avoid_failing_slot(self, pipe: SupervisedPipeline) -> bool:
        """An elastic gang whose first failing rank ran on the same slot in this crash and the one before: that
        slot is granted to it no more this session (the scheduler's `avoid`), and a notice says so. True when
        the gang can start without it; at a slot it cannot do without (its MIN) it is granted as before."""
        now, before = pipe.live.failed_on, pipe.last_failed_on
        pipe.last_failed_on = now
        failed = failed_again(before, now) if pipe.plan.config.elastic else ""
        if not failed or now is None:
            return False
        pipe.last_failed_on = None  # counted: two more in a row before it is said again
        slot = now[0]
        low = pipe.plan.config.min_ranks
        refused = self._scheduler.avoid(pipe.name, slot, f"{failed}: not granted to this gang again",
                                        pipe.plan.request)
        if refused:
            self._publish(Notice(pipeline=pipe.name, level="warning",
                                 text=f"{failed}, but it may be granted {slot.name} again: {refused}"))
            return False
        self._publish(Notice(pipeline=pipe.name, level="warning", text=(
            f"{failed}: not granted to this gang again (its later grants skip it, down to {low} "
            f"rank{'s' if low != 1 else ''})")))
        return True

    def after_crash(self, pipe: SupervisedPipeline, uptime: float, exit_desc: str, stepped: bool = True) -> None:
        """Restart under the policy (-> BACKOFF), or end the pipeline as failed."""
        decision = pipe.plan.policy.decide(pipe.restarts, pipe.failed_starts, uptime, stepped)
        pipe.failed_starts = decision.failed_starts
        what = (pipe.last_error or exit_desc) + self._gpu_note(pipe)
        if not decision.restart:
            self.finish(pipe, S.FAILED, f"{decision.reason}: {what}")
            return
        pipe.restarts += 1
        pipe.restart_at = time.monotonic() + decision.delay
        pipe.last_error = what
        self.set_state(pipe, S.BACKOFF)  # STARTING/RUNNING/... -> BACKOFF
        if pipe.plan.config.elastic and pipe.slots:
            self._regrant(pipe)
            pipe.regrant_cause = what
        self._publish(WorkerRestarting(pipeline=pipe.name, attempt=pipe.attempts + 1, delay=decision.delay,
                                       restarts_left=pipe.plan.run_config.restart.max_restarts - pipe.restarts,
                                       reason=f"{decision.reason}: {what}"))

    def _regrant(self, pipe: SupervisedPipeline) -> None:
        """An elastic gang in BACKOFF gives its slots back and asks again in its place in the queue: a pipeline
        that outranks it may take one meanwhile, and it starts again at the size it is granted (at least MIN)."""
        self._scheduler.release(pipe.slots, pipe.name)
        pipe.slots = []
        self._scheduler.enqueue(pipe.name, pipe.plan.config.priority, pipe.plan.order, pipe.plan.request)


OUTCOMES: dict[ExitReason, Callable[[Lifecycle, SupervisedPipeline, float, str], None]] = {
    R.RESTARTED: Lifecycle._relaunch,
    R.KILLED: Lifecycle._killed,
    R.STOPPED: Lifecycle._stopped,
    R.COMPLETED: Lifecycle._completed,
    R.FAILED: Lifecycle._failed,
    R.RESTART_REQUESTED: Lifecycle._restart_requested,
    R.CRASHED: Lifecycle._crashed,
    R.HUNG: Lifecycle._crashed,
}
