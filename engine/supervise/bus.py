"""The event bus of a session: events go on with `publish` (one), `publish_steps` (a run of step reports at
once) or `publish_transient` (telemetry: never written); they come off through `add_writer` (the run directory,
first), `add_tap` (a callback per event) and `subscribe` (a stream, the history first for late comers).

Each event is encoded once (its events.jsonl line) for every writer and tap. Closing the bus ends every stream.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable, Iterator, cast

from ..protocol.messages import Event, StepMetrics
from ..rundir.lines import encode_line, encode_lines

HISTORY = 100_000  # events kept in memory for late subscribers


class EventStream:
    """An async iterator of a bus's events, queued one by one or a burst as one list; ends when the bus closes."""

    def __init__(self, queue: asyncio.Queue):
        self._queue = queue
        self._ready: deque[Event] = deque()  # the rest of the burst being taken

    def __aiter__(self) -> "EventStream":
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
    """Fans events out to writers, taps and subscribers, in the order they were published."""

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

