"""The workload of benchmarks/recovery.py: one model, data set and batch, trained as a torchherd Task gang
(`build`) and by a plain DDP loop under torchrun (run this file: `torchrun ... _recovery_torchrun.py LINES`).

The plain loop saves model and optimizer with torch.save every epoch (torchherd's Task checkpoint interval),
resumes from that file when torchrun restarts it, and appends a line with the wall-clock time per step to LINES.
"""
from __future__ import annotations

import time

STARTED = time.time()  # before torch's import: a restarted rank's first moment, for the breakdown

import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

QUICK = "TORCHHERD_BENCH_QUICK"  # "1": the least size (recovery.py --quick sets it for both ways)
# hidden width, hidden layers, samples, samples per rank per step
WIDTH, LAYERS, SAMPLES, BATCH = (32, 1, 256, 32) if os.environ.get(QUICK) == "1" else (512, 4, 4096, 32)
RANKS = 2
STEPS_PER_EPOCH = SAMPLES // (BATCH * RANKS)  # the checkpoint interval of both ways, in optimizer steps


def model() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(16, WIDTH), nn.ReLU()]
    layers += [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 16, generator=g)
    return TensorDataset(x, x[:, :4].sum(dim=1, keepdim=True))


def optimizer(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(net.parameters(), lr=1e-4)


def build(params):
    from torchherd import Task

    net = model()
    return Task(model=net, optimizer=optimizer(net), train_data=data(), loss_fn=nn.functional.mse_loss)


def plain_ddp(lines: str, epochs: int) -> None:
    """What a user writes without torchherd: DDP over gloo, a checkpoint each epoch, resumed on a restart."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = open(lines, "a", buffering=1)
    out.write(f"rank {rank} restart {restart} pid {os.getpid()} started {STARTED:.6f} joined {time.time():.6f}\n")
    net = model()
    opt = optimizer(net)
    path = os.path.join(os.path.dirname(os.path.abspath(lines)), "plain.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        if rank == 0:
            out.write(f"resumed {step} at {time.time():.6f}\n")
    ddp = DistributedDataParallel(net)
    train = data()
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=BATCH, sampler=sampler, drop_last=True)
    for epoch in range(step // STEPS_PER_EPOCH, epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if rank == 0:
                out.write(f"step {step} restart {restart} at {time.time():.6f}\n")
        if rank == 0:
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
            os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(plain_ddp(sys.argv[1], int(sys.argv[2])))
