"""The run configuration's typed schema: one pydantic model per TOML table, a description on every key.

`RunConfig` is a whole file; `config/load.py` reads TOML into it and says what is wrong.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..protocol.names import PipelineKind, ValidationMode
from .alerts import AlertsConfig
from .metric_patterns import check_metrics_regex, patterns  # patterns: a re-export too
from .placeholders import PLACEHOLDER, PLACEHOLDERS, SETTING_NAMES, unknown  # noqa: F401 (PLACEHOLDER*: re-export)
from .sweep import SweepConfig
from .tracking import TrackingConfig
from .units import memory_bytes

BUILTIN_TASKS = ("regression", "digits")
# Run and pipeline names become folder names, so no '/', no leading '.', nothing that climbs out.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RUN_FOLDERS = ("tensorboard", "tracking", "code", "validator")  # torchherd's own folders in a run directory
NAME_RULE = "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit (it names a folder)"


def _check_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{NAME_RULE} (got {value!r})")
    return value


LIGHTNING_PREFIX = "lightning:"  # task = "lightning:file.py:Class": a LightningModule trained by Trainer.fit


class _Strict(BaseModel):
    # strict: "3" is not 3; a wrong type in a config is a mistake to report.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PipelineSettings(_Strict):
    """Settings a pipeline takes; `[defaults]` holds the same keys."""

    model_config = ConfigDict(populate_by_name=True)  # `validate_factory` reads back from a dump by its name

    task: str | None = Field(None, description=(
        "What to train: a built-in task name (regression, digits), 'path/to/file.py:build' "
        "(relative to the config file) or 'package.module:build'."))
    params: dict[str, Any] = Field(default_factory=dict, description=(
        "Free-form parameters passed to the task factory; [defaults] params are merged under "
        "each pipeline's."))
    priority: int = Field(0, description="Higher starts first when pipelines wait for a device slot.")
    max_epochs: int = Field(10, ge=1, description="Train at most this many epochs.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps in all.")
    max_time: float | None = Field(None, gt=0, description="Stop after this much training time (seconds).")
    batch_size: int = Field(32, ge=1, description="Samples per batch when the task returns a Dataset.")
    precision: Literal["32", "bf16-mixed", "16-mixed"] = Field("32", description=(
        "Numeric precision: 32 (float32), bf16-mixed (autocast to bfloat16), 16-mixed "
        "(autocast to float16 with a gradient scaler)."))
    compile: bool = Field(False, description="Wrap the model in torch.compile (slow first steps).")
    float32_matmul_precision: Literal["highest", "high", "medium"] = Field("highest", description=(
        "torch.set_float32_matmul_precision: 'high' or 'medium' allow TF32 on GPUs that have it."))
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per pipeline.")
    pin_memory: bool = Field(False, description="DataLoader pin_memory (speeds host-to-GPU copies).")
    persistent_workers: bool = Field(False, description="Keep DataLoader workers alive between epochs.")
    accumulate_grad_batches: int = Field(1, ge=1, description="Batches whose gradients add up per optimizer step.")
    log_every_n_steps: int = Field(10, ge=1, description="Report the mean loss every this many optimizer steps.")
    checkpoint_every_n_epochs: int = Field(1, ge=1, description="Write the 'last' checkpoint every this many epochs.")
    keep_last: int = Field(2, ge=1, description=(
        "'last' checkpoints kept: 2 keeps last and prev (a fallback when last cannot be read), 1 only last, more "
        "keeps older ones too (prev2, prev3, ...). The best checkpoint is kept besides, never deleted."))
    async_checkpoints: bool = Field(True, description=(
        "A Task's checkpoint is copied into memory of its own (on a GPU, pinned host memory) and written by a "
        "background thread, so training waits only for the copy; false writes it on the training thread, "
        "training waiting for the disk. A sharded (fsdp) gang's ranks stage their shards and write them through DCP's "
        "async_save alike."))
    trust_checkpoints: bool = Field(False, description=(
        "Load this pipeline's checkpoints even when they hold objects other than tensors and plain values "
        "(torch.load with weights_only=False), which can run any code as they load: only for files you wrote "
        "yourself. Off, such a checkpoint is refused, naming the file and what it would import."))
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1, description=(
        "Cap on this pipeline's share of its GPU's memory (0-1], so it cannot starve a neighbour."))
    seed: int = Field(0, description="Seed for torch's generators and the data order.")
    gpus_per_rank: int = Field(1, ge=1, description=(
        "Whole GPUs each rank's process holds (on a GPU machine), chosen to share the fastest link between "
        "them; CUDA_VISIBLE_DEVICES lists them, and TORCHHERD_GPUS says which CUDA indices are this rank's."))
    gpu_memory: str | float | None = Field(None, description=(
        "A share of one GPU instead of a whole one: bytes ('6GiB'), or a fraction of the smallest GPU (0-1], "
        "the only form on Ray (num_gpus). Shares pack on a GPU while they fit; a gang's ranks never share one."))
    ranks: int | str = Field(1, description=(
        "Processes of one DistributedDataParallel gang, one per device slot, started and restarted as a unit "
        "(torchrun's --nproc-per-node); 1 trains in one process. A Task's gang, or a script's that resumes itself "
        "(resume_args or herd.resume_from(); it is told each attempt's WORLD_SIZE), may be elastic, 'MIN:MAX' like "
        "'1:2': it starts with as many ranks as the slots granted (at least MIN; it waits for MIN), and when a rank "
        "fails and fewer slots are free than it had (another pipeline or run took one), it restarts from its "
        "checkpoint at the size it can get, down to MIN, instead of waiting; below MAX, it grows back while it "
        "trains once slots nobody waits for have been free for `grow_after`."))
    keep: Literal["global_batch", "per_rank_batch"] = Field("global_batch", description=(
        "An elastic gang (ranks = 'MIN:MAX') at fewer ranks than MAX: 'global_batch' keeps the samples of one "
        "optimizer step as at MAX ranks (accumulate_grad_batches, else batch_size, scaled up; said in the "
        "gang_resized event, and so when neither divides evenly); 'per_rank_batch' keeps both, so a step trains "
        "fewer samples. Not for a script (refused): its batch is its own."))
    grow_after: float = Field(30.0, ge=0, description=(
        "Seconds an elastic gang (ranks = 'MIN:MAX') running below MAX waits while enough slots for more ranks stay "
        "free (slots no queued pipeline of any run waits for) before it stops at a checkpoint and starts again "
        "from it at the larger size (gang_resized; no restart spent). A script is stopped as `s` stops it and "
        "resumes from its newest checkpoint: steps since that save train again unless it saves as it stops."))
    nan_policy: Literal["warn", "stop", "restart"] = Field("stop", description=(
        "When the training loss is NaN or infinite: warn and carry on, stop the pipeline as failed, "
        "or restart it from its last checkpoint."))
    # A training script of the user's own, run as it is (engine/runners/script/runner.py).
    script: str | None = Field(None, description=(
        "Instead of `task`: a training script to run as it is, 'path/to/train.py' (relative to the config "
        "file), with this Python, in `cwd`."))
    args: list[str] = Field(default_factory=list, description=(
        "Command-line arguments for `script`. torchherd fills in {checkpoint_dir} (the pipeline's checkpoints/ "
        "folder in the run directory), {pipeline_dir}, {run_dir} (absolute paths), {rank}, {world_size} and "
        "{restart} (0 on the first attempt), and {params.NAME} (a key of params) and {KEY} (a key a sweep varies, "
        "e.g. {batch_size}) from the config; {{ and }} are literal braces."))
    samples_per_step: int | None = Field(None, ge=1, description=(
        "For `script`: samples (or tokens) one of its steps trains, e.g. batch size x gradient accumulation x "
        "block size; samples/s then follows from the steps its `metrics` lines report."))
    resume_args: list[str] = Field(default_factory=list, description=(
        "For `script`: arguments added after `args` when an attempt starts with files in {checkpoint_dir} "
        "(a restart, or `torchherd resume`), e.g. ['--init_from=resume']; placeholders as in `args`."))
    cwd: str | None = Field(None, description=(
        "For `script`: its working directory, relative to the config file ({params.NAME} and swept {KEY} filled "
        "in). Default: the script's own folder, as `cd path/to && python train.py` would run it."))
    torchrun_env: bool = Field(False, description=(
        "For a one-rank `script`: set torchrun's variables (RANK=0, WORLD_SIZE=1, MASTER_ADDR, ...) as a "
        "one-process torchrun would. Off, it sees the environment `python train.py` would; a gang "
        "(ranks > 1, or 'MIN:MAX' at any size) always gets them."))
    stop_signal: Literal["SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT"] = Field(
        "SIGINT", description=(
            "For `script` without torchherd.client: the signal a graceful stop sends it (Ctrl-C's SIGINT by "
            "default); use the one your script catches to save."))
    stop_mode: Literal["signal", "after_checkpoint"] = Field("signal", description=(
        "For `script` without torchherd.client: 'signal' sends `stop_signal` at once; 'after_checkpoint' "
        "waits (up to three quarters of restart.stop_timeout) for the script's next file in {checkpoint_dir} "
        "and sends it once that file is written, so a script that cannot save on demand loses only the "
        "moment after its save."))
    metrics: str | list[str] | None = Field(None, description=(
        "A regular expression (or a list of them) matched against every line `script` prints; named groups "
        "`step`, `epoch` and `loss` (and `lr`) become step or epoch reports, any other named group a metric "
        "of the report, e.g. 'Epoch (?P<epoch>\\d+), Loss: (?P<loss>\\S+)'."))
    val_metrics: str | list[str] | None = Field(None, description=(
        "For `script`: a regular expression (or a list) matching the lines where the script reports its own "
        "validation; named groups become a val_result's metrics (`loss` as val_loss, others prefixed val_), "
        "`step` or `epoch` say which weights, and [validation] `metric` and `patience` apply (best, early stop)."))
    # Named `validate` in TOML; that name would shadow pydantic's BaseModel.validate.
    validate_factory: str | None = Field(None, alias="validate", description=(
        "For `script`: 'path/to/file.py:build' or 'package.module:build', a factory returning "
        "torchherd.client.Validation(model, val_data, loss_fn) that scores what the script passes to "
        "herd.hand_off(model)."))
    datamodule: str = Field("", description=(
        "Lightning pipelines: the LightningDataModule class, 'path/to/file.py:Class' (relative to the config "
        "file) or 'package.module:Class'; empty: the module's own *_dataloader methods."))
    datamodule_params: dict[str, Any] = Field(default_factory=dict, description=(
        "Lightning pipelines: keyword arguments of the DataModule's constructor; [defaults] ones are merged "
        "under each pipeline's, and a sweep varies one as datamodule_params.NAME."))
    strategy: Literal["ddp", "ddp_find_unused_parameters_true", "fsdp", "deepspeed"] = Field("ddp", description=(
        "With ranks > 1, how the gang trains (gloo on CPU, NCCL on GPU): 'ddp' replicates the model; 'fsdp' shards "
        "it (a Task by FSDP2; a Lightning module by FSDPStrategy: GPUs); 'deepspeed': Lightning, GPUs, deepspeed."))
    shard_group: int | None = Field(None, ge=1, description=(
        "A Task's 'fsdp' gang: ranks that shard one copy of the model between them, the copies replicated between "
        "groups (HSDP, a 2-D device mesh), e.g. the ranks of one node; must divide ranks. Default: all ranks."))

    @field_validator("ranks")
    @classmethod
    def _ranks(cls, v: int | str) -> int | str:
        if isinstance(v, int):
            if v < 1:
                raise ValueError(f"must be at least 1 (got {v})")
            return v
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", v)
        if m is None:
            raise ValueError(f"must be a whole number of ranks or 'MIN:MAX' like '2:4' (got {v!r})")
        low, high = int(m[1]), int(m[2])
        if not 1 <= low <= high:
            raise ValueError(f"'MIN:MAX' needs 1 <= MIN <= MAX (got {v!r})")
        return v

    @property
    def max_ranks(self) -> int:
        """The most ranks its gang runs at: `ranks`, or MAX of 'MIN:MAX'."""
        return self.ranks if isinstance(self.ranks, int) else int(self.ranks.split(":")[1])

    @property
    def min_ranks(self) -> int:
        """The fewest ranks its gang runs at: `ranks`, or MIN of 'MIN:MAX'."""
        return self.ranks if isinstance(self.ranks, int) else int(self.ranks.split(":")[0])

    @property
    def elastic(self) -> bool:
        """Its gang's size may change between attempts (ranks = 'MIN:MAX' with MIN < MAX)."""
        return self.min_ranks < self.max_ranks

    @field_validator("gpu_memory")
    @classmethod
    def _gpu_memory(cls, v: str | float | None) -> str | float | None:
        if isinstance(v, str):
            memory_bytes(v)
        elif isinstance(v, float | int) and not isinstance(v, bool) and not 0 < v <= 1:
            raise ValueError(f"a fraction of a GPU must be in (0, 1] (got {v!r}); or give bytes as '6GiB'")
        return v

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_from_int(cls, v: object) -> object:  # before validation: any input
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("metrics", "val_metrics")
    @classmethod
    def _metrics_regex(cls, v: str | list[str] | None) -> str | list[str] | None:
        for i, pattern in enumerate(patterns(v)):
            try:
                check_metrics_regex(pattern)
            except ValueError as exc:
                raise ValueError(f"[{i}] {exc}" if isinstance(v, list) else str(exc)) from None
        return v

    @field_validator("args", "resume_args")
    @classmethod
    def _placeholders(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # info.context: the pipeline as the loader filled it in (config/placeholders.py); None for [defaults]
        for i, arg in enumerate(v):
            if (problem := unknown(arg, runtime=True, loaded=info.context)) is not None:
                raise ValueError(f"[{i}] {problem}")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd_placeholders(cls, v: str | None, info: ValidationInfo) -> str | None:
        problem = None if v is None or info.context is None else unknown(v, runtime=False, loaded=info.context)
        if problem is not None:
            raise ValueError(problem)
        return v


SCRIPT_ONLY = ("args", "metrics", "val_metrics", "validate", "resume_args", "cwd", "torchrun_env", "stop_signal",
               "stop_mode", "samples_per_step")  # keys that mean nothing without `script`
SETTING_NAMES.update(n for n in PipelineSettings.model_fields if n not in ("params", "task", "script", "name"))


class Pipeline(PipelineSettings):
    """One independent training pipeline."""

    name: str = Field(..., description="Unique name; also the pipeline's folder in the run directory.")
    task_ref: str = Field("", description="The task as resolved (absolute file path); filled in by the loader.")
    script_ref: str = Field("", description="The script as resolved (absolute path); filled in by the loader.")
    validate_ref: str = Field("", description="`validate` as resolved; filled in by the loader.")
    workdir: str = Field("", description="The script's working directory (`cwd` resolved); from the loader.")
    max_epochs_set: bool = Field(True, description=(
        "Whether the config sets max_epochs (a script's epoch total is unknown otherwise); from the loader."))
    trial: dict[str, Any] = Field(default_factory=dict, description=(
        "A sweep's trial: the values of the [sweep] space keys this pipeline trains with; from the loader."))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in RUN_FOLDERS:
            raise ValueError(f"{v!r} is the name of a folder torchherd keeps in every run directory; name the "
                             "pipeline otherwise")
        return _check_name(v)

    @property
    def epochs_planned(self) -> int:
        """Its epoch total as far as the config says; 0 (unknown) for a script without max_epochs, which runs
        its own loop: the default of 10 would be a guess."""
        return 0 if self.kind == PipelineKind.SCRIPT and not self.max_epochs_set else self.max_epochs

    @property
    def kind(self) -> PipelineKind:
        """Which runner trains it (engine/runners/registry.py): TASK (torchherd's own loop over a `Task`),
        LIGHTNING (Lightning's Trainer.fit over a LightningModule) or SCRIPT (the user's own training script)."""
        if self.script is not None:
            return PipelineKind.SCRIPT
        if self.task is not None and self.task.startswith(LIGHTNING_PREFIX):
            return PipelineKind.LIGHTNING
        return PipelineKind.TASK


class DevicesConfig(_Strict):
    """Where workers run."""

    placement: str | list[int] = Field("auto", description=(
        "'auto' (every visible GPU, else CPU slots), 'cpu', or a list of GPU indices."))

    @field_validator("placement", mode="before")
    @classmethod
    def _placement(cls, v: object) -> object:  # before validation: any input
        if v in ("auto", "cpu"):
            return v
        if isinstance(v, list) and v and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                             for i in v):
            if len(set(v)) != len(v):
                raise ValueError(f"lists a GPU twice (got {v!r})")
            return v
        raise ValueError(f"must be 'auto', 'cpu' or a list of GPU indices like [0, 1] (got {v!r})")
    cpu_slots: int | Literal["auto"] = Field("auto", description=(
        "How many CPU workers run at once; 'auto' is the core count over threads_per_worker."))
    threads_per_worker: int = Field(1, ge=1, description="torch threads for each CPU worker.")
    keep_free: int = Field(0, ge=0, description=(
        "GPUs this run always leaves wholly free for other people (no lease of any run, no other process)."))
    share: Literal["memory", "exclusive"] = Field("memory", description=(
        "'memory': a gpu_memory share may go on a GPU another user's process uses, if its free memory fits; "
        "'exclusive': never on such a GPU. A whole-GPU request never takes one."))

    @field_validator("cpu_slots")
    @classmethod
    def _positive_slots(cls, v: int | Literal["auto"]) -> int | Literal["auto"]:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1 or 'auto'")
        return v


