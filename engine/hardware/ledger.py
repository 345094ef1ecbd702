"""The machine-wide ledger: which of this user's runs holds which device, as leases that die with their holder.

Every supervisor of the user on this machine grants devices through one folder beside the control sockets
(`ledger/` in the private runtime folder). A lease is a small JSON file its holder keeps locked with flock
for as long as it holds the device; the kernel drops the lock when the holder dies, so a SIGKILLed run
strands nothing: the next grant finds the file unlocked and removes it. Grants are decided under the
ledger's own lock, so two runs never grant the same device at once. `MemoryLedger` keeps the same books in
one process, for a backend whose cluster does its own accounting (Ray) and for logic tests.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..protocol.jsonvalue import JsonObject
from ..protocol.private import UnsafeRuntimeDir, runtime_dir

FOLDER_VARIABLE = "TORCHHERD_LEDGER"  # another folder for the ledger: runs that name the same one share it
LOCK_FILE = ".lock"
LEASE_SUFFIX = ".lease"
SESSION_SUFFIX = ".session"
E = TypeVar("E")  # a ledger entry: Lease or Presence


@dataclass(frozen=True)
class Lease:
    """One grant of one device to one rank of a pipeline of a run."""

    device: str  # "gpu0", "cpu1": the device's name on this machine
    run: str  # the holding run's id
    pipeline: str
    rank: int = 0
    memory: int | None = None  # bytes of the GPU's memory reserved; None: the whole device
    pid: int = 0  # the supervisor holding it (this process's, when taken)
    run_dir: str = ""

    @property
    def key(self) -> str:
        """Its file's name in the ledger: unique per device, run, pipeline and rank."""
        return f"{self.device}.{self.run}.{self.pipeline}.{self.rank}"


@dataclass(frozen=True)
class Presence:
    """A live run's presence in the ledger (one file per session): its supervisor, and what of it waits and why."""

    run: str
    pid: int
    run_dir: str = ""
    # [pipeline, priority, since (wall-clock s), why, the device names it may be granted] of each that waits
    waiting: list[list[Any]] = field(default_factory=list)


class MemoryLedger:
    """The ledger's books in this process only: what the session itself holds (no other run is seen)."""

    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}

    @contextmanager
    def locked(self) -> Iterator[list[Lease]]:
        """Every live lease, for one decision; `take` inside the block makes the decision's grants."""
        yield list(self._held.values())

    def take(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._held[lease.key] = lease

    def give_back(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._held.pop(lease.key, None)

    def presences(self) -> list[Presence]:
        return []

    def announce(self, presence: Presence) -> None:
        """Say which run this is and what of it waits (other runs read it: `torchherd ls`)."""

    def close(self) -> None:
        self._held.clear()


class Ledger(MemoryLedger):
    """The user's ledger on this machine: leases in files every run of the user reads (see the module)."""

    def __init__(self, folder: Path | None = None) -> None:
        super().__init__()
        self.folder = Path(folder) if folder is not None else ledger_folder()
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.folder.lstat().st_uid != os.getuid() or not self.folder.is_dir():
            raise UnsafeRuntimeDir(f"{self.folder}: the device ledger's folder is not a folder of yours "
                                   f"(uid {os.getuid()}); remove it or set {FOLDER_VARIABLE}")
        self._fds: dict[str, int] = {}  # lease or session file name -> the descriptor that holds its lock

    @contextmanager
    def locked(self) -> Iterator[list[Lease]]:
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a decision: a directory scan, microseconds
            yield self._live(LEASE_SUFFIX, Lease, prune=True)
        finally:
            os.close(fd)  # closing drops the lock

    def take(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._hold(lease.key + LEASE_SUFFIX, asdict(lease))
            self._held[lease.key] = lease

    def give_back(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._drop(lease.key + LEASE_SUFFIX)
            self._held.pop(lease.key, None)

    def leases(self) -> list[Lease]:
        """Every live lease now, read without the ledger's lock (for people: `ls`, `check`)."""
        return self._live(LEASE_SUFFIX, Lease)

    def presences(self) -> list[Presence]:
        """Every live run that grants through the ledger."""
        return self._live(SESSION_SUFFIX, Presence)

    def announce(self, presence: Presence) -> None:
        self._hold(f"{presence.run}{SESSION_SUFFIX}", asdict(presence))

    def close(self) -> None:
        """Give back every lease and the session's entry (a process that dies gives them back as well)."""
        for name in list(self._fds):
            self._drop(name)
        self._held.clear()

    # ------------------------------------------------------------ files

    def _hold(self, name: str, data: JsonObject) -> None:
        """Write `name` (replacing any of ours) and keep it locked: a new file, locked before it is renamed into
        place, so a reader never sees it unlocked while we live."""
        tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (json.dumps(data) + "\n").encode())
        os.replace(tmp, self.folder / name)
        old = self._fds.pop(name, None)
        if old is not None:
            os.close(old)
        self._fds[name] = fd

    def _drop(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            try:
                (self.folder / name).unlink(missing_ok=True)
            finally:
                os.close(fd)

    def _live(self, suffix: str, kind: type[E], prune: bool = False) -> list[E]:
        """The entries of `suffix` whose holders live (their files are locked); with `prune` (under the
        ledger's lock) the files of dead holders are removed."""
        out = []
        for path in sorted(self.folder.glob(f"*{suffix}")):
            state = _holder_state(path)
            if state is None:
                continue
            alive, data = state
            if not alive:
                if prune:
                    path.unlink(missing_ok=True)
                continue
            try:
                out.append(kind(**data))
            except TypeError:  # not one of ours: another version's, or garbage
                continue
        return out


def ledger_folder() -> Path:
    """Where this user's ledger lives: $TORCHHERD_LEDGER, else `ledger` in the private runtime folder."""
    named = os.environ.get(FOLDER_VARIABLE)
    return Path(named) if named else runtime_dir() / "ledger"


def _holder_state(path: Path) -> tuple[bool, dict[str, Any]] | None:
    """(whether its holder lives, its data) for one ledger file; None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            alive = False  # nobody holds it: its holder died
        except BlockingIOError:
            alive = True
        data = json.loads(os.read(fd, 1 << 16) or b"{}")
        return (alive, data) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
