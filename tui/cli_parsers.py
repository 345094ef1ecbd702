"""The `torchherd` command line's grammar: its usage, the list of commands, and one argparse parser per
command, each with its own clean usage line and help."""
from __future__ import annotations

import argparse
import sys
from typing import Any

USAGE = """torchherd [DIR|CONFIG] [--runs-dir DIR] [--version]
       torchherd run CONFIG [--headless] [--detach] [--runs-dir DIR] [--json]
       torchherd attach [RUN] [--headless] [--read-only] [--from-start] [--runs-dir DIR] [--json]
       torchherd ls [--runs-dir DIR] [--json]
       torchherd stop|kill RUN [NAME] [--json]
       torchherd pause|unpause|checkpoint|restart|stacks|promote RUN NAME [--json]
       torchherd resume RUN_DIR [--headless] [--detach] [--only NAME] [--json]
       torchherd check CONFIG [--probe] [--json]
       torchherd export RUN --tensorboard DIR [--runs-dir DIR] [--json]
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
command's options. --json: stdout holds JSON only, for scripts (notices go to stderr)."""


JSON_LINES = ("no screen: each event as its events.jsonl line, then one object saying how it ended (for scripts "
              "and jq)")


def _version() -> str:
    """'torchherd 0.1.0 (torch 2.13.0, Python 3.11.7)': what a bug report needs, read without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"torchherd {of('torchherd')} (torch {of('torch')}, Python {sys.version.split()[0]})"


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
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
    run.add_argument("--json", action="store_true", help=JSON_LINES)

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
    resume.add_argument("--json", action="store_true", help=JSON_LINES)

    check = argparse.ArgumentParser(
        prog="torchherd check", description="Validate a config: 'ok' and what would launch where, or every "
        "problem as 'file: key: what is wrong' (exit 2). Task files are read, not imported; --probe also "
        "builds every task in a fresh process, as `torchherd run` does.")
    check.add_argument("config", metavar="CONFIG", help="the TOML config to check")
    check.add_argument("--probe", action="store_true", help="also build every task in a fresh process")
    check.add_argument("--json", action="store_true", help="one JSON object: ok, the problems, the plan")
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
    attach.add_argument("--json", action="store_true", help=JSON_LINES)
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
    export.add_argument("--json", action="store_true", help="one JSON object: what was written")
    parsers = {"attach": attach, "ls": ls, "export": export, "exporter": _exporter_parser()}
    for verb in ACTIONS:
        one = verb in NEEDS_NAME
        act = argparse.ArgumentParser(
            prog=f"torchherd {verb}", description=f"{verb} {'a pipeline' if one else 'a pipeline (or all)'} "
            "of a live run. Exit status: 0 it took, 1 the run is not live or refused, 2 bad input.")
        act.add_argument("run", metavar="RUN", help="run directory or run id")
        act.add_argument("name", nargs=None if one else "?", metavar="NAME", help="the pipeline")
        act.add_argument("--runs-dir", **runs_dir)
        act.add_argument("--json", action="store_true", help="one JSON object: what the run answered")
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
