"""The suite's tiers: a session whose -m expression selects no Ray test leaves tests/ray uncollected (no Ray
import), which holds only while every test there carries exactly the marks the conftest says."""
from __future__ import annotations

import re

import pytest

from tests.conftest import RAY_MARKS, REPO, _selects

NOT_SELECTION = {"parametrize", "timeout", "skipif", "skip", "xfail", "usefixtures", "filterwarnings"}


def test_every_ray_test_carries_the_marks_the_other_tiers_leave_it_out_by():
    modules = sorted((REPO / "tests" / "ray").glob("test_*.py"))
    assert modules
    for path in modules:
        text = path.read_text()
        assert "pytestmark = [pytest.mark.ray, pytest.mark.slow]" in text, path
        assert set(re.findall(r"pytest\.mark\.(\w+)", text)) - NOT_SELECTION == RAY_MARKS, path


@pytest.mark.parametrize(("expression", "selects"), [
    ("not slow", False), ("not ray", False), ("slow and not ray", False), ("gpu", False),
    ("ray", True), ("slow", True), ("not slow or ray", True), ("(ray)", True), ("not (slow and not ray)", True),
    ("timeout(300)", None), ("lambda: 1", None), ("ray or", None),
])
def test_a_mark_expression_is_read_as_pytest_reads_it_or_not_at_all(expression, selects):
    assert _selects(expression, RAY_MARKS) is selects
