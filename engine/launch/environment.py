"""The environment of every supervised child, built in this one place: GPU visibility, threads, torchrun's
variables for a gang's rank, unbuffered output.

GPU visibility follows torchrun: every rank of a gang sees the gang's GPUs, in rank order, and uses
`cuda:{LOCAL_RANK}`; a child that runs alone sees its own GPU only, as `cuda:0`.

Each backend says only what it knows (this machine's environment to inherit, whether its host
sets CUDA_VISIBLE_DEVICES itself); the variables and their values are decided here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

GPUS_VARIABLE = "TORCHHERD_GPUS"  # a GPU child's own GPUs, as CUDA numbers those it sees: "0", "2,3"


def child_env(extra: Mapping[str, str], threads: int, gpus: Sequence[int], *, inherit: Mapping[str, str] | None = None,
              gpu_set_by_host: bool = False, pci_order: bool = True) -> dict[str, str]:
    """The environment of one child.

    `extra`: the launch spec's own variables (a gang rank's `rank_env`); `threads`: the CPU threads of
    its slot; `gpus`: the GPUs it sees, in the order CUDA will number them (indices as CUDA counts on its
    machine): a gang's rank sees every GPU of its gang and its LOCAL_RANK picks its own, as under torchrun;
    one that runs alone sees its own; () for none;
    `inherit`: the environment it starts from (this process's, locally; a remote host adds its own);
    `gpu_set_by_host`: the host decides what it sees and sets CUDA_VISIBLE_DEVICES (Ray does for a GPU actor);
    `pci_order`: CUDA counts GPUs as NVML does, so `gpus` are NVML indices (this machine's inventory).
    """
    env = dict(inherit or {})
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"  # the log file shows prints as they happen
    if gpu_set_by_host:
        return env
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU: a CPU child must not grab one (a Ray CPU actor sees all)
        env.setdefault("OMP_NUM_THREADS", str(threads))  # its slot's share of the cores, unless the user set it
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus)
        if pci_order:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML and CUDA agree on indices
    return env


def visible_devices(gpus: Sequence[int | str]) -> str:
    """CUDA_VISIBLE_DEVICES naming `gpus` in this order: "2,5" (the same string for every rank of a gang)."""
    return ",".join(str(g) for g in gpus)


def cuda_device(local_rank: int) -> str:
    """A GPU worker's device: its own GPU among those it sees, which LOCAL_RANK indexes ("cuda:0" alone)."""
    return f"cuda:{local_rank}"


def node_ranks(nodes: Sequence[str], rank: int) -> tuple[int, int, int, int]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE) of `rank` in a gang whose ranks run on
    `nodes` (one entry a rank, grouped by node, rank 0's first), as torchrun sets them on each node."""
    order = list(dict.fromkeys(nodes))
    peers = [r for r, node in enumerate(nodes) if node == nodes[rank]]
    return peers.index(rank), len(peers), order.index(nodes[rank]), len(order)


def rank_env(rank: int, world: int, port: int, restarts: int, max_restarts: int, run_id: str,
             addr: str = "127.0.0.1", nodes: Sequence[str] = ()) -> dict[str, str]:
    """What torchrun sets for one rank, so a script written for it runs unchanged: --standalone's values on
    one node, or per node when `nodes` (each rank's node) names several."""
    local, local_world, group, groups = node_ranks(nodes, rank) if nodes else (rank, world, 0, 1)
    return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(groups),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default", "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": str(restarts), "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id, "TORCHHERD_RESTART_COUNT": str(restarts)}
