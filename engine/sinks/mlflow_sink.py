"""`[tracking] mlflow`: each pipeline an MLflow run of the experiment (a sweep's trials nested under one run of the
session), written with MLflow's own client: its settings as params, its curves as metrics by step, its state,
reason, commit and best checkpoint as tags, FINISHED / FAILED / KILLED as it ends; a resumed run writes on into the
same MLflow runs (their ids are kept in tracking/mlflow.json)."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..protocol.health import Alert
from ..protocol.messages import (
    CheckpointSaved,
    EpochEnd,
    Event,
    PipelineFinished,
    RunFinished,
    StepMetrics,
    TrialDecision,
    ValResult,
    WorkerStarted,
)
from ..protocol.progress import better, metric_value
from ..protocol.states import RESTING_STATES
from .api import Sink, SinkRun, params_of, tracker_status

RESTING = frozenset(s.value for s in RESTING_STATES)
PER_CALL = 1000  # metrics in one log_batch (MLflow's limit); params and tags: 100
_BAD_KEY = re.compile(r"[^\w\-. /]")


def tracking_uri(value: str) -> str:
    """`[tracking] mlflow` as MLflow takes it: a URI as given (a relative sqlite path is the working directory's,
    as `runs_dir` is); a folder as file:// (MLflow's file store, which it keeps only on request: prefer
    sqlite:///)."""
    if "://" in value or value.startswith("sqlite:"):
        return value
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the folder was asked for by name
    return Path(value).expanduser().resolve().as_uri()


