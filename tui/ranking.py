"""A sweep's trials ranked by their best validation metric (trials that report none: by their last train loss),
folded from events: one `TrialRow` per trial (its values, state, best metric, the highest rung it was judged at
and why), and the table headless prints at the end. Plain data: the app's run state folds the same rows.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine import TO_VALIDATE, TRAIN_LOSS, TRAIN_LOSS_SAID, reports_validation
from ..engine.protocol.control import Action, ClientCommand
from ..engine.protocol.messages import (
    EpochEnd,
    Event,
    PipelineFinished,
    StepMetrics,
    TrainingStarted,
    TrialDecision,
    ValResult,
    pipeline_of,
)
from ..engine.protocol.progress import better, metric_value
from ..engine.protocol.states import ended_label

if TYPE_CHECKING:  # the config's schema (pydantic) loads with headless's ranking, not with the app's run state
    from ..engine import RunConfig

# engine/worker/checkpoint.py's names, and a Lightning pipeline's (engine/runners/lightning)
KNOWN = ("best.pt", "best.ckpt", "last.pt", "last.ckpt")
SAID = {"prune": "pruned", "pause": "paused", "promote": "promoted"}  # a trial_decision's action, as a reason says it


@dataclass
class TrialRow:
    """One trial as the ranking shows it."""

    name: str
    values: dict[str, Any]  # the [sweep] space's values it trains with
    state: str = "queued"  # as people read it ('pruned', 'early stop', 'running', ...)
    best: float | None = None  # its best `metric` so far (ranked by TRAIN_LOSS: its last train loss)
    rung: float | None = None  # the highest rung its scheduler judged it at
    epoch: int = 0  # the newest validated epoch, from 1
    reasons: list[str] = field(default_factory=list)  # its scheduler's decisions and promotions, oldest first
    lineage: str = ""  # PBT: whose checkpoint it trains on from, and from which epoch ('from lr0.03@e4')
    taking_over: bool = False  # PBT: exploited, not training from the copy yet (a result now is of the old weights)


def fold_trial(row: TrialRow, ev: Event, metric: str, mode: str) -> bool:
    """Take one of `row`'s trial's events into it (`metric` TRAIN_LOSS: its step and epoch losses); True when the
    row changed."""
    if metric == TRAIN_LOSS and isinstance(ev, (StepMetrics, EpochEnd)):
        loss = ev.loss if isinstance(ev, StepMetrics) else ev.train_loss
        if isinstance(ev, EpochEnd):  # an epoch's mean; NaN when it reported no loss: its steps' stands
            row.epoch = max(row.epoch, ev.epoch + 1)
            if not math.isfinite(loss):
                return True
        row.best = loss
    elif isinstance(ev, ValResult) and not ev.error:
        value = metric_value(ev.metrics, metric)
        if value is not None and better(value, row.best, mode) and not row.taking_over:
            row.best = value
        row.epoch = max(row.epoch, ev.epoch + 1)
    elif isinstance(ev, TrainingStarted) and row.taking_over:
        row.taking_over = False
        return False
    elif isinstance(ev, TrialDecision) and ev.action == "exploit":
        row.values = {**row.values, **{k: v for k, v in ev.exploit.get("values", {}).items() if k in row.values}}
        # It trains on from another's checkpoint: its best (and best.ckpt) is of the weights it trains from then on
        row.best, row.taking_over = None, True
        row.lineage = lineage(ev)
        row.reasons.append(f"{lineage(ev)}: {ev.reason}")
    elif isinstance(ev, TrialDecision):
        row.rung = ev.rung if row.rung is None else max(row.rung, ev.rung)
        row.reasons.append(f"rung {ev.rung:g}: {SAID.get(ev.action, 'goes on')}: {ev.reason}")
    elif isinstance(ev, PipelineFinished):
        row.state = ended_label(ev.status, ev.rung, ev.never_ran)
    elif isinstance(ev, ClientCommand) and ev.action == Action.PROMOTE and ev.ok:
        row.reasons.append("promoted: trains on from its checkpoint, never pruned again this session")
    else:
        return False
    return True


def lineage(decision: TrialDecision) -> str:
    """A PBT trial's lineage as the sweep view says it: 'from lr0.03@e4' (the donor's name less its base)."""
    donor = str(decision.exploit.get("donor", ""))
    return f"from {donor.split('-', 1)[1] if '-' in donor else donor}@e{decision.exploit.get('epoch', 0)}"


def fold_trials(config: RunConfig, events: Iterable[Event], states: dict[str, str] | None = None) -> list[TrialRow]:
    """Each of `config`'s pipelines as a row, best first by [validation] metric and mode (rows without a
    result last, in config order). `states`: final or live states by name, over those the events say."""
    from ..engine import labelled

    sweep = SavedSweep.of(config)
    assert sweep is not None, "a sweep's trials"
    rows = {name: TrialRow(name, values) for name, values in labelled({p.name: dict(p.trial)
                                                                       for p in config.pipelines}).items()}
    for ev in events:
        row = rows.get(pipeline_of(ev))
        if row is not None:
            fold_trial(row, ev, sweep.ranks_by, sweep.ranks_mode)
    for name, state in (states or {}).items():
        if name in rows:
            rows[name].state = state
    return rank(list(rows.values()), sweep.ranks_mode)


PROMOTING = ("asha", "median")  # the sweep schedulers whose trials reach rungs and can be promoted


@dataclass(frozen=True)
class SavedSweep:
    """One sweep of a session: each trial's values (by the name the session gave it), its [validation] metric,
    how many of its best trials the sweep view's chart overlays, its scheduler (PBT's and a plain grid's
    trials have nothing to promote), and whether any trial reports a validation result (else its trials are
    ranked by their last train loss)."""

    trials: dict[str, dict[str, Any]]
    metric: str
    metric_mode: str
    overlay: int = 4
    scheduler: str = "asha"
    validated: bool = True

    @property
    def ranks_by(self) -> str:
        """What ranks its trials: its metric, or TRAIN_LOSS when none of them reports a validation result."""
        return self.metric if self.validated else TRAIN_LOSS

    @property
    def ranks_mode(self) -> str:
        return self.metric_mode if self.validated else "min"

    @property
    def ranking(self) -> str:
        """What ranks its trials, as its tables say it: 'val_loss', 'last train loss (no validation metric)'."""
        return self.metric if self.validated else TRAIN_LOSS_SAID

    @property
    def promotes(self) -> bool:
        """A trial of it can be promoted: its scheduler prunes or pauses trials."""
        return self.scheduler in PROMOTING

    @property
    def undecided(self) -> str:
        """What the sweep view says of a trial its scheduler has not judged yet."""
        return "no rung reached yet" if self.promotes else "no decision yet" if self.scheduler == "pbt" else \
            "a grid: every trial trains to its end"

    @classmethod
    def of(cls, config: RunConfig, names: list[str] | None = None) -> SavedSweep | None:
        """`config`'s sweep, its trials under `names` (what the session called its pipelines, in order; default
        their own names); None for a config that is no sweep."""
        if config.sweep is None:
            return None
        from ..engine import labelled

        names = names or [p.name for p in config.pipelines]
        v = config.validation
        return cls(labelled({n: dict(p.trial) for n, p in zip(names, config.pipelines)}), v.metric, v.metric_mode,
                   config.sweep.overlay, config.sweep.scheduler, reports_validation(config.pipelines, v.mode))


def saved_sweeps(run_dir: Path) -> list[SavedSweep]:
    """Every sweep of the run in `run_dir`, one per config that is one, read from config.json without the schema;
    [] for a run with none or whose config cannot be read."""
    try:
        configs = json.loads((Path(run_dir) / "config.json").read_text())
        from ..engine import labelled

        return [SavedSweep(labelled({p["name"]: dict(p.get("trial") or {}) for p in c["pipelines"]}),
                           c.get("validation", {}).get("metric", "val_loss"),
                           c.get("validation", {}).get("metric_mode", "min"), int(c["sweep"].get("overlay", 4)),
                           str(c["sweep"].get("scheduler", "none")),
                           reports_validation(c["pipelines"], c.get("validation", {}).get("mode", "auto")))
                for c in configs if c.get("sweep")]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return []


def rank(rows: list[TrialRow], mode: str) -> list[TrialRow]:
    """`rows` best first (NaN after every number); those with no result keep their order, after the rest."""
    scored = [(r.best, r) for r in rows if r.best is not None]
    scored.sort(key=lambda pair: (not math.isfinite(pair[0]), pair[0] if mode == "min" else -pair[0]))
    return [r for _, r in scored] + [r for r in rows if r.best is None]


def checkpoint_of(run_dir: Path, name: str) -> Path | None:
    """The trial's best checkpoint, else its last one, else (a script's own) the newest file in its
    checkpoints/; None when it wrote none."""
    folder = Path(run_dir) / name / "checkpoints"
    for file in KNOWN:
        if (folder / file).exists():
            return folder / file
    try:
        own = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "~"))]
    except OSError:
        return None
    return max(own, key=lambda p: p.stat().st_mtime, default=None)


def short_value(v: object) -> str:
    """A trial's value as a column shows it: floats in 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def ranked_table(rows: list[TrialRow], metric: str, run_dir: Path, limit: int = 20) -> list[str]:
    """The lines headless prints at the end of a sweep: a ranked table, then the best trial's values, metric
    and checkpoint (`metric` TRAIN_LOSS: ranked by the trials' last train loss)."""
    if not rows:
        return []
    by_loss = metric == TRAIN_LOSS
    keys = list(rows[0].values)
    pbt = any(r.lineage for r in rows)  # its lineage where a rung would be: PBT has none
    head = ["#", "trial", *(k.rsplit(".", 1)[-1] for k in keys), metric, "state", "lineage" if pbt else "rung"]
    body = [[str(i + 1), r.name, *(short_value(r.values.get(k, "")) for k in keys),
             "-" if r.best is None else f"{r.best:.4g}", r.state,
             (r.lineage or "-") if pbt else "-" if r.rung is None else f"{r.rung:g}"]
            for i, r in enumerate(rows[:limit])]
    widths = [max(len(line[c]) for line in [head, *body]) for c in range(len(head))]
    out = [ranked_by_line(len(rows), metric, any(r.best is not None for r in rows))]
    out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [head, *body]]
    if len(rows) > limit:
        out.append(f"  ... and {len(rows) - limit} more")
    best = rows[0]
    if best.best is not None:
        values = ", ".join(f"{k} = {short_value(v)}" for k, v in best.values.items())
        ckpt = checkpoint_of(run_dir, best.name)
        said = "last train loss" if by_loss else metric
        out.append(f"best: {best.name} ({values}): {said} {best.best:.4g}, checkpoint "
                   f"{ckpt if ckpt is not None else 'none written'}")
    return out


