"""What one Prometheus scrape of `torchherd exporter` costs while 8 pipelines train (two live runs of 4 plain
training scripts each, a step report every `--delay` seconds from each), over the same exporter's scrape with no
live run (the baseline: HTTP and the runtime folder's listing alone). Wall-clock milliseconds per scrape, median
of `--scrapes` scrapes a `--gap` apart (the runs write between them); the first scrape of each run (its whole
history so far) is shown apart. The goal: a scrape of 8 pipelines under 50 ms.

Usage: python benchmarks/exporter_scrape.py [--quick] [--scrapes 100] [--gap 0.2] [--delay 0.01] [--history 5]
(--quick: 10 scrapes, 1 s of history: CI checks that it still runs)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAIN = ROOT / "tests" / "tasks" / "scripts" / "plain_loop.py"
PIPELINES = 4  # a run; two runs


def config(delay: float) -> str:
    body = "".join(f'[[pipelines]]\nname = "p{i}"\nscript = "{PLAIN}"\nargs = ["--epochs", "100000000", "--delay", '
                   f'"{delay}"]\nmetrics = \'Epoch (?P<epoch>\\d+), Loss: (?P<loss>\\S+)\'\n' for i in range(PIPELINES))
    return (f'name = "scrape"\n{body}[devices]\nplacement = "cpu"\ncpu_slots = {PIPELINES}\n'
            "[telemetry]\nenabled = false\n[validation]\nmode = \"off\"\n")


def torchherd(env: dict[str, str], cwd: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "torchherd", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)
    if done.returncode != 0:
        sys.exit(f"torchherd {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")


def scrape(url: str) -> tuple[float, bytes]:
    """Seconds for one GET of /metrics, and what it returned."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = reply.read()
    return time.perf_counter() - start, body


def timed(url: str, scrapes: int, gap: float) -> float:
    """Median seconds of `scrapes` scrapes, `gap` seconds apart."""
    times = []
    for _ in range(scrapes):
        times.append(scrape(url)[0])
        time.sleep(gap)  # what the runs write between two scrapes (Prometheus scrapes every 15 s by default)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 scrapes, 1 s of history (CI)")
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between scrapes")
    ap.add_argument("--delay", type=float, default=0.01, help="seconds between a script's step reports")
    ap.add_argument("--history", type=float, default=5.0, help="seconds the runs train before the first scrape")
    args = ap.parse_args()
    if args.quick:
        args.scrapes, args.history = 10, 1.0
    # The runtime folder (control sockets) under /tmp itself: an AF_UNIX path holds 107 bytes, TMPDIR may be deep.
    with tempfile.TemporaryDirectory(prefix="th-scrape-") as tmp, \
            tempfile.TemporaryDirectory(prefix="th-rt-", dir="/tmp") as runtime:
        work = Path(tmp)
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime, "PYTHONPATH": str(ROOT)}
        exporter = subprocess.Popen([sys.executable, "-m", "torchherd", "exporter", "--port", "0"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs: list[Path] = []
        try:
            url = exporter.stdout.readline().split()[3]  # type: ignore[union-attr]
            idle = timed(url, args.scrapes, args.gap)
            for name in ("a", "b"):
                (work / name).mkdir()
                (work / name / "run.toml").write_text(config(args.delay))
                torchherd({**env, "TORCHHERD_LEDGER": str(work / name / "ledger")}, work / name, "run", "run.toml",
                          "--detach")
                runs += list((work / name / "runs").iterdir())
            time.sleep(args.history)  # history for the first scrape to read whole
            first, body = scrape(url)
            live = body.count(b"torchherd_pipeline_step{")
            busy = timed(url, args.scrapes, args.gap)
        finally:
            for run in runs:
                torchherd(env, work, "kill", str(run))
            exporter.terminate()
            exporter.wait(timeout=60)
    print(f"pipelines live in the scrape: {live} (of {2 * PIPELINES})")
    print(f"first scrape of both runs ({args.history:g} s of history each): {first * 1e3:.1f} ms")
    print(f"scrape of {2 * PIPELINES} live pipelines: {busy * 1e3:.2f} ms over idle {idle * 1e3:.2f} ms (median of "
          f"{args.scrapes}): ratio {busy / idle:.2f}x; goal under 50 ms: {'met' if busy < 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
