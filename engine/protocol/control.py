"""The messages of a live run's control socket: a client's hello and requests, the supervisor's welcome
and replies, and the `ClientCommand` event that records in events.jsonl what each client asked.

A live client reads the run's events from events.jsonl itself, as far as each `Appended` says is written;
the socket carries only what the file does not keep (telemetry) as `EventLines`, and the history in short.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from .messages import Event, Message, PipelineOrRunEvent


class Action(StrEnum):
    """What a client can ask of a live run; `pipeline` "" means every pipeline (stop and kill only)."""

    STOP = "stop"  # finish the step, checkpoint, exit
    KILL = "kill"
    RESTART = "restart"
    PAUSE = "pause"
    UNPAUSE = "unpause"  # the pipeline carries on after a pause
    RESUME = "resume"  # what clients before 0.2 sent for UNPAUSE: taken as it
    CHECKPOINT = "checkpoint"
    PROMOTE = "promote"  # a sweep's trial: un-pruned (from its checkpoint) and never pruned again this session
    STACKS = "stacks"  # every process of the pipeline writes its Python stacks to its log; nothing stops
    ADD_CONFIG = "add_config"  # `path`: another config's pipelines join the run
    DETACH = "detach"  # nothing to do: the client says it is leaving, and the run goes on


@dataclass(frozen=True, kw_only=True, slots=True)
class Hello(Message):
    """The first message of every connection: who the client is and what it wants."""

    type: ClassVar[str] = "hello"
    pid: int
    read_only: bool = False
    live: bool = True  # False: only the welcome, for `torchherd ls` and one-shot commands
    summary: bool = False  # True: right after the welcome, the run's history in short (an EventLines)


@dataclass(frozen=True, kw_only=True, slots=True)
class Welcome(Message):
    """The supervisor's answer to a hello: the run, and how many bytes of events.jsonl were on disk when the
    live stream began (a client's history; it reads every later event from the file, as `Appended` says)."""

    type: ClassVar[str] = "welcome"
    run_id: str
    run_dir: str
    supervisor_pid: int
    events_bytes: int
    pipelines: tuple[str, ...]
    statuses: dict[str, str]  # each pipeline's state now


@dataclass(frozen=True, kw_only=True, slots=True)
class EventLines(Message):
    """Events as whole lines of events.jsonl: those it does not keep (telemetry; encoded once, the same frame
    to every client), or the history in short that a `summary` hello asked for."""

    type: ClassVar[str] = "event_lines"
    data: bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Appended(Message):
    """events.jsonl now holds every event published so far in its first `events_bytes` bytes: a live client
    reads on from where it is to there (each client reads the run's file itself, so a thousand viewers cost
    the supervisor what one does, and one that stops reading costs it nothing)."""

    type: ClassVar[str] = "appended"
    events_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Request(Message):
    """A client asks for an action; the supervisor answers with a Reply of the same `id`."""

    type: ClassVar[str] = "request"
    id: int
    action: str  # an Action
    pipeline: str = ""
    path: str = ""  # ADD_CONFIG's config file
    reason: str = ""  # STOP's reason, as the pipelines' end records it (default "requested")


@dataclass(frozen=True, kw_only=True, slots=True)
class Reply(Message):
    type: ClassVar[str] = "reply"
    id: int
    ok: bool
    text: str = ""  # why it was refused, or what it did


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientCommand(PipelineOrRunEvent):
    """A client's request, whether it was carried out, and who sent it (its pid, as the socket saw it)."""

    type: ClassVar[str] = "client_command"
    action: str
    client_pid: int = 0
    ok: bool = True
    text: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientRefused(Event):
    """A connection the supervisor refused: another user's, by its peer credentials."""

    type: ClassVar[str] = "client_refused"
    pid: int
    uid: int
    reason: str
