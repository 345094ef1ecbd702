"""What a sink is: `Sink`, fed a run's events in order, a batch at a time, in a process of its own (host.py);
`SinkRun`, what it knows of the run (its folder, configs, whether it resumes, where to keep its own state); and the
plain values trackers take of a pipeline (`params_of`, `tracker_status`)."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import Pipeline, RunConfig
from ..config.tracking import TrackingConfig
from ..protocol.messages import Event, RunStarted, SourceCommit
from ..protocol.nolinks import make_dirs, write_text
from ..protocol.states import SUCCESS_STATES, WorkerState

FOLDER = "tracking"  # under the run directory: each sink's log and state, W&B's offline run files
# Settings that say what a pipeline trains (the rest say how it is supervised): a tracker's params.
PARAMS = ("task", "script", "args", "max_epochs", "max_steps", "max_time", "batch_size", "precision", "compile",
          "accumulate_grad_batches", "seed", "ranks", "strategy", "datamodule")


@dataclass
class SinkRun:
    """The run a sink is fed: its folder and id, its configs as resolved (a session may add more), whether this
    session resumes it, and `state`, the sink's own folder for what it must find again on a resume."""

    run_dir: Path
    run_id: str
    configs: list[RunConfig]
    resuming: bool
    tracking: TrackingConfig
    code: tuple[SourceCommit, ...] = ()  # the code's commits, from run_started
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.run_dir / FOLDER

    def pipelines(self) -> Iterator[tuple[RunConfig, Pipeline]]:
        for config in self.configs:
            for pipe in config.pipelines:
                yield config, pipe

    def pipeline(self, name: str) -> Pipeline | None:
        return next((p for _, p in self.pipelines() if p.name == name), None)

    @property
    def sweep(self) -> bool:  # its pipelines are a sweep's trials (grouped under one parent run)
        return any(c.sweep is not None for c in self.configs)

    @property
    def name(self) -> str:  # the first config's run name
        return self.configs[0].name or Path(self.configs[0].source).stem

    def commit(self) -> str:
        """The config's repository's commit, "-dirty" after it when its tree was; "" when none was found."""
        return f"{self.code[0].commit}{'-dirty' if self.code[0].dirty else ''}" if self.code else ""

    def load(self, sink: str) -> dict[str, Any]:
        """What sink `sink` kept of this run (its tracker's run ids), or {} (a new run, or an unreadable file)."""
        try:
            data = json.loads((self.state / f"{sink}.json").read_bytes())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def keep(self, sink: str, data: dict[str, Any]) -> None:
        """Keep `data` as sink `sink`'s state of this run (written whole or not at all)."""
        make_dirs(self.state, self.run_dir)
        path = self.state / f"{sink}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        write_text(tmp, json.dumps(data, indent=1, sort_keys=True), 0o600)  # never through a link in the run
        os.replace(tmp, path)

    def observe(self, event: Event) -> None:
        """What the run itself says as it goes (its commits), before any sink sees the event."""
        if isinstance(event, RunStarted):
            self.code = event.code


def sink_name(spec: str) -> str:
    """The name a sink's notices and files go by: "mlflow", "wandb", or the class a user's spec names."""
    return spec.rpartition(":")[2] or spec


class Sink:
    """A tracker fed a run's events. Subclass it, name it in `[tracking] sinks`, and torchherd runs it in a
    process of its own: `write` gets every event of the run in order, a batch at a time (step reports included),
    and `close` comes once at the end. What it raises is said once as a notice and costs the run nothing; what it
    prints goes to tracking/NAME.log in the run directory."""

    name = "sink"  # its log and state files under tracking/

    def __init__(self, run: SinkRun):
        self.run = run

    def write(self, events: list[Event]) -> None:
        """Take the next events of the run, in order."""

    def close(self) -> None:
        """The session has ended (or its supervisor is gone): flush and finish."""


def params_of(pipe: Pipeline) -> dict[str, Any]:
    """A pipeline's settings as flat key-values: what it trains, its `params.*` and a sweep trial's values."""
    out: dict[str, Any] = {k: getattr(pipe, k) for k in PARAMS if getattr(pipe, k, None) not in (None, "", [], {})}
    out.update(_flat("params", pipe.params))
    out.update(_flat("trial", pipe.trial))
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str) for k, v in out.items()}


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(name, value))
        else:
            out[name] = value
    return out


def tracker_status(status: str) -> str:
    """A pipeline's final state as trackers say it: FINISHED (it trained to an end it chose), FAILED or KILLED."""
    try:
        state = WorkerState(status)
    except ValueError:
        return "FAILED"
    if state in SUCCESS_STATES:
        return "FINISHED"
    return "FAILED" if state == WorkerState.FAILED else "KILLED"
