"""The log pane follows the selected pipeline's log to its newest line, however often the selection moves."""
from __future__ import annotations

import pytest
from textual.app import App

from torchherd.tui.widgets.log_views import LogTail
from tests.tui.pilots import wait_for

pytestmark = pytest.mark.asyncio


class TailOnly(App):
    CSS = "LogTail { height: 8; }"

    def compose(self):
        yield LogTail()


async def test_back_on_a_log_after_another_it_shows_and_follows_the_newest_lines(tmp_path):
    # Regression: attached at 80x24, down to a queued pipeline (no log yet) and back up, the pane showed
    # "epoch 27" lines of a pipeline at epoch 42, and stayed there as its log grew.
    narrow, wide, medium = tmp_path / "narrow.txt", tmp_path / "wide.txt", tmp_path / "medium.txt"
    narrow.write_text("".join(f"epoch {i}\n" for i in range(1, 101)))
    wide.write_text("".join(f"wide epoch {i}\n" for i in range(1, 81)))  # fewer lines: a view further up
    app = TailOnly()
    async with app.run_test(size=(60, 20)) as pilot:
        tail = app.query_one(LogTail)

        def at_the_end(last: str) -> bool:
            return bool(tail.lines) and tail.lines[-1] == last and tail.scroll_offset.y == tail.max_scroll_y > 0

        tail.follow(narrow)
        await wait_for(pilot, lambda: at_the_end("epoch 100"), what="narrow's newest line shown")
        tail.follow(medium)  # queued: no log yet
        await wait_for(pilot, lambda: not tail.lines and tail.border_title == "log", what="an empty pane")
        tail.follow(wide)
        await wait_for(pilot, lambda: at_the_end("wide epoch 80"), what="wide's newest line shown")
        tail.follow(narrow)  # its lines replace wide's while the view still stands where wide's ended
        await wait_for(pilot, lambda: at_the_end("epoch 100"), what="narrow's newest line shown again")
        with narrow.open("a") as fh:
            fh.write("".join(f"epoch {i}\n" for i in range(101, 121)))
        await wait_for(pilot, lambda: at_the_end("epoch 120"), what="the lines written since, followed")


class WrappedTail(App):
    CSS = "LogTail { height: 12; }"

    def compose(self):
        yield LogTail(wrap=True)


async def test_the_full_log_wraps_a_long_line_so_it_reads_whole(tmp_path):
    # Regression: at 80 columns Lightning's long warnings were cut to what fit; `l` showed no more of them.
    log = tmp_path / "log.txt"
    warning = "UserWarning: The 'train_dataloader' does not have many workers which may be a bottleneck. " * 2
    log.write_text(f"epoch 1\n{warning}\nepoch 2\n")
    app = WrappedTail()
    async with app.run_test(size=(40, 20)) as pilot:
        tail = app.query_one(LogTail)
        tail.follow(log)
        await wait_for(pilot, lambda: tail.lines and tail.lines[-1] == "epoch 2", what="lines shown")
        width = tail.scrollable_content_region.width
        assert all(len(line) <= width for line in tail.lines)
        assert "".join(tail.lines[1:-1]) == warning  # every character of it, over several lines


async def test_the_app_closes_without_waiting_out_the_tails_poll(tmp_path, monkeypatch):
    # Regression: the thread following a log slept out its poll before it looked whether it should stop, and the
    # event loop's close waits for that thread: quitting the app, or moving to another log, took up to a poll.
    import asyncio
    import threading

    from torchherd.tui.widgets import log_views

    monkeypatch.setattr(log_views, "POLL", 3600.0)
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("epoch 1\n")
    second.write_text("epoch 2\n")

    async def session() -> None:
        app = TailOnly()
        async with app.run_test(size=(60, 20)) as pilot:
            tail = app.query_one(LogTail)
            tail.follow(first)
            await wait_for(pilot, lambda: tail.lines == ["epoch 1"], what="the first log shown")
            tail.follow(second)  # the first one's thread ends here, the second's when the app goes
            await wait_for(pilot, lambda: tail.lines == ["epoch 2"], what="the second log shown")

    # asyncio.run closes its loop as the app's does: it waits for every thread the loop lent out to return.
    closed = threading.Thread(target=asyncio.run, args=(session(),), daemon=True)
    closed.start()
    await asyncio.to_thread(closed.join, 60)
    assert not closed.is_alive(), "the event loop waited on a tail thread still sleeping out its poll"
