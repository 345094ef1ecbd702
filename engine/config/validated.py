"""Whether a config's pipelines report a validation result at all, read from the config as loaded or as its
run directory's config.json holds it: a sweep of trials that report none is ranked by their last train loss.

Standard library only: the app's sweep view reads a run's trials without loading the config schema.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TRAIN_LOSS = "train_loss"  # what ranks a sweep's trials when none reports a validation metric: its last train loss
TRAIN_LOSS_SAID = "last train loss (no validation metric)"  # ... as the sweep's tables say it
TO_VALIDATE = ("a script reports one with `val_metrics` (a pattern for the lines where it validates itself) or a "
               "`validate` factory")


def reports_validation(pipelines: Iterable[Mapping[str, Any] | Any], mode: str) -> bool:
    """Whether any of `pipelines` (loaded, or as config.json holds them) can report a validation result under
    [validation] `mode`: a task's or a Lightning module's can, a script's only with `val_metrics` or a
    `validate` factory."""
    def key(pipe: Mapping[str, Any] | Any, name: str) -> Any:
        return pipe.get(name) if isinstance(pipe, Mapping) else getattr(pipe, name, None)

    return mode != "off" and any(key(p, "script") is None or key(p, "validate_factory") or key(p, "val_metrics")
                                 for p in pipelines)


def unranked_line(reports_loss: bool, scheduler: str) -> str:
    """What `check` says of a sweep whose trials report no validation metric: ranked by their last train loss
    (`reports_loss`), else by nothing, and what to add; a scheduler that judges validation results judges none."""
    if reports_loss:
        text = f"ranked by last train loss (no validation metric: {TO_VALIDATE})"
    else:
        text = (f"nothing ranks its trials: they report no validation metric and no train loss (give the script "
                f"`metrics`, a pattern for its loss lines, to rank them by their last train loss; {TO_VALIDATE} to "
                "rank them by it)")
    if scheduler in ("asha", "median", "pbt"):
        rule = "the median rule" if scheduler == "median" else scheduler.upper()
        text += f"; {rule} judges validation results, so with none it judges no trial: each trains to its end"
    return text
