"""`torchherd check` for Lightning configs: a missing Lightning and val-metric monitors in background mode."""
from __future__ import annotations

import importlib.util

import pytest

from torchherd.engine.preflight.check import check_config
from torchherd.engine.config.load import parse_config
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.hardware.devices import Inventory
from tests.conftest import TASKS

SAMPLES = TASKS.parent.parent / "sample_configs"

TINY = f"lightning:{TASKS / 'lit_tiny.py'}"


def write(tmp_path, task: str, mode: str = "background", extra: str = "") -> str:
    path = tmp_path / "lit.toml"
    path.write_text(f'[defaults]\ntask = "{task}"\n{extra}\n[validation]\nmode = "{mode}"\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 1\n[[pipelines]]\nname = "a"\n')
    return str(path)


def test_lightning_missing_is_one_line_saying_what_to_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lightning" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        parse_config({"pipelines": [{"name": "a", "task": f"{TINY}:LitTiny"}]}, str(tmp_path / "c.toml"), tmp_path)
    assert str(err.value).endswith('pipelines[0].task: Lightning is not installed: pip install "torchherd[lightning]"')


@pytest.mark.slow  # imports Lightning: seconds
def test_sample_config_is_a_lightning_pipeline_with_its_datamodule_resolved():
    pytest.importorskip("lightning")
    report = check_config(SAMPLES / "lightning_digits.toml", inventory=Inventory(cpu_count=4, note="test"))
    assert report.ok, report.render()
    pipe = report.config.pipelines[0]
    assert pipe.kind == "lightning" and pipe.task_ref == f"lightning:{SAMPLES / 'lit_digits.py'}:LitDigits"
    assert pipe.datamodule == f"{SAMPLES / 'lit_digits.py'}:DigitsData"
    assert pipe.datamodule_params == {"batch_size": 32}
    assert any("(Lightning Trainer.fit)" in line for line in report.lines)


def test_datamodule_on_a_plain_task_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="only Lightning pipelines"):
        parse_config({"pipelines": [{"name": "a", "task": "regression", "datamodule": f"{TASKS / 'tiny.py'}:build"}]},
                     str(tmp_path / "c.toml"), tmp_path)


@pytest.mark.slow
def test_probe_says_early_stopping_cannot_watch_val_loss_in_background(tmp_path):
    pytest.importorskip("lightning")
    report = check_config(write(tmp_path, f"{TINY}:with_early_stopping"), probe=True,
                          inventory=Inventory(cpu_count=2, note="test"))
    assert not report.ok
    [problem] = report.problems
    assert "EarlyStopping monitors 'val_loss'" in problem.message and "[validation] metric and patience" in \
        problem.message and 'mode = "inline"' in problem.message


@pytest.mark.slow
def test_probe_sees_a_plain_factory_that_returns_a_lightning_task(tmp_path):
    pytest.importorskip("lightning")
    path = tmp_path / "two.toml"
    path.write_text(f'[defaults]\ntask = "{TASKS / "lit_tiny.py"}:build"\n[validation]\nmode = "background"\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 2\n[[pipelines]]\nname = "a"\n'
                    f'[[pipelines]]\nname = "b"\ntask = "{TASKS / "lit_tiny.py"}:with_early_stopping"\n')
    inventory = Inventory(cpu_count=4, note="test")
    report = check_config(path, probe=True, inventory=inventory)
    # No `lightning:` prefix, yet its EarlyStopping on val_loss is caught in background mode, as with one.
    [problem] = report.problems
    assert problem.key == "pipelines[1].task" and "EarlyStopping monitors 'val_loss'" in problem.message
    # The other one built (from the probe's cache now) and trains under Lightning, which check says.
    report = check_config(write(tmp_path, f"{TASKS / 'lit_tiny.py'}:build"), probe=True, inventory=inventory)
    assert report.ok, report.render()
    assert any(line.startswith("a: task ") and "lit_tiny.py:build (Lightning Trainer.fit)," in line
               for line in report.lines)
