"""The validation service: the session's background validators and the ledger of snapshots.

It starts the validator (and restarts it under the restart policy when it dies), routes its
results to the supervisor, and keeps, per pipeline, which snapshots were handed
off and which were scored, so that every snapshot ends either scored or recorded
as skipped, and a run waits (bounded) for the results still to come.

Locally there is one validator (node ""). On a cluster of several nodes the plan is
per node: snapshots stay in the shared memory of the worker's node, so each node that
hosts a validated worker gets its own validator, started when the first such worker
is placed there, watching a snapshot root of that node's own (named after the node, so
nodes that share one machine's /dev/shm, as a test cluster does, never mix).
"""
from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..config.schema import RestartConfig
from ..hardware.placement import ValidationPlan
from ..launch.backend import Backend, Handle, LaunchSpec
from ..protocol.messages import (
    EarlyStop,
    Event,
    Notice,
    SnapshotSkipped,
    SnapshotTaken,
    Stop,
    ValidatorStarted,
    ValResult,
    pipeline_of,
)
from ..protocol.names import Intent, ValidationMode
from ..protocol.spec import ValidatorSpec
from ..rundir.snapshots import claim_root
from .policy import RestartPolicy

DRAIN = 120.0  # seconds the run waits, all training done, for results that make no progress
# The validator's restarts, under the workers' restart policy: backoff from 1 s doubling to 30 s per death
# in a row, reset by one after 60 s of uptime; never out of budget, as training never waits on it.
VALIDATOR_RESTARTS = RestartConfig(backoff=1.0, backoff_max=30.0, min_uptime=60.0, max_restarts=sys.maxsize,
                                   max_failed_starts=sys.maxsize)
GIVE_UP = 3  # validator deaths in a row after which the run no longer waits for results
SKIPPED_NEWER = "a newer snapshot was validated first"
BEHIND_AFTER = 10  # skipped snapshots before "the validator falls far behind" can be said
SESSION_ENDED = "the session ended before the validator scored it"


@dataclass
class SnapshotLedger:
    """One pipeline's snapshots: handed off but not scored yet, and scored."""

    handed: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (epoch, step)
    scored: set[int] = field(default_factory=set)
    scored_max: int = 0
    seq_max: int = 0  # highest seq any attempt handed off: the next attempt numbers on from here
    broken: bool = False  # the validator cannot score this pipeline at all
    skipped: int = 0  # snapshots skipped because a newer one was scored first
    skipped_starting: int = 0  # of those, the ones the first score overtook: handed off while the validator started
    said_behind: bool = False  # the notice that the validator falls far behind went out
    best_file: str = "best.pt"  # the name of the best checkpoint the validator keeps (best.ckpt for Lightning)

    def far_behind(self) -> bool:
        """Whether the validator skips most of this pipeline's snapshots (said once). Those handed off before its
        first score are no lag of its (it was starting: torch, CUDA, the model) and do not count."""
        lagged = self.skipped - self.skipped_starting
        return not self.said_behind and lagged >= BEHIND_AFTER and lagged >= 4 * len(self.scored)

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
        self.skipped += len(skipped)
        self.handed.pop(seq, None)
        if seq and not self.scored:
            self.skipped_starting = len(skipped)
        if seq:
            self.scored.add(seq)
            self.scored_max = max(self.scored_max, seq)
        return skipped

    @property
    def waiting(self) -> bool:
        return bool(self.handed) and not self.broken


def far_behind_text(ledger: SnapshotLedger) -> str:
    """What a validator that scores only a few of a pipeline's snapshots means, and what would help."""
    scored, total = len(ledger.scored), len(ledger.scored) + ledger.skipped
    return (f"the validator scored {scored} of {total} snapshots so far (the rest were overtaken by newer ones): "
            f"patience counts only those it scored and {ledger.best_file} is the best of those; validate less often "
            "(every_n_epochs, every_n_steps), give it more threads ([validation] threads) or a GPU of its own")


class Validator:
    """One node's validator process: its handle, attempts and restart backoff."""

    def __init__(self, node: str, root: Path):
        self.node, self.root = node, root
        self.handle: Handle | None = None
        self.attempt = 0
        self.restart_at: float | None = None
        self.failures = 0  # deaths in a row (one after a healthy run counts 1); sets the backoff
        self.started_mono = 0.0
        self.announced = False  # validator_started went out for this attempt
        self.resting = False  # ended because no live pipeline needed it; started again on demand


