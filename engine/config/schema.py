"""The run configuration: a typed schema for torchherd TOML files and its loader.

`load_config(path)` returns a validated `RunConfig` or raises `ConfigError`,
which lists every problem with the file, the key path and what is wrong.
"""
from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..protocol.names import PipelineKind

BUILTIN_TASKS = ("regression", "digits")
# Run and pipeline names become folder names, so no '/', no leading '.', nothing that climbs out.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_RULE = "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit (it names a folder)"


def display_path(path: str | os.PathLike[str]) -> str:
    """`path` as problems show it: relative to the working directory when under it, else absolute."""
    full = os.path.abspath(path)
    cwd = os.getcwd()
    if full == cwd or full.startswith(cwd.rstrip(os.sep) + os.sep):
        return os.path.relpath(full, cwd)
    return full


def _check_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{NAME_RULE} (got {value!r})")
    return value


LIGHTNING_PREFIX = "lightning:"  # task = "lightning:file.py:Class": a LightningModule trained by Trainer.fit


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, and what."""

    file: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" if self.key else f"{self.file}: {self.message}"


class ConfigError(Exception):
    """A config that cannot be run; `problems` lists every reason."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


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
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1, description=(
        "Cap on this pipeline's share of its GPU's memory (0-1], so it cannot starve a neighbour."))
    seed: int = Field(0, description="Seed for torch's generators and the data order.")
    ranks: int = Field(1, ge=1, description=(
        "Processes of one DistributedDataParallel gang, one per device slot, started and restarted as a unit "
        "(torchrun's --nproc-per-node); 1 trains in one process."))
    nan_policy: Literal["warn", "stop", "restart"] = Field("stop", description=(
        "When the training loss is NaN or infinite: warn and carry on, stop the pipeline as failed, "
        "or restart it from its last checkpoint."))
    # A training script of the user's own, run as it is (engine/runners/script/runner.py).
    script: str | None = Field(None, description=(
        "Instead of `task`: a training script to run as it is, 'path/to/train.py' (relative to the config "
        "file, which is also its working directory), with this Python."))
    args: list[str] = Field(default_factory=list, description="Command-line arguments for `script`.")
    metrics: str | None = Field(None, description=(
        "A regular expression matched against every line `script` prints; named groups `step`, `epoch` and "
        "`loss` (and `lr`) become step or epoch reports, any other named group a metric of the report, e.g. 'Epoch (?P<epoch>\\d+), Loss: (?P<loss>\\S+)'."))
    # Named `validate` in TOML; that name would shadow pydantic's BaseModel.validate.
    validate_factory: str | None = Field(None, alias="validate", description=(
        "For `script`: 'path/to/file.py:build' or 'package.module:build', a factory returning "
        "torchherd.client.Validation(model, val_data, loss_fn) that scores what the script passes to "
        "herd.hand_off(model)."))
    datamodule: str = Field("", description=(
        "Lightning pipelines: the LightningDataModule class, 'path/to/file.py:Class' (relative to the config "
        "file) or 'package.module:Class'; empty: the module's own *_dataloader methods."))
    datamodule_params: dict[str, Any] = Field(default_factory=dict, description=(
        "Lightning pipelines: keyword arguments of the DataModule's constructor."))

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_from_int(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("metrics")
    @classmethod
    def _metrics_regex(cls, v: str | None) -> str | None:
        return v if v is None else check_metrics_regex(v)


SCRIPT_ONLY = ("args", "metrics", "validate")  # keys that mean nothing without `script`


def check_metrics_regex(pattern: str) -> str:
    """`pattern` if it compiles and names what it captures; else ValueError saying what is wrong."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    if not compiled.groupindex:
        raise ValueError("has no named group: name what a group captures, e.g. (?P<loss>[-+.\\deE]+) "
                         "or (?P<epoch>\\d+)")
    return pattern


class Pipeline(PipelineSettings):
    """One independent training pipeline."""

    name: str = Field(..., description="Unique name; also the pipeline's folder in the run directory.")
    task_ref: str = Field("", description="The task as resolved (absolute file path); filled in by the loader.")
    script_ref: str = Field("", description="The script as resolved (absolute path); filled in by the loader.")
    validate_ref: str = Field("", description="`validate` as resolved; filled in by the loader.")
    workdir: str = Field("", description="The script's working directory (the config's folder); from the loader.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v)

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
    def _placement(cls, v: Any) -> Any:
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

    @field_validator("cpu_slots")
    @classmethod
    def _positive_slots(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1 or 'auto'")
        return v


class ValidationConfig(_Strict):
    """How and when the weights are scored on validation data."""

    mode: Literal["auto", "background", "inline", "off"] = Field("auto", description=(
        "'background' hands weight snapshots to a validation process (one per node on a Ray cluster) while "
        "training goes on; 'inline' validates in the worker, which waits; 'auto' picks background when there is a spare GPU or core, "
        "else inline; 'off' never validates."))
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


class RestartConfig(_Strict):
    """What happens when a worker dies unexpectedly."""

    max_restarts: int = Field(3, ge=0, description="Restarts allowed per pipeline after crashes.")
    backoff: float = Field(1.0, ge=0, description="Delay before the first restart (seconds); doubles per failed start.")
    backoff_max: float = Field(30.0, ge=0, description="Longest delay between restarts (seconds).")
    min_uptime: float = Field(5.0, ge=0, description=(
        "A worker that dies sooner than this (seconds) counts as a failed start."))
    max_failed_starts: int = Field(3, ge=1, description="Consecutive failed starts after which the pipeline fails.")
    kill_grace: float = Field(5.0, gt=0, description="Seconds between SIGTERM and SIGKILL when killing.")
    hang_timeout: float | None = Field(None, gt=0, description=(
        "Seconds without a training step after which a running worker is declared hung: its stack goes to "
        "its log, it is killed and the restart policy applies. Must exceed the slowest step or validation; "
        "building the task may take three times as long. Unset: never."))
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
    source: str = Field("", description="The file this config was read from; filled in by the loader.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v if v == "" else _check_name(v)  # "": the file's name is used


# ------------------------------------------------------------------ loading

RESOLVED = ("task_ref", "source", "script_ref", "validate_ref", "workdir")  # filled in by the loader, not keys


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err: dict[str, Any], fields: list[str]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, fields, n=1)
        if close:
            return f"unknown key (did you mean '{close[0]}'?)"
        if "params" in fields:
            return "unknown key (task parameters go in the pipeline's params table)"
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    if "input" in err and kind not in ("model_type", "list_type", "dict_type"):
        msg += f" (got {err['input']!r})"
    return msg


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Known keys of the table that `loc` points into (for 'did you mean')."""
    names = list(model.model_fields)
    if len(loc) >= 2:
        first = loc[0]
        sub = {"defaults": PipelineSettings, "pipelines": Pipeline, "devices": DevicesConfig,
               "validation": ValidationConfig, "restart": RestartConfig,
               "telemetry": TelemetryConfig, "cluster": ClusterConfig}.get(first)
        if sub is not None:
            names = [f.alias or n for n, f in sub.model_fields.items()]
    return [n for n in names if n not in RESOLVED]


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and (part in ("int", "float", "str", "bool", "none")
                                      or part.startswith(("list[", "literal[", "function-")))


def _problems(exc: ValidationError, file: str, model: type[BaseModel], prefix: tuple = ()) -> list[Problem]:
    out = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        # Pydantic names union branches in the location ("int", "literal['auto']"); drop them.
        loc = tuple(p for p in loc if not _is_branch(p))
        out.append(Problem(file, _key_path(loc), _message(err, _fields_at(model, loc))))
    seen, unique = set(), []
    for p in out:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            unique.append(p)
    return unique


def resolve_task(task: str, base_dir: Path) -> tuple[str, str | None]:
    """Turn a task string into an absolute reference, or say what is wrong with it."""
    if task.startswith(LIGHTNING_PREFIX):
        import importlib.util

        if importlib.util.find_spec("lightning") is None:  # found without importing it (seconds)
            return task, 'Lightning is not installed: pip install "torchherd[lightning]"'
        inner = task[len(LIGHTNING_PREFIX):]
        if ":" not in inner:
            return task, (f"{task!r}: name the LightningModule as 'lightning:path/to/file.py:Class' "
                          "or 'lightning:package.module:Class'")
        ref, err = resolve_task(inner, base_dir)
        return LIGHTNING_PREFIX + ref, err
    if task in BUILTIN_TASKS:
        return task, None
    if ":" not in task:
        return task, (f"unknown task {task!r}: use a built-in task ({', '.join(BUILTIN_TASKS)}), "
                      "'path/to/file.py:build' or 'package.module:build'")
    target, _, attr = task.rpartition(":")
    if not attr.isidentifier():
        return task, f"{attr!r} after ':' is not a Python name"
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        if not path.is_file():
            return task, f"task file not found: {display_path(path)}"
        return f"{path}:{attr}", None
    import importlib.util
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        return task, f"cannot find module {target!r}: {exc}"
    if spec is None:
        return task, f"cannot find module {target!r} (is it installed or on PYTHONPATH?)"
    return task, None


def resolve_kind(model: Pipeline, own: dict[str, Any], i: int, file: str,
                 base_dir: Path) -> tuple[dict[str, str], list[Problem]]:
    """The loader's fields for one pipeline (`task_ref`, or `script_ref`, `workdir`, `validate_ref`) and the
    problems with its `task` or `script`; `own` is the pipeline's table as written, without [defaults]."""
    def where(key: str) -> str:
        return f"pipelines[{i}].{key}" if key in own else f"defaults.{key}"

    if model.task is not None and model.script is not None:
        both = "`task` and `script` are both set: a pipeline runs one or the other"
        return {}, [Problem(file, where("script"), both)]
    if model.script is None:
        only = "only applies to a `script` pipeline (this one runs a `task`)"
        problems = [Problem(file, f"pipelines[{i}].{key}", only) for key in SCRIPT_ONLY if key in own]
        if model.task is None:
            return {}, problems + [Problem(file, f"pipelines[{i}].task",
                                           "required key is missing: set `task` or `script` (here or in [defaults])")]
        ref, err = resolve_task(model.task, base_dir)
        return {"task_ref": ref}, problems + ([Problem(file, where("task"), err)] if err else [])
    problems = []
    path = Path(model.script)
    path = path if path.is_absolute() else (base_dir / path).resolve()
    if not path.is_file():
        problems.append(Problem(file, where("script"), f"script not found: {path}"))
    update = {"script_ref": str(path), "workdir": str(base_dir.resolve())}
    if model.validate_factory is not None:
        ref, err = resolve_task(model.validate_factory, base_dir)
        update["validate_ref"] = ref
        if err:
            problems.append(Problem(file, where("validate"), err.replace("task", "validate factory", 1)))
    return update, problems


def parse_config(data: dict[str, Any], file: str, base_dir: Path | None = None) -> RunConfig:
    """Validate a decoded TOML document; raise ConfigError naming every problem."""
    base_dir = base_dir or Path(file).resolve().parent
    shown = display_path(file)  # one path style in every problem, whether from here or from the probe
    problems: list[Problem] = []
    raw = dict(data)
    raw_defaults = raw.get("defaults", {})
    raw_pipelines = raw.get("pipelines")
    if not isinstance(raw_defaults, dict):
        problems.append(Problem(shown, "defaults", "must be a table ([defaults])"))
        raw_defaults = {}
    try:
        PipelineSettings.model_validate(raw_defaults)
    except ValidationError as exc:
        problems += _problems(exc, shown, RunConfig, ("defaults",))

    if raw_pipelines is None:
        problems.append(Problem(shown, "pipelines", "no pipelines: add at least one [[pipelines]] table"))
        raw_pipelines = []
    elif not isinstance(raw_pipelines, list) or not all(isinstance(p, dict) for p in raw_pipelines):
        problems.append(Problem(shown, "pipelines", "must be an array of tables ([[pipelines]])"))
        raw_pipelines = []
    elif not raw_pipelines:
        problems.append(Problem(shown, "pipelines", "no pipelines: add at least one [[pipelines]] table"))

    merged_pipelines = []
    names: dict[str, int] = {}
    for i, pipe in enumerate(raw_pipelines):
        merged = {**raw_defaults, **pipe}
        for own, other in (("script", "task"), ("task", "script")):
            if own in pipe and other not in pipe:
                merged.pop(other, None)  # a pipeline's own task or script replaces the other from [defaults]
        merged["params"] = {**raw_defaults.get("params", {}), **pipe.get("params", {})} \
            if isinstance(raw_defaults.get("params", {}), dict) and isinstance(pipe.get("params", {}), dict) \
            else pipe.get("params", {})
        try:
            model = Pipeline.model_validate(merged)
        except ValidationError as exc:
            for p in _problems(exc, shown, RunConfig, ("pipelines", i)):
                key = p.key.split(".", 1)[1] if "." in p.key else ""
                if key.split("[")[0] in raw_defaults and key.split("[")[0] not in pipe:
                    continue  # reported once, under [defaults]
                problems.append(p)
            merged_pipelines.append(None)
            continue
        if model.name in names:
            problems.append(Problem(shown, f"pipelines[{i}].name",
                                    f"duplicate name {model.name!r} (also pipelines[{names[model.name]}])"))
        names[model.name] = i
        update, found = resolve_kind(model, pipe, i, shown, base_dir)
        problems += [p for p in found if p not in problems]
        if model.datamodule:
            dm_ref, dm_err = resolve_task(model.datamodule, base_dir)
            if dm_err or model.kind != PipelineKind.LIGHTNING:
                where = f"pipelines[{i}].datamodule" if "datamodule" in pipe else "defaults.datamodule"
                problems.append(Problem(shown, where, dm_err or "only Lightning pipelines "
                                        "(task = \"lightning:...\") take a datamodule"))
            update["datamodule"] = dm_ref
        merged_pipelines.append(model.model_copy(update=update))

    rest = {k: v for k, v in raw.items() if k not in ("defaults", "pipelines")}
    try:
        top = RunConfig.model_validate({**rest, "pipelines": [{"name": "x", "task": "regression"}]})
    except ValidationError as exc:
        problems += _problems(exc, shown, RunConfig)
        top = None
    if top is not None and top.cluster.backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # found without importing it (half a second)
            problems.append(Problem(shown, "cluster.backend", 'Ray is not installed: pip install "torchherd[ray]"'))
    if problems:
        raise ConfigError(problems)
    assert top is not None
    name = top.name or Path(file).stem
    return top.model_copy(update={
        "name": name,
        "defaults": PipelineSettings.model_validate(raw_defaults),
        "pipelines": merged_pipelines,
        "source": str(Path(file).resolve()) if os.path.exists(file) else file,
    })


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read and validate a torchherd TOML file."""
    file = str(path)
    shown = display_path(file)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(shown, "", "file not found")]) from None
    except OSError as exc:
        raise ConfigError([Problem(shown, "", f"cannot read: {exc.strerror}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(shown, "", f"TOML syntax error: {exc}")]) from None
    return parse_config(data, file, Path(path).resolve().parent)


def describe_fields() -> dict[str, dict[str, str]]:
    """Every config table's keys and their descriptions (for docs and the app)."""
    tables = {"(top level)": RunConfig, "pipelines / defaults": Pipeline, "devices": DevicesConfig,
              "validation": ValidationConfig, "restart": RestartConfig, "telemetry": TelemetryConfig, "cluster": ClusterConfig}
    return {t: {f.alias or n: f.description or "" for n, f in m.model_fields.items() if n not in RESOLVED}
            for t, m in tables.items()}
