"""What a person's command does to one pipeline: stop, pause, resume, checkpoint, kill, restart.

Each is a move of the pipeline's state machine made through the lifecycle
(engine/supervise/lifecycle.py); the supervisor applies it to the pipelines named and
then looks at the session as a whole (is it finished, is there something to schedule).
"""
from __future__ import annotations

import time
from dataclasses import replace

from ..config.trials import retuned
from ..protocol.messages import CheckpointNow, Notice, Pause, PipelineFinished, Resume
from ..protocol.names import Intent
from ..protocol.names import NoticeTopic
from ..protocol.states import WorkerState
from .lifecycle import Lifecycle
from .pipeline import PipelineRun

S = WorkerState
LIVE = (S.STARTING, S.RUNNING, S.PAUSED)
STACKS_ASKED = "its processes write their Python stacks to its log"  # the notice of a request


def stop(lifecycle: Lifecycle, run: PipelineRun, reason: str, ending: WorkerState = S.STOPPED,
         rung: float | None = None) -> None:
    """Gracefully stop: finish the step, checkpoint, exit (or end now what has nothing to save). `ending`: the
    state it ends in (early_stopped, pruned: a completion rather than a stop on request; a resting state: a sweep's
    trial that waits for its policy, at `rung` when it waits at one). A resting trial ends at once (its sweep cut
    it, or a person stopped it)."""
    if run.state in (S.QUEUED, S.BACKOFF) or run.state.resting:
        why = _unstarted(run, "stopped") if run.state == S.QUEUED and ending == S.STOPPED else reason
        lifecycle.finish(run, ending, why, rung)  # QUEUED/BACKOFF -> STOPPED (or ending); WAITING_AT_RUNG -> PRUNED
        return
    if run.state in LIVE or (run.state in (S.KILLING, S.HUNG) and run.intent in (Intent.RESTART, Intent.HUNG)):
        run.stop_as, run.stop_rung = ending, rung
    if run.state in LIVE and run.live.start_step is None:
        # Still building its task: it hears no Stop until it trains, and it has trained
        # nothing since its last checkpoint, so it is ended now instead of waited for.
        run.live.intent, run.stop_reason = Intent.STOP, reason
        lifecycle.terminate(run)  # STARTING/PAUSED -> KILLING
    elif run.state in LIVE:
        lifecycle.request_stop(run, reason)  # STARTING/RUNNING/PAUSED -> STOPPING
    elif run.state in (S.KILLING, S.HUNG) and run.intent in (Intent.RESTART, Intent.HUNG):
        # Already on its way out to be started again: let it end there instead.
        run.live.intent, run.stop_reason = Intent.STOP, reason


def pause(lifecycle: Lifecycle, run: PipelineRun) -> None:
    if run.state not in (S.STARTING, S.RUNNING):
        raise ValueError(f"{run.name} is paused already" if run.state == S.PAUSED else _cannot(run, "paused"))
    run.live_handle.send(Pause())
    lifecycle.set_state(run, S.PAUSED)  # STARTING/RUNNING -> PAUSED


def resume(lifecycle: Lifecycle, run: PipelineRun) -> None:
    if run.state != S.PAUSED:
        raise ValueError(f"{run.name} is {run.state.value}, not paused: nothing to resume")
    run.live.last_progress = time.monotonic()
    run.live_handle.send(Resume())
    lifecycle.set_state(run, S.RUNNING)  # PAUSED -> RUNNING


def checkpoint(run: PipelineRun) -> None:
    if run.state not in LIVE:
        raise ValueError(_cannot(run, "checkpointed"))
    run.live_handle.send(CheckpointNow())


def _unstarted(run: PipelineRun, what: str) -> str:
    """Why a pipeline with no process ended: `what` before it started (it never ran: people read "never ran"),
    or, when an attempt of it ran (this session or one this run resumes), where it was waiting."""
    if not run.attempts:
        return f"{what} before it started"  # PipelineFinished.never_ran says so to the readers
    return f"{what} while waiting to restart" if run.state == S.BACKOFF else f"{what} while queued"


