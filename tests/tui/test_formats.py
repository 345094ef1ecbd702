"""Numbers fitted to their cells, epochs for people, metric names and failure reasons, as every pane writes them."""
from __future__ import annotations

import math

import pytest

from torchherd.tui.formats import (epoch_label, finish_text, fmt_count, fmt_duration, fmt_num, is_loss_metric,
                                   metric_label)


@pytest.mark.parametrize("value,width,text", [
    (3.027e-05, 7, "3.03e-5"),  # regression: was cut to "3.027e-"
    (0.5737, 7, "0.5737"), (1234.5678, 7, "1235"), (123456789.0, 7, "1.235e8"), (123456789.0, 6, "1.23e8"), (-0.000123456, 8, "-1.23e-4"),
    (0.0003, 7, "0.0003"), (1e-12, 5, "1e-12"), (None, 7, "-"), (math.nan, 7, "nan"), (math.inf, 7, "inf"),
])
def test_fmt_num_gives_up_digits_never_characters(value, width, text):
    assert fmt_num(value, width) == text


@pytest.mark.parametrize("width", range(6, 12))
@pytest.mark.parametrize("value", [3.027e-05, -2.5e-7, 0.123456, 9.99999, 123456.7, -98765432.1, 1e300])
def test_fmt_num_always_fits_and_reads_back_close(value, width):
    text = fmt_num(value, width)
    assert len(text) <= width
    assert float(text) == pytest.approx(value, rel=0.5)


@pytest.mark.parametrize("n,width,text", [(999, 6, "999"), (12_345, 6, "12,345"), (123_456, 6, "123k"),
                                          (999_600, 6, "1.0M"), (1_234_567, 5, "1.2M"), (None, 6, "-")])
def test_fmt_count(n, width, text):
    assert fmt_count(n, width) == text


def test_durations_and_epochs():
    assert (fmt_duration(65), fmt_duration(3 * 3600 + 300), fmt_duration(None)) == ("1:05", "3h05m", "-")
    assert [fmt_duration(s) for s in (100 * 3600, 10 ** 7)] == ["4d04h", "115d"]
    assert fmt_num(-2.5e-7, 4) == "####"  # no digit fits: say so, never show a wrong number
    assert (epoch_label(0, 8), epoch_label(7, 8), epoch_label(2)) == ("epoch 1/8", "epoch 8/8", "epoch 3")


def test_metric_names_and_which_share_the_loss_axis():
    assert (metric_label("accuracy"), metric_label("val_loss"), metric_label("val_f1")) == ("acc", "loss", "f1")
    assert is_loss_metric("val_loss", "min") and is_loss_metric("val_nll_loss", "min")
    assert not is_loss_metric("accuracy", "max") and not is_loss_metric("loss_ratio", "max")


def test_failure_reasons_lose_their_nested_brackets():
    # Regression: "failed (IndexError: ... (restart budget of 3 used up))".
    assert finish_text("failed", "restart budget of 3 used up: IndexError: x") == \
        "failed: restart budget of 3 used up: IndexError: x"
    assert finish_text("completed", "trained to its limits") == "completed: trained to its limits"
    assert finish_text("killed", "") == "killed"


def test_a_resumed_run_shows_a_fresh_restart_budget():
    # Regression: after `torchherd resume` the row read "try 3 ↻1/3", though resume gives a fresh budget.
    from torchherd.engine.protocol import messages as m
    from torchherd.tui.runstate import RunState
    from torchherd.tui.widgets.pipeline_table import fmt_try

    state = RunState()
    started = m.RunStarted(run_id="r", run_dir="/tmp/r", config_path="c.toml", pipelines=("a",))
    for event in (started, m.WorkerStarted(pipeline="a", pid=1, device="cpu0", attempt=1),
                  m.WorkerRestarting(pipeline="a", attempt=1, delay=0.1, restarts_left=2),
                  m.WorkerStarted(pipeline="a", pid=2, device="cpu0", attempt=2)):
        state.apply(event)
    assert fmt_try(state.rows["a"], 10) == "2 ↻1/3"
    state.apply(started)  # the resumed session
    state.apply(m.WorkerStarted(pipeline="a", pid=3, device="cpu0", attempt=3))
    assert fmt_try(state.rows["a"], 10) == "3"


def test_an_elastic_gangs_size_fits_its_cell_and_the_line_under_the_table_names_its_slots():
    from torchherd.engine.protocol.progress import PipelineProgress
    from torchherd.tui.formats import gang_size, gang_text

    gang = PipelineProgress("g", device="cpu1", ranks=1, min_ranks=1, max_ranks=2)
    assert (gang_size(gang, 9), gang_size(gang, 6)) == ("1/2 ranks", "1/2")
    assert gang_size(PipelineProgress("g", ranks=12, min_ranks=8, max_ranks=16), 9) == "12/16"
    assert gang_text(gang) == "1/2 ranks of 1:2 on cpu1"
    fixed = PipelineProgress("f", device="cpu0,cpu1", ranks=2)
    assert (gang_size(fixed), gang_text(fixed)) == ("", "")  # a fixed gang's row says what it said before
    assert gang_size(PipelineProgress("g", min_ranks=1, max_ranks=2)) == ""  # queued: no size, no slots
