"""Sharded gangs: peak memory per rank, `fsdp` over `ddp`, and DCP's checkpoint write beside a gather to rank 0.

Two ranks over gloo train the same model of some tens of MiB (Adam) for a few steps, once wrapped
the way torchherd wraps a `ddp` Task gang and once sharded the way it shards an `fsdp` one
(engine/runners/task: Gang.wrap, optimizer_over), each in fresh processes; the peak resident memory a
rank grew by while building and training is its figure (goal: fsdp at most 0.6x ddp), with glibc told to
return freed blocks. Then the fsdp
gang writes its checkpoint both ways, alternating, 3 rounds: torchherd's DCP save (every rank its
shards) and the whole state dict gathered to rank 0 and torch.save'd. Prints medians with the spread.
Run: python benchmarks/fsdp_memory.py [--width 1024] [--layers 16]
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

RANKS = 2
ROUNDS = 3


def rss_peak() -> int:
    """This process's peak resident memory so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def rank_main(rank: int, strategy: str, width: int, layers: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from torchherd.engine.runners.task.distributed import Gang
    from torchherd.engine.runners.task.sharded import optimizer_over

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    gang = Gang.join(rank, RANKS, torch.device("cpu"), 300.0, strategy)
    x, y = torch.randn(16, width), torch.randn(16, width)
    before = rss_peak()
    net = model(width, layers)
    names = {id(p): n for n, p in net.named_parameters()}
    ddp = gang.wrap(net)
    opt = optimizer_over(torch.optim.Adam(net.parameters(), lr=1e-4), net, names)
    forward = ddp if ddp is not None else net
    for _ in range(3):
        torch.nn.functional.mse_loss(forward(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    grew = rss_peak() - before
    lines = [f"{strategy} {rank} memory {grew}"]
    if strategy == "fsdp":
        lines += checkpoint_rounds(gang, net, opt)
    Path(out, f"{strategy}-{rank}.txt").write_text("\n".join(lines))
    dist.barrier()


def checkpoint_rounds(gang, net, opt) -> list[str]:
    """Seconds to write the checkpoint by DCP (every rank its shards) and by gathering to rank 0, alternating."""
    import torch.distributed as dist

    from torchherd.engine.runners.task.sharded import full_state
    from torchherd.engine.runners.task.sharded_checkpoint import save_sharded
    from torchherd.engine.worker.checkpoint import write_atomic

    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) if gang.lead else None
        objs = [target]
        dist.broadcast_object_list(objs)  # every rank writes under rank 0's folder
        folder = objs[0]
        for i in range(ROUNDS):
            ways = ["dcp", "gather"] if i % 2 == 0 else ["gather", "dcp"]
            for way in ways:
                dist.barrier()
                start = time.perf_counter()
                if way == "dcp":
                    save_sharded(folder, "last", net, opt, {"step": i, "epoch": 0}, gang.lead, gang.world)
                else:
                    state = full_state(net)
                    if gang.lead:
                        write_atomic(folder / "whole.pt", {"model": state})
                dist.barrier()  # done when every rank is done
                lines.append(f"{way} {time.perf_counter() - start:.4f}")
        dist.barrier()
    return lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)  # 64 MiB: at 32 MiB fixed costs read 0.65x
    args = parser.parse_args()
    mib = args.layers * (args.width * args.width + args.width) * 4 / 2**20
    print(f"model: {args.layers} x Linear({args.width}, {args.width}), {mib:.1f} MiB of float32 parameters, "
          f"Adam, {RANKS} ranks over gloo")
    # Large blocks straight from mmap, given back when freed: otherwise glibc keeps freed gather buffers in its
    # heap and resident memory counts what the process no longer holds (fsdp read 1.24x ddp that way).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))
    results: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as out:
        for strategy in ("ddp", "fsdp"):
            mp.spawn(rank_main, args=(strategy, args.width, args.layers, free_port(), out), nprocs=RANKS)
        for f in sorted(Path(out).iterdir()):
            results[f.stem] = f.read_text().splitlines()
    memory = {k: int(v[0].split()[-1]) for k, v in results.items()}
    for strategy in ("ddp", "fsdp"):
        per = [memory[f"{strategy}-{r}"] / 2**20 for r in range(RANKS)]
        print(f"{strategy}: peak memory grown per rank " + ", ".join(f"{m:.0f} MiB" for m in per))
    ratio = max(memory[f"fsdp-{r}"] for r in range(RANKS)) / max(memory[f"ddp-{r}"] for r in range(RANKS))
    print(f"peak memory per rank, fsdp / ddp: {ratio:.2f}x (goal <= 0.6x)")
    times: dict[str, list[float]] = {"dcp": [], "gather": []}
    for line in results["fsdp-0"][1:]:
        way, seconds = line.split()
        times[way].append(float(seconds))
    for way, label in (("dcp", "DCP, every rank its shards"), ("gather", "gather to rank 0 + torch.save")):
        t = times[way]
        print(f"checkpoint write, {label}: median {statistics.median(t):.3f} s (spread {min(t):.3f}-{max(t):.3f}, "
              f"{len(t)} rounds)")
    ratio = statistics.median(times["dcp"]) / statistics.median(times["gather"])
    print(f"checkpoint write, DCP / gather: {ratio:.2f}x")


if __name__ == "__main__":
    main()
