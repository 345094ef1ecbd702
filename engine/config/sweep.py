"""The `[sweep]` table's schema: the search space over pipeline keys and `params.*`, and the scheduler that
prunes trials by their validation results (ASHA or the median rule).

`config/trials.py` expands it into one pipeline per trial; `supervise/sweep/pruning.py` applies the scheduler.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RANGE_KINDS = ("uniform", "log_uniform", "int_uniform", "choice")  # the tables a `space` key may hold


class SweepConfig(BaseModel):
    """A search over pipeline keys and task parameters; each trial becomes a pipeline named from its values."""

    # strict as every other table: "3" is not 3.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    space: dict[str, Any] = Field(..., description=(
        "The keys to search, `params.NAME` (a task parameter) or a pipeline key such as batch_size or "
        "precision: a list is a grid axis (every value is tried); a table samples one value per trial: "
        "{uniform = [lo, hi]}, {log_uniform = [lo, hi]}, {int_uniform = [lo, hi]} (both ends included) or "
        "{choice = [a, b, ...]}. Trials are every grid point times `samples`."))
    samples: int = Field(1, ge=1, description=(
        "Random draws of the sampled keys per grid point (Ray Tune's num_samples); more than 1 needs a "
        "sampled key."))
    seed: int = Field(0, description="Seed of the random draws: the same seed gives the same trials.")
    scheduler: Literal["none", "asha", "median", "pbt"] = Field("none", description=(
        "Pruning by validation results on [validation] `metric` and `metric_mode`: 'asha' (asynchronous "
        "successive halving: at each rung a trial outside the best 1/reduction_factor of those that reached "
        "the rung before it is pruned), 'median' (pruned when its best is worse than the median of the other "
        "trials' bests at the same point), 'pbt' (population-based training: every perturbation_interval a "
        "trial in the bottom quantile_fraction takes over the checkpoint of one in the top and trains on "
        "with its values explored), or 'none'."))
    # promote by default: no trial is lost to the order trials reach a rung in (tests/test_sweep_promoting.py);
    # it ends with the trial that successive halving over full rungs keeps. Stop's pick hangs on that order: on
    # benchmarks/sweep_asha.py (16 epochs) it ended with the grid's best on 8 trials because that trial reached
    # the rungs early, and with neither the grid's best nor promote's pick on 16. Promote's wall time was
    # 0.9x-2x stop's (pauses restart trials, and the trial it keeps may train slower).
    mode: Literal["stop", "promote"] = Field("promote", description=(
        "ASHA: 'promote' (the ASHA paper's, the default) pauses a trial at a rung, checkpointed and its slot "
        "freed, unless it is among the best 1/reduction_factor of the trials recorded there, and trains it on "
        "once it ranks there as more trials reach the rung; trials never promoted end pruned when nothing "
        "else can run. 'stop' (Ray Tune's) cuts a trial for good when it is outside the best 1/reduction_factor "
        "of those that reached the rung before it."))
    rung_unit: Literal["epoch", "step"] = Field("epoch", description=(
        "What the scheduler counts trials' progress in: epochs trained, or optimizer steps."))
    grace_period: int = Field(1, ge=1, description=(
        "Epochs (or steps) every trial trains before it can be pruned: ASHA's first rung."))
    reduction_factor: int = Field(2, ge=2, description=(
        "ASHA: rungs at grace_period x reduction_factor^k; 1/reduction_factor of the trials at a rung go on."))
    min_trials: int = Field(3, ge=1, description=(
        "Median rule: other trials that must have reached the same point before one is compared with them."))
    overlay: int = Field(4, ge=1, le=8, description=(
        "The app's sweep view (`t`): how many of the best trials its chart overlays, each with a marker of "
        "its own."))
    perturbation_interval: int = Field(1, ge=1, description=(
        "PBT: epochs (or steps, with rung_unit = \"step\") a trial trains between two of its perturbations."))
    quantile_fraction: float = Field(0.25, gt=0.0, le=0.5, description=(
        "PBT: the share of the trials with a result that counts as the bottom (they take over a checkpoint) "
        "and as the top (whose checkpoints are taken); at least one trial each once two have results."))
    explore: dict[str, Any] = Field(default_factory=dict, description=(
        "PBT: how each swept key changes when a trial takes over another's checkpoint: 'perturb' (numbers: "
        "the donor's value times 0.8 or 1.2), 'resample' (a value drawn from the key's list or range) or 'keep' "
        "(the donor's value, as the checkpoint was trained: for a key that shapes the model, such as a layer's "
        "width, whose checkpoint no other value can load). Keys are written as in `space` (params.lr = "
        "\"resample\"). Unlisted keys: 'perturb' for numbers, else 'resample'."))

    def rungs(self, limit: int | None) -> list[int]:
        """ASHA's milestones in `rung_unit`, up to `limit` (a trial's max_epochs or max_steps) excluded:
        a trial that reaches its limit has finished, with nothing left to save by pruning it."""
        out: list[int] = []
        rung = self.grace_period
        while (limit is None and len(out) < 32) or (limit is not None and rung < limit):
            out.append(rung)
            rung *= self.reduction_factor
        return out

    def describe(self, trials: int, limit: int | None) -> str:
        """One line for `torchherd check`: the trial count and the scheduler."""
        unit = "epoch" if self.rung_unit == "epoch" else "step"
        text = f"sweep: {trials} trial{'s' if trials != 1 else ''}"
        if self.scheduler == "asha":
            rungs = ", ".join(str(r) for r in self.rungs(limit)[:6]) or "none (grace_period reaches max_epochs)"
            if self.mode == "promote":
                text += f", ASHA at {unit} {rungs} (promotes the best 1/{self.reduction_factor} at each; the " \
                        "others wait there)"
            else:
                text += f", ASHA pruning at {unit} {rungs} (keeps 1/{self.reduction_factor} at each)"
        elif self.scheduler == "pbt":
            share = f"{self.quantile_fraction:.0%}"
            text += (f", PBT every {self.perturbation_interval} {unit}{'s' if self.perturbation_interval != 1 else ''}"
                     f" (the bottom {share} take over a top {share} trial's checkpoint, values explored)")
        elif self.scheduler == "median":
            text += (f", median pruning from {unit} {self.grace_period} once {self.min_trials} other "
                     "trials got there")
        else:
            text += ", no pruning"
        return text