class ValidationConfig(_Strict):
    """How and when the weights are scored on validation data."""

    # strict=False: the TOML string (and a dumped config's) becomes the member; strict would want the member itself
    mode: ValidationMode = Field(ValidationMode.AUTO, strict=False, description=(
        "'background' hands weight snapshots to a validation process (one per node on a Ray cluster) while "
        "training goes on; 'inline' validates in the worker, which waits; 'auto' picks background when there "
        "is a spare GPU or core, else inline; 'off' never validates."))
    every_n_epochs: int = Field(1, ge=1, description="Validate every this many epochs.")
    every_n_steps: int | None = Field(None, ge=1, description=(
        "Also hand off a snapshot every this many optimizer steps (background mode)."))
    policy: Literal["latest", "all"] = Field("latest", description=(
        "When the validator falls behind: 'latest' validates the newest snapshot and records the skipped "
        "ones; 'all' validates every snapshot, dropping (and saying so) only when every slot is unread."))
    slots: int = Field(2, ge=2, le=64, description=(
        "Snapshot slots per pipeline in shared memory (each the size of the model's weights)."))
    device: Literal["auto", "cpu"] | int = Field("auto", description=(
        "Where the validator runs: 'auto' (a GPU no worker uses, else the last GPU, else the CPU), 'cpu', "
        "or a GPU index."))
    threads: int = Field(1, ge=1, description="torch threads for the validator on the CPU.")
    metric: str = Field("val_loss", description="The metric that decides the best checkpoint.")
    metric_mode: Literal["min", "max"] = Field("min", description="Whether lower or higher `metric` is better.")
    patience: int | None = Field(None, ge=1, description=(
        "Stop a pipeline after this many validations without improving `metric` (early stopping)."))
    checksum: bool = Field(False, description=(
        "Record a checksum of every snapshot and of the weights validated (costs one pass over the weights)."))
    handoff_staging: bool = Field(True, description=(
        "On a GPU, a hand-off first copies the weights to a buffer on the same GPU (training waits only for "
        "that on-device copy; the copy to shared memory runs beside training), which holds GPU memory the size "
        "of the weights; false gives that memory back and copies straight to shared memory, so training's "
        "next kernels wait for the copy over the bus."))


