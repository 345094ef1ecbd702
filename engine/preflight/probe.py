"""Task preflight: build every pipeline's task in a fresh interpreter and report what fails.

`probe_tasks(config)` runs `python -m torchherd.engine.preflight.probe` so user code never runs (or
prints) in the supervisor's process, and returns the problems found. Each distinct
(task, params) is built once; its verdict is cached until the task file changes, so the
picker can ask again on every highlight. The caller may watch progress and cancel.
The probe dies with its caller (the end of its stdin pipe) and exits as soon as it has answered.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from ..config.problems import Problem, display_path
from ..config.schema import BUILTIN_TASKS, LIGHTNING_PREFIX, RunConfig
from ..launch.process import python_module_command
from ..protocol.names import PipelineKind, ValidationMode
from ..runners.registry import runner_for

PREFIX = "TORCHHERD-PROBE "
POLL = 0.1  # seconds between looks at the cancel flag while the probe runs


class ProbeCancelled(Exception):
    """The caller cancelled the probe; its process was killed."""


@dataclass(frozen=True)
class ProbeJob:
    """One distinct (task, params) to build, and the pipelines that use it."""

    ref: str
    params: str  # JSON, keys sorted
    pipelines: tuple[int, ...]
    stamp: tuple[str, int, int] | None  # (file, mtime ns, size bytes) of the task's source, if known
    settings: str = ""  # JSON: the pipeline's kind, whether validation is in the background (then a
    # Lightning callback may not monitor a val_* metric), and what its runner's probe_job adds

    @property
    def key(self) -> tuple:
        return (self.ref, self.params, self.stamp, self.settings)


_CACHE: dict[tuple, str] = {}  # job key -> error ("" when it built)
_TRAINS_AS: dict[tuple, str] = {}  # job key -> the kind whose runner trains what it built (a factory's LightningTask)
_NOTES: dict[tuple, str] = {}  # job key -> what `check --probe` says of what it built ("no val_data: ...")
_CACHE_LOCK = threading.Lock()


def _stamp(ref: str) -> tuple[str, int, int] | None:
    target = ref.rpartition(":")[0]
    path: str | None = target if target.endswith(".py") else None
    if path is None and ref not in BUILTIN_TASKS:
        import importlib.util
        try:
            spec = importlib.util.find_spec(target)
            path = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            path = None
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_mtime_ns, st.st_size)


def plan_jobs(config: RunConfig, background: bool | None = None, only: set[int] | None = None) -> list[ProbeJob]:
    """The distinct (task, params) of `config`, in pipeline order.

    `background`: whether validation runs in the background (then a Lightning callback that monitors
    a validation metric inside the worker is a problem); None takes it from the configured mode.
    `only`: the indices of the pipelines to plan for (default: all).
    """
    if background is None:
        background = config.validation.mode in (ValidationMode.BACKGROUND, ValidationMode.AUTO)
    grouped: dict[tuple[str, str, str], list[int]] = {}
    for i, p in enumerate(config.pipelines):
        extra = runner_for(p.kind).probe_job(p) if only is None or i in only else None
        if extra is None:
            continue  # nothing to build (the user's own script)
        # A plain task's factory may return a LightningTask too: every job is told the validation mode.
        settings = json.dumps({**extra, "background": background, "kind": str(p.kind)}, sort_keys=True)
        grouped.setdefault((p.task_ref or p.task or "", json.dumps(p.params, sort_keys=True), settings), []).append(i)
    return [ProbeJob(ref, params, tuple(idx), _stamp(ref.removeprefix(LIGHTNING_PREFIX)), settings)
            for (ref, params, settings), idx in grouped.items()]


def pending_jobs(config: RunConfig, background: bool | None = None) -> list[ProbeJob]:
    """The jobs whose verdict is not cached: what a probe of `config` would build now."""
    with _CACHE_LOCK:
        return [job for job in plan_jobs(config, background) if job.key not in _CACHE]


def task_problems(config: RunConfig, errors: dict[int, str]) -> list[Problem]:
    """Problems for the pipelines whose task failed (`errors`: pipeline index -> message).

    A task every pipeline inherits from [defaults] and that fails the same way for each is one
    problem, at `defaults.task`, not one per pipeline.
    """
    file = display_path(config.source) if config.source else ""
    tasks = {i: p.task for i, p in enumerate(config.pipelines)}
    errors = {i: _with_params(message, config.pipelines[i].params) for i, message in errors.items()}
    return grouped_task_problems(file, config.defaults.task, tasks, errors)


def _with_params(message: str, params: dict) -> str:
    """A factory that raised was called with the pipeline's params, often the cause: say what they were."""
    if not params or not message.startswith("task factory ") or " raised " not in message:
        return message
    shown = ", ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in params.items())
    return f"{message} (its params: {shown})"


