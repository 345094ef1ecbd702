"""What a hand-off costs training on a GPU, against the copies it is made of, measured in one run.

Prints the training stall per hand-off over an on-device copy of the same bytes (staged, and with
`handoff_staging = false`), the asynchronous copy's bandwidth to shared memory over a plain
`tensor.to('cpu', non_blocking=True)` into pinned memory, and the blocking pageable copy hand-offs used to make.
Run: python benchmarks/handoff_gpu.py (MIB=1024 for a bigger model); without CUDA it says so and exits 0.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from torchherd.engine.worker.snapshot import SnapshotWriter  # noqa: E402

MIB = int(os.environ.get("MIB", "512"))  # weights to hand off, in MiB
ROUNDS = int(os.environ.get("ROUNDS", "20"))


def model(mib: int) -> nn.Module:
    """A stack of square float32 layers holding about `mib` MiB of weights (the shape of a real model's bulk)."""
    width = 2048  # 16 MiB per layer
    layers = max(1, mib // 16)
    return nn.Sequential(*[nn.Linear(width, width, bias=True) for _ in range(layers)]).cuda()


def held(fn) -> float:
    """Seconds the current stream is held by `fn`: its host time, then the stream catching up; other streams not."""
    main = torch.cuda.current_stream()
    main.synchronize()
    start = time.perf_counter()
    fn()
    main.synchronize()
    return time.perf_counter() - start


def landed(writer: SnapshotWriter) -> float:
    """Seconds from a hand-off's call until its snapshot is published (the asynchronous copy included)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    writer.hand_off(0, 0)
    writer.flush()
    return time.perf_counter() - start


def median(fn, rounds: int = ROUNDS) -> float:
    times = [fn() for _ in range(rounds + 2)][2:]  # two to warm up
    return statistics.median(times)


def measure(folder: Path, net: nn.Module) -> None:
    staged = SnapshotWriter(folder / "staged", net, 2, "latest", False, {}, staging=True)
    nbytes = staged.nbytes
    gib = nbytes / 2**30
    flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    twin = torch.empty_like(flat)
    device_copy = median(lambda: held(lambda: twin.copy_(flat)))
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned_copy = median(lambda: held(lambda: pinned.copy_(flat, non_blocking=True)))

    def staged_stall() -> float:
        staged.flush()
        return held(lambda: staged.hand_off(0, 0))

    stall = median(staged_stall)
    trip = median(lambda: landed(staged))
    print(f"device: {torch.cuda.get_device_name()}; {nbytes / 2**20:.0f} MiB of weights in "
          f"{len(staged.tensors)} tensors; median of {ROUNDS}; copy engine {staged.engine.name}, "
          f"{len(staged.notices)} notice(s) {staged.notices}")
    print(f"on-device copy {device_copy * 1e3:.2f} ms; pinned D2H copy {pinned_copy * 1e3:.2f} ms "
          f"({gib / pinned_copy:.1f} GiB/s)")
    print(f"staged hand-off: stall {stall * 1e3:.3f} ms = {stall / device_copy:.2f}x the on-device copy "
          f"(goal <= 2); published after {trip * 1e3:.2f} ms")
    print(f"async copy bandwidth {gib / trip:.1f} GiB/s / pinned memcpy {gib / pinned_copy:.1f} GiB/s = "
          f"{pinned_copy / trip:.2f} (goal >= 0.8)")
    staged.close()

    direct = SnapshotWriter(folder / "direct", net, 2, "latest", False, {}, staging=False)

    def direct_stall() -> float:
        direct.flush()
        return held(lambda: direct.hand_off(0, 0))

    print(f"handoff_staging = false: stall {median(direct_stall) * 1e3:.2f} ms "
          f"(the copy over the bus, on training's stream)")
    direct.close()
    views = [torch.empty(t.shape, dtype=t.dtype) for t in staged.tensors]  # pageable, as slots were before

    def pageable() -> None:
        for view, t in zip(views, staged.tensors):
            view.copy_(t)

    old = median(lambda: held(pageable))
    print(f"the blocking pageable copy per tensor (every hand-off before): {old * 1e3:.2f} ms = "
          f"{old / stall:.0f}x the staged stall")


def main() -> None:
    if not torch.cuda.is_available():
        print("handoff_gpu: needs CUDA (torch.cuda.is_available() is False here); nothing measured")
        return
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = Path(tempfile.mkdtemp(prefix="torchherd-handoff-bench-", dir=where))
    try:
        st = os.statvfs(folder)
        room = st.f_bavail * st.f_frsize / 2**20  # MiB
        mib = MIB
        if room < 4.5 * mib:  # two writers of two slots each
            mib = int(room / 4.5) // 16 * 16
            print(f"{folder.parent} holds {room:.0f} MiB free: measuring {mib} MiB of weights, not {MIB}")
        measure(folder, model(max(mib, 16)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
