"""The background checkpoint writer on a real GPU: a CUDA model's state is staged into pinned host memory on a
side stream, and the file holds the state at the save, whatever training does to the weights on the device right
after it (worker/checkpoint_writer.py; the CPU twin is in tests/test_checkpoint_retention.py).

Skipped without CUDA (`python -m pytest -m gpu -rs` says so).
"""
from __future__ import annotations

import pytest
import torch

from torchherd.engine.worker import checkpoint as ckpt
from torchherd.engine.worker.checkpoint_writer import CheckpointWriter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available"),
              pytest.mark.xdist_group("gpu")]


def test_a_cuda_models_checkpoint_is_the_state_at_the_save_and_loads_back(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512)).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 512, device="cuda")).sum().backward()
    opt.step()
    said: list[str] = []
    landed: list[tuple[float, float]] = []
    writer = CheckpointWriter(tmp_path, keep=2, say=said.append)
    expected = []
    for step in range(3):
        expected.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        writer.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt.LAST,
                    lambda path, blocked, took: landed.append((blocked, took)), lambda exc: None, step)
        with torch.no_grad():  # training goes on at once, on the device
            for p in model.parameters():
                p.mul_(1.5)
    writer.close()
    assert len(landed) == 3 and all(took > 0 for _, took in landed)
    last = torch.load(tmp_path / ckpt.LAST, weights_only=True)
    assert last["step"] == 2
    for key, value in expected[2].items():
        assert torch.equal(last["model"][key], value), key
    assert all(t.device.type == "cpu" for t in last["model"].values())  # written from host memory
    fresh = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512)).cuda()
    fresh.load_state_dict(last["model"])
    torch.optim.Adam(fresh.parameters()).load_state_dict(last["optimizer"])
