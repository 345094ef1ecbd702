"""TensorBoard event files: written by the supervisor during a run (a sweep's HParams too) and by
`torchherd export` for a past run; TensorBoard's own reader gets back the values torchherd reported."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from torchherd.engine.protocol.messages import EpochEnd, RunStarted, StepMetrics, ValResult
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config

pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow


def read_back(folder):
    """Scalars by tag ({tag: {step: value}}) and the HParams session values, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    hparams = {}
    for tag, content in acc.PluginTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.WhichOneof("data") == "session_start_info":
            for key, value in data.session_start_info.hparams.items():
                hparams[key] = value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
    return scalars, hparams


def check_against_events(run_dir, logdir, names):
    events = read_events(run_dir)
    for name in names:
        scalars, hparams = read_back(logdir / name)
        steps = [e for e in events if isinstance(e, StepMetrics) and e.pipeline == name]
        vals = [e for e in events if isinstance(e, ValResult) and e.pipeline == name]
        assert steps and vals
        assert scalars["train/loss"][steps[-1].step] == pytest.approx(steps[-1].loss, rel=1e-6)
        assert scalars["train/lr"][steps[-1].step] == pytest.approx(steps[-1].lr, rel=1e-6)
        assert "train/samples_per_s" in scalars and "epoch/train_loss" in scalars
        for v in vals:
            assert scalars["val/val_loss"][v.step] == pytest.approx(v.metrics["val_loss"], rel=1e-6)
        best = min(v.metrics["val_loss"] for v in vals)
        assert list(scalars["hparams/best_val_loss"].values()) == [pytest.approx(best, rel=1e-6)]
        lr = float(name.rsplit("lr", 1)[1])
        assert hparams["params.lr"] == pytest.approx(lr) and hparams["status"] == "completed"
        # The commit of the code (this checkout's, where tests/tasks is), "-dirty" after it when the tree was.
        code = next(e for e in events if isinstance(e, RunStarted)).code
        commit = f"{code[0].commit}{'-dirty' if code[0].dirty else ''}" if code else None
        assert hparams.get("commit") == commit
        epochs = [e for e in events if isinstance(e, EpochEnd) and e.pipeline == name]
        assert scalars["epoch/train_loss"][epochs[-1].step] == pytest.approx(epochs[-1].train_loss, rel=1e-6)


async def run(config):
    sup = Supervisor(config)
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    return sup.run_dir


async def test_a_sweep_writes_scalars_and_hparams_that_tensorboard_reads_back(tmp_path):
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 2},
                         sweep={"space": {"params": {"lr": [0.05, 0.01]}}}, telemetry={"enabled": False})
    run_dir = await run(config)
    check_against_events(run_dir, run_dir / "tensorboard", ["t-lr0.05", "t-lr0.01"])


async def test_export_writes_a_past_runs_files(tmp_path):
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 2}, tensorboard=False,
                         sweep={"space": {"params": {"lr": [0.05]}}})
    run_dir = await run(config)
    assert not (run_dir / "tensorboard").exists()  # tensorboard = false: nothing written during the run
    out = tmp_path / "tb"
    proc = subprocess.run([sys.executable, "-m", "torchherd", "export", str(run_dir), "--tensorboard", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "1 pipeline(s)" in proc.stdout, proc.stdout + proc.stderr
    check_against_events(run_dir, out, ["t-lr0.05"])
    # Regression: exporting again added a second event file beside the first: every curve drawn twice.
    again = subprocess.run([sys.executable, "-m", "torchherd", "export", str(run_dir), "--tensorboard", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and f"{out / 't-lr0.05'} already holds TensorBoard files" in again.stderr
    assert len(list((out / "t-lr0.05").glob("events.out.tfevents.*"))) == 1
    check_against_events(run_dir, out, ["t-lr0.05"])  # the first export stands, untouched
    bad = subprocess.run([sys.executable, "-m", "torchherd", "export", str(tmp_path / "nope"), "--tensorboard",
                          str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such run" in bad.stderr


async def test_values_a_script_never_reports_stay_absent_in_metrics_jsonl_and_tensorboard(tmp_path):
    # Regression: a script that never prints lr or its samples got train/lr and train/samples_per_s curves flat
    # at 0.0, and "lr":0.0,"samples_per_s":0.0 in metrics.jsonl.
    import json
    from tests.conftest import TASKS

    config = make_config(tmp_path, [{"name": "s", "script": str(TASKS / "scripts" / "plain_loop.py"),
                                     "args": ["--epochs", "2", "--delay", "0"],
                                     "metrics": r"Epoch (?P<epoch>\d+), Loss: (?P<loss>[-+.\deE]+)"}],
                         validation={"mode": "off"}, telemetry={"enabled": False})
    run_dir = await run(config)
    records = [json.loads(line) for line in (run_dir / "s" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    ends = [r for r in records if r["type"] == "epoch_end"]
    assert len(steps) == 2 and len(ends) == 2
    assert all(r["lr"] is None and r["samples_per_s"] is None for r in steps)
    assert all(r["samples_per_s"] is None for r in ends)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard" / "s"), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert "train/loss" in scalars and "epoch/train_loss" in scalars
    assert not {"train/lr", "train/samples_per_s", "epoch/samples_per_s"} & scalars


# Regression: `export` wrote alerts (alerts/RULE in the Text tab) but the live files never carried them.
async def test_a_live_runs_files_carry_its_alerts(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    script = tmp_path / "nan_loop.py"
    script.write_text("for e in range(3):\n    print(f'Epoch {e + 1}, Loss: nan', flush=True)\n")
    config = make_config(tmp_path, [{"name": "s", "script": str(script), "nan_policy": "warn",
                                     "metrics": r"Epoch (?P<epoch>\d+), Loss: (?P<loss>\S+)"}],
                         validation={"mode": "off"}, telemetry={"enabled": False})
    run_dir = await run(config)
    acc = EventAccumulator(str(run_dir / "tensorboard" / "s"))
    acc.Reload()
    [alert] = [tag for tag in acc.Tags()["tensors"] if tag.startswith("alerts/")]
    text = acc.Tensors(alert)[0].tensor_proto.string_val[0].decode()
    assert alert.startswith("alerts/nan") and "loss is not finite" in text, (alert, text)
