"""Atomic checkpoints: write to a temporary file, fsync, then rename; keep the previous one.

`save_checkpoint` never leaves a half-written file under a checkpoint's name and keeps `keep` of them (last.pt,
prev.pt, prev2.pt, ...); `load_latest` falls back to the older ones, newest first, when the newest cannot be
read, saying why.

A checkpoint is data, not code: it loads with `torch.load(weights_only=True)`, which builds tensors, plain
values and torch's own state (optimizers, schedulers, scalers, RNG states) but imports nothing else. One that
would import something else is refused (CheckpointRefused, naming the file and what it would import) unless
the pipeline's `trust_checkpoints` says its files are the user's own.
"""
from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

LAST = "last.pt"
PREV = "prev.pt"
BEST = "best.pt"


class CheckpointError(Exception):
    """A checkpoint could not be written; the previous one is untouched."""


class CheckpointRefused(Exception):
    """A checkpoint would import (and so could run) code beyond tensors and plain values, and is not trusted."""


def refusal(path: Path, exc: pickle.UnpicklingError) -> CheckpointRefused:
    """The refusal of `path`, which torch.load(weights_only=True) would not load: naming what it would import."""
    found = re.search(r"GLOBAL (\S+)", str(exc))
    what = found.group(1) if found else str(exc).splitlines()[0][:200]
    return CheckpointRefused(
        f"{path}: refused to load: it would import {what}, and a checkpoint that imports anything but "
        "tensors and plain values can run code as it loads. If you wrote this file yourself, set "
        "`trust_checkpoints = true` for the pipeline in its config")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(directory: Path) -> None:
    """Delete temporary files left by writers that died mid-write (named `.NAME.PID.tmp`)."""
    for tmp in directory.glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # its writer is gone; a live one (validator, ...) is left alone
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def write_atomic(path: Path, state: Mapping[str, object]) -> None:
    """Save `state` with torch.save to `path` so a crash leaves the old file or the new, never half."""
    import torch

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path.parent)  # a SIGKILL mid-write leaves one, as big as a checkpoint
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch.save reports a short write as RuntimeError
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise CheckpointError(f"could not write {path}: {reason}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def older_name(index: int, suffix: str = ".pt") -> str:
    """The name of the `index`-th checkpoint before 'last': prev.pt, then prev2.pt, prev3.pt, ..."""
    return f"prev{index if index > 1 else ''}{suffix}"


def older_checkpoints(directory: Path, suffix: str = ".pt") -> list[tuple[int, Path]]:
    """The checkpoints before 'last' in `directory`, newest first: (index, path) of prev.pt, prev2.pt, ..."""
    found = []
    for path in directory.glob(f"prev*{suffix}"):
        digits = path.name[len("prev"):-len(suffix)]
        if digits == "" or (digits.isdigit() and int(digits) > 1):
            found.append((int(digits or 1), path))
    return sorted(found)


def _rotate(directory: Path, suffix: str, keep: int) -> None:
    """Make room for a new 'last': the one there becomes prev, prev becomes prev2, ...; beyond `keep` in all
    (the new last included), the oldest go."""
    olds = older_checkpoints(directory, suffix)
    for index, path in olds:
        if index > keep - 2:  # it would be shifted past the last one kept
            path.unlink(missing_ok=True)
    for index, path in reversed(olds):
        if index <= keep - 2:
            os.replace(path, directory / older_name(index + 1, suffix))
    last = directory / f"last{suffix}"
    if keep > 1 and last.exists():
        os.replace(last, directory / older_name(1, suffix))


def save_checkpoint(directory: Path, state: Mapping[str, object], name: str = LAST, keep: int = 2) -> Path:
    """Write `name` in `directory`; for 'last' (last.pt, or a Lightning pipeline's last.ckpt), the ones it
    replaces become 'prev', 'prev2', ..., `keep` of them in all with the new one (2: last and prev; 1: last
    alone). best.pt is never touched by a 'last'."""
    path = directory / name
    if not name.startswith("last."):
        write_atomic(path, state)
        return path
    tmp_new = directory / f".last.new{path.suffix}"
    write_atomic(tmp_new, state)  # fails here on a full disk, before anything is moved
    _rotate(directory, path.suffix, keep)
    os.replace(tmp_new, path)
    _fsync_dir(directory)
    return path


def load_latest(directory: Path, map_location: MAP_LOCATION = "cpu", suffix: str = ".pt",
                required: str = "model", trusted: bool = False) -> tuple[dict[str, Any] | None, Path | None, str]:
    """The newest readable checkpoint in `directory` (files ending in `suffix`, holding key `required`):
    (state, path, note). Nothing there: (None, None, "").

    Unless `trusted`, one that would import more than tensors and plain values raises CheckpointRefused
    rather than falling back to an older one: a resume from prev.pt, or from nothing, would silently
    overwrite the user's newer training."""
    import torch

    notes = []
    olds = [path.name for _, path in older_checkpoints(directory, suffix)]
    for name in (f"last{suffix}", f".last.new{suffix}", *olds):
        path = directory / name
        if not path.exists():
            continue
        try:
            try:
                state = torch.load(path, map_location=map_location, weights_only=not trusted)
            except pickle.UnpicklingError as exc:
                if trusted or "GLOBAL" not in str(exc):
                    raise
                raise refusal(path, exc) from None
            if not isinstance(state, dict) or required not in state:
                raise ValueError("not a torchherd checkpoint" if required == "model" else
                                 f"not a checkpoint with {required!r}")
        except CheckpointRefused:
            raise
        except Exception as exc:  # truncated, corrupt, wrong format
            notes.append(f"{name} unreadable ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if notes:
            notes.append(f"resumed from {name}")
        return state, path, "; ".join(notes)
    return None, None, "; ".join(notes)
