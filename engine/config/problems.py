"""What is wrong with a config: `Problem` (file, key path, message) and `ConfigError`, which carries them all.

The loader, the preflight check and the launchers report through these, with paths
shown the one way `display_path` writes them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .schema import Pipeline


def display_path(path: str | os.PathLike[str]) -> str:
    """`path` as problems show it: relative to the working directory when under it, else absolute."""
    full = os.path.abspath(path)
    cwd = os.getcwd()
    if full == cwd or full.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(full, cwd)
    return full


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, and what."""

    file: str
    key: str
    message: str

    @property
    def pipeline(self) -> int | None:
        """The index of the pipeline this problem is about (`pipelines[2].lr`: 2); None for the rest."""
        head = self.key.split(".", 1)[0]
        return int(head[len("pipelines["):-1]) if head.startswith("pipelines[") and head.endswith("]") else None

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" if self.key else f"{self.file}: {self.message}"


class ConfigError(Exception):
    """A config that cannot be run; `problems` lists every reason.

    `sound` holds the pipelines (by index) that parsed with no problem of their own, and `defaults_task` the
    [defaults] task as written, so a check can still read their task files and report those problems too.
    """

    def __init__(self, problems: list[Problem], sound: dict[int, Pipeline] | None = None,
                 defaults_task: str | None = None):
        self.problems = problems
        self.sound = sound or {}
        self.defaults_task = defaults_task
        super().__init__("\n".join(str(p) for p in problems))
