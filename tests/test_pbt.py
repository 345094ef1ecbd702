"""PBT's rule apart from any process (engine/supervise/sweep/pbt.py): quantiles, exploration, when a trial takes over
another's checkpoint, the schedules folded from its decisions; its config keys and a retuned trial."""
from __future__ import annotations

import hashlib
import os
import random

import pytest

from torchherd.engine.config.problems import ConfigError
from torchherd.engine.config.trials import retuned
from torchherd.engine.protocol.messages import TrialDecision
from torchherd.engine.supervise.sweep.exploiting import STAGED, checksum, stage, unstage
from torchherd.engine.supervise.sweep.pbt import Pbt, explore, quantiles, schedules
from torchherd.tui.ranking import lineage
from tests.conftest import make_config
from tests.scripted import PolicySession


def rule(**kw) -> Pbt:
    out = Pbt({"params.lr": [0.1, 0.01]}, kw.pop("interval", 2), kw.pop("fraction", 0.25), {}, "val_loss", "min",
              seed=kw.pop("seed", 0))
    out.values = {n: {"params.lr": 0.1} for n in "abcd"}
    return out


def test_quantiles_are_a_share_of_the_trials_with_results_at_most_half():
    latest = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4, "e": float("nan")}
    assert quantiles(latest, 0.25, "min") == (["e", "d"], ["a", "b"])  # ceil(5 * 0.25) = 2; NaN is worst
    assert quantiles({"a": 0.1, "b": 0.2}, 0.5, "max") == (["a"], ["b"])
    assert quantiles({"a": 0.1}, 0.25, "min") == ([], [])  # one trial: nothing to compare with


def test_explore_perturbs_numbers_by_0_8_or_1_2_and_resamples_the_rest():
    space = {"params.lr": [0.1, 0.01], "batch_size": [16, 64], "params.act": ["relu", "gelu"]}
    values = {"params.lr": 0.1, "batch_size": 32, "params.act": "relu"}
    seen = [explore(values, space, {}, random.Random(i)) for i in range(20)]
    assert {v["params.lr"] for v in seen} == {0.08, 0.12}  # 6 significant digits: no 0.08000000000000002
    assert {v["batch_size"] for v in seen} == {26, 38}  # a whole number stays whole
    assert {v["params.act"] for v in seen} == {"relu", "gelu"}
    resampled = {explore(values, space, {"params.lr": "resample"}, random.Random(i))["params.lr"] for i in range(20)}
    assert resampled == {0.1, 0.01}
    kept = [explore(values, space, {"batch_size": "keep"}, random.Random(i)) for i in range(20)]
    assert {v["batch_size"] for v in kept} == {32} and {v["params.lr"] for v in kept} == {0.08, 0.12}


def test_a_bottom_trial_at_its_perturbation_point_takes_over_a_better_top_one():
    pbt = rule()
    assert pbt.result("a", 1.0, 0.5, lambda n: True) is None  # alone, and before its point (interval 2)
    for name, value in (("b", 0.4), ("c", 0.3), ("d", 0.2)):
        assert pbt.result(name, 2.0, value, lambda n: True) is None  # not the worst when it got there
    ex = pbt.result("a", 2.0, 0.9, lambda n: True)
    assert ex is not None and ex.donor == "d" and ex.trial == "a" and ex.cutoff == 0.2
    assert ex.values["params.lr"] in (0.08, 0.12)
    assert "in the bottom 25%" in ex.reason and "takes over d's checkpoint" in ex.reason
    pbt.exploited("a", ex.values, 2.0)
    assert "a" not in pbt.latest and pbt.values["a"] == ex.values
    assert pbt.result("a", 3.0, 0.9, lambda n: True) is None  # its next point is at 4


def test_no_exploit_without_a_donor_that_can_give_or_that_is_better():
    pbt = rule()
    pbt.result("d", 2.0, 0.2, lambda n: True)
    assert pbt.result("a", 2.0, 0.9, lambda n: False) is None  # the top one has no checkpoint to copy
    alike = rule()
    alike.result("d", 2.0, 1.0, lambda n: True)
    assert alike.result("a", 2.0, 1.0, lambda n: True) is None  # a tie gives it nothing


