"""Every bundled sample config passes the check `torchherd run` makes first, on a machine like CI's."""
from __future__ import annotations

from pathlib import Path

import pytest

from torchherd.engine import check_config

SAMPLES = sorted((Path(__file__).resolve().parent.parent / "sample_configs").glob("*.toml"))


def test_the_samples_are_there():
    assert {"digits.toml", "sweep.toml", "pbt.toml", "gang.toml"} <= {p.name for p in SAMPLES}


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_sample_config_passes_the_check(sample, tmp_path):
    report = check_config(str(sample), runs_dir=str(tmp_path))
    assert report.ok, report.render()
