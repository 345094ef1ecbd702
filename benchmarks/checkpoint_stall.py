"""How long a checkpoint holds training: a Task's background writer (staging only) against today's synchronous
save_checkpoint (torch.save, fsync, rename on the training thread) and a bare copy of the state (a clone of every
tensor), for a model whose parameters and Adam state take ~256 MiB on the CPU.

Each round measures the three in turn (alternating which goes first), after one unmeasured save of each so the
writer's staging memory exists, as it does from a run's second checkpoint on; medians of the rounds with their
spread, and the ratios async/bare (goal <= 1.5) and async/sync (goal <= 0.2).
Usage: python benchmarks/checkpoint_stall.py [--quick] [--rounds N] [--mib M] [--dir DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torchherd.engine.worker import checkpoint as ckpt  # noqa: E402
from torchherd.engine.worker.checkpoint_writer import CheckpointWriter  # noqa: E402

WIDTH = 1024  # features per layer: a layer is WIDTH x WIDTH weights plus WIDTH biases


def build(mib: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of square Linear layers and an Adam that has stepped once: 12 bytes per parameter in all."""
    width = WIDTH if mib >= 64 else 64
    layers = max(1, round(mib * 2**20 / 12 / (width * width + width)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    return model, opt


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "rng": {"torch": torch.get_rng_state()}}


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:9.1f} ms  (spread {min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny state (1 MiB): only that every path runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=float, default=256.0, help="MiB of parameters and Adam state")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder)")
    args = parser.parse_args()
    mib = 1.0 if args.quick else args.mib
    model, opt = build(mib)
    nbytes = sum(t.numel() * t.element_size() for t in [*model.state_dict().values(),
                                                         *(v for s in opt.state.values() for v in s.values())])
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        writes: list[float] = []
        writer = CheckpointWriter(folder / "async", keep=2, say=lambda text: None)
        step = [0]

        def run_async() -> None:
            writer.save(state_of(model, opt, step[0]), ckpt.LAST, lambda p, b, w: writes.append(w),
                        lambda exc: print(f"checkpoint failed: {exc}", file=sys.stderr))

        def run_sync() -> None:
            ckpt.save_checkpoint(folder / "sync", state_of(model, opt, step[0]))

        def run_bare() -> None:
            state = state_of(model, opt, step[0])
            [t.clone() for t in (*state["model"].values(), *(v for s in state["optimizer"]["state"].values()
                                                             for v in s.values() if torch.is_tensor(v)))]

        ways = {"bare copy (clone)": run_bare, "async (staging only)": run_async, "sync save_checkpoint": run_sync}
        times: dict[str, list[float]] = {name: [] for name in ways}
        for fn in ways.values():  # unmeasured: the writer's staging memory, the folders, the page cache
            fn()
        writer.wait()
        for r in range(args.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                step[0] += 1
                times[name].append(timed(ways[name]))
                writer.wait()  # the write in flight lands before the next measurement, out of the clock
        writer.close()
    print(f"checkpoint stall: {nbytes / 2**20:.0f} MiB of model and Adam state on the CPU, {args.rounds} rounds, "
          f"training blocked per checkpoint")
    for name, values in times.items():
        print(f"  {name:<22} {spread(values)}")
    print(f"  (the async write itself, on its thread: {spread(writes[1:])})")
    med = {name: statistics.median(values) for name, values in times.items()}
    bare, asyn, sync = med["bare copy (clone)"], med["async (staging only)"], med["sync save_checkpoint"]
    print(f"ratio async/bare {asyn / bare:.2f}x (goal <= 1.5); ratio async/sync {asyn / sync:.3f}x (goal <= 0.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
