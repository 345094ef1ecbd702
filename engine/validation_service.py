"""The validation service: the session's background validator process and the ledger of snapshots.

It starts the validator (and restarts it with backoff when it dies), routes its
results to the supervisor, and keeps, per pipeline, which snapshots were handed
off and which were scored, so that every snapshot ends either scored or recorded
as skipped, and a run waits (bounded) for the results still to come.
"""
from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torchherd.engine.launcher import Handle, LaunchSpec, Launcher
from torchherd.engine.messages import (EarlyStop, Event, Notice, SnapshotSkipped, SnapshotTaken, Stop,
                                       ValidatorStarted, ValResult)
from torchherd.engine.placement import ValidationPlan
from torchherd.engine.rundir import claim_root
from torchherd.engine.spec import ValidatorSpec

BACKOFF = (1.0, 30.0)  # seconds: first and longest delay before restarting the validator
DRAIN = 120.0  # seconds the run waits, all training done, for results that make no progress
HEALTHY = 60.0  # seconds of uptime after which a validator death resets the backoff
GIVE_UP = 3  # validator deaths in a row after which the run no longer waits for results
SKIPPED_NEWER = "a newer snapshot was validated first"
SESSION_ENDED = "the session ended before the validator scored it"


@dataclass
class SnapshotLedger:
    """One pipeline's snapshots: handed off but not scored yet, and scored."""

    handed: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (epoch, step)
    scored: set[int] = field(default_factory=set)
    scored_max: int = 0
    seq_max: int = 0  # highest seq any attempt handed off: the next attempt numbers on from here
    broken: bool = False  # the validator cannot score this pipeline at all

    def taken(self, event: SnapshotTaken) -> bool:
        """Note a hand-off; False if a newer snapshot was already scored (so this one is skipped)."""
        self.seq_max = max(self.seq_max, event.seq)
        # The validator's result can overtake the worker's report of the hand-off.
        if event.dropped or event.seq in self.scored:
            return True
        if event.seq < self.scored_max:
            return False
        self.handed[event.seq] = (event.epoch, event.step)
        return True

    def resolve(self, seq: int) -> list[tuple[int, int, int]]:
        """`seq` was scored: returns the older unscored hand-offs, now skipped, as (seq, epoch, step)."""
        skipped = [(old, *self.handed.pop(old)) for old in sorted(k for k in self.handed if k < seq)]
        self.handed.pop(seq, None)
        if seq:
            self.scored.add(seq)
            self.scored_max = max(self.scored_max, seq)
        return skipped

    @property
    def waiting(self) -> bool:
        return bool(self.handed) and not self.broken


