"""What the dashboard costs the training box: CPU (% of one core) and bytes/s written to the terminal.

Runs the app in a real pseudo-terminal on the real Supervisor over scripted workers (tests/tui/scripting.py)
that stream step events from many pipelines already holding long histories, and measures the app process
(screen and supervisor together, as in the product) after a warm-up.
Usage: python benchmarks/tui_cost.py [--seconds 30] [--size 120x40] [--hz 2]
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import math
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measured time (seconds)")
    ap.add_argument("--warmup", type=float, default=3.0, help="time after loading, before measuring (seconds)")
    ap.add_argument("--size", default="120x40", help="terminal COLUMNSxROWS")
    ap.add_argument("--pipelines", type=int, default=8)
    ap.add_argument("--rate", type=float, default=200.0, help="step events per second, all pipelines together")
    ap.add_argument("--history", type=int, default=10_000, help="points per pipeline before streaming starts")
    ap.add_argument("--hz", type=float, default=2.0, help="dashboard redraws per second at most")
    ap.add_argument("--dump", type=Path, help="also write the measured terminal output to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ------------------------------------------------------------ the app side (in the pty)


def run_child(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(ROOT)]
    from tests.tui.scripting import FrozenTime, Session

    from torchherd.engine.supervise.supervisor import TICK

    from torchherd.engine.protocol import messages as m
    from torchherd.tui.app import TorchherdApp
    from torchherd.tui.start import Launch

    # The real Supervisor over scripted workers: every event goes through its fold, its run directory
    # (events.jsonl) and its subscriber queue, as a real worker's would; only the training is missing.
    session = Session(FrozenTime(), run_id="bench", cpu_count=args.pipelines, tick=TICK)

    async def stream() -> None:
        """Preload `history` points per pipeline, then stream `rate` step events per second."""
        while len(session.launcher.handles) < args.pipelines:
            await asyncio.sleep(0.05)
        names = list(session.launcher.names)
        now = time.time()
        for name in names:
            session.feed(name, m.TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=10,
                                                 steps_per_epoch=50_000, device="cpu", parameters=1234))
            session.feed(name, *[m.StepMetrics(pipeline=name, epoch=(i + 1) * 10 // 5000, step=(i + 1) * 10,
                                               lr=0.01, loss=_loss((i + 1) * 10, name), samples_per_s=1000.0,
                                               time=now - (args.history - i) * 0.04) for i in range(args.history)])
            await asyncio.sleep(0)
        steps = {n: args.history * 10 for n in names}
        tick = 0.05  # seconds
        per_tick = args.rate * tick
        owed, i = 0.0, 0
        next_at = time.monotonic()
        while True:
            owed += per_tick
            while owed >= 1:
                name = names[i % len(names)]
                i += 1
                owed -= 1
                steps[name] += 10
                step = steps[name]
                session.feed(name, m.StepMetrics(pipeline=name, epoch=step // 5000, step=step,
                                                 loss=_loss(step, name), lr=0.01, samples_per_s=1000.0))
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    config = Path(tempfile.mkdtemp()) / "bench.toml"
    config.write_text("[defaults]\ntask = \"regression\"\n[devices]\nplacement = \"cpu\"\n"
                      f"cpu_slots = {args.pipelines}\n" +
                      "".join(f"[[pipelines]]\nname = \"p{i}\"\n" for i in range(args.pipelines)))

    class BenchApp(TorchherdApp):
        def on_mount(self) -> None:
            self.install_signal_handlers()
            self.call_later(self._picked, Launch(config))
            self.run_worker(stream(), exclusive=True, group="bench")
            self.ready_check = self.set_interval(0.2, self.check_ready)

        def check_ready(self) -> None:
            """Tell the parent (through a file) once every history is loaded and shown."""
            rows = self.bridge.state.rows.values()
            if len(rows) == args.pipelines and all(r.step >= args.history * 10 for r in rows):
                self.ready_check.stop()
                if os.environ.get("TORCHHERD_BENCH_READY"):
                    Path(os.environ["TORCHHERD_BENCH_READY"]).touch()

    app = BenchApp(config, Path(tempfile.mkdtemp()), factory=session, refresh_hz=args.hz)
    app.run()


def _loss(step: int, name: str) -> float:
    k = int(name[1:]) if name[1:].isdigit() else 0
    return 2.0 * math.exp(-step / (20_000 + 3_000 * k)) + 0.1 + 0.03 * math.sin(step / 170)


# ------------------------------------------------------------ the measuring side


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def measure(args: argparse.Namespace) -> int:
    import psutil

    cols, rows = (int(v) for v in args.size.lower().split("x"))
    master, slave = pty.openpty()
    set_size(slave, cols, rows)
    ready_file = Path(tempfile.mkdtemp()) / "ready"
    env = {**os.environ, "TORCHHERD_BENCH_READY": str(ready_file), "TERM": os.environ.get("TERM", "xterm-256color"), "COLUMNS": str(cols),
           "LINES": str(rows), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", "--size", args.size, "--pipelines", str(args.pipelines),
           "--rate", str(args.rate), "--history", str(args.history), "--hz", str(args.hz)]
    child = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    proc = psutil.Process(child.pid)
    total = 0
    phase_end = math.inf  # set once the app says its histories are loaded
    load_deadline = time.monotonic() + 120  # seconds to load the histories at most
    start_bytes = start_cpu = start_wall = None
    dump = open(args.dump, "wb") if args.dump else None
    try:
        while True:
            now = time.monotonic()
            if phase_end == math.inf:
                if ready_file.exists():
                    phase_end = now + args.warmup
                elif now > load_deadline:
                    print("the app never finished loading its histories", file=sys.stderr)
                    return 1
            if start_wall is None and now >= phase_end:
                t = proc.cpu_times()
                start_bytes, start_cpu, start_wall = total, t.user + t.system, now
                phase_end = now + args.seconds
            elif start_wall is not None and now >= phase_end:
                break
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                total += len(data)
                if dump is not None and start_wall is not None:
                    dump.write(data)
            if child.poll() is not None:
                print(f"app exited early with {child.returncode}", file=sys.stderr)
                return 1
        t = proc.cpu_times()
        wall = time.monotonic() - start_wall
        cpu = (t.user + t.system - start_cpu) / wall * 100
        rate = (total - start_bytes) / wall
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)  # the app stops its (scripted) session and exits
            deadline = time.monotonic() + 10
            while child.poll() is None and time.monotonic() < deadline:
                if select.select([master], [], [], 0.1)[0]:
                    try:
                        os.read(master, 65536)
                    except OSError:
                        break
            if child.poll() is None:
                child.kill()
        child.wait()
        os.close(master)
        if dump is not None:
            dump.close()
    print(f"dashboard {args.size}, {args.pipelines} pipelines x {args.history} points, "
          f"{args.rate:.0f} step events/s, {args.hz:g} redraws/s max, {wall:.0f} s measured")
    print(f"app CPU: {cpu:.1f}% of one core (goal < 5%); host load average {os.getloadavg()[0]:.2f}")
    print(f"terminal output: {rate / 1024:.1f} KiB/s (goal < 20 KiB/s)")
    return 0


def main() -> int:
    args = parse_args()
    if args.child:
        run_child(args)
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
