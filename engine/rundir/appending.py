"""A run file opened for appending whose writes never raise: what the disk does not take (full, over a quota,
over the file size limit) waits in memory and goes out on the next flush, so a full disk costs the run its
files for a while, never its supervision or its events.

Lines go out whole or are completed later: `whole` is how far the file holds whole lines, which is all a
reader may take of it.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..protocol.nolinks import open_fd
from .lines import trim_torn_line

HOLD = 1 << 20  # bytes a file holds back before writing them out


class AppendFile:
    """One of a run's .jsonl files, appended to; `error` is why the last flush left bytes unwritten (None:
    everything is on disk)."""

    def __init__(self, path: Path, hold: int = HOLD):
        trim_torn_line(path)  # a resume: the last run may have died mid-line
        self.path, self.hold = Path(path), hold
        self.fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # never through a planted link
        self.error: OSError | None = None
        self._buf = bytearray()
        self._end = self.whole = os.fstat(self.fd).st_size  # bytes on disk; of those, up to the last newline

    @property
    def closed(self) -> bool:
        return self.fd < 0

    @property
    def pending(self) -> int:
        """Bytes written to this object that the disk does not hold yet."""
        return len(self._buf)

    def write(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= self.hold and self.error is None:  # a failing disk is retried on flush, not per line
            self.flush()

    def flush(self) -> bool:
        """Write out what is held; False (and `error`) if the disk took only part of it."""
        while self._buf and self.fd >= 0:
            try:
                n = os.write(self.fd, self._buf)
            except InterruptedError:
                continue
            except OSError as exc:
                self.error = exc
                return False
            newline = self._buf.rfind(b"\n", 0, n)
            if newline >= 0:
                self.whole = self._end + newline + 1
            self._end += n
            del self._buf[:n]
        self.error = None
        return True

    def sync(self) -> bool:
        """flush, then fsync: what is written survives a crash of the machine (a final state, say)."""
        if not self.flush():
            return False
        try:
            os.fsync(self.fd)
        except OSError:
            pass
        return True

    def close(self) -> None:
        """Flush what it can and close; what the disk would not take is given up (`pending` says how much)."""
        if self.fd >= 0:
            self.flush()
            os.close(self.fd)
            self.fd = -1
