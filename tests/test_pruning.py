"""The sweep schedulers' decisions (ASHA, the median rule) on scripted results: who is pruned at which rung,
and why, in the words events.jsonl keeps."""
from __future__ import annotations

import math

import pytest

from torchherd.engine.supervise.sweep.pruning import Asha, MedianRule, percentile, worse


def test_percentile_interpolates_as_numpy():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 25) == 5.0
    assert percentile([4.0, 1.0, 3.0], 0) == 1.0


def test_worse_follows_the_mode_and_nan_is_worst():
    assert worse(0.5, 0.3, "min") and not worse(0.3, 0.5, "min")
    assert worse(0.3, 0.5, "max") and not worse(0.3, 0.3, "min")
    assert worse(math.nan, 1.0, "min") and worse(math.nan, 1.0, "max")


def test_asha_keeps_the_first_at_a_rung_and_cuts_a_worse_one():
    asha = Asha([1, 2, 4], 2, "val_loss", "min")
    first = asha.result("a", 1.0, 0.30)
    assert not first.prune and first.cutoff is None and first.reason == "val_loss 0.3 at epoch 1, first at rung 1"
    worse_one = asha.result("b", 1.0, 0.40)
    assert worse_one.prune and worse_one.cutoff == pytest.approx(0.30)
    assert worse_one.reason == "val_loss 0.4 at epoch 1, rung cut 0.3"
    better = asha.result("c", 1.0, 0.10)
    assert not better.prune and better.reason.endswith("(kept: best 1/2)")


def test_a_verdict_on_weights_handed_off_mid_epoch_says_epochs_trained_not_a_fractional_epoch():
    # Regression: a prune reason said "at epoch 2.25".
    asha = Asha([1, 2, 4], 2, "val_loss", "min")
    asha.result("a", 2.0, 0.30)
    assert asha.result("b", 2.25, 0.40).reason == "val_loss 0.4 after 2.25 epochs, rung cut 0.3"


def test_asha_judges_each_trial_once_per_rung_and_at_the_highest_reached():
    asha = Asha([1, 2, 4], 2, "val_loss", "min")
    assert asha.result("a", 1.0, 0.3).rung == 1
    assert asha.result("a", 1.5, 0.2) is None  # between rungs: nothing to judge
    assert asha.result("a", 1.0, 0.2) is None  # judged at rung 1 already
    late = asha.result("b", 4.0, 0.5)  # a result that skipped rungs is judged at the highest it reached
    assert late.rung == 4 and not late.prune
    assert "b" not in asha.recorded[1]


def test_asha_for_a_metric_to_maximize():
    asha = Asha([2], 3, "val_acc", "max", "step")
    for name, value in (("a", 0.9), ("b", 0.8), ("c", 0.7)):
        asha.result(name, 2.0, value)
    cut = asha.cutoff(2)
    assert cut == pytest.approx(percentile([0.9, 0.8, 0.7], 100 - 100 / 3))
    verdict = asha.result("d", 2.0, 0.75)
    assert verdict.prune and verdict.reason.startswith("val_acc 0.75 at step 2, rung cut")


def test_asha_prunes_a_nan_even_first():
    assert Asha([1], 2, "val_loss", "min").result("a", 1.0, math.nan).prune


def test_the_median_rule_waits_for_its_grace_and_its_peers():
    rule = MedianRule(grace_period=2, min_trials=2, metric="val_loss", mode="min")
    assert rule.result("a", 1.0, 0.5) is None  # before the grace period
    assert rule.result("a", 2.0, 0.4) is None  # nobody else got there
    rule.result("b", 1.0, 0.3)
    assert rule.result("b", 2.0, 0.2) is None  # one peer is too few
    rule.result("c", 2.0, 0.1)
    verdict = rule.result("a", 3.0, 0.45)  # a's best 0.4 against the median of b's 0.2 and c's 0.1
    assert verdict is None  # neither b nor c has reached 3 epochs
    rule.result("b", 3.0, 0.25)
    rule.result("c", 3.0, 0.15)
    verdict = rule.result("a", 3.0, 0.45)
    assert verdict.prune and verdict.cutoff == pytest.approx(0.15)
    assert verdict.reason == "val_loss 0.4 at epoch 3, median of 2 others 0.15"
    assert not rule.result("c", 3.0, 0.1).prune


def ray_tunes_verdicts(results, reduction_factor, mode, rungs):
    """Ray Tune's AsyncHyperBandScheduler bracket (ray/tune/schedulers/async_hyperband.py), restated: rewards
    are the metric signed so that more is better; at the highest rung reached and not yet recorded a trial
    stops when its reward is below the (1 - 1/rf) percentile of the rewards recorded there before it."""
    sign = -1.0 if mode == "min" else 1.0
    recorded = {r: {} for r in rungs}
    out = []
    for trial, t, value in results:
        verdict = None
        for rung in sorted(rungs, reverse=True):
            if t < rung or trial in recorded[rung]:
                continue
            seen = list(recorded[rung].values())
            cut = percentile(seen, (1 - 1 / reduction_factor) * 100) if seen else None
            verdict = cut is not None and sign * value < cut
            recorded[rung][trial] = sign * value
            break
        out.append(verdict)
    return out


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("reduction_factor", [2, 3, 4])
def test_asha_prunes_exactly_whom_ray_tunes_asha_stops(mode, reduction_factor):
    import random

    rng = random.Random(reduction_factor)
    rungs = [1, 2, 4]
    results = []
    for trial in range(40):  # trials start in turn; each reports epochs 1..6, interleaved with the others
        for epoch in range(1, 7):
            results.append((f"t{trial}", float(epoch), round(rng.uniform(0, 1), 2)))  # rounded: ties happen
    rng.shuffle(results)
    results.sort(key=lambda r: (r[1], int(r[0][1:])))  # each epoch's results arrive trial by trial
    asha = Asha(rungs, reduction_factor, "m", mode)
    ours = [v.prune if (v := asha.result(trial, t, value)) is not None else None for trial, t, value in results]
    assert ours == ray_tunes_verdicts(results, reduction_factor, mode, rungs)
    assert sum(bool(p) for p in ours) > 10  # it did prune
