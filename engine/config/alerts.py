"""The `[alerts]` table: which rules raise an alert, how loud it is, and what it runs."""
from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

COMMAND_FIELDS = ("title", "message", "rule", "pipeline", "run", "run_dir", "status")  # what `command` may name


class AlertsConfig(BaseModel):
    """Alerts on what the supervisor sees: NaN loss, a loss spike, a stall, a straggler, out of memory, an idle
    GPU, a validator falling behind, a full disk."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    bell: bool = Field(True, description=(
        "Ring the terminal bell in the app on each alert (the NO_BELL environment variable silences it too)."))
    command: list[str] = Field(default_factory=list, description=(
        "Run this for each alert, as argv (no shell), e.g. [\"notify-send\", \"{title}\", \"{message}\"]; "
        "{title}, {message}, {rule}, {pipeline}, {run} (its id), {run_dir} and {status} (the run's: running, "
        "or how it ended in the on_finish summary) are filled in. Its output goes to alerts.log in the run "
        "directory, never the terminal; it is given 10 seconds."))
    on_finish: bool = Field(False, description=(
        "When the run ends, send a `finished` alert to the command and the webhook summing it up: how it ended, "
        "its duration and restarts, each pipeline's state and why, its best validation value and best "
        "checkpoint; for a failure the last error and the log. A completed run's summary never rings the "
        "bell. The session's end waits up to 20 seconds for them."))
    webhook: str = Field("", description=(
        "POST each alert as JSON (its event, with the run's id) to this http:// or https:// URL; a failing "
        "webhook costs the run nothing: three tries, then one notice."))
    interval: float = Field(300.0, ge=0, description=(
        "Seconds: at most one alert per rule and pipeline in this while; the next says how many it stood for."))
    straggler: float = Field(1.5, gt=1, description=(
        "A gang's rank whose own time per batch is at least this many times its peers' median, three reports "
        "running, is a straggler (flagged in the table, the event log and headless)."))
    spike: float = Field(10.0, gt=0, description=(
        "A step's loss this many robust z-scores (median and MAD of the recent window) above the window's "
        "median starts a loss spike."))
    spike_persist: int = Field(3, ge=1, description=(
        "Step reports in a row, the first included, whose loss must stay at or above the level the first "
        "crossed before the loss spike alerts (one alert, until the loss falls under it): a single outlier "
        "batch is no spike; 1 alerts on the first report."))
    spike_window: int = Field(50, ge=10, description="Step reports in the loss spike rule's window.")
    idle_gpu: float = Field(5.0, ge=0, le=100, description=(
        "Alert when a running pipeline's GPUs ran kernels less than this percent of the time for "
        "idle_minutes (NVML's utilisation; a job stuck on data or a lost process); 0 turns the rule off."))
    idle_minutes: float = Field(10.0, ge=0, description="Minutes of idle GPU before the idle rule alerts.")
    validator_behind: int = Field(3, ge=0, description=(
        "Alert when this many snapshots of a pipeline were handed off since the background validator last "
        "scored one of its weights (results lag training); before its first score of the pipeline (while it "
        "starts) only a minute on; 0 turns the rule off."))
    disk_free: float = Field(0.05, ge=0, lt=1, description=(
        "Alert when the runs folder's disk has less than this share free (0.05: 5%); 0 turns the rule off."))

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str) -> str:
        if v and not re.match(r"https?://[^\s/]+", v):
            raise ValueError(f"must be an http:// or https:// URL (got {v!r})")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        for part in v:
            for name in re.findall(r"{([^{}]*)}", part):
                if name not in COMMAND_FIELDS:
                    raise ValueError(f"{{{name}}} is not a field an alert fills in; use "
                                     + ", ".join("{" + f + "}" for f in COMMAND_FIELDS))
        return v
