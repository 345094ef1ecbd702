"""Scripting for app tests: the real Supervisor over the scripted launcher, fed training the test writes.

`Session` is the app's supervisor factory: each launch builds a real `Supervisor` (telemetry off,
validation inline, a fixed run id) over a `ScriptedLauncher`, so screens see exactly the events the
product emits. Training data goes in through a worker handle's attach callback (`feed`), so the
supervisor folds and re-emits it as it would a real worker's. Only `FakeHandle` internals are used
here (`on_events`, `code`, `send`), so a change to the launcher's signalling interface stays
inside tests/scripted.py.

Times: the events the test writes carry explicit times from T0; the events the supervisor makes are
stamped by `engine.messages`' clock, which `FrozenTime` replaces, so screens are the same each run.
"""
from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol import telemetry as tm
from torchherd.engine.protocol.channel import WorkerExit
from torchherd.engine.config.schema import RunConfig
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.names import ValidationMode
from torchherd.engine.supervise.supervisor import Supervisor
from tests.scripted import ScriptedLauncher

T0 = 1_700_000_000.0  # fixed wall-clock origin of scripted events (seconds since the epoch)
RUN_ID = "20231114-221320-good"
TRACEBACK = """Traceback (most recent call last):
  File "tasks/broken.py", line 12, in training_step
    loss = model(x).sum() / zero
ZeroDivisionError: float division by zero"""


class FrozenTime:
    """Stands in for the `time` module inside engine.messages: `time()` is `now`, moved by the test."""

    def __init__(self, now: float = T0):
        self.now = now

    def time(self) -> float:
        return self.now


class ObedientLauncher(ScriptedLauncher):
    """Scripted workers that exit the way a real one does when told to stop: code 10 after a checkpoint."""

    def __init__(self) -> None:
        super().__init__(obey_stop=True)
        self.names: list[str] = []  # pipeline of each handle, in launch order

    def launch(self, spec):
        handle = super().launch(spec)
        self.names.append(spec.child.name)
        return handle

    def handle(self, name: str):
        """The newest worker handle of pipeline `name`."""
        index = len(self.names) - 1 - self.names[::-1].index(name)
        return self.handles[index]


def scripted_config(config: RunConfig, **restart) -> RunConfig:
    """The config with no telemetry sampler and inline validation: no process beyond the scripted workers."""
    return config.model_copy(update={
        "telemetry": config.telemetry.model_copy(update={"enabled": False}),
        "validation": config.validation.model_copy(update={"mode": ValidationMode.INLINE}),
        "restart": config.restart.model_copy(update=restart)})


