"""Promoting ASHA's decisions on scripted results (the ASHA paper's algorithm): a trial outside the best
1/reduction_factor of its rung pauses there, is promoted as the rung fills, and is cut only once nothing else
can run; a trial that starts slow and ends best survives where stopping ASHA cuts it."""
from __future__ import annotations

import math

from torchherd.engine.protocol.states import WorkerState, ended_label
from torchherd.engine.supervise.sweep.pruning import Asha, PromotingAsha
from tests.scripted import PolicySession


def test_the_first_at_a_rung_pauses_and_the_second_better_one_goes_on():
    asha = PromotingAsha([1, 2], 2, "val_loss", "min")
    first = asha.result("a", 1.0, 0.30)
    assert first.pause and not first.prune and asha.paused == {"a": 1}
    assert first.reason == ("val_loss 0.3 at epoch 1, waits for more trials at rung 1 "
                            "(the best 1 of every 2 go on; 1 so far)")
    second = asha.result("b", 1.0, 0.20)  # best 1 of 2: it goes on at once
    assert not second.pause and second.reason == "val_loss 0.2 at epoch 1, among the best 1 of 2"
    assert asha.promotions() == []  # 'a' is second of 2: it still waits


def test_a_paused_trial_is_promoted_once_the_rung_has_filled_enough():
    asha = PromotingAsha([1, 2], 2, "val_loss", "min")
    asha.result("a", 1.0, 0.30)
    asha.result("b", 1.0, 0.20)
    asha.result("c", 1.0, 0.50)
    assert asha.result("d", 1.0, 0.60).pause
    [(name, verdict)] = asha.promotions()  # best 2 of 4 are b (gone on) and a (waiting)
    assert name == "a" and verdict.rung == 1 and verdict.cutoff == 0.30
    assert verdict.reason == "val_loss 0.3 at epoch 1, now among the best 2 of 4: promoted"
    assert asha.paused == {"c": 1, "d": 1} and asha.promotions() == []


def test_higher_rungs_promote_first_and_nan_never_qualifies():
    asha = PromotingAsha([1, 2], 2, "val_loss", "min")
    asha.result("a", 1.0, 0.1)
    asha.result("b", 2.0, 0.1)  # a result that skipped rung 1 waits at rung 2
    asha.result("c", 2.0, 0.2)
    asha.result("d", 1.0, 0.2)
    asha.result("e", 1.0, math.nan)
    assert asha.paused == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 1}
    assert [(n, v.rung) for n, v in asha.promotions()] == [("b", 2), ("a", 1)]
    asha.result("f", 1.0, 0.3)  # 4 at rung 1: its best 2 are a and d
    assert [n for n, _ in asha.promotions()] == ["d"]
    assert asha.paused == {"c": 2, "e": 1, "f": 1}


def test_when_nothing_else_can_run_every_waiting_trial_is_cut_with_why():
    asha = PromotingAsha([1], 3, "val_loss", "min")
    for name, value in (("a", 0.3), ("b", 0.2), ("c", 0.5)):
        asha.result(name, 1.0, value)
    asha.promotions()
    cut = asha.unpromoted()
    assert [n for n, _ in cut] == ["a", "c"] and all(v.prune for _, v in cut)
    assert cut[0][1].reason == "val_loss 0.3 at epoch 1, never among the best 1 of the 3 trials that reached rung 1"
    assert asha.paused == {}


def test_forget_takes_a_trial_off_the_waiting_list():
    asha = PromotingAsha([1], 2, "val_loss", "min")
    asha.result("a", 1.0, 0.3)
    asha.forget("a")
    assert asha.paused == {} and "a" in asha.promoted[1]


def _scripted(rule, order):
    """Feed results in `order` (trial, epoch, value); whoever is cut stops reporting. Returns the survivors."""
    cut = set()
    for trial, t, value in order:
        if trial in cut:
            continue
        verdict = rule.result(trial, t, value)
        if verdict is not None and verdict.prune:
            cut.add(trial)
    return {t for t, _, _ in order} - cut


