"""A sweep's pruning in a live session: every `val_result` (the background validator's or inline) goes to the
sweep's scheduler (`pruning.py`), each verdict becomes a `trial_decision` event, and a pruned trial is stopped
(checkpoint first) into the final state `pruned`, so its slot goes to the next queued trial. Promoting ASHA
stops a trial the same way into `waiting_at_rung` and queues it again once promoted.

A policy: it reads the session through a `SessionView` and sends its decisions to an `Outbox`.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from ...config.schema import RunConfig
from ...protocol.messages import EpochEnd, Event, PipelineFinished, TrainingStarted, TrialDecision, ValResult
from ...protocol.progress import metric_value
from ...protocol.states import WorkerState
from ...rundir.directory import read_events
from ..decisions import Outbox, Record, Requeue, SessionView, Stop
from .pruning import Asha, MedianRule, PromotingAsha, Verdict

S = WorkerState
JUDGED = (S.STARTING, S.RUNNING, S.PAUSED)  # live trials a prune can stop; results of others are only recorded


def scheduler_for(config: RunConfig) -> Asha | PromotingAsha | MedianRule | None:
    """The pruning rule `config`'s [sweep] asks for, on its [validation] metric; None without one."""
    sweep, v = config.sweep, config.validation
    if sweep is None or sweep.scheduler in ("none", "pbt"):  # PBT prunes nothing: supervise/exploiting.py
        return None
    if sweep.scheduler == "median":
        return MedianRule(sweep.grace_period, sweep.min_trials, v.metric, v.metric_mode, sweep.rung_unit)
    limits = [p.max_epochs if sweep.rung_unit == "epoch" else p.max_steps for p in config.pipelines]
    limit = None if None in limits else max(x for x in limits if x is not None)
    kind = PromotingAsha if sweep.mode == "promote" else Asha
    return kind(sweep.rungs(limit), sweep.reduction_factor, v.metric, v.metric_mode, sweep.rung_unit)


