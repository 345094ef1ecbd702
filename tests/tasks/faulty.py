"""A tiny regression task for the fault tests: every way user code can misbehave, one knob each.

Params (all optional):
  samples, delay, lr, seed    data size, seconds per item (makes epochs take a known while), SGD lr
  fault                       "raise", "oom", "segv", "nan" or "hang", at forward call `fault_at_call`
  fault_at_call               the forward call (training and validation calls count) that misbehaves
  once_file                   a marker path: the fault fires only while it does not exist, and creates it,
                              so the restarted attempt proceeds
  ignore_sigterm              set SIGTERM to SIG_IGN in the worker and in its DataLoader workers
  ballast_mb                  a buffer of this many MiB in the state dict: big, slow checkpoints
  disk_full_file              while this path exists, torch.save writes a little and fails with ENOSPC
  save_gate_file, save_gate_after
                              after `save_gate_after` (default 0) 'last' checkpoints, each one's torch.save waits
                              (its temporary file open, a little written) until `save_gate_file` exists: a slow disk
  gate_file, gate_at_call     at forward call `gate_at_call` the worker waits until `gate_file` exists, so a
                              test can keep a pipeline running until it has done its part
"""
import errno
import os
import signal
import threading
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from torchherd.engine import Task


class Slow(Dataset):
    """Synthetic y = 3*sum(x) + 1; each item can take `delay` seconds."""

    def __init__(self, n, delay, seed, ignore_sigterm=False):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True) * 3 + 1
        self.delay = delay
        self.ignore_sigterm = ignore_sigterm

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.ignore_sigterm:
            # In a DataLoader worker this runs in the forked child: make it stubborn too.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


class Faulty(nn.Module):
    def __init__(self, fault, at_call, once_file, ballast_mb, gate=(None, None)):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.calls = 0
        self.fault, self.at_call, self.once_file = fault, at_call, once_file
        self.gate_file, self.gate_at_call = gate
        if ballast_mb:
            # Random, so nothing downstream can shortcut it; a buffer, so the optimizer ignores it.
            self.register_buffer("ballast", torch.rand(int(ballast_mb * 2**20 / 4)))

    def _fire(self) -> bool:
        if self.fault is None or self.at_call is None or self.calls < self.at_call:
            return False
        if self.once_file is None:
            return True
        if os.path.exists(self.once_file):
            return False
        open(self.once_file, "w").close()
        return True

    def _wait_at_gate(self) -> None:
        if self.gate_file is None or self.calls != self.gate_at_call:
            return
        deadline = time.monotonic() + 300.0  # bounded: a test that never opens it fails, it does not hang
        while not os.path.exists(self.gate_file) and time.monotonic() < deadline:
            time.sleep(0.01)

    def forward(self, x):
        self.calls += 1
        self._wait_at_gate()
        if self._fire():
            if self.fault == "raise":
                raise RuntimeError("faulty task exploded on purpose")
            if self.fault == "oom":
                # What the CUDA caching allocator raises, type and message, without needing a GPU.
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 7.79 GiB "
                    "of which 1.02 GiB is free. Of the allocated memory 6.50 GiB is allocated by PyTorch.")
            if self.fault == "segv":
                import ctypes
                ctypes.string_at(0)
            if self.fault == "hang":
                threading.Event().wait()  # blocks forever, like a deadlocked collective
            if self.fault == "nan":
                return self.lin(x) * float("nan")  # the weights turn NaN too, as in a real blow-up
        return self.lin(x)


def _fail_saves_while(marker: str) -> None:
    """Make torch.save behave like a full disk whenever `marker` exists."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if os.path.exists(marker):
            if hasattr(f, "write"):
                f.write(b"\0" * 4096)  # a partial file, as a full disk leaves one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


def _gate_saves(gate: str, after: int) -> None:
    """Make every 'last' checkpoint's write after the first `after` wait until `gate` exists."""
    real_save = torch.save
    passed = [0]

    def save(obj, f, *args, **kwargs):
        if "last.new" in str(getattr(f, "name", "")):
            passed[0] += 1
            if passed[0] > after:
                f.write(b"\0" * 4096)  # written in part, as a slow disk is mid-way
                f.flush()
                f.seek(0)
                deadline = time.monotonic() + 300.0  # bounded: a test that never opens it fails, it does not hang
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.01)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save


def build(params):
    torch.manual_seed(0)
    ignore = bool(params.get("ignore_sigterm", False))
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if params.get("disk_full_file"):
        _fail_saves_while(params["disk_full_file"])
    if params.get("save_gate_file"):
        _gate_saves(params["save_gate_file"], int(params.get("save_gate_after", 0)))
    model = Faulty(params.get("fault"), params.get("fault_at_call"), params.get("once_file"),
                   float(params.get("ballast_mb", 0)),
                   gate=(params.get("gate_file"), params.get("gate_at_call")))
    data = Slow(int(params.get("samples", 256)), float(params.get("delay", 0.0)), int(params.get("seed", 1)),
                ignore_sigterm=ignore)
    val = Slow(64, 0.0, 2)
    opt = torch.optim.SGD(model.parameters(), lr=float(params.get("lr", 0.05)))
    return Task(model=model, optimizer=opt, train_data=data, val_data=val, loss_fn=nn.functional.mse_loss)
