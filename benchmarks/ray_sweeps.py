"""Ray Tune's side of benchmarks/sweep_asha.py: the same grid of trials (torchherd's built-in regression task, the
same loop per epoch) under Ray Tune's ASHAScheduler or PopulationBasedTraining, `slots` trials at a time.

Ray gets its best settings: `ray.init` before the clock starts, `reuse_actors`, checkpoints only where PBT needs
them, and each side's epochs are counted (a file line per epoch trained) so start-ups are told from scheduling.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RaySweep:
    wall: float  # seconds of tuner.fit(), ray.init excluded
    best: str
    value: float
    epochs: int  # epochs trained, all trials together


def trainable_for(params: dict, epochs: int, tally: Path, checkpoints: bool):
    """A function trainable: trains `epochs` epochs (from its checkpoint's, restored), reports val_loss each."""
    def trainable(cfg):
        import torch
        from ray import tune

        from torchherd.engine.runners.task.api import build_task
        torch.set_num_threads(1)
        task = build_task("regression", {**params, "lr": cfg["lr"]})
        start, restored = 0, tune.get_checkpoint()
        if restored is not None:
            with restored.as_directory() as folder:
                state = torch.load(os.path.join(folder, "state.pt"), weights_only=True)
            task.model.load_state_dict(state["model"])
            task.optimizer.load_state_dict(state["optimizer"])
            for group in task.optimizer.param_groups:  # the loaded state would put the donor's lr back
                group["lr"] = cfg["lr"]
            start = state["epoch"]
        train = torch.utils.data.DataLoader(task.train_data, batch_size=cfg["batch_size"], shuffle=True)
        val = torch.utils.data.DataLoader(task.val_data, batch_size=256)
        for epoch in range(start, epochs):
            task.model.train()
            for x, y in train:
                task.optimizer.zero_grad()
                task.loss_fn(task.model(x), y).backward()
                task.optimizer.step()
            task.model.eval()
            with torch.no_grad():
                total = sum(task.loss_fn(task.model(x), y).item() * len(x) for x, y in val)
            with open(tally, "a") as fh:
                fh.write("1\n")
            metrics = {"val_loss": total / len(task.val_data)}
            if not checkpoints:
                tune.report(metrics)
                continue
            with tempfile.TemporaryDirectory() as folder:
                torch.save({"model": task.model.state_dict(), "optimizer": task.optimizer.state_dict(),
                            "epoch": epoch + 1}, os.path.join(folder, "state.pt"))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
    return trainable


def ray_sweep(how: str, lrs: list[float], batches: list[int], params: dict, slots: int, epochs: int, grace: int,
              interval: int) -> RaySweep:
    """The grid under Ray Tune's ASHA (`how` "asha") or PBT ("pbt", lr perturbed by 0.8/1.2 or resampled,
    batch size resampled, every `interval` epochs, as torchherd's PBT does)."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    if how == "asha":
        scheduler = ASHAScheduler(metric="val_loss", mode="min", grace_period=grace, reduction_factor=2, max_t=epochs)
    else:
        scheduler = PopulationBasedTraining(metric="val_loss", mode="min", perturbation_interval=interval,
                                            quantile_fraction=0.25, hyperparam_mutations={
                                                "lr": tune.loguniform(min(lrs) / 10, max(lrs) * 10),
                                                "batch_size": batches})
    tally = Path(tempfile.mkdtemp()) / "epochs"
    tally.touch()
    ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            tune.with_resources(trainable_for(params, epochs, tally, how == "pbt"), {"cpu": 1}),
            param_space={"lr": tune.grid_search(lrs), "batch_size": tune.grid_search(batches)},
            tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=slots, reuse_actors=True),
            run_config=tune.RunConfig(verbose=0, storage_path=str(tally.parent)))
        t = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - t
        best = results.get_best_result(metric="val_loss", mode="min", scope="all")
        value = float(best.metrics_dataframe["val_loss"].min())
        name = f"reg-lr{best.config['lr']:.3g}-batch_size{best.config['batch_size']}"
        return RaySweep(wall, name, value, len(tally.read_text().splitlines()))
    finally:
        ray.shutdown()