def test_a_trial_that_starts_slow_and_ends_best_is_cut_by_stopping_asha_only():
    # One slot: 'fast' trains first and sets the rung; 'slow' is behind it at epoch 1, best at epoch 4.
    curves = {"fast": [1.0, 0.9, 0.8, 0.7], "slow": [1.1, 0.6, 0.3, 0.1], "bad1": [2.0] * 4, "bad2": [3.0] * 4}
    order = [(n, e + 1.0, v) for n in curves for e, v in enumerate(curves[n])]
    assert "slow" not in _scripted(Asha([1, 2], 2, "val_loss", "min"), order)
    promoting = PromotingAsha([1, 2], 2, "val_loss", "min")
    for n, t, v in order[:5]:  # fast to epoch 1 (pauses), slow to epoch 1 (pauses)
        promoting.result(n, t, v)
    assert promoting.paused == {"fast": 1, "slow": 1}
    promoting.promotions()  # fast is best 1 of 2: promoted
    promoting.result("bad1", 1.0, 2.0)
    promoting.result("bad2", 1.0, 3.0)
    assert [n for n, _ in promoting.promotions()] == ["slow"]  # best 2 of 4 now


def test_a_paused_trial_reads_waiting_at_its_rung():
    assert ended_label("waiting_at_rung", 2.0) == "waiting at rung 2"
    assert ended_label("pruned") == "pruned" and not WorkerState.WAITING_AT_RUNG.final


def test_the_pipeline_table_shortens_a_paused_trial_to_its_column():
    from torchherd.engine.protocol.progress import PipelineProgress
    from torchherd.tui.widgets.pipeline_table import state_text

    row = PipelineProgress(name="t", state=WorkerState.WAITING_AT_RUNG, rung=2.0,
                           finish_reason="val_loss 0.3 at epoch 2")
    assert state_text(row, 0.0) == "waiting at rung 2" and state_text(row, 0.0, 10) == "waits r2"


def test_the_sweep_view_says_paused_and_promoted_in_a_trial_reasons():
    from torchherd.engine.protocol.messages import TrialDecision
    from torchherd.tui.ranking import TrialRow, fold_trial

    row = TrialRow("t", {})
    for action in ("pause", "promote"):
        fold_trial(row, TrialDecision(pipeline="t", action=action, rung=1, value=0.3, reason="why"), "val_loss", "min")
    assert row.reasons == ["rung 1: paused: why", "rung 1: promoted: why"]


def test_when_nothing_else_can_run_a_rung_that_let_none_go_on_promotes_its_best():
    # 8 trials, rungs 1, 2, 4, 8 of 16 epochs: one trial reaches rung 8 and no other can; it trains to the end.
    asha = PromotingAsha([1, 2, 4, 8], 2, "val_loss", "min")
    asha.result("a", 8.0, 0.2)
    asha.result("b", 4.0, math.nan)
    assert asha.promotions() == []
    [(name, verdict)] = asha.last_promotion()
    assert name == "a" and verdict.rung == 8 and verdict.reason.endswith("and no other can: promoted")
    assert asha.last_promotion() == []  # NaN is never promoted


async def test_a_trial_promoted_while_its_pause_took_effect_trains_on_when_the_last_trial_ends_with_it(tmp_path):
    # Regression: the sweep's settle (every trial ended) queued the promoted trial again, then found no trial
    # waking and cut the rest: the run finished, saying the trial was 'queued', and it never trained on.
    from torchherd.engine.protocol.states import WorkerState
    from torchherd.engine.supervise.sweep.sweeping import SweepPruner
    from tests.conftest import make_config

    sweep = {"space": {"params": {"lr": [0.1, 0.01]}}, "scheduler": "asha", "mode": "promote", "grace_period": 1,
             "reduction_factor": 2}
    session = PolicySession(make_config(tmp_path, [{"name": "t"}], sweep=sweep, defaults={"max_epochs": 4}), tmp_path)
    a, b = "t-lr0.1", "t-lr0.01"
    session.states = {a: WorkerState.RUNNING, b: WorkerState.RUNNING}
    pruner = SweepPruner(session.view, session.out, PromotingAsha([1, 2], 2, "val_loss", "min"))
    pruner._act(a, pruner.rule.result(a, 1.0, 0.3))  # first at rung 1: it pauses
    assert session.states[a] == WorkerState.STOPPING
    assert [(d.ending, d.rung) for d in session.stopped] == [(WorkerState.WAITING_AT_RUNG, 1)]  # it waits at rung 1
    pruner._act(b, pruner.rule.result(b, 1.0, 0.5))  # second and worse: it pauses, and a is promoted
    assert [(d.pipeline, d.action) for d in session.recorded] == [(a, "pause"), (b, "pause"), (a, "promote")]
    session.states = {a: WorkerState.WAITING_AT_RUNG, b: WorkerState.WAITING_AT_RUNG}  # both end, in one turn
    assert pruner.settle()  # the sweep goes on: a trains on
    assert session.requeued == [a] and pruner.rule.paused == {b: 1}  # b still waits: nothing is cut
