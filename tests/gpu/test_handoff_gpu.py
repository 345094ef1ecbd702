"""The hand-off on a real GPU: exact snapshots, a stall of about one on-device copy, one copy in flight.

Skipped without CUDA (`python -m pytest -m gpu -rs` says so). The slots go under /dev/shm, as a run's do:
CUDA cannot page-lock a writable mapping of an ordinary file on recent kernels.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from torchherd.engine.protocol.messages import SnapshotTaken, ValResult
from torchherd.engine.worker import cuda_copy
from torchherd.engine.worker.copy_engine import BLOCKING, DIRECT, STAGED
from torchherd.engine.worker.snapshot import IN_FLIGHT, SnapshotReader, SnapshotWriter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
              pytest.mark.xdist_group("gpu")]  # never beside test_gpus.py on the same GPUs

WAIT = 60.0  # seconds: a bound on waiting for a copy to land, never a pause


@pytest.fixture
def shm():
    """A private folder under /dev/shm (else the temp folder), removed afterwards."""
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="torchherd-gpu-test-", dir=where))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def room(path: Path, nbytes: int, slots: int = 2) -> None:
    """Skip when `path`'s filesystem cannot hold the slots (a container's /dev/shm is often 64 MiB)."""
    st = os.statvfs(path)
    if st.f_bavail * st.f_frsize < slots * nbytes * 1.2:
        pytest.skip(f"{path} has too little room for {slots} slots of {nbytes / 2**20:.0f} MiB")


class Mixed(nn.Module):
    """float32 weights, a bfloat16 buffer and BatchNorm's int64 counter: every kind a state dict holds."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)
        self.register_buffer("scale", torch.randn(width, dtype=torch.bfloat16))  # ("half" is a Module method)


