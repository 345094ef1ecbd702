"""Every message that crosses a process boundary: events up, commands down.

Each is a frozen, picklable dataclass of primitives stamped with wall-clock `time` (seconds since the epoch) and
a `type` tag; `protocol/records.py` turns them into the JSON objects of `events.jsonl` and back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .names import NoticeTopic, ValidationMode

clock = time  # what stamps every message: anything with `.time()` (the app's tests freeze it)


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """Base of every message; `type` names it in JSON."""

    type: ClassVar[str] = "message"
    time: float = field(default_factory=lambda: clock.time())  # `clock` looked up at each stamp


# ---------------------------------------------------------------- events


@dataclass(frozen=True, kw_only=True, slots=True)
class Event(Message):
    """Base of everything the engine reports."""

    type: ClassVar[str] = "event"


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineEvent(Event):
    """Base of every event about one pipeline of the run."""

    pipeline: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineOrRunEvent(Event):
    """Base of the events about one pipeline or, with `pipeline` "", the whole run (notices, alerts)."""

    pipeline: str = ""


def pipeline_of(event: Event) -> str:
    """The pipeline an event is about; "" for an event about the whole run."""
    return event.pipeline if isinstance(event, (PipelineEvent, PipelineOrRunEvent)) else ""


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceCommit:
    """The git commit a folder of the run's code was at when the session began (a part of `RunStarted`)."""

    repo: str  # the repository's top folder
    commit: str  # the full hash HEAD named
    dirty: bool = False  # tracked files differed from the commit (untracked files do not count)
    diff: str = ""  # when dirty: the file in the run folder holding `git diff HEAD`, relative to it
    diff_cut: bool = False  # the diff was longer than torchherd keeps (rundir/provenance.py) and was cut


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStarted(Event):
    """A run (or a resumed session of it) began: its id, directory, the pipelines it will train and the commits of
    its code."""

    type: ClassVar[str] = "run_started"
    run_id: str
    run_dir: str
    config_path: str
    pipelines: tuple[str, ...]
    code: tuple[SourceCommit, ...] = ()  # the config's repository first, then any other its tasks or scripts are in


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigAdded(Event):
    """Another config's pipelines joined a live session (its run keeps the first config's name and folder)."""

    type: ClassVar[str] = "config_added"
    name: str  # the config's run name (its `name`, else its file's stem)
    config_path: str
    pipelines: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineQueued(PipelineEvent):
    """A pipeline was added and waits for a free device slot."""

    type: ClassVar[str] = "pipeline_queued"
    priority: int
    position: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineWaiting(PipelineEvent):
    """A queued pipeline cannot be granted its devices yet: what it waits for and what holds them."""

    type: ClassVar[str] = "pipeline_waiting"
    why: str  # "waiting for 2 GPUs: gpu0, gpu1 held by run R (you)"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStarted(PipelineEvent):
    """A worker process was spawned for a pipeline on a device."""

    type: ClassVar[str] = "worker_started"
    pid: int
    device: str
    attempt: int
    gpu_uuid: str = ""
    pids: tuple[int, ...] = ()  # of a gang: every rank's pid, rank 0 first
    node: str = ""  # the cluster node it runs on; "" for the supervisor's machine
    min_ranks: int = 0  # an elastic gang's (ranks = "MIN:MAX") MIN; 0 for a fixed gang or one process
    max_ranks: int = 0  # an elastic gang's MAX; 0 for a fixed gang or one process


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStateChanged(PipelineEvent):
    """A worker moved from one lifecycle state to another."""

    type: ClassVar[str] = "worker_state"
    state: str
    previous: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingStarted(PipelineEvent):
    """A worker built its task and is about to train (from `epoch`, `step` when resuming)."""

    type: ClassVar[str] = "training_started"
    epoch: int
    step: int
    epochs_total: int
    steps_per_epoch: int
    device: str
    parameters: int  # number of model parameters


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetrics(PipelineEvent):
    """Training progress at a reporting interval (losses averaged over it)."""

    type: ClassVar[str] = "step"
    epoch: int
    step: int
    loss: float
    lr: float | None = None  # None: not reported (a script whose output names no lr)
    samples_per_s: float | None = None  # None: not known (a script without samples_per_step or the client's)
    dropped: int = 0  # step reports coalesced away before this one
    # Other training values (script regex groups, herd.report(**metrics)); torchherd's own loop reports none.
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat(PipelineEvent):
    """The training thread is alive and stepping (sent at most once a second; not in events.jsonl)."""

    type: ClassVar[str] = "heartbeat"
    step: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Stalled(PipelineEvent):
    """A live pipeline made no training step for `quiet` seconds (heard whether or not `hang_timeout` is set,
    and never killed for it); `quiet` 0 says it is heard from again while it trains."""

    type: ClassVar[str] = "stalled"
    quiet: float
    first_step: bool = False  # it has made no step yet (still waiting for its first, or heard from before it)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochEnd(PipelineEvent):
    """A training epoch finished: its mean loss and how long it took."""

    type: ClassVar[str] = "epoch_end"
    epoch: int
    step: int
    train_loss: float
    duration: float  # seconds
    samples_per_s: float | None  # None: not known (a script that says nothing of its samples)
    epochs_total: int
    steps_per_epoch: int
    metrics: dict[str, float] = field(default_factory=dict)  # other values a script printed for the epoch


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSaved(PipelineEvent):
    """A checkpoint was written atomically."""

    type: ClassVar[str] = "checkpoint_saved"
    path: str
    epoch: int
    step: int
    reason: str  # "epoch", "stop", "request", "best"
    blocked_s: float = 0.0  # seconds training was held by it (the staging copy; a synchronous save, all of it)
    write_s: float = 0.0  # seconds its write, fsync and rename took (on a background thread, for a Task's)


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskBuilt(PipelineEvent):
    """A held worker built its task and waits for the run's other tasks (engine/supervise/build_check.py)."""

    type: ClassVar[str] = "task_built"


