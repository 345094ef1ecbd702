"""What a benchmark's quick mode shares: CI's slow tier runs every benchmark at its least size, so that one which
no longer runs fails a test (tests/test_benchmarks.py); its figures mean nothing there.

`warm(quick)` forks the workers of every in-process Supervisor from one process that imported torch once (the
engine's keep_warm, as a program that supervises runs one after another may), so that a quick run does not pay
a fresh interpreter's imports per worker; at full size nothing changes.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def warm(quick: bool) -> Iterator[None]:
    """In quick mode, every local worker started inside forks warm; otherwise nothing."""
    if not quick:
        yield
        return
    from torchherd.engine.launch.process import keep_warm, let_go

    keep_warm()
    try:
        yield
    finally:
        let_go()
