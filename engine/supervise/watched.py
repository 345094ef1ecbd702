"""`WatchedClock`: the seconds a supervisor was running to watch its workers, on which their silence is judged.

A supervisor stopped by SIGSTOP, on a swapping machine or in a long pause of its event loop
reads nothing meanwhile: its workers train on and their reports wait unread in their channels.
Time it was not running is left out of this clock, so it is never taken for a worker's silence.
"""
from __future__ import annotations

import time
from collections.abc import Callable

PAUSED_AFTER = 1.0  # seconds a look at the clock may come later than the tick interval before it counts as a pause


class WatchedClock:
    """Monotonic seconds less the pauses of this process, as seen by looks at the clock.

    The supervision tick looks at least every tick interval; a look that comes more than PAUSED_AFTER later
    than that means the process was not running in between (a tick is late by much less on a loaded machine),
    and the whole lateness is left out. Crediting the pause, rather than restarting every silence from the
    first look after it, keeps what a worker's silence was before the pause: one that was already quiet still
    reaches hang_timeout after as many watched seconds, and its slowest gap between reports (the stall rule's
    measure) is not stretched by the pause. Deadlines for a worker to act (stop_timeout, kill_grace) stay on
    the real monotonic clock: the worker ran meanwhile and had that time.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self._interval, self._clock = interval, clock  # interval: seconds between supervision ticks
        self._last = clock()
        self.missed = 0.0  # seconds this process was not running, so far

    def __call__(self) -> float:
        now = self._clock()
        late = now - self._last - self._interval
        if late > PAUSED_AFTER:
            self.missed += late
        self._last = now
        return now - self.missed
