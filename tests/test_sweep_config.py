"""The [sweep] table: grid and seeded random trials over params.* and pipeline keys, each a pipeline named
from its values; bad values named by key; `torchherd check` shows the trial count and the first trials."""
from __future__ import annotations

import math

import pytest

from torchherd.engine.config.problems import ConfigError
from torchherd.engine.config.sweep import SweepConfig
from torchherd.engine.config.trials import trials
from torchherd.engine.preflight.check import sweep_lines
from tests.conftest import TASKS, make_config


def sweep_config(tmp_path, sweep, pipelines=None, **top):
    return make_config(tmp_path, pipelines or [{"name": "t"}], sweep=sweep, **top)


def test_a_grid_expands_into_one_named_pipeline_per_point(tmp_path):
    config = sweep_config(tmp_path, {"space": {"params": {"lr": [0.1, 0.01, 0.001]}, "batch_size": [16, 32]}})
    names = [p.name for p in config.pipelines]
    assert names[:2] == ["t-lr0.1-batch_size16", "t-lr0.1-batch_size32"] and len(names) == 6
    last = config.pipelines[-1]
    assert last.params["lr"] == 0.001 and last.batch_size == 32
    assert last.trial == {"params.lr": 0.001, "batch_size": 32}


def test_random_draws_are_seeded_and_in_their_ranges(tmp_path):
    space = {"params": {"lr": {"log_uniform": [1e-4, 1e-1]}, "width": {"int_uniform": [4, 8]},
                        "act": {"choice": ["relu", "tanh"]}}, "precision": ["32", "bf16-mixed"]}
    one = sweep_config(tmp_path, {"space": space, "samples": 5, "seed": 7})
    two = sweep_config(tmp_path, {"space": space, "samples": 5, "seed": 7})
    other = sweep_config(tmp_path, {"space": space, "samples": 5, "seed": 8})
    assert len(one.pipelines) == 10  # 2 grid points x 5 draws
    assert [p.trial for p in one.pipelines] == [p.trial for p in two.pipelines]
    assert [p.trial for p in one.pipelines] != [p.trial for p in other.pipelines]
    for p in one.pipelines:
        assert 1e-4 <= p.params["lr"] <= 1e-1 and p.params["width"] in range(4, 9)
        assert p.params["act"] in ("relu", "tanh")
    assert len({p.name for p in one.pipelines}) == 10
    logs = [math.log10(p.params["lr"]) for p in one.pipelines]
    assert max(logs) - min(logs) > 0.5  # spread over decades, not crowded at the top


def test_params_of_the_pipeline_and_defaults_stay_under_the_trials(tmp_path):
    config = sweep_config(tmp_path, {"space": {"params": {"lr": [0.5]}}},
                          [{"name": "t", "params": {"lr": 9.0, "delay": 0.01}}], defaults={"params": {"hidden": 3}})
    assert config.pipelines[0].params == {"lr": 0.5, "delay": 0.01, "hidden": 3}


@pytest.mark.parametrize("sweep, key, text", [
    ({"space": {"batch_size": [16, "x"]}}, "sweep.space.batch_size", "'x': Input should be a valid integer"),
    ({"space": {"params": {"lr": {"log_uniform": [0, 1]}}}}, "sweep.space.params.lr", "log_uniform needs low > 0"),
    ({"space": {"params": {"lr": {"uniform": [2, 1]}}}}, "sweep.space.params.lr", "low <= high"),
    ({"space": {"params": {"lr": {"normal": [0, 1]}}}}, "sweep.space.params.lr", "one of uniform"),
    ({"space": {"name": ["a"]}}, "sweep.space.name", "unknown key"),
    ({"space": {"params": {"lr": [0.1]}}, "samples": 3}, "sweep.samples", "no key is sampled"),
    ({"space": {"params": {"lr": [0.1]}}, "scheduler": "hyperband"}, "sweep.scheduler", "asha"),
    ({"space": {}}, "sweep.space", "is empty"),
    ({"space": {"params": {"lr": [0.1]}}, "scheduler": "median", "mode": "promote"}, "sweep.mode", "only ASHA"),
    ({"space": {"params": {"lr": [0.1]}}, "scheduler": "asha", "mode": "pause"}, "sweep.mode", "'stop' or 'promote'"),
])
def test_a_bad_sweep_names_the_key_and_launches_nothing(tmp_path, sweep, key, text):
    with pytest.raises(ConfigError) as err:
        sweep_config(tmp_path, sweep)
    assert any(p.key == key and text in p.message for p in err.value.problems), err.value.problems