class SweepPruner:
    """Feeds a session's validation results to its sweep's scheduler and prunes the trials it cuts."""

    def __init__(self, session: SessionView, out: Outbox, rule: Asha | MedianRule):
        self._session, self._out, self.rule = session, out, rule
        sweep = session.config.sweep
        assert sweep is not None, "a pruner is a sweep's"
        self._unit = sweep.rung_unit
        self._metric = session.config.validation.metric
        self.exempt: set[str] = set()  # trials a person promoted: never pruned again this session
        self.epoch_ends: dict[str, dict[int, int]] = {}  # trial -> epoch (from 0) -> the step it ended at
        self.waking: set[str] = set()  # promoted from a pause, queued again once their pause has ended

    @classmethod
    def attach(cls, session: SessionView, out: Outbox, run_dir: Path) -> SweepPruner | None:
        """A pruner for the session's sweep, fed the results already in `run_dir` (a resumed run); it observes
        every new event once tapped (`on_event`). None when its config prunes nothing."""
        rule = scheduler_for(session.config)
        if rule is None:
            return None
        pruner = cls(session, out, rule)
        per_epoch: dict[str, int] = {}
        decisions: list[TrialDecision] = []
        ended: dict[str, float] = {}  # when each pipeline last ended
        for event in read_events(run_dir):  # the rungs as they stood when the run was cut short
            if isinstance(event, (TrainingStarted, EpochEnd)):
                per_epoch[event.pipeline] = event.steps_per_epoch
                if isinstance(event, EpochEnd):
                    pruner._ended(event)
            elif isinstance(event, ValResult) and not isinstance(rule, PromotingAsha):
                pruner._judge(event, per_epoch.get(event.pipeline, 0))
            elif isinstance(event, TrialDecision):
                decisions.append(event)
            elif isinstance(event, PipelineFinished):
                ended[event.pipeline] = event.time
        if isinstance(rule, PromotingAsha):
            pruner._restore(decisions, ended)
        return pruner

    @property
    def restarts_trials(self) -> bool:
        """Its pauses and promotions start trials again (promoting ASHA); stopping ASHA's cuts are for good."""
        return isinstance(self.rule, PromotingAsha)

    @property
    def _promoting(self) -> PromotingAsha:
        """The rule, in what only promoting ASHA reaches (rungs, pauses and promotions)."""
        assert isinstance(self.rule, PromotingAsha), "promoting ASHA's step taken under another rule"
        return self.rule

    def _restore(self, decisions: list[TrialDecision], ended: dict[str, float]) -> None:
        """Promoting ASHA's rungs, pauses and promotions as its decisions left them: paused trials stay paused
        (they kept their state, waiting_at_rung), one promoted whose pause had ended but that had not started again is
        queued now, and one paused that `resume --only` names trains on, promoted by a person."""
        last: dict[str, TrialDecision] = {}
        for d in decisions:
            rung = int(d.rung)
            if d.action in ("continue", "pause") and rung in self._promoting.recorded:  # a result judged at its rung
                self._promoting.recorded[rung][d.pipeline] = d.value
                self._promoting.at[rung][d.pipeline] = d.at if d.at is not None else d.rung
            if d.action in ("continue", "promote") and rung in self._promoting.promoted:
                self._promoting.promoted[rung].add(d.pipeline)
            last[d.pipeline] = d
        self._promoting.paused = {n: int(d.rung) for n, d in last.items() if d.action == "pause"}
        for name, d in last.items():
            state = self._session.view(name).state
            if d.action == "promote" and state == S.WAITING_AT_RUNG:
                self.waking.add(name)
            elif d.action == "pause" and state == S.QUEUED and ended.get(name, 0.0) > d.time:  # --only NAME
                self.exempt.add(name)
                self._promoting.forget(name)
            elif d.action == "pause" and state == S.QUEUED:  # cut short while its pause took effect
                self._out.send(Stop(name, d.reason, S.WAITING_AT_RUNG, rung=d.rung))
        self._wake()

    def promote(self, name: str) -> None:
        """Never prune `name` again this session; a pruned or waiting trial trains on from its checkpoint.
        Raises ValueError for a trial that ended otherwise (restart starts it again)."""
        state = self._session.view(name).state
        if state.final and state != S.PRUNED:
            raise ValueError(f"{name} is {state.value}, not pruned: only a pruned trial or one still going can "
                             "be promoted (restart starts it again)")
        self.exempt.add(name)
        if isinstance(self.rule, PromotingAsha):
            self.rule.forget(name)
            if state == S.STOPPING:  # its pause is taking effect: it trains on once that has ended
                self.waking.add(name)
        if state in (S.PRUNED, S.WAITING_AT_RUNG):
            self._out.send(Requeue(name))  # PRUNED/WAITING_AT_RUNG -> QUEUED: it trains on from its checkpoint

    def _ended(self, event: EpochEnd) -> None:
        self.epoch_ends.setdefault(event.pipeline, {})[event.epoch] = event.step

    def progress(self, event: ValResult, steps_per_epoch: int) -> float:
        """How far the weights scored had trained, in the sweep's unit: the end of the epoch the result is of
        when it scored the weights that epoch ended with, else epochs from steps where known."""
        if self._unit == "step":
            return float(event.step)
        # Not steps / steps_per_epoch there: a script resumed mid-sweep counts its first epoch's steps from 0
        # (an epoch of 60 steps, not 30), and its second epoch's result read as a first one's (issue 52).
        if self.epoch_ends.get(event.pipeline, {}).get(event.epoch) == event.step:
            return float(event.epoch + 1)
        return event.step / steps_per_epoch if steps_per_epoch else float(event.epoch + 1)

    def _judge(self, event: ValResult, steps_per_epoch: int) -> Verdict | None:
        value = metric_value(event.metrics, self._metric)
        if event.error or value is None:
            return None
        return self.rule.result(event.pipeline, self.progress(event, steps_per_epoch), value)

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        if isinstance(event, PipelineFinished) and event.pipeline in self.waking:
            self._out.later(self._wake)  # a promoted trial's pause has ended: it trains on
        if isinstance(event, EpochEnd):
            self._ended(event)
        if not isinstance(event, ValResult):
            return
        try:
            view = self._session.view(event.pipeline)
        except KeyError:
            return
        verdict = self._judge(event, view.steps_per_epoch)
        if verdict is not None:  # acted on after this event has reached everyone, not inside its publishing
            self._out.later(partial(self._act, event.pipeline, verdict))

    def _act(self, name: str, verdict: Verdict) -> None:
        if isinstance(self.rule, PromotingAsha):
            self._act_promoting(name, verdict)
            return
        live = self._session.view(name).state in JUDGED
        prune = verdict.prune and live and name not in self.exempt
        reason = verdict.reason if live or not verdict.prune else f"{verdict.reason} (it had ended already)"
        if verdict.prune and live and not prune:
            reason += " (promoted: never pruned)"
        self._out.send(Record(TrialDecision(pipeline=name, action="prune" if prune else "continue",
                                            rung=verdict.rung, value=verdict.value, cutoff=verdict.cutoff,
                                            reason=reason, at=verdict.at)))
        if prune:
            self._out.send(Stop(name, verdict.reason, S.PRUNED))

    def _act_promoting(self, name: str, verdict: Verdict) -> None:
        """Promoting ASHA: a trial goes on or pauses at its rung; then any paused trial that now qualifies
        is promoted."""
        live, action, reason = self._session.view(name).state in JUDGED, "continue", verdict.reason
        if verdict.pause and name in self.exempt:
            self._promoting.forget(name)
            reason += " (promoted: never paused)"
        elif verdict.pause and not live:
            self._promoting.forget(name)
            reason += " (it had ended already)"
        elif verdict.pause:
            action = "pause"
        self._out.send(Record(TrialDecision(pipeline=name, action=action, rung=verdict.rung, value=verdict.value,
                                            cutoff=verdict.cutoff, reason=reason, at=verdict.at)))
        if action == "pause":
            self._out.send(Stop(name, verdict.reason, S.WAITING_AT_RUNG, rung=verdict.rung))
        self._promote()

    def _promote(self, last: bool = False) -> int:
        """Promote the paused trials that qualify now (`last`: nothing else can run, `last_promotion`);
        returns how many were."""
        promoted = self._promoting.promotions() or (self._promoting.last_promotion() if last else [])
        for name, verdict in promoted:
            self._out.send(Record(TrialDecision(pipeline=name, action="promote", rung=verdict.rung,
                                                value=verdict.value, cutoff=verdict.cutoff, reason=verdict.reason,
                                                at=verdict.at)))
            self.waking.add(name)
        self._wake()
        return len(promoted)

    def _wake(self) -> None:
        """Queue again each promoted trial whose pause has ended (one still stopping waits for its end)."""
        for name in sorted(self.waking):
            if self._session.view(name).state.ended:
                self.waking.discard(name)
                self._out.send(Requeue(name))  # WAITING_AT_RUNG -> QUEUED: it trains on from its checkpoint

    def settle(self) -> bool:
        """Every trial has ended and every result is in: promote whoever qualifies now (True: the sweep goes
        on), else cut the trials still paused, for good (False)."""
        if not isinstance(self.rule, PromotingAsha):
            return False
        waking = bool(self.waking)  # promoted while its pause took effect: every pause has ended, so _promote
        if self._promote(last=True) or waking:  # queues them again (and empties `waking`)
            return True
        for name, verdict in self.rule.unpromoted():
            self._out.send(Record(TrialDecision(pipeline=name, action="prune", rung=verdict.rung, value=verdict.value,
                                                cutoff=verdict.cutoff, reason=verdict.reason, at=verdict.at)),
                           Stop(name, verdict.reason, S.PRUNED))  # WAITING_AT_RUNG -> PRUNED, for good
        return False
