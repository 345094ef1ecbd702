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


def test_the_best_trials_checkpoint_is_its_own_where_it_is_a_script_or_a_lightning_module(tmp_path):
    # Regression: a script sweep ended "checkpoint none written" while each trial's own checkpoint existed.
    from torchherd.tui.ranking import checkpoint_of

    folder = tmp_path / "t-lr0.01" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / ".ckpt.pt.tmp").write_bytes(b"half")  # a save in progress is none
    assert checkpoint_of(tmp_path, "t-lr0.01") is None
    (folder / "ckpt.pt").write_bytes(b"x")
    assert checkpoint_of(tmp_path, "t-lr0.01") == folder / "ckpt.pt"
    (folder / "best.ckpt").write_bytes(b"x")
    assert checkpoint_of(tmp_path, "t-lr0.01") == folder / "best.ckpt"
    assert ranked_table(fold_trials(sweep(tmp_path), events()), "val_loss", tmp_path)[-1].endswith(
        f"checkpoint {folder / 'best.ckpt'}")


def test_the_reasons_say_each_decision_and_a_promotion(tmp_path):
    from torchherd.engine.protocol.control import ClientCommand

    more = [ClientCommand(action="promote", pipeline="t-lr0.1", ok=True),
            ClientCommand(action="promote", pipeline="t-lr0.001", ok=False, text="no"),
            TrialDecision(pipeline="t-lr0.1", action="continue", rung=2, value=0.4, cutoff=0.1,
                          reason="val_loss 0.4 at epoch 2, rung cut 0.1 (promoted: never pruned)")]
    rows = {r.name: r for r in fold_trials(sweep(tmp_path), events() + more)}
    assert rows["t-lr0.1"].reasons == [
        "rung 1: pruned: cut", "promoted: trains on from its checkpoint, never pruned again this session",
        "rung 2: goes on: val_loss 0.4 at epoch 2, rung cut 0.1 (promoted: never pruned)"]
    assert rows["t-lr0.1"].rung == 2 and rows["t-lr0.001"].reasons == []  # a refused promote changes nothing


def test_the_app_folds_the_same_rows_event_by_event_as_headless_does(tmp_path):
    from torchherd.tui.ranking import SavedSweep
    from torchherd.tui.runstate import RunState

    config = sweep(tmp_path)
    state = RunState()
    state.add_sweep(SavedSweep({p.name: dict(p.trial) for p in config.pipelines}, "val_loss", "min"))
    for event in events():
        state.apply(event)
    assert [(r.name, r.best, r.rung, r.reasons) for r in state.ranked()] == \
        [(r.name, r.best, r.rung, r.reasons) for r in fold_trials(config, events())]
    assert state.trials_version > 1
    plain = RunState()  # no sweep: no trials, whatever events come
    for event in events():
        plain.apply(event)
    assert plain.trials == {} and plain.ranked() == []


def test_a_run_directory_says_its_sweep_without_loading_the_schema(tmp_path):
    import json

    from torchherd.tui.ranking import saved_sweeps

    config = sweep(tmp_path, "max")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps([config.model_dump(mode="json")]))
    [saved] = saved_sweeps(run)
    assert (saved.metric, saved.metric_mode, saved.overlay) == ("val_loss", "max", 4)
    assert saved.trials == {"t-lr0.1": {"params.lr": 0.1}, "t-lr0.01": {"params.lr": 0.01},
                            "t-lr0.001": {"params.lr": 0.001}}
    plain = make_config(tmp_path, [{"name": "a"}])
    (run / "config.json").write_text(json.dumps([plain.model_dump(mode="json")]))
    assert saved_sweeps(run) == []  # no sweep
    (run / "config.json").write_text("{not json")
    assert saved_sweeps(run) == [] and saved_sweeps(tmp_path / "nowhere") == []


def test_every_sweep_of_a_session_is_ranked_on_its_own_metric_and_mode(tmp_path):
    import json

    from torchherd.tui.ranking import SavedSweep, saved_sweeps
    from torchherd.tui.runstate import RunState

    first, added = sweep(tmp_path, "min"), sweep(tmp_path, "max")
    added = added.model_copy(update={"sweep": added.sweep.model_copy(update={"overlay": 2})})
    run = tmp_path / "run"
    run.mkdir()
    plain = make_config(tmp_path, [{"name": "a"}])
    configs = [first, plain, added]  # the second config added with `n` is no sweep; the third is one
    (run / "config.json").write_text(json.dumps([c.model_dump(mode="json") for c in configs]))
    assert [(s.metric_mode, s.overlay) for s in saved_sweeps(run)] == [("min", 4), ("max", 2)]
    state = RunState()
    state.add_sweep(SavedSweep.of(first))
    renamed = [f"{p.name}-2" for p in added.pipelines]  # the session's names for the added trials
    state.add_sweep(SavedSweep.of(added, renamed))
    for name, value in [("t-lr0.1", 0.5), ("t-lr0.01", 0.2), ("t-lr0.1-2", 0.5), ("t-lr0.01-2", 0.2)]:
        state.apply(ValResult(pipeline=name, epoch=1, step=10, metrics={"val_loss": value}))
    assert [r.name for r in state.ranked("t-lr0.1")][:2] == ["t-lr0.01", "t-lr0.1"]  # min: lower first
    assert [r.name for r in state.ranked("t-lr0.01-2")][:2] == ["t-lr0.1-2", "t-lr0.01-2"]  # max: higher first
    assert state.sweep_for("a") is state.sweeps[0] and state.sweep_for("t-lr0.001-2").overlay == 2
