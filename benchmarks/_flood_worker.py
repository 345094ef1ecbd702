"""A stand-in worker for benchmarks: sends N step reports through a real StatusSender as fast as it can."""
import json
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from torchherd.engine.protocol.channel import StatusSender
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.protocol.spec import read_spec


def main() -> None:
    spec, transport = read_spec(Path(sys.argv[1]))
    count = spec.pipeline["params"]["count"]
    name = spec.name
    sender = StatusSender(Connection(transport.status_fd, readable=False), max_pending=10 * count)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(count):
        sender.step(StepMetrics(pipeline=name, epoch=0, step=i, loss=0.5, lr=0.1, samples_per_s=1000.0))
    loop_cpu = time.process_time() - cpu0
    sender.close(timeout=60)
    total_cpu = time.process_time() - cpu0  # includes the sender thread's pickling and writes
    sender2 = StatusSender(Connection(transport.status_fd, readable=False))
    sender2.send(Notice(pipeline=name, text=json.dumps({"count": count, "loop_cpu": loop_cpu,
                                                         "total_cpu": total_cpu,
                                                         "wall": time.perf_counter() - wall0})))
    sender2.close(timeout=10)


if __name__ == "__main__":
    main()