def test_check_shows_the_trial_count_and_the_first_trials(tmp_path):
    config = sweep_config(tmp_path, {"space": {"params": {"lr": [0.1, 0.01, 0.001]}, "batch_size": [16, 32]},
                                     "scheduler": "asha"}, defaults={"max_epochs": 8})
    lines = sweep_lines(config)
    assert lines[0] == "sweep: 6 trials, ASHA at epoch 1, 2, 4 (promotes the best 1/2 at each; the others wait there)"
    assert lines[1] == "  t-lr0.1-batch_size16: params.lr = 0.1, batch_size = 16"
    assert lines[-1] == "  ... and 2 more"


def test_asha_rungs_stop_before_the_limit():
    sweep = SweepConfig(space={"params": {"lr": [1]}}, grace_period=1, reduction_factor=3)
    assert sweep.rungs(10) == [1, 3, 9] and sweep.rungs(9) == [1, 3] and sweep.rungs(1) == []
    assert trials(sweep) == [{"params.lr": 1}]


# ------------------------------------------------------------ a script sweep passes its values to the script

SCRIPT = {"name": "mlp", "script": str(TASKS / "scripts" / "plain_loop.py")}


def test_params_and_swept_keys_fill_in_a_scripts_args_resume_args_and_cwd(tmp_path):
    # Regression: `{params.lr}` reached the script as the literal text '{params.lr}' (argparse refused it and
    # every trial failed twice), though check said ok.
    (tmp_path / "work-16").mkdir()
    config = sweep_config(tmp_path, {"space": {"params": {"lr": [0.05, 0.1]}, "batch_size": [16]}}, [{
        **SCRIPT, "args": ["--lr", "{params.lr}", "--bs={batch_size}", "--out={checkpoint_dir}", "{{lit}}"],
        "resume_args": ["--resume-lr={params.lr}"], "cwd": "work-{batch_size}", "params": {"width": 8}}])
    first, second = config.pipelines
    assert first.name == "mlp-lr0.05-batch_size16"
    assert first.args == ["--lr", "0.05", "--bs=16", "--out={checkpoint_dir}", "{{lit}}"]
    assert second.args[1] == "0.1" and second.resume_args == ["--resume-lr=0.1"]
    assert first.workdir == str(tmp_path / "work-16")
    plain = make_config(tmp_path, [{**SCRIPT, "args": ["--width", "{params.width}"], "params": {"width": 8}}])
    assert plain.pipelines[0].args == ["--width", "8"]  # a params key fills in without a sweep too


@pytest.mark.parametrize("pipeline, sweep, text", [
    ({"args": ["--lr", "{params.lr}"]}, None, "'{params.lr}': {params.lr} is never filled in: this "
     "pipeline's params have no 'lr'"),
    ({"args": ["--lr", "{lr}"]}, {"space": {"params": {"lr": [0.1]}}}, "unknown placeholder {lr}"),
    ({"args": ["--bs", "{batch_size}"]}, None, "batch_size is not a key this pipeline's sweep varies"),
    ({"cwd": "run-{rank}"}, None, "unknown placeholder {rank}"),
], ids=["params_key_missing", "plain_name_of_a_param", "unswept_key", "attempt_placeholder_in_cwd"])
def test_a_placeholder_that_will_not_be_filled_is_refused(tmp_path, pipeline, sweep, text):
    # Regression: only {name} placeholders were checked; {params.lr} passed check and reached the script as is.
    with pytest.raises(ConfigError) as err:
        (sweep_config(tmp_path, sweep, [{**SCRIPT, **pipeline}]) if sweep else
         make_config(tmp_path, [{**SCRIPT, **pipeline}]))
    [problem] = err.value.problems
    key = "pipelines[0].cwd" if "cwd" in pipeline else "pipelines[0].args"
    assert problem.key == key and text in problem.message, problem
    if "{lr}" in pipeline.get("args", []):
        assert problem.message.endswith("did you mean {params.lr}?")


