"""The machine-wide ledger: which of this user's runs holds which device, as leases that die with their holder.

Every supervisor of the user on this machine grants devices through one folder beside the control sockets
(`ledger/` in the private runtime folder). A lease is a small JSON file its holder keeps locked with flock
for as long as it holds the device; the kernel drops the lock when the holder dies, so a SIGKILLed run
strands nothing: the next grant finds the file unlocked and removes it. Grants are decided under the
ledger's own lock, so two runs never grant the same device at once. `MemoryLedger` keeps the same books in
one process, for a backend whose cluster does its own accounting (Ray) and for logic tests.
Its files are data: each is decoded into a typed entry, one that is not what torchherd writes is skipped and
said once, and a folder someone else owns or can write is refused.
"""
from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import msgspec

from ..protocol.private import UnsafeRuntimeDir, runtime_dir

FOLDER_VARIABLE = "TORCHHERD_LEDGER"  # another folder for the ledger: runs that name the same one share it
LOCK_FILE = ".lock"
LEASE_SUFFIX = ".lease"
SESSION_SUFFIX = ".session"
MAX_ENTRY = 64 << 10  # bytes: a lease or a session is a few hundred; a longer file is none of torchherd's
# A link or a FIFO planted under an entry's name neither leads the open elsewhere nor blocks it.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
Count = Annotated[int, msgspec.Meta(ge=0)]


class Lease(msgspec.Struct, frozen=True):
    """One grant of one device to one rank of a pipeline of a run."""

    device: str  # "gpu0", "cpu1": the device's name on this machine
    run: str  # the holding run's id
    pipeline: str
    rank: Count = 0
    memory: Count | None = None  # bytes of the GPU's memory reserved; None: the whole device
    pid: Count = 0  # the supervisor holding it (this process's, when taken)
    run_dir: str = ""

    @property
    def key(self) -> str:
        """Its file's name in the ledger: unique per device, run, pipeline and rank."""
        return f"{self.device}.{self.run}.{self.pipeline}.{self.rank}"


class Waiter(msgspec.Struct, frozen=True, array_like=True):
    """A pipeline of a live run that waits, as its run announces it: a list in the file (older versions wrote
    the first four items only)."""

    pipeline: str
    priority: int
    since: float  # wall-clock seconds it began to wait: the order across runs
    why: str = ""  # what outside its run holds it up, for people; "": it waits behind its own run's pipelines
    devices: tuple[str, ...] | None = None  # the device names it may be granted; None: not said


class Presence(msgspec.Struct, frozen=True):
    """A live run's presence in the ledger (one file per session): its supervisor, and what of it waits and why."""

    run: str
    pid: Count
    run_dir: str = ""
    waiting: tuple[Waiter, ...] = ()


E = TypeVar("E", Lease, Presence)  # a ledger entry


class UnsafeLedger(UnsafeRuntimeDir):
    """The ledger's folder (or its lock) is not this user's alone: whoever else can write there could stall
    every grant or mislead it, so it is refused."""

    def __init__(self, folder: Path, why: str):
        super().__init__(f"{folder}: {why}")
        self.folder, self.why = folder, why


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

    def notices(self) -> list[str]:
        """What is wrong with the ledger's files found since the last call, each bad file said once."""
        return []

    def close(self) -> None:
        self._held.clear()


