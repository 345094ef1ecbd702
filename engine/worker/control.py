"""The supervisor's commands as a training process obeys them: stop, pause, checkpoint-now, heartbeats, NaN policy.

`WorkerControl` is polled between steps by every runner; it is cheap when nothing
is waiting (one clock read), beats the heartbeat from the training thread itself
(a stuck step stops the beats), and holds the caller while the pipeline is paused.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..protocol.channel import ControlReceiver, StatusSender, WorkerExit
from ..protocol.messages import CheckpointNow, Heartbeat, Notice, Pause, Proceed, Stop, Unpause, WorkerError

CONTROL_INTERVAL = 0.02  # seconds between looks at the control pipe
HEARTBEAT_INTERVAL = 1.0  # seconds between "still stepping" reports from the training thread


class WorkerControl:
    """Commands from the supervisor for one pipeline, and what it reports about obeying them."""

    def __init__(self, name: str, sender: StatusSender, control: ControlReceiver, nan_policy: str = "stop"):
        self.name, self.sender, self.control, self.nan_policy = name, sender, control, nan_policy
        self.stop_reason: str | None = None
        self.paused = False
        self.paused_time = 0.0  # seconds spent paused
        self.checkpoint_requested = False
        self.cleared = False  # Proceed came: every task of the run built
        self._next_control = 0.0
        self._next_heartbeat = 0.0
        self.step = -1  # the optimizer step the runner last reported here
        self._start_step: int | None = None  # the step this attempt began at
        self._stepped = False  # this attempt completed an optimizer step

    @property
    def should_stop(self) -> bool:
        return self.stop_reason is not None

    def poll(self, timeout: float = 0.0) -> None:
        """Read whatever commands have arrived (waiting up to `timeout` seconds for the first)."""
        for cmd in self.control.poll(timeout):
            if isinstance(cmd, Stop):
                self.stop_reason = cmd.reason
            elif isinstance(cmd, Pause):
                self.paused = True
            elif isinstance(cmd, Unpause):
                self.paused = False
            elif isinstance(cmd, CheckpointNow):
                self.checkpoint_requested = True
            elif isinstance(cmd, Proceed):
                self.cleared = True

    def hold(self) -> bool:
        """After the build, wait until every task of the run has built (True) or a Stop comes (False)."""
        while not self.cleared and self.stop_reason is None:
            self.poll(timeout=0.5)
        return self.stop_reason is None

    def discard(self) -> None:
        """Read and drop whatever commands arrived (a gang's rank that takes its orders from rank 0)."""
        self.control.poll(0.0)

    def take_checkpoint_request(self) -> bool:
        """True once per checkpoint-now command."""
        requested, self.checkpoint_requested = self.checkpoint_requested, False
        return requested

    def between_steps(self, step: int, save: Callable[[str], None]) -> None:
        """Beat, obey commands, and hold here while paused (saving on request meanwhile)."""
        if not self.beat(step):
            return
        self.poll()
        if self.paused:
            paused_at = time.monotonic()
            while self.paused and self.stop_reason is None:
                self.poll(timeout=0.5)
                if self.take_checkpoint_request():
                    save("request")
            self.paused_time += time.monotonic() - paused_at

    def beat(self, step: int) -> bool:
        """Note the step and beat the heartbeat when due; True when it is time to look at the commands."""
        self.step = step
        if self._start_step is None:
            self._start_step = step
        elif not self._stepped and step > self._start_step:
            # The attempt's first completed step is told at once: a worker that dies before it
            # is a failed start, one that dies after it an ordinary crash.
            self._stepped = True
            self._next_control = self._next_heartbeat = 0.0
        now = time.monotonic()
        if now < self._next_control:
            return False
        self._next_control = now + CONTROL_INTERVAL
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_INTERVAL
            self.heartbeat(step)
        return True

    def heartbeat(self, step: int) -> None:
        """Tell the supervisor's hang check the pipeline is alive at `step` (beat() calls it when due; a
        runner whose training runs in another process calls it when that process showed life)."""
        self.sender.step(Heartbeat(pipeline=self.name, step=step))

    def non_finite(self, value: float, where: str) -> int | None:
        """None if `value` is finite or the policy only warns; else the exit code the policy asks for."""
        if math.isfinite(value):
            return None
        text = f"training loss is {value} at {where}"
        if self.nan_policy == "warn":
            self.sender.send(Notice(pipeline=self.name, level="warning", text=text))
            return None
        self.sender.send(WorkerError(pipeline=self.name, error=f"NonFiniteLoss: {text}", traceback="",
                                     where="train"))
        return WorkerExit.FATAL if self.nan_policy == "stop" else WorkerExit.RESTART