def ranked_by_line(trials: int, metric: str, any_ranked: bool) -> str:
    """'sweep: 4 trials ranked by val_loss'; by their last train loss, or by nothing, said as such with what to
    add to the config."""
    if metric != TRAIN_LOSS and any_ranked:
        return f"sweep: {trials} trials ranked by {metric}"
    if metric != TRAIN_LOSS:
        return f"sweep: {trials} trials, none ranked: no trial reported {metric}"
    if any_ranked:
        return f"sweep: {trials} trials ranked by last train loss (no validation metric: {TO_VALIDATE})"
    return (f"sweep: {trials} trials, none ranked: they reported no validation metric and no train loss (give the "
            f"script `metrics`, a pattern for its loss lines, to rank them by their last train loss; {TO_VALIDATE} "
            "to rank them by it)")


def sweep_ranking(run_dir: Path, states: dict[str, str], more: Iterable[Event] = ()) -> list[str]:
    """`ranked_table` of each sweep in `run_dir` (one per config that is a sweep; none for a run with none),
    from its saved configs and events (a resumed sweep's earlier results too), `more` events not in the file
    yet, and each trial's ended state as people read it (`states`)."""
    from ..engine import load_resolved_configs, read_events

    try:
        configs = [c for c in load_resolved_configs(run_dir) if c.sweep is not None]
    except (OSError, ValueError, IndexError):
        return []
    events = [*read_events(run_dir), *more] if configs else []
    sweeps = [SavedSweep.of(config) for config in configs]
    return [line for config, sweep in zip(configs, sweeps) if sweep is not None
            for line in ranked_table(fold_trials(config, events, states), sweep.ranks_by, run_dir)]
