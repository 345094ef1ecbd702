"""The run's task check, made by its first workers: every task builds before any pipeline takes a step.

`torchherd run --headless` used to build every task in a throwaway interpreter (the probe,
engine/preflight/probe.py) and only then start the run, whose workers imported torch and built the
same tasks again: a Task pipeline reached its first step 2.5x as late as a bare `python train.py`.
The probe's verdict cache does not help there: it lives in the process that asked (the app's picker
asks on every highlight), and a command starts with it empty.

So with `check_builds` the supervisor starts the workers at once and lets their first build be the
check. Each first attempt of a Task pipeline builds its task, says `TaskBuilt` and holds before its
first step; once every held worker has built (and the probe has built, meanwhile, the tasks of the
pipelines queued for a slot), they all get `Proceed`; nothing else starts until then. If any task does not build,
`TasksChecked` carries the problems the probe would have named (file, key, message), every pipeline
is stopped before its first step and `torchherd run` exits 2. The guarantee is the probe's — a task
that cannot be built trains nothing — at the cost of one build instead of two in a row. This is
simpler than overlapping the probe with the start (two torch imports on the same cores) and, unlike
a cache kept on disk, it speeds up the first run too. A script or a Lightning module cannot be held
before its first step, so a config with one of those is probed first, as before (tui/headless.py).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..config.problems import Problem
from ..config.schema import RunConfig
from ..preflight.probe import plan_jobs, probe_tasks, shorten, task_problems
from ..protocol.messages import Event, Proceed, TaskBuilt, TasksChecked, WorkerError, pipeline_of
from ..protocol.names import PipelineKind
from . import commands
from .bus import Publisher
from .lifecycle import Lifecycle
from .pipeline import SupervisedPipeline

EXITED = "its worker exited before its task was built"


class BuildCheck:
    """Which held first attempts have built their task, and the probe of the tasks no held worker builds."""

    def __init__(self, config: RunConfig, asked: bool):
        self.config, self.asked = config, asked
        self.index = {p.name: i for i, p in enumerate(config.pipelines)}
        self.active = False  # under way: the first wave holds until the verdict
        self.background = False  # validation runs in the background (the probe checks Lightning callbacks for it)
        self.tasks = 0  # distinct tasks to build, as the probe counts them
        self.held: set[str] = set()  # pipelines whose first attempt holds after its build
        self.waiting: set[str] = set()  # held pipelines that have not said their task built yet
        self.errors: dict[int, str] = {}  # pipeline index -> why its task did not build
        self.sealed = False  # the first wave has launched: no more workers are held
        self.started = time.monotonic()
        self._probe: threading.Thread | None = None
        self._probed: list[Problem] = []
        self._cancelled = False
        self.refused = False  # a task did not build: the run trained nothing and its directory goes at the end

    def open(self, resuming: bool, background: bool, publish: Publisher) -> None:
        """Before the first wave launches: hold its Task workers, if asked, unless resuming or nothing builds."""
        self.background = background
        self.tasks = len(plan_jobs(self.config, background)) if self.asked and not resuming else 0
        if self.tasks:
            self.active, self.started = True, time.monotonic()
            publish.tap(lambda event, line, kept: self.heard(pipeline_of(event), event))

    @property
    def holding(self) -> bool:
        """The first wave waits for the verdict: nothing else starts meanwhile (a stopped one frees its slot)."""
        return self.active and self.sealed

    def admit(self, pipe: SupervisedPipeline) -> bool:
        """Whether the attempt about to launch holds after its build: a Task pipeline's first, in the first wave."""
        if not self.active or self.sealed or pipe.plan.config.kind != PipelineKind.TASK or pipe.name not in self.index:
            return False
        self.held.add(pipe.name)
        self.waiting.add(pipe.name)
        return True

    def seal(self) -> None:
        """The first wave has launched: the probe builds, meanwhile, the tasks no held worker builds."""
        self.sealed = True
        held = {self.index[name] for name in self.held}
        rest = {i for job in plan_jobs(self.config, self.background) if not held & set(job.pipelines)
                for i in job.pipelines}
        if rest:
            self._probe = threading.Thread(target=self._run_probe, args=(rest,), name="torchherd-probe", daemon=True)
            self._probe.start()

    def _run_probe(self, only: set[int]) -> None:
        from ..preflight.probe import ProbeCancelled

        try:
            self._probed = probe_tasks(self.config, background=self.background, only=only,
                                       cancelled=lambda: self._cancelled)
        except ProbeCancelled:
            pass

    def heard(self, name: str, event: Event) -> None:
        """A worker's event: a held one's TaskBuilt, or its WorkerError before that (its task did not build)."""
        if name not in self.waiting:
            return
        if isinstance(event, TaskBuilt):
            self.waiting.discard(name)
        elif isinstance(event, WorkerError):
            self.failed(name, event.error)

    def failed(self, name: str, error: str) -> None:
        """A held worker's task did not build (its WorkerError, or the worker died first)."""
        self.waiting.discard(name)
        pipe = self.config.pipelines[self.index[name]]
        self.errors[self.index[name]] = shorten(error.removeprefix("torchherd: "), pipe.task_ref or pipe.task or "")

    def look(self, pipes: dict[str, SupervisedPipeline]) -> None:
        """Held workers that ended without a word: one that failed is a task that did not build; one a person
        stopped is simply no longer waited for."""
        for name in list(self.waiting):
            pipe = pipes[name]
            if pipe.handle is None:
                if pipe.last_error:
                    self.failed(name, pipe.last_error)
                else:
                    self.waiting.discard(name)

    def verdict(self) -> list[Problem] | None:
        """None while a build is outstanding; else the problems (none: every task built). The first failure
        decides at once: nobody waits for the other builds to say no."""
        if self.errors:
            self._cancelled = True  # the probe's process, if it still runs, is killed
            return task_problems(self.config, self.errors) + self._probed
        if self.waiting or (self._probe is not None and self._probe.is_alive()):
            return None
        return self._probed

    def settle(self, pipes: dict[str, SupervisedPipeline], lifecycle: Lifecycle,
               publish: Callable[[Event], None]) -> None:
        """Every supervision pass while under way: once every task has built, let the held workers step; once one
        has not, stop every pipeline before its first step (the one that failed ends by itself)."""
        if not self.active:
            return
        if not self.sealed:  # the first pass after the first wave launched
            self.seal()
        self.look(pipes)
        problems = self.verdict()
        if problems is None:
            return
        self.active, self.refused = False, bool(problems)
        publish(TasksChecked(tasks=self.tasks, seconds=time.monotonic() - self.started,
                             problems=tuple(map(str, problems))))
        for pipe in pipes.values():
            if not problems and pipe.name in self.held and pipe.handle is not None:
                pipe.handle.send(Proceed())
            elif problems and not (self.index.get(pipe.name) in self.errors and pipe.handle is not None):
                commands.stop(lifecycle, pipe, "a task of the run did not build")