class ValidationService:
    """Runs the validators of a session and keeps the snapshot ledgers of its pipelines."""

    def __init__(self, *, backend: Backend, publish: Callable[[Event], None], run_dir: Path, snapshot_root: Path,
                 on_early_stop: Callable[[str, EarlyStop], None], clock: Callable[[], float] = time.monotonic):
        self._backend, self._publish = backend, publish  # publish: results, skips, the validator's own news
        self._clock = clock  # the supervisor's watched clock (watched.py): the validators' silence is judged on it
        self._policy = RestartPolicy(VALIDATOR_RESTARTS)
        self.run_dir, self.snapshot_root = run_dir, snapshot_root
        self._on_early_stop = on_early_stop
        self.ledgers: dict[str, SnapshotLedger] = {}
        self.plan: ValidationPlan | None = None
        self.validators: dict[str, Validator] = {}  # by node id; "" is this machine
        self.node_of: dict[str, str] = {}  # pipeline -> the node whose validator scores its snapshots
        self.last_result = clock()  # when a validator last reported
        self.drain_start: float | None = None  # when training ended with results still to come
        self.stopping = False  # stop() is delivering the validators' last results
        self.closed = False  # stopped for good: never restarted
        self._resting: asyncio.Task | None = None  # ending the validators of a finished run

    # ------------------------------------------------------------ pipelines

    def ledger(self, name: str) -> SnapshotLedger:
        return self.ledgers.setdefault(name, SnapshotLedger())

    def root_for(self, node: str) -> Path:
        """The snapshot root of `node`'s validator: the session's own root here, one named after the node there."""
        if not node:
            return self.snapshot_root
        return self.snapshot_root.with_name(f"{self.snapshot_root.name}-{node[:12]}")

    def snapshot_dir(self, name: str, node: str = "") -> Path:
        return self.root_for(self._key(node)) / name

    def hand_off_dir(self, name: str, node: str = "", best_file: str = "best.pt") -> Path:
        """Where pipeline `name`'s worker on `node` hands its snapshots off (its runner's best checkpoint is
        `best_file`); starts that node's validator if it is the first validated worker placed there."""
        key = self._key(node)
        self.node_of[name] = key
        self.ledger(name).best_file = best_file
        if self.plan is not None and not self.closed and key not in self.validators:
            self.validators[key] = Validator(key, self.root_for(key))
            self._launch(self.validators[key])
        elif key in self.validators and self.validators[key].resting and not self.closed:
            self._launch(self.validators[key])  # work again after the run had finished
        return self.root_for(key) / name

    def _key(self, node: str) -> str:
        return node if self.plan is not None and self.plan.per_node else ""

    def start_for(self, plan: ValidationPlan) -> None:
        """Make sure a validator runs when a config validates in the background (one per session, or,
        per node, once a validated worker is placed there)."""
        if plan.mode == ValidationMode.BACKGROUND and self.plan is None:
            self.plan = plan
            if not plan.per_node:
                self.validators[""] = Validator("", self.snapshot_root)
                self._launch(self.validators[""])

    def on_snapshot(self, name: str, event: SnapshotTaken) -> list[Event]:
        """The events a worker's hand-off report becomes; the validators' results waiting unread are read first,
        so that a hand-off is never counted as unscored while its score waits in a channel (as it does for a
        while after this process was stopped: the worker and the validator both ran on meanwhile)."""
        self.read_results()
        if self.ledger(name).taken(event):
            return [event]
        self.ledger(name).skipped += 1
        return [event, SnapshotSkipped(pipeline=name, seq=event.seq, epoch=event.epoch, step=event.step,
                                       reason=SKIPPED_NEWER)]

    def read_results(self) -> None:
        """Deliver now what the running validators sent that waits unread."""
        for v in list(self.validators.values()):
            if v.handle is not None:
                v.handle.read_waiting()

    @property
    def handle(self) -> Handle | None:
        """A running validator's handle (this machine's first), or None when none runs."""
        live = [v.handle for v in self.validators.values() if v.handle is not None]
        live.sort(key=lambda h: bool(h.node))
        return live[0] if live else None

    # ------------------------------------------------------------ waiting for results

    def pending(self, training_done: bool) -> bool:
        """Whether results are still to come that the run should wait for."""
        if self.plan is None or self.closed:
            return False
        # A validator that keeps dying: the run must still end without its results.
        given_up = {k for k, v in self.validators.items() if v.failures >= GIVE_UP}
        waiting = {n: led for n, led in self.ledgers.items() if led.waiting and self.node_of.get(n, "") not in given_up}
        if not waiting:
            return False
        now = self._clock()
        if not training_done:
            self.drain_start = None
            return True
        if self.drain_start is None:
            self.drain_start = now
        if now - max(self.last_result, self.drain_start) > DRAIN:
            self.read_results()  # judged on all they sent: a result waiting unread is no silence
            if self._clock() - max(self.last_result, self.drain_start) > DRAIN:
                self.abandon(f"no validation result within {DRAIN:g}s")
                return False
        return True

    async def drain(self, deadline: float, interval: float) -> None:
        """Wait, until `deadline` (monotonic), for the scores of what the stopped workers handed off last."""
        while self.pending(training_done=True) and time.monotonic() < deadline and self.handle is not None:
            await asyncio.sleep(interval)

    def abandon(self, reason: str) -> None:
        """Record every snapshot still unscored as skipped (say, /dev/shm was cleared under us)."""
        for name, ledger in self.ledgers.items():
            for seq, (epoch, step) in sorted(ledger.handed.items()):
                self._publish(SnapshotSkipped(pipeline=name, seq=seq, epoch=epoch, step=step, reason=reason))
            ledger.handed.clear()

    def abandon_node(self, node: str, reason: str) -> None:
        """Record as skipped the snapshots handed off on `node` and not scored yet."""
        for name, ledger in self.ledgers.items():
            if self.node_of.get(name, "") != node:
                continue
            for seq, (epoch, step) in sorted(ledger.handed.items()):
                self._publish(SnapshotSkipped(pipeline=name, seq=seq, epoch=epoch, step=step, reason=reason))
            ledger.handed.clear()

    # ------------------------------------------------------------ the processes

    def tick(self, now: float) -> None:
        """Notice a dead validator, and restart it once its backoff is over."""
        if self.plan is None or self.closed:
            return
        for v in list(self.validators.values()):  # one whose node left is dropped
            if v.resting:
                continue
            if v.handle is not None:
                code = v.handle.poll()
                self._announce(v, force=code is not None)
                if code is not None:
                    self._died(v, code)
            elif v.restart_at is not None and now >= v.restart_at:
                self._launch(v)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask every validator to finish and wait up to `timeout` seconds; their last results are delivered.

        None is restarted afterwards; the snapshot roots on other nodes are removed.
        """
        self.closed = True
        if self._resting is not None:
            await self._resting  # their ending had begun when the run finished
        await self._end_running(timeout)
        remote = {v.node: str(v.root) for v in self.validators.values() if v.node}
        if remote:  # a cluster's: a task on each node
            await asyncio.to_thread(self._backend.remove_roots, remote)

    def rest_soon(self) -> None:
        """`rest` as a task of the running loop (`stop` waits for it)."""
        self._resting = asyncio.get_running_loop().create_task(self.rest())

    async def rest(self, timeout: float = 5.0) -> None:
        """No live pipeline needs a validator (the run finished): end them, so none holds a core or a CUDA
        context while the app stays open; the next validated worker placed (a restart) starts its node's again."""
        if self.closed or self.plan is None:
            return
        for v in self.validators.values():
            v.resting, v.restart_at = True, None
        await self._end_running(timeout)

    async def _end_running(self, timeout: float) -> None:
        """Stop every running validator (a Stop, then up to `timeout` s), delivering its last results."""
        running = [(v, v.handle) for v in self.validators.values() if v.handle is not None]
        self.stopping = True
        try:
            for _, handle in running:
                handle.send(Stop(reason="shutdown"))
            end = time.monotonic() + timeout
            while any(handle.poll() is None for _, handle in running) and time.monotonic() < end:
                await asyncio.sleep(0.02)
            for v, handle in running:  # (a restart meanwhile may have started a new one: that one stays)
                self._events(v, handle, handle.drain())
                handle.close()
                if v.handle is handle:
                    v.handle = None
        finally:
            self.stopping = False

    def _launch(self, v: Validator) -> None:
        assert self.plan is not None
        if v.attempt == 0 and not v.node:
            claim_root(v.root)  # on another node, the actor that first needs it there makes it
        v.attempt += 1
        v.restart_at, v.resting = None, False
        # a label may be "host/id" when hosts share a name: one folder per node, never nested
        directory = self.run_dir / ("validator" if not v.node else
                                    "validator-" + re.sub(r"[^\w.-]", "-", self._label(v.node)))
        plan = self.plan
        spec = LaunchSpec(
            child=ValidatorSpec(snapshot_root=str(v.root), device=plan.device, threads=plan.threads,
                                directory=str(directory), attempt=v.attempt),
            log_path=directory / "log.txt", gpu_index=plan.gpu.index if plan.gpu is not None else None,
            node=v.node)
        try:
            handle = self._backend.launch(spec)
        except OSError as exc:
            self._publish(Notice(level="error", text=f"could not start the validator{self._where(v)}: {exc}"))
            self._died(v)
            return
        v.handle, v.announced = handle, False
        v.started_mono = time.monotonic()
        self._announce(v)
        handle.attach(partial(self._events, v, handle))

    def _announce(self, v: Validator, force: bool = False) -> None:
        """validator_started, once its pid is known: at once locally; on a cluster when the actor has
        started the process (a tick or so later). `force`: now, with what is known."""
        if v.announced or v.handle is None or self.plan is None or (not v.handle.pids and not force):
            return
        v.announced = True
        self._publish(ValidatorStarted(pid=v.handle.pid, device=self.plan.label + self._where(v), attempt=v.attempt))

    def _where(self, v: Validator) -> str:
        return f" on node {self._label(v.node)}" if v.node else ""

    def _label(self, node: str) -> str:
        return self._backend.node_label(node) or node[:12]  # a cluster's names its nodes

    def _died(self, v: Validator, code: int | None = None) -> None:
        where = self._where(v)
        left = v.handle is not None and v.handle.cause == Intent.NODE_LEFT
        if v.handle is not None:
            self._events(v, v.handle, v.handle.drain())
            v.handle.close()
            v.handle = None
        if left:  # its snapshots went with the node; a worker placed elsewhere gets that node's validator
            del self.validators[v.node]
            self.abandon_node(v.node, "the node left the cluster")
            return
        decision = self._policy.decide(0, v.failures, uptime=time.monotonic() - v.started_mono)
        v.failures = max(decision.failed_starts, 1)  # a death after a healthy run is the first of a new streak
        delay = decision.delay
        v.restart_at = time.monotonic() + delay
        how = "" if code is None else (f" (killed by {signal.Signals(-code).name})" if code < 0 and
                                       -code in signal.Signals._value2member_map_ else f" (exit code {code})")
        self._publish(Notice(level="error", text=(
            f"validator{where} exited{how}; restarting in {delay:g}s; "
            "training goes on and the snapshots it misses are recorded as skipped")))

    def _events(self, v: Validator, handle: Handle, events: list[Event]) -> None:
        if v.handle is not handle:
            return  # a late batch from a validator already reaped
        for event in events:
            name = pipeline_of(event)
            known = name in self.ledgers
            if isinstance(event, ValResult):
                self.last_result = self._clock()
                if known:
                    ledger = self.ledger(name)
                    if event.seq == 0 and event.error:
                        ledger.broken = True
                    for seq, epoch, step in ledger.resolve(event.seq):
                        self._publish(SnapshotSkipped(pipeline=name, seq=seq, epoch=epoch, step=step,
                                                      reason=SKIPPED_NEWER))
                    self._publish(event)
                    if ledger.far_behind():
                        ledger.said_behind = True
                        self._publish(Notice(pipeline=name, level="warning", text=far_behind_text(ledger)))
                    continue
            if isinstance(event, EarlyStop) and known:
                self._on_early_stop(name, event)
                continue
            self._publish(event)
