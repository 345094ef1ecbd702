"""An unmodified training loop for tests: prints `Epoch N, Loss: L` and knows nothing of torchherd.

Knobs make it crash once, go silent for ever, start children of its own, or save on Ctrl-C (or on
SIGTERM, ignoring Ctrl-C).
Pure Python: no torch import, so it starts in milliseconds.
"""
import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--delay", type=float, default=0.05)  # seconds per epoch: a workload knob
parser.add_argument("--crash-once", default="")  # marker file: crash at epoch 2 unless it exists
parser.add_argument("--silent-hang", action="store_true")  # after the first epoch, sleep for ever printing nothing
parser.add_argument("--children", type=int, default=0)  # start this many long-lived children first
parser.add_argument("--on-interrupt", default="")  # file written when Ctrl-C arrives, before exiting
parser.add_argument("--on-sigterm", default="")  # ignore Ctrl-C; write this file and exit 0 on SIGTERM
parser.add_argument("--done", default="")  # written half a second after the last epoch (a final save)
args = parser.parse_args()
if args.on_sigterm:
    import signal

    def saved_and_gone(signum, frame):
        with open(args.on_sigterm, "w") as fh:
            fh.write(f"sigterm at epoch {epoch}\n")
        print("plain_loop: SIGTERM, saved", flush=True)
        sys.exit(0)
    epoch = 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, saved_and_gone)

print(f"plain_loop: RANK={os.environ.get('RANK')} WORLD_SIZE={os.environ.get('WORLD_SIZE')} "
      f"MASTER_PORT={os.environ.get('MASTER_PORT')} restart={os.environ.get('TORCHHERD_RESTART_COUNT')} "
      f"cwd={os.getcwd()}", flush=True)
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(args.children)]
if kids:
    print("plain_loop: children " + " ".join(str(k.pid) for k in kids), flush=True)
try:
    for epoch in range(args.epochs):
        time.sleep(args.delay)
        if args.crash_once and epoch == 1 and not os.path.exists(args.crash_once):
            open(args.crash_once, "w").close()
            raise RuntimeError("plain_loop crashed on purpose")
        print(f"Epoch {epoch + 1}, Loss: {1.0 / (epoch + 1):.4f}", flush=True)
        if args.silent_hang:
            time.sleep(600)
    if args.done:
        time.sleep(0.5)
        with open(args.done, "w") as fh:
            fh.write(f"done after epoch {epoch + 1}\n")
except KeyboardInterrupt:
    if args.on_interrupt:
        with open(args.on_interrupt, "w") as fh:
            fh.write(f"interrupted at epoch {epoch}\n")
    print("plain_loop: interrupted, saved", flush=True)
    sys.exit(0)
