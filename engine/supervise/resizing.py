"""An elastic gang's batch at the size an attempt is granted: `sizing` keeps the samples of one optimizer step as
at MAX ranks (the accumulation, else the per-rank batch, scaled up) unless `keep = "per_rank_batch"` (a script's
batch is its own), and `resized_event` says what changed between two sizes, as the `gang_resized` event;
`failed_again` names a slot whose rank failed first in two crashes in a row, which the gang is then granted no more."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import Pipeline
from ..hardware.slots import Slot
from ..protocol.messages import GangResized
from ..protocol.names import PipelineKind


@dataclass(frozen=True)
class Sizing:
    """One attempt's batch settings at `ranks` ranks."""

    ranks: int
    batch_size: int  # samples per batch, per rank
    accumulate_grad_batches: int

    @property
    def samples_per_step(self) -> int:
        """Samples of one optimizer step, the whole gang's."""
        return self.batch_size * self.accumulate_grad_batches * self.ranks


def sizing(pipe: Pipeline, ranks: int) -> Sizing:
    """`pipe`'s batch at `ranks` ranks: as configured at MAX ranks (or for a fixed gang, or a script, whose batch
    is its own); else, keeping the global batch, the accumulation scaled by MAX / ranks when that divides, else the
    per-rank batch; else as configured (the event then says the global batch changed)."""
    bs, acc, most = pipe.batch_size, pipe.accumulate_grad_batches, pipe.max_ranks
    if not pipe.elastic or ranks == most or pipe.keep == "per_rank_batch" or pipe.kind == PipelineKind.SCRIPT:
        return Sizing(ranks, bs, acc)
    if acc * most % ranks == 0:
        return Sizing(ranks, bs, acc * most // ranks)
    if bs * most % ranks == 0:
        return Sizing(ranks, bs * most // ranks, acc)
    return Sizing(ranks, bs, acc)


def sized(pipe: Pipeline, ranks: int) -> Pipeline:
    """`pipe` as an attempt of `ranks` ranks trains it (itself when nothing changes)."""
    s = sizing(pipe, ranks)
    if (s.batch_size, s.accumulate_grad_batches) == (pipe.batch_size, pipe.accumulate_grad_batches):
        return pipe
    return pipe.model_copy(update={"batch_size": s.batch_size, "accumulate_grad_batches": s.accumulate_grad_batches})


def resized_event(pipe: Pipeline, before: int, after: int, why: str) -> GangResized:
    """The `gang_resized` event of an attempt of `after` ranks following one of `before`; a script's batch is its
    own, which torchherd does not know: 0 (unknown) for its batch, accumulation and samples, and keep ""."""
    if pipe.kind == PipelineKind.SCRIPT:
        return GangResized(pipeline=pipe.name, from_ranks=before, to_ranks=after, why=why, batch_size=0,
                           accumulate_grad_batches=0, samples_per_step=0, samples_per_step_before=0, keep="")
    old, new = sizing(pipe, before), sizing(pipe, after)
    return GangResized(pipeline=pipe.name, from_ranks=before, to_ranks=after, why=why, batch_size=new.batch_size,
                       accumulate_grad_batches=new.accumulate_grad_batches, samples_per_step=new.samples_per_step,
                       samples_per_step_before=old.samples_per_step, keep=pipe.keep)


def failed_again(before: tuple[Slot, int] | None, now: tuple[Slot, int] | None) -> str:
    """"cpu1 failed rank 1 twice in a row" when the rank that failed first ran on the same slot in a gang's crash
    (`now`) and its crash before (`before`), each (slot, rank) or None when not known (a one-rank attempt, a
    hang); else ""."""
    if now is None or before is None or now[0].name != before[0].name:
        return ""
    ranks = f"rank {now[1]} twice in a row" if now[1] == before[1] else \
        f"twice in a row (rank {before[1]}, then rank {now[1]})"
    return f"{now[0].name} failed {ranks}"