def test_a_point_where_no_better_trial_had_a_checkpoint_yet_is_judged_again_once_one_has():
    # Regression: a bottom trial's result that came before its donor's checkpoint passed its perturbation point
    # with no exploit, and a PBT run could end with none (the 'keep' test failed so on loaded machines).
    pbt = rule()
    pbt.result("d", 2.0, 0.2, lambda n: True)
    assert pbt.result("a", 2.0, 0.9, lambda n: False) is None and pbt.open == {"a": 2.0}
    again = pbt.result("a", pbt.open["a"], pbt.latest["a"], lambda n: True)  # d's checkpoint is there now
    assert again is not None and (again.trial, again.donor, again.progress) == ("a", "d", 2.0) and pbt.open == {}


def _exploit(trial, donor, epoch, lr) -> TrialDecision:
    return TrialDecision(pipeline=trial, action="exploit", rung=epoch, value=1.0,
                         exploit={"donor": donor, "epoch": epoch, "step": epoch * 4, "values": {"params.lr": lr}})


def test_schedules_follow_each_final_trial_back_through_its_donors():
    initial = {"t-lr0.1": {"params.lr": 0.1}, "t-lr0.01": {"params.lr": 0.01}, "t-lr0.002": {"params.lr": 0.002}}
    decisions = [_exploit("t-lr0.01", "t-lr0.1", 1, 0.08), _exploit("t-lr0.002", "t-lr0.01", 3, 0.064)]
    out = schedules(initial, decisions, 4)
    assert [e["params.lr"] for e in out["t-lr0.1"]] == [0.1] * 4
    assert [e["params.lr"] for e in out["t-lr0.01"]] == [0.1, 0.08, 0.08, 0.08]
    assert [e["params.lr"] for e in out["t-lr0.002"]] == [0.1, 0.08, 0.08, 0.064]
    assert out["t-lr0.002"][0] == {"epoch": 1, "params.lr": 0.1}
    assert lineage(decisions[1]) == "from lr0.01@e3"


def test_pbt_keys_are_checked_by_name(tmp_path):
    space = {"params": {"lr": [0.1, 0.01]}, "batch_size": [16, 32]}
    config = make_config(tmp_path, [{"name": "t"}], sweep={"space": space, "scheduler": "pbt",
                                                            "explore": {"batch_size": "resample"}})
    assert config.sweep.describe(4, 3).endswith("PBT every 1 epoch (the bottom 25% take over a top 25% trial's "
                                                 "checkpoint, values explored)")
    with pytest.raises(ConfigError) as bad:
        make_config(tmp_path, [{"name": "t"}], sweep={"space": space, "scheduler": "asha", "quantile_fraction": 0.5,
                                                      "explore": {"params": {"wd": "perturb"}}})
    said = {p.key: p.message for p in bad.value.problems}
    assert "only PBT uses it" in said["sweep.quantile_fraction"]
    assert said["sweep.explore.params.wd"].startswith("is not a swept key")
    with pytest.raises(ConfigError) as bad:
        make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"act": ["relu", "gelu"]}},
                                                      "scheduler": "pbt", "explore": {"params": {"act": "perturb"}}})
    assert "not all numbers" in bad.value.problems[0].message
    with pytest.raises(ConfigError) as bad:
        make_config(tmp_path, [{"name": "t"}], sweep={"space": space, "scheduler": "pbt",
                                                      "explore": {"batch_size": "hold"}})
    assert bad.value.problems[0].message == "must be 'perturb', 'resample' or 'keep' (got 'hold')"
    make_config(tmp_path, [{"name": "t"}], sweep={"space": space, "scheduler": "pbt", "explore": {"batch_size": "keep"}})