def key(name: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, _ - . / and spaces)."""
    return _BAD_KEY.sub("_", name)[:250]


class MlflowSink(Sink):
    name = "mlflow"

    def __init__(self, run: SinkRun):
        super().__init__(run)
        from mlflow import MlflowClient

        config = run.configs[0]
        self.client = MlflowClient(tracking_uri=tracking_uri(run.tracking.mlflow))
        self.metric, self.mode = config.validation.metric, config.validation.metric_mode
        kept = run.load(self.name)
        name = run.tracking.experiment or run.name
        found = self.client.get_experiment_by_name(name)
        self.experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        self.runs: dict[str, str] = {k: v for k, v in kept.get("runs", {}).items() if isinstance(v, str)}
        self.parent: str = kept.get("parent", "") if kept.get("experiment") == self.experiment else ""
        if kept.get("experiment") != self.experiment:
            self.runs = {}
        self._reopened: set[str] = set()  # runs of an earlier session set RUNNING again in this one
        self._ended: set[str] = set()
        self._best: dict[str, float] = {}
        self._metrics: dict[str, list[Any]] = {}
        self._tags: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------ runs

    def _run_id(self, pipeline: str) -> str:
        run_id = self.runs.get(pipeline)
        if run_id is not None:
            if run_id not in self._reopened:
                self._reopened.add(run_id)
                self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = self._identity(pipeline)
        if self.run.sweep:
            tags["mlflow.parentRunId"] = self._parent()
        run_id = self.runs[pipeline] = self.client.create_run(self.experiment, run_name=pipeline,
                                                              tags=tags).info.run_id
        self._reopened.add(run_id)
        pipe = self.run.pipeline(pipeline)
        if pipe is not None:
            from mlflow.entities import Param

            params = [Param(key(k), str(v)[:6000]) for k, v in params_of(pipe).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i:i + 100])
        self._keep()
        return run_id

    def _parent(self) -> str:
        """The session's run, a sweep's trials nested under it."""
        if not self.parent:
            self.parent = self.client.create_run(self.experiment, run_name=self.run.run_id,
                                                 tags=self._identity("")).info.run_id
            self._keep()
        return self.parent

    def _identity(self, pipeline: str) -> dict[str, str]:
        tags = {"torchherd.run_id": self.run.run_id, "torchherd.run_dir": str(self.run.run_dir)}
        if pipeline:
            tags["torchherd.pipeline"] = pipeline
        if self.run.code:
            tags["mlflow.source.git.commit"] = self.run.code[0].commit
            tags["torchherd.commit"] = self.run.commit()
        return tags

    def _keep(self) -> None:
        self.run.keep(self.name, {"experiment": self.experiment, "parent": self.parent, "runs": self.runs})

    # ------------------------------------------------------------ events

    def write(self, events: list[Event]) -> None:
        for event in events:
            self._take(event)
        self._flush()

    def _take(self, event: Event) -> None:
        if isinstance(event, StepMetrics):
            values = [("train/loss", event.loss), ("train/lr", event.lr), ("train/samples_per_s", event.samples_per_s),
                      *((f"train/{k}", v) for k, v in event.metrics.items())]
            self._add(event.pipeline, values, event.step, event.time)
        elif isinstance(event, EpochEnd):
            self._add(event.pipeline, [("epoch", float(event.epoch + 1)), ("epoch/train_loss", event.train_loss),
                                       ("epoch/duration_s", event.duration),
                                       ("epoch/samples_per_s", event.samples_per_s),
                                       *((f"epoch/{k}", v) for k, v in event.metrics.items())], event.step, event.time)
        elif isinstance(event, ValResult) and not event.error:
            self._add(event.pipeline, [(f"val/{k}", v) for k, v in event.metrics.items()], event.step, event.time)
            value = metric_value(event.metrics, self.metric)
            if value is not None and better(value, self._best.get(event.pipeline), self.mode):
                self._best[event.pipeline] = value
                self._tag(event.pipeline, {f"torchherd.best_{self.metric}": f"{value:.6g}"})
        elif isinstance(event, CheckpointSaved) and event.reason == "best":
            self._tag(event.pipeline, {"torchherd.best_checkpoint": event.path})
        elif isinstance(event, TrialDecision) and event.action == "exploit":
            values = event.exploit.get("values", {})
            self._add(event.pipeline, [(f"pbt/{k}", v) for k, v in values.items()], event.exploit.get("step", 0),
                      event.time)
            self._tag(event.pipeline, {"torchherd.exploited_from": str(event.exploit.get("donor", ""))})
        elif isinstance(event, Alert):
            for name in [event.pipeline] if event.pipeline else list(self.runs):
                self._tag(name, {f"torchherd.alert.{key(event.rule)}": f"{event.title}: {event.message}"[:5000]})
        else:
            self._lifecycle(event)

    def _lifecycle(self, event: Event) -> None:
        if isinstance(event, WorkerStarted):
            self._tag(event.pipeline, {"torchherd.state": "running"})
            run_id = self._run_id(event.pipeline)
            if run_id in self._ended:  # started again after it had ended (a restart, a promotion)
                self._ended.discard(run_id)
                self.client.update_run(run_id, status="RUNNING")
        elif isinstance(event, PipelineFinished):
            self._tag(event.pipeline, {"torchherd.state": event.status, "torchherd.reason": event.reason[:5000]})
            self._flush()
            if event.status not in RESTING:  # a trial resting (paused at a rung, ...) is not over
                run_id = self._run_id(event.pipeline)
                self.client.set_terminated(run_id, tracker_status(event.status))
                self._ended.add(run_id)
        elif isinstance(event, RunFinished) and self.parent:
            self.client.set_terminated(self.parent, "FINISHED" if event.ok else "FAILED")

    def _add(self, pipeline: str, values: Sequence[tuple[str, object]], step: int, wall: float) -> None:
        from mlflow.entities import Metric

        stamp = int(wall * 1000)
        out = self._metrics.setdefault(pipeline, [])
        for name, value in values:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isinf(value):
                out.append(Metric(key(name), float(value), stamp, int(step)))

    def _tag(self, pipeline: str, tags: dict[str, str]) -> None:
        self._tags.setdefault(pipeline, {}).update(tags)

    def _flush(self) -> None:
        from mlflow.entities import RunTag

        metrics, self._metrics = self._metrics, {}
        tags, self._tags = self._tags, {}
        for pipeline in {*metrics, *tags}:
            run_id = self._run_id(pipeline)
            found = metrics.get(pipeline, [])
            for i in range(0, len(found), PER_CALL):
                self.client.log_batch(run_id, metrics=found[i:i + PER_CALL])
            if tags.get(pipeline):
                self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags[pipeline].items()])

    def close(self) -> None:
        self._flush()
