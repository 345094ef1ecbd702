"""Time from the command to its first text on screen in tmux: `torchherd` (the picker) and `torchherd run CONFIG`
against a Textual hello-world, as ratios.

Each command starts in a fresh detached tmux session (80x24, on a tmux server of this benchmark's own) and `tmux capture-pane` is polled until the
pane shows any text; the commands take turns, round after round, and the medians are compared.
Goal: the picker <= 1.3x the hello-world.
Usage: python benchmarks/first_screen.py [--rounds 7] [--config sample_configs/digits.toml]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELLO = """
from textual.app import App
from textual.widgets import Static


class Hello(App):
    def compose(self):
        yield Static("hello, world")


Hello().run()
"""


TMUX = ["tmux", "-L", f"first-screen-{os.getpid()}"]  # a server of its own, kept up by an idle session


def first_text(command: list[str], timeout: float, cwd: Path) -> float:
    """Seconds from starting `command` in a new tmux session to the first non-blank text in its pane."""
    name = f"first-screen-{uuid.uuid4().hex[:8]}"
    shell = " ".join(f"'{part}'" for part in command)
    start = time.perf_counter()
    subprocess.run([*TMUX, "new-session", "-d", "-s", name, "-x", "80", "-y", "24", "-c", str(cwd), shell],
                   check=True)
    try:
        while True:
            pane = subprocess.run([*TMUX, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            if pane.strip():
                return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise SystemExit(f"{command}: no text on screen after {timeout:g}s")
            time.sleep(0.005)  # poll interval of the measurement
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", name], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--config", default="sample_configs/digits.toml", help="the config `torchherd run` opens")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a first text")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is not installed", file=sys.stderr)
        return 1
    hello = Path(tempfile.mkdtemp()) / "hello.py"
    hello.write_text(HELLO)
    torchherd = str(Path(sys.executable).with_name("torchherd"))  # the installed command, as users start it
    runs = tempfile.mkdtemp()  # `torchherd run` starts a run: keep it out of the checkout's runs/
    commands = {"hello-world": [sys.executable, str(hello)], "torchherd": [torchherd],
                "torchherd run CONFIG": [torchherd, "run", str(ROOT / args.config), "--runs-dir", runs]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    subprocess.run([*TMUX, "new-session", "-d", "-s", "keep", "cat"], check=True)  # no server start in a timing
    try:
        for name, command in commands.items():  # a first start of each (byte-compiling, a cold cache) is left out
            first_text(command, args.timeout, ROOT)
        for _ in range(args.rounds):
            for name, command in commands.items():
                times[name].append(first_text(command, args.timeout, ROOT))
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)
    for run_dir in Path(runs).iterdir():  # a run that launched before its session was killed: end it
        subprocess.run([torchherd, "kill", str(run_dir)], capture_output=True)
    base = statistics.median(times["hello-world"])
    print(f"first text on screen in tmux 80x24, medians of {args.rounds} alternating rounds "
          f"(host load average {os.getloadavg()[0]:.2f}):")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:22s} {median:5.2f} s  ratio {median / base:4.2f}"
              + ("  (goal <= 1.3)" if name == "torchherd" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
