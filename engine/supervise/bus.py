"""The event bus of a session and its one door, `Publisher`: every event, run of step reports and transient of
the session goes on through it, which folds each pipeline's progress as it publishes; events come off through
writers (the run directory, first), taps (a callback per event) and subscribers (a stream, the history first).

Each event is encoded once (its events.jsonl line) for every writer and tap. Closing the bus ends every stream.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, cast

from ..protocol.messages import Event, StepMetrics, pipeline_of
from ..rundir.lines import encode_line, encode_lines

if TYPE_CHECKING:
    from .pipeline import SupervisedPipeline

HISTORY = 100_000  # events kept in memory for late subscribers
Tap = Callable[[Event, bytes, bool], None]  # (event, its events.jsonl line, kept) on every event published
StepsTap = Callable[[list[StepMetrics], list[bytes]], None]  # a run of step reports and their lines at once


class EventStream:
    """An async iterator of a bus's events, queued one by one or a burst as one list; ends when the bus closes."""

    def __init__(self, queue: asyncio.Queue):
        self._queue = queue
        self._ready: deque[Event] = deque()  # the rest of the burst being taken

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        while not self._ready:
            item = await self._queue.get()
            if item is None:
                raise StopAsyncIteration
            if type(item) is not list:
                return item
            self._ready.extend(item)
        return self._ready.popleft()

    def waiting(self, limit: int) -> list[Event]:
        """Up to `limit` events already queued, taken without waiting; the stream's end, if queued, stays
        queued for the iteration to see."""
        out: list[Event] = []
        while len(out) < limit:
            if self._ready:
                out.append(self._ready.popleft())
                continue
            if self._queue.empty():
                break
            item = self._queue.get_nowait()
            if item is None:  # the last item a closed bus queues: put back, nothing follows it
                self._queue.put_nowait(None)
                break
            if type(item) is list:
                self._ready.extend(item)
            else:
                out.append(item)
        return out

    def get_nowait(self) -> Event | None:
        """The next event if one is waiting, else None (also None once closed)."""
        while not self._ready:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
            if type(item) is not list:
                return item
            self._ready.extend(item)
        return self._ready.popleft()


class EventBus:
    """Fans events out to writers, taps and subscribers, in the order they were published. Only its `Publisher`
    publishes on it."""

    def __init__(self, history: int = HISTORY):
        self._history: deque[Event] = deque(maxlen=history)
        self._subscribers: list[asyncio.Queue] = []
        self._writers: list[Callable[[Event, bytes], None]] = []
        self._step_writers: list[Callable[[list[StepMetrics], list[bytes]], None]] = []
        self._taps: list[Callable[[Event, bytes, bool], None]] = []
        self._each_step_taps: list[Callable[[Event, bytes, bool], None]] = []  # the taps with no `steps` of their own
        self._step_taps: list[Callable[[list[StepMetrics], list[bytes]], None]] = []
        self.closed = False
        self.publishing = 0  # publishes under way (a tap's work deferred until it is 0: decisions.Outbox)

    def add_writer(self, writer: Callable[[Event, bytes], None],
                   steps: Callable[[list[StepMetrics], list[bytes]], None] | None = None) -> None:
        """Call `writer(event, line)` with its events.jsonl line for every kept event, before any tap (the run
        directory); `steps`, if given, takes a run of step reports and their lines at once (`publish_steps`)."""
        self._writers.append(writer)

        def each(events: list[StepMetrics], lines: list[bytes]) -> None:
            for event, line in zip(events, lines):
                writer(event, line)
        self._step_writers.append(steps or each)

    def add_tap(self, tap: Callable[[Event, bytes, bool], None],
                steps: Callable[[list[StepMetrics], list[bytes]], None] | None = None) -> None:
        """Call `tap(event, line, kept)` for every event from now on, kept or transient, right after the writers
        (so a tap that reads the run directory sees the event written): the control socket's fan-out, observers.
        `line` is the event's one encoding, the bytes events.jsonl has (or would have, for a transient).
        `steps`, if given, takes a run of step reports (all kept) and their lines at once instead."""
        self._taps.append(tap)
        if steps is None:
            self._each_step_taps.append(tap)
        else:
            self._step_taps.append(steps)

    def publish(self, event: Event) -> None:
        self._history.append(event)
        if self.closed:
            return
        line = encode_line(event) if self._writers or self._taps else b""
        for writer in self._writers:
            writer(event, line)
        self.publishing += 1
        try:
            for tap in self._taps:
                tap(event, line, True)
        finally:
            self.publishing -= 1
        for queue in self._subscribers:
            queue.put_nowait(event)

    def publish_steps(self, steps: list[StepMetrics]) -> None:
        """`publish` of each of a run of step reports, in order, to the same writers, taps and subscribers: one call
        for the bulk of a worker's batch. Every line is written (into the buffers: step reports are not flushed)
        before the first tap or subscriber sees its event."""
        if self.closed:
            self._history.extend(steps)
            return
        lines = encode_lines(steps) if self._writers or self._taps else [b""] * len(steps)
        for write in self._step_writers:
            write(steps, lines)
        self.publishing += 1
        try:
            self._tap_steps(steps, lines)
        finally:
            self.publishing -= 1

    def _tap_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        for tap_steps in self._step_taps:
            tap_steps(steps, lines)
        history, taps, queues = self._history.append, self._each_step_taps, self._subscribers
        for event, line in zip(steps, lines):
            history(event)
            if self.closed:  # by a tap, meanwhile: what follows is kept in the history only
                continue
            for tap in taps:
                tap(event, line, True)
            for queue in queues:
                queue.put_nowait(event)

    def publish_transient(self, event: Event) -> None:
        """To subscribers only: not kept, not written (telemetry has its own file)."""
        if not self.closed:
            if self._taps:
                line = encode_line(event)
                self.publishing += 1
                try:
                    for tap in self._taps:
                        tap(event, line, False)
                finally:
                    self.publishing -= 1
            for queue in self._subscribers:
                queue.put_nowait(event)

    def subscribe(self, replay: bool = True) -> EventStream:
        """A stream of every event from now on (and, with `replay`, those already published)."""
        queue: asyncio.Queue = asyncio.Queue()
        if replay:
            for event in self._history:
                queue.put_nowait(event)
        if self.closed:
            queue.put_nowait(None)
        self._subscribers.append(queue)
        return EventStream(queue)

    def close(self) -> None:
        """End every stream; later events are kept in the history only."""
        if self.closed:
            return
        self.closed = True
        self._writers.clear()
        self._step_writers.clear()
        self._taps.clear()
        self._each_step_taps.clear()
        self._step_taps.clear()
        for queue in self._subscribers:
            queue.put_nowait(None)


