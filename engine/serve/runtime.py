"""Where a live run's control socket lives: a folder only this user can enter, and `control.json` in the run
directory that names the socket and the supervisor's pid, so `torchherd attach RUN` can find it.

The socket lives outside the run directory because an AF_UNIX path holds at most 107 bytes and runs
directories can be deep, and because a run directory may sit on a shared file system.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..protocol.nolinks import write_text
from ..protocol.private import UnsafeRuntimeDir, runtime_dir  # the control socket's folder

CONTROL_FILE = "control.json"
INDEX = ".run.json"  # beside a socket in the runtime folder: the run directory it serves
MAX_SOCKET_PATH = 107  # bytes, sun_path less its terminating NUL


def socket_path(run_dir: Path) -> Path:
    """The control socket for `run_dir`: named by the run, short enough for AF_UNIX."""
    folder = runtime_dir()
    tag = hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=6).hexdigest()
    name = f"{Path(run_dir).name[:40]}-{tag}.sock"
    path = folder / name
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        path = folder / f"{tag}.sock"
    return path


@dataclass(frozen=True)
class Control:
    """What control.json says: where the socket is and who serves it."""

    socket: Path
    pid: int


def publish(run_dir: Path, sock: Path) -> None:
    """Write control.json (atomically): clients find the socket through it; and, beside the socket in the
    runtime folder, which run directory it serves, so the user's live runs are found from any folder."""
    tmp = Path(run_dir) / f".{CONTROL_FILE}.{os.getpid()}"
    write_text(tmp, json.dumps({"socket": str(sock), "pid": os.getpid()}) + "\n")  # never through a link
    os.replace(tmp, Path(run_dir) / CONTROL_FILE)
    index = _index(sock)
    tmp = index.with_name(f".{index.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"run_dir": str(Path(run_dir).resolve()), "pid": os.getpid()}) + "\n")
    os.replace(tmp, index)


def _unlink_socket(sock: Path) -> None:
    """Unlink `sock` only if it is a socket of this user's: never a file, a folder or someone else's."""
    try:
        info = os.lstat(sock)
    except OSError:
        return
    if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid():
        Path(sock).unlink(missing_ok=True)


def withdraw(run_dir: Path, sock: Path) -> None:
    """Remove the socket this process served, its entry in the runtime folder and control.json (the run is no
    longer served)."""
    _unlink_socket(Path(sock))
    _index(sock).unlink(missing_ok=True)
    (Path(run_dir) / CONTROL_FILE).unlink(missing_ok=True)


def _index(sock: Path) -> Path:
    return Path(sock).with_name(Path(sock).name + INDEX)


def live_runs() -> list[Path]:
    """The run directories of this user's live runs, wherever they were started (the runtime folder's entries
    whose run a supervisor still holds); the entries of runs whose supervisor died are removed."""
    from ..rundir.directory import run_held

    try:
        entries = sorted(runtime_dir().glob(f"*{INDEX}"))
    except (OSError, UnsafeRuntimeDir):
        return []
    out = []
    for entry in entries:
        try:
            run_dir = Path(json.loads(entry.read_text())["run_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if run_held(run_dir):
            out.append(run_dir)
        else:  # its supervisor died (SIGKILL, reboot) before it could withdraw
            entry.unlink(missing_ok=True)
    return out


def read_control(run_dir: Path) -> Control | None:
    """The run's control.json, or None when it has none (never served, or finished)."""
    try:
        data = json.loads((Path(run_dir) / CONTROL_FILE).read_text())
        return Control(Path(data["socket"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):  # anyone may write it
        return None


def clean_stale(run_dir: Path) -> bool:
    """Remove the socket and control.json of a run whose supervisor is gone; True if there were some.

    control.json is data anyone may have written (run folders are copied, shared, downloaded), so the
    path it names is unlinked only when it is the very socket a supervisor of `run_dir` would have made
    in this user's private runtime folder, and is a socket of this user's; any other path is left alone."""
    control = read_control(run_dir)
    if control is None:
        return False
    try:
        ours = socket_path(run_dir)
    except (OSError, UnsafeRuntimeDir):
        ours = None
    if ours is not None and os.path.abspath(control.socket) == str(ours):
        _unlink_socket(ours)
    try:
        (Path(run_dir) / CONTROL_FILE).unlink(missing_ok=True)
    except OSError:  # a run folder this user may read but not write (shared, read-only): leave it
        pass
    return True
