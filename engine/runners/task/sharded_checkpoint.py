"""Checkpoints of a sharded (`fsdp`) gang through torch.distributed.checkpoint (DCP): every rank writes its own
shards, and a checkpoint loads into whatever world size the gang has now (no torch import until one is used).

A checkpoint is a folder (`last.dcp`, `prev.dcp`, `best.dcp`): DCP's `.metadata` and one `__RANK_0.distcp`
per rank, `trainer.pt` (rank 0's step, epoch, RNG, scheduler) and `torchherd.json` (the world size that
wrote it), written as `.last.dcp.STEP.tmp` and renamed once every rank's shards are in, so a temporary one is ignored.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...worker import checkpoint as ckpt

if TYPE_CHECKING:
    import torch

SUFFIX = ".dcp"
TRAINER_FILE = "trainer.pt"
INFO_FILE = "torchherd.json"


def folder_name(which: str) -> str:
    """"last.pt" or "last" -> "last.dcp"."""
    return which.split(".")[0] + SUFFIX


def complete(path: Path) -> bool:
    """Whether `path` is a whole checkpoint: DCP's metadata (written once every rank's shards are) and ours."""
    return (path / ".metadata").is_file() and (path / TRAINER_FILE).is_file() and (path / INFO_FILE).is_file()


def written_by(path: Path) -> int:
    """The world size of the gang that wrote the checkpoint at `path`."""
    return int(json.loads((path / INFO_FILE).read_text())["world_size"])


def find_latest(directory: Path) -> Path | None:
    """The newest complete sharded checkpoint in `directory` (last, else prev), or None."""
    for name in ("last", "prev"):
        path = directory / folder_name(name)
        if complete(path):
            return path
    return None


def _clear_temps(directory: Path, stem: str) -> None:
    """Temporary folders of writes that never finished (a rank killed mid-save): never a checkpoint."""
    for tmp in directory.glob(f".{stem}{SUFFIX}.*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, directory: Path, stem: str) -> Path:
    """Rename the finished `tmp` to its checkpoint's name; the `last` it replaces becomes `prev`."""
    final = directory / f"{stem}{SUFFIX}"
    if stem == "last" and final.exists():
        prev = directory / f"prev{SUFFIX}"
        shutil.rmtree(prev, ignore_errors=True)
        os.replace(final, prev)  # until the next line, `prev` is the newest: a crash here resumes from it
    elif final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    ckpt._fsync_dir(directory)
    return final


def _reason(exc: BaseException) -> str:
    """Why a DCP save failed, in a few words: the first rank's error (DCP's own exception, a BaseException, holds
    every failed rank's with its traceback), its OS error's own words where it is one ("No space left on device")."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def begin(directory: Path, which: str, step: int, lead: bool) -> tuple[str, Path]:
    """(stem, temporary folder) of checkpoint `which` ("last", "best") at `step`, which every rank writes its
    shards into: a collective (rank 0 clears what writes that never finished left, the others wait for it)."""
    import torch.distributed as dist

    stem = which.split(".")[0]
    tmp = directory / f".{stem}{SUFFIX}.{step}.tmp"
    if lead:
        directory.mkdir(parents=True, exist_ok=True)
        _clear_temps(directory, stem)
    dist.barrier()  # no rank writes into a folder rank 0 is still clearing
    return stem, tmp


def write_failed(tmp: Path, exc: BaseException, lead: bool) -> ckpt.CheckpointError:
    """The CheckpointError of a DCP write that failed (DCP raises on every rank when any rank's did); rank 0
    removes what the ranks wrote before the failure (on a full disk, the room a next try needs)."""
    if lead:
        shutil.rmtree(tmp, ignore_errors=True)
    return ckpt.CheckpointError(f"could not write {tmp}: {_reason(exc)}")


def finish(tmp: Path, directory: Path, stem: str, extra: dict[str, Any], world: int) -> Path:
    """Rank 0's part once every rank's shards are in `tmp`: `extra` and the world size added, the folder
    published. CheckpointError when that fails, `tmp` removed (never published, its shards only take room)."""
    final = directory / f"{stem}{SUFFIX}"
    try:
        ckpt.write_atomic(tmp / TRAINER_FILE, extra)
        info = {"world_size": world, "step": extra["step"], "epoch": extra["epoch"],
                "format": "torch.distributed.checkpoint"}
        (tmp / INFO_FILE).write_text(json.dumps(info))
        return _publish(tmp, directory, stem)
    except (OSError, ckpt.CheckpointError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ckpt.CheckpointError(f"could not write {final}: {exc}") from exc


def save_sharded(directory: Path, which: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any], lead: bool, world: int) -> Path:
    """Write checkpoint `which` ("last", "best") from every rank, on the training thread: a collective, every
    rank calls it at the same step. Rank 0 adds `extra` and publishes the folder once all shards are written.
    CheckpointError on any failure; the previous checkpoint is then untouched. (sharded_writer.py writes one
    in the background.)"""
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    stem, tmp = begin(directory, which, extra["step"], lead)
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise write_failed(tmp, exc, lead) from exc
    final, failure = directory / f"{stem}{SUFFIX}", None
    if lead:
        try:
            final = finish(tmp, directory, stem, extra, world)
        except ckpt.CheckpointError as exc:
            failure = exc
    dist.barrier()  # the checkpoint is in place (or not) for every rank alike
    if failure is not None:
        raise failure
    return final


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 trusted: bool = False) -> dict[str, Any]:
    """Load the checkpoint at `path` into this rank's shards (DCP reshards when the gang that wrote it had a
    different world size): a collective. Returns rank 0's trainer state, as every rank reads it.

    Unless `trusted`, every file loads as data: CheckpointRefused (on every rank alike, before any collective
    for the metadata and trainer.pt) names a file that would import anything else."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    model_state, optim_state = get_state_dict(model, optimizer)  # the optimizer's state made up front, to load into
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    if trusted:
        trainer = _load_trainer(path, trusted)
        load(state, checkpoint_id=str(path))
    else:
        from torch.distributed.checkpoint.api import CheckpointException

        from .dcp_data import DataPlanner, MetadataReader, read_metadata, refusal_in

        reader = MetadataReader(path, read_metadata(path))
        trainer = _load_trainer(path, trusted)
        try:
            load(state, storage_reader=reader, planner=DataPlanner(path))
        except CheckpointException as exc:
            refused = refusal_in(exc)
            if refused is None:
                raise
            raise refused from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return trainer


def _load_trainer(path: Path, trusted: bool) -> dict[str, Any]:
    """Rank 0's trainer state in the checkpoint at `path` (CheckpointRefused, unless `trusted`, for one that
    would import anything but torch's own state and plain values)."""
    import pickle

    import torch

    try:
        return torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as exc:
        if trusted or "GLOBAL" not in str(exc):
            raise
        raise ckpt.refusal(path / TRAINER_FILE, exc) from None


def export_state_dict(path: Path, target: Path) -> None:
    """A sharded checkpoint as one plain torch.save file ({"model": ..., "optim": ...}), for use outside
    torchherd; no process group needed."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(target))
