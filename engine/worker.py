"""The worker process: `python -m torchherd.engine.worker SPEC.json` builds a pipeline's task and trains it.

It talks to the supervisor only through the two pipe descriptors named in the
spec, dies with its parent (parent-death signal plus the control pipe's EOF),
and reports any exception with its traceback before exiting non-zero.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

from torchherd.engine.channel import EXIT_ERROR, EXIT_FATAL, EXIT_ORPHANED, ControlReceiver, StatusSender, SupervisorGone
from torchherd.engine.launcher import WorkerSpec
from torchherd.engine.messages import WorkerError

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL us when the supervisor dies; the control pipe's EOF is the fallback."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return
    if parent_pid and os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(EXIT_ORPHANED)



def run(spec: WorkerSpec, sender: StatusSender, control: ControlReceiver) -> int:
    name = spec.pipeline["name"]
    where = "build"
    try:
        import torch

        from torchherd.engine.config import Pipeline, ValidationConfig
        from torchherd.engine.task import TaskError, build_task
        from torchherd.engine.trainer import Trainer

        pipe = Pipeline.model_validate(spec.pipeline)
        validation = ValidationConfig.model_validate(spec.validation)
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads)
        torch.set_float32_matmul_precision(pipe.float32_matmul_precision)
        torch.manual_seed(pipe.seed)
        if spec.device.startswith("cuda") and pipe.gpu_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(pipe.gpu_memory_fraction, 0)
        try:
            task = build_task(pipe.task_ref or pipe.task, pipe.params)
        except TaskError as exc:
            print(f"torchherd: {exc}", file=sys.stderr)
            sender.send(WorkerError(pipeline=name, error=str(exc), where="build",
                                    traceback=traceback.format_exc()))
            return EXIT_FATAL
        where = "train"
        trainer = Trainer(task, pipe, validation, spec.device, Path(spec.pipeline_dir), sender, control,
                          Path(spec.snapshot_dir) if spec.snapshot_dir else None, spec.snapshot_seq)
        return trainer.run()
    except SupervisorGone:
        raise
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        error = f"{type(exc).__name__}: {exc}"
        if "out of memory" in str(exc).lower():
            error = f"CUDA out of memory: {exc}"
        sender.send(WorkerError(pipeline=name, error=error, traceback=tb, where=where))
        return EXIT_ERROR


def serve_child(role: str, body: Callable[[WorkerSpec, StatusSender, ControlReceiver], int],
                argv: list[str] | None = None) -> None:
    """Run `body` as a supervised child process (a worker or the validator) and exit with its code.

    Reads the spec, dies with the supervisor, dumps stacks on a crash or on SIGUSR1,
    ignores the terminal's Ctrl-C (the supervisor decides when to stop) and ships
    every queued event before exiting.
    """
    argv = sys.argv[1:] if argv is None else argv
    spec = WorkerSpec.from_json(Path(argv[0]).read_text())
    _die_with_parent(spec.supervisor_pid)
    faulthandler.enable(all_threads=True)  # a segfault leaves its stack in the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the supervisor's "where are you stuck?"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"torchherd {role} pid {os.getpid()} {spec.pipeline['name']} attempt {spec.attempt} "
          f"device {spec.device}", flush=True)
    sender = StatusSender(Connection(spec.status_fd, readable=False))
    control = ControlReceiver(Connection(spec.control_fd, writable=False))
    try:
        code = body(spec, sender, control)
    except SupervisorGone:
        print("torchherd: the supervisor went away; exiting", file=sys.stderr, flush=True)
        os._exit(EXIT_ORPHANED)
    except BaseException:
        traceback.print_exc()
        code = EXIT_ERROR
    sender.close(timeout=10.0)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader and compile threads can hang it.
    os._exit(code)


if __name__ == "__main__":
    serve_child("worker", run)
