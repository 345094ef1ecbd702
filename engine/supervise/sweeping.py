"""A sweep's pruning in a live session: every `val_result` (the background validator's or inline) goes to the
sweep's scheduler (`pruning.py`), each verdict becomes a `trial_decision` event, and a pruned trial is stopped
(checkpoint first) into the final state `pruned`, so its slot goes to the next queued trial.

It reads the session only through the supervisor's public methods (tap, record, view, stop, restart).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..config.schema import RunConfig
from ..protocol.messages import EpochEnd, Event, TrainingStarted, TrialDecision, ValResult
from ..protocol.progress import metric_value
from ..protocol.states import WorkerState
from ..rundir.directory import read_events
from .pruning import Asha, MedianRule

S = WorkerState
JUDGED = (S.STARTING, S.RUNNING, S.PAUSED)  # live trials a prune can stop; results of others are only recorded


def scheduler_for(config: RunConfig) -> Asha | MedianRule | None:
    """The pruning rule `config`'s [sweep] asks for, on its [validation] metric; None without one."""
    sweep, v = config.sweep, config.validation
    if sweep is None or sweep.scheduler == "none":
        return None
    if sweep.scheduler == "median":
        return MedianRule(sweep.grace_period, sweep.min_trials, v.metric, v.metric_mode, sweep.rung_unit)
    limits = [p.max_epochs if sweep.rung_unit == "epoch" else p.max_steps for p in config.pipelines]
    limit = None if None in limits else max(limits)
    return Asha(sweep.rungs(limit), sweep.reduction_factor, v.metric, v.metric_mode, sweep.rung_unit)


class SweepPruner:
    """Feeds a session's validation results to its sweep's scheduler and prunes the trials it cuts."""

    def __init__(self, supervisor: Any, rule: Asha | MedianRule):
        self._sup, self.rule = supervisor, rule
        self._unit = supervisor.config.sweep.rung_unit
        self._metric = supervisor.config.validation.metric
        self.exempt: set[str] = set()  # trials a person promoted: never pruned again this session
        self._loop = asyncio.get_running_loop()

    @classmethod
    def attach(cls, supervisor: Any, run_dir: Path) -> "SweepPruner | None":
        """A pruner for `supervisor`'s sweep, fed the results already in `run_dir` (a resumed run) and then
        every new one; None when its config prunes nothing."""
        rule = scheduler_for(supervisor.config)
        if rule is None:
            return None
        pruner = cls(supervisor, rule)
        per_epoch: dict[str, int] = {}
        for event in read_events(run_dir):  # the rungs as they stood when the run was cut short
            if isinstance(event, (TrainingStarted, EpochEnd)):
                per_epoch[event.pipeline] = event.steps_per_epoch
            elif isinstance(event, ValResult):
                pruner._judge(event, per_epoch.get(event.pipeline, 0))
        supervisor.tap(pruner._on_event)
        return pruner

    def promote(self, name: str) -> None:
        """Never prune `name` again this session; a pruned trial is un-pruned and trains on from its
        checkpoint. Raises ValueError for a trial that ended otherwise (restart starts it again)."""
        state = self._sup.view(name).state
        if state.final and state != S.PRUNED:
            raise ValueError(f"{name} is {state.value}, not pruned: only a pruned trial or one still going can "
                             "be promoted (restart starts it again)")
        self.exempt.add(name)
        if state == S.PRUNED:
            self._sup.restart(name)  # PRUNED -> QUEUED: it trains on from its checkpoint

    def progress(self, event: ValResult, steps_per_epoch: int) -> float:
        """How far the weights scored had trained, in the sweep's unit (epochs from steps where known)."""
        if self._unit == "step":
            return float(event.step)
        return event.step / steps_per_epoch if steps_per_epoch else float(event.epoch + 1)

    def _judge(self, event: ValResult, steps_per_epoch: int):
        value = metric_value(event.metrics, self._metric)
        if event.error or value is None:
            return None
        return self.rule.result(event.pipeline, self.progress(event, steps_per_epoch), value)

    def _on_event(self, event: Event, line: bytes, kept: bool) -> None:
        if not isinstance(event, ValResult):
            return
        try:
            view = self._sup.view(event.pipeline)
        except KeyError:
            return
        verdict = self._judge(event, view.steps_per_epoch)
        if verdict is not None:  # acted on after this event has reached everyone, not inside its publishing
            self._loop.call_soon(self._act, event.pipeline, verdict)

    def _act(self, name: str, verdict) -> None:
        live = self._sup.view(name).state in JUDGED
        prune = verdict.prune and live and name not in self.exempt
        reason = verdict.reason if live or not verdict.prune else f"{verdict.reason} (it had ended already)"
        if verdict.prune and live and not prune:
            reason += " (promoted: never pruned)"
        self._sup.record(TrialDecision(pipeline=name, action="prune" if prune else "continue", rung=verdict.rung,
                                       value=verdict.value, cutoff=verdict.cutoff, reason=reason))
        if prune:
            self._sup.stop(name, reason=verdict.reason, ending=S.PRUNED)
