"""How the app writes numbers, durations, epochs, metric names and failure reasons, the same in every pane.

Numbers are fitted to a width by giving up digits, never by cutting characters: `3.027e-05` in seven
cells is `3.03e-5`, not `3.027e-`. Epochs are counted from 1 for people ("epoch 2/8"); the engine's
events and JSON count from 0.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from ..engine.protocol.health import Straggler
from ..engine.protocol.messages import CheckpointSaved, GangResized
from ..engine.protocol.progress import PipelineProgress

SHORT_METRICS = {"accuracy": "acc", "val_loss": "loss", "loss": "loss", "val_accuracy": "acc"}


def _tidy_exponent(text: str) -> str:
    """'3.03e-05' -> '3.03e-5', '1.2e+04' -> '1.2e4'."""
    mantissa, e, exponent = text.partition("e")
    if not e:
        return text
    sign = "-" if exponent.startswith("-") else ""
    return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"


def fmt_num(value: float | None, width: int = 7) -> str:
    """`value` in at most `width` cells with as many significant digits as fit; '-' when absent."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")[:width]
    for digits in (4, 3, 2, 1):
        plain = _tidy_exponent(f"{value:.{digits}g}")
        if len(plain) <= width:
            return plain
        sci = _tidy_exponent(f"{value:.{digits - 1}e}")
        if len(sci) <= width:
            return sci
    return "#" * width  # cannot fit even one digit: say so rather than show a wrong number


def fmt_count(n: float | None, width: int = 6) -> str:
    """A count such as steps or samples/s: '1,234', '123k', '12.3M', fitted to `width`."""
    if n is None:
        return "-"
    n = int(n)
    for text in (f"{n:,}", f"{n / 1e3:.0f}k", f"{n / 1e6:.1f}M", f"{n / 1e6:.0f}M", f"{n / 1e9:.0f}G"):
        if len(text) <= width and not (text.endswith("k") and n >= 999_500):
            return text
    return "#" * width


def fmt_device(device: str, width: int = 6) -> str:
    """A pipeline's slots in `width` cells: "cpu1", a gang's "gpu0-3" when they run in a row, else "4×gpu"."""
    names = device.split(",") if device else []
    if len(names) <= 1:
        return device or "-"
    kinds = {n.rstrip("0123456789") for n in names}
    numbers = [n[len(n.rstrip("0123456789")):] for n in names]
    if len(kinds) == 1 and all(numbers):
        kind, first, last = kinds.pop(), int(numbers[0]), int(numbers[-1])
        span = f"{kind}{first}-{last}"
        if [int(x) for x in numbers] == list(range(first, last + 1)) and len(span) <= width:
            return span
        return f"{len(names)}×{kind}"
    return f"{len(names)} slots"


def gang_size(row: PipelineProgress, width: int = 9) -> str:
    """An elastic gang's size, current of MAX, in `width` cells: '2/4 ranks', else '2/4'; "" for a fixed gang or
    one process, and while it holds no device."""
    if not row.elastic or not row.ranks:
        return ""
    size = f"{row.ranks}/{row.max_ranks}"
    return f"{size} ranks" if len(size) + 6 <= width else size


def fmt_duration(seconds: float | None) -> str:
    """'4:05' under an hour, '2h05m' under 100 hours, then '4d07h', then '123d': six cells at most."""
    if seconds is None:
        return "-"
    s = int(seconds)
    days = s // 86400
    if days >= 100:
        return f"{days}d"
    if s >= 100 * 3600:
        return f"{days}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}:{s % 60:02d}"


def fmt_quiet(seconds: float) -> str:
    """How long without a step, in at most four cells: '45s', '6m', '12h', '3d'."""
    s = int(max(seconds, 0))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit != "m" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def quiet_text(seconds: float) -> str:
    """'no step for 6 min' as people read it."""
    s = int(max(seconds, 0))
    return f"no step for {s} s" if s < 120 else f"no step for {s // 60} min" if s < 7200 else \
        f"no step for {s // 3600} h"


