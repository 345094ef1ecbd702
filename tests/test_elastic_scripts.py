"""Elastic script gangs (ranks = "MIN:MAX" with `script`): allowed by check when the script resumes itself and
refused when nothing tells it to, `keep` refused."""
from __future__ import annotations

from pathlib import Path

from tests.test_elastic import inventory
from torchherd.engine.preflight.check import check_config

RESUME = 'resume_args = ["--resume", "{checkpoint_dir}/ckpt.pt"]'


def _check(tmp_path: Path, lines: str):
    toml = tmp_path / "elastic.toml"
    toml.write_text(f'[[pipelines]]\nname = "g"\nranks = "1:2"\nscript = "train.py"\n{lines}\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 2\n')
    return check_config(toml, inventory=inventory())


def test_check_allows_an_elastic_script_that_resumes_itself_and_plans_it(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    report = _check(tmp_path, RESUME)
    assert report.ok, report.render()
    [line] = [ln for ln in report.lines if ln.startswith("g: script train.py")]
    assert ", restarted at each new size from its newest checkpoint -> an elastic gang of 2 ranks (1 to 2) on " \
        "cpu0" in line, line
    (tmp_path / "train.py").write_text("import torchherd.client as herd\nstate = herd.resume_from()\n")
    assert _check(tmp_path, "").ok


def test_check_refuses_an_elastic_script_that_nothing_tells_to_resume(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    [problem] = _check(tmp_path, "").problems
    assert problem.key == "pipelines[0].ranks" and "\n" not in problem.message
    assert "restarts at another size from the script's own checkpoint" in problem.message
    assert "add resume_args" in problem.message and "elastic.toml" in str(problem)


def test_check_refuses_keep_on_a_script_whose_batch_is_its_own(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    [problem] = _check(tmp_path, f'{RESUME}\nkeep = "per_rank_batch"').problems
    assert problem.key == "pipelines[0].keep" and "does not size a script's batch" in problem.message
