"""The report window every in-process runner shares: losses summed on the device between two step reports.

A step report is the window's mean loss put to the NaN policy and sent as `StepMetrics`,
with samples/s over the window's wall time; the window then starts afresh. Sums stay
on the device so training never waits for a sync between reports.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..protocol.channel import StatusSender
from ..protocol.health import RankPace
from ..protocol.messages import StepMetrics
from .control import WorkerControl

if TYPE_CHECKING:
    import torch


class ReportWindow:
    """The batches since the last step report: their loss sum (a 0-d tensor), count and samples."""

    def __init__(self, loss_sum: torch.Tensor):
        self.loss = loss_sum  # a zero 0-d tensor on the training device; added to in place
        self.batches = 0
        self.samples = 0
        self.start = time.monotonic()
        self.own = 0.0  # seconds of this rank's own work (data and forward) in the window
        self._mark = time.perf_counter()  # where its own work began: the end of the last backward

    def before_backward(self) -> None:
        """The micro-batch's data and forward are done: a gang's backward is where DDP waits for its peers."""
        self.own += time.perf_counter() - self._mark

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """One micro-batch's detached loss (no device sync) and its sample count, after its backward."""
        self.loss += loss
        self.batches += 1
        self.samples += samples
        self._mark = time.perf_counter()

    def report(self, control: WorkerControl, sender: StatusSender, mean: float, where: str, *, epoch: int,
               step: int, lr: float, world: int = 1, metrics: dict[str, float] | None = None,
               rank: int | None = None) -> int | None:
        """Send the step report for `mean` (the window's mean loss) and start a new window; the exit code
        the NaN policy asks for instead when `mean` is not finite (`where` names the step in its message).
        `world`: ranks that each trained as many samples (a gang's samples/s is the whole gang's); `rank`: a
        gang's rank, which reports its own pace (`RankPace`) too."""
        code = control.non_finite(mean, where)
        if code is not None:
            return code
        now = time.monotonic()
        if rank is not None:
            sender.step(RankPace(pipeline=control.name, rank=rank, step=step,
                                 step_time=self.own / max(self.batches, 1)))
        sender.step(StepMetrics(pipeline=control.name, epoch=epoch, step=step, loss=mean, lr=lr,
                                samples_per_s=self.samples * world / max(now - self.start, 1e-9),
                                metrics=metrics if metrics is not None else {}))
        self.loss.zero_()
        self.batches = self.samples = 0
        self.start, self.own = now, 0.0
        return None
