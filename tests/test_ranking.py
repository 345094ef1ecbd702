"""A sweep's trials ranked from events (the headless table at the end, the app's sweep view): best first by
the metric and its mode, with values, state and rung."""
from __future__ import annotations

from torchherd.engine.protocol.messages import PipelineFinished, TrialDecision, ValResult
from torchherd.tui.ranking import fold_trials, ranked_table
from tests.conftest import make_config


def sweep(tmp_path, mode="min"):
    return make_config(tmp_path, [{"name": "t"}], sweep={"space": {"params": {"lr": [0.1, 0.01, 0.001]}}},
                       validation={"mode": "inline", "metric": "val_loss", "metric_mode": mode})


def events():
    return [ValResult(pipeline="t-lr0.1", epoch=0, step=8, metrics={"val_loss": 0.5}),
            ValResult(pipeline="t-lr0.01", epoch=0, step=8, metrics={"val_loss": 0.2}),
            ValResult(pipeline="t-lr0.01", epoch=1, step=16, metrics={"val_loss": 0.1}),
            TrialDecision(pipeline="t-lr0.1", action="prune", rung=1, value=0.5, cutoff=0.2, reason="cut"),
            PipelineFinished(pipeline="t-lr0.1", status="pruned", reason="val_loss 0.5 at epoch 1, rung cut 0.2")]


def test_trials_rank_best_first_and_unscored_last(tmp_path):
    rows = fold_trials(sweep(tmp_path), events(), {"t-lr0.01": "completed"})
    assert [(r.name, r.best, r.state) for r in rows] == [
        ("t-lr0.01", 0.1, "completed"), ("t-lr0.1", 0.5, "pruned"), ("t-lr0.001", None, "queued")]
    assert rows[1].rung == 1 and rows[0].values == {"params.lr": 0.01}
    assert [r.name for r in fold_trials(sweep(tmp_path, "max"), events())][:2] == ["t-lr0.1", "t-lr0.01"]


def test_the_table_names_the_best_trial_its_values_and_checkpoint(tmp_path):
    (tmp_path / "t-lr0.01" / "checkpoints").mkdir(parents=True)
    (tmp_path / "t-lr0.01" / "checkpoints" / "best.pt").write_bytes(b"x")
    lines = ranked_table(fold_trials(sweep(tmp_path), events()), "val_loss", tmp_path)
    assert lines[0] == "sweep: 3 trials ranked by val_loss"
    assert lines[1].split() == ["#", "trial", "lr", "val_loss", "state", "rung"]
    assert lines[2].split() == ["1", "t-lr0.01", "0.01", "0.1", "queued", "-"]
    assert lines[-1] == f"best: t-lr0.01 (params.lr = 0.01): val_loss 0.1, checkpoint {tmp_path}/t-lr0.01/checkpoints/best.pt"