class Publisher:
    """The one door onto a session's bus: what it publishes is folded into its pipeline's progress (the one fold
    of progress, as the app folds the same events), then written, tapped and streamed."""

    def __init__(self, pipelines: Mapping[str, SupervisedPipeline], bus: EventBus | None = None):
        self._pipelines = pipelines  # the supervisor's, by name: a pipeline added later is folded too
        self._bus = bus if bus is not None else EventBus()
        self.quiet = False  # the run has finished: news from the validator is no longer kept (`validation`)

    @property
    def publishing(self) -> bool:
        """An event is reaching its taps now (a policy's decisions wait until it has reached every one)."""
        return self._bus.publishing > 0

    def event(self, event: Event) -> None:
        """Publish one event."""
        self._bus.publish(event)
        pipe = self._pipelines.get(pipeline_of(event))
        if pipe is not None:
            pipe.fold(event)

    def steps(self, pipe: SupervisedPipeline, steps: list[StepMetrics]) -> None:
        """Publish a run of `pipe`'s step reports at once (the bulk of a worker's batch)."""
        self._bus.publish_steps(steps)
        pipe.fold(steps[-1])  # the newest supersedes the rest

    def transient(self, event: Event) -> None:
        """To taps and subscribers only, never written (telemetry has its own file; a rank's pace)."""
        self._bus.publish_transient(event)

    def validation(self, event: Event) -> None:
        """The validator's news; once the run has finished nothing more is written (readers take run_finished to be
        the last event), so what arrives later is not kept."""
        if not self.quiet:
            self.event(event)

    def add_writer(self, writer: Callable[[Event, bytes], None], steps: StepsTap | None = None) -> None:
        self._bus.add_writer(writer, steps)

    def tap(self, tap: Tap, steps: StepsTap | None = None) -> None:
        self._bus.add_tap(tap, steps)

    def subscribe(self, replay: bool = True) -> EventStream:
        return self._bus.subscribe(replay)

    def close(self) -> None:
        self._bus.close()


def step_runs(events: list[Event]) -> Iterator[tuple[list[StepMetrics], Event | None]]:
    """`events` in order as (a run of step reports, maybe empty; the event after it, or None after the last):
    a worker's batch is mostly step reports, which `publish_steps` takes in bulk."""
    start = 0
    for i, event in enumerate(events):
        if type(event) is not StepMetrics:
            yield cast("list[StepMetrics]", events[start:i]), event  # the run before it: step reports only
            start = i + 1
    if start < len(events):
        yield cast("list[StepMetrics]", events[start:] if start else events), None  # step reports only

