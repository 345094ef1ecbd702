"""A live run's history in short, kept as it happens, for a client that attaches: every event it keeps,
but of each pipeline's step reports only a thinned series (at most POINTS, evenly spread over the whole
history, and always the newest), so the fold gives the same figures and the charts the same shape.
"""
from __future__ import annotations

import msgspec

POINTS = 1024  # step reports kept per pipeline: twice a chart's 512 bins (tui/series.py)
_STEP = b'{"type":"step",'


class _Pipeline(msgspec.Struct):
    pipeline: str = ""


_pipeline_of = msgspec.json.Decoder(_Pipeline)


class _Thinned:
    """One pipeline's step reports: every `stride`-th one, halved when it outgrows POINTS, and the newest."""

    __slots__ = ("kept", "newest", "seen", "stride")

    def __init__(self) -> None:
        self.kept: list[tuple[int, bytes]] = []  # (position in the run, line)
        self.stride = 1
        self.seen = 0
        self.newest: tuple[int, bytes] | None = None

    def add(self, seq: int, line: bytes, points: int) -> None:
        if self.seen % self.stride == 0:
            self.kept.append((seq, line))
            if len(self.kept) > points:
                del self.kept[1::2]
                self.stride *= 2
        self.seen += 1
        self.newest = (seq, line)

    def lines(self) -> list[tuple[int, bytes]]:
        if self.newest is not None and (not self.kept or self.kept[-1][0] != self.newest[0]):
            return [*self.kept, self.newest]
        return list(self.kept)


class HistorySummary:
    """Takes a run's events.jsonl lines in order (`add`, or `add_file` for what is on disk already) and gives
    its history in short as events.jsonl lines (`data`)."""

    def __init__(self, points: int = POINTS):
        self.points = points
        self._seq = 0
        self._others: list[tuple[int, bytes]] = []  # every line that is not a step report, with its position
        self._steps: dict[str, _Thinned] = {}

    def add(self, line: bytes, pipeline: str | None = None) -> None:
        """One line of events.jsonl (`pipeline`: a step report's pipeline, when the caller knows it)."""
        if pipeline is None and line.startswith(_STEP):
            try:
                pipeline = _pipeline_of.decode(line).pipeline
            except msgspec.DecodeError:
                return
        self._seq += 1
        if pipeline is None:
            self._others.append((self._seq, line))
            return
        steps = self._steps.get(pipeline)
        if steps is None:
            steps = self._steps[pipeline] = _Thinned()
        steps.add(self._seq, line, self.points)

    def add_file(self, data: bytes) -> None:
        """Whole lines of events.jsonl, as read from the file."""
        for line in data.splitlines(keepends=True):
            if line.strip():
                self.add(line)

    def data(self) -> bytes:
        """The history in short, in the order it happened, as events.jsonl lines."""
        kept = [*self._others]
        for steps in self._steps.values():
            kept += steps.lines()
        kept.sort(key=lambda item: item[0])
        return b"".join(line for _, line in kept)

    @property
    def steps_seen(self) -> int:
        return sum(s.seen for s in self._steps.values())
