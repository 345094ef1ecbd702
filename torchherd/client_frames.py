"""The frames torchherd.client and the script runner exchange over the client socket: one definition, both sides.

A frame is a frozen dataclass; on the wire it is one JSON object a line whose `t` names
it (`{"t": "step", "step": 4, ...}`). Standard library only: the client imports this
inside users' own training scripts, which must not pay for torch or pydantic here.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

# The environment the script runner gives the script (read by the client), defined where the client reads it.
from torchherd.client_env import ENV_CHECKPOINT_DIR, ENV_FD, ENV_PIPELINE, ENV_SNAPSHOT  # noqa: F401


@dataclass(frozen=True)
class Frame:
    """Base of every frame: `T` is its `t` on the wire."""

    T: ClassVar[str] = ""


# ------------------------------------------------------------ script -> runner


@dataclass(frozen=True)
class Hello(Frame):
    """The client connected (sent once, first): from now on commands go to it as frames."""

    T: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True)
class PollsStop(Frame):
    """The loop calls should_stop(): a stop is asked with a frame, never with SIGINT."""

    T: ClassVar[str] = "polls_stop"


@dataclass(frozen=True)
class Beat(Frame):
    """Alive without a new step (herd.heartbeat())."""

    T: ClassVar[str] = "beat"
    step: int = 0


@dataclass(frozen=True)
class StepReport(Frame):
    """The reports queued since the last flush, coalesced: `loss` is the mean of `n` losses."""

    T: ClassVar[str] = "step"
    step: int | None = None
    epoch: int | None = None
    loss: float | None = None
    n: int = 1
    samples: float = 0.0  # trained in the last `seconds`
    seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # the newest of each; "lr" among them


@dataclass(frozen=True)
class EpochDone(Frame):
    """herd.epoch_end(epoch, loss): `epoch` counts from 0."""

    T: ClassVar[str] = "epoch_end"
    epoch: int
    step: int = 0
    loss: float | None = None


@dataclass(frozen=True)
class Saved(Frame):
    """herd.save() wrote a checkpoint at `path` (absolute)."""

    T: ClassVar[str] = "checkpoint"
    path: str
    epoch: int = 0
    step: int = 0
    reason: str = "script"  # "stop", "request" or "script"


@dataclass(frozen=True)
class ResumedFrom(Frame):
    """herd.resume_from() found the checkpoint at `path` (absolute) to carry on from."""

    T: ClassVar[str] = "resumed"
    path: str


@dataclass(frozen=True)
class Snapshot(Frame):
    """herd.hand_off() copied the weights into a slot; `wait`: inline, the script waits for an Ack."""

    T: ClassVar[str] = "snapshot"
    epoch: int
    step: int
    seq: int
    slot: int
    stall_ms: float
    nbytes: int
    checksum: float | None = None
    dropped: bool = False
    reason: str = ""
    wait: bool = False

    def info(self) -> dict[str, Any]:
        """What a SnapshotTaken event carries beyond the pipeline, epoch and step."""
        return {"seq": self.seq, "slot": self.slot, "stall_ms": self.stall_ms, "nbytes": self.nbytes,
                "checksum": self.checksum, "dropped": self.dropped, "reason": self.reason}


# ------------------------------------------------------------ runner -> script


@dataclass(frozen=True)
class StopRequest(Frame):
    """Stop at the next step boundary (should_stop() turns True)."""

    T: ClassVar[str] = "stop"


@dataclass(frozen=True)
class PauseRequest(Frame):
    """Hold the loop in report()/wait_if_paused() until a ResumeRequest."""

    T: ClassVar[str] = "pause"


@dataclass(frozen=True)
class ResumeRequest(Frame):
    """Let a paused loop go on."""

    T: ClassVar[str] = "resume"


@dataclass(frozen=True)
class CheckpointRequest(Frame):
    """Checkpoint now (checkpoint_requested() turns True once)."""

    T: ClassVar[str] = "checkpoint"


@dataclass(frozen=True)
class Ack(Frame):
    """An inline hand-off was scored: the waiting hand_off() returns."""

    T: ClassVar[str] = "ack"


TO_RUNNER: dict[str, type[Frame]] = {c.T: c for c in (Hello, PollsStop, Beat, StepReport, EpochDone, Saved,
                                                       ResumedFrom, Snapshot)}
TO_SCRIPT: dict[str, type[Frame]] = {c.T: c for c in (StopRequest, PauseRequest, ResumeRequest, CheckpointRequest,
                                                       Ack)}


def encode(frame: Frame) -> bytes:
    """One line of the wire: `{"t": frame.T, ...its fields}` and a newline (NaN stays NaN)."""
    return (json.dumps({"t": frame.T, **asdict(frame)}, allow_nan=True) + "\n").encode()


MAX_LINE = 1 << 20  # bytes: the longest frame a reader keeps; a longer line is dropped, never buffered on


def _fits(value: object, annotation: str) -> bool:
    """Whether a decoded JSON value has the type a frame's field is declared with (its annotation's text)."""
    if annotation.endswith(" | None"):
        return value is None or _fits(value, annotation[:-len(" | None")])
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "dict[str, float]":
        return isinstance(value, dict) and all(isinstance(k, str) and _fits(v, "float") for k, v in value.items())
    return False  # a field type this check does not know: refuse rather than pass something unchecked


def decode(line: bytes, kinds: dict[str, type[Frame]]) -> Frame | None:
    """The frame one line holds (`kinds`: TO_RUNNER or TO_SCRIPT), or None for a line that is not one: not
    JSON, nested too deep, an unknown `t`, a field it must have missing, or a field of the wrong type."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    kind = data.get("t") if isinstance(data, dict) else None
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    given = {f.name: data[f.name] for f in fields(cls) if f.name in data}
    if not all(_fits(given[f.name], str(f.type)) for f in fields(cls) if f.name in given):
        return None
    try:
        return cls(**given)
    except TypeError:  # a field it must have is missing
        return None


class LineReader:
    """Turns a stream's bytes, in any pieces, into its lines: each byte looked at once (a line in many pieces
    costs its length, not its length squared), and no line kept past MAX_LINE bytes (`dropped` counts those)."""

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self.dropped = 0
        self._buf = bytearray()
        self._skipping = False  # inside a line already too long: its bytes are thrown away up to its newline

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                pass
            elif len(self._buf) + end - start > self.max_line:
                self.dropped += 1
            else:
                self._buf += chunk[start:end]
                lines.append(bytes(self._buf))
            self._buf.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._buf += chunk[start:]
            if len(self._buf) > self.max_line:
                self._buf.clear()
                self._skipping = True
                self.dropped += 1
        return lines


@dataclass(frozen=True)
class SnapshotTarget:
    """Where the client's hand-offs go (the env var ENV_SNAPSHOT): the slots' folder and the writer's settings."""

    dir: str
    mode: str  # "background" or "inline" (then hand_off waits for an Ack)
    slots: int
    policy: str
    checksum: bool
    seq: int  # the newest seq an earlier attempt handed off: numbers keep rising
    meta: dict[str, Any]  # the snapshot meta the validator reads (worker/handoff.py: snapshot_meta)
    staging: bool = True  # validation.handoff_staging: a CUDA hand-off goes through a device buffer

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> SnapshotTarget:
        return cls(**json.loads(text))
