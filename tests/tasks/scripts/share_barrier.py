"""Prints what it sees, as visible_devices.py does, then waits until COUNT processes have reached the barrier
folder DIR (each leaves a file there), so it proves that many ran at once; exits 4 if they never did."""
import os
import sys
import time

folder, count = sys.argv[1], int(sys.argv[2])
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
print(f"visible_devices: rank 0 local_rank 0 cuda_visible_devices [{visible}] own "
      f"[{os.environ.get('TORCHHERD_GPUS', '')}]", flush=True)
os.makedirs(folder, exist_ok=True)
open(os.path.join(folder, str(os.getpid())), "w").close()
deadline = time.monotonic() + 120
while len(os.listdir(folder)) < count:
    if time.monotonic() > deadline:
        sys.exit(4)
    time.sleep(0.05)  # a poll of the folder, not a wait for time to pass
