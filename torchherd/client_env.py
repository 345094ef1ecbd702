"""What torchherd.client and the script runner agree on besides the frames: the environment and the flush interval.

Nothing but constants: torchherd.client reads these at import in users' own scripts, before it knows
whether torchherd runs them (and only then loads the socket and the frames).
"""

ENV_FD = "TORCHHERD_CLIENT_FD"  # the script's end of the socket
ENV_SNAPSHOT = "TORCHHERD_SNAPSHOT"  # a SnapshotTarget as JSON, when hand-offs are scored
ENV_CHECKPOINT_DIR = "TORCHHERD_CHECKPOINT_DIR"  # where herd.save() writes
ENV_PIPELINE = "TORCHHERD_PIPELINE"  # the pipeline's name
FLUSH_INTERVAL = 0.1  # seconds between batches of reports sent to torchherd
