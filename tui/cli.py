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
from typing import TYPE_CHECKING, Any, Unpack

if TYPE_CHECKING:
    from .app import AppOptions, TorchherdApp

USAGE = """torchherd [DIR|CONFIG] [--runs-dir DIR] [--version]
       torchherd run CONFIG [--headless] [--detach] [--runs-dir DIR]
       torchherd attach [RUN] [--headless] [--read-only] [--from-start] [--runs-dir DIR]
       torchherd ls [--runs-dir DIR] [--json]
       torchherd stop|kill RUN [NAME]
       torchherd pause|unpause|checkpoint|restart|stacks|promote RUN NAME
       torchherd resume RUN_DIR [--headless] [--detach] [--only NAME]
       torchherd check CONFIG [--probe]
       torchherd export RUN --tensorboard DIR [--runs-dir DIR]
       torchherd exporter [--host 127.0.0.1] [--port 9400]"""

COMMANDS = """commands:
  run CONFIG        run a config in a supervisor of its own (it outlives this terminal) and watch it:
                    the dashboard, or with --headless one line per event; --detach returns at once
  attach [RUN]      watch a live run (default: your newest live run, wherever it was started): the
                    dashboard, or --headless
  ls                list runs: live, finished, or cut short and resumable
  stop|kill RUN [NAME]             stop gracefully (checkpoint first) or kill one pipeline, or all
  pause|unpause|checkpoint|restart RUN NAME           act on one pipeline of a live run
  stacks RUN NAME   every process of a pipeline writes its Python stacks to its log (nothing stops)
  promote RUN NAME  a sweep's pruned trial trains on from its checkpoint and is never pruned again
  resume RUN_DIR    carry on every pipeline of a run that did not complete, from its checkpoints
                    (--detach: in the background, returning at once)
  check CONFIG      validate a config and say what would launch where (exit 2 if it cannot run)
  export RUN        write a past run's TensorBoard event files (--tensorboard DIR)
  exporter          serve Prometheus metrics of your live runs on this box (http://127.0.0.1:9400/metrics)

RUN is a run directory or a run id under --runs-dir (default ./runs). `torchherd COMMAND -h` shows a
command's options."""


def _version() -> str:
    """'torchherd 0.1.0 (torch 2.13.0, Python 3.11.7)': what a bug report needs, read without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"torchherd {of('torchherd')} (torch {of('torch')}, Python {sys.version.split()[0]})"


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The app's parser and one parser per command, each with its own clean usage line."""
    app = argparse.ArgumentParser(
        prog="torchherd", usage=USAGE, epilog=COMMANDS, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Supervise PyTorch training from a terminal.\n"
                    "With no command, open the app: pick a config, watch it, steer it.")
    app.add_argument("target", nargs="?", metavar="DIR|CONFIG",
                     help="a folder of configs or one config file "
                          "(default: ./sample_configs, else this folder's *.toml)")
    app.add_argument("--runs-dir", metavar="DIR",
                     help="where run directories go and past runs are found (default: ./runs)")
    app.add_argument("--version", action="version", version=_version(),
                     help="print torchherd's version (and torch's and Python's) and exit")

    run = argparse.ArgumentParser(
        prog="torchherd run", description="Check a config, then run it: on the dashboard, or with --headless "
        "one line per event (every worker builds its task and holds before its first step until all have "
        "built). Exit status: 0 every pipeline completed, 1 one failed or was killed, 2 the config is "
        "invalid or a task did not build (nothing trained), "
        "3 stopped before completing.")
    run.add_argument("config", metavar="CONFIG", help="the TOML config to run")
    run.add_argument("--headless", action="store_true", help="no screen: print one line per event")
    run.add_argument("--detach", action="store_true",
                     help="start the run and return at once (exit 0), printing how to attach and stop it")
    run.add_argument("--runs-dir", metavar="DIR",
                     help="where the run directory goes (overrides the config's runs_dir)")

    resume = argparse.ArgumentParser(
        prog="torchherd resume", description="Carry on every pipeline of a run that did not complete "
        "(stopped, killed, failed, never started, or cut short when its torchherd died) from its "
        "checkpoints, in the same run directory, with a fresh restart budget. Completed pipelines stay "
        "as they are.")
    resume.add_argument("run_dir", metavar="RUN", help="the run directory (e.g. runs/20250101-120000-digits) or "
                        "its run id under --runs-dir, as `torchherd ls` lists it")
    resume.add_argument("--runs-dir", metavar="DIR", default="runs", help="where run ids are looked up (default: "
                        "./runs)")
    resume.add_argument("--headless", action="store_true", help="no screen: print one line per event")
    resume.add_argument("--detach", action="store_true",
                        help="carry it on in the background and return at once (exit 0), printing how to attach")
    resume.add_argument("--only", action="append", metavar="NAME",
                        help="resume only these pipelines (repeat, or separate with commas)")

    check = argparse.ArgumentParser(
        prog="torchherd check", description="Validate a config: 'ok' and what would launch where, or every "
        "problem as 'file: key: what is wrong' (exit 2). Task files are read, not imported; --probe also "
        "builds every task in a fresh process, as `torchherd run` does.")
    check.add_argument("config", metavar="CONFIG", help="the TOML config to check")
    check.add_argument("--probe", action="store_true", help="also build every task in a fresh process")
    return app, {"run": run, "resume": resume, "check": check, **_client_parsers()}