def cuda_model(width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    model = Mixed(width).cuda()
    model.norm.num_batches_tracked.fill_(7)
    return model


def on_cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def read_back(directory: Path, width: int = 256) -> dict[str, torch.Tensor]:
    reader = SnapshotReader(directory)
    found = reader.newest()
    assert found is not None, "no snapshot published"
    target = Mixed(width)
    assert reader.load_into(target, found[0]) is not None
    return on_cpu(target)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def bump(model: nn.Module) -> None:
    """What an optimizer step does right after a hand-off: change every weight in place, on the current stream."""
    with torch.no_grad():
        for t in model.state_dict().values():
            t.add_(1)


@pytest.mark.parametrize("staging", [True, False])
def test_a_cuda_snapshot_round_trips_exactly_though_training_changes_the_weights_at_once(shm, staging):
    model = cuda_model()
    writer = SnapshotWriter(shm / "p", model, 2, "latest", False, {}, staging=staging)
    assert writer.engine.name == (STAGED if staging else DIRECT)
    assert writer.engine.staging_bytes == (writer.nbytes if staging else 0)
    expected = on_cpu(model)
    info = writer.hand_off(epoch=0, step=1)
    bump(model)  # queued behind the hand-off's copy from the live weights: the snapshot must not see it
    assert info["dropped"] is False and writer.flush(WAIT)
    assert same(read_back(shm / "p"), expected)
    assert SnapshotReader(shm / "p").meta["staging_bytes"] == writer.engine.staging_bytes
    writer.close()


def test_the_slots_are_page_locked_while_the_writer_is_open(shm):
    writer = SnapshotWriter(shm / "p", cuda_model(), 2, "latest", False, {})
    assert writer.notices == [], writer.notices
    assert len(writer.engine.pinned) == 2 and all(buf.is_pinned() for buf in writer.slots)
    writer.close()
    assert not any(buf.is_pinned() for buf in writer.slots)


def test_never_two_copies_in_flight(shm):
    model = cuda_model()
    writer = SnapshotWriter(shm / "p", model, 2, "latest", False, {})
    torch.cuda._sleep(200_000_000)  # the current stream is busy, so the side stream's copy cannot have landed
    first = writer.hand_off(epoch=0, step=1)
    second = writer.hand_off(epoch=0, step=2)
    assert first["dropped"] is False
    assert second["dropped"] is True and second["reason"] == IN_FLIGHT and second["slot"] == -1
    assert writer.flush(WAIT) and not writer.in_flight()
    assert SnapshotReader(shm / "p").newest()[1] == first["seq"]
    assert writer.hand_off(epoch=0, step=3)["dropped"] is False
    writer.close()


@pytest.mark.parametrize("staging", [True, False])
def test_slots_cuda_will_not_page_lock_fall_back_to_pageable_memory(shm, monkeypatch, staging):
    monkeypatch.setattr(cuda_copy, "page_lock", lambda buf: "refused by the test")
    model = cuda_model()
    writer = SnapshotWriter(shm / "p", model, 2, "latest", False, {}, staging=staging)
    assert len(writer.notices) == 1 and "refused by the test" in writer.notices[0]
    assert writer.engine.pinned == []
    expected = on_cpu(model)
    writer.hand_off(epoch=0, step=1)
    bump(model)
    assert writer.flush(WAIT)
    assert same(read_back(shm / "p"), expected)
    writer.close()


def test_a_refused_registration_does_not_surface_as_the_next_kernels_error():
    buf = torch.zeros(1 << 20, dtype=torch.uint8)
    assert cuda_copy.page_lock(buf) is None
    try:
        assert cuda_copy.page_lock(buf) is not None  # registered already: refused, and CUDA keeps the error
        cuda_copy.forget_cuda_error(torch.device("cuda", torch.cuda.current_device()))
        assert torch.ones(4, device="cuda").mul_(2).sum().item() == 8  # no stale error raised here
    finally:
        assert cuda_copy.page_unlock(buf) is None


def test_weights_on_two_devices_take_the_blocking_copy(shm):
    model = nn.Sequential(nn.Linear(8, 8).cuda(), nn.Linear(8, 8))  # one GPU and the CPU
    writer = SnapshotWriter(shm / "p", model, 2, "latest", False, {})
    assert writer.engine.name == BLOCKING
    writer.hand_off(epoch=0, step=1)
    reader = SnapshotReader(shm / "p")
    assert reader.newest() is not None
    writer.close()


def held(fn) -> float:
    """Seconds the current stream is held by `fn`: its host time plus the stream catching up (not other streams)."""
    main = torch.cuda.current_stream()
    main.synchronize()
    start = time.perf_counter()
    fn()
    main.synchronize()
    return time.perf_counter() - start


def test_the_training_stall_is_a_few_on_device_copies_of_the_same_bytes(shm):
    width = 4096  # 4096 x 4096 float32: 64 MiB of weights in one tensor, plus a little
    nbytes = width * width * 4
    room(shm, nbytes)
    model = cuda_model(width)
    writer = SnapshotWriter(shm / "p", model, 2, "latest", False, {})
    src = torch.empty(writer.nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stalls, copies = [], []
    for i in range(12):
        stalls.append(held(lambda: writer.hand_off(epoch=0, step=i)))
        copies.append(held(lambda: dst.copy_(src)))
        assert writer.flush(WAIT)
    stall, copy = statistics.median(stalls[2:]), statistics.median(copies[2:])
    # Generous: the ratio is about 1 plus the hand-off's own bookkeeping; the old pageable copy was ~100x.
    assert stall <= 5 * copy + 0.5e-3, f"stall {stall * 1e3:.2f} ms vs on-device copy {copy * 1e3:.2f} ms"
    writer.close()


@pytest.mark.slow
async def test_a_gpu_run_validates_exactly_the_weights_it_handed_off(tmp_path):
    from tests.conftest import make_config
    from tests.test_validation import background, of, run_to_end
    from torchherd.engine.supervise.supervisor import Supervisor

    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.002}}], defaults={"max_epochs": 3},
                         devices={"placement": [0]}, validation=background(policy="all", slots=4, checksum=True))
    events = await run_to_end(Supervisor(config))
    taken, results = of(events, SnapshotTaken), of(events, ValResult)
    assert [t.epoch for t in taken] == [0, 1, 2] and not any(t.dropped for t in taken)
    by_seq = {t.seq: t.checksum for t in taken}
    assert sorted(r.seq for r in results) == sorted(by_seq)  # the last one too: published before the exit
    # The worker sums on the GPU, the validator on the CPU: the same weights, summed in another order.
    assert all(r.checksum == pytest.approx(by_seq[r.seq], rel=1e-9) for r in results)
