"""A scripted launcher: handles that exit when told to and feed the supervisor events the test writes.

The real `Supervisor` runs over it exactly as over real processes, so logic tests and app tests see
the events the product really emits, with no training process behind them.
"""
from __future__ import annotations

import asyncio
import signal

from torchherd.engine.launch.backend import Backend, Handle
from torchherd.engine.protocol.channel import WorkerExit
from torchherd.engine.protocol.messages import Stop, TrainingStarted
from torchherd.engine.protocol.spec import ValidatorSpec


class FakeHandle(Handle):
    """A worker that exits when told to; `ignore_term` makes it shrug off `terminate()`; `obey_stop` makes it
    exit at a Stop command as a real child does (WorkerExit.STOPPED), else it waits for the test.

    `signals` records what it was asked, as the signals a local process would get. It is a `Handle`,
    so a method the contract adds and this fake lacks is a TypeError when a test makes one.
    """

    def __init__(self, pid: int, ignore_term: bool = False, obey_stop: bool = False):
        self.pid, self.code, self.ignore_term, self.obey_stop = pid, None, ignore_term, obey_stop
        self.signals: list[int] = []
        self.sent: list[object] = []
        self.on_events = None

    @property
    def pids(self):
        return (self.pid,)

    def poll(self):
        return self.code

    def terminate(self):
        self.signals.append(signal.SIGTERM)
        if not self.ignore_term:
            self.code = -signal.SIGTERM

    def kill(self):
        self.signals.append(signal.SIGKILL)
        self.code = -signal.SIGKILL

    def dump_stacks(self):
        self.signals.append(signal.SIGUSR1)

    def exit(self, code: int, events=()):
        """The worker ends by itself with `code`, after sending `events`."""
        if events:
            self.on_events(list(events))
        self.code = code

    def send(self, command):
        self.sent.append(command)
        if self.obey_stop and isinstance(command, Stop) and self.code is None:
            self.code = WorkerExit.STOPPED
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


class ScriptedLauncher(Backend):
    """Launches FakeHandles (or whatever `make(n)` returns for the n-th launch) and keeps them in order; a
    validator's ends at a Stop, as the real one does (the session's shutdown waits for it).

    Every other ability is the `Backend` default, as for the local backend."""

    def __init__(self, ignore_term: bool = False, obey_stop: bool = False):
        self.handles: list[FakeHandle] = []
        self.specs: list = []
        self.ignore_term, self.obey_stop = ignore_term, obey_stop
        self.make = None

    def launch(self, spec):
        self.specs.append(spec)
        n = len(self.handles)
        obey = self.obey_stop or isinstance(spec.child, ValidatorSpec)  # a validator ends at Stop, always
        handle = self.make(n) if self.make is not None else FakeHandle(10_000 + n, self.ignore_term, obey)
        self.handles.append(handle)
        return handle


async def until(condition, timeout: float = 5.0):
    async def poll():
        while not condition():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(poll(), timeout)


class PolicySession:
    """A session as a policy reads it (a real SessionView over states a test sets) and an Outbox whose decisions
    land here, carried out as the supervisor would: for orders of events a live run hits only by chance. Stop
    moves a trial to STOPPING (its attempt then ends when the test says); Requeue queues an ended one."""

    def __init__(self, config, run_dir):
        from types import SimpleNamespace

        from torchherd.engine.supervise.decisions import Outbox, SessionView

        self.config, self.run_dir = config, run_dir
        self.states: dict = {}
        self.recorded: list = []  # the events of Record decisions
        self.stopped: list = []  # the Stop decisions
        self.requeued: list[str] = []
        self.retuned: dict[str, dict] = {}
        view = lambda name: SimpleNamespace(state=self.states[name], step=4, epoch=1, steps_per_epoch=4)  # noqa: E731
        self.view = SessionView(config, run_dir, view, lambda: [])
        self.out = Outbox(self._carry_out, lambda: False, asyncio.get_running_loop())

    def _carry_out(self, decision) -> None:
        from torchherd.engine.protocol.states import WorkerState
        from torchherd.engine.supervise.decisions import Record, Requeue, Retune, Stop

        if isinstance(decision, Record):
            self.recorded.append(decision.event)
        elif isinstance(decision, Stop):
            self.stopped.append(decision)
            self.states[decision.name] = WorkerState.STOPPING
        elif isinstance(decision, Requeue) and self.states[decision.name].ended:  # as the supervisor does
            self.requeued.append(decision.name)
            self.states[decision.name] = WorkerState.QUEUED
        elif isinstance(decision, Retune):
            self.retuned[decision.name] = decision.values
