"""Publishing a snapshot once its asynchronous copy has landed, off the training thread.

A `Flight` is one snapshot whose copy is still running, with what to do once it lands (publish the slot)
or fails (free the slot); a `Publisher` is the daemon thread that waits for each flight in turn and does it.

Why a thread, and not a check at the next step or report: the validator sees a snapshot as soon as its bytes
are in shared memory (a few milliseconds on a GPU), whatever the loop does next. A check at the next boundary
would leave a per-epoch hand-off unpublished for an epoch, the last one of a run for ever, and would need a
hook in every runner and in users' own scripts. The thread costs little: it sleeps in a blocking-sync CUDA
event wait with the GIL released, and training only reads a flag (`Flight.landed`) at its next hand-off.
"""
from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable

from .copy_engine import Copy


class Flight:
    """One snapshot whose copy may still be running; `landed` is set once it is published or has failed."""

    def __init__(self, copy: Copy, publish: Callable[[], None], abandon: Callable[[], None]):
        self.copy = copy
        self._publish, self._abandon = publish, abandon
        self.landed = threading.Event()
        self.error: BaseException | None = None  # why the copy failed (raised at the next hand-off)

    def finish(self) -> None:
        """Wait for the copy, then publish; on an error, free the slot instead. Sets `landed` either way."""
        try:
            self.copy.wait()
            self._publish()
        except BaseException as exc:  # a CUDA error: the slot holds torn bytes and must not be read
            self.error = exc
            self._abandon()
        finally:
            self.landed.set()


class Publisher:
    """A daemon thread that finishes flights one at a time, started with the first one."""

    def __init__(self, name: str = "torchherd-snapshot-publisher") -> None:
        self.name = name  # the thread's
        self._flights: queue.SimpleQueue[Flight | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._current: Flight | None = None

    def submit(self, flight: Flight) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
            # A script that ends normally with a copy in flight still publishes it: daemon threads run on
            # while atexit handlers do. (A worker process ends with os._exit; its runner closes the writer.)
            atexit.register(self.drain)
        self._current = flight
        self._flights.put(flight)

    def _run(self) -> None:
        while (flight := self._flights.get()) is not None:
            flight.finish()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for the flight submitted last; False if `timeout` (seconds) ran out first."""
        flight = self._current
        return flight is None or flight.landed.wait(timeout)

    def stop(self) -> None:
        """Finish what was submitted, then end the thread."""
        if self._thread is None:
            return
        self._flights.put(None)
        self._thread.join()
        self._thread = None
        self._current = None
        atexit.unregister(self.drain)
