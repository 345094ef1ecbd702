"""Sinks of a user's own for tests/test_sinks.py: one that writes what it takes to a file, one that raises on
every batch, one that never returns from its first."""
from __future__ import annotations

import json
import threading

from torchherd.engine.sinks.api import Sink


class Recording(Sink):
    name = "recording"

    def write(self, events):
        with open(self.run.state / "recorded.jsonl", "a") as out:
            for event in events:
                out.write(json.dumps({"type": event.type, "pipeline": getattr(event, "pipeline", ""),
                                      "step": getattr(event, "step", None)}) + "\n")
        print(f"wrote {len(events)} events")  # a sink's prints go to its log, never the supervisor's terminal

    def close(self):
        (self.run.state / "closed").write_text("yes")


class Raising(Sink):
    def write(self, events):
        raise RuntimeError("the tracker's server said no")


class Blocking(Sink):
    def write(self, events):
        threading.Event().wait()  # a tracker whose connection hangs for ever
