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