def _client_parsers() -> dict[str, argparse.ArgumentParser]:
    """attach, ls and the commands that act on a live run."""
    from .verbs import ACTIONS, NEEDS_NAME

    runs_dir: dict[str, Any] = {"metavar": "DIR", "default": "runs", "help": "where runs are found (default: ./runs)"}
    attach = argparse.ArgumentParser(
        prog="torchherd attach", description="Watch a live run: its whole history, then live events. Several "
        "clients may watch one run; each command a client sends is recorded in events.jsonl with its pid.")
    attach.add_argument("run", nargs="?", metavar="RUN",
                        help="run directory or run id (default: your newest live run, wherever it was started)")
    attach.add_argument("--headless", action="store_true", help="print one line per event, from now on")
    attach.add_argument("--from-start", action="store_true", help="with --headless: from the run's beginning")
    attach.add_argument("--read-only", action="store_true", help="watch only: commands are refused")
    attach.add_argument("--runs-dir", **runs_dir)
    ls = argparse.ArgumentParser(prog="torchherd ls", description="List runs, newest first: live, finished, "
                                 "or cut short and resumable.")
    ls.add_argument("--runs-dir", **runs_dir)
    ls.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    export = argparse.ArgumentParser(
        prog="torchherd export", description="Write a run's TensorBoard event files (one folder per pipeline, a "
        "sweep's HParams too) from its events.jsonl and telemetry.jsonl: for runs made before torchherd wrote "
        "them, or with tensorboard = false; a PBT sweep's schedules.json too (each trial's values, epoch by "
        "epoch). Exit status: 0 written, 2 no such run.")
    export.add_argument("run", metavar="RUN", help="run directory or run id")
    export.add_argument("--tensorboard", metavar="DIR", required=True, help="where the event files go")
    export.add_argument("--runs-dir", **runs_dir)
    parsers = {"attach": attach, "ls": ls, "export": export, "exporter": _exporter_parser()}
    for verb in ACTIONS:
        one = verb in NEEDS_NAME
        act = argparse.ArgumentParser(
            prog=f"torchherd {verb}", description=f"{verb} {'a pipeline' if one else 'a pipeline (or all)'} "
            "of a live run. Exit status: 0 it took, 1 the run is not live or refused, 2 bad input.")
        act.add_argument("run", metavar="RUN", help="run directory or run id")
        act.add_argument("name", nargs=None if one else "?", metavar="NAME", help="the pipeline")
        act.add_argument("--runs-dir", **runs_dir)
        parsers[verb] = act
    return parsers