def test_a_checkpoint_of_other_swept_values_that_does_not_fit_names_the_key_and_keep():
    from pathlib import Path

    from torch import nn

    from torchherd.engine.runners.task.state import _unfit

    with pytest.raises(RuntimeError) as real:  # torch's own words for another trial's wider model
        nn.Linear(4, 77).load_state_dict(nn.Linear(4, 64).state_dict())
    said = _unfit(real.value, Path("last.pt"), {"params.hidden": 64, "params.lr": 0.1},
                  {"params.hidden": 77, "params.lr": 0.12})
    assert said.startswith("checkpoint last.pt was written with params.hidden 64 (this attempt: 77)")
    assert 'explore = { params.hidden = "keep" }' in said and "size mismatch for weight" in said
    assert "params.lr" not in said  # an lr is rescaled on load, never a misfit
    assert _unfit(real.value, Path("last.pt"), {}, {"params.hidden": 77}) == str(real.value)  # not a trial's
    with pytest.raises(RuntimeError) as deeper:  # another depth: keys missing, not sizes
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).load_state_dict(nn.Sequential(nn.Linear(4, 1)).state_dict())
    said = _unfit(deeper.value, Path("last.pt"), {"params.depth": 1, "params.wd": 0.1},
                  {"params.depth": 2, "params.wd": 0.12})
    assert "params.depth 1 (this attempt: 2), params.wd 0.1 (this attempt: 0.12)" in said
    assert "whichever of these shapes the model" in said and "Missing key" in said


def test_a_retuned_trial_trains_with_the_new_values_and_a_script_passes_them_on(tmp_path):
    config = make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"lr": [0.1]}, "batch_size": [16]},
                                                           "scheduler": "pbt"})
    pipe = retuned(config.pipelines[0], {"params.lr": 0.08, "batch_size": 19})
    assert (pipe.params["lr"], pipe.batch_size, pipe.trial) == (0.08, 19, {"params.lr": 0.08, "batch_size": 19})
    script = tmp_path / "train.py"
    script.write_text("")
    config = make_config(tmp_path, [{"name": "s", "script": str(script), "task": None,
                                     "args": ["--lr={params.lr}", "--bs", "{batch_size}", "--epochs=3"]}],
                         sweep={"space": {"params": {"lr": [0.1]}, "batch_size": [16]}, "scheduler": "pbt"})
    pipe = retuned(config.pipelines[0], {"params.lr": 0.08, "batch_size": 19})
    assert pipe.args == ["--lr=0.08", "--bs", "19", "--epochs=3"]


def test_a_staged_copy_is_the_donors_newest_checkpoint_and_replaces_the_trials_own(tmp_path):
    donor, mine = tmp_path / "d" / "checkpoints", tmp_path / "r" / "checkpoints"
    donor.mkdir(parents=True)
    mine.mkdir(parents=True)
    (donor / "last.pt").write_bytes(b"donor at step 8")
    (donor / "prev.pt").write_bytes(b"donor at step 4")
    (mine / "last.pt").write_bytes(b"mine")
    (mine / "prev.pt").write_bytes(b"mine before")
    staged = tmp_path / "r" / STAGED
    assert stage(donor, staged, task=True) == hashlib.sha256(b"donor at step 8").hexdigest()
    (donor / ".last.new.pt").write_bytes(b"donor at step 12")  # the donor saves on, as save_checkpoint does
    os.replace(donor / "last.pt", donor / "prev.pt")
    os.replace(donor / ".last.new.pt", donor / "last.pt")
    unstage(staged, mine, task=True)
    assert sorted(p.name for p in mine.iterdir()) == ["last.pt"]  # no older file of its own to fall back to
    assert (mine / "last.pt").read_bytes() == b"donor at step 8" == (staged / "last.pt").read_bytes()

    (donor / "sub").mkdir()  # a script's own files, whatever their names
    (donor / "sub" / "model.bin").write_bytes(b"weights")
    (donor / ".tmp-partial").write_bytes(b"half")
    digest = stage(donor, staged, task=False)
    assert digest == checksum(staged) and not (staged / ".tmp-partial").exists()
    unstage(staged, mine, task=False)
    assert (mine / "sub" / "model.bin").read_bytes() == b"weights" and (mine / "last.pt").read_bytes() == \
        b"donor at step 12"