class RestartConfig(_Strict):
    """What happens when a worker dies unexpectedly."""

    max_restarts: int = Field(3, ge=0, description="Restarts allowed per pipeline after crashes.")
    backoff: float = Field(1.0, ge=0, description="Delay before the first restart (seconds); doubles per failed start.")
    backoff_max: float = Field(30.0, ge=0, description="Longest delay between restarts (seconds).")
    min_uptime: float = Field(5.0, ge=0,
                              description="A worker that dies sooner than this (seconds) counts as a failed start.")
    max_failed_starts: int = Field(3, ge=1, description="Consecutive failed starts after which the pipeline fails.")
    kill_grace: float = Field(5.0, gt=0, description="Seconds between SIGTERM and SIGKILL when killing.")
    hang_timeout: float | None = Field(None, gt=0, description=(
        "Seconds without a training step after which a running worker is declared hung: its stack goes to "
        "its log, it is killed and the restart policy applies. Must exceed the slowest step or validation; "
        "building the task and the first step get `start_timeout`. Unset: never."))
    stall_warning: float = Field(60.0, gt=0, description=(
        "Seconds without a training step after which a live pipeline is flagged in the table and headless "
        "(`d` or `torchherd stacks` then writes its stacks to its log; nothing is killed): at least this, or 5x "
        "its slowest gap between steps so far; before its first step, 5x this."))
    start_timeout: float | None = Field(None, gt=0, description=(
        "With `hang_timeout` set: seconds a worker may take to build its task and make its first step before "
        "it is declared hung (imports, data loading, a gang's first collective, compilation). "
        "Default: three times `hang_timeout`, and at least 60."))
    stop_timeout: float = Field(120.0, gt=0, description=(
        "Seconds a graceful stop may take (finish the step, checkpoint) before the worker is killed."))


