"""A terminal's reader for the app in a real pty: everything it draws, read as it comes (or the app blocks on a
full pty), into one growing buffer."""
from __future__ import annotations

import os
import threading


def read_screen(master: int) -> bytearray:
    """What the app writes to the pty whose master end is `master`, collected by a thread until the pty closes."""
    screen = bytearray()

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            screen.extend(data)

    threading.Thread(target=drain, daemon=True).start()
    return screen
