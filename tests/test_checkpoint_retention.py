"""`keep_last` rotation and fallback (worker/checkpoint.py), and the background writer's staging
(worker/checkpoint_writer.py): what is saved is the state at the save, whatever training does after it."""
from __future__ import annotations

import torch

from torchherd.engine.worker import checkpoint as ckpt
from torchherd.engine.worker.checkpoint_writer import CheckpointWriter


def test_older_checkpoints_shift_and_load_latest_falls_back_through_them_in_order(tmp_path):
    for step in range(5):
        ckpt.save_checkpoint(tmp_path, {"model": {}, "step": step}, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt", "prev2.pt"]
    (tmp_path / "last.pt").write_bytes(b"torn")
    (tmp_path / "prev.pt").write_bytes(b"torn")
    state, path, note = ckpt.load_latest(tmp_path)
    assert path is not None and path.name == "prev2.pt" and state is not None and state["step"] == 2
    assert "last.pt unreadable" in note and "prev.pt unreadable" in note and note.endswith("resumed from prev2.pt")
    ckpt.save_checkpoint(tmp_path, {"model": {}, "step": 5}, keep=1)  # fewer kept now: the older ones go
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_the_writer_saves_the_state_as_it_was_when_saved(tmp_path):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    landed: list[tuple[str, int]] = []
    writer = CheckpointWriter(tmp_path, keep=2, say=lambda text: None)
    expected = []
    for step in range(3):
        expected.append(model.weight.detach().clone())
        writer.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt.LAST,
                    lambda path, blocked, took, step=step: landed.append((path.name, step)), lambda exc: None)
        with torch.no_grad():  # training changes the weights at once; the staged copy is not touched
            model.weight.add_(1.0)
    writer.close()
    assert landed == [("last.pt", 0), ("last.pt", 1), ("last.pt", 2)]
    last = torch.load(tmp_path / ckpt.LAST, weights_only=True)
    prev = torch.load(tmp_path / ckpt.PREV, weights_only=True)
    assert torch.equal(last["model"]["weight"], expected[2]) and torch.equal(prev["model"]["weight"], expected[1])
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(last["model"])
    torch.optim.Adam(fresh.parameters()).load_state_dict(last["optimizer"])
