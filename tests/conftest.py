"""Shared fixtures: tiny configs, a supervisor runner, and the no-orphans check every test ends with."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from torchherd.engine.config.load import parse_config
from torchherd.engine.config.schema import RunConfig

TASKS = Path(__file__).parent / "tasks"
REPO = Path(__file__).resolve().parent.parent


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that imports torchherd from this checkout: the repository first on
    PYTHONPATH, then what was there (a machine may bring its dependencies that way), then `extra`."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


# The marks every test under tests/ray carries (its modules' pytestmark), and no other.
RAY_MARKS = frozenset({"ray", "slow"})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave tests/ray out of a session whose -m expression selects none of its tests (the fast tier, the main
    tier): collecting it imports Ray, 0.6 s in every process that collects. Anything else is collected as usual."""
    if collection_path != Path(__file__).parent / "ray" or not config.option.markexpr:
        return None
    return True if _selects(config.option.markexpr, RAY_MARKS) is False else None


class _Marked(dict):
    """Names for eval: a mark name is True when the test carries that mark."""

    def __init__(self, marks: frozenset[str]):
        super().__init__()
        self.marks = marks

    def __missing__(self, name: str) -> bool:
        return name in self.marks


def _selects(expression: str, marks: frozenset[str]) -> bool | None:
    """Whether a -m expression selects a test with exactly `marks`; None when it is more than and, or, not,
    parentheses and mark names (keyword matches, say), so the caller collects as if it might."""
    if not all(word.isidentifier() for word in expression.replace("(", " ").replace(")", " ").split()):
        return None
    try:
        return bool(eval(expression, {"__builtins__": {}}, _Marked(marks)))  # and, or, not: Python's meaning
    except Exception:
        return None


def make_config(tmp_path: Path, pipelines: list[dict[str, Any]], **top: Any) -> RunConfig:
    """A validated config as if read from tmp_path/test.toml; tasks default to tests/tasks/tiny.py."""
    defaults = {"task": f"{TASKS / 'tiny.py'}:build", "max_epochs": 3, "batch_size": 32,
                "log_every_n_steps": 2, **top.pop("defaults", {})}
    # A name of its own, so the run id does too: the shared-memory snapshot root is named after the run id
    # alone (see test_runs_in_different_directories_never_share_snapshots), and two test sessions on one
    # machine, or two xdist workers, start runs of the same config in the same second.
    top.setdefault("name", f"test-{uuid.uuid4().hex[:8]}")
    # Validation inline unless a test says otherwise: "auto" would pick by this machine's spare cores.
    top.setdefault("validation", {"mode": "inline"})
    data = {"runs_dir": str(tmp_path / "runs"), "defaults": defaults, "pipelines": pipelines,
            "devices": {"placement": "cpu", "cpu_slots": 2, **top.pop("devices", {})},
            "restart": {"backoff": 0.1, "min_uptime": 0.5, **top.pop("restart", {})}, **top}
    return parse_config(data, str(tmp_path / "test.toml"), tmp_path)


async def wait_for(stream, predicate, timeout: float = 60.0):
    """The first event from `stream` that satisfies `predicate`; fails the test after `timeout` seconds."""
    async def scan():
        async for event in stream:
            if predicate(event):
                return event
        raise AssertionError("event stream ended before the expected event")
    return await asyncio.wait_for(scan(), timeout)


def children() -> list[psutil.Process]:
    """Our live descendants, less the test session's forking process (warm_children): never a test's leftover."""
    from torchherd.engine.launch.process import kept

    warm = kept()
    try:
        return [p for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE and (warm is None or p.pid != warm.proc.pid)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="session", autouse=True)
def warm_children():
    """The workers of in-process supervisors fork from one process per test session (per xdist worker) that
    imported torch once (engine/launch/process.py: keep_warm), not each from a fresh interpreter: a worker's
    imports cost seconds of CPU, and the suite starts hundreds. A child whose environment differs in what
    torch reads at import starts cold, as in a real session; TORCHHERD_TEST_COLD=1 starts every one cold."""
    from torchherd.engine.launch.process import keep_warm, let_go

    if os.environ.get("TORCHHERD_TEST_COLD"):
        yield None
        return
    warm = keep_warm(late=("PYTEST_CURRENT_TEST",))  # pytest's name of the test running, for each test
    yield warm
    let_go()


@pytest.fixture(autouse=True)
def children_stay_warm(warm_children):
    """Every test must leave the environment workers fork from as it found it, in what torch could read at import
    (engine/launch/warm.py: compatible). A variable one test leaks makes every later child of its xdist worker start
    cold, which shows only as a suite far slower than its tests are alone. The leak is undone, and the test fails."""
    from torchherd.engine.launch.warm import compatible

    before = dict(os.environ)
    yield
    after = dict(os.environ)
    late = warm_children.late if warm_children is not None else ()
    leaked = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                    and not compatible({k: after.get(k, "")}, {k: before.get(k, "")}, late))
    if leaked:
        os.environ.clear()
        os.environ.update(before)
        pytest.fail(f"the test left {', '.join(leaked)} changed in this process's environment: every later child "
                    "it starts would differ from the forking process's and start cold (restore it, as monkeypatch "
                    "does)", pytrace=False)


def service_of(run_dir: Path) -> psutil.Process:
    """The torchherd service supervising `run_dir` (its supervisor.pid): a process of its own session, not the
    CLI's child, since runs outlive the terminal."""
    return psutil.Process(int((Path(run_dir) / "supervisor.pid").read_text().split()[0]))


def still_alive(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The pids among `pids` still running (zombies excluded) after waiting up to `timeout` seconds."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() >= deadline:
            return [p.pid for p in left]
        psutil.wait_procs(left, timeout=0.1)


@pytest.fixture(autouse=True)
def private_runtime(monkeypatch) -> Path:
    """A runtime folder of the test's own (where control sockets, the note of each live run and the device ledger
    go): `ls` and `attach` find every live run of the user's there, other test sessions' runs are no test's
    business, and two test files run at once (xdist) do not queue behind each other's workers as two runs on one
    box would (a test's own runs share its ledger).
    Short, as AF_UNIX paths are; children get it through the environment."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="th-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    monkeypatch.delenv("TORCHHERD_LEDGER", raising=False)  # a user's shared ledger is no test's either
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_orphans():
    """Every test must leave no child process of ours alive."""
    yield
    deadline = time.monotonic() + 10.0
    left = children()
    while left and time.monotonic() < deadline:
        psutil.wait_procs(left, timeout=0.2)
        left = children()
    names = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in left if p.is_running()]
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert not names, f"child processes left behind: {names}"


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory) -> Path:
    """The fake NVIDIA driver library (tests/nvml_fake/fake_nvml.c), built once per test session."""
    from tests.nvml_fake import build, compiler

    if compiler() is None:
        pytest.skip("no C compiler (cc or gcc) to build the fake NVML library with")
    return build(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def fake_nvml(fake_nvml_library: Path, tmp_path: Path, monkeypatch):
    """A `FakeDriver` with no GPUs yet, that pynvml in this process is bound to for the test."""
    from tests.nvml_fake import FakeDriver, bound_in_process

    driver = FakeDriver(tmp_path / "fake-nvml", fake_nvml_library)
    monkeypatch.setenv("FAKE_NVML_STATE", str(driver.state))
    monkeypatch.setenv("FAKE_NVML_LOG", str(driver.log))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with bound_in_process(fake_nvml_library):
        yield driver
