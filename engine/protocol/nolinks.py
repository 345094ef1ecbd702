"""Writing inside a run folder without following symbolic links: a run folder may be a copy someone else made,
and a link planted in it (`stacks -> /somewhere`) must not carry torchherd's writes outside it.

Files are opened with O_NOFOLLOW, folders are made one part at a time and refused when a part is a link, and
`find_link` finds a link in a run folder before a resume writes into it (torchherd makes none there).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any, Literal

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
WANDB = ("tracking", "wandb")  # W&B's offline run files, in the run folder (engine/sinks/wandb_sink.py)
OWN_FILES = "checkpoints"  # a folder whose contents a training script writes as it likes (its own links too)


class LinkRefused(OSError):
    """A part of a run folder that torchherd writes is a symbolic link: nothing is written through it."""

    def __init__(self, link: os.PathLike | str):
        super().__init__(f"{link} is a symbolic link, and torchherd writes nothing through a link in a run "
                         "folder: remove it (or copy the run folder without links)")
        self.link = Path(link)


def open_fd(path: os.PathLike | str, flags: int, mode: int = 0o644) -> int:
    """os.open of `path`, refusing (LinkRefused) to follow it when it is a link."""
    try:
        return os.open(path, flags | NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        raise


def open_file(path: os.PathLike | str, how: Literal["ab", "wb", "a", "w"], mode: int = 0o644,
              **kwargs: Any) -> IO[Any]:  # the file object open() gives for `how`
    """open(path, how) for writing ('a': appended to, 'w': truncated), refusing to follow a link."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if how.startswith("a") else os.O_TRUNC)
    fd = open_fd(path, flags, mode)
    try:
        return os.fdopen(fd, how, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_text(path: os.PathLike | str, text: str, mode: int = 0o644) -> None:
    """Path.write_text, refusing to follow a link."""
    with open_file(path, "w", mode, encoding="utf-8") as fh:
        fh.write(text)


def make_dirs(path: os.PathLike | str, below: os.PathLike | str) -> Path:
    """mkdir -p of `path`, a folder inside `below` (the run folder, which may itself be reached through a link
    of the user's): each part of it under `below` is made or found, and refused (LinkRefused) if it is a link."""
    path, current = Path(path), Path(below)
    for part in path.relative_to(current).parts:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                raise LinkRefused(current) from None
    return path


def find_link(run_dir: os.PathLike | str) -> Path | None:
    """The first symbolic link in a run folder (not looking inside the checkpoints folders, whose contents are a
    training script's own, nor tracking/wandb, whose are W&B's: it links its own logs there), or None."""
    top_dir = os.fspath(run_dir)
    for top, folders, files in os.walk(top_dir):
        for name in (*folders, *files):
            if os.path.islink(os.path.join(top, name)):
                return Path(top, name)
        folders[:] = [f for f in folders if f != OWN_FILES and os.path.join(top, f) != os.path.join(top_dir, *WANDB)]
    return None
