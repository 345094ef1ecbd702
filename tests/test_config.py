"""Config validation: good and bad fixture files through `check_config`, and `parse_config` rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from torchherd.engine.preflight.check import check_config
from torchherd.engine.config.load import parse_config
from torchherd.engine.config.problems import ConfigError, Problem, display_path
from torchherd.engine.hardware.devices import Inventory

CONFIGS = Path(__file__).parent / "configs"
BAD = sorted((CONFIGS / "bad").glob("*.toml"))
GOOD = sorted((CONFIGS / "good").glob("*.toml"))
# A machine with no GPU and two cores, whatever machine runs the tests.
NO_GPU = Inventory(cpu_count=2, note="no NVIDIA GPU (test inventory)")


def expectation(path: Path) -> tuple[str, str]:
    """The (key path, message substring) a bad fixture's first line promises; an empty key is the whole file."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name} lacks its '# expect:' line"
    key, _, substring = first[len("# expect:"):].partition("|")
    return key.strip(), substring.strip()


def needs_probe(path: Path) -> bool:
    """Fixtures whose problem shows only when the task is built (task_*.toml); a syntax error the fast
    check finds by reading the file."""
    return path.name.startswith("task_") and path.name != "task_bad_syntax.toml"


def test_fixture_sets_are_complete():
    assert len(BAD) >= 12 and len(GOOD) >= 2
    assert sum(needs_probe(p) for p in BAD) == 2


def probe_is_slow(path: Path):
    """A fixture's parameter; those that need the probe (a process that imports torch: seconds) are slow."""
    return pytest.param(path, id=path.stem, marks=[pytest.mark.slow] if needs_probe(path) else [])


@pytest.mark.parametrize("path", [probe_is_slow(p) for p in BAD])
def test_bad_config_names_key_and_problem(path: Path):
    key, substring = expectation(path)
    report = check_config(path.resolve(), probe=needs_probe(path), inventory=NO_GPU)
    assert not report.ok
    matching = [p for p in report.problems if p.key == key]
    assert matching, f"no problem at {key!r}: {report.problems}"
    assert any(substring in p.message for p in matching), [p.message for p in matching]
    assert f"{display_path(path)}: " in report.render()  # relative to the working directory when under it


@pytest.mark.parametrize("path", [p for p in BAD if needs_probe(p)], ids=lambda p: p.stem)
def test_task_build_problems_need_the_probe(path: Path):
    # The fast check only resolves the reference; building the task is what finds these.
    assert check_config(path.resolve(), probe=False, inventory=NO_GPU).ok


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_config_plans_every_pipeline(path: Path):
    report = check_config(path.resolve(), inventory=NO_GPU)
    assert report.ok, report.render()
    assert report.config is not None and report.render().startswith("ok\n")
    for pipe in report.config.pipelines:
        assert any(line.startswith(f"{pipe.name}: ") for line in report.lines), report.lines


@pytest.mark.slow  # the probe builds the task in a process of its own
def test_good_task_file_builds_in_the_probe():
    report = check_config(CONFIGS / "good" / "task_file_tables.toml", probe=True, inventory=NO_GPU)
    assert report.ok, report.render()


# ------------------------------------------------------------ parse_config

def parse(data: dict, tmp_path: Path):
    return parse_config(data, str(tmp_path / "c.toml"), tmp_path)