def test_a_placeholder_in_defaults_args_is_filled_per_pipeline(tmp_path):
    config = sweep_config(tmp_path, {"space": {"params": {"lr": [0.1, 0.2]}}}, [{"name": "mlp"}],
                          defaults={"script": SCRIPT["script"], "task": None, "args": ["--lr={params.lr}"]})
    assert [p.args for p in config.pipelines] == [["--lr=0.1"], ["--lr=0.2"]]


def test_trials_of_a_swept_args_list_are_named_by_the_values_that_differ(tmp_path):
    # Regression: named 'mlp-args__lr0.05__epochs6__outcheckpoint_dir'.
    lists = [["--lr", "0.05", "--epochs", "6", "--out={checkpoint_dir}"],
             ["--lr", "0.1", "--epochs", "6", "--out={checkpoint_dir}"],
             ["--lr=0.2", "--epochs", "6", "--out={checkpoint_dir}"]]
    config = sweep_config(tmp_path, {"space": {"args": lists}}, [SCRIPT])
    assert [p.name for p in config.pipelines] == ["mlp-lr0.05", "mlp-lr0.1", "mlp-lr0.2"]
    from torchherd.tui.ranking import fold_trials  # the sweep view's column says the same, not "['--lr', '0…"

    assert [r.values["args"] for r in fold_trials(config, [])] == ["lr0.05", "lr0.1", "lr0.2"]


# ------------------------------------------------------------ a Lightning sweep over what its DataModule takes

LIT = {"name": "lit", "task": f"lightning:{TASKS / 'lit_tiny.py'}:LitTiny",
       "datamodule": f"{TASKS / 'lit_gang.py'}:RegressionData"}


def test_a_lightning_sweep_varies_the_datamodules_own_arguments(tmp_path):
    # Regression: `datamodule_params.batch_size = [16, 64]` was refused ("must be a list of values").
    config = sweep_config(tmp_path, {"space": {"datamodule_params": {"batch_size": [16, 64]}}}, [LIT],
                          defaults={"datamodule_params": {"samples": 128}})
    assert [p.name for p in config.pipelines] == ["lit-batch_size16", "lit-batch_size64"]
    assert [p.datamodule_params for p in config.pipelines] == [{"samples": 128, "batch_size": 16},
                                                               {"samples": 128, "batch_size": 64}]
    assert config.pipelines[0].trial == {"datamodule_params.batch_size": 16}


@pytest.mark.parametrize("pipeline, key, text", [
    (LIT, "batch_size", "has no effect on lit-batch_size16 (lightning pipeline): the DataModule (or the module's "
     "own *_dataloader) makes its batches: sweep datamodule_params.batch_size"),
    (SCRIPT, "precision", "the script runs its own loop: pass the value in args"),
], ids=["lightning_batch_size", "script_precision"])
def test_a_swept_key_that_does_nothing_for_the_pipeline_is_refused(tmp_path, pipeline, key, text):
    # Regression: a sweep over batch_size for a Lightning pipeline passed check and ran trials that differed
    # only in a value nothing read (0.9248 / 0.9248).
    values = [16, 64] if key == "batch_size" else ["32", "bf16-mixed"]
    with pytest.raises(ConfigError) as err:
        sweep_config(tmp_path, {"space": {key: values}}, [pipeline])
    problems = [p for p in err.value.problems if p.key == f"sweep.space.{key}"]
    assert len(problems) == 1 and text in problems[0].message, err.value.problems


def test_a_key_set_for_a_pipeline_it_does_nothing_for_is_refused(tmp_path):
    # Regression (with the sweep above): batch_size set on a Lightning pipeline with a DataModule was silently
    # ignored; [defaults] may hold it for the task pipelines beside it.
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, [{**LIT, "batch_size": 64}, {"name": "t"}], defaults={"batch_size": 16})
    [problem] = err.value.problems
    assert problem.key == "pipelines[0].batch_size" and problem.message.startswith(
        "has no effect on a lightning pipeline: the DataModule") and "set datamodule_params.batch_size" in problem.message
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, [{**SCRIPT, "precision": "bf16-mixed"}])
    assert [p.key for p in err.value.problems] == ["pipelines[0].precision"]
    assert "the script runs its own loop" in err.value.problems[0].message
    # Regression: `compile = true` on a Lightning pipeline was silently ignored (scores equal to the uncompiled run's).
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, [{**LIT, "compile": True}])
    assert [p.key for p in err.value.problems] == ["pipelines[0].compile"]
    assert "self.net = torch.compile(net)" in err.value.problems[0].message
