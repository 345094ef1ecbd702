"""How one attempt of a pipeline is launched: a launch spec per rank, and one handle for them all.

`AttemptLauncher.start(run)` writes each rank's worker spec (its slot, log and, for
rank 0, where snapshots go) and launches one process, or a gang of one per slot with
torchrun's environment on the address and port the backend's `rendezvous` names
(this machine's loopback; on a cluster, its node's address and a port free there).
"""
from __future__ import annotations

from ..launch import gang
from ..launch.backend import Backend, Handle, LaunchSpec
from ..launch.environment import GPUS_VARIABLE, cuda_device, node_ranks, rank_env
from ..launch.ports import release_port
from ..protocol.spec import WorkerSpec
from ..rundir.directory import RunDirectory
from ..runners.registry import runner_for
from .pipeline import SupervisedPipeline
from .resizing import sized
from .validation_service import ValidationService

# Seconds a gang's rank waits in a collective, at least: well below torch's 30 minutes (the hang
# check, when set, catches a stuck peer sooner still), but the other ranks wait in one while
# rank 0 validates inline.
COLLECTIVE_TIMEOUT = 300.0


class AttemptLauncher:
    """Starts attempts of a run's pipelines through the session's backend."""

    def __init__(self, backend: Backend, rundir: RunDirectory, validation: ValidationService, run_id: str):
        self._backend, self._rundir, self._validation, self._run_id = backend, rundir, validation, run_id

    def start(self, pipe: SupervisedPipeline, hold: bool = False) -> Handle:
        """Launch the pipeline's next attempt on its slots (raises OSError); `hold`: rank 0 holds after its build
        until Proceed (its peers wait for it where the gang meets)."""
        if len(pipe.slots) == 1:
            return self._backend.launch(self.spec_for(pipe, 0, hold=hold))
        restart = pipe.plan.run_config.restart
        # rank 0's store listens on its node (the scheduler groups a gang's ranks by node, rank 0's first)
        addr, port = self._backend.rendezvous(pipe.slots[0].node)
        nodes = [s.node for s in pipe.slots]
        envs = [rank_env(rank, len(pipe.slots), port, pipe.attempts - 1, restart.max_restarts, self._run_id, addr,
                         nodes) for rank in range(len(pipe.slots))]
        return gang.launch_gang(self._backend, [self.spec_for(pipe, rank, env, hold=hold and rank == 0)
                                                 for rank, env in enumerate(envs)],
                                linger=restart.stop_timeout, grace=restart.kill_grace,
                                on_close=lambda: release_port(port))

    def spec_for(self, pipe: SupervisedPipeline, rank: int, env: dict[str, str] | None = None,
                 hold: bool = False) -> LaunchSpec:
        slot = pipe.slots[rank]
        plan = pipe.plan
        # A GPU gang's ranks each see every GPU of the gang on their node, in rank order, as under torchrun;
        # alone, a worker sees its own. TORCHHERD_GPUS names a rank's own among those it sees (with one GPU a
        # rank, the one its LOCAL_RANK indexes), and it starts on the first of them.
        gang_gpus = tuple(g.index for s in pipe.slots if s.node == slot.node for g in s.gpus) \
            if len(pipe.slots) > 1 else ()
        local_rank = node_ranks([s.node for s in pipe.slots], rank)[0]
        own = tuple(range(local_rank * len(slot.gpus), (local_rank + 1) * len(slot.gpus)))
        device = cuda_device(own[0]) if slot.device == "cuda" else slot.device
        if slot.gpus:
            env = {**(env or {}), GPUS_VARIABLE: ",".join(map(str, own if gang_gpus else range(len(slot.gpus))))}
        hang = plan.run_config.restart.hang_timeout
        return LaunchSpec(
            child=WorkerSpec(pipeline=sized(plan.config, len(pipe.slots)).model_dump(mode="json"),
                             validation={**plan.run_config.validation.model_dump(mode="json"),
                                         "mode": plan.validation.mode},
                             device=device, threads=slot.threads,
                             pipeline_dir=str(self._rundir.pipeline_dir(pipe.name).absolute()), attempt=pipe.attempts,
                             # rank 0 alone hands snapshots to the validator (its node's, on a cluster)
                             snapshot_dir=str(self._validation.hand_off_dir(
                                 pipe.name, slot.node, runner_for(plan.config.kind).checkpoint_name("best")))
                             if plan.background and rank == 0 else "",
                             snapshot_seq=self._validation.ledger(pipe.name).seq_max,
                             rank=rank, world_size=len(pipe.slots),
                             collective_timeout=max(COLLECTIVE_TIMEOUT, 4 * hang) if hang else COLLECTIVE_TIMEOUT,
                             stop_timeout=plan.run_config.restart.stop_timeout, hold=hold),
            log_path=self._rundir.log_path(pipe.name, rank),
            gpu_index=slot.gpu.index if slot.gpu is not None else None, env=env or {}, node=slot.node,
            gang_gpus=gang_gpus, own_gpus=tuple(g.index for g in slot.gpus) if len(slot.gpus) > 1 else (),
            gpu_share=slot.share)
