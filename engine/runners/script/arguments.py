"""A script's command line for one attempt: `args` with torchherd's placeholders filled in, then `resume_args`
when the pipeline's checkpoint folder already holds a file the script wrote.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...config.placeholders import PLACEHOLDER

if TYPE_CHECKING:
    from ...config.schema import Pipeline

IGNORED = (".", "~")  # names starting so are temporary or hidden files, not a checkpoint


def newest_checkpoint(folder: Path) -> Path | None:
    """The most recently written file under `folder` (a checkpoint the script saved), or None."""
    try:
        files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(IGNORED)]
    except OSError:
        return None
    return max(files, key=lambda p: p.stat().st_mtime, default=None)


def describe_checkpoint(path: Path, now: float | None = None) -> str:
    """'ckpt.pt, 2 min ago', for plans and notices."""
    age = max((now if now is not None else time.time()) - path.stat().st_mtime, 0.0)
    ago = (f"{age:.0f} s" if age < 90 else f"{age / 60:.0f} min" if age < 5400 else f"{age / 3600:.1f} h")
    return f"{path.name}, {ago} ago"


def fill(arg: str, values: dict[str, str]) -> str:
    """`arg` with each {name} of `values` replaced; {{ and }} become literal braces."""
    return re.sub(PLACEHOLDER, lambda m: values.get(m[1], m[0]) if m[1] else m[0][0], arg)


def command_line(pipe: Pipeline, pipeline_dir: Path, rank: int, world_size: int,
                 restart: int) -> tuple[list[str], Path | None]:
    """(the script and its arguments, the checkpoint it resumes from when `resume_args` were added)."""
    checkpoints = pipeline_dir / "checkpoints"
    values = {"checkpoint_dir": str(checkpoints), "pipeline_dir": str(pipeline_dir),
              "run_dir": str(pipeline_dir.parent), "rank": str(rank), "world_size": str(world_size),
              "restart": str(restart)}
    argv = [pipe.script_ref, *(fill(a, values) for a in pipe.args)]
    found = newest_checkpoint(checkpoints) if pipe.resume_args else None
    if found is not None:
        argv += [fill(a, values) for a in pipe.resume_args]
    return argv, found