def problems(data: dict, tmp_path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse(data, tmp_path)
    return info.value.problems


def test_defaults_merge_under_pipeline_values(tmp_path):
    config = parse({"defaults": {"task": "regression", "max_epochs": 5, "batch_size": 16},
                    "pipelines": [{"name": "a", "max_epochs": 2}, {"name": "b"}]}, tmp_path)
    a, b = config.pipelines
    assert (a.max_epochs, a.batch_size) == (2, 16)
    assert (b.max_epochs, b.batch_size) == (5, 16)


def test_params_merge_key_by_key(tmp_path):
    config = parse({"defaults": {"task": "regression", "params": {"lr": 0.1, "hidden": 8}},
                    "pipelines": [{"name": "a", "params": {"hidden": 32, "extra": 1}}, {"name": "b"}]},
                   tmp_path)
    assert config.pipelines[0].params == {"lr": 0.1, "hidden": 32, "extra": 1}
    assert config.pipelines[1].params == {"lr": 0.1, "hidden": 8}


def test_defaults_problem_reported_once(tmp_path):
    found = problems({"defaults": {"task": "regression", "batch_size": 0},
                      "pipelines": [{"name": n} for n in "abc"]}, tmp_path)
    assert [p.key for p in found] == ["defaults.batch_size"]


def test_a_pipeline_with_a_bad_key_still_has_its_task_checked(tmp_path):
    # Regression: a pipeline with a bad name and an unknown task was reported for its name only; the task's
    # problem surfaced on the next check, after the name was fixed.
    found = problems({"pipelines": [{"name": "b c", "task": "nosuchtask"},
                                    {"name": "d", "task": "regression", "batch_size": 0}]}, tmp_path)
    assert [p.key for p in found] == ["pipelines[0].name", "pipelines[0].task", "pipelines[1].batch_size"]
    assert "unknown task 'nosuchtask'" in found[1].message


@pytest.mark.parametrize("data, key, suggestion", [
    ({"pipelines": [{"name": "a", "task": "regression", "bach_size": 8}]}, "pipelines[0].bach_size", "batch_size"),
    ({"restart": {"max_restart": 2}, "pipelines": [{"name": "a", "task": "regression"}]},
     "restart.max_restart", "max_restarts"),
])
def test_typo_suggests_the_known_key(tmp_path, data, key, suggestion):
    found = problems(data, tmp_path)
    assert [(p.key, p.message) for p in found] == [(key, f"unknown key (did you mean '{suggestion}'?)")]


def test_integers_accepted_for_float_fields(tmp_path):
    config = parse({"restart": {"backoff": 2, "hang_timeout": 30},
                    "pipelines": [{"name": "a", "task": "regression", "max_time": 60}]}, tmp_path)
    assert config.pipelines[0].max_time == 60.0 and isinstance(config.pipelines[0].max_time, float)
    assert (config.restart.backoff, config.restart.hang_timeout) == (2.0, 30.0)


@pytest.mark.parametrize("data, key", [
    ({"pipelines": [{"name": "a", "task": "regression", "max_epochs": "3"}]}, "pipelines[0].max_epochs"),
    ({"restart": {"max_restarts": "2"}, "pipelines": [{"name": "a", "task": "regression"}]},
     "restart.max_restarts"),
    ({"devices": {"threads_per_worker": "1"}, "pipelines": [{"name": "a", "task": "regression"}]},
     "devices.threads_per_worker"),
])
def test_strings_rejected_for_int_fields(tmp_path, data, key):
    found = problems(data, tmp_path)
    assert [p.key for p in found] == [key]
    assert "valid integer" in found[0].message


def test_int_precision_read_as_string(tmp_path):
    config = parse({"pipelines": [{"name": "a", "task": "regression", "precision": 32}]}, tmp_path)
    assert config.pipelines[0].precision == "32"


# Bug: config._problems drops every loc part starting with "int" (meant for the
# int|Literal union branch), so telemetry.interval is reported as plain "telemetry".
def test_telemetry_interval_problem_names_its_key(tmp_path):
    found = problems({"telemetry": {"interval": 0}, "pipelines": [{"name": "a", "task": "regression"}]},
                     tmp_path)
    assert [p.key for p in found] == ["telemetry.interval"]


# Regression: `cpu_slots = "two"` gave two lines for one mistake, one per branch of `int | "auto"`.
def test_a_value_no_branch_of_a_union_takes_is_one_problem(tmp_path):
    found = problems({"devices": {"cpu_slots": "two"}, "pipelines": [{"name": "a", "task": "regression"}]},
                     tmp_path)
    assert [str(p) for p in found] == [
        f"{display_path(tmp_path / 'c.toml')}: devices.cpu_slots: "
        "Input should be a valid integer or 'auto' (got 'two')"]


# Regression: `command = "notify-send hi"` said only "Input should be a valid list", with no example.
def test_a_string_for_an_array_key_is_shown_written_as_an_array(tmp_path):
    found = problems({"alerts": {"command": "notify-send 'loss spike'"},
                      "pipelines": [{"name": "a", "task": "regression"}]}, tmp_path)
    assert [(p.key, p.message.split(": ", 1)[1]) for p in found] == [
        ("alerts.command", 'write it as an array, e.g. command = ["notify-send", "loss spike"]')]
