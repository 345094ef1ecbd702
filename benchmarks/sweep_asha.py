"""What pruning buys a sweep: wall time and best metric of one grid with ASHA against the same grid without
pruning (torchherd both times), and against Ray Tune's ASHA on the same trials and slots where Ray is installed.

Goals: ASHA <= 0.5x the unpruned sweep's time for the same best trial; <= 1.0x Ray Tune's time.
Each trial is a fresh process that imports torch and builds its task before its first step; pruning saves
only the training after a rung, so `--samples` sets epochs long enough for training to be most of a trial.
Usage: python benchmarks/sweep_asha.py [--slots 2] [--epochs 8] [--samples 40000] [--no-ray]
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import ValResult  # noqa: E402
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

LRS = [0.03, 0.01, 0.003, 0.001]
BATCHES = [32, 128]
PARAMS = {"samples": 40000, "hidden": 128}  # --samples overrides


async def torchherd_sweep(tmp: Path, scheduler: str, slots: int, epochs: int) -> tuple[float, str, float]:
    """(wall seconds, best trial, its best val_loss) of the grid under `scheduler` ("asha" or "none")."""
    config = parse_config({
        "runs_dir": str(tmp / "runs"), "tensorboard": False,
        "defaults": {"task": "regression", "max_epochs": epochs, "params": PARAMS},
        "pipelines": [{"name": "reg"}], "devices": {"placement": "cpu", "cpu_slots": slots},
        "validation": {"mode": "inline"}, "telemetry": {"enabled": False},
        "sweep": {"space": {"params": {"lr": LRS}, "batch_size": BATCHES}, "scheduler": scheduler,
                  "grace_period": 1, "reduction_factor": 2}}, str(tmp / "sweep.toml"), tmp)
    sup = Supervisor(config)
    t = time.perf_counter()
    await sup.start()
    try:
        await sup.wait()
    finally:
        await sup.shutdown(graceful=False)
    wall = time.perf_counter() - t
    best = min((e for e in read_events(sup.run_dir) if isinstance(e, ValResult) and not e.error),
               key=lambda e: e.metrics["val_loss"])
    return wall, best.pipeline, best.metrics["val_loss"]


def ray_sweep(slots: int, epochs: int) -> tuple[float, str, float]:
    """(wall seconds, best trial, its best val_loss) of the same grid under Ray Tune's ASHAScheduler, the
    same training loop per epoch (torchherd's built-in regression task), `slots` trials at a time."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(cfg):
        import torch

        from torchherd.engine.runners.task.api import build_task
        torch.set_num_threads(1)
        task = build_task("regression", {**PARAMS, "lr": cfg["lr"]})
        train = torch.utils.data.DataLoader(task.train_data, batch_size=cfg["batch_size"], shuffle=True)
        val = torch.utils.data.DataLoader(task.val_data, batch_size=256)
        for _ in range(epochs):
            task.model.train()
            for x, y in train:
                task.optimizer.zero_grad()
                task.loss_fn(task.model(x), y).backward()
                task.optimizer.step()
            task.model.eval()
            with torch.no_grad():
                total = sum(task.loss_fn(task.model(x), y).item() * len(x) for x, y in val)
            tune.report({"val_loss": total / len(task.val_data)})

    t = time.perf_counter()
    ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"lr": tune.grid_search(LRS), "batch_size": tune.grid_search(BATCHES)},
            tune_config=tune.TuneConfig(scheduler=ASHAScheduler(metric="val_loss", mode="min", grace_period=1,
                                                                reduction_factor=2, max_t=epochs),
                                        max_concurrent_trials=slots))
        results = tuner.fit()
        best = results.get_best_result(metric="val_loss", mode="min", scope="all")
        wall = time.perf_counter() - t
        value = float(best.metrics_dataframe["val_loss"].min())
        return wall, f"reg-lr{best.config['lr']:.3g}-batch_size{best.config['batch_size']}", value
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--samples", type=int, default=PARAMS["samples"], help="regression samples per trial")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray Tune even where it is installed")
    args = ap.parse_args()
    PARAMS["samples"] = args.samples
    trials = len(LRS) * len(BATCHES)
    print(f"{trials} trials (lr x batch_size) of {args.epochs} epochs of {args.samples} samples on {args.slots} "
          "CPU slots")
    with tempfile.TemporaryDirectory() as tmp:
        full = asyncio.run(torchherd_sweep(Path(tmp) / "none", "none", args.slots, args.epochs))
        asha = asyncio.run(torchherd_sweep(Path(tmp) / "asha", "asha", args.slots, args.epochs))
    print(f"no pruning:       {full[0]:6.1f}s, best {full[1]} val_loss {full[2]:.4g}")
    print(f"torchherd ASHA:   {asha[0]:6.1f}s, best {asha[1]} val_loss {asha[2]:.4g}")
    same = "same best trial" if asha[1] == full[1] else "a DIFFERENT best trial"
    print(f"ASHA / no pruning: {asha[0] / full[0]:.2f}x the time, {same} (goal <= 0.5x)")
    if args.no_ray or importlib.util.find_spec("ray") is None:
        print("Ray Tune: skipped (not installed, or --no-ray)")
        return
    try:
        ray_result = ray_sweep(args.slots, args.epochs)
    except ImportError as exc:  # ray without its tune extra
        print(f"Ray Tune: skipped ({exc})")
        return
    print(f"Ray Tune ASHA:    {ray_result[0]:6.1f}s, best {ray_result[1]} val_loss {ray_result[2]:.4g}")
    print(f"torchherd ASHA / Ray Tune ASHA: {asha[0] / ray_result[0]:.2f}x the time (goal <= 1.0x)")


if __name__ == "__main__":
    main()