def grouped_task_problems(file: str, defaults_task: str | None, tasks: dict[int, str | None],
                          errors: dict[int, str]) -> list[Problem]:
    """`task_problems` for some pipelines only (`tasks`: index -> its task as written)."""
    inherited = [i for i, task in tasks.items() if defaults_task is not None and task == defaults_task]
    messages = {errors.get(i) for i in inherited}
    once: set[int] = set()
    out = []
    if inherited and len(messages) == 1 and None not in messages:
        out.append(Problem(file, "defaults.task", errors[inherited[0]]))
        once = set(inherited)
    for i in sorted(errors):
        if i not in once:
            out.append(Problem(file, f"pipelines[{i}].task", errors[i]))
    return out


def probe_tasks(config: RunConfig, timeout: float = 180.0,
                on_progress: Callable[[int, int], object] | None = None,
                cancelled: Callable[[], bool] | None = None, background: bool | None = None,
                only: set[int] | None = None) -> list[Problem]:
    """Problems found building each distinct (task, params) of `config`; empty if all build.

    `on_progress(built, total)` is called as tasks finish; `cancelled()` is polled and, once
    true, the probe process is killed and ProbeCancelled raised. `only`: as for plan_jobs.
    """
    jobs = plan_jobs(config, background, only)
    with _CACHE_LOCK:
        todo = [job for job in jobs if job.key not in _CACHE]
    file = display_path(config.source) if config.source else ""
    if todo:
        results, failure = _run(todo, timeout, on_progress, cancelled)
        if failure:
            return [Problem(file, "pipelines", failure)]
        with _CACHE_LOCK:
            for job, (error, trains_as, note) in zip(todo, results):
                _CACHE[job.key] = error
                _TRAINS_AS[job.key] = trains_as
                _NOTES[job.key] = note
    errors = {}
    with _CACHE_LOCK:
        for job in jobs:
            error = _CACHE.get(job.key, "")
            if error:
                for i in job.pipelines:
                    errors[i] = shorten(error, job.ref)
    return task_problems(config, errors)


def lightning_factories(config: RunConfig, background: bool | None = None) -> set[str]:
    """The pipelines whose `task = "file.py:build"` factory returned a LightningTask, as far as probes
    have found (`background` as for plan_jobs): the config cannot tell them from torchherd Tasks."""
    with _CACHE_LOCK:
        return {config.pipelines[i].name for job in plan_jobs(config, background)
                if _TRAINS_AS.get(job.key) == PipelineKind.LIGHTNING
                for i in job.pipelines if config.pipelines[i].kind == PipelineKind.TASK}


def probe_notes(config: RunConfig, background: bool | None = None) -> dict[str, list[str]]:
    """What the probes found worth saying of the tasks they built (a Task without val_data), each note with
    the pipelines it is about, in pipeline order (`background` as for plan_jobs)."""
    notes: dict[str, list[str]] = {}
    with _CACHE_LOCK:
        for job in plan_jobs(config, background):
            if _NOTES.get(job.key):
                notes.setdefault(_NOTES[job.key], []).extend(config.pipelines[i].name for i in job.pipelines)
    return notes


def shorten(error: str, ref: str) -> str:
    """The task file as problems show paths (relative to the working directory when under it)."""
    target = ref.rpartition(":")[0]
    return error.replace(target, display_path(target)) if target.endswith(".py") else error