def test_the_ranking_shows_an_exploited_trials_new_values_and_lineage(tmp_path):
    from torchherd.tui.ranking import fold_trials, ranked_table
    from torchherd.engine.protocol.messages import TrainingStarted, ValResult

    config = make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"lr": [0.1, 0.01]}},
                                                           "scheduler": "pbt"})
    events = [ValResult(pipeline="t-lr0.1", epoch=1, step=8, metrics={"val_loss": 0.3}),
              ValResult(pipeline="t-lr0.01", epoch=1, step=4, metrics={"val_loss": 0.1}),
              ValResult(pipeline="t-lr0.01", epoch=1, step=8, metrics={"val_loss": 0.9}),
              _exploit("t-lr0.01", "t-lr0.1", 2, 0.08),
              ValResult(pipeline="t-lr0.01", epoch=1, step=8, metrics={"val_loss": 0.05}),  # its old weights'
              TrainingStarted(pipeline="t-lr0.01", epoch=2, step=8, epochs_total=4, steps_per_epoch=4, device="cpu",
                              parameters=1),
              ValResult(pipeline="t-lr0.01", epoch=3, step=16, metrics={"val_loss": 0.2})]
    rows = fold_trials(config, events)
    # Its best is of the weights it trains from the copy on (issue 52 item 12: its best before, or its old
    # weights' scored after the exploit, are not the trial's best.ckpt)
    assert [(r.name, r.values["params.lr"], r.lineage, r.best) for r in rows] == [
        ("t-lr0.01", 0.08, "from lr0.1@e2", 0.2), ("t-lr0.1", 0.1, "", 0.3)]
    lines = ranked_table(rows, "val_loss", tmp_path)
    assert lines[1].split() == ["#", "trial", "lr", "val_loss", "state", "lineage"]
    assert lines[2].split() == ["1", "t-lr0.01", "0.08", "0.2", "queued", "from", "lr0.1@e2"]


async def test_a_trials_own_saves_after_its_exploit_was_decided_are_never_offered_as_its_checkpoint(tmp_path):
    # Its old attempt checkpoints once more as it stops (and may finish an epoch's save): those files are replaced
    # by the copy it takes over, so a trial taking over *its* checkpoint before it saves again would be told one
    # step and epoch and get the copy's.
    from torchherd.engine.protocol.messages import CheckpointSaved, EpochEnd, TrainingStarted
    from torchherd.engine.supervise.decisions import SessionView
    from torchherd.engine.supervise.sweep.exploiting import PbtController
    from torchherd.engine.supervise.supervisor import Supervisor

    config = make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"lr": [0.1, 0.01]}},
                                                           "scheduler": "pbt", "perturbation_interval": 1})
    sup = Supervisor(config)
    out = PolicySession(config, sup.run_dir).out
    controller = PbtController(SessionView(config, sup.run_dir, sup.view, sup.views), out, rule())

    def saved(step, reason="epoch"):
        return CheckpointSaved(pipeline="t-lr0.01", path="last.pt", epoch=step // 4, step=step, reason=reason)

    def started(step):
        return TrainingStarted(pipeline="t-lr0.01", epoch=step // 4, step=step, epochs_total=5, steps_per_epoch=4,
                               device="cpu", parameters=2)

    controller._note(saved(4))
    assert controller._newest("t-lr0.01")[:2] == (4, 1)
    controller._decided(_exploit("t-lr0.01", "t-lr0.1", 1, 0.08))
    old_epoch = EpochEnd(pipeline="t-lr0.01", epoch=1, step=8, train_loss=1.0, duration=1.0, samples_per_s=None,
                         epochs_total=5, steps_per_epoch=4)
    assert controller._passes_point(old_epoch) is None  # its perturbation point is the copy's, not moved by it
    for event in (saved(8), saved(9, "stop"), started(4)):
        controller._note(event)
    assert controller._newest("t-lr0.01") is None and "t-lr0.01" not in controller.pending
    controller._note(saved(8))  # trained on from the copy
    assert controller._newest("t-lr0.01")[:2] == (8, 2) and controller._passes_point(old_epoch) == 2


async def test_an_exploit_decided_as_the_trials_yield_ends_applies_its_copy_before_it_queues_again(tmp_path):
    # Regression: a yielding trial's result (exploit queued) and its end (requeue queued) in one loop turn: the
    # exploit found it ended, not queued, and only staged the copy; the requeue started it from its own
    # checkpoint with its old values, and its next attempt's results were ignored as an exploit's still pending.
    import asyncio

    from torchherd.engine.protocol.messages import PipelineFinished
    from torchherd.engine.protocol.states import WorkerState
    from torchherd.engine.supervise.sweep.exploiting import PbtController
    from torchherd.engine.supervise.sweep.pbt import Exploit

    config = make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"lr": [0.1, 0.01]}},
                                                           "scheduler": "pbt", "perturbation_interval": 1})
    session = PolicySession(config, tmp_path / "run")
    trial, donor = "t-lr0.01", "t-lr0.1"
    (session.run_dir / donor / "checkpoints").mkdir(parents=True)
    (session.run_dir / donor / "checkpoints" / "last.pt").write_bytes(b"donor at step 4")
    (session.run_dir / trial / "checkpoints").mkdir(parents=True)
    (session.run_dir / trial / "checkpoints" / "last.pt").write_bytes(b"its own, at step 4")
    controller = PbtController(session.view, session.out, rule())
    controller.checkpoints[donor] = (4, 1, float("inf"))
    controller.yielding.add(trial)
    session.states = {trial: WorkerState.YIELDING, donor: WorkerState.RUNNING}  # its yield has just ended
    controller.on_event(PipelineFinished(pipeline=trial, status="yielding", epoch=1, step=4))
    controller._exploit(Exploit(trial=trial, donor=donor, progress=1.0, value=9.0, cutoff=1.0,
                                values={"params.lr": 0.12}, reason="bottom"))
    await asyncio.sleep(0)  # the yield's requeue, queued by its end
    await asyncio.sleep(0)
    assert session.requeued == [trial] and session.retuned == {trial: {"params.lr": 0.12}}
    assert (session.run_dir / trial / "checkpoints" / "last.pt").read_bytes() == b"donor at step 4"
    assert trial not in controller.staged  # its next TrainingStarted ends the exploit: its results count again


