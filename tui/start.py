"""What the app does first, as one small union the command line and the picker share: pick from a folder,
open an ended run, launch a config, resume a run, or attach to a live one."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pick:
    """Show the picker (`torchherd [DIR|CONFIG]`)."""


@dataclass(frozen=True)
class Open:
    """Replay a run that has ended, as it ended."""

    run_dir: Path


@dataclass(frozen=True)
class Launch:
    """Start a config (a new session, or its pipelines added to the live one)."""

    config: Path


@dataclass(frozen=True)
class Resume:
    """Carry on a run's unfinished pipelines (`only` some of them) from their checkpoints."""

    run_dir: Path
    only: tuple[str, ...] = ()


@dataclass(frozen=True)
class Attach:
    """Watch (and, unless `read_only`, steer) a run that is live."""

    run_dir: Path
    read_only: bool = False


Start = Pick | Open | Launch | Resume | Attach
"""How the app starts (from the command line)."""

Picked = Open | Launch | Resume | Attach
"""What the picker chose."""

STARTS_A_RUN = (Launch, Resume)  # the app's exit status is then the run's
