"""A sweep's trials as a table, best first: rank (with the chart's glyph for the trials it overlays), the
values each trial trains with, its state as the pipeline table words it, its best metric, the highest rung
its scheduler judged it at (PBT: its lineage), and its epoch. The trial's name shows only where the terminal
has room for it.

It draws and moves its cursor as `PipelineTable` does (and posts the same `Selected`), so the dashboard's
keys act on the trial under the cursor; rows are re-ranked as results arrive, the cursor staying on its trial.
"""
from __future__ import annotations

from typing import Any, Unpack

from rich.cells import cell_len

from ...engine import TRAIN_LOSS, TRAIN_LOSS_SAID
from ...engine.protocol.progress import PipelineProgress
from ...engine.protocol.states import WorkerState
from ..formats import fmt_num, metric_label
from ..ranking import PROMOTING, TrialRow, short_value
from . import WidgetOptions
from .pipeline_table import Column, PipelineTable, state_text

VALUE_WIDTH = (4, 12)  # cells a value column takes at least and at most
LINEAGE_WIDTH = 24  # cells a PBT trial's lineage takes at most ('from lr0.03@e4')
NAME_WIDTH = 30  # at most, for the trial's name where there is room
STATE_WIDTH = (10, 16)  # cells the state takes, up to 'paused at rung 2' whole while a trial reads so
BORDER = 2


def _column(key: str, label: str, width: int) -> Column:
    return Column(key, label, width, lambda r, now, w: "", True)


def value_columns(rows: list[TrialRow]) -> list[Column]:
    """One column per swept key (its last part as the header, as the trial names say it), wide enough for
    its values within VALUE_WIDTH."""
    keys = list(rows[0].values) if rows else []
    out = []
    for key in keys:
        label = key.rsplit(".", 1)[-1]
        widest = max([cell_len(label)] + [cell_len(short_value(r.values.get(key, ""))) for r in rows])
        out.append(_column(f"value:{key}", label, min(max(widest, VALUE_WIDTH[0]), VALUE_WIDTH[1])))
    return out


def fmt_rung(rung: float | None) -> str:
    return "-" if rung is None else f"{rung:g}"


def fmt_epoch(row: PipelineProgress | None) -> str:
    if row is None or not row.epochs_total:
        return "-"
    return f"{min(row.epoch_number, row.epochs_total)}/{row.epochs_total}"


class SweepTable(PipelineTable):
    """Trials as rows, best first; `update_trials` takes the ranked rows and repaints what changed."""

    DEFAULT_CSS = """
    SweepTable { height: auto; max-height: 12; border: round $panel-lighten-2; }
    SweepTable:focus { border: round $accent; }
    """

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(**kwargs)
        self.border_title = "sweep: trials best first"
        self.columns: list[Column] = []
        self.scheduler = "asha"  # its sweep's: PBT's trials have a lineage and no rung, a plain grid's neither

    def _say_rows(self) -> None:
        super()._say_rows()
        promote = "u promote" if self.scheduler in PROMOTING else ""
        self.border_subtitle = "  ".join(t for t in (self.border_subtitle, promote) if t)

    def label(self, column: Column) -> str:
        return column.label

    def visible_columns(self) -> list[Column]:
        return self.columns

    def update_trials(self, rows: list[TrialRow], progress: dict[str, PipelineProgress], now: float,
                      terminal_width: int, metric: str, marks: dict[str, str] | None = None) -> None:
        """Take the ranked rows (`progress`: each trial's live figures, for its state and epoch; `metric`: what
        ranks them, TRAIN_LOSS for trials with no validation metric; `marks`: the chart's glyph of the trials it
        overlays); keep the cursor on the trial it was on."""
        marks = marks or {}
        states = {r.name: state_text(progress[r.name], now) if r.name in progress else r.state for r in rows}
        state_width = min(max([STATE_WIDTH[0], *map(cell_len, states.values())]), STATE_WIDTH[1])
        columns = [_column("rank", "#", 3), *value_columns(rows), _column("state", "state", state_width),
                   _column("best", "train loss" if metric == TRAIN_LOSS else f"best {metric_label(metric)}", 10),
                   _column("rung", "rung", 4),
                   _column("epoch", "epoch", 5)]
        lineage = min(max((cell_len(r.lineage) for r in rows), default=0), LINEAGE_WIDTH)
        if lineage or self.scheduler == "pbt":  # whose checkpoint each trains on from, in place of rungs
            columns[-2] = _column("lineage", "lineage", max(lineage, 7))
        elif self.scheduler not in PROMOTING:  # a plain grid judges nothing: no rung
            del columns[-2]
        used = sum(c.width + 1 for c in columns)
        name_width = min(NAME_WIDTH, max((cell_len(r.name) for r in rows), default=0))
        if rows and used + name_width + 1 <= terminal_width - BORDER:  # room for the names too
            columns.insert(1, _column("name", "trial", name_width))
        self.border_title = (f"sweep: {len(rows)} trials by {TRAIN_LOSS_SAID}" if metric == TRAIN_LOSS else
                             f"sweep: {len(rows)} trials, best {metric_label(metric)} first")
        selected = self.selected
        names = [r.name for r in rows]
        cells: dict[str, dict[str, Any]] = {}
        for i, row in enumerate(rows):
            live = progress.get(row.name)
            cells[row.name] = {
                "rank": f"{i + 1}{marks.get(row.name, '')}", "name": row.name,
                **{f"value:{k}": short_value(v) for k, v in row.values.items()},
                "state": states[row.name],
                "best": fmt_num(row.best, 10), "rung": fmt_rung(row.rung), "epoch": fmt_epoch(live),
                "lineage": row.lineage or "-"}
            self.states[row.name] = live.state if live is not None else WorkerState.QUEUED
            self.stalled[row.name] = cells[row.name]["state"].startswith("stall ")
        relayout = names != self.names or [(c.key, c.width) for c in columns] != \
            [(c.key, c.width) for c in self.columns]
        changed = [i for i, n in enumerate(names) if cells[n] != self.cells.get(n)]
        self.names, self.cells, self.columns = names, cells, columns
        if selected in names:
            self.cursor = names.index(selected)
        self.cursor = min(self.cursor, max(0, len(names) - 1))
        if relayout:
            self.on_resize()  # the cursor's row kept in view
            self.refresh(layout=True)
        else:
            for index in changed:
                self._refresh_row(index)
        self._say_rows()

    def select(self, name: str) -> None:
        """Put the cursor on `name` (the pipeline selected elsewhere), without posting Selected."""
        if name in self.names and self.names[self.cursor] != name:
            self.cursor = self.names.index(name)
            self.on_resize()
            self.refresh()
