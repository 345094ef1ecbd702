"""PBT over real Lightning trials whose explored key shapes the model (tests/tasks/lit_wide.py's `hidden`, kept from
the donor): every background score is of the weights it names (Trainer.validate on the trial's last.ckpt says the
same), the explored lr reaches the optimizer, and TensorBoard's HParams and best.ckpt are the trial's own."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from torchherd.engine.protocol.messages import StepMetrics, TrainingStarted, TrialDecision, ValResult
from torchherd.engine.rundir.directory import read_events
from tests.conftest import TASKS, make_config
from tests.test_lightning import session

NO_LIGHTNING = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                  reason='Lightning is not installed: pip install "torchherd[lightning]"')
pytestmark = [pytest.mark.slow, NO_LIGHTNING]
WIDE = f"lightning:{TASKS / 'lit_wide.py'}:LitWide"
EPOCHS = 6
SWEEP = {"space": {"params": {"hidden": [4, 32], "lr": [0.1]}}, "scheduler": "pbt", "perturbation_interval": 1,
         "seed": 3, "explore": {"params": {"hidden": "keep"}}}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One PBT session of two trials (widths 4 and 32), validated in the background; 8 batches an epoch, 0.64 s."""
    tmp = tmp_path_factory.mktemp("lightning_pbt")
    config = make_config(tmp, [{"name": "w", "task": WIDE}], sweep=SWEEP, devices={"cpu_slots": 2},
                         defaults={"max_epochs": EPOCHS, "params": {"samples": 128, "delay": 0.08,
                                                                      "sync_file": str(tmp / "validated")}},
                         validation={"mode": "background", "device": "cpu"}, telemetry={"enabled": False})
    statuses, run_dir = session(config, timeout=300)
    events = read_events(run_dir)
    exploits = [e for e in events if isinstance(e, TrialDecision) and e.action == "exploit"]
    return statuses, run_dir, events, exploits


def lit_validate(path) -> dict[str, float]:
    """What plain Lightning reports for a checkpoint: the module its hparams build, its weights, Trainer.validate."""
    import lightning.pytorch as pl

    from tests.tasks.lit_wide import LitWide

    module = LitWide.load_from_checkpoint(path, map_location="cpu")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    return {k: float(v) for k, v in trainer.validate(module, verbose=False)[0].items()}


def test_every_trials_last_background_score_is_what_lightning_says_of_its_last_ckpt(sweep):
    # Issue 52 item 8: after a width-4 trial took over a width-32 donor, the validator kept scoring it with the
    # width-4 model it had built first (and the snapshot layout it had opened first): chance, silently.
    statuses, run_dir, events, exploits = sweep
    assert set(statuses.values()) == {"completed"}, statuses
    assert any(x.exploit["values"]["params.hidden"] != x_own(x) for x in exploits), exploits
    for name in statuses:
        scores = [e for e in events if isinstance(e, ValResult) and e.pipeline == name]
        assert scores and not any(e.error for e in scores), scores
        last = run_dir / name / "checkpoints" / "last.ckpt"
        state = torch.load(last, map_location="cpu", weights_only=False)
        assert scores[-1].step == state["global_step"]
        assert scores[-1].metrics["val_loss"] == pytest.approx(lit_validate(last)["val_loss"], rel=1e-4), name
        mine = [x for x in exploits if x.pipeline == name]
        if mine:  # its hparams are the donor's width: the one it trains, checkpoints and is scored with
            assert state["hyper_parameters"]["hidden"] == mine[-1].exploit["values"]["params.hidden"]


def hparams_sessions(folder) -> list[dict]:
    """Every HParams session written into a trial's TensorBoard folder, in the order TensorBoard reads them (it
    shows the first)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    info = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    values = info.session_start_info.hparams
                    out.append({k: getattr(v, v.WhichOneof("kind")) for k, v in values.items()})
    return out


def x_own(decision: TrialDecision) -> int:
    """The width the exploited trial was configured with ('w-hidden4-lr0.1' -> 4)."""
    return int(decision.pipeline.split("-hidden")[1].split("-")[0])


def test_the_explored_lr_reaches_the_lightning_optimizer(sweep):
    # Issue 52 item 9: the optimizer state restored from the donor's checkpoint kept the donor's lr.
    _, run_dir, events, exploits = sweep
    assert exploits
    for name in {x.pipeline for x in exploits}:
        lr = [x for x in exploits if x.pipeline == name][-1].exploit["values"]["params.lr"]
        state = torch.load(run_dir / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert state["hyper_parameters"]["lr"] == pytest.approx(lr)
        assert [g["lr"] for g in state["optimizer_states"][0]["param_groups"]] == [pytest.approx(lr)]
        started = max(i for i, e in enumerate(events) if isinstance(e, TrainingStarted) and e.pipeline == name)
        reported = [e.lr for e in events[started:] if isinstance(e, StepMetrics) and e.pipeline == name]
        assert reported and all(r == pytest.approx(lr) for r in reported), (name, lr, reported)


def test_hparams_hold_one_session_per_trial_with_its_values_now_and_best_ckpt_is_its_own(sweep):
    # Issue 52 item 12: every attempt wrote a session (TensorBoard shows the first: the trial's old values, the
    # status of an interim stop), and the donor's best.ckpt came with its checkpoint.
    from torchherd.tui.bridge import replay_run

    statuses, run_dir, events, exploits = sweep
    assert exploits
    rows = {r.name: r for r in replay_run(run_dir).ranked()}  # the sweep view's
    for name in statuses:
        mine = [x for x in exploits if x.pipeline == name]
        values = mine[-1].exploit["values"] if mine else {}
        [hparams] = hparams_sessions(run_dir / "tensorboard" / name)
        assert hparams["status"] == "completed"
        for key, value in values.items():
            assert hparams[key] == pytest.approx(value), (name, key)
        best = torch.load(run_dir / name / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
        assert best["torchherd"]["pipeline"] == name
        # its own weights' results: since it first trained from its last exploit's copy
        since = next(i for i, e in enumerate(events) if isinstance(e, TrainingStarted) and e.pipeline == name
                     and (not mine or i > events.index(mine[-1])))
        own = [e.metrics["val_loss"] for e in events[since:] if isinstance(e, ValResult) and e.pipeline == name]
        assert best["torchherd"]["value"] == pytest.approx(min(own)) == rows[name].best, name
        if values:  # the width its weights have since
            assert best["hyper_parameters"]["hidden"] == values["params.hidden"]
