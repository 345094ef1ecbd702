"""The `torchherd` command: the app by default, `run` (with `--headless`), `resume` and `check`.

`torchherd [DIR|CONFIG] [--runs-dir DIR]` opens the app; `torchherd run CONFIG [--headless]
[--runs-dir DIR]` runs a config; `torchherd resume RUN_DIR` carries one on; `torchherd check
CONFIG [--probe]` validates one. `torchherd COMMAND -h` shows a command's own help.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from .cli_parsers import parsers

if TYPE_CHECKING:
    from .app import AppOptions, TorchherdApp
    from .headless import LinePrinter


def _exporter(args: argparse.Namespace) -> int:
    import signal

    if not args.port.isdigit() or int(args.port) > 65535:
        print(f"torchherd exporter: --port {args.port!r}: not a port (a number from 0 to 65535)", file=sys.stderr)
        return 2
    from ..engine import MetricsServer

    # Ctrl-C and SIGTERM are waited for here, not raised into whichever thread is serving a scrape: blocked
    # before the serving threads start, which inherit the mask.
    ending = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, ending)
    try:
        server = MetricsServer(args.host, int(args.port))
    except OSError as exc:  # a port in use or not ours to take, an address that is not this box's
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ending)
        print(f"torchherd exporter: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    host = f"[{server.host}]" if ":" in server.host else server.host
    print(f"torchherd exporter: serving http://{host}:{server.port}/metrics (your live runs on this box; "
          "Ctrl-C ends it)", flush=True)
    signal.sigwait(ending)
    server.close()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ending)
    return 0


def _check(args: argparse.Namespace) -> int:
    from ..engine import check_config

    report = check_config(args.config, probe=args.probe)
    if args.json:
        from .json_output import check_json, emit

        emit(check_json(args.config, report))
    else:
        print(report.render())
    return 0 if report.ok else 2


def _refuse(args: argparse.Namespace, text: str, code: int = 2, stream: bool = False) -> int:
    """A command that cannot do what it was asked: `text` on stderr (after 'torchherd: '), and with --json the
    object saying so on stdout (`stream`: a followed run's `end` object)."""
    print(f"torchherd: {text}", file=sys.stderr)
    if getattr(args, "json", False):
        from .json_output import emit, refusal

        emit(refusal(text, code, stream))
    return code


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # headless lines count from here, not from when the run starts
    # On screen the app opens at once and checks in its picker, before the engine loads (--json has no screen).
    if not args.headless and not args.detach and not args.json:
        return run_app_checked(Path(args.config), Path(args.runs_dir) if args.runs_dir else None)
    from ..engine import check_config
    from .attach import check_and_run
    from .headless import EXIT_CONFIG

    # The fast check first (milliseconds); building every task comes next, with progress shown:
    # headless prints a line at once.
    report = check_config(args.config, runs_dir=args.runs_dir)
    if not report.ok:
        print(report.render(), file=sys.stderr)
        if args.json:  # each problem as check prints it: `torchherd check --json` splits them into fields
            from .json_output import emit

            emit({"type": "end", "ok": False, "exit": EXIT_CONFIG, "message": "", "how": "refused",
                  "problems": [str(p) for p in report.problems]})
        return EXIT_CONFIG
    assert report.config is not None
    return check_and_run(report.config, args.runs_dir, start=started, detach=args.detach, as_json=args.json)


def check_then_launch_app(config: Path, runs_dir: Path | None = None,
                          **kwargs: Unpack[AppOptions]) -> TorchherdApp:
    """The app for `torchherd run CONFIG`: its first picker opens at once on `config`, shows the tasks
    being built and launches the config as soon as they all build (else it shows why not)."""
    from .app import TorchherdApp
    from .screens.picker import PickerScreen

    class CheckThenLaunch(TorchherdApp):
        first = True

        def _picker(self, adding: bool) -> PickerScreen:
            screen = super()._picker(adding)
            if self.first and not adding:
                screen.launch, self.first = True, False
            return screen

    return CheckThenLaunch(config, runs_dir, **kwargs)


def run_app_checked(config: Path, runs_dir: Path | None) -> int:
    """Run the check-then-launch app; 0 only if every pipeline completed, 2 (problems on stderr) if the
    check refused the config (the app closes at once when the config itself is invalid)."""
    from .app import report_runs

    app = check_then_launch_app(config, runs_dir)
    app.run()
    if app.bridge.run_dirs or app.return_code:  # it launched: how it ended, and where
        return report_runs(app, launch=True)
    from ..engine import (
        check_config,  # after the app: its first frame waits for no engine
        pending_jobs,
        probe_tasks,
    )
    from .headless import EXIT_CONFIG, EXIT_STOPPED

    report = check_config(config, runs_dir=runs_dir)
    problems = report.problems
    if report.ok and report.config is not None and not pending_jobs(report.config):
        problems = probe_tasks(report.config)  # the verdict the picker showed, from the cache: instant
    if problems:
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}:", file=sys.stderr)
        print("\n".join(str(p) for p in problems), file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_STOPPED  # quit before it launched


def _resume(args: argparse.Namespace) -> int:
    from ..engine import summarize
    from .verbs import BadRun, resolve_run

    try:
        run_dir = resolve_run(args.run_dir, Path(args.runs_dir))
    except BadRun as exc:
        return _refuse(args, str(exc), stream=True)
    summary = summarize(run_dir) if (run_dir / "events.jsonl").exists() else None
    if summary is None or not (run_dir / "config.json").exists():
        return _refuse(args, f"{run_dir}: not a torchherd run directory", stream=True)
    if summary.live:
        return _refuse(args, f"{run_dir}: another torchherd process is still running it", stream=True)
    only = [n for part in args.only or [] for n in part.split(",") if n]
    unknown = [n for n in only if n not in summary.pipelines]
    if unknown:
        return _refuse(args, f"{run_dir}: --only {', '.join(unknown)}: no such pipeline (it has "
                       f"{', '.join(summary.pipelines)})", stream=True)
    # By default early-stopped and pruned pipelines are done; naming one with --only carries it on.
    to_resume = [n for n in only if summary.statuses.get(n) != "completed"] if only else summary.to_resume
    if not to_resume:
        text = (f"{run_dir}: every pipeline {'named ' if only else ''}ended well (completed, early-stopped or "
                "pruned); nothing to resume")
        print(f"torchherd: {text}", file=sys.stderr)
        return _printer(args).end("", 0, how="nothing to resume", run_dir=str(run_dir),
                                  statuses=dict(summary.statuses), message=text)  # no mistake (2: bad input)
    if not args.headless and not args.detach and not args.json:
        from .app import run_app
        from .start import Resume

        return run_app(None, None, start=Resume(run_dir, tuple(only or ())))
    from ..engine import ServiceFailed, StartCancelled, spawn
    from .attach import follow_run, say_detached
    from .headless import EXIT_STOPPED

    printer = _printer(args)
    try:
        started = spawn(resume=run_dir, only=only or None)
    except ServiceFailed as exc:
        print(exc, file=sys.stderr)
        return printer.close(2, str(exc))
    except StartCancelled as exc:  # the run directory is as it was
        text = str(exc).replace("no run is kept", f"{run_dir} is as it was")
        print(f"\ntorchherd: {text}", file=sys.stderr)
        return printer.close(EXIT_STOPPED, text)
    if args.detach:
        return say_detached(started, f"resuming {', '.join(to_resume)}", printer)
    return asyncio.run(follow_run(started.run_dir, printer, from_start=True, owner=True))


def _printer(args: argparse.Namespace) -> LinePrinter:
    """What a followed run's events become: lines for a person, or with --json events.jsonl lines on stdout."""
    from .headless import LinePrinter

    if not args.json:
        return LinePrinter(sys.stdout)
    from .json_output import EventLines

    return EventLines(sys.stdout, sys.stderr)


def _attach(args: argparse.Namespace) -> int:
    from .verbs import BadRun, resolve_run

    try:
        run_dir = resolve_run(args.run, Path(args.runs_dir))
    except BadRun as exc:
        return _refuse(args, str(exc), stream=True)
    if args.headless or args.json:
        from .attach import follow_run

        return asyncio.run(follow_run(run_dir, _printer(args), from_start=args.from_start,
                                      read_only=args.read_only))
    from .app import run_app
    from .start import Attach

    return run_app(None, Path(args.runs_dir), start=Attach(run_dir, args.read_only))


def _export(args: argparse.Namespace) -> int:
    from ..engine import Unreadable, export_run, export_schedules
    from .verbs import BadRun, resolve_run

    unreadable, folder = Unreadable(), Path(args.tensorboard)
    before = set(folder.rglob("*")) if folder.is_dir() else set()
    try:
        run_dir = resolve_run(args.run, Path(args.runs_dir))
        count = export_run(run_dir, folder, unreadable)
        schedules = export_schedules(run_dir, folder)
    except (BadRun, OSError, ValueError) as exc:
        return _refuse(args, str(exc))
    for line in unreadable.lines():
        print(f"torchherd: {line}", file=sys.stderr)
    if args.json:
        from .json_output import emit

        written = sorted(str(p) for p in set(folder.rglob("*")) - before if p.is_file() and p != schedules)
        emit({"ok": True, "run_dir": str(run_dir), "tensorboard": str(folder), "pipelines": count,
              "files": written, "schedules": str(schedules) if schedules is not None else None,
              "skipped": unreadable.counts})
        return 0
    print(f"{run_dir}: TensorBoard files of {count} pipeline(s) in {args.tensorboard} "
          f"(tensorboard --logdir {args.tensorboard}; TensorBoard itself: pip install tensorboard)")
    if schedules is not None:
        print(f"{run_dir}: each PBT trial's values, epoch by epoch, in {schedules}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    from .verbs import list_command

    return list_command(Path(args.runs_dir), args.json)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, not in the interpreter's last flush, where a closed pipe's error is not ours
        return code
    except BrokenPipeError:  # `torchherd ls | head -1`: what reads the output has what it wanted
        # Nothing more may reach the closed pipe, the interpreter's last flush included (a second error).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    app_parser, commands = parsers()
    if argv and argv[0] in commands:
        args = commands[argv[0]].parse_args(argv[1:])
        handlers = {"run": _run, "check": _check, "resume": _resume, "attach": _attach, "ls": _ls,
                    "export": _export, "exporter": _exporter}
        if argv[0] in handlers:
            return handlers[argv[0]](args)
        from .verbs import act_command

        return act_command(argv[0], args.run, args.name, Path(args.runs_dir), sys.stdout, sys.stderr, args.json)
    args = app_parser.parse_args(argv)
    from .app import run_app

    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        print(f"torchherd: {target}: no such file or folder", file=sys.stderr)
        return 2
    return run_app(target, Path(args.runs_dir) if args.runs_dir else None)


if __name__ == "__main__":
    sys.exit(main())
