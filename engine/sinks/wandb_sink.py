"""`[tracking] wandb`: each pipeline a Weights & Biases run, grouped by session, written with W&B's own client
(offline: run files under the run directory's tracking/ folder, which `wandb sync` uploads and `wandb leet` reads):
its settings as config, its curves by the trainer's step, its state and reason in the summary; a resumed run
writes on into the same W&B runs (their ids are kept in tracking/wandb.json)."""
from __future__ import annotations

import math
import secrets
import string
from typing import Any

from ..protocol.health import Alert
from ..protocol.messages import (
    CheckpointSaved,
    EpochEnd,
    Event,
    PipelineFinished,
    StepMetrics,
    TrialDecision,
    ValResult,
)
from ..protocol.nolinks import make_dirs
from ..protocol.progress import better, metric_value
from ..protocol.states import RESTING_STATES
from .api import Sink, SinkRun, params_of, tracker_status

STEP = "trainer/step"  # every curve's x axis: the optimizer step (W&B's own step only counts its log calls)
RESTING = frozenset(s.value for s in RESTING_STATES)


def new_id() -> str:
    """A W&B run id: eight lowercase letters and digits, as W&B makes its own."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, run: SinkRun):
        super().__init__(run)
        import wandb

        self.wandb = wandb
        self.project = run.tracking.project or run.name
        self.metric, self.mode = run.configs[0].validation.metric, run.configs[0].validation.metric_mode
        self.ids: dict[str, str] = {k: v for k, v in run.load(self.name).get("runs", {}).items()
                                    if isinstance(v, str)}
        self.open: dict[str, Any] = {}  # pipeline -> its live wandb Run
        self._best: dict[str, float] = {}

    def _run(self, pipeline: str) -> Any:
        live = self.open.get(pipeline)
        if live is not None:
            return live
        wandb = self.wandb
        known = pipeline in self.ids
        run_id = self.ids.get(pipeline) or new_id()
        pipe = self.run.pipeline(pipeline)
        config: dict[str, Any] = params_of(pipe) if pipe is not None else {}
        config.update({"torchherd.run_id": self.run.run_id, "torchherd.run_dir": str(self.run.run_dir)})
        if self.run.code:
            config["torchherd.commit"] = self.run.commit()
        make_dirs(self.run.state, self.run.run_dir)
        live = wandb.init(project=self.project, group=self.run.run_id, name=pipeline, id=run_id,
                          resume="allow" if known else None, dir=str(self.run.state), mode=self.run.tracking.wandb,
                          config=config, job_type="trial" if self.run.sweep else "train", reinit="create_new",
                          settings=wandb.Settings(console="off", silent=True, symlink=False, x_disable_stats=True,
                                                  x_disable_machine_info=True))
        live.define_metric(STEP)
        live.define_metric("*", step_metric=STEP)
        self.open[pipeline] = live
        if not known:
            self.ids[pipeline] = run_id
            self.run.keep(self.name, {"runs": self.ids})
        return live

    def write(self, events: list[Event]) -> None:
        for event in events:
            self._take(event)

    def _take(self, event: Event) -> None:
        if isinstance(event, StepMetrics):
            self._log(event.pipeline, event.step, {"train/loss": event.loss, "train/lr": event.lr,
                                                   "train/samples_per_s": event.samples_per_s,
                                                   **{f"train/{k}": v for k, v in event.metrics.items()}})
        elif isinstance(event, EpochEnd):
            self._log(event.pipeline, event.step, {"epoch": event.epoch + 1, "epoch/train_loss": event.train_loss,
                                                   "epoch/duration_s": event.duration,
                                                   "epoch/samples_per_s": event.samples_per_s,
                                                   **{f"epoch/{k}": v for k, v in event.metrics.items()}})
        elif isinstance(event, ValResult) and not event.error:
            self._log(event.pipeline, event.step, {f"val/{k}": v for k, v in event.metrics.items()})
            value = metric_value(event.metrics, self.metric)
            if value is not None and better(value, self._best.get(event.pipeline), self.mode):
                self._best[event.pipeline] = value
                self._run(event.pipeline).summary[f"best_{self.metric}"] = value
        elif isinstance(event, CheckpointSaved) and event.reason == "best":
            self._run(event.pipeline).summary["best_checkpoint"] = event.path
        elif isinstance(event, TrialDecision) and event.action == "exploit":
            live = self._run(event.pipeline)
            live.config.update({f"trial.{k}": v for k, v in event.exploit.get("values", {}).items()},
                               allow_val_change=True)
            live.summary["exploited_from"] = str(event.exploit.get("donor", ""))
        elif isinstance(event, Alert) and event.pipeline:
            self._run(event.pipeline).summary[f"alert/{event.rule}"] = f"{event.title}: {event.message}"
        elif isinstance(event, PipelineFinished):
            self._end(event)

    def _log(self, pipeline: str, step: int, values: dict[str, object]) -> None:
        finite = {k: float(v) for k, v in values.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v)}
        if finite:
            self._run(pipeline).log({STEP: step, **finite})

    def _end(self, event: PipelineFinished) -> None:
        live = self._run(event.pipeline)
        live.summary["state"] = event.status
        live.summary["reason"] = event.reason
        if event.status in RESTING:  # a trial resting is not over: its run stays open
            return
        del self.open[event.pipeline]
        live.finish(exit_code=0 if tracker_status(event.status) == "FINISHED" else 1)

    def close(self) -> None:
        for pipeline in list(self.open):  # resting trials, or a session that ended early
            self.open.pop(pipeline).finish(exit_code=1)