class Session:
    """The app's supervisor factory, and what the test needs to script the sessions it builds."""

    def __init__(self, clock: FrozenTime, run_id: str = RUN_ID, cpu_count: int = 2, tick: float = 0.05,
                 **restart):
        self.clock, self.run_id, self.cpu_count, self.restart = clock, run_id, cpu_count, restart
        self.tick = tick  # seconds between supervision passes: short, so tests see exits at once
        self.launcher = ObedientLauncher()
        self.sup: Supervisor | None = None
        self.stream = None
        self.events: list[m.Event] = []

    def __call__(self, config: RunConfig, runs_dir: Path | None) -> Supervisor:
        run_id = self.run_id if self.sup is None else f"{self.run_id}-{len(self.launcher.handles)}"
        self.launcher = ObedientLauncher()
        self.events, self.stream = [], None
        self.sup = Supervisor(scripted_config(config, **self.restart), runs_dir=runs_dir, launcher=self.launcher,
                              inventory=Inventory(cpu_count=self.cpu_count), run_id=run_id, tick=self.tick)
        self.stream = self.sup.subscribe()
        return self.sup

    # ------------------------------------------------------------ reading what the supervisor emitted
    def seen(self) -> list[m.Event]:
        """Every event emitted so far, in order."""
        while self.stream is not None and (event := self.stream.get_nowait()) is not None:
            self.events.append(event)
        return self.events

    def transitions(self, name: str) -> list[tuple[str, str]]:
        """(previous, state) of each state change of pipeline `name`."""
        return [(e.previous, e.state) for e in self.seen() if isinstance(e, m.WorkerStateChanged) and
                e.pipeline == name]

    def exits(self, name: str) -> list[m.WorkerExited]:
        return [e for e in self.seen() if isinstance(e, m.WorkerExited) and e.pipeline == name]

    def state(self, name: str) -> str:
        return self.sup.view(name).state.value

    # ------------------------------------------------------------ scripting the workers
    def feed(self, name: str, *events: m.Event) -> None:
        """Events from pipeline `name`'s current worker, as its status pipe would deliver them."""
        self.launcher.handle(name).on_events(list(events))
        self.clock.now = max([self.clock.now] + [e.time for e in events])

    def start_training(self, name: str, epochs: int = 4, steps_per_epoch: int = 50, epoch: int = 0,
                       step: int = 0) -> None:
        self.feed(name, m.TrainingStarted(pipeline=name, epoch=epoch, step=step, epochs_total=epochs,
                                          steps_per_epoch=steps_per_epoch, device="cpu", parameters=1234,
                                          time=self.clock.now))

    def train(self, name: str, steps: int, every: int = 10, epochs: int = 4, steps_per_epoch: int = 50,
              dt: float = 1.0, val: bool = True, start: int = 0, t0: float | None = None,
              loss=None, metrics=None) -> None:
        """Step reports (a decaying loss unless `loss(step)` says otherwise), epoch ends and validation."""
        loss = loss or (lambda step: 2.0 * math.exp(-step / 120) + 0.1 + 0.05 * math.sin(step / 7))
        metrics = metrics or (lambda step, value: {"val_loss": value * 1.1, "accuracy": 0.5 + step / 1000})
        t = self.clock.now if t0 is None else t0
        events: list[m.Event] = []
        for step in range(start + every, start + steps + 1, every):
            t += dt
            epoch = (step - 1) // steps_per_epoch
            value = loss(step)
            events.append(m.StepMetrics(pipeline=name, epoch=epoch, step=step, loss=value, lr=0.01,
                                        samples_per_s=1280.0, time=t))
            if step % steps_per_epoch == 0:
                if val:  # inline validation reports before the epoch's end, as the trainer does
                    events.append(m.ValResult(pipeline=name, epoch=epoch, step=step, time=t,
                                              metrics=metrics(step, value), latency=0.25))
                events.append(m.EpochEnd(pipeline=name, epoch=epoch, step=step, train_loss=value, duration=5.0,
                                         samples_per_s=1280.0, epochs_total=epochs,
                                         steps_per_epoch=steps_per_epoch, time=t))
        self.feed(name, *events)

    def crash(self, name: str, error: str = "ZeroDivisionError: float division by zero",
              traceback: str = TRACEBACK) -> None:
        """The worker reports an exception and exits non-zero; the restart policy takes it from there."""
        self.clock.now += 1
        self.feed(name, m.WorkerError(pipeline=name, error=error, traceback=traceback, where="train",
                                      time=self.clock.now))
        self.launcher.handle(name).code = WorkerExit.ERROR

    def show_telemetry(self, snapshot: tm.TelemetrySnapshot) -> None:
        """Hand the supervisor a telemetry sample as its sampler thread would (the sampler is off in tests)."""
        self.sup.on_telemetry(snapshot)

    def exit(self, name: str, code: int) -> None:
        """The worker exits with `code` (0: trained to its limits)."""
        self.launcher.handle(name).code = code


async def until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Wait (on the running loop) until `condition()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def write_past_run(runs_dir: Path, clock: FrozenTime, run_id: str = "20231114-220000-old") -> Path:
    """A finished run directory with a failure in it, written by a real Supervisor over scripted workers."""
    from tests.conftest import make_config

    config = make_config(runs_dir.parent, [{"name": "alpha"}], name="old", restart={"max_restarts": 0})
    session = Session(clock, run_id=run_id, max_restarts=0)
    sup = session(config, runs_dir)
    clock.now = T0
    await sup.start()
    await until(lambda: session.launcher.handles, what="the worker to start")
    session.start_training("alpha")
    session.train("alpha", 100)
    session.crash("alpha")
    await until(lambda: sup.finished, what="the run to fail")
    await sup.shutdown()
    log = runs_dir / run_id / "alpha" / "log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("epoch 1\nepoch 2\nTraceback: boom\n")
    return runs_dir / run_id