@dataclass(frozen=True, kw_only=True, slots=True)
class TasksChecked(Event):
    """Every task of the run built (its worker's build, or the probe's), or some did not: then `problems`
    ('file: key: what is wrong', as `torchherd check --probe` says them) and no pipeline trains."""

    type: ClassVar[str] = "tasks_checked"
    tasks: int  # distinct tasks (task and params) of the run
    seconds: float  # from the run's start to the verdict
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Resumed(PipelineEvent):
    """A worker resumed from a checkpoint instead of starting fresh."""

    type: ClassVar[str] = "resumed"
    path: str
    epoch: int
    step: int
    note: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ValResult(PipelineEvent):
    """Validation scores of the weights from a given epoch and step."""

    type: ClassVar[str] = "val_result"
    epoch: int
    step: int
    metrics: dict[str, float]
    latency: float = 0.0  # seconds from weight hand-off to result
    mode: str = ValidationMode.INLINE  # a ValidationMode: INLINE or BACKGROUND
    seq: int = 0  # the snapshot scored (background)
    checksum: float | None = None  # sum of the weights scored, when validation.checksum is on
    error: str = ""  # validation raised: metrics is empty and this says why
    traceback: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotTaken(PipelineEvent):
    """A worker copied its weights into a snapshot slot for the validator and carried on."""

    type: ClassVar[str] = "snapshot_taken"
    seq: int  # 1, 2, ... per pipeline and attempt chain
    epoch: int
    step: int
    slot: int
    stall_ms: float  # how long training waited for the copy
    nbytes: int
    checksum: float | None = None  # sum of every weight, when validation.checksum is on
    dropped: bool = False  # this snapshot was not kept (every slot unread under policy "all", or a copy in flight)
    reason: str = ""  # why it was dropped


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidatorStarted(Event):
    """The background validation process was spawned."""

    type: ClassVar[str] = "validator_started"
    pid: int
    device: str
    attempt: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotSkipped(PipelineEvent):
    """A snapshot was never validated (a newer one was, or the validator was down)."""

    type: ClassVar[str] = "snapshot_skipped"
    seq: int
    epoch: int
    step: int
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class EarlyStop(PipelineEvent):
    """The validator saw no improvement for `patience` results and asks the pipeline to stop."""

    type: ClassVar[str] = "early_stop"
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialDecision(PipelineEvent):
    """A sweep's scheduler judged a trial's validation result at a rung: it goes on, or it is pruned (or exploits)."""

    type: ClassVar[str] = "trial_decision"
    action: str  # "continue", "prune"; promoting ASHA: "pause", "promote"; PBT: "exploit" (a donor's checkpoint)
    rung: float  # the milestone, in the sweep's rung_unit (epochs or steps); PBT: the trial's progress judged
    value: float  # the trial's `metric` there
    cutoff: float | None = None  # the rung's cut (None: the first at its rung); PBT: the bottom quantile's edge
    reason: str = ""  # "val_loss 0.31 at epoch 4, rung cut 0.27"
    at: float | None = None  # how far the weights judged had trained (rung_unit: 2.25 past rung 2); None: at the rung
    exploit: dict[str, Any] = field(default_factory=dict)  # PBT: donor, step and epoch taken, new values, checksum


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerError(PipelineEvent):
    """A worker caught an exception; sent before it exits non-zero."""

    type: ClassVar[str] = "worker_error"
    error: str  # "ExceptionType: message"
    traceback: str = ""
    where: str  # "build", "train", "validate", "checkpoint"
    step: int = -1  # optimizer steps completed when it failed; -1 unknown
    rank: int = 0  # which rank of a gang raised it


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerExited(PipelineEvent):
    """A worker process ended: exit code or signal, and why if known."""

    type: ClassVar[str] = "worker_exited"
    pid: int
    attempt: int
    exit_code: int | None
    signal: str = ""
    reason: str = ""  # an ExitReason ("completed", "stopped", "crashed", ...); "" when unknown
    error: str = ""
    traceback: str = ""
    uptime: float = 0.0  # seconds
    rank: int = 0  # of a gang: the rank whose exit brought the gang down (the root cause)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerRestarting(PipelineEvent):
    """A pipeline will be restarted after a delay."""

    type: ClassVar[str] = "worker_restarting"
    attempt: int
    delay: float  # seconds
    restarts_left: int
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class GangResized(PipelineEvent):
    """An elastic gang (ranks = "MIN:MAX") starts an attempt at another size than its last (or, first, than MAX)."""

    type: ClassVar[str] = "gang_resized"
    from_ranks: int
    to_ranks: int
    why: str = ""  # "rank 1 killed by SIGKILL; 1 of 2 CPU slots free: cpu1 held by this run (urgent)"
    # the batch figures are 0 and keep "" for a script, whose batch is its own (unknown to torchherd)
    batch_size: int = 0  # per rank, at `to_ranks`
    accumulate_grad_batches: int = 1  # at `to_ranks`
    samples_per_step: int = 0  # samples of one optimizer step at `to_ranks` (batch_size x accumulation x ranks)
    samples_per_step_before: int = 0  # the same at `from_ranks`
    keep: str = "global_batch"  # the pipeline's `keep`: "global_batch" or "per_rank_batch"; "" for a script


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineFinished(PipelineEvent):
    """A pipeline's attempt ended for good: it reached a final state, or a resting one (a sweep's trial that waits
    for its policy)."""

    type: ClassVar[str] = "pipeline_finished"
    status: str  # a final or resting WorkerState's value
    reason: str = ""
    epoch: int = 0
    step: int = 0
    rung: float | None = None  # waiting_at_rung: the rung it waits at
    never_ran: bool = False  # it ended before any attempt of it ran (people read "never ran")


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice(PipelineOrRunEvent):
    """Something a person should read that is not a failure (NaN loss, ...)."""

    type: ClassVar[str] = "notice"
    level: str = "warning"  # "info", "warning", "error"
    text: str = ""
    topic: NoticeTopic = NoticeTopic.NONE  # what the engine acts on in it; NONE: for people only


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFinished(Event):
    """Every pipeline of the run reached a final status."""

    type: ClassVar[str] = "run_finished"
    ok: bool
    statuses: dict[str, str]


# --------------------------------------------------------------- commands


@dataclass(frozen=True, kw_only=True, slots=True)
class Command(Message):
    """Base of everything the supervisor tells a worker."""

    type: ClassVar[str] = "command"


@dataclass(frozen=True, kw_only=True, slots=True)
class Stop(Command):
    """Finish the current step, checkpoint and exit 0."""

    type: ClassVar[str] = "stop"
    reason: str = "requested"


@dataclass(frozen=True, kw_only=True, slots=True)
class Pause(Command):
    """Hold before the next step until Unpause (or Stop) arrives."""

    type: ClassVar[str] = "pause"


@dataclass(frozen=True, kw_only=True, slots=True)
class Unpause(Command):
    """Carry on after Pause (un-pausing; resuming is what `torchherd resume` does to a run)."""

    type: ClassVar[str] = "unpause"


@dataclass(frozen=True, kw_only=True, slots=True)
class Proceed(Command):
    """Every task of the run built: a worker held after its build may take its first step."""

    type: ClassVar[str] = "proceed"


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointNow(Command):
    """Write a checkpoint after the current step."""

    type: ClassVar[str] = "checkpoint"
