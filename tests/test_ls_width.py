"""`torchherd ls` fits a run's row to the terminal: a sweep's trials are cut with a count, not printed whole;
into a pipe the names go whole."""
from torchherd.tui.verbs import fit_names


def test_a_sweeps_pipeline_list_is_cut_to_the_room_with_a_count():
    # Regression: a 16-trial sweep's row ran past 300 columns.
    names = [f"lr{i}-batch{j}" for i in range(8) for j in (32, 128)]
    cut = fit_names(names, 60)
    assert len(cut) <= 60 and cut.startswith("lr0-batch32, lr0-batch128") and cut.endswith("(+13 more)")
    assert fit_names(["a", "b"], 60) == "a, b"
    assert fit_names(names, 10) == "lr0-batch32, … (+15 more)"  # the first name always


def test_the_waiting_section_names_every_pipeline_that_waits():
    # Regression: one run, three pipelines, two slots: `ls` printed "waiting:" then only "and 1 more queued
    # behind them", naming nothing.
    from torchherd.engine.hardware.ledger import Presence, Waiter
    from torchherd.tui.verbs import ledger_lines

    own = Presence(run="r1", pid=1, waiting=(Waiter("c", 0, 1.0, "", ("cpu0", "cpu1")),))
    assert ledger_lines([], [own]) == ["waiting:", "  run r1  c: queued for a slot the run's own pipelines hold"]
    held_up = Presence(run="r2", pid=2, waiting=(Waiter("a", 0, 1.0, "gpu0 held by run r1"), Waiter("b", 0, 2.0),
                                                 Waiter("c", 0, 3.0)))
    assert ledger_lines([], [held_up]) == ["waiting:", "  run r2  a: gpu0 held by run r1",
                                           "  run r2  b, c: queued behind it"]
