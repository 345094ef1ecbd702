"""A scripted launcher: handles that exit when told to and feed the supervisor events the test writes.

The real `Supervisor` runs over it exactly as over real processes, so logic tests and app tests see
the events the product really emits, with no training process behind them.
"""
from __future__ import annotations

import asyncio
import signal

from torchherd.engine.messages import TrainingStarted


class FakeHandle:
    """A worker that exits when told to; `ignore_term` makes it shrug off SIGTERM."""

    def __init__(self, pid: int, ignore_term: bool = False):
        self.pid, self.code, self.ignore_term = pid, None, ignore_term
        self.signals: list[int] = []
        self.sent: list[object] = []
        self.on_events = None

    def poll(self):
        return self.code

    def signal_group(self, sig):
        self.signals.append(sig)
        if sig == signal.SIGKILL or not self.ignore_term:
            self.code = -sig

    def signal_process(self, sig):
        self.signals.append(sig)

    def send(self, command):
        self.sent.append(command)
        return True

    def attach(self, on_events):
        self.on_events = on_events

    def drain(self):
        return []

    def close(self):
        pass

    def started(self, name):
        self.on_events([TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=1, steps_per_epoch=1,
                                        device="cpu", parameters=1)])


class ScriptedLauncher:
    def __init__(self, ignore_term: bool = False):
        self.handles: list[FakeHandle] = []
        self.specs: list = []
        self.ignore_term = ignore_term

    def launch(self, spec):
        self.specs.append(spec)
        handle = FakeHandle(10_000 + len(self.handles), self.ignore_term)
        self.handles.append(handle)
        return handle


async def until(condition, timeout: float = 5.0):
    async def poll():
        while not condition():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(poll(), timeout)
