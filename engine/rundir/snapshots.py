"""A run's weight-snapshot folders: made fresh and private by the run that uses them, marked as torchherd's,
and freed when their owner is gone; and whether the torchherd process named by a folder's pid file lives.
"""
from __future__ import annotations

import os
import secrets
import shutil
import stat
import time
from pathlib import Path

PID_FILE = "supervisor.pid"  # the pid of the torchherd process writing a run (or snapshot folder)
SNAPSHOT_MARKER = ".torchherd-snapshots"  # only torchherd writes it: stale cleanup touches nothing without it
STALE_AFTER = 60.0  # seconds: a younger folder's owner may not have written its pid yet


def snapshot_root(run_id: str, run_dir: Path) -> Path:
    """Where a run's weight snapshots will live (claim_root creates it): RAM-backed /dev/shm when there
    is one, else the run directory. The name ends in 64 random bits, so nobody can make it first."""
    token = secrets.token_hex(8)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"torchherd-{run_id}-{token}"
    return run_dir / f".snapshots-{token}"


def _ours(directory: Path) -> bool:
    """A real folder (not a link) this user owns, holding torchherd's marker file, also ours."""
    try:
        st, marker = os.lstat(directory), os.lstat(directory / SNAPSHOT_MARKER)
    except OSError:
        return False
    uid = os.getuid()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and stat.S_ISREG(marker.st_mode) and marker.st_uid == uid


def remove_root(root: Path) -> None:
    """Delete a snapshot folder claim_root made; anything else at that path is left alone."""
    if _ours(root):
        shutil.rmtree(root, ignore_errors=True)


def remove_stale_roots(parent: Path, prefix: str) -> None:
    """Free the snapshots of torchherd processes that died without (RAM a SIGKILLed supervisor never gave back).

    Only folders named `prefix`* that this user owns and that carry the marker file are touched."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for other in entries:
        if not other.name.startswith(prefix) or not _ours(other):
            continue
        try:
            young = time.time() - other.lstat().st_mtime < STALE_AFTER
        except OSError:
            continue
        if not young and not owner_alive(other):
            shutil.rmtree(other, ignore_errors=True)


def claim_root(root: Path) -> None:
    """Create `root` fresh and private (mode 0700), mark it as torchherd's and this process's, and free
    stale ones. A path that already exists is never adopted: FileExistsError."""
    remove_stale_roots(root.parent, "torchherd-" if root.name.startswith("torchherd-") else ".snapshots-")
    if root.parent != Path("/dev/shm"):
        root.parent.mkdir(parents=True, exist_ok=True)  # the run directory: ours
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        raise FileExistsError(f"{root} already exists: torchherd only uses a snapshot folder it has just "
                              "created itself") from None
    os.chmod(root, 0o700)  # whatever the umask
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for name, text in ((SNAPSHOT_MARKER, "weight snapshots of a torchherd run\n"), (PID_FILE, f"{os.getpid()}\n")):
        fd = os.open(root / name, flags, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)



def owner_alive(run_dir: Path) -> bool:
    """Whether the torchherd process that wrote `run_dir/supervisor.pid` still runs."""
    try:
        pid = int((run_dir / PID_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False
