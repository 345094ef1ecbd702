"""The `torchherd` command: the app by default, `run` (with `--headless`) and `check`.

`torchherd [DIR|CONFIG]` opens the app; `torchherd run CONFIG [--headless]
[--runs-dir DIR]` runs a config; `torchherd check CONFIG` validates one.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

USAGE = """torchherd [DIR|CONFIG]                      open the app on a folder of configs (default ./sample_configs)
       torchherd run CONFIG [--headless] [--runs-dir DIR]
       torchherd check CONFIG [--probe]
       torchherd resume RUN_DIR [--headless] [--only NAME]   carry on what did not complete"""


def _check(args: argparse.Namespace) -> int:
    from torchherd.engine.check import check_config

    report = check_config(args.config, probe=args.probe)
    print(report.render())
    return 0 if report.ok else 2


def _run(args: argparse.Namespace) -> int:
    from torchherd.engine.check import check_config
    from torchherd.tui.headless import EXIT_CONFIG, run_headless

    # Every pipeline's task is built once in a throwaway process first: a bad config launches nothing.
    report = check_config(args.config, probe=True)
    if not report.ok:
        print(report.render(), file=sys.stderr)
        return EXIT_CONFIG
    assert report.config is not None
    if not args.headless:
        from torchherd.tui.app import run_app

        return run_app(Path(args.config), Path(args.runs_dir) if args.runs_dir else None, launch=True)
    return asyncio.run(run_headless(report.config, args.runs_dir))


def _resume(args: argparse.Namespace) -> int:
    from torchherd.engine.rundir import summarize
    from torchherd.engine.supervisor import Supervisor
    from torchherd.tui.headless import run_headless

    run_dir = Path(args.run_dir)
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
    if not summary.to_resume or (only and not set(only) & set(summary.to_resume)):
        print(f"torchherd: {run_dir}: every pipeline {'named ' if only else ''}completed; nothing to resume",
              file=sys.stderr)
        return 2
    if not args.headless:
        from torchherd.tui.app import run_app

        return run_app(run_dir, None, launch=True)
    return asyncio.run(run_headless(None, supervisor=Supervisor.resume_run(run_dir, only=only or None)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="torchherd", usage=USAGE,
                                     description="Supervise PyTorch training from a terminal.")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a config")
    run.add_argument("config")
    run.add_argument("--headless", action="store_true", help="no screen: print one line per event")
    run.add_argument("--runs-dir", help="where the run directory goes (overrides the config's runs_dir)")
    check = sub.add_parser("check", help="validate a config and say what would launch where")
    check.add_argument("config")
    check.add_argument("--probe", action="store_true", help="also build every task in a fresh process")
    resume = sub.add_parser("resume", help="carry on every pipeline of a run that did not complete, "
                                           "from its checkpoints")
    resume.add_argument("run_dir")
    resume.add_argument("--only", action="append", metavar="NAME",
                        help="resume only these pipelines (repeat, or separate with commas)")
    resume.add_argument("--headless", action="store_true", help="no screen: print one line per event")
    if argv and argv[0] in ("run", "check", "resume", "-h", "--help"):
        args = parser.parse_args(argv)
        return {"run": _run, "check": _check, "resume": _resume}[args.command](args)
    app = argparse.ArgumentParser(prog="torchherd", usage=USAGE)
    app.add_argument("target", nargs="?", help="a folder of configs or one config file")
    app.add_argument("--runs-dir", help="where run directories go")
    args = app.parse_args(argv)
    from torchherd.tui.app import run_app

    target = Path(args.target) if args.target else None
    if target is not None and not target.exists():
        print(f"torchherd: {target}: no such file or folder", file=sys.stderr)
        return 2
    return run_app(target, Path(args.runs_dir) if args.runs_dir else None)


if __name__ == "__main__":
    sys.exit(main())