def _cannot(run: PipelineRun, what: str) -> str:
    """Why a command that needs a training process does nothing to `run` as it is (queued, ended, ...)."""
    if run.state == S.QUEUED:
        return f"{run.name} is queued, waiting for a free device: it cannot be {what} before it starts"
    return f"{run.name} is {run.state.value}: it cannot be {what} now"


def kill(lifecycle: Lifecycle, run: PipelineRun) -> None:
    """End the worker now: the polite signal to its process group, the hard one after the grace period."""
    if run.state in (S.QUEUED, S.BACKOFF) or run.state.resting:
        lifecycle.finish(run, S.KILLED, _unstarted(run, "killed"))  # QUEUED/BACKOFF/resting -> KILLED
    elif run.handle is not None and run.state != S.KILLING:
        run.live.intent = Intent.KILL
        lifecycle.terminate(run)
    elif run.state == S.KILLING:
        run.live.intent = Intent.KILL  # a restart in progress becomes a kill


def restart(lifecycle: Lifecycle, run: PipelineRun) -> bool:
    """Kill the worker and start it again from its last checkpoint (no restart budget spent); True when
    an ended pipeline went back to the queue (the session has work again)."""
    if run.handle is not None:
        run.live.intent = Intent.RESTART
        if run.state != S.KILLING:
            lifecycle.terminate(run)
    elif run.state == S.BACKOFF:
        lifecycle.launch(run)
    elif run.state.ended:
        run.failed_starts = 0
        run.finish_reason = ""
        lifecycle.set_state(run, S.QUEUED)  # final/resting -> QUEUED: a person asked for another go, or its policy
        return True
    return False


def requeue(run: PipelineRun, order: int) -> None:
    """Its next place in the queue is `order` (behind every pipeline waiting now, when that is the newest)."""
    run.plan = replace(run.plan, order=order)


def retune(run: PipelineRun, values: dict) -> None:
    """Its next attempts train with other values for its swept keys (a PBT trial taking over another's
    checkpoint); the plan is replaced whole, as an attempt reads it when it starts."""
    run.plan = replace(run.plan, config=retuned(run.plan.config, values))


def end_at_shutdown(lifecycle: Lifecycle, run: PipelineRun) -> None:
    """The session is ending: a worker still there is killed (one asked to stop keeps that intent)."""
    if run.handle is not None:
        if run.intent != Intent.STOP:
            run.live.intent = Intent.KILL
        if run.state != S.KILLING:
            lifecycle.set_state(run, S.KILLING)  # alive -> KILLING
        run.handle.kill()


def settle_unreaped(lifecycle: Lifecycle, run: PipelineRun) -> None:
    """The session has ended and `run` has no process, yet no final state: it ends killed (stopped if asked)."""
    if not run.state.ended and run.handle is None:
        why = run.finish_reason or (_unstarted(run, "session ended") if run.state == S.QUEUED else "session ended")
        lifecycle.finish(run, S.KILLED if run.state != S.STOPPING else run.stop_as, why)


def keep_ended(lifecycle: Lifecycle, run: PipelineRun, ended: PipelineFinished) -> None:
    """A resumed run's pipeline that has nothing to train keeps how it had ended (QUEUED -> that state); a resting
    trial rests again, as it was, for its sweep's policy to decide."""
    state = WorkerState(ended.status)
    if state.resting:
        lifecycle.finish(run, state, ended.reason, ended.rung)  # QUEUED -> resting
        return
    run.finish_reason = f"{state.value} before the run was resumed"
    lifecycle.set_state(run, state)


def stacks(run: PipelineRun, publish) -> None:
    """Every process of its attempt writes its Python stacks to its log (faulthandler); nothing is stopped."""
    if run.handle is None:
        raise ValueError(f"{run.name} has no process now: no stacks to write")
    run.handle.dump_stacks()
    publish(Notice(pipeline=run.name, level="info", text=STACKS_ASKED, topic=NoticeTopic.STACKS_ASKED))