class ValidationService:
    """Runs the validator for a session and keeps the snapshot ledgers of its pipelines."""

    def __init__(self, launcher: Launcher, publish: Callable[[Event], None], run_dir: Path, snapshot_root: Path,
                 on_result: Callable[[str, ValResult], None], on_early_stop: Callable[[str, EarlyStop], None]):
        self._launcher, self._publish = launcher, publish
        self.run_dir, self.snapshot_root = run_dir, snapshot_root
        self._on_result, self._on_early_stop = on_result, on_early_stop
        self.ledgers: dict[str, SnapshotLedger] = {}
        self.plan: ValidationPlan | None = None
        self.handle: Handle | None = None
        self.attempt = 0
        self.restart_at: float | None = None
        self.failures = 0  # consecutive deaths; sets the backoff
        self.started_mono = 0.0
        self.last_result = time.monotonic()  # when the validator last reported
        self.drain_start: float | None = None  # when training ended with results still to come
        self.stopping = False  # stop() is delivering the validator's last results
        self.closed = False  # stopped for good: never restarted

    # ------------------------------------------------------------ pipelines

    def ledger(self, name: str) -> SnapshotLedger:
        return self.ledgers.setdefault(name, SnapshotLedger())

    def snapshot_dir(self, name: str) -> Path:
        return self.snapshot_root / name

    def start_for(self, plan: ValidationPlan) -> None:
        """Make sure a validator runs when a config validates in the background (one per session)."""
        if plan.mode == "background" and self.plan is None:
            self.plan = plan
            self._launch()

    def on_snapshot(self, name: str, event: SnapshotTaken) -> list[Event]:
        """The events a worker's hand-off report becomes."""
        if self.ledger(name).taken(event):
            return [event]
        return [event, SnapshotSkipped(pipeline=name, seq=event.seq, epoch=event.epoch, step=event.step,
                                       reason=SKIPPED_NEWER)]

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

    # ------------------------------------------------------------ waiting for results

    def pending(self, training_done: bool) -> bool:
        """Whether results are still to come that the run should wait for."""
        if self.plan is None or self.closed or self.failures >= GIVE_UP:
            return False  # no validator, or one that keeps dying: the run must still end
        waiting = {n: l for n, l in self.ledgers.items() if l.waiting}
        if not waiting:
            return False
        now = time.monotonic()
        if not training_done:
            self.drain_start = None
            return True
        if self.drain_start is None:
            self.drain_start = now
        if now - max(self.last_result, self.drain_start) > DRAIN:
            self.abandon(f"no validation result within {DRAIN:g}s")
            return False
        return True

    def abandon(self, reason: str) -> None:
        """Record every snapshot still unscored as skipped (say, /dev/shm was cleared under us)."""
        for name, ledger in self.ledgers.items():
            for seq, (epoch, step) in sorted(ledger.handed.items()):
                self._publish(SnapshotSkipped(pipeline=name, seq=seq, epoch=epoch, step=step, reason=reason))
            ledger.handed.clear()

    # ------------------------------------------------------------ the process

    def tick(self, now: float) -> None:
        """Notice a dead validator, and restart it once its backoff is over."""
        if self.plan is None or self.closed:
            return
        if self.handle is not None:
            code = self.handle.poll()
            if code is not None:
                self._died(code)
        elif self.restart_at is not None and now >= self.restart_at:
            self._launch()

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask the validator to finish and wait up to `timeout` seconds; its last results are delivered.

        It is not restarted afterwards.
        """
        self.closed = True
        handle = self.handle
        if handle is None:
            return
        self.stopping = True
        try:
            handle.send(Stop(reason="shutdown"))
            end = time.monotonic() + timeout
            while handle.poll() is None and time.monotonic() < end:
                await asyncio.sleep(0.02)
            self._events(handle, handle.drain())
            handle.close()
            self.handle = None
        finally:
            self.stopping = False

    def _launch(self) -> None:
        assert self.plan is not None
        if self.attempt == 0:
            claim_root(self.snapshot_root)
        self.attempt += 1
        self.restart_at = None
        directory = self.run_dir / "validator"
        plan = self.plan
        spec = LaunchSpec(
            child=ValidatorSpec(snapshot_root=str(self.snapshot_root), device=plan.device, threads=plan.threads,
                                directory=str(directory), attempt=self.attempt),
            log_path=directory / "log.txt", gpu_index=plan.gpu.index if plan.gpu is not None else None)
        try:
            handle = self._launcher.launch(spec)
        except OSError as exc:
            self._publish(Notice(level="error", text=f"could not start the validator: {exc}"))
            self._died()
            return
        self.handle = handle
        self.started_mono = time.monotonic()
        self._publish(ValidatorStarted(pid=handle.pid, device=plan.label, attempt=self.attempt))
        handle.attach(lambda events, handle=handle: self._events(handle, events))

    def _died(self, code: int | None = None) -> None:
        if self.handle is not None:
            self._events(self.handle, self.handle.drain())
            self.handle.close()
            self.handle = None
        healthy = time.monotonic() - self.started_mono > HEALTHY
        self.failures = 1 if healthy else self.failures + 1
        first, longest = BACKOFF
        delay = min(first * 2 ** (self.failures - 1), longest)
        self.restart_at = time.monotonic() + delay
        how = "" if code is None else (f" (killed by {signal.Signals(-code).name})" if code < 0 and
                                       -code in signal.Signals._value2member_map_ else f" (exit code {code})")
        self._publish(Notice(level="error", text=f"validator exited{how}; restarting in {delay:g}s; "
                                                 "training goes on and the snapshots it misses are recorded as skipped"))

    def _events(self, handle: Handle, events: list[Event]) -> None:
        if self.handle is not handle:
            return  # a late batch from a validator already reaped
        for event in events:
            name = getattr(event, "pipeline", "")
            known = name in self.ledgers
            if isinstance(event, ValResult):
                self.last_result = time.monotonic()
                if known:
                    ledger = self.ledger(name)
                    if event.seq == 0 and event.error:
                        ledger.broken = True
                    for seq, epoch, step in ledger.resolve(event.seq):
                        self._publish(SnapshotSkipped(pipeline=name, seq=seq, epoch=epoch, step=step,
                                                      reason=SKIPPED_NEWER))
                    self._on_result(name, event)
                    continue
            if isinstance(event, EarlyStop) and known:
                self._on_early_stop(name, event)
                continue
            self._publish(event)
