"""The `[tracking]` table: which experiment trackers (MLflow, Weights & Biases, a sink of the user's own) get a
copy of the run's events."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TrackingConfig(BaseModel):
    """Experiment trackers fed from the run's events by a process of their own each (engine/sinks/)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mlflow: str = Field("", description=(
        "An MLflow tracking URI: a folder, `sqlite:///path.db`, or a server's http(s):// address. Each pipeline "
        "becomes an MLflow run (a sweep's trials nested under one run of the session) with its settings as "
        "params, its losses, learning rate, samples/s and validation metrics by step, and its state, reason, "
        "commit and best checkpoint as tags; a resumed run adds to the same MLflow runs. Needs "
        "`pip install \"torchherd[mlflow]\"`."))
    experiment: str = Field("", description="The MLflow experiment (made if missing); default: the config's name.")
    wandb: Literal["", "offline", "online"] = Field("", description=(
        "Weights & Biases: 'offline' writes run files under the run directory's tracking/ folder (`wandb sync` "
        "uploads them; `wandb leet` reads them), 'online' sends them as well. One W&B run per pipeline, grouped "
        "by session. Needs `pip install \"torchherd[wandb]\"`."))
    project: str = Field("", description="The W&B project; default: the config's name.")
    sinks: list[str] = Field(default_factory=list, description=(
        "Sinks of your own, each 'file.py:Class' or 'package.module:Class' (a subclass of "
        "torchherd.engine.sinks.api.Sink); docs/guide/tracking.md has the recipe."))
    points_per_s: float = Field(20.0, ge=0, description=(
        "Step reports each tracker gets a second of a pipeline's training, at most, as TensorBoard's files do: "
        "its first, then one every 1/N seconds of the worker's clock, and the newest before an epoch, an attempt "
        "or the run ends; validation results, epochs and ends always go whole. 0: every step report (events.jsonl "
        "keeps every one either way)."))
    buffer: int = Field(100_000, ge=100, description=(
        "Events held for a tracker that falls behind; past this, newer ones are dropped (one notice, counted at "
        "the end) and training never waits."))

    @field_validator("sinks")
    @classmethod
    def _sinks(cls, v: list[str]) -> list[str]:
        for spec in v:
            if not re.fullmatch(r"[^:\s]+:[A-Za-z_]\w*", spec):
                raise ValueError(f"{spec!r} is not 'file.py:Class' or 'package.module:Class'")
        return v

    def specs(self) -> list[str]:
        """Every sink this table turns on, as the sink host takes them."""
        return ((["mlflow"] if self.mlflow else []) + (["wandb"] if self.wandb else []) + list(self.sinks))

