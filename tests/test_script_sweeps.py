"""Sweeps of a user's own scripts, with real script processes: a script that says nothing a pattern matches
is told so when it ends, and promoting ASHA judges a script's result at the rung of the epoch it belongs to,
in the same words from its pause to its verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_config
from tests.test_engine_runs import run_to_end
from torchherd.engine.protocol.messages import EpochEnd, Notice, PipelineFinished, TrialDecision, ValResult
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.runners.script.events import ScriptEvents
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.engine.supervise.sweep.pruning import PromotingAsha

SCRIPTS = Path(__file__).parent / "tasks" / "scripts"
PLAIN = str(SCRIPTS / "plain_loop.py")
RUNG = str(SCRIPTS / "rung_loop.py")


def of(events, cls, pipeline):
    return [e for e in events if isinstance(e, cls) and e.pipeline == pipeline]


# ------------------------------------------------------------ a pattern that never matches a short script


@pytest.mark.slow
async def test_a_short_script_whose_pattern_never_matches_is_told_so_when_it_ends(tmp_path):
    # Regression (issue 52): the notice came after 50 unmatched lines or 60 s; a script that printed six lines
    # and ended completed with 0 steps and no word.
    config = make_config(tmp_path, [{"name": "s", "script": PLAIN, "args": ["--epochs", "5", "--delay", "0"],
                                     "metrics": r"epoch=(?P<epoch>\d+)"}], validation={"mode": "off"},
                         telemetry={"enabled": False})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"s": "completed"}
    said = [n.text for n in of(read_events(sup.run_dir), Notice, "s") if "matched none" in n.text]
    assert len(said) == 1, said
    assert "'epoch=(?P<epoch>\\\\d+)'" in said[0] and "matched none of the 6 lines" in said[0], said
    assert "before it ended" in said[0] and "'Epoch 5, Loss: 0.2000'" in said[0], said


# ------------------------------------------------------------ the epoch a script's result belongs to


def test_a_val_line_is_of_the_epoch_it_names_or_that_just_ended_not_the_one_in_progress():
    events = ScriptEvents("p", epochs_total=4)
    for step in (1, 2, 3):
        events.from_match({"step": str(step), "loss": "0.5"})
    [end] = events.from_match({"epoch": "1"})
    after = events.val_from_match({"loss": "0.3"})  # printed after `saved epoch 1`, before any step of epoch 2
    assert (end.epoch, end.step) == (0, 3) and (after.epoch, after.step) == (0, 3)
    events.from_match({"step": "4", "loss": "0.5"})
    late = events.val_from_match({"epoch": "1", "loss": "0.3"})  # names epoch 1, printed during epoch 2
    assert (late.epoch, late.step) == (0, 3)
    now = events.val_from_match({"loss": "0.3"})  # mid-epoch, no epoch named: the weights it has now
    assert (now.epoch, now.step) == (1, 4)


def test_a_result_judged_past_its_rung_is_worded_alike_from_its_pause_to_its_verdict():
    # Regression (issue 52): the pause said 'at epoch 3', the final verdict on the same result 'at epoch 2'.
    asha = PromotingAsha([1, 2], 2, "val_loss", "min")
    paused = asha.result("a", 2.25, 0.3)
    assert paused.pause and paused.reason.startswith("val_loss 0.3 after 2.25 epochs, waits")
    [(_, cut)] = asha.unpromoted()
    assert cut.reason == "val_loss 0.3 after 2.25 epochs, never among the best 0 of the 1 trials that reached rung 2"
    assert cut.at == 2.25


def rung_sweep(tmp_path: Path, delay: float) -> Supervisor:
    """Four trials of rung_loop.py (lower quality is better at every epoch), promoting ASHA at epochs 1 and 2
    of 4, one slot: trials start in grid order."""
    pipe = {"name": "r", "script": RUNG, "resume_args": ["--resume"],
            "args": ["--quality", "{params.q}", "--out", "{checkpoint_dir}", "--delay", str(delay)],
            "metrics": [r"step (?P<step>\d+) loss (?P<loss>[\d.]+)", r"saved epoch (?P<epoch>\d+)"],
            "val_metrics": r"val epoch (?P<epoch>\d+) val_loss (?P<loss>[\d.]+)"}
    sweep = {"space": {"params": {"q": [0.2, 0.1, 0.3, 0.4]}}, "scheduler": "asha", "mode": "promote",
             "grace_period": 1, "reduction_factor": 2}
    return Supervisor(make_config(tmp_path, [pipe], sweep=sweep, devices={"cpu_slots": 1},
                                  defaults={"max_epochs": 4}, telemetry={"enabled": False}, tensorboard=False))


@pytest.mark.slow
async def test_a_promoted_script_is_judged_at_rung_2_on_its_second_epochs_result(tmp_path):
    # Regression (issue 52): a script printing `saved epoch N`, then `val epoch N val_loss X`, promoted from
    # rung 1, was judged at rung 2 on its third epoch's result: resumed, its first epoch ended at step 6 of its
    # count, read as a 6-step epoch, so its second epoch's result was taken for a first one's.
    sup = rung_sweep(tmp_path, delay=0.3)
    statuses = await run_to_end(sup, timeout=240)
    a, b = "r-q0.2", "r-q0.1"
    assert statuses == {a: "pruned", b: "completed", "r-q0.3": "pruned", "r-q0.4": "pruned"}, statuses
    events = read_events(sup.run_dir)
    decisions = [(d.action, d.rung, d.value) for d in of(events, TrialDecision, a)]
    # paused at rung 1 (first there), promoted as rung 1 filled, then judged at rung 2 on epoch 2's 0.2 / 2
    assert decisions == [("pause", 1, 0.2), ("promote", 1, 0.2), ("pause", 2, 0.1), ("prune", 2, 0.1)], decisions
    reasons = [d.reason for d in of(events, TrialDecision, a)]
    assert reasons[2].startswith("val_loss 0.1 at epoch 2, not among the best 1 of 2 at rung 2"), reasons
    assert reasons[3] == "val_loss 0.1 at epoch 2, never among the best 1 of the 2 trials that reached rung 2"
    assert of(events, PipelineFinished, a)[-1].reason == reasons[3]
    # it trained its second epoch after its promotion, and that epoch's result is the one judged
    assert [(r.epoch, r.step) for r in of(events, ValResult, a)][:2] == [(0, 3), (1, 6)]
    assert [e.epoch for e in of(events, EpochEnd, a)][:2] == [0, 1]


# ------------------------------------------------------------ what ranks a sweep of scripts with no validation


def loss_sweep(tmp_path: Path, metrics: bool) -> Supervisor:
    """Four trials of rung_loop.py (its loss is quality / step) that report no validation metric: with a
    `metrics` pattern for its loss lines, or, as the scripts guide's sweep example, with none."""
    pipe = {"name": "r", "script": RUNG, "args": ["--quality", "{params.q}", "--out", "{checkpoint_dir}",
                                                  "--epochs", "2", "--delay", "0"]}
    if metrics:
        pipe["metrics"] = [r"step (?P<step>\d+) loss (?P<loss>[\d.]+)", r"saved epoch (?P<epoch>\d+)"]
    return Supervisor(make_config(tmp_path, [pipe], sweep={"space": {"params": {"q": [0.3, 0.1, 0.4, 0.2]}}},
                                  defaults={"max_epochs": 2}, telemetry={"enabled": False}, tensorboard=False))


