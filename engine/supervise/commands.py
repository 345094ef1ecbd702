"""What a person's command does to one pipeline: stop, pause, resume, checkpoint, kill, restart.

Each is a move of the pipeline's state machine made through the lifecycle
(engine/supervise/lifecycle.py); the supervisor applies it to the pipelines named and
then looks at the session as a whole (is it finished, is there something to schedule).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..config.trials import retuned
from ..protocol.messages import CheckpointNow, Event, Notice, Pause, PipelineFinished, Unpause
from ..protocol.names import Intent, NoticeTopic
from ..protocol.states import WorkerState
from .lifecycle import Lifecycle
from .pipeline import SupervisedPipeline

S = WorkerState
LIVE = (S.STARTING, S.RUNNING, S.PAUSED)
STACKS_ASKED = "its processes write their Python stacks to its log"  # the notice of a request


def stop(lifecycle: Lifecycle, pipe: SupervisedPipeline, reason: str, ending: WorkerState = S.STOPPED,
         rung: float | None = None) -> None:
    """Gracefully stop: finish the step, checkpoint, exit (or end now what has nothing to save). `ending`: the
    state it ends in (early_stopped, pruned: a completion rather than a stop on request; a resting state: a sweep's
    trial that waits for its policy, at `rung` when it waits at one). A resting trial ends at once (its sweep cut
    it, or a person stopped it)."""
    if pipe.state in (S.QUEUED, S.BACKOFF) or pipe.state.resting:
        why = _unstarted(pipe, "stopped") if pipe.state == S.QUEUED and ending == S.STOPPED else reason
        lifecycle.finish(pipe, ending, why, rung)  # QUEUED/BACKOFF -> STOPPED (or ending); WAITING_AT_RUNG -> PRUNED
        return
    if pipe.state in LIVE or (pipe.state in (S.KILLING, S.HUNG) and pipe.intent in (Intent.RESTART, Intent.HUNG)):
        pipe.stop_as, pipe.stop_rung = ending, rung
    if pipe.state in LIVE and pipe.live.start_step is None:
        # Still building its task: it hears no Stop until it trains, and it has trained
        # nothing since its last checkpoint, so it is ended now instead of waited for.
        pipe.live.intent, pipe.stop_reason = Intent.STOP, reason
        lifecycle.terminate(pipe)  # STARTING/PAUSED -> KILLING
    elif pipe.state in LIVE:
        lifecycle.request_stop(pipe, reason)  # STARTING/RUNNING/PAUSED -> STOPPING
    elif pipe.state in (S.KILLING, S.HUNG) and pipe.intent in (Intent.RESTART, Intent.HUNG):
        # Already on its way out to be started again: let it end there instead.
        pipe.live.intent, pipe.stop_reason = Intent.STOP, reason
    elif pipe.state in (S.STOPPING, S.KILLING) and pipe.intent == Intent.RESIZE:
        # Stopping to start again at another size: it stops for good instead (STOPPING keeps its deadline).
        pipe.stop_as, pipe.stop_rung = ending, rung
        pipe.live.intent, pipe.stop_reason = Intent.STOP, reason


def pause(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> None:
    if pipe.state not in (S.STARTING, S.RUNNING):
        raise ValueError(f"{pipe.name} is paused already" if pipe.state == S.PAUSED else _cannot(pipe, "paused"))
    pipe.live_handle.send(Pause())
    lifecycle.set_state(pipe, S.PAUSED)  # STARTING/RUNNING -> PAUSED


def unpause(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> None:
    if pipe.state != S.PAUSED:
        raise ValueError(f"{pipe.name} is {pipe.state.value}, not paused: nothing to unpause")
    pipe.live.last_progress = lifecycle.states.clock()  # its silence is counted from now
    pipe.live_handle.send(Unpause())
    lifecycle.set_state(pipe, S.RUNNING)  # PAUSED -> RUNNING


def checkpoint(pipe: SupervisedPipeline) -> None:
    if pipe.state not in LIVE:
        raise ValueError(_cannot(pipe, "checkpointed"))
    pipe.live_handle.send(CheckpointNow())


def _unstarted(pipe: SupervisedPipeline, what: str) -> str:
    """Why a pipeline with no process ended: `what` before it started (it never ran: people read "never ran"),
    or, when an attempt of it ran (this session or one this run resumes), where it was waiting."""
    if not pipe.attempts:
        return f"{what} before it started"  # PipelineFinished.never_ran says so to the readers
    return f"{what} while waiting to restart" if pipe.state == S.BACKOFF else f"{what} while queued"


def _cannot(pipe: SupervisedPipeline, what: str) -> str:
    """Why a command that needs a training process does nothing to `pipe` as it is (queued, ended, ...)."""
    if pipe.state == S.QUEUED:
        return f"{pipe.name} is queued, waiting for a free device: it cannot be {what} before it starts"
    return f"{pipe.name} is {pipe.state.value}: it cannot be {what} now"


def kill(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> None:
    """End the worker now: the polite signal to its process group, the hard one after the grace period."""
    if pipe.state in (S.QUEUED, S.BACKOFF) or pipe.state.resting:
        lifecycle.finish(pipe, S.KILLED, _unstarted(pipe, "killed"))  # QUEUED/BACKOFF/resting -> KILLED
    elif pipe.handle is not None and pipe.state != S.KILLING:
        pipe.live.intent = Intent.KILL
        lifecycle.terminate(pipe)
    elif pipe.state == S.KILLING:
        pipe.live.intent = Intent.KILL  # a restart in progress becomes a kill


def restart(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> bool:
    """Kill the worker and start it again from its last checkpoint (no restart budget spent); True when
    an ended pipeline went back to the queue (the session has work again)."""
    if pipe.handle is not None:
        pipe.live.intent = Intent.RESTART
        if pipe.state != S.KILLING:
            lifecycle.terminate(pipe)
    elif pipe.state == S.BACKOFF:
        lifecycle.launch(pipe)
    elif pipe.state.ended:
        pipe.failed_starts = 0
        pipe.finish_reason = ""
        lifecycle.set_state(pipe, S.QUEUED)  # final/resting -> QUEUED: a person asked for another go, or its policy
        return True
    return False


def requeue(pipe: SupervisedPipeline, order: int) -> None:
    """Its next place in the queue is `order` (behind every pipeline waiting now, when that is the newest)."""
    pipe.plan = replace(pipe.plan, order=order)


def retune(pipe: SupervisedPipeline, values: dict) -> None:
    """Its next attempts train with other values for its swept keys (a PBT trial taking over another's
    checkpoint); the plan is replaced whole, as an attempt reads it when it starts."""
    pipe.plan = replace(pipe.plan, config=retuned(pipe.plan.config, values))


def end_at_shutdown(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> None:
    """The session is ending: a worker still there is killed (one asked to stop keeps that intent)."""
    if pipe.handle is not None:
        if pipe.intent != Intent.STOP:
            pipe.live.intent = Intent.KILL
        if pipe.state != S.KILLING:
            lifecycle.set_state(pipe, S.KILLING)  # alive -> KILLING
        pipe.handle.kill()


def settle_unreaped(lifecycle: Lifecycle, pipe: SupervisedPipeline) -> None:
    """The session has ended and `pipe` has no process, yet no final state: it ends killed (stopped if asked)."""
    if not pipe.state.ended and pipe.handle is None:
        why = pipe.finish_reason or (_unstarted(pipe, "session ended") if pipe.state == S.QUEUED else "session ended")
        lifecycle.finish(pipe, S.KILLED if pipe.state != S.STOPPING else pipe.stop_as, why)


def keep_ended(lifecycle: Lifecycle, pipe: SupervisedPipeline, ended: PipelineFinished) -> None:
    """A resumed run's pipeline that has nothing to train keeps how it had ended (QUEUED -> that state); a resting
    trial rests again, as it was, for its sweep's policy to decide."""
    state = WorkerState(ended.status)
    if state.resting:
        lifecycle.finish(pipe, state, ended.reason, ended.rung)  # QUEUED -> resting
        return
    pipe.finish_reason = f"{state.value} before the run was resumed"
    lifecycle.set_state(pipe, state)


def stacks(pipe: SupervisedPipeline, publish: Callable[[Event], None]) -> None:
    """Every process of its attempt writes its Python stacks to its log (faulthandler); nothing is stopped."""
    if pipe.handle is None:
        raise ValueError(f"{pipe.name} has no process now: no stacks to write")
    pipe.handle.dump_stacks()
    publish(Notice(pipeline=pipe.name, level="info", text=STACKS_ASKED, topic=NoticeTopic.STACKS_ASKED))
