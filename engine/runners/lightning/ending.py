"""How a Lightning fit ends before its epochs run out: at once for a stop mid-epoch (`end_fit_now`), and as an
early stop, said as such, when the module's own EarlyStopping callback ended it (`stopped_by_its_own_early_stopping`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning.pytorch as pl


def end_fit_now() -> None:
    """Leave Trainer.fit at once, as Lightning's own tuner does: with should_stop alone Lightning ends the epoch,
    and the module's and every callback's on_train_epoch_end (a ModelCheckpoint's among them) ran for an epoch that
    had not ended. A Lightning without that exit keeps should_stop's way."""
    try:
        from lightning.pytorch.utilities.exceptions import _TunerExitException
    except ImportError:
        return
    raise _TunerExitException()


def stopped_by_its_own_early_stopping(trainer: pl.Trainer) -> str | None:
    """Why the module's own EarlyStopping callback ended the fit before its epochs ran out, for people; None when
    none did."""
    from lightning.pytorch.callbacks import EarlyStopping

    for cb in trainer.callbacks:  # type: ignore[attr-defined]  # Trainer.callbacks is a list of Callback
        if isinstance(cb, EarlyStopping) and cb.stopped_epoch > 0:
            of = f" of {trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
            return (f"Lightning's EarlyStopping: {cb.monitor} did not improve in {cb.patience} checks "
                    f"(stopped after epoch {cb.stopped_epoch + 1}{of})")
    return None