# Regression (issue 52 item 12): a Lightning trial took its donor's best.ckpt over with its checkpoint, so its
# "best" was another trial's weights and score.
def test_a_staged_copy_leaves_the_donors_best_checkpoint_behind_and_the_trials_own_goes(tmp_path):
    donor, mine = tmp_path / "d" / "checkpoints", tmp_path / "r" / "checkpoints"
    donor.mkdir(parents=True)
    mine.mkdir(parents=True)
    (donor / "last.ckpt").write_bytes(b"donor at step 8")
    (donor / "best.ckpt").write_bytes(b"donor's best")
    (mine / "best.ckpt").write_bytes(b"mine, before it took the donor's weights")
    stage(donor, tmp_path / "r" / STAGED, task=False, best="best.ckpt")
    unstage(tmp_path / "r" / STAGED, mine, task=False)
    assert sorted(p.name for p in mine.iterdir()) == ["last.ckpt"]  # the validator writes its best afresh


# Issue 52 item 9: the explored lr reaches every rate a restored optimizer and its schedule hold.
def test_scaling_the_lr_scales_every_param_groups_rates_and_the_schedulers_bases():
    import torch

    from torchherd.engine.worker.retune import lr_scale, scale_lrs

    params = [torch.nn.Parameter(torch.zeros(2))]
    sgd = torch.optim.SGD(params, lr=0.2)
    step = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.25)
    sgd.step()
    step.step()  # lr 0.05 of base 0.2: the donor's schedule, one step on
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    cycle = torch.optim.lr_scheduler.OneCycleLR(adam, max_lr=0.1, total_steps=10)
    assert lr_scale(0.2, 0.2) is None and lr_scale(None, 0.24) is None and lr_scale(0.2, True) is None
    scale = lr_scale(0.2, 0.24)
    scale_lrs([sgd, adam], [step, cycle], scale)
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.06) and step.base_lrs == [pytest.approx(0.24)]
    step.step()
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.24 * 0.25 ** 2)  # the schedule goes on, at the new rate
    assert adam.param_groups[0]["max_lr"] == pytest.approx(0.12)
    same = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=0.12)  # a cycle planned at 0.12 throughout
    planned = torch.optim.lr_scheduler.OneCycleLR(same, max_lr=0.12, total_steps=10)
    for opt, sched in ((adam, cycle), (same, planned)):
        opt.step()
        sched.step()
    assert adam.param_groups[0]["lr"] == pytest.approx(same.param_groups[0]["lr"])
