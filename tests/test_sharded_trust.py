"""A sharded (`fsdp`) checkpoint is data too: DCP's `.metadata` unpickles only DCP's own records, its byte items
and trainer.pt load with torch.load(weights_only=True), and a file that would import anything else is refused,
naming it, unless the pipeline's `trust_checkpoints` says the files are the user's own.

Real DCP checkpoints, written in one process (DCP's no-process-group mode), then a real `fsdp` gang's run folder
resumed with `torchherd resume`.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_saver import save

from tests.conftest import make_config
from tests.test_checkpoint_trust import RunsCode, UsersOwn
from tests.test_resume import cli
from tests.test_sharded import fsdp, inventory, stop_after
from torchherd.engine.protocol.messages import PipelineFinished, Resumed, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.runners.task import sharded_checkpoint as sharded
from torchherd.engine.runners.task.dcp_data import read_metadata
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.engine.worker.checkpoint import CheckpointRefused

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def model() -> torch.nn.Module:
    """Layers of two dtypes and an integer buffer."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2).to(torch.bfloat16))
    net.register_buffer("counts", torch.zeros(3, dtype=torch.long))
    return net


def trained(tag: object = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model trained a step by Adam (its state and param groups to save), `tag` in its param group."""
    torch.manual_seed(0)
    net = model()
    net.counts += 5
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    opt.param_groups[0]["tag"] = tag
    net[1](net[0](torch.ones(5, 3)).to(torch.bfloat16)).float().sum().backward()
    opt.step()
    return net, opt


def fresh(tag: object = "placeholder") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """What a resumed attempt loads into: the model as built, an optimizer with no state yet (and the param
    group's key a checkpoint with `tag` fills)."""
    torch.manual_seed(1)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.5)
    opt.param_groups[0]["tag"] = tag
    return net, opt


def write(path: Path, tag: object = None) -> Path:
    """A real DCP checkpoint folder as save_sharded writes one (its shards, `.metadata`, trainer.pt)."""
    net, opt = trained(tag)
    model_state, optim_state = get_state_dict(net, opt)
    save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path), no_dist=True)
    torch.save({"step": 9, "epoch": 1, "rng": torch.get_rng_state()}, path / sharded.TRAINER_FILE)
    return path


def test_a_real_sharded_checkpoint_reads_as_data_and_loads_whole(tmp_path):
    path = write(tmp_path / "last.dcp")
    with open(path / ".metadata", "rb") as fh:
        assert read_metadata(path) == pickle.load(fh)  # every record DCP writes, allowed and built alike
    net, opt = fresh()
    state = sharded.load_sharded(path, net, opt)
    saved_net, saved_opt = trained()
    assert state["step"] == 9 and opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["tag"] is None
    for mine, theirs in zip(net.state_dict().values(), saved_net.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs) and mine.dtype == theirs.dtype
    assert torch.equal(opt.state_dict()["state"][2]["exp_avg"], saved_opt.state_dict()["state"][2]["exp_avg"])


def plant_metadata(path: Path, marker: Path) -> Path:
    metadata = path / ".metadata"
    metadata.write_bytes(pickle.dumps(RunsCode(marker)))
    return metadata


def test_a_planted_metadata_is_refused_naming_the_file_and_what_it_names_and_runs_nothing(tmp_path):
    # Regression: DCP's FileSystemReader pickle.load-ed `.metadata`: a planted one ran os.system on resume.
    marker = tmp_path / "ran"
    metadata = plant_metadata(write(tmp_path / "last.dcp"), marker)
    net, opt = fresh()
    with pytest.raises(CheckpointRefused) as refused:
        sharded.load_sharded(metadata.parent, net, opt)
    text = str(refused.value)
    assert f"{metadata}: refused to unpickle: it names posix.system" in text and "trust_checkpoints" in text
    assert "\n" not in text
    assert not marker.exists()


@pytest.mark.parametrize("hostile", ["item", "trainer"])
def test_a_byte_item_or_trainer_state_that_would_import_code_is_refused_unless_trusted(tmp_path, hostile):
    # Regression: DCP's default planner loaded byte items (param groups) with torch.load(weights_only=False).
    marker = tmp_path / "ran"
    path = write(tmp_path / "last.dcp", tag=RunsCode(marker) if hostile == "item" else None)
    if hostile == "trainer":
        torch.save({"step": 9, "epoch": 1, "payload": RunsCode(marker)}, path / sharded.TRAINER_FILE)
    net, opt = fresh()
    with pytest.raises(CheckpointRefused) as refused:
        sharded.load_sharded(path, net, opt)
    named = path / ("__0_0.distcp" if hostile == "item" else sharded.TRAINER_FILE)
    assert f"{named}: refused to load: it would import posix.system" in str(refused.value)
    assert not marker.exists()


def test_a_trusted_sharded_checkpoint_of_the_users_own_objects_loads(tmp_path):
    path = write(tmp_path / "last.dcp", tag=UsersOwn(7))
    net, opt = fresh()
    with pytest.raises(CheckpointRefused, match="UsersOwn"):
        sharded.load_sharded(path, net, opt)
    assert sharded.load_sharded(path, net, opt, trusted=True)["step"] == 9
    assert opt.param_groups[0]["tag"].value == 7


@pytest.mark.slow
async def test_resuming_an_fsdp_run_folder_with_a_planted_metadata_refuses_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    cfg = make_config(tmp_path, [fsdp(max_epochs=3, params={"samples": 512, "delay": 0.002})],
                      validation={"mode": "off"}, telemetry={"enabled": False})
    sup = Supervisor(cfg, inventory=inventory())
    first, _ = await stop_after(sup, 2)
    assert first.status == "stopped"
    last = sup.run_dir / "f" / "checkpoints" / "last.dcp"
    assert sharded.complete(last)
    metadata = plant_metadata(last, marker)

    again = cli("resume", str(sup.run_dir), "--headless")
    text, _ = again.communicate(timeout=240)
    events = read_events(sup.run_dir)
    [finished] = [e for e in events if isinstance(e, PipelineFinished) and e.time > first.time]
    assert finished.status == "failed", text[-3000:]
    said = f"CheckpointRefused: {metadata}: refused to unpickle: it names posix.system"
    assert said in finished.reason and said in text and again.returncode != 0
    assert not [e for e in events if isinstance(e, Resumed)]
    assert len([e for e in events if isinstance(e, WorkerStarted) and e.time > first.time]) == 1  # no retry
    assert not marker.exists()
