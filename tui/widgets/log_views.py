"""The selected pipeline's log tail (a file followed from a thread) and the run's event log.

`LogTail.follow(path)` polls the file's size twice a second from a worker thread and appends
new lines (the thread ends at once when the tail follows another file or goes away);
`EventLog.add(entries)` writes event-log entries, failures with their traceback.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import Log, RichLog
from textual.worker import get_current_worker

from ..runstate import LogEntry
from . import WidgetOptions

POLL = 0.5  # seconds between looks at the log file
TAIL_BYTES = 64 * 1024  # bytes read back when starting to follow a file
LEVEL_STYLE = {"info": "", "warning": "yellow", "error": "bold red"}


def read_tail(path: Path, max_bytes: int) -> tuple[list[str], int]:
    """The last lines of a file (at most `max_bytes` of it) and the offset it ends at."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return [], 0
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    if start and lines:
        lines = lines[1:]  # the first one is probably cut
    return lines, start + len(data)


class LogTail(Log):
    """Follows one log file; `follow(None)` stops."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 3; border: round $panel-lighten-2; scrollbar-size: 1 1; }
    """

    @dataclass
    class Lines(Message):
        """New lines read from the followed file."""

        path: Path
        lines: list[str]
        reset: bool

    def __init__(self, max_lines: int = 500, tail_bytes: int = TAIL_BYTES, wrap: bool = False,
                 **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kwargs)
        self.tail_bytes = tail_bytes
        self.wrap = wrap  # long lines (a Lightning warning) go on over the next lines, at the width when read
        self.path: Path | None = None
        self.border_title = "log"
        self._done = threading.Event()  # set: the thread following the current file stops (no sleep waited out)

    def follow(self, path: Path | None, title: str = "log") -> None:
        if path == self.path:
            return
        self.path = path
        self.border_title = title
        self.clear()
        self._done.set()
        self._done = threading.Event()
        if path is None:
            self.workers.cancel_group(self, "tail")
        else:
            self._tail(path, self._done)

    def on_unmount(self) -> None:
        self._done.set()  # the app exits without waiting out the thread's sleep

    @work(thread=True, exclusive=True, exit_on_error=False, group="tail")
    def _tail(self, path: Path, done: threading.Event) -> None:
        worker = get_current_worker()
        lines, offset = read_tail(path, self.tail_bytes)
        self.post_message(self.Lines(path, lines, True))
        partial = b""
        while not done.wait(POLL) and not worker.is_cancelled:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size < offset:  # truncated or replaced: start over
                offset, partial = 0, b""
            if size == offset:
                continue
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(size - offset)
            offset += len(data)
            data = partial + data
            cut = data.rfind(b"\n") + 1
            partial = data[cut:]
            if cut and not worker.is_cancelled:
                self.post_message(self.Lines(path, data[:cut].decode("utf-8", "replace").splitlines(), False))

    def on_log_tail_lines(self, message: Lines) -> None:
        message.stop()
        if message.path != self.path:
            return
        if self.wrap:
            width = max(self.scrollable_content_region.width, 20)
            message.lines = [line[i:i + width] for line in message.lines for i in range(0, len(line) or 1, width)]
        if message.reset:  # a file followed afresh shows its newest lines, wherever the last one's view stood
            self.clear()
            self.write_lines(message.lines, scroll_end=False)
            self.scroll_end(animate=False, immediate=True, x_axis=False)
            return
        self.write_lines(message.lines)  # follows on while the view stays at the end (not scrolled back)


def format_entry(entry: LogEntry) -> Text:
    stamp = time.strftime("%H:%M:%S", time.localtime(entry.time))
    text = Text(stamp + " ", style="dim")
    if entry.pipeline:
        text.append(entry.pipeline + " ", style="bold")
    text.append(entry.text, style=LEVEL_STYLE.get(entry.level, ""))
    if entry.traceback:
        text.append("\n" + entry.traceback.rstrip(), style="red")
    return text


class EventLog(RichLog):
    """Run events as they happen; `add` skips entries it has already written."""

    DEFAULT_CSS = """
    EventLog { height: 1fr; min-height: 3; border: round $panel-lighten-2; scrollbar-size: 1 1; }
    """

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(max_lines=500, wrap=True, min_width=20, markup=False, highlight=False, **kwargs)
        self.border_title = "events"
        self.last_seq = 0

    def add(self, entries: Iterable[LogEntry]) -> None:
        for entry in entries:
            if entry.seq > self.last_seq:
                self.write(format_entry(entry))
                self.last_seq = entry.seq