class Ledger(MemoryLedger):
    """The user's ledger on this machine: leases in files every run of the user reads (see the module).
    Raises UnsafeLedger for a folder, or a lock file, that is not the user's alone."""

    def __init__(self, folder: Path | None = None) -> None:
        super().__init__()
        self.folder = Path(folder) if folder is not None else ledger_folder()
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # something that is not a folder
            pass
        refuse_unsafe(self.folder)
        self._fds: dict[str, int] = {}  # lease or session file name -> the descriptor that holds its lock
        self._said: set[tuple[str, int, int, int]] = set()  # bad files said: (name, inode, mtime ns, size)
        self._notices: list[str] = []  # said since the last `notices`
        os.close(self._open_lock())  # a lock file that is no plain file of ours is refused now, not at a grant

    @contextmanager
    def locked(self) -> Iterator[list[Lease]]:
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a decision: a directory scan, microseconds
            yield self._live(LEASE_SUFFIX, Lease, prune=True)
        finally:
            os.close(fd)  # closing drops the lock

    def take(self, leases: list[Lease]) -> None:
        for lease in leases:
            self._hold(lease.key + LEASE_SUFFIX, lease)
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
        self._hold(f"{presence.run}{SESSION_SUFFIX}", presence)

    def notices(self) -> list[str]:
        said, self._notices = self._notices, []
        return said

    def close(self) -> None:
        """Give back every lease and the session's entry (a process that dies gives them back as well)."""
        for name in list(self._fds):
            self._drop(name)
        self._held.clear()

    # ------------------------------------------------------------ files

    def _open_lock(self) -> int:
        """The ledger's lock file, opened: a plain file of this user's, else UnsafeLedger."""
        try:
            fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o600)
        except OSError as exc:
            raise UnsafeLedger(self.folder, f"its {LOCK_FILE} cannot be opened ({exc.strerror}); remove it") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            os.close(fd)
            raise UnsafeLedger(self.folder, f"its {LOCK_FILE} is not a plain file of yours; remove it")
        return fd

    def _hold(self, name: str, entry: Lease | Presence) -> None:
        """Write `name` (replacing any of ours) and keep it locked: a new file, locked before it is renamed into
        place, so a reader never sees it unlocked while we live."""
        tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, msgspec.json.encode(entry) + b"\n")
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
            entry = self._entry(path, kind, prune)
            if entry is not None:
                out.append(entry)
        return out

    def _entry(self, path: Path, kind: type[E], prune: bool) -> E | None:
        """The entry in `path` if its holder lives; None if it is gone, its holder dead (with `prune`, the file
        removed) or it is not an entry torchherd wrote (said once: `notices`)."""
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                self._skip(path, info, f"it is {_kind_of(info.st_mode)}, not a plain file")
                return None
            fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        except FileNotFoundError:
            return None  # given back between the scan and now
        except OSError as exc:
            self._skip(path, None, f"it cannot be read ({exc.strerror})")
            return None
        try:
            return self._read(fd, path, kind, prune)
        finally:
            os.close(fd)

    def _read(self, fd: int, path: Path, kind: type[E], prune: bool) -> E | None:
        """`_entry`'s reading of the open file `fd`."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            self._skip(path, info, "it is not a plain file of yours")
            return None
        if not _held(fd):
            if prune:
                path.unlink(missing_ok=True)
            return None
        try:
            data = os.read(fd, MAX_ENTRY + 1)
            if len(data) > MAX_ENTRY:
                self._skip(path, info, f"it is longer than {MAX_ENTRY} bytes")
                return None
            return msgspec.json.decode(data, type=kind)
        except msgspec.DecodeError as exc:  # a ValidationError too: it names the field
            self._skip(path, info, str(exc))
        except OSError as exc:
            self._skip(path, info, f"it cannot be read ({exc.strerror})")
        return None

    def _skip(self, path: Path, info: os.stat_result | None, why: str) -> None:
        """Skip a file that is not an entry torchherd wrote, saying so the first time this file is seen as it is."""
        key = (path.name, info.st_ino, info.st_mtime_ns, info.st_size) if info is not None else (path.name, 0, 0, 0)
        if key not in self._said:
            self._said.add(key)
            self._notices.append(f"{path}: skipped, not a ledger entry torchherd wrote: {why} "
                                 "(remove it if no run of yours holds it)")


def ledger_folder() -> Path:
    """Where this user's ledger lives: $TORCHHERD_LEDGER, else `ledger` in the private runtime folder."""
    named = os.environ.get(FOLDER_VARIABLE)
    return Path(named) if named else runtime_dir() / "ledger"


def refuse_unsafe(folder: Path) -> None:
    """Raise UnsafeLedger unless `folder` is a folder of this user's that no one else can write."""
    me = os.getuid()
    link = folder.lstat()
    if stat.S_ISLNK(link.st_mode) and link.st_uid != me:
        raise UnsafeLedger(folder, f"the device ledger's folder is a link of uid {link.st_uid}'s, not yours "
                                   f"(uid {me}); set {FOLDER_VARIABLE} to a folder of yours")
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeLedger(folder, f"the device ledger's folder is not a folder; remove it or set {FOLDER_VARIABLE}")
    if info.st_uid != me:
        raise UnsafeLedger(folder, f"the device ledger's folder belongs to uid {info.st_uid}, not you (uid {me}); "
                                   f"set {FOLDER_VARIABLE} to a folder of yours")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        who = "others" if mode & 0o002 else "its group"
        raise UnsafeLedger(folder, f"the device ledger's folder is writable by {who} (mode {mode:04o}), who could "
                                   f"stall or mislead your runs' grants; chmod 700 it, or set {FOLDER_VARIABLE} "
                                   "to a folder only you can write")


def _held(fd: int) -> bool:
    """Whether a live holder keeps the file of `fd` locked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False  # nobody holds it: its holder died
    except BlockingIOError:
        return True


def _kind_of(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a device")