def _run(jobs: list[ProbeJob], timeout: float, on_progress: Callable[[int, int], object] | None,
         cancelled: Callable[[], bool] | None) -> tuple[list[tuple[str, str, str]], str]:
    """((an error or "", the kind that trains what it built, a note or "") per job, a failure of the probe
    itself or "")."""
    payload = json.dumps([{"id": k, "ref": job.ref, "params": json.loads(job.params),
                           **(json.loads(job.settings) if job.settings else {})} for k, job in enumerate(jobs)])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    lines: queue.Queue[str | None] = queue.Queue()
    results: dict[int, tuple[str, str, str]] = {}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        proc = subprocess.Popen(python_module_command("torchherd.engine.preflight.probe"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, env=env, text=True, start_new_session=True)
        try:
            reader = threading.Thread(target=_read_lines, args=(proc, payload, lines), daemon=True)
            reader.start()
            deadline = time.monotonic() + timeout
            while True:
                if cancelled is not None and cancelled():
                    raise ProbeCancelled()
                if time.monotonic() > deadline:
                    return [], f"building the tasks took longer than {timeout:g}s"
                try:
                    line = lines.get(timeout=POLL)
                except queue.Empty:
                    continue
                if line is None:
                    break
                if line.startswith(PREFIX):
                    result = json.loads(line[len(PREFIX):])
                    results[result["id"]] = (result["error"], result.get("kind", ""), result.get("note", ""))
                    if on_progress is not None:
                        on_progress(len(results), len(jobs))
                    if len(results) == len(jobs):
                        break  # every answer is in: no waiting for the probe's end of file
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the user's code and anything it spawned
                except ProcessLookupError:
                    pass
                proc.wait()
            _close(proc.stdin)
        if len(results) < len(jobs):
            stderr.seek(0)
            tail = stderr.read().strip().splitlines()[-5:]
            return [], "building the tasks crashed: " + (" | ".join(tail) or f"exit code {proc.returncode}")
    return [results[k] for k in range(len(jobs))], ""


def _close(pipe: IO[str] | None) -> None:
    try:
        if pipe is not None:  # never: the probe's stdin is a pipe
            pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _read_lines(proc: subprocess.Popen, payload: str, lines: queue.Queue) -> None:
    """Send the jobs as one line, keeping stdin open: the probe takes its end of file for its caller's death."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(payload + "\n")
        proc.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _die_with_caller(caller: int) -> None:
    """Wait for the end of `caller` (the stdin pipe, whose write end only the caller holds), then SIGKILL the
    probe's process group: the caller died, or gave up on it. A pipe, not PR_SET_PDEATHSIG: that follows
    the thread that started the probe (the app's thread worker ends long before the app), and is Linux only."""
    from ..launch.child import kill_own_group

    while os.read(caller, 4096):
        pass
    kill_own_group()


def _main() -> None:
    # Results go out on a copy of stdout; whatever the user's code prints goes to stderr instead, and it
    # reads an empty stdin: the pipe from the caller is watched here.
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    caller = os.dup(0)
    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(caller, 1 << 16)
        if not chunk:
            os._exit(1)  # the caller went away before it sent the jobs (no user code has run)
        line += chunk
    jobs = json.loads(line)
    threading.Thread(target=_die_with_caller, args=(caller,), name="torchherd-probe-caller", daemon=True).start()
    import torch

    from ..runners.task.api import TaskError

    torch.set_num_threads(1)
    for job in jobs:
        kind = note = ""
        try:  # a torchherd Task, a LightningTask a factory returned, or a `lightning:` module
            built, note = runner_for(job["kind"]).probe(job["ref"], job["params"], job)
            kind, error = str(built), ""
        except TaskError as exc:
            error = str(exc)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        results.write(PREFIX + json.dumps({"id": job["id"], "error": error, "kind": kind, "note": note}) + "\n")
    results.flush()
    os._exit(0)  # answered: skip the interpreter's teardown (about a second with torch) the caller would wait out


if __name__ == "__main__":
    _main()
