"""A scripted stand-in for `engine.supervisor.Supervisor`: same methods, events fed by the test.

Commands are recorded in `calls` and answered with the events the real supervisor would emit,
so every dashboard key can be driven without a training process.
"""
from __future__ import annotations

import asyncio
import math
from pathlib import Path

from torchherd.engine import messages as m

T0 = 1_700_000_000.0  # fixed wall-clock origin of scripted events (seconds since the epoch)
TRACEBACK = """Traceback (most recent call last):
  File "tasks/broken.py", line 12, in training_step
    loss = model(x).sum() / zero
ZeroDivisionError: float division by zero"""


class FakeStream:
    """An async iterator over a queue; None ends it (like the real EventStream)."""

    def __init__(self, queue: asyncio.Queue):
        self._queue = queue

    def __aiter__(self):
        return self

    async def __anext__(self) -> m.Event:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def get_nowait(self) -> m.Event | None:
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None


class FakeSupervisor:
    """Scripted supervisor: `emit` events, inspect `calls`, `added`, `shutdowns`."""

    instances: list["FakeSupervisor"] = []

    def __init__(self, config, runs_dir: Path | None = None, t0: float = T0):
        self.config = config
        self.run_id = "20231114-221320-" + config.name
        self.run_dir = Path(runs_dir or "runs") / self.run_id
        self.t = t0
        self.calls: list[tuple[str, str | None]] = []
        self.added: list[str] = []
        self.shutdowns: list[bool] = []
        self.states: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        self._queues: list[asyncio.Queue] = []
        self._history: list[m.Event] = []
        FakeSupervisor.instances.append(self)

    # ------------------------------------------------------------ the Supervisor API
    async def start(self) -> None:
        names = tuple(p.name for p in self.config.pipelines)
        self.emit(m.RunStarted(run_id=self.run_id, run_dir=str(self.run_dir), config_path=self.config.source,
                               pipelines=names))
        for i, name in enumerate(names):
            self._begin(name, i)

    def subscribe(self) -> FakeStream:
        queue: asyncio.Queue = asyncio.Queue()
        for ev in self._history:
            queue.put_nowait(ev)
        self._queues.append(queue)
        return FakeStream(queue)

    def views(self) -> list:
        return []

    @property
    def alive(self) -> bool:
        return any(s in ("starting", "running", "paused", "stopping", "killing") for s in self.states.values())

    def add_config(self, config) -> list[str]:
        names = [p.name for p in config.pipelines]
        self.added += names
        for i, name in enumerate(names):
            self._begin(name, len(self.states) + i)
        return names

    def stop(self, name: str | None = None) -> None:
        for n in ([name] if name else list(self.states)):
            self._check(n)
            self.calls.append(("stop", n))
            self._end(n, "stopped", "stopping")

    def pause(self, name: str) -> None:
        self._check(name)
        self.calls.append(("pause", name))
        self._state(name, "paused")

    def resume(self, name: str) -> None:
        self._check(name)
        self.calls.append(("resume", name))
        self._state(name, "running")

    def checkpoint(self, name: str) -> None:
        self._check(name)
        self.calls.append(("checkpoint", name))
        self.emit(m.CheckpointSaved(pipeline=name, path="last.pt", epoch=0, step=0, reason="request", time=self.t))

    def kill(self, name: str) -> None:
        self._check(name)
        self.calls.append(("kill", name))
        self._end(name, "killed", "killing")

    def restart(self, name: str) -> None:
        self._check(name)
        self.calls.append(("restart", name))
        self._state(name, "killing")
        self.emit(m.WorkerExited(pipeline=name, pid=1000, attempt=self.attempts[name], exit_code=None,
                                 signal="SIGTERM", reason="restart", time=self.t))
        self._state(name, "queued")
        self._begin(name, 0, restart=True)

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        self.shutdowns.append(graceful)
        for name, state in list(self.states.items()):
            if state not in ("completed", "stopped", "failed", "killed"):
                self._end(name, "stopped" if graceful else "killed", "stopping" if graceful else "killing")
        for q in self._queues:
            q.put_nowait(None)

    # ------------------------------------------------------------ scripting
    def emit(self, *events: m.Event) -> None:
        for ev in events:
            self._history.append(ev)
            for q in self._queues:
                q.put_nowait(ev)

    def train(self, name: str, steps: int, every: int = 10, epochs: int = 4, steps_per_epoch: int = 50,
              dt: float = 1.0, val: bool = True, start: int = 0) -> None:
        """Emit step reports (a decaying loss), epoch ends and validation results."""
        for step in range(start + every, start + steps + 1, every):
            self.t += dt
            epoch = (step - 1) // steps_per_epoch
            loss = 2.0 * math.exp(-step / 120) + 0.1 + 0.05 * math.sin(step / 7)
            self.emit(m.StepMetrics(pipeline=name, epoch=epoch, step=step, loss=loss, lr=0.01,
                                    samples_per_s=1280.0, time=self.t))
            if step % steps_per_epoch == 0:
                self.emit(m.EpochEnd(pipeline=name, epoch=epoch, step=step, train_loss=loss, duration=5.0,
                                     samples_per_s=1280.0, epochs_total=epochs, steps_per_epoch=steps_per_epoch,
                                     time=self.t))
                if val:
                    self.emit(m.ValResult(pipeline=name, epoch=epoch, step=step, time=self.t,
                                          metrics={"val_loss": loss * 1.1, "accuracy": 0.5 + step / 1000},
                                          latency=0.25))

    def crash(self, name: str) -> None:
        """A worker raises, exits non-zero and is restarted by the policy."""
        self.t += 1
        self.emit(m.WorkerError(pipeline=name, error="ZeroDivisionError: float division by zero",
                                traceback=TRACEBACK, where="train", time=self.t),
                  m.WorkerExited(pipeline=name, pid=1000, attempt=self.attempts[name], exit_code=1,
                                 reason="crashed", error="ZeroDivisionError: float division by zero",
                                 traceback=TRACEBACK, time=self.t))
        self._state(name, "backoff")
        self.emit(m.WorkerRestarting(pipeline=name, attempt=self.attempts[name] + 1, delay=2.0,
                                     restarts_left=2, reason="crashed", time=self.t))

    # ------------------------------------------------------------ internals
    def _check(self, name: str) -> None:
        if name not in self.states:
            raise KeyError(name)

    def _state(self, name: str, state: str) -> None:
        previous = self.states.get(name, "queued")
        self.states[name] = state
        self.emit(m.WorkerStateChanged(pipeline=name, state=state, previous=previous, time=self.t))

    def _begin(self, name: str, index: int, restart: bool = False) -> None:
        if not restart:
            self.states[name] = "queued"
            self.emit(m.PipelineQueued(pipeline=name, priority=0, position=index, time=self.t))
        self.attempts[name] = self.attempts.get(name, 0) + 1
        self.emit(m.WorkerStarted(pipeline=name, pid=4000 + index, device=f"cpu{index}",
                                  attempt=self.attempts[name], time=self.t))
        self._state(name, "starting")
        self.emit(m.TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=4, steps_per_epoch=50,
                                    device=f"cpu{index}", parameters=1234, time=self.t))
        self._state(name, "running")

    def _end(self, name: str, status: str, via: str) -> None:
        if self.states.get(name) in ("completed", "stopped", "failed", "killed"):
            return
        self._state(name, via)
        self.emit(m.WorkerExited(pipeline=name, pid=1000, attempt=self.attempts[name], exit_code=0 if
                                 status == "stopped" else None, signal="" if status == "stopped" else "SIGTERM",
                                 reason=status, time=self.t))
        self._state(name, status)
        self.emit(m.PipelineFinished(pipeline=name, status=status, time=self.t))