@pytest.mark.slow
async def test_a_script_sweep_with_no_validation_metric_is_ranked_by_its_last_train_loss(tmp_path):
    # Regression (issue 52): four {params.lr} trials of a script that prints only its training loss were ranked
    # by nothing: `best loss -` on every row, headless `ranked by val_loss` with `-` for each, and check claimed
    # `validation: inline ..., best by val_loss (min)`.
    from torchherd.tui.bridge import replay_run
    from torchherd.tui.ranking import sweep_ranking

    sup = loss_sweep(tmp_path, metrics=True)
    statuses = await run_to_end(sup)
    assert set(statuses.values()) == {"completed"}, statuses
    lines = sweep_ranking(sup.run_dir, statuses)
    assert lines[0].startswith("sweep: 4 trials ranked by last train loss (no validation metric: a script reports "
                               "one with `val_metrics`"), lines
    assert [line.split()[1] for line in lines[2:6]] == ["r-q0.1", "r-q0.2", "r-q0.3", "r-q0.4"], lines
    # its last epoch's mean loss: of steps 4 to 6, each q / step as printed
    last = {q: sum(round(q / step, 4) for step in (4, 5, 6)) / 3 for q in (0.1, 0.2, 0.3, 0.4)}
    assert lines[1].split()[3] == "train_loss" and lines[2].split()[3] == f"{last[0.1]:.4g}", lines
    assert lines[-1].startswith(f"best: r-q0.1 (params.q = 0.1): last train loss {last[0.1]:.4g}, checkpoint "), lines
    state = replay_run(sup.run_dir)  # what the app's sweep view draws: the same order, each with its loss
    assert [(r.name, r.best) for r in state.ranked()] == [(f"r-q{q}", pytest.approx(v)) for q, v in last.items()]


def test_check_says_what_ranks_a_script_sweep_with_no_validation_metric(tmp_path):
    from torchherd.engine.hardware.devices import Inventory
    from torchherd.engine.preflight.check import check_config

    def check(metrics: str, scheduler: str = "none") -> str:
        (tmp_path / "train.py").write_text("print('step 1 loss 0.5')\n")
        (tmp_path / "s.toml").write_text(f"""
[[pipelines]]
name = "mlp"
script = "train.py"
args = ["--lr", "{{params.lr}}"]
{metrics}
[sweep]
space = {{ params.lr = [0.1, 0.03, 0.01, 0.003] }}
scheduler = "{scheduler}"
[devices]
cpu_slots = 2
""")
        return check_config(tmp_path / "s.toml", inventory=Inventory(cpu_count=2, note="no GPU (test)")).render()

    ranked = check("metrics = 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'")
    assert "validation: none: no pipeline reports val_loss (a script reports one with `val_metrics`" in ranked
    assert "best by val_loss" not in ranked
    assert "  ranked by last train loss (no validation metric: a script reports one with" in ranked, ranked
    unranked = check("", scheduler="asha")  # the scripts guide's sweep example: no metrics, no client
    assert "  nothing ranks its trials: they report no validation metric and no train loss (give the script " \
           "`metrics`, a pattern for its loss lines" in unranked, unranked
    assert "; ASHA judges validation results, so with none it judges no trial: each trains to its end" in unranked


@pytest.mark.slow
async def test_a_script_sweep_that_reports_nothing_says_plainly_that_nothing_ranks_it(tmp_path):
    from torchherd.tui.ranking import sweep_ranking

    sup = loss_sweep(tmp_path, metrics=False)
    statuses = await run_to_end(sup)
    assert set(statuses.values()) == {"completed"}, statuses
    lines = sweep_ranking(sup.run_dir, statuses)
    assert lines[0] == (
        "sweep: 4 trials, none ranked: they reported no validation metric and no train loss (give the script "
        "`metrics`, a pattern for its loss lines, to rank them by their last train loss; a script reports one "
        "with `val_metrics` (a pattern for the lines where it validates itself) or a `validate` factory to rank "
        "them by it)"), lines
    assert not any(line.startswith("best:") for line in lines)