def _exporter_parser() -> argparse.ArgumentParser:
    exporter = argparse.ArgumentParser(
        prog="torchherd exporter", description="Serve Prometheus metrics at http://HOST:PORT/metrics until "
        "Ctrl-C: every live run of yours on this box (as `torchherd ls` finds them), by run and pipeline (state, "
        "step, epoch, loss, validation, samples/s, restarts, alerts, devices), and the device ledger's leases. "
        "A run that ends drops out; one started later comes in. Scrapes read each run's events.jsonl and never "
        "ask its supervisor. Exit status: 0 ended by Ctrl-C or SIGTERM, 2 it cannot listen there.")
    exporter.add_argument("--host", default="127.0.0.1", metavar="HOST",
                          help="the address to listen on (default: 127.0.0.1, this box only; any other lets "
                               "whoever reaches it read your run names, pipelines and run directories)")
    exporter.add_argument("--port", default="9400", metavar="PORT",
                          help="the port to listen on (default: 9400; 0: any free one, printed)")
    return exporter


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
    print(report.render())
    return 0 if report.ok else 2


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()  # headless lines count from here, not from when the run starts
    if not args.headless and not args.detach:  # the app opens at once and checks in its picker, before the
        return run_app_checked(Path(args.config), Path(args.runs_dir) if args.runs_dir else None)  # engine loads
    from ..engine import check_config
    from .attach import check_and_run
    from .headless import EXIT_CONFIG

    # The fast check first (milliseconds); building every task comes next, with progress shown:
    # headless prints a line at once.
    report = check_config(args.config, runs_dir=args.runs_dir)
    if not report.ok:
        print(report.render(), file=sys.stderr)
        return EXIT_CONFIG
    assert report.config is not None
    return check_and_run(report.config, args.runs_dir, start=started, detach=args.detach)


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
        print(f"torchherd: {exc}", file=sys.stderr)
        return 2
    summary = summarize(run_dir) if (run_dir / "events.jsonl").exists() else None
    if summary is None or not (run_dir / "config.json").exists():
        print(f"torchherd: {run_dir}: not a torchherd run directory", file=sys.stderr)
        return 2
    if summary.live:
        print(f"torchherd: {run_dir}: another torchherd process is still running it", file=sys.stderr)
        return 2
    only = [n for part in args.only or [] for n in part.split(",") if n]
    unknown = [n for n in only if n not in summary.pipelines]
    if unknown:
        print(f"torchherd: {run_dir}: --only {', '.join(unknown)}: no such pipeline (it has "
              f"{', '.join(summary.pipelines)})", file=sys.stderr)
        return 2
    # By default early-stopped and pruned pipelines are done; naming one with --only carries it on.
    to_resume = [n for n in only if summary.statuses.get(n) != "completed"] if only else summary.to_resume
    if not to_resume:
        print(f"torchherd: {run_dir}: every pipeline {'named ' if only else ''}ended well (completed, "
              "early-stopped or pruned); nothing to resume",
              file=sys.stderr)
        return 0  # nothing to do is no mistake (2 is for bad input)
    if not args.headless and not args.detach:
        from .app import run_app
        from .start import Resume

        return run_app(None, None, start=Resume(run_dir, tuple(only or ())))
    from ..engine import ServiceFailed, StartCancelled, spawn
    from .attach import follow_run, say_detached
    from .headless import EXIT_STOPPED, LinePrinter

    try:
        started = spawn(resume=run_dir, only=only or None)
    except ServiceFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    except StartCancelled as exc:  # the run directory is as it was
        print(f"\ntorchherd: {exc}".replace("no run is kept", f"{run_dir} is as it was"), file=sys.stderr)
        return EXIT_STOPPED
    if args.detach:
        return say_detached(started, f"resuming {', '.join(to_resume)}")
    return asyncio.run(follow_run(started.run_dir, LinePrinter(sys.stdout), from_start=True, owner=True))


def _attach(args: argparse.Namespace) -> int:
    from .verbs import BadRun, resolve_run

    try:
        run_dir = resolve_run(args.run, Path(args.runs_dir))
    except BadRun as exc:
        print(f"torchherd: {exc}", file=sys.stderr)
        return 2
    if args.headless:
        from .attach import follow_run
        from .headless import LinePrinter

        return asyncio.run(follow_run(run_dir, LinePrinter(sys.stdout), from_start=args.from_start,
                                      read_only=args.read_only))
    from .app import run_app
    from .start import Attach

    return run_app(None, Path(args.runs_dir), start=Attach(run_dir, args.read_only))


def _export(args: argparse.Namespace) -> int:
    from ..engine import Unreadable, export_run, export_schedules
    from .verbs import BadRun, resolve_run

    unreadable = Unreadable()
    try:
        run_dir = resolve_run(args.run, Path(args.runs_dir))
        count = export_run(run_dir, Path(args.tensorboard), unreadable)
        schedules = export_schedules(run_dir, Path(args.tensorboard))
    except (BadRun, OSError, ValueError) as exc:
        print(f"torchherd: {exc}", file=sys.stderr)
        return 2
    for line in unreadable.lines():
        print(f"torchherd: {line}", file=sys.stderr)
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
    app_parser, commands = _parsers()
    if argv and argv[0] in commands:
        args = commands[argv[0]].parse_args(argv[1:])
        handlers = {"run": _run, "check": _check, "resume": _resume, "attach": _attach, "ls": _ls,
                    "export": _export, "exporter": _exporter}
        if argv[0] in handlers:
            return handlers[argv[0]](args)
        from .verbs import act_command

        return act_command(argv[0], args.run, args.name, Path(args.runs_dir))
    args = app_parser.parse_args(argv)
    from .app import run_app

    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        print(f"torchherd: {target}: no such file or folder", file=sys.stderr)
        return 2
    return run_app(target, Path(args.runs_dir) if args.runs_dir else None)


if __name__ == "__main__":
    sys.exit(main())