class TelemetryConfig(_Strict):
    """How often GPU and process figures are read and saved."""

    interval: float = Field(1.0, gt=0, description="Seconds between telemetry samples (NVML and psutil).")
    persist_every: float = Field(10.0, gt=0, description="Seconds between samples written to telemetry.jsonl.")
    enabled: bool = Field(True, description="Sample at all; off saves the sampler's fraction of a core.")


class ClusterConfig(_Strict):
    """Where the workers run: this machine, or a Ray cluster."""

    backend: Literal["local", "ray"] = Field("local", description=(
        "'local': processes on this machine; 'ray': Ray actors on a cluster (pip install \"torchherd[ray]\")."))
    address: str = Field("auto", description=(
        "With backend 'ray': 'auto' (the cluster `ray start` made here, or RAY_ADDRESS), 'host:port' of a "
        "cluster's head, or 'local' for a private one-machine cluster torchherd starts and ends."))
    warm_start: bool = Field(True, description=(
        "With backend 'local': when more pipelines wait than there are free slots, or a sweep or gang will "
        "restart its processes, start them from a process that has imported torch once (a fork), so each trains "
        "about 0.1 s after it gets its slot; false starts every pipeline as a fresh interpreter."))

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if v in ("auto", "local") or re.fullmatch(r"[\w.\-]+:\d{1,5}", v):
            return v
        raise ValueError(f"must be 'auto', 'local' or 'host:port' like '10.0.0.5:6379' (got {v!r})")


