"""The user's private runtime folder on this machine: where the control sockets and the device ledger live.

One folder only this user can enter ($XDG_RUNTIME_DIR/torchherd, else /tmp/torchherd-<uid>), made on first
use and refused when someone else owns it or can enter it.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeRuntimeDir(RuntimeError):
    """The runtime folder exists but another user owns it or others can enter it."""


def runtime_dir() -> Path:
    """This user's private folder for sockets: $XDG_RUNTIME_DIR/torchherd, else /tmp/torchherd-<uid>;
    made mode 0700 and refused (UnsafeRuntimeDir) when someone else owns it or can enter it."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) if xdg and Path(xdg).is_dir() else None
    path = base / "torchherd" if base is not None else Path("/tmp") / f"torchherd-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UnsafeRuntimeDir(f"{path}: not a folder of this user's (uid {os.getuid()}); remove it or "
                               f"set XDG_RUNTIME_DIR to a private folder")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours, but too open: close it before anything is put in it
    return path