def shown_path(path: Path) -> str:
    """`path` as the person at this terminal can use it: relative to the working folder when it lies inside it,
    else absolute (a run attached from another folder names its files as they are from there)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except (ValueError, OSError):  # outside the working folder, or the working folder is gone
        return str(absolute)


def epoch_label(epoch: int, total: int = 0) -> str:
    """A 0-based epoch as people count it: 'epoch 2/8', or 'epoch 2' when the total is unknown."""
    return f"epoch {epoch + 1}/{total}" if total else f"epoch {epoch + 1}"


def metric_label(metric: str) -> str:
    """A short name for a metric, for a column header: 'accuracy' -> 'acc', 'val_loss' -> 'loss'."""
    if metric in SHORT_METRICS:
        return SHORT_METRICS[metric]
    return metric[4:] if metric.startswith("val_") and len(metric) > 4 else metric


def is_loss_metric(metric: str, mode: str) -> bool:
    """Whether validation values share the train loss's scale: `val_loss`, or a minimised '...loss...'."""
    return metric == "val_loss" or (mode == "min" and "loss" in metric)


def finish_text(status: str, reason: str) -> str:
    """'failed: restart budget of 3 used up: IndexError: x': the status, then why."""
    return f"{status}: {reason}" if reason else status


def straggler_text(ev: Straggler) -> str:
    """A `Straggler` event as the event log and headless say it."""
    if not ev.ratio:
        return f"rank {ev.rank} keeps pace again"
    return (f"straggler rank {ev.rank}: {ev.ratio:.1f}x its peers' time per batch "
            f"({ev.slowest * 1e3:.0f} ms vs {ev.median * 1e3:.0f} ms)")


def gang_text(row: PipelineProgress) -> str:
    """A gang's ranks as its row's detail line says them: an elastic gang's size and slots ('1/2 ranks of 1:2 on
    cpu0'), the spread of their own time per batch, a straggler, and while it is stalled the triage's verdict
    ("" for a pipeline with nothing of the kind to say)."""
    parts = []
    if row.elastic and row.ranks:  # the table's device column gives its size instead of its slots
        parts.append(f"{row.ranks}/{row.max_ranks} ranks of {row.min_ranks}:{row.max_ranks} on {row.device or '-'}")
    if (spread := row.spread) is not None:
        median, slowest, rank = spread
        parts.append(f"ranks: slowest rank {rank} {slowest * 1e3:.0f} ms/batch, its peers' median "
                     f"{median * 1e3:.0f} ms ({slowest / median if median > 0 else 1:.1f}x)")
    if row.straggler:
        parts.append(f"straggler {row.straggler}")
    if row.verdict and row.stalled_since is not None:
        parts.append(f"triage: {row.verdict}")
    return " · ".join(parts)


def resized_text(ev: GangResized) -> str:
    """A `gang_resized` event as the event log and headless say it: the sizes, why, and what became of the batch."""
    ranks = f"{ev.to_ranks} rank{'s' if ev.to_ranks != 1 else ''}"
    text = f"gang resized from {ev.from_ranks} to {ranks}" + (f" ({ev.why})" if ev.why else "")
    if not ev.keep:  # a script (keep ""): told WORLD_SIZE, it sizes its batch itself
        return f"{text}: WORLD_SIZE={ev.to_ranks}; the script's batch is its own"
    batch = f"batch_size {ev.batch_size} x accumulate_grad_batches {ev.accumulate_grad_batches} a rank"
    if ev.samples_per_step == ev.samples_per_step_before:
        return f"{text}: {batch}, {ev.samples_per_step} samples an optimizer step as before"
    how = "keep = per_rank_batch" if ev.keep == "per_rank_batch" else \
        f"the global batch does not divide between {ranks}"
    return f"{text}: {batch}, {ev.samples_per_step_before} -> {ev.samples_per_step} samples an optimizer step ({how})"


def checkpoint_cost(ev: CheckpointSaved) -> str:
    """", training held 0.012 s, written in 1.3 s" for a checkpoint that says so (older records do not)."""
    if not ev.write_s and not ev.blocked_s:
        return ""
    return f", training held {ev.blocked_s:.2g} s, written in {ev.write_s:.2g} s"


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; 0 -> '0 B'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