class RunConfig(_Strict):
    """A whole torchherd config file."""

    name: str = Field("", description=(
        "Name of the run, the start of its folder's name (letters, digits, '_', '.', '-'); defaults to the "
        "file name."))
    runs_dir: str = Field("runs", description="Where run directories go (relative to the working directory).")
    defaults: PipelineSettings = Field(default_factory=PipelineSettings, description=(
        "Settings every pipeline inherits unless it sets its own."))
    pipelines: list[Pipeline] = Field(..., min_length=1, description="The pipelines to train ([[pipelines]] tables).")
    devices: DevicesConfig = Field(default_factory=DevicesConfig, description="Device placement.")
    validation: ValidationConfig = Field(default_factory=ValidationConfig, description="Validation settings.")
    restart: RestartConfig = Field(default_factory=RestartConfig, description="Restart policy.")
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig, description="Telemetry sampling.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Local processes or a Ray cluster.")
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="Alerts: rules, bell, command.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description=(
        "Experiment trackers (MLflow, W&B, your own sinks) that get a copy of the run's events."))
    sweep: SweepConfig | None = Field(None, description=(
        "A search: each [[pipelines]] table becomes one pipeline per trial, pruned by validation results."))
    tensorboard: bool = Field(True, description=(
        "Write TensorBoard event files of every pipeline under the run directory's tensorboard/ folder (the "
        "supervisor writes them from its events; workers do no work for it)."))
    source: str = Field("", description="The file this config was read from; filled in by the loader.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v if v == "" else _check_name(v)  # "": the file's name is used


# filled in by the loader, not keys
RESOLVED = ("task_ref", "source", "script_ref", "validate_ref", "workdir", "trial", "max_epochs_set")
TABLES: dict[str, type[BaseModel]] = {  # the model of each table below the top level, by its key in the file
    "defaults": PipelineSettings, "pipelines": Pipeline, "devices": DevicesConfig, "validation": ValidationConfig,
    "restart": RestartConfig, "telemetry": TelemetryConfig, "cluster": ClusterConfig, "sweep": SweepConfig,
    "alerts": AlertsConfig, "tracking": TrackingConfig}


def describe_fields() -> dict[str, dict[str, str]]:
    """Every config table's keys and their descriptions (for docs and the app)."""
    tables: dict[str, type[BaseModel]] = {"(top level)": RunConfig, "pipelines / defaults": Pipeline,
              **{k: v for k, v in TABLES.items() if k not in ("defaults", "pipelines")}}
    return {t: {f.alias or n: f.description or "" for n, f in m.model_fields.items() if n not in RESOLVED}
            for t, m in tables.items()}
