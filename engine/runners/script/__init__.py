"""The `script` kind: a training script of the user's own, run as `python train.py ARGS`.

`ScriptRunner` is its contract (engine/runners/base.py); the attempt is runner.py, the
process process.py, its reports events.py, a `validate` factory validation.py. A script
worker never imports torch: the script trains in its own process.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ...protocol.names import PipelineKind, ValidationMode
from ..base import Runner, Scorer

if TYPE_CHECKING:
    from ...config.schema import Pipeline, ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.spec import WorkerSpec
    from ...worker.control import WorkerControl

HAND_OFF = re.compile(r"\bhand_off\s*\(")
RESUME_FROM = re.compile(r"\bresume_from\s*\(")
CLIENT = re.compile(r"\btorchherd\.client\b|\bfrom\s+torchherd\s+import\s+client\b")
SCAN_LIMIT = 200  # .py files beside a script searched for a call, at most


def calls(script: Path, call: re.Pattern) -> bool:
    """Whether the script, or a module beside it (a training loop often lives there), makes `call`."""
    files = [script, *sorted(p for p in script.parent.glob("*.py") if p != script)[:SCAN_LIMIT]]
    for file in files:
        try:
            if call.search(file.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def calls_hand_off(script: Path) -> bool:
    """Whether the script (or a module beside it) calls hand_off(...)."""
    return calls(script, HAND_OFF)


def uses_client(script: Path) -> bool:
    """Whether the script (or a module beside it) imports torchherd.client, so it can take requests."""
    return calls(script, CLIENT)


class ScriptRunner(Runner):
    """`script = "train.py"`: the script's own loop, steered by signals or by torchherd.client."""

    kind = PipelineKind.SCRIPT

    def scored_in_background(self, pipe: Pipeline) -> bool:
        """Only a `validate` factory gives the validator something to score; `val_metrics` are the script's own."""
        return pipe.validate_factory is not None

    def check(self, pipe: Pipeline, validation_mode: str) -> list[tuple[str, str]]:
        """A `validate` factory whose script never hands its weights off: nothing would ever be scored."""
        if not pipe.validate_factory or validation_mode == ValidationMode.OFF:
            return []
        script = Path(pipe.script_ref)
        if not script.is_file() or calls_hand_off(script):
            return []
        return [("validate", (
            f"{script.name} never calls herd.hand_off(model), so validation would have nothing to score: "
            "add `import torchherd.client as herd` and `herd.hand_off(model)` after each epoch, "
            "or remove `validate`"))]

    def elastic_problem(self, pipe: Pipeline) -> str:
        """An elastic gang restarts at another size from the script's own checkpoint, told the new WORLD_SIZE: a
        script that is never told to resume (no `resume_args`, no herd.resume_from()) would start over."""
        if pipe.resume_args or calls(Path(pipe.script_ref), RESUME_FROM):
            return ""
        return ("an elastic gang ('MIN:MAX') restarts at another size from the script's own checkpoint, and nothing "
                "tells this script to resume: add resume_args (e.g. [\"--resume\", \"{checkpoint_dir}/ckpt.pt\"]) "
                "that load it at the WORLD_SIZE it is given (or call herd.resume_from() in the script), or give a "
                "whole number of ranks")

    def describe(self, pipe: Pipeline) -> str:
        """'script train.py --lr 0.01, metrics from its output, validate val.py:build': its own loop, so
        torchherd's epochs and precision do not apply."""
        import shlex

        text = "script " + shlex.join([cast(str, pipe.script), *pipe.args])  # a script pipeline names it
        if pipe.metrics:
            text += ", metrics from its output"
        if pipe.val_metrics:
            text += ", its own validation from its output"
        if pipe.resume_args:
            text += f", resumes with {shlex.join(pipe.resume_args)}"
        if pipe.elastic:  # each new size is a new attempt (a grow stops it first, as `s` would)
            text += ", restarted at each new size from its newest checkpoint"
        if pipe.stop_mode == "after_checkpoint":
            text += ", stops after its next save"
        if pipe.cwd is not None:
            text += f", in {pipe.workdir}"
        if pipe.validate_factory:
            text += f", validate {pipe.validate_factory}"
        return text + (f", max {pipe.max_time:g}s" if pipe.max_time else "")

    def resumes_from(self, pipe: Pipeline, checkpoints: Path) -> str:
        """The script's own checkpoint, as `resume_args` pass it on: the newest file in its checkpoints/."""
        import shlex

        from .arguments import describe_checkpoint, newest_checkpoint

        found = newest_checkpoint(checkpoints)
        if found is None:
            return "from scratch (no checkpoint yet)"
        if not pipe.resume_args and calls(Path(pipe.script_ref), RESUME_FROM):
            return f"from {describe_checkpoint(found)}, which the script loads itself (herd.resume_from())"
        if not pipe.resume_args:
            return (f"from the start of its script: checkpoints/ holds {describe_checkpoint(found)}, "
                    "but no `resume_args` tell the script to resume")
        return f"with {shlex.join(pipe.resume_args)} ({describe_checkpoint(found)})"

    def run(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
            control: WorkerControl) -> int:
        from .runner import run_script

        return run_script(spec, pipe, validation, sender, control)

    def scorer(self, name: str, directory: Path, device: str) -> Scorer:
        from ..task.scorer import PipelineScorer  # the `validate` factory's model and data, scored as a Task's

        return PipelineScorer(name, directory, device)
